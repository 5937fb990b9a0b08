//! The thin adapter between fuser and the tree's operations (`ops.rs`): type conversions,
//! errno replies, passthrough of stored objects, cache invalidation. It decides nothing
//! about the tree: every rule is in the operation it calls.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::attr::{Attr, Invalidator, Kind};
use super::inode::DirCache;
use super::ops::{CkptFs, OpenedAs};
use ckptfs_core::error::Error;
use ckptfs_core::fsutil::lock;
use ckptfs_core::store::ObjectId;

/// The fuser `Filesystem` over a [`CkptFs`].
pub struct FuseAdapter {
    fs: Arc<CkptFs>,
    /// Decided at `init`: the kernel and our privileges allow FUSE passthrough.
    passthrough: bool,
    backing: Mutex<BackingCache>,
}

/// One kernel backing id per open stored object, shared by its open handles.
#[derive(Default)]
struct BackingCache {
    by_handle: HashMap<u64, Arc<BackingId>>,
    by_object: HashMap<ObjectId, Weak<BackingId>>,
}

impl FuseAdapter {
    /// fuser's filesystem over `fs`.
    pub fn new(fs: Arc<CkptFs>) -> Self {
        FuseAdapter {
            fs,
            passthrough: false,
            backing: Mutex::new(BackingCache::default()),
        }
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: match a.kind {
            Kind::Dir => FileType::Directory,
            Kind::File => FileType::RegularFile,
            Kind::Symlink => FileType::Symlink,
        },
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn name_str(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::ENOENT)
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        if std::env::var_os("CKPTFS_NO_PASSTHROUGH").is_none()
            && nix::unistd::geteuid().is_root()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            // Stored objects live on an ordinary filesystem (stack depth 0); allow one
            // level so overlay-backed stores work too.
            self.passthrough = config.set_max_stack_depth(2).is_ok();
        }
        log::info!(
            "FUSE passthrough {}",
            if self.passthrough {
                "on"
            } else {
                "off (ordinary reads)"
            }
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        match self.fs.lookup(parent.0, name) {
            Ok(a) => reply.entry(&a.ttl(), &file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&a.ttl(), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.fs.setattr(ino.0, mode, uid, gid, size) {
            Ok(a) => reply.attr(&a.ttl(), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(target.as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(errno(&self.fs.refuse_change(parent.0)))
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(errno(&self.fs.refuse_change(parent.0)))
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let error = self.fs.unlink(parent.0, &name.to_string_lossy(), req.pid());
        reply.error(errno(&error))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        match self.fs.rmdir(parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(errno(&self.fs.refuse_change(parent.0)))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(errno(&self.fs.refuse_change(parent.0)))
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(errno(&self.fs.refuse_change(ino.0)))
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(errno(&self.fs.refuse_change(parent.0)))
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let read = flags.acc_mode() != OpenAccMode::O_WRONLY;
        match self.fs.open_access(ino.0, read, write) {
            Ok(OpenedAs::Object { fh, file, object }) => {
                if self.passthrough {
                    let mut cache = lock(&self.backing);
                    let existing = cache.by_object.get(&object).and_then(Weak::upgrade);
                    let id = match existing {
                        Some(id) => Some(id),
                        None => match reply.open_backing(&*file) {
                            Ok(id) => {
                                let id = Arc::new(id);
                                cache.by_object.insert(object, Arc::downgrade(&id));
                                Some(id)
                            }
                            Err(e) => {
                                log::debug!("passthrough refused for {object}: {e}");
                                None
                            }
                        },
                    };
                    if let Some(id) = id {
                        cache.by_handle.insert(fh, id.clone());
                        cache.by_object.retain(|_, w| w.strong_count() > 0);
                        return reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
                    }
                }
                // Files never change while they exist: keep the page cache across opens.
                // (Not with passthrough: the kernel refuses that combination with EIO, and
                // the backing file's own page cache serves the reads anyway.)
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE)
            }
            // Generated content has no size in advance: direct I/O reads until end of file.
            Ok(OpenedAs::Stream { fh, seekable }) => reply.opened(
                FileHandle(fh),
                if seekable {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NONSEEKABLE
                },
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.fs.read(
            fh.0,
            offset,
            size,
            Box::new(move |result| match result {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e)),
            }),
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(fh.0, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.backing).by_handle.remove(&fh.0);
        self.fs.release(fh.0);
        reply.ok()
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir_as(ino.0, req.uid()) {
            Ok((fh, cache)) => {
                let flags = match cache {
                    DirCache::Off => FopenFlags::empty(),
                    DirCache::Refill => FopenFlags::FOPEN_CACHE_DIR,
                    DirCache::Keep => FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
                };
                reply.opened(FileHandle(fh), flags)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok()
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.fs.readdir_handle(fh.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(
                INodeNo(entry.attr.ino),
                (i + 1) as u64,
                file_attr(&entry.attr).kind,
                &entry.name,
            ) {
                break;
            }
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.fs.readdir_handle(fh.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
            let full = reply.add(
                INodeNo(entry.attr.ino),
                (i + 1) as u64,
                &entry.name,
                &entry.attr.ttl(),
                &file_attr(&entry.attr),
                Generation(0),
            );
            if full {
                break;
            }
        }
        reply.ok()
    }

    // No extended attributes. ENOSYS (rather than ENODATA) lets the kernel remember that
    // and answer EOPNOTSUPP itself: `ls -l` asks three times per entry, and those round
    // trips dominated listing 1,000 checkpoints.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS)
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS)
    }

    /// Terminal probes (isatty's TCGETS) and the like: not a terminal, quietly.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Room in a local store, or in the state directory (cache) of one on object storage.
        let room = self.fs.room();
        match nix::sys::statvfs::statvfs(room) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                255,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }
}

/// Sends invalidations from a thread of its own: the kernel may be waiting on the FUSE
/// thread that caused the change, and a notification sent from it could deadlock.
pub struct NotifierInvalidator {
    tx: Mutex<mpsc::Sender<Invalidation>>,
}

enum Invalidation {
    Entry(u64, String),
    Inode(u64),
}

impl NotifierInvalidator {
    /// The invalidator sending through `notifier`, with its thread started.
    pub fn start(notifier: Notifier) -> Arc<Self> {
        let (tx, rx) = mpsc::channel::<Invalidation>();
        std::thread::Builder::new()
            .name("ckptfs-invalidate".into())
            .spawn(move || {
                for inv in rx {
                    let result = match &inv {
                        Invalidation::Entry(parent, name) => {
                            notifier.inval_entry(INodeNo(*parent), OsStr::new(name))
                        }
                        Invalidation::Inode(ino) => notifier.inval_inode(INodeNo(*ino), 0, 0),
                    };
                    if let Err(e) = result {
                        // ENOENT: the kernel had nothing cached. Anything else is harmless too:
                        // the short TTLs bound how long a stale entry can live.
                        log::debug!("invalidation failed: {e}");
                    }
                }
            })
            .expect("spawn invalidation thread");
        Arc::new(NotifierInvalidator { tx: Mutex::new(tx) })
    }
}

impl Invalidator for NotifierInvalidator {
    fn entry(&self, parent: u64, name: &str) {
        let _ = lock(&self.tx).send(Invalidation::Entry(parent, name.to_string()));
    }

    fn inode(&self, ino: u64) {
        let _ = lock(&self.tx).send(Invalidation::Inode(ino));
    }
}
