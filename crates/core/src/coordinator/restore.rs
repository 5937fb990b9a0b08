//! Restoring: the hosted backends rolled back to a checkpoint (all or, after a crash,
//! finished at the next start), and materializing a checkpoint's files as a directory
//! RocksDB opens.

use std::path::{Path, PathBuf};

use super::{backend_dir, Engine};
use crate::backend::{Backend, BackendOptions};
use crate::catalog::BackendSnapshot;
use crate::error::{Error, IoContext, Result};
use crate::fsutil::{create_private_dir_all, fsync_dir, lock, parallel_map, remove_tree};
use crate::store::ObjectStore;

impl Engine {
    /// Roll the hosted backends back to checkpoint `id` (every backend the checkpoint holds).
    /// Refused while a checkpoint is in flight. Later checkpoints stay retained; the next
    /// checkpoint builds only on `id`'s files.
    pub fn restore_backends(&self, id: u64) -> Result<()> {
        self.check_writable()?;
        let manifest = {
            let mut st = self.state();
            st.flight.check_restore()?;
            let manifest = st.held.retained(id)?.clone();
            st.flight.set_restoring(true);
            for object in manifest.objects() {
                st.held.registry.pin(object);
            }
            manifest
        };
        let external = self.external_names();
        let result = (|| -> Result<()> {
            let hosted: Vec<&BackendSnapshot> = manifest
                .backends
                .iter()
                .filter(|s| {
                    let hosted = self.inner.backends.contains_key(&s.name);
                    // Imported backends are the applications' own to restore.
                    if !hosted && !external.contains(&s.name) {
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
                .map(|(_, s)| crate::fsutil::write(&self.inner.backends[&s.name]))
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
                    st.lineages.restored(
                        &snapshot.name,
                        backend.lineage().to_string(),
                        id,
                        snapshot,
                    );
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
        st.flight.set_restoring(false);
        self.inner.slot_freed.notify_all();
        self.release_pins(&mut st, manifest.objects());
        if let Err(e) = &result {
            self.note_error(&mut st, format!("restore from checkpoint {id} failed: {e}"));
        }
        result
    }
}

/// `STATE/restore-intent`: the checkpoint a restore is installing, present from its first
/// swap until every backend runs from it.
pub(super) fn restore_intent_path(state_dir: &Path) -> PathBuf {
    state_dir.join(crate::store::layout::RESTORE_INTENT)
}

pub(super) fn write_restore_intent(state_dir: &Path, id: u64) -> Result<()> {
    crate::fsutil::write_atomic(&restore_intent_path(state_dir), id.to_string().as_bytes())
}

pub(super) fn clear_restore_intent(state_dir: &Path) -> Result<()> {
    let path = restore_intent_path(state_dir);
    match std::fs::remove_file(&path) {
        Ok(()) => fsync_dir(state_dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
    }
}

pub(super) fn read_restore_intent(state_dir: &Path) -> Result<Option<u64>> {
    let path = restore_intent_path(state_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| {
            Error::Corrupt(format!("{} does not hold a checkpoint id", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

/// Write one backend's files of a checkpoint into `dir` (verified, each fsync'd), a
/// directory RocksDB opens. `dir` must be empty or missing. Up to [`MATERIALIZE_FILES`]
/// files are written at once, so that their reads and hashes overlap, then all are
/// fsync'd; on error,
/// what was written stays for the caller to remove.
pub fn materialize(
    store: &dyn ObjectStore,
    snapshot: &BackendSnapshot,
    dir: &Path,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<()> {
    create_private_dir_all(dir)?;
    let files: Vec<_> = snapshot.files.iter().collect();
    let progress = std::sync::Mutex::new(progress);
    // Durable once a batch is written (their writeback started as each was): the copies
    // never wait for the disk, and the fsyncs overlap. Each through the descriptor that
    // wrote it (a write error is reported to it, not always to a new one); at most a
    // batch of them open at once.
    for batch in files.chunks(MATERIALIZE_BATCH) {
        let written = parallel_map(batch, MATERIALIZE_FILES, |file| {
            let out = file.copy_verified(store, &dir.join(&file.name))?;
            (lock(&progress))(file.size);
            Ok(out)
        });
        let written = written.into_iter().collect::<Result<Vec<_>>>()?;
        let synced = parallel_map(&written, MATERIALIZE_SYNCS, |out| {
            out.sync_all().ctx("fsync", dir)
        });
        synced.into_iter().collect::<Result<Vec<()>>>()?;
    }
    fsync_dir(dir)
}

/// Files of one backend [`materialize`] fsyncs at once.
const MATERIALIZE_SYNCS: usize = 8;

/// Files of one backend [`materialize`] writes before it fsyncs them (and holds open).
const MATERIALIZE_BATCH: usize = 256;

/// Files of one backend [`materialize`] writes at once.
const MATERIALIZE_FILES: usize = 4;

/// Write a checkpoint's files for the backend living in `dir` into `dir/restore.tmp`
/// (verified, durable), leaving the live database alone.
pub(super) fn prepare_snapshot(
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
pub(super) fn prepare_all(
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
pub(super) fn swap_in_snapshot(dir: &Path, fresh: &Path) -> Result<()> {
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
pub(super) fn install_snapshot(
    store: &dyn ObjectStore,
    snapshot: &BackendSnapshot,
    dir: &Path,
) -> Result<()> {
    let fresh = prepare_snapshot(store, snapshot, dir)?;
    swap_in_snapshot(dir, &fresh)
}
