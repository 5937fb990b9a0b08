//! The parts of the engine's state, each with its own rules: [`Held`] (the retained
//! checkpoints and the objects they reference), [`Flight`] (the checkpoints in flight, the
//! import slot and the restore: who may begin now), [`Lineages`] (what a new checkpoint of
//! each hosted backend builds on) and [`Health`] (what `status` reports). The engine's
//! `State` holds them beside the store's metadata and `wal` mode's
//! [`super::materialize::WalState`], all behind its one lock (see the locking note in
//! [`super`]); the rules here are plain data, tested without an engine.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::catalog::{BackendSnapshot, FileEntry, FileList, Manifest};
use crate::error::{Error, Result};
use crate::names::BackendName;
use crate::registry::Registry;
use crate::store::ObjectId;

/// What the store holds: the retained checkpoints, the references their objects have, and
/// the objects set apart from the rules (kept for recovery, found missing).
pub(super) struct Held {
    pub registry: Registry,
    pub manifests: BTreeMap<u64, Arc<Manifest>>,
    /// Objects of a manifest that may exist on disk after a failed commit: never deleted
    /// by this process (the next start decides from what is durable).
    pub kept: BTreeSet<ObjectId>,
    /// Referenced objects found missing at start: never shared, stored again when a
    /// checkpoint has their bytes (which repairs them).
    pub missing: BTreeSet<ObjectId>,
    /// A read-only view: listed checkpoints whose manifest cannot be read (reported once,
    /// not read again while listed).
    pub unreadable: BTreeSet<u64>,
}

impl Held {
    /// The retained checkpoints `manifests` and the references in `registry`; nothing kept,
    /// missing or unreadable.
    pub fn new(registry: Registry, manifests: BTreeMap<u64, Arc<Manifest>>) -> Held {
        Held {
            registry,
            manifests,
            kept: BTreeSet::new(),
            missing: BTreeSet::new(),
            unreadable: BTreeSet::new(),
        }
    }

    /// May a checkpoint reference this object without storing its bytes?
    pub fn can_share(&self, id: &ObjectId) -> bool {
        self.registry.is_live(id) && !self.missing.contains(id)
    }

    /// The manifest of retained checkpoint `id`, or ENOENT.
    pub fn retained(&self, id: u64) -> Result<&Arc<Manifest>> {
        self.manifests.get(&id).ok_or(Error::NoSuchCheckpoint(id))
    }

    /// Of `garbage`, what may be deleted: all but the objects kept for recovery.
    pub fn deletable(&self, garbage: &[ObjectId]) -> Vec<ObjectId> {
        garbage
            .iter()
            .filter(|id| !self.kept.contains(id))
            .copied()
            .collect()
    }

    /// May the orphan sweep delete `id` (not live, not kept)?
    pub fn is_orphan(&self, id: &ObjectId) -> bool {
        !self.registry.is_live(id) && !self.kept.contains(id)
    }
}

/// The checkpoints in flight, the import slot and the restore: the rules of who may begin.
#[derive(Debug, Default)]
pub(super) struct Flight {
    /// The checkpoints begun and not yet committed or failed.
    in_flight: BTreeSet<u64>,
    /// The checkpoint in flight that imports backends: while it is, no other checkpoint
    /// begins (each carries every backend it does not stage over from the newest committed
    /// checkpoint, which must not miss an import committing meanwhile).
    importing: Option<u64>,
    /// A restore is swapping the hosted backends' databases.
    restoring: bool,
}

impl Flight {
    /// Refuse while a restore runs (EBUSY): no checkpoint begins, no metadata changes and
    /// no checkpoint is dropped meanwhile.
    pub fn check_not_restoring(&self) -> Result<()> {
        if self.restoring {
            return Err(Error::Busy("a restore is in progress".into()));
        }
        Ok(())
    }

