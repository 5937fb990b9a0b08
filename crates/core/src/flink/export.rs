//! A checkpoint imported from Flink, given back to Flink (`ckptfs export-flink`): a Flink
//! checkpoint directory, `DEST/<job-id>/chk-<N>/`, whose `_metadata` is the one Flink wrote
//! with every file named relative to `chk-<N>/` (relocatable: the directory restores
//! wherever it is moved or copied, another disk or a bucket), and those files:
//!
//! - a file Flink named by absolute path (`shared/<uuid>`, the RocksDB files and whatever
//!   else it uploaded) goes to `DEST/<job-id>/shared/<last part of its path>`, named
//!   `../shared/<file>`;
//! - a segment of a file-merging checkpoint (FLIP-306) becomes a file of its own there,
//!   `shared/<physical file>-<start>-<size>`, and its handle a plain file's (the exported
//!   checkpoint restores with file merging on or off);
//! - a file named relative to its checkpoint's directory goes there, `chk-<N>/<path>`;
//! - files Flink inlined into `_metadata` stay there.
//!
//! Where each file is in the store is what the import wrote ([`super::import::layout`]):
//! a subtask's files in its backend under their RocksDB names, the job's own files (and
//! `_metadata`) in [`super::import::job_backend`]. Flink restores the job from the
//! directory (`execution.state-recovery.path`); it never needs ckptfs to read it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::import::{job_backend, layout, METADATA};
use super::metadata::{self, StreamHandle};
use crate::error::{Error, ErrorKind, IoContext, Result};
use crate::names::BackendName;
use crate::source::MAX_METADATA_BYTES;
use crate::store::s3::{Remote, MAX_COPY};

/// Where the files of one checkpoint are read from: a store, or a mount's `cp-N/`.
pub trait CheckpointFiles: Sync {
    /// Write file `name` of `backend` to `out`; its length. An error may come after bytes
    /// went out (a store finds a checksum mismatch at the file's end): what `out` received
    /// is then not the file.
    fn write_to(&self, backend: &BackendName, name: &str, out: &mut dyn Write) -> Result<u64>;

    /// Where file `name` of `backend` is stored whole on object storage: the bucket's
    /// connection, the object's key there and the file's size, for an export that copies
    /// it inside the object store. `None` (the default) where the file is streamed: a local
    /// store, a mount, a file stored as chunks.
    fn stored_remotely(
        &self,
        _backend: &BackendName,
        _name: &str,
    ) -> Option<(std::sync::Arc<Remote>, String, u64)> {
        None
    }

    /// Clone file `name` of `backend` into `out` (a new, empty file), checked, where the
    /// two share a filesystem that shares extents (a local store on btrfs or XFS); its
    /// length. `Ok(None)` (the default) where it cannot: then it is written out.
    fn clone_into(
        &self,
        _backend: &BackendName,
        _name: &str,
        _out: &std::fs::File,
    ) -> Result<Option<u64>> {
        Ok(None)
    }
}

/// The files of checkpoint N as a mount shows them (`MOUNTPOINT/cp-N/`).
pub struct MountedCheckpoint(pub PathBuf);

impl CheckpointFiles for MountedCheckpoint {
    fn write_to(&self, backend: &BackendName, name: &str, out: &mut dyn Write) -> Result<u64> {
        let from = self.0.join(backend.rel_path()).join(name);
        let mut input = std::fs::File::open(&from).ctx("open", &from)?;
        std::io::copy(&mut input, out).ctx("copy", &from)
    }
}

