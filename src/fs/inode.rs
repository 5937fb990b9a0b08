//! The inode table ([`Inodes`]): inode numbers (`cp-N`'s nodes are N<<32 | index), `stat`,
//! lookup, directory listings, readlink, the checkpoint trees built so far, how the kernel
//! may cache a listing (the root's readdir cache), and what the kernel is told to forget
//! when checkpoints go. The operations that use it are in `ops.rs`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::attr::{
    Attr, DirEntry, Invalidator, Kind, Owner, CHECKPOINTS, CTL, LATEST, META_DIR, META_DIR_NAME,
    METRICS, PINNED, REGISTRY, ROOT, STATUS,
};
use super::flink_names::{is_flink_dir, is_flink_ino, FlinkNames, FLINK, FLINK_DIR_NAME};
use super::pinned::{is_pin_ino, Pins};
use super::seam::Checkpoints;
use super::tree::{CheckpointTree, NodeKind, TreeCache};
use ckptfs_core::catalog::Manifest;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;

/// Checkpoint trees kept built at once (each about 80 KB for ~500 files); the others are
/// rebuilt from their manifest when needed.
pub const TREE_CACHE: usize = 256;

/// What the kernel's cached listing of the root (FUSE's readdir cache) holds. The kernel
/// fills it from whichever handle opened with the cache on reads the directory from its
/// start, whatever picture that handle has; so only a root handle opened while no other
/// root handle is open uses the cache, and a later one keeps the cache only if the set of
/// checkpoints is still the one that handle pictured.
#[derive(Default)]
struct RootCache {
    /// The generation of the picture of the last root handle that used the cache.
    holds: Option<u64>,
    /// Open root handles.
    open: usize,
}

impl RootCache {
    /// A root handle opens on a picture of `generation`: how the kernel may cache it.
    fn open(&mut self, generation: u64) -> DirCache {
        let cache = if self.open > 0 {
            DirCache::Off
        } else if self.holds.replace(generation) == Some(generation) {
            DirCache::Keep
        } else {
            DirCache::Refill
        };
        self.open += 1;
        cache
    }

    /// A root handle was released.
    fn close(&mut self) {
        self.open -= 1;
    }
}

/// How the kernel may cache an opened directory's listing (see `CkptFs::opendir`).
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

/// The checkpoint and node index of an inode inside a checkpoint (`cp-N` and below).
pub(super) fn split_ino(ino: u64) -> Option<(u64, usize)> {
    let cp = ino >> 32;
    (cp > 0).then_some((cp, (ino & 0xffff_ffff) as usize))
}

/// The inode of node `index` of checkpoint `cp` (`cp-N` itself: index 0).
pub(super) fn make_ino(cp: u64, index: usize) -> u64 {
    (cp << 32) | index as u64
}

/// The checkpoint whose top directory (`cp-N`) inode `ino` is.
pub(super) fn top_of(ino: u64) -> Option<u64> {
    split_ino(ino)
        .filter(|(_, index)| *index == 0)
        .map(|(cp, _)| cp)
}

/// Make `shown` the checkpoints of `current`; the ones it held that are gone.
fn replace_shown(shown: &mut BTreeSet<u64>, current: BTreeSet<u64>) -> Vec<u64> {
    let gone = shown.difference(&current).copied().collect();
    *shown = current;
    gone
}

/// The inode table: what every inode is (fixed, a pin's link, the `flink/` subtree, a
/// node of a checkpoint's tree), its `stat`, lookups and listings, the checkpoint trees
/// built so far, and what the kernel was shown, forgotten when checkpoints go.
pub(super) struct Inodes {
    /// The retained checkpoints the tree shows.
    checkpoints: Arc<dyn Checkpoints>,
    owner: Owner,
    /// Bumped whenever the set of checkpoints (the root's listing) changes.
    generation: AtomicU64,
    trees: Mutex<TreeCache>,
    /// Checkpoints the kernel may have cached entries for.
    shown: Mutex<BTreeSet<u64>>,
    root_cache: Mutex<RootCache>,
    /// `pinned/`: a link per pin (pinned.rs).
    pins: Pins,
    /// `flink/`: Flink's names of the imported checkpoints (flink_names.rs).
    flink: FlinkNames,
    /// Where the tree is mounted (absolute), once known: a Flink checkpoint's `cp-N/`
    /// then shows a `_metadata` naming the files below it there.
    mountpoint: Mutex<Option<PathBuf>>,
    /// Where to tell the kernel what to forget, once the session runs.
    invalidator: Mutex<Option<Arc<dyn Invalidator>>>,
}

