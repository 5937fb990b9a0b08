//! The store as a directory on a local (or network) filesystem.
//!
//! Layout: `objects/<first two hex digits>/<64 hex digits>`, staged copies in `tmp/`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{hash_copy, Digest, IdHasher, ObjectId, ObjectStore, Staged};
use crate::error::{Error, IoContext, Result};
use crate::fsutil::{create_new_private, ensure_real_dir, fsync_dir, is_real_dir};

/// How many files a checkpoint copies into a local store at once.
const LOCAL_STAGES: usize = 4;

/// How many files (or directories) [`ObjectStore::sync_published`] fsyncs at once.
const SYNCS: usize = 8;

/// How many objects may wait, published and open, for [`ObjectStore::sync_published`]:
/// past that they are fsync'd at once (a first import of thousands of files holds no
/// more descriptors than this).
const MAX_UNSYNCED_FILES: usize = 256;

/// The objects of a local store: `objects/` and `tmp/` under its root.
pub struct LocalStore {
    objects: PathBuf,
    tmp: PathBuf,
    next_tmp: AtomicU64,
    /// Directories holding objects published unsynced: fsync'd (all at once) by
    /// [`ObjectStore::sync_published`].
    unsynced: std::sync::Mutex<std::collections::BTreeSet<PathBuf>>,
    /// Objects published unsynced (their data written back from their staging on, not
    /// waited for), with the descriptor that wrote each: fsync'd through it, several at
    /// once, by [`ObjectStore::sync_published`] before their directories.
    unsynced_files: std::sync::Mutex<Vec<(PathBuf, fs::File)>>,
    /// The first object fsync that failed, if one did: its data may never reach the disk,
    /// and a second fsync would not say so (the kernel reports a write error once), so
    /// every later sync fails until the store is opened again.
    failed_sync: std::sync::Mutex<Option<String>>,
    /// Tests: make the next object fsync fail.
    #[cfg(test)]
    fail_next_sync: std::sync::atomic::AtomicBool,
    /// Held through a sync: a sync that returns has waited for one running meanwhile
    /// (another checkpoint's, whose objects its caller may re-reference).
    syncing: std::sync::Mutex<()>,
}

impl LocalStore {
    /// Call `found` with every object in the store, in directory order (stray entries are
    /// logged and skipped).
    fn each_object(&self, mut found: impl FnMut(ObjectId)) -> Result<()> {
        let shards = match fs::read_dir(&self.objects) {
            Ok(shards) => shards,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("list {}", self.objects.display()), e)),
        };
        for shard in shards {
            let shard = shard.ctx("list", &self.objects)?;
            // Not through links: a planted one must not make its target look like objects.
            if !shard.file_type().is_ok_and(|t| t.is_dir()) {
                log::warn!("ignoring stray entry {}", shard.path().display());
                continue;
            }
            let shard = shard.path();
            for entry in fs::read_dir(&shard).ctx("list", &shard)? {
                let entry = entry.ctx("list", &shard)?;
                let shard_name = shard.file_name().and_then(|n| n.to_str()).unwrap_or("");
                match entry.file_name().to_str().map(str::parse::<ObjectId>) {
                    Some(Ok(id)) if id.to_hex().starts_with(shard_name) => found(id),
                    _ => log::warn!("ignoring stray file {}", entry.path().display()),
                }
            }
        }
        Ok(())
    }

    /// Open (creating the directories if needed) the object area under `root`.
    pub fn open(root: &Path) -> Result<Self> {
        let store = Self::open_existing(root)?;
        ensure_real_dir(&store.objects)?;
        ensure_real_dir(&store.tmp)?;
        Ok(store)
    }

    /// Open the object area under `root` without creating anything (readers: fsck, restore).
    pub fn open_existing(root: &Path) -> Result<Self> {
        let objects = root.join(super::layout::OBJECTS);
        let tmp = root.join(super::layout::TMP);
        for dir in [&objects, &tmp] {
            if dir.exists() && !is_real_dir(dir) {
                return Err(Error::Corrupt(format!(
                    "{} is not a real directory (a symbolic link?); refusing to use it",
                    dir.display()
                )));
            }
        }
        Ok(LocalStore {
            objects,
            tmp,
            next_tmp: AtomicU64::new(0),
            unsynced: Default::default(),
            unsynced_files: Default::default(),
            failed_sync: Default::default(),
            #[cfg(test)]
            fail_next_sync: Default::default(),
            syncing: Default::default(),
        })
    }

    fn path_of(&self, id: &ObjectId) -> PathBuf {
        let hex = id.to_hex();
        self.objects.join(&hex[..2]).join(hex)
    }

    /// Fsync objects published unsynced, several at once, each through the descriptor
    /// that wrote it. A failure is never retried: it fails this sync and every later one.
    fn sync_files(&self, files: Vec<(PathBuf, fs::File)>) -> Result<()> {
        if let Some(first) = &*crate::fsutil::lock(&self.failed_sync) {
            return Err(Self::sync_failed_before(first));
        }
        let synced = crate::fsutil::parallel_map(&files, files.len().min(SYNCS), |(path, file)| {
            #[cfg(test)]
            if self.fail_next_sync.swap(false, Ordering::SeqCst) {
                return Err(Error::io(
                    format!("fsync {}", path.display()),
                    std::io::Error::from_raw_os_error(libc::EIO),
                ));
            }
            file.sync_all().ctx("fsync", path)
        });
        match synced.into_iter().find_map(|r| r.err()) {
            None => Ok(()),
            Some(e) => {
                crate::fsutil::lock(&self.failed_sync).get_or_insert_with(|| e.to_string());
                Err(e)
            }
        }
    }

    fn sync_failed_before(first: &str) -> Error {
        Error::io(
            format!(
                "an object's fsync failed earlier ({first}); nothing more is made durable \
                 until the store is opened again"
            ),
            std::io::Error::from_raw_os_error(libc::EIO),
        )
    }
}

