//! Open files and directories ([`Handles`]): the handle table, what each kind of handle
//! reads (a stored object, a generated snapshot, a file stored as chunks, the control
//! stream, the registry view, a directory's picture), which `cp-N` listings are open and by
//! whom, and the objects whose checksum was checked at a first open. The operations that
//! use them are in `ops.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::attr::DirEntry;
use super::control_stream::ControlStream;
use super::registry_view::RegistryStream;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;
use ckptfs_core::store::chunks::Chunks;
use ckptfs_core::store::{ObjectId, ObjectStore};

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

/// A handle's reader, cloned out of the table's lock so that a read runs without it.
pub(super) enum HandleRef {
    Object(Arc<File>),
    Bytes(Vec<u8>),
    Chunked(Arc<(Chunks, u64)>),
    Control(Arc<ControlStream>),
    Registry(Arc<Mutex<RegistryStream>>),
}

/// The open handles of each checkpoint's top directory (`cp-N`), by the uid that opened
/// them (see `CkptFs::rmdir`).
#[derive(Default)]
pub(super) struct Listings(HashMap<u64, BTreeMap<u32, usize>>);

impl Listings {
    /// User `uid` opened `cp-{cp}`.
    pub(super) fn opened(&mut self, cp: u64, uid: u32) {
        *self.0.entry(cp).or_default().entry(uid).or_default() += 1;
    }

    /// User `uid` closed a handle of `cp-{cp}`: a checkpoint no one lists is forgotten.
    fn closed(&mut self, cp: u64, uid: u32) {
        if let Some(uids) = self.0.get_mut(&cp) {
            if let Some(n) = uids.get_mut(&uid) {
                *n -= 1;
                if *n == 0 {
                    uids.remove(&uid);
                }
            }
            if uids.is_empty() {
                self.0.remove(&cp);
            }
        }
    }

    /// Whether `cp-{cp}` is open.
    pub(super) fn is_listed(&self, cp: u64) -> bool {
        self.0.contains_key(&cp)
    }

