//! Taking a checkpoint: the synchronous phase (flush, hard links into staging), the
//! asynchronous upload of what the store does not hold yet, the commit of the manifest,
//! registration and retention.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use super::ingest::{Ingest, PendingBackend};
use super::materialize::StagedBackend;
use super::state::{base_of, Base};
use super::{CatalogWrites, Engine, State};
use crate::backend::StagedFile;
use crate::catalog::{BackendSnapshot, CheckpointStats, Manifest, StoreMeta, FORMAT};
use crate::error::{Error, ErrorKind, Result};
use crate::fsutil::{create_private_dir_all, now_unix_ms, remove_tree};
use crate::import::{Scanned, ScannedFile};
use crate::names::BackendName;
use crate::store::crash::CrashAfter;
use crate::store::{ObjectId, ObjectStore};

/// What a checkpoint holds. The hosted backends are always staged; the plan says which
/// backends are imported and what becomes of the store's other backends.
#[derive(Debug)]
pub enum CheckpointPlan {
    /// The hosted backends; every other backend of the store is carried over unchanged
    /// from the newest checkpoint.
    Hosted,
    /// The hosted backends and these imports (RocksDB checkpoint directories checked by
    /// [`crate::import::scan`]), each the state of its backend, an external one from now
    /// on; every other backend is carried over unchanged (`ckptfs import`).
    Import(Vec<Scanned>),
    /// The hosted backends and these imports, nothing carried over: an application's
    /// checkpoint that names every backend it has (a Flink checkpoint: an operator no
    /// longer in the job is gone).
    Application(Vec<Scanned>),
}

impl CheckpointPlan {
    /// The imports, and whether the other backends are carried over.
    fn into_parts(self) -> (Vec<Scanned>, bool) {
        match self {
            CheckpointPlan::Hosted => (Vec::new(), true),
            CheckpointPlan::Import(imports) => (imports, true),
            CheckpointPlan::Application(imports) => (imports, false),
        }
    }
}

impl Engine {
    /// [`Engine::begin`] of a checkpoint of the hosted backends ([`CheckpointPlan::Hosted`]).
    pub fn begin_checkpoint(&self) -> Result<PendingCheckpoint> {
        self.begin(CheckpointPlan::Hosted)
    }

    /// The synchronous phase of a checkpoint as `plan` says: take a slot and reserve an
    /// id, then stage every hosted backend's files (RocksDB's native checkpoint: hard
    /// links, a flush in `flush` mode; see [`super::materialize`]) and pin what the imports
    /// and the carried backends re-reference. Writers may continue as soon as this returns.
    /// A checkpoint that imports is the only one in flight.
    pub fn begin(&self, plan: CheckpointPlan) -> Result<PendingCheckpoint> {
        self.check_writable()?;
        let (imports, carry) = plan.into_parts();
        self.check_imports(&imports)?;
        let started_unix_ms = now_unix_ms();
        let slot = self.take_slot(&imports)?;
        let (id, bases) = (slot.id, slot.bases.clone());
        let clock = Instant::now();
        let mut pending = PendingCheckpoint {
            engine: self.clone(),
            id,
            parts: Vec::new(),
            carried: Vec::new(),
            scanned: Vec::new(),
            flink: None,
            staging: self
                .inner
                .state_dir
                .join(crate::store::layout::STAGING)
                .join(id.to_string()),
            started: clock,
            started_unix_ms,
            sync_micros: 0,
            pins: Vec::new(),
            stats: CheckpointStats::default(),
            list_bytes: 0,
            finished: false,
            keep_objects: false,
            reserved: false,
        };
        // The id's reservation is written while the hosted backends are staged (a wait on
        // the disk beside RocksDB's flush): nothing staged is durable, and nothing names the
        // id durably before its manifest, which follows the reservation.
        let (reserved, staged) = if self.inner.backends.is_empty() {
            (self.reserve(slot), Ok(()))
        } else {
            std::thread::scope(|scope| {
                let staging = scope.spawn(|| self.stage_hosted(&mut pending, &bases, clock));
                let reserved = self.reserve(slot);
                (
                    reserved,
                    staging.join().expect("a sync phase thread panicked"),
                )
            })
        };
        if let Err(e) = reserved {
            pending.fail(&e);
            return Err(e);
        }
        pending.reserved = true;
        // The first failure fails the checkpoint; what every part pinned is released then.
        let held = self.hold_imports(&mut pending, imports, carry);
        pending.sync_micros = clock.elapsed().as_micros() as u64;
        match staged.and(held) {
            Ok(()) => Ok(pending),
            Err(e) => {
                pending.fail(&e);
                Err(e)
            }
        }
    }

