//! What a checkpoint manifest says and how it is stored: the file entries, backend
//! snapshots and statistics of one checkpoint, the format history of the catalog's records
//! ([`FORMAT`]), and their checksummed JSON ([`seal`]). Manifests are untrusted input when
//! read: [`Manifest::validate`] checks what they claim before anything uses it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::lists::{self, FileList, ListReader};
use super::shared::{Chain, Files};
use crate::error::{Error, IoContext, Result};
use crate::names::BackendName;
use crate::store::chunks::Chunks;
use crate::store::{ObjectId, ObjectStore};

/// The format written. 10: an object may be named by the SHA-256 of its parts' SHA-256s
/// (`sha256p<n>-<hex>`, a copy in parts of an object over 1 GiB); format 9 readers refuse
/// such an id. 9: an object may be named by the SHA-256 the object store computed
/// when it copied the bytes from a source (`sha256-<hex>`, see [`crate::store::Digest`]);
/// format 8 readers refuse such an id. 8: file-list entries of SSTs record their column family (format 7
/// readers refuse an entry with an unknown field); 7: imported backends (`ckptfs import`): `ckptfs.json` lists them as
/// external and file lists record where each imported file was read from; 6: on object storage, `ckptfs.json` carries the writer's epoch, the
/// pending and the void checkpoints (manifests unchanged; format 5 readers would count a
/// void manifest); 5: WAL files stored as chunks (of any size: format 4 readers
/// refused chunked files over 64 MiB) and WAL figures in the stats; 4: file lists may store
/// append-only files as chunks; 3: manifests name one stored file list per backend; 2:
/// manifests and `ckptfs.json` carry a checksum.
pub const FORMAT: u32 = 10;
/// The oldest format still read: format 1 files have no checksum.
pub const OLDEST_FORMAT: u32 = 1;

/// Serialize with a `checksum` field: the BLAKE3 hash of the value's compact JSON (fields in
/// declaration order). A flipped digit in a size, an object id or `retain` is then caught
/// at load instead of acted upon (a changed object id would make its object an orphan).
pub(super) fn seal<T: Serialize>(value: &T) -> Vec<u8> {
    let canonical = serde_json::to_vec(value).expect("serializes");
    let mut tree = serde_json::to_value(value).expect("serializes");
    if let Some(fields) = tree.as_object_mut() {
        fields.insert(
            "checksum".into(),
            blake3::hash(&canonical).to_hex().to_string().into(),
        );
    }
    let mut bytes = serde_json::to_vec_pretty(&tree).expect("serializes");
    bytes.push(b'\n');
    bytes
}

/// Parse what [`seal`] wrote; returns whether a checksum was present (and it matched).
pub(super) fn unseal<T: Serialize + serde::de::DeserializeOwned>(
    bytes: &[u8],
    path: &str,
) -> Result<(T, bool)> {
    let corrupt = |why: String| Error::Corrupt(format!("{path} cannot be parsed: {why}"));
    let mut tree: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    let checksum = match tree.as_object_mut() {
        Some(fields) => fields.remove("checksum"),
        None => return Err(corrupt("not a JSON object".into())),
    };
    let value: T = serde_json::from_value(tree).map_err(|e| corrupt(e.to_string()))?;
    let Some(checksum) = checksum else {
        return Ok((value, false));
    };
    let canonical = serde_json::to_vec(&value).expect("serializes");
    if checksum.as_str() != Some(blake3::hash(&canonical).to_hex().as_str()) {
        return Err(Error::Corrupt(format!(
            "{path} does not match its checksum (damaged or edited)"
        )));
    }
    Ok((value, true))
}

/// Check a format number read from disk, and that a checksum is there when it must be.
pub(super) fn check_format(format: u32, sealed: bool) -> Result<()> {
    if !(OLDEST_FORMAT..=FORMAT).contains(&format) {
        return Err(Error::Invalid(format!(
            "format {format} (this ckptfs reads formats {OLDEST_FORMAT} to {FORMAT})"
        )));
    }
    if format >= 2 && !sealed {
        return Err(Error::Invalid(format!(
            "format {format} without its checksum"
        )));
    }
    Ok(())
}