    /// The users with `cp-{cp}` open.
    pub(super) fn listers(&self, cp: u64) -> Vec<u32> {
        self.0
            .get(&cp)
            .map(|uids| uids.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Whether no `cp-N` is open.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The open handles. A handle number is never reused while the daemon runs; a `cp-N`
/// handle is counted in the [`Listings`] from its open to its release; an object is
/// verified at most once.
pub(super) struct Handles {
    table: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// Open `cp-N` handles by uid.
    listings: Mutex<Listings>,
    /// Signalled when a `cp-N` handle is released.
    listing_released: Condvar,
    /// Objects whose checksum this daemon has verified.
    verified: Mutex<HashSet<ObjectId>>,
    /// Verify each object at its first open (the default); off with `--no-verify`.
    verify: bool,
}

impl Handles {
    /// No handle open; objects verified at their first open if `verify`.
    pub(super) fn new(verify: bool) -> Self {
        Handles {
            table: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            listings: Mutex::default(),
            listing_released: Condvar::new(),
            verified: Mutex::default(),
            verify,
        }
    }

    /// Open `handle`: its number.
    pub(super) fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.table).insert(fh, handle);
        fh
    }

    /// Close handle `fh`: what it was, if open. A `cp-N` handle leaves the listings (and
    /// wakes an `rmdir` waiting for it).
    pub(super) fn remove(&self, fh: u64) -> Option<Handle> {
        let handle = lock(&self.table).remove(&fh);
        if let Some(Handle::Dir(_, DirOf::Top(cp, uid))) = &handle {
            lock(&self.listings).closed(*cp, *uid);
            self.listing_released.notify_all();
        }
        handle
    }

    /// The control stream of handle `fh` (writes go only there).
    pub(super) fn control_stream(&self, fh: u64) -> Result<Arc<ControlStream>> {
        match lock(&self.table).get(&fh) {
            Some(Handle::Control(stream)) => Ok(stream.clone()),
            Some(_) => Err(Error::ReadOnly("only .ckptfs/ctl is writable".into())),
            None => Err(Error::io(
                "write",
                std::io::Error::from_raw_os_error(libc::EBADF),
            )),
        }
    }

    /// The entries of directory handle `fh`.
    pub(super) fn dir_entries(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>> {
        match lock(&self.table).get(&fh) {
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

    /// What a read of `size` bytes at `offset` of handle `fh` reads (a snapshot's bytes
    /// already cut out).
    pub(super) fn reader(&self, fh: u64, offset: u64, size: u32) -> Result<HandleRef> {
        match lock(&self.table).get(&fh) {
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
        }
    }

    /// The open `cp-N` listings, locked: held, no `cp-N` opens or closes.
    pub(super) fn listings(&self) -> MutexGuard<'_, Listings> {
        lock(&self.listings)
    }

    /// The listings, locked once `cp-{cp}` is not open or `within` has passed.
    pub(super) fn listings_once_closed(
        &self,
        cp: u64,
        within: Duration,
    ) -> MutexGuard<'_, Listings> {
        let mut listings = lock(&self.listings);
        let deadline = Instant::now() + within;
        while listings.is_listed(cp) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            listings = ckptfs_core::fsutil::wait_timeout(&self.listing_released, listings, left);
        }
        listings
    }

    /// Check an object's size and checksum the first time this daemon serves it, so a
    /// corrupt object is an EIO at open, never silently wrong bytes in a copy. Objects are
    /// immutable, so once is enough; the cost is one sequential read, which also warms the
    /// page cache for the reads that follow.
    pub(super) fn verify_once(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectId,
        size: u64,
    ) -> Result<()> {
        if !self.verify || lock(&self.verified).contains(object) {
            return Ok(());
        }
        store.verify(object, size)?;
        lock(&self.verified).insert(*object);
        Ok(())
    }
}

/// Up to `size` bytes of `file` at `offset`: fewer only at its end.
pub(super) fn read_object(file: &File, offset: u64, size: u32) -> Result<Vec<u8>> {
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
    result.map(|_| buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint is listed while any of its handles is open, by each user that has
    /// one open.
    #[test]
    fn a_checkpoint_is_listed_until_its_last_handle_closes() {
        let mut listings = Listings::default();
        listings.opened(1, 0);
        listings.opened(1, 0);
        listings.opened(1, 1000);
        listings.opened(2, 1000);
        assert_eq!(listings.listers(1), [0, 1000]);
        listings.closed(1, 0);
        assert_eq!(listings.listers(1), [0, 1000]);
        listings.closed(1, 0);
        assert_eq!(listings.listers(1), [1000]);
        listings.closed(1, 1000);
        assert!(!listings.is_listed(1));
        assert!(listings.listers(1).is_empty());
        // Closing what is not open changes nothing.
        listings.closed(2, 0);
        assert_eq!(listings.listers(2), [1000]);
        listings.closed(2, 1000);
        assert!(listings.is_empty());
    }

    /// Releasing a `cp-N` handle is what ends its listing; handle numbers are not reused.
    #[test]
    fn a_released_directory_handle_leaves_the_listings() {
        let handles = Handles::new(true);
        handles.listings().opened(4, 7);
        let top = handles.insert(Handle::Dir(Arc::default(), DirOf::Top(4, 7)));
        let other = handles.insert(Handle::Dir(Arc::default(), DirOf::Other));
        assert_ne!(top, other);
        assert!(handles.listings().is_listed(4));
        assert!(handles.remove(other).is_some());
        assert!(handles.listings().is_listed(4));
        assert!(handles.remove(top).is_some());
        assert!(handles.listings().is_empty());
        assert!(handles.remove(top).is_none());
        assert_eq!(
            handles.dir_entries(top).unwrap_err().errno(),
            libc::EBADF,
            "a released handle"
        );
        let snapshot = handles.insert(Handle::Snapshot(b"0123456789".to_vec()));
        assert!(snapshot > other);
        match handles.reader(snapshot, 8, 100).unwrap() {
            HandleRef::Bytes(bytes) => assert_eq!(bytes, b"89"),
            _ => panic!("a snapshot reads its bytes"),
        }
        assert_eq!(
            handles.dir_entries(snapshot).unwrap_err().errno(),
            libc::ENOTDIR
        );
        let not_control = handles.control_stream(snapshot).err().unwrap();
        assert_eq!(not_control.errno(), libc::EROFS);
    }

    /// An rmdir waiting for a listing to close wakes when it is released.
    #[test]
    fn a_wait_for_a_listing_ends_at_its_release() {
        let handles = Arc::new(Handles::new(true));
        handles.listings().opened(3, 0);
        let fh = handles.insert(Handle::Dir(Arc::default(), DirOf::Top(3, 0)));
        let closer = {
            let handles = handles.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                handles.remove(fh);
            })
        };
        let listings = handles.listings_once_closed(3, Duration::from_secs(600));
        assert!(!listings.is_listed(3));
        drop(listings);
        closer.join().unwrap();
        // Still open when the time is up: the listings as they are.
        handles.listings().opened(3, 0);
        assert!(handles
            .listings_once_closed(3, Duration::from_millis(10))
            .is_listed(3));
    }

    /// An object is verified at its first open only, and not at all without `verify`.
    #[test]
    fn objects_are_verified_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = ckptfs_core::store::LocalStore::open(dir.path()).unwrap();
        let staged = store.stage_bytes(b"bytes").unwrap();
        let (object, size) = (staged.id, staged.size);
        store.publish(staged).unwrap();
        let handles = Handles::new(true);
        assert_eq!(
            handles
                .verify_once(&store, &object, size + 1)
                .unwrap_err()
                .errno(),
            libc::EIO,
            "a wrong size fails the check"
        );
        handles.verify_once(&store, &object, size).unwrap();
        // Once verified, not read again.
        handles.verify_once(&store, &object, size + 1).unwrap();
        Handles::new(false)
            .verify_once(&store, &object, size + 1)
            .unwrap();
    }
}