/// File `name` of `backend` copied by `stored` to `to` (a new file), durably; its length.
fn copy_to_file(
    stored: &dyn CheckpointFiles,
    backend: &BackendName,
    name: &str,
    to: &Path,
) -> Result<u64> {
    let file = crate::fsutil::create_new_private()
        .open(to)
        .ctx("create", to)?;
    if let Some(n) = stored.clone_into(backend, name, &file)? {
        file.sync_all().ctx("fsync", to)?;
        return Ok(n);
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let n = stored.write_to(backend, name, &mut out)?;
    let file = out
        .into_inner()
        .map_err(|e| Error::io(format!("write {}", to.display()), e.into_error()))?;
    file.sync_all().ctx("fsync", to)?;
    Ok(n)
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Exported {
    /// The Flink checkpoint directory (holding `_metadata`): what Flink restores from.
    pub path: PathBuf,
    /// The Flink job id (32 hex).
    pub job: String,
    /// The Flink checkpoint's id.
    pub checkpoint: u64,
    /// Files written (`_metadata` included) and their bytes.
    pub files: u64,
    /// The bytes of those files.
    pub bytes: u64,
    /// Of those files, how many the object store copied itself (CopyObject from the store's
    /// object into the same bucket): none of their bytes passed through this host.
    pub copied_in_store: u64,
}

/// What an export writes under `<job-id>/`: each file's path there and where in the
/// checkpoint it is read from, and the `_metadata` rewritten to name them.
struct ExportPlan {
    /// `chk-<N>`.
    chk: String,
    /// Each destination once (one file may be named by several subtasks after a rescale).
    copies: BTreeMap<PathBuf, (BackendName, String)>,
    /// `chk-<N>/_metadata`'s bytes.
    metadata: Vec<u8>,
}

/// Read Flink checkpoint `checkpoint`'s `_metadata` from `stored` (at most
/// [`MAX_METADATA_BYTES`]) and plan its export.
fn plan_export(stored: &dyn CheckpointFiles, checkpoint: u64) -> Result<ExportPlan> {
    let mut bytes = Vec::new();
    let mut bounded = Bounded {
        out: &mut bytes,
        left: MAX_METADATA_BYTES,
    };
    stored
        .write_to(&job_backend(), METADATA, &mut bounded)
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => Error::NotFound(format!(
                "the checkpoint holds no Flink _metadata (imported before ckptfs kept it: import \
             the Flink checkpoint again into a new store): {e}"
            )),
            _ => e,
        })?;
    let parsed = parse_for(&bytes, checkpoint)?;
    let layout = layout(&parsed)?;
    let job_backend = job_backend();
    let chk = format!("chk-{checkpoint}");
    let mut copies: BTreeMap<PathBuf, (BackendName, String, String)> = BTreeMap::new();
    let mut edits = metadata::file_merging_undone(&parsed);
    let mut edited: std::collections::HashSet<metadata::Span> =
        edits.iter().map(|(s, _)| s.clone()).collect();
    for (backend, name, stream) in homes(&layout, &job_backend) {
        let Some((rel, whole, handle)) = exported_as(stream, &chk)? else {
            continue;
        };
        if let Some((span, handle)) = handle {
            if edited.insert(span.clone()) {
                edits.push((span, handle));
            }
        }
        match copies.get(&rel) {
            Some((_, _, known)) if *known != whole => {
                return Err(Error::Invalid(format!(
                    "{whole} and {known} would both be exported as {}",
                    rel.display()
                )))
            }
            Some(_) => {}
            None => {
                copies.insert(rel, (backend.clone(), name.clone(), whole));
            }
        }
    }
    let metadata = metadata::rewrite(&bytes, edits)?;
    Ok(ExportPlan {
        chk,
        copies: copies
            .into_iter()
            .map(|(rel, (backend, name, _))| (rel, (backend, name)))
            .collect(),
        metadata,
    })
}

/// A writer into `out` that refuses more than `left` bytes.
struct Bounded<'a> {
    out: &'a mut Vec<u8>,
    left: u64,
}