/// One file of a backend's checkpoint: its RocksDB name, its content and how that is
/// stored. Entries are immutable and shared (`Arc`) between the checkpoints that list the
/// same file. A daemon holds one per stored file: the optional parts are boxed (`Box<str>`,
/// no spare capacity; chunks behind a pointer): 112 bytes instead of 152.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// The original RocksDB file name, e.g. `000012.sst` or `MANIFEST-000005`.
    pub name: String,
    /// The BLAKE3 hash of the file's content: the object that holds it, unless it is
    /// stored as chunks.
    pub object: ObjectId,
    /// The file's length in bytes.
    pub size: u64,
    /// An append-only file stored as chunks (format 4; WAL files from format 5): only the
    /// chunks are objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Box<Chunks>>,
    /// An imported file (format 7): where it was read from, as `device:inode:size:mtime`
    /// of the file in the imported directory. The backend's next import re-references a
    /// file found under the same source and name without reading it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Box<str>>,
    /// An SST's RocksDB column family (format 8; for Flink, the state's name), read once
    /// when the file entered a checkpoint: from RocksDB's live file metadata for a hosted
    /// backend, from the file's table properties for an imported one. `None`: not an SST,
    /// or stored by an older ckptfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column_family: Option<Box<str>>,
}

impl FileEntry {
    /// A file stored whole.
    pub fn whole(name: impl Into<String>, object: ObjectId, size: u64) -> Self {
        FileEntry {
            name: name.into(),
            object,
            size,
            chunks: None,
            source: None,
            column_family: None,
        }
    }

    /// The stored objects that hold the file's content, with their sizes.
    pub fn stored(&self) -> impl Iterator<Item = (ObjectId, u64)> + '_ {
        let whole = self.chunks.is_none().then_some((self.object, self.size));
        whole
            .into_iter()
            .chain(self.chunks.iter().flat_map(|c| c.with_lengths(self.size)))
    }

    /// Copy the file to `dest` (which must not exist), verified; not fsync'd yet: the
    /// caller fsyncs the file returned (see [`ObjectStore::copy_verified`]).
    pub fn copy_verified(&self, store: &dyn ObjectStore, dest: &Path) -> Result<std::fs::File> {
        match &self.chunks {
            None => store.copy_verified(&self.object, self.size, dest),
            Some(_) => {
                let file = crate::fsutil::create_new_private()
                    .open(dest)
                    .ctx("create", dest)?;
                let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
                self.write_verified(store, &mut out)?;
                let file = out
                    .into_inner()
                    .map_err(|e| Error::io(format!("write {}", dest.display()), e.into_error()))?;
                crate::fsutil::start_writeback(&file);
                Ok(file)
            }
        }
    }

    /// Write the file's content to `out`, read from its object or assembled from its
    /// chunks, checking every hash. A mismatch is found once every byte went out: on an
    /// error, what `out` received is not the file.
    pub fn write_verified(
        &self,
        store: &dyn ObjectStore,
        out: &mut dyn std::io::Write,
    ) -> Result<()> {
        match &self.chunks {
            None => store.write_verified(&self.object, self.size, out),
            Some(chunks) => chunks.copy_to(store, &self.object, self.size, out),
        }
    }
}

/// One backend's state in a checkpoint: the files of its RocksDB directory at that point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSnapshot {
    /// The backend.
    pub name: BackendName,
    /// Identity of the local RocksDB instance that produced the files: file names are only
    /// meaningful within one lineage (a restore starts a new one).
    pub lineage: String,
    /// The files, sorted by name; entries (and blocks of them) are shared between the
    /// checkpoints that list them.
    pub files: Files,
    /// The stored file lists these files are read from, newest first (see [`lists`]); empty
    /// when the manifest lists them inline (formats 1 and 2, until migrated).
    pub lists: Chain,
}

impl BackendSnapshot {
    /// Imported (`ckptfs import`), not hosted: its files record where they were read from.
    pub fn is_imported(&self) -> bool {
        self.files.iter().any(|f| f.source.is_some())
    }

    /// A snapshot of `files` (any order) not stored as a list yet.
    pub fn inline(name: BackendName, lineage: String, files: Vec<FileEntry>) -> Self {
        BackendSnapshot {
            name,
            lineage,
            files: lists::sorted(files.into_iter().map(Arc::new).collect(), None),
            lists: Chain::default(),
        }
    }

    /// The files and list chain, as the base of the backend's next list.
    pub fn file_list(&self) -> FileList {
        FileList {
            files: self.files.clone(),
            chain: self.lists.clone(),
        }
    }
}

