//! Durable checkpoint manifests and the store's small metadata file.
//!
//! A manifest says, for one checkpoint, which original file of which backend is which stored
//! object. On a local store, whose one writer is fenced by a lock, writing the manifest
//! (atomically, after every object it names is durable) is the commit point of a checkpoint
//! and removing it the commit point of a drop. On object storage a paused or delayed writer
//! may still write after another took over, so the commit point is a conditional write of
//! `ckptfs.json` instead: a manifest counts only once the metadata no longer lists its id as
//! pending, and never once it lists it as void (see [`StoreMeta::counts`] and
//! `docs/fencing.md`).
//!
//! Every write of `ckptfs.json` is followed, where its settings changed or its next id
//! passed the copy's, by a write of its copy, `ckptfs.copy.json` ([`StoreMeta::for_copy`]):
//! no commit point, never read but to rebuild `ckptfs.json` when that is lost.
//!
//! What the records hold and their format is in [`manifest`] and [`meta`]; this file
//! reads, writes, lists and quarantines them.

use std::collections::{BTreeMap, BTreeSet};
#[cfg(test)]
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::names::BackendName;
use crate::store::conditional::{read_back, ReadBack};
use crate::store::layout::{self, CHECKPOINTS, META, META_COPY, QUARANTINE};
#[cfg(test)]
use crate::store::records::LocalRecords;
use crate::store::records::{Put, Records};
#[cfg(test)]
use crate::store::LocalStore;
use crate::store::{ObjectId, ObjectStore};

pub mod history;
pub mod lists;
pub mod manifest;
pub mod meta;
pub mod shared;

pub use lists::FileList;
use lists::ListReader;
use manifest::{check_format, seal, unseal, StoredManifest};
pub use manifest::{
    validate_file_name, BackendSnapshot, CheckpointStats, FileEntry, FlinkLabel, Manifest, FORMAT,
    OLDEST_FORMAT,
};
pub use meta::{StoreMeta, FLINK_DROPS_KEPT};
pub use shared::{Chain, Files};

/// The manifests (`checkpoints/<id>.json`) and `ckptfs.json` of one store, kept as
/// [`Records`], and the object store its file lists are read from.
pub struct Catalog {
    records: Arc<dyn Records>,
    objects: Arc<dyn ObjectStore>,
    /// `ckptfs.json` as last read or written: metadata is replaced only if nobody else
    /// changed it meanwhile (object storage; a local store has no versions).
    meta_version: std::sync::Mutex<MetaVersion>,
    /// On object storage: the writer's lease, checked before every write.
    fence: Option<crate::lease::Fence>,
    /// A read-only view refuses every write.
    read_only: bool,
    /// What `ckptfs.copy.json` holds, as far as this catalog knows.
    copy: std::sync::Mutex<CopyState>,
}

/// What the copy of the metadata holds, as far as a catalog knows.
enum CopyState {
    /// Not read or written by this catalog yet.
    Unknown,
    /// As read or written last; `None`: there is none, or it cannot be read, or its last
    /// write failed (so the next write of the metadata writes it).
    Holds(Option<Box<StoreMeta>>),
}

/// The version and revision of `ckptfs.json` this catalog last read or wrote.
#[derive(Default)]
struct MetaVersion {
    version: Option<String>,
    revision: u64,
    /// Writes that failed without an answer and could not be read back, oldest first: any
    /// one of them may have landed (a few failures in a row while the store is unreachable).
    unconfirmed: Vec<Vec<u8>>,
}

/// Unconfirmed metadata writes remembered (see [`MetaVersion::unconfirmed`]).
const MAX_UNCONFIRMED: usize = 16;

/// Manifests read together when loading many (bounds the bytes held at once).
const LOAD_BATCH: usize = 256;

impl Catalog {
    /// The catalog kept in `records`, its file lists in `objects`. Creates nothing.
    pub fn new(records: Arc<dyn Records>, objects: Arc<dyn ObjectStore>) -> Self {
        Catalog {
            records,
            objects,
            meta_version: std::sync::Mutex::new(MetaVersion::default()),
            fence: None,
            read_only: false,
            copy: std::sync::Mutex::new(CopyState::Unknown),
        }
    }

