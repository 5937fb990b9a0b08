//! The door's one bucket, laid out as the mount is: every retained checkpoint as
//! `cp-N/<operator>/<subtask>/<file>`, each pin as `pinned/NAME/...` and each checkpoint
//! imported from Flink as `flink/<job>/chk-N/...` (the same files), a Flink checkpoint's
//! tree holding at its top a `_metadata` naming every file relative to it
//! ([`ckptfs_core::flink::export::metadata_relocatable`]), so that the directory restores
//! wherever it is read or copied.
//!
//! A key is a *root* (`cp-N/`, `pinned/NAME/`, `flink/<job>/chk-N/`, each leading to one
//! checkpoint) followed by a path in that checkpoint's tree. No root is a prefix of
//! another, so the keys of one root come together in the bucket's order: a listing walks
//! the roots in order and opens a checkpoint's file list only when it lists its keys (a
//! listing of `/`-delimited top levels opens none). File lists are built from the
//! checkpoint's manifest ([`CheckpointTree::build`], as the mount builds its tree) and the
//! last [`FILE_LISTS`] are kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::fs::flink_names::{parse_chk, Picture};
use crate::fs::seam::Checkpoints;
use crate::fs::tree::{CheckpointTree, NodeKind};
use ckptfs_core::catalog::Manifest;
use ckptfs_core::error::{Error, ErrorKind, Result};
use ckptfs_core::fsutil::lock;
use ckptfs_core::store::chunks::Chunks;
use ckptfs_core::store::ObjectId;

/// The file lists kept built (the least recently used goes first).
pub const FILE_LISTS: usize = 64;

/// The most keys (and common prefixes) one listing answers, as S3 does.
pub const MAX_KEYS: usize = 1000;

/// What an object's bytes are.
#[derive(Debug, Clone)]
pub enum Content {
    /// A stored file: its object (or its chunk list's) and size.
    Stored {
        /// The stored object (for a chunked file, its chunk list's id: its content hash).
        object: ObjectId,
        /// The file's size.
        size: u64,
        /// Stored as chunks, each verified as it is read.
        chunks: Option<Box<Chunks>>,
    },
    /// A file the door makes (a Flink checkpoint's relocatable `_metadata`).
    Generated(Arc<Vec<u8>>),
}

impl Content {
    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Content::Stored { size, .. } => *size,
            Content::Generated(bytes) => bytes.len() as u64,
        }
    }

    /// Its entity tag: the content hash (64 hex digits: no client takes it for an MD5).
    pub fn etag(&self) -> String {
        match self {
            Content::Stored { object, .. } => object.to_hex(),
            Content::Generated(bytes) => blake3::hash(bytes).to_hex().to_string(),
        }
    }
}

/// The files of one checkpoint, by path below its root, in the bucket's (byte) order.
#[derive(Debug)]
pub struct FileList {
    /// The checkpoint's completion time: every object's Last-Modified.
    pub modified: SystemTime,
    /// Path and content, sorted by path.
    pub files: Vec<(String, Content)>,
}