impl Write for Bounded<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("a Flink _metadata is at most {MAX_METADATA_BYTES} bytes"),
            ));
        }
        self.left -= buf.len() as u64;
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Write checkpoint `checkpoint` of Flink job `job`, whose files `stored` reads, as a Flink
/// checkpoint directory under `dest` (missing or empty; a link on its path followed only
/// where a source's would be, else EACCES), owned by `dest`'s owner (its parent's when it
/// is missing). Everything is written into a temporary directory beside
/// `dest`, through a descriptor of it, and renamed into place last: a failed export leaves
/// nothing.
pub fn export(
    stored: &dyn CheckpointFiles,
    job: &str,
    checkpoint: u64,
    dest: &Path,
) -> Result<Exported> {
    if !super::import::is_job_id(job) {
        return Err(Error::Invalid(format!("{job:?} is not a Flink job id")));
    }
    // DEST is resolved as a source is: a link on its way is followed only where nobody but
    // root (or this user) can have put it (the Flink user may own a directory on the way,
    // and could otherwise point the export anywhere). Everything is then done in DEST's
    // parent through a descriptor of it, whatever is renamed or swapped in on the way.
    let (dest, held_parent) = resolve_dest(dest)?;
    let parent = dest
        .parent()
        .expect("an absolute path that is not / has a parent");
    let name = dest.file_name().expect("a resolved DEST has a last name");
    let at_parent = fd_path(&held_parent);
    let dest_at = at_parent.join(name);
    if !crate::fsutil::is_empty_or_missing(&dest_at)? {
        return Err(Error::NotEmpty(dest.to_path_buf()));
    }
    let owner = owner_of(&dest_at, &at_parent)?;
    let tmp = tempfile::Builder::new()
        .prefix(".ckptfs-export-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(&at_parent)
        .ctx("create a directory in", parent)?;
    let tmp_shown = parent.join(
        tmp.path()
            .file_name()
            .expect("a temporary directory's name"),
    );
    // Written through a descriptor of the directory just made, never by its path: DEST's
    // parent may be writable by others (the Flink user), who could rename it and plant a
    // link in its place while the files are copied. Inside it (0700, ours) nobody else
    // can create anything.
    let held = HeldDir::open(tmp.path())?;
    crate::failpoint!("export::before-copy");
    let base = held.path();
    let plan = plan_export(stored, checkpoint)?;
    let chk = &plan.chk;
    let (tmp_job, job_dir) = (base.join(job), dest.join(job));
    for dir in [tmp_job.join("shared"), tmp_job.join(chk)] {
        std::fs::create_dir_all(&dir).ctx("create", &dir)?;
    }
    let mut out = Exported {
        path: job_dir.join(chk),
        job: job.to_string(),
        checkpoint,
        files: 0,
        bytes: 0,
        copied_in_store: 0,
    };
    for (rel, (backend, name)) in &plan.copies {
        let to = tmp_job.join(rel);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).ctx("create", dir)?;
        }
        out.bytes += copy_to_file(stored, backend, name, &to)?;
        out.files += 1;
    }
    crate::fsutil::write_atomic(&tmp_job.join(chk).join(METADATA), &plan.metadata)?;
    out.files += 1;
    out.bytes += plan.metadata.len() as u64;
    for dir in [tmp_job.join("shared"), tmp_job.join(chk), tmp_job.clone()] {
        crate::fsutil::fsync_dir(&dir)?;
    }
    // Flink, which reads the directory, runs as DEST's owner. Everything below is given
    // while the directory is still this process's (0700: nobody else can change what is
    // in it meanwhile), the directory itself last.
    if let Some((uid, gid)) = owner {
        chown_below(&base, uid, gid)?;
        std::os::unix::fs::fchown(&held.dir, Some(uid), Some(gid))
            .ctx("change the owner of", &tmp_shown)?;
    }
    if !held.is_at(tmp.path()) {
        // What was written goes, wherever it was moved.
        held.empty();
        return Err(Error::Invalid(format!(
            "{} changed during the export: {} is no longer the directory ckptfs wrote \
             (another user renamed it); nothing was exported",
            parent.display(),
            tmp_shown.display()
        )));
    }
    if std::fs::symlink_metadata(&dest_at).is_ok() {
        std::fs::remove_dir(&dest_at).ctx("replace the empty directory", &dest)?;
    }
    let tmp = tmp.keep();
    std::fs::rename(&tmp, &dest_at).ctx("rename into place", &dest)?;
    crate::fsutil::fsync_dir(&at_parent)?;
    Ok(out)
}

