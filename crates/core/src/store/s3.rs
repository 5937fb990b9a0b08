//! The store on S3-compatible object storage (AWS S3, Ceph RGW, MinIO), through the
//! `object_store` crate.
//!
//! Layout under `s3://BUCKET/PREFIX/`: `objects/<64 hex digits>` (content-addressed),
//! `checkpoints/<id>.json`, `ckptfs.json`, `quarantine/`, `lease.json`.
//!
//! Objects go straight to their final key: the key is the hash of the content, so two
//! uploads of one key write the same bytes and either may land. What the local store gets
//! from its private temporary files, this store gets from bookkeeping: an object staged and
//! not yet published or discarded is never deleted ([`ObjectStore::delete`] skips it and
//! leaves it to the orphan sweep), and a stage waits for a delete of its key in flight.
//! An upload interrupted after the bytes landed leaves an orphan, which the sweep removes
//! once it is older than the grace period.
//!
//! Reads go through a local cache (`store/cache.rs`): an object is fetched once, checked
//! against its hash, and served from a file under the state directory; the least recently
//! used objects are evicted above the cache's size.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{
    ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload, UpdateVersion,
};

use super::cache::Cache;
use super::conditional::{read_back, ReadBack};
use super::records::{Put, Record, Records};
use super::{hash_file, layout, ObjectId, ObjectStore, Staged, WriteFence};
use crate::error::{Error, ErrorKind, IoContext, Result};
use crate::fsutil::{create_new_private, create_private_dir_all, lock, remove_tree};

mod copy;
pub use copy::Copied;

/// Keys deleted by one request (S3's DeleteObjects takes at most 1,000).
const DELETE_BATCH: usize = 1000;

/// How many times an object delete is sent at most (each after a check of the fence).
const DELETE_ATTEMPTS: usize = 5;
/// How long one delete request may take before it is abandoned without a fence (and the
/// deleting client's own timeout): with one, its request budget ([`WriteFence::
/// request_budget`]: a fifth of the lease time), so that a request sent just after the
/// fence was checked is answered, or abandoned, before another writer can take over.
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(30);

/// Objects above this size are uploaded in parts of this size, several at once.
pub const PART_SIZE: usize = 8 << 20;

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

/// The largest object one CopyObject request copies (5 GiB); larger ones need a multipart
/// upload of UploadPartCopy parts.
pub const MAX_COPY_OBJECT: u64 = 5 << 30;

/// The connection to one bucket and prefix, shared by the objects and the records.
pub struct Remote {
    client: AmazonS3,
    /// The client object deletes go through: it never re-sends a request by itself (see
    /// [`S3Objects::delete`]), and gives up on one after [`DELETE_TIMEOUT`].
    deleter: AmazonS3,
    runtime: tokio::runtime::Runtime,
    bucket: String,
    /// The prefix keys start with: empty or ending in `/`.
    prefix: String,
    /// The endpoint it talks to (`None`: AWS's, from the region).
    endpoint: Option<String>,
    /// Server-side copies from other buckets ([`Remote::copy_from`]).
    copier: copy::Copier,
}

impl Remote {
    /// Connect to `s3://bucket/prefix`, configured from the standard AWS environment
    /// variables (endpoint, region, credentials). Makes no request.
    pub fn connect(bucket: &str, prefix: &str) -> Result<Arc<Remote>> {
        Self::connect_to(bucket, prefix, None)
    }

