//! A RocksDB checkpoint directory as the source of a backend's state (`ckptfs import`).
//!
//! Any RocksDB application can make a consistent copy of its database in one call (the
//! Checkpoint API: `Checkpoint::CreateCheckpoint`, RocksJava `Checkpoint.createCheckpoint`,
//! `ldb checkpoint`). Importing such a directory makes it one backend of a new checkpoint:
//! [`scan`] checks that it is a RocksDB directory nobody writes to and lists its files, each
//! with its *source* (device, inode, size and modification time); the engine then stores
//! them through the one ingest path, re-referencing a file whose source and name are those
//! of the backend's previous import without reading it (RocksDB hard-links unchanged SSTs
//! into every checkpoint directory, so consecutive checkpoints share inodes).
//!
//! What is refused, before anything changes: a path that is not a directory, a directory
//! without `CURRENT` or whose `CURRENT` names no MANIFEST in it, a name RocksDB does not
//! write, a symbolic link or a subdirectory inside, and a database a running RocksDB holds
//! open (its `LOCK` file is locked). A file that changes while it is imported fails the
//! import ([`ScannedFile::check_unchanged`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, IoContext, Result};
use crate::names::BackendName;
use crate::source::{EntryKind, LocalTree, SourceFile, Tree, MAX_CURRENT_BYTES};

/// One directory to import as one backend's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportDir {
    /// The backend whose state it becomes.
    pub backend: BackendName,
    /// The RocksDB checkpoint directory.
    pub dir: PathBuf,
}

/// A directory checked and listed: what an import will store.
#[derive(Debug, Clone)]
pub struct Scanned {
    /// The backend whose state it becomes.
    pub backend: BackendName,
    /// The directory's files, sorted by name.
    pub files: Vec<ScannedFile>,
}

impl Scanned {
    /// The bytes of all its files, as listed.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// A regular file of an imported directory, as it was when listed.
#[derive(Debug, Clone)]
pub struct ScannedFile {
    /// Its name in the directory, and in the backend's snapshot.
    pub name: String,
    /// Where the engine reads it: a source file's descriptor (`/proc/self/fd/N`), or a
    /// file ckptfs wrote itself into a staging directory; empty for [`ScannedFile::stored`].
    pub path: PathBuf,
    /// Its length in bytes when listed.
    pub size: u64,
    /// What the file's entry records as where it came from, by which the backend's next
    /// import re-references it unread (`None`: a file ckptfs wrote itself, read each time).
    pub source: Option<String>,
    /// An SST's column family, read from its properties when listed (`None`: not an SST,
    /// none recorded, or re-referenced: the earlier entry's is kept).
    pub column_family: Option<String>,
    origin: Origin,
}

/// Where a listed file's bytes are.
#[derive(Debug, Clone)]
enum Origin {
    /// A source file, held open from its listing until the import is stored: the bytes
    /// read are those of the file listed, whatever is at its path meanwhile.
    Held(Arc<SourceFile>),
    /// A file ckptfs wrote into its staging directory, with its stamp when listed.
    Staged(String),
    /// In the store already (see [`ScannedFile::stored`]).
    Stored,
    /// On object storage, to be copied by the object store itself (see
    /// [`ScannedFile::remote`]).
    Remote(crate::store::s3::RemoteFile),
}

impl ScannedFile {
    /// A file on object storage under an immutable name (`source`) that the backend's
    /// newest snapshot already holds under this name, source and size: re-referenced, never
    /// fetched. It has no local path (an import that cannot re-reference it fails, see
    /// [`ScannedFile::is_stored`]) and nothing local to check.
    pub fn stored(name: &str, source: String, size: u64) -> Self {
        ScannedFile {
            name: name.to_string(),
            path: PathBuf::new(),
            size,
            source: Some(source),
            column_family: None,
            origin: Origin::Stored,
        }
    }

    /// A source file held open, imported as `name`, with its source and column family
    /// ([`source_of`]). One file named several times is held once (the `Arc` shared).
    pub fn held(name: &str, file: Arc<SourceFile>, (source, column_family): Origins) -> Self {
        ScannedFile {
            name: name.to_string(),
            path: file.fd_path(),
            size: file.stamp.size,
            source: Some(source),
            column_family,
            origin: Origin::Held(file),
        }
    }

    /// A file on object storage that the store copies without reading it, imported as
    /// `name`, recorded under `source` (its immutable name) with its column family (read
    /// from its properties by ranged reads). Its path is its URI: never opened, it keys
    /// the file in an import (one object named twice is copied once).
    pub fn remote(
        name: &str,
        file: crate::store::s3::RemoteFile,
        source: Option<String>,
        column_family: Option<String>,
    ) -> Self {
        ScannedFile {
            name: name.to_string(),
            path: PathBuf::from(file.uri()),
            size: file.size,
            source,
            column_family,
            origin: Origin::Remote(file),
        }
    }