impl FileList {
    /// The list of `manifest`'s tree, with `metadata` (a relocatable `_metadata`) at its top.
    pub fn build(manifest: &Manifest, metadata: Option<Vec<u8>>) -> FileList {
        let mut tree = CheckpointTree::build(manifest);
        if let Some(bytes) = metadata {
            tree.add_generated(ckptfs_core::flink::import::METADATA, bytes);
        }
        let mut files = Vec::new();
        for (index, node) in tree.nodes.iter().enumerate() {
            let content = match &node.kind {
                NodeKind::Dir(_) => continue,
                NodeKind::File {
                    object,
                    size,
                    chunks,
                } => Content::Stored {
                    object: *object,
                    size: *size,
                    chunks: chunks.clone(),
                },
                NodeKind::Generated(bytes) => Content::Generated(bytes.clone()),
            };
            // `cp-N/a/b/c` without `cp-N/`.
            let path = tree.path_of(index);
            let rel = path.split_once('/').map_or("", |(_, rel)| rel).to_string();
            files.push((rel, content));
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        FileList {
            modified: UNIX_EPOCH + Duration::from_millis(manifest.completed_unix_ms),
            files,
        }
    }
}

/// One object of the bucket.
#[derive(Debug, Clone)]
pub struct Found {
    /// The checkpoint it is a file of.
    pub cp: u64,
    /// Its path in that checkpoint's tree (for messages).
    pub path: String,
    /// Its bytes.
    pub content: Content,
    /// Last-Modified.
    pub modified: SystemTime,
}

/// What a listing asks for (ListObjects and ListObjectsV2 alike).
#[derive(Debug, Default, Clone)]
pub struct Query {
    /// Only keys starting with this.
    pub prefix: String,
    /// Keys with this after the prefix are rolled up into one common prefix.
    pub delimiter: Option<String>,
    /// Only entries (keys or common prefixes) after this one (marker, start-after, or a
    /// continuation token).
    pub after: Option<String>,
    /// At most this many entries (capped at [`MAX_KEYS`]).
    pub max_keys: usize,
}

/// A listing's answer.
#[derive(Debug, Default, PartialEq)]
pub struct Page {
    /// Keys with their objects, in order.
    pub keys: Vec<(String, u64, String, SystemTime)>,
    /// Common prefixes, in order.
    pub prefixes: Vec<String>,
    /// More entries follow; the next page starts after [`Page::last`].
    pub truncated: bool,
    /// The last entry answered (key or common prefix).
    pub last: Option<String>,
}

/// The bucket over the retained checkpoints.
pub struct Bucket {
    checkpoints: Arc<dyn Checkpoints>,
    lists: Mutex<Lists>,
}

#[derive(Default)]
struct Lists {
    built: HashMap<u64, (Arc<FileList>, u64)>,
    clock: u64,
}

impl Bucket {
    /// The bucket of `checkpoints`.
    pub fn new(checkpoints: Arc<dyn Checkpoints>) -> Bucket {
        Bucket {
            checkpoints,
            lists: Mutex::default(),
        }
    }

    /// Where the checkpoints are (objects are read from its store).
    pub fn checkpoints(&self) -> &Arc<dyn Checkpoints> {
        &self.checkpoints
    }

    /// Every root and the checkpoint it leads to, in key order.
    pub fn roots(&self) -> Vec<(String, u64)> {
        let manifests = self.checkpoints.checkpoints();
        let mut roots: Vec<(String, u64)> = manifests
            .iter()
            .map(|m| (format!("cp-{}/", m.id), m.id))
            .collect();
        for (name, cp) in self.checkpoints.pins() {
            if is_name(&name) {
                roots.push((format!("pinned/{name}/"), cp));
            }
        }
        for (job, n, cp) in Picture::of(&manifests).pairs() {
            roots.push((format!("flink/{job}/chk-{n}/"), cp));
        }
        roots.sort();
        roots
    }

    /// The checkpoint `key`'s root leads to, and the path after it.
    fn root_of<'k>(&self, key: &'k str) -> Option<(u64, &'k str)> {
        let (first, rest) = key.split_once('/')?;
        match first {
            "pinned" => {
                let (name, path) = rest.split_once('/')?;
                Some((self.checkpoints.pinned(name)?, path))
            }
            "flink" => {
                let (job, rest) = rest.split_once('/')?;
                let (chk, path) = rest.split_once('/')?;
                let n = parse_chk(chk)?;
                let manifests = self.checkpoints.checkpoints();
                let picture = Picture::of(&manifests);
                let cp = picture
                    .pairs()
                    .find(|(j, m, _)| *j == job && *m == n)
                    .map(|(_, _, cp)| cp)?;
                Some((cp, path))
            }
            cp => {
                let digits = cp.strip_prefix("cp-")?;
                let canonical =
                    !digits.starts_with('0') && digits.bytes().all(|b| b.is_ascii_digit());
                let id = digits.parse().ok().filter(|_| canonical)?;
                self.checkpoints.manifest(id)?;
                Some((id, rest))
            }
        }
    }

