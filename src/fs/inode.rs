//! The inode side of the tree: inode numbers (`cp-N`'s nodes are N<<32 | index), `stat`,
//! lookup, directory listings as pictures taken at `opendir` (with the kernel's readdir
//! cache for the root), readlink, and `rmdir cp-N`, which drops a checkpoint.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::flink_names::{is_flink_dir, is_flink_ino, FLINK, FLINK_DIR_NAME};
use super::handles::{DirOf, Handle};
use super::tree::NodeKind;
use super::{
    Attr, CkptFs, DirEntry, Kind, CHECKPOINTS, CTL, LATEST, META_DIR, META_DIR_NAME, METRICS,
    PINNED, PIN_LINKS, REGISTRY, ROOT, STATUS,
};
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;

/// What the kernel's cached listing of the root (FUSE's readdir cache) holds. The kernel
/// fills it from whichever handle opened with the cache on reads the directory from its
/// start, whatever picture that handle has; so only a root handle opened while no other
/// root handle is open uses the cache, and a later one keeps the cache only if the set of
/// checkpoints is still the one that handle pictured.
#[derive(Default)]
pub(super) struct RootCache {
    /// The generation of the picture of the last root handle that used the cache.
    pub(super) holds: Option<u64>,
    /// Open root handles.
    pub(super) open: usize,
}

/// How the kernel may cache an opened directory's listing (see [`CkptFs::opendir`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirCache {
    /// Not cached: this handle reads from the daemon.
    Off,
    /// Cached, after dropping what the kernel cached before.
    Refill,
    /// Cached, keeping what the kernel cached at an earlier open.
    Keep,
}

/// `cp-N` with N in canonical decimal.
pub fn parse_checkpoint_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("cp-")?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|n| *n < (1 << 31))
}

pub(super) fn split_ino(ino: u64) -> Option<(u64, usize)> {
    let cp = ino >> 32;
    (cp > 0).then_some((cp, (ino & 0xffff_ffff) as usize))
}

pub(super) fn make_ino(cp: u64, index: usize) -> u64 {
    (cp << 32) | index as u64
}

/// The names of the links in `pinned/`: every pin name seen, in the order seen (the k-th
/// is inode [`PIN_LINKS`] + k, stable while mounted), and each name's place, so that
/// listing 10,000 links costs 10,000 steps, not a search of every name per link.
#[derive(Default)]
pub(super) struct PinNames {
    pub(super) names: Vec<String>,
    index: HashMap<String, u64>,
}

impl PinNames {
    /// The inode of the link `pinned/NAME` (given one if the name is new).
    fn ino(&mut self, name: &str) -> u64 {
        if let Some(ino) = self.index.get(name) {
            return *ino;
        }
        let ino = PIN_LINKS + self.names.len() as u64;
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), ino);
        ino
    }

    /// The name of link inode `ino`.
    fn name(&self, ino: u64) -> Option<&str> {
        let k = usize::try_from(ino.checked_sub(PIN_LINKS)?).ok()?;
        self.names.get(k).map(String::as_str)
    }
}

impl CkptFs {
    /// The inode of the link `pinned/NAME`.
    fn pin_ino(&self, name: &str) -> u64 {
        lock(&self.pin_names).ino(name)
    }

    /// The pin a link inode shows, and the retained checkpoint it points to.
    fn pin_of(&self, ino: u64) -> Option<(String, u64)> {
        let name = lock(&self.pin_names).name(ino)?.to_string();
        let cp = self.checkpoints.pinned(&name)?;
        self.checkpoints.manifest(cp).map(|_| (name, cp))
    }

    /// What `stat` shows of link `pinned/NAME`, inode `ino`, to `cp-{cp}`.
    fn pin_attr(&self, ino: u64, cp: u64) -> Attr {
        let len = format!("../cp-{cp}").len() as u64;
        self.attr(ino, Kind::Symlink, len, 0o777, 1, self.mounted_at)
    }