impl Inodes {
    /// The table of the tree over `checkpoints`, every entry owned by `owner`.
    pub(super) fn new(checkpoints: Arc<dyn Checkpoints>, owner: Owner) -> Self {
        Inodes {
            flink: FlinkNames::new(checkpoints.clone(), owner),
            pins: Pins::new(checkpoints.clone(), owner),
            checkpoints,
            owner,
            generation: AtomicU64::new(1),
            trees: Mutex::new(TreeCache::new(TREE_CACHE)),
            shown: Mutex::new(BTreeSet::new()),
            root_cache: Mutex::new(RootCache::default()),
            mountpoint: Mutex::new(None),
            invalidator: Mutex::new(None),
        }
    }

    /// Who owns the entries, and when the tree was mounted.
    pub(super) fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The generation of the set of checkpoints (see [`Inodes::forget_dropped`]).
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// See `CkptFs::set_mountpoint`.
    pub(super) fn set_mountpoint(&self, mountpoint: PathBuf) {
        *lock(&self.mountpoint) = Some(mountpoint);
    }

    /// Where to tell the kernel which cached entries to forget.
    pub(super) fn set_invalidator(&self, invalidator: Arc<dyn Invalidator>) {
        *lock(&self.invalidator) = Some(invalidator);
    }

    /// After the set of checkpoints may have changed: forget trees of dropped checkpoints
    /// and tell the kernel to drop their entries.
    pub(super) fn forget_dropped(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        let current: BTreeSet<u64> = self
            .checkpoints
            .checkpoints()
            .iter()
            .map(|m| m.id)
            .collect();
        let gone = replace_shown(&mut lock(&self.shown), current);
        let invalidator = lock(&self.invalidator).clone();
        {
            let mut trees = lock(&self.trees);
            for id in &gone {
                trees.remove(id);
            }
        }
        self.flink.changed(self.generation(), invalidator.as_ref());
        if let Some(inv) = invalidator {
            for id in &gone {
                inv.entry(ROOT, &format!("cp-{id}"));
            }
            inv.inode(LATEST);
            inv.inode(ROOT);
            // Pins change without a checkpoint coming or going: each link the kernel was
            // shown is looked up again.
            // Told with no lock held.
            let pins = self.pins.names();
            if !pins.is_empty() {
                inv.inode(PINNED);
            }
            for name in &pins {
                inv.entry(PINNED, name);
            }
        }
    }

