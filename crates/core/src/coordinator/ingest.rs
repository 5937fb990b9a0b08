//! The one way bytes come into the store. Every piece a checkpoint or a materialization
//! needs (a whole file, a chunk of an append-only file, a backend's file list) goes through
//! [`Ingest`]: it is re-referenced if the store holds it alive, or else staged, then
//! published unless the store came to hold it meanwhile, and pinned either way.
//!
//! The check and the pin happen under one lock of the engine's state, so an object found
//! alive cannot be deleted before it is pinned; whether to publish is decided under the
//! same lock, so concurrent checkpoints that stage the same content resolve to one object
//! (the first publishes, the others discard). Staging (the copy or the upload) happens
//! without the lock, several at once where the store gains from it (object storage).
//! What an ingest pinned is released by its owner when it does not commit.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};

use super::{Base, Engine, State};
use crate::backend::{chunk_size_for, is_shared_file, wal_number, StagedFile};
use crate::catalog::{lists, CheckpointStats, FileEntry, FileList};
use crate::error::{Error, IoContext, Result};
use crate::fsutil::parallel_map;
use crate::names::BackendName;
use crate::store::chunks::Chunks;
use crate::store::{hash_file, ObjectId, ObjectStore, Staged};

/// What one backend contributes to a checkpoint (or a materialization): its staged files,
/// stored on top of `base` (the backend's newest confirmed checkpoint).
pub(super) struct PendingBackend {
    pub name: BackendName,
    pub lineage: String,
    pub files: Vec<StagedFile>,
    /// Named as they are from the materialization this checkpoint builds on (pinned).
    pub kept: Vec<Arc<FileEntry>>,
    pub materializes: Option<u64>,
    pub base: Option<Base>,
    /// An import: files are re-referenced by their source (matched before, in `kept`),
    /// never by name alone (another directory's `000012.sst` is another file).
    pub by_source_only: bool,
}

impl PendingBackend {
    /// Staged files to store on top of `base`.
    pub(super) fn new(
        name: BackendName,
        lineage: String,
        files: Vec<StagedFile>,
        base: Option<Base>,
    ) -> Self {
        PendingBackend {
            name,
            lineage,
            files,
            kept: Vec::new(),
            materializes: None,
            base,
            by_source_only: false,
        }
    }

    /// The entry for a file, shared with the base's when it is the same (memory follows
    /// what changed, not the number of checkpoints).
    fn entry(&self, file: &StagedFile, object: ObjectId, size: u64) -> Arc<FileEntry> {
        self.entry_stored_as(FileEntry {
            source: file.source.as_deref().map(Into::into),
            column_family: file.column_family.as_deref().map(Into::into),
            ..FileEntry::whole(&file.name, object, size)
        })
    }

    /// `entry`, or the base's equal one (same content, stored the same way).
    fn entry_stored_as(&self, entry: FileEntry) -> Arc<FileEntry> {
        self.base
            .as_ref()
            .and_then(|b| b.by_name.get(&entry.name))
            .filter(|known| ***known == entry)
            .cloned()
            .unwrap_or_else(|| Arc::new(entry))
    }

    /// The base's entry for a shared file of the same name and size, stored whole: the
    /// same file (SSTs are immutable and their numbers never reused within a lineage).
    fn known(&self, file: &StagedFile) -> Option<&Arc<FileEntry>> {
        self.base
            .as_ref()
            .filter(|_| is_shared_file(&file.name) && !self.by_source_only)
            .and_then(|b| b.by_name.get(&file.name))
            .filter(|known| known.size == file.size && known.chunks.is_none())
    }
}

/// How far an append-only file was cut into chunks at a previous checkpoint: its first
/// `len` bytes (a chunk boundary) are the chunks `ids`, and `hasher` has hashed them. A WAL
/// file only grows (recycling is off), so the next checkpoint of the same lineage resumes
/// here instead of reading and hashing the whole file again.
#[derive(Clone)]
pub(super) struct ChunkedPrefix {
    len: u64,
    chunk_size: u32,
    hasher: blake3::Hasher,
    ids: Vec<ObjectId>,
}

/// What a published piece was, for the checkpoint's figures.
#[derive(Clone, Copy)]
enum Piece {
    /// A whole file (an SST, or a small private file).
    File,
    /// A chunk of a write-ahead log.
    WalChunk,
    /// A chunk of another append-only file (RocksDB's MANIFEST).
    Chunk,
    /// A backend's file list.
    List,
}

