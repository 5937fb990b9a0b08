//! The store on S3-compatible object storage (AWS S3, Ceph RGW, MinIO), through the
//! `object_store` crate.
//!
//! Layout under `s3://BUCKET/PREFIX/`: `objects/<64 hex digits>` (content-addressed),
//! `checkpoints/<id>.json`, `ckptfs.json`, `quarantine/`, `lease.json`.
//!
//! Objects go straight to their final key: the key is the hash of the content, so two
//! uploads of one key write the same bytes and either may land. What the local store gets
//! from its private temporary files, this store gets from bookkeeping: an object staged and
//! not yet published or discarded is never deleted
//! ([`ObjectStore::delete`](super::ObjectStore::delete) skips it and leaves it to the
//! orphan sweep), and a stage waits for a delete of its key in flight.
//! An upload interrupted after the bytes landed leaves an orphan, which the sweep removes
//! once it is older than the grace period.
//!
//! Reads go through a local cache (`store/cache.rs`): an object is fetched once, checked
//! against its hash, and served from a file under the state directory; the least recently
//! used objects are evicted above the cache's size.

use std::time::Duration;

use crate::error::Error;

mod copy;
mod foreign;
#[cfg(test)]
pub(crate) mod moto;
mod objects;
mod records;
mod remote;
mod staging;
mod transfer;
mod upload;

#[cfg(test)]
mod tests;

pub use copy::Copied;
pub use foreign::RemoteFile;
pub use objects::S3Objects;
pub use records::S3Records;
pub use remote::Remote;

/// Keys deleted by one request (S3's DeleteObjects takes at most 1,000).
const DELETE_BATCH: usize = 1000;

/// How many times an object delete is sent at most (each after a check of the fence).
const DELETE_ATTEMPTS: usize = 5;
/// How long one delete request may take before it is abandoned without a fence (and the
/// deleting client's own timeout): with one, its request budget
/// ([`WriteFence::request_budget`](super::WriteFence::request_budget): a fifth of the lease
/// time), so that a request sent just after the fence was checked is answered, or
/// abandoned, before another writer can take over.
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

/// Small reads (records, prefetched file lists) in flight at once.
const GET_CONCURRENCY: usize = 16;

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