/// Objects an export to object storage uploads at once.
const UPLOADS_AT_ONCE: usize = 8;

/// [`export`] to object storage: the same relocatable directory, as objects under
/// `s3://BUCKET/PREFIX/<job-id>/...` (`prefix` without its slashes, "" for the whole
/// bucket), which must hold none. Each file streams from `stored` into its upload
/// (verified as it is read; nothing is written to a local disk), `_metadata` last: until
/// it is there Flink sees no checkpoint, and a failed export removes what it uploaded.
pub fn export_to_s3(
    stored: &dyn CheckpointFiles,
    job: &str,
    checkpoint: u64,
    remote: &Remote,
    prefix: &str,
) -> Result<Exported> {
    if !super::import::is_job_id(job) {
        return Err(Error::Invalid(format!("{job:?} is not a Flink job id")));
    }
    let prefix = prefix.trim_matches('/');
    let under = |rel: &str| -> String {
        if prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{prefix}/{rel}")
        }
    };
    let url = |rel: &str| format!("s3://{}/{}", remote.bucket(), under(rel));
    if !remote.list_keys(&under(""), false)?.is_empty() {
        return Err(Error::NotEmpty(PathBuf::from(url(""))));
    }
    let plan = plan_export(stored, checkpoint)?;
    let key_of = |rel: &Path| -> Result<String> {
        let rel = rel
            .to_str()
            .ok_or_else(|| Error::Invalid(format!("{} is not valid UTF-8", rel.display())))?;
        Ok(under(&format!("{job}/{rel}")))
    };
    let copies: Vec<(&PathBuf, &(BackendName, String))> = plan.copies.iter().collect();
    // The first failure stops what has not started (it is all removed anyway).
    let given_up = std::sync::atomic::AtomicBool::new(false);
    // Each file's bytes and whether the object store copied it, or `None` if it was not
    // started.
    let upload = |(rel, (backend, name)): &(&PathBuf, &(BackendName, String))| -> Result<
        Option<(u64, bool)>,
    > {
        if given_up.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        let key = key_of(rel)?;
        let in_store = stored
            .stored_remotely(backend, name)
            .filter(|(from, _, size)| remote.can_copy_from(from) && *size <= MAX_COPY);
        let uploaded = match in_store {
            Some((from, from_key, size)) => remote
                .copy_from(&from, &from_key, &key, size, None)
                .map(|_| (size, true)),
            None => {
                let mut written = 0;
                remote
                    .upload_from(&key, |out| {
                        written = stored.write_to(backend, name, out)?;
                        Ok(())
                    })
                    .map(|()| (written, false))
            }
        };
        if uploaded.is_err() {
            given_up.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        uploaded.map(Some)
    };
    let uploaded = crate::fsutil::parallel_map(&copies, UPLOADS_AT_ONCE, upload);
    let metadata_rel = Path::new(&plan.chk).join(METADATA);
    let mut out = Exported {
        path: PathBuf::from(url(&format!("{job}/{}", plan.chk))),
        job: job.to_string(),
        checkpoint,
        files: 0,
        bytes: 0,
        copied_in_store: 0,
    };
    let mut failed = None;
    for result in uploaded {
        match result {
            Ok(Some((bytes, in_store))) => {
                out.files += 1;
                out.bytes += bytes;
                out.copied_in_store += u64::from(in_store);
            }
            Ok(None) => {}
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if failed.is_none() {
        let uploaded = key_of(&metadata_rel).and_then(|key| {
            remote.upload_from(&key, |out| {
                out.write_all(&plan.metadata)
                    .map_err(|e| Error::io("write the _metadata", e))
            })
        });
        match uploaded {
            Ok(()) => {
                out.files += 1;
                out.bytes += plan.metadata.len() as u64;
            }
            Err(e) => failed = Some(e),
        }
    }
    if let Some(e) = failed {
        // `_metadata` first (its upload may have landed though it failed): a checkpoint
        // half removed must not look complete.
        let mut left = Vec::new();
        if let Ok(key) = key_of(&metadata_rel) {
            if let Err(e) = remote.delete_key(&key) {
                left.push((key, e));
            }
        }
        let keys: Vec<String> = plan
            .copies
            .keys()
            .filter_map(|rel| key_of(rel).ok())
            .collect();
        left.extend(remote.delete_keys(&keys));
        for (key, e) in &left {
            log::warn!(
                "s3://{}/{key} was uploaded and could not be removed: {e}",
                remote.bucket()
            );
        }
        return Err(Error::Context {
            context: format!("export to {}", url("")),
            source: Box::new(e),
        });
    }
    Ok(out)
}

/// The `_metadata` a mount shows at the top of checkpoint `checkpoint`'s directory
/// `cp_dir` (`MOUNTPOINT/cp-M`, absolute): Flink's own (`bytes`, as the import stored it)
/// with every file it names pointing at the mount's copy, so that Flink restores from the
/// mount with nothing copied first (`execution.state-recovery.path: file://MOUNTPOINT/cp-M`).
/// A file Flink named by absolute path becomes `file:<cp_dir>/<operator>/<subtask>/<name>`;
/// one named relative to its checkpoint's directory (resolved by Flink against the
/// directory holding `_metadata`) becomes `<operator>/<subtask>/<name>`; inline state
/// stays inline. Refused as [`export`] refuses: a `_metadata` of another Flink checkpoint
/// than the label says, a layout ckptfs does not import.
pub fn metadata_for_mount(bytes: &[u8], checkpoint: u64, cp_dir: &Path) -> Result<Vec<u8>> {
    metadata_naming_tree(bytes, checkpoint, Some(cp_dir))
}

/// The `_metadata` of a checkpoint's tree wherever it is (`cp-M/` of the S3 door, or a
/// copy of it): Flink's own with every file it names, however Flink named it, named
/// relative to the directory holding `_metadata`, `<operator>/<subtask>/<name>` (the tree
/// [`metadata_for_mount`] names by absolute path). Relocatable as [`export`]'s is: the
/// directory restores wherever it is copied, a local disk or a bucket.
pub fn metadata_relocatable(bytes: &[u8], checkpoint: u64) -> Result<Vec<u8>> {
    metadata_naming_tree(bytes, checkpoint, None)
}

/// Flink's `_metadata` naming the files of the checkpoint's tree: by absolute path below
/// `cp_dir` where one is given, else relative to the tree's top.
fn metadata_naming_tree(bytes: &[u8], checkpoint: u64, cp_dir: Option<&Path>) -> Result<Vec<u8>> {
    let parsed = parse_for(bytes, checkpoint)?;
    let layout = layout(&parsed)?;
    let job_backend = job_backend();
    let homes = homes(&layout, &job_backend);
    let mut edits = metadata::file_merging_undone(&parsed);
    let mut edited: std::collections::HashSet<metadata::Span> =
        edits.iter().map(|(s, _)| s.clone()).collect();
    for (backend, name, stream) in homes {
        crate::catalog::validate_file_name(name)?;
        let rel = backend.rel_path().join(name);
        let relative = |size: u64| metadata::relative_handle(&rel.display().to_string(), size);
        let edit = match (stream, cp_dir) {
            (
                StreamHandle::File { span, size, .. } | StreamHandle::Segment { span, size, .. },
                Some(cp_dir),
            ) => {
                let absolute = format!("file:{}", cp_dir.join(&rel).display());
                (span.clone(), metadata::file_handle(&absolute, *size)?)
            }
            (
                StreamHandle::File { span, size, .. }
                | StreamHandle::Segment { span, size, .. }
                | StreamHandle::Relative { span, size, .. },
                _,
            ) => (span.clone(), relative(*size)?),
            _ => continue,
        };
        // A file named by several subtasks (after a rescale) is one handle, rewritten once.
        if edited.insert(edit.0.clone()) {
            edits.push(edit);
        }
    }
    metadata::rewrite(bytes, edits)
}

/// Where an export puts the file a handle names, below the job's directory; what it is in
/// full (to tell two files that would be exported under one name); and the handle the
/// exported `_metadata` names it by, if it is not Flink's own. `None` for state
/// `_metadata` holds itself (inline, an empty segment).
///
/// The layout is relocatable: every file is named relative to the checkpoint's directory
/// (the one holding `_metadata`), so that the job's directory restores wherever it is
/// moved or copied. Files Flink named by absolute path (its `shared/` ones), and segments
/// of a file-merging checkpoint (each its own file now), go to `shared/` beside `chk-N/`,
/// named `../shared/<file>`; Flink resolves that against the checkpoint's directory. A
/// relative file stays where Flink put it.
#[allow(clippy::type_complexity)]
fn exported_as(
    stream: &StreamHandle,
    chk: &str,
) -> Result<Option<(PathBuf, String, Option<(metadata::Span, Vec<u8>)>)>> {
    let shared = |file: String, size: u64, span: &metadata::Span| -> Result<_> {
        crate::catalog::validate_file_name(&file)?;
        let handle = metadata::relative_handle(&format!("../shared/{file}"), size)?;
        Ok(Path::new("shared").join(file)).map(|rel| (rel, Some((span.clone(), handle))))
    };
    Ok(Some(match stream {
        StreamHandle::File {
            path, size, span, ..
        } => {
            let file = path.rsplit('/').next().unwrap_or(path).to_string();
            let (rel, handle) = shared(file, *size, span)?;
            (rel, path.clone(), handle)
        }
        StreamHandle::Segment { span, size, .. } => {
            let (file, whole) =
                super::import::job_file_name(stream).expect("a segment names a file");
            let (rel, handle) = shared(file, *size, span)?;
            (rel, whole, handle)
        }
        StreamHandle::Relative { path, .. } => {
            // Flink's own (a plain name in chk-N/), or an earlier export's `../shared/<file>`.
            let rel = match path.strip_prefix("../") {
                Some(rest) => PathBuf::from(rest),
                None => Path::new(chk).join(path),
            };
            for part in rel.iter() {
                crate::catalog::validate_file_name(&part.to_string_lossy())?;
            }
            (rel, path.clone(), None)
        }
        StreamHandle::Inline(_) | StreamHandle::EmptySegment => return Ok(None),
    }))
}

/// The stored `_metadata` of Flink checkpoint `checkpoint`, parsed: refused if it is
/// another checkpoint's than the label says.
fn parse_for(bytes: &[u8], checkpoint: u64) -> Result<metadata::Metadata> {
    let parsed = metadata::parse(bytes)?;
    if parsed.checkpoint_id != checkpoint {
        return Err(Error::Corrupt(format!(
            "the stored _metadata is of Flink checkpoint {}, the checkpoint's label says \
             {checkpoint}",
            parsed.checkpoint_id
        )));
    }
    Ok(parsed)
}

/// Where each file `_metadata` names is in the store: the backend, the name there, and
/// the handle naming it (every subtask's, then the job's own files in `job_backend`).
fn homes<'a>(
    layout: &'a super::import::Layout<'a>,
    job_backend: &'a BackendName,
) -> impl Iterator<Item = (&'a BackendName, &'a String, &'a StreamHandle)> + 'a {
    layout
        .subtasks
        .iter()
        .flat_map(|(backend, files)| files.iter().map(move |(n, s)| (backend, n, *s)))
        .chain(
            layout
                .job_files
                .iter()
                .map(move |(n, s)| (job_backend, n, *s)),
        )
}

/// A directory held open: its files are reached through `/proc/self/fd/N`, whatever is at
/// its path meanwhile.
struct HeldDir {
    dir: std::fs::File,
}

impl HeldDir {
    /// The directory `path` this process just made: refused unless it is a directory of
    /// this user's, private and empty (not one swapped in for it).
    fn open(path: &Path) -> Result<HeldDir> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .ctx("open", path)?;
        let meta = dir.metadata().ctx("stat", path)?;
        let held = HeldDir { dir };
        let empty = std::fs::read_dir(held.path())
            .ctx("read directory", path)?
            .next()
            .is_none();
        if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0 || !empty {
            return Err(Error::Invalid(format!(
                "{} is not the private directory ckptfs just made (another user replaced \
                 it); nothing was exported",
                path.display()
            )));
        }
        Ok(held)
    }

    fn path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd()))
    }

    /// Remove everything in it (best effort: it is being given up).
    fn empty(&self) {
        if let Ok(entries) = std::fs::read_dir(self.path()) {
            for entry in entries.flatten() {
                let _ = match entry.file_type() {
                    Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(entry.path()),
                    _ => std::fs::remove_file(entry.path()),
                };
            }
        }
    }

    /// Whether `path` is still this directory (not a link or another directory put there).
    fn is_at(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.dir.metadata(), std::fs::symlink_metadata(path)) {
            (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
            _ => false,
        }
    }
}

