//! What the tree shows the kernel, shared by every part of it: the fixed inodes, what `stat`
//! shows ([`Attr`], made by the mount's [`Owner`]), a directory entry, and the
//! [`Invalidator`] through which the tree takes back what the kernel may have cached.

use std::time::{Duration, SystemTime};

/// The mount's root directory (FUSE's root inode).
pub const ROOT: u64 = 1;
/// `.ckptfs/`.
pub const META_DIR: u64 = 2;
/// `.ckptfs/ctl`, the control file.
pub const CTL: u64 = 3;
/// `.ckptfs/status`.
pub const STATUS: u64 = 4;
/// `.ckptfs/registry`.
pub const REGISTRY: u64 = 5;
/// `latest`, the link to the newest checkpoint.
pub const LATEST: u64 = 6;
/// `.ckptfs/checkpoints`.
pub const CHECKPOINTS: u64 = 7;
/// `.ckptfs/metrics`.
pub const METRICS: u64 = 8;
/// `pinned/`, a link per pin.
pub const PINNED: u64 = 9;
/// The first inode of the links in `pinned/` (one per pin name seen, in the order seen;
/// below `1 << 32`, where checkpoint inodes begin).
pub const PIN_LINKS: u64 = 1 << 24;

/// `.ckptfs` in the root.
pub(super) const META_DIR_NAME: &str = ".ckptfs";

/// The file types the tree shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link (`latest`, `flink/<job>/chk-N`).
    Symlink,
}

/// What `stat` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// The inode number (stable: see `tree.rs`).
    pub ino: u64,
    /// Its file type.
    pub kind: Kind,
    /// Its size in bytes.
    pub size: u64,
    /// Its permission bits.
    pub perm: u16,
    /// Its link count.
    pub nlink: u32,
    /// When it last changed: a checkpoint's files show the checkpoint's time.
    pub mtime: SystemTime,
    /// Its owner: the mount's.
    pub uid: u32,
    /// Its group: the mount's.
    pub gid: u32,
    /// True for entries that never change while they exist (checkpoint content): the
    /// adapter gives them long cache lifetimes.
    pub immutable: bool,
}

impl Attr {
    /// How long the kernel may cache this answer: immutable entries an hour, the rest a
    /// second.
    pub fn ttl(&self) -> Duration {
        if self.immutable {
            Duration::from_secs(3600)
        } else {
            Duration::from_secs(1)
        }
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Its name in the directory.
    pub name: String,
    /// What `stat` shows of it.
    pub attr: Attr,
}

/// Who owns everything the tree shows (the daemon's user), and when it was mounted (the
/// time of what has no time of its own).
#[derive(Debug, Clone, Copy)]
pub(super) struct Owner {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) mounted_at: SystemTime,
}

impl Owner {
    /// The daemon's user and group, mounted now.
    pub(super) fn now() -> Self {
        Owner {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            mounted_at: SystemTime::now(),
        }
    }

    /// What `stat` shows of an entry owned by the mount (not immutable).
    pub(super) fn attr(
        &self,
        ino: u64,
        kind: Kind,
        size: u64,
        perm: u16,
        nlink: u32,
        mtime: SystemTime,
    ) -> Attr {
        Attr {
            ino,
            kind,
            size,
            perm,
            nlink,
            mtime,
            uid: self.uid,
            gid: self.gid,
            immutable: false,
        }
    }

    /// [`Owner::attr`] at the mount's time.
    pub(super) fn fixed(&self, ino: u64, kind: Kind, size: u64, perm: u16, nlink: u32) -> Attr {
        self.attr(ino, kind, size, perm, nlink, self.mounted_at)
    }

    /// Whether user `uid` may drop checkpoints itself, and so hold a drop with a listing:
    /// root and the mount's owner (the daemon's user). With `--allow-other` others may
    /// only read, and the kernel refuses them `rmdir` and the control file.
    pub(super) fn may_drop(&self, uid: u32) -> bool {
        uid == 0 || uid == self.uid
    }
}

/// Lets the core ask the kernel to forget cached entries (implemented by the adapter).
pub trait Invalidator: Send + Sync {
    /// Forget the entry `name` of directory `parent`.
    fn entry(&self, parent: u64, name: &str);
    /// Forget the attributes and data of inode `ino`.
    fn inode(&self, ino: u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_and_the_owner_may_drop() {
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            mounted_at: SystemTime::UNIX_EPOCH,
        };
        assert!(owner.may_drop(0));
        assert!(owner.may_drop(1000));
        assert!(!owner.may_drop(1001));
    }

    #[test]
    fn immutable_entries_are_cached_longer() {
        let owner = Owner::now();
        let mut attr = owner.fixed(ROOT, Kind::Dir, 0, 0o755, 2);
        assert_eq!(attr.ttl(), Duration::from_secs(1));
        attr.immutable = true;
        assert_eq!(attr.ttl(), Duration::from_secs(3600));
    }
}