    /// Refuse imports this engine cannot take: a backend the store hosts, or one imported
    /// twice.
    fn check_imports(&self, imports: &[Scanned]) -> Result<()> {
        let mut seen = BTreeSet::new();
        for import in imports {
            self.check_import_into(&import.backend)?;
            if !seen.insert(&import.backend) {
                return Err(Error::Invalid(format!(
                    "backend {} is imported twice in one checkpoint",
                    import.backend
                )));
            }
        }
        Ok(())
    }

    /// Take a slot for a checkpoint: its id and the bases of the hosted backends, and the
    /// metadata that reserves the id ([`Engine::reserve`] writes it, before anything of
    /// the checkpoint is stored). A checkpoint that imports waits for no other: it is
    /// refused while others are in flight, and takes the import slot, which refuses every
    /// other checkpoint until it leaves flight.
    fn take_slot(&self, imports: &[Scanned]) -> Result<Slot<'_>> {
        let writes = self.catalog_writes();
        let (id, meta, bases) = {
            let mut st = self.state();
            st.flight.check_open()?;
            st.flight
                .check_room(!imports.is_empty(), self.inner.max_concurrent)?;
            let id = st.meta.next_checkpoint;
            let mut meta = st.meta.clone();
            meta.next_checkpoint += 1;
            if self.inner.catalog.commits_in_meta() {
                // Reserved, not committed: a manifest of this id counts only once a
                // later write of the metadata confirms it.
                meta.pending.push(id);
            }
            st.flight.enter(id, !imports.is_empty());
            (id, meta, st.lineages.bases().clone())
        };
        Ok(Slot {
            id,
            meta,
            bases,
            _writes: writes,
        })
    }

    /// Write the metadata that reserves a slot's id (durably), then adopt it. The state
    /// lock is not held meanwhile: the slot is taken already; the catalog's writes are
    /// (by the slot), so no other write of the metadata comes in between. On failure the
    /// checkpoint fails (its pending checkpoint releases the slot).
    fn reserve(&self, slot: Slot<'_>) -> Result<()> {
        self.inner.catalog.save_meta(&slot.meta)?;
        self.state().meta = slot.meta;
        Ok(())
    }

    /// A checkpoint leaves flight (committed, failed, or its id never reserved): its slot,
    /// and the import slot if it held it, are free again.
    pub(super) fn leave_flight(&self, st: &mut State, id: u64) {
        st.flight.leave(id);
        self.inner.slot_freed.notify_all();
    }

    /// Stage every hosted backend at once into `pending` (a backend's staging waits on its
    /// own flush in flush mode, or its WAL links in wal mode, not on the others'); the
    /// first failure, after every backend's pins are taken into `pending`.
    fn stage_hosted(
        &self,
        pending: &mut PendingCheckpoint,
        bases: &HashMap<BackendName, Base>,
        clock: Instant,
    ) -> Result<()> {
        let staging = &pending.staging;
        let stage = |name: &BackendName| {
            let mut pins = Vec::new();
            let dir = staging.join(name.rel_path());
            let parent = dir.parent().expect("backend paths have a parent");
            let staged = create_private_dir_all(parent)
                .and_then(|()| self.stage_backend(name, &dir, clock, &mut pins));
            (staged, pins)
        };
        let names: Vec<&BackendName> = self.inner.backends.keys().collect();
        let staged: Vec<(Result<StagedBackend>, Vec<ObjectId>)> = if names.len() == 1 {
            vec![stage(names[0])]
        } else {
            std::thread::scope(|scope| {
                let threads: Vec<_> = names
                    .iter()
                    .map(|name| scope.spawn(|| stage(name)))
                    .collect();
                threads
                    .into_iter()
                    .map(|t| t.join().expect("a sync phase thread panicked"))
                    .collect()
            })
        };
        let mut sync = Ok(());
        for (name, (result, backend_pins)) in names.into_iter().zip(staged) {
            pending.pins.extend(backend_pins);
            match result {
                Ok(staged) => {
                    pending.stats.bytes_uploaded_materialization += staged.uploaded_before;
                    pending.parts.push(PendingBackend {
                        name: name.clone(),
                        lineage: staged.lineage,
                        files: staged.files,
                        kept: staged.kept,
                        materializes: staged.materializes,
                        base: bases.get(name).cloned(),
                        by_source_only: false,
                    });
                }
                Err(e) if sync.is_ok() => sync = Err(e),
                Err(_) => {}
            }
        }
        sync
    }

    /// Take the imports and (with `carry`) the carried backends into `pending`: what they
    /// re-reference is pinned now, under the lock (nothing the newest checkpoint holds can
    /// be deleted before). The first failure: an object to carry or re-reference that is
    /// missing or being deleted.
    fn hold_imports(
        &self,
        pending: &mut PendingCheckpoint,
        imports: Vec<Scanned>,
        carry: bool,
    ) -> Result<()> {
        let id = pending.id;
        let pins = &mut pending.pins;
        let (carried, pinned, imported) = {
            let mut st = self.state();
            let carried = if carry {
                self.carry_over(&st, &imports)
            } else {
                Vec::new()
            };
            let pinned = carried
                .iter()
                .try_for_each(|snapshot| pin_snapshot(&mut st, snapshot, pins));
            let imported: Vec<(PendingBackend, Vec<ScannedFile>)> = imports
                .into_iter()
                .map(|import| import_part(&mut st, id, import, pins))
                .collect();
            (carried, pinned, imported)
        };
        pending.carried = carried;
        let mut held = pinned;
        for (part, files) in imported {
            let kept = |name: &str| part.kept.iter().any(|k| k.name == name);
            if let (Some(lost), true) = (
                files.iter().find(|f| f.is_stored() && !kept(&f.name)),
                held.is_ok(),
            ) {
                held = Err(Error::Busy(format!(
                    "{}/{} was in the store when listed and is being deleted now: import again \
                     (it is then fetched)",
                    part.name, lost.name
                )));
            }
            pending.parts.push(part);
            pending.scanned.push(files);
        }
        held
    }
}

