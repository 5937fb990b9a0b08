//! Starting the engine on a store opened by [`crate::repo::Repo`] (as its writer, or as a
//! read-only follower): load the catalog, recover (leftovers, orphans, an interrupted
//! restore), and start the backends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use super::restore::{
    clear_restore_intent, prepare_all, read_restore_intent, swap_in_snapshot, write_restore_intent,
};
use super::state::{base_of, Base, Lineages};
use super::{backend_dir, validate_retain, Engine, EngineConfig, Inner, State};
use crate::backend::Backend;
use crate::catalog::{BackendSnapshot, Catalog, FileList, Manifest, StoreMeta, Unreadable, FORMAT};
use crate::error::{Error, Result};
use crate::fsutil::remove_tree;
use crate::lock::DirLock;
use crate::names::BackendName;
use crate::registry::Registry;
use crate::repo::{Repo, StateDir, Writer, WriterOptions};
use crate::store::{layout, Location, ObjectId, ObjectStore};

impl Engine {
    /// Open a store (creating it if new), recover, and start the backends: the store is
    /// taken over and its catalog loaded ([`load`]), the metadata settled ([`settle_meta`])
    /// and the start judged ([`refuse_bad_start`]) before anything changes; then the
    /// catalog is recovered ([`recover_catalog`]) and the objects swept ([`sweep_store`]),
    /// an interrupted restore found ([`restore_to_finish`]) and the backends started
    /// ([`start_backends`]).
    pub fn open(config: EngineConfig) -> Result<Engine> {
        // Options matter only to the backends this engine opens (an import opens none,
        // and creating RocksDB's options costs a process per import milliseconds).
        if config.host_backends {
            config.backend_options.validate()?;
        }
        let opened = Repo::writer(
            &config.store,
            WriterOptions {
                state: config.state.as_deref(),
                restore_from: config.restore_from,
                lease_ttl: config.lease_ttl,
                lease_wait: config.lease_wait,
                s3: &config.s3,
            },
        )?;
        let (repo, state_dir) = (&opened.repo, opened.state.path.as_path());
        let mut loaded = load(&repo.catalog, &repo.location, opened.had_objects)?;
        let as_loaded = loaded.meta.clone();
        let mut meta = settle_meta(&mut loaded, &config, &repo.location)?;
        refuse_bad_start(&config, &meta, &loaded, state_dir, &repo.location)?;
        let unreadable_ids = loaded.unreadable_ids.clone();
        let catalog = recover_catalog(repo, &mut meta, as_loaded.as_ref(), loaded)?;
        let swept = sweep_store(repo.objects.as_ref(), &config, catalog)?;
        remove_tree(&state_dir.join(layout::STAGING))?;
        let restore_from =
            restore_to_finish(&config, state_dir, &swept.manifests, &unreadable_ids)?;
        let hosted: &[BackendName] = if config.host_backends {
            &meta.backends
        } else {
            &[]
        };
        let started = start_backends(
            &config,
            state_dir,
            repo.objects.as_ref(),
            hosted,
            &swept.manifests,
            &unreadable_ids,
            restore_from,
        )?;
        let mut state = State {
            lineages: Lineages::new(started.lineages, started.bases),
            ..State::new(swept.registry, swept.manifests, meta, swept.last_error)
        };
        state.held.missing = swept.missing.into_iter().collect();
        let engine = Engine::assemble(
            &config,
            Parts {
                location: opened.repo.location,
                state_dir: opened.state.path,
                state_lock: opened.state.lock,
                store: opened.repo.objects,
                catalog: opened.repo.catalog,
                backends: started.backends,
                state,
                deletes_frozen: swept.deletes_frozen,
                writer: Some(opened.writer),
            },
        );
        engine.apply_retention(&engine.catalog_writes())?;
        // A lease taken over while this daemon was starting: it must not serve as a writer.
        engine.inner.catalog.check_writer()?;
        // Loading thousands of manifests leaves freed memory behind: give it back.
        crate::fsutil::release_free_memory();
        Ok(engine)
    }

