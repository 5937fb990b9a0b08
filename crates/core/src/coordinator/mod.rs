//! Runs checkpoints across the hosted backends: synchronous phase, asynchronous uploads,
//! commit, registration, retention; drops and restores.
//!
//! Locking: `Inner::state` (registry, manifests, metadata, in-flight set) is held only for
//! bookkeeping and for the store operations that must be atomic with it (publishing an
//! object, deleting garbage, committing or removing a manifest), never while hashing or
//! copying file contents. Each backend sits behind its own `RwLock`, taken for writing only
//! to swap the database during a restore.
//!
//! One file per part of the story: [`open`] (recovery at start), [`checkpoint`] (taking
//! one: what it holds, its synchronous phase, its commit), [`materialize`] (one backend's
//! synchronous phase and `wal` mode's materializations), [`ingest`] (the one way bytes come
//! into the store: re-referenced, or staged and published, and pinned), [`flink`]
//! (importing a Flink job's checkpoints), [`follower`] (a follower's lag and last look),
//! [`restore`] (rolling back, materializing), [`retention`] (the policy, pins and leases,
//! drops, deleting garbage) and [`counters`] (what the engine counted since it opened, for
//! metrics). The state behind the one lock is made of typed parts, each with its rules:
//! [`state`] (what the store holds, the checkpoints in flight, the lineages, the health)
//! and `wal` mode's [`materialize::WalState`]. This file holds the engine's face: its
//! configuration, its state and the requests that need no more than a few lines.

mod checkpoint;
pub mod counters;
mod flink;
mod follower;
mod ingest;
mod materialize;
mod open;
mod restore;
mod retention;
mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

use crate::backend::{Backend, BackendOptions, WriteOp};
use crate::catalog::{Catalog, Manifest, StoreMeta};
use crate::error::{Error, ErrorKind, Result};
use crate::fsutil::{lock, wait};
use crate::lock::DirLock;
use crate::names::BackendName;
use crate::policy::Policy;
use crate::registry::Registry;
use crate::store::s3::S3Options;
use crate::store::{Location, ObjectId, ObjectStore, DEFAULT_ORPHAN_GRACE};

use state::{Base, Flight, Health, Held, Lineages};

pub use crate::repo::ensure_store_dir;
pub use checkpoint::{CheckpointPlan, ImportReport, PendingCheckpoint};
pub use flink::{FlinkImport, FlinkRefused, Retries, Retry};
pub use follower::{lag as flink_lag, FlinkNewest, FollowerHealth};
pub use materialize::MaterializePolicy;
pub use restore::materialize;

/// What [`Engine::open`] opens and how: the store, the backends to host, and the settings
/// of the daemon. [`EngineConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The store: a local directory or an S3 bucket prefix.
    pub store: Location,
    /// Where the live RocksDB instances and the staging area live (default `STORE/state`).
    pub state: Option<PathBuf>,
    /// Backends to host in addition to those the store already knows (none at all: `default/0`).
    pub backends: Vec<BackendName>,
    /// Number of retained checkpoints (the policy's `last`); `None` keeps the store's
    /// setting (default 3).
    pub retain: Option<u32>,
    /// The policy's rules by time; `None` keeps the store's (default none).
    pub keep: Option<crate::policy::ByTime>,
    /// Most checkpoints in flight at once (default 1; 0 counts as 1; a read-only view
    /// takes 1 whatever is set).
    pub max_concurrent: usize,
    /// How the hosted RocksDB instances are opened and checkpointed.
    pub backend_options: BackendOptions,
    /// Start every backend of this checkpoint from it, discarding the local state.
    pub restore_from: Option<u64>,
    /// When `wal` mode checkpoints materialize.
    pub materialize: MaterializePolicy,
    /// Object storage: uploads in flight and the read cache's size.
    pub s3: S3Options,
    /// Object storage: an unreferenced object younger than this may be an upload still in
    /// flight (of this daemon or a previous one) and is not swept yet.
    pub orphan_grace: std::time::Duration,
    /// Object storage: how long the writer's lease lasts unless renewed.
    pub lease_ttl: std::time::Duration,
    /// Object storage: how long to wait for a lease another daemon holds (it may have died,
    /// or be stopping) before giving up; zero fails at once.
    pub lease_wait: std::time::Duration,
    /// Open the backends the store hosts (a daemon). False: host none, and carry every
    /// backend over unchanged into each checkpoint (`ckptfs import` on a store).
    pub host_backends: bool,
}

