//! The mounted tree as plain Rust: inodes, lookup, readdir, getattr, read, rmdir and the
//! control-file handles. No fuser types here (see `fuse.rs`), so everything is testable
//! without a mount. The generated files' content is typed in [`crate::views`].
//!
//! ```text
//! /                       root (ino 1)
//! ├── .ckptfs/            ino 2
//! │   ├── ctl             ino 3, 0600: control commands in, JSON answers out
//! │   ├── status          ino 4, 0444: JSON picture of the daemon
//! │   ├── registry        ino 5, 0444: JSON lines, one per stored object
//! │   ├── checkpoints     ino 7, 0444: JSON lines, one per retained checkpoint
//! │   └── metrics         ino 8, 0444: the daemon's metrics for Prometheus (metrics.rs)
//! ├── latest -> cp-N      ino 6
//! └── cp-N/               ino N<<32, one per retained checkpoint (see tree.rs)
//! ```

pub mod fuse;
pub mod tree;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::fsutil::lock;
use std::time::{Duration, SystemTime};

use crate::catalog::history::{object_histories, ObjectHistory};
use crate::control::{self, Controller};
use crate::error::{Error, Result};
use crate::store::chunks::{Chunks, MAX_ASSEMBLED};
use crate::store::ObjectId;
use crate::views;
use tree::{CheckpointTree, NodeKind, TreeCache};

pub const ROOT: u64 = 1;
pub const META_DIR: u64 = 2;
pub const CTL: u64 = 3;
pub const STATUS: u64 = 4;
pub const REGISTRY: u64 = 5;
pub const LATEST: u64 = 6;
pub const CHECKPOINTS: u64 = 7;
pub const METRICS: u64 = 8;

const META_DIR_NAME: &str = ".ckptfs";

/// Longest control line accepted (a put of a large value fits; a stray binary stream not).
pub const MAX_LINE: usize = 4 << 20;

/// Checkpoint trees kept built at once (each about 80 KB for ~500 files); the others are
/// rebuilt from their manifest when needed.
pub const TREE_CACHE: usize = 256;

/// Most answers a control handle keeps unread. A handle opened write-only keeps none (no
/// one can read them); a reading handle that falls this far behind gets ENOBUFS on write
/// until it reads, so a producer that never reads cannot grow the daemon without bound.
pub const MAX_UNREAD_ANSWERS: usize = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

/// What `stat` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    pub mtime: SystemTime,
    pub uid: u32,
    pub gid: u32,
    /// True for entries that never change while they exist (checkpoint content): the
    /// adapter gives them long cache lifetimes.
    pub immutable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub attr: Attr,
}

/// How an opened file is to be read.
pub enum Opened {
    /// A stored object: reads go to this file (or the kernel, by passthrough).
    Object {
        fh: u64,
        file: Arc<File>,
        object: ObjectId,
    },
    /// Generated content (seekable) or the control stream (not): reads go through
    /// [`CkptFs::read`].
    Stream { fh: u64, seekable: bool },
}

enum Handle {
    Object(Arc<File>),
    Snapshot(Vec<u8>),
    /// A large file stored as chunks (a WAL): each read fetches the chunks it spans.
    Chunked(Arc<(Chunks, u64)>),
    Control(Arc<ControlStream>),
    Registry(Arc<Mutex<RegistryStream>>),
    /// An open directory: its entries (with `.` and `..`) as of `opendir`, so that every
    /// page of a listing comes from one picture, whatever is dropped meanwhile; and the
    /// directory it is.
    Dir(Arc<Vec<DirEntry>>, DirOf),
}

/// `.ckptfs/registry` as it is read: the objects' histories are worked out at open, their
/// rows written as the reader gets to them (122,883 rows were 1 s of a release daemon's
/// time before the first byte; a reader of the head now waits only for the histories).
#[derive(Default)]
struct RegistryStream {
    rows: Vec<(ObjectId, ObjectHistory)>,
    counts: std::collections::BTreeMap<ObjectId, u32>,
    /// The next row to write.
    next: usize,
    /// Text written and not yet read past, starting at byte `start` of the view.
    window: Vec<u8>,
    start: u64,
}

enum DirOf {
    Root,
    /// The top directory of this checkpoint.
    Top(u64),
    Other,
}

/// Answers of one open control handle, in command order.
#[derive(Default)]
struct ControlStream {
    state: Mutex<ControlState>,
    /// Opened write-only: answers are not kept.
    discard_answers: bool,
}

/// A reader parked until the next answer is ready.
pub type ReadCallback = Box<dyn FnOnce(Result<Vec<u8>>) + Send>;

#[derive(Default)]
struct ControlState {
    /// Answer slots; `None` until the command has finished.
    slots: VecDeque<Option<String>>,
    /// Slot index of the front of `slots` (answers already read are popped).
    base: usize,
    /// Unread remainder of a line a reader only took part of.
    partial: Vec<u8>,
    /// Written text after the last newline: the start of a line the next write completes.
    unfinished: Vec<u8>,
    waiting: VecDeque<(u32, ReadCallback)>,
}

impl ControlState {
    /// One answer line per read: what `head -n1` expects. `None` if the next one is not
    /// ready yet; an empty vector at the end of the stream.
    fn take(&mut self, size: u32) -> Option<Vec<u8>> {
        if self.partial.is_empty() {
            match self.slots.front() {
                None => return Some(Vec::new()),
                Some(None) => return None,
                Some(Some(_)) => {
                    let line = self.slots.pop_front().flatten().unwrap_or_default();
                    self.base += 1;
                    self.partial = line.into_bytes();
                    self.partial.push(b'\n');
                }
            }
        }
        let n = (size as usize).min(self.partial.len());
        Some(self.partial.drain(..n).collect())
    }

    /// Wake the parked readers that can now be answered.
    fn deliverable(&mut self) -> Vec<(ReadCallback, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some((size, _)) = self.waiting.front() {
            match self.take(*size) {
                Some(data) => {
                    let (_, callback) = self.waiting.pop_front().expect("front exists");
                    out.push((callback, data));
                }
                None => break,
            }
        }
        out
    }
}

/// Lets the core ask the kernel to forget cached entries (implemented by the adapter).
pub trait Invalidator: Send + Sync {
    fn entry(&self, parent: u64, name: &str);
    fn inode(&self, ino: u64);
}

