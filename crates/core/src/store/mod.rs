//! Stored objects, addressed by their content.
//!
//! The store knows nothing of RocksDB, checkpoints or FUSE: it keeps immutable byte strings
//! under the BLAKE3 hash of their content. Writing is split in two steps, [`ObjectStore::stage`]
//! (copy into a private temporary object, durable) and [`ObjectStore::publish`] (make it
//! visible under its id), so the caller decides under its own lock whether a staged copy is
//! published or discarded as a duplicate.

mod cache;
pub mod chunks;
pub mod conditional;
pub(crate) mod crash;
pub mod layout;
mod local;
pub mod records;
pub mod s3;

use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use local::LocalStore;

use crate::error::{Error, IoContext, Result};

/// Where a store is: a local directory, or `s3://BUCKET/PREFIX` on S3-compatible object
/// storage (endpoint, region and credentials from the standard AWS environment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A directory, as the user named it.
    Local(PathBuf),
    /// A key prefix of an S3 bucket.
    S3 {
        /// The bucket's name.
        bucket: String,
        /// The key prefix, without a trailing `/` ("": the whole bucket).
        prefix: String,
    },
}

impl Location {
    /// A store argument: `s3://BUCKET[/PREFIX]` or a directory.
    pub fn parse(arg: &str) -> Result<Location> {
        if let Some(rest) = arg.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let bucket_ok = (3..=63).contains(&bucket.len())
                && bucket.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'
                });
            if !bucket_ok {
                return Err(Error::Invalid(format!(
                    "{arg}: not a bucket name (3 to 63 lower-case letters, digits, dots, dashes)"
                )));
            }
            let prefix = prefix.trim_end_matches('/');
            if prefix
                .split('/')
                .any(|part| part == "." || part == ".." || (part.is_empty() && !prefix.is_empty()))
            {
                return Err(Error::Invalid(format!(
                    "{arg}: the prefix must not hold empty, . or .. parts"
                )));
            }
            return Ok(Location::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
            });
        }
        if let Some((scheme, _)) = arg.split_once("://") {
            return Err(Error::Invalid(format!(
                "{arg}: stores of kind {scheme}:// are not supported (a directory or \
                 s3://BUCKET/PREFIX)"
            )));
        }
        Ok(Location::Local(PathBuf::from(arg)))
    }

    /// The directory of a local store.
    pub fn local(&self) -> Option<&Path> {
        match self {
            Location::Local(path) => Some(path),
            Location::S3 { .. } => None,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(path) => write!(f, "{}", path.display()),
            Location::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Location::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

impl From<PathBuf> for Location {
    fn from(path: PathBuf) -> Self {
        Location::Local(path)
    }
}

impl From<&Location> for Location {
    fn from(location: &Location) -> Self {
        location.clone()
    }
}

impl From<&PathBuf> for Location {
    fn from(path: &PathBuf) -> Self {
        Location::Local(path.clone())
    }
}

impl From<&Path> for Location {
    fn from(path: &Path) -> Self {
        Location::Local(path.to_path_buf())
    }
}

/// A store opened for reading by a command that is not the daemon (`restore`, `fsck`,
/// `graph`): its objects and records; an object store's read cache lives in a temporary
/// directory for as long as this does.
pub struct OpenedStore {
    /// The store's objects.
    pub objects: std::sync::Arc<dyn ObjectStore>,
    /// The store's named records.
    pub records: std::sync::Arc<dyn records::Records>,
    _cache: Option<tempfile::TempDir>,
}

impl OpenedStore {
    /// The objects and records at `location`, without creating anything and without
    /// asking whether they are a ckptfs store ([`crate::repo::Repo`] does): raw access
    /// for the reader's opening and for tests.
    pub fn open(location: &Location) -> Result<OpenedStore> {
        match location {
            Location::Local(root) => Ok(OpenedStore {
                objects: std::sync::Arc::new(LocalStore::open_existing(root)?),
                records: std::sync::Arc::new(records::LocalRecords::new(root)),
                _cache: None,
            }),
            Location::S3 { bucket, prefix } => {
                let remote = s3::Remote::connect(bucket, prefix)?;
                remote.check_bucket()?;
                let cache = tempfile::Builder::new()
                    .prefix("ckptfs-cache-")
                    .tempdir()
                    .map_err(|e| Error::io("create a cache directory", e))?;
                let objects = s3::S3Objects::new(
                    remote.clone(),
                    s3::S3Options::default(),
                    &cache.path().join(layout::OBJECTS),
                )?;
                Ok(OpenedStore {
                    objects: std::sync::Arc::new(objects),
                    records: std::sync::Arc::new(s3::S3Records::new(remote)),
                    _cache: Some(cache),
                })
            }
        }
    }
}

/// How an object's id was computed from its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Digest {
    /// BLAKE3, computed by ckptfs as it read the bytes (every object it wrote itself).
    Blake3,
    /// SHA-256, computed by the object store as it copied the bytes from a source that
    /// ckptfs never read (format 9: `CopyObject` with a checksum, see `s3/staging.rs`).
    Sha256,
    /// The SHA-256 of the SHA-256s of the bytes' parts of `1 << n` bytes each (the last
    /// one shorter), computed by the object store as it copied the bytes in parts (format
    /// 10: objects over 1 GiB, S3's "composite" checksum of a multipart upload, see
    /// `s3/copy_parts.rs`).
    Sha256Parts(u8),
}

/// The smallest and largest parts (`1 << n` bytes) of a [`Digest::Sha256Parts`] id: S3's
/// parts are at most 5 GiB, and an id names whole bytes however small its parts.
const PART_LOG2: std::ops::RangeInclusive<u8> = 10..=32;

/// The identity of a stored object: the hash of its bytes, BLAKE3 or (for a copy the
/// object store made) SHA-256. Either way the object is addressed by its content: every
/// reader checks the bytes against the id with the id's own hash function.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectId {
    hash: [u8; 32],
    digest: Digest,
}