/// Whose the export is: DEST's owner (an empty directory made for it), else its parent's;
/// `None` if that is this process's user (nothing to change).
fn owner_of(dest: &Path, parent: &Path) -> Result<Option<(u32, u32)>> {
    use std::os::unix::fs::MetadataExt;
    let of = if dest.exists() { dest } else { parent };
    let meta = std::fs::metadata(of).ctx("stat", of)?;
    let me = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    Ok(Some((meta.uid(), meta.gid())).filter(|owner| *owner != me))
}

/// Give everything below `dir` (written by this export: no links) to `uid:gid`.
fn chown_below(dir: &Path, uid: u32, gid: u32) -> Result<()> {
    for entry in std::fs::read_dir(dir).ctx("read directory", dir)? {
        let entry = entry.ctx("read directory", dir)?;
        let path = entry.path();
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid)).ctx("change the owner of", &path)?;
        if entry.file_type().ctx("stat", &path)?.is_dir() {
            chown_below(&path, uid, gid)?;
        }
    }
    Ok(())
}

/// Where `dest` is, and a path descriptor of its parent: `dest` made absolute and resolved
/// with the rule sources follow ([`crate::source::local::open_trusted_dir`]), its last
/// component allowed to be missing (a link there is followed by that rule too).
fn resolve_dest(dest: &Path) -> Result<(PathBuf, std::os::fd::OwnedFd)> {
    let mut given = std::path::absolute(dest).ctx("resolve", dest)?;
    if std::fs::symlink_metadata(&given).is_ok_and(|m| m.file_type().is_symlink()) {
        given = crate::source::local::resolve_trusted(&given)?;
    }
    let name = given
        .file_name()
        .filter(|n| *n != "..")
        .ok_or_else(|| Error::Invalid(format!("{} names no directory", dest.display())))?
        .to_os_string();
    let parent = given.parent().unwrap_or(Path::new("/"));
    let (parent, held) = crate::source::local::open_trusted_dir(parent)?;
    Ok((parent.join(name), held))
}

/// The path that reaches what `fd` is (`/proc/self/fd/N`), whatever is at its path now.
fn fd_path(fd: &std::os::fd::OwnedFd) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The refusal of a checkpoint that is no Flink checkpoint.
pub fn not_flink(id: u64) -> Error {
    Error::Invalid(format!(
        "checkpoint {id} was not imported from Flink (ckptfs import-flink or mount --flink): \
         there is no Flink checkpoint to give back"
    ))
}
