//! Taking a checkpoint: the synchronous phase (flush, hard links into staging), the
//! asynchronous upload of what the store does not hold yet, the commit of the manifest,
//! registration and retention.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::catalog::{lists, FileList};
use std::time::Instant;

use super::materialize::StagedBackend;
use super::{base_of, Base, Engine};
use crate::backend::{chunk_size_for, is_shared_file, wal_number, StagedFile};
use crate::catalog::{BackendSnapshot, CheckpointStats, FileEntry, Manifest, FORMAT};
use crate::error::IoContext;
use crate::error::{Error, Result};
use crate::fsutil::{create_private_dir_all, now_unix_ms, remove_tree};
use crate::names::BackendName;
use crate::store::chunks::Chunks;
use crate::store::{hash_file, ObjectId};

impl Engine {
    /// The synchronous phase: allocate an id, then stage every backend's files (RocksDB's
    /// native checkpoint: hard links, a flush in `flush` mode; see [`super::materialize`]).
    /// Writers may continue as soon as this returns.
    pub fn begin_checkpoint(&self) -> Result<PendingCheckpoint> {
        self.check_writable()?;
        let started_unix_ms = now_unix_ms();
        let (id, bases) = {
            let _writes = self.catalog_writes();
            let (id, meta) = {
                let mut st = self.state();
                if st.restoring {
                    return Err(Error::Busy("a restore is in progress".into()));
                }
                if st.in_flight.len() >= self.inner.max_concurrent {
                    return Err(Error::Busy(format!(
                        "{} checkpoint(s) already in flight (max_concurrent = {}); try \
                         again when it completes",
                        st.in_flight.len(),
                        self.inner.max_concurrent
                    )));
                }
                let id = st.meta.next_checkpoint;
                let mut meta = st.meta.clone();
                meta.next_checkpoint += 1;
                if self.inner.catalog.commits_in_meta() {
                    // Reserved, not committed: a manifest of this id counts only once a
                    // later write of the metadata confirms it.
                    meta.pending.push(id);
                }
                st.in_flight.insert(id);
                (id, meta)
            };
            // The id is reserved durably before anything of the checkpoint is stored (the
            // state lock is not held meanwhile: the slot is taken already).
            let saved = self.inner.catalog.save_meta(&meta);
            let mut st = self.state();
            if let Err(e) = saved {
                st.in_flight.remove(&id);
                self.inner.slot_freed.notify_all();
                self.inner.counters.checkpoint_failed();
                return Err(e);
            }
            st.meta = meta;
            (id, st.bases.clone())
        };
        let clock = Instant::now();
        let staging = self.inner.state_dir.join("staging").join(id.to_string());
        let mut parts = Vec::new();
        let mut pins = Vec::new();
        let mut stats = CheckpointStats::default();
        // Every backend at once: a backend's native checkpoint waits on its own flush (flush
        // mode) or WAL copy (wal mode), not on the others'.
        let stage = |name: &BackendName| {
            let mut pins = Vec::new();
            let dir = staging.join(name.rel_path());
            let parent = dir.parent().expect("backend paths have a parent");
            let staged = create_private_dir_all(parent)
                .and_then(|()| self.stage_backend(name, &dir, clock, &mut pins));
            (staged, pins)
        };
        let names: Vec<&BackendName> = self.inner.backends.keys().collect();
        let staged: Vec<(Result<StagedBackend>, Vec<ObjectId>)> = if names.len() == 1 {
            vec![stage(names[0])]
        } else {
            std::thread::scope(|scope| {
                let threads: Vec<_> = names
                    .iter()
                    .map(|name| scope.spawn(|| stage(name)))
                    .collect();
                threads
                    .into_iter()
                    .map(|t| t.join().expect("a sync phase thread panicked"))
                    .collect()
            })
        };
        let mut sync = Ok(());
        for (name, (result, backend_pins)) in names.into_iter().zip(staged) {
            pins.extend(backend_pins);
            match result {
                Ok(staged) => {
                    stats.bytes_uploaded_materialization += staged.uploaded_before;
                    parts.push(PendingBackend {
                        name: name.clone(),
                        lineage: staged.lineage,
                        files: staged.files,
                        kept: staged.kept,
                        materializes: staged.materializes,
                        base: bases.get(name).cloned(),
                    });
                }
                Err(e) if sync.is_ok() => sync = Err(e),
                Err(_) => {}
            }
        }
        let pending = PendingCheckpoint {
            engine: self.clone(),
            id,
            parts,
            staging,
            started: clock,
            started_unix_ms,
            sync_micros: clock.elapsed().as_micros() as u64,
            pins,
            stats,
            list_bytes: 0,
            finished: false,
            keep_objects: false,
        };
        match sync {
            Ok(()) => Ok(pending),
            Err(e) => {
                pending.fail(&e);
                Err(e)
            }
        }
    }
}

