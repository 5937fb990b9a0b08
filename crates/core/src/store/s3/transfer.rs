//! The bytes that [`S3Objects`](super::S3Objects) moves: what an upload reads
//! ([`UploadBody`]), and a fetch into the cache checked against the object's id on the
//! way in ([`fetch_into`]).

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use object_store::{ObjectStore as _, ObjectStoreExt as _};

use super::remote::{remote_error, Remote};
use crate::error::{Error, IoContext, Result};
use crate::fsutil::create_new_private;
use crate::store::cache::Cache;
use crate::store::{layout, ObjectId};

/// Objects up to this size (SSTs of RocksDB's default 64 MiB target size) are fetched with
/// one GET each (a copy of a checkpoint fetches several files at once, see
/// [`ObjectStore::prefetch`](crate::store::ObjectStore::prefetch)); larger ones in ranges
/// of [`RANGE_SIZE`], several at once.
const SINGLE_GET: u64 = 64 << 20;
/// The range of one GET of a large object.
const RANGE_SIZE: u64 = 16 << 20;

/// Fetch object `id` into `cache`, hashing it on the way: one GET, or for a large object
/// ranged GETs of [`RANGE_SIZE`], `concurrency` of them in flight, consumed in order.
pub(super) async fn fetch_into(
    remote: Arc<Remote>,
    cache: Arc<Cache>,
    id: ObjectId,
    concurrency: usize,
) -> Result<PathBuf> {
    let name = layout::object_key(&id.to_hex());
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
        crate::store::check(&id, total, hash, total)?;
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
pub(super) enum UploadBody<'a> {
    File(&'a fs::File, u64),
    Bytes(&'a [u8]),
}

impl UploadBody<'_> {
    pub(super) fn len(&self) -> u64 {
        match self {
            UploadBody::File(_, len) => *len,
            UploadBody::Bytes(b) => b.len() as u64,
        }
    }

    pub(super) fn read_range(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
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

    pub(super) fn read_all(&self) -> Result<Vec<u8>> {
        self.read_range(0, self.len() as usize)
    }
}