/// The text that precedes the hex digits of a SHA-256 id (a BLAKE3 id is bare hex, as
/// stores of formats 1 to 8 name every object).
const SHA256_PREFIX: &str = "sha256-";

/// The text that precedes a [`Digest::Sha256Parts`] id's part size (`n` of `1 << n`), then
/// `-` and its hex digits: `sha256p30-<hex>` for parts of 1 GiB.
const SHA256_PARTS_PREFIX: &str = "sha256p";

/// Hashing an id for a hash table needs only some of its bytes: they are a cryptographic
/// hash already, uniformly spread (and equal ids still hash equally). Feeding 8 bytes
/// rather than 32 makes loading 10,000 checkpoints' registry measurably cheaper.
impl std::hash::Hash for ObjectId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut head = [0u8; 8];
        head.copy_from_slice(&self.hash[..8]);
        state.write_u64(u64::from_le_bytes(head));
    }
}

impl ObjectId {
    /// The id of the bytes whose BLAKE3 hash is `hash`.
    pub fn from_hash(hash: blake3::Hash) -> Self {
        ObjectId {
            hash: *hash.as_bytes(),
            digest: Digest::Blake3,
        }
    }

    /// The id of the bytes whose SHA-256 hash is `hash`.
    pub fn from_sha256(hash: [u8; 32]) -> Self {
        ObjectId {
            hash,
            digest: Digest::Sha256,
        }
    }

    /// The id of the bytes whose parts of `1 << part_log2` bytes have SHA-256s whose
    /// concatenation's SHA-256 is `hash`; `None` for a part size outside 1 KiB to 4 GiB.
    pub fn from_sha256_parts(hash: [u8; 32], part_log2: u8) -> Option<Self> {
        PART_LOG2.contains(&part_log2).then_some(ObjectId {
            hash,
            digest: Digest::Sha256Parts(part_log2),
        })
    }

