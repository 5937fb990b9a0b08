//! A stand-in for the engine in the tree's unit tests: checkpoints held in memory, built
//! by the test, whose files are real objects in a local store on a temporary directory.
//! It tests the tree without RocksDB, and sets up what the engine makes hard to reach: a
//! checkpoint dropped behind the tree's back, an object missing from the store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::ops::CkptFs;
use super::seam::{Checkpoints, ControlLines};
use crate::control::protocol::{Failure, Request};
use crate::control::{AnswerSink, ChangeHook, StagedImports};
use ckptfs_core::catalog::{
    BackendSnapshot, CheckpointStats, FileEntry, FlinkLabel, Manifest, FORMAT,
};
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;
use ckptfs_core::store::{LocalStore, ObjectId, ObjectStore};

/// Checkpoints in memory over a local object store.
pub struct Double {
    dir: tempfile::TempDir,
    store: LocalStore,
    manifests: Mutex<BTreeMap<u64, Arc<Manifest>>>,
    last_error: Mutex<Option<String>>,
    hook: Mutex<Option<ChangeHook>>,
    /// The pins the tree shows (set by the test).
    pub pins: Mutex<BTreeMap<String, u64>>,
    /// Pins handed to the tree so far, counted one per pin in each answer (what a tree
    /// that asks for all of them per link pays).
    pub pins_handed: std::sync::atomic::AtomicUsize,
}

/// What the double's control file answers every line with: it runs no commands.
pub const NO_CONTROL: &str = "the test double runs no control commands";

impl Double {
    pub fn new() -> Arc<Double> {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        Arc::new(Double {
            dir,
            store,
            manifests: Mutex::default(),
            last_error: Mutex::default(),
            hook: Mutex::default(),
            pins: Mutex::default(),
            pins_handed: Default::default(),
        })
    }

    /// The double with checkpoints 1..=n of backend `A/0`, each with the files a RocksDB
    /// checkpoint has: `CURRENT` and `IDENTITY` the same in all (one object each), the
    /// others different in each.
    pub fn with_checkpoints(n: u64) -> Arc<Double> {
        let double = Double::new();
        for id in 1..=n {
            let files = vec![
                double.file("CURRENT", b"MANIFEST-000005\n"),
                double.file("IDENTITY", b"d9f1c0de\n"),
                double.file("MANIFEST-000005", format!("manifest {id}").as_bytes()),
                double.file("OPTIONS-000007", format!("options {id}").as_bytes()),
                double.file("000009.sst", format!("k={id}").as_bytes()),
            ];
            double.add(id, vec![("A/0", files)]);
        }
        double
    }

    /// The tree over this double, verifying objects at first open as the daemon does.
    pub fn fs(self: &Arc<Self>) -> Arc<CkptFs> {
        CkptFs::with_parts(self.clone(), self.clone(), true)
    }

    /// A file of `bytes`, stored whole as an object.
    pub fn file(&self, name: &str, bytes: &[u8]) -> FileEntry {
        let staged = self.store.stage_bytes(bytes).unwrap();
        let (id, size) = (staged.id, staged.size);
        self.store.publish(staged).unwrap();
        FileEntry::whole(name, id, size)
    }

    /// Retain checkpoint `id` with these backends' files.
    pub fn add(&self, id: u64, backends: Vec<(&str, Vec<FileEntry>)>) {
        let backends = backends
            .into_iter()
            .map(|(name, files)| {
                BackendSnapshot::inline(name.parse().unwrap(), "lineage".into(), files)
            })
            .collect();
        let manifest = Manifest {
            format: FORMAT,
            id,
            started_unix_ms: 1_700_000_000_000 + id * 1000,
            completed_unix_ms: 1_700_000_000_000 + id * 1000 + 10,
            backends,
            stats: CheckpointStats::default(),
            flink: None,
        };
        lock(&self.manifests).insert(id, Arc::new(manifest));
    }

    /// Label checkpoint `id` as imported from Flink checkpoint `checkpoint` of `job`.
    pub fn label(&self, id: u64, job: &str, checkpoint: u64) {
        let mut manifests = lock(&self.manifests);
        let manifest = manifests.get_mut(&id).expect("a retained checkpoint");
        let mut labelled = (**manifest).clone();
        labelled.flink = Some(FlinkLabel {
            job: job.into(),
            checkpoint,
            operators: BTreeMap::new(),
            time_unix_ms: None,
        });
        *manifest = Arc::new(labelled);
    }

