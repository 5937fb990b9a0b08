//! Starting the engine on a store opened by [`crate::repo::Repo`] (as its writer, or as a
//! read-only follower): load the catalog, recover (leftovers, orphans, an interrupted
//! restore), and start the backends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, RwLock};

use super::restore::{
    clear_restore_intent, prepare_all, read_restore_intent, swap_in_snapshot, write_restore_intent,
};
use super::{backend_dir, base_of, validate_retain, Engine, EngineConfig, Inner, State};
use crate::backend::Backend;
use crate::catalog::{BackendSnapshot, Catalog, FileList, Manifest, StoreMeta, FORMAT};
use crate::error::{Error, Result};
use crate::fsutil::remove_tree;
use crate::names::BackendName;
use crate::registry::Registry;
use crate::repo::{Repo, StateDir, WriterOptions};
use crate::store::{layout, ObjectId, ObjectStore};

impl Engine {
    /// Open a store (creating it if new), recover, and start the backends.
    pub fn open(config: EngineConfig) -> Result<Engine> {
        config.backend_options.validate()?;
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
        let (store, catalog, had_objects) =
            (opened.repo.objects, opened.repo.catalog, opened.had_objects);
        let root = opened.repo.location;
        // On object storage this is where the store becomes this writer's: every write of an
        // earlier writer fails from here on (see Catalog::take_over).
        let loaded_meta = catalog.take_over()?;
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
                root
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
                    root,
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
        // A backend first imported by a checkpoint whose write of the metadata was lost
        // after its manifest (a local store's commit point) is external all the same.
        for name in imported_backends(&manifests) {
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
        let (state_dir, state_lock) = (opened.state.path, opened.state.lock);
        if !config.host_backends {
            // Only a daemon that hosts the backends can finish an interrupted restore;
            // writing without it would let retention drop the checkpoint it restores.
            if let Some(n) = read_restore_intent(&state_dir)? {
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
            match migrate(&catalog, manifests) {
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
            .chain(
                unreadable
                    .iter()
                    .filter_map(|(n, _)| crate::catalog::manifest_id(n)),
            )
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
        catalog.save_meta(&meta)?;
        if catalog.commits_in_meta() {
            remove_void_manifests(&catalog)?;
        }
        let mut registry =
            Registry::from_checkpoints(manifests.iter().map(|(id, m)| (*id, m.object_refs())));
        for m in manifests.values() {
            registry.set_sizes(m.stored_sizes());
        }
        crate::failpoint!("open::before-sweep");
        let (orphans, missing) = if !deletes_frozen {
            sweep(store.as_ref(), &registry, config.orphan_grace)?
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
        remove_tree(&state_dir.join(layout::STAGING))?;
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
        let hosted: &[BackendName] = if config.host_backends {
            &meta.backends
        } else {
            &[]
        };
        let mut sources = BTreeMap::new();
        for name in hosted {
            let dir = backend_dir(&state_dir, name);
            let has_local = Backend::db_dir(&dir).join("CURRENT").exists();
            // A backend without local state starts from its newest checkpoint: never
            // from an older one, or empty, while a newer manifest cannot be read.
            let newest_of_backend = || -> Result<Option<(u64, BackendSnapshot)>> {
                let latest = latest_snapshot(&manifests, name);
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
            let source = match restore_from
                .and_then(|n| manifests[&n].backend(name).map(|s| (n, s.clone())))
            {
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
            .map(|(name, (_, snapshot))| (backend_dir(&state_dir, name), snapshot))
            .collect();
        let prepared = prepare_all(store.as_ref(), &config.backend_options, &items)?;
        if let Some(n) = restore_from {
            write_restore_intent(&state_dir, n)?;
        }
        for ((dir, _), fresh) in items.iter().zip(&prepared) {
            swap_in_snapshot(dir, fresh)?;
        }

        let mut backends = BTreeMap::new();
        let mut lineages = HashMap::new();
        let mut bases = HashMap::new();
        for name in hosted {
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
                location: root,
                state_dir,
                store,
                catalog,
                backend_options: config.backend_options.clone(),
                materialize: config.materialize,
                last_trim: Mutex::new(std::time::Instant::now()),
                counters: super::counters::Counters::new(last_error.is_some()),
                max_concurrent: config.max_concurrent.max(1),
                orphan_grace: config.orphan_grace,
                read_only: false,
                backends,
                state: Mutex::new(State {
                    lineages,
                    bases,
                    missing: missing.into_iter().collect(),
                    ..State::new(registry, manifests, meta, last_error)
                }),
                catalog_writes: Mutex::new(()),
                slot_freed: Condvar::new(),
                deletes_frozen,
                _state_lock: state_lock,
                _writer: Some(opened.writer),
            }),
        };
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
        let (state_dir, state_lock) = (state.path, state.lock);
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
        let engine = Engine {
            inner: Arc::new(Inner {
                location: config.store.clone(),
                state_dir,
                store,
                catalog,
                backend_options: config.backend_options.clone(),
                materialize: config.materialize,
                last_trim: Mutex::new(std::time::Instant::now()),
                counters: super::counters::Counters::new(false),
                max_concurrent: 1,
                orphan_grace: config.orphan_grace,
                read_only: true,
                backends: BTreeMap::new(),
                state: Mutex::new(State::new(Registry::default(), BTreeMap::new(), meta, None)),
                catalog_writes: Mutex::new(()),
                slot_freed: Condvar::new(),
                deletes_frozen: true,
                _state_lock: state_lock,
                _writer: None,
            }),
        };
        engine.refresh_checkpoints()?;
        Ok(engine)
    }
}

/// Store metadata rebuilt from the manifests when `ckptfs.json` is lost: every backend they
/// hold, ids past the newest, and a retention that keeps every one of them.
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

fn rebuild_meta(manifests: &BTreeMap<u64, Manifest>) -> StoreMeta {
    // Each backend as its newest snapshot has it: imported files record their source.
    let external = imported_backends(manifests);
    let mut backends: Vec<BackendName> = manifests
        .values()
        .flat_map(|m| m.backends.iter().map(|b| b.name.clone()))
        .filter(|name| !external.contains(name))
        .collect();
    backends.sort();
    backends.dedup();
    let defaults = StoreMeta::default();
    StoreMeta {
        next_checkpoint: manifests.keys().next_back().map_or(1, |n| n + 1),
        retain: defaults.retain.max(manifests.len() as u32),
        backends,
        external,
        ..defaults
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
    let live = registry.live_objects();
    let listed = store.list_modified()?;
    let mut orphans = 0;
    for (id, modified) in &listed {
        if live.contains(id) {
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
    let listed: BTreeSet<ObjectId> = listed.into_iter().map(|(id, _)| id).collect();
    let missing = live.difference(&listed).copied().collect();
    Ok((orphans, missing))
}
