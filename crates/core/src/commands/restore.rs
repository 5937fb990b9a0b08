//! `ckptfs restore`: write a checkpoint out of a store, without a daemon.

use std::path::Path;

use crate::coordinator::materialize;
use crate::error::{Error, Result};
use crate::fsutil::{is_empty_or_missing, lock, parallel_map, remove_tree};
use crate::repo::Repo;
use crate::store::Location;

/// What a restore wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RestoreReport {
    /// Backends written, one directory each.
    pub backends: usize,
    /// Files written, over all backends.
    pub files: usize,
    /// Bytes of those files.
    pub bytes: u64,
}

/// Write checkpoint `id` of `store` to `dest/<operator>/<subtask>/`, verifying every object.
/// `dest` must be missing or empty; on failure, what was written is removed again.
pub fn restore_checkpoint(
    store: impl Into<Location>,
    id: u64,
    dest: &Path,
    mut progress: impl FnMut(u64) + Send,
) -> Result<RestoreReport> {
    let store = store.into();
    let opened = Repo::reader(&store)?;
    let catalog = opened.catalog;
    if !catalog.has_dir() {
        return Err(Error::NotFound(format!(
            "{store} is not a ckptfs store (no checkpoints/ directory)"
        )));
    }
    if !is_empty_or_missing(dest)? {
        return Err(Error::NotEmpty(dest.to_path_buf()));
    }
    let manifest = catalog.load(id)?;
    let objects = opened.objects.as_ref();
    let existed = dest.exists();
    crate::fsutil::create_private_dir_all(dest)?;
    let result = (|| -> Result<RestoreReport> {
        // Several backends at once (they share nothing but the store), at most
        // RESTORE_THREADS: the manifest, not the host, says how many there are.
        let progress = std::sync::Mutex::new(&mut progress);
        let written = parallel_map(&manifest.backends, RESTORE_THREADS, |snapshot| {
            materialize(
                objects,
                snapshot,
                &dest.join(snapshot.name.rel_path()),
                &mut |n| (lock(&progress))(n),
            )
        });
        written.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(RestoreReport {
            backends: manifest.backends.len(),
            files: manifest.backends.iter().map(|b| b.files.len()).sum(),
            bytes: manifest
                .backends
                .iter()
                .flat_map(|b| b.files.iter())
                .map(|f| f.size)
                .sum(),
        })
    })();
    if result.is_err() {
        if existed {
            if let Ok(entries) = std::fs::read_dir(dest) {
                for entry in entries.flatten() {
                    let _ = remove_tree(&entry.path());
                }
            }
        } else {
            let _ = remove_tree(dest);
        }
    }
    result
}

/// Backends a restore writes at once.
const RESTORE_THREADS: usize = 8;

/// Total bytes of a checkpoint, for progress bars.
pub fn checkpoint_bytes(store: impl Into<Location>, id: u64) -> Result<u64> {
    let manifest = Repo::reader(&store.into())?.catalog.load(id)?;
    Ok(manifest.stats.bytes_total)
}