impl EngineConfig {
    /// The defaults for the store at `store`: no state directory named (`STORE/state` on
    /// a local store), no backends added, the store's retention, one checkpoint in flight,
    /// the default backend options (`flush` mode), no restore, the default lease and
    /// orphan grace, no wait for a held lease, backends hosted.
    pub fn new(store: impl Into<Location>) -> Self {
        EngineConfig {
            store: store.into(),
            state: None,
            backends: Vec::new(),
            retain: None,
            keep: None,
            max_concurrent: 1,
            backend_options: BackendOptions::default(),
            restore_from: None,
            materialize: MaterializePolicy::default(),
            s3: S3Options::default(),
            orphan_grace: DEFAULT_ORPHAN_GRACE,
            lease_ttl: crate::lease::DEFAULT_TTL,
            lease_wait: std::time::Duration::ZERO,
            host_backends: true,
        }
    }
}

/// The engine's state, behind its one lock: the store's metadata beside the parts, each
/// with its rules ([`state`], and [`materialize::WalState`]).
struct State {
    /// The store's metadata as last saved: changed only under `Inner::catalog_writes`.
    meta: StoreMeta,
    held: Held,
    flight: Flight,
    lineages: Lineages,
    wal: materialize::WalState,
    health: Health,
}

impl State {
    /// The state of a store with these checkpoints, nothing in flight.
    fn new(
        registry: Registry,
        manifests: BTreeMap<u64, Arc<Manifest>>,
        meta: StoreMeta,
        last_error: Option<String>,
    ) -> State {
        State {
            meta,
            held: Held::new(registry, manifests),
            flight: Flight::default(),
            lineages: Lineages::default(),
            wal: materialize::WalState::default(),
            health: Health {
                last_error,
                ..Health::default()
            },
        }
    }

    /// May a checkpoint reference this object without storing its bytes?
    fn can_share(&self, id: &ObjectId) -> bool {
        self.held.can_share(id)
    }
}

struct Inner {
    location: Location,
    state_dir: PathBuf,
    store: Arc<dyn ObjectStore>,
    catalog: Catalog,
    backend_options: BackendOptions,
    materialize: MaterializePolicy,
    max_concurrent: usize,
    orphan_grace: std::time::Duration,
    /// A read-only view of a store another process writes (`mount --read-only`).
    read_only: bool,
    backends: BTreeMap<BackendName, RwLock<Option<Backend>>>,
    state: Mutex<State>,
    /// Held across every change of the durable catalog (the metadata, a manifest written
    /// or removed) and of `State::meta`, taken before `state` when both are needed: the
    /// requests to the store (slow on object storage) run without the state lock, so
    /// status, listings and writers never wait for them, and metadata written from a copy
    /// of `State::meta` never loses a concurrent change.
    catalog_writes: Mutex<()>,
    /// Signalled whenever a checkpoint leaves flight or a restore ends.
    slot_freed: Condvar,
    /// An unreadable or quarantined manifest exists: no object is deleted at all (which
    /// ones it names cannot be known for sure), only manifests are.
    deletes_frozen: bool,
    /// When memory was last given back to the system (see [`Engine::trim_memory`]).
    last_trim: Mutex<std::time::Instant>,
    /// What happened since the engine opened, for metrics.
    counters: counters::Counters,
    /// The Flink checkpoints a follower refuses, as its last look left them (status).
    flink_refused: Mutex<Vec<FlinkRefused>>,
    /// A Flink follower's health as its last look left it (`None`: none follows).
    follower: Mutex<Option<FollowerHealth>>,
    _state_lock: DirLock,
    /// The lock or lease that makes this process the writer (held, never read): the last
    /// field, so it is released only after everything else is closed.
    _writer: Option<crate::repo::Writer>,
}

