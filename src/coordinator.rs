//! Runs checkpoints across the hosted backends: synchronous phase, asynchronous uploads,
//! commit, registration, retention; drops and restores.
//!
//! Locking: `Inner::state` (registry, manifests, metadata, in-flight set) is held only for
//! bookkeeping and for the store operations that must be atomic with it (publishing an
//! object, deleting garbage, committing or removing a manifest), never while hashing or
//! copying file contents. Each backend sits behind its own `RwLock`, taken for writing only
//! to swap the database during a restore.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use crate::backend::{is_shared_file, Backend, BackendOptions, StagedFile, WriteOp};
use crate::catalog::{
    BackendSnapshot, Catalog, CheckpointStats, FileEntry, Manifest, StoreMeta, FORMAT,
};
use crate::error::{Error, IoContext, Result};
use crate::fsutil::{create_private_dir_all, fsync_dir, make_private, now_unix_ms, remove_tree};
use crate::lock::{DirLock, StoreLock};
use crate::names::BackendName;
use crate::registry::Registry;
use crate::store::{hash_file, LocalStore, ObjectId, ObjectStore};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub store: PathBuf,
    /// Where the live RocksDB instances and the staging area live (default `STORE/state`).
    pub state: Option<PathBuf>,
    /// Backends to host in addition to those the store already knows (none at all: `default/0`).
    pub backends: Vec<BackendName>,
    /// Number of retained checkpoints; `None` keeps the store's setting (default 3).
    pub retain: Option<u32>,
    pub max_concurrent: usize,
    pub backend_options: BackendOptions,
    /// Start every backend of this checkpoint from it, discarding the local state.
    pub restore_from: Option<u64>,
}

impl EngineConfig {
    pub fn new(store: impl Into<PathBuf>) -> Self {
        EngineConfig {
            store: store.into(),
            state: None,
            backends: Vec::new(),
            retain: None,
            max_concurrent: 1,
            backend_options: BackendOptions::default(),
            restore_from: None,
        }
    }
}

/// The files of the newest confirmed checkpoint of one backend's lineage: the only files a
/// new checkpoint may re-reference by name.
#[derive(Debug, Clone)]
struct Base {
    checkpoint: u64,
    files: Arc<HashMap<String, FileEntry>>,
}

struct State {
    registry: Registry,
    manifests: BTreeMap<u64, Arc<Manifest>>,
    meta: StoreMeta,
    in_flight: BTreeSet<u64>,
    restoring: bool,
    lineages: HashMap<BackendName, String>,
    bases: HashMap<BackendName, Base>,
    last_error: Option<String>,
    /// Small SSTs merged by small-file compaction since start: files, bytes.
    small_file_compactions: (u64, u64),
    /// Objects of a manifest that may exist on disk after a failed commit: never deleted
    /// by this process (the next start decides from what is durable).
    kept: BTreeSet<ObjectId>,
    /// Referenced objects found missing at start: never shared, stored again when a
    /// checkpoint has their bytes (which repairs them).
    missing: BTreeSet<ObjectId>,
}

impl State {
    /// May a checkpoint reference this object without storing its bytes?
    fn can_share(&self, id: &ObjectId) -> bool {
        self.registry.is_live(id) && !self.missing.contains(id)
    }
}

struct Inner {
    store_root: PathBuf,
    state_dir: PathBuf,
    store: Box<dyn ObjectStore>,
    catalog: Catalog,
    backend_options: BackendOptions,
    max_concurrent: usize,
    backends: BTreeMap<BackendName, RwLock<Option<Backend>>>,
    state: Mutex<State>,
    /// Signalled whenever a checkpoint leaves flight or a restore ends.
    slot_freed: Condvar,
    /// An unreadable or quarantined manifest exists: no object is deleted at all (which
    /// ones it names cannot be known for sure), only manifests are.
    deletes_frozen: bool,
    _lock: StoreLock,
    _state_lock: DirLock,
}

/// The checkpointing engine of one store. Cheap to clone; all clones share one engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// A read-only picture of the engine for status displays.
#[derive(Debug, Clone)]
pub struct Status {
    pub backends: Vec<BackendName>,
    pub checkpoints: Vec<Arc<Manifest>>,
    pub in_flight: Vec<u64>,
    pub retain: u32,
    pub max_concurrent: usize,
    pub last_error: Option<String>,
    /// Small SSTs merged by small-file compaction since start: files, bytes.
    pub small_file_compactions: (u64, u64),
}