    /// The object the store copies, for a file made by [`ScannedFile::remote`].
    pub fn remote_file(&self) -> Option<&crate::store::s3::RemoteFile> {
        match &self.origin {
            Origin::Remote(file) => Some(file),
            _ => None,
        }
    }

    /// A file ckptfs wrote itself at `path` (inlined or downloaded), imported as `name`;
    /// its source is `source` (what it was made from) or else its stamp.
    pub fn staged(name: &str, path: PathBuf, source: Option<String>) -> Result<Self> {
        let meta = std::fs::symlink_metadata(&path).ctx("stat", &path)?;
        let stamp = crate::source::local::Stamp::of(&meta).to_string();
        let column_family = if name.ends_with(".sst") {
            crate::source::sst::properties_at(&path)?.column_family
        } else {
            None
        };
        Ok(ScannedFile {
            name: name.to_string(),
            size: meta.len(),
            source: source.or_else(|| Some(stamp.clone())),
            column_family,
            origin: Origin::Staged(stamp),
            path,
        })
    }

    /// Made by [`ScannedFile::stored`]: there are no local bytes to read.
    pub fn is_stored(&self) -> bool {
        matches!(self.origin, Origin::Stored)
    }

    /// Where it was found, for messages.
    pub fn shown(&self) -> String {
        match &self.origin {
            Origin::Held(file) => file.path.display().to_string(),
            _ => self
                .source
                .clone()
                .unwrap_or_else(|| self.path.display().to_string()),
        }
    }

    /// The source file held open, if it is one.
    pub fn source_file(&self) -> Option<&SourceFile> {
        match &self.origin {
            Origin::Held(file) => Some(file),
            _ => None,
        }
    }

    /// Fail if the file is no longer what was listed (written since; a staged file also
    /// if replaced or removed).
    pub fn check_unchanged(&self) -> Result<()> {
        match &self.origin {
            // Copied only while it was the version listed (`If-Match` on its ETag).
            Origin::Stored | Origin::Remote(_) => Ok(()),
            Origin::Held(file) => file.check_unchanged(),
            Origin::Staged(stamp) => {
                let now = std::fs::symlink_metadata(&self.path)
                    .map(|m| crate::source::local::Stamp::of(&m).to_string())
                    .unwrap_or_default();
                if &now != stamp {
                    return Err(Error::Invalid(format!(
                        "{} changed while it was imported; nothing was imported",
                        self.path.display()
                    )));
                }
                Ok(())
            }
        }
    }
}

/// What an imported local file's entry records as its source: an SST's identity (its
/// database and session ids and file number, read from its table properties:
/// [`crate::source::sst`]), by which the next import re-references it unread; for any
/// other file, or an SST without one, its stamp (device, inode, size, mtime), which tells
/// where it was read from but never makes a file reusable unread
/// (`checkpoint::reusable_by_source`). With it, an SST's column family, read from the same
/// properties block.
pub fn source_of(name: &str, file: &SourceFile) -> Result<Origins> {
    if name.ends_with(".sst") {
        let props = crate::source::sst::properties(file)?;
        let source = match props.identity {
            Some(identity) => identity.to_string(),
            None => file.stamp.to_string(),
        };
        return Ok((source, props.column_family));
    }
    Ok((file.stamp.to_string(), None))
}

/// What [`source_of`] reads: the source recorded, and an SST's column family.
pub type Origins = (String, Option<String>);

/// Every name RocksDB writes into a database directory, and so into a checkpoint of it.
pub fn is_rocksdb_file_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if matches!(name, "CURRENT" | "IDENTITY" | "LOCK" | "LOG") {
        return true;
    }
    if let Some(n) = name.strip_prefix("LOG.old.") {
        return digits(n);
    }
    if let Some(n) = name
        .strip_prefix("MANIFEST-")
        .or_else(|| name.strip_prefix("OPTIONS-"))
    {
        return digits(n);
    }
    match name.rsplit_once('.') {
        Some((n, "sst" | "log" | "blob" | "ldb")) => digits(n),
        _ => false,
    }
}

