//! Taking a checkpoint: the synchronous phase (flush, hard links into staging), the
//! asynchronous upload of what the store does not hold yet, the commit of the manifest,
//! registration and retention.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::ingest::{Ingest, PendingBackend};
use super::materialize::StagedBackend;
use super::{base_of, Engine};
use crate::catalog::{BackendSnapshot, CheckpointStats, Manifest, FORMAT};
use crate::error::{Error, Result};
use crate::fsutil::{create_private_dir_all, now_unix_ms, remove_tree};
use crate::names::BackendName;
use crate::store::crash::CrashAfter;
use crate::store::{ObjectId, ObjectStore};

impl Engine {
    /// The synchronous phase: allocate an id, then stage every backend's files (RocksDB's
    /// native checkpoint: hard links, a flush in `flush` mode; see [`super::materialize`]).
    /// Writers may continue as soon as this returns.
    pub fn begin_checkpoint(&self) -> Result<PendingCheckpoint> {
        self.check_writable()?;
        let started_unix_ms = now_unix_ms();
        let (id, bases) = {
            let _writes = self.catalog_writes();
            let (id, meta) = {
                let mut st = self.state();
                if st.restoring {
                    return Err(Error::Busy("a restore is in progress".into()));
                }
                if st.in_flight.len() >= self.inner.max_concurrent {
                    return Err(Error::Busy(format!(
                        "{} checkpoint(s) already in flight (max_concurrent = {}); try \
                         again when it completes",
                        st.in_flight.len(),
                        self.inner.max_concurrent
                    )));
                }
                let id = st.meta.next_checkpoint;
                let mut meta = st.meta.clone();
                meta.next_checkpoint += 1;
                if self.inner.catalog.commits_in_meta() {
                    // Reserved, not committed: a manifest of this id counts only once a
                    // later write of the metadata confirms it.
                    meta.pending.push(id);
                }
                st.in_flight.insert(id);
                (id, meta)
            };
            // The id is reserved durably before anything of the checkpoint is stored (the
            // state lock is not held meanwhile: the slot is taken already).
            let saved = self.inner.catalog.save_meta(&meta);
            let mut st = self.state();
            if let Err(e) = saved {
                st.in_flight.remove(&id);
                self.inner.slot_freed.notify_all();
                self.inner.counters.checkpoint_failed();
                return Err(e);
            }
            st.meta = meta;
            (id, st.bases.clone())
        };
        let clock = Instant::now();
        let staging = self
            .inner
            .state_dir
            .join(crate::store::layout::STAGING)
            .join(id.to_string());
        let mut parts = Vec::new();
        let mut pins = Vec::new();
        let mut stats = CheckpointStats::default();
        // Every backend at once: a backend's native checkpoint waits on its own flush (flush
        // mode) or WAL copy (wal mode), not on the others'.
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
            pins.extend(backend_pins);
            match result {
                Ok(staged) => {
                    stats.bytes_uploaded_materialization += staged.uploaded_before;
                    parts.push(PendingBackend {
                        name: name.clone(),
                        lineage: staged.lineage,
                        files: staged.files,
                        kept: staged.kept,
                        materializes: staged.materializes,
                        base: bases.get(name).cloned(),
                    });
                }
                Err(e) if sync.is_ok() => sync = Err(e),
                Err(_) => {}
            }
        }
        let pending = PendingCheckpoint {
            engine: self.clone(),
            id,
            parts,
            staging,
            started: clock,
            started_unix_ms,
            sync_micros: clock.elapsed().as_micros() as u64,
            pins,
            stats,
            list_bytes: 0,
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
    /// Figures gathered in the synchronous phase (a background materialization adopted).
    stats: CheckpointStats,
    /// Bytes of file lists stored (in `bytes_uploaded`, not in `bytes_total`): the
    /// engine's counters tell file bytes uploaded from reused ones with it.
    list_bytes: u64,
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
        match self.upload(None) {
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
                    Ok(m) => {
                        self.engine.trim_memory();
                        Ok(m)
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
        let e = Error::Busy(format!("checkpoint {} aborted", self.id));
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
    fn upload(
        &mut self,
        crash_after: Option<usize>,
    ) -> Result<(Vec<BackendSnapshot>, CheckpointStats)> {
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
        let mut ingest = Ingest::new(&self.engine, store, &mut self.pins, &mut stats);
        let mut snapshots = Vec::new();
        for part in &self.parts {
            let entries = ingest.backend(part)?;
            let list = ingest.list(part, entries)?;
            snapshots.push(BackendSnapshot {
                name: part.name.clone(),
                lineage: part.lineage.clone(),
                files: list.files,
                lists: list.chain,
            });
        }
        self.list_bytes += ingest.list_bytes();
        stats.backends_materialized += self
            .parts
            .iter()
            .filter(|p| p.materializes.is_some())
            .count() as u64;
        Ok((snapshots, stats))
    }

    fn commit(&mut self, manifest: Manifest) -> Result<Arc<Manifest>> {
        let engine = self.engine.clone();
        let inner = &engine.inner;
        // The catalog's requests run without the state lock (see Inner::catalog_writes).
        let writes = engine.catalog_writes();
        crate::failpoint!("checkpoint::before-commit");
        if inner.catalog.commits_in_meta() {
            // Object storage: the manifest, then the metadata that confirms it (the commit
            // point, conditional: it fails if another writer took the store meanwhile).
            let confirmed = inner.catalog.commit(&manifest).and_then(|()| {
                crate::failpoint!("checkpoint::before-confirm");
                let mut meta = engine.state().meta.clone();
                meta.pending.retain(|p| *p != manifest.id);
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
            if let Error::Exists(_) = e {
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
        let id = manifest.id;
        crate::failpoint!("checkpoint::after-commit");
        let mut st = engine.state();
        st.registry.register_checkpoint(id, manifest.object_refs());
        st.registry.set_sizes(manifest.stored_sizes());
        crate::failpoint!("checkpoint::after-register");
        engine.release_pins(&mut st, self.pins.drain(..));
        st.in_flight.remove(&id);
        inner.slot_freed.notify_all();
        let mut prune = Vec::new();
        for (part, snapshot) in self.parts.iter().zip(&manifest.backends) {
            if let Some(below) =
                Engine::note_materialization(&mut st, id, self.started, part, snapshot)
            {
                prune.push((part.name.clone(), below));
            }
        }
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
            st.kept.extend(self.pins.iter().copied());
        }
        engine.release_pins(&mut st, self.pins.drain(..));
        st.in_flight.remove(&self.id);
        if engine.inner.catalog.commits_in_meta() {
            // Its reservation ends: void from the next write of the metadata on.
            st.meta.make_void(self.id);
        }
        engine.inner.slot_freed.notify_all();
        // Not committed, whatever the reason (an error, an abort, a drop).
        engine.inner.counters.checkpoint_failed();
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