/// One checkpoint's (or materialization's) way into the store: what it pins goes into
/// `pins`, what it uploads into `stats`.
pub(super) struct Ingest<'a> {
    engine: &'a Engine,
    store: &'a dyn ObjectStore,
    pins: &'a mut Vec<ObjectId>,
    stats: &'a mut CheckpointStats,
    /// Bytes of file lists uploaded (part of `stats.bytes_uploaded`; not reused file bytes).
    list_bytes: u64,
    /// The whole files stored (or re-referenced) so far, by the path they were read from:
    /// a file several names of an import read through one path (one source file named by
    /// many handles) is read and staged once, the other names re-reference its object.
    by_path: HashMap<std::path::PathBuf, (ObjectId, u64)>,
}

impl<'a> Ingest<'a> {
    /// Ingest into `store` (the engine's, or a wrapper of it) for `engine`'s registry.
    pub(super) fn new(
        engine: &'a Engine,
        store: &'a dyn ObjectStore,
        pins: &'a mut Vec<ObjectId>,
        stats: &'a mut CheckpointStats,
    ) -> Self {
        Ingest {
            engine,
            store,
            pins,
            stats,
            list_bytes: 0,
            by_path: HashMap::new(),
        }
    }

    /// Bytes of file lists this ingest uploaded.
    pub(super) fn list_bytes(&self) -> u64 {
        self.list_bytes
    }

    /// Bytes this ingest uploaded so far (files, chunks and lists).
    pub(super) fn uploaded(&self) -> u64 {
        self.stats.bytes_uploaded
    }

    /// Re-reference `id` if the store holds it alive: checked and pinned under one lock.
    fn share(&mut self, id: &ObjectId) -> bool {
        let mut st = self.engine.state();
        self.share_locked(&mut st, id)
    }

    fn share_locked(&mut self, st: &mut MutexGuard<'_, State>, id: &ObjectId) -> bool {
        if !st.can_share(id) {
            return false;
        }
        st.held.registry.pin(*id);
        self.pins.push(*id);
        true
    }

    /// Publish `staged` unless the store came to hold its content meanwhile (a concurrent
    /// checkpoint's copy, which survives; ours is the duplicate), and pin it either way.
    /// Called under the state lock, so no other ingest decides in between. True if it
    /// was published.
    fn publish(
        &mut self,
        st: &mut MutexGuard<'_, State>,
        staged: Staged,
        piece: Piece,
    ) -> Result<bool> {
        let (id, size) = (staged.id, staged.size);
        let published = !st.can_share(&id);
        if !published {
            self.store.discard(staged);
        } else {
            if st.held.missing.contains(&id) {
                // Named by manifests already: durable before it counts as found again.
                self.store.publish(staged)?;
            } else {
                // Durable with the others before the manifest names it (see `commit`).
                self.store.publish_unsynced(staged)?;
            }
            self.stats.bytes_uploaded += size;
            match piece {
                Piece::WalChunk => self.stats.bytes_uploaded_wal += size,
                Piece::Chunk => self.stats.bytes_uploaded_append_only += size,
                Piece::List => self.list_bytes += size,
                Piece::File => {}
            }
            if st.held.missing.remove(&id) {
                log::info!("object {id} was missing and is stored again");
            }
        }
        st.held.registry.pin(id);
        self.pins.push(id);
        Ok(published)
    }