    /// The object at `key`, if there is one.
    pub fn find(&self, key: &str) -> Result<Option<Found>> {
        let Some((cp, path)) = self.root_of(key) else {
            return Ok(None);
        };
        let list = match self.file_list(cp) {
            Ok(list) => list,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let Ok(at) = list.files.binary_search_by(|(p, _)| p.as_str().cmp(path)) else {
            return Ok(None);
        };
        Ok(Some(Found {
            cp,
            path: format!("cp-{cp}/{path}"),
            content: list.files[at].1.clone(),
            modified: list.modified,
        }))
    }

    /// Checkpoint `cp`'s file list, built if it is not kept.
    pub fn file_list(&self, cp: u64) -> Result<Arc<FileList>> {
        {
            let mut lists = lock(&self.lists);
            lists.clock += 1;
            let clock = lists.clock;
            if let Some((list, used)) = lists.built.get_mut(&cp) {
                *used = clock;
                return Ok(list.clone());
            }
        }
        let manifest = self
            .checkpoints
            .manifest(cp)
            .ok_or(Error::NoSuchCheckpoint(cp))?;
        let (metadata, whole) = match self.flink_metadata(&manifest) {
            Some(Ok(bytes)) => (Some(bytes), true),
            Some(Err(())) => (None, false),
            None => (None, true),
        };
        let list = Arc::new(FileList::build(&manifest, metadata));
        if whole {
            // A list without the `_metadata` that failed is not kept: the next look tries
            // again.
            let mut lists = lock(&self.lists);
            let clock = lists.clock;
            lists.built.insert(cp, (list.clone(), clock));
            while lists.built.len() > FILE_LISTS {
                let oldest = lists
                    .built
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(id, _)| *id);
                match oldest {
                    Some(id) => lists.built.remove(&id),
                    None => break,
                };
            }
        }
        Ok(list)
    }

    /// The relocatable `_metadata` at the top of a checkpoint imported from Flink; `None`
    /// for any other; `Some(Err)` when Flink's cannot be read or rewritten (logged and
    /// recorded: the rest of the checkpoint is served all the same).
    fn flink_metadata(&self, manifest: &Manifest) -> Option<std::result::Result<Vec<u8>, ()>> {
        use ckptfs_core::flink::import::{job_backend, METADATA};
        let label = manifest.flink.as_ref()?;
        let file = manifest
            .backend(&job_backend())?
            .files
            .iter()
            .find(|f| f.name == METADATA && f.chunks.is_none())?;
        let made = self
            .checkpoints
            .object_store()
            .read_verified(&file.object, ckptfs_core::source::MAX_METADATA_BYTES)
            .and_then(|bytes| {
                ckptfs_core::flink::export::metadata_relocatable(&bytes, label.checkpoint)
            });
        Some(made.map_err(|e| {
            let msg = format!(
                "S3 door: cp-{}/_metadata (Flink's, relocatable) is not served: {e}",
                manifest.id
            );
            log::warn!("{msg}");
            self.checkpoints.record_error(msg);
        }))
    }

    /// One page of the listing `query` asks for.
    pub fn list(&self, query: &Query) -> Result<Page> {
        let mut lister = Lister {
            query,
            max: query.max_keys.min(MAX_KEYS),
            page: Page::default(),
        };
        let prefix = query.prefix.as_str();
        for (root, cp) in self.roots() {
            if !(root.starts_with(prefix) || prefix.starts_with(root.as_str())) {
                continue;
            }
            if let Some(after) = &query.after {
                // Every key of this root sorts before `after`.
                if after.as_str() > root.as_str() && !after.starts_with(root.as_str()) {
                    continue;
                }
            }
            // A delimiter within the root's own name: the root is one common prefix, and
            // its files need not be read.
            if let Some(rolled) = lister.rolled_up(&root) {
                if lister.offer(rolled, None) {
                    break;
                }
                continue;
            }
            let list = match self.file_list(cp) {
                Ok(list) => list,
                // Dropped since the roots were taken.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            // The files below the prefix, from the first one after `after`.
            let within = prefix.strip_prefix(root.as_str()).unwrap_or("");
            let start = list.files.partition_point(|(p, _)| p.as_str() < within);
            let mut done = false;
            for (path, content) in &list.files[start..] {
                if !path.starts_with(within) {
                    break;
                }
                let key = format!("{root}{path}");
                let entry = (content.size(), content.etag(), list.modified);
                if lister.offer(key, Some(entry)) {
                    done = true;
                    break;
                }
            }
            if done {
                break;
            }
        }
        Ok(lister.page)
    }
}

/// A page being filled.
struct Lister<'q> {
    query: &'q Query,
    max: usize,
    page: Page,
}

