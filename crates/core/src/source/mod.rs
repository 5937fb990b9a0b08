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
    /// When it was last written, where the listing tells (a local file's mtime, an
    /// object's last modification; `None` for a directory of object storage).
    pub modified: Option<std::time::SystemTime>,
}

/// What a look at a file says without reading it: its size and when it was last written
/// (a writer that writes it again changes one or the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    /// Bytes.
    pub size: u64,
    /// When it was last written, where the source tells (a local file's mtime, an object's
    /// last modification).
    pub modified: Option<std::time::SystemTime>,
}

/// Most entries [`Tree::walk`] lists below one directory: a tree past it is refused (a
/// source's writer must not make ckptfs hold an unbounded listing).
pub const MAX_WALK_ENTRIES: usize = 10_000_000;
/// How deep [`Tree::walk`] goes below the directory it walks (Flink's deepest is
/// `shared/<merged-dir>/<file>`).
pub const MAX_WALK_DEPTH: usize = 8;

/// One entry found by [`Tree::walk`], by its path below the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walked {
    /// Its path below the tree's root.
    pub rel: String,
    /// What kind of file it is (object storage lists files only).
    pub kind: EntryKind,
    /// Bytes, for a file.
    pub size: u64,
    /// When it was last written, where known.
    pub modified: Option<std::time::SystemTime>,
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
#[derive(Clone)]
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
    /// The names directly under directory `rel` ("" is the root) with their kinds as the
    /// directory itself records them, in no particular order: [`Tree::list`] without a look
    /// at each entry (a local directory's entry types; `lstat` only where the filesystem
    /// records none), for a listing repeated every second.
    fn list_kinds(&self, rel: &str) -> Result<Vec<(String, EntryKind)>> {
        Ok(self
            .list(rel)?
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect())
    }
    /// The size of regular file `rel`, `None` if there is nothing there; a link or another
    /// kind of file is refused.
    fn size_of(&self, rel: &str) -> Result<Option<u64>>;
    /// [`Tree::size_of`] with the file's modification time.
    fn stamp(&self, rel: &str) -> Result<Option<FileStamp>>;
    /// File `rel` whole, refused (before anything is read) beyond `limit` bytes.
    fn read(&self, rel: &str, limit: u64) -> Result<Vec<u8>>;
    /// File `rel` made readable: held open where it is, or downloaded into `staging` (a
    /// directory of ckptfs's own) under `name`, refused past `limit` bytes (what its handle
    /// declares: a larger file is refused by its caller anyway).
    fn fetch(&self, rel: &str, staging: &Path, name: &str, limit: u64) -> Result<Fetched>;
    /// Bytes `[start, start + size)` of file `rel` (a segment of a file-merging
    /// checkpoint) made readable: the file held open where it is (the caller reads the
    /// range), or the range alone downloaded into `staging` under `name`.
    fn fetch_segment(
        &self,
        rel: &str,
        start: u64,
        size: u64,
        staging: &Path,
        name: &str,
    ) -> Result<Fetched>;
    /// Where the file an absolute URI of this kind of tree names (`file:/...`,
    /// `s3://bucket/key`) is below the root, `None` if it is outside it (or another kind).
    fn locate(&self, uri: &str) -> Option<String>;
    /// File `rel` as an object a store on the same object storage can copy without
    /// reading it (see [`crate::store::ObjectStore::stage_copy`]), looked up now; `None`
    /// for a tree on a local disk, or if there is nothing at `rel`.
    fn remote_file(&self, _rel: &str) -> Result<Option<crate::store::s3::RemoteFile>> {
        Ok(None)
    }
    /// The bucket connection of a tree on object storage (`None` on a local disk): whether
    /// a store can copy its files is known without a request.
    fn remote(&self) -> Option<&std::sync::Arc<crate::store::s3::Remote>> {
        None
    }
    /// An immutable name of `rel` for the store to remember (an object's URI), `None` for a
    /// local file (its identity is read from the file itself).
    fn immutable_name(&self, rel: &str) -> Option<String>;

    /// Every entry below directory `rel` (not `rel` itself), files and directories,
    /// sorted by path; nothing below a link is listed (a link is an [`EntryKind::Other`]
    /// entry). Refused past [`MAX_WALK_ENTRIES`] entries or [`MAX_WALK_DEPTH`] levels.
    fn walk(&self, rel: &str) -> Result<Vec<Walked>> {
        let mut out = Vec::new();
        walk_into(self, rel, 0, &mut out)?;
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(out)
    }

    /// Delete regular file `rel` if it is still the one `seen` describes (same size and
    /// modification time: a file written since it was listed is not the one judged);
    /// `Ok(false)` if it is gone already. No link is followed; anything but a regular file
    /// is refused.
    fn remove_file(&self, rel: &str, seen: &Walked) -> Result<bool>;

    /// [`Tree::remove_file`] of each of `files`, several at once; each one's result, in
    /// order. Object storage has no conditional delete: there each key but a `_metadata`
    /// is deleted as it is (a bulk request per thousand keys, no look-up first, a key gone
    /// already counts as deleted), and the caller checks `seen` against a listing taken
    /// just before.
    fn remove_files(&self, files: &[(&str, &Walked)]) -> Vec<Result<bool>> {
        crate::fsutil::parallel_map(files, 16, |(rel, seen)| self.remove_file(rel, seen))
    }

    /// Delete directory `rel` if it is empty; `Ok(false)` if it is not there or not
    /// empty (on object storage, where directories are key prefixes, nothing to do).
    fn remove_empty_dir(&self, rel: &str) -> Result<bool>;
}