    /// [`Remote::connect`], to `endpoint` (`http://host:port`) instead of the one the
    /// environment names, if given.
    pub fn connect_to(bucket: &str, prefix: &str, endpoint: Option<&str>) -> Result<Arc<Remote>> {
        let mut base = AmazonS3Builder::from_env().with_bucket_name(bucket);
        // An endpoint the user gave as plain http (a local MinIO or Ceph) is meant.
        let endpoint = endpoint.map(str::to_string).or_else(|| {
            ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
                .iter()
                .find_map(|v| std::env::var(v).ok())
        });
        let allow_http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        if let Some(endpoint) = &endpoint {
            base = base.with_endpoint(endpoint);
        }
        let deleter = base
            .clone()
            .with_retry(object_store::RetryConfig {
                max_retries: 0,
                ..object_store::RetryConfig::default()
            })
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(DELETE_TIMEOUT)
                    .with_allow_http(allow_http),
            )
            .build()
            .map_err(|e| Error::Invalid(format!("s3://{bucket}: {e}")))?;
        let builder = base
            .with_retry(object_store::RetryConfig {
                backoff: object_store::BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(5),
                    base: 2.0,
                },
                max_retries: 5,
                retry_timeout: Duration::from_secs(30),
            })
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(120))
                    .with_allow_http(allow_http),
            );
        let copier = copy::Copier::new(&builder, allow_http)?;
        let client = builder
            .build()
            .map_err(|e| Error::Invalid(format!("s3://{bucket}: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ckptfs-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the object storage client", e))?;
        let prefix = prefix.trim_matches('/');
        Ok(Arc::new(Remote {
            client,
            deleter,
            runtime,
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            endpoint,
            copier,
        }))
    }

    /// Fail clearly when the bucket does not exist or cannot be reached (one LIST).
    pub fn check_bucket(&self) -> Result<()> {
        let prefix = self.key(layout::META);
        let listed = self.block_on(async {
            let mut stream = self.client.list(Some(&prefix));
            stream.next().await.transpose()
        });
        match listed {
            Ok(_) => Ok(()),
            Err(e) if s3_error_code(&e).as_deref() == Some("NoSuchBucket") => {
                Err(Error::NotFound(format!(
                    "bucket {} does not exist (create it first; ckptfs never creates buckets)",
                    self.bucket
                )))
            }
            Err(e) => Err(remote_error(&format!("reach {}", self.url("")), e)),
        }
    }

    fn key(&self, name: &str) -> Key {
        Key::from(format!("{}{name}", self.prefix))
    }

    fn url(&self, name: &str) -> String {
        format!("s3://{}/{}{name}", self.bucket, self.prefix)
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Every key under `dir/`, with its last modification time.
    fn list_under(&self, dir: &str) -> Result<Vec<(String, SystemTime)>> {
        let prefix = self.key(dir);
        // Keys come back as `object_store` spells them (characters such as `~`, `#`, `%`
        // or non-ASCII letters percent-encoded): strip the prefix spelled the same way.
        let full = format!("{}/", prefix.as_ref());
        self.block_on(async {
            let mut stream = self.client.list(Some(&prefix));
            let mut out = Vec::new();
            while let Some(meta) = stream.next().await {
                let meta = meta.map_err(|e| remote_error(&format!("list {}", self.url(dir)), e))?;
                let key = meta.location.as_ref();
                if let Some(name) = key.strip_prefix(&full) {
                    out.push((name.to_string(), SystemTime::from(meta.last_modified)));
                }
            }
            Ok(out)
        })
    }
}

/// Reading objects that are not ckptfs's own (a Flink job's checkpoints, `ckptfs
/// import-flink s3://...`): keys are whole keys of the bucket, the prefix is not added.
impl Remote {
    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key of `name` below the bucket: the prefix, then `name`.
    pub fn full_key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// True when [`Remote::copy_from`] can copy `other`'s objects here: any bucket on the
    /// same endpoint, both configured from the same environment (one set of credentials
    /// reads there and writes here).
    pub fn can_copy_from(&self, other: &Remote) -> bool {
        self.endpoint == other.endpoint
    }

    /// Copy object `from` to `to` (keys below the bucket) inside the object store: one
    /// CopyObject request, which no byte of the object passes through this host for. S3
    /// copies objects up to [`MAX_COPY_OBJECT`] bytes this way.
    pub fn copy_within(&self, from: &str, to: &str) -> Result<()> {
        self.block_on(self.client.copy(&Key::from(from), &Key::from(to)))
            .map_err(|e| {
                remote_error(
                    &format!("copy s3://{0}/{from} to s3://{0}/{to}", self.bucket),
                    e,
                )
            })
    }

    /// The keys under `prefix` (a whole key prefix, ending in `/` for a directory), their
    /// sizes and last modification times; with `delimiter`, only the next level (keys, and
    /// "directories" ending in `/` with size 0 and no time).
    pub fn list_keys(
        &self,
        prefix: &str,
        delimiter: bool,
    ) -> Result<Vec<(String, u64, Option<SystemTime>)>> {
        let what = format!("list s3://{}/{prefix}", self.bucket);
        // object_store lists whole path segments: "a/b" lists under "a/b/".
        let dir = Key::from(prefix.trim_end_matches('/'));
        self.block_on(async {
            let mut out = Vec::new();
            if delimiter {
                let listed = self
                    .client
                    .list_with_delimiter(Some(&dir))
                    .await
                    .map_err(|e| remote_error(&what, e))?;
                for p in listed.common_prefixes {
                    out.push((format!("{}/", p.as_ref()), 0, None));
                }
                for o in listed.objects {
                    let modified = SystemTime::from(o.last_modified);
                    out.push((o.location.as_ref().to_string(), o.size, Some(modified)));
                }
            } else {
                let mut stream = self.client.list(Some(&dir));
                while let Some(meta) = stream.next().await {
                    let meta = meta.map_err(|e| remote_error(&what, e))?;
                    let modified = SystemTime::from(meta.last_modified);
                    out.push((
                        meta.location.as_ref().to_string(),
                        meta.size,
                        Some(modified),
                    ));
                }
            }
            Ok(out)
        })
    }

