//! Per-backend file lists stored by content (manifest format 3).
//!
//! A format-3 manifest does not repeat every file of every backend: each backend entry names
//! one *list object* in the object store. A backend that did not change names the same list
//! as in the previous checkpoint (as a git tree is shared between commits); one that changed
//! names a new list, either complete or a delta on its previous list (`base`, the names
//! `removed`, the `files` added or changed). A delta is written only while it is smaller
//! than the complete list and the chain of deltas is shorter than [`MAX_CHAIN`], so what a
//! checkpoint adds to the store follows what changed, not the number of files.
//!
//! List objects are ordinary content-addressed objects: verified by their hash when read,
//! and referenced by every checkpoint whose chain uses them (the registry counts them like
//! any file), so they live exactly as long as a retained checkpoint needs them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::shared::{Chain, Files};
use super::{validate_file_name, FileEntry};
use crate::error::{Error, Result};
use crate::store::{ObjectId, ObjectStore};

/// The longest chain of lists the writer builds (the list itself and its bases).
pub const MAX_CHAIN: usize = 16;
/// A longer chain is refused on read (a damaged store, or one written by a hostile hand).
const MAX_CHAIN_READ: usize = 1024;
/// A larger list object is refused on read.
const MAX_LIST_BYTES: u64 = 256 << 20;
const KIND: &str = "ckptfs-file-list";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredList {
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base: Option<ObjectId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    removed: Vec<String>,
    files: Vec<FileEntry>,
}

/// One backend's files (sorted by name) and the list objects they are read from, newest
/// first (empty: not stored as a list, as in format 1 and 2 manifests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileList {
    /// The files, sorted by name.
    pub files: Files,
    /// The list objects they are read from, newest first.
    pub chain: Chain,
}

/// A list object to store for a backend's files.
#[derive(Debug)]
pub struct Encoded {
    /// The list object's bytes (compact JSON and a newline).
    pub bytes: Vec<u8>,
    /// Its id: the BLAKE3 hash of `bytes`.
    pub id: ObjectId,
    /// The new list's chain: its own id, then its base's chain (if it is a delta).
    pub chain: Chain,
}

/// Sort entries by name (the order lists are kept and written in), sharing what did not
/// change with `like` (the backend's previous snapshot).
pub fn sorted(mut files: Vec<Arc<FileEntry>>, like: Option<&Files>) -> Files {
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Files::new(files, like)
}

/// What to store for `files` (sorted by name), given the backend's previous list if it may
/// be used as a base (stored, alive and pinned by the caller). `None`: the files are exactly
/// the base's, which the new checkpoint shares.
pub fn encode(files: &Files, base: Option<&FileList>) -> Option<Encoded> {
    let base = base.filter(|b| !b.chain.is_empty());
    let mut delta = None;
    if let Some(base) = base {
        let before: HashMap<&str, &FileEntry> =
            base.files.iter().map(|f| (f.name.as_str(), &**f)).collect();
        let now: HashMap<&str, &FileEntry> =
            files.iter().map(|f| (f.name.as_str(), &**f)).collect();
        let mut removed: Vec<String> = before
            .keys()
            .filter(|name| !now.contains_key(*name))
            .map(|name| name.to_string())
            .collect();
        removed.sort();
        let changed: Vec<FileEntry> = files
            .iter()
            .filter(|f| before.get(f.name.as_str()) != Some(&&***f))
            .map(|f| (**f).clone())
            .collect();
        if removed.is_empty() && changed.is_empty() {
            return None;
        }
        if base.chain.len() < MAX_CHAIN && removed.len() + changed.len() < files.len() {
            delta = Some((base, removed, changed));
        }
    }
    let (list, chain_tail): (StoredList, Chain) = match delta {
        Some((base, removed, changed)) => (
            StoredList {
                kind: KIND.into(),
                base: base.chain.first(),
                removed,
                files: changed,
            },
            base.chain.clone(),
        ),
        None => (
            StoredList {
                kind: KIND.into(),
                base: None,
                removed: Vec::new(),
                files: files.iter().map(|f| (**f).clone()).collect(),
            },
            Chain::default(),
        ),
    };
    let mut bytes = serde_json::to_vec(&list).expect("serializes");
    bytes.push(b'\n');
    let id = ObjectId::from_hash(blake3::hash(&bytes));
    let chain = chain_tail.push(id);
    Some(Encoded { bytes, id, chain })
}