/// Check that `dir` is a RocksDB directory that can be imported as `backend`, and list it.
/// Every file is opened here, through the directory's descriptor and without following
/// links ([`crate::source::local`]), and held open: what the import stores is what was
/// listed, whatever is renamed or swapped in afterwards.
pub fn scan(backend: &BackendName, dir: &Path) -> Result<Scanned> {
    let meta = std::fs::metadata(dir).ctx("import", dir)?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is not a directory: import a RocksDB checkpoint directory",
            dir.display()
        )));
    }
    let tree = LocalTree::open(dir)?;
    let shown = tree.path().to_path_buf();
    let entries = tree.list("")?;
    for entry in &entries {
        let path = shown.join(&entry.name);
        match entry.kind {
            EntryKind::Dir => {
                return Err(Error::Invalid(format!(
                    "{} is a directory: a RocksDB checkpoint directory holds files only; \
                     nothing was imported",
                    path.display()
                )))
            }
            // Refused with the reason (a link: ELOOP; a FIFO, socket or device: EINVAL),
            // without being opened for reading.
            EntryKind::Other => {
                tree.open_file(&entry.name)?;
                return Err(Error::Invalid(format!(
                    "{} is not a regular file; nothing was imported",
                    path.display()
                )));
            }
            EntryKind::File => {}
        }
        if !is_rocksdb_file_name(&entry.name) {
            return Err(Error::Invalid(format!(
                "{} is not a file RocksDB writes (CURRENT, MANIFEST-N, OPTIONS-N, N.sst, \
                 N.log, N.blob, IDENTITY, LOCK, LOG): is {} a RocksDB directory? Nothing was \
                 imported",
                path.display(),
                shown.display()
            )));
        }
    }
    if !entries.iter().any(|e| e.name == "CURRENT") {
        return Err(Error::Invalid(format!(
            "{} is not a RocksDB directory: it has no CURRENT file; nothing was imported",
            shown.display()
        )));
    }
    // Asked before any file is opened for reading (closing one would drop this process's
    // own locks on it).
    if let Some((devs, ino)) = tree.lock_identity("LOCK")? {
        if is_locked(&devs, ino)? {
            return Err(Error::Invalid(format!(
                "{} is open in a running RocksDB (its LOCK file is locked): import a \
                 checkpoint of it instead (RocksDB's Checkpoint API, `ldb checkpoint`); \
                 nothing was imported",
                shown.display()
            )));
        }
    }
    crate::failpoint!("import::after-listing");
    let mut files = Vec::new();
    for entry in &entries {
        // Deleted since the listing: the directory is being written to.
        let file = tree.open_file(&entry.name)?.ok_or_else(|| {
            Error::Invalid(format!(
                "{} disappeared while it was imported; nothing was imported (import a \
                 checkpoint directory, which nobody writes to)",
                shown.join(&entry.name).display()
            ))
        })?;
        let source = source_of(&entry.name, &file)?;
        files.push(ScannedFile::held(&entry.name, Arc::new(file), source));
    }
    let current = files
        .iter()
        .find(|f| f.name == "CURRENT")
        .and_then(ScannedFile::source_file)
        .expect("CURRENT is listed and held");
    let named = current.read_all(MAX_CURRENT_BYTES)?;
    let named = String::from_utf8_lossy(&named);
    // RocksDB writes the name and a newline, and refuses a CURRENT without it.
    let Some(manifest) = named.strip_suffix('\n') else {
        return Err(Error::Invalid(format!(
            "{} is not a complete RocksDB directory: its CURRENT does not end in a newline \
             (RocksDB refuses such a CURRENT); nothing was imported",
            shown.display()
        )));
    };
    if !is_rocksdb_file_name(manifest)
        || !manifest.starts_with("MANIFEST-")
        || !files.iter().any(|f| f.name == manifest)
    {
        let shown_name: String = manifest.chars().take(80).collect();
        return Err(Error::Invalid(format!(
            "{} is not a complete RocksDB directory: CURRENT names {shown_name:?}, which is \
             not in it; nothing was imported",
            shown.display()
        )));
    }
    Ok(Scanned {
        backend: backend.clone(),
        files,
    })
}

/// True if a process holds a lock on the file `ino` of one of the devices `devs` (RocksDB
/// locks its `LOCK` file with `fcntl`), as `/proc/locks` lists them by device and inode.
/// `/proc/locks` names the device of the filesystem's superblock, which is not always the
/// file's `st_dev` (a btrfs subvolume has a device of its own): `devs` holds both (see
/// [`crate::source::LocalTree::lock_identity`]). The file is not opened: closing a
/// descriptor of it would drop every lock this process holds on it (the daemon's own
/// databases' among them).
fn is_locked(devs: &[u64], ino: u64) -> Result<bool> {
    let wanted: Vec<String> = devs
        .iter()
        .map(|dev| format!("{:02x}:{:02x}:{ino}", libc::major(*dev), libc::minor(*dev)))
        .collect();
    let locks = std::fs::read_to_string("/proc/locks").ctx("read", Path::new("/proc/locks"))?;
    Ok(locks
        .lines()
        .any(|line| wanted.iter().any(|w| holds(line, w))))
}