    /// Delete object `key` (a whole key of the bucket; S3 answers a delete of a missing key
    /// as done).
    pub fn delete_key(&self, key: &str) -> Result<()> {
        let what = format!("delete s3://{}/{key}", self.bucket);
        match self.block_on(self.deleter.delete(&Key::from(key))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error(&what, e)),
        }
    }

    /// Delete objects `keys` (whole keys of the bucket), [`DELETE_BATCH`] in one request
    /// (S3's DeleteObjects; a missing key is no error); the keys that could not be deleted,
    /// with why. A request that fails is followed by a delete of each of its keys alone,
    /// to learn which.
    pub fn delete_keys(&self, keys: &[String]) -> Vec<(String, Error)> {
        let mut failed = Vec::new();
        for batch in keys.chunks(DELETE_BATCH) {
            let stream = futures::stream::iter(
                batch
                    .iter()
                    .map(|k| Ok(Key::from(k.as_str())))
                    .collect::<Vec<_>>(),
            )
            .boxed();
            let results: Vec<object_store::Result<Key>> =
                self.block_on(self.client.delete_stream(stream).collect::<Vec<_>>());
            let trouble = results.into_iter().find_map(|r| match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => Some(e),
            });
            if let Some(e) = trouble {
                log::warn!(
                    "a bulk delete in s3://{} failed ({e}); deleting one by one",
                    self.bucket
                );
                failed.extend(
                    batch
                        .iter()
                        .filter_map(|k| self.delete_key(k).err().map(|e| (k.clone(), e))),
                );
            }
        }
        failed
    }

    /// The size of object `key`, or `None` if there is none.
    pub fn size_of(&self, key: &str) -> Result<Option<u64>> {
        Ok(self.stamp_of(key)?.map(|(size, _)| size))
    }

    /// The size and last modification of object `key` (one HEAD), or `None` if there is
    /// none.
    pub fn stamp_of(&self, key: &str) -> Result<Option<(u64, SystemTime)>> {
        let what = format!("look up s3://{}/{key}", self.bucket);
        match self.block_on(self.client.head(&Key::from(key))) {
            Ok(meta) => Ok(Some((meta.size, SystemTime::from(meta.last_modified)))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(remote_error(&what, e)),
        }
    }

    /// Object `key`, whole.
    pub fn get_bytes(&self, key: &str) -> Result<Vec<u8>> {
        let what = format!("read s3://{}/{key}", self.bucket);
        self.block_on(async {
            let got = self
                .client
                .get(&Key::from(key))
                .await
                .map_err(|e| remote_error(&what, e))?;
            let bytes = got.bytes().await.map_err(|e| remote_error(&what, e))?;
            Ok(bytes.to_vec())
        })
    }

    /// The first `limit + 1` bytes of object `key` at most (a ranged GET): a caller that
    /// gets more than `limit` knows the object is too large, having read no more.
    pub fn get_bytes_upto(&self, key: &str, limit: u64) -> Result<Vec<u8>> {
        let what = format!("read s3://{}/{key}", self.bucket);
        let options = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(0..limit.saturating_add(1))),
            ..Default::default()
        };
        // (An empty object has no first byte to ask for: read it with `get_bytes`.)
        self.block_on(async {
            let got = self
                .client
                .get_opts(&Key::from(key), options)
                .await
                .map_err(|e| remote_error(&what, e))?;
            let bytes = got.bytes().await.map_err(|e| remote_error(&what, e))?;
            Ok(bytes.to_vec())
        })
    }

    /// What `fill` writes, uploaded as object `key` (a key below the bucket, not the
    /// store's prefix), without a copy anywhere but in memory: one PUT when it is at most
    /// [`PART_SIZE`] bytes, else a multipart upload of [`PART_SIZE`] parts, a few in
    /// flight. When `fill` fails (a source that does not match its checksum finds out at
    /// its end), or an upload does, nothing is left under `key`: the multipart upload is
    /// aborted, the single PUT never sent.
    pub fn upload_from(
        &self,
        key: &str,
        fill: impl FnOnce(&mut dyn std::io::Write) -> Result<()>,
    ) -> Result<()> {
        let mut upload = Upload {
            remote: self,
            key: Key::from(key),
            what: format!("upload s3://{}/{key}", self.bucket),
            pending: Vec::new(),
            parts: None,
            failed: None,
        };
        let filled = fill(&mut upload);
        match (filled, upload.failed.take()) {
            (Ok(()), None) => upload.finish(),
            // The upload's own error is the cause of the write error `fill` saw.
            (_, Some(e)) | (Err(e), None) => {
                upload.abort();
                Err(e)
            }
        }
    }

    /// Object `key` written to `to` (a new file), durably; its length, or `None` for one
    /// larger than `limit` bytes, given up once that many are in (and `to` removed).
    pub fn download(&self, key: &str, to: &Path, limit: u64) -> Result<Option<u64>> {
        self.download_range(key, to, None, limit)
    }

    /// Bytes `range` of object `key` (all of it for `None`) written to `to` as
    /// [`Remote::download`] writes it (a ranged GET: nothing else of the object is read).
    pub fn download_range(
        &self,
        key: &str,
        to: &Path,
        range: Option<std::ops::Range<u64>>,
        limit: u64,
    ) -> Result<Option<u64>> {
        let what = format!("read s3://{}/{key}", self.bucket);
        let mut out = create_new_private().open(to).ctx("create", to)?;
        let options = object_store::GetOptions {
            range: range.map(object_store::GetRange::Bounded),
            ..Default::default()
        };
        let total: Result<Option<u64>> = self.block_on(async {
            let got = self
                .client
                .get_opts(&Key::from(key), options)
                .await
                .map_err(|e| remote_error(&what, e))?;
            let mut stream = got.into_stream();
            let mut total = 0u64;
            while let Some(piece) = stream.next().await {
                let piece = piece.map_err(|e| remote_error(&what, e))?;
                total += piece.len() as u64;
                if total > limit {
                    return Ok(None);
                }
                out.write_all(&piece).ctx("write", to)?;
            }
            Ok(Some(total))
        });
        let total = total.and_then(|n| match n {
            Some(_) => out.sync_all().ctx("fsync", to).map(|()| n),
            None => Ok(None),
        });
        if !matches!(total, Ok(Some(_))) {
            let _ = fs::remove_file(to);
        }
        total
    }
}