/// Reads list objects, resolving delta chains once per list and sharing file entries
/// between the lists it resolves (equal entries are one allocation).
pub struct ListReader<'a> {
    store: &'a dyn ObjectStore,
    resolved: HashMap<ObjectId, FileList>,
    interned: HashSet<Arc<FileEntry>>,
    /// Lists read ahead ([`ListReader::read_ahead`]), each taken by the resolve that
    /// first needs it.
    ahead: HashMap<ObjectId, Result<StoredList>>,
}

impl<'a> ListReader<'a> {
    /// A reader of the list objects in `store`, nothing resolved yet.
    pub fn new(store: &'a dyn ObjectStore) -> Self {
        ListReader {
            store,
            resolved: HashMap::new(),
            interned: HashSet::new(),
            ahead: HashMap::new(),
        }
    }

    /// Read the lists `ids` that are not resolved yet several at once (each checked
    /// against its hash and parsed), for the resolves that follow: a store's open reads
    /// thousands of small lists, and reading, hashing and parsing them one by one left
    /// the other cores idle. What one of them fails with is what its resolve returns.
    pub fn read_ahead(&mut self, ids: &[ObjectId]) {
        let wanted: Vec<ObjectId> = ids
            .iter()
            .filter(|id| !self.resolved.contains_key(id) && !self.ahead.contains_key(id))
            .copied()
            .collect::<HashSet<ObjectId>>()
            .into_iter()
            .collect();
        if wanted.len() < 2 {
            return;
        }
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
        let store = self.store;
        let read = crate::fsutil::parallel_map(&wanted, workers, |id| read_list(store, id));
        self.ahead.extend(wanted.into_iter().zip(read));
    }

    /// One shared allocation per distinct entry.
    pub fn intern(&mut self, entry: FileEntry) -> Arc<FileEntry> {
        if let Some(known) = self.interned.get(&entry) {
            return known.clone();
        }
        let shared = Arc::new(entry);
        self.interned.insert(shared.clone());
        shared
    }

    /// The files of list `id`, and its chain.
    pub fn resolve(&mut self, id: ObjectId) -> Result<FileList> {
        let mut pending = Vec::new();
        let mut next = Some(id);
        let mut start = FileList::default();
        while let Some(current) = next {
            if let Some(known) = self.resolved.get(&current) {
                start = known.clone();
                break;
            }
            if pending.len() + 1 > MAX_CHAIN_READ {
                return Err(Error::Corrupt(format!(
                    "file list {id} has a chain of more than {MAX_CHAIN_READ} lists"
                )));
            }
            let list = self.read(&current)?;
            next = list.base;
            pending.push((current, list));
        }
        let mut files = start.files;
        let mut chain = start.chain;
        if chain.len() + pending.len() > MAX_CHAIN_READ {
            return Err(Error::Corrupt(format!(
                "file list {id} has a chain of more than {MAX_CHAIN_READ} lists"
            )));
        }
        for (current, list) in pending.into_iter().rev() {
            files = self.apply(current, &files, list)?;
            chain = chain.push(current);
            let resolved = FileList {
                files: files.clone(),
                chain: chain.clone(),
            };
            self.resolved.insert(current, resolved);
        }
        Ok(self.resolved[&id].clone())
    }