    /// After `rmdir cp-{cp}` dropped it: forget its tree and that it was shown, and have
    /// the kernel forget `latest` and what `flink/` showed of it.
    pub(super) fn forget(&self, cp: u64) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        lock(&self.trees).remove(&cp);
        lock(&self.shown).remove(&cp);
        let invalidator = lock(&self.invalidator).clone();
        self.flink.changed(self.generation(), invalidator.as_ref());
        if let Some(inv) = invalidator {
            inv.inode(LATEST);
        }
    }

    /// The tree of checkpoint `cp`, built from its manifest unless cached.
    pub(super) fn tree(&self, cp: u64) -> Result<Arc<CheckpointTree>> {
        if let Some(tree) = lock(&self.trees).get(cp) {
            return Ok(tree.clone());
        }
        let manifest = self
            .checkpoints
            .manifest(cp)
            .ok_or(Error::NoSuchCheckpoint(cp))?;
        let mut tree = CheckpointTree::build(&manifest);
        let mut whole = true;
        match self.flink_metadata(&manifest) {
            Some(Ok(bytes)) => tree.add_generated(ckptfs_core::flink::import::METADATA, bytes),
            // Not kept: the next look tries again (a store that failed once may not twice).
            Some(Err(())) => whole = false,
            None => {}
        }
        let tree = Arc::new(tree);
        if !whole {
            return Ok(tree);
        }
        lock(&self.trees).insert(cp, tree.clone());
        lock(&self.shown).insert(cp);
        // Dropped while we built it? Then the change hook may have run before our insert.
        if self.checkpoints.manifest(cp).is_none() {
            lock(&self.trees).remove(&cp);
            return Err(Error::NoSuchCheckpoint(cp));
        }
        Ok(tree)
    }

    /// The `_metadata` shown at the top of `cp-N/` for a checkpoint imported from Flink
    /// ([`ckptfs_core::flink::export::metadata_for_mount`]); `None` for any other or before
    /// the mountpoint is known; `Some(Err)` when Flink's `_metadata` cannot be read or
    /// rewritten (logged and recorded: the rest of the checkpoint is shown all the same).
    fn flink_metadata(&self, manifest: &Manifest) -> Option<std::result::Result<Vec<u8>, ()>> {
        use ckptfs_core::flink::import::{job_backend, METADATA};
        let label = manifest.flink.as_ref()?;
        let mountpoint = lock(&self.mountpoint).clone()?;
        let file = manifest
            .backend(&job_backend())?
            .files
            .iter()
            .find(|f| f.name == METADATA && f.chunks.is_none())?;
        let cp_dir = mountpoint.join(format!("cp-{}", manifest.id));
        let made = self
            .checkpoints
            .object_store()
            .read_verified(&file.object, ckptfs_core::source::MAX_METADATA_BYTES)
            .and_then(|bytes| {
                ckptfs_core::flink::export::metadata_for_mount(&bytes, label.checkpoint, &cp_dir)
            });
        Some(made.map_err(|e| {
            let msg = format!(
                "cp-{}/_metadata (Flink's, naming the mount's files) is not shown: {e}",
                manifest.id
            );
            log::warn!("{msg}");
            self.checkpoints.record_error(msg);
        }))
    }

    /// The checkpoint, node index and tree of an inode inside a checkpoint.
    pub(super) fn resolve(&self, ino: u64) -> Result<(u64, usize, Arc<CheckpointTree>)> {
        let missing = || Error::NotFound(format!("inode {ino}"));
        let (cp, index) = split_ino(ino).ok_or_else(missing)?;
        let tree = self.tree(cp)?;
        if index >= tree.nodes.len() {
            return Err(missing());
        }
        Ok((cp, index, tree))
    }

    /// The newest retained checkpoint (`latest`).
    pub(super) fn latest(&self) -> Option<u64> {
        self.checkpoints.checkpoints().last().map(|m| m.id)
    }

    /// What `stat` shows of inode `ino`.
    pub(super) fn getattr(&self, ino: u64) -> Result<Attr> {
        let owner = &self.owner;
        match ino {
            ROOT => {
                let n = self.checkpoints.checkpoints().len() as u32;
                let pinned = u32::from(self.pins.shown());
                let flink = u32::from(self.flink.shown(self.generation()));
                Ok(owner.fixed(ROOT, Kind::Dir, 0, 0o755, 3 + pinned + flink + n))
            }
            _ if is_flink_ino(ino) => self.flink.getattr(self.generation(), ino),
            META_DIR => Ok(owner.fixed(META_DIR, Kind::Dir, 0, 0o755, 2)),
            CTL => Ok(owner.fixed(CTL, Kind::File, 0, 0o600, 1)),
            STATUS | REGISTRY | CHECKPOINTS | METRICS => {
                Ok(owner.attr(ino, Kind::File, 0, 0o444, 1, SystemTime::now()))
            }
            LATEST => {
                let target = self
                    .latest()
                    .ok_or(Error::NotFound("no checkpoint yet".into()))?;
                let len = format!("cp-{target}").len() as u64;
                Ok(owner.fixed(LATEST, Kind::Symlink, len, 0o777, 1))
            }
            PINNED => Ok(owner.fixed(PINNED, Kind::Dir, 0, 0o555, 2)),
            _ if is_pin_ino(ino) => self.pins.getattr(ino),
            _ => match top_of(ino) {
                Some(cp) => self.top_attr(ino, cp),
                None => self.node_attr(ino),
            },
        }
    }

    /// `cp-N` itself: from its manifest, without building its tree (listing the root of
    /// thousands of checkpoints must not churn the tree cache).
    fn top_attr(&self, ino: u64, cp: u64) -> Result<Attr> {
        let manifest = self
            .checkpoints
            .manifest(cp)
            .ok_or(Error::NoSuchCheckpoint(cp))?;
        // The kernel may cache this entry now: invalidate it when cp-N is dropped (and if
        // that already happened meanwhile, do not hand it out).
        lock(&self.shown).insert(cp);
        if self.checkpoints.manifest(cp).is_none() {
            return Err(Error::NoSuchCheckpoint(cp));
        }
        let operators: BTreeSet<&str> = manifest
            .backends
            .iter()
            .map(|b| b.name.operator())
            .collect();
        let mtime = std::time::UNIX_EPOCH + Duration::from_millis(manifest.completed_unix_ms);
        let nlink = 2 + operators.len() as u32;
        let mut attr = self.owner.attr(ino, Kind::Dir, 0, 0o555, nlink, mtime);
        attr.immutable = true;
        Ok(attr)
    }

    /// A node below `cp-N`, from its checkpoint's tree.
    fn node_attr(&self, ino: u64) -> Result<Attr> {
        let (_, index, tree) = self.resolve(ino)?;
        let node = &tree.nodes[index];
        let owner = &self.owner;
        let mut attr = match &node.kind {
            NodeKind::Dir(children) => {
                let subdirs = children
                    .iter()
                    .filter(|c| matches!(tree.nodes[**c].kind, NodeKind::Dir(_)))
                    .count() as u32;
                owner.attr(ino, Kind::Dir, 0, 0o555, 2 + subdirs, tree.mtime)
            }
            NodeKind::File { size, .. } => owner.attr(ino, Kind::File, *size, 0o444, 1, tree.mtime),
            NodeKind::Generated(bytes) => {
                owner.attr(ino, Kind::File, bytes.len() as u64, 0o444, 1, tree.mtime)
            }
        };
        attr.immutable = true;
        Ok(attr)
    }

    /// The entry `name` of directory `parent`.
    pub(super) fn lookup(&self, parent: u64, name: &str) -> Result<Attr> {
        let missing = || Error::NotFound(name.to_string());
        match parent {
            ROOT => match name {
                META_DIR_NAME => self.getattr(META_DIR),
                "latest" => self.getattr(LATEST),
                "pinned" if self.pins.shown() => self.getattr(PINNED),
                FLINK_DIR_NAME if self.flink.shown(self.generation()) => self.getattr(FLINK),
                _ => {
                    let cp = parse_checkpoint_dir(name).ok_or_else(missing)?;
                    if self.checkpoints.manifest(cp).is_none() {
                        return Err(missing());
                    }
                    self.getattr(make_ino(cp, 0))
                }
            },
            PINNED => self.pins.lookup(name),
            META_DIR => match name {
                "ctl" => self.getattr(CTL),
                "status" => self.getattr(STATUS),
                "registry" => self.getattr(REGISTRY),
                "checkpoints" => self.getattr(CHECKPOINTS),
                "metrics" => self.getattr(METRICS),
                _ => Err(missing()),
            },
            _ if is_flink_dir(parent) => self.flink.lookup(self.generation(), parent, name),
            _ => {
                let (cp, index) = split_ino(parent).ok_or_else(missing)?;
                let tree = self.tree(cp)?;
                let child = tree.child(index, name).ok_or_else(missing)?;
                self.getattr(make_ino(cp, child))
            }
        }
    }

    /// The entries of a directory, without `.` and `..`.
    pub(super) fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
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
                if self.pins.shown() {
                    out.push(entry("pinned", PINNED)?);
                }
                out.extend(self.flink.root_entry(self.generation())?);
                for m in checkpoints {
                    if let Ok(e) = entry(&format!("cp-{}", m.id), make_ino(m.id, 0)) {
                        out.push(e);
                    }
                }
                Ok(out)
            }
            PINNED => Ok(self.pins.readdir()),
            META_DIR => Ok(vec![
                entry("ctl", CTL)?,
                entry("checkpoints", CHECKPOINTS)?,
                entry("metrics", METRICS)?,
                entry("registry", REGISTRY)?,
                entry("status", STATUS)?,
            ]),
            _ if is_flink_dir(ino) => self.flink.readdir(self.generation(), ino),
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

    /// The entries of a directory with `.` and `..` first: what an open directory serves.
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

    /// How the kernel may cache the listing of directory `ino`, not a `cp-N`, opened on a
    /// picture of `generation`: the root as [`RootCache`] tells (counted open until
    /// [`Inodes::close_root`]); `pinned/` and `flink/` not at all, as they change with no
    /// checkpoint's coming or going or as checkpoints come and go; the rest never changes.
    pub(super) fn dir_cache(&self, ino: u64, generation: u64) -> DirCache {
        match ino {
            ROOT => lock(&self.root_cache).open(generation),
            PINNED => DirCache::Off,
            _ if is_flink_dir(ino) => DirCache::Off,
            _ => DirCache::Keep,
        }
    }

    /// A root handle opened by [`Inodes::dir_cache`] was released.
    pub(super) fn close_root(&self) {
        lock(&self.root_cache).close();
    }

    /// The parent inode of a directory (for `..`).
    pub(super) fn parent_of(&self, ino: u64) -> u64 {
        if is_flink_dir(ino) {
            return FlinkNames::parent(ino);
        }
        match self.resolve(ino) {
            Ok((cp, index, tree)) if index > 0 => make_ino(cp, tree.nodes[index].parent),
            _ => ROOT,
        }
    }

    /// The target of link `ino` (`latest`, `pinned/NAME`, `flink/<job>/chk-N`).
    pub(super) fn readlink(&self, ino: u64) -> Result<String> {
        if is_flink_ino(ino) {
            return self.flink.readlink(self.generation(), ino);
        }
        if is_pin_ino(ino) {
            return self.pins.readlink(ino);
        }
        if ino != LATEST {
            return Err(Error::Invalid("not a symbolic link".into()));
        }
        let target = self
            .latest()
            .ok_or(Error::NotFound("no checkpoint yet".into()))?;
        Ok(format!("cp-{target}"))
    }

    /// The cache of built trees (tests bound and inspect it).
    #[cfg(test)]
    pub(super) fn trees(&self) -> std::sync::MutexGuard<'_, TreeCache> {
        lock(&self.trees)
    }
}