/// An upload in progress ([`Remote::upload_from`]): what is written is held until a part's
/// worth is in, then handed to a multipart upload (started by the first full part).
struct Upload<'a> {
    remote: &'a Remote,
    key: Key,
    what: String,
    /// Written, not handed over yet: less than a part, or the whole object if it stays
    /// that small.
    pending: Vec<u8>,
    parts: Option<object_store::WriteMultipart>,
    /// Why a write failed (kept whole: the writer sees it as an `io::Error`).
    failed: Option<Error>,
}

impl Upload<'_> {
    /// Hand the pending bytes to the multipart upload, starting it first if need be.
    fn send_part(&mut self) -> Result<()> {
        let (remote, key, what) = (self.remote, &self.key, &self.what);
        let part = std::mem::take(&mut self.pending);
        let parts = &mut self.parts;
        remote.block_on(async {
            if parts.is_none() {
                let upload = remote
                    .client
                    .put_multipart(key)
                    .await
                    .map_err(|e| remote_error(what, e))?;
                *parts = Some(object_store::WriteMultipart::new_with_chunk_size(
                    upload, PART_SIZE,
                ));
            }
            if let Some(writer) = parts.as_mut() {
                writer
                    .wait_for_capacity(4)
                    .await
                    .map_err(|e| remote_error(what, e))?;
                writer.put(bytes::Bytes::from(part));
            }
            Ok(())
        })
    }

    fn finish(mut self) -> Result<()> {
        let (remote, what) = (self.remote, &self.what);
        match self.parts.take() {
            None => {
                let payload = PutPayload::from(std::mem::take(&mut self.pending));
                remote
                    .block_on(remote.client.put(&self.key, payload))
                    .map(|_| ())
                    .map_err(|e| remote_error(what, e))
            }
            Some(mut writer) => {
                let rest = std::mem::take(&mut self.pending);
                remote.block_on(async {
                    writer.put(bytes::Bytes::from(rest));
                    writer
                        .finish()
                        .await
                        .map(|_| ())
                        .map_err(|e| remote_error(what, e))
                })
            }
        }
    }

    fn abort(mut self) {
        if let Some(writer) = self.parts.take() {
            if let Err(e) = self.remote.block_on(writer.abort()) {
                // Its parts stay in the bucket, unseen, until a lifecycle rule
                // (AbortIncompleteMultipartUpload) removes them.
                log::warn!(
                    "{}: the multipart upload could not be aborted: {e}",
                    self.what
                );
            }
        }
    }
}