    /// Open a read-only view of a store that another process may be writing (from another
    /// host, on object storage): no backends, no lock or lease, nothing written or deleted.
    /// [`Engine::refresh_checkpoints`] picks up what the writer commits and drops.
    pub fn open_read_only(config: EngineConfig) -> Result<Engine> {
        let Some(state) = &config.state else {
            return Err(Error::Invalid(
                "a read-only view needs a state directory for its cache".into(),
            ));
        };
        let state = StateDir::lock(state)?;
        let repo = Repo::follower(&config.store, &config.s3, &state)?;
        let (store, catalog) = (repo.objects, repo.catalog);
        let meta = match catalog.load_meta() {
            Ok(Some(meta)) => meta,
            Ok(None) if catalog.has_manifests()? => StoreMeta::default(),
            Ok(None) => {
                return Err(Error::NotFound(format!(
                    "{} is not a ckptfs store (no ckptfs.json, no checkpoints/)",
                    config.store
                )))
            }
            Err(e) => return Err(e),
        };
        let engine = Engine::assemble(
            &config,
            Parts {
                location: config.store.clone(),
                state_dir: state.path,
                state_lock: state.lock,
                store,
                catalog,
                backends: BTreeMap::new(),
                state: State::new(Registry::default(), BTreeMap::new(), meta, None),
                deletes_frozen: true,
                writer: None,
            },
        );
        engine.refresh_checkpoints()?;
        Ok(engine)
    }

    /// The engine over what opening a store gave: the one place its `Inner` is built. A
    /// store opened without a writer's lock or lease is a read-only view.
    fn assemble(config: &EngineConfig, parts: Parts) -> Engine {
        let read_only = parts.writer.is_none();
        Engine {
            inner: Arc::new(Inner {
                location: parts.location,
                state_dir: parts.state_dir,
                store: parts.store,
                catalog: parts.catalog,
                backend_options: config.backend_options.clone(),
                materialize: config.materialize,
                last_trim: Mutex::new(std::time::Instant::now()),
                counters: super::counters::Counters::new(parts.state.health.last_error.is_some()),
                flink_refused: Mutex::new(Vec::new()),
                follower: Mutex::new(None),
                max_concurrent: if read_only {
                    1
                } else {
                    config.max_concurrent.max(1)
                },
                orphan_grace: config.orphan_grace,
                read_only,
                backends: parts.backends,
                state: Mutex::new(parts.state),
                catalog_writes: Mutex::new(()),
                slot_freed: Condvar::new(),
                deletes_frozen: parts.deletes_frozen,
                _state_lock: parts.state_lock,
                _writer: parts.writer,
            }),
        }
    }
}

/// What an engine is assembled from (see [`Engine::assemble`]).
struct Parts {
    location: Location,
    state_dir: PathBuf,
    state_lock: DirLock,
    store: Arc<dyn ObjectStore>,
    catalog: Catalog,
    backends: BTreeMap<BackendName, RwLock<Option<Backend>>>,
    state: State,
    deletes_frozen: bool,
    /// The writer's lock or lease; none for a read-only view.
    writer: Option<Writer>,
}

/// The catalog as a writer's start finds it.
struct Loaded {
    /// `ckptfs.json`, taken over (none in a new store, or one that lost it).
    meta: Option<StoreMeta>,
    /// Its copy, `ckptfs.copy.json`, read only when `ckptfs.json` is missing: what
    /// rebuilds it (none in a new store, or one last written before the copy existed).
    copy: Option<StoreMeta>,
    /// The readable manifests, as stored (not migrated yet).
    manifests: BTreeMap<u64, Manifest>,
    /// The manifests that cannot be read, and the ids of those named like one.
    unreadable: Vec<Unreadable>,
    unreadable_ids: BTreeSet<u64>,
    /// What the start reports in `status` (startup problems add up: none hides another).
    last_error: Option<String>,
}