/// The figures of one checkpoint, over all its backends, as its manifest records them.
/// The five fields from `bytes_uploaded_append_only` to `bytes_uploaded_materialization`
/// are left out of the JSON when zero, so that manifests written before them keep their
/// checksums: a missing one reads as zero.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Files the checkpoint names.
    pub files_total: u64,
    /// Files not re-referenced by name: their content was stored, or found stored already
    /// (by its hash).
    pub files_new: u64,
    /// Files re-referenced without being read: the same SST as the previous confirmed
    /// checkpoint of the lineage, a file kept from a materialization or matched by its
    /// import source, or a file of a backend carried over unchanged.
    pub files_reused: u64,
    /// Bytes of the files the checkpoint names (file lists not counted).
    pub bytes_total: u64,
    /// Bytes this checkpoint stored as new objects: files, chunks and file lists (what a
    /// background materialization stored before is in `bytes_uploaded_materialization`).
    pub bytes_uploaded: u64,
    /// Bytes of the SST (shared) files that were not re-referenced from the previous
    /// confirmed checkpoint, whether uploaded or found already stored.
    pub bytes_new_sst: u64,
    /// Bytes of append-only files (MANIFEST) stored as new chunks (format 4; skipped when
    /// zero so that older manifests keep their checksums).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_uploaded_append_only: u64,
    /// Bytes of WAL files the checkpoint names (`wal` mode; the open WAL in `flush` mode).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_wal: u64,
    /// Bytes of WAL files stored as new chunks.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_uploaded_wal: u64,
    /// Backends whose SST set this checkpoint adopted (`wal` mode: materializations).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub backends_materialized: u64,
    /// Bytes a background materialization this checkpoint adopted stored before it began
    /// (not in `bytes_uploaded`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_uploaded_materialization: u64,
    /// Of `bytes_uploaded`, the bytes the object store copied from the source itself
    /// (format 9): no byte of them passed through ckptfs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_copied: u64,
    /// Microseconds of the synchronous phase ([`crate::Engine::begin`]), after which
    /// writers continue.
    pub sync_micros: u64,
    /// Microseconds of the asynchronous phase up to the commit: storing the files and file
    /// lists.
    pub async_micros: u64,
}

/// One committed checkpoint, as read from (or about to be written to) the catalog: every
/// backend's files and the checkpoint's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The format of the file this was read from (or [`FORMAT`] for one about to be written).
    pub format: u32,
    /// The checkpoint's id, reserved from the store's `next_checkpoint`: a later checkpoint
    /// has a larger id.
    pub id: u64,
    /// When the checkpoint began (before its synchronous phase), in milliseconds since the
    /// Unix epoch.
    pub started_unix_ms: u64,
    /// When its files were stored, just before the commit, in milliseconds since the Unix
    /// epoch.
    pub completed_unix_ms: u64,
    /// One snapshot per backend, sorted by name.
    pub backends: Vec<BackendSnapshot>,
    /// The checkpoint's figures.
    pub stats: CheckpointStats,
    /// Imported from a Flink checkpoint (`ckptfs import-flink`): which.
    pub flink: Option<FlinkLabel>,
}

/// The Flink checkpoint a ckptfs checkpoint was imported from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlinkLabel {
    /// The job id (32 hex).
    pub job: String,
    /// The Flink checkpoint's id (its `chk-<id>` directory).
    pub checkpoint: u64,
    /// The name the job gave each keyed operator, by its directory (`<operator>` of its
    /// backends: the uid, escaped, or the operator id), as `_metadata` version 5 on records
    /// it; operators without a name are left out. Empty (and not written) for imports by
    /// builds before it: such manifests keep their bytes and checksums. Part of format 8,
    /// which no release wrote without it (a reader drops fields it does not know, so its
    /// recomputed checksum would differ: a field added to a released format needs a new
    /// one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub operators: BTreeMap<String, String>,
    /// When Flink completed it (its `_metadata` written), in milliseconds since the Unix
    /// epoch: the time retention policies go by. Absent where the source did not say, and
    /// for imports by builds before it (format 8 too, under the same rule as `operators`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_unix_ms: Option<u64>,
}

impl FlinkLabel {
    /// The name of operator directory `operator`, if the job named it.
    pub fn operator_name(&self, operator: &str) -> Option<&str> {
        self.operators.get(operator).map(String::as_str)
    }
}