impl std::io::Write for Upload<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.failed.is_some() {
            return Err(std::io::Error::other("the upload failed"));
        }
        // A full part goes out only once more follows: an object of exactly one part's
        // size is one PUT.
        if self.pending.len() == PART_SIZE && !buf.is_empty() {
            if let Err(e) = self.send_part() {
                let message = e.to_string();
                self.failed = Some(e);
                return Err(std::io::Error::other(message));
            }
        }
        let n = buf.len().min(PART_SIZE - self.pending.len());
        self.pending.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An `object_store` error as ours: the operation and the key in the message, the client's
/// error kept as the source; its kind (a missing object, a create-only or conditional write
/// refused) is [`Error::kind`]'s to tell.
fn remote_error(what: &str, source: object_store::Error) -> Error {
    Error::ObjectStore {
        what: what.to_string(),
        source,
    }
}

/// The S3 error code (`NoSuchBucket`, `AccessDenied`, ...) of a failed request: S3 names the
/// kind of every error in the `<Code>` of its XML error response, which `object_store`
/// keeps in the error's text but exposes no other way (no HTTP status for a LIST).
fn s3_error_code(e: &object_store::Error) -> Option<String> {
    let mut cause: Option<&dyn std::error::Error> = Some(e);
    while let Some(error) = cause {
        let text = error.to_string();
        if let Some((_, rest)) = text.split_once("<Code>") {
            if let Some((code, _)) = rest.split_once("</Code>") {
                return Some(code.to_string());
            }
        }
        cause = error.source();
    }
    None
}

/// Objects on object storage, read through a local cache.
pub struct S3Objects {
    remote: Arc<Remote>,
    options: S3Options,
    uploads: Mutex<Uploads>,
    delete_done: Condvar,
    cache: Arc<Cache>,
    /// Prefetches in flight at once.
    prefetches: Arc<tokio::sync::Semaphore>,
    /// Parts of uploads in memory at once (see [`S3Objects::upload`]).
    part_buffers: Arc<tokio::sync::Semaphore>,
    /// The writer's lease, checked before every delete request: a writer that lost the
    /// store deletes nothing (the next writer may have stored the same content again).
    fence: Option<Arc<dyn WriteFence>>,
    /// False once a copy came back without a SHA-256 (an endpoint that computes none):
    /// files are read and uploaded from then on ([`ObjectStore::copies_from`]).
    copies_named: std::sync::atomic::AtomicBool,
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