#[cfg(test)]
mod tests {
    use super::super::attr::PIN_LINKS;
    use super::*;

    /// Only a root handle opened while no other is open uses the kernel's cache, and it
    /// keeps what the kernel holds only if that was filled at the same generation.
    #[test]
    fn the_roots_cache_is_refilled_kept_or_left_off() {
        let mut root = RootCache::default();
        assert_eq!(root.open(1), DirCache::Refill);
        assert_eq!(root.open(1), DirCache::Off, "another root handle is open");
        root.close();
        root.close();
        assert_eq!(root.open(1), DirCache::Keep);
        root.close();
        assert_eq!(root.open(2), DirCache::Refill);
        assert_eq!(root.open(3), DirCache::Off);
        root.close();
        root.close();
        // The Off open did not record its generation.
        assert_eq!(root.open(2), DirCache::Keep);
    }

    /// What the kernel was shown and is no longer retained is what it is told to forget.
    #[test]
    fn the_checkpoints_gone_are_those_shown_and_no_longer_current() {
        let mut shown = BTreeSet::from([1, 2, 3]);
        assert_eq!(replace_shown(&mut shown, BTreeSet::from([2, 4])), [1, 3]);
        assert_eq!(shown, BTreeSet::from([2, 4]));
        assert!(replace_shown(&mut shown, BTreeSet::from([2, 4, 5])).is_empty());
    }

    #[test]
    fn checkpoint_inodes_split_and_name_their_directories() {
        assert_eq!(split_ino(make_ino(7, 3)), Some((7, 3)));
        assert_eq!(split_ino(PIN_LINKS), None);
        assert_eq!(top_of(make_ino(7, 0)), Some(7));
        assert_eq!(top_of(make_ino(7, 1)), None);
        assert_eq!(parse_checkpoint_dir("cp-12"), Some(12));
        for bad in ["cp-012", "cp-", "cp-x", "cp--1", "cp-4294967296"] {
            assert_eq!(parse_checkpoint_dir(bad), None, "{bad}");
        }
    }
}