/// A manifest as stored: format 3 names a list object per backend, formats 1 and 2 list the
/// files inline (and format 3 may too: what was not migrated yet).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredManifest {
    pub(super) format: u32,
    id: u64,
    started_unix_ms: u64,
    completed_unix_ms: u64,
    pub(super) backends: Vec<StoredBackend>,
    stats: CheckpointStats,
    // Last and skipped when absent: the canonical bytes of older manifests are unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flink: Option<FlinkLabel>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredBackend {
    name: BackendName,
    lineage: String,
    // Field order and skipping keep the canonical bytes of format 1 and 2 manifests (which
    // had `files` only) unchanged, so their checksums still verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    files: Option<Vec<FileEntry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) list: Option<ObjectId>,
}

pub(super) fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Check that a file name read from a store is one plain path component: 1 to 255 bytes
/// of ASCII letters, digits, `-`, `_` and `.` (every name RocksDB writes), not `.` or `..`.
/// Manifests are untrusted input: a name like `../../x` must never reach a path join.
pub fn validate_file_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(80).collect();
        Err(Error::Invalid(format!("invalid file name {shown:?}")))
    }
}

impl Manifest {
    /// The checkpoint's own time, in milliseconds since the Unix epoch: Flink's checkpoint
    /// time for one imported from Flink (when its `_metadata` was written, as the source
    /// said: never later than the import's commit), else when it began. Retention policies
    /// go by it ([`crate::policy`]).
    pub fn time_ms(&self) -> u64 {
        self.flink
            .as_ref()
            .and_then(|f| f.time_unix_ms)
            .map_or(self.started_unix_ms, |t| t.min(self.completed_unix_ms))
    }