    /// `pinned/` is shown while some retained checkpoint is pinned (as `latest` while
    /// there is a checkpoint).
    fn shows_pinned(&self) -> bool {
        self.checkpoints
            .pins()
            .values()
            .any(|cp| self.checkpoints.manifest(*cp).is_some())
    }

    /// True for the inode of a link in `pinned/` (shown or not): below the `flink/`
    /// subtree's inodes ([`FLINK`] on).
    fn is_pin_ino(ino: u64) -> bool {
        (PIN_LINKS..FLINK).contains(&ino)
    }

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

    /// What `stat` shows of inode `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        match ino {
            ROOT => {
                let n = self.checkpoints.checkpoints().len() as u32;
                let pinned = u32::from(self.shows_pinned());
                let flink = u32::from(self.flink_shown());
                Ok(self.attr(
                    ROOT,
                    Kind::Dir,
                    0,
                    0o755,
                    3 + pinned + flink + n,
                    self.mounted_at,
                ))
            }
            _ if is_flink_ino(ino) => self.flink_getattr(ino),
            META_DIR => Ok(self.attr(META_DIR, Kind::Dir, 0, 0o755, 2, self.mounted_at)),
            CTL => Ok(self.attr(CTL, Kind::File, 0, 0o600, 1, self.mounted_at)),
            STATUS | REGISTRY | CHECKPOINTS | METRICS => {
                Ok(self.attr(ino, Kind::File, 0, 0o444, 1, SystemTime::now()))
            }
            LATEST => {
                let target = self
                    .latest()
                    .ok_or(Error::NotFound("no checkpoint yet".into()))?;
                let len = format!("cp-{target}").len() as u64;
                Ok(self.attr(LATEST, Kind::Symlink, len, 0o777, 1, self.mounted_at))
            }
            PINNED => Ok(self.attr(PINNED, Kind::Dir, 0, 0o555, 2, self.mounted_at)),
            _ if Self::is_pin_ino(ino) => {
                let (_, cp) = self
                    .pin_of(ino)
                    .ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
                Ok(self.pin_attr(ino, cp))
            }
            // cp-N itself: from its manifest, without building its tree (listing the root
            // of thousands of checkpoints must not churn the tree cache).
            _ if split_ino(ino).is_some_and(|(_, index)| index == 0) => {
                let cp = ino >> 32;
                let manifest = self
                    .checkpoints
                    .manifest(cp)
                    .ok_or(Error::NoSuchCheckpoint(cp))?;
                // The kernel may cache this entry now: invalidate it when cp-N is dropped
                // (and if that already happened meanwhile, do not hand it out).
                lock(&self.shown).insert(cp);
                if self.checkpoints.manifest(cp).is_none() {
                    return Err(Error::NoSuchCheckpoint(cp));
                }
                let operators: BTreeSet<&str> = manifest
                    .backends
                    .iter()
                    .map(|b| b.name.operator())
                    .collect();
                let mtime =
                    std::time::UNIX_EPOCH + Duration::from_millis(manifest.completed_unix_ms);
                let mut attr =
                    self.attr(ino, Kind::Dir, 0, 0o555, 2 + operators.len() as u32, mtime);
                attr.immutable = true;
                Ok(attr)
            }
            _ => {
                let (_, index, tree) = self.resolve(ino)?;
                let node = &tree.nodes[index];
                let mut attr = match &node.kind {
                    NodeKind::Dir(children) => {
                        let subdirs = children
                            .iter()
                            .filter(|c| matches!(tree.nodes[**c].kind, NodeKind::Dir(_)))
                            .count() as u32;
                        self.attr(ino, Kind::Dir, 0, 0o555, 2 + subdirs, tree.mtime)
                    }
                    NodeKind::File { size, .. } => {
                        self.attr(ino, Kind::File, *size, 0o444, 1, tree.mtime)
                    }
                    NodeKind::Generated(bytes) => {
                        self.attr(ino, Kind::File, bytes.len() as u64, 0o444, 1, tree.mtime)
                    }
                };
                attr.immutable = true;
                Ok(attr)
            }
        }
    }

    /// The entry `name` of directory `parent`.
    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr> {
        let missing = || Error::NotFound(name.to_string());
        match parent {
            ROOT => match name {
                META_DIR_NAME => self.getattr(META_DIR),
                "latest" => self.getattr(LATEST),
                "pinned" if self.shows_pinned() => self.getattr(PINNED),
                FLINK_DIR_NAME if self.flink_shown() => self.getattr(FLINK),
                _ => {
                    let cp = parse_checkpoint_dir(name).ok_or_else(missing)?;
                    if self.checkpoints.manifest(cp).is_none() {
                        return Err(missing());
                    }
                    self.getattr(make_ino(cp, 0))
                }
            },
            PINNED => {
                let cp = self.checkpoints.pinned(name).ok_or_else(missing)?;
                if self.checkpoints.manifest(cp).is_none() {
                    return Err(missing());
                }
                Ok(self.pin_attr(self.pin_ino(name), cp))
            }
            META_DIR => match name {
                "ctl" => self.getattr(CTL),
                "status" => self.getattr(STATUS),
                "registry" => self.getattr(REGISTRY),
                "checkpoints" => self.getattr(CHECKPOINTS),
                "metrics" => self.getattr(METRICS),
                _ => Err(missing()),
            },
            _ if is_flink_dir(parent) => self.flink_lookup(parent, name),
            _ => {
                let (cp, index) = split_ino(parent).ok_or_else(missing)?;
                let tree = self.tree(cp)?;
                let child = tree.child(index, name).ok_or_else(missing)?;
                self.getattr(make_ino(cp, child))
            }
        }
    }

    /// The entries of a directory, without `.` and `..`.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let entry = |name: &str, ino: u64| -> Result<DirEntry> {
            Ok(DirEntry {
                name: name.to_string(),
                attr: self.getattr(ino)?,
            })
        };
        match ino {
            ROOT => {
                let mut out = vec![entry(META_DIR_NAME, META_DIR)?];
                let checkpoints = self.checkpoints.checkpoints();
                if !checkpoints.is_empty() {
                    out.push(entry("latest", LATEST)?);
                }
                if self.shows_pinned() {
                    out.push(entry("pinned", PINNED)?);
                }
                out.extend(self.flink_root_entry()?);
                for m in checkpoints {
                    if let Ok(e) = entry(&format!("cp-{}", m.id), make_ino(m.id, 0)) {
                        out.push(e);
                    }
                }
                Ok(out)
            }
            PINNED => {
                // The pins once, and each link's inode from its name (not one search each).
                let shown: Vec<(String, u64)> = self
                    .checkpoints
                    .pins()
                    .into_iter()
                    .filter(|(_, cp)| self.checkpoints.manifest(*cp).is_some())
                    .collect();
                let mut names = lock(&self.pin_names);
                Ok(shown
                    .into_iter()
                    .map(|(name, cp)| {
                        let attr = self.pin_attr(names.ino(&name), cp);
                        DirEntry { name, attr }
                    })
                    .collect())
            }
            META_DIR => Ok(vec![
                entry("ctl", CTL)?,
                entry("checkpoints", CHECKPOINTS)?,
                entry("metrics", METRICS)?,
                entry("registry", REGISTRY)?,
                entry("status", STATUS)?,
            ]),
            _ if is_flink_dir(ino) => self.flink_readdir(ino),
            _ => {
                let (cp, index, tree) = self.resolve(ino)?;
                match &tree.nodes.get(index).map(|n| &n.kind) {
                    Some(NodeKind::Dir(children)) => children
                        .iter()
                        .map(|c| entry(&tree.nodes[*c].name, make_ino(cp, *c)))
                        .collect(),
                    Some(NodeKind::File { .. } | NodeKind::Generated(_)) => Err(Error::io(
                        "readdir",
                        std::io::Error::from_raw_os_error(libc::ENOTDIR),
                    )),
                    None => Err(Error::NotFound(format!("inode {ino}"))),
                }
            }
        }
    }

    /// Open a directory: its entries, `.` and `..` included, are taken now and served by
    /// [`CkptFs::readdir_handle`] until [`CkptFs::releasedir`]. A checkpoint dropped while
    /// `cp -r` walks it then fails the walk loudly (at the next lookup or opendir) instead of
    /// showing a directory as empty: glibc reads ENOENT from getdents as end of directory.
    /// Open a directory: its handle, and how the kernel may cache its listing (so that a
    /// warm `ls -l` of 10,000 checkpoints asks nothing of the daemon). A checkpoint's
    /// directories and `.ckptfs` never change; the root's cache is used only as
    /// [`RootCache`] tells.
    pub fn opendir(&self, ino: u64) -> Result<(u64, DirCache)> {
        self.opendir_as(ino, self.uid)
    }

    /// [`CkptFs::opendir`] by user `uid` (whose listing of a `cp-N` may hold its drop: see
    /// [`CkptFs::rmdir`]).
    pub fn opendir_as(&self, ino: u64, uid: u32) -> Result<(u64, DirCache)> {
        // Read before the picture is taken: the picture is at least this new.
        let generation = self.root_generation.load(Ordering::SeqCst);
        // The top directory of a checkpoint is counted while open: `rmdir` waits for no one
        // and the kernel marks a removed directory dead, after which a listing on an open
        // handle ends early *without an error* (getdents' ENOENT is end-of-directory to
        // glibc). So rmdir refuses while it is open (see `rmdir`).
        let top = split_ino(ino)
            .filter(|(_, index)| *index == 0)
            .map(|(cp, _)| cp);
        let mut listing = top.map(|_| lock(&self.listing));
        if let Some(cp) = top {
            if self.checkpoints.manifest(cp).is_none() {
                return Err(Error::NoSuchCheckpoint(cp));
            }
        }
        let entries = self.dir_snapshot(ino)?;
        if let (Some(cp), Some(listing)) = (top, listing.as_mut()) {
            *listing.entry(cp).or_default().entry(uid).or_default() += 1;
        }
        let (of, cache) = match top {
            Some(cp) => (DirOf::Top(cp, uid), DirCache::Keep),
            None if ino == ROOT => {
                let mut root = lock(&self.root_cache);
                let cache = if root.open > 0 {
                    DirCache::Off
                } else if root.holds.replace(generation) == Some(generation) {
                    DirCache::Keep
                } else {
                    DirCache::Refill
                };
                root.open += 1;
                (DirOf::Root, cache)
            }
            // The pins change with no checkpoint's coming or going.
            None if ino == PINNED => (DirOf::Other, DirCache::Off),
            // `flink/` changes as checkpoints come and go.
            None if is_flink_dir(ino) => (DirOf::Other, DirCache::Off),
            None => (DirOf::Other, DirCache::Keep),
        };
        Ok((self.new_handle(Handle::Dir(Arc::new(entries), of)), cache))
    }

    pub(super) fn dir_snapshot(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let mut entries = vec![
            DirEntry {
                name: ".".into(),
                attr: self.getattr(ino)?,
            },
            DirEntry {
                name: "..".into(),
                attr: self.getattr(self.parent_of(ino))?,
            },
        ];
        entries.extend(self.readdir(ino)?);
        Ok(entries)
    }

    /// The entries of a directory opened with [`CkptFs::opendir`].
    pub fn readdir_handle(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>> {
        match lock(&self.handles).get(&fh) {
            Some(Handle::Dir(entries, _)) => Ok(entries.clone()),
            Some(_) => Err(Error::io(
                "readdir",
                std::io::Error::from_raw_os_error(libc::ENOTDIR),
            )),
            None => Err(Error::io(
                "readdir",
                std::io::Error::from_raw_os_error(libc::EBADF),
            )),
        }
    }

    /// Close directory handle `fh`.
    pub fn releasedir(&self, fh: u64) {
        let handle = lock(&self.handles).remove(&fh);
        if let Some(Handle::Dir(_, DirOf::Root)) = handle {
            lock(&self.root_cache).open -= 1;
        } else if let Some(Handle::Dir(_, DirOf::Top(cp, uid))) = handle {
            let mut listing = lock(&self.listing);
            if let Some(uids) = listing.get_mut(&cp) {
                if let Some(n) = uids.get_mut(&uid) {
                    *n -= 1;
                    if *n == 0 {
                        uids.remove(&uid);
                    }
                }
                if uids.is_empty() {
                    listing.remove(&cp);
                }
            }
            self.listing_released.notify_all();
        }
    }

    /// The parent inode of a directory (for `..`).
    pub fn parent_of(&self, ino: u64) -> u64 {
        if is_flink_dir(ino) {
            return self.flink_parent(ino);
        }
        match self.resolve(ino) {
            Ok((cp, index, tree)) if index > 0 => make_ino(cp, tree.nodes[index].parent),
            _ => ROOT,
        }
    }

    /// The target of link `ino` (`latest`, `pinned/NAME`, `flink/<job>/chk-N`).
    pub fn readlink(&self, ino: u64) -> Result<String> {
        if is_flink_ino(ino) {
            return self.flink_readlink(ino);
        }
        if Self::is_pin_ino(ino) {
            let (_, cp) = self
                .pin_of(ino)
                .ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
            return Ok(format!("../cp-{cp}"));
        }
        if ino != LATEST {
            return Err(Error::Invalid("not a symbolic link".into()));
        }
        let target = self
            .latest()
            .ok_or(Error::NotFound("no checkpoint yet".into()))?;
        Ok(format!("cp-{target}"))
    }

    /// `rmdir cp-N` drops checkpoint N; anything else is refused. The kernel marks a
    /// removed directory dead and a listing on it then ends early without error, so a
    /// `cp -r` racing the drop could succeed with part of the checkpoint: while cp-N itself
    /// is open (a listing in progress), rmdir waits up to 2 s for it to be closed. A
    /// listing by root or the mount's owner (who may drop checkpoints themselves) then
    /// holds the drop: EBUSY. One by another user (`--allow-other`) does not: nobody who
    /// may only read can keep a checkpoint from being dropped. The drop goes ahead and is
    /// logged with the uids whose listing it ends (any file they hold open stays readable;
    /// whatever they open next of cp-N fails, ENOENT). Directories below cp-N keep their
    /// listings (see [`CkptFs::opendir`]); files below it fail to open once it is gone.
    ///
    /// The newest checkpoint is not dropped this way (EBUSY, the reason recorded for
    /// status and logged): `latest` would silently move back to an older one, and what
    /// restores from it with it. `ckptfs rm --force` (the control line `delete N`) drops it.
    pub fn rmdir(&self, parent: u64, name: &str) -> Result<()> {
        if parent != ROOT {
            return Err(if split_ino(parent).is_some() {
                Error::ReadOnly(format!("{name} is part of a checkpoint"))
            } else {
                Error::io("rmdir", std::io::Error::from_raw_os_error(libc::EPERM))
            });
        }
        let Some(cp) = parse_checkpoint_dir(name) else {
            return Err(
                if name == META_DIR_NAME || name == "pinned" || name == FLINK_DIR_NAME {
                    Error::io("rmdir", std::io::Error::from_raw_os_error(libc::EPERM))
                } else if name == "latest" {
                    Error::io("rmdir", std::io::Error::from_raw_os_error(libc::ENOTDIR))
                } else {
                    Error::NotFound(name.to_string())
                },
            );
        };
        if self.latest() == Some(cp) {
            let message = format!(
                "rmdir cp-{cp} refused: it is the newest checkpoint (latest -> cp-{cp}), and \
                 dropping it would move latest back; `ckptfs rm --force MOUNTPOINT {cp}` (the \
                 control line `delete {cp}`) drops it"
            );
            log::warn!("{message}");
            self.checkpoints.record_error(message.clone());
            return Err(Error::Busy(message));
        }
        // Held through the drop, so no opendir of cp-N slips in between check and drop.
        // The kernel releases a closed directory asynchronously (`ls cp-N && rmdir cp-N`
        // may arrive first): wait a moment for that before calling it busy. The same moment
        // is all another user's listing holds the drop (see `may_drop`).
        let mut listing = lock(&self.listing);
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while listing.contains_key(&cp) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            listing = ckptfs_core::fsutil::wait_timeout(&self.listing_released, listing, left);
        }
        let (holding, others): (Vec<u32>, Vec<u32>) = listing
            .get(&cp)
            .map(|uids| uids.keys().partition(|u| self.may_drop(**u)))
            .unwrap_or_default();
        if !holding.is_empty() {
            return Err(Error::Busy(format!(
                "cp-{cp} is open by root or the mount's owner (being listed, e.g. by a copy); \
                 try again when it is closed"
            )));
        }
        self.checkpoints.delete_checkpoint(cp)?;
        if !others.is_empty() {
            let uids: Vec<String> = others.iter().map(|u| format!("uid {u}")).collect();
            log::warn!(
                "cp-{cp} dropped while other users held it open for more than 2 s ({}): \
                 their listing of it ends here, files they hold open stay readable",
                uids.join(", ")
            );
        }
        self.root_generation.fetch_add(1, Ordering::SeqCst);
        lock(&self.trees).remove(&cp);
        drop(listing);
        lock(&self.shown).remove(&cp);
        let invalidator = lock(&self.invalidator).clone();
        self.flink_changed(invalidator.as_ref());
        if let Some(inv) = invalidator {
            inv.inode(LATEST);
        }
        Ok(())
    }

    /// Whether user `uid` may drop checkpoints itself, and so hold a drop with a listing:
    /// root and the mount's owner (the daemon's user). With `--allow-other` others may
    /// only read, and the kernel refuses them `rmdir` and the control file.
    fn may_drop(&self, uid: u32) -> bool {
        uid == 0 || uid == self.uid
    }

    /// `unlink`, always refused. From a JVM (process `pid` runs `java`), below a checkpoint
    /// imported from Flink and of a file it holds, it is the sign of a Flink job restored
    /// from the mount in CLAIM mode, whose checkpoints then name the checkpoint's files
    /// (and which deletes it once it is subsumed; NO_CLAIM never deletes anything): the
    /// checkpoint is pinned as `flink-claim-cp-N` (the job depends on it), and the error
    /// recorded and logged, once per checkpoint. Anyone else's (`rm -r` of a checkpoint)
    /// is only refused.
    pub fn unlink(&self, parent: u64, name: &str, pid: u32) -> Error {
        if let Some((cp, index)) = split_ino(parent) {
            let flink = self
                .checkpoints
                .manifest(cp)
                .is_some_and(|m| m.flink.is_some());
            let exists = flink
                && self
                    .tree(cp)
                    .is_ok_and(|tree| tree.child(index, name).is_some());
            if exists && is_jvm(pid) && lock(&self.claimed).insert(cp) {
                let path = match self.tree(cp) {
                    Ok(tree) => format!("{}/{name}", tree.path_of(index)),
                    Err(_) => format!("cp-{cp}/.../{name}"),
                };
                self.checkpoints.flink_claimed(cp, &path);
            }
        }
        self.refuse_change(parent)
    }

    /// The error for any other change (create, rename, mkdir, setattr...).
    pub fn refuse_change(&self, parent_or_ino: u64) -> Error {
        if split_ino(parent_or_ino).is_some() {
            Error::ReadOnly("checkpoints are read-only".into())
        } else {
            Error::io("change", std::io::Error::from_raw_os_error(libc::EPERM))
        }
    }
}

/// Whether process (or thread) `pid` runs a Java virtual machine, as Flink's JobManager and
/// TaskManagers do.
fn is_jvm(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .is_ok_and(|exe| exe.file_name().is_some_and(|n| n == "java"))
}
