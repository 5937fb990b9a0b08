//! The store as a directory on a local (or network) filesystem.
//!
//! Layout: `objects/<first two hex digits>/<64 hex digits>`, staged copies in `tmp/`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{hash_copy, ObjectId, ObjectStore, Staged};
use crate::error::{Error, IoContext, Result};
use crate::fsutil::{create_new_private, ensure_real_dir, fsync_dir, is_real_dir};

/// The objects of a local store: `objects/` and `tmp/` under its root.
pub struct LocalStore {
    objects: PathBuf,
    tmp: PathBuf,
    next_tmp: AtomicU64,
}

impl LocalStore {
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
        })
    }

    fn path_of(&self, id: &ObjectId) -> PathBuf {
        let hex = id.to_hex();
        self.objects.join(&hex[..2]).join(hex)
    }
}

impl ObjectStore for LocalStore {
    fn stage(&self, src: &Path) -> Result<Staged> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self.tmp.join(format!("{}-{n}", std::process::id()));
        let mut input = fs::File::open(src).ctx("open", src)?;
        let mut out = create_new_private().open(&tmp).ctx("create", &tmp)?;
        let result = hash_copy(&mut input, Some(&mut out), &tmp).and_then(|r| {
            crate::failpoint!("store::staged-before-fsync");
            out.sync_all().ctx("fsync", &tmp).map(|_| r)
        });
        match result {
            Ok((hash, size)) => Ok(Staged {
                id: ObjectId::from_hash(hash),
                size,
                tmp,
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
        let result = out
            .write_all(bytes)
            .ctx("write", &tmp)
            .and_then(|_| out.sync_all().ctx("fsync", &tmp));
        match result {
            Ok(()) => Ok(Staged {
                id: ObjectId::from_hash(blake3::hash(bytes)),
                size: bytes.len() as u64,
                tmp,
            }),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    fn publish(&self, staged: Staged) -> Result<()> {
        let dest = self.path_of(&staged.id);
        let dir = dest.parent().expect("object paths have a parent");
        if !is_real_dir(dir) {
            ensure_real_dir(dir)?;
            fsync_dir(&self.objects)?;
        }
        crate::failpoint!("store::before-publish");
        fs::rename(&staged.tmp, &dest).ctx("publish object", &dest)?;
        crate::failpoint!("store::after-publish");
        fsync_dir(dir)
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
        let shards = match fs::read_dir(&self.objects) {
            Ok(shards) => shards,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
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
                    Some(Ok(id)) if id.to_hex().starts_with(shard_name) => ids.push(id),
                    _ => log::warn!("ignoring stray file {}", entry.path().display()),
                }
            }
        }
        ids.sort();
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