fn walk_into<T: Tree + ?Sized>(
    tree: &T,
    rel: &str,
    depth: usize,
    out: &mut Vec<Walked>,
) -> Result<()> {
    if depth >= MAX_WALK_DEPTH {
        return Err(refused(
            tree.show(rel),
            format!("more than {MAX_WALK_DEPTH} levels of directories"),
            libc::ELOOP,
        ));
    }
    for entry in tree.list(rel)? {
        if out.len() >= MAX_WALK_ENTRIES {
            return Err(refused(
                tree.show(rel),
                format!("more than {MAX_WALK_ENTRIES} entries"),
                libc::E2BIG,
            ));
        }
        let path = join(rel, &entry.name);
        out.push(Walked {
            rel: path.clone(),
            kind: entry.kind,
            size: entry.size,
            modified: entry.modified,
        });
        if entry.kind == EntryKind::Dir {
            walk_into(tree, &path, depth + 1, out)?;
        }
    }
    Ok(())
}

/// `a/b` joined, either side possibly empty.
pub fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

/// A tree for tests: a local one that counts what is looked at and read through it.
#[cfg(test)]
pub(crate) mod counting {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A [`LocalTree`] counting the files looked at ([`Tree::size_of`], [`Tree::stamp`])
    /// and read whole ([`Tree::read`]: calls and bytes).
    pub(crate) struct CountingTree {
        pub tree: LocalTree,
        pub stamps: AtomicU64,
        pub reads: AtomicU64,
        pub read_bytes: AtomicU64,
    }

    impl CountingTree {
        pub(crate) fn open(path: &Path) -> CountingTree {
            CountingTree {
                tree: LocalTree::open(path).unwrap(),
                stamps: AtomicU64::new(0),
                reads: AtomicU64::new(0),
                read_bytes: AtomicU64::new(0),
            }
        }

        /// (files looked at, files read, bytes read) so far.
        pub(crate) fn counts(&self) -> (u64, u64, u64) {
            (
                self.stamps.load(Ordering::SeqCst),
                self.reads.load(Ordering::SeqCst),
                self.read_bytes.load(Ordering::SeqCst),
            )
        }
    }

    impl Tree for CountingTree {
        fn describe(&self) -> String {
            self.tree.describe()
        }
        fn list(&self, rel: &str) -> Result<Vec<Entry>> {
            self.tree.list(rel)
        }
        fn list_kinds(&self, rel: &str) -> Result<Vec<(String, EntryKind)>> {
            self.tree.list_kinds(rel)
        }
        fn size_of(&self, rel: &str) -> Result<Option<u64>> {
            self.stamps.fetch_add(1, Ordering::SeqCst);
            self.tree.size_of(rel)
        }
        fn stamp(&self, rel: &str) -> Result<Option<FileStamp>> {
            self.stamps.fetch_add(1, Ordering::SeqCst);
            self.tree.stamp(rel)
        }
        fn read(&self, rel: &str, limit: u64) -> Result<Vec<u8>> {
            let bytes = self.tree.read(rel, limit)?;
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.read_bytes
                .fetch_add(bytes.len() as u64, Ordering::SeqCst);
            Ok(bytes)
        }
        fn fetch(&self, rel: &str, staging: &Path, name: &str, limit: u64) -> Result<Fetched> {
            self.tree.fetch(rel, staging, name, limit)
        }
        fn fetch_segment(
            &self,
            rel: &str,
            start: u64,
            size: u64,
            staging: &Path,
            name: &str,
        ) -> Result<Fetched> {
            self.tree.fetch_segment(rel, start, size, staging, name)
        }
        fn locate(&self, uri: &str) -> Option<String> {
            self.tree.locate(uri)
        }
        fn immutable_name(&self, rel: &str) -> Option<String> {
            self.tree.immutable_name(rel)
        }
        fn remove_file(&self, rel: &str, seen: &Walked) -> Result<bool> {
            self.tree.remove_file(rel, seen)
        }
        fn remove_empty_dir(&self, rel: &str) -> Result<bool> {
            self.tree.remove_empty_dir(rel)
        }
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