pub struct CkptFs {
    controller: Arc<Controller>,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
    trees: Mutex<TreeCache>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// Checkpoints the kernel may have cached entries for.
    shown: Mutex<BTreeSet<u64>>,
    invalidator: Mutex<Option<Arc<dyn Invalidator>>>,
    /// Open handles of each checkpoint's top directory (`cp-N`), see [`CkptFs::rmdir`].
    listing: Mutex<HashMap<u64, usize>>,
    /// Signalled when a `cp-N` handle is released.
    listing_released: std::sync::Condvar,
    /// Objects whose checksum this daemon has verified.
    verified: Mutex<std::collections::HashSet<ObjectId>>,
    /// Verify each object at its first open (the default); off with `--no-verify`.
    verify: bool,
    /// Bumped whenever the set of checkpoints (the root's listing) changes.
    root_generation: AtomicU64,
    root_cache: Mutex<RootCache>,
}

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

fn split_ino(ino: u64) -> Option<(u64, usize)> {
    let cp = ino >> 32;
    (cp > 0).then_some((cp, (ino & 0xffff_ffff) as usize))
}

fn make_ino(cp: u64, index: usize) -> u64 {
    (cp << 32) | index as u64
}

impl CkptFs {
    pub fn new(controller: Arc<Controller>) -> Arc<Self> {
        Self::with_verification(controller, true)
    }

    pub fn with_verification(controller: Arc<Controller>, verify: bool) -> Arc<Self> {
        let fs = Arc::new(CkptFs {
            controller,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            mounted_at: SystemTime::now(),
            trees: Mutex::new(TreeCache::new(TREE_CACHE)),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            shown: Mutex::new(BTreeSet::new()),
            invalidator: Mutex::new(None),
            listing: Mutex::new(HashMap::new()),
            listing_released: std::sync::Condvar::new(),
            verified: Mutex::new(Default::default()),
            verify,
            root_generation: AtomicU64::new(1),
            root_cache: Mutex::new(RootCache::default()),
        });
        let weak = Arc::downgrade(&fs);
        fs.controller.set_change_hook(Arc::new(move || {
            if let Some(fs) = weak.upgrade() {
                fs.checkpoints_changed();
            }
        }));
        fs
    }

    pub fn controller(&self) -> &Arc<Controller> {
        &self.controller
    }

    pub fn set_invalidator(&self, invalidator: Arc<dyn Invalidator>) {
        *lock(&self.invalidator) = Some(invalidator);
    }

    /// Forget trees of dropped checkpoints and tell the kernel to drop their entries.
    fn checkpoints_changed(&self) {
        self.root_generation.fetch_add(1, Ordering::SeqCst);
        let current: BTreeSet<u64> = self
            .controller
            .engine()
            .checkpoints()
            .iter()
            .map(|m| m.id)
            .collect();
        let gone: Vec<u64> = {
            let mut shown = lock(&self.shown);
            let gone = shown.difference(&current).copied().collect();
            *shown = current;
            gone
        };
        let invalidator = lock(&self.invalidator).clone();
        {
            let mut trees = lock(&self.trees);
            for id in &gone {
                trees.remove(id);
            }
        }
        if let Some(inv) = invalidator {
            for id in &gone {
                inv.entry(ROOT, &format!("cp-{id}"));
            }
            inv.inode(LATEST);
            inv.inode(ROOT);
        }
    }

    fn tree(&self, cp: u64) -> Result<Arc<CheckpointTree>> {
        if let Some(tree) = lock(&self.trees).get(cp) {
            return Ok(tree.clone());
        }
        let manifest = self
            .controller
            .engine()
            .manifest(cp)
            .ok_or(Error::NoSuchCheckpoint(cp))?;
        let tree = Arc::new(CheckpointTree::build(&manifest));
        lock(&self.trees).insert(cp, tree.clone());
        lock(&self.shown).insert(cp);
        // Dropped while we built it? Then the change hook may have run before our insert.
        if self.controller.engine().manifest(cp).is_none() {
            lock(&self.trees).remove(&cp);
            return Err(Error::NoSuchCheckpoint(cp));
        }
        Ok(tree)
    }

    /// The checkpoint, node index and tree of an inode inside a checkpoint.
    fn resolve(&self, ino: u64) -> Result<(u64, usize, Arc<CheckpointTree>)> {
        let missing = || Error::NotFound(format!("inode {ino}"));
        let (cp, index) = split_ino(ino).ok_or_else(missing)?;
        let tree = self.tree(cp)?;
        if index >= tree.nodes.len() {
            return Err(missing());
        }
        Ok((cp, index, tree))
    }

    fn latest(&self) -> Option<u64> {
        self.controller.engine().checkpoints().last().map(|m| m.id)
    }