    /// A catalog that refuses every write (a read-only view of a store).
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Write only while `fence` says this process is the writer.
    pub fn with_fence(mut self, fence: crate::lease::Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// True where a write of the metadata is the commit point of checkpoints and drops
    /// (object storage: see the module documentation); false where the manifest itself is
    /// (a local store, whose lock fences its one writer).
    pub fn commits_in_meta(&self) -> bool {
        self.records.versioned()
    }

    /// Fails if this process is no longer the store's writer (its lease was lost).
    pub fn check_writer(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly("a read-only view of the store".into()));
        }
        self.fence.as_ref().map_or(Ok(()), |f| f.check())
    }

    /// The catalog of a new local store in a test, `checkpoints/` created (stores are
    /// opened through [`crate::repo::Repo`]).
    #[cfg(test)]
    pub fn open(root: &Path) -> Result<Self> {
        let catalog = Self::new(
            Arc::new(LocalRecords::new(root)),
            Arc::new(LocalStore::open_existing(root)?),
        );
        catalog.create_dir()?;
        Ok(catalog)
    }

    /// Create `checkpoints/` where the store has directories.
    pub fn create_dir(&self) -> Result<()> {
        self.records.create_dir(CHECKPOINTS)
    }

    /// True if the store has its `checkpoints/` directory (always, on object storage).
    pub fn has_dir(&self) -> bool {
        self.records.has_dir(CHECKPOINTS)
    }

    /// Where `fsck --repair` moves manifests that cannot be read.
    pub fn quarantine_dir(&self) -> String {
        self.records.describe(QUARANTINE)
    }

    /// Read the store metadata (`ckptfs.json`), `None` if there is none. One that cannot
    /// be parsed, does not match its checksum, has a format this build does not read or
    /// holds a zero `retain` or `next_checkpoint` is [`Error::Corrupt`]. Remembers the
    /// version read: on object storage the next [`Catalog::save_meta`] is conditional on
    /// it.
    pub fn load_meta(&self) -> Result<Option<StoreMeta>> {
        let Some(record) = self.records.get(META)? else {
            return Ok(None);
        };
        let meta = self.parse_meta(
            META,
            &record.bytes,
            "nothing was changed; move it aside to have it rebuilt from its copy \
             (ckptfs.copy.json) and the checkpoint manifests at the next mount",
        )?;
        *crate::fsutil::lock(&self.meta_version) = MetaVersion {
            version: record.version,
            revision: meta.revision,
            unconfirmed: Vec::new(),
        };
        Ok(Some(meta))
    }

    /// Read the copy of the store metadata (`ckptfs.copy.json`, see
    /// [`StoreMeta::for_copy`]), `None` if there is none: what rebuilds `ckptfs.json` when
    /// that is lost. Damage is [`Error::Corrupt`], as in `ckptfs.json`.
    pub fn load_meta_copy(&self) -> Result<Option<StoreMeta>> {
        let copy = self.read_copy(
            "nothing was changed; move it aside too to have the metadata rebuilt from the \
             checkpoint manifests alone (the pins, the retention policy and the dropped \
             Flink checkpoints are lost then, and every checkpoint is retained)",
        )?;
        *crate::fsutil::lock(&self.copy) = CopyState::Holds(copy.clone().map(Box::new));
        Ok(copy)
    }

    fn read_copy(&self, advice: &str) -> Result<Option<StoreMeta>> {
        match self.records.get(META_COPY)? {
            Some(record) => self.parse_meta(META_COPY, &record.bytes, advice).map(Some),
            None => Ok(None),
        }
    }

    /// The metadata record `key` holds, checked (see [`Catalog::load_meta`]); an error says
    /// `advice`.
    fn parse_meta(&self, key: &str, bytes: &[u8], advice: &str) -> Result<StoreMeta> {
        let path = self.records.describe(key);
        let (meta, sealed): (StoreMeta, bool) =
            unseal(bytes, &path).map_err(|e| Error::Corrupt(format!("{e}; {advice}")))?;
        check_format(meta.format, sealed)
            .map_err(|e| Error::Corrupt(format!("{path} has {e}; {advice}")))?;
        if meta.retain == 0 || meta.next_checkpoint == 0 {
            return Err(Error::Corrupt(format!(
                "{path} is invalid (retain {}, next checkpoint {}); {advice}",
                meta.retain, meta.next_checkpoint
            )));
        }
        if meta.pins.len() > meta::MAX_PINS {
            return Err(Error::Corrupt(format!(
                "{path} is invalid ({} pins, at most {}); {advice}",
                meta.pins.len(),
                meta::MAX_PINS
            )));
        }
        if let Some(name) = meta.pins.keys().find(|n| meta::valid_pin_name(n).is_err()) {
            return Err(Error::Corrupt(format!(
                "{path} is invalid (a pin named {name:?}); {advice}"
            )));
        }
        if let Some(name) = meta
            .pin_expires
            .keys()
            .find(|n| !meta.pins.contains_key(*n))
        {
            return Err(Error::Corrupt(format!(
                "{path} is invalid (an expiry for {name:?}, which is no pin); {advice}"
            )));
        }
        Ok(meta)
    }

    /// Replace the store metadata, unless someone else changed it since this catalog last
    /// read or wrote it ([`Error::Conflict`]: another writer took the store; the fence then
    /// says so too, and nothing more is written). On object storage this is the commit
    /// point of every change of the catalog; each write carries the next revision.
    pub fn save_meta(&self, meta: &StoreMeta) -> Result<()> {
        let saved = self.write_meta(meta);
        if let (Err(e), Some(fence)) = (&saved, &self.fence) {
            if e.kind() == ErrorKind::Conflict {
                fence.lose();
            }
        }
        saved
    }

    /// Become the writer of the catalog: read the metadata, raise its epoch and void every
    /// pending checkpoint (a previous writer's, confirmed by no one: its manifest, whenever
    /// it lands, never counts), and write it back conditionally, so that no write of a
    /// previous writer succeeds from here on. Retried while a previous writer's last write
    /// lands in between. `None` for a store without metadata. Object storage only; a local
    /// store's metadata is read as it is.
    pub fn take_over(&self) -> Result<Option<StoreMeta>> {
        if !self.commits_in_meta() {
            return self.load_meta();
        }
        let mut tries = 0;
        loop {
            let Some(mut meta) = self.load_meta()? else {
                return Ok(None);
            };
            meta.epoch += 1;
            for id in std::mem::take(&mut meta.pending) {
                meta.make_void(id);
            }
            match self.write_meta(&meta) {
                Ok(()) => return Ok(Some(meta)),
                Err(e) if e.kind() == ErrorKind::Conflict && tries < 5 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Write the metadata, then its copy where that no longer stands for it
    /// ([`Catalog::sync_copy`]).
    fn write_meta(&self, meta: &StoreMeta) -> Result<()> {
        // Held across both writes: the copy follows the record, never ahead of it.
        let mut copy = crate::fsutil::lock(&self.copy);
        self.write_record(meta)?;
        self.update_copy(&mut copy, meta);
        Ok(())
    }

    /// Make the copy of the metadata (`ckptfs.copy.json`) stand for `meta`, the metadata
    /// as written: rewritten (atomically and durably, as every record) when one of its
    /// settings changed, when `meta`'s next id reached the copy's, or when the copy is
    /// missing or cannot be read; otherwise not even read again. Every write of the
    /// metadata does this after it; a writer's start too, so that a copy a crash left
    /// behind the metadata is brought up to date. A failed write of the copy is logged and
    /// fails nothing (the metadata is written): the next write of the metadata tries again.
    pub fn sync_copy(&self, meta: &StoreMeta) {
        let mut copy = crate::fsutil::lock(&self.copy);
        self.update_copy(&mut copy, meta);
    }

    fn update_copy(&self, copy: &mut CopyState, meta: &StoreMeta) {
        if let CopyState::Unknown = copy {
            let held = self.read_copy("it is written again").unwrap_or_else(|e| {
                log::warn!("{e}");
                None
            });
            *copy = CopyState::Holds(held.map(Box::new));
        }
        if let CopyState::Holds(Some(held)) = copy {
            if held.covers(meta) {
                return;
            }
        }
        let wanted = meta.for_copy();
        let written = self
            .check_writer()
            .and_then(|()| self.records.put(META_COPY, &seal(&wanted), Put::Overwrite));
        *copy = CopyState::Holds(match written {
            Ok(_) => Some(Box::new(wanted)),
            Err(e) => {
                log::warn!(
                    "could not write {}, the copy that rebuilds {} when it is lost ({e}); the \
                     next write of the metadata tries again",
                    self.records.describe(META_COPY),
                    self.records.describe(META)
                );
                None
            }
        });
    }

    fn write_record(&self, meta: &StoreMeta) -> Result<()> {
        self.check_writer()?;
        let mut state = crate::fsutil::lock(&self.meta_version);
        let versioned = self.records.versioned();
        let mut meta = meta.clone();
        loop {
            let mode = match (versioned, &state.version) {
                (false, _) => Put::Overwrite,
                (true, Some(v)) => Put::Update(Some(v.clone())),
                // Never read: only a store without metadata yet.
                (true, None) => Put::Create,
            };
            if versioned {
                meta.revision = state.revision + 1;
            }
            let bytes = seal(&meta);
            match self.records.put(META, &bytes, mode) {
                Ok(written) => {
                    state.version = written;
                    state.revision = meta.revision;
                    state.unconfirmed.clear();
                    return Ok(());
                }
                // An earlier write whose answer was lost may have landed: then the record is
                // still this writer's, and this write goes again on top of it.
                // If the record cannot be read now, nothing is known: an I/O error, not a
                // takeover (the next write looks again).
                Err(e) if matches!(e.kind(), ErrorKind::Conflict | ErrorKind::Exists) => {
                    if !self.adopt_unconfirmed(&mut state)? {
                        return Err(Error::Conflict(format!(
                            "{} was changed by another process: another daemon took over \
                             this store, and this one no longer writes to it",
                            self.records.describe(META)
                        )));
                    }
                }
                Err(e) => {
                    // Perhaps it landed all the same (a lost response): the record tells, by
                    // its bytes, which are unique to this write; if it cannot be read now,
                    // the next write finds out.
                    // An earlier unconfirmed write may be what it shows instead: adopt
                    // it, or the next write would look like another writer's takeover.
                    if versioned {
                        match read_back(self.records.as_ref(), META, &bytes) {
                            Ok(ReadBack::Landed { version }) => {
                                state.version = version;
                                state.revision = meta.revision;
                                state.unconfirmed.clear();
                                return Ok(());
                            }
                            Ok(ReadBack::Other(record)) => {
                                if !Self::adopt_if_unconfirmed(&mut state, record) {
                                    // A write that timed out may still land later.
                                    Self::remember_unconfirmed(&mut state, bytes);
                                }
                            }
                            Ok(ReadBack::Absent) | Err(_) => {
                                Self::remember_unconfirmed(&mut state, bytes)
                            }
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    /// If one of the writes whose outcome is unknown is what the store holds, take its
    /// version: it landed.
    fn adopt_unconfirmed(&self, state: &mut MetaVersion) -> Result<bool> {
        if state.unconfirmed.is_empty() {
            return Ok(false);
        }
        match self.records.get(META)? {
            Some(record) => Ok(Self::adopt_if_unconfirmed(state, record)),
            None => Ok(false),
        }
    }

    fn remember_unconfirmed(state: &mut MetaVersion, bytes: Vec<u8>) {
        if state.unconfirmed.len() == MAX_UNCONFIRMED {
            state.unconfirmed.remove(0);
        }
        state.unconfirmed.push(bytes);
    }

    fn adopt_if_unconfirmed(
        state: &mut MetaVersion,
        record: crate::store::records::Record,
    ) -> bool {
        let Some(landed) = state
            .unconfirmed
            .iter()
            .find(|earlier| **earlier == record.bytes)
            .and_then(|earlier| unseal::<StoreMeta>(earlier, META).ok())
        else {
            return false;
        };
        log::info!("a write of the store metadata whose answer was lost had landed");
        state.version = record.version;
        state.revision = landed.0.revision;
        state.unconfirmed.clear();
        true
    }

    fn manifest_key(id: u64) -> String {
        layout::manifest_key(id)
    }

    /// Durably write a manifest (in the current format; its file lists must be stored
    /// already): from here on the checkpoint exists. A manifest is never overwritten: if
    /// one of that id exists already, another writer made it ([`Error::Exists`]).
    pub fn commit(&self, manifest: &Manifest) -> Result<()> {
        self.write_manifest(manifest, Put::Create)
    }

    /// Rewrite a manifest in the current format (migration; same checkpoint, same files).
    pub fn rewrite(&self, manifest: &Manifest) -> Result<()> {
        self.write_manifest(manifest, Put::Overwrite)
    }

    fn write_manifest(&self, manifest: &Manifest, mode: Put) -> Result<()> {
        self.check_writer()?;
        let key = Self::manifest_key(manifest.id);
        self.records
            .put(&key, &seal(&manifest.to_stored()), mode)
            .map(|_| ())
    }

    /// Store the file list of each backend whose files are listed inline, as a delta on
    /// `previous` (the backend's list in an earlier checkpoint of the same lineage) where
    /// that helps; returns the manifest with its lists. Nothing is committed.
    pub fn store_lists(
        &self,
        manifest: &Manifest,
        previous: &BTreeMap<(BackendName, String), FileList>,
    ) -> Result<Manifest> {
        let mut out = manifest.clone();
        for b in out.backends.iter_mut().filter(|b| b.lists.is_empty()) {
            let base = previous.get(&(b.name.clone(), b.lineage.clone()));
            b.lists = match lists::encode(&b.files, base) {
                None => base.expect("no change means a base").chain.clone(),
                Some(encoded) => {
                    let staged = self.objects.stage_bytes(&encoded.bytes)?;
                    self.objects.publish(staged)?;
                    encoded.chain
                }
            };
        }
        Ok(out)
    }

    /// Durably remove a manifest: from here on the checkpoint is gone.
    pub fn remove(&self, id: u64) -> Result<()> {
        self.check_writer()?;
        self.records.delete(&Self::manifest_key(id))
    }

    /// The metadata as a reader judges manifests by: `None` where it is missing or cannot
    /// be read (then every manifest counts, as on a store of an older format).
    fn meta_for_reading(&self) -> Result<Option<StoreMeta>> {
        Ok(self
            .records
            .get(META)?
            .and_then(|record| unseal::<StoreMeta>(&record.bytes, META).ok())
            .map(|(meta, _)| meta))
    }

    /// Load the manifest of checkpoint `id`, if it is committed ([`Error::NoSuchCheckpoint`]
    /// for a pending or void one).
    pub fn load(&self, id: u64) -> Result<Manifest> {
        if self.meta_for_reading()?.is_some_and(|m| !m.counts(id)) {
            return Err(Error::NoSuchCheckpoint(id));
        }
        self.load_with(id, &mut ListReader::new(self.objects.as_ref()))
    }

    fn load_with(&self, id: u64, reader: &mut ListReader) -> Result<Manifest> {
        let key = Self::manifest_key(id);
        let record = self.records.get(&key)?.ok_or(Error::NoSuchCheckpoint(id))?;
        let stored = self.unseal_manifest(id, &record.bytes)?;
        self.finish_manifest(id, stored, reader)
    }

    /// A manifest's bytes parsed and checked against their checksum and format.
    fn unseal_manifest(&self, id: u64, bytes: &[u8]) -> Result<StoredManifest> {
        let path = self.records.describe(&Self::manifest_key(id));
        let (stored, sealed): (StoredManifest, bool) = unseal(bytes, &path)?;
        check_format(stored.format, sealed)
            .map_err(|e| Error::Corrupt(format!("{path} is invalid: {e}")))?;
        Ok(stored)
    }

    /// A parsed manifest with its file lists read, validated.
    fn finish_manifest(
        &self,
        id: u64,
        stored: StoredManifest,
        reader: &mut ListReader,
    ) -> Result<Manifest> {
        let path = self.records.describe(&Self::manifest_key(id));
        let invalid = |e: Error| Error::Corrupt(format!("{path} is invalid: {e}"));
        let manifest = Manifest::from_stored(stored, reader).map_err(invalid)?;
        manifest.validate().map_err(invalid)?;
        if manifest.id != id {
            return Err(Error::Corrupt(format!(
                "{path} claims to be checkpoint {}",
                manifest.id
            )));
        }
        Ok(manifest)
    }

    /// Every committed manifest. Any unreadable manifest fails the whole load: a checkpoint
    /// the catalog cannot read must never look like one that does not exist (its objects
    /// would be swept). Leftovers of interrupted writes are skipped, not removed: only the
    /// lock holder removes anything ([`Catalog::clear_leftovers`]).
    pub fn load_all(&self) -> Result<BTreeMap<u64, Manifest>> {
        let (manifests, unreadable) = self.load_all_lenient()?;
        match unreadable.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(manifests),
        }
    }

    /// The ids of the committed manifests, and the names of what else is in `checkpoints/`
    /// (manifests that do not count, pending or void, are neither).
    pub fn list_ids(&self) -> Result<(BTreeSet<u64>, Vec<String>)> {
        let listing = self.list_manifests()?;
        Ok((listing.committed, listing.others))
    }

    /// What `checkpoints/` holds, judged by the metadata read just before it is listed (a
    /// manifest committed after that read is seen at the next look).
    pub fn list_manifests(&self) -> Result<Listing> {
        let meta = self.meta_for_reading()?;
        let mut listing = Listing::default();
        for name in self.records.list(CHECKPOINTS)? {
            match manifest_id(&name) {
                Some(id) if meta.as_ref().is_none_or(|m| m.counts(id)) => {
                    listing.committed.insert(id);
                }
                // A writer's checkpoint in flight: neither committed nor void yet.
                Some(id) if meta.as_ref().is_some_and(|m| m.pending.contains(&id)) => {}
                Some(id) => {
                    listing.void.insert(id);
                }
                None => listing.others.push(name),
            }
        }
        Ok(listing)
    }

    /// Every readable manifest, and the file names of the unreadable ones with their errors.
    pub fn load_all_lenient(&self) -> Result<(BTreeMap<u64, Manifest>, Vec<Unreadable>)> {
        let mut manifests = BTreeMap::new();
        let mut unreadable = Vec::new();
        let mut reader = ListReader::new(self.objects.as_ref());
        let (ids, others) = self.list_ids()?;
        for name in others {
            // Perhaps a manifest set aside by hand (`12.json.bad`): it may name objects,
            // so it counts as unreadable (deletions freeze) until it is dealt with.
            unreadable.push((
                name,
                Error::Corrupt("not a manifest name (N.json) in checkpoints/".into()),
            ));
        }
        let ids: Vec<u64> = ids.into_iter().collect();
        for batch in ids.chunks(LOAD_BATCH) {
            for (id, loaded) in self.load_batch(batch, &mut reader)? {
                match loaded {
                    Ok(m) => {
                        manifests.insert(id, m);
                    }
                    // Dropped by a live daemon between the listing and the read: the
                    // manifest is gone, or (a daemon deletes a dropped checkpoint's objects
                    // after its manifest) one of its file lists is.
                    Err(e) if e.kind() == crate::error::ErrorKind::NotFound => {}
                    Err(_) if matches!(self.records.get(&Self::manifest_key(id)), Ok(None)) => {}
                    Err(e) => unreadable.push((layout::manifest_name(id), e)),
                }
            }
        }
        Ok((manifests, unreadable))
    }

    /// Load the manifests `ids` (each one's own result): their records read together (at
    /// once on object storage), then the file lists they name fetched ahead.
    pub fn load_many(&self, ids: &[u64]) -> Result<Vec<(u64, Result<Manifest>)>> {
        let mut reader = ListReader::new(self.objects.as_ref());
        let mut out = Vec::with_capacity(ids.len());
        for batch in ids.chunks(LOAD_BATCH) {
            out.extend(self.load_batch(batch, &mut reader)?);
        }
        Ok(out)
    }

    fn load_batch(
        &self,
        ids: &[u64],
        reader: &mut ListReader,
    ) -> Result<Vec<(u64, Result<Manifest>)>> {
        let keys: Vec<String> = ids.iter().map(|id| Self::manifest_key(*id)).collect();
        let records = self.records.get_many(&keys);
        let parsed: Vec<(u64, Result<StoredManifest>)> = ids
            .iter()
            .zip(records)
            .map(|(id, record)| {
                let stored = match record {
                    Ok(Some(record)) => self.unseal_manifest(*id, &record.bytes),
                    Ok(None) => Err(Error::NoSuchCheckpoint(*id)),
                    Err(e) => Err(e),
                };
                (*id, stored)
            })
            .collect();
        let lists: Vec<ObjectId> = parsed
            .iter()
            .filter_map(|(_, stored)| stored.as_ref().ok())
            .flat_map(|stored| stored.backends.iter().filter_map(|b| b.list))
            .collect();
        self.objects.prefetch(&lists);
        reader.read_ahead(&lists);
        Ok(parsed
            .into_iter()
            .map(|(id, stored)| (id, stored.and_then(|s| self.finish_manifest(id, s, reader))))
            .collect())
    }

    /// Leftovers of interrupted atomic writes of manifests and metadata.
    pub fn leftovers(&self) -> Result<Vec<String>> {
        self.records.leftovers()
    }

    /// Remove leftovers of interrupted atomic writes (lock holders only).
    pub fn clear_leftovers(&self) -> Result<usize> {
        self.records.clear_leftovers()
    }

    /// True if the store holds manifests (committed or not readable).
    pub fn has_manifests(&self) -> Result<bool> {
        Ok(self
            .records
            .list(CHECKPOINTS)?
            .iter()
            .any(|n| n.ends_with(".json")))
    }

    /// Move an unreadable manifest out of the way into `quarantine/`, never deleting it:
    /// the copy is durable before the original goes. Returns where it went.
    pub fn quarantine(&self, name: &str) -> Result<String> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::Invalid(format!("cannot quarantine {name:?}")));
        }
        let src = format!("{CHECKPOINTS}/{name}");
        let Some(record) = self.records.get(&src)? else {
            return Err(Error::NotFound(self.records.describe(&src)));
        };
        let taken = self.records.list(QUARANTINE)?;
        let mut dest = name.to_string();
        let mut n = 1;
        while taken.contains(&dest) {
            dest = format!("{name}.{n}");
            n += 1;
        }
        let dest = format!("{QUARANTINE}/{dest}");
        self.check_writer()?;
        self.records.put(&dest, &record.bytes, Put::Create)?;
        self.check_writer()?;
        self.records.delete(&src)?;
        Ok(self.records.describe(&dest))
    }

    /// True if `quarantine/` holds anything.
    /// Fails safe: anything but a missing or empty directory counts as holding manifests.
    pub fn has_quarantine(&self) -> bool {
        self.records
            .list(QUARANTINE)
            .map_or(true, |n| !n.is_empty())
    }
}

/// A manifest file that cannot be read, and why.
pub type Unreadable = (String, Error);

/// The manifests in `checkpoints/`, by what they are (pending ones, a writer's checkpoints
/// in flight, are in neither set).
#[derive(Debug, Default)]
pub struct Listing {
    /// Checkpoints that count.
    pub committed: BTreeSet<u64>,
    /// Never count: left by a writer that lost the store, or dropped (object storage).
    pub void: BTreeSet<u64>,
    /// Names that are no manifest's.
    pub others: Vec<String>,
}

pub use crate::store::layout::manifest_id;

#[cfg(test)]
mod tests {
    use super::manifest::tests::sample;
    use super::*;

    #[test]
    fn manifests_round_trip_and_removal_is_final() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        catalog.commit(&sample(4)).unwrap();
        catalog.commit(&sample(9)).unwrap();
        let all = catalog.load_all().unwrap();
        assert_eq!(all.keys().copied().collect::<Vec<_>>(), vec![4, 9]);
        assert_eq!(all[&4], sample(4));
        catalog.remove(4).unwrap();
        assert!(matches!(catalog.load(4), Err(Error::NoSuchCheckpoint(4))));
        assert_eq!(catalog.load_all().unwrap().len(), 1);
    }

    #[test]
    fn a_corrupt_manifest_is_reported_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        std::fs::write(dir.path().join("checkpoints/3.json"), b"{not json").unwrap();
        assert!(matches!(catalog.load_all(), Err(Error::Corrupt(_))));
    }

    /// Records in a local directory that behave like object storage (versions, conditional
    /// writes) and fail on demand: a write that lands and answers with an error (a lost
    /// response), reads that fail.
    struct LossyRecords {
        inner: LocalRecords,
        lose_next_answer: std::sync::atomic::AtomicBool,
        fail_reads: std::sync::atomic::AtomicBool,
        /// Writes fail without landing.
        fail_writes: std::sync::atomic::AtomicBool,
    }

    impl LossyRecords {
        fn version(bytes: &[u8]) -> Option<String> {
            Some(blake3::hash(bytes).to_hex()[..16].to_string())
        }
    }

    impl Records for LossyRecords {
        fn get(&self, key: &str) -> Result<Option<crate::store::records::Record>> {
            if self.fail_reads.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::io("read", std::io::Error::other("connection reset")));
            }
            Ok(self.inner.get(key)?.map(|mut r| {
                r.version = Self::version(&r.bytes);
                r
            }))
        }
        fn put(&self, key: &str, bytes: &[u8], mode: Put) -> Result<Option<String>> {
            if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::io(
                    "write",
                    std::io::Error::other("connection refused"),
                ));
            }
            let current = self.inner.get(key)?.map(|r| Self::version(&r.bytes));
            match (&mode, &current) {
                (Put::Create, Some(_)) => return Err(Error::Exists(key.into())),
                (Put::Update(Some(v)), Some(c)) if Some(v) != c.as_ref() => {
                    return Err(Error::Conflict(key.into()))
                }
                _ => {}
            }
            self.inner.put(key, bytes, Put::Overwrite)?;
            if self
                .lose_next_answer
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                return Err(Error::io(
                    "write",
                    std::io::Error::other("connection closed"),
                ));
            }
            Ok(Self::version(bytes))
        }
        fn delete(&self, key: &str) -> Result<()> {
            self.inner.delete(key)
        }
        fn list(&self, dir: &str) -> Result<Vec<String>> {
            self.inner.list(dir)
        }
        fn has_dir(&self, dir: &str) -> bool {
            self.inner.has_dir(dir)
        }
        fn create_dir(&self, dir: &str) -> Result<()> {
            self.inner.create_dir(dir)
        }
        fn describe(&self, key: &str) -> String {
            self.inner.describe(key)
        }
        fn versioned(&self) -> bool {
            true
        }
    }

    /// A catalog on [`LossyRecords`] in `dir`, and the records (to make them fail).
    fn lossy_catalog(dir: &Path) -> (Arc<LossyRecords>, Catalog) {
        let records = Arc::new(LossyRecords {
            inner: LocalRecords::new(dir),
            lose_next_answer: false.into(),
            fail_reads: false.into(),
            fail_writes: false.into(),
        });
        let objects = Arc::new(LocalStore::open(dir).unwrap());
        let catalog = Catalog::new(records.clone(), objects);
        catalog.create_dir().unwrap();
        (records, catalog)
    }

    /// A catalog in `dir` whose second write of the metadata (next checkpoint 2) landed
    /// with its answer lost and could not be read back; reads still fail.
    fn a_write_landed_unanswered(dir: &Path) -> (Arc<LossyRecords>, Catalog, StoreMeta) {
        use std::sync::atomic::Ordering::SeqCst;
        let (records, catalog) = lossy_catalog(dir);
        let mut meta = StoreMeta::default();
        catalog.save_meta(&meta).unwrap();
        meta.next_checkpoint = 2;
        records.lose_next_answer.store(true, SeqCst);
        records.fail_reads.store(true, SeqCst);
        assert!(catalog.save_meta(&meta).is_err());
        (records, catalog, meta)
    }

    /// A write of the metadata that landed but whose answer was lost (and could not be read
    /// back at once) is found to be this writer's at the next write, which then succeeds:
    /// it never looks like another writer's takeover.
    #[test]
    fn a_metadata_write_whose_answer_was_lost_is_adopted() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().unwrap();
        let (records, catalog, mut meta) = a_write_landed_unanswered(dir.path());
        records.fail_reads.store(false, SeqCst);
        meta.next_checkpoint = 3;
        catalog.save_meta(&meta).unwrap();
        let read = catalog.load_meta().unwrap().unwrap();
        assert_eq!(read.next_checkpoint, 3);
        assert_eq!(read.revision, 3);
        // Someone else's write is still a conflict.
        records
            .inner
            .put(META, &seal(&StoreMeta::default()), Put::Overwrite)
            .unwrap();
        meta.next_checkpoint = 4;
        assert!(matches!(catalog.save_meta(&meta), Err(Error::Conflict(_))));
    }

    /// While the store is unreachable a write lands with its answer lost, and the next one
    /// fails without landing but reads the first back: the first is adopted, not forgotten,
    /// and the write after succeeds (it is no other writer's takeover).
    #[test]
    fn an_unconfirmed_write_seen_by_a_later_failed_write_is_adopted() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().unwrap();
        let (records, catalog) = lossy_catalog(dir.path());
        let mut meta = StoreMeta::default();
        catalog.save_meta(&meta).unwrap();
        for (step, next) in [2u64, 3].into_iter().enumerate() {
            meta.next_checkpoint = next;
            records.lose_next_answer.store(step == 0, SeqCst);
            records.fail_reads.store(step == 0, SeqCst);
            records.fail_writes.store(step == 1, SeqCst);
            assert!(catalog.save_meta(&meta).is_err());
        }
        records.fail_writes.store(false, SeqCst);
        meta.next_checkpoint = 4;
        catalog.save_meta(&meta).unwrap();
        let read = catalog.load_meta().unwrap().unwrap();
        assert_eq!((read.next_checkpoint, read.revision), (4, 3));
    }

    /// A write refused as conditional while the record cannot be read back is an I/O
    /// error, not another writer's takeover: the fence holds, and the next write, once the
    /// store answers again, adopts the earlier write and succeeds.
    #[test]
    fn a_refused_write_that_cannot_be_read_back_is_no_takeover() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().unwrap();
        let (records, catalog, mut meta) = a_write_landed_unanswered(dir.path());
        // The earlier write landed: this one is refused, and still nothing can be read.
        meta.next_checkpoint = 3;
        let refused = catalog.save_meta(&meta).unwrap_err();
        assert!(!matches!(refused, Error::Conflict(_)), "{refused}");
        records.fail_reads.store(false, SeqCst);
        meta.next_checkpoint = 4;
        catalog.save_meta(&meta).unwrap();
        assert_eq!(catalog.load_meta().unwrap().unwrap().next_checkpoint, 4);
    }

    /// The copy of the metadata follows it: written with its first write, and again when a
    /// setting changes or its next id passes the copy's, not at every write; without a
    /// writer's bookkeeping. A failed write of the copy fails no write of the metadata and
    /// is tried again at the next; a damaged copy is refused when read.
    #[test]
    fn the_copy_of_the_metadata_follows_its_settings_and_stays_ahead_of_its_ids() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        let path = dir.path().join(META_COPY);
        // Each write renames a new file into place.
        let written = || std::fs::metadata(&path).map(|m| m.ino()).ok();
        let copy = || {
            let (copy, sealed) = unseal::<StoreMeta>(&std::fs::read(&path).unwrap(), "").unwrap();
            assert!(sealed);
            copy
        };
        assert!(catalog.load_meta_copy().unwrap().is_none());
        let mut meta = StoreMeta::default();
        catalog.save_meta(&meta).unwrap();
        let first = written().expect("no copy written");
        assert_eq!(copy().next_checkpoint, 1 + meta::COPY_IDS_AHEAD);
        // Ids up to the copy's next one, a writer's bookkeeping: not written again.
        meta.next_checkpoint = 1 + meta::COPY_IDS_AHEAD;
        meta.epoch = 7;
        meta.revision = 9;
        meta.pending = vec![meta.next_checkpoint - 1];
        meta.make_void(3);
        catalog.save_meta(&meta).unwrap();
        assert_eq!(written(), Some(first));
        // Past it: written again, ahead again, and no bookkeeping in it.
        meta.next_checkpoint += 1;
        catalog.save_meta(&meta).unwrap();
        let second = written().unwrap();
        assert_ne!(second, first);
        assert_eq!(copy(), meta.for_copy());
        assert_eq!(
            (copy().epoch, copy().pending.len(), copy().void.len()),
            (0, 0, 0)
        );
        assert_eq!(
            copy().next_checkpoint,
            meta.next_checkpoint + meta::COPY_IDS_AHEAD
        );
        // A setting: written again.
        meta.pins.insert("kept".into(), 2);
        catalog.save_meta(&meta).unwrap();
        assert_ne!(written(), Some(second));
        assert_eq!(copy().pins, meta.pins);
        // The copy cannot be written (a directory in its place): the metadata is, and the
        // next write of the metadata writes the copy.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        meta.keep.daily = 7;
        catalog.save_meta(&meta).unwrap();
        assert_eq!(catalog.load_meta().unwrap().unwrap().keep.daily, 7);
        std::fs::remove_dir(&path).unwrap();
        meta.next_checkpoint += 1;
        catalog.save_meta(&meta).unwrap();
        assert_eq!(copy(), meta.for_copy());
        // Damage is refused when the copy is read, and a new catalog writes it again.
        std::fs::write(&path, b"{").unwrap();
        let e = catalog.load_meta_copy().unwrap_err();
        assert!(
            matches!(&e, Error::Corrupt(m) if m.contains(META_COPY)),
            "{e}"
        );
        let again = Catalog::open(dir.path()).unwrap();
        again.sync_copy(&meta);
        assert_eq!(copy(), meta.for_copy());
    }

    #[test]
    fn meta_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        assert!(catalog.load_meta().unwrap().is_none());
        let meta = StoreMeta {
            next_checkpoint: 12,
            ..StoreMeta::default()
        };
        catalog.save_meta(&meta).unwrap();
        assert_eq!(catalog.load_meta().unwrap(), Some(meta.clone()));
        // A policy and pins round-trip; a pin name that could not be a file name in the
        // mount's pinned/ is damage, refused.
        let mut kept = meta.clone();
        kept.keep.daily = 7;
        kept.keep.within_ms = 3_600_000;
        kept.pins.insert("before-deploy".into(), 11);
        catalog.save_meta(&kept).unwrap();
        assert_eq!(catalog.load_meta().unwrap(), Some(kept.clone()));
        kept.pins.insert("../../etc".into(), 11);
        catalog.save_meta(&kept).unwrap();
        let e = catalog.load_meta().unwrap_err();
        assert!(
            matches!(&e, Error::Corrupt(m) if m.contains("a pin named \"../../etc\"")),
            "{e}"
        );
    }
}
