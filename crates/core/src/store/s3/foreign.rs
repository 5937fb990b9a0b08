//! Reads (and the few writes) of keys that are not the store's own: a Flink job's
//! checkpoints in a bucket, and a source object ([`RemoteFile`]) that a store on the same
//! endpoint copies without reading it.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use futures::StreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore as _, ObjectStoreExt as _};

use super::remote::{remote_error, s3_error_code, Remote, DELETE_BATCH};
use crate::error::{Error, IoContext, Result};
use crate::fsutil::create_new_private;

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

    /// Object `key` if it holds at most `limit` bytes: one GET of its first `limit + 1`
    /// bytes at most (ranged), its size taken from the response. A larger object is
    /// [`Within::Larger`], no more of it read. An empty object has no first byte to ask
    /// for (S3 answers `InvalidRange`): it is read whole, as bounded.
    pub fn get_within(&self, key: &str, limit: u64) -> Result<Within> {
        let what = format!("read s3://{}/{key}", self.bucket);
        let key = Key::from(key);
        let ranged = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(0..limit.saturating_add(1))),
            ..Default::default()
        };
        self.block_on(async {
            let got = match self.client.get_opts(&key, ranged).await {
                Ok(got) => got,
                Err(e) if s3_error_code(&e).as_deref() == Some("InvalidRange") => self
                    .client
                    .get(&key)
                    .await
                    .map_err(|e| remote_error(&what, e))?,
                Err(e) => return Err(remote_error(&what, e)),
            };
            // The whole object's size (a ranged answer's `Content-Range` says it).
            let size = got.meta.size;
            if size > limit {
                return Ok(Within::Larger(Some(size)));
            }
            let mut bytes = Vec::with_capacity(size as usize);
            let mut stream = got.into_stream();
            while let Some(piece) = stream.next().await {
                let piece = piece.map_err(|e| remote_error(&what, e))?;
                if (bytes.len() + piece.len()) as u64 > limit {
                    return Ok(Within::Larger(None));
                }
                bytes.extend_from_slice(&piece);
            }
            Ok(Within::Bytes(bytes))
        })
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

/// What [`Remote::get_within`] read.
#[derive(Debug)]
pub enum Within {
    /// The whole object.
    Bytes(Vec<u8>),
    /// More than the limit: its size where the answer said it.
    Larger(Option<u64>),
}

/// An object of a source bucket that a store on the same endpoint copies without reading
/// it ([`ObjectStore::stage_copy`](crate::store::ObjectStore::stage_copy)): the bucket's
/// connection, the object's whole key, and its size and ETag when it was looked up. Every
/// read and copy of it is conditional on that ETag (`If-Match`), so what is read of it
/// and what is copied are the same version.
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
