//! Flink's completed checkpoints as imports: every subtask with RocksDB incremental state
//! becomes one backend, `<operator>/<subtask>`, holding that subtask's RocksDB files under
//! their original names, plus Flink's own meta data of the backend ([`FLINK_META`]).
//!
//! - `<operator>` is the operator's uid when the job set one, written with
//!   [`operator_dir_name`] (collision-free), else its 32-hex operator id.
//! - `<subtask>` is the position of the subtask's key-group range among the operator's.
//!
//! Files Flink uploaded (`shared/<uuid>`) are read where they are; a file whose path the
//! job directory no longer has (it was moved) is looked for under the `shared/` of the
//! directory given. Files Flink inlined into `_metadata` are written out to a staging
//! directory first. Each file's source is recorded: an uploaded file's device, inode, size
//! and mtime (as for `ckptfs import`), an inlined one's content hash; the next checkpoint
//! re-references an SST whose source it recorded without reading it again.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use super::listing::chk_number;
use super::listing::Listing;
use super::metadata::{self, KeyedHandle, OperatorState, StreamHandle};
use crate::error::{Error, IoContext, Result};
use crate::import::{Scanned, ScannedFile};
use crate::names::BackendName;
use crate::source::{
    join, EntryKind, Fetched, FileStamp, LocalTree, S3Tree, Tree, MAX_METADATA_BYTES,
};
use crate::store::s3::MAX_COPY;
use crate::store::ObjectStore;

/// The name under which a subtask's Flink meta data (`KeyedBackendSerializationProxy`) is
/// kept beside its RocksDB files: RocksDB ignores files it does not name itself.
pub const FLINK_META: &str = "FLINK-KEYED-META";

/// Where a Flink job's checkpoints are: a directory, or a prefix of an S3 bucket
/// (`s3://BUCKET/PREFIX`, configured from the standard AWS environment like a store). Every
/// file is read through its [`Tree`], confined to it (and to the more roots the user named,
/// [`FlinkSource::open`]): a `_metadata` naming a file outside is refused.
#[derive(Clone)]
pub struct FlinkSource {
    tree: Arc<dyn Tree>,
    /// More roots the user named: the directories of the jobs a job was restored from in
    /// CLAIM mode, whose files its checkpoints go on naming.
    also: Vec<Arc<dyn Tree>>,
}

impl std::fmt::Debug for FlinkSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl FlinkSource {
    /// `SRC` of `import-flink` and `mount --flink`: `s3://BUCKET[/PREFIX]`, a `file://`
    /// URL or a directory (which is opened: it must exist).
    pub fn parse(arg: &Path) -> Result<FlinkSource> {
        Ok(FlinkSource {
            tree: Self::open_tree(arg)?,
            also: Vec::new(),
        })
    }

    fn open_tree(arg: &Path) -> Result<Arc<dyn Tree>> {
        let text = arg.to_string_lossy();
        if text.starts_with("s3://") {
            let crate::store::Location::S3 { bucket, prefix } =
                crate::store::Location::parse(&text)?
            else {
                unreachable!("an s3:// URL parses as S3")
            };
            let remote = crate::store::s3::Remote::connect(&bucket, "")?;
            return Ok(Arc::new(S3Tree::new(remote, &prefix)));
        }
        let dir = match text
            .strip_prefix("file://")
            .or_else(|| text.strip_prefix("file:"))
        {
            Some(path) if path.starts_with('/') => PathBuf::from(path),
            Some(_) => {
                return Err(Error::Invalid(format!(
                    "{text}: a file: URL names an absolute path (file:///data/checkpoints)"
                )))
            }
            None => arg.to_path_buf(),
        };
        let tree = LocalTree::open(&dir).map_err(|e| match e {
            Error::Io { source, .. } => Error::io(
                format!("read Flink checkpoints in {}", dir.display()),
                source,
            ),
            other => other,
        })?;
        Ok(Arc::new(tree))
    }

    /// [`FlinkSource::parse`] of `src`, also reading the files below each of `roots` that its
    /// checkpoints name (a job restored in CLAIM mode names the files of the job it was
    /// restored from: `--source-root`).
    pub fn open(src: &Path, roots: &[PathBuf]) -> Result<FlinkSource> {
        let mut source = Self::parse(src)?;
        for root in roots {
            source.also.push(Self::open_tree(root)?);
        }
        Ok(source)
    }

    /// `arg` as another process (a daemon, in another directory) reads it: a URL as it is
    /// (an `s3://` one checked), a path made absolute. Connects to nothing.
    pub fn absolute(arg: &Path) -> Result<PathBuf> {
        let text = arg.to_string_lossy();
        if text.starts_with("s3://") {
            crate::store::Location::parse(&text)?;
            return Ok(arg.to_path_buf());
        }
        if text.starts_with("file:") {
            return Ok(arg.to_path_buf());
        }
        std::path::absolute(arg).ctx("resolve", arg)
    }

    /// The source's root as the user named it (`/data/flink`, `s3://bucket/prefix`).
    pub fn describe(&self) -> String {
        self.tree.describe()
    }

    /// The tree of the source's root.
    pub(crate) fn tree(&self) -> &Arc<dyn Tree> {
        &self.tree
    }

    /// The trees of the more roots the user named.
    pub(crate) fn also_trees(&self) -> &[Arc<dyn Tree>] {
        &self.also
    }

    /// A source of `tree` alone (tests read through trees that count).
    #[cfg(test)]
    pub(crate) fn of_tree(tree: Arc<dyn Tree>) -> FlinkSource {
        FlinkSource {
            tree,
            also: Vec::new(),
        }
    }

