//! `ckptfs export-flink` of a store read without a daemon: the checkpoint's files read
//! straight from the store (verified) and written out by [`crate::flink::export`], which
//! also serves a mount's `cp-N/`. Only opening the store and finding the files is here;
//! the Flink checkpoint directory and its `_metadata` are Flink's side.

use std::path::Path;

use crate::error::{Error, Result};
use crate::flink::export::{export, not_flink, CheckpointFiles, Exported};
use crate::names::BackendName;

/// The files of one checkpoint in a store, read directly (verified).
struct StoredCheckpoint<'a> {
    objects: &'a dyn crate::store::ObjectStore,
    manifest: &'a crate::catalog::Manifest,
}

impl CheckpointFiles for StoredCheckpoint<'_> {
    fn copy(&self, backend: &BackendName, name: &str, to: &Path) -> Result<u64> {
        let file = self
            .manifest
            .backend(backend)
            .and_then(|b| b.files.iter().find(|f| f.name == name))
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "checkpoint {} has no file {backend}/{name}",
                    self.manifest.id
                ))
            })?;
        file.copy_verified(self.objects, to)?;
        Ok(file.size)
    }
}

/// [`export`] checkpoint `id` of a store (a directory or a URL, read without a daemon).
pub fn export_from_store(store: &crate::store::Location, id: u64, dest: &Path) -> Result<Exported> {
    let repo = crate::repo::Repo::reader(store)?;
    let manifest = repo.catalog.load(id)?;
    let label = manifest.flink.clone().ok_or_else(|| not_flink(id))?;
    let stored = StoredCheckpoint {
        objects: repo.objects.as_ref(),
        manifest: &manifest,
    };
    export(&stored, &label.job, label.checkpoint, dest)
}
