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

use std::path::{Path, PathBuf};

use super::metadata::{self, KeyedHandle, OperatorState, StreamHandle};
use crate::error::{Error, IoContext, Result};
use crate::import::{stamp_of, Scanned, ScannedFile};
use crate::names::BackendName;

/// The name under which a subtask's Flink meta data (`KeyedBackendSerializationProxy`) is
/// kept beside its RocksDB files: RocksDB ignores files it does not name itself.
pub const FLINK_META: &str = "FLINK-KEYED-META";

/// Where a Flink job's checkpoints are: a directory, or a prefix of an S3 bucket
/// (`s3://BUCKET/PREFIX`, configured from the standard AWS environment like a store).
#[derive(Clone)]
pub enum Source {
    Local(PathBuf),
    S3 {
        remote: std::sync::Arc<crate::store::s3::Remote>,
        /// The key prefix, without a trailing `/` (empty: the whole bucket).
        prefix: String,
    },
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Source {
    /// `SRC` of `import-flink` and `mount --flink`: `s3://BUCKET[/PREFIX]`, a `file://`
    /// URL or a directory. Makes no request.
    pub fn parse(arg: &Path) -> Result<Source> {
        let text = arg.to_string_lossy();
        if text.starts_with("s3://") {
            let crate::store::Location::S3 { bucket, prefix } =
                crate::store::Location::parse(&text)?
            else {
                unreachable!("an s3:// URL parses as S3")
            };
            let remote = crate::store::s3::Remote::connect(&bucket, "")?;
            return Ok(Source::S3 { remote, prefix });
        }
        match text
            .strip_prefix("file://")
            .or_else(|| text.strip_prefix("file:"))
        {
            Some(path) if path.starts_with('/') => Ok(Source::Local(PathBuf::from(path))),
            Some(_) => Err(Error::Invalid(format!(
                "{text}: a file: URL names an absolute path (file:///data/checkpoints)"
            ))),
            None => Ok(Source::Local(arg.to_path_buf())),
        }
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

    pub fn describe(&self) -> String {
        match self {
            Source::Local(dir) => dir.display().to_string(),
            Source::S3 { remote, prefix } => format!("s3://{}/{prefix}", remote.bucket()),
        }
    }
}

/// A completed checkpoint of a Flink job (its `_metadata` exists).
#[derive(Debug, Clone)]
pub struct Completed {
    /// The job id (32 hex), the name of its directory.
    pub job: String,
    pub checkpoint: u64,
    /// The job's directory (`chk-N/`, `shared/`, `taskowned/`): a path, or on S3 the key
    /// prefix (without a trailing `/`).
    pub job_dir: PathBuf,
    pub source: Source,
}

impl Completed {
    /// Where its `_metadata` is (a path, or a key).
    pub fn metadata_path(&self) -> PathBuf {
        self.job_dir
            .join(format!("chk-{}", self.checkpoint))
            .join(METADATA)
    }

    /// Its `_metadata`.
    pub fn read_metadata(&self) -> Result<Vec<u8>> {
        let path = self.metadata_path();
        match &self.source {
            Source::Local(_) => std::fs::read(&path).ctx("read", &path),
            Source::S3 { remote, .. } => remote.get_bytes(&path.to_string_lossy()),
        }
    }

    /// Where it is, for messages.
    pub fn location(&self) -> String {
        match &self.source {
            Source::Local(_) => self.job_dir.display().to_string(),
            Source::S3 { remote, .. } => {
                format!("s3://{}/{}", remote.bucket(), self.job_dir.display())
            }
        }
    }
}

/// A Flink job id: 32 hex digits.
pub fn is_job_id(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The completed checkpoints under `src`: one job's directory (`<dir>/<job-id>/`, or a copy
/// of one under another name) or a checkpoint root holding one job (several are refused:
/// their backends would mix in one store). Oldest first (by checkpoint id). A `chk-N`
/// without `_metadata` is skipped (in flight or abandoned).
pub fn completed(src: &Source) -> Result<Vec<Completed>> {
    if let Some(found) = completed_if_any(src)? {
        return Ok(found);
    }
    let holds_metadata = match src {
        Source::Local(dir) => dir.join(METADATA).is_file(),
        Source::S3 { remote, prefix } => {
            let key = Path::new(prefix).join(METADATA);
            remote.size_of(&key.to_string_lossy())?.is_some()
        }
    };
    Err(Error::Invalid(if holds_metadata {
        format!(
            "{} is one checkpoint's or savepoint's directory (it holds _metadata): give the \
             job's checkpoint directory, which holds its chk-N/ (savepoints are not imported)",
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
pub fn completed_if_any(src: &Source) -> Result<Option<Vec<Completed>>> {
    let jobs = match src {
        Source::Local(dir) => {
            local_jobs(&std::fs::canonicalize(dir).ctx("read Flink checkpoints in", dir)?)?
        }
        Source::S3 { remote, prefix } => s3_jobs(remote, prefix)?,
    };
    if jobs.is_empty() {
        return Ok(None);
    }
    if jobs.len() > 1 {
        return Err(Error::Invalid(format!(
            "{} holds checkpoints of {} jobs: import each job's directory into its own store",
            src.describe(),
            jobs.len()
        )));
    }
    let mut out = Vec::new();
    for job_dir in jobs {
        let name = job_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut ids = match src {
            Source::Local(_) => local_checkpoints(&job_dir)?,
            Source::S3 { remote, .. } => s3_checkpoints(remote, &job_dir)?,
        };
        ids.sort_unstable();
        for checkpoint in ids {
            out.push(Completed {
                // A copied job directory keeps its id in every path of its metadata.
                job: name.clone(),
                checkpoint,
                job_dir: job_dir.clone(),
                source: src.clone(),
            });
        }
    }
    Ok(Some(out))
}

/// `N` of a `chk-N` name.
fn chk_number(name: &str) -> Option<u64> {
    name.strip_prefix("chk-").and_then(|n| n.parse().ok())
}

/// The job directories of a local `src`: itself, or those named by a job id in it.
fn local_jobs(src: &Path) -> Result<Vec<PathBuf>> {
    let is_job_dir = |dir: &Path| dir.join("shared").is_dir() || has_chk(dir);
    if is_job_dir(src) {
        return Ok(vec![src.to_path_buf()]);
    }
    let mut jobs = Vec::new();
    for entry in std::fs::read_dir(src).ctx("read directory", src)? {
        let entry = entry.ctx("read directory", src)?;
        let name = entry.file_name();
        if is_job_id(&name.to_string_lossy()) && is_job_dir(&entry.path()) {
            jobs.push(entry.path());
        }
    }
    jobs.sort();
    Ok(jobs)
}

/// The ids of a local job directory's `chk-N` that hold a `_metadata`.
fn local_checkpoints(job_dir: &Path) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(job_dir).ctx("read directory", job_dir)? {
        let entry = entry.ctx("read directory", job_dir)?;
        let Some(n) = entry.file_name().to_str().and_then(chk_number) else {
            continue;
        };
        if entry.path().join(METADATA).is_file() {
            ids.push(n);
        }
    }
    Ok(ids)
}

/// The job "directories" (key prefixes) under an S3 `prefix`: itself, or those named by a
/// job id under it.
fn s3_jobs(remote: &crate::store::s3::Remote, prefix: &str) -> Result<Vec<PathBuf>> {
    let dir = |p: &str| {
        if p.is_empty() {
            String::new()
        } else {
            format!("{p}/")
        }
    };
    let last = |key: &str| {
        key.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string()
    };
    let is_job_dir = |entries: &[(String, u64)]| {
        entries.iter().any(|(key, _)| {
            let name = last(key);
            key.ends_with('/') && (name == "shared" || chk_number(&name).is_some())
        })
    };
    let top = remote.list_keys(&dir(prefix), true)?;
    if is_job_dir(&top) {
        return Ok(vec![PathBuf::from(prefix)]);
    }
    let mut jobs = Vec::new();
    for (key, _) in &top {
        if key.ends_with('/') && is_job_id(&last(key)) {
            let job = key.trim_end_matches('/');
            if is_job_dir(&remote.list_keys(&dir(job), true)?) {
                jobs.push(PathBuf::from(job));
            }
        }
    }
    jobs.sort();
    Ok(jobs)
}

/// The ids of an S3 job prefix's `chk-N/` that hold a `_metadata`.
fn s3_checkpoints(remote: &crate::store::s3::Remote, job_dir: &Path) -> Result<Vec<u64>> {
    let job = job_dir.to_string_lossy();
    let mut ids = Vec::new();
    for (key, _) in remote.list_keys(&format!("{job}/"), true)? {
        let name = key.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        if let Some(n) = chk_number(name).filter(|_| key.ends_with('/')) {
            if remote
                .size_of(&format!("{job}/chk-{n}/{METADATA}"))?
                .is_some()
            {
                ids.push(n);
            }
        }
    }
    Ok(ids)
}

/// Read and parse every checkpoint's `_metadata`, and check that ckptfs can import it
/// ([`layout`]): a command that imports several refuses a bad one before the store is
/// touched.
pub fn check_all(completed: &[Completed]) -> Result<()> {
    for checkpoint in completed {
        let bytes = checkpoint.read_metadata()?;
        metadata::parse(&bytes)
            .and_then(|parsed| layout(&parsed).map(drop))
            .map_err(|e| {
                Error::Invalid(format!(
                    "Flink checkpoint {} of {}: {e}; nothing was imported",
                    checkpoint.checkpoint,
                    checkpoint.location()
                ))
            })?;
    }
    Ok(())
}

fn has_chk(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("chk-"))
        })
        .unwrap_or(false)
}

/// An operator's directory name: its uid, with every byte outside `[A-Za-z0-9.-]` written
/// `_XX` (hex; so `_` itself is `_5f`), a leading `.` too, and a uid of 32 hex digits (which
/// would read as an operator id) with its first byte escaped; without a uid, the 32-hex id.
pub fn operator_dir_name(op: &OperatorState) -> String {
    let Some(uid) = &op.uid else {
        return op.id.clone();
    };
    let mut out = String::new();
    for (i, b) in uid.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'-' || (b == b'.' && i > 0);
        let looks_like_id = i == 0 && is_job_id(uid);
        if plain && !looks_like_id {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out
}

/// The backend that keeps what a Flink checkpoint holds besides its subtasks' RocksDB
/// state: its `_metadata` ([`METADATA`]) and every file that names outside the subtasks'
/// incremental keyed state (operator state, coordinator state), under the last part of its
/// path. No operator's directory is named `_flink` ([`operator_dir_name`] writes `_` only
/// before two hex digits).
pub const JOB_OPERATOR: &str = "_flink";
pub const METADATA: &str = "_metadata";

pub fn job_backend() -> BackendName {
    BackendName::new(JOB_OPERATOR, 0).expect("a valid backend name")
}

/// Where the store keeps each file a checkpoint's metadata names: by subtask, its RocksDB
/// files under their names (and its Flink meta data as [`FLINK_META`]); the job's other
/// files in [`job_backend`]. Inline handles are listed with the subtasks (they are files of
/// a RocksDB directory) but not with the job (the `_metadata` holds them).
pub struct Layout<'a> {
    pub subtasks: Vec<(BackendName, Vec<(String, &'a StreamHandle)>)>,
    pub job_files: Vec<(String, &'a StreamHandle)>,
}

/// The [`Layout`] of a parsed checkpoint; what ckptfs does not import is refused with the
/// reason (full keyed snapshots, file merging).
pub fn layout(metadata: &metadata::Metadata) -> Result<Layout<'_>> {
    let mut subtasks = Vec::new();
    let mut job_files: Vec<(String, &StreamHandle)> = Vec::new();
    let mut others: Vec<&StreamHandle> = Vec::new();
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
            if files.iter().any(|(_, s)| is_merged(s)) {
                return Err(file_merging(&backend.to_string()));
            }
            subtasks.push((backend, files));
        }
    }
    for stream in others {
        let path = match stream {
            StreamHandle::Inline(_) => continue,
            StreamHandle::File { path, .. } | StreamHandle::Relative { path, .. } => path,
            StreamHandle::Segment { .. } | StreamHandle::EmptySegment => {
                return Err(file_merging("the job's operator state"))
            }
        };
        let name = path.rsplit('/').next().unwrap_or(path);
        crate::catalog::validate_file_name(name)
            .ok()
            .filter(|()| name != METADATA)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "operator state in {path}: not a file name ckptfs keeps"
                ))
            })?;
        // One file may be named by several handles (the subtasks of a union list state):
        // each is listed (an export rewrites every path), the file kept once.
        if let Some((_, known)) = job_files.iter().find(|(n, _)| n == name) {
            let known_path = match known {
                StreamHandle::File { path, .. } | StreamHandle::Relative { path, .. } => path,
                _ => unreachable!("only files are listed"),
            };
            if known_path != path {
                return Err(Error::Invalid(format!(
                    "two files of operator state named {name}: {known_path} and {path}"
                )));
            }
        }
        job_files.push((name.to_string(), stream));
    }
    job_files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Layout {
        subtasks,
        job_files,
    })
}