    /// The roots read, for messages.
    fn roots(&self) -> String {
        std::iter::once(&self.tree)
            .chain(&self.also)
            .map(|t| t.describe())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A completed checkpoint of a Flink job (its `_metadata` exists).
#[derive(Debug, Clone)]
pub struct Completed {
    /// The name of the job's directory: the job id (32 hex), or another name for a copy
    /// of one (whose metadata still names the id in its paths).
    pub job: String,
    /// The Flink checkpoint's id (its `chk-<id>` directory).
    pub checkpoint: u64,
    /// The job's directory (`chk-N/`, `shared/`, `taskowned/`) below the source's root
    /// ("": the root itself).
    pub job_dir: String,
    /// The source it was found in, through which its files are read.
    pub source: FlinkSource,
    /// Its `_metadata` as the listing saw it (size, modification time); `None` where it is
    /// refused (a link, not a regular file). A follower tells by it whether Flink wrote the
    /// file again.
    pub seen: Option<FileStamp>,
}

impl Completed {
    /// Where its `_metadata` is below the source's root.
    pub fn metadata_path(&self) -> String {
        join(
            &self.job_dir,
            &format!("chk-{}/{METADATA}", self.checkpoint),
        )
    }

    /// Its `_metadata`, read through the source (no link followed, at most
    /// [`MAX_METADATA_BYTES`]).
    pub fn read_metadata(&self) -> Result<Vec<u8>> {
        self.source
            .tree
            .read(&self.metadata_path(), MAX_METADATA_BYTES)
    }

    /// When its `_metadata` was last written (Flink writes it last, as the checkpoint
    /// completes): the checkpoint's time, as the listing saw it ([`Completed::seen`]: no
    /// request). `None` where the source does not say.
    pub fn metadata_time(&self) -> Option<std::time::SystemTime> {
        self.seen.and_then(|s| s.modified)
    }

    /// Where it is, for messages.
    pub fn location(&self) -> String {
        self.source.tree.show(&self.job_dir)
    }
}

/// A Flink job id: 32 hex digits.
pub fn is_job_id(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The completed checkpoints under `src`: one job's directory (`<dir>/<job-id>/`, or a copy
/// of one under another name) or a checkpoint root (`execution.checkpointing.dir`) holding
/// any number of jobs, such as a job and the ones restored from it, each in a directory of
/// its own. Job by job, in the order the jobs began ([`completed_if_any`]), each job's
/// oldest first (by checkpoint id). A `chk-N` without `_metadata` is skipped (in flight or
/// abandoned).
pub fn completed(src: &FlinkSource) -> Result<Vec<Completed>> {
    if let Some(found) = completed_if_any(src)? {
        return Ok(found);
    }
    let holds_metadata = src.tree.size_of(METADATA).unwrap_or(None).is_some();
    Err(Error::Invalid(if holds_metadata {
        format!(
            "{} is one checkpoint's or savepoint's directory (it holds _metadata): give the \
             job's checkpoint directory, which holds its chk-N/, or the checkpoint root \
             holding the jobs' directories (savepoints are not imported)",
            src.describe()
        )
    } else {
        format!(
            "{} holds no Flink job's checkpoints (no chk-N/ or shared/, nor job directories \
             named by a 32-hex job id)",
            src.describe()
        )
    }))
}

/// [`completed`], or `None` where no job has written yet (a follower started before the
/// job, which makes its directory with its first checkpoint).
///
/// A root's jobs come in the order they began: by the modification time of the
/// `_metadata` of each one's oldest completed checkpoint, then by name (a job whose time
/// the listing does not give comes after those whose time it gives, by name). A job
/// restored from another one's checkpoint begins after it, so its checkpoints are imported
/// after the older job's.
pub fn completed_if_any(src: &FlinkSource) -> Result<Option<Vec<Completed>>> {
    completed_listed(src, &mut Listing::default())
}

/// [`completed_if_any`] for a follower, which keeps `listing` from one look to the next: a
/// look lists each job's directory and looks into few of its `chk-N/` ([`Listing`]).
pub fn completed_listed(
    src: &FlinkSource,
    listing: &mut Listing,
) -> Result<Option<Vec<Completed>>> {
    let tree = src.tree.as_ref();
    let jobs = job_listings(tree)?;
    listing.keep_jobs(&jobs.iter().map(|(dir, _)| dir.clone()).collect::<Vec<_>>());
    if jobs.is_empty() {
        return Ok(None);
    }
    let mut by_job = Vec::new();
    for (job_dir, entries) in jobs {
        // A copied job directory keeps its id in every path of its metadata.
        let name = if job_dir.is_empty() {
            tree.describe()
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or("")
                .to_string()
        } else {
            job_dir.rsplit('/').next().unwrap_or("").to_string()
        };
        let found: Vec<Completed> = listing
            .checkpoints(tree, &job_dir, &entries)?
            .into_iter()
            .map(|(checkpoint, seen)| Completed {
                job: name.clone(),
                checkpoint,
                job_dir: job_dir.clone(),
                source: src.clone(),
                seen,
            })
            .collect();
        let Some(oldest) = found.first() else {
            continue;
        };
        // Only an order: a refused one (a link) has no time.
        let began = oldest.seen.and_then(|s| s.modified);
        by_job.push(((began.is_none(), began, name), found));
    }
    by_job.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Some(
        by_job.into_iter().flat_map(|(_, found)| found).collect(),
    ))
}

/// The job directories below a source's root: itself, or those named by a job id in it.
pub(crate) fn job_dirs(tree: &dyn Tree) -> Result<Vec<String>> {
    Ok(job_listings(tree)?
        .into_iter()
        .map(|(dir, _)| dir)
        .collect())
}

/// [`job_dirs`], each with its entries (names and kinds, [`Tree::list_kinds`]).
#[allow(clippy::type_complexity)]
fn job_listings(tree: &dyn Tree) -> Result<Vec<(String, Vec<(String, EntryKind)>)>> {
    let is_job_dir = |entries: &[(String, EntryKind)]| {
        entries.iter().any(|(name, kind)| {
            *kind == EntryKind::Dir && (name == "shared" || chk_number(name).is_some())
        })
    };
    let top = tree.list_kinds("")?;
    if is_job_dir(&top) {
        return Ok(vec![(String::new(), top)]);
    }
    let mut jobs = Vec::new();
    for (name, kind) in &top {
        if *kind == EntryKind::Dir && is_job_id(name) {
            let entries = tree.list_kinds(name)?;
            if is_job_dir(&entries) {
                jobs.push((name.clone(), entries));
            }
        }
    }
    jobs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(jobs)
}

/// An operator's directory name: its uid, with every byte outside `[A-Za-z0-9.-]` written
/// `_XX` (hex; so `_` itself is `_5f`), a leading `.` too, and a uid of 32 hex digits (which
/// would read as an operator id) with its first byte escaped; without a uid, the 32-hex id.
/// A name longer than [`LONG_NAME`] bytes keeps its first part and ends in `__` and a hash
/// of the whole uid: `__` appears in no escaped name, so the two kinds never collide, and
/// the name stays within a directory name's 255 bytes.
pub fn operator_dir_name(op: &OperatorState) -> String {
    let Some(uid) = &op.uid else {
        return op.id.clone();
    };
    let mut out = String::new();
    let mut cuts = vec![0];
    for (i, b) in uid.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'-' || (b == b'.' && i > 0);
        let looks_like_id = i == 0 && is_job_id(uid);
        if plain && !looks_like_id {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
        cuts.push(out.len());
    }
    if out.len() <= LONG_NAME {
        return out;
    }
    let keep = cuts
        .into_iter()
        .filter(|c| *c <= LONG_NAME - 34)
        .max()
        .unwrap_or(0);
    let hash = blake3::hash(uid.as_bytes()).to_hex();
    format!("{}__{}", &out[..keep], &hash[..32])
}

/// The longest operator directory name written as it is ([`operator_dir_name`]).
pub const LONG_NAME: usize = 200;

/// The backend that keeps what a Flink checkpoint holds besides its subtasks' RocksDB
/// state: its `_metadata` ([`METADATA`]) and every file that names outside the subtasks'
/// incremental keyed state (operator state, coordinator state), under the last part of its
/// path. No operator's directory is named `_flink` ([`operator_dir_name`] writes `_` only
/// before two hex digits).
pub const JOB_OPERATOR: &str = "_flink";
/// The name of a Flink checkpoint's metadata file, in its `chk-N/` directory and in the
/// [`job_backend`].
pub use super::listing::METADATA;

/// The backend that keeps a Flink checkpoint's own files: [`JOB_OPERATOR`], subtask 0.
pub fn job_backend() -> BackendName {
    BackendName::new(JOB_OPERATOR, 0).expect("a valid backend name")
}

/// Where the store keeps each file a checkpoint's metadata names: by subtask, its RocksDB
/// files under their names (and its Flink meta data as [`FLINK_META`]); the job's other
/// files in [`job_backend`]. Inline handles are listed with the subtasks (they are files of
/// a RocksDB directory) but not with the job (the `_metadata` holds them).
pub struct Layout<'a> {
    /// Each subtask with RocksDB incremental state: its backend and its files (name and
    /// handle), sorted by name.
    pub subtasks: Vec<(BackendName, Vec<(String, &'a StreamHandle)>)>,
    /// The job's other files that are not inline: each under the last part of its path,
    /// sorted by name.
    pub job_files: Vec<(String, &'a StreamHandle)>,
    /// The name of each operator with subtasks here, by its directory (the `<operator>` of
    /// their backends), when the metadata gives one (version 5 on).
    pub names: std::collections::BTreeMap<String, String>,
}

/// The [`Layout`] of a parsed checkpoint; what ckptfs does not import is refused with the
/// reason (keyed state as key groups: the heap backend's snapshots, canonical savepoints).
/// With file merging, each file is a segment of a shared physical file: the subtasks'
/// under their RocksDB names as always, the job's under [`job_file_name`].
pub fn layout(metadata: &metadata::Metadata) -> Result<Layout<'_>> {
    layout_of_at_most(metadata, MAX_HANDLES)
}

/// [`layout`], refused if the checkpoint names more than `max_handles` files.
fn layout_of_at_most(metadata: &metadata::Metadata, max_handles: usize) -> Result<Layout<'_>> {
    let mut subtasks = Vec::new();
    let mut job_files: Vec<(String, &StreamHandle)> = Vec::new();
    let mut others: Vec<&StreamHandle> = Vec::new();
    let mut job_whole: std::collections::HashMap<String, String> = Default::default();
    let mut names = std::collections::BTreeMap::new();
    for op in &metadata.operators {
        others.extend(&op.coordinator_state);
        let mut incremental: Vec<&metadata::IncrementalHandle> = Vec::new();
        for subtask in &op.subtasks {
            for state in [&subtask.managed_operator_state, &subtask.raw_operator_state]
                .into_iter()
                .flatten()
            {
                others.extend(&state.handle);
            }
            match &subtask.raw_keyed {
                Some(KeyedHandle::KeyGroups { handle, .. }) => others.extend(handle),
                Some(KeyedHandle::Incremental(_)) => {
                    return Err(Error::Invalid(format!(
                        "operator {} holds raw keyed state as RocksDB files, which ckptfs \
                         does not know",
                        op.id
                    )))
                }
                None => {}
            }
            match &subtask.managed_keyed {
                Some(KeyedHandle::Incremental(h)) => incremental.push(h),
                Some(KeyedHandle::KeyGroups { .. }) => {
                    return Err(Error::Invalid(format!(
                        "operator {} holds its keyed state as key groups (the heap state \
                         backend's snapshot, or a savepoint in canonical format), not as \
                         RocksDB files; ckptfs imports checkpoints of state.backend.type: \
                         rocksdb",
                        op.id
                    )))
                }
                None => {}
            }
        }
        incremental.sort_by_key(|h| h.key_group_start);
        let operator = operator_dir_name(op);
        if let (Some(name), false) = (&op.name, incremental.is_empty()) {
            names.insert(operator.clone(), name.clone());
        }
        for (index, handle) in incremental.into_iter().enumerate() {
            let backend = BackendName::new(&operator, index as u32)?;
            let mut files = Vec::new();
            for (name, stream) in handle.shared.iter().chain(&handle.private) {
                crate::catalog::validate_file_name(name)?;
                files.push((name.clone(), stream));
            }
            files.push((FLINK_META.to_string(), &handle.meta));
            files.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(twice) = files.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(Error::Invalid(format!(
                    "backend {backend} lists {} twice",
                    twice[0].0
                )));
            }
            if !files.iter().any(|(name, _)| name == "CURRENT") {
                return Err(Error::Invalid(format!(
                    "backend {backend} has no CURRENT file"
                )));
            }
            subtasks.push((backend, files));
        }
    }
    for stream in others {
        let Some((name, whole)) = job_file_name(stream) else {
            continue;
        };
        crate::catalog::validate_file_name(&name)
            .ok()
            .filter(|()| name != METADATA)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "operator state in {whole}: not a file name ckptfs keeps"
                ))
            })?;
        // One file may be named by several handles (the subtasks of a union list state):
        // each is listed (an export rewrites every path), the file kept once.
        match job_whole.entry(name.clone()) {
            std::collections::hash_map::Entry::Occupied(known) if *known.get() != whole => {
                return Err(Error::Invalid(format!(
                    "two files of operator state named {name}: {} and {whole}",
                    known.get()
                )));
            }
            std::collections::hash_map::Entry::Occupied(_) => {}
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(whole);
            }
        }
        job_files.push((name, stream));
    }
    job_files.sort_by(|a, b| a.0.cmp(&b.0));
    let handles = subtasks.iter().map(|(_, files)| files.len()).sum::<usize>() + job_files.len();
    if handles > max_handles {
        return Err(Error::Invalid(format!(
            "the checkpoint's metadata names {handles} files; ckptfs imports at most \
             {max_handles} per checkpoint"
        )));
    }
    refuse_overlapping_segments(
        subtasks
            .iter()
            .flat_map(|(_, files)| files.iter().map(|(_, s)| *s))
            .chain(job_files.iter().map(|(_, s)| *s)),
    )?;
    Ok(Layout {
        subtasks,
        job_files,
        names,
    })
}

