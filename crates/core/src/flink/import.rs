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

/// A completed checkpoint of a Flink job (its `_metadata` exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The job id (32 hex), the name of its directory.
    pub job: String,
    pub checkpoint: u64,
    /// The job's directory (`chk-N/`, `shared/`, `taskowned/`).
    pub job_dir: PathBuf,
}

impl Completed {
    pub fn metadata_path(&self) -> PathBuf {
        self.job_dir
            .join(format!("chk-{}", self.checkpoint))
            .join("_metadata")
    }
}

/// A Flink job id: 32 hex digits.
pub fn is_job_id(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The completed checkpoints under `src`: one job's directory (`<dir>/<job-id>/`, or a copy
/// of one under another name) or a checkpoint root holding one job (several are refused:
/// their backends would mix in one store). Oldest first (by checkpoint id). A `chk-N` without `_metadata` is skipped (in flight
/// or abandoned).
pub fn completed(src: &Path) -> Result<Vec<Completed>> {
    let src = std::fs::canonicalize(src).ctx("read Flink checkpoints in", src)?;
    let is_job_dir = |dir: &Path| dir.join("shared").is_dir() || has_chk(dir);
    let jobs: Vec<PathBuf> = if is_job_dir(&src) {
        vec![src.clone()]
    } else {
        let mut jobs = Vec::new();
        for entry in std::fs::read_dir(&src).ctx("read directory", &src)? {
            let entry = entry.ctx("read directory", &src)?;
            let name = entry.file_name();
            if is_job_id(&name.to_string_lossy()) && is_job_dir(&entry.path()) {
                jobs.push(entry.path());
            }
        }
        jobs.sort();
        jobs
    };
    if jobs.is_empty() {
        return Err(Error::Invalid(format!(
            "{} holds no Flink job's checkpoints (no chk-N/ or shared/, nor job directories \
             named by a 32-hex job id)",
            src.display()
        )));
    }
    if jobs.len() > 1 {
        return Err(Error::Invalid(format!(
            "{} holds checkpoints of {} jobs: import each job's directory into its own store",
            src.display(),
            jobs.len()
        )));
    }
    let mut out = Vec::new();
    for job_dir in jobs {
        let name = job_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&job_dir).ctx("read directory", &job_dir)? {
            let entry = entry.ctx("read directory", &job_dir)?;
            let file_name = entry.file_name();
            let Some(n) = file_name
                .to_str()
                .and_then(|n| n.strip_prefix("chk-"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if entry.path().join("_metadata").is_file() {
                ids.push(n);
            }
        }
        ids.sort_unstable();
        for checkpoint in ids {
            out.push(Completed {
                // A copied job directory keeps its id in every path of its metadata.
                job: name.clone(),
                checkpoint,
                job_dir: job_dir.clone(),
            });
        }
    }
    Ok(out)
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

/// The backends of one completed checkpoint, each listed like an imported directory, and
/// the job's id (from the directory's name, or else from the paths the metadata names: a
/// copy of a job directory may have another name). Inline files are written under
/// `staging` (which must be empty or missing).
pub fn subtasks(completed: &Completed, staging: &Path) -> Result<(Vec<Scanned>, String)> {
    let path = completed.metadata_path();
    let bytes = std::fs::read(&path).ctx("read", &path)?;
    let metadata = metadata::parse(&bytes).map_err(|e| {
        Error::Invalid(format!(
            "Flink checkpoint {} of job {}: {e}",
            completed.checkpoint, completed.job
        ))
    })?;
    let mut out = Vec::new();
    let mut job = is_job_id(&completed.job).then(|| completed.job.clone());
    for op in &metadata.operators {
        let mut incremental: Vec<&metadata::IncrementalHandle> = Vec::new();
        for subtask in &op.subtasks {
            match &subtask.managed_keyed {
                Some(KeyedHandle::Incremental(h)) => incremental.push(h),
                Some(KeyedHandle::KeyGroups { .. }) => {
                    return Err(Error::Invalid(format!(
                        "Flink checkpoint {} of job {}: operator {} holds a full (not \
                         RocksDB incremental) keyed snapshot; use state.backend.type: rocksdb \
                         with execution.checkpointing.incremental: true",
                        completed.checkpoint, completed.job, op.id
                    )))
                }
                None => {}
            }
        }
        incremental.sort_by_key(|h| h.key_group_start);
        let operator = operator_dir_name(op);
        for (index, handle) in incremental.into_iter().enumerate() {
            let backend = BackendName::new(&operator, index as u32)?;
            let dir = staging.join(format!("{operator}-{index}"));
            let mut files = Vec::new();
            for (name, stream) in handle.shared.iter().chain(&handle.private) {
                crate::catalog::validate_file_name(name)?;
                if let (None, StreamHandle::File { path, .. }) = (&job, stream) {
                    job = path
                        .rsplit_once("/shared/")
                        .and_then(|(dir, _)| dir.rsplit_once('/'))
                        .map(|(_, id)| id.to_string())
                        .filter(|id| is_job_id(id));
                }
                files.push(file(completed, &backend, &dir, name, stream)?);
            }
            files.push(file(completed, &backend, &dir, FLINK_META, &handle.meta)?);
            files.sort_by(|a, b| a.name.cmp(&b.name));
            if let Some(twice) = files.windows(2).find(|w| w[0].name == w[1].name) {
                return Err(Error::Invalid(format!(
                    "Flink checkpoint {}: backend {backend} lists {} twice",
                    completed.checkpoint, twice[0].name
                )));
            }
            if !files.iter().any(|f| f.name == "CURRENT") {
                return Err(Error::Invalid(format!(
                    "Flink checkpoint {}: backend {backend} has no CURRENT file",
                    completed.checkpoint
                )));
            }
            out.push(Scanned { backend, files });
        }
    }
    Ok((out, job.unwrap_or_else(|| completed.job.clone())))
}

/// One file of a subtask: where its bytes are, and its source.
fn file(
    completed: &Completed,
    backend: &BackendName,
    staging: &Path,
    name: &str,
    stream: &StreamHandle,
) -> Result<ScannedFile> {
    let (path, source) = match stream {
        StreamHandle::Inline(bytes) => {
            crate::fsutil::create_private_dir_all(staging)?;
            let path = staging.join(name);
            std::fs::write(&path, bytes).ctx("write", &path)?;
            let hash = blake3::hash(bytes).to_hex();
            (path, Some(format!("inline:{hash}")))
        }
        StreamHandle::File { path, size } => {
            let path = resolve(completed, path)?;
            let meta = std::fs::metadata(&path).ctx("stat", &path)?;
            if meta.len() != *size {
                return Err(Error::Invalid(format!(
                    "{} has {} bytes, the checkpoint's metadata says {size}",
                    path.display(),
                    meta.len()
                )));
            }
            (path, None)
        }
        StreamHandle::Relative { path, .. } => (
            completed
                .job_dir
                .join(format!("chk-{}", completed.checkpoint))
                .join(path),
            None,
        ),
        StreamHandle::Segment { .. } | StreamHandle::EmptySegment => {
            return Err(Error::Invalid(format!(
                "Flink checkpoint {} of job {}: backend {backend} uses file merging \
                 (execution.checkpointing.file-merging.enabled), which ckptfs does not import",
                completed.checkpoint, completed.job
            )))
        }
    };
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
/// `/<job-id>/shared/` (or `taskowned/`) under the job directory given (a moved copy).
fn resolve(completed: &Completed, uri: &str) -> Result<PathBuf> {
    let local = uri
        .strip_prefix("file://")
        .or_else(|| uri.strip_prefix("file:"))
        .ok_or_else(|| {
            Error::Invalid(format!(
                "Flink checkpoint {} refers to {uri}: ckptfs imports checkpoints on a local \
                 filesystem (file://) only, for now",
                completed.checkpoint
            ))
        })?;
    let path = PathBuf::from(local);
    if path.is_file() {
        return Ok(path);
    }
    for dir in ["shared", "taskowned"] {
        if let Some((_, rest)) = local.rsplit_once(&format!("/{dir}/")) {
            let moved = completed.job_dir.join(dir).join(rest);
            if moved.is_file() {
                return Ok(moved);
            }
        }
    }
    Err(Error::NotFound(format!(
        "Flink checkpoint {} of job {} refers to {uri}, which is neither there nor under {}",
        completed.checkpoint,
        completed.job,
        completed.job_dir.display()
    )))
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
        let found = completed(&fixture).unwrap();
        assert_eq!(
            found.iter().map(|c| c.checkpoint).collect::<Vec<_>>(),
            [4, 5, 6]
        );
        let staging = tempfile::tempdir().unwrap();
        let (backends, job) = subtasks(&found[2], staging.path()).unwrap();
        assert_eq!(job, "a312c9034e3e0d2016dae60431b4c9dc");
        let names: Vec<String> = backends.iter().map(|b| b.backend.to_string()).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names.contains(&"counter/0".to_string()), "{names:?}");
        assert!(names.contains(&"counter/1".to_string()), "{names:?}");
        for b in &backends {
            assert!(b.files.iter().any(|f| f.name == FLINK_META));
            for f in &b.files {
                f.check_unchanged().unwrap();
            }
        }
    }
}