/// See [`Engine::trim_memory`].
const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The checkpointing engine of one store. Cheap to clone; all clones share one engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// A read-only picture of the engine for status displays.
#[derive(Debug, Clone)]
pub struct EngineStatus {
    /// The hosted backends, sorted.
    pub backends: Vec<BackendName>,
    /// Imported backends (`ckptfs import`).
    pub external: Vec<BackendName>,
    /// The retained checkpoints, oldest first.
    pub checkpoints: Vec<Arc<Manifest>>,
    /// The ids of the checkpoints begun and not yet committed or failed, ascending.
    pub in_flight: Vec<u64>,
    /// How many checkpoints the store retains.
    pub retain: u32,
    /// Most checkpoints in flight at once.
    pub max_concurrent: usize,
    /// The newest error recorded, if any: the problems found at start (joined by `; `), a
    /// failed checkpoint, restore or retention, an unreadable manifest, or what the
    /// daemon recorded ([`Engine::record_error`]).
    pub last_error: Option<String>,
    /// Small SSTs merged by small-file compaction since start: files, bytes.
    pub small_file_compactions: (u64, u64),
    /// Stored objects the retained checkpoints reference, and their bytes (files and
    /// chunks; file lists are counted but not sized).
    pub objects: usize,
    /// The bytes of those objects (see `objects`).
    pub referenced_bytes: u64,
    /// How the checkpoints capture the memtables.
    pub checkpoint_mode: crate::backend::CheckpointMode,
    /// `wal` mode: the checkpoint each backend's newest confirmed materialization is.
    pub materializations: Vec<(BackendName, u64)>,
}

/// Proof that the caller holds `Inner::catalog_writes`.
type CatalogWrites<'a> = MutexGuard<'a, ()>;