/// What one import of a checkpoint read and stored (the answer to `ckptfs import`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImportReport {
    /// The backend imported into.
    pub backend: BackendName,
    /// The directory's files and bytes.
    pub files: u64,
    /// The bytes of those files.
    pub bytes: u64,
    /// Files read (hashed or copied here): those neither re-referenced by their source nor
    /// copied by the object store itself (see `CheckpointStats::bytes_copied`).
    pub files_read: u64,
    /// The bytes of the files read.
    pub bytes_read: u64,
    /// Bytes the store did not hold yet (file list excluded).
    pub bytes_stored: u64,
}

impl Engine {
    /// The newest snapshot of every backend of the store that this checkpoint neither
    /// hosts nor imports.
    fn carry_over(&self, st: &State, imports: &[Scanned]) -> Vec<BackendSnapshot> {
        let mut carried: std::collections::BTreeMap<&BackendName, &BackendSnapshot> =
            Default::default();
        for snapshot in st.held.manifests.values().flat_map(|m| &m.backends) {
            let name = &snapshot.name;
            if !self.inner.backends.contains_key(name)
                && !imports.iter().any(|i| &i.backend == name)
            {
                carried.insert(name, snapshot);
            }
        }
        carried.into_values().cloned().collect()
    }
}

/// Pin every object a snapshot references (its files and its file lists): it is carried
/// into a new checkpoint as it is.
fn pin_snapshot(
    st: &mut MutexGuard<'_, State>,
    snapshot: &BackendSnapshot,
    pins: &mut Vec<ObjectId>,
) -> Result<()> {
    let objects: Vec<ObjectId> = snapshot
        .files
        .iter()
        .flat_map(|f| f.stored().map(|(id, _)| id))
        .chain(snapshot.lists.iter())
        .collect();
    if let Some(gone) = objects.iter().find(|id| !st.can_share(id)) {
        return Err(Error::Corrupt(format!(
            "backend {} cannot be carried over: object {gone} of its newest checkpoint is \
             missing; run `ckptfs fsck`, and import the backend again (which stores it anew)",
            snapshot.name
        )));
    }
    for id in objects {
        st.held.registry.pin(id);
        pins.push(id);
    }
    Ok(())
}