    /// Call the change hook, as the controller does after a checkpoint or a drop.
    pub fn tell(&self) {
        let hook = lock(&self.hook).clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// Drop checkpoint `id` without telling the tree, as a drop the change hook has not
    /// reported yet.
    pub fn forget(&self, id: u64) {
        assert!(
            lock(&self.manifests).remove(&id).is_some(),
            "no checkpoint {id}"
        );
    }

    /// Drop checkpoint `id` and call the change hook, as the controller does after a drop.
    pub fn drop_and_tell(&self, id: u64) {
        self.forget(id);
        let hook = lock(&self.hook).clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// Delete an object from the store, whatever references it.
    pub fn delete_object(&self, id: &ObjectId) {
        self.store.delete(id).unwrap();
    }

    /// The file `name` of checkpoint `id`'s backend `backend`.
    pub fn entry(&self, id: u64, backend: &str, name: &str) -> FileEntry {
        let manifest = self.manifest(id).unwrap();
        let snapshot = manifest
            .backends
            .iter()
            .find(|b| b.name.to_string() == backend)
            .unwrap();
        let file = snapshot.files.iter().find(|f| f.name == name).unwrap();
        (**file).clone()
    }

    /// The last error the tree recorded.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }
}

impl Checkpoints for Double {
    fn checkpoints(&self) -> Vec<Arc<Manifest>> {
        lock(&self.manifests).values().cloned().collect()
    }

    fn manifest(&self, id: u64) -> Option<Arc<Manifest>> {
        lock(&self.manifests).get(&id).cloned()
    }

    fn object_store(&self) -> &dyn ObjectStore {
        &self.store
    }

    /// How many retained checkpoints reference each object.
    fn reference_counts(&self) -> BTreeMap<ObjectId, u32> {
        let mut counts = BTreeMap::new();
        for manifest in lock(&self.manifests).values() {
            let objects: BTreeSet<ObjectId> = manifest
                .backends
                .iter()
                .flat_map(|b| b.files.iter())
                .flat_map(|f| f.stored().map(|(id, _)| id).collect::<Vec<_>>())
                .collect();
            for id in objects {
                *counts.entry(id).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Drops the checkpoint (its objects stay), refusing an unknown one as the engine does.
    fn delete_checkpoint(&self, id: u64) -> Result<()> {
        match lock(&self.manifests).remove(&id) {
            Some(_) => Ok(()),
            None => Err(Error::NoSuchCheckpoint(id)),
        }
    }

    fn pins(&self) -> BTreeMap<String, u64> {
        let pins = lock(&self.pins).clone();
        self.pins_handed
            .fetch_add(pins.len(), std::sync::atomic::Ordering::Relaxed);
        pins
    }

    fn pinned(&self, name: &str) -> Option<u64> {
        self.pins_handed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.pins).get(name).copied()
    }

    /// Pins it as the engine does.
    fn flink_claimed(&self, id: u64, _path: &str) {
        lock(&self.pins).insert(format!("flink-claim-cp-{id}"), id);
    }

    /// A read of `_metadata` pins it as the engine leases it (the expiry is the engine's).
    fn restore_read(&self, id: u64, metadata: bool) {
        if metadata {
            lock(&self.pins).insert(super::seam::restore_lease_name(id), id);
        }
    }

    fn record_error(&self, message: String) {
        *lock(&self.last_error) = Some(message);
    }

    fn status_text(&self) -> String {
        format!(
            "{{\"checkpoints_total\": {}}}\n",
            lock(&self.manifests).len()
        )
    }

    /// The one metric the tests read: how many checkpoints are retained at the call.
    fn metrics_text(&self) -> String {
        format!(
            "# TYPE ckptfs_checkpoints gauge\nckptfs_checkpoints {}\n# EOF\n",
            lock(&self.manifests).len()
        )
    }

    fn room(&self) -> &Path {
        self.dir.path()
    }

    fn set_change_hook(&self, hook: ChangeHook) {
        *lock(&self.hook) = Some(hook);
    }
}

/// Every line is refused at validation: the tests on the double write no control lines
/// that need a controller (those run on the real engine).
impl ControlLines for Double {
    fn validate(&self, _commands: &[Request]) -> Result<()> {
        Err(Error::Invalid(NO_CONTROL.into()))
    }

    fn execute(&self, commands: Vec<Request>, answer: AnswerSink, _: &Mutex<StagedImports>) {
        for i in 0..commands.len() {
            answer(i, Err(Failure::of(&Error::Invalid(NO_CONTROL.into()))));
        }
    }
}