/// Most files (handles to files, segments and inline bytes) one checkpoint's `_metadata`
/// may name. A job of 2,048 subtasks with 200 SSTs each names about 410,000; each handle
/// costs an import a few hundred bytes of memory (its entry), however many name one file.
pub const MAX_HANDLES: usize = 1_000_000;

/// Refuse segments of one physical file that overlap (one range named twice, by several
/// handles, is one segment). Flink's file merging writes each segment once, after the
/// previous one; a crafted `_metadata` naming overlapping ranges would have every one of
/// them copied, many times the file's bytes. So what an import copies out of a physical
/// file is at most that file.
fn refuse_overlapping_segments<'a>(streams: impl Iterator<Item = &'a StreamHandle>) -> Result<()> {
    let mut ranges: Vec<(&str, u64, u64)> = streams
        .filter_map(|s| match s {
            StreamHandle::Segment {
                path, start, size, ..
            } if *size > 0 => Some((path.as_str(), *start, *size)),
            _ => None,
        })
        .collect();
    ranges.sort_unstable();
    ranges.dedup();
    for w in ranges.windows(2) {
        let ((path, start, size), (next_path, next_start, next_size)) = (w[0], w[1]);
        if path == next_path && u128::from(start) + u128::from(size) > u128::from(next_start) {
            return Err(Error::Invalid(format!(
                "the checkpoint's metadata names overlapping ranges of {path}: bytes \
                 {start}..{} and {next_start}..{}; Flink's file merging writes each range \
                 once",
                start.saturating_add(size),
                next_start.saturating_add(next_size)
            )));
        }
    }
    Ok(())
}