    /// The hash's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.hash
    }

    /// The hash function the id was computed with.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// A hasher that computes, from an object's bytes, the id it must have: a reader
    /// checks `id.hasher()` fed the bytes against `id`.
    pub fn hasher(&self) -> IdHasher {
        IdHasher::new(self.digest)
    }

    /// The id as the object is named in the store: 64 lower-case hex digits for BLAKE3,
    /// the same prefixed with `sha256-` for SHA-256, and with `sha256p<n>-` for the SHA-256
    /// of parts of `1 << n` bytes.
    pub fn to_hex(&self) -> String {
        let hex = blake3::Hash::from_bytes(self.hash).to_hex();
        match self.digest {
            Digest::Blake3 => hex.to_string(),
            Digest::Sha256 => format!("{SHA256_PREFIX}{hex}"),
            Digest::Sha256Parts(n) => format!("{SHA256_PARTS_PREFIX}{n}-{hex}"),
        }
    }

    /// A short prefix for logs and pictures.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.short())
    }
}

impl FromStr for ObjectId {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        let not_an_id = || Error::Invalid(format!("not an object id: {text:?}"));
        let (hex, digest) = if let Some(hex) = text.strip_prefix(SHA256_PREFIX) {
            (hex, Digest::Sha256)
        } else if let Some(rest) = text.strip_prefix(SHA256_PARTS_PREFIX) {
            let (n, hex) = rest.split_once('-').ok_or_else(not_an_id)?;
            // Digits only, as written (no sign, no leading zero).
            let n = n
                .parse::<u8>()
                .ok()
                .filter(|v| PART_LOG2.contains(v) && v.to_string() == n)
                .ok_or_else(not_an_id)?;
            (hex, Digest::Sha256Parts(n))
        } else {
            (text, Digest::Blake3)
        };
        blake3::Hash::from_hex(hex)
            .map(|hash| ObjectId {
                hash: *hash.as_bytes(),
                digest,
            })
            .map_err(|_| not_an_id())
    }
}

impl Serialize for ObjectId {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ObjectId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Computes an object's id from its bytes, with the hash function of [`Digest`].
#[derive(Clone)]
pub enum IdHasher {
    /// BLAKE3.
    Blake3(Box<blake3::Hasher>),
    /// SHA-256.
    Sha256(sha2::Sha256),
    /// SHA-256 of parts' SHA-256s.
    Sha256Parts(Box<PartsHasher>),
}

/// Computes a [`Digest::Sha256Parts`] id: each part of `1 << log2` bytes hashed with
/// SHA-256, and those hashes (32 bytes each, in order) hashed again, as S3 computes a
/// multipart upload's "composite" checksum.
#[derive(Clone)]
pub struct PartsHasher {
    log2: u8,
    part: sha2::Sha256,
    /// Bytes fed to `part` so far.
    in_part: u64,
    /// Fed each finished part's hash.
    parts: sha2::Sha256,
    /// How many parts were finished.
    ended: u64,
}

impl PartsHasher {
    fn update(&mut self, mut bytes: &[u8]) {
        let part_size = 1u64 << self.log2;
        while !bytes.is_empty() {
            let room = part_size - self.in_part;
            let n = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            sha2::Digest::update(&mut self.part, &bytes[..n]);
            self.in_part += n as u64;
            bytes = &bytes[n..];
            if self.in_part == part_size {
                self.end_part();
            }
        }
    }

    fn end_part(&mut self) {
        let part = std::mem::replace(&mut self.part, <sha2::Sha256 as sha2::Digest>::new());
        sha2::Digest::update(&mut self.parts, sha2::Digest::finalize(part));
        self.in_part = 0;
        self.ended += 1;
    }

    fn finalize(mut self) -> ObjectId {
        // The last part, shorter; or the only one, of nothing.
        if self.in_part > 0 || self.ended == 0 {
            self.end_part();
        }
        ObjectId {
            hash: sha2::Digest::finalize(self.parts).into(),
            digest: Digest::Sha256Parts(self.log2),
        }
    }
}

impl IdHasher {
    /// A hasher for ids computed with `digest`.
    pub fn new(digest: Digest) -> Self {
        match digest {
            Digest::Blake3 => IdHasher::Blake3(Box::new(blake3::Hasher::new())),
            Digest::Sha256 => IdHasher::Sha256(<sha2::Sha256 as sha2::Digest>::new()),
            Digest::Sha256Parts(log2) => IdHasher::Sha256Parts(Box::new(PartsHasher {
                log2,
                part: sha2::Digest::new(),
                in_part: 0,
                parts: sha2::Digest::new(),
                ended: 0,
            })),
        }
    }

