//! The store on S3-compatible object storage (AWS S3, Ceph RGW, MinIO), through the
//! `object_store` crate.
//!
//! Layout under `s3://BUCKET/PREFIX/`: `objects/<id>` (content-addressed: see
//! [`ObjectId`](super::ObjectId)),
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

mod copier;
mod copy;
mod copy_parts;
mod foreign;
#[cfg(test)]
pub(crate) mod moto;
#[cfg(test)]
mod moto_server;
mod objects;
mod records;
mod remote;
mod staging;
mod transfer;
mod upload;

#[cfg(test)]
mod tests;

pub use copy::{Copied, MAX_COPY};
pub use foreign::{RemoteFile, Within};
pub use objects::{S3Objects, S3Options};
pub use records::S3Records;
pub use remote::{Remote, DELETE_TIMEOUT};
pub use upload::PART_SIZE;