impl Engine {
    /// Open a store (creating it if new), recover, and start the backends.
    pub fn open(config: EngineConfig) -> Result<Engine> {
        config.backend_options.validate()?;
        if let Some(n) = config.restore_from {
            if !config.store.join("checkpoints").is_dir() {
                return Err(Error::NoSuchCheckpoint(n));
            }
        }
        let root = ensure_store_dir(&config.store)?;
        let lock = StoreLock::acquire(&root)?;
        // Decide what the store is before creating anything in it: a store whose metadata
        // is missing must never look new (a new store's retention would delete checkpoints),
        // and a refused start must leave nothing that makes the next start look fine.
        let had_objects = store_has_objects(&root)?;
        let had_checkpoints_dir = crate::fsutil::is_real_dir(&root.join("checkpoints"));
        if had_objects && !had_checkpoints_dir {
            return Err(Error::Corrupt(format!(
                "{} holds objects but no checkpoints/ directory: the store is incomplete \
                 (a partial copy?); refusing to start so that nothing is deleted",
                root.display()
            )));
        }
        let catalog = Catalog::open(&root)?;
        let store = LocalStore::open(&root)?;
        let loaded_meta = catalog.load_meta()?;
        // An unreadable manifest hides its checkpoint, never deletes it: the daemon starts
        // without it, keeps every object it may name and sweeps nothing; fsck reports it.
        let (manifests, unreadable) = catalog.load_all_lenient()?;
        let mut last_error = None;
        for (name, e) in &unreadable {
            let msg = format!(
                "checkpoint manifest {name} cannot be read and is not shown ({e}); its objects \
                 are kept; run `ckptfs fsck` (--repair moves it to quarantine/)"
            );
            log::error!("{msg}");
            last_error = Some(msg);
        }
        // A store with metadata trusts its checkpoints/ directory, even empty (every
        // checkpoint dropped, or the first one interrupted).
        if loaded_meta.is_none() && manifests.is_empty() && unreadable.is_empty() && had_objects {
            return Err(Error::Corrupt(format!(
                "{} holds objects but neither ckptfs.json nor checkpoint manifests: the \
                 store is incomplete (a partial copy?); refusing to start so that nothing is \
                 deleted",
                root.display()
            )));
        }
        let mut meta = match loaded_meta {
            Some(meta) => meta,
            None if manifests.is_empty() => StoreMeta::default(),
            None => {
                let rebuilt = rebuild_meta(&manifests);
                log::warn!(
                    "{}/ckptfs.json is missing: rebuilt it from {} manifests (backends {}, \
                     next checkpoint {}, retain {})",
                    root.display(),
                    manifests.len(),
                    rebuilt
                        .backends
                        .iter()
                        .map(|b| b.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    rebuilt.next_checkpoint,
                    rebuilt.retain
                );
                rebuilt
            }
        };
        if let Some(retain) = config.retain {
            meta.retain = validate_retain(retain)?;
        }
        for name in &config.backends {
            if !meta.backends.contains(name) {
                meta.backends.push(name.clone());
            }
        }
        if meta.backends.is_empty() {
            meta.backends.push(BackendName::new("default", 0)?);
        }
        meta.backends.sort();
        meta.backends.dedup();

        let unreadable_ids: BTreeSet<u64> = unreadable
            .iter()
            .filter_map(|(n, _)| crate::catalog::manifest_id(n))
            .collect();
        // Refuse a bad --restore before changing anything.
        if let Some(n) = config.restore_from {
            if unreadable_ids.contains(&n) {
                return Err(Error::Corrupt(format!(
                    "checkpoint {n} cannot be restored: its manifest cannot be read (see \
                     `ckptfs fsck`)"
                )));
            }
            if !manifests.contains_key(&n) {
                return Err(Error::NoSuchCheckpoint(n));
            }
        }
        let state_dir = config.state.clone().unwrap_or_else(|| root.join("state"));
        create_private_dir_all(&state_dir)?;
        // The roots may be links the user chose; everything inside them is checked.
        let state_dir = std::fs::canonicalize(&state_dir).ctx("resolve", &state_dir)?;
        make_private(&state_dir)?;
        // The store lock does not cover a state directory shared by mistake with a daemon
        // of another store: lock it too before touching anything in it.
        let state_lock = DirLock::acquire_for(&state_dir, "state directory")?;

        let leftovers = store.clear_staging()? + catalog.clear_leftovers()?;
        if leftovers > 0 {
            log::info!("removed {leftovers} leftovers of interrupted writes");
        }
        let newest = manifests
            .keys()
            .copied()
            .chain(
                unreadable
                    .iter()
                    .filter_map(|(n, _)| crate::catalog::manifest_id(n)),
            )
            .max();
        if let Some(last) = newest {
            meta.next_checkpoint = meta.next_checkpoint.max(last + 1);
        }
        catalog.save_meta(&meta)?;
        let registry =
            Registry::from_checkpoints(manifests.iter().map(|(id, m)| (*id, m.objects())));
        let deletes_frozen = !unreadable.is_empty() || catalog.has_quarantine();
        crate::failpoint!("open::before-sweep");
        let (orphans, missing) = if !deletes_frozen {
            sweep(&store, &registry)?
        } else {
            let msg = "an unreadable or quarantined manifest exists: no object is deleted \
                       until it is resolved (fsck --repair, then remove STORE/quarantine/)";
            log::warn!("{msg}");
            last_error = Some(match last_error {
                Some(before) => format!("{before}; {msg}"),
                None => msg.to_string(),
            });
            let listed: BTreeSet<ObjectId> = store.list()?.into_iter().collect();
            let missing = registry
                .live_objects()
                .difference(&listed)
                .copied()
                .collect();
            (0, missing)
        };
        if orphans > 0 {
            log::info!("deleted {orphans} orphaned objects (no manifest references them)");
        }
        if !missing.is_empty() {
            let msg = format!(
                "{} referenced objects are missing from the store; run `ckptfs fsck`",
                missing.len()
            );
            log::error!("{msg}");
            // Startup problems add up: none hides another.
            last_error = Some(match last_error {
                Some(before) => format!("{before}; {msg}"),
                None => msg,
            });
        }
        remove_tree(&state_dir.join("staging"))?;
        // A restore that a crash interrupted is finished first: its backends must not
        // come up half from the checkpoint and half from their old state.
        let restore_from = match (config.restore_from, read_restore_intent(&state_dir)?) {
            (Some(n), _) => Some(n),
            (None, Some(n)) if manifests.contains_key(&n) => {
                log::warn!("finishing the restore from checkpoint {n} that was interrupted");
                Some(n)
            }
            (None, Some(n)) => {
                // Starting would mix restored and old backends: let the operator choose.
                let why = if unreadable_ids.contains(&n) {
                    "its manifest cannot be read"
                } else {
                    "it no longer exists"
                };
                return Err(Error::Corrupt(format!(
                    "a restore from checkpoint {n} was interrupted and cannot be finished: \
                     {why}. Some backends may hold checkpoint {n}, others their old state; \
                     start with --restore M to choose the checkpoint they all start from"
                )));
            }
            (None, None) => None,
        };

        let manifests: BTreeMap<u64, Arc<Manifest>> = manifests
            .into_iter()
            .map(|(id, m)| (id, Arc::new(m)))
            .collect();
        // Backends that start from a checkpoint: every snapshot is copied, verified and
        // opened once before any live database is replaced, so a bad object or option fails
        // the start with all local state as it was.
        let mut sources = BTreeMap::new();
        for name in &meta.backends {
            let dir = backend_dir(&state_dir, name);
            let has_local = Backend::db_dir(&dir).join("CURRENT").exists();
            let source = match restore_from {
                Some(n) => manifests[&n].backend(name).map(|s| (n, s.clone())),
                None if !has_local => {
                    let latest = latest_snapshot(&manifests, name);
                    let newest_readable = latest.as_ref().map_or(0, |(id, _)| *id);
                    if let Some(newer) = unreadable_ids.iter().find(|id| **id > newest_readable) {
                        // It may hold this backend's newest state: never start older or
                        // empty in silence.
                        return Err(Error::Corrupt(format!(
                            "backend {name} has no local state, and checkpoint {newer}, newer \
                             than any readable one holding it, cannot be read; run `ckptfs \
                             fsck` (--repair quarantines it) or start with --restore M"
                        )));
                    }
                    latest
                }
                None => None,
            };
            if let Some(source) = source {
                sources.insert(name.clone(), source);
            }
        }
        let items: Vec<(PathBuf, &BackendSnapshot)> = sources
            .iter()
            .map(|(name, (_, snapshot))| (backend_dir(&state_dir, name), snapshot))
            .collect();
        let prepared = prepare_all(&store, &config.backend_options, &items)?;
        if let Some(n) = restore_from {
            write_restore_intent(&state_dir, n)?;
        }
        for ((dir, _), fresh) in items.iter().zip(&prepared) {
            swap_in_snapshot(dir, fresh)?;
        }

        let mut backends = BTreeMap::new();
        let mut lineages = HashMap::new();
        let mut bases = HashMap::new();
        for name in &meta.backends {
            let dir = backend_dir(&state_dir, name);
            let backend = match sources.get(name) {
                Some((checkpoint, snapshot)) => {
                    log::info!("starting backend {name} from checkpoint {checkpoint}");
                    let backend = Backend::open_restored(&dir, name, &config.backend_options)?;
                    bases.insert(name.clone(), base_of(*checkpoint, snapshot));
                    backend
                }
                None => {
                    let backend = Backend::open_or_create(&dir, name, &config.backend_options)?;
                    if let Some((checkpoint, snapshot)) =
                        latest_snapshot_of_lineage(&manifests, name, backend.lineage())
                    {
                        bases.insert(name.clone(), base_of(checkpoint, &snapshot));
                    }
                    backend
                }
            };
            lineages.insert(name.clone(), backend.lineage().to_string());
            backends.insert(name.clone(), RwLock::new(Some(backend)));
        }
        if restore_from.is_some() {
            clear_restore_intent(&state_dir)?;
        }

        let engine = Engine {
            inner: Arc::new(Inner {
                store_root: root,
                state_dir,
                store: Box::new(store),
                catalog,
                backend_options: config.backend_options.clone(),
                max_concurrent: config.max_concurrent.max(1),
                backends,
                state: Mutex::new(State {
                    registry,
                    manifests,
                    meta,
                    in_flight: BTreeSet::new(),
                    restoring: false,
                    lineages,
                    bases,
                    last_error,
                    small_file_compactions: (0, 0),
                    kept: BTreeSet::new(),
                    missing: missing.into_iter().collect(),
                }),
                slot_freed: Condvar::new(),
                deletes_frozen,
                _lock: lock,
                _state_lock: state_lock,
            }),
        };
        {
            let mut st = engine.state();
            engine.apply_retention(&mut st)?;
        }
        Ok(engine)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn store_root(&self) -> &Path {
        &self.inner.store_root
    }

    pub fn state_dir(&self) -> &Path {
        &self.inner.state_dir
    }

    pub fn object_store(&self) -> &dyn ObjectStore {
        self.inner.store.as_ref()
    }

    pub fn backend_names(&self) -> Vec<BackendName> {
        self.inner.backends.keys().cloned().collect()
    }

    fn with_backend<T>(
        &self,
        name: &BackendName,
        f: impl FnOnce(&Backend) -> Result<T>,
    ) -> Result<T> {
        let slot = self
            .inner
            .backends
            .get(name)
            .ok_or_else(|| Error::NoSuchBackend(name.to_string()))?;
        let guard = slot.read().unwrap_or_else(|p| p.into_inner());
        let backend = guard
            .as_ref()
            .ok_or_else(|| Error::BackendClosed(name.to_string()))?;
        f(backend)
    }

    /// Apply the operations to one backend as one atomic batch.
    pub fn write(&self, name: &BackendName, ops: &[WriteOp]) -> Result<()> {
        self.with_backend(name, |b| b.write(ops))
    }

    pub fn put(&self, name: &BackendName, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(name, &[WriteOp::Put(key.to_vec(), value.to_vec())])
    }

    pub fn delete(&self, name: &BackendName, key: &[u8]) -> Result<()> {
        self.write(name, &[WriteOp::Delete(key.to_vec())])
    }

    pub fn get(&self, name: &BackendName, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.with_backend(name, |b| b.get(key))
    }

    pub fn flush(&self, name: &BackendName) -> Result<()> {
        self.with_backend(name, |b| b.flush())
    }

    pub fn compact(&self, name: &BackendName) -> Result<()> {
        self.with_backend(name, |b| b.compact())
    }

    /// Merge runs of small SSTs of one backend; returns the files and bytes merged.
    pub fn compact_small_files(
        &self,
        name: &BackendName,
        policy: &crate::compaction::SmallFilePolicy,
    ) -> Result<(usize, u64)> {
        let plans = self.with_backend(name, |b| b.compact_small_files(policy))?;
        let files = plans.iter().map(|p| p.files).sum();
        let bytes = plans.iter().map(|p| p.bytes).sum();
        if files > 0 {
            log::info!(
                "backend {name}: merged {files} small SSTs ({bytes} bytes) in {} ranges",
                plans.len()
            );
            let mut st = self.state();
            st.small_file_compactions.0 += files as u64;
            st.small_file_compactions.1 += bytes;
        }
        Ok((files, bytes))
    }

    pub fn scan(&self, name: &BackendName) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.with_backend(name, |b| b.scan())
    }

    pub fn live_sst_files(&self, name: &BackendName) -> Result<Vec<(String, u64)>> {
        self.with_backend(name, |b| b.live_sst_files())
    }

    /// Take a checkpoint of every backend and wait until it is complete.
    pub fn checkpoint(&self) -> Result<Arc<Manifest>> {
        self.begin_checkpoint()?.complete()
    }

    /// The synchronous phase: allocate an id, then flush and hard-link every backend's live
    /// files into staging. Writers may continue as soon as this returns.
    pub fn begin_checkpoint(&self) -> Result<PendingCheckpoint> {
        let started_unix_ms = now_unix_ms();
        let (id, bases) = {
            let mut st = self.state();
            if st.restoring {
                return Err(Error::Busy("a restore is in progress".into()));
            }
            if st.in_flight.len() >= self.inner.max_concurrent {
                return Err(Error::Busy(format!(
                    "{} checkpoint(s) already in flight (max_concurrent = {}); try again \
                     when it completes",
                    st.in_flight.len(),
                    self.inner.max_concurrent
                )));
            }
            let id = st.meta.next_checkpoint;
            let mut meta = st.meta.clone();
            meta.next_checkpoint += 1;
            self.inner.catalog.save_meta(&meta)?;
            st.meta = meta;
            st.in_flight.insert(id);
            (id, st.bases.clone())
        };
        let clock = Instant::now();
        let staging = self.inner.state_dir.join("staging").join(id.to_string());
        let mut parts = Vec::new();
        let sync = (|| -> Result<()> {
            for name in self.inner.backends.keys() {
                let dir = staging.join(name.rel_path());
                let parent = dir.parent().expect("backend paths have a parent");
                create_private_dir_all(parent)?;
                let (lineage, files) = self.with_backend(name, |b| {
                    Ok((b.lineage().to_string(), b.checkpoint_into(&dir)?))
                })?;
                let base = bases.get(name).cloned();
                parts.push(PendingBackend {
                    name: name.clone(),
                    lineage,
                    files,
                    base,
                });
            }
            Ok(())
        })();
        let pending = PendingCheckpoint {
            engine: self.clone(),
            id,
            parts,
            staging,
            started_unix_ms,
            sync_micros: clock.elapsed().as_micros() as u64,
            pins: Vec::new(),
            finished: false,
            keep_objects: false,
        };
        match sync {
            Ok(()) => Ok(pending),
            Err(e) => {
                pending.fail(&e);
                Err(e)
            }
        }
    }

    /// Block until no checkpoint is in flight (used at shutdown).
    pub fn wait_idle(&self) {
        let mut st = self.state();
        while !st.in_flight.is_empty() {
            st = self
                .inner
                .slot_freed
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Drop a retained checkpoint: its manifest goes, then every object no other retained
    /// checkpoint references.
    pub fn delete_checkpoint(&self, id: u64) -> Result<()> {
        let mut st = self.state();
        if st.restoring {
            return Err(Error::Busy("a restore is in progress".into()));
        }
        if st.in_flight.contains(&id) {
            return Err(Error::Busy(format!("checkpoint {id} is still in flight")));
        }
        if !st.manifests.contains_key(&id) {
            return Err(Error::NoSuchCheckpoint(id));
        }
        self.drop_checkpoint_locked(&mut st, id)
    }

    /// Change the number of retained checkpoints (at least 1); applied at once.
    pub fn set_retain(&self, retain: u32) -> Result<()> {
        let retain = validate_retain(retain)?;
        let mut st = self.state();
        if st.restoring {
            return Err(Error::Busy("a restore is in progress".into()));
        }
        let mut meta = st.meta.clone();
        meta.retain = retain;
        self.inner.catalog.save_meta(&meta)?;
        st.meta = meta;
        self.apply_retention(&mut st)
    }

    pub fn retain(&self) -> u32 {
        self.state().meta.retain
    }

    pub fn checkpoints(&self) -> Vec<Arc<Manifest>> {
        self.state().manifests.values().cloned().collect()
    }

    pub fn manifest(&self, id: u64) -> Option<Arc<Manifest>> {
        self.state().manifests.get(&id).cloned()
    }

    /// Reference count of every object referenced by a retained checkpoint.
    pub fn reference_counts(&self) -> BTreeMap<ObjectId, u32> {
        self.state().registry.counts()
    }

    pub fn status(&self) -> Status {
        let st = self.state();
        Status {
            backends: self.backend_names(),
            checkpoints: st.manifests.values().cloned().collect(),
            in_flight: st.in_flight.iter().copied().collect(),
            retain: st.meta.retain,
            max_concurrent: self.inner.max_concurrent,
            last_error: st.last_error.clone(),
            small_file_compactions: st.small_file_compactions,
        }
    }

    /// Remember an error for `status` (the control file reports failures this way too).
    pub fn record_error(&self, message: String) {
        self.state().last_error = Some(message);
    }

    /// Roll the hosted backends back to checkpoint `id` (every backend the checkpoint holds).
    /// Refused while a checkpoint is in flight. Later checkpoints stay retained; the next
    /// checkpoint builds only on `id`'s files.
    pub fn restore_backends(&self, id: u64) -> Result<()> {
        let manifest = {
            let mut st = self.state();
            if !st.in_flight.is_empty() || st.restoring {
                return Err(Error::Busy(
                    "cannot restore while a checkpoint or restore is in flight".into(),
                ));
            }
            let manifest = st
                .manifests
                .get(&id)
                .cloned()
                .ok_or(Error::NoSuchCheckpoint(id))?;
            st.restoring = true;
            for object in manifest.objects() {
                st.registry.pin(object);
            }
            manifest
        };
        let result = (|| -> Result<()> {
            let hosted: Vec<&BackendSnapshot> = manifest
                .backends
                .iter()
                .filter(|s| {
                    let hosted = self.inner.backends.contains_key(&s.name);
                    if !hosted {
                        log::warn!(
                            "checkpoint {id} holds backend {} which is not hosted",
                            s.name
                        );
                    }
                    hosted
                })
                .collect();
            let items: Vec<(PathBuf, &BackendSnapshot)> = hosted
                .iter()
                .map(|s| (backend_dir(&self.inner.state_dir, &s.name), *s))
                .collect();
            // Copy, verify and open every snapshot first: a bad object fails the restore
            // with every live database untouched and open.
            let prepared = prepare_all(
                self.inner.store.as_ref(),
                &self.inner.backend_options,
                &items,
            )?;
            crate::failpoint!("restore::after-prepare");
            // Every backend stays locked until all run from the checkpoint and the intent
            // is gone: no write is acknowledged that the next start could roll back.
            let mut guards: Vec<_> = items
                .iter()
                .map(|(_, s)| {
                    self.inner.backends[&s.name]
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                })
                .collect();
            // From the first swap on, a crash must not leave some backends restored and
            // others not: the next start finishes the restore (see Engine::open).
            write_restore_intent(&self.inner.state_dir, id)?;
            let swapped = (|| -> Result<()> {
                for (((dir, snapshot), fresh), guard) in
                    items.iter().zip(&prepared).zip(guards.iter_mut())
                {
                    **guard = None; // close the live database before replacing its files
                    swap_in_snapshot(dir, fresh)?;
                    crate::failpoint!("restore::after-swap");
                    let backend =
                        Backend::open_restored(dir, &snapshot.name, &self.inner.backend_options)?;
                    let mut st = self.state();
                    st.lineages
                        .insert(snapshot.name.clone(), backend.lineage().to_string());
                    st.bases
                        .insert(snapshot.name.clone(), base_of(id, snapshot));
                    **guard = Some(backend);
                    log::info!("backend {} restored from checkpoint {id}", snapshot.name);
                }
                clear_restore_intent(&self.inner.state_dir)
            })();
            if swapped.is_err() {
                // Half restored: take no writes until a restart finishes the restore.
                for guard in guards.iter_mut() {
                    **guard = None;
                }
            }
            swapped
        })();
        let mut st = self.state();
        st.restoring = false;
        self.inner.slot_freed.notify_all();
        let mut garbage = Vec::new();
        for object in manifest.objects() {
            garbage.extend(st.registry.unpin(&object));
        }
        self.delete_objects(&st, &garbage);
        if let Err(e) = &result {
            st.last_error = Some(format!("restore from checkpoint {id} failed: {e}"));
        }
        result
    }

    fn apply_retention(&self, st: &mut State) -> Result<()> {
        for victim in st.registry.retention_victims(st.meta.retain as usize) {
            self.drop_checkpoint_locked(st, victim)?;
            crate::failpoint!("retention::between-drops");
        }
        Ok(())
    }

    fn drop_checkpoint_locked(&self, st: &mut State, id: u64) -> Result<()> {
        self.inner.catalog.remove(id)?;
        crate::failpoint!("drop::after-manifest-removed");
        st.manifests.remove(&id);
        let garbage = st.registry.drop_checkpoint(id).unwrap_or_default();
        self.delete_objects(st, &garbage);
        log::info!("dropped checkpoint {id}; deleted {} objects", garbage.len());
        Ok(())
    }

    /// Delete objects the registry declared garbage. Called with the state lock held, so no
    /// checkpoint can match or publish the same object meanwhile. A failed delete leaves an
    /// orphan that the next start (or `fsck --repair`) removes.
    fn delete_objects(&self, st: &State, garbage: &[ObjectId]) {
        if self.inner.deletes_frozen && !garbage.is_empty() {
            log::warn!(
                "keeping {} unreferenced objects: deletions are frozen while a manifest is \
                 unreadable or quarantined",
                garbage.len()
            );
            return;
        }
        for id in garbage.iter().filter(|id| !st.kept.contains(id)) {
            if let Err(e) = self.inner.store.delete(id) {
                log::warn!("could not delete object {id}: {e}");
            } else {
                log::info!("deleted object {id}");
            }
            crate::failpoint!("drop::mid-delete");
        }
    }
}

struct PendingBackend {
    name: BackendName,
    lineage: String,
    files: Vec<StagedFile>,
    base: Option<Base>,
}

/// A checkpoint between its synchronous phase and its completion. Completing it runs the
/// asynchronous phase; dropping it without completing aborts it and leaves nothing behind.
pub struct PendingCheckpoint {
    engine: Engine,
    id: u64,
    parts: Vec<PendingBackend>,
    staging: PathBuf,
    started_unix_ms: u64,
    sync_micros: u64,
    pins: Vec<ObjectId>,
    finished: bool,
    /// The manifest may exist on disk after a failed commit: delete nothing, let the next
    /// start decide from what is durable.
    keep_objects: bool,
}

impl PendingCheckpoint {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn sync_micros(&self) -> u64 {
        self.sync_micros
    }

    /// The asynchronous phase: store what is new, re-reference the rest, commit, register,
    /// apply retention.
    pub fn complete(mut self) -> Result<Arc<Manifest>> {
        crate::failpoint!("checkpoint::after-sync");
        let clock = Instant::now();
        match self.upload(usize::MAX) {
            Ok((backends, mut stats)) => {
                stats.sync_micros = self.sync_micros;
                stats.async_micros = clock.elapsed().as_micros() as u64;
                let manifest = Manifest {
                    format: FORMAT,
                    id: self.id,
                    started_unix_ms: self.started_unix_ms,
                    completed_unix_ms: now_unix_ms(),
                    backends,
                    stats,
                };
                match self.commit(manifest) {
                    Ok(m) => Ok(m),
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
        let e = Error::Busy(format!("checkpoint {} aborted", self.id));
        self.fail(&e);
    }

    /// Test hook: store at most `uploads` new objects, then stop as if the process had been
    /// killed there: no cleanup, no manifest. Recovery at the next start must sweep it.
    #[doc(hidden)]
    pub fn simulate_crash(mut self, uploads: usize) {
        let _ = self.upload(uploads);
        self.finished = true;
    }

    fn upload(
        &mut self,
        mut upload_budget: usize,
    ) -> Result<(Vec<BackendSnapshot>, CheckpointStats)> {
        let inner = &self.engine.inner;
        let mut stats = CheckpointStats::default();
        let mut snapshots = Vec::new();
        for part in &self.parts {
            let mut entries = Vec::with_capacity(part.files.len());
            for file in &part.files {
                stats.files_total += 1;
                stats.bytes_total += file.size;
                let shared = is_shared_file(&file.name);
                // Re-reference by name only within the lineage of a confirmed checkpoint,
                // and only while the object is still alive.
                if let Some(known) = part
                    .base
                    .as_ref()
                    .filter(|_| shared)
                    .and_then(|b| b.files.get(&file.name))
                    .filter(|known| known.size == file.size)
                {
                    let mut st = self.engine.state();
                    if st.can_share(&known.object) {
                        st.registry.pin(known.object);
                        self.pins.push(known.object);
                        stats.files_reused += 1;
                        entries.push(known.clone());
                        continue;
                    }
                }
                stats.files_new += 1;
                // A new SST of an established lineage is almost never stored yet: copy it
                // in one pass. Anything else (private files, the first checkpoint of a
                // lineage, e.g. after a restore) is hashed first, because its content is
                // often stored already and the copy can be skipped.
                let hash_first = !(shared && part.base.is_some());
                let expected = if hash_first {
                    let (id, size) = hash_file(&file.path)?;
                    let mut st = self.engine.state();
                    if st.can_share(&id) {
                        // Same content already stored (another backend, a private file that
                        // did not change, a restored file, or a concurrent checkpoint).
                        st.registry.pin(id);
                        self.pins.push(id);
                        if shared {
                            stats.bytes_new_sst += size;
                        }
                        entries.push(FileEntry {
                            name: file.name.clone(),
                            object: id,
                            size,
                        });
                        continue;
                    }
                    Some((id, size))
                } else {
                    None
                };
                if upload_budget == 0 {
                    return Err(Error::Busy("simulated crash".into()));
                }
                upload_budget -= 1;
                let staged = inner.store.stage(&file.path)?;
                let (id, size) = (staged.id, staged.size);
                if expected.is_some_and(|e| e != (id, size)) {
                    inner.store.discard(staged);
                    return Err(Error::Corrupt(format!(
                        "{} changed while it was being checkpointed",
                        file.path.display()
                    )));
                }
                if shared {
                    stats.bytes_new_sst += size;
                }
                let mut st = self.engine.state();
                if st.can_share(&id) {
                    // Stored already (by a concurrent checkpoint, or elsewhere): that copy
                    // survives, ours is the duplicate.
                    inner.store.discard(staged);
                } else {
                    inner.store.publish(staged)?;
                    stats.bytes_uploaded += size;
                    if st.missing.remove(&id) {
                        log::info!("object {id} was missing and is stored again");
                    }
                }
                st.registry.pin(id);
                self.pins.push(id);
                entries.push(FileEntry {
                    name: file.name.clone(),
                    object: id,
                    size,
                });
            }
            snapshots.push(BackendSnapshot {
                name: part.name.clone(),
                lineage: part.lineage.clone(),
                files: entries,
            });
        }
        Ok((snapshots, stats))
    }

    fn commit(&mut self, manifest: Manifest) -> Result<Arc<Manifest>> {
        let engine = self.engine.clone();
        let inner = &engine.inner;
        let mut st = engine.state();
        crate::failpoint!("checkpoint::before-commit");
        if let Err(e) = inner.catalog.commit(&manifest) {
            // The rename may have happened even if a later fsync failed. If the manifest
            // cannot be removed (durably), it may still name our objects: leave them to the
            // sweep at the next start instead of deleting them.
            if let Err(remove) = inner.catalog.remove(manifest.id) {
                log::warn!("checkpoint {}: manifest may remain: {remove}", manifest.id);
                self.keep_objects = true;
            }
            return Err(e);
        }
        let id = manifest.id;
        crate::failpoint!("checkpoint::after-commit");
        st.registry.register_checkpoint(id, manifest.objects());
        crate::failpoint!("checkpoint::after-register");
        let mut garbage = Vec::new();
        for pin in self.pins.drain(..) {
            garbage.extend(st.registry.unpin(&pin));
        }
        engine.delete_objects(&st, &garbage);
        st.in_flight.remove(&id);
        inner.slot_freed.notify_all();
        for snapshot in &manifest.backends {
            let current = st.lineages.get(&snapshot.name) == Some(&snapshot.lineage);
            let newer = st
                .bases
                .get(&snapshot.name)
                .is_none_or(|b| b.checkpoint < id);
            if current && newer {
                st.bases
                    .insert(snapshot.name.clone(), base_of(id, snapshot));
            }
        }
        let manifest = Arc::new(manifest);
        st.manifests.insert(id, manifest.clone());
        log::info!(
            "checkpoint {id} complete: {} files ({} reused), {} bytes uploaded",
            manifest.stats.files_total,
            manifest.stats.files_reused,
            manifest.stats.bytes_uploaded
        );
        let retention = engine.apply_retention(&mut st);
        drop(st);
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

    fn fail(mut self, error: &Error) {
        self.release(Some(error));
    }

    fn release(&mut self, error: Option<&Error>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let engine = self.engine.clone();
        let mut st = engine.state();
        if self.keep_objects {
            // Not only now: no later drop may delete them either.
            log::warn!(
                "checkpoint {}: keeping its {} objects for recovery to judge",
                self.id,
                self.pins.len()
            );
            st.kept.extend(self.pins.iter().copied());
        }
        let mut garbage = Vec::new();
        for pin in self.pins.drain(..) {
            garbage.extend(st.registry.unpin(&pin));
        }
        engine.delete_objects(&st, &garbage);
        st.in_flight.remove(&self.id);
        engine.inner.slot_freed.notify_all();
        if let Some(e) = error {
            log::warn!("checkpoint {} failed: {e}", self.id);
            st.last_error = Some(format!("checkpoint {} failed: {e}", self.id));
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

/// Create the store directory if needed (owner-only) and make it owner-only; a path that
/// exists but is no directory is an error. Returns its canonical path (the root may be a
/// link the user chose; links inside the store are refused).
pub fn ensure_store_dir(root: &Path) -> Result<PathBuf> {
    if root.exists() && !root.is_dir() {
        return Err(Error::io(
            format!("store {}", root.display()),
            std::io::Error::from_raw_os_error(libc::ENOTDIR),
        ));
    }
    create_private_dir_all(root)?;
    let root = std::fs::canonicalize(root).ctx("resolve", root)?;
    make_private(&root)?;
    Ok(root)
}

/// `STATE/restore-intent`: the checkpoint a restore is installing, present from its first
/// swap until every backend runs from it.
fn restore_intent_path(state_dir: &Path) -> PathBuf {
    state_dir.join("restore-intent")
}

fn write_restore_intent(state_dir: &Path, id: u64) -> Result<()> {
    crate::fsutil::write_atomic(&restore_intent_path(state_dir), id.to_string().as_bytes())
}

fn clear_restore_intent(state_dir: &Path) -> Result<()> {
    let path = restore_intent_path(state_dir);
    match std::fs::remove_file(&path) {
        Ok(()) => fsync_dir(state_dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
    }
}

fn read_restore_intent(state_dir: &Path) -> Result<Option<u64>> {
    let path = restore_intent_path(state_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| {
            Error::Corrupt(format!("{} does not hold a checkpoint id", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

/// True if `root/objects` holds at least one object file.
fn store_has_objects(root: &Path) -> Result<bool> {
    let objects = root.join("objects");
    let shards = match std::fs::read_dir(&objects) {
        Ok(shards) => shards,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(format!("list {}", objects.display()), e)),
    };
    for shard in shards {
        let shard = shard.ctx("list", &objects)?.path();
        if shard.is_dir()
            && std::fs::read_dir(&shard)
                .ctx("list", &shard)?
                .next()
                .is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Store metadata rebuilt from the manifests when `ckptfs.json` is lost: every backend they
/// hold, ids past the newest, and a retention that keeps every one of them.
fn rebuild_meta(manifests: &BTreeMap<u64, Manifest>) -> StoreMeta {
    let mut backends: Vec<BackendName> = manifests
        .values()
        .flat_map(|m| m.backends.iter().map(|b| b.name.clone()))
        .collect();
    backends.sort();
    backends.dedup();
    let defaults = StoreMeta::default();
    StoreMeta {
        next_checkpoint: manifests.keys().next_back().map_or(1, |n| n + 1),
        retain: defaults.retain.max(manifests.len() as u32),
        backends,
        ..defaults
    }
}

fn validate_retain(retain: u32) -> Result<u32> {
    if retain == 0 {
        return Err(Error::Invalid("retain must be at least 1".into()));
    }
    Ok(retain)
}

fn backend_dir(state_dir: &Path, name: &BackendName) -> PathBuf {
    state_dir.join("backends").join(name.rel_path())
}

fn base_of(checkpoint: u64, snapshot: &BackendSnapshot) -> Base {
    Base {
        checkpoint,
        files: Arc::new(
            snapshot
                .files
                .iter()
                .map(|f| (f.name.clone(), f.clone()))
                .collect(),
        ),
    }
}

fn latest_snapshot(
    manifests: &BTreeMap<u64, Arc<Manifest>>,
    name: &BackendName,
) -> Option<(u64, BackendSnapshot)> {
    manifests
        .iter()
        .rev()
        .find_map(|(id, m)| m.backend(name).map(|s| (*id, s.clone())))
}

fn latest_snapshot_of_lineage(
    manifests: &BTreeMap<u64, Arc<Manifest>>,
    name: &BackendName,
    lineage: &str,
) -> Option<(u64, BackendSnapshot)> {
    manifests.iter().rev().find_map(|(id, m)| {
        m.backend(name)
            .filter(|s| s.lineage == lineage)
            .map(|s| (*id, s.clone()))
    })
}

/// Delete objects no manifest references;
/// report referenced objects that are missing.
fn sweep(store: &dyn ObjectStore, registry: &Registry) -> Result<(usize, Vec<ObjectId>)> {
    let live = registry.live_objects();
    let listed: BTreeSet<ObjectId> = store.list()?.into_iter().collect();
    let mut orphans = 0;
    for id in listed.difference(&live) {
        store.delete(id)?;
        crate::failpoint!("open::mid-sweep");
        orphans += 1;
    }
    let missing = live.difference(&listed).copied().collect();
    Ok((orphans, missing))
}

/// Write one backend's files of a checkpoint into `dir` (verified), a directory RocksDB
/// opens. `dir` must be empty or missing.
pub fn materialize(
    store: &dyn ObjectStore,
    snapshot: &BackendSnapshot,
    dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    create_private_dir_all(dir)?;
    for file in &snapshot.files {
        store.copy_verified(&file.object, file.size, &dir.join(&file.name))?;
        progress(file.size);
    }
    fsync_dir(dir)
}

/// Write a checkpoint's files for the backend living in `dir` into `dir/restore.tmp`
/// (verified, durable), leaving the live database alone.
fn prepare_snapshot(
    store: &dyn ObjectStore,
    snapshot: &BackendSnapshot,
    dir: &Path,
) -> Result<PathBuf> {
    let fresh = dir.join("restore.tmp");
    remove_tree(&fresh)?;
    materialize(store, snapshot, &fresh, &mut |_| {})?;
    Ok(fresh)
}

/// Prepare the snapshots of several backends, each copied, verified and opened once (then
/// closed), before any live database is replaced. On error, nothing prepared is left.
fn prepare_all(
    store: &dyn ObjectStore,
    options: &BackendOptions,
    items: &[(PathBuf, &BackendSnapshot)],
) -> Result<Vec<PathBuf>> {
    let mut prepared = Vec::new();
    for (dir, snapshot) in items {
        let result = prepare_snapshot(store, snapshot, dir)
            .and_then(|fresh| Backend::check_opens(&fresh, options).map(|_| fresh));
        match result {
            Ok(fresh) => prepared.push(fresh),
            Err(e) => {
                for path in prepared
                    .iter()
                    .chain(std::iter::once(&dir.join("restore.tmp")))
                {
                    let _ = remove_tree(path);
                }
                return Err(e);
            }
        }
    }
    Ok(prepared)
}

/// Replace the (closed) database in `dir` by a prepared snapshot.
fn swap_in_snapshot(dir: &Path, fresh: &Path) -> Result<()> {
    let old = dir.join("db.old");
    remove_tree(&old)?;
    // The old lineage must not outlive the old database: if we die after the rename below
    // but before the restored database gets its new lineage, a stale one would let the
    // next checkpoint re-reference abandoned files by name.
    Backend::forget_lineage(dir)?;
    let db = Backend::db_dir(dir);
    if db.exists() {
        std::fs::rename(&db, &old).ctx("move aside", &db)?;
        crate::failpoint!("restore::mid-swap");
    }
    std::fs::rename(fresh, &db).ctx("install restored database", &db)?;
    fsync_dir(dir)?;
    remove_tree(&old)
}

/// Replace the database of the backend living in `dir` with a checkpoint's files (the
/// tests use it to stop a restore half way).
#[cfg(test)]
fn install_snapshot(store: &dyn ObjectStore, snapshot: &BackendSnapshot, dir: &Path) -> Result<()> {
    let fresh = prepare_snapshot(store, snapshot, dir)?;
    swap_in_snapshot(dir, &fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        crate::restore::restore_checkpoint(&store, cp.id, &out, |_| {}).unwrap();
        assert_eq!(
            crate::backend::scan_dir(&out.join("A/0")).unwrap(),
            expected
        );
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
        assert!(engine.state().in_flight.is_empty());
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
