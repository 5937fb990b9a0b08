//! A store that dies after a number of uploads: the test hook behind
//! `PendingCheckpoint::simulate_crash`. It wraps the engine's store for one checkpoint and
//! refuses every stage after the first `uploads` (a stage is the upload on object storage,
//! the copy into `tmp/` on a local disk), as if the process had been killed there, so the
//! ingest code runs unchanged (no budget threaded through its calls).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{ObjectId, ObjectStore, Staged};
use crate::error::{Error, Result};

pub(crate) struct CrashAfter<'a> {
    inner: &'a dyn ObjectStore,
    uploads_left: AtomicUsize,
}

impl<'a> CrashAfter<'a> {
    /// `inner`, staging at most `uploads` objects.
    pub(crate) fn new(inner: &'a dyn ObjectStore, uploads: usize) -> Self {
        CrashAfter {
            inner,
            uploads_left: AtomicUsize::new(uploads),
        }
    }
}

impl CrashAfter<'_> {
    fn take_upload(&self) -> Result<()> {
        self.uploads_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| Error::SimulatedCrash)
    }
}

impl ObjectStore for CrashAfter<'_> {
    fn stage(&self, src: &Path) -> Result<Staged> {
        self.take_upload()?;
        self.inner.stage(src)
    }

    fn stage_bytes(&self, bytes: &[u8]) -> Result<Staged> {
        self.take_upload()?;
        self.inner.stage_bytes(bytes)
    }

    fn publish(&self, staged: Staged) -> Result<()> {
        self.inner.publish(staged)
    }

    fn publish_unsynced(&self, staged: Staged) -> Result<()> {
        self.inner.publish_unsynced(staged)
    }

    fn sync_published(&self) -> Result<()> {
        self.inner.sync_published()
    }

    fn discard(&self, staged: Staged) {
        self.inner.discard(staged)
    }

    fn delete(&self, id: &ObjectId) -> Result<()> {
        self.inner.delete(id)
    }

    fn delete_many(&self, ids: &[ObjectId]) -> Vec<(ObjectId, Error)> {
        self.inner.delete_many(ids)
    }

    fn list(&self) -> Result<Vec<ObjectId>> {
        self.inner.list()
    }

    fn open(&self, id: &ObjectId) -> Result<std::fs::File> {
        self.inner.open(id)
    }

    fn upload_concurrency(&self) -> usize {
        self.inner.upload_concurrency()
    }

    fn prefetch(&self, ids: &[ObjectId]) {
        self.inner.prefetch(ids)
    }

    fn local_path(&self, id: &ObjectId) -> Option<PathBuf> {
        self.inner.local_path(id)
    }

    fn remote_object(&self, id: &ObjectId) -> Option<(std::sync::Arc<super::s3::Remote>, String)> {
        self.inner.remote_object(id)
    }

    fn clear_staging(&self) -> Result<usize> {
        self.inner.clear_staging()
    }

    fn list_modified(&self) -> Result<Vec<(ObjectId, Option<std::time::SystemTime>)>> {
        self.inner.list_modified()
    }

    fn has_objects(&self) -> Result<bool> {
        self.inner.has_objects()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