impl Lister<'_> {
    /// The common prefix `key` is rolled up into, if the delimiter follows the prefix in it.
    fn rolled_up(&self, key: &str) -> Option<String> {
        let delimiter = self.query.delimiter.as_deref().filter(|d| !d.is_empty())?;
        let rest = key.strip_prefix(self.query.prefix.as_str())?;
        let at = rest.find(delimiter)?;
        Some(key[..self.query.prefix.len() + at + delimiter.len()].to_string())
    }

    /// Answer `key` (with its size, ETag and time) or its common prefix, unless it comes
    /// at or before `after` or repeats the last common prefix. True once the page is full
    /// and another entry was offered (the page is then truncated).
    fn offer(&mut self, key: String, object: Option<(u64, String, SystemTime)>) -> bool {
        let (entry, object) = match self.rolled_up(&key) {
            Some(prefix) => (prefix, None),
            None => (key, object),
        };
        if self.query.after.as_ref().is_some_and(|a| entry <= *a)
            || self.page.last.as_ref() == Some(&entry)
        {
            return false;
        }
        if self.page.keys.len() + self.page.prefixes.len() >= self.max {
            self.page.truncated = true;
            return true;
        }
        match object {
            Some((size, etag, modified)) => {
                self.page.keys.push((entry.clone(), size, etag, modified))
            }
            None => self.page.prefixes.push(entry.clone()),
        }
        self.page.last = Some(entry);
        false
    }
}

