//! The one way in for bytes another program wrote: every file ckptfs reads from a checkpoint
//! source (a RocksDB checkpoint directory, a Flink job's checkpoints on a local disk or in a
//! bucket) is read through a [`Tree`] here, never by a path of its own.
//!
//! A source is untrusted input to a daemon that runs as root: whoever writes it (the Flink
//! user, anyone who can write the bucket) chooses every name and path in it, and may change
//! it while ckptfs reads. A tree therefore
//! - confines every path to its root, the directory or key prefix the user named
//!   ([`Tree::locate`] maps a path a `_metadata` names into it, or refuses it);
//! - follows no symbolic link on a local disk: each component is opened with `O_NOFOLLOW`
//!   below the root's descriptor ([`local`]); `..` is refused, not resolved;
//! - opens a file once, as a path descriptor first, and refuses anything that is not a
//!   regular file before opening it for reading (a FIFO never blocks, a device is never
//!   opened); the bytes are read through that descriptor, whatever is renamed or swapped
//!   in meanwhile;
//! - bounds what it reads into memory ([`Tree::read`] takes a limit).
//!
//! Each refusal is an [`Error::Refused`] naming the path, the rule and its errno: `EACCES`
//! for a path outside the roots, `ELOOP` for a symbolic link, `EINVAL` for a file that is
//! not regular or too large. docs/security.md says what is trusted and what is not.

pub mod local;
pub mod s3;
pub mod sst;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub use local::{LocalTree, SourceFile};
pub use s3::S3Tree;

/// At most this many bytes of a `CURRENT` file are read (RocksDB writes a MANIFEST's name
/// and a newline: about 16 bytes).
pub const MAX_CURRENT_BYTES: u64 = 4096;
/// At most this many bytes of a Flink `_metadata` are read. Flink inlines small state
/// (`state.storage.fs.memory-threshold`, 20 KiB per handle by default) into it, so a large
/// job's may reach megabytes; a bigger one is refused rather than read into memory.
pub const MAX_METADATA_BYTES: u64 = 256 << 20;

/// A refusal of a source path: `path` broke `rule`.
pub fn refused(path: impl std::fmt::Display, rule: impl Into<String>, errno: i32) -> Error {
    Error::Refused {
        path: path.to_string(),
        rule: rule.into(),
        errno,
    }
}

/// A path relative to a tree's root, checked: `/`-separated plain components, none empty,
/// `.` or `..`. Nothing in a source is resolved upwards.
pub fn checked_relative<'a>(shown: &dyn std::fmt::Display, rel: &'a str) -> Result<&'a str> {
    let bad = rel.is_empty()
        || rel.starts_with('/')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c.contains('\0'));
    if bad {
        return Err(refused(
            shown,
            "a path in a source is plain names below its root (no `..`, `.`, empty or \
             absolute parts)",
            libc::EACCES,
        ));
    }
    Ok(rel)
}

/// One entry of a listed directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name in the directory.
    pub name: String,
    /// What kind of file it is.
    pub kind: EntryKind,
    /// Bytes, for a file (0 otherwise).
    pub size: u64,
}

/// The kind of a listed entry, as the listing says (a link is not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory (on object storage, a common prefix of keys).
    Dir,
    /// A symbolic link, FIFO, socket or device: never read.
    Other,
}

/// Where the bytes of a source file are once [`Tree::fetch`] made them readable.
pub enum Fetched {
    /// Held open on a local disk: read through the descriptor.
    Open(std::sync::Arc<SourceFile>),
    /// Downloaded into the staging directory given (a file ckptfs wrote itself).
    Downloaded(PathBuf),
}

/// A source's files below one root: a local directory or a key prefix of a bucket. Paths
/// are relative to the root, `/`-separated, and checked by [`checked_relative`].
pub trait Tree: Send + Sync {
    /// The root as a user would name it (`/data/flink`, `s3://bucket/prefix`).
    fn describe(&self) -> String;
    /// `rel` shown to a user.
    fn show(&self, rel: &str) -> String {
        if rel.is_empty() {
            self.describe()
        } else {
            format!("{}/{rel}", self.describe().trim_end_matches('/'))
        }
    }
    /// The entries directly under directory `rel` ("" is the root), sorted by name.
    fn list(&self, rel: &str) -> Result<Vec<Entry>>;
    /// The size of regular file `rel`, `None` if there is nothing there; a link or another
    /// kind of file is refused.
    fn size_of(&self, rel: &str) -> Result<Option<u64>>;
    /// File `rel` whole, refused (before anything is read) beyond `limit` bytes.
    fn read(&self, rel: &str, limit: u64) -> Result<Vec<u8>>;
    /// File `rel` made readable: held open where it is, or downloaded into `staging` (a
    /// directory of ckptfs's own) under `name`, refused past `limit` bytes (what its handle
    /// declares: a larger file is refused by its caller anyway).
    fn fetch(&self, rel: &str, staging: &Path, name: &str, limit: u64) -> Result<Fetched>;
    /// Where the file an absolute URI of this kind of tree names (`file:/...`,
    /// `s3://bucket/key`) is below the root, `None` if it is outside it (or another kind).
    fn locate(&self, uri: &str) -> Option<String>;
    /// An immutable name of `rel` for the store to remember (an object's URI), `None` for a
    /// local file (its identity is read from the file itself).
    fn immutable_name(&self, rel: &str) -> Option<String>;
}

/// `a/b` joined, either side possibly empty.
pub fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_pass() {
        for ok in ["a", "a/b", "job/chk-4/_metadata", "shared/7f-uuid"] {
            checked_relative(&ok, ok).unwrap();
        }
        for bad in ["", "/a", "a/../b", "..", "a/./b", "a//b", "a/", "a\0b"] {
            let e = checked_relative(&bad, bad).unwrap_err();
            assert_eq!(e.errno(), libc::EACCES, "{bad:?}");
        }
    }

    #[test]
    fn join_skips_empty_sides() {
        assert_eq!(join("", "b"), "b");
        assert_eq!(join("a", ""), "a");
        assert_eq!(join("a", "b"), "a/b");
    }
}