/// Take the store over and load its catalog. On object storage taking it over is where
/// the store becomes this writer's: every write of an earlier writer fails from here on
/// (see [`Catalog::take_over`]).
fn load(catalog: &Catalog, root: &Location, had_objects: bool) -> Result<Loaded> {
    let meta = catalog.take_over()?;
    // A damaged copy stops the start, as a damaged ckptfs.json does: rebuilding without
    // it would lose the pins, the policy and the ids used.
    let copy = match meta {
        Some(_) => None,
        None => catalog.load_meta_copy()?,
    };
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
    if meta.is_none() && manifests.is_empty() && unreadable.is_empty() && had_objects {
        return Err(Error::Corrupt(format!(
            "{} holds objects but neither ckptfs.json nor checkpoint manifests: the \
             store is incomplete (a partial copy?); refusing to start so that nothing is \
             deleted",
            root
        )));
    }
    let unreadable_ids = unreadable
        .iter()
        .filter_map(|(n, _)| crate::catalog::manifest_id(n))
        .collect();
    Ok(Loaded {
        meta,
        copy,
        manifests,
        unreadable,
        unreadable_ids,
        last_error,
    })
}

/// The metadata this start writes: as loaded (or rebuilt from its copy and the manifests
/// when it was lost), with the configured retention and backends, and every imported
/// backend external.
fn settle_meta(loaded: &mut Loaded, config: &EngineConfig, root: &Location) -> Result<StoreMeta> {
    let manifests = &loaded.manifests;
    let mut meta = match loaded.meta.take() {
        Some(meta) => meta,
        None if manifests.is_empty() && loaded.copy.is_none() => StoreMeta::default(),
        None => {
            let from_copy = loaded.copy.is_some();
            let rebuilt = rebuild_meta(manifests, &loaded.unreadable_ids, loaded.copy.take());
            log::warn!(
                "{}/ckptfs.json is missing: rebuilt it from {} manifests{} (backends {}, \
                 next checkpoint {}, policy {}, pins {:?})",
                root,
                manifests.len(),
                if from_copy {
                    " and its copy ckptfs.copy.json"
                } else {
                    " alone (no copy): pins, the policy's rules by time and dropped Flink \
                     checkpoints are not known, every checkpoint is retained"
                },
                rebuilt
                    .backends
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                rebuilt.next_checkpoint,
                rebuilt.policy(),
                rebuilt.pins
            );
            rebuilt
        }
    };
    if let Some(retain) = config.retain {
        meta.retain = validate_retain(retain)?;
    }
    if let Some(keep) = &config.keep {
        meta.keep = keep.clone();
    }
    // A backend first imported by a checkpoint whose write of the metadata was lost
    // after its manifest (a local store's commit point) is external all the same.
    for name in imported_backends(&loaded.manifests) {
        if !meta.backends.contains(&name) && !meta.external.contains(&name) {
            meta.external.push(name);
            meta.external.sort();
        }
    }
    if let Some(name) = config.backends.iter().find(|n| meta.external.contains(n)) {
        return Err(Error::Invalid(format!(
            "backend {name} is external in {root}: its state is imported (`ckptfs \
             import`), and a daemon cannot host it; choose another name"
        )));
    }
    if config.host_backends {
        for name in &config.backends {
            if !meta.backends.contains(name) {
                meta.backends.push(name.clone());
            }
        }
        // A new store hosts one backend unless told otherwise (a store of imports
        // needs none).
        if meta.backends.is_empty() && meta.external.is_empty() {
            meta.backends.push(BackendName::new("default", 0)?);
        }
    }
    meta.backends.sort();
    meta.backends.dedup();
    Ok(meta)
}

/// Refuse a start that cannot go well, before anything is changed: a `--restore` from a
/// checkpoint that is missing or unreadable, an interrupted restore that only a daemon
/// hosting the backends can finish, a backend both hosted and external.
fn refuse_bad_start(
    config: &EngineConfig,
    meta: &StoreMeta,
    loaded: &Loaded,
    state_dir: &Path,
    root: &Location,
) -> Result<()> {
    if let Some(n) = config.restore_from {
        if loaded.unreadable_ids.contains(&n) {
            return Err(Error::Corrupt(format!(
                "checkpoint {n} cannot be restored: its manifest cannot be read (see \
                 `ckptfs fsck`)"
            )));
        }
        if !loaded.manifests.contains_key(&n) {
            return Err(Error::NoSuchCheckpoint(n));
        }
    }
    if !config.host_backends {
        // Only a daemon that hosts the backends can finish an interrupted restore;
        // writing without it would let retention drop the checkpoint it restores.
        if let Some(n) = read_restore_intent(state_dir)? {
            return Err(Error::Busy(format!(
                "a restore from checkpoint {n} was interrupted in {}: mount the store \
                 to finish it first; nothing was changed",
                state_dir.display()
            )));
        }
    }
    if let Some(name) = meta.backends.iter().find(|n| meta.external.contains(n)) {
        return Err(Error::Corrupt(format!(
            "backend {name} is both hosted and external in {root}/ckptfs.json; nothing \
             was changed"
        )));
    }
    Ok(())
}

