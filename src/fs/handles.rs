//! Open files: the handle table, what each kind of handle reads (a stored object, a
//! generated snapshot, a file stored as chunks, the control stream, the registry view), the
//! prefetch of the next files of a directory, and the checksum check at first open.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::control_stream::{ControlStream, ReadCallback};
use super::registry_view::RegistryStream;
use super::tree::{CheckpointTree, NodeKind};
use super::{
    CkptFs, DirEntry, OpenedAs, CHECKPOINTS, CTL, LATEST, META_DIR, METRICS, REGISTRY, ROOT, STATUS,
};
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;
use ckptfs_core::store::chunks::{Chunks, MAX_ASSEMBLED};
use ckptfs_core::store::ObjectId;
use ckptfs_core::views;

/// Which directory an open directory handle is (the root and `cp-N` are watched: see
/// `CkptFs::opendir` and `CkptFs::rmdir`).
pub(super) enum DirOf {
    Root,
    /// The top directory of this checkpoint, opened by this uid.
    Top(u64, u32),
    Other,
}

/// What an open handle reads.
pub(super) enum Handle {
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

/// Files fetched ahead of a sequential copy (object storage).
pub(super) const PREFETCH_FILES: usize = 8;

/// A handle's reader, cloned out of the table's lock so that a read runs without it.
pub(super) enum HandleRef {
    Object(Arc<File>),
    Bytes(Vec<u8>),
    Chunked(Arc<(Chunks, u64)>),
    Control(Arc<ControlStream>),
    Registry(Arc<Mutex<RegistryStream>>),
}

impl CkptFs {
    pub(super) fn new_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, handle);
        fh
    }

    /// The control stream of handle `fh` (writes go only there).
    pub(super) fn control_stream(&self, fh: u64) -> Result<Arc<ControlStream>> {
        match lock(&self.handles).get(&fh) {
            Some(Handle::Control(stream)) => Ok(stream.clone()),
            Some(_) => Err(Error::ReadOnly("only .ckptfs/ctl is writable".into())),
            None => Err(Error::io(
                "write",
                std::io::Error::from_raw_os_error(libc::EBADF),
            )),
        }
    }

    /// Open a file for reading (and writing, with `write`). Checkpoint files are
    /// read-only; the control file accepts writes.
    pub fn open(&self, ino: u64, write: bool) -> Result<OpenedAs> {
        self.open_access(ino, true, write)
    }

    /// Open a file with an explicit access mode (`read` false: opened write-only).
    pub fn open_access(&self, ino: u64, read: bool, write: bool) -> Result<OpenedAs> {
        match ino {
            CTL => Ok(OpenedAs::Stream {
                fh: self.new_handle(Handle::Control(Arc::new(ControlStream {
                    state: Mutex::default(),
                    discard_answers: !read,
                    imports: Mutex::default(),
                }))),
                seekable: false,
            }),
            REGISTRY if !write => Ok(OpenedAs::Stream {
                fh: self.new_handle(Handle::Registry(Arc::new(Mutex::new(
                    self.registry_stream(),
                )))),
                seekable: true,
            }),
            STATUS | CHECKPOINTS | METRICS if !write => {
                let bytes = match ino {
                    STATUS => self.checkpoints.status_text(),
                    METRICS => self.checkpoints.metrics_text(),
                    _ => {
                        views::checkpoint_lines(self.checkpoints.checkpoints().iter().map(|m| &**m))
                    }
                };
                ckptfs_core::fsutil::release_free_memory();
                Ok(OpenedAs::Stream {
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
                if let NodeKind::Generated(bytes) = &node.kind {
                    if write {
                        return Err(Error::ReadOnly(format!("cp-{cp} is a checkpoint")));
                    }
                    // A Flink checkpoint's own `_metadata`, what a restore opens first.
                    if index != 0 && node.parent == 0 && node.name == "_metadata" {
                        self.checkpoints.restore_read(cp, true);
                    }
                    return Ok(OpenedAs::Stream {
                        fh: self.new_handle(Handle::Snapshot(bytes.to_vec())),
                        seekable: true,
                    });
                }
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
                self.checkpoints.restore_read(cp, false);
                if let Some(chunks) = chunks {
                    if *size > MAX_ASSEMBLED {
                        // A large append-only file (a WAL): every read verifies the chunks
                        // it spans against their ids.
                        if let Err(e) = chunks.validate(*size) {
                            return Err(self.cannot_serve(cp, &tree, index, object, e));
                        }
                        return Ok(OpenedAs::Stream {
                            fh: self.new_handle(Handle::Chunked(Arc::new((chunks.clone(), *size)))),
                            seekable: true,
                        });
                    }
                    // An append-only file stored as chunks (a MANIFEST, a small WAL):
                    // assembled and verified whole, then served from memory.
                    let store = self.checkpoints.object_store();
                    return match chunks.read(store, object, *size) {
                        Ok(bytes) => Ok(OpenedAs::Stream {
                            fh: self.new_handle(Handle::Snapshot(bytes)),
                            seekable: true,
                        }),
                        Err(e) => Err(self.cannot_serve(cp, &tree, index, object, e)),
                    };
                }
                self.prefetch_after(&tree, index);
                let opened = self
                    .verify_once(object, *size)
                    .and_then(|_| self.checkpoints.object_store().open(object));
                let file = match opened {
                    Ok(file) => Arc::new(file),
                    Err(e) => return Err(self.cannot_serve(cp, &tree, index, object, e)),
                };
                let fh = self.new_handle(Handle::Object(file.clone()));
                Ok(OpenedAs::Object {
                    fh,
                    file,
                    object: *object,
                })
            }
        }
    }

    /// A copy of a checkpoint directory opens its files in order: start fetching the next
    /// few after `index` (object storage; nothing happens where objects are local).
    pub(super) fn prefetch_after(&self, tree: &CheckpointTree, index: usize) {
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
        self.checkpoints.object_store().prefetch(&ids);
    }

    /// The error for a file of cp-N that cannot be opened: gone if the checkpoint was
    /// dropped meanwhile, else logged and recorded with the object and the path it has.
    pub(super) fn cannot_serve(
        &self,
        cp: u64,
        tree: &CheckpointTree,
        index: usize,
        object: &ObjectId,
        e: Error,
    ) -> Error {
        if self.checkpoints.manifest(cp).is_none() {
            return Error::NoSuchCheckpoint(cp);
        }
        let path = tree.path_of(index);
        log::error!("cannot serve {path} (object {object}): {e}");
        self.checkpoints.record_error(format!("{path}: {e}"));
        e
    }

    /// Check an object's size and checksum the first time this daemon serves it, so a
    /// corrupt object is an EIO at open, never silently wrong bytes in a copy. Objects are
    /// immutable, so once is enough; the cost is one sequential read, which also warms the
    /// page cache for the reads that follow.
    pub(super) fn verify_once(&self, object: &ObjectId, size: u64) -> Result<()> {
        if !self.verify || lock(&self.verified).contains(object) {
            return Ok(());
        }
        self.checkpoints.object_store().verify(object, size)?;
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
                let store = self.checkpoints.object_store();
                let result = chunks.read_range(store, *file_size, offset, size as u64);
                if let Err(e) = &result {
                    log::error!("cannot read a chunked file: {e}");
                    self.checkpoints.record_error(format!("read: {e}"));
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

    /// Close handle `fh`.
    pub fn release(&self, fh: u64) {
        let handle = lock(&self.handles).remove(&fh);
        if let Some(Handle::Registry(stream)) = handle {
            // Freed here, whoever still holds the stream (a read that just replied).
            drop(std::mem::take(&mut *lock(&stream)));
            ckptfs_core::fsutil::release_free_memory();
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
}
