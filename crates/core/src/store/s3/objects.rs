//! [`S3Objects`]: the store's objects under `objects/`: staging bookkeeping, fenced deletes,
//! listing, and reads through the local cache.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore as _, ObjectStoreExt as _, PutPayload};

use super::foreign::RemoteFile;
use super::remote::{remote_error, Remote, DELETE_BATCH, DELETE_TIMEOUT, GET_CONCURRENCY};
use super::transfer::{fetch_into, UploadBody};
use super::upload::PART_SIZE;
use crate::error::{Error, IoContext, Result};
use crate::fsutil::{create_private_dir_all, lock, remove_tree};
use crate::store::cache::Cache;
use crate::store::{hash_file, layout, ObjectId, ObjectStore, Staged, WriteFence};

/// What the command line says about object storage.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Uploads (and multipart parts) in flight at once.
    pub upload_concurrency: usize,
    /// The read cache's size in bytes.
    pub cache_size: u64,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            upload_concurrency: 8,
            cache_size: 4 << 30,
        }
    }
}

/// How many times an object delete is sent at most (each after a check of the fence).
const DELETE_ATTEMPTS: usize = 5;

/// Objects on object storage, read through a local cache.
pub struct S3Objects {
    pub(super) remote: Arc<Remote>,
    pub(super) options: S3Options,
    uploads: Mutex<Uploads>,
    delete_done: Condvar,
    pub(super) cache: Arc<Cache>,
    /// Prefetches in flight at once.
    pub(super) prefetches: Arc<tokio::sync::Semaphore>,
    /// Parts of uploads in memory at once (see [`S3Objects::upload`]).
    pub(super) part_buffers: Arc<tokio::sync::Semaphore>,
    /// The writer's lease, checked before every delete request: a writer that lost the
    /// store deletes nothing (the next writer may have stored the same content again).
    pub(super) fence: Option<Arc<dyn WriteFence>>,
    /// False once a copy came back without a SHA-256 (an endpoint that computes none):
    /// files are read and uploaded from then on ([`ObjectStore::copies_from`]).
    pub(super) copies_named: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Uploads {
    /// Objects staged (uploading or uploaded) and not yet published or discarded.
    staged: HashMap<ObjectId, usize>,
    /// Objects whose delete is in flight.
    deleting: HashSet<ObjectId>,
}

impl S3Objects {
    /// Objects of `remote`, cached in `cache_dir` (emptied now: only this process uses it).
    pub fn new(remote: Arc<Remote>, options: S3Options, cache_dir: &Path) -> Result<Self> {
        remove_tree(cache_dir)?;
        create_private_dir_all(cache_dir)?;
        Ok(S3Objects {
            remote,
            cache: Arc::new(Cache::new(cache_dir, options.cache_size)),
            prefetches: Arc::new(tokio::sync::Semaphore::new(GET_CONCURRENCY)),
            part_buffers: Arc::new(tokio::sync::Semaphore::new(
                options.upload_concurrency.max(1),
            )),
            options,
            uploads: Mutex::new(Uploads::default()),
            delete_done: Condvar::new(),
            fence: None,
            copies_named: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Delete only while `fence` says this process is the writer.
    pub fn with_fence(mut self, fence: Arc<dyn WriteFence>) -> Self {
        self.fence = Some(fence);
        self
    }

    pub(super) fn check_fence(&self) -> Result<()> {
        self.fence.as_ref().map_or(Ok(()), |f| f.check())
    }

    /// Run a delete request, abandoned (a `Generic` error) once the fence's request budget
    /// is spent (else after [`DELETE_TIMEOUT`]).
    fn within_budget<T>(
        &self,
        request: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> object_store::Result<T> {
        let budget = self
            .fence
            .as_ref()
            .and_then(|f| f.request_budget())
            .unwrap_or(DELETE_TIMEOUT);
        self.remote.block_on(async {
            tokio::time::timeout(budget, request)
                .await
                .unwrap_or_else(|_| {
                    Err(object_store::Error::Generic {
                        store: "S3",
                        source: format!("no answer within {budget:?}: abandoned").into(),
                    })
                })
        })
    }

    /// One delete request `attempt`ed up to [`DELETE_ATTEMPTS`] times while it fails with a
    /// server or transport error, backing off, and with the fence checked before every
    /// attempt after the first (the caller checks before the first): a delete is never
    /// sent again once this process may no longer write. The client itself re-sends
    /// nothing ([`Remote::deleter`]), so every DELETE leaves at most [`DELETE_TIMEOUT`]
    /// after the fence check before it.
    fn fenced<T>(
        &self,
        mut attempt: impl FnMut() -> object_store::Result<T>,
    ) -> Result<object_store::Result<T>> {
        let mut pause = Duration::from_millis(100);
        for n in 1..=DELETE_ATTEMPTS {
            if n > 1 {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
                self.check_fence()?;
            }
            match attempt() {
                Err(object_store::Error::Generic { .. }) if n < DELETE_ATTEMPTS => continue,
                done => return Ok(done),
            }
        }
        unreachable!("the last attempt returns")
    }

    pub(super) fn object_name(id: &ObjectId) -> String {
        layout::object_key(&id.to_hex())
    }

    /// Count `id` as staged (waiting for a delete of it in flight first).
    pub(super) fn begin_stage(&self, id: ObjectId) {
        let mut uploads = lock(&self.uploads);
        while uploads.deleting.contains(&id) {
            uploads = crate::fsutil::wait(&self.delete_done, uploads);
        }
        *uploads.staged.entry(id).or_default() += 1;
    }

    pub(super) fn end_stage(&self, id: &ObjectId) {
        let mut uploads = lock(&self.uploads);
        if let Some(n) = uploads.staged.get_mut(id) {
            *n -= 1;
            if *n == 0 {
                uploads.staged.remove(id);
            }
        }
    }

    /// Delete up to [`DELETE_BATCH`] objects in one request (each one alone to learn which
    /// failed, if it fails), skipping those staged again meanwhile.
    fn delete_batch(&self, ids: &[ObjectId]) -> Vec<(ObjectId, Error)> {
        let targets: Vec<ObjectId> = {
            let mut uploads = lock(&self.uploads);
            let targets: Vec<ObjectId> = ids
                .iter()
                .filter(|id| {
                    let staged = uploads.staged.contains_key(id);
                    if staged {
                        log::info!("object {id} is being uploaded again: not deleted");
                    }
                    !staged
                })
                .copied()
                .collect();
            uploads.deleting.extend(targets.iter().copied());
            targets
        };
        for id in &targets {
            self.cache.remove(id);
        }
        let keys: Vec<object_store::Result<Key>> = targets
            .iter()
            .map(|id| Ok(self.remote.key(&Self::object_name(id))))
            .collect();
        // One request, never re-sent by the client: a failure falls back to deleting key by
        // key below, each attempt after a check of the fence.
        let results: Vec<object_store::Result<Key>> = self
            .within_budget(async {
                Ok(self
                    .remote
                    .deleter
                    .delete_stream(futures::stream::iter(keys).boxed())
                    .collect::<Vec<_>>()
                    .await)
            })
            .unwrap_or_else(|e| vec![Err(e)]);
        {
            let mut uploads = lock(&self.uploads);
            for id in &targets {
                uploads.deleting.remove(id);
            }
        }
        self.delete_done.notify_all();
        let trouble = results
            .into_iter()
            .filter_map(|r| match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => Some(e),
            })
            .next();
        match trouble {
            None => Vec::new(),
            Some(e) => {
                // Which keys failed is not always said: delete each one again, alone
                // (deleting a deleted object is no error), to know.
                log::warn!("a bulk delete failed ({e}); deleting one by one");
                targets
                    .iter()
                    .filter_map(|id| self.delete(id).err().map(|e| (*id, e)))
                    .collect()
            }
        }
    }

    /// Upload `src` to the key of `id`: one PUT when small, a multipart upload with several
    /// parts in flight when large. Fails (uploading nothing) if `src` does not hash to `id`.
    /// Every part in memory holds one of the store's [`S3Objects::part_buffers`] permits
    /// from its read until its upload ends: all uploads together hold at most
    /// `upload_concurrency` parts of [`PART_SIZE`], however many files are staged at once.
    pub(super) fn upload(&self, id: &ObjectId, src: UploadBody<'_>) -> Result<()> {
        let name = Self::object_name(id);
        let key = self.remote.key(&name);
        let what = format!("upload {}", self.remote.url(&name));
        let size = src.len();
        let changed = || {
            Error::Corrupt(format!(
                "the content uploaded as object {id} does not hash to it (the file changed)"
            ))
        };
        let buffer = || async {
            self.part_buffers
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed")
        };
        if size <= PART_SIZE as u64 {
            let _buffer = self.remote.block_on(buffer());
            let bytes = src.read_all()?;
            if ObjectId::from_hash(blake3::hash(&bytes)) != *id {
                return Err(changed());
            }
            return self
                .remote
                .block_on(self.remote.client.put(&key, PutPayload::from(bytes)))
                .map(|_| ())
                .map_err(|e| remote_error(&what, e));
        }
        self.remote.block_on(async {
            let mut upload = self
                .remote
                .client
                .put_multipart(&key)
                .await
                .map_err(|e| remote_error(&what, e))?;
            let mut parts = Vec::new();
            let result: Result<()> = async {
                // What is uploaded is hashed on the way: it must be the object it claims.
                let mut hasher = blake3::Hasher::new();
                let mut offset = 0u64;
                while offset < size {
                    let permit = buffer().await;
                    let len = (size - offset).min(PART_SIZE as u64) as usize;
                    let part = src.read_range(offset, len)?;
                    hasher.update(&part);
                    let sent = upload.put_part(PutPayload::from(part));
                    parts.push(tokio::spawn(async move {
                        let result = sent.await;
                        drop(permit);
                        result
                    }));
                    offset += len as u64;
                }
                if ObjectId::from_hash(hasher.finalize()) != *id {
                    return Err(changed());
                }
                for part in parts.drain(..) {
                    part.await
                        .map_err(|e| Error::io(what.clone(), std::io::Error::other(e)))?
                        .map_err(|e| remote_error(&what, e))?;
                }
                Ok(())
            }
            .await;
            match result {
                Ok(()) => upload
                    .complete()
                    .await
                    .map(|_| ())
                    .map_err(|e| remote_error(&what, e)),
                Err(e) => {
                    for part in parts {
                        let _ = part.await;
                    }
                    let _ = upload.abort().await;
                    Err(e)
                }
            }
        })
    }

    /// Fetch an object into the cache (once), checked against its id; its cached path.
    /// Waits for a prefetch of the same object instead of fetching it twice.
    fn fetch(&self, id: &ObjectId) -> Result<PathBuf> {
        loop {
            if let Some(path) = self.cache.get(id) {
                return Ok(path);
            }
            if self.cache.begin_fetch(*id) {
                break;
            }
            self.cache.wait_fetch(id);
        }
        let fetched = self.remote.block_on(fetch_into(
            self.remote.clone(),
            self.cache.clone(),
            *id,
            self.options.upload_concurrency,
        ));
        self.cache.end_fetch(id);
        fetched
    }
}

impl ObjectStore for S3Objects {
    fn remote_object(&self, id: &ObjectId) -> Option<(Arc<Remote>, String)> {
        Some((
            self.remote.clone(),
            self.remote.full_key(&Self::object_name(id)),
        ))
    }

    fn stage(&self, src: &Path) -> Result<Staged> {
        // The key is the hash: hash first (a local read), then upload.
        let (id, size) = hash_file(src)?;
        let file = fs::File::open(src).ctx("open", src)?;
        self.begin_stage(id);
        match self.upload(&id, UploadBody::File(&file, size)) {
            Ok(()) => Ok(Staged {
                id,
                size,
                tmp: PathBuf::new(),
                file: None,
            }),
            Err(e) => {
                self.end_stage(&id);
                Err(e)
            }
        }
    }

    fn stage_bytes(&self, bytes: &[u8]) -> Result<Staged> {
        let id = ObjectId::from_hash(blake3::hash(bytes));
        self.begin_stage(id);
        match self.upload(&id, UploadBody::Bytes(bytes)) {
            Ok(()) => Ok(Staged {
                id,
                size: bytes.len() as u64,
                tmp: PathBuf::new(),
                file: None,
            }),
            Err(e) => {
                self.end_stage(&id);
                Err(e)
            }
        }
    }

    fn publish(&self, staged: Staged) -> Result<()> {
        crate::failpoint!("store::before-publish");
        self.end_stage(&staged.id);
        Ok(())
    }

    fn discard(&self, staged: Staged) {
        // The key may be another upload's too (same content): never deleted here. If
        // nothing references it, the orphan sweep removes it after the grace period.
        self.end_stage(&staged.id);
    }

    fn delete(&self, id: &ObjectId) -> Result<()> {
        self.check_fence()?;
        {
            let mut uploads = lock(&self.uploads);
            if uploads.staged.contains_key(id) {
                log::info!("object {id} is being uploaded again: not deleted");
                return Ok(());
            }
            uploads.deleting.insert(*id);
        }
        self.cache.remove(id);
        let name = Self::object_name(id);
        let key = self.remote.key(&name);
        let result = self.fenced(|| self.within_budget(self.remote.deleter.delete(&key)));
        lock(&self.uploads).deleting.remove(id);
        self.delete_done.notify_all();
        let result = result?;
        match result {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error(
                &format!("delete {}", self.remote.url(&name)),
                e,
            )),
        }
    }

    fn delete_many(&self, ids: &[ObjectId]) -> Vec<(ObjectId, Error)> {
        // One request per 1,000 keys (S3's DeleteObjects), the fence checked before each.
        let mut failed = Vec::new();
        for (n, batch) in ids.chunks(DELETE_BATCH).enumerate() {
            if let Err(e) = self.check_fence() {
                let rest = &ids[n * DELETE_BATCH..];
                log::warn!("{} objects not deleted: {e}", rest.len());
                failed.extend(rest.iter().map(|id| (*id, Error::Conflict(e.to_string()))));
                break;
            }
            failed.extend(self.delete_batch(batch));
        }
        failed
    }

    fn list(&self) -> Result<Vec<ObjectId>> {
        let mut ids: Vec<ObjectId> = self
            .list_modified()?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        Ok(ids)
    }

    fn list_modified(&self) -> Result<Vec<(ObjectId, Option<SystemTime>)>> {
        let mut ids = Vec::new();
        for (name, modified) in self.remote.list_under(layout::OBJECTS)? {
            match name.parse::<ObjectId>() {
                Ok(id) if id.to_hex() == name => ids.push((id, Some(modified))),
                _ => log::warn!("ignoring stray key {}", self.remote.url(&name)),
            }
        }
        Ok(ids)
    }

    fn has_objects(&self) -> Result<bool> {
        let prefix = self.remote.key(layout::OBJECTS);
        self.remote.block_on(async {
            match self.remote.client.list(Some(&prefix)).next().await {
                None => Ok(false),
                Some(Ok(_)) => Ok(true),
                Some(Err(e)) => Err(remote_error(
                    &format!("list {}", self.remote.url(layout::OBJECTS)),
                    e,
                )),
            }
        })
    }

    fn open(&self, id: &ObjectId) -> Result<fs::File> {
        let path = self.fetch(id)?;
        match fs::File::open(&path) {
            // Evicted between the fetch and the open (a busy, small cache): once more.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.cache.remove(id);
                let path = self.fetch(id)?;
                fs::File::open(&path).ctx("open", &path)
            }
            opened => opened.ctx("open", &path),
        }
    }

    fn upload_concurrency(&self) -> usize {
        self.options.upload_concurrency
    }

    fn verify(&self, id: &ObjectId, size: u64) -> Result<()> {
        // A fetch checks the hash on the way into the cache: reading the copy through
        // again (as the default does) would hash every object twice at its first open.
        let file = self.open(id)?;
        let actual = file
            .metadata()
            .map_err(|e| Error::io(format!("stat cached object {id}"), e))?
            .len();
        if actual != size {
            return Err(Error::Corrupt(format!(
                "object {id} has {actual} bytes, expected {size}"
            )));
        }
        Ok(())
    }

    fn prefetch(&self, ids: &[ObjectId]) {
        for id in ids {
            if self.cache.get(id).is_some() || !self.cache.begin_fetch(*id) {
                continue;
            }
            let (remote, cache, id) = (self.remote.clone(), self.cache.clone(), *id);
            let permits = self.prefetches.clone();
            let concurrency = self.options.upload_concurrency;
            self.remote.runtime.spawn(async move {
                if let Ok(_permit) = permits.acquire().await {
                    if let Err(e) = fetch_into(remote, cache.clone(), id, concurrency).await {
                        log::debug!("prefetch of {id} failed: {e}");
                    }
                }
                cache.end_fetch(&id);
            });
        }
    }

    fn local_path(&self, id: &ObjectId) -> Option<PathBuf> {
        self.cache.get(id)
    }

    fn clear_staging(&self) -> Result<usize> {
        self.sweep_copy_staging(crate::store::DEFAULT_ORPHAN_GRACE)
    }

    fn copies_from(&self, remote: &Remote) -> bool {
        self.copies_named.load(std::sync::atomic::Ordering::Relaxed)
            && self.remote.can_copy_from(remote)
    }

    fn stage_copy(&self, file: &RemoteFile) -> Result<Staged> {
        self.copy_in(file)
    }

    fn describe(&self) -> String {
        self.remote.url("")
    }
}