impl Engine {
    fn catalog_writes(&self) -> CatalogWrites<'_> {
        lock(&self.inner.catalog_writes)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.inner.state)
    }

    /// Where the store is.
    pub fn location(&self) -> &Location {
        &self.inner.location
    }

    /// The state directory (resolved): the live RocksDB instances, staging, the cache.
    pub fn state_dir(&self) -> &Path {
        &self.inner.state_dir
    }

    /// The store's objects.
    pub fn object_store(&self) -> &dyn ObjectStore {
        self.inner.store.as_ref()
    }

    /// The hosted backends, sorted.
    pub fn backend_names(&self) -> Vec<BackendName> {
        self.inner.backends.keys().cloned().collect()
    }

    /// Backends whose state is imported (`ckptfs import`), never hosted.
    pub fn external_names(&self) -> Vec<BackendName> {
        self.state().meta.external.clone()
    }

    /// The error for a write, flush or compaction aimed at an imported backend.
    fn refuse_external(name: &BackendName) -> Error {
        Error::Invalid(format!(
            "backend {name} is external: its state is imported from its own application's \
             RocksDB checkpoints (`ckptfs import`), so put, del, flush and compact are \
             refused; write to that application's database and import again"
        ))
    }

    /// The error for a backend this engine does not host: an imported one (EINVAL), or
    /// none of that name (ENOENT, naming those it hosts).
    fn not_hosted(&self, name: &BackendName) -> Error {
        if self.state().meta.external.contains(name) {
            return Self::refuse_external(name);
        }
        let hosted: Vec<String> = self.backend_names().iter().map(|b| b.to_string()).collect();
        Error::NoSuchBackend(format!("{name} (hosted: {})", hosted.join(", ")))
    }

    /// Refuse a write, flush or compaction of a backend this engine does not host, as
    /// the request itself would be refused (one rule, one message, one errno).
    pub fn check_hosted(&self, name: &BackendName) -> Result<()> {
        if self.inner.backends.contains_key(name) {
            Ok(())
        } else {
            Err(self.not_hosted(name))
        }
    }

    /// Refuse an import into a backend the store hosts (EINVAL): its RocksDB runs in this
    /// engine, or in the store's daemon when this engine hosts nothing (an import without
    /// a daemon). The one rule, asked by [`Engine::begin`] of every checkpoint that
    /// imports and by a daemon's control line before it runs.
    pub fn check_import_into(&self, name: &BackendName) -> Result<()> {
        state::check_not_hosted(&self.state().meta.backends, [name])
    }

    /// Refuse a request naming a checkpoint the store does not retain (ENOENT), as the
    /// request itself would be refused.
    pub fn check_checkpoint(&self, id: u64) -> Result<()> {
        self.state().held.retained(id).map(drop)
    }

    fn with_backend<T>(
        &self,
        name: &BackendName,
        f: impl FnOnce(&Backend) -> Result<T>,
    ) -> Result<T> {
        let Some(slot) = self.inner.backends.get(name) else {
            return Err(self.not_hosted(name));
        };
        let guard = crate::fsutil::read(slot);
        let backend = guard
            .as_ref()
            .ok_or_else(|| Error::BackendClosed(name.to_string()))?;
        f(backend)
    }

    /// Apply the operations to one backend as one atomic batch.
    pub fn write(&self, name: &BackendName, ops: &[WriteOp]) -> Result<()> {
        self.with_backend(name, |b| b.write(ops))
    }

    /// Set `key` to `value` in one backend.
    pub fn put(&self, name: &BackendName, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(name, &[WriteOp::Put(key.to_vec(), value.to_vec())])
    }

    /// Remove `key` from one backend.
    pub fn delete(&self, name: &BackendName, key: &[u8]) -> Result<()> {
        self.write(name, &[WriteOp::Delete(key.to_vec())])
    }

    /// The value of `key` in one backend, `None` if it is not set.
    pub fn get(&self, name: &BackendName, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.with_backend(name, |b| b.get(key))
    }

    /// Flush one backend's memtables into SSTs (waits for it).
    pub fn flush(&self, name: &BackendName) -> Result<()> {
        self.with_backend(name, |b| b.flush())
    }

    /// Compact one backend's whole key range (waits for it).
    pub fn compact(&self, name: &BackendName) -> Result<()> {
        self.with_backend(name, |b| b.compact())
    }

    /// Merge runs of small SSTs of one backend; returns the files and bytes merged.
    pub fn compact_small_files(
        &self,
        name: &BackendName,
        policy: &crate::compaction::SmallFilePolicy,
    ) -> Result<(usize, u64)> {
        self.compact_small_files_until(name, policy, &|| false)
    }

    /// [`Engine::compact_small_files`], stopping between ranges once `stop` says so.
    pub fn compact_small_files_until(
        &self,
        name: &BackendName,
        policy: &crate::compaction::SmallFilePolicy,
        stop: &dyn Fn() -> bool,
    ) -> Result<(usize, u64)> {
        let plans = self.with_backend(name, |b| b.compact_small_files(policy, stop))?;
        let files = plans.iter().map(|p| p.files).sum();
        let bytes = plans.iter().map(|p| p.bytes).sum();
        if files > 0 {
            log::info!(
                "backend {name}: merged {files} small SSTs ({bytes} bytes) in {} ranges",
                plans.len()
            );
            self.state().health.compacted(files as u64, bytes);
        }
        Ok((files, bytes))
    }

    /// Every key and value of one backend, in key order.
    pub fn scan(&self, name: &BackendName) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.with_backend(name, |b| b.scan())
    }

    /// Names and sizes of one backend's live SST files.
    pub fn live_sst_files(&self, name: &BackendName) -> Result<Vec<(String, u64)>> {
        self.with_backend(name, |b| b.live_sst_files())
    }

    /// Take a checkpoint of every backend and wait until it is complete.
    pub fn checkpoint(&self) -> Result<Arc<Manifest>> {
        self.begin_checkpoint()?.complete()
    }

    /// Give the allocator's free memory back to the system after a checkpoint, at most
    /// every [`TRIM_INTERVAL`]: each checkpoint frees what it used on the way (buffers,
    /// staging lists, RocksDB's flushed memtables), and glibc keeps such memory unless
    /// asked. Measured with the scale benchmark (dev build, 4 backends), trimming after
    /// every checkpoint: 26 and 33 MiB right after checkpoints 1,000 and 2,000 instead of
    /// 29 and 38; but one trim costs about 1 ms there, hence at most one a second (28 and
    /// 35 MiB in that benchmark, 30 checkpoints a second).
    pub(crate) fn trim_memory(&self) {
        {
            let mut last = lock(&self.inner.last_trim);
            if last.elapsed() < TRIM_INTERVAL {
                return;
            }
            *last = std::time::Instant::now();
        }
        crate::fsutil::release_free_memory();
    }

    /// Block until no materialization is being prepared in the background.
    pub fn wait_background(&self) {
        let mut st = self.state();
        while st.wal.is_preparing() {
            st = wait(&self.inner.slot_freed, st);
        }
    }

    /// Block until no checkpoint is in flight and no materialization is being prepared
    /// (used at shutdown).
    pub fn wait_idle(&self) {
        let mut st = self.state();
        while !st.flight.is_empty() || st.wal.is_preparing() {
            st = wait(&self.inner.slot_freed, st);
        }
    }

    /// Fails on a read-only view of a store.
    pub fn check_writable(&self) -> Result<()> {
        if self.inner.read_only {
            return Err(Error::ReadOnly(format!(
                "{} is mounted read-only: another daemon writes it",
                self.inner.location
            )));
        }
        Ok(())
    }

    /// True for a read-only view of a store (`mount --read-only`).
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// A read-only view: pick up the checkpoints the writer committed or dropped since the
    /// last look. Returns whether anything changed.
    pub fn refresh_checkpoints(&self) -> Result<bool> {
        // The writer's settings and pins, as it last saved them.
        let meta = if self.inner.read_only {
            self.inner.catalog.load_meta()
        } else {
            Ok(None)
        };
        let pins_changed = match meta {
            Ok(Some(meta)) => {
                let mut st = self.state();
                let changed = meta.pins != st.meta.pins;
                st.meta = meta;
                changed
            }
            Ok(None) => false,
            Err(e) => {
                log::warn!("the store's metadata is not read this time: {e}");
                false
            }
        };
        let (ids, _) = self.inner.catalog.list_ids()?;
        let (known, unreadable): (BTreeSet<u64>, BTreeSet<u64>) = {
            let mut st = self.state();
            // A manifest found unreadable is not read again while it is listed.
            st.held.unreadable.retain(|id| ids.contains(id));
            (
                st.held.manifests.keys().copied().collect(),
                st.held.unreadable.clone(),
            )
        };
        let mut added = Vec::new();
        let new: Vec<u64> = ids
            .difference(&known)
            .filter(|id| !unreadable.contains(id))
            .copied()
            .collect();
        let mut broken = Vec::new();
        for (id, loaded) in self.inner.catalog.load_many(&new)? {
            match loaded {
                Ok(m) => added.push(Arc::new(m)),
                Err(e) if matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::Invalid) => {
                    broken.push((id, e))
                }
                // Dropped meanwhile, or being written: the next look decides.
                Err(e) => log::debug!("checkpoint {id} not shown yet: {e}"),
            }
        }
        let gone: Vec<u64> = known.difference(&ids).copied().collect();
        let mut st = self.state();
        for (id, e) in broken {
            let msg = format!("checkpoint {id} cannot be read and is not shown: {e}");
            log::error!("{msg}");
            self.note_error(&mut st, msg);
            st.held.unreadable.insert(id);
        }
        if added.is_empty() && gone.is_empty() {
            return Ok(pins_changed);
        }
        for id in gone {
            if let Some(m) = st.held.manifests.remove(&id) {
                let _ = st.held.registry.drop_checkpoint(id, m.object_refs());
            }
        }
        for m in added {
            st.held.registry.register_checkpoint(m.id, m.object_refs());
            st.held.registry.set_sizes(m.stored_sizes());
            st.held.manifests.insert(m.id, m);
        }
        Ok(true)
    }

    /// Change the store metadata under the catalog's write serialization (held by the
    /// caller): `change` edits a copy, which is saved and then adopted. Refused during a
    /// restore.
    fn change_meta(&self, change: impl FnOnce(&mut StoreMeta) -> Result<()>) -> Result<()> {
        let mut meta = {
            let st = self.state();
            st.flight.check_not_restoring()?;
            st.meta.clone()
        };
        change(&mut meta)?;
        self.inner.catalog.save_meta(&meta)?;
        self.state().meta = meta;
        Ok(())
    }

    /// How many checkpoints the store retains at least (the policy's `last`).
    pub fn retain(&self) -> u32 {
        self.state().meta.retain
    }

    /// The store's retention policy.
    pub fn policy(&self) -> Policy {
        self.state().meta.policy()
    }

    /// The retained checkpoints, oldest first.
    pub fn checkpoints(&self) -> Vec<Arc<Manifest>> {
        self.state().held.manifests.values().cloned().collect()
    }

    /// The manifest of retained checkpoint `id`, `None` if it is not retained.
    pub fn manifest(&self, id: u64) -> Option<Arc<Manifest>> {
        self.state().held.manifests.get(&id).cloned()
    }

    /// Reference count of every object referenced by a retained checkpoint.
    pub fn reference_counts(&self) -> BTreeMap<ObjectId, u32> {
        self.state().held.registry.counts()
    }

    /// A picture of the engine now, for status displays.
    pub fn status(&self) -> EngineStatus {
        let st = self.state();
        EngineStatus {
            backends: self.backend_names(),
            external: st.meta.external.clone(),
            checkpoints: st.held.manifests.values().cloned().collect(),
            in_flight: st.flight.ids().collect(),
            retain: st.meta.retain,
            max_concurrent: self.inner.max_concurrent,
            last_error: st.health.last_error.clone(),
            small_file_compactions: st.health.small_file_compactions,
            objects: st.held.registry.referenced_objects(),
            referenced_bytes: st.held.registry.referenced_bytes(),
            checkpoint_mode: self.inner.backend_options.checkpoint_mode,
            materializations: st.wal.confirmed(),
        }
    }

    /// Remember an error for `status` (the control file reports failures this way too).
    pub fn record_error(&self, message: String) {
        self.note_error(&mut self.state(), message);
    }

    /// [`Engine::record_error`] with the state lock held.
    fn note_error(&self, st: &mut State, message: String) {
        st.health.last_error = Some(message);
        self.inner.counters.error_recorded();
    }

    /// What the engine counted since it opened (checkpoints completed and failed, bytes,
    /// durations, errors).
    pub fn counters(&self) -> &counters::Counters {
        &self.inner.counters
    }
}