    fn attr(
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

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        match ino {
            ROOT => {
                let n = self.controller.engine().checkpoints().len() as u32;
                Ok(self.attr(ROOT, Kind::Dir, 0, 0o755, 3 + n, self.mounted_at))
            }
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
            // cp-N itself: from its manifest, without building its tree (listing the root
            // of thousands of checkpoints must not churn the tree cache).
            _ if split_ino(ino).is_some_and(|(_, index)| index == 0) => {
                let cp = ino >> 32;
                let manifest = self
                    .controller
                    .engine()
                    .manifest(cp)
                    .ok_or(Error::NoSuchCheckpoint(cp))?;
                // The kernel may cache this entry now: invalidate it when cp-N is dropped
                // (and if that already happened meanwhile, do not hand it out).
                lock(&self.shown).insert(cp);
                if self.controller.engine().manifest(cp).is_none() {
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
                };
                attr.immutable = true;
                Ok(attr)
            }
        }
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr> {
        let missing = || Error::NotFound(name.to_string());
        match parent {
            ROOT => match name {
                META_DIR_NAME => self.getattr(META_DIR),
                "latest" => self.getattr(LATEST),
                _ => {
                    let cp = parse_checkpoint_dir(name).ok_or_else(missing)?;
                    if self.controller.engine().manifest(cp).is_none() {
                        return Err(missing());
                    }
                    self.getattr(make_ino(cp, 0))
                }
            },
            META_DIR => match name {
                "ctl" => self.getattr(CTL),
                "status" => self.getattr(STATUS),
                "registry" => self.getattr(REGISTRY),
                "checkpoints" => self.getattr(CHECKPOINTS),
                "metrics" => self.getattr(METRICS),
                _ => Err(missing()),
            },
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
                let checkpoints = self.controller.engine().checkpoints();
                if !checkpoints.is_empty() {
                    out.push(entry("latest", LATEST)?);
                }
                for m in checkpoints {
                    if let Ok(e) = entry(&format!("cp-{}", m.id), make_ino(m.id, 0)) {
                        out.push(e);
                    }
                }
                Ok(out)
            }
            META_DIR => Ok(vec![
                entry("ctl", CTL)?,
                entry("checkpoints", CHECKPOINTS)?,
                entry("metrics", METRICS)?,
                entry("registry", REGISTRY)?,
                entry("status", STATUS)?,
            ]),
            _ => {
                let (cp, index, tree) = self.resolve(ino)?;
                match &tree.nodes.get(index).map(|n| &n.kind) {
                    Some(NodeKind::Dir(children)) => children
                        .iter()
                        .map(|c| entry(&tree.nodes[*c].name, make_ino(cp, *c)))
                        .collect(),
                    Some(NodeKind::File { .. }) => Err(Error::io(
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
            if self.controller.engine().manifest(cp).is_none() {
                return Err(Error::NoSuchCheckpoint(cp));
            }
        }
        let entries = self.dir_snapshot(ino)?;
        if let (Some(cp), Some(listing)) = (top, listing.as_mut()) {
            *listing.entry(cp).or_default() += 1;
        }
        let (of, cache) = match top {
            Some(cp) => (DirOf::Top(cp), DirCache::Keep),
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
            None => (DirOf::Other, DirCache::Keep),
        };
        Ok((self.new_handle(Handle::Dir(Arc::new(entries), of)), cache))
    }

    fn dir_snapshot(&self, ino: u64) -> Result<Vec<DirEntry>> {
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

    pub fn releasedir(&self, fh: u64) {
        let handle = lock(&self.handles).remove(&fh);
        if let Some(Handle::Dir(_, DirOf::Root)) = handle {
            lock(&self.root_cache).open -= 1;
        } else if let Some(Handle::Dir(_, DirOf::Top(cp))) = handle {
            let mut listing = lock(&self.listing);
            if let Some(n) = listing.get_mut(&cp) {
                *n -= 1;
                if *n == 0 {
                    listing.remove(&cp);
                }
            }
            self.listing_released.notify_all();
        }
    }

    /// The parent inode of a directory (for `..`).
    pub fn parent_of(&self, ino: u64) -> u64 {
        match self.resolve(ino) {
            Ok((cp, index, tree)) if index > 0 => make_ino(cp, tree.nodes[index].parent),
            _ => ROOT,
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<String> {
        if ino != LATEST {
            return Err(Error::Invalid("not a symbolic link".into()));
        }
        let target = self
            .latest()
            .ok_or(Error::NotFound("no checkpoint yet".into()))?;
        Ok(format!("cp-{target}"))
    }

    fn new_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, handle);
        fh
    }

    /// Open a file for reading (and writing, with `write`). Checkpoint files are
    /// read-only; the control file accepts writes.
    pub fn open(&self, ino: u64, write: bool) -> Result<Opened> {
        self.open_access(ino, true, write)
    }

    /// Open a file with an explicit access mode (`read` false: opened write-only).
    pub fn open_access(&self, ino: u64, read: bool, write: bool) -> Result<Opened> {
        match ino {
            CTL => Ok(Opened::Stream {
                fh: self.new_handle(Handle::Control(Arc::new(ControlStream {
                    state: Mutex::default(),
                    discard_answers: !read,
                }))),
                seekable: false,
            }),
            REGISTRY if !write => Ok(Opened::Stream {
                fh: self.new_handle(Handle::Registry(Arc::new(Mutex::new(
                    self.registry_stream(),
                )))),
                seekable: true,
            }),
            STATUS | CHECKPOINTS | METRICS if !write => {
                let engine = self.controller.engine();
                let bytes = match ino {
                    STATUS => views::to_pretty_text(&views::Status::of(engine)),
                    METRICS => crate::metrics::render(engine),
                    _ => views::checkpoint_lines(engine.checkpoints().iter().map(|m| &**m)),
                };
                crate::fsutil::release_free_memory();
                Ok(Opened::Stream {
                    fh: self.new_handle(Handle::Snapshot(bytes.into_bytes())),
                    seekable: true,
                })
            }
            META_DIR | ROOT | LATEST => Err(Error::Invalid("not a regular file".into())),
            STATUS | REGISTRY | CHECKPOINTS | METRICS => {
                Err(Error::ReadOnly(".ckptfs status files are read-only".into()))
            }
            _ => {
                let (cp, index, tree) = self.resolve(ino)?;
                let node = &tree.nodes[index];
                let NodeKind::File {
                    object,
                    size,
                    chunks,
                } = &node.kind
                else {
                    return Err(Error::io(
                        "open",
                        std::io::Error::from_raw_os_error(libc::EISDIR),
                    ));
                };
                if write {
                    return Err(Error::ReadOnly(format!("cp-{cp} is a checkpoint")));
                }
                if let Some(chunks) = chunks {
                    if *size > MAX_ASSEMBLED {
                        // A large append-only file (a WAL): every read verifies the chunks
                        // it spans against their ids.
                        if let Err(e) = chunks.validate(*size) {
                            return Err(self.cannot_serve(cp, &tree, index, object, e));
                        }
                        return Ok(Opened::Stream {
                            fh: self.new_handle(Handle::Chunked(Arc::new((chunks.clone(), *size)))),
                            seekable: true,
                        });
                    }
                    // An append-only file stored as chunks (a MANIFEST, a small WAL):
                    // assembled and verified whole, then served from memory.
                    let store = self.controller.engine().object_store();
                    return match chunks.read(store, object, *size) {
                        Ok(bytes) => Ok(Opened::Stream {
                            fh: self.new_handle(Handle::Snapshot(bytes)),
                            seekable: true,
                        }),
                        Err(e) => Err(self.cannot_serve(cp, &tree, index, object, e)),
                    };
                }
                self.prefetch_after(&tree, index);
                let opened = self
                    .verify_once(object, *size)
                    .and_then(|_| self.controller.engine().object_store().open(object));
                let file = match opened {
                    Ok(file) => Arc::new(file),
                    Err(e) => return Err(self.cannot_serve(cp, &tree, index, object, e)),
                };
                let fh = self.new_handle(Handle::Object(file.clone()));
                Ok(Opened::Object {
                    fh,
                    file,
                    object: *object,
                })
            }
        }
    }

    /// A copy of a checkpoint directory opens its files in order: start fetching the next
    /// few after `index` (object storage; nothing happens where objects are local).
    fn prefetch_after(&self, tree: &CheckpointTree, index: usize) {
        let NodeKind::Dir(children) = &tree.nodes[tree.nodes[index].parent].kind else {
            return;
        };
        let Some(at) = children.iter().position(|c| *c == index) else {
            return;
        };
        let ids: Vec<ObjectId> = children[at + 1..]
            .iter()
            .filter_map(|c| match &tree.nodes[*c].kind {
                NodeKind::File {
                    object,
                    chunks: None,
                    ..
                } => Some(*object),
                _ => None,
            })
            .take(PREFETCH_FILES)
            .collect();
        self.controller.engine().object_store().prefetch(&ids);
    }

    /// The error for a file of cp-N that cannot be opened: gone if the checkpoint was
    /// dropped meanwhile, else logged and recorded with the object and the path it has.
    fn cannot_serve(
        &self,
        cp: u64,
        tree: &CheckpointTree,
        index: usize,
        object: &ObjectId,
        e: Error,
    ) -> Error {
        if self.controller.engine().manifest(cp).is_none() {
            return Error::NoSuchCheckpoint(cp);
        }
        let path = tree.path_of(index);
        log::error!("cannot serve {path} (object {object}): {e}");
        self.controller
            .engine()
            .record_error(format!("{path}: {e}"));
        e
    }

    /// Check an object's size and checksum the first time this daemon serves it, so a
    /// corrupt object is an EIO at open, never silently wrong bytes in a copy. Objects are
    /// immutable, so once is enough; the cost is one sequential read, which also warms the
    /// page cache for the reads that follow.
    fn verify_once(&self, object: &ObjectId, size: u64) -> Result<()> {
        if !self.verify || lock(&self.verified).contains(object) {
            return Ok(());
        }
        self.controller
            .engine()
            .object_store()
            .verify(object, size)?;
        lock(&self.verified).insert(*object);
        Ok(())
    }

    /// Read from an open handle. `reply` is called now, or later for a control handle
    /// whose next answer is still being worked on (a checkpoint uploading).
    pub fn read(&self, fh: u64, offset: u64, size: u32, reply: ReadCallback) {
        let handle = match lock(&self.handles).get(&fh) {
            Some(Handle::Object(file)) => Ok(HandleRef::Object(file.clone())),
            Some(Handle::Snapshot(bytes)) => {
                let start = (offset as usize).min(bytes.len());
                let end = (start + size as usize).min(bytes.len());
                Ok(HandleRef::Bytes(bytes[start..end].to_vec()))
            }
            Some(Handle::Control(stream)) => Ok(HandleRef::Control(stream.clone())),
            Some(Handle::Chunked(file)) => Ok(HandleRef::Chunked(file.clone())),
            Some(Handle::Registry(stream)) => Ok(HandleRef::Registry(stream.clone())),
            Some(Handle::Dir(..)) => Err(Error::io(
                "read",
                std::io::Error::from_raw_os_error(libc::EISDIR),
            )),
            None => Err(Error::io(
                "read",
                std::io::Error::from_raw_os_error(libc::EBADF),
            )),
        };
        match handle {
            Err(e) => reply(Err(e)),
            Ok(HandleRef::Bytes(b)) => reply(Ok(b)),
            Ok(HandleRef::Registry(stream)) => reply(Ok(self.read_registry(
                &mut lock(&stream),
                offset,
                size as u64,
            ))),
            Ok(HandleRef::Chunked(file)) => {
                let (chunks, file_size) = &*file;
                let store = self.controller.engine().object_store();
                let result = chunks.read_range(store, *file_size, offset, size as u64);
                if let Err(e) = &result {
                    log::error!("cannot read a chunked file: {e}");
                    self.controller.engine().record_error(format!("read: {e}"));
                }
                reply(result);
            }
            Ok(HandleRef::Object(file)) => {
                let mut buf = vec![0u8; size as usize];
                let mut filled = 0;
                let result = loop {
                    match file.read_at(&mut buf[filled..], offset + filled as u64) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            filled += n;
                            if filled == buf.len() {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(Error::io("read stored object", e)),
                    }
                };
                buf.truncate(filled);
                reply(result.map(|_| buf));
            }
            Ok(HandleRef::Control(stream)) => {
                let mut st = lock(&stream.state);
                match st.take(size) {
                    Some(data) => {
                        drop(st);
                        reply(Ok(data));
                    }
                    None => st.waiting.push_back((size, reply)),
                }
            }
        }
    }

    /// Write control commands. Lines run when complete: text after the last newline waits
    /// for the next write (or the close), so a line split across writes runs once, whole.
    /// The complete lines of a write are parsed and validated first: one bad line fails the
    /// write with EINVAL, nothing runs, and the error is the handle's next answer.
    pub fn write(&self, fh: u64, data: &[u8]) -> Result<usize> {
        let stream = match lock(&self.handles).get(&fh) {
            Some(Handle::Control(stream)) => stream.clone(),
            Some(_) => return Err(Error::ReadOnly("only .ckptfs/ctl is writable".into())),
            None => {
                return Err(Error::io(
                    "write",
                    std::io::Error::from_raw_os_error(libc::EBADF),
                ))
            }
        };
        // `carried`: how much of `complete` earlier writes handed over.
        let (complete, carried) = {
            let mut st = lock(&stream.state);
            // Only the new bytes can hold the last newline: no rescans of old text.
            match data.iter().rposition(|b| *b == b'\n') {
                Some(end) => {
                    let mut text = std::mem::take(&mut st.unfinished);
                    let carried = text.len();
                    text.extend_from_slice(&data[..=end]);
                    st.unfinished = data[end + 1..].to_vec();
                    (text, carried)
                }
                None => {
                    st.unfinished.extend_from_slice(data);
                    (Vec::new(), 0)
                }
            }
        };
        if lock(&stream.state).unfinished.len() > MAX_LINE {
            lock(&stream.state).unfinished.clear();
            let e = Error::Invalid(format!(
                "a control line is longer than {MAX_LINE} bytes; nothing of it runs"
            ));
            self.controller.engine().record_error(e.to_string());
            push_answers(&stream, vec![Some(control::error_json(&e))]);
            return Err(e);
        }
        if !complete.is_empty() {
            if let Err(e) = self.run_lines(&stream, &complete) {
                // ENOBUFS asks for a retry of the same write: what earlier writes carried
                // over stays pending. Any other refusal judged the line that carried text
                // belongs to: it is dropped with it (else every later line would be glued
                // to a line that can never parse).
                lock(&stream.state).unfinished = if e.errno() == libc::ENOBUFS {
                    complete[..carried].to_vec()
                } else {
                    Vec::new()
                };
                return Err(e);
            }
        }
        Ok(data.len())
    }

    /// Parse, validate and run complete lines on behalf of a control handle.
    fn run_lines(&self, stream: &Arc<ControlStream>, text: &[u8]) -> Result<()> {
        let commands = control::parse_write(text).and_then(|c| {
            self.controller.validate(&c)?;
            Ok(c)
        });
        let commands = match commands {
            Ok(c) => c,
            Err(e) => {
                self.controller.engine().record_error(e.to_string());
                push_answers(stream, vec![Some(control::error_json(&e))]);
                return Err(e);
            }
        };
        let first = {
            let mut st = lock(&stream.state);
            if !stream.discard_answers && st.slots.len() + commands.len() > MAX_UNREAD_ANSWERS {
                return Err(Error::io(
                    format!(
                        "this handle holds {} unread answers (at most {MAX_UNREAD_ANSWERS}); \
                         read them before writing more",
                        st.slots.len()
                    ),
                    std::io::Error::from_raw_os_error(libc::ENOBUFS),
                ));
            }
            let first = st.base + st.slots.len();
            if !stream.discard_answers {
                st.slots.extend(std::iter::repeat_n(None, commands.len()));
            }
            first
        };
        if stream.discard_answers {
            // Nobody reads these answers: a command refused later (a busy checkpoint, a
            // failed write) must at least show in status.
            let engine = self.controller.engine().clone();
            self.controller.execute(
                commands,
                Arc::new(move |_, line: String| {
                    if let Ok(answer) = serde_json::from_str::<serde_json::Value>(&line) {
                        if answer["ok"] == false {
                            let error = answer["error"].as_str().unwrap_or("command failed");
                            engine.record_error(format!("control command refused: {error}"));
                        }
                    }
                }),
            );
            return Ok(());
        }
        let weak = Arc::downgrade(stream);
        let answer: control::AnswerSink = Arc::new(move |index, line| {
            if let Some(stream) = weak.upgrade() {
                let ready = {
                    let mut st = lock(&stream.state);
                    if let Some(slot) = (first + index)
                        .checked_sub(st.base)
                        .and_then(|i| st.slots.get_mut(i))
                    {
                        *slot = Some(line);
                    }
                    st.deliverable()
                };
                for (callback, data) in ready {
                    callback(Ok(data));
                }
            }
        });
        self.controller.execute(commands, answer);
        Ok(())
    }

    pub fn release(&self, fh: u64) {
        let handle = lock(&self.handles).remove(&fh);
        if let Some(Handle::Registry(stream)) = handle {
            // Freed here, whoever still holds the stream (a read that just replied).
            drop(std::mem::take(&mut *lock(&stream)));
            crate::fsutil::release_free_memory();
        } else if let Some(Handle::Control(stream)) = handle {
            // A last line without a newline (`echo -n checkpoint > ctl`) runs at close.
            let rest = std::mem::take(&mut lock(&stream.state).unfinished);
            if !rest.is_empty() {
                let _ = self.run_lines(&stream, &rest);
            }
            // Readers still parked (another thread of the process) get end-of-file.
            let waiting: Vec<_> = lock(&stream.state).waiting.drain(..).collect();
            for (_, callback) in waiting {
                callback(Ok(Vec::new()));
            }
        }
    }

    /// `rmdir cp-N` drops checkpoint N; anything else is refused. Refused with EBUSY while
    /// cp-N itself is open (a listing in progress): the kernel marks a removed directory
    /// dead and a listing on it then ends early without error, so a `cp -r` racing the
    /// drop could succeed with part of the checkpoint. Directories below cp-N keep their
    /// listings (see [`CkptFs::opendir`]); files below it fail to open once it is gone.
    pub fn rmdir(&self, parent: u64, name: &str) -> Result<()> {
        if parent != ROOT {
            return Err(if split_ino(parent).is_some() {
                Error::ReadOnly(format!("{name} is part of a checkpoint"))
            } else {
                Error::io("rmdir", std::io::Error::from_raw_os_error(libc::EPERM))
            });
        }
        let Some(cp) = parse_checkpoint_dir(name) else {
            return Err(if name == META_DIR_NAME {
                Error::io("rmdir", std::io::Error::from_raw_os_error(libc::EPERM))
            } else if name == "latest" {
                Error::io("rmdir", std::io::Error::from_raw_os_error(libc::ENOTDIR))
            } else {
                Error::NotFound(name.to_string())
            });
        };
        // Held through the drop, so no opendir of cp-N slips in between check and drop.
        // The kernel releases a closed directory asynchronously (`ls cp-N && rmdir cp-N`
        // may arrive first): wait a moment for that before calling it busy.
        let mut listing = lock(&self.listing);
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while listing.get(&cp).is_some_and(|n| *n > 0) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            listing = self
                .listing_released
                .wait_timeout(listing, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if listing.get(&cp).is_some_and(|n| *n > 0) {
            return Err(Error::Busy(format!(
                "cp-{cp} is open (being listed, e.g. by a copy); try again when it is closed"
            )));
        }
        self.controller.engine().delete_checkpoint(cp)?;
        self.root_generation.fetch_add(1, Ordering::SeqCst);
        lock(&self.trees).remove(&cp);
        drop(listing);
        lock(&self.shown).remove(&cp);
        if let Some(inv) = lock(&self.invalidator).clone() {
            inv.inode(LATEST);
        }
        Ok(())
    }

    /// The error for any other change (create, unlink, rename, mkdir, setattr...).
    pub fn refuse_change(&self, parent_or_ino: u64) -> Error {
        if split_ino(parent_or_ino).is_some() {
            Error::ReadOnly("checkpoints are read-only".into())
        } else {
            Error::io("change", std::io::Error::from_raw_os_error(libc::EPERM))
        }
    }

    fn registry_stream(&self) -> RegistryStream {
        let engine = self.controller.engine();
        let counts = engine.reference_counts();
        // Each object's referencing checkpoints as runs of consecutive retained ones: with
        // thousands of checkpoints, a list of every one would be millions of numbers.
        let checkpoints = engine.checkpoints();
        let rows = object_histories(checkpoints.iter().map(|m| &**m))
            .into_iter()
            .collect();
        RegistryStream {
            rows,
            counts,
            next: 0,
            window: Vec::new(),
            start: 0,
        }
    }

    /// Bytes `offset..offset + size` of the registry view, writing rows as far as needed
    /// (from the first row again if the reader went back before the text still held).
    fn read_registry(&self, stream: &mut RegistryStream, offset: u64, size: u64) -> Vec<u8> {
        if offset < stream.start {
            stream.next = 0;
            stream.window.clear();
            stream.start = 0;
        }
        loop {
            let end = stream.start + stream.window.len() as u64;
            let skip = (offset.min(end) - stream.start) as usize;
            stream.window.drain(..skip);
            stream.start += skip as u64;
            if end >= offset + size || stream.next == stream.rows.len() {
                break;
            }
            let (id, row) = &stream.rows[stream.next];
            self.registry_row(&mut stream.window, id, row, &stream.counts);
            stream.next += 1;
        }
        let from = ((offset - stream.start) as usize).min(stream.window.len());
        let to = (from + size as usize).min(stream.window.len());
        stream.window[from..to].to_vec()
    }

    /// One row of the registry view (one row per stored object: 100,000 and more, so
    /// written as the reader gets to them).
    fn registry_row(
        &self,
        out: &mut Vec<u8>,
        id: &ObjectId,
        history: &ObjectHistory,
        counts: &std::collections::BTreeMap<ObjectId, u32>,
    ) {
        // File lists are not sized in the manifests: the store knows.
        let size = history.size.unwrap_or_else(|| {
            self.controller
                .engine()
                .object_store()
                .local_path(id)
                .and_then(|p| std::fs::symlink_metadata(p).ok())
                .map_or(0, |m| m.len())
        });
        let refcount = counts.get(id).copied().unwrap_or(0);
        let row = views::RegistryRow::of(*id, history, size, refcount);
        // Into a vector, a row of strings and numbers cannot fail to serialise.
        let _ = serde_json::to_writer(&mut *out, &row);
        out.push(b'\n');
    }

    /// The answers the kernel may cache: immutable entries for an hour, the rest a second.
    pub fn ttl(attr: &Attr) -> Duration {
        if attr.immutable {
            Duration::from_secs(3600)
        } else {
            Duration::from_secs(1)
        }
    }
}

/// Files fetched ahead of a sequential copy (object storage).
const PREFETCH_FILES: usize = 8;

enum HandleRef {
    Object(Arc<File>),
    Bytes(Vec<u8>),
    Chunked(Arc<(Chunks, u64)>),
    Control(Arc<ControlStream>),
    Registry(Arc<Mutex<RegistryStream>>),
}

fn push_answers(stream: &Arc<ControlStream>, answers: Vec<Option<String>>) {
    if stream.discard_answers {
        return;
    }
    let ready = {
        let mut st = lock(&stream.state);
        st.slots.extend(answers);
        st.deliverable()
    };
    for (callback, data) in ready {
        callback(Ok(data));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::{Engine, EngineConfig};

    fn fs_with_checkpoints(dir: &std::path::Path, n: usize) -> Arc<CkptFs> {
        fs_with(dir, n, 1)
    }

    fn fs_with(dir: &std::path::Path, n: usize, max_concurrent: usize) -> Arc<CkptFs> {
        let mut config = EngineConfig::new(dir.join("store"));
        config.backends = vec!["A/0".parse().unwrap()];
        config.retain = Some(10);
        config.max_concurrent = max_concurrent;
        let engine = Engine::open(config).unwrap();
        for i in 0..n {
            engine
                .put(&"A/0".parse().unwrap(), b"k", i.to_string().as_bytes())
                .unwrap();
            engine.checkpoint().unwrap();
        }
        CkptFs::new(Arc::new(Controller::new(engine)))
    }

    fn ids(fs: &CkptFs) -> Vec<u64> {
        fs.controller()
            .engine()
            .checkpoints()
            .iter()
            .map(|m| m.id)
            .collect()
    }

    fn ctl(fs: &CkptFs) -> u64 {
        match fs.open(CTL, true).unwrap() {
            Opened::Stream { fh, .. } => fh,
            Opened::Object { .. } => unreachable!(),
        }
    }

    fn read_now(fs: &CkptFs, fh: u64) -> Vec<u8> {
        let (tx, rx) = std::sync::mpsc::channel();
        fs.read(fh, 0, 4096, Box::new(move |r| tx.send(r.unwrap()).unwrap()));
        rx.recv_timeout(Duration::from_secs(30)).unwrap()
    }

    fn read_at(fs: &CkptFs, fh: u64, offset: u64, size: u32) -> Vec<u8> {
        let (tx, rx) = std::sync::mpsc::channel();
        fs.read(
            fh,
            offset,
            size,
            Box::new(move |r| tx.send(r.unwrap()).unwrap()),
        );
        rx.recv_timeout(Duration::from_secs(30)).unwrap()
    }

    /// The registry view is written as it is read: any read pattern (small windows,
    /// skipping ahead, going back) gives the bytes of one whole read.
    #[test]
    fn the_registry_view_reads_the_same_in_any_windows() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 6);
        let open = || match fs.open(REGISTRY, false).unwrap() {
            Opened::Stream { fh, .. } => fh,
            Opened::Object { .. } => unreachable!(),
        };
        let fh = open();
        let whole = read_at(&fs, fh, 0, 1 << 30);
        let rows = whole
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        assert!(rows >= 6, "{rows} rows");
        assert!(read_at(&fs, fh, whole.len() as u64, 100).is_empty());
        fs.release(fh);
        for window in [1u32, 7, 100, 4096] {
            let fh = open();
            let mut got = Vec::new();
            loop {
                let piece = read_at(&fs, fh, got.len() as u64, window);
                if piece.is_empty() {
                    break;
                }
                got.extend(piece);
            }
            assert_eq!(got, whole, "windows of {window}");
            // Back to earlier bytes, and ahead past unread ones.
            assert_eq!(read_at(&fs, fh, 3, 10), whole[3..13]);
            let mid = whole.len() / 2;
            assert_eq!(read_at(&fs, fh, mid as u64, 20), whole[mid..mid + 20]);
            assert_eq!(read_at(&fs, fh, 0, 5), whole[..5]);
            fs.release(fh);
        }
    }

    /// `cat cmds > ctl` may split a line across two writes: it must run once, whole.
    #[test]
    fn a_line_split_across_writes_runs_once_whole() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 3);
        let fh = ctl(&fs);
        assert_eq!(fs.write(fh, b"delete ").unwrap(), 7);
        assert_eq!(ids(&fs), vec![1, 2, 3], "half a line ran");
        assert_eq!(fs.write(fh, b"3\ndel").unwrap(), 5);
        assert_eq!(ids(&fs), vec![1, 2]);
        assert_eq!(read_now(&fs, fh), b"{\"ok\":true}\n");
        // The unfinished "del" + "ete 9" is bad as a whole line: refused, nothing runs, and
        // the bad line is gone, carried part included.
        let err = fs.write(fh, b"ete 9\n").unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL);
        assert!(String::from_utf8(read_now(&fs, fh))
            .unwrap()
            .contains("no such checkpoint 9"));
        assert_eq!(ids(&fs), vec![1, 2]);
        fs.write(fh, b"delete 2\n").unwrap();
        assert_eq!(read_now(&fs, fh), b"{\"ok\":true}\n");
        assert_eq!(ids(&fs), vec![1]);
        // A last line without newline runs when the handle is closed.
        fs.write(fh, b"delete 1").unwrap();
        assert_eq!(ids(&fs), vec![1]);
        fs.release(fh);
        assert!(ids(&fs).is_empty());
    }

    /// A stream without newlines (say `cat /dev/zero > ctl`) is refused once it passes
    /// the line limit, instead of growing without bound; the handle works on afterwards.
    #[test]
    fn an_endless_line_is_refused_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 1);
        let fh = ctl(&fs);
        let chunk = vec![b'x'; 1 << 20];
        let mut refused = None;
        for _ in 0..(MAX_LINE >> 20) + 2 {
            if let Err(e) = fs.write(fh, &chunk) {
                refused = Some(e);
                break;
            }
        }
        assert_eq!(refused.expect("never refused").errno(), libc::EINVAL);
        assert!(String::from_utf8(read_now(&fs, fh))
            .unwrap()
            .contains("longer than"));
        fs.write(fh, b"delete 1\n").unwrap();
        assert_eq!(read_now(&fs, fh), b"{\"ok\":true}\n");
        assert!(ids(&fs).is_empty());
    }

