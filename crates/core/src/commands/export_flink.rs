//! `ckptfs export-flink` to a directory or to object storage, and of a store read without a daemon: the checkpoint's files read
//! straight from the store (verified) and written out by [`crate::flink::export`], which
//! also serves a mount's `cp-N/`. Only opening the store and finding the files is here;
//! the Flink checkpoint directory and its `_metadata` are Flink's side.

use std::io::Write;
use std::sync::Arc;

use crate::catalog::FileEntry;
use crate::error::{Error, Result};
use crate::flink::export::{export, export_to_s3, not_flink, CheckpointFiles, Exported};
use crate::names::BackendName;
use crate::store::s3::Remote;
use crate::store::Location;

/// The files of one checkpoint in a store, read directly (verified).
struct StoredCheckpoint<'a> {
    objects: &'a dyn crate::store::ObjectStore,
    manifest: &'a crate::catalog::Manifest,
}

impl StoredCheckpoint<'_> {
    fn file(&self, backend: &BackendName, name: &str) -> Result<&FileEntry> {
        self.manifest
            .backend(backend)
            .and_then(|b| b.files.iter().find(|f| f.name == name))
            .map(|f| f.as_ref())
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "checkpoint {} has no file {backend}/{name}",
                    self.manifest.id
                ))
            })
    }
}

impl CheckpointFiles for StoredCheckpoint<'_> {
    fn write_to(&self, backend: &BackendName, name: &str, out: &mut dyn Write) -> Result<u64> {
        let file = self.file(backend, name)?;
        file.write_verified(self.objects, out)?;
        Ok(file.size)
    }

    /// A file stored whole (not as chunks) in a store on object storage: its object.
    fn stored_remotely(
        &self,
        backend: &BackendName,
        name: &str,
    ) -> Option<(Arc<Remote>, String, u64)> {
        let file = self.file(backend, name).ok()?;
        if file.chunks.is_some() {
            return None;
        }
        let (remote, key) = self.objects.remote_object(&file.object)?;
        Some((remote, key, file.size))
    }
}

/// [`export`] to `dest`: a directory ([`export`]) or `s3://BUCKET/PREFIX`
/// ([`export_to_s3`], configured from the standard AWS environment variables, as a store
/// on S3 is).
pub fn export_to(
    stored: &dyn CheckpointFiles,
    job: &str,
    checkpoint: u64,
    dest: &Location,
) -> Result<Exported> {
    match dest {
        Location::Local(path) => export(stored, job, checkpoint, path),
        Location::S3 { bucket, prefix } => {
            let remote = crate::store::s3::Remote::connect(bucket, "")?;
            remote.check_bucket()?;
            export_to_s3(stored, job, checkpoint, &remote, prefix)
        }
    }
}

/// [`export_to`] checkpoint `id` of a store (a directory or a URL, read without a daemon).
pub fn export_from_store(store: &Location, id: u64, dest: &Location) -> Result<Exported> {
    let repo = crate::repo::Repo::reader(store)?;
    let manifest = repo.catalog.load(id)?;
    let label = manifest.flink.clone().ok_or_else(|| not_flink(id))?;
    let stored = StoredCheckpoint {
        objects: repo.objects.as_ref(),
        manifest: &manifest,
    };
    export_to(&stored, &label.job, label.checkpoint, dest)
}
