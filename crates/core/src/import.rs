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

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::names::BackendName;

/// One directory to import as one backend's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportDir {
    pub backend: BackendName,
    pub dir: PathBuf,
}

/// A directory checked and listed: what an import will store.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub backend: BackendName,
    /// Sorted by name.
    pub files: Vec<ScannedFile>,
}

impl Scanned {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// A regular file of an imported directory, as it was when listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedFile {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    /// What the file's entry records as where it came from, by which the backend's next
    /// import re-references it unread (`None`: a file ckptfs wrote itself, read each time).
    pub source: Option<String>,
    /// `device:inode:size:mtime` (seconds.nanoseconds) when listed: the file's identity
    /// and version, checked again once it is stored.
    pub stamp: String,
}

/// Where a file held open is read from ([`ScannedFile::held_open`]).
const HELD: &str = "/proc/self/fd/";

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
            stamp: String::new(),
        }
    }

    /// Made by [`ScannedFile::stored`]: there are no local bytes to read.
    pub fn is_stored(&self) -> bool {
        self.path.as_os_str().is_empty()
    }

    /// This file opened now and held open in `open` (keep it until the import is stored):
    /// its bytes are read through the descriptor (`/proc/self/fd/N`), so the application
    /// may delete the file meanwhile (Flink drops a checkpoint it no longer retains).
    /// Refused if it is no longer what was listed.
    pub fn held_open(self, open: &mut Vec<std::fs::File>) -> Result<ScannedFile> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(&self.path).ctx("open", &self.path)?;
        let meta = file.metadata().ctx("stat", &self.path)?;
        if stamp_of(&meta) != self.stamp {
            return Err(self.changed());
        }
        let path = PathBuf::from(format!("{HELD}{}", file.as_raw_fd()));
        open.push(file);
        Ok(ScannedFile { path, ..self })
    }

    fn changed(&self) -> Error {
        Error::Invalid(format!(
            "{} changed while it was imported; nothing was imported (import a checkpoint \
             directory, which nobody writes to)",
            self.path.display()
        ))
    }

    /// Fail if the file is no longer what was listed (written, replaced or removed since;
    /// a file held open only if written).
    pub fn check_unchanged(&self) -> Result<()> {
        if self.is_stored() {
            return Ok(());
        }
        let now = if self.path.starts_with(HELD) {
            std::fs::metadata(&self.path)
        } else {
            std::fs::symlink_metadata(&self.path)
        };
        let now = now.map(|m| stamp_of(&m)).unwrap_or_default();
        if now != self.stamp {
            return Err(self.changed());
        }
        Ok(())
    }
}

/// `device:inode:size:mtime` of a file.
pub fn stamp_of(meta: &std::fs::Metadata) -> String {
    format!(
        "{}:{}:{}:{}.{:09}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec()
    )
}

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
pub fn scan(backend: &BackendName, dir: &Path) -> Result<Scanned> {
    let meta = std::fs::metadata(dir).ctx("import", dir)?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is not a directory: import a RocksDB checkpoint directory",
            dir.display()
        )));
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).ctx("read directory", dir)? {
        let entry = entry.ctx("read directory", dir)?;
        let path = entry.path();
        let name = entry.file_name();
        let Some(name) = name.to_str().map(str::to_string) else {
            return Err(Error::Invalid(format!(
                "{}: a file name that is not UTF-8 is no RocksDB file; nothing was imported",
                path.display()
            )));
        };
        let meta = std::fs::symlink_metadata(&path).ctx("stat", &path)?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(Error::Invalid(format!(
                "{} is a symbolic link: ckptfs imports regular files and does not follow \
                 links; nothing was imported",
                path.display()
            )));
        }
        if kind.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is a directory: a RocksDB checkpoint directory holds files only; \
                 nothing was imported",
                path.display()
            )));
        }
        if !kind.is_file() {
            return Err(Error::Invalid(format!(
                "{} is not a regular file; nothing was imported",
                path.display()
            )));
        }
        if !is_rocksdb_file_name(&name) {
            return Err(Error::Invalid(format!(
                "{} is not a file RocksDB writes (CURRENT, MANIFEST-N, OPTIONS-N, N.sst, \
                 N.log, N.blob, IDENTITY, LOCK, LOG): is {} a RocksDB directory? Nothing was \
                 imported",
                path.display(),
                dir.display()
            )));
        }
        files.push(ScannedFile {
            size: meta.size(),
            source: Some(stamp_of(&meta)),
            stamp: stamp_of(&meta),
            name,
            path,
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    let current = files.iter().find(|f| f.name == "CURRENT").ok_or_else(|| {
        Error::Invalid(format!(
            "{} is not a RocksDB directory: it has no CURRENT file; nothing was imported",
            dir.display()
        ))
    })?;
    let named = std::fs::read_to_string(&current.path).ctx("read", &current.path)?;
    // RocksDB writes the name and a newline, and refuses a CURRENT without it.
    let manifest = named.strip_suffix('\n').unwrap_or("");
    if !is_rocksdb_file_name(manifest)
        || !manifest.starts_with("MANIFEST-")
        || !files.iter().any(|f| f.name == manifest)
    {
        let shown: String = manifest.chars().take(80).collect();
        return Err(Error::Invalid(format!(
            "{} is not a complete RocksDB directory: CURRENT names {shown:?}, which is not \
             in it; nothing was imported",
            dir.display()
        )));
    }
    if let Some(lock) = files.iter().find(|f| f.name == "LOCK") {
        if is_locked(&lock.path)? {
            return Err(Error::Invalid(format!(
                "{} is open in a running RocksDB (its LOCK file is locked): import a \
                 checkpoint of it instead (RocksDB's Checkpoint API, `ldb checkpoint`); \
                 nothing was imported",
                dir.display()
            )));
        }
    }
    Ok(Scanned {
        backend: backend.clone(),
        files,
    })
}

/// True if a process holds a lock on `path` (RocksDB locks its `LOCK` file with `fcntl`),
/// as `/proc/locks` lists them by device and inode. The file is not opened: closing a
/// descriptor of it would drop every lock this process holds on it (the daemon's own
/// databases' among them).
fn is_locked(path: &Path) -> Result<bool> {
    let meta = std::fs::symlink_metadata(path).ctx("stat", path)?;
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let wanted = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ctx("read", Path::new("/proc/locks"))?;
    Ok(locks.lines().any(|line| holds(line, &wanted)))
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
        refused(dir.path(), "CURRENT names");

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
        assert!(is_locked(&dir.path().join("LOCK")).unwrap());
        drop(db);
        // Closed, it is a RocksDB directory like any other.
        scan(&backend(), dir.path()).unwrap();
    }
}