fn validate_retain(retain: u32) -> Result<u32> {
    if retain == 0 {
        return Err(Error::Invalid("retain must be at least 1".into()));
    }
    Ok(retain)
}

fn backend_dir(state_dir: &Path, name: &BackendName) -> PathBuf {
    state_dir
        .join(crate::store::layout::BACKENDS)
        .join(name.rel_path())
}

#[cfg(test)]
mod tests {
    use super::restore::install_snapshot;
    use super::*;
    use crate::store::LocalStore;

    fn config(store: &Path) -> EngineConfig {
        let mut config = EngineConfig::new(store);
        config.backends = vec!["A/0".parse().unwrap()];
        config.retain = Some(20);
        config.backend_options.write_buffer_size = Some(64 * 1024);
        config
    }

    fn fill(engine: &Engine, tag: &str, range: std::ops::Range<u32>) {
        let a: BackendName = "A/0".parse().unwrap();
        let ops: Vec<WriteOp> = range
            .map(|i| {
                WriteOp::Put(
                    format!("k{i:06}").into_bytes(),
                    format!("{tag}{}", "x".repeat(80)).into_bytes(),
                )
            })
            .collect();
        engine.write(&a, &ops).unwrap();
        engine.flush(&a).unwrap();
    }

    /// A lease is a pin that expires: it holds its checkpoint through the policy and
    /// `delete` (which says when it expires), survives a reopen, moves later only past its
    /// slack, leaves a pin made by hand alone, and once expired is gone and the policy
    /// drops what it held.
    #[test]
    fn a_lease_holds_its_checkpoint_until_it_expires_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let engine = Engine::open(config(&store)).unwrap();
        let mut ids = Vec::new();
        for i in 0..3u32 {
            fill(&engine, "v", i * 10..(i + 1) * 10);
            ids.push(engine.checkpoint().unwrap().id);
        }
        assert!(engine.lease(ids[0], "restore-cp-1", 5_000, 100).unwrap());
        // Within its slack: nothing written.
        assert!(!engine.lease(ids[0], "restore-cp-1", 5_050, 100).unwrap());
        assert!(engine.lease(ids[0], "restore-cp-1", 6_000, 100).unwrap());
        // A hand-made pin under that name is no lease.
        engine.pin(ids[1], "restore-cp-2").unwrap();
        assert!(!engine.lease(ids[1], "restore-cp-2", 9_000, 100).unwrap());
        engine.set_retain(1).unwrap();
        assert_eq!(engine.checkpoints().len(), 3);
        let e = engine.delete_checkpoint(ids[0]).unwrap_err().to_string();
        assert!(e.contains("restore-cp-1 (a lease"), "{e}");
        drop(engine);