    /// Store pieces held in memory unless the store holds them already: those it holds are
    /// pinned at once, the others staged (several at once where the store gains from it),
    /// then published or found stored meanwhile, and pinned.
    fn pieces(&mut self, pieces: Vec<(ObjectId, Vec<u8>)>, piece: Piece) -> Result<()> {
        let todo: Vec<Vec<u8>> = {
            let mut st = self.engine.state();
            pieces
                .into_iter()
                .filter(|(id, _)| !self.share_locked(&mut st, id))
                .map(|(_, bytes)| bytes)
                .collect()
        };
        let staged = stage_all(self.store, &todo);
        let mut st = self.engine.state();
        let mut failed = None;
        for staged in staged {
            match staged {
                Ok(staged) if failed.is_some() => self.store.discard(staged),
                Ok(staged) => {
                    if let Err(e) = self.publish(&mut st, staged, piece) {
                        failed = Some(e);
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Store the staged files of one backend (the asynchronous phase's work): re-reference
    /// what the base holds under the same name, store what is new (append-only files as
    /// chunks), pin everything. Returns the entries, `kept` ones first.
    pub(super) fn backend(&mut self, part: &PendingBackend) -> Result<Vec<Arc<FileEntry>>> {
        let mut entries = Vec::with_capacity(part.files.len() + part.kept.len());
        for kept in &part.kept {
            self.stats.files_total += 1;
            self.stats.files_reused += 1;
            self.stats.bytes_total += kept.size;
            entries.push(kept.clone());
        }
        let mut prefixes = HashMap::new();
        let mut ahead = AheadSet::start(self.engine, self.store, part, &self.by_path);
        for file in part.files.iter() {
            crate::failpoint!("ingest::before-file");
            self.stats.files_total += 1;
            self.stats.bytes_total += file.size;
            if wal_number(&file.name).is_some() {
                self.stats.bytes_wal += file.size;
            }
            // Re-reference by name only within the lineage of a confirmed checkpoint, and
            // only while the object is still alive.
            if let Some(known) = part.known(file) {
                if self.share(&known.object) {
                    self.stats.files_reused += 1;
                    entries.push(known.clone());
                    continue;
                }
            }
            self.stats.files_new += 1;
            if let Some(chunk_size) = chunk_size_for(&file.name, file.size) {
                // A WAL file that only grew since the previous checkpoint of this lineage:
                // resume where that one stopped cutting it.
                let resume = wal_number(&file.name).and_then(|_| {
                    let st = self.engine.state();
                    st.wal
                        .prefixes
                        .get(&part.name)
                        .filter(|(lineage, _)| *lineage == part.lineage)
                        .and_then(|(_, files)| files.get(&file.name).cloned())
                });
                let (entry, prefix) = self.chunked(part, file, chunk_size, resume.as_deref())?;
                if wal_number(&file.name).is_some() {
                    prefixes.insert(file.name.clone(), Arc::new(prefix));
                }
                entries.push(entry);
                continue;
            }
            entries.push(self.whole_file(part, file, &mut ahead)?);
        }
        // Only the WAL files of this checkpoint can grow further.
        self.engine
            .state()
            .wal
            .prefixes
            .insert(part.name.clone(), (part.lineage.clone(), prefixes));
        Ok(entries)
    }

    /// Store one file whole (staged ahead, or now), unless its content is stored already.
    fn whole_file(
        &mut self,
        part: &PendingBackend,
        file: &StagedFile,
        ahead: &mut AheadSet<'_>,
    ) -> Result<Arc<FileEntry>> {
        let shared = is_shared_file(&file.name);
        if let Some(&(id, size)) = self.by_path.get(&file.path) {
            // Read and stored under another name of this checkpoint: pinned while it is.
            if size == file.size && self.share(&id) {
                return Ok(part.entry(file, id, size));
            }
        }
        let entry = self.whole_file_once(part, file, ahead, shared)?;
        self.by_path
            .insert(file.path.clone(), (entry.object, entry.size));
        Ok(entry)
    }

    /// [`Ingest::whole_file`] of a path not read yet.
    fn whole_file_once(
        &mut self,
        part: &PendingBackend,
        file: &StagedFile,
        ahead: &mut AheadSet<'_>,
        shared: bool,
    ) -> Result<Arc<FileEntry>> {
        let staging = match ahead.take(&file.name) {
            Some(staged_ahead) => staged_ahead?,
            None => stage_file(self.engine, self.store, file, copy_at_once(part, file))?,
        };
        let (staged, expected) = match staging {
            StageOutcome::Staged(staged, expected) => (staged, expected),
            StageOutcome::Shareable(id, size) => {
                // Same content already stored (another backend, a private file that did
                // not change, a restored file, or a concurrent checkpoint): pinned here,
                // under the lock, if it is still alive.
                if self.share(&id) {
                    if shared {
                        self.stats.bytes_new_sst += size;
                    }
                    return Ok(part.entry(file, id, size));
                }
                (self.store.stage(&file.path)?, Some((id, size)))
            }
        };
        let (id, size) = (staged.id, staged.size);
        if expected.is_some_and(|e| e != (id, size)) {
            self.store.discard(staged);
            return Err(Error::Corrupt(format!(
                "{} changed while it was being checkpointed",
                file.path.display()
            )));
        }
        if shared {
            self.stats.bytes_new_sst += size;
        }
        let mut st = self.engine.state();
        if self.publish(&mut st, staged, Piece::File)? && file.remote.is_some() {
            self.stats.bytes_copied += size;
        }
        Ok(part.entry(file, id, size))
    }

    /// Store an append-only file as chunks of `chunk_size`: the chunks the store holds
    /// already (all but the last of a file that only grew since the previous checkpoint)
    /// are re-referenced, the others stored. Reads one chunk at a time, and only what
    /// follows `resume` when given, up to the staged size. Returns the entry and where the
    /// next checkpoint may resume.
    fn chunked(
        &mut self,
        part: &PendingBackend,
        file: &StagedFile,
        chunk_size: u32,
        resume: Option<&ChunkedPrefix>,
    ) -> Result<(Arc<FileEntry>, ChunkedPrefix)> {
        use std::io::{Seek, SeekFrom};
        let piece_kind = match wal_number(&file.name) {
            Some(_) => Piece::WalChunk,
            None => Piece::Chunk,
        };
        let mut input = std::fs::File::open(&file.path).ctx("open", &file.path)?;
        let mut piece = vec![0u8; chunk_size as usize];
        let resume = resume.filter(|p| p.chunk_size == chunk_size && p.len <= file.size);
        let (mut whole, mut ids, mut total) = match resume {
            Some(prefix) => {
                for (index, id) in prefix.ids.iter().enumerate() {
                    if self.share(id) {
                        continue;
                    }
                    // No longer stored (its checkpoints are gone): store it from the file.
                    input
                        .seek(SeekFrom::Start(index as u64 * chunk_size as u64))
                        .ctx("seek", &file.path)?;
                    let len = read_full(&mut input, &mut piece, &file.path)?;
                    if ObjectId::from_hash(blake3::hash(&piece[..len])) != *id {
                        return Err(Error::Corrupt(format!(
                            "{} changed where it had only grown",
                            file.path.display()
                        )));
                    }
                    self.pieces(vec![(*id, piece[..len].to_vec())], piece_kind)?;
                }
                input
                    .seek(SeekFrom::Start(prefix.len))
                    .ctx("seek", &file.path)?;
                (prefix.hasher.clone(), prefix.ids.clone(), prefix.len)
            }
            None => (blake3::Hasher::new(), Vec::new(), 0),
        };
        let mut boundary = ChunkedPrefix {
            len: total,
            chunk_size,
            hasher: whole.clone(),
            ids: Vec::new(),
        };
        let mut boundary_chunks = ids.len();
        // New chunks are stored in batches: several uploads at once on object storage.
        let batch_size = match self.store.upload_concurrency() {
            0 | 1 => 1,
            n => 4 * n,
        };
        let mut batch = Vec::with_capacity(batch_size);
        loop {
            // Up to the staged size: a WAL file linked live grows on past it.
            let want = (file.size - total).min(chunk_size as u64) as usize;
            let len = match want {
                0 => 0,
                want => read_full(&mut input, &mut piece[..want], &file.path)?,
            };
            if len == 0 {
                break;
            }
            let piece = &piece[..len];
            total += len as u64;
            whole.update(piece);
            let id = ObjectId::from_hash(blake3::hash(piece));
            ids.push(id);
            if len == chunk_size as usize {
                boundary.len = total;
                boundary.hasher = whole.clone();
                boundary_chunks = ids.len();
            }
            batch.push((id, piece.to_vec()));
            if batch.len() >= batch_size {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(batch_size));
                self.pieces(full, piece_kind)?;
            }
        }
        if !batch.is_empty() {
            self.pieces(batch, piece_kind)?;
        }
        if total != file.size {
            return Err(Error::Corrupt(format!(
                "{} shrank while it was being checkpointed",
                file.path.display()
            )));
        }
        boundary.ids = ids[..boundary_chunks].to_vec();
        let entry = part.entry_stored_as(FileEntry {
            name: file.name.clone(),
            object: ObjectId::from_hash(whole.finalize()),
            size: total,
            chunks: Some(Box::new(Chunks {
                size: chunk_size,
                ids,
            })),
            source: file.source.as_deref().map(Into::into),
            column_family: file.column_family.as_deref().map(Into::into),
        });
        Ok((entry, boundary))
    }

    /// Store a backend's file list (shared with, or a delta on, its base's while the base's
    /// lists are alive; pinned like files); returns the files and the list chain the
    /// manifest will name (the base's own, one allocation, when nothing changed).
    pub(super) fn list(
        &mut self,
        part: &PendingBackend,
        entries: Vec<Arc<FileEntry>>,
    ) -> Result<FileList> {
        let files = lists::sorted(entries, part.base.as_ref().map(|b| &b.list.files));
        let base = match part.base.as_ref().filter(|b| !b.list.chain.is_empty()) {
            Some(base) => {
                let mut st = self.engine.state();
                if base.list.chain.iter().all(|l| st.can_share(&l)) {
                    for l in base.list.chain.iter() {
                        self.share_locked(&mut st, &l);
                    }
                    Some(&base.list)
                } else {
                    None
                }
            }
            None => None,
        };
        let Some(encoded) = lists::encode(&files, base) else {
            return Ok(base.expect("an unchanged list has a base").clone());
        };
        self.pieces(vec![(encoded.id, encoded.bytes)], Piece::List)?;
        Ok(FileList {
            files,
            chain: encoded.chain,
        })
    }
}

/// Stage pieces from memory, several at once where the store gains from it.
fn stage_all(store: &dyn ObjectStore, pieces: &[Vec<u8>]) -> Vec<Result<Staged>> {
    parallel_map(pieces, store.upload_concurrency(), |piece| {
        store.stage_bytes(piece)
    })
}

/// Read up to `buf.len()` bytes at the current position (less only at the end of the file).
fn read_full(input: &mut std::fs::File, buf: &mut [u8], path: &std::path::Path) -> Result<usize> {
    use std::io::Read;
    let mut len = 0;
    while len < buf.len() {
        match input.read(&mut buf[len..]).ctx("read", path)? {
            0 => break,
            n => len += n,
        }
    }
    Ok(len)
}

/// A file staged (or found stored already) before its turn.
enum StageOutcome {
    /// Staged; with the id and size it hashed to first, if it was hashed first.
    Staged(Staged, Option<(ObjectId, u64)>),
    /// Hashed first, and stored already when looked up (to be pinned in its turn).
    Shareable(ObjectId, u64),
}

/// A new SST of an established lineage is almost never stored yet: copy it in one pass.
/// Anything else (private files, the first checkpoint of a lineage, e.g. after a restore)
/// is hashed first, because its content is often stored already and the copy can be
/// skipped.
fn copy_at_once(part: &PendingBackend, file: &StagedFile) -> bool {
    is_shared_file(&file.name) && part.base.is_some()
}

fn stage_file(
    engine: &Engine,
    store: &dyn ObjectStore,
    file: &StagedFile,
    copy_at_once: bool,
) -> Result<StageOutcome> {
    // On object storage the store can copy from: copied there, never read here.
    if let Some(remote) = &file.remote {
        return Ok(StageOutcome::Staged(store.stage_copy(remote)?, None));
    }
    // With nothing alive in the store (the first checkpoint of a new store, a first
    // import), no content can be shared: copy while hashing, reading the file once.
    if copy_at_once || engine.state().held.registry.is_empty() {
        return Ok(StageOutcome::Staged(store.stage(&file.path)?, None));
    }
    let (id, size) = hash_file(&file.path)?;
    if engine.state().can_share(&id) {
        return Ok(StageOutcome::Shareable(id, size));
    }
    Ok(StageOutcome::Staged(
        store.stage(&file.path)?,
        Some((id, size)),
    ))
}

/// Files of one backend staged several at once ahead of the sequential walk that pins
/// and publishes them, where the store gains from parallel transfers (object storage).
/// What the walk does not take (it stopped at an error) is discarded.
struct AheadSet<'a> {
    store: &'a dyn ObjectStore,
    staged: HashMap<String, Result<StageOutcome>>,
}

impl<'a> AheadSet<'a> {
    fn start(
        engine: &Engine,
        store: &'a dyn ObjectStore,
        part: &PendingBackend,
        done: &HashMap<std::path::PathBuf, (ObjectId, u64)>,
    ) -> Self {
        let mut set = AheadSet {
            store,
            staged: HashMap::new(),
        };
        let workers = store.upload_concurrency();
        if workers <= 1 {
            return set;
        }
        // Whole files not re-referenced by name: those the walk would stage one by one,
        // each path once (the walk re-references the others by path).
        let mut paths = std::collections::HashSet::new();
        let todo: Vec<&StagedFile> = part
            .files
            .iter()
            .filter(|f| chunk_size_for(&f.name, f.size).is_none() && part.known(f).is_none())
            .filter(|f| !done.contains_key(&f.path) && paths.insert(&f.path))
            .collect();
        if todo.len() < 2 {
            return set;
        }
        let staged = parallel_map(&todo, workers, |file| {
            stage_file(engine, store, file, copy_at_once(part, file))
        });
        set.staged = todo
            .iter()
            .map(|file| file.name.clone())
            .zip(staged)
            .collect();
        set
    }

    fn take(&mut self, name: &str) -> Option<Result<StageOutcome>> {
        self.staged.remove(name)
    }
}

impl Drop for AheadSet<'_> {
    fn drop(&mut self) {
        for (_, ahead) in self.staged.drain() {
            if let Ok(StageOutcome::Staged(staged, _)) = ahead {
                self.store.discard(staged);
            }
        }
    }
}