/// Whether an imported file `name` read from `source`, of `size` bytes, is `known` (the
/// backend's newest snapshot's entry of that name) and is re-referenced without being read.
/// Only SSTs and blob files are never rewritten, and only a source that names content is
/// trusted to tell that nothing changed: an SST's identity from its table properties
/// (`sst:`, [`crate::source::sst`]), the content hash of a file Flink inlined (`inline:`),
/// or an object's key in the source's bucket (`s3://`: Flink never rewrites an uploaded
/// file). A stamp (device, inode, size, mtime) is not: `cp -p`, `rsync -t`, a restore
/// from backup and a filesystem that reuses a freed inode keep it for other bytes.
pub(super) fn reusable_by_source(
    known: &crate::catalog::FileEntry,
    name: &str,
    source: Option<&str>,
    size: u64,
) -> bool {
    let names_content = |s: &str| {
        crate::source::sst::is_identity(s) || s.starts_with("inline:") || s.starts_with("s3://")
    };
    crate::backend::is_shared_file(name)
        && source.is_some_and(names_content)
        && known.source.as_deref() == source
        && known.size == size
}

/// An import as a backend of checkpoint `id`: a file whose source and name are those of
/// the backend's newest snapshot is re-referenced (pinned now, not read); the others are
/// read in the asynchronous phase. The base is that snapshot (its file list is the base of
/// the new one).
fn import_part(
    st: &mut MutexGuard<'_, State>,
    id: u64,
    import: Scanned,
    pins: &mut Vec<ObjectId>,
) -> (PendingBackend, Vec<ScannedFile>) {
    let base = st
        .held
        .manifests
        .iter()
        .rev()
        .find_map(|(n, m)| m.backend(&import.backend).map(|s| base_of(*n, s)));
    let mut part = PendingBackend::new(
        import.backend.clone(),
        format!("import-{id}"),
        Vec::new(),
        base,
    );
    part.by_source_only = true;
    for file in &import.files {
        let known = part
            .base
            .as_ref()
            .and_then(|b| b.by_name.get(&file.name))
            .filter(|known| {
                reusable_by_source(known, &file.name, file.source.as_deref(), file.size)
            })
            .cloned();
        if let Some(known) = known {
            let objects: Vec<ObjectId> = known.stored().map(|(id, _)| id).collect();
            if objects.iter().all(|id| st.can_share(id)) {
                for id in objects {
                    st.held.registry.pin(id);
                    pins.push(id);
                }
                part.kept.push(known);
                continue;
            }
        }
        if file.is_stored() {
            // Expected in the store and no longer there to share (being deleted): the
            // checkpoint fails below; the next one fetches the file.
            continue;
        }
        part.files.push(StagedFile {
            name: file.name.clone(),
            path: file.path.clone(),
            size: file.size,
            source: file.source.clone(),
            column_family: file.column_family.clone(),
            remote: file.remote_file().cloned(),
        });
    }
    (part, import.files)
}

/// A checkpoint's slot, taken: its id, the bases of the hosted backends, and the metadata
/// that reserves the id, with the catalog's writes held until it is written.
struct Slot<'a> {
    id: u64,
    meta: StoreMeta,
    bases: HashMap<BackendName, Base>,
    _writes: CatalogWrites<'a>,
}