impl ObjectStore for LocalStore {
    fn stage(&self, src: &Path) -> Result<Staged> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self.tmp.join(format!("{}-{n}", std::process::id()));
        let mut input = fs::File::open(src).ctx("open", src)?;
        let mut out = create_new_private().open(&tmp).ctx("create", &tmp)?;
        // Where the filesystem shares extents (btrfs, XFS) the object is a clone of the
        // source, which writes no data; it is hashed from the clone, a private file no one
        // else can change, so its name is its content whatever the source does after.
        // Elsewhere it is copied while hashed.
        let hashed = if crate::fsutil::reflink(&input, &out) {
            fs::File::open(&tmp)
                .ctx("open", &tmp)
                .and_then(|mut clone| {
                    hash_copy(&mut clone, IdHasher::new(Digest::Blake3), None, &tmp)
                })
        } else {
            hash_copy(
                &mut input,
                IdHasher::new(Digest::Blake3),
                Some(&mut out),
                &tmp,
            )
        };
        // Written back from now on, and made durable with every object published before
        // a manifest names any (`sync_published`): the next copies go on while the disk
        // writes, instead of each waiting for its own fsync.
        let result = hashed.inspect(|_| {
            crate::failpoint!("store::staged-before-fsync");
            crate::fsutil::start_writeback(&out);
        });
        match result {
            Ok((id, size)) => Ok(Staged {
                id,
                size,
                tmp,
                file: Some(out),
            }),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    fn stage_bytes(&self, bytes: &[u8]) -> Result<Staged> {
        use std::io::Write;
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self.tmp.join(format!("{}-{n}", std::process::id()));
        let mut out = create_new_private().open(&tmp).ctx("create", &tmp)?;
        // Durable once published and synced (see `stage`).
        let result = out.write_all(bytes).ctx("write", &tmp).map(|()| {
            crate::fsutil::start_writeback(&out);
        });
        match result {
            Ok(()) => Ok(Staged {
                id: ObjectId::from_hash(blake3::hash(bytes)),
                size: bytes.len() as u64,
                tmp,
                file: Some(out),
            }),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    fn publish(&self, staged: Staged) -> Result<()> {
        self.publish_unsynced(staged)?;
        self.sync_published()
    }

    fn publish_unsynced(&self, mut staged: Staged) -> Result<()> {
        let dest = self.path_of(&staged.id);
        let dir = dest.parent().expect("object paths have a parent");
        let file = staged.file.take();
        // An object already there (an orphan, or one a manifest that does not count yet
        // names) is replaced by a durable copy only: a power cut must not leave it torn.
        let replaces = fs::symlink_metadata(&dest).is_ok();
        if let (true, Some(file)) = (replaces, &file) {
            file.sync_all().ctx("fsync", &staged.tmp)?;
        }
        let full = {
            let mut unsynced = crate::fsutil::lock(&self.unsynced);
            if !is_real_dir(dir) {
                ensure_real_dir(dir)?;
                unsynced.insert(self.objects.clone());
            }
            crate::failpoint!("store::before-publish");
            fs::rename(&staged.tmp, &dest).ctx("publish object", &dest)?;
            unsynced.insert(dir.to_path_buf());
            let mut files = crate::fsutil::lock(&self.unsynced_files);
            if let (false, Some(file)) = (replaces, file) {
                files.push((dest, file));
            }
            crate::failpoint!("store::after-publish");
            match files.len() >= MAX_UNSYNCED_FILES {
                true => std::mem::take(&mut *files),
                false => Vec::new(),
            }
        };
        // Too many waiting: their data now (their directories still wait for the sync).
        self.sync_files(full)
    }

    fn sync_published(&self) -> Result<()> {
        let _syncing = crate::fsutil::lock(&self.syncing);
        // The objects' data first (in parallel: each is a wait on the disk), never
        // retried, then the entries naming them, whose failures go back for the next sync
        // to try again.
        let files = std::mem::take(&mut *crate::fsutil::lock(&self.unsynced_files));
        self.sync_files(files)?;
        let mut first = None;
        let dirs: Vec<PathBuf> = std::mem::take(&mut *crate::fsutil::lock(&self.unsynced))
            .into_iter()
            .collect();
        let synced = crate::fsutil::parallel_map(&dirs, dirs.len().min(SYNCS), |d| fsync_dir(d));
        let mut unsynced = crate::fsutil::lock(&self.unsynced);
        for (dir, result) in dirs.into_iter().zip(synced) {
            if let Err(e) = result {
                // A directory gone meanwhile took its objects along: this sync fails (its
                // caller must not name them), later ones need not.
                if dir.exists() {
                    unsynced.insert(dir);
                }
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn discard(&self, staged: Staged) {
        if let Err(e) = fs::remove_file(&staged.tmp) {
            log::warn!("could not remove staged copy {}: {e}", staged.tmp.display());
        }
    }

    fn delete(&self, id: &ObjectId) -> Result<()> {
        let path = self.path_of(id);
        let shard = path.parent().expect("object paths have a parent");
        if !is_real_dir(shard) {
            return match fs::symlink_metadata(shard) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(Error::Corrupt(format!(
                    "{} is not a real directory; not deleting through it",
                    shard.display()
                ))),
            };
        }
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("delete object {}", path.display()), e)),
        }
    }

    fn list(&self) -> Result<Vec<ObjectId>> {
        let mut ids = Vec::new();
        self.each_object(|id| ids.push(id))?;
        ids.sort();
        Ok(ids)
    }

    /// No modification times, as by default, but listed once: with a million objects, the
    /// default's sorted list and its copy with times were 90 MB at once.
    fn list_modified(&self) -> Result<Vec<(ObjectId, Option<std::time::SystemTime>)>> {
        let mut ids = Vec::new();
        self.each_object(|id| ids.push((id, None)))?;
        Ok(ids)
    }

    fn open(&self, id: &ObjectId) -> Result<fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.path_of(id);
        let shard = path.parent().expect("object paths have a parent");
        if shard.exists() && !is_real_dir(shard) {
            return Err(Error::Corrupt(format!(
                "{} is not a real directory; object {id} not served",
                shard.display()
            )));
        }
        // Never through a link planted in the store: it could serve any file of the host.
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Error::Corrupt(format!("object {id} is missing from the store"))
                } else if e.raw_os_error() == Some(libc::ELOOP) {
                    Error::Corrupt(format!("object {id} is a symbolic link; not followed"))
                } else {
                    Error::io(format!("open object {}", path.display()), e)
                }
            })
    }

    fn local_path(&self, id: &ObjectId) -> Option<PathBuf> {
        Some(self.path_of(id))
    }

    /// Several copies at once: each a read, a hash and a write that others overlap (a
    /// compaction's new SSTs, a checkpoint's SST and MANIFEST).
    fn upload_concurrency(&self) -> usize {
        LOCAL_STAGES
    }

    fn has_objects(&self) -> Result<bool> {
        let shards = match fs::read_dir(&self.objects) {
            Ok(shards) => shards,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(Error::io(format!("list {}", self.objects.display()), e)),
        };
        for shard in shards {
            let shard = shard.ctx("list", &self.objects)?.path();
            if shard.is_dir() && fs::read_dir(&shard).ctx("list", &shard)?.next().is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn describe(&self) -> String {
        self.objects.display().to_string()
    }

    fn clear_staging(&self) -> Result<usize> {
        let mut removed = 0;
        if !self.tmp.exists() {
            return Ok(0);
        }
        for entry in fs::read_dir(&self.tmp).ctx("list", &self.tmp)? {
            let path = entry.ctx("list", &self.tmp)?.path();
            fs::remove_file(&path).ctx("remove leftover", &path)?;
            removed += 1;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsynced(store: &LocalStore) -> Vec<PathBuf> {
        crate::fsutil::lock(&store.unsynced)
            .iter()
            .cloned()
            .collect()
    }

    #[test]
    fn unsynced_objects_are_visible_at_once_and_durable_after_one_sync() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let a = store.stage_bytes(b"a").unwrap();
        let (a_id, a_dir) = (a.id, store.path_of(&a.id).parent().unwrap().to_path_buf());
        store.publish_unsynced(a).unwrap();
        // Readable before it is durable: a concurrent checkpoint may re-reference it.
        assert!(store.list().unwrap().contains(&a_id));
        std::io::Read::read_to_end(&mut store.open(&a_id).unwrap(), &mut Vec::new()).unwrap();
        // Its new shard's entry in objects/ waits too, and so does its data.
        assert_eq!(unsynced(&store), vec![store.objects.clone(), a_dir.clone()]);
        assert_eq!(unsynced_files(&store), vec![store.path_of(&a_id)]);
        store.sync_published().unwrap();
        assert!(unsynced(&store).is_empty());
        assert!(unsynced_files(&store).is_empty());
        // Staged, but not published, it waits for nothing.
        let c = store.stage_bytes(b"c").unwrap();
        assert!(unsynced_files(&store).is_empty());
        store.discard(c);
        // `publish` is durable when it returns.
        let b = store.stage_bytes(b"b").unwrap();
        store.publish(b).unwrap();
        assert!(unsynced(&store).is_empty());
    }

    fn unsynced_files(store: &LocalStore) -> Vec<PathBuf> {
        let files = crate::fsutil::lock(&store.unsynced_files);
        files.iter().map(|(path, _)| path.clone()).collect()
    }

    /// A failed object fsync is not retried (a second fsync would not report the lost
    /// write): that sync fails, and so does every later one, until the store is reopened.
    #[test]
    fn a_failed_object_fsync_fails_every_later_sync() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let a = store.stage_bytes(b"a").unwrap();
        store.publish_unsynced(a).unwrap();
        store.fail_next_sync.store(true, Ordering::SeqCst);
        let first = store.sync_published().unwrap_err().to_string();
        assert!(first.contains("fsync"), "{first}");
        // Nothing is waiting any more, and the next sync still fails, naming the first.
        assert!(unsynced_files(&store).is_empty());
        let later = store.sync_published().unwrap_err().to_string();
        assert!(later.contains("failed earlier"), "{later}");
        let b = store.stage_bytes(b"b").unwrap();
        assert!(store.publish(b).is_err());
        // Opened again, the store syncs.
        let store = LocalStore::open(dir.path()).unwrap();
        let c = store.stage_bytes(b"c").unwrap();
        store.publish(c).unwrap();
    }

    /// An object replaced (an orphan of the same content) is replaced durably: it waits
    /// for no later sync.
    #[test]
    fn an_object_already_there_is_replaced_by_a_synced_copy() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let a = store.stage_bytes(b"a").unwrap();
        store.publish(a).unwrap();
        let again = store.stage_bytes(b"a").unwrap();
        store.publish_unsynced(again).unwrap();
        assert!(unsynced_files(&store).is_empty());
    }

    /// Past MAX_UNSYNCED_FILES waiting objects, their data is synced at once (no more
    /// descriptors held).
    #[test]
    fn many_waiting_objects_are_synced_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        for i in 0..MAX_UNSYNCED_FILES + 3 {
            let s = store.stage_bytes(format!("object {i}").as_bytes()).unwrap();
            store.publish_unsynced(s).unwrap();
        }
        assert_eq!(unsynced_files(&store).len(), 3);
        store.sync_published().unwrap();
        assert!(unsynced_files(&store).is_empty());
    }

    #[test]
    fn an_object_dropped_before_its_sync_does_not_fail_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let a = store.stage_bytes(b"a").unwrap();
        let a_id = a.id;
        store.publish_unsynced(a).unwrap();
        // Deleted (a failed checkpoint's object nothing names) before anyone synced it.
        store.delete(&a_id).unwrap();
        store.sync_published().unwrap();
        assert!(unsynced_files(&store).is_empty());
    }

    #[test]
    fn a_failed_sync_fails_and_is_retried_unless_its_directory_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let a = store.stage_bytes(b"a").unwrap();
        let a_dir = store.path_of(&a.id).parent().unwrap().to_path_buf();
        store.publish_unsynced(a).unwrap();
        // Gone (by hand) before the sync: the sync fails, so no manifest names the object;
        // the next one has nothing left to fail on.
        std::fs::remove_dir_all(&a_dir).unwrap();
        assert!(store.sync_published().is_err());
        assert!(!unsynced(&store).contains(&a_dir));
        store.sync_published().unwrap();
    }
}
