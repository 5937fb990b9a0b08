//! The small named records of a store, beside its objects: the store metadata
//! (`ckptfs.json`), the checkpoint manifests (`checkpoints/N.json`), quarantined manifests
//! and, on object storage, the writer's lease.
//!
//! Unlike objects they are named, not addressed by content, and some change: every write is
//! atomic (a reader sees the old record or the new one, never a mix) and durable when it
//! returns, and may be conditional, which is what fences a second writer on object storage.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::fsutil::{
    ensure_real_dir, fsync_dir, is_atomic_leftover, is_real_dir, remove_tree, write_atomic,
};

/// A record as read, with the version a conditional update must name.
#[derive(Debug, Clone)]
pub struct Record {
    /// The record's content.
    pub bytes: Vec<u8>,
    /// The record's version (an ETag on object storage; none on a local store, whose single
    /// writer is fenced by a lock instead).
    pub version: Option<String>,
    /// When the store last wrote it, by the store's own clock (object storage; none on a
    /// local store).
    pub modified: Option<std::time::SystemTime>,
}

/// How a record is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// Replace whatever is there.
    Overwrite,
    /// Write only if no record of that name exists ([`Error::Exists`] otherwise).
    Create,
    /// Write only if the record is still at this version ([`Error::Conflict`] otherwise);
    /// `None` (a store without versions) overwrites.
    Update(Option<String>),
}

/// The named records of one store: files under a local store's root, or small objects
/// beside the objects on object storage. Keys are `/`-separated names relative to the
/// store ([`crate::store::layout`]).
pub trait Records: Send + Sync {
    /// Read a record; `None` if it does not exist.
    fn get(&self, key: &str) -> Result<Option<Record>>;
    /// Read several records (at once where the store gains from it), each one's result.
    fn get_many(&self, keys: &[String]) -> Vec<Result<Option<Record>>> {
        keys.iter().map(|key| self.get(key)).collect()
    }
    /// Write a record atomically and durably; returns its new version.
    fn put(&self, key: &str, bytes: &[u8], mode: Put) -> Result<Option<String>>;
    /// Delete a record durably; deleting a missing record is not an error.
    fn delete(&self, key: &str) -> Result<()>;
    /// The names of the records directly under `dir` (`checkpoints`), any order. Names of
    /// leftovers of interrupted writes are not listed.
    fn list(&self, dir: &str) -> Result<Vec<String>>;
    /// True if the store has the directory `dir` (a local store must have `checkpoints/`
    /// to be complete; object storage has no directories and answers true).
    fn has_dir(&self, dir: &str) -> bool;
    /// Create the directory `dir` where a store has directories.
    fn create_dir(&self, dir: &str) -> Result<()>;
    /// Leftovers of interrupted atomic writes (none on object storage, whose writes leave
    /// nothing behind).
    fn leftovers(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    /// Remove [`Records::leftovers`] (the writer only).
    fn clear_leftovers(&self) -> Result<usize> {
        Ok(0)
    }
    /// Where a record lives, for messages: a path or a URL.
    fn describe(&self, key: &str) -> String;
    /// True where records have versions (object storage): a writer must then name the
    /// version it read in every conditional write.
    fn versioned(&self) -> bool {
        false
    }
    /// The store's own clock now, where it has one apart from this host's (object storage:
    /// the time it stamps on a record written now). Decisions that compare with a record's
    /// [`Record::modified`] use it, never this host's clock.
    fn store_now(&self) -> Result<Option<std::time::SystemTime>> {
        Ok(None)
    }
}

/// Records as files under a local store's root.
pub struct LocalRecords {
    root: PathBuf,
}

impl LocalRecords {
    /// The records of the local store at `root`; creates nothing.
    pub fn new(root: &Path) -> Self {
        LocalRecords {
            root: root.to_path_buf(),
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

impl Records for LocalRecords {
    fn get(&self, key: &str) -> Result<Option<Record>> {
        let path = self.path(key);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(Record {
                bytes,
                version: None,
                modified: None,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
        }
    }

    fn put(&self, key: &str, bytes: &[u8], mode: Put) -> Result<Option<String>> {
        let path = self.path(key);
        if mode == Put::Create && fs::symlink_metadata(&path).is_ok() {
            // The store lock makes this holder the only writer: no race with the check.
            return Err(Error::Exists(path.display().to_string()));
        }
        if let Some(dir) = path.parent().filter(|d| !is_real_dir(d)) {
            ensure_real_dir(dir)?;
        }
        write_atomic(&path, bytes)?;
        Ok(None)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match fs::remove_file(&path) {
            Ok(()) => fsync_dir(path.parent().unwrap_or(&self.root)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let path = self.path(dir);
        let entries = match fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("list {}", path.display()), e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let name = entry.ctx("list", &path)?.file_name();
            let name = name.to_string_lossy().into_owned();
            if !is_atomic_leftover(&name) {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn has_dir(&self, dir: &str) -> bool {
        is_real_dir(&self.path(dir))
    }

    fn create_dir(&self, dir: &str) -> Result<()> {
        ensure_real_dir(&self.path(dir))
    }

    fn leftovers(&self) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for dir in [super::layout::CHECKPOINTS, ""] {
            let path = self.path(dir);
            if !path.exists() {
                continue;
            }
            for entry in fs::read_dir(&path).ctx("list", &path)? {
                let name = entry.ctx("list", &path)?.file_name();
                let name = name.to_string_lossy();
                if is_atomic_leftover(&name) {
                    found.push(if dir.is_empty() {
                        name.into_owned()
                    } else {
                        format!("{dir}/{name}")
                    });
                }
            }
        }
        Ok(found)
    }

    fn clear_leftovers(&self) -> Result<usize> {
        let found = self.leftovers()?;
        for key in &found {
            let path = self.path(key);
            if path.is_dir() {
                remove_tree(&path)?;
            } else {
                fs::remove_file(&path).ctx("remove leftover", &path)?;
            }
        }
        Ok(found.len())
    }

    fn describe(&self, key: &str) -> String {
        self.path(key).display().to_string()
    }
}