    /// Check everything a manifest read from disk claims before any of it is used: its
    /// format, one entry per backend, and per backend unique, plain file names; an object
    /// has one size.
    pub fn validate(&self) -> Result<()> {
        let mut backends = BTreeSet::new();
        let mut sizes: Vec<(ObjectId, u64)> = Vec::new();
        for backend in &self.backends {
            if !backends.insert(&backend.name) {
                return Err(Error::Invalid(format!(
                    "backend {} appears twice",
                    backend.name
                )));
            }
            // Files are kept sorted by name: a name that appears twice is next to itself.
            let mut names: Vec<&str> = backend.files.iter().map(|f| f.name.as_str()).collect();
            names.sort_unstable();
            if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
                return Err(Error::Invalid(format!(
                    "backend {}: file {} appears twice",
                    backend.name, twice[0]
                )));
            }
            for file in backend.files.iter() {
                validate_file_name(&file.name)
                    .map_err(|e| Error::Invalid(format!("backend {}: {e}", backend.name)))?;
                if let Some(chunks) = &file.chunks {
                    chunks
                        .validate(file.size)
                        .map_err(|e| Error::Invalid(format!("file {}: {e}", file.name)))?;
                }
                sizes.extend(file.stored());
            }
        }
        sizes.sort_unstable();
        sizes.dedup();
        if let Some(two) = sizes.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::Invalid(format!(
                "object {} is listed with two sizes",
                two[0].0
            )));
        }
        Ok(())
    }

    /// Every object the checkpoint references: its files' and its file lists'.
    pub fn objects(&self) -> BTreeSet<ObjectId> {
        self.object_refs().collect()
    }

    /// [`Manifest::objects`] as they are listed (an object may come more than once).
    pub fn object_refs(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.backends.iter().flat_map(|b| {
            b.files
                .iter()
                .flat_map(|f| f.stored().map(|(id, _)| id))
                .chain(b.lists.iter())
        })
    }

    /// The stored objects of its files (not its lists), with their sizes.
    pub fn stored_sizes(&self) -> impl Iterator<Item = (ObjectId, u64)> + '_ {
        self.backends
            .iter()
            .flat_map(|b| b.files.iter().flat_map(|f| f.stored()))
    }

    /// True if some backend's files are listed inline (a format 1 or 2 manifest).
    pub fn has_inline_lists(&self) -> bool {
        self.backends.iter().any(|b| b.lists.is_empty())
    }

    pub(super) fn to_stored(&self) -> StoredManifest {
        StoredManifest {
            format: FORMAT,
            id: self.id,
            started_unix_ms: self.started_unix_ms,
            completed_unix_ms: self.completed_unix_ms,
            backends: self
                .backends
                .iter()
                .map(|b| StoredBackend {
                    name: b.name.clone(),
                    lineage: b.lineage.clone(),
                    files: b
                        .lists
                        .is_empty()
                        .then(|| b.files.iter().map(|f| (**f).clone()).collect()),
                    list: b.lists.first(),
                })
                .collect(),
            stats: self.stats.clone(),
            flink: self.flink.clone(),
        }
    }

    pub(super) fn from_stored(stored: StoredManifest, reader: &mut ListReader) -> Result<Manifest> {
        let mut backends = Vec::with_capacity(stored.backends.len());
        for b in stored.backends {
            let snapshot = match (b.files, b.list) {
                (Some(files), None) => {
                    let files = files.into_iter().map(|f| reader.intern(f)).collect();
                    BackendSnapshot {
                        name: b.name,
                        lineage: b.lineage,
                        files: lists::sorted(files, None),
                        lists: Chain::default(),
                    }
                }
                (None, Some(list)) if stored.format >= 3 => {
                    let resolved = reader
                        .resolve(list)
                        .map_err(|e| Error::Corrupt(format!("backend {}: {e}", b.name)))?;
                    BackendSnapshot {
                        name: b.name,
                        lineage: b.lineage,
                        files: resolved.files,
                        lists: resolved.chain,
                    }
                }
                _ => {
                    return Err(Error::Invalid(format!(
                        "backend {} must have either `files` or (format 3) `list`",
                        b.name
                    )))
                }
            };
            backends.push(snapshot);
        }
        Ok(Manifest {
            format: stored.format,
            id: stored.id,
            started_unix_ms: stored.started_unix_ms,
            completed_unix_ms: stored.completed_unix_ms,
            backends,
            stats: stored.stats,
            flink: stored.flink,
        })
    }

    /// The snapshot of backend `name`, if the checkpoint has one.
    pub fn backend(&self, name: &BackendName) -> Option<&BackendSnapshot> {
        self.backends.iter().find(|b| &b.name == name)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A manifest of checkpoint `id` with one backend of one file.
    pub(crate) fn sample(id: u64) -> Manifest {
        Manifest {
            format: FORMAT,
            id,
            started_unix_ms: 1,
            completed_unix_ms: 2,
            backends: vec![BackendSnapshot::inline(
                "op/0".parse().unwrap(),
                "l1".into(),
                vec![FileEntry::whole(
                    "000007.sst",
                    ObjectId::from_hash(blake3::hash(b"x")),
                    1,
                )],
            )],
            stats: CheckpointStats::default(),
            flink: None,
        }
    }

    /// What a manifest read from a store claims is checked: unique backends, unique plain
    /// file names per backend, one size per object, chunk lists that fit their file.
    /// A daemon holds one entry per stored file (a million with a million objects): its
    /// optional parts stay behind pointers.
    #[test]
    fn an_entry_stays_small() {
        assert!(
            std::mem::size_of::<FileEntry>() <= 112,
            "{} bytes",
            std::mem::size_of::<FileEntry>()
        );
    }

    #[test]
    fn validation_refuses_duplicates_and_inconsistent_sizes() {
        sample(1).validate().unwrap();
        let x = ObjectId::from_hash(blake3::hash(b"x"));
        let with_files = |files: Vec<FileEntry>| {
            let mut m = sample(1);
            m.backends[0] = BackendSnapshot::inline("op/0".parse().unwrap(), "l1".into(), files);
            m
        };
        let twice = with_files(vec![
            FileEntry::whole("000007.sst", x, 1),
            FileEntry::whole("000007.sst", x, 1),
        ]);
        assert!(twice
            .validate()
            .unwrap_err()
            .to_string()
            .contains("appears twice"));
        let sizes = with_files(vec![
            FileEntry::whole("000007.sst", x, 1),
            FileEntry::whole("000008.sst", x, 2),
        ]);
        assert!(sizes
            .validate()
            .unwrap_err()
            .to_string()
            .contains("two sizes"));
        let shared = with_files(vec![
            FileEntry::whole("000007.sst", x, 1),
            FileEntry::whole("000008.sst", x, 1),
        ]);
        shared.validate().unwrap();
        let mut chunked = FileEntry::whole("MANIFEST-000005", x, 10);
        chunked.chunks = Some(Box::new(Chunks {
            size: 4,
            ids: vec![x, x],
        }));
        assert!(with_files(vec![chunked]).validate().is_err());
        let bad_name = with_files(vec![FileEntry::whole("../etc", x, 1)]);
        assert!(bad_name.validate().is_err());
        let mut backends = sample(1);
        backends.backends.push(backends.backends[0].clone());
        assert!(backends
            .validate()
            .unwrap_err()
            .to_string()
            .contains("appears twice"));
    }
}