/// The name a file of the job's own state (not a subtask's RocksDB file) is kept under
/// in [`job_backend`], and what it is in full (its path, or its file and range): the last
/// part of its path, or for a segment of a file-merging checkpoint
/// `<last part>-<start>-<size>`. `None` for what `_metadata` holds itself (inline state,
/// an empty segment).
pub fn job_file_name(stream: &StreamHandle) -> Option<(String, String)> {
    let last = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
    match stream {
        StreamHandle::Inline(_) | StreamHandle::EmptySegment => None,
        StreamHandle::File { path, .. } | StreamHandle::Relative { path, .. } => {
            Some((last(path), path.clone()))
        }
        StreamHandle::Segment {
            path, start, size, ..
        } => Some((
            format!("{}-{start}-{size}", last(path)),
            format!("{path} bytes {start}..{}", start.saturating_add(*size)),
        )),
    }
}

/// Where the file a relative handle names is, below the source's root: Flink resolves
/// its path against the checkpoint's directory `chk_dir`; a path that begins with `../`
/// (an export's relocatable layout: `../shared/<file>`) is in the directory above, the
/// job's. Refused (`EACCES`) if it climbs further or is no plain path.
pub fn relative_in(chk_dir: &str, path: &str) -> Result<String> {
    let rel = match path.strip_prefix("../") {
        Some(rest) => join(chk_dir.rsplit_once('/').map_or("", |(up, _)| up), rest),
        None => join(chk_dir, path),
    };
    crate::source::checked_relative(&path, &rel)?;
    Ok(rel)
}