/// The catalog after recovery, before the objects are swept.
struct RecoveredCatalog {
    manifests: BTreeMap<u64, Manifest>,
    deletes_frozen: bool,
    last_error: Option<String>,
}

/// Recover the catalog: remove leftovers of interrupted writes, migrate manifests of
/// formats 1 and 2, and write the metadata this start settled (the current format, ids
/// past every manifest's, on object storage the void ids compacted) unless it is the
/// metadata as loaded (`as_loaded`: nothing to write, and a store opened for one import
/// saves a write and two fsyncs), then remove void manifests.
fn recover_catalog(
    repo: &Repo,
    meta: &mut StoreMeta,
    as_loaded: Option<&StoreMeta>,
    loaded: Loaded,
) -> Result<RecoveredCatalog> {
    let (store, catalog) = (repo.objects.as_ref(), &repo.catalog);
    let Loaded {
        manifests,
        unreadable,
        unreadable_ids,
        mut last_error,
        ..
    } = loaded;
    let leftovers = store.clear_staging()? + catalog.clear_leftovers()?;
    if leftovers > 0 {
        log::info!("removed {leftovers} leftovers of interrupted writes");
    }
    let mut deletes_frozen = !unreadable.is_empty() || catalog.has_quarantine();
    // Manifests of formats 1 and 2 list every file inline: store their lists (sharing
    // between checkpoints) and rewrite them in the current format. Each rewrite is
    // atomic after its lists are durable; lists of an interrupted one are orphans.
    let manifests = if deletes_frozen {
        manifests
    } else {
        match migrate(catalog, manifests) {
            Ok(migrated) => migrated,
            Err((manifests, e)) => {
                // A rewrite that failed late may be on disk, naming lists the registry
                // would not know: delete nothing this run.
                let msg = format!(
                    "could not migrate checkpoint manifests to format {FORMAT} ({e}); no \
                     object is deleted until the next start"
                );
                log::error!("{msg}");
                last_error = Some(msg);
                deletes_frozen = true;
                manifests
            }
        }
    };
    // This daemon writes manifests of the current format, migrated or not: older
    // versions must refuse the store clearly, not find new manifests unreadable.
    meta.format = FORMAT;
    let newest = manifests
        .keys()
        .copied()
        .chain(unreadable_ids.iter().copied())
        .max();
    if let Some(last) = newest {
        meta.next_checkpoint = meta.next_checkpoint.max(last + 1);
    }
    if catalog.commits_in_meta() {
        meta.compact_void(
            manifests
                .keys()
                .copied()
                .chain(unreadable_ids.iter().copied()),
        );
    }
    if as_loaded != Some(&*meta) {
        catalog.save_meta(meta)?;
    } else {
        // Its copy may be behind it (a crash between the two writes, a store last written
        // before the copy existed): one read, and a write where it is.
        catalog.sync_copy(meta);
    }
    if catalog.commits_in_meta() {
        remove_void_manifests(catalog)?;
    }
    Ok(RecoveredCatalog {
        manifests,
        deletes_frozen,
        last_error,
    })
}

/// The store after the sweep: what the engine's state starts from.
struct Swept {
    manifests: BTreeMap<u64, Arc<Manifest>>,
    registry: Registry,
    /// Referenced objects the store does not hold.
    missing: Vec<ObjectId>,
    deletes_frozen: bool,
    last_error: Option<String>,
}