    /// Refuse any checkpoint now (EBUSY): a restore runs, or a checkpoint that imports is in
    /// flight (it holds the import slot).
    pub fn check_open(&self) -> Result<()> {
        self.check_not_restoring()?;
        if let Some(n) = self.importing {
            return Err(Error::Busy(format!(
                "checkpoint {n} imports backends; try again when it completes"
            )));
        }
        Ok(())
    }

    /// Refuse a checkpoint for lack of room (EBUSY): one that `imports` waits for no other,
    /// so it is refused while others are in flight; any is refused at `max_concurrent` in
    /// flight.
    pub fn check_room(&self, imports: bool, max_concurrent: usize) -> Result<()> {
        if imports && !self.in_flight.is_empty() {
            return Err(Error::Busy(format!(
                "an import waits for the checkpoints in flight ({}) to complete; \
                 try again when they have",
                self.in_flight
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if self.in_flight.len() >= max_concurrent {
            return Err(Error::Busy(format!(
                "{} checkpoint(s) already in flight (max_concurrent = {}); try \
                 again when it completes",
                self.in_flight.len(),
                max_concurrent
            )));
        }
        Ok(())
    }

    /// Checkpoint `id` enters flight (admitted by [`Flight::check_open`] and
    /// [`Flight::check_room`]); one that `imports` takes the import slot.
    pub fn enter(&mut self, id: u64, imports: bool) {
        self.in_flight.insert(id);
        if imports {
            self.importing = Some(id);
        }
    }

    /// Checkpoint `id` leaves flight (committed, failed, or its id never reserved): its
    /// slot, and the import slot if it held it, are free again.
    pub fn leave(&mut self, id: u64) {
        self.in_flight.remove(&id);
        if self.importing == Some(id) {
            self.importing = None;
        }
    }

    /// Refuse to drop checkpoint `id` (EBUSY) while a restore runs or while it is in flight.
    pub fn check_droppable(&self, id: u64) -> Result<()> {
        self.check_not_restoring()?;
        if self.in_flight.contains(&id) {
            return Err(Error::Busy(format!("checkpoint {id} is still in flight")));
        }
        Ok(())
    }

    /// Refuse a restore (EBUSY) while a checkpoint or another restore is in flight.
    pub fn check_restore(&self) -> Result<()> {
        if !self.in_flight.is_empty() || self.restoring {
            return Err(Error::Busy(
                "cannot restore while a checkpoint or restore is in flight".into(),
            ));
        }
        Ok(())
    }

    /// A restore (admitted by [`Flight::check_restore`]) begins, or ends.
    pub fn set_restoring(&mut self, restoring: bool) {
        self.restoring = restoring;
    }

    /// The checkpoints in flight, ascending.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.in_flight.iter().copied()
    }

    /// No checkpoint in flight.
    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }
}

/// Refuse an import into a backend a daemon of this store hosts (`hosted`, the store's
/// metadata): its RocksDB runs there (EINVAL). The rule of [`Engine::check_import_into`](super::Engine::check_import_into).
pub(super) fn check_not_hosted<'a>(
    hosted: &[BackendName],
    imports: impl IntoIterator<Item = &'a BackendName>,
) -> Result<()> {
    if let Some(name) = imports.into_iter().find(|name| hosted.contains(name)) {
        return Err(Error::Invalid(format!(
            "backend {name} is hosted (a daemon of this store runs its RocksDB): \
             import into another name"
        )));
    }
    Ok(())
}

/// The files of the newest confirmed checkpoint of one backend's lineage: the only files a
/// new checkpoint may re-reference by name.
#[derive(Debug, Clone)]
pub(super) struct Base {
    pub checkpoint: u64,
    pub by_name: Arc<HashMap<String, Arc<FileEntry>>>,
    /// The checkpoint's file list of this backend: the base of the next one's.
    pub list: FileList,
}

/// `snapshot`, of checkpoint `checkpoint`, as the base of its backend's next checkpoint.
pub(super) fn base_of(checkpoint: u64, snapshot: &BackendSnapshot) -> Base {
    Base {
        checkpoint,
        by_name: Arc::new(
            snapshot
                .files
                .iter()
                .map(|f| (f.name.clone(), f.clone()))
                .collect(),
        ),
        list: snapshot.file_list(),
    }
}

/// The lineage each hosted backend's live database runs in, and the base a new checkpoint
/// of it builds on (the newest confirmed checkpoint of that lineage).
#[derive(Debug, Default)]
pub(super) struct Lineages {
    lineages: HashMap<BackendName, String>,
    bases: HashMap<BackendName, Base>,
}

impl Lineages {
    /// The lineages the backends opened in, and the bases found for them.
    pub fn new(lineages: HashMap<BackendName, String>, bases: HashMap<BackendName, Base>) -> Self {
        Lineages { lineages, bases }
    }