/// A checkpoint between its synchronous phase and its completion. Completing it runs the
/// asynchronous phase; dropping it without completing aborts it and leaves nothing behind.
pub struct PendingCheckpoint {
    engine: Engine,
    id: u64,
    parts: Vec<PendingBackend>,
    staging: PathBuf,
    started: Instant,
    started_unix_ms: u64,
    sync_micros: u64,
    pins: Vec<ObjectId>,
    /// Backends neither hosted nor imported: their newest snapshots, unchanged (pinned).
    carried: Vec<BackendSnapshot>,
    /// The imported backends' files as listed, in the order of their parts (the last
    /// ones of `parts`): checked again once stored.
    scanned: Vec<Vec<ScannedFile>>,
    /// Figures gathered in the synchronous phase (a background materialization adopted).
    stats: CheckpointStats,
    /// The Flink checkpoint this one imports, for its manifest.
    flink: Option<crate::catalog::FlinkLabel>,
    /// Bytes of file lists stored (in `bytes_uploaded`, not in `bytes_total`): the
    /// engine's counters tell file bytes uploaded from reused ones with it.
    list_bytes: u64,
    finished: bool,
    /// The manifest may exist on disk after a failed commit: delete nothing, let the next
    /// start decide from what is durable.
    keep_objects: bool,
    /// The id's reservation was written: a failure from here on voids the id (object
    /// storage). One that was not must not: the next checkpoint takes the same id.
    reserved: bool,
}

impl PendingCheckpoint {
    /// The id reserved for the checkpoint.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Microseconds the synchronous phase took.
    pub fn sync_micros(&self) -> u64 {
        self.sync_micros
    }

    /// Label the checkpoint with the Flink checkpoint it imports.
    pub fn set_flink(&mut self, label: crate::catalog::FlinkLabel) {
        self.flink = Some(label);
    }

    /// The asynchronous phase: store what is new, re-reference the rest, commit, register,
    /// apply retention.
    pub fn complete(self) -> Result<Arc<Manifest>> {
        self.complete_with_imports().map(|(manifest, _)| manifest)
    }