/// Count the references of the recovered catalog and sweep the store: delete orphans
/// (unless deletions are frozen) and find referenced objects that are missing.
fn sweep_store(
    store: &dyn ObjectStore,
    config: &EngineConfig,
    catalog: RecoveredCatalog,
) -> Result<Swept> {
    let RecoveredCatalog {
        manifests,
        deletes_frozen,
        mut last_error,
    } = catalog;
    let mut registry =
        Registry::from_checkpoints(manifests.iter().map(|(id, m)| (*id, m.object_refs())));
    for m in manifests.values() {
        registry.set_sizes(m.stored_sizes());
    }
    crate::failpoint!("open::before-sweep");
    let (orphans, missing) = if !deletes_frozen {
        sweep(store, &registry, config.orphan_grace)?
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
    Ok(Swept {
        manifests: manifests
            .into_iter()
            .map(|(id, m)| (id, Arc::new(m)))
            .collect(),
        registry,
        missing,
        deletes_frozen,
        last_error,
    })
}

/// The checkpoint the backends start from: `--restore`, or the restore a crash
/// interrupted (finished first: its backends must not come up half from the checkpoint and
/// half from their old state).
fn restore_to_finish(
    config: &EngineConfig,
    state_dir: &Path,
    manifests: &BTreeMap<u64, Arc<Manifest>>,
    unreadable_ids: &BTreeSet<u64>,
) -> Result<Option<u64>> {
    match (config.restore_from, read_restore_intent(state_dir)?) {
        (Some(n), _) => Ok(Some(n)),
        (None, Some(n)) if manifests.contains_key(&n) => {
            log::warn!("finishing the restore from checkpoint {n} that was interrupted");
            Ok(Some(n))
        }
        (None, Some(n)) => {
            // Starting would mix restored and old backends: let the operator choose.
            let why = if unreadable_ids.contains(&n) {
                "its manifest cannot be read"
            } else {
                "it no longer exists"
            };
            Err(Error::Corrupt(format!(
                "a restore from checkpoint {n} was interrupted and cannot be finished: \
                 {why}. Some backends may hold checkpoint {n}, others their old state; \
                 start with --restore M to choose the checkpoint they all start from"
            )))
        }
        (None, None) => Ok(None),
    }
}

/// The hosted backends, open, with their lineages and the bases of their next
/// checkpoints.
struct Started {
    backends: BTreeMap<BackendName, RwLock<Option<Backend>>>,
    lineages: HashMap<BackendName, String>,
    bases: HashMap<BackendName, Base>,
}

/// Start the hosted backends. Those that start from a checkpoint (`restore_from`, or
/// the newest holding them when they have no local state) have every snapshot copied,
/// verified and opened once before any live database is replaced, so a bad object or
/// option fails the start with all local state as it was.
fn start_backends(
    config: &EngineConfig,
    state_dir: &Path,
    store: &dyn ObjectStore,
    hosted: &[BackendName],
    manifests: &BTreeMap<u64, Arc<Manifest>>,
    unreadable_ids: &BTreeSet<u64>,
    restore_from: Option<u64>,
) -> Result<Started> {
    let mut sources = BTreeMap::new();
    for name in hosted {
        let dir = backend_dir(state_dir, name);
        let has_local = Backend::db_dir(&dir).join("CURRENT").exists();
        // A backend without local state starts from its newest checkpoint: never
        // from an older one, or empty, while a newer manifest cannot be read.
        let newest_of_backend = || -> Result<Option<(u64, BackendSnapshot)>> {
            let latest = latest_snapshot(manifests, name);
            let newest_readable = latest.as_ref().map_or(0, |(id, _)| *id);
            if let Some(newer) = unreadable_ids.iter().find(|id| **id > newest_readable) {
                return Err(Error::Corrupt(format!(
                    "backend {name} has no local state, and checkpoint {newer}, newer \
                     than any readable one holding it, cannot be read; run `ckptfs \
                     fsck` (--repair quarantines it) or start with --restore M"
                )));
            }
            Ok(latest)
        };
        let source =
            match restore_from.and_then(|n| manifests[&n].backend(name).map(|s| (n, s.clone()))) {
                Some(source) => Some(source),
                // Not in the checkpoint restored from: like any other start.
                None if !has_local => newest_of_backend()?,
                None => None,
            };
        if let Some(source) = source {
            sources.insert(name.clone(), source);
        }
    }
    let items: Vec<(PathBuf, &BackendSnapshot)> = sources
        .iter()
        .map(|(name, (_, snapshot))| (backend_dir(state_dir, name), snapshot))
        .collect();
    let prepared = prepare_all(store, &config.backend_options, &items)?;
    if let Some(n) = restore_from {
        write_restore_intent(state_dir, n)?;
    }
    for ((dir, _), fresh) in items.iter().zip(&prepared) {
        swap_in_snapshot(dir, fresh)?;
    }

    let mut started = Started {
        backends: BTreeMap::new(),
        lineages: HashMap::new(),
        bases: HashMap::new(),
    };
    for name in hosted {
        let dir = backend_dir(state_dir, name);
        let backend = match sources.get(name) {
            Some((checkpoint, snapshot)) => {
                log::info!("starting backend {name} from checkpoint {checkpoint}");
                let backend = Backend::open_restored(&dir, name, &config.backend_options)?;
                started
                    .bases
                    .insert(name.clone(), base_of(*checkpoint, snapshot));
                backend
            }
            None => {
                let backend = Backend::open_or_create(&dir, name, &config.backend_options)?;
                if let Some((checkpoint, snapshot)) =
                    latest_snapshot_of_lineage(manifests, name, backend.lineage())
                {
                    started
                        .bases
                        .insert(name.clone(), base_of(checkpoint, &snapshot));
                }
                backend
            }
        };
        started
            .lineages
            .insert(name.clone(), backend.lineage().to_string());
        started
            .backends
            .insert(name.clone(), RwLock::new(Some(backend)));
    }
    if restore_from.is_some() {
        clear_restore_intent(state_dir)?;
    }
    Ok(started)
}

/// The backends whose newest snapshot was imported.
fn imported_backends(manifests: &BTreeMap<u64, Manifest>) -> Vec<BackendName> {
    let mut newest: BTreeMap<&BackendName, &BackendSnapshot> = BTreeMap::new();
    for snapshot in manifests.values().flat_map(|m| &m.backends) {
        newest.insert(&snapshot.name, snapshot);
    }
    newest
        .into_iter()
        .filter(|(_, snapshot)| snapshot.is_imported())
        .map(|(name, _)| name.clone())
        .collect()
}

/// Store metadata rebuilt when `ckptfs.json` is lost, from its copy (`ckptfs.copy.json`)
/// and the manifests. With a copy: its settings (retain and the policy's rules, dropped
/// Flink checkpoints, backends) and the pins on checkpoints that still exist (readable or
/// not), ids past the copy's next one (past every id the store used) and past the newest
/// manifest. Without one (a store last written before the copy existed, or both lost):
/// every backend the manifests hold, ids past the newest, and a retention that keeps every
/// one of them.
fn rebuild_meta(
    manifests: &BTreeMap<u64, Manifest>,
    unreadable_ids: &BTreeSet<u64>,
    copy: Option<StoreMeta>,
) -> StoreMeta {
    // Each backend as its newest snapshot has it: imported files record their source.
    let imported = imported_backends(manifests);
    let hosted_in_copy = copy.as_ref().map_or(&[][..], |c| &c.backends[..]);
    let mut external: Vec<BackendName> =
        copy.as_ref().map_or_else(Vec::new, |c| c.external.clone());
    external.extend(
        imported
            .into_iter()
            .filter(|name| !hosted_in_copy.contains(name)),
    );
    external.sort();
    external.dedup();
    let mut backends: Vec<BackendName> = manifests
        .values()
        .flat_map(|m| m.backends.iter().map(|b| b.name.clone()))
        .chain(hosted_in_copy.iter().cloned())
        .filter(|name| !external.contains(name))
        .collect();
    backends.sort();
    backends.dedup();
    let past_manifests = manifests.keys().next_back().map_or(1, |n| n + 1);
    let Some(copy) = copy else {
        let defaults = StoreMeta::default();
        return StoreMeta {
            next_checkpoint: past_manifests,
            retain: defaults.retain.max(manifests.len() as u32),
            backends,
            external,
            ..defaults
        };
    };
    let mut pins = copy.pins;
    pins.retain(|name, id| {
        let there = manifests.contains_key(id) || unreadable_ids.contains(id);
        if !there {
            log::warn!(
                "pin {name} of the store's copied metadata is dropped: its checkpoint {id} \
                 no longer exists"
            );
        }
        there
    });
    let mut pin_expires = copy.pin_expires;
    pin_expires.retain(|name, _| pins.contains_key(name));
    StoreMeta {
        next_checkpoint: copy.next_checkpoint.max(past_manifests),
        backends,
        external,
        pins,
        pin_expires,
        ..copy
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

/// Store the file lists of manifests that list files inline and rewrite them in the
/// current format, oldest first (so each list can be a delta on the backend's previous one).
/// On failure, the manifests as they are now in memory (each one migrated or not).
#[allow(clippy::type_complexity)]
fn migrate(
    catalog: &Catalog,
    manifests: BTreeMap<u64, Manifest>,
) -> std::result::Result<BTreeMap<u64, Manifest>, (BTreeMap<u64, Manifest>, Error)> {
    let mut previous: BTreeMap<(BackendName, String), FileList> = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut migrated = 0;
    let mut rest = manifests.into_iter();
    while let Some((id, manifest)) = rest.next() {
        let manifest = if manifest.has_inline_lists() {
            let result = catalog.store_lists(&manifest, &previous).and_then(|m| {
                catalog.rewrite(&m)?;
                Ok(m)
            });
            match result {
                Ok(mut m) => {
                    m.format = FORMAT;
                    migrated += 1;
                    m
                }
                Err(e) => {
                    out.insert(id, manifest);
                    out.extend(rest);
                    return Err((out, e));
                }
            }
        } else {
            manifest
        };
        for b in &manifest.backends {
            previous.insert((b.name.clone(), b.lineage.clone()), b.file_list());
        }
        out.insert(id, manifest);
    }
    if migrated > 0 {
        log::info!("migrated {migrated} checkpoint manifests to format {FORMAT}");
    }
    Ok(out)
}

/// Delete the manifests that never count (object storage: written by a writer that lost the
/// store before it confirmed them, or dropped and not deleted yet). Their objects are
/// orphans now, left to the sweep.
fn remove_void_manifests(catalog: &Catalog) -> Result<()> {
    let void = catalog.list_manifests()?.void;
    for id in &void {
        catalog.remove(*id)?;
    }
    if !void.is_empty() {
        log::info!(
            "removed {} void manifests (of a writer that lost the store, or dropped)",
            void.len()
        );
    }
    Ok(())
}

/// Delete objects no manifest references (on object storage only those older than
/// `grace`: younger ones may be uploads of a daemon still running, or of a checkpoint that
/// failed a moment ago); report referenced objects that are missing.
fn sweep(
    store: &dyn ObjectStore,
    registry: &Registry,
    grace: std::time::Duration,
) -> Result<(usize, Vec<ObjectId>)> {
    // Looked up in the registry as listed: with a million objects, a set of the live ones
    // and another of the listed ones were 70 MB of the daemon's peak at its start.
    let listed = store.list_modified()?;
    let mut orphans = 0;
    let mut found = 0;
    for (id, modified) in &listed {
        if registry.is_live(id) {
            found += 1;
            continue;
        }
        if crate::store::is_young(*modified, grace) {
            log::info!("keeping unreferenced object {id} for now: younger than the grace period");
            continue;
        }
        store.delete(id)?;
        crate::failpoint!("open::mid-sweep");
        orphans += 1;
    }
    // Every live object listed (each is listed once): none is missing.
    if found == registry.live_count() {
        return Ok((orphans, Vec::new()));
    }
    let listed: BTreeSet<ObjectId> = listed.into_iter().map(|(id, _)| id).collect();
    let missing = registry
        .live_objects()
        .difference(&listed)
        .copied()
        .collect();
    Ok((orphans, missing))
}