    /// Does `name`'s live database still run in `lineage`?
    pub fn is_current(&self, name: &BackendName, lineage: &str) -> bool {
        self.lineages.get(name).map(String::as_str) == Some(lineage)
    }

    /// The base of `name`'s next checkpoint.
    pub fn base(&self, name: &BackendName) -> Option<&Base> {
        self.bases.get(name)
    }

    /// Every backend's base (a checkpoint's slot takes them as they are when it begins).
    pub fn bases(&self) -> &HashMap<BackendName, Base> {
        &self.bases
    }

    /// `name` runs from `snapshot` of checkpoint `id` now, in `lineage` (restored).
    pub fn restored(
        &mut self,
        name: &BackendName,
        lineage: String,
        id: u64,
        snapshot: &BackendSnapshot,
    ) {
        self.lineages.insert(name.clone(), lineage);
        self.bases.insert(name.clone(), base_of(id, snapshot));
    }

    /// Checkpoint `id` committed `snapshot`: the base of its backend's next checkpoint if
    /// the snapshot is of the lineage the backend runs in and newer than the base.
    pub fn committed(&mut self, id: u64, snapshot: &BackendSnapshot) {
        let current = self.is_current(&snapshot.name, &snapshot.lineage);
        let newer = self
            .bases
            .get(&snapshot.name)
            .is_none_or(|b| b.checkpoint < id);
        if current && newer {
            self.bases
                .insert(snapshot.name.clone(), base_of(id, snapshot));
        }
    }
}

/// What `status` reports of the engine's health.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// The newest error recorded (see [`super::EngineStatus::last_error`]).
    pub last_error: Option<String>,
    /// Small SSTs merged by small-file compaction since start: files, bytes.
    pub small_file_compactions: (u64, u64),
}