pub(super) struct PendingBackend {
    pub name: BackendName,
    pub lineage: String,
    pub files: Vec<StagedFile>,
    /// Named as they are from the materialization this checkpoint builds on (pinned).
    pub kept: Vec<Arc<FileEntry>>,
    pub materializes: Option<u64>,
    base: Option<Base>,
}

impl PendingBackend {
    /// Staged files to store on top of `base` (the backend's newest confirmed checkpoint).
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
        }
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

/// Store one chunk unless the store holds it already (checked and pinned under one lock).
fn store_chunk(
    engine: &Engine,
    pins: &mut Vec<ObjectId>,
    id: ObjectId,
    piece: &[u8],
    stats: &mut CheckpointStats,
    wal: bool,
    upload_budget: &mut usize,
) -> Result<()> {
    let batch = vec![(id, piece.to_vec())];
    store_chunks(engine, pins, batch, stats, wal, upload_budget)
}

/// Store chunks unless the store holds them already: those it holds are pinned at once,
/// the others staged (several at once where the store gains from it), then published or
/// found stored meanwhile and pinned, under one lock.
fn store_chunks(
    engine: &Engine,
    pins: &mut Vec<ObjectId>,
    pieces: Vec<(ObjectId, Vec<u8>)>,
    stats: &mut CheckpointStats,
    wal: bool,
    upload_budget: &mut usize,
) -> Result<()> {
    let store = engine.inner.store.as_ref();
    let mut todo = Vec::with_capacity(pieces.len());
    {
        let mut st = engine.state();
        for (id, piece) in pieces {
            if st.can_share(&id) {
                st.registry.pin(id);
                pins.push(id);
            } else {
                todo.push((id, piece));
            }
        }
    }
    let allowed = todo.len().min(*upload_budget);
    *upload_budget -= allowed;
    let over_budget = todo.len() > allowed;
    todo.truncate(allowed);
    let staged = stage_all(store, &todo);
    let mut st = engine.state();
    let mut failed = None;
    for ((id, piece), staged) in todo.iter().zip(staged) {
        let staged = match staged {
            Ok(staged) if failed.is_none() => staged,
            Ok(staged) => {
                store.discard(staged);
                continue;
            }
            Err(e) => {
                failed.get_or_insert(e);
                continue;
            }
        };
        if st.can_share(id) {
            store.discard(staged);
        } else {
            if let Err(e) = store.publish(staged) {
                failed.get_or_insert(e);
                continue;
            }
            stats.bytes_uploaded += piece.len() as u64;
            if wal {
                stats.bytes_uploaded_wal += piece.len() as u64;
            } else {
                stats.bytes_uploaded_append_only += piece.len() as u64;
            }
            st.missing.remove(id);
        }
        st.registry.pin(*id);
        pins.push(*id);
    }
    match failed {
        Some(e) => Err(e),
        None if over_budget => Err(Error::Busy("simulated crash".into())),
        None => Ok(()),
    }
}

/// Stage pieces from memory, several at once where the store gains from it.
fn stage_all(
    store: &dyn crate::store::ObjectStore,
    pieces: &[(ObjectId, Vec<u8>)],
) -> Vec<Result<crate::store::Staged>> {
    let workers = store.upload_concurrency().min(pieces.len());
    if workers <= 1 {
        return pieces.iter().map(|(_, p)| store.stage_bytes(p)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::with_capacity(pieces.len()));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some((_, piece)) = pieces.get(i) else {
                    break;
                };
                let staged = store.stage_bytes(piece);
                done.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((i, staged));
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, staged)| staged).collect()
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