    /// Feed `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            IdHasher::Blake3(h) => {
                h.update(bytes);
            }
            IdHasher::Sha256(h) => sha2::Digest::update(h, bytes),
            IdHasher::Sha256Parts(h) => h.update(bytes),
        }
    }

    /// The id of the bytes fed.
    pub fn finalize(self) -> ObjectId {
        match self {
            IdHasher::Blake3(h) => ObjectId::from_hash(h.finalize()),
            IdHasher::Sha256(h) => ObjectId::from_sha256(sha2::Digest::finalize(h).into()),
            IdHasher::Sha256Parts(h) => h.finalize(),
        }
    }
}

/// True for an object listed with a modification time less than `grace` ago: on object
/// storage it may be an upload still in flight, never an orphan to delete yet.
pub fn is_young(modified: Option<std::time::SystemTime>, grace: std::time::Duration) -> bool {
    let now = std::time::SystemTime::now();
    modified.is_some_and(|m| now.duration_since(m).unwrap_or_default() < grace)
}

/// The default grace period of unreferenced objects on object storage: well beyond the
/// life of any upload (a stage, then its checkpoint's commit).
pub const DEFAULT_ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// What a writer checks before every request that changes the store: that it still is the
/// writer (the lease's fence, in lease.rs). A trait here, so the stores need not know how
/// the writer was chosen.
pub trait WriteFence: Send + Sync {
    /// Fails (Conflict) once this process may no longer write to the store.
    fn check(&self) -> Result<()>;
    /// How long a request sent right after a successful [`WriteFence::check`] may take
    /// before it is abandoned, so that it ends while what the check saw still holds;
    /// `None`: the client's own timeout.
    fn request_budget(&self) -> Option<std::time::Duration> {
        None
    }
}

/// A copy that [`ObjectStore::stage`] made durable under a private name.
#[derive(Debug)]
pub struct Staged {
    /// The id of the bytes copied (their hash, computed while copying).
    pub id: ObjectId,
    /// Their length in bytes.
    pub size: u64,
    pub(crate) tmp: PathBuf,
    /// The staged copy, still open (a local store): its fsync goes through the descriptor
    /// that wrote it, which a write error is reported to however long the fsync waits.
    pub(crate) file: Option<std::fs::File>,
}