/// A pin name the bucket can show as one path component.
fn is_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::double::Double;

    fn bucket(double: &Arc<Double>) -> Bucket {
        Bucket::new(double.clone())
    }

    fn query(prefix: &str, delimiter: Option<&str>, after: Option<&str>, max: usize) -> Query {
        Query {
            prefix: prefix.into(),
            delimiter: delimiter.map(Into::into),
            after: after.map(Into::into),
            max_keys: max,
        }
    }

    fn keys(page: &Page) -> Vec<&str> {
        page.keys.iter().map(|k| k.0.as_str()).collect()
    }

    /// Every page of a listing, following its continuation.
    fn all(bucket: &Bucket, mut q: Query) -> (Vec<String>, Vec<String>, usize) {
        let (mut ks, mut ps, mut pages) = (Vec::new(), Vec::new(), 0);
        loop {
            let page = bucket.list(&q).unwrap();
            pages += 1;
            ks.extend(page.keys.iter().map(|k| k.0.clone()));
            ps.extend(page.prefixes.iter().cloned());
            if !page.truncated {
                return (ks, ps, pages);
            }
            q.after = page.last.clone();
        }
    }

    #[test]
    fn the_top_level_lists_every_root_without_reading_a_file_list() {
        let double = Double::with_checkpoints(11);
        double.label(3, &"a".repeat(32), 7);
        lock(&double.pins).insert("keep".into(), 2);
        let b = bucket(&double);
        let page = b.list(&query("", Some("/"), None, 1000)).unwrap();
        assert!(page.keys.is_empty());
        let mut want: Vec<String> = (1..=11).map(|i| format!("cp-{i}/")).collect();
        want.push("flink/".into());
        want.push("pinned/".into());
        want.sort();
        assert_eq!(page.prefixes, want);
        assert!(lock(&b.lists).built.is_empty());
        let page = b.list(&query("flink/", Some("/"), None, 1000)).unwrap();
        assert_eq!(page.prefixes, [format!("flink/{}/", "a".repeat(32))]);
        let page = b
            .list(&query(
                &format!("flink/{}/", "a".repeat(32)),
                Some("/"),
                None,
                1000,
            ))
            .unwrap();
        assert_eq!(page.prefixes, [format!("flink/{}/chk-7/", "a".repeat(32))]);
        let page = b.list(&query("pinned/", Some("/"), None, 1000)).unwrap();
        assert_eq!(page.prefixes, ["pinned/keep/"]);
    }

    #[test]
    fn a_checkpoint_lists_its_files_and_each_is_found() {
        let double = Double::with_checkpoints(2);
        lock(&double.pins).insert("keep".into(), 2);
        let b = bucket(&double);
        let page = b.list(&query("cp-2/", None, None, 1000)).unwrap();
        let want = [
            "cp-2/A/0/000009.sst",
            "cp-2/A/0/CURRENT",
            "cp-2/A/0/IDENTITY",
            "cp-2/A/0/MANIFEST-000005",
            "cp-2/A/0/OPTIONS-000007",
        ];
        assert_eq!(keys(&page), want);
        assert!(!page.truncated);
        let current = b.find("cp-2/A/0/CURRENT").unwrap().unwrap();
        assert_eq!(current.content.size(), "MANIFEST-000005\n".len() as u64);
        let pinned = b.find("pinned/keep/A/0/CURRENT").unwrap().unwrap();
        assert_eq!(pinned.content.etag(), current.content.etag());
        assert_eq!(pinned.cp, 2);
        for missing in [
            "cp-2/A/0",
            "cp-2/A/0/",
            "cp-02/A/0/CURRENT",
            "cp-3/A/0/CURRENT",
            "pinned/nope/A/0/CURRENT",
            "flink/x/chk-1/_metadata",
            "cp-2",
            "",
        ] {
            assert!(b.find(missing).unwrap().is_none(), "{missing}");
        }
        let page = b.list(&query("cp-2/A/0/M", None, None, 1000)).unwrap();
        assert_eq!(keys(&page), ["cp-2/A/0/MANIFEST-000005"]);
        let page = b.list(&query("cp-2/", Some("/"), None, 1000)).unwrap();
        assert_eq!(page.prefixes, ["cp-2/A/"]);
    }

    /// Pages of any size add up to the whole listing, with and without a delimiter.
    #[test]
    fn pages_add_up_to_the_whole_listing() {
        let double = Double::with_checkpoints(12);
        lock(&double.pins).insert("keep".into(), 5);
        let b = bucket(&double);
        let (whole, _, _) = all(&b, query("", None, None, 1000));
        assert_eq!(whole.len(), 13 * 5);
        let mut sorted = whole.clone();
        sorted.sort();
        assert_eq!(whole, sorted);
        for max in [1, 2, 3, 7, 64] {
            let (paged, _, pages) = all(&b, query("", None, None, max));
            assert_eq!(paged, whole, "max {max}");
            assert_eq!(pages, whole.len().div_ceil(max), "max {max}");
        }
        let (_, prefixes, _) = all(&b, query("", Some("/"), None, 1000));
        for max in [1, 2, 5] {
            let (ks, ps, _) = all(&b, query("", Some("/"), None, max));
            assert!(ks.is_empty());
            assert_eq!(ps, prefixes, "max {max}");
        }
        // Rolled up below the top: `cp-1/A/0/` is one prefix, met once over pages.
        let (ks, ps, _) = all(&b, query("cp-1/A/", Some("/"), None, 1));
        assert!(ks.is_empty());
        assert_eq!(ps, ["cp-1/A/0/"]);
        // start-after inside a checkpoint.
        let page = b
            .list(&query("", None, Some("cp-10/A/0/IDENTITY"), 2))
            .unwrap();
        assert_eq!(
            keys(&page),
            ["cp-10/A/0/MANIFEST-000005", "cp-10/A/0/OPTIONS-000007"]
        );
        assert!(page.truncated);
    }

    #[test]
    fn a_dropped_checkpoint_is_gone_from_listings_and_lookups() {
        let double = Double::with_checkpoints(3);
        let b = bucket(&double);
        assert!(b.find("cp-2/A/0/CURRENT").unwrap().is_some());
        double.forget(2);
        assert!(b.find("cp-2/A/0/CURRENT").unwrap().is_none());
        let page = b.list(&query("", Some("/"), None, 1000)).unwrap();
        assert_eq!(page.prefixes, ["cp-1/", "cp-3/"]);
    }
}