/// Store an append-only file as chunks of `chunk_size`: the chunks the store holds already
/// (all but the last of a file that only grew since the previous checkpoint) are
/// re-referenced, the others stored. Pinned like files. Reads one chunk at a time, and only
/// what follows `resume` when given. Returns the entry and where the next checkpoint may
/// resume.
#[allow(clippy::too_many_arguments)]
fn store_chunked(
    engine: &Engine,
    pins: &mut Vec<ObjectId>,
    part: &PendingBackend,
    file: &StagedFile,
    chunk_size: u32,
    resume: Option<&ChunkedPrefix>,
    stats: &mut CheckpointStats,
    upload_budget: &mut usize,
) -> Result<(Arc<FileEntry>, ChunkedPrefix)> {
    use std::io::{Seek, SeekFrom};
    let wal = wal_number(&file.name).is_some();
    let mut input = std::fs::File::open(&file.path).ctx("open", &file.path)?;
    let mut piece = vec![0u8; chunk_size as usize];
    let resume = resume.filter(|p| p.chunk_size == chunk_size && p.len <= file.size);
    let (mut whole, mut ids, mut total) = match resume {
        Some(prefix) => {
            for (index, id) in prefix.ids.iter().enumerate() {
                let shared = {
                    let mut st = engine.state();
                    let shared = st.can_share(id);
                    if shared {
                        st.registry.pin(*id);
                        pins.push(*id);
                    }
                    shared
                };
                if !shared {
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
                    store_chunk(engine, pins, *id, &piece[..len], stats, wal, upload_budget)?;
                }
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
    let batch_size = match engine.inner.store.upload_concurrency() {
        0 | 1 => 1,
        n => 4 * n,
    };
    let mut batch = Vec::with_capacity(batch_size);
    loop {
        let len = read_full(&mut input, &mut piece, &file.path)?;
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
            store_chunks(engine, pins, full, stats, wal, upload_budget)?;
        }
    }
    if !batch.is_empty() {
        store_chunks(engine, pins, batch, stats, wal, upload_budget)?;
    }
    if total != file.size {
        return Err(Error::Corrupt(format!(
            "{} changed while it was being checkpointed",
            file.path.display()
        )));
    }
    boundary.ids = ids[..boundary_chunks].to_vec();
    let entry = part.entry_stored_as(FileEntry {
        name: file.name.clone(),
        object: ObjectId::from_hash(whole.finalize()),
        size: total,
        chunks: Some(Chunks {
            size: chunk_size,
            ids,
        }),
    });
    Ok((entry, boundary))
}

/// Store a backend's file list (shared with, or a delta on, its base's while the base's
/// lists are alive; pinned like files); returns the files and the list chain the manifest
/// will name (the base's own, one allocation, when nothing changed).
fn store_list(
    engine: &Engine,
    pins: &mut Vec<ObjectId>,
    part: &PendingBackend,
    entries: Vec<Arc<FileEntry>>,
    stats: &mut CheckpointStats,
) -> Result<FileList> {
    let files = lists::sorted(entries, part.base.as_ref().map(|b| &b.list.files));
    let store = &engine.inner.store;
    let base = match part.base.as_ref().filter(|b| !b.list.chain.is_empty()) {
        Some(base) => {
            let mut st = engine.state();
            if base.list.chain.iter().all(|l| st.can_share(&l)) {
                for l in base.list.chain.iter() {
                    st.registry.pin(l);
                    pins.push(l);
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
    let chain = encoded.chain;
    {
        // Checked and pinned under one lock: a live object cannot be deleted in between.
        let mut st = engine.state();
        if st.can_share(&encoded.id) {
            st.registry.pin(encoded.id);
            pins.push(encoded.id);
            return Ok(FileList { files, chain });
        }
    }
    let staged = store.stage_bytes(&encoded.bytes)?;
    let mut st = engine.state();
    if st.can_share(&encoded.id) {
        store.discard(staged);
    } else {
        store.publish(staged)?;
        stats.bytes_uploaded += encoded.bytes.len() as u64;
        st.missing.remove(&encoded.id);
    }
    st.registry.pin(encoded.id);
    pins.push(encoded.id);
    Ok(FileList { files, chain })
}

/// Store the staged files of one backend (the asynchronous phase's work): re-reference
/// what the base holds under the same name, store what is new (append-only files as
/// chunks), pin everything into `pins`. Returns the entries, `kept` ones first.
pub(super) fn store_files(
    engine: &Engine,
    part: &PendingBackend,
    pins: &mut Vec<ObjectId>,
    stats: &mut CheckpointStats,
    upload_budget: &mut usize,
) -> Result<Vec<Arc<FileEntry>>> {
    let inner = &engine.inner;
    let mut entries = Vec::with_capacity(part.files.len() + part.kept.len());
    for kept in &part.kept {
        stats.files_total += 1;
        stats.files_reused += 1;
        stats.bytes_total += kept.size;
        entries.push(kept.clone());
    }
    let mut prefixes = HashMap::new();
    let mut ahead = AheadSet::start(engine, part);
    for file in part.files.iter() {
        stats.files_total += 1;
        stats.bytes_total += file.size;
        if wal_number(&file.name).is_some() {
            stats.bytes_wal += file.size;
        }
        let shared = is_shared_file(&file.name);
        // Re-reference by name only within the lineage of a confirmed checkpoint,
        // and only while the object is still alive.
        if let Some(known) = part
            .base
            .as_ref()
            .filter(|_| shared)
            .and_then(|b| b.by_name.get(&file.name))
            .filter(|known| known.size == file.size && known.chunks.is_none())
        {
            let mut st = engine.state();
            if st.can_share(&known.object) {
                st.registry.pin(known.object);
                pins.push(known.object);
                stats.files_reused += 1;
                entries.push(known.clone());
                continue;
            }
        }
        stats.files_new += 1;
        if let Some(chunk_size) = chunk_size_for(&file.name, file.size) {
            // A WAL file that only grew since the previous checkpoint of this
            // lineage: resume where that one stopped cutting it.
            let resume = wal_number(&file.name).and_then(|_| {
                let st = engine.state();
                st.wal_prefixes
                    .get(&part.name)
                    .filter(|(lineage, _)| *lineage == part.lineage)
                    .and_then(|(_, files)| files.get(&file.name).cloned())
            });
            let (entry, prefix) = store_chunked(
                engine,
                pins,
                part,
                file,
                chunk_size,
                resume.as_deref(),
                stats,
                upload_budget,
            )?;
            if wal_number(&file.name).is_some() {
                prefixes.insert(file.name.clone(), Arc::new(prefix));
            }
            entries.push(entry);
            continue;
        }
        let staging = match ahead.take(&file.name) {
            Some(staged_ahead) => staged_ahead?,
            None => stage_file(engine, file, shared && part.base.is_some())?,
        };
        let (staged, expected) = match staging {
            Staging::Staged(staged, expected) => (staged, expected),
            Staging::Shareable(id, size) => {
                // Same content already stored (another backend, a private file that did
                // not change, a restored file, or a concurrent checkpoint): pinned here,
                // under the lock, if it is still alive.
                let mut st = engine.state();
                if st.can_share(&id) {
                    st.registry.pin(id);
                    pins.push(id);
                    if shared {
                        stats.bytes_new_sst += size;
                    }
                    entries.push(part.entry(&file.name, id, size));
                    continue;
                }
                drop(st);
                (inner.store.stage(&file.path)?, Some((id, size)))
            }
        };
        if *upload_budget == 0 {
            inner.store.discard(staged);
            return Err(Error::Busy("simulated crash".into()));
        }
        *upload_budget -= 1;
        let (id, size) = (staged.id, staged.size);
        if expected.is_some_and(|e| e != (id, size)) {
            inner.store.discard(staged);
            return Err(Error::Corrupt(format!(
                "{} changed while it was being checkpointed",
                file.path.display()
            )));
        }
        if shared {
            stats.bytes_new_sst += size;
        }
        let mut st = engine.state();
        if st.can_share(&id) {
            // Stored already (by a concurrent checkpoint, or elsewhere): that copy
            // survives, ours is the duplicate.
            inner.store.discard(staged);
        } else {
            inner.store.publish(staged)?;
            stats.bytes_uploaded += size;
            if st.missing.remove(&id) {
                log::info!("object {id} was missing and is stored again");
            }
        }
        st.registry.pin(id);
        pins.push(id);
        entries.push(part.entry(&file.name, id, size));
    }
    // Only the WAL files of this checkpoint can grow further.
    engine
        .state()
        .wal_prefixes
        .insert(part.name.clone(), (part.lineage.clone(), prefixes));
    Ok(entries)
}

/// A file staged (or found stored already) before its turn.
enum Staging {
    /// Staged; with the id and size it hashed to first, if it was hashed first.
    Staged(crate::store::Staged, Option<(ObjectId, u64)>),
    /// Hashed first, and stored already when looked up (to be pinned in its turn).
    Shareable(ObjectId, u64),
}

/// A new SST of an established lineage is almost never stored yet: copy it in one pass
/// (`copy_at_once`). Anything else (private files, the first checkpoint of a lineage, e.g.
/// after a restore) is hashed first, because its content is often stored already and the
/// copy can be skipped.
fn stage_file(engine: &Engine, file: &StagedFile, copy_at_once: bool) -> Result<Staging> {
    let store = &engine.inner.store;
    if copy_at_once {
        return Ok(Staging::Staged(store.stage(&file.path)?, None));
    }
    let (id, size) = hash_file(&file.path)?;
    if engine.state().can_share(&id) {
        return Ok(Staging::Shareable(id, size));
    }
    Ok(Staging::Staged(store.stage(&file.path)?, Some((id, size))))
}

/// Files of one backend staged several at once ahead of the sequential walk that pins
/// and publishes them, where the store gains from parallel transfers (object storage).
/// What the walk does not take (it stopped at an error) is discarded.
struct AheadSet<'a> {
    store: &'a dyn crate::store::ObjectStore,
    staged: HashMap<String, Result<Staging>>,
}

impl<'a> AheadSet<'a> {
    fn start(engine: &'a Engine, part: &PendingBackend) -> AheadSet<'a> {
        let store = engine.inner.store.as_ref();
        let mut set = AheadSet {
            store,
            staged: HashMap::new(),
        };
        let workers = store.upload_concurrency();
        if workers <= 1 {
            return set;
        }
        // Whole files not re-referenced by name: those the walk would stage one by one.
        let todo: Vec<&StagedFile> = part
            .files
            .iter()
            .filter(|f| chunk_size_for(&f.name, f.size).is_none())
            .filter(|f| {
                let by_name = part
                    .base
                    .as_ref()
                    .filter(|_| is_shared_file(&f.name))
                    .and_then(|b| b.by_name.get(&f.name))
                    .is_some_and(|k| k.size == f.size && k.chunks.is_none());
                !by_name
            })
            .collect();
        if todo.len() < 2 {
            return set;
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..workers.min(todo.len()) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(file) = todo.get(i) else { break };
                    let copy_at_once = is_shared_file(&file.name) && part.base.is_some();
                    let result = stage_file(engine, file, copy_at_once);
                    done.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((file.name.clone(), result));
                });
            }
        });
        set.staged = done
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .collect();
        set
    }

    fn take(&mut self, name: &str) -> Option<Result<Staging>> {
        self.staged.remove(name)
    }
}

impl Drop for AheadSet<'_> {
    fn drop(&mut self) {
        for (_, ahead) in self.staged.drain() {
            if let Ok(Staging::Staged(staged, _)) = ahead {
                self.store.discard(staged);
            }
        }
    }
}

impl PendingBackend {
    /// The entry for a file, shared with the base's when it is the same (memory follows
    /// what changed, not the number of checkpoints).
    fn entry(&self, name: &str, object: ObjectId, size: u64) -> Arc<FileEntry> {
        self.entry_stored_as(FileEntry::whole(name, object, size))
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
}

/// A checkpoint between its synchronous phase and its completion. Completing it runs the
/// asynchronous phase; dropping it without completing aborts it and leaves nothing behind.
pub struct PendingCheckpoint {
    engine: Engine,
    id: u64,
    parts: Vec<PendingBackend>,
    staging: PathBuf,
    started: Instant,
    started_unix_ms: u64,
    sync_micros: u64,
    pins: Vec<ObjectId>,
    /// Figures gathered in the synchronous phase (a background materialization adopted).
    stats: CheckpointStats,
    /// Bytes of file lists stored (in `bytes_uploaded`, not in `bytes_total`): the
    /// engine's counters tell file bytes uploaded from reused ones with it.
    list_bytes: u64,
    finished: bool,
    /// The manifest may exist on disk after a failed commit: delete nothing, let the next
    /// start decide from what is durable.
    keep_objects: bool,
}

impl PendingCheckpoint {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn sync_micros(&self) -> u64 {
        self.sync_micros
    }

    /// The asynchronous phase: store what is new, re-reference the rest, commit, register,
    /// apply retention.
    pub fn complete(mut self) -> Result<Arc<Manifest>> {
        crate::failpoint!("checkpoint::after-sync");
        let clock = Instant::now();
        match self.upload(usize::MAX) {
            Ok((backends, mut stats)) => {
                stats.sync_micros = self.sync_micros;
                stats.async_micros = clock.elapsed().as_micros() as u64;
                let manifest = Manifest {
                    format: FORMAT,
                    id: self.id,
                    started_unix_ms: self.started_unix_ms,
                    completed_unix_ms: now_unix_ms(),
                    backends,
                    stats,
                };
                match self.commit(manifest) {
                    Ok(m) => {
                        self.engine.trim_memory();
                        Ok(m)
                    }
                    Err(e) => {
                        self.fail(&e);
                        Err(e)
                    }
                }
            }
            Err(e) => {
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Abort: release everything this checkpoint stored or matched.
    pub fn abort(self) {
        let e = Error::Busy(format!("checkpoint {} aborted", self.id));
        self.fail(&e);
    }

    /// Test hook: store at most `uploads` new objects, then stop as if the process had been
    /// killed there: no cleanup, no manifest. Recovery at the next start must sweep it.
    #[doc(hidden)]
    pub fn simulate_crash(mut self, uploads: usize) {
        let _ = self.upload(uploads);
        self.finished = true;
    }

    fn upload(
        &mut self,
        mut upload_budget: usize,
    ) -> Result<(Vec<BackendSnapshot>, CheckpointStats)> {
        let mut stats = self.stats.clone();
        let mut snapshots = Vec::new();
        for part in &self.parts {
            if part.materializes.is_some() {
                stats.backends_materialized += 1;
            }
            let entries = store_files(
                &self.engine,
                part,
                &mut self.pins,
                &mut stats,
                &mut upload_budget,
            )?;
            let before = stats.bytes_uploaded;
            let list = store_list(&self.engine, &mut self.pins, part, entries, &mut stats)?;
            self.list_bytes += stats.bytes_uploaded - before;
            snapshots.push(BackendSnapshot {
                name: part.name.clone(),
                lineage: part.lineage.clone(),
                files: list.files,
                lists: list.chain,
            });
        }
        Ok((snapshots, stats))
    }

    fn commit(&mut self, manifest: Manifest) -> Result<Arc<Manifest>> {
        let engine = self.engine.clone();
        let inner = &engine.inner;
        // The catalog's requests run without the state lock (see Inner::catalog_writes).
        let writes = engine.catalog_writes();
        crate::failpoint!("checkpoint::before-commit");
        if inner.catalog.commits_in_meta() {
            // Object storage: the manifest, then the metadata that confirms it (the commit
            // point, conditional: it fails if another writer took the store meanwhile).
            let confirmed = inner.catalog.commit(&manifest).and_then(|()| {
                crate::failpoint!("checkpoint::before-confirm");
                let mut meta = engine.state().meta.clone();
                meta.pending.retain(|p| *p != manifest.id);
                inner.catalog.save_meta(&meta)?;
                engine.state().meta = meta;
                Ok(())
            });
            if let Err(e) = confirmed {
                // Not committed: the id stays pending (void from the next write on, see
                // `release`), but its manifest may exist: the objects are left to the
                // orphan sweep.
                self.keep_objects = true;
                return Err(e);
            }
        } else if let Err(e) = inner.catalog.commit(&manifest) {
            if let Error::Exists(_) = e {
                // Another writer's manifest of that id (a daemon that took the lease over):
                // never ours to remove, and our objects are left to the orphan sweep.
                self.keep_objects = true;
                return Err(e);
            }
            // The rename may have happened even if a later fsync failed. If the manifest
            // cannot be removed (durably), it may still name our objects: leave them to the
            // sweep at the next start instead of deleting them.
            if let Err(remove) = inner.catalog.remove(manifest.id) {
                log::warn!("checkpoint {}: manifest may remain: {remove}", manifest.id);
                self.keep_objects = true;
            }
            return Err(e);
        }
        let id = manifest.id;
        crate::failpoint!("checkpoint::after-commit");
        let mut st = engine.state();
        st.registry.register_checkpoint(id, manifest.object_refs());
        st.registry.set_sizes(manifest.stored_sizes());
        crate::failpoint!("checkpoint::after-register");
        engine.release_pins(&mut st, self.pins.drain(..));
        st.in_flight.remove(&id);
        inner.slot_freed.notify_all();
        let mut prune = Vec::new();
        for (part, snapshot) in self.parts.iter().zip(&manifest.backends) {
            if let Some(below) =
                Engine::note_materialization(&mut st, id, self.started, part, snapshot)
            {
                prune.push((part.name.clone(), below));
            }
        }
        for snapshot in &manifest.backends {
            let current = st.lineages.get(&snapshot.name) == Some(&snapshot.lineage);
            let newer = st
                .bases
                .get(&snapshot.name)
                .is_none_or(|b| b.checkpoint < id);
            if current && newer {
                st.bases
                    .insert(snapshot.name.clone(), base_of(id, snapshot));
            }
        }
        let manifest = Arc::new(manifest);
        st.manifests.insert(id, manifest.clone());
        inner
            .counters
            .checkpoint_completed(&manifest.stats, self.list_bytes);
        log::info!(
            "checkpoint {id} complete: {} files ({} reused), {} bytes uploaded",
            manifest.stats.files_total,
            manifest.stats.files_reused,
            manifest.stats.bytes_uploaded
        );
        drop(st);
        let retention = engine.apply_retention(&writes);
        drop(writes);
        engine.prune_wal_archives(&prune);
        self.finished = true;
        if let Err(e) = remove_tree(&self.staging) {
            log::warn!("could not remove staging of checkpoint {id}: {e}");
        }
        // The checkpoint itself is durable; a retention failure is reported separately.
        if let Err(e) = retention {
            log::warn!("retention after checkpoint {id} failed: {e}");
            engine.record_error(format!("retention after checkpoint {id} failed: {e}"));
        }
        Ok(manifest)
    }

    fn fail(mut self, error: &Error) {
        self.release(Some(error));
    }

    fn release(&mut self, error: Option<&Error>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let engine = self.engine.clone();
        // The metadata may change below (never held here by this thread: see `commit`).
        let _writes = engine.catalog_writes();
        let mut st = engine.state();
        if self.keep_objects {
            // Not only now: no later drop may delete them either.
            log::warn!(
                "checkpoint {}: keeping its {} objects for recovery to judge",
                self.id,
                self.pins.len()
            );
            st.kept.extend(self.pins.iter().copied());
        }
        engine.release_pins(&mut st, self.pins.drain(..));
        st.in_flight.remove(&self.id);
        if engine.inner.catalog.commits_in_meta() {
            // Its reservation ends: void from the next write of the metadata on.
            st.meta.make_void(self.id);
        }
        engine.inner.slot_freed.notify_all();
        // Not committed, whatever the reason (an error, an abort, a drop).
        engine.inner.counters.checkpoint_failed();
        if let Some(e) = error {
            log::warn!("checkpoint {} failed: {e}", self.id);
            engine.note_error(&mut st, format!("checkpoint {} failed: {e}", self.id));
        }
        drop(st);
        let _ = remove_tree(&self.staging);
    }
}

impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        self.release(None);
    }
}
