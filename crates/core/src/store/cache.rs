//! The local cache of objects fetched from object storage: whole objects as files under
//! the state directory, checked against their hash before they are inserted, the least
//! recently used evicted above a size. Open handles keep reading an evicted file (it is
//! only unlinked). Fetches of one object are claimed, so a read waits for a prefetch of
//! the same object instead of fetching it twice.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use super::ObjectId;
use crate::error::{IoContext, Result};
use crate::fsutil::lock;

/// Fetched objects on local disk, least recently used evicted above a size.
pub(super) struct Cache {
    dir: PathBuf,
    limit: u64,
    next_tmp: AtomicU64,
    index: Mutex<CacheIndex>,
    /// Objects being fetched (by a read or a prefetch), and their end.
    fetching: Mutex<HashSet<ObjectId>>,
    fetched: Condvar,
}

#[derive(Default)]
struct CacheIndex {
    entries: HashMap<ObjectId, (u64, u64)>,
    total: u64,
    tick: u64,
}

impl Cache {
    pub(super) fn new(dir: &Path, limit: u64) -> Self {
        Cache {
            dir: dir.to_path_buf(),
            limit,
            next_tmp: AtomicU64::new(0),
            index: Mutex::new(CacheIndex::default()),
            fetching: Mutex::new(HashSet::new()),
            fetched: Condvar::new(),
        }
    }

    /// Claim the fetch of `id`; false if another fetch of it is under way.
    pub(super) fn begin_fetch(&self, id: ObjectId) -> bool {
        lock(&self.fetching).insert(id)
    }

    pub(super) fn end_fetch(&self, id: &ObjectId) {
        lock(&self.fetching).remove(id);
        self.fetched.notify_all();
    }

    /// Wait until no fetch of `id` is under way.
    pub(super) fn wait_fetch(&self, id: &ObjectId) {
        let mut fetching = lock(&self.fetching);
        while fetching.contains(id) {
            fetching = crate::fsutil::wait(&self.fetched, fetching);
        }
    }

    pub(super) fn path(&self, id: &ObjectId) -> PathBuf {
        self.dir.join(id.to_hex())
    }

    pub(super) fn tmp_path(&self, id: &ObjectId) -> PathBuf {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!(".{}.tmp-{n}", id.to_hex()))
    }

    pub(super) fn get(&self, id: &ObjectId) -> Option<PathBuf> {
        let mut index = lock(&self.index);
        index.tick += 1;
        let tick = index.tick;
        let entry = index.entries.get_mut(id)?;
        entry.1 = tick;
        Some(self.path(id))
    }

    /// Move a fetched and checked file into the cache, evicting the least recently used
    /// objects (never this one) while the cache is over its size.
    pub(super) fn insert(&self, id: ObjectId, tmp: &Path, size: u64) -> Result<PathBuf> {
        let path = self.path(&id);
        fs::rename(tmp, &path).ctx("cache", &path)?;
        let mut index = lock(&self.index);
        index.tick += 1;
        let tick = index.tick;
        if let Some((old, _)) = index.entries.insert(id, (size, tick)) {
            index.total -= old;
        }
        index.total += size;
        while index.total > self.limit && index.entries.len() > 1 {
            let Some((victim, (bytes, _))) = index
                .entries
                .iter()
                .filter(|(v, _)| **v != id)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(v, e)| (*v, *e))
            else {
                break;
            };
            index.entries.remove(&victim);
            index.total -= bytes;
            // Open handles keep reading an evicted file: it is only unlinked.
            let _ = fs::remove_file(self.path(&victim));
        }
        Ok(path)
    }

    pub(super) fn remove(&self, id: &ObjectId) {
        let mut index = lock(&self.index);
        if let Some((bytes, _)) = index.entries.remove(id) {
            index.total -= bytes;
            let _ = fs::remove_file(self.path(id));
        }
    }
}