    #[test]
    fn inode_numbers_and_lookups_are_stable() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 2);
        let cp = fs.lookup(ROOT, "cp-2").unwrap();
        assert_eq!(cp.ino, 2 << 32);
        let op = fs.lookup(cp.ino, "A").unwrap();
        let sub = fs.lookup(op.ino, "0").unwrap();
        let current = fs.lookup(sub.ino, "CURRENT").unwrap();
        assert_eq!(fs.getattr(current.ino).unwrap(), current);
        assert_eq!(fs.parent_of(sub.ino), op.ino);
        assert_eq!(fs.readlink(LATEST).unwrap(), "cp-2");
        for bad in ["cp-02", "cp-", "cp-x", "cp-3", "cp-2/"] {
            assert!(fs.lookup(ROOT, bad).is_err(), "{bad}");
        }
        fs.rmdir(ROOT, "cp-2").unwrap();
        assert_eq!(fs.lookup(ROOT, "cp-2").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.readlink(LATEST).unwrap(), "cp-1");
        let meta: Vec<(String, u64)> = fs
            .readdir(META_DIR)
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.attr.ino))
            .collect();
        let expected = [
            ("ctl", CTL),
            ("checkpoints", CHECKPOINTS),
            ("metrics", METRICS),
            ("registry", REGISTRY),
            ("status", STATUS),
        ];
        assert_eq!(meta, expected.map(|(n, i)| (n.to_string(), i)));
        for (name, ino) in expected {
            assert_eq!(fs.lookup(META_DIR, name).unwrap().ino, ino);
        }
    }

    /// `.ckptfs/metrics` is a picture taken at open, read-only like status.
    #[test]
    fn the_metrics_file_is_a_read_only_picture() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 2);
        let fh = match fs.open(METRICS, false).unwrap() {
            Opened::Stream { fh, seekable: true } => fh,
            _ => panic!("not a seekable stream"),
        };
        let text = String::from_utf8(read_at(&fs, fh, 0, 1 << 20)).unwrap();
        assert!(
            text.contains("\nckptfs_checkpoints_completed_total 2\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        fs.release(fh);
        assert_eq!(fs.open(METRICS, true).err().unwrap().errno(), libc::EROFS);
    }

    /// Read answers until `n` lines have arrived.
    fn read_lines(fs: &CkptFs, fh: u64, n: usize) -> Vec<serde_json::Value> {
        (0..n)
            .map(|_| serde_json::from_slice(&read_now(fs, fh)).unwrap())
            .collect()
    }

    fn value_in(store: &std::path::Path, id: u64, key: &[u8]) -> Option<Vec<u8>> {
        let out = tempfile::tempdir().unwrap();
        let dest = out.path().join("r");
        crate::restore::restore_checkpoint(store, id, &dest, |_| {}).unwrap();
        crate::backend::scan_dir(&dest.join("A/0"))
            .unwrap()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Issue 7, defect 2: every line takes effect at its position, even within one write: a
    /// checkpoint holds the data lines before it and none after.
    #[test]
    fn a_checkpoint_holds_exactly_the_lines_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with(dir.path(), 0, 2);
        let fh = ctl(&fs);
        fs.write(
            fh,
            b"put A/0 k 1\ncheckpoint\nput A/0 k 2\ncheckpoint\nput A/0 k 3\n",
        )
        .unwrap();
        let answers = read_lines(&fs, fh, 5);
        assert!(answers.iter().all(|a| a["ok"] == true), "{answers:?}");
        let (first, second) = (
            answers[1]["id"].as_u64().unwrap(),
            answers[3]["id"].as_u64().unwrap(),
        );
        let store = dir.path().join("store");
        assert_eq!(value_in(&store, first, b"k"), Some(b"1".to_vec()));
        assert_eq!(value_in(&store, second, b"k"), Some(b"2".to_vec()));
        assert_eq!(
            fs.controller()
                .engine()
                .get(&"A/0".parse().unwrap(), b"k")
                .unwrap(),
            Some(b"3".to_vec())
        );
    }

    /// Issue 7, defects 2 and 6: with no free slot a checkpoint line is answered EBUSY at
    /// once; nothing waits, so nothing later can leak into it and nothing piles up.
    #[test]
    fn checkpoints_without_a_free_slot_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 1);
        let pending = fs.controller().engine().begin_checkpoint().unwrap();
        let fh = ctl(&fs);
        let mut text = Vec::new();
        for _ in 0..50 {
            text.extend_from_slice(b"checkpoint\nput A/0 k later\n");
        }
        fs.write(fh, &text).unwrap();
        let answers = read_lines(&fs, fh, 100);
        for pair in answers.chunks(2) {
            assert_eq!(pair[0]["errno"], libc::EBUSY, "{pair:?}");
            assert_eq!(pair[1]["ok"], true, "{pair:?}");
        }
        assert!(
            lock(fs.controller().workers_for_tests()).is_empty(),
            "refused checkpoints started threads"
        );
        // On a write-only handle nobody reads the answer: the refusal shows in status.
        let wo = match fs.open_access(CTL, false, true).unwrap() {
            Opened::Stream { fh, .. } => fh,
            Opened::Object { .. } => unreachable!(),
        };
        fs.write(wo, b"checkpoint\n").unwrap();
        let last = fs
            .controller()
            .engine()
            .status()
            .last_error
            .unwrap_or_default();
        assert!(last.contains("already in flight"), "{last}");
        let manifest = pending.complete().unwrap();
        assert_eq!(
            value_in(&dir.path().join("store"), manifest.id, b"k"),
            Some(b"0".to_vec())
        );
    }

    /// Issue 7, defect 8: answers of a handle opened write-only are not kept, and a reading
    /// handle that never reads is refused (ENOBUFS) before it holds too many.
    #[test]
    fn unread_answers_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 1);
        let lines = "put A/0 k v\n".repeat(10_000);
        let wo = match fs.open_access(CTL, false, true).unwrap() {
            Opened::Stream { fh, .. } => fh,
            Opened::Object { .. } => unreachable!(),
        };
        for _ in 0..(MAX_UNREAD_ANSWERS / 10_000 + 2) {
            fs.write(wo, lines.as_bytes()).unwrap();
        }
        match lock(&fs.handles).get(&wo) {
            Some(Handle::Control(stream)) => assert!(lock(&stream.state).slots.is_empty()),
            _ => unreachable!(),
        }
        let rw = ctl(&fs);
        let mut refused = None;
        for _ in 0..(MAX_UNREAD_ANSWERS / 10_000 + 2) {
            if let Err(e) = fs.write(rw, lines.as_bytes()) {
                refused = Some(e);
                break;
            }
        }
        assert_eq!(refused.expect("never refused").errno(), libc::ENOBUFS);
        // Fill up to the limit exactly, one answer at a time.
        while fs.write(rw, b"put A/0 k v\n").is_ok() {}
        // A line begun by an accepted write survives a refused one.
        fs.write(rw, b"put A/0 carried ").unwrap();
        let refused = fs.write(rw, b"w\n").unwrap_err();
        assert_eq!(refused.errno(), libc::ENOBUFS);
        // Reading makes room again, and the retried write completes the carried line.
        for _ in 0..20_000 {
            read_now(&fs, rw);
        }
        fs.write(rw, b"w\n").unwrap();
        let engine = fs.controller().engine();
        assert_eq!(
            engine.get(&"A/0".parse().unwrap(), b"carried").unwrap(),
            Some(b"w".to_vec())
        );
    }

    /// Issue 7, defect 11: an open directory lists its full contents until released, even
    /// if its checkpoint is dropped meanwhile; afterwards it cannot be opened at all.
    #[test]
    fn an_open_directory_outlives_a_drop_and_a_closed_one_fails() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 2);
        let cp = fs.lookup(ROOT, "cp-2").unwrap();
        let op = fs.lookup(cp.ino, "A").unwrap();
        let sub = fs.lookup(op.ino, "0").unwrap();
        let fh_cp = fs.opendir(cp.ino).unwrap().0;
        let fh_sub = fs.opendir(sub.ino).unwrap().0;
        let listed = fs.readdir_handle(fh_sub).unwrap().len();
        // While cp-2 itself is open, rmdir is refused.
        assert_eq!(fs.rmdir(ROOT, "cp-2").unwrap_err().errno(), libc::EBUSY);
        fs.releasedir(fh_cp);
        fs.rmdir(ROOT, "cp-2").unwrap();
        assert_eq!(fs.readdir_handle(fh_sub).unwrap().len(), listed);
        assert!(listed > 4);
        fs.releasedir(fh_sub);
        assert_eq!(fs.opendir(cp.ino).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.opendir(op.ino).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.opendir(sub.ino).unwrap_err().errno(), libc::ENOENT);
        // A drop by retention (no rmdir) leaves an open cp-N listing whole.
        let cp1 = fs.lookup(ROOT, "cp-1").unwrap();
        let fh = fs.opendir(cp1.ino).unwrap().0;
        fs.controller().engine().delete_checkpoint(1).unwrap();
        let names: Vec<_> = fs
            .readdir_handle(fh)
            .unwrap()
            .iter()
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(names, vec![".", "..", "A"]);
        fs.releasedir(fh);
    }

    /// Issue 9: trees are a bounded cache; an evicted one is rebuilt with the same inodes.
    #[test]
    fn checkpoint_trees_are_a_bounded_cache_with_stable_inodes() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 3);
        *lock(&fs.trees) = TreeCache::new(1);
        let path = |fs: &CkptFs, cp: &str| {
            let top = fs.lookup(ROOT, cp).unwrap();
            let op = fs.lookup(top.ino, "A").unwrap();
            let sub = fs.lookup(op.ino, "0").unwrap();
            fs.lookup(sub.ino, "CURRENT").unwrap()
        };
        let first = path(&fs, "cp-1");
        for cp in ["cp-2", "cp-3", "cp-2"] {
            path(&fs, cp);
            assert_eq!(lock(&fs.trees).len(), 1);
        }
        assert_eq!(path(&fs, "cp-1"), first);
        assert_eq!(fs.getattr(first.ino).unwrap(), first);
    }

    /// Second review: listing the root builds no checkpoint tree.
    #[test]
    fn listing_the_root_builds_no_tree() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with_checkpoints(dir.path(), 3);
        let names: Vec<_> = fs
            .readdir(ROOT)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec![".ckptfs", "latest", "cp-1", "cp-2", "cp-3"]);
        fs.lookup(ROOT, "cp-2").unwrap();
        assert!(lock(&fs.trees).is_empty());
        let attr = fs.getattr(2 << 32).unwrap();
        assert_eq!((attr.nlink, attr.perm), (3, 0o555));
    }
}