    /// The files of list `id`: its base's (sorted by name) without the removed names, with
    /// the listed entries added or replaced. One merge walk; unchanged entries are shared.
    fn apply(&mut self, id: ObjectId, base: &Files, list: StoredList) -> Result<Files> {
        let corrupt = |why: String| Error::Corrupt(format!("file list {id} {why}"));
        let mut removed = list.removed;
        removed.sort();
        let mut changed = Vec::with_capacity(list.files.len());
        for entry in list.files {
            validate_file_name(&entry.name).map_err(|e| corrupt(format!(": {e}")))?;
            changed.push(self.intern(entry));
        }
        changed.sort_by(|a, b| a.name.cmp(&b.name));
        for pair in changed.windows(2) {
            if pair[0].name == pair[1].name {
                return Err(corrupt(format!("lists {} twice", pair[0].name)));
            }
        }
        let mut out = Vec::with_capacity(base.len() + changed.len());
        let mut removed = removed.iter().peekable();
        let mut changed = changed.into_iter().peekable();
        for file in base.iter() {
            if let Some(name) = removed.next_if(|n| n.as_str() < file.name.as_str()) {
                return Err(corrupt(format!(
                    "removes {name:?}, which its base does not list"
                )));
            }
            while let Some(entry) = changed.next_if(|c| c.name < file.name) {
                out.push(entry);
            }
            let gone = removed.next_if(|n| **n == file.name).is_some();
            match changed.next_if(|c| c.name == file.name) {
                Some(entry) => out.push(entry),
                None if gone => {}
                None => out.push(file.clone()),
            }
        }
        if let Some(name) = removed.next() {
            return Err(corrupt(format!(
                "removes {name:?}, which its base does not list"
            )));
        }
        out.extend(changed);
        Ok(Files::new(out, Some(base)))
    }

    fn read(&mut self, id: &ObjectId) -> Result<StoredList> {
        match self.ahead.remove(id) {
            Some(read) => read,
            None => read_list(self.store, id),
        }
    }
}