    /// [`PendingCheckpoint::complete`], with what each import read and stored.
    pub fn complete_with_imports(mut self) -> Result<(Arc<Manifest>, Vec<ImportReport>)> {
        crate::failpoint!("checkpoint::after-sync");
        let clock = Instant::now();
        match self.upload(None) {
            Ok((backends, mut stats, reports)) => {
                stats.sync_micros = self.sync_micros;
                stats.async_micros = clock.elapsed().as_micros() as u64;
                let manifest = Manifest {
                    format: FORMAT,
                    id: self.id,
                    started_unix_ms: self.started_unix_ms,
                    completed_unix_ms: now_unix_ms(),
                    backends,
                    stats,
                    flink: self.flink.take(),
                };
                match self.commit(manifest) {
                    Ok(m) => {
                        self.engine.inner.counters.imports_completed(&reports);
                        self.engine.trim_memory();
                        Ok((m, reports))
                    }
                    Err(e) => {
                        self.fail(&e);
                        Err(e)
                    }
                }
            }
            Err(e) => {
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Abort: release everything this checkpoint stored or matched.
    pub fn abort(self) {
        let e = Error::Aborted {
            checkpoint: self.id,
        };
        self.fail(&e);
    }

    /// Test hook: store at most `uploads` new objects, then stop as if the process had been
    /// killed there: no cleanup, no manifest. Recovery at the next start must sweep it.
    #[doc(hidden)]
    pub fn simulate_crash(mut self, uploads: usize) {
        let _ = self.upload(Some(uploads));
        self.finished = true;
    }

    /// Store every backend's files and file list; with `crash_after`, publish at most that
    /// many objects (the test hook).
    #[allow(clippy::type_complexity)]
    fn upload(
        &mut self,
        crash_after: Option<usize>,
    ) -> Result<(Vec<BackendSnapshot>, CheckpointStats, Vec<ImportReport>)> {
        let mut stats = self.stats.clone();
        let store = self.engine.inner.store.as_ref();
        let crash;
        let store: &dyn ObjectStore = match crash_after {
            Some(uploads) => {
                crash = CrashAfter::new(store, uploads);
                &crash
            }
            None => store,
        };
        let mut snapshots = Vec::new();
        let mut reports = Vec::new();
        let hosted = self.parts.len() - self.scanned.len();
        let mut ingest = Ingest::new(&self.engine, store, &mut self.pins, &mut stats);
        for (index, part) in self.parts.iter().enumerate() {
            let before = ingest.uploaded();
            let entries = ingest.backend(part)?;
            if let Some(scanned) = index.checked_sub(hosted).map(|i| &self.scanned[i]) {
                // Read (or re-referenced) as listed: a file written meanwhile fails it.
                for file in scanned {
                    file.check_unchanged()?;
                }
                reports.push(ImportReport {
                    backend: part.name.clone(),
                    files: scanned.len() as u64,
                    bytes: scanned.iter().map(|f| f.size).sum(),
                    files_read: part.files.iter().filter(|f| f.remote.is_none()).count() as u64,
                    bytes_read: part
                        .files
                        .iter()
                        .filter(|f| f.remote.is_none())
                        .map(|f| f.size)
                        .sum(),
                    bytes_stored: ingest.uploaded() - before,
                });
            }
            let list = ingest.list(part, entries)?;
            snapshots.push(BackendSnapshot {
                name: part.name.clone(),
                lineage: part.lineage.clone(),
                files: list.files,
                lists: list.chain,
            });
        }
        self.list_bytes += ingest.list_bytes();
        for carried in &self.carried {
            for file in carried.files.iter() {
                stats.files_total += 1;
                stats.files_reused += 1;
                stats.bytes_total += file.size;
            }
            snapshots.push(carried.clone());
        }
        snapshots.sort_by(|a, b| a.name.cmp(&b.name));
        stats.backends_materialized += self
            .parts
            .iter()
            .filter(|p| p.materializes.is_some())
            .count() as u64;
        Ok((snapshots, stats, reports))
    }

    fn commit(&mut self, manifest: Manifest) -> Result<Arc<Manifest>> {
        let engine = self.engine.clone();
        let inner = &engine.inner;
        // The catalog's requests run without the state lock (see Inner::catalog_writes).
        let writes = engine.catalog_writes();
        // Every object the manifest names is durable before it is: this checkpoint's
        // (published unsynced, see `Ingest::publish`) and any it re-references.
        inner.store.sync_published()?;
        crate::failpoint!("checkpoint::before-commit");
        if inner.catalog.commits_in_meta() {
            // Object storage: the manifest, then the metadata that confirms it (the commit
            // point, conditional: it fails if another writer took the store meanwhile).
            let confirmed = inner.catalog.commit(&manifest).and_then(|()| {
                crate::failpoint!("checkpoint::before-confirm");
                let mut meta = engine.state().meta.clone();
                meta.pending.retain(|p| *p != manifest.id);
                self.note_external(&mut meta);
                inner.catalog.save_meta(&meta)?;
                engine.state().meta = meta;
                Ok(())
            });
            if let Err(e) = confirmed {
                // Not committed: the id stays pending (void from the next write on, see
                // `release`), but its manifest may exist: the objects are left to the
                // orphan sweep.
                self.keep_objects = true;
                return Err(e);
            }
        } else if let Err(e) = inner.catalog.commit(&manifest) {
            if e.kind() == ErrorKind::Exists {
                // Another writer's manifest of that id (a daemon that took the lease over):
                // never ours to remove, and our objects are left to the orphan sweep.
                self.keep_objects = true;
                return Err(e);
            }
            // The rename may have happened even if a later fsync failed. If the manifest
            // cannot be removed (durably), it may still name our objects: leave them to the
            // sweep at the next start instead of deleting them.
            if let Err(remove) = inner.catalog.remove(manifest.id) {
                log::warn!("checkpoint {}: manifest may remain: {remove}", manifest.id);
                self.keep_objects = true;
            }
            return Err(e);
        }
        if !inner.catalog.commits_in_meta() {
            // A local store commits with the manifest; a backend imported for the first
            // time is recorded as external now (if this write is lost, the next start
            // finds it from the manifest: see `open`).
            let mut meta = engine.state().meta.clone();
            if self.note_external(&mut meta) {
                match inner.catalog.save_meta(&meta) {
                    Ok(()) => engine.state().meta = meta,
                    Err(e) => log::warn!(
                        "checkpoint {}: could not record its imported backends as external \
                         ({e}); the next start does",
                        manifest.id
                    ),
                }
            }
        }
        let id = manifest.id;
        crate::failpoint!("checkpoint::after-commit");
        let mut st = engine.state();
        st.held
            .registry
            .register_checkpoint(id, manifest.object_refs());
        st.held.registry.set_sizes(manifest.stored_sizes());
        crate::failpoint!("checkpoint::after-register");
        engine.release_pins(&mut st, self.pins.drain(..));
        engine.leave_flight(&mut st, id);
        let mut prune = Vec::new();
        let state = &mut *st;
        for (part, snapshot) in self
            .parts
            .iter()
            .filter_map(|p| manifest.backend(&p.name).map(|s| (p, s)))
        {
            let below = state
                .wal
                .committed(&state.lineages, id, self.started, part, snapshot);
            if let Some(below) = below {
                prune.push((part.name.clone(), below));
            }
        }
        for snapshot in &manifest.backends {
            state.lineages.committed(id, snapshot);
        }
        let manifest = Arc::new(manifest);
        st.held.manifests.insert(id, manifest.clone());
        inner
            .counters
            .checkpoint_completed(&manifest.stats, self.list_bytes);
        log::info!(
            "checkpoint {id} complete: {} files ({} reused), {} bytes uploaded",
            manifest.stats.files_total,
            manifest.stats.files_reused,
            manifest.stats.bytes_uploaded
        );
        drop(st);
        let retention = engine.apply_retention(&writes);
        drop(writes);
        engine.prune_wal_archives(&prune);
        self.finished = true;
        if let Err(e) = remove_tree(&self.staging) {
            log::warn!("could not remove staging of checkpoint {id}: {e}");
        }
        // The checkpoint itself is durable; a retention failure is reported separately.
        if let Err(e) = retention {
            log::warn!("retention after checkpoint {id} failed: {e}");
            engine.record_error(format!("retention after checkpoint {id} failed: {e}"));
        }
        Ok(manifest)
    }

    /// Record this checkpoint's imported backends as external in `meta`; true if any was
    /// not yet.
    fn note_external(&self, meta: &mut crate::catalog::StoreMeta) -> bool {
        let hosted = self.parts.len() - self.scanned.len();
        let mut added = false;
        for part in &self.parts[hosted..] {
            if !meta.external.contains(&part.name) {
                meta.external.push(part.name.clone());
                added = true;
            }
        }
        meta.external.sort();
        added
    }

    fn fail(mut self, error: &Error) {
        self.release(Some(error));
    }

    fn release(&mut self, error: Option<&Error>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let engine = self.engine.clone();
        // The metadata may change below (never held here by this thread: see `commit`).
        let _writes = engine.catalog_writes();
        let mut st = engine.state();
        if self.keep_objects {
            // Not only now: no later drop may delete them either.
            log::warn!(
                "checkpoint {}: keeping its {} objects for recovery to judge",
                self.id,
                self.pins.len()
            );
            st.held.kept.extend(self.pins.iter().copied());
        }
        engine.release_pins(&mut st, self.pins.drain(..));
        if engine.inner.catalog.commits_in_meta() && self.reserved {
            // Its reservation ends: void from the next write of the metadata on.
            st.meta.make_void(self.id);
        }
        engine.leave_flight(&mut st, self.id);
        // Not committed, whatever the reason (an error, an abort, a drop).
        engine.inner.counters.checkpoint_failed();
        engine
            .inner
            .counters
            .imports_failed
            .inc_by(self.scanned.len() as u64);
        if let Some(e) = error {
            log::warn!("checkpoint {} failed: {e}", self.id);
            engine.note_error(&mut st, format!("checkpoint {} failed: {e}", self.id));
        }
        drop(st);
        let _ = remove_tree(&self.staging);
    }
}

impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        self.release(None);
    }
}