fn is_merged(stream: &StreamHandle) -> bool {
    matches!(
        stream,
        StreamHandle::Segment { .. } | StreamHandle::EmptySegment
    )
}

fn file_merging(what: &str) -> Error {
    Error::Invalid(format!(
        "{what} uses file merging (execution.checkpointing.file-merging.enabled), which \
         ckptfs does not import"
    ))
}

/// The backends of one completed checkpoint, each listed like an imported directory (the
/// subtasks, then [`job_backend`]), and the job's id (from the directory's name, or else
/// from the paths the metadata names: a copy of a job directory may have another name).
/// Inline files, and files on object storage, are written under `staging` (which must be
/// empty or missing); a file on object storage that `known` says the store holds (its
/// backend's newest snapshot lists it under its name, source and size) is not fetched.
pub fn subtasks(
    completed: &Completed,
    staging: &Path,
    known: &dyn Fn(&BackendName, &str, &str, u64) -> bool,
) -> Result<Listed> {
    let mut open = Vec::new();
    let bytes = completed.read_metadata()?;
    let in_checkpoint = |e: Error| {
        Error::Invalid(format!(
            "Flink checkpoint {} of job {}: {e}",
            completed.checkpoint, completed.job
        ))
    };
    let metadata = metadata::parse(&bytes).map_err(in_checkpoint)?;
    let layout = layout(&metadata).map_err(in_checkpoint)?;
    let mut job = is_job_id(&completed.job).then(|| completed.job.clone());
    let mut out = Vec::new();
    for (backend, named) in &layout.subtasks {
        let to = Staging {
            dir: staging.join(backend.rel_path()),
            backend,
            known,
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
            files.push(file(completed, &to, name, stream, &mut open)?);
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
    };
    // As read and parsed (Flink may delete it meanwhile).
    crate::fsutil::create_private_dir_all(&to.dir)?;
    let path = to.dir.join(METADATA);
    std::fs::write(&path, &bytes).ctx("write", &path)?;
    let mut files = vec![on_disk(METADATA, path, None)?];
    for (name, stream) in &layout.job_files {
        if !files.iter().any(|f| &f.name == name) {
            files.push(file(completed, &to, name, stream, &mut open)?);
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    out.push(Scanned { backend, files });
    Ok(Listed {
        backends: out,
        job: job.unwrap_or_else(|| completed.job.clone()),
        open,
    })
}

/// A completed checkpoint listed for import ([`subtasks`]).
pub struct Listed {
    /// Its subtasks, then [`job_backend`].
    pub backends: Vec<Scanned>,
    /// The job's id.
    pub job: String,
    /// The files to read, held open until the import is stored: Flink deletes the files of
    /// a checkpoint it no longer retains, possibly while ckptfs imports it.
    pub open: Vec<std::fs::File>,
}

/// Where the files of one backend that must be written out go, and what the store holds.
struct Staging<'a> {
    dir: PathBuf,
    backend: &'a BackendName,
    known: &'a dyn Fn(&BackendName, &str, &str, u64) -> bool,
}

/// One file named by a checkpoint: where its bytes are, and its source.
fn file(
    completed: &Completed,
    to: &Staging<'_>,
    name: &str,
    stream: &StreamHandle,
    open: &mut Vec<std::fs::File>,
) -> Result<ScannedFile> {
    let (found, size) = match stream {
        StreamHandle::Inline(bytes) => {
            crate::fsutil::create_private_dir_all(&to.dir)?;
            let path = to.dir.join(name);
            std::fs::write(&path, bytes).ctx("write", &path)?;
            let hash = blake3::hash(bytes).to_hex();
            return on_disk(name, path, Some(format!("inline:{hash}")));
        }
        StreamHandle::File { path, size, .. } => (resolve(completed, path)?, *size),
        StreamHandle::Relative { path, size, .. } => {
            let at = completed
                .job_dir
                .join(format!("chk-{}", completed.checkpoint))
                .join(path);
            (
                match completed.source {
                    Source::Local(_) => Found::Local(at),
                    Source::S3 { .. } => Found::Key(at.to_string_lossy().into_owned()),
                },
                *size,
            )
        }
        StreamHandle::Segment { .. } | StreamHandle::EmptySegment => {
            return Err(file_merging(&format!("file {name}")))
        }
    };
    let found = match (found, &completed.source) {
        (Found::Local(path), _) => {
            let listed = on_disk(name, path, None)?;
            let source = listed.source.clone().unwrap_or_default();
            if (to.known)(to.backend, name, &source, listed.size) {
                // Re-referenced unread under its immutable name: Flink may delete it now.
                ScannedFile::stored(name, source, listed.size)
            } else {
                listed.held_open(open)?
            }
        }
        (Found::Key(key), Source::S3 { remote, .. }) => {
            let source = format!("s3://{}/{key}", remote.bucket());
            if (to.known)(to.backend, name, &source, size) {
                return Ok(ScannedFile::stored(name, source, size));
            }
            crate::fsutil::create_private_dir_all(&to.dir)?;
            let path = to.dir.join(name);
            remote.download(&key, &path)?;
            on_disk(name, path, Some(source))?
        }
        (Found::Key(_), Source::Local(_)) => unreachable!("keys are found on object storage"),
    };
    if found.size != size {
        return Err(Error::Invalid(format!(
            "{} has {} bytes, the checkpoint's metadata says {size}",
            found
                .source
                .as_deref()
                .unwrap_or(&found.path.display().to_string()),
            found.size
        )));
    }
    Ok(found)
}

/// Where a file named by a checkpoint is.
enum Found {
    Local(PathBuf),
    /// A key of the source's bucket.
    Key(String),
}

/// A regular file at `path`, imported as `name`; its source is `source` or else its stamp.
fn on_disk(name: &str, path: PathBuf, source: Option<String>) -> Result<ScannedFile> {
    let meta = std::fs::symlink_metadata(&path).ctx("stat", &path)?;
    if !meta.is_file() {
        return Err(Error::Invalid(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    let stamp = stamp_of(&meta);
    Ok(ScannedFile {
        name: name.to_string(),
        size: meta.len(),
        source: source.or_else(|| Some(stamp.clone())),
        stamp,
        path,
    })
}

/// A file named by its absolute URI: as it is if it exists, else the part after
/// `/<job-id>/shared/` (or `taskowned/`) under the job directory given (a moved copy). On
/// object storage, an `s3://` (`s3a://`, `s3p://`) URI of the source's bucket is that key.
fn resolve(completed: &Completed, uri: &str) -> Result<Found> {
    let not_found = || {
        Error::NotFound(format!(
            "Flink checkpoint {} of job {} refers to {uri}, which is neither there nor under {}",
            completed.checkpoint,
            completed.job,
            completed.location()
        ))
    };
    let moved = |local: &str, exists: &dyn Fn(&str) -> Result<bool>| -> Result<Option<String>> {
        for dir in ["shared", "taskowned"] {
            if let Some((_, rest)) = local.rsplit_once(&format!("/{dir}/")) {
                let at = completed.job_dir.join(dir).join(rest);
                let at = at.to_string_lossy();
                if exists(&at)? {
                    return Ok(Some(at.into_owned()));
                }
            }
        }
        Ok(None)
    };
    match &completed.source {
        Source::Local(_) => {
            let local = uri
                .strip_prefix("file://")
                .or_else(|| uri.strip_prefix("file:"))
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "Flink checkpoint {} refers to {uri}: a checkpoint on a local \
                         filesystem names file: paths (give an s3:// SRC for checkpoints on \
                         object storage)",
                        completed.checkpoint
                    ))
                })?;
            if Path::new(local).is_file() {
                return Ok(Found::Local(local.into()));
            }
            moved(local, &|p| Ok(Path::new(p).is_file()))?
                .map(|p| Found::Local(p.into()))
                .ok_or_else(not_found)
        }
        Source::S3 { remote, .. } => {
            let exists = |key: &str| remote.size_of(key).map(|s| s.is_some());
            let in_bucket = ["s3://", "s3a://", "s3p://"]
                .iter()
                .find_map(|scheme| uri.strip_prefix(scheme))
                .and_then(|rest| rest.split_once('/'))
                .filter(|(bucket, _)| *bucket == remote.bucket())
                .map(|(_, key)| key);
            if let Some(key) = in_bucket {
                if exists(key)? {
                    return Ok(Found::Key(key.to_string()));
                }
            }
            moved(uri, &exists)?.map(Found::Key).ok_or_else(not_found)
        }
    }
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
    }

    #[test]
    fn the_fixture_job_lists_its_completed_checkpoints_and_subtasks() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/flink/job1");
        let found = completed(&Source::Local(fixture)).unwrap();
        assert_eq!(
            found.iter().map(|c| c.checkpoint).collect::<Vec<_>>(),
            [4, 5, 6]
        );
        let staging = tempfile::tempdir().unwrap();
        let listed = subtasks(&found[2], staging.path(), &|_, _, _, _| false).unwrap();
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