/// Whether a line of `/proc/locks` (`1: POSIX ADVISORY WRITE 4242 08:01:1234 0 EOF`, or
/// with `->` for a waiter) is a lock on the file `MAJ:MIN:INODE`.
fn holds(line: &str, wanted: &str) -> bool {
    !line.contains("->") && line.split_whitespace().any(|field| field == wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> BackendName {
        "app/0".parse().unwrap()
    }

    fn rocksdb_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("CURRENT"), "MANIFEST-000005\n").unwrap();
        std::fs::write(dir.path().join("MANIFEST-000005"), b"m").unwrap();
        std::fs::write(dir.path().join("OPTIONS-000007"), b"o").unwrap();
        std::fs::write(dir.path().join("000012.sst"), b"sst").unwrap();
        dir
    }

    #[test]
    fn names_rocksdb_writes_are_accepted_others_not() {
        for ok in [
            "CURRENT",
            "LOCK",
            "LOG.old.1700000000",
            "MANIFEST-000005",
            "OPTIONS-000007",
            "000012.sst",
            "000013.log",
            "000014.blob",
        ] {
            assert!(is_rocksdb_file_name(ok), "{ok}");
        }
        for bad in [
            "",
            "x.sst",
            ".sst",
            "MANIFEST-",
            "MANIFEST-12a",
            "notes.txt",
            "LOG.old.",
            "a/b",
        ] {
            assert!(!is_rocksdb_file_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_rocksdb_directory_is_listed_with_sources() {
        let dir = rocksdb_dir();
        let scanned = scan(&backend(), dir.path()).unwrap();
        let names: Vec<&str> = scanned.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["000012.sst", "CURRENT", "MANIFEST-000005", "OPTIONS-000007"]
        );
        assert_eq!(scanned.bytes(), 3 + 16 + 1 + 1);
        for file in &scanned.files {
            file.check_unchanged().unwrap();
        }
        std::fs::write(dir.path().join("000012.sst"), b"changed").unwrap();
        assert!(scanned.files[0].check_unchanged().is_err());
    }

    #[test]
    fn what_is_no_rocksdb_directory_is_refused() {
        let refused = |dir: &Path, part: &str| {
            let e = scan(&backend(), dir).unwrap_err().to_string();
            assert!(e.contains(part), "{e:?} should say {part:?}");
        };
        let dir = rocksdb_dir();
        std::fs::remove_file(dir.path().join("CURRENT")).unwrap();
        refused(dir.path(), "no CURRENT");

        let dir = rocksdb_dir();
        std::fs::write(dir.path().join("CURRENT"), "MANIFEST-000009\n").unwrap();
        refused(dir.path(), "MANIFEST-000009");

        let dir = rocksdb_dir();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("000013.sst")).unwrap();
        refused(dir.path(), "symbolic link");

        let dir = rocksdb_dir();
        std::fs::create_dir(dir.path().join("000013.sst")).unwrap();
        refused(dir.path(), "is a directory");

        let dir = rocksdb_dir();
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
        refused(dir.path(), "not a file RocksDB writes");

        let dir = rocksdb_dir();
        std::fs::write(dir.path().join("CURRENT"), "MANIFEST-000005").unwrap();
        refused(dir.path(), "does not end in a newline");

        let dir = rocksdb_dir();
        nix::unistd::mkfifo(
            &dir.path().join("000013.sst"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        refused(dir.path(), "a FIFO");

        let dir = rocksdb_dir();
        let current = std::fs::File::create(dir.path().join("CURRENT")).unwrap();
        current.set_len(2 << 30).unwrap(); // sparse: refused by its size, unread
        refused(dir.path(), "more than the 4096");

        let dir = rocksdb_dir();
        refused(&dir.path().join("CURRENT"), "not a directory");
    }

    #[test]
    fn lock_lines_match_by_device_and_inode() {
        assert!(holds(
            "1: POSIX  ADVISORY  WRITE 4242 08:01:1234 0 EOF",
            "08:01:1234"
        ));
        assert!(!holds(
            "1: POSIX  ADVISORY  WRITE 4242 08:01:12345 0 EOF",
            "08:01:1234"
        ));
        assert!(!holds(
            "1: -> POSIX  ADVISORY  WRITE 4243 08:01:1234 0 EOF",
            "08:01:1234"
        ));
    }

    #[test]
    fn a_database_open_in_rocksdb_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        let db = rocksdb::DB::open(&options, dir.path()).unwrap();
        db.put(b"k", b"v").unwrap();
        let e = scan(&backend(), dir.path()).unwrap_err().to_string();
        assert!(e.contains("open in a running RocksDB"), "{e}");
        // Asking did not drop the lock (closing a descriptor of LOCK would have).
        scan(&backend(), dir.path()).unwrap_err();
        let (devs, ino) = LocalTree::open(dir.path())
            .unwrap()
            .lock_identity("LOCK")
            .unwrap()
            .unwrap();
        assert!(is_locked(&devs, ino).unwrap());
        drop(db);
        // Closed, it is a RocksDB directory like any other.
        scan(&backend(), dir.path()).unwrap();
    }
}