/// Where the bytes live: a local directory (`local.rs`) or S3-compatible object storage
/// (`s3.rs`), both behind the same calls.
pub trait ObjectStore: Send + Sync {
    /// Copy `src` into a private temporary object, hashing it on the way; durable once
    /// published and [`ObjectStore::sync_published`] (a local store starts its writeback
    /// here and fsyncs it there).
    fn stage(&self, src: &Path) -> Result<Staged>;
    /// Stage an object from bytes in memory (file lists).
    fn stage_bytes(&self, bytes: &[u8]) -> Result<Staged>;
    /// Make a staged object visible under its id (durably).
    fn publish(&self, staged: Staged) -> Result<()>;
    /// Make a staged object visible under its id, durable once [`ObjectStore::sync_published`]
    /// returns (a local store defers the fsync of the object and of its directory so that
    /// a checkpoint's objects are made durable together, just before their manifest, and
    /// replaces an object already there by a synced copy; object storage has nothing to
    /// defer). Whoever commits a reference to it calls `sync_published` first.
    fn publish_unsynced(&self, staged: Staged) -> Result<()> {
        self.publish(staged)
    }
    /// Make every object published so far durable (see [`ObjectStore::publish_unsynced`]).
    fn sync_published(&self) -> Result<()> {
        Ok(())
    }
    /// Throw a staged object away (a duplicate, or an aborted checkpoint's).
    fn discard(&self, staged: Staged);
    /// Delete a published object. Deleting a missing object is not an error.
    fn delete(&self, id: &ObjectId) -> Result<()>;
    /// Delete published objects (several per request where the store can); the ids of
    /// those that could not be deleted, with why. Missing objects are not errors.
    fn delete_many(&self, ids: &[ObjectId]) -> Vec<(ObjectId, Error)> {
        let mut failed = Vec::new();
        for id in ids {
            if let Err(e) = self.delete(id) {
                failed.push((*id, e));
            }
            crate::failpoint!("drop::mid-delete");
        }
        failed
    }
    /// Every published object id.
    fn list(&self) -> Result<Vec<ObjectId>>;
    /// Open an object for reading (not verified; see [`ObjectStore::copy_verified`]).
    fn open(&self, id: &ObjectId) -> Result<std::fs::File>;
    /// How many stages (uploads, copies) gain from running at once.
    fn upload_concurrency(&self) -> usize {
        1
    }
    /// Start fetching objects that are about to be read (object storage; a no-op where
    /// reads are local). Errors surface when the object is opened.
    fn prefetch(&self, _ids: &[ObjectId]) {}
    /// A local path to the object, for stores that have one (FUSE passthrough).
    fn local_path(&self, id: &ObjectId) -> Option<PathBuf>;
    /// The object's bucket connection and its key there, for stores on object storage: an
    /// export into the same bucket copies it inside the object store.
    fn remote_object(&self, _id: &ObjectId) -> Option<(std::sync::Arc<s3::Remote>, String)> {
        None
    }
    /// True if [`ObjectStore::stage_copy`] copies objects of `remote` (object storage on
    /// the same endpoint).
    fn copies_from(&self, _remote: &s3::Remote) -> bool {
        false
    }
    /// Have the object store copy `file` into a durable private object without a byte of
    /// it passing through this host, named by the SHA-256 the object store computed as it
    /// copied ([`Digest::Sha256`]). Only where [`ObjectStore::copies_from`] says so.
    fn stage_copy(&self, file: &s3::RemoteFile) -> Result<Staged> {
        Err(Error::Invalid(format!(
            "{}: {} cannot be copied here without reading it",
            self.describe(),
            file.uri()
        )))
    }
    /// Remove leftovers of interrupted stages.
    fn clear_staging(&self) -> Result<usize>;
    /// Every published object id with its last modification time where the store has
    /// objects that can appear outside a stage (object storage: an upload landed by a
    /// daemon that then failed or died); such an object is an orphan only once it is older
    /// than the grace period. `None`: the object was published under the writer's lock.
    fn list_modified(&self) -> Result<Vec<(ObjectId, Option<std::time::SystemTime>)>> {
        Ok(self.list()?.into_iter().map(|id| (id, None)).collect())
    }
    /// True if the store holds at least one object.
    fn has_objects(&self) -> Result<bool>;
    /// Where the objects are, for messages.
    fn describe(&self) -> String;

    /// Copy an object to `dest` (which must not exist), checking size and hash; its
    /// writeback is started, not waited for: the caller fsyncs the file returned (the
    /// descriptor that wrote it, so that a write error is reported to that fsync).
    fn copy_verified(&self, id: &ObjectId, size: u64, dest: &Path) -> Result<std::fs::File> {
        let mut src = self.open(id)?;
        let mut out = crate::fsutil::create_new_private()
            .open(dest)
            .ctx("create", dest)?;
        // A clone where the filesystem shares extents (a local store on btrfs or XFS), or
        // a copy the kernel makes (`copy_file_range`, one filesystem type), checked by
        // reading the copy itself; else a copy checked as it is written.
        let in_kernel =
            crate::fsutil::reflink(&src, &out) || crate::fsutil::copy_in_kernel(&src, &out, dest)?;
        let (hash, copied) = if in_kernel {
            let mut clone = std::fs::File::open(dest).ctx("open", dest)?;
            hash_copy(&mut clone, id.hasher(), None, dest)?
        } else {
            hash_copy(&mut src, id.hasher(), Some(&mut out), dest)?
        };
        check(id, size, hash, copied)?;
        // Not waited for: the caller fsyncs what it wrote once it is all written.
        crate::fsutil::start_writeback(&out);
        Ok(out)
    }