impl Health {
    /// Small-file compaction merged `files` SSTs of `bytes`.
    pub fn compacted(&mut self, files: u64, bytes: u64) {
        self.small_file_compactions.0 += files;
        self.small_file_compactions.1 += bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn busy(result: Result<()>) -> String {
        match result {
            Err(e) if e.kind() == ErrorKind::Busy => e.to_string(),
            other => panic!("expected EBUSY, got {other:?}"),
        }
    }

    #[test]
    fn an_empty_flight_admits_any_checkpoint() {
        let flight = Flight::default();
        flight.check_open().unwrap();
        flight.check_room(false, 1).unwrap();
        flight.check_room(true, 1).unwrap();
        flight.check_droppable(7).unwrap();
        flight.check_restore().unwrap();
    }

    #[test]
    fn a_restore_refuses_checkpoints_drops_metadata_and_another_restore() {
        let mut flight = Flight::default();
        flight.set_restoring(true);
        assert!(busy(flight.check_open()).contains("a restore is in progress"));
        assert!(busy(flight.check_not_restoring()).contains("a restore is in progress"));
        assert!(busy(flight.check_droppable(3)).contains("a restore is in progress"));
        assert!(busy(flight.check_restore()).contains("cannot restore"));
        flight.set_restoring(false);
        flight.check_open().unwrap();
        flight.check_restore().unwrap();
    }

    #[test]
    fn an_import_in_flight_holds_the_import_slot_until_it_leaves() {
        let mut flight = Flight::default();
        flight.check_room(true, 4).unwrap();
        flight.enter(5, true);
        let e = busy(flight.check_open());
        assert!(e.contains("checkpoint 5 imports backends"), "{e}");
        // Not the refusal of a full flight: there is room for 4.
        flight.check_room(false, 4).unwrap();
        flight.leave(5);
        flight.check_open().unwrap();
        assert!(flight.is_empty());
    }

    #[test]
    fn an_import_waits_for_every_checkpoint_in_flight() {
        let mut flight = Flight::default();
        flight.enter(2, false);
        flight.enter(3, false);
        flight.check_open().unwrap();
        let e = busy(flight.check_room(true, 10));
        assert!(e.contains("checkpoints in flight (2, 3)"), "{e}");
        flight.check_room(false, 10).unwrap();
        flight.leave(2);
        flight.leave(3);
        flight.check_room(true, 10).unwrap();
    }

    #[test]
    fn max_concurrent_checkpoints_fill_the_flight() {
        let mut flight = Flight::default();
        flight.enter(1, false);
        flight.check_room(false, 2).unwrap();
        flight.enter(2, false);
        let e = busy(flight.check_room(false, 2));
        assert!(
            e.contains("2 checkpoint(s) already in flight (max_concurrent = 2)"),
            "{e}"
        );
        assert_eq!(flight.ids().collect::<Vec<_>>(), [1, 2]);
        // One leaving makes room; a checkpoint that is not the importer leaves no slot.
        flight.leave(1);
        flight.check_room(false, 2).unwrap();
    }

    #[test]
    fn a_checkpoint_in_flight_is_neither_dropped_nor_restored_over() {
        let mut flight = Flight::default();
        flight.enter(9, false);
        let e = busy(flight.check_droppable(9));
        assert!(e.contains("checkpoint 9 is still in flight"), "{e}");
        flight.check_droppable(8).unwrap();
        assert!(busy(flight.check_restore()).contains("cannot restore"));
        flight.leave(9);
        flight.check_droppable(9).unwrap();
        flight.check_restore().unwrap();
    }

    #[test]
    fn an_import_into_a_backend_the_store_hosts_is_invalid() {
        let hosted: Vec<BackendName> = vec!["A/0".parse().unwrap()];
        let (a, b): (BackendName, BackendName) = ("A/0".parse().unwrap(), "B/0".parse().unwrap());
        check_not_hosted(&hosted, [&b]).unwrap();
        let e = check_not_hosted(&hosted, [&b, &a]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid);
        assert!(e.to_string().contains("backend A/0 is hosted"), "{e}");
    }

    fn snapshot(name: &str, lineage: &str) -> BackendSnapshot {
        BackendSnapshot {
            name: name.parse().unwrap(),
            lineage: lineage.into(),
            files: Default::default(),
            lists: Default::default(),
        }
    }

    #[test]
    fn a_base_advances_only_within_the_current_lineage_and_forward() {
        let a: BackendName = "A/0".parse().unwrap();
        let mut lineages = Lineages::new([(a.clone(), "one".to_string())].into(), HashMap::new());
        lineages.committed(4, &snapshot("A/0", "old"));
        assert!(lineages.base(&a).is_none());
        lineages.committed(4, &snapshot("A/0", "one"));
        lineages.committed(3, &snapshot("A/0", "one"));
        assert_eq!(lineages.base(&a).unwrap().checkpoint, 4);
        lineages.restored(&a, "two".into(), 2, &snapshot("A/0", "one"));
        assert!(lineages.is_current(&a, "two"));
        assert_eq!(lineages.base(&a).unwrap().checkpoint, 2);
        lineages.committed(5, &snapshot("A/0", "one"));
        assert_eq!(lineages.base(&a).unwrap().checkpoint, 2);
    }
}