/// The backends of one completed checkpoint whose `_metadata` is `bytes` (as its import's
/// plan read it: [`super::plan::Planned::metadata`]), each listed like an imported
/// directory (the subtasks, then [`job_backend`]), and the job's id (from the directory's
/// name, or else from the paths the metadata names: a copy of a job directory may have
/// another name). Inline files, and files on object storage, are written under `staging`
/// (which must be empty or missing); a file on object storage that `known` says the store
/// holds (its backend's newest snapshot lists it under its name, source and size) is not
/// fetched. The local files to read are held open in the listing: Flink may delete them
/// meanwhile.
pub fn subtasks(
    completed: &Completed,
    bytes: &[u8],
    staging: &Path,
    known: &dyn Fn(&BackendName, &str, &str, u64) -> bool,
    copies_into: Option<&dyn ObjectStore>,
) -> Result<Listed> {
    let in_checkpoint = |e: Error| {
        Error::Invalid(format!(
            "Flink checkpoint {} of job {}: {e}",
            completed.checkpoint, completed.job
        ))
    };
    let metadata = metadata::parse(bytes).map_err(in_checkpoint)?;
    let layout = layout(&metadata).map_err(in_checkpoint)?;
    let mut job = is_job_id(&completed.job).then(|| completed.job.clone());
    let fetched = RefCell::new(Fetches::default());
    let mut out = Vec::new();
    for (backend, named) in &layout.subtasks {
        let to = Staging {
            dir: staging.join(backend.rel_path()),
            backend,
            known,
            copies_into,
            fetched: &fetched,
        };
        let mut files = Vec::new();
        for (name, stream) in named {
            if let (None, StreamHandle::File { path, .. }) = (&job, stream) {
                job = path
                    .rsplit_once("/shared/")
                    .and_then(|(dir, _)| dir.rsplit_once('/'))
                    .map(|(_, id)| id.to_string())
                    .filter(|id| is_job_id(id));
            }
            files.push(file(completed, &to, name, stream)?);
        }
        out.push(Scanned {
            backend: backend.clone(),
            files,
        });
    }
    let backend = job_backend();
    let to = Staging {
        dir: staging.join(JOB_OPERATOR),
        backend: &backend,
        known,
        copies_into,
        fetched: &fetched,
    };
    // As read and parsed (Flink may delete it meanwhile).
    crate::fsutil::create_private_dir_all(&to.dir)?;
    let path = to.dir.join(METADATA);
    std::fs::write(&path, bytes).ctx("write", &path)?;
    let mut files = vec![ScannedFile::staged(METADATA, path, None)?];
    // Sorted by name: a file several handles name (each a subtask of a union list state)
    // comes in a row, and is listed once.
    for (name, stream) in &layout.job_files {
        if files.last().is_none_or(|f| &f.name != name) {
            files.push(file(completed, &to, name, stream)?);
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    out.push(Scanned { backend, files });
    Ok(Listed {
        backends: out,
        job: job.unwrap_or_else(|| completed.job.clone()),
        operators: layout.names,
    })
}

/// A completed checkpoint listed for import ([`subtasks`]).
pub struct Listed {
    /// Its subtasks, then [`job_backend`]; the local files to read are held open in them.
    pub backends: Vec<Scanned>,
    /// The job's id.
    pub job: String,
    /// The keyed operators' names, by directory ([`Layout::names`]).
    pub operators: std::collections::BTreeMap<String, String>,
}

/// Where the files of one backend that must be written out go, and what the store holds.
struct Staging<'a> {
    dir: PathBuf,
    backend: &'a BackendName,
    known: &'a dyn Fn(&BackendName, &str, &str, u64) -> bool,
    /// The store, when it may copy files of object storage itself (see [`copied`]).
    copies_into: Option<&'a dyn ObjectStore>,
    /// What this checkpoint's handles made readable so far, shared by every handle that
    /// names the same bytes.
    fetched: &'a RefCell<Fetches>,
}

/// The bytes one checkpoint's handles named, each made readable once however many handles
/// name it (a union list state, or a crafted `_metadata` naming one file a million
/// times): a local file is held open once, a file on object storage downloaded once, a
/// segment copied out once, inline bytes written once. So what an import writes into its
/// staging is at most the distinct bytes named, whatever the number of handles.
#[derive(Default)]
struct Fetches {
    /// Local files held open, and files downloaded whole, by tree and path.
    whole: std::collections::HashMap<(usize, String), Fetched>,
    /// Segments copied or downloaded, by tree, path and range.
    segments: std::collections::HashMap<(usize, String, u64, u64), ScannedFile>,
    /// Inline bytes written out, by their hash.
    inline: std::collections::HashMap<String, ScannedFile>,
    /// Files on object storage the store copies itself, by tree and path.
    copied: std::collections::HashMap<(usize, String), ScannedFile>,
}

impl Fetches {
    fn key(tree: &Arc<dyn Tree>, rel: &str) -> (usize, String) {
        (Arc::as_ptr(tree) as *const () as usize, rel.to_string())
    }
}

/// `first`, as the file `name` too.
fn renamed(first: &ScannedFile, name: &str) -> ScannedFile {
    let mut file = first.clone();
    file.name = name.to_string();
    file
}

/// One file named by a checkpoint: where its bytes are, and its source.
fn file(
    completed: &Completed,
    to: &Staging<'_>,
    name: &str,
    stream: &StreamHandle,
) -> Result<ScannedFile> {
    let ((tree, rel), size) = match stream {
        StreamHandle::Inline(bytes) => {
            let source = format!("inline:{}", blake3::hash(bytes).to_hex());
            if let Some(first) = to.fetched.borrow().inline.get(&source) {
                return Ok(renamed(first, name));
            }
            crate::fsutil::create_private_dir_all(&to.dir)?;
            let path = to.dir.join(name);
            std::fs::write(&path, bytes).ctx("write", &path)?;
            let found = ScannedFile::staged(name, path, Some(source.clone()))?;
            to.fetched.borrow_mut().inline.insert(source, found.clone());
            return Ok(found);
        }
        StreamHandle::File { path, size, .. } => {
            if let Some(found) = at_its_uri(completed, to, name, path, *size)? {
                return Ok(found);
            }
            (resolve(completed, path)?, *size)
        }
        StreamHandle::Relative { path, size, .. } => {
            let chk = join(&completed.job_dir, &format!("chk-{}", completed.checkpoint));
            let rel = relative_in(&chk, path)?;
            ((completed.source.tree.clone(), rel), *size)
        }
        StreamHandle::Segment {
            path, start, size, ..
        } => {
            let (tree, rel) = resolve(completed, path)?;
            return segment(to, name, &tree, &rel, *start, *size);
        }
        StreamHandle::EmptySegment => {
            crate::fsutil::create_private_dir_all(&to.dir)?;
            let path = to.dir.join(name);
            std::fs::write(&path, b"").ctx("write", &path)?;
            return ScannedFile::staged(name, path, Some("inline:empty".into()));
        }
    };
    let immutable = tree.immutable_name(&rel);
    if let Some(source) = &immutable {
        if (to.known)(to.backend, name, source, size) {
            // Re-referenced unread under its immutable name.
            return Ok(ScannedFile::stored(name, source.clone(), size));
        }
    }
    if let Some(found) = copied(to, name, &tree, &rel, size, &immutable)? {
        return of_size(found, size);
    }
    let fetched = opened(to, &tree, &rel, || tree.fetch(&rel, &to.dir, name, size))?;
    let found = match fetched {
        Fetched::Open(file) => {
            let origins = crate::import::source_of(name, &file)?;
            if (to.known)(to.backend, name, &origins.0, file.stamp.size) {
                // Re-referenced unread: Flink may delete it now.
                return Ok(ScannedFile::stored(name, origins.0, file.stamp.size));
            }
            ScannedFile::held(name, file, origins)
        }
        Fetched::Downloaded(path) => ScannedFile::staged(name, path, immutable)?,
    };
    of_size(found, size)
}

/// `found`, refused unless it has the `size` its handle declares.
fn of_size(found: ScannedFile, size: u64) -> Result<ScannedFile> {
    if found.size != size {
        return Err(Error::Invalid(format!(
            "{} has {} bytes, the checkpoint's metadata says {size}",
            found.shown(),
            found.size
        )));
    }
    Ok(found)
}

/// The file a handle names by `uri` on object storage, where the URI says (below a root),
/// when that takes no look at the source or one: re-referenced unread if the store holds
/// it under that immutable name, else copied by the object store (one HEAD, which also
/// tells it is there). `None`: [`resolve`] it (a local file, a moved job's, one the store
/// cannot copy, or one not where its URI says).
fn at_its_uri(
    completed: &Completed,
    to: &Staging<'_>,
    name: &str,
    uri: &str,
    size: u64,
) -> Result<Option<ScannedFile>> {
    let src = &completed.source;
    let Some((tree, rel)) = std::iter::once(&src.tree)
        .chain(&src.also)
        .find_map(|tree| tree.locate(uri).map(|rel| (tree, rel)))
    else {
        return Ok(None);
    };
    let Some(immutable) = tree.immutable_name(&rel) else {
        return Ok(None);
    };
    if (to.known)(to.backend, name, &immutable, size) {
        return Ok(Some(ScannedFile::stored(name, immutable, size)));
    }
    copied(to, name, tree, &rel, size, &Some(immutable))?
        .map(|found| of_size(found, size))
        .transpose()
}

/// File `rel` of `tree` as an object the store copies without reading it (an SST or blob
/// file of at most [`MAX_COPY`] bytes, on object storage the store can copy from),
/// looked up and its properties read once per checkpoint however many handles name it;
/// `None` for a file that is read (downloaded or held open) instead.
fn copied(
    to: &Staging<'_>,
    name: &str,
    tree: &Arc<dyn Tree>,
    rel: &str,
    size: u64,
    immutable: &Option<String>,
) -> Result<Option<ScannedFile>> {
    let Some(store) = to.copies_into else {
        return Ok(None);
    };
    let copies = tree
        .remote()
        .is_some_and(|remote| store.copies_from(remote));
    if !copies || !crate::backend::is_shared_file(name) || size > MAX_COPY {
        return Ok(None);
    }
    let key = Fetches::key(tree, rel);
    if let Some(first) = to.fetched.borrow().copied.get(&key) {
        return Ok(Some(renamed(first, name)));
    }
    let Some(file) = tree.remote_file(rel)? else {
        return Ok(None);
    };
    let column_family = if name.ends_with(".sst") {
        crate::source::sst::properties_of_remote(&file)?.column_family
    } else {
        None
    };
    let found = ScannedFile::remote(name, file, immutable.clone(), column_family);
    to.fetched.borrow_mut().copied.insert(key, found.clone());
    Ok(Some(found))
}

/// File `rel` of `tree` as `fetch` makes it readable, once per checkpoint however many
/// handles name it: held open (a local file), or downloaded (object storage).
fn opened(
    to: &Staging<'_>,
    tree: &Arc<dyn Tree>,
    rel: &str,
    fetch: impl FnOnce() -> Result<Fetched>,
) -> Result<Fetched> {
    let key = Fetches::key(tree, rel);
    if let Some(known) = to.fetched.borrow().whole.get(&key) {
        return Ok(known.clone());
    }
    let fetched = fetch()?;
    to.fetched.borrow_mut().whole.insert(key, fetched.clone());
    Ok(fetched)
}

/// The logical file `name` that is bytes `[start, start + size)` of file `rel` (a segment
/// of a file-merging checkpoint): an SST the store holds (its identity, read from the
/// range's end, or an object's name and range) is re-referenced unread; anything else is
/// copied out of the range into the staging directory, and its identity kept for the
/// next import.
fn segment(
    to: &Staging<'_>,
    name: &str,
    tree: &Arc<dyn Tree>,
    rel: &str,
    start: u64,
    size: u64,
) -> Result<ScannedFile> {
    let immutable = tree
        .immutable_name(rel)
        .map(|uri| format!("{uri}#{start}+{size}"));
    if let Some(source) = &immutable {
        if (to.known)(to.backend, name, source, size) {
            return Ok(ScannedFile::stored(name, source.clone(), size));
        }
    }
    let (tree_key, path_key) = Fetches::key(tree, rel);
    let range = (tree_key, path_key, start, size);
    if let Some(first) = to.fetched.borrow().segments.get(&range) {
        return Ok(renamed(first, name));
    }
    // A local file is held open whole (its other segments read through the same
    // descriptor); a segment on object storage is downloaded alone.
    let held = match to.fetched.borrow().whole.get(&Fetches::key(tree, rel)) {
        Some(Fetched::Open(file)) => Some(file.clone()),
        _ => None,
    };
    let fetched = match held {
        Some(file) => Fetched::Open(file),
        None => tree.fetch_segment(rel, start, size, &to.dir, name)?,
    };
    let found = match fetched {
        Fetched::Downloaded(path) => ScannedFile::staged(name, path, immutable)?,
        Fetched::Open(file) => {
            to.fetched
                .borrow_mut()
                .whole
                .insert(Fetches::key(tree, rel), Fetched::Open(file.clone()));
            if start
                .checked_add(size)
                .is_none_or(|end| end > file.stamp.size)
            {
                return Err(Error::Invalid(format!(
                    "{}: the checkpoint's metadata names bytes {start}..{} of it, which has {}",
                    file.path.display(),
                    start.saturating_add(size),
                    file.stamp.size
                )));
            }
            let identity = if name.ends_with(".sst") {
                crate::source::sst::properties_in(&file, start, size)?
                    .identity
                    .map(|i| i.to_string())
            } else {
                None
            };
            if let Some(source) = &identity {
                if (to.known)(to.backend, name, source, size) {
                    return Ok(ScannedFile::stored(name, source.clone(), size));
                }
            }
            let path = copy_range(&file, start, size, &to.dir, name)?;
            ScannedFile::staged(name, path, identity)?
        }
    };
    let found = of_size(found, size)?;
    to.fetched
        .borrow_mut()
        .segments
        .insert(range, found.clone());
    Ok(found)
}

/// Bytes `[start, start + size)` of a file held open, copied to `dir/name` (a new file).
fn copy_range(
    file: &crate::source::SourceFile,
    start: u64,
    size: u64,
    dir: &Path,
    name: &str,
) -> Result<PathBuf> {
    use std::io::Write;
    const PIECE: u64 = 1 << 20;
    crate::fsutil::create_private_dir_all(dir)?;
    let path = dir.join(name);
    let mut out = crate::fsutil::create_new_private()
        .open(&path)
        .ctx("create", &path)?;
    let mut done = 0;
    while done < size {
        let want = (size - done).min(PIECE) as usize;
        let piece = file.read_at(start + done, want)?;
        if piece.len() != want {
            return Err(Error::Invalid(format!(
                "{} ended while its segment was read",
                file.path.display()
            )));
        }
        out.write_all(&piece).ctx("write", &path)?;
        done += want as u64;
    }
    Ok(path)
}

/// The file an absolute URI of a checkpoint's metadata names, below one of the source's
/// roots: where it says, or else (a job directory moved or copied elsewhere) the part after
/// `/shared/` (or `/taskowned/`), one plain name (or, with file merging, a `job_...`
/// directory of Flink's and one plain name), under the job's directory. A URI outside
/// every root is refused (`EACCES`) and never looked at.
fn resolve(completed: &Completed, uri: &str) -> Result<(Arc<dyn Tree>, String)> {
    let src = &completed.source;
    let mut inside = false;
    for tree in std::iter::once(&src.tree).chain(&src.also) {
        if let Some(rel) = tree.locate(uri) {
            inside = true;
            if tree.size_of(&rel)?.is_some() {
                return Ok((tree.clone(), rel));
            }
        }
    }
    for dir in ["shared", "taskowned"] {
        let Some((_, rest)) = uri.rsplit_once(&format!("/{dir}/")) else {
            continue;
        };
        // One plain name, or with file merging `job_<job>_op_...` (or `_tm_...`) and one.
        let parts: Vec<&str> = rest.split('/').collect();
        let merged = parts.len() == 2 && parts[0].starts_with("job_");
        if (parts.len() != 1 && !merged) || crate::source::checked_relative(&rest, rest).is_err() {
            continue;
        }
        let rel = join(&completed.job_dir, &format!("{dir}/{rest}"));
        if src.tree.size_of(&rel)?.is_some() {
            return Ok((src.tree.clone(), rel));
        }
    }
    if inside {
        return Err(Error::NotFound(format!(
            "Flink checkpoint {} of job {} refers to {uri}, which is neither there nor under {}",
            completed.checkpoint,
            completed.job,
            completed.location()
        )));
    }
    Err(crate::source::refused(
        uri,
        format!(
            "Flink checkpoint {} of job {} names a file outside the source ({}), and no \
             file of its name is in the job's shared/: ckptfs reads only below the roots it \
             is given (a job restored in CLAIM mode from another job's checkpoint: give the \
             checkpoint root holding both jobs, or name that job's directory too, \
             --source-root)",
            completed.checkpoint,
            completed.job,
            src.roots()
        ),
        libc::EACCES,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(uid: Option<&str>) -> OperatorState {
        OperatorState {
            name: None,
            uid: uid.map(str::to_string),
            id: "0da08f51d4b7c9a2e1f3a4b5c6d7e8f9".into(),
            parallelism: 2,
            max_parallelism: 128,
            coordinator_state: None,
            subtasks: Vec::new(),
        }
    }

    #[test]
    fn operator_names_are_backend_names_and_never_collide() {
        let cases = [
            (None, "0da08f51d4b7c9a2e1f3a4b5c6d7e8f9"),
            (Some("counter"), "counter"),
            (Some("my op/v2"), "my_20op_2fv2"),
            (Some("a_b"), "a_5fb"),
            (Some(".hidden"), "_2ehidden"),
            (
                Some("0da08f51d4b7c9a2e1f3a4b5c6d7e8f9"),
                "_30da08f51d4b7c9a2e1f3a4b5c6d7e8f9",
            ),
        ];
        for (uid, expected) in cases {
            let name = operator_dir_name(&op(uid));
            assert_eq!(name, expected);
            BackendName::new(&name, 0).unwrap();
        }
        // Long uids (85 bytes that need escaping are 255 escaped): valid, distinct names.
        let long = |tail: &str| operator_dir_name(&op(Some(&format!("{}{tail}", "ü".repeat(43)))));
        let (a, b) = (long("a"), long("b"));
        assert_ne!(a, b);
        for name in [&a, &b] {
            assert!(name.len() <= LONG_NAME, "{name}");
            assert!(name.contains("__"), "{name}");
            BackendName::new(name, 0).unwrap();
        }
        let exactly = "x".repeat(LONG_NAME);
        assert_eq!(operator_dir_name(&op(Some(&exactly))), exactly);
    }

    #[test]
    fn overlapping_segments_of_one_file_are_refused() {
        let seg = |path: &str, start: u64, size: u64| StreamHandle::Segment {
            path: path.to_string(),
            start,
            size,
            span: 0..0,
        };
        let check = |handles: &[StreamHandle]| refuse_overlapping_segments(handles.iter());
        // Flink's own: ranges one after another, one range named by several handles, the
        // same offsets in another file, an empty range anywhere.
        check(&[
            seg("file:/f/a", 0, 100),
            seg("file:/f/a", 100, 50),
            seg("file:/f/a", 0, 100),
            seg("file:/f/b", 0, 100),
            seg("file:/f/a", 20, 0),
        ])
        .unwrap();
        // A crafted one: a range that begins inside another, which every copy would
        // copy again (here 1 GiB a handle).
        let e = check(&[seg("file:/f/a", 0, 1 << 30), seg("file:/f/a", 1, 1 << 30)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlapping ranges of file:/f/a"), "{e}");
        assert!(e.contains("bytes 0..1073741824 and 1..1073741825"), "{e}");
        // Ends past 2^64 overlap what follows them too.
        check(&[
            seg("file:/f/a", u64::MAX - 1, 10),
            seg("file:/f/a", u64::MAX, 1),
        ])
        .unwrap_err();
    }

    #[test]
    fn a_checkpoint_naming_too_many_files_is_refused() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/flink/job1");
        let bytes = std::fs::read(fixture.join("chk-6/_metadata")).unwrap();
        let parsed = metadata::parse(&bytes).unwrap();
        let named = {
            let layout = layout(&parsed).unwrap();
            layout.subtasks.iter().map(|(_, f)| f.len()).sum::<usize>() + layout.job_files.len()
        };
        assert!(named > 10, "{named}");
        layout_of_at_most(&parsed, named).unwrap();
        let refused = layout_of_at_most(&parsed, named - 1).err().unwrap();
        assert_eq!(refused.errno(), libc::EINVAL);
        assert!(
            refused
                .to_string()
                .contains(&format!("names {named} files")),
            "{refused}"
        );
    }

    #[test]
    fn a_file_named_by_many_handles_is_held_open_once() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("job");
        crate::flink::copy_of_fixture(&job);
        // Every uploaded file's handle names one file, with its size.
        let metadata_path = job.join("chk-6/_metadata");
        let bytes = std::fs::read(&metadata_path).unwrap();
        // Where each file handle's path is in a `_metadata`.
        let file_paths_at = |bytes: &[u8]| {
            let mut ats = Vec::new();
            for op in metadata::parse(bytes).unwrap().operators {
                for subtask in op.subtasks {
                    if let Some(KeyedHandle::Incremental(h)) = subtask.managed_keyed {
                        for (_, stream) in h.shared.iter().chain(&h.private) {
                            if let StreamHandle::File { at, .. } = stream {
                                ats.push(*at);
                            }
                        }
                    }
                }
            }
            ats
        };
        let handles = file_paths_at(&bytes);
        assert!(handles.len() > 2);
        let one = std::fs::read_dir(job.join("shared"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let size = std::fs::metadata(&one).unwrap().len();
        let uri = format!("file:{}", one.display());
        let mut rewritten = metadata::with_paths(
            &bytes,
            handles.iter().map(|at| (*at, uri.clone())).collect(),
        )
        .unwrap();
        // The sizes precede the paths; the offsets shift by the paths' new lengths.
        for at in file_paths_at(&rewritten) {
            rewritten[at - 8..at].copy_from_slice(&(size as i64).to_be_bytes());
        }
        std::fs::write(&metadata_path, &rewritten).unwrap();
        let found = completed(&FlinkSource::parse(&job).unwrap()).unwrap();
        let staging = tempfile::tempdir().unwrap();
        let listed = subtasks_of(&found[2], staging.path()).unwrap();
        let held: std::collections::BTreeSet<PathBuf> = listed
            .backends
            .iter()
            .flat_map(|b| &b.files)
            .filter(|f| f.source_file().is_some())
            .map(|f| f.path.clone())
            .collect();
        assert_eq!(held.len(), 1, "{held:?}");
    }

    /// [`subtasks`] of a checkpoint, its `_metadata` read now, the store holding nothing.
    fn subtasks_of(completed: &Completed, staging: &Path) -> Result<Listed> {
        let bytes = completed.read_metadata()?;
        subtasks(completed, &bytes, staging, &|_, _, _, _| false, None)
    }

    /// `from` copied to `to` with `cp -a`.
    fn cp_a(from: &Path, to: &Path) {
        assert!(std::process::Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .status()
            .unwrap()
            .success());
    }

    /// Set file `path`'s modification time to `secs` after the Unix epoch.
    fn set_mtime(path: &Path, secs: u64) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
            .unwrap();
    }

    /// A checkpoint root holding two jobs: the fixture job A, and job B restored from it in
    /// CLAIM mode (its checkpoints 2 and 7 name A's files, in A's directory). Both are
    /// listed, job by job in the order they began (the `_metadata` time of each one's
    /// oldest checkpoint, whatever the names), each job's by id; B's files in the sibling
    /// directory are read; a file outside the root is still refused.
    #[test]
    fn a_root_of_two_jobs_lists_both_in_the_order_they_began() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/flink/job1");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ck");
        std::fs::create_dir(&root).unwrap();
        let (a, b) = (
            "a312c9034e3e0d2016dae60431b4c9dc",
            "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b",
        );
        cp_a(&fixture, &root.join(a));
        let bytes = std::fs::read(fixture.join("chk-6/_metadata")).unwrap();
        let claimed = crate::flink::naming_files_in(&bytes, &root.join(a));
        for n in [2, 7] {
            let chk = root.join(b).join(format!("chk-{n}"));
            std::fs::create_dir_all(&chk).unwrap();
            std::fs::write(chk.join(METADATA), &claimed).unwrap();
        }
        std::fs::create_dir(root.join(b).join("shared")).unwrap();
        let set = |job: &str, n: u64, secs: u64| {
            set_mtime(&root.join(job).join(format!("chk-{n}/{METADATA}")), secs)
        };
        for n in [4, 5, 6] {
            set(a, n, 1_000 + n);
        }
        set(b, 2, 2_000);
        set(b, 7, 2_007);
        let listed = |root: &Path| -> Vec<(String, u64)> {
            completed(&FlinkSource::parse(root).unwrap())
                .unwrap()
                .into_iter()
                .map(|c| (c.job, c.checkpoint))
                .collect()
        };
        let pairs = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(j, n)| (j.to_string(), *n)).collect()
        };
        assert_eq!(
            listed(&root),
            pairs(&[(a, 4), (a, 5), (a, 6), (b, 2), (b, 7)])
        );
        // The order is the jobs' time, not their names.
        set(b, 2, 500);
        assert_eq!(
            listed(&root),
            pairs(&[(b, 2), (b, 7), (a, 4), (a, 5), (a, 6)])
        );
        // B's checkpoint names A's files: inside the root, read.
        let found = completed(&FlinkSource::parse(&root).unwrap()).unwrap();
        let staging = tempfile::tempdir().unwrap();
        let listed_b = subtasks_of(&found[1], staging.path()).unwrap();
        assert_eq!(listed_b.job, b);
        assert!(listed_b
            .backends
            .iter()
            .flat_map(|s| &s.files)
            .any(|f| f.source_file().is_some()));
        // One job's directory alone: the other job's files are outside it.
        let alone = completed(&FlinkSource::parse(&root.join(b)).unwrap()).unwrap();
        let staging = tempfile::tempdir().unwrap();
        let e = subtasks_of(&alone[0], staging.path())
            .err()
            .expect("outside the job's directory");
        assert_eq!(e.errno(), libc::EACCES, "{e}");
        // A copy of A's shared/ beside the root is outside it: refused.
        let outside = dir.path().join("elsewhere");
        cp_a(&fixture, &outside);
        let escaping = crate::flink::naming_files_in(&bytes, &outside);
        std::fs::write(root.join(b).join(format!("chk-7/{METADATA}")), &escaping).unwrap();
        let found = completed(&FlinkSource::parse(&root).unwrap()).unwrap();
        let staging = tempfile::tempdir().unwrap();
        let e = subtasks_of(&found[1], staging.path())
            .err()
            .expect("outside the root");
        assert_eq!(e.errno(), libc::EACCES, "{e}");
        assert!(e.to_string().contains("checkpoint root"), "{e}");
        // A job directory that is a link is no job of the root.
        std::os::unix::fs::symlink(&outside, root.join("0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c"))
            .unwrap();
        assert_eq!(listed(&root).len(), 5);
    }

    #[test]
    fn the_fixture_job_lists_its_completed_checkpoints_and_subtasks() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/flink/job1");
        let found = completed(&FlinkSource::parse(&fixture).unwrap()).unwrap();
        assert_eq!(
            found.iter().map(|c| c.checkpoint).collect::<Vec<_>>(),
            [4, 5, 6]
        );
        let staging = tempfile::tempdir().unwrap();
        let listed = subtasks_of(&found[2], staging.path()).unwrap();
        let (backends, job) = (listed.backends, listed.job);
        assert_eq!(job, "a312c9034e3e0d2016dae60431b4c9dc");
        let names: Vec<String> = backends.iter().map(|b| b.backend.to_string()).collect();
        assert_eq!(names.len(), 5, "{names:?}");
        assert_eq!(names.last().unwrap(), "_flink/0", "{names:?}");
        assert!(names.contains(&"counter/0".to_string()), "{names:?}");
        assert!(names.contains(&"counter/1".to_string()), "{names:?}");
        let (job_backend, backends) = backends.split_last().unwrap();
        assert!(job_backend.files.iter().any(|f| f.name == METADATA));
        for b in backends {
            assert!(b.files.iter().any(|f| f.name == FLINK_META));
            for f in &b.files {
                f.check_unchanged().unwrap();
            }
        }
    }
}