    /// Write an object to `out`, checking size and hash. A mismatch is found once every
    /// byte went out: on an error, what `out` received is not the object.
    fn write_verified(&self, id: &ObjectId, size: u64, out: &mut dyn Write) -> Result<()> {
        let mut src = self.open(id)?;
        let what = PathBuf::from(format!("object {id}"));
        let (hash, copied) = hash_copy(&mut src, id.hasher(), Some(out), &what)?;
        check(id, size, hash, copied)
    }

    /// Read a whole small object into memory, checking its hash; at most `limit` bytes.
    fn read_verified(&self, id: &ObjectId, limit: u64) -> Result<Vec<u8>> {
        let file = self.open(id)?;
        let mut bytes = Vec::new();
        file.take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(format!("read object {id}"), e))?;
        if bytes.len() as u64 > limit {
            return Err(Error::Corrupt(format!(
                "object {id} is larger than {limit} bytes"
            )));
        }
        let mut hasher = id.hasher();
        hasher.update(&bytes);
        check(
            id,
            bytes.len() as u64,
            hasher.finalize(),
            bytes.len() as u64,
        )?;
        Ok(bytes)
    }

    /// Read an object through, checking size and hash.
    fn verify(&self, id: &ObjectId, size: u64) -> Result<()> {
        let mut src = self.open(id)?;
        let (hash, read) = hash_copy(&mut src, id.hasher(), None, Path::new("-"))?;
        check(id, size, hash, read)
    }
}

/// Refuse an object read as `actual` bytes that hash to `hash` unless it is `size` bytes
/// of content `id`.
pub fn check(id: &ObjectId, size: u64, hash: ObjectId, actual: u64) -> Result<()> {
    if actual != size {
        return Err(Error::Corrupt(format!(
            "object {id} has {actual} bytes, expected {size}"
        )));
    }
    if hash != *id {
        return Err(Error::Corrupt(format!(
            "object {id} does not match its checksum (content hashes to {hash})"
        )));
    }
    Ok(())
}

/// Hash a file's content: its object id and size.
pub fn hash_file(path: &Path) -> Result<(ObjectId, u64)> {
    let mut file = std::fs::File::open(path).ctx("open", path)?;
    hash_copy(&mut file, IdHasher::new(Digest::Blake3), None, path)
}