    fn check_fence(&self) -> Result<()> {
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

    fn object_name(id: &ObjectId) -> String {
        layout::object_key(&id.to_hex())
    }

    /// Count `id` as staged (waiting for a delete of it in flight first).
    fn begin_stage(&self, id: ObjectId) {
        let mut uploads = lock(&self.uploads);
        while uploads.deleting.contains(&id) {
            uploads = crate::fsutil::wait(&self.delete_done, uploads);
        }
        *uploads.staged.entry(id).or_default() += 1;
    }

    fn end_stage(&self, id: &ObjectId) {
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
    fn upload(&self, id: &ObjectId, src: UploadBody<'_>) -> Result<()> {
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

/// Objects up to this size (SSTs of RocksDB's default 64 MiB target size) are fetched with
/// one GET each (a copy of a checkpoint fetches several files at once, see
/// [`ObjectStore::prefetch`]); larger ones in ranges of [`RANGE_SIZE`], several at once.
const SINGLE_GET: u64 = 64 << 20;
/// The range of one GET of a large object.
const RANGE_SIZE: u64 = 16 << 20;

/// Fetch object `id` into `cache`, hashing it on the way: one GET, or for a large object
/// ranged GETs of [`RANGE_SIZE`], `concurrency` of them in flight, consumed in order.
async fn fetch_into(
    remote: Arc<Remote>,
    cache: Arc<Cache>,
    id: ObjectId,
    concurrency: usize,
) -> Result<PathBuf> {
    let name = S3Objects::object_name(&id);
    let key = remote.key(&name);
    let what = format!("fetch {}", remote.url(&name));
    let missing = |e: object_store::Error| match e {
        object_store::Error::NotFound { .. } => {
            Error::Corrupt(format!("object {id} is missing from the store"))
        }
        e => remote_error(&what, e),
    };
    let tmp = cache.tmp_path(&id);
    let mut out = create_new_private().open(&tmp).ctx("create", &tmp)?;
    if id == id.hasher().finalize() {
        // Empty (a fresh WAL): nothing to fetch, and a ranged GET of it is refused.
        return cache.insert(id, &tmp, 0);
    }
    let result: Result<(ObjectId, u64)> = async {
        let first = remote
            .client
            .get_opts(
                &key,
                object_store::GetOptions {
                    range: Some(object_store::GetRange::Bounded(0..SINGLE_GET)),
                    ..Default::default()
                },
            )
            .await
            .map_err(missing)?;
        let size = first.meta.size;
        let mut hasher = id.hasher();
        let mut total = 0u64;
        let mut stream = first.into_stream();
        while let Some(piece) = stream.next().await {
            let piece = piece.map_err(|e| remote_error(&what, e))?;
            hasher.update(&piece);
            out.write_all(&piece).ctx("write", &tmp)?;
            total += piece.len() as u64;
        }
        if total < size {
            let ranges: Vec<std::ops::Range<u64>> = (total..size)
                .step_by(RANGE_SIZE as usize)
                .map(|start| start..(start + RANGE_SIZE).min(size))
                .collect();
            let mut parts = futures::stream::iter(ranges)
                .map(|range| remote.client.get_range(&key, range))
                .buffered(concurrency.max(1));
            while let Some(part) = parts.next().await {
                let part = part.map_err(missing)?;
                hasher.update(&part);
                out.write_all(&part).ctx("write", &tmp)?;
                total += part.len() as u64;
            }
        }
        Ok((hasher.finalize(), total))
    }
    .await;
    let checked = result.and_then(|(hash, total)| {
        super::check(&id, total, hash, total)?;
        Ok(total)
    });
    match checked {
        Ok(size) => cache.insert(id, &tmp, size),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// What an upload reads: a file or bytes in memory.
enum UploadBody<'a> {
    File(&'a fs::File, u64),
    Bytes(&'a [u8]),
}

impl UploadBody<'_> {
    fn len(&self) -> u64 {
        match self {
            UploadBody::File(_, len) => *len,
            UploadBody::Bytes(b) => b.len() as u64,
        }
    }

    fn read_range(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        match self {
            UploadBody::File(file, _) => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, offset)
                    .map_err(|e| Error::io("read for upload", e))?;
                Ok(buf)
            }
            UploadBody::Bytes(b) => Ok(b[offset as usize..offset as usize + len].to_vec()),
        }
    }

    fn read_all(&self) -> Result<Vec<u8>> {
        self.read_range(0, self.len() as usize)
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
        self.sweep_copy_staging()
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

/// Records as small objects beside the objects, written with conditional PUTs.
pub struct S3Records {
    remote: Arc<Remote>,
}

impl S3Records {
    /// The records under `remote`'s prefix; connects to nothing.
    pub fn new(remote: Arc<Remote>) -> Self {
        S3Records { remote }
    }

    /// Refuse a server that ignores conditional writes (`If-None-Match: *`, `If-Match`):
    /// on it, nothing would fence a second writer. Probes with a record of its own.
    pub fn check_conditional_writes(&self) -> Result<()> {
        let key = format!("probe-{}.json", std::process::id());
        let refuse = |what: &str| {
            Err(Error::Invalid(format!(
                "{} ignores conditional writes ({what}): ckptfs cannot keep a second writer \
                 out of a store there, and refuses to write to it",
                self.remote.url("")
            )))
        };
        let _ = self.delete(&key);
        self.put(&key, b"1", Put::Create)?;
        let checked = match self.put(&key, b"2", Put::Create) {
            Err(e) if e.kind() == ErrorKind::Exists => match self.put(
                &key,
                b"3",
                Put::Update(Some("\"ckptfs-probe-no-such-etag\"".into())),
            ) {
                Err(e) if e.kind() == ErrorKind::Conflict => Ok(()),
                Ok(_) => refuse("If-Match"),
                Err(e) => Err(e),
            },
            Ok(_) => refuse("If-None-Match"),
            Err(e) => Err(e),
        };
        let _ = self.delete(&key);
        checked
    }

    /// A conditional put the server refused may have been our own, landed before a retry
    /// (a timeout, then "exists" or "changed"): its version if the record holds our bytes,
    /// `refused` if it holds none or another's. A record that cannot be read is an I/O
    /// error (see [`read_back`]).
    fn refused_put(&self, key: &str, bytes: &[u8], refused: Error) -> Result<Option<String>> {
        match read_back(self, key, bytes) {
            Ok(ReadBack::Landed { version }) => Ok(version),
            Ok(ReadBack::Absent | ReadBack::Other(_)) => Err(refused),
            Err(e) => Err(Error::io(
                format!(
                    "write {}: refused as changed, and it cannot be read back to tell \
                     whether by this writer's own earlier attempt",
                    self.remote.url(key)
                ),
                std::io::Error::other(e.to_string()),
            )),
        }
    }
}

impl S3Records {
    async fn get_async(&self, key: &str) -> Result<Option<Record>> {
        let what = format!("read {}", self.remote.url(key));
        let got = match self.remote.client.get(&self.remote.key(key)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(remote_error(&what, e)),
        };
        let version = got.meta.e_tag.clone();
        let modified = Some(SystemTime::from(got.meta.last_modified));
        let bytes = got.bytes().await.map_err(|e| remote_error(&what, e))?;
        Ok(Some(Record {
            bytes: bytes.to_vec(),
            version,
            modified,
        }))
    }
}

/// Small reads (records, prefetched file lists) in flight at once.
const GET_CONCURRENCY: usize = 16;

impl Records for S3Records {
    fn get(&self, key: &str) -> Result<Option<Record>> {
        self.remote.block_on(self.get_async(key))
    }

    fn get_many(&self, keys: &[String]) -> Vec<Result<Option<Record>>> {
        self.remote.block_on(
            futures::stream::iter(keys)
                .map(|key| self.get_async(key))
                .buffered(GET_CONCURRENCY)
                .collect(),
        )
    }

    fn put(&self, key: &str, bytes: &[u8], mode: Put) -> Result<Option<String>> {
        let what = format!("write {}", self.remote.url(key));
        let mode = match mode {
            Put::Overwrite | Put::Update(None) => PutMode::Overwrite,
            Put::Create => PutMode::Create,
            Put::Update(Some(e_tag)) => PutMode::Update(UpdateVersion {
                e_tag: Some(e_tag),
                version: None,
            }),
        };
        let options = PutOptions {
            mode,
            ..Default::default()
        };
        let result = self.remote.block_on(self.remote.client.put_opts(
            &self.remote.key(key),
            PutPayload::from(bytes.to_vec()),
            options,
        ));
        match result {
            Ok(put) => Ok(put.e_tag),
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => self.refused_put(key, bytes, remote_error(&what, e)),
            Err(e) => Err(remote_error(&what, e)),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        match self
            .remote
            .block_on(self.remote.client.delete(&self.remote.key(key)))
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error(&format!("delete {}", self.remote.url(key)), e)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        Ok(self
            .remote
            .list_under(dir)?
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| !name.contains('/'))
            .collect())
    }

    fn has_dir(&self, _dir: &str) -> bool {
        true
    }

    fn create_dir(&self, _dir: &str) -> Result<()> {
        Ok(())
    }

    fn describe(&self, key: &str) -> String {
        self.remote.url(key)
    }

    fn versioned(&self) -> bool {
        true
    }

    /// A small record written and read back: its modification time is the store's now
    /// (to the second on most servers; callers allow for that).
    fn store_now(&self) -> Result<Option<SystemTime>> {
        let key = self.remote.key(CLOCK);
        let what = format!("read the clock of {}", self.remote.url(""));
        self.remote.block_on(async {
            self.remote
                .client
                .put(&key, PutPayload::from_static(b"{}"))
                .await
                .map_err(|e| remote_error(&what, e))?;
            let meta = self
                .remote
                .client
                .head(&key)
                .await
                .map_err(|e| remote_error(&what, e))?;
            Ok(Some(SystemTime::from(meta.last_modified)))
        })
    }
}

/// The record [`Records::store_now`] writes to read the store's clock.
const CLOCK: &str = layout::CLOCK;

/// An object of a source bucket that a store on the same endpoint copies without reading
/// it ([`ObjectStore::stage_copy`]): the bucket's connection, the object's whole key, and
/// its size and ETag when it was looked up. Every read and copy of it is conditional on
/// that ETag (`If-Match`), so what is read of it and what is copied are the same version.
#[derive(Clone)]
pub struct RemoteFile {
    /// The source bucket's connection.
    pub remote: Arc<Remote>,
    /// The object's key below the bucket.
    pub key: String,
    /// Its size in bytes when looked up.
    pub size: u64,
    /// Its ETag when looked up.
    pub etag: Option<String>,
}

impl RemoteFile {
    /// `s3://bucket/key`.
    pub fn uri(&self) -> String {
        format!("s3://{}/{}", self.remote.bucket, self.key)
    }
}

impl std::fmt::Debug for RemoteFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteFile({}, {} bytes)", self.uri(), self.size)
    }
}

impl Remote {
    /// Object `key` (a whole key below the bucket) as it is now (one HEAD), `None` if
    /// there is none.
    pub fn remote_file(self: &Arc<Self>, key: &str) -> Result<Option<RemoteFile>> {
        let what = format!("look up s3://{}/{key}", self.bucket);
        match self.block_on(self.client.head(&Key::from(key))) {
            Ok(meta) => Ok(Some(RemoteFile {
                remote: self.clone(),
                key: key.to_string(),
                size: meta.size,
                etag: meta.e_tag,
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(remote_error(&what, e)),
        }
    }

    /// Bytes `[offset, offset + len)` of `file` (fewer at its end), read only while it is
    /// the version looked up: an object written since is a Conflict.
    pub fn read_range_of(&self, file: &RemoteFile, offset: u64, len: usize) -> Result<Vec<u8>> {
        let end = offset.saturating_add(len as u64).min(file.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let what = format!("read {}", file.uri());
        let options = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(offset..end)),
            if_match: file.etag.clone(),
            ..Default::default()
        };
        self.block_on(async {
            let got = self
                .client
                .get_opts(&Key::from(file.key.as_str()), options)
                .await
                .map_err(|e| changed_or(&what, e))?;
            let bytes = got.bytes().await.map_err(|e| remote_error(&what, e))?;
            Ok(bytes.to_vec())
        })
    }
}

/// `e`, said as a source object written since it was looked up when it is a failed
/// precondition.
fn changed_or(what: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::Precondition { .. } => Error::Conflict(format!(
            "{what}: the object was written again since it was listed"
        )),
        e => remote_error(what, e),
    }
}

/// Staging keys of copies: `tmp/<unique>` below the store's prefix, never under
/// `objects/` (whose keys are all ids).
static COPY_SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl S3Objects {
    /// A key below the store's prefix that no other stage uses: `tmp/<pid>-<nanos>-<n>`.
    fn copy_staging_key(&self) -> String {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let n = COPY_SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.remote.full_key(&format!(
            "{}/{}-{nanos}-{n}",
            layout::TMP,
            std::process::id()
        ))
    }

    /// Copy `file` into the store inside the object store, named by the SHA-256 the object
    /// store computes: first to a staging key (which gives the hash), then from there to
    /// the object's key, then the staging key is deleted. No byte passes through this host.
    fn copy_in(&self, file: &RemoteFile) -> Result<Staged> {
        if !self.remote.can_copy_from(&file.remote) {
            return Err(Error::Invalid(format!(
                "{} is on another endpoint than {}: the object store cannot copy it",
                file.uri(),
                self.describe()
            )));
        }
        if file.size > MAX_COPY_OBJECT {
            return Err(Error::Invalid(format!(
                "{} has {} bytes, more than one copy request copies ({MAX_COPY_OBJECT})",
                file.uri(),
                file.size
            )));
        }
        let staging = self.copy_staging_key();
        let first = self
            .remote
            .copy_from(&file.remote, &file.key, &staging, file.etag.as_deref());
        let result = first.and_then(|copied| {
            let sha256 = copied.whole_sha256(&file.uri()).inspect_err(|e| {
                // Such an endpoint never will: the next try reads the files instead.
                self.copies_named
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                log::warn!("{e}; files are read and uploaded from now on");
            })?;
            let id = ObjectId::from_sha256(sha256);
            let key = self.remote.full_key(&Self::object_name(&id));
            self.begin_stage(id);
            let second = self
                .remote
                .copy_from(&self.remote, &staging, &key, Some(&copied.etag))
                .and_then(|again| {
                    if again.sha256 == Some(*id.as_bytes()) {
                        Ok(())
                    } else {
                        Err(Error::Corrupt(format!(
                            "the object store copied {} as {} and then as {:?}",
                            file.uri(),
                            id,
                            again.sha256.map(ObjectId::from_sha256)
                        )))
                    }
                });
            match second {
                Ok(()) => Ok(Staged {
                    id,
                    size: file.size,
                    tmp: PathBuf::new(),
                }),
                Err(e) => {
                    self.end_stage(&id);
                    Err(e)
                }
            }
        });
        // Best effort: a staging key left behind is swept with the orphans.
        if let Err(e) = self.remote.delete_key(&staging) {
            log::warn!(
                "staging copy s3://{}/{staging} not deleted: {e}",
                self.remote.bucket
            );
        }
        result
    }

    /// Delete staging copies (`tmp/`) older than the orphan grace: a copy in flight is
    /// younger, and an interrupted one is an orphan once older.
    fn sweep_copy_staging(&self) -> Result<usize> {
        let mut swept = 0;
        for (name, modified) in self.remote.list_under(layout::TMP)? {
            if super::is_young(Some(modified), super::DEFAULT_ORPHAN_GRACE) {
                continue;
            }
            self.check_fence()?;
            self.remote
                .delete_key(&self.remote.full_key(&format!("{}/{name}", layout::TMP)))?;
            swept += 1;
        }
        Ok(swept)
    }
}