        let engine = Engine::open(config(&store)).unwrap();
        // (The config says 20 again.)
        engine.set_retain(1).unwrap();
        assert_eq!(engine.checkpoints().len(), 3);
        assert_eq!(engine.pinned("restore-cp-1"), Some(ids[0]));
        assert_eq!(
            engine.pin_expires(),
            [("restore-cp-1".to_string(), 6_000)].into()
        );
        assert!(engine.expire_pins(5_999).unwrap().is_empty());
        assert_eq!(
            engine.expire_pins(6_000).unwrap(),
            [("restore-cp-1".to_string(), ids[0])]
        );
        let kept: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
        assert_eq!(kept, [ids[1], ids[2]]);
        assert!(engine.pin_expires().is_empty());
        assert_eq!(engine.pins(), [("restore-cp-2".to_string(), ids[1])].into());
    }

    /// A crash after a restored database was renamed into place, but before it got its new
    /// lineage, must not let the old lineage's files be re-referenced by name.
    #[test]
    fn a_crash_in_the_middle_of_a_restore_never_aliases_abandoned_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let a: BackendName = "A/0".parse().unwrap();
        let engine = Engine::open(config(&store)).unwrap();
        fill(&engine, "base", 0..1500);
        let cp1 = engine.checkpoint().unwrap();
        for i in 0..3u32 {
            fill(&engine, "abandoned", i * 250..(i + 1) * 250);
            engine.checkpoint().unwrap();
        }
        let state_dir = engine.state_dir().to_path_buf();
        drop(engine);
        // The crash: the restored files are in place, the database never reopened.
        let objects = LocalStore::open(&store).unwrap();
        install_snapshot(&objects, &cp1.backends[0], &backend_dir(&state_dir, &a)).unwrap();

        let engine = Engine::open(config(&store)).unwrap();
        fill(&engine, "after", 0..100);
        let expected = engine.scan(&a).unwrap();
        let cp = engine.checkpoint().unwrap();
        let old_lineage = &cp1.backends[0].lineage;
        assert_ne!(
            &cp.backends[0].lineage, old_lineage,
            "the restored database kept the old lineage"
        );
        // With a fresh lineage nothing is re-referenced by name (content may still be shared).
        assert_eq!(cp.stats.files_reused, 0);
        let out = dir.path().join("out");
        crate::commands::restore::restore_checkpoint(&store, cp.id, &out, |_| {}).unwrap();
        assert_eq!(
            crate::backend::scan_dir(&out.join("A/0")).unwrap(),
            expected
        );
    }

    /// The counters follow the checkpoints: each commit counts once with its bytes, each
    /// checkpoint that got an id and did not commit counts as failed (an upload that
    /// failed, an abort), a refused one (busy) not at all.
    #[test]
    fn counters_follow_commits_and_failures() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let engine = Engine::open(config(&store)).unwrap();
        let counters = engine.counters();
        fill(&engine, "one", 0..500);
        let first = engine.checkpoint().unwrap();
        let second = engine.checkpoint().unwrap();
        assert_eq!(counters.checkpoints_completed.get(), 2);
        let uploaded = first.stats.bytes_uploaded + second.stats.bytes_uploaded;
        assert_eq!(counters.bytes_uploaded.get(), uploaded);
        // Everything named and not uploaded was reused; file lists are uploaded but not
        // named, so the sum is at least what the checkpoints name.
        let named = first.stats.bytes_total + second.stats.bytes_total;
        assert!(counters.bytes_reused.get() <= named);
        assert!(counters.bytes_reused.get() + uploaded >= named);
        assert!(
            counters.bytes_reused.get() >= second.stats.bytes_total - second.stats.bytes_uploaded
        );
        assert_eq!(counters.checkpoints_failed.get(), 0);
        assert_eq!(counters.last_error_unix_ms(), None);

        let pending = engine.begin_checkpoint().unwrap();
        assert!(matches!(engine.begin_checkpoint(), Err(Error::Busy(_))));
        pending.abort();
        assert_eq!(counters.checkpoints_failed.get(), 1);

        // The store's staging directory replaced by a file: the upload fails.
        fill(&engine, "two", 500..900);
        let tmp = store.join("tmp");
        std::fs::rename(&tmp, store.join("tmp.away")).unwrap();
        std::fs::write(&tmp, b"not a directory").unwrap();
        assert!(engine.checkpoint().is_err());
        assert_eq!(counters.checkpoints_failed.get(), 2);
        assert_eq!(counters.checkpoints_completed.get(), 2);
        assert_eq!(counters.bytes_uploaded.get(), uploaded);
        assert!(counters.last_error_unix_ms().is_some());
        assert!(counters.errors.get() >= 2);
        std::fs::remove_file(&tmp).unwrap();
        std::fs::rename(store.join("tmp.away"), &tmp).unwrap();
        engine.checkpoint().unwrap();
        assert_eq!(counters.checkpoints_completed.get(), 3);
    }

    /// A closed backend fails a checkpoint at once and leaves no slot taken.
    #[test]
    fn a_closed_backend_fails_a_checkpoint_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(config(&dir.path().join("store"))).unwrap();
        let a: BackendName = "A/0".parse().unwrap();
        *engine.inner.backends[&a].write().unwrap() = None;
        let before = engine.state().meta.next_checkpoint;
        let err = engine.begin_checkpoint().err().expect("must fail");
        assert!(matches!(err, Error::BackendClosed(_)), "{err}");
        assert_eq!(engine.state().meta.next_checkpoint, before + 1);
        assert!(engine.state().flight.is_empty());
    }

    /// A restore that cannot read its checkpoint leaves the live database open and as it was.
    #[test]
    fn a_failed_restore_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(config(&dir.path().join("store"))).unwrap();
        let a: BackendName = "A/0".parse().unwrap();
        fill(&engine, "v1", 0..500);
        let cp = engine.checkpoint().unwrap();
        fill(&engine, "v2", 0..500);
        let live = engine.scan(&a).unwrap();
        let sst = cp.backends[0]
            .files
            .iter()
            .find(|f| f.name.ends_with(".sst"))
            .unwrap();
        let path = engine.object_store().local_path(&sst.object).unwrap();
        std::fs::write(&path, b"garbage").unwrap();
        assert!(matches!(
            engine.restore_backends(cp.id),
            Err(Error::Corrupt(_))
        ));
        assert_eq!(engine.scan(&a).unwrap(), live);
        engine.checkpoint().unwrap();
    }
}