/// Stream `src` into `dest` (if any) while `hasher` hashes it; returns the id of the bytes
/// and their count.
pub(crate) fn hash_copy(
    src: &mut impl Read,
    mut hasher: IdHasher,
    mut dest: Option<&mut dyn Write>,
    what: &Path,
) -> Result<(ObjectId, u64)> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(format!("read for {}", what.display()), e)),
        };
        hasher.update(&buf[..n]);
        if let Some(out) = dest.as_deref_mut() {
            out.write_all(&buf[..n]).ctx("write", what)?;
        }
        total += n as u64;
    }
    Ok((hasher.finalize(), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256(bytes: &[u8]) -> [u8; 32] {
        <sha2::Sha256 as sha2::Digest>::digest(bytes).into()
    }

    #[test]
    fn a_sha256_id_is_named_apart_and_parses_back() {
        let blake = ObjectId::from_hash(blake3::hash(b"x"));
        let sha = ObjectId::from_sha256(sha256(b"x"));
        assert_eq!(blake.to_hex().len(), 64);
        assert!(sha.to_hex().starts_with("sha256-"), "{sha}");
        assert_eq!(sha.to_hex().len(), 64 + "sha256-".len());
        for id in [blake, sha] {
            assert_eq!(id.to_hex().parse::<ObjectId>().unwrap(), id);
            let json = serde_json::to_string(&id).unwrap();
            assert_eq!(serde_json::from_str::<ObjectId>(&json).unwrap(), id);
        }
        // The same 32 bytes under the two hash functions are two ids.
        let same_bytes = ObjectId::from_sha256(*blake.as_bytes());
        assert_ne!(same_bytes, blake);
        for bad in ["sha256-", "sha256-xyz", "sha1-00", "SHA256-00"] {
            assert!(bad.parse::<ObjectId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn each_id_is_checked_with_its_own_hash_function() {
        let bytes = b"an SST the object store copied";
        let sha = ObjectId::from_sha256(sha256(bytes));
        let mut hasher = sha.hasher();
        hasher.update(bytes);
        assert_eq!(hasher.finalize(), sha);
        let (hashed, len) = hash_copy(&mut &bytes[..], sha.hasher(), None, Path::new("-")).unwrap();
        assert!(check(&sha, bytes.len() as u64, hashed, len).is_ok());
        // One byte changed: refused, naming the object.
        let (hashed, len) = hash_copy(
            &mut &b"an SST the object store copieD"[..],
            sha.hasher(),
            None,
            Path::new("-"),
        )
        .unwrap();
        let e = check(&sha, bytes.len() as u64, hashed, len).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Corrupt);
        assert!(e.to_string().contains(&sha.to_hex()), "{e}");
        // A BLAKE3 hasher never vouches for a SHA-256 id of the same bytes.
        let (blake, len) = hash_copy(
            &mut &bytes[..],
            IdHasher::new(Digest::Blake3),
            None,
            Path::new("-"),
        )
        .unwrap();
        assert!(check(&sha, len, blake, len).is_err());
    }

    /// S3's composite checksum of a multipart object, computed the way its documentation
    /// gives it: the SHA-256 of the parts' SHA-256s, concatenated.
    fn composite(bytes: &[u8], part: usize) -> [u8; 32] {
        let mut hashes = Vec::new();
        for piece in bytes.chunks(part) {
            hashes.extend_from_slice(&sha256(piece));
        }
        sha256(&hashes)
    }

    #[test]
    fn a_parts_id_is_the_sha256_of_its_parts_sha256s_however_the_bytes_are_fed() {
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let id = ObjectId::from_sha256_parts(composite(&bytes, 1024), 10).unwrap();
        assert!(id.to_hex().starts_with("sha256p10-"), "{id}");
        assert_eq!(id.to_hex().parse::<ObjectId>().unwrap(), id);
        // Fed whole, byte by byte, or in pieces across part boundaries: the same id.
        for step in [bytes.len(), 1, 7, 1024, 1500] {
            let mut hasher = id.hasher();
            for piece in bytes.chunks(step) {
                hasher.update(piece);
            }
            assert_eq!(hasher.finalize(), id, "fed {step} bytes at a time");
        }
        // An exact multiple of the part size has no empty last part.
        let even = &bytes[..4096];
        let even_id = ObjectId::from_sha256_parts(composite(even, 1024), 10).unwrap();
        let mut hasher = even_id.hasher();
        hasher.update(even);
        assert_eq!(hasher.finalize(), even_id);
        // Other part sizes, other bytes, or the whole SHA-256: other ids.
        let mut hasher = ObjectId::from_sha256_parts([0; 32], 11).unwrap().hasher();
        hasher.update(&bytes);
        assert_ne!(hasher.finalize(), id);
        let mut changed = bytes.clone();
        changed[4999] ^= 1;
        let mut hasher = id.hasher();
        hasher.update(&changed);
        assert_ne!(hasher.finalize(), id);
        assert_ne!(ObjectId::from_sha256(*id.as_bytes()), id);
        assert_eq!(ObjectId::from_sha256_parts([0; 32], 9), None);
        assert_eq!(ObjectId::from_sha256_parts([0; 32], 33), None);
        let hex = blake3::Hash::from_bytes([0; 32]).to_hex();
        for bad in [
            format!("sha256p-{hex}"),
            format!("sha256p9-{hex}"),
            format!("sha256p33-{hex}"),
            format!("sha256p030-{hex}"),
            format!("sha256p+30-{hex}"),
            format!("sha256p30{hex}"),
            "sha256p30-00".to_string(),
        ] {
            assert!(bad.parse::<ObjectId>().is_err(), "{bad}");
        }
    }
}