/// List object `id` of `store`, checked against its hash and parsed.
fn read_list(store: &dyn ObjectStore, id: &ObjectId) -> Result<StoredList> {
    {
        let bytes = store
            .read_verified(id, MAX_LIST_BYTES)
            .map_err(|e| Error::Corrupt(format!("file list {id} cannot be read: {e}")))?;
        let list: StoredList = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Corrupt(format!("file list {id} cannot be parsed: {e}")))?;
        if list.kind != KIND {
            return Err(Error::Corrupt(format!(
                "object {id} is not a file list (kind {:?})",
                list.kind
            )));
        }
        if list.base.is_none() && !list.removed.is_empty() {
            return Err(Error::Corrupt(format!(
                "file list {id} removes files but has no base"
            )));
        }
        Ok(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;

    fn entry(name: &str, content: &str) -> Arc<FileEntry> {
        Arc::new(FileEntry {
            name: name.into(),
            object: ObjectId::from_hash(blake3::hash(content.as_bytes())),
            size: content.len() as u64,
            chunks: None,
            source: None,
            column_family: None,
        })
    }

    fn store_encoded(store: &LocalStore, encoded: &Encoded) {
        let staged = store.stage_bytes(&encoded.bytes).unwrap();
        assert_eq!(staged.id, encoded.id);
        store.publish(staged).unwrap();
    }

    /// Each step changes one file of many: the lists form delta chains no longer than
    /// MAX_CHAIN, each delta is small, and every list resolves to exactly its files.
    #[test]
    fn delta_chains_resolve_to_the_files_and_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let mut files: Vec<Arc<FileEntry>> = (0..40)
            .map(|i| entry(&format!("{i:06}.sst"), &format!("c{i}")))
            .collect();
        let mut previous: Option<FileList> = None;
        let mut written = Vec::new();
        for step in 0..50 {
            // Replace one SST by a new one and rewrite the MANIFEST.
            files.remove(0);
            files.push(entry(
                &format!("{:06}.sst", 100 + step),
                &format!("n{step}"),
            ));
            files.retain(|f| f.name != "MANIFEST-000001");
            files.push(entry("MANIFEST-000001", &format!("m{step}")));
            let sorted_files = sorted(files.clone(), None);
            let encoded = encode(&sorted_files, previous.as_ref()).expect("changed");
            assert!(encoded.chain.len() <= MAX_CHAIN);
            if encoded.chain.len() > 1 {
                assert!(encoded.bytes.len() < 1000, "a delta of 3 changes is small");
            }
            store_encoded(&store, &encoded);
            written.push((encoded.id, sorted_files.clone()));
            previous = Some(FileList {
                files: sorted_files,
                chain: encoded.chain,
            });
        }
        assert!(written.len() == 50);
        let mut reader = ListReader::new(&store);
        for (id, expected) in written.iter().rev() {
            let resolved = reader.resolve(*id).unwrap();
            assert_eq!(&resolved.files, expected);
            assert_eq!(resolved.chain.first(), Some(*id));
        }
        // Entries that did not change are shared, not copied.
        let a = reader.resolve(written[10].0).unwrap();
        let b = reader.resolve(written[11].0).unwrap();
        let shared = a
            .files
            .iter()
            .filter(|f| b.files.iter().any(|g| Arc::ptr_eq(f, g)))
            .count();
        assert!(shared >= 38, "{shared} shared entries");
        // Read ahead, several at once, the lists resolve to the same files.
        let ids: Vec<ObjectId> = written.iter().map(|(id, _)| *id).collect();
        let mut ahead = ListReader::new(&store);
        ahead.read_ahead(&ids);
        assert_eq!(ahead.ahead.len(), ids.len());
        for (id, expected) in &written {
            assert_eq!(&ahead.resolve(*id).unwrap().files, expected);
        }
        assert!(
            ahead.ahead.is_empty(),
            "every list read ahead was used once"
        );
    }

    #[test]
    fn unchanged_files_share_the_base_list() {
        let files = sorted(vec![entry("000001.sst", "a"), entry("CURRENT", "b")], None);
        let first = encode(&files, None).unwrap();
        let base = FileList {
            files: files.clone(),
            chain: first.chain.clone(),
        };
        assert!(encode(&files, Some(&base)).is_none());
    }

    #[test]
    fn damaged_or_foreign_lists_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let files = sorted(vec![entry("000001.sst", "a")], None);
        let encoded = encode(&files, None).unwrap();
        store_encoded(&store, &encoded);
        // A delta that removes a name its base does not have.
        let bad = format!(
            "{{\"kind\":\"{KIND}\",\"base\":\"{}\",\"removed\":[\"nope.sst\"],\"files\":[]}}",
            encoded.id
        );
        let staged = store.stage_bytes(bad.as_bytes()).unwrap();
        let bad_id = staged.id;
        store.publish(staged).unwrap();
        let err = ListReader::new(&store).resolve(bad_id).unwrap_err();
        assert!(err.to_string().contains("does not list"), "{err}");
        // A file name that would escape the directory.
        let evil = format!(
            "{{\"kind\":\"{KIND}\",\"files\":[{{\"name\":\"../x\",\"object\":\"{}\",\"size\":1}}]}}",
            encoded.id
        );
        let staged = store.stage_bytes(evil.as_bytes()).unwrap();
        let evil_id = staged.id;
        store.publish(staged).unwrap();
        assert!(ListReader::new(&store).resolve(evil_id).is_err());
        // A missing list.
        let missing = ObjectId::from_hash(blake3::hash(b"nothing"));
        assert!(ListReader::new(&store).resolve(missing).is_err());
        // Read ahead, each fails its resolve as it would alone.
        let mut ahead = ListReader::new(&store);
        ahead.read_ahead(&[missing, bad_id, evil_id]);
        assert!(ahead.resolve(missing).is_err());
        let err = ahead.resolve(bad_id).unwrap_err();
        assert!(err.to_string().contains("does not list"), "{err}");
        assert!(ahead.resolve(evil_id).is_err());
    }
}
