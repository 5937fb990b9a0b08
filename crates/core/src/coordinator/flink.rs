//! Importing the completed checkpoints of Flink jobs (`ckptfs import-flink`, and a daemon
//! that follows a job directory or a checkpoint root with `mount --flink`: a job restarted
//! from a checkpoint writes a new job directory beside the old one, which is followed
//! without a restart). Job by job, in the order the jobs began, each checkpoint newer than
//! the newest the store holds from *that* job (for a follower also an older one that failed
//! to import, while Flink has it),
//! and never one the store held and dropped ([`crate::catalog::StoreMeta::flink_dropped`]:
//! a user's drop sticks), becomes one checkpoint, labelled with the job and checkpoint id, whose backends
//! are the job's subtasks and its own files ([`crate::flink::import`]): nothing else is
//! carried over, so an operator the job no longer has is not in its later checkpoints.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{CheckpointPlan, Engine, ImportReport};
use crate::catalog::{FlinkLabel, Manifest};
use crate::error::{Error, ErrorKind, IoContext, Result};
use crate::flink::import::{self as flink, FlinkSource};
use crate::flink::listing::Listing;
use crate::flink::plan::{Plan, Planned};
use crate::names::BackendName;
use crate::source::FileStamp;

/// The pause before a follower tries again a checkpoint that failed otherwise than by a
/// refusal; it doubles with each failure, up to [`MAX_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause between tries of a checkpoint that keeps failing.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// What a follower remembers between its looks: what it listed of Flink's directories
/// ([`Listing`]), and the Flink checkpoints (job directory's name, checkpoint id) that
/// failed to import, tried again while Flink has them: one refused for what it is
/// ([`refuses`]) once its `_metadata` changes (size or modification time), one that failed
/// otherwise (an I/O error, a busy engine) after a pause that doubles from [`FIRST_PAUSE`]
/// to [`MAX_PAUSE`].
#[derive(Debug, Default)]
pub struct Retries {
    failed: BTreeMap<(String, u64), Failure>,
    /// The newest completed checkpoint the last look found (job directory's name, id): of
    /// a root's jobs, the newest checkpoint of the job that began last.
    newest: Option<(String, u64)>,
    /// When Flink wrote that checkpoint's `_metadata`, where the source says.
    newest_time: Option<std::time::SystemTime>,
    listing: Listing,
    /// The job id read from the `_metadata` of each checkpoint of a job directory not named
    /// by its id (a copy under another name), with that file's stamp: while the stamp is
    /// the same, a look asks whether the store holds the checkpoint without reading it.
    jobs: HashMap<(String, u64), (FileStamp, String)>,
}

/// Why a checkpoint failed to import, and so when it is tried again.
#[derive(Debug)]
enum Failure {
    /// Refused for what it is: read again once its `_metadata` is no longer the one seen.
    Refused {
        seen: Option<FileStamp>,
        reason: String,
    },
    /// Failed otherwise, `attempts` times in a row: tried again at `next`.
    Failed { attempts: u32, next: Instant },
}

impl Retries {
    /// The newest completed checkpoint Flink had at the last look that could list them
    /// (job directory's name, checkpoint id): what a follower's lag is measured against.
    pub fn newest_completed(&self) -> Option<(&str, u64)> {
        self.newest.as_ref().map(|(job, id)| (job.as_str(), *id))
    }

    /// [`Retries::newest_completed`] with its job id where known (else the job
    /// directory's name) and its time, for the follower's health.
    fn newest_look(&self) -> Option<(String, u64, Option<std::time::SystemTime>)> {
        let (dir, id) = self.newest.clone()?;
        let job = match self.jobs.get(&(dir.clone(), id)) {
            Some((_, job)) => job.clone(),
            None => dir,
        };
        Some((job, id, self.newest_time))
    }

    /// The checkpoints refused for what they are, oldest job and id first.
    pub fn refused(&self) -> Vec<FlinkRefused> {
        self.failed
            .iter()
            .filter_map(|((job, checkpoint), failure)| match failure {
                Failure::Refused { seen, reason } => Some(FlinkRefused {
                    job: job.clone(),
                    checkpoint: *checkpoint,
                    metadata_bytes: seen.map(|s| s.size),
                    reason: reason.clone(),
                }),
                Failure::Failed { .. } => None,
            })
            .collect()
    }
}

/// The pause after the `attempts`th failure in a row (1: the first).
fn pause(attempts: u32) -> Duration {
    FIRST_PAUSE
        .saturating_mul(1 << attempts.saturating_sub(1).min(16))
        .min(MAX_PAUSE)
}

/// Whether `error` refuses a checkpoint for what it is, so that reading the same
/// `_metadata` again gives the same answer: what the file says ([`Error::Invalid`]: a format,
/// layout or file name ckptfs does not import, a file of another size than it names) or a
/// path the source's rules refuse ([`Error::Refused`]: outside the roots, a link). Anything
/// else (I/O, object storage, a busy engine) may pass at a later try.
pub fn refuses(error: &Error) -> bool {
    matches!(error.kind(), ErrorKind::Invalid | ErrorKind::Refused)
}

/// A Flink checkpoint a follower refuses, as `.ckptfs/status` shows it (`flink_refused`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlinkRefused {
    /// The job directory's name (the job id, unless it is a copy under another name).
    pub job: String,
    /// The Flink checkpoint's id.
    pub checkpoint: u64,
    /// The size of its `_metadata` when it was refused (`null`: not a regular file).
    pub metadata_bytes: Option<u64>,
    /// Why.
    pub reason: String,
}

/// When a follower tries a failed import again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Once its `_metadata` changes (size or modification time): it was refused for what
    /// it is.
    WhenChanged,
    /// After this pause.
    After(Duration),
}

/// What importing one Flink checkpoint gave.
pub struct FlinkImport {
    /// The Flink job id; for a failed import, the name of the job's directory (its id,
    /// unless it is a copy under another name).
    pub job: String,
    /// The Flink checkpoint's id.
    pub checkpoint: u64,
    /// The committed checkpoint and what each of its imports read and stored, or why the
    /// import failed.
    pub result: Result<(Arc<Manifest>, Vec<ImportReport>)>,
    /// For a failed import, when a follower tries it again.
    pub retry: Option<Retry>,
}

impl Engine {
    /// Import each checkpoint of `plan` (the completed checkpoints of the Flink jobs under
    /// a source, one job's directory or a root of any number of jobs, [`Plan::checked`])
    /// that is newer than the newest the store holds from its job and that the store did
    /// not hold and drop: job by job in the order they began, each job's oldest first
    /// ([`flink::completed`]), the `_metadata` the plan read. The first failure ends the
    /// import.
    pub fn import_flink(&self, plan: &Plan) -> Vec<FlinkImport> {
        self.import_flink_with(plan, false, &mut Retries::default(), Instant::now())
    }

    /// One look of a follower (`mount --flink`): [`Engine::import_flink`], each failure
    /// reported and the later ones still imported. A checkpoint that failed is tried again
    /// while Flink still has it, though a newer one was imported meanwhile: one refused for
    /// what it is once its `_metadata` changes, one that failed otherwise after a growing
    /// pause (`retries` remembers them, and the listing, [`Retries`]). The checkpoints
    /// refused are shown in status ([`Engine::flink_refused`]).
    pub fn follow_flink(
        &self,
        src: &FlinkSource,
        retries: &mut Retries,
    ) -> Result<Vec<FlinkImport>> {
        self.follow_flink_at(src, retries, Instant::now())
    }

    /// [`Engine::follow_flink`] at time `now`.
    pub(crate) fn follow_flink_at(
        &self,
        src: &FlinkSource,
        retries: &mut Retries,
        now: Instant,
    ) -> Result<Vec<FlinkImport>> {
        // A follower may look before the job has written anything.
        let imports = flink::completed_listed(src, &mut retries.listing).map(|completed| {
            let plan = Plan::listed(completed.unwrap_or_default());
            self.import_flink_with(&plan, true, retries, now)
        });
        *crate::fsutil::lock(&self.inner.flink_refused) = retries.refused();
        if imports.is_ok() {
            let newest = retries.newest_look().map(|(job, checkpoint, time)| {
                let time_unix_ms = time.and_then(super::follower::unix_ms);
                // The follower's own rule: nothing left to import for it.
                let caught_up = self.skips_flink(&job, checkpoint, time_unix_ms, false);
                let newest = super::follower::FlinkNewest {
                    job,
                    checkpoint,
                    time_unix_ms,
                };
                (newest, caught_up)
            });
            self.note_look(newest);
        }
        imports
    }

    /// The Flink checkpoints the follower refuses, as its last look left them.
    pub fn flink_refused(&self) -> Vec<FlinkRefused> {
        crate::fsutil::lock(&self.inner.flink_refused).clone()
    }

    /// The checkpoints of `plan`, in order; without `keep_going`, until the first failure.
    fn import_flink_with(
        &self,
        plan: &Plan,
        keep_going: bool,
        retries: &mut Retries,
        now: Instant,
    ) -> Vec<FlinkImport> {
        // A checkpoint's files to read are held open while it is imported: a large job's
        // first checkpoint has thousands.
        crate::fsutil::raise_open_files_limit();
        let completed = plan.checkpoints();
        if let Some(c) = completed.last().map(|p| &p.completed) {
            retries.newest = Some((c.job.clone(), c.checkpoint));
            retries.newest_time = c.seen.and_then(|s| s.modified);
        }
        // What Flink no longer has is not tried again.
        let listed = |key: &(String, u64)| {
            completed
                .iter()
                .any(|p| (&p.completed.job, p.completed.checkpoint) == (&key.0, key.1))
        };
        retries.failed.retain(|key, _| listed(key));
        retries.jobs.retain(|key, _| listed(key));
        let mut out = Vec::new();
        for planned in completed {
            let checkpoint = &planned.completed;
            let key = (checkpoint.job.clone(), checkpoint.checkpoint);
            let attempts = match retries.failed.get(&key) {
                // Not read again: the same file says the same.
                Some(Failure::Refused { seen, .. }) if *seen == checkpoint.seen => continue,
                Some(Failure::Failed { next, .. }) if now < *next => continue,
                Some(Failure::Failed { attempts, .. }) => Some(*attempts),
                Some(Failure::Refused { .. }) => Some(0),
                None => None,
            };
            let known = retries
                .jobs
                .get(&key)
                .filter(|(seen, _)| Some(*seen) == checkpoint.seen)
                .map(|(_, job)| job.clone());
            let started = Instant::now();
            let imported =
                self.import_flink_checkpoint(planned, attempts.is_some(), known.as_deref());
            if let (Ok(Imported::Held(job) | Imported::Done(job, _)), Some(seen)) =
                (&imported, checkpoint.seen)
            {
                if !flink::is_job_id(&checkpoint.job) {
                    retries.jobs.insert(key.clone(), (seen, job.clone()));
                }
            }
            let (job, result) = match imported {
                Ok(Imported::Held(_)) => {
                    retries.failed.remove(&key);
                    continue;
                }
                Ok(Imported::Done(job, done)) => (job, Ok(done)),
                Err(e) => (checkpoint.job.clone(), Err(e)),
            };
            let retry = match &result {
                Ok(_) => {
                    retries.failed.remove(&key);
                    None
                }
                Err(e) if refuses(e) => {
                    if keep_going {
                        self.inner.counters.flink_refused.inc();
                    }
                    let reason = e.to_string();
                    retries.failed.insert(
                        key,
                        Failure::Refused {
                            seen: checkpoint.seen,
                            reason,
                        },
                    );
                    Some(Retry::WhenChanged)
                }
                Err(_) => {
                    let attempts = attempts.unwrap_or(0) + 1;
                    let wait = pause(attempts);
                    retries.failed.insert(
                        key,
                        Failure::Failed {
                            attempts,
                            next: now + wait,
                        },
                    );
                    Some(Retry::After(wait))
                }
            };
            let failed = result.is_err();
            self.inner
                .counters
                .flink_import_ended(!failed, started.elapsed());
            out.push(FlinkImport {
                job,
                checkpoint: checkpoint.checkpoint,
                result,
                retry,
            });
            if failed && !keep_going {
                break;
            }
        }
        out
    }

    /// Whether checkpoint `checkpoint` of `job`, whose `_metadata` was written at
    /// `written_ms` (where the source says), is not to be imported: the store holds it, or
    /// held it and it was dropped, or (unless `retry`: it failed before) it holds a newer
    /// one of the job; unless it is of a later line ([`later_line`]).
    fn skips_flink(
        &self,
        job: &str,
        checkpoint: u64,
        written_ms: Option<u64>,
        retry: bool,
    ) -> bool {
        let st = self.state();
        let (mut this, mut newest, mut latest) = (false, None, None);
        for label in st.held.manifests.values().filter_map(|m| m.flink.as_ref()) {
            if label.job == job {
                this |= label.checkpoint == checkpoint;
                newest = newest.max(Some(label.checkpoint));
                latest = latest.max(label.time_unix_ms);
            }
        }
        // Dropped ones count too: a user's drop of a later line's checkpoint sticks.
        latest = latest.max(st.meta.flink_dropped_ms.get(job).copied());
        if later_line(written_ms, latest) {
            log::debug!("checkpoint {checkpoint} of Flink job {job} is of a later line");
            return false;
        }
        this || st.meta.flink_was_dropped(job, checkpoint) || (!retry && newest >= Some(checkpoint))
    }

    /// The Flink checkpoints the store held and dropped, by job (status shows them).
    pub fn flink_dropped(&self) -> std::collections::BTreeMap<String, Vec<u64>> {
        self.state().meta.flink_dropped.clone()
    }

    /// Whether the newest snapshot of `backend` lists file `name` read from `source`, of
    /// `size` bytes, so that the next import re-references it without reading it (the rule
    /// of `import_part`, asked before the file is opened or fetched).
    fn holds_source(&self, backend: &BackendName, name: &str, source: &str, size: u64) -> bool {
        let st = self.state();
        let newest = st
            .held
            .manifests
            .values()
            .rev()
            .find_map(|m| m.backend(backend));
        newest.is_some_and(|snapshot| {
            snapshot.files.iter().any(|f| {
                f.name == name && super::checkpoint::reusable_by_source(f, name, Some(source), size)
            })
        })
    }

    /// One checkpoint, unless [`Engine::skips_flink`] says so; `job` is its job id where an
    /// earlier look read it from the same `_metadata`.
    fn import_flink_checkpoint(
        &self,
        planned: &Planned,
        retry: bool,
        job: Option<&str>,
    ) -> Result<Imported> {
        let checkpoint = &planned.completed;
        let written_ms = checkpoint
            .seen
            .and_then(|s| s.modified)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64);
        let held = |job: &str| self.skips_flink(job, checkpoint.checkpoint, written_ms, retry);
        // Named by its id, the job's directory says it without reading the metadata.
        let known = job.or(flink::is_job_id(&checkpoint.job).then_some(checkpoint.job.as_str()));
        if let Some(job) = known.filter(|job| held(job)) {
            return Ok(Imported::Held(job.to_string()));
        }
        let staging = tempfile::Builder::new()
            .prefix("flink-import-")
            .tempdir_in(self.state_dir())
            .ctx("create a staging directory in", self.state_dir())?;
        let known = |backend: &BackendName, name: &str, source: &str, size: u64| {
            self.holds_source(backend, name, source, size)
        };
        // The files to read are held open in `backends` until the checkpoint is stored.
        // The bytes checked: a `_metadata` written again since is not what is imported.
        let metadata = planned.metadata()?;
        let listed = flink::subtasks(
            checkpoint,
            &metadata,
            staging.path(),
            &known,
            Some(self.object_store()),
        )?;
        let (backends, job, operators) = (listed.backends, listed.job, listed.operators);
        if held(&job) {
            return Ok(Imported::Held(job));
        }
        crate::failpoint!("flink::before-begin");
        let mut pending = self.begin(CheckpointPlan::Application(backends))?;
        // Asked again in the checkpoint slot, which an import holds alone: another importer
        // (the follower, a control line) may have committed it since the look above.
        if held(&job) {
            pending.abort();
            return Ok(Imported::Held(job));
        }
        let time_unix_ms = checkpoint.metadata_time().and_then(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_millis() as u64)
        });
        pending.set_flink(FlinkLabel {
            job: job.clone(),
            checkpoint: checkpoint.checkpoint,
            operators,
            time_unix_ms,
        });
        let done = pending.complete_with_imports()?;
        log::info!(
            "imported checkpoint {} of Flink job {job} as checkpoint {}",
            checkpoint.checkpoint,
            done.0.id
        );
        Ok(Imported::Done(job, done))
    }
}

/// Whether a checkpoint whose `_metadata` was written at `written_ms` is of a later line of
/// its job than every checkpoint the store holds of it, the newest of which Flink completed
/// at `latest_ms`: written after it. A job restored under the same job id (application mode
/// on Kubernetes fixes it) writes into the same directory with ids going on from the
/// restored checkpoint's, so below the newest the store holds, and Flink's directory may
/// then hold a `chk-N` the store holds (or held and dropped) another of. Both times are
/// the source's (one filesystem's or bucket's clock); `latest_ms` counts the checkpoints
/// dropped too ([`StoreMeta::flink_dropped_ms`](crate::catalog::StoreMeta::flink_dropped_ms)). Unknown times (imports by builds that did not record
/// them, sources that do not say) are never a later line.
fn later_line(written_ms: Option<u64>, latest_ms: Option<u64>) -> bool {
    matches!((written_ms, latest_ms), (Some(w), Some(l)) if w > l)
}

/// What [`Engine::import_flink_checkpoint`] came to, with the checkpoint's job id.
enum Imported {
    /// Not imported: [`Engine::skips_flink`] says so.
    Held(String),
    /// Committed, with what each of its imports read and stored.
    Done(String, (Arc<Manifest>, Vec<ImportReport>)),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::counting::CountingTree;
    use std::path::Path;

    const JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";

    /// `bytes` with the RocksDB file name `000024.sst` written `00/024.sst`, as the changelog
    /// backend and unaligned checkpoints name files: refused by ckptfs.
    fn with_a_slash(bytes: &[u8]) -> Vec<u8> {
        let (from, to) = (b"\x00\x0a000024.sst", b"\x00\x0a00/024.sst");
        let at = bytes
            .windows(from.len())
            .position(|w| w == from)
            .expect("the name 000024.sst");
        let mut out = bytes.to_vec();
        out[at..at + from.len()].copy_from_slice(to);
        out
    }

    fn set_mtime(path: &Path, secs: u64) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    }

    fn flink_labels(engine: &Engine) -> Vec<u64> {
        engine
            .status()
            .checkpoints
            .iter()
            .filter_map(|m| m.flink.as_ref().map(|f| f.checkpoint))
            .collect()
    }

    /// A follower's looks, one a second for two minutes, at the fixture job whose
    /// checkpoint 5 names a file `00/024.sst` (refused) and whose checkpoints 4 and 6 name
    /// files that are not there yet (an error a later try may not meet): checkpoint 5's
    /// `_metadata` is read once, and again once only after it is written again; 4 and 6 are
    /// tried after pauses of 1, 2, 4 ... up to 60 s (7 tries in 2 minutes, not 121); once
    /// their files are back they import at their next try, and checkpoint 5 once its
    /// `_metadata` is one ckptfs imports.
    #[test]
    fn a_refused_checkpoint_is_read_again_only_once_changed_and_failures_back_off() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join(JOB);
        crate::flink::copy_of_fixture(&job);
        let metadata_of = |n: u64| job.join(format!("chk-{n}/_metadata"));
        let mut good = BTreeMap::new();
        for n in [4, 5, 6] {
            let bytes =
                crate::flink::naming_files_in(&std::fs::read(metadata_of(n)).unwrap(), &job);
            std::fs::write(metadata_of(n), &bytes).unwrap();
            good.insert(n, bytes);
        }
        let refused = with_a_slash(&good[&5]);
        std::fs::write(metadata_of(5), &refused).unwrap();
        set_mtime(&metadata_of(5), 1_000);
        std::fs::rename(job.join("shared"), dir.path().join("away")).unwrap();

        let engine = Engine::open(crate::EngineConfig::new(dir.path().join("store"))).unwrap();
        let tree = Arc::new(CountingTree::open(&job));
        let src = FlinkSource::of_tree(tree.clone());
        let mut retries = Retries::default();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);

        let first = engine.follow_flink_at(&src, &mut retries, at(0)).unwrap();
        let tried: Vec<(u64, Option<Retry>)> =
            first.iter().map(|i| (i.checkpoint, i.retry)).collect();
        assert_eq!(
            tried,
            [
                (4, Some(Retry::After(FIRST_PAUSE))),
                (5, Some(Retry::WhenChanged)),
                (6, Some(Retry::After(FIRST_PAUSE)))
            ]
        );
        let e = first[1].result.as_ref().err().unwrap().to_string();
        assert!(e.contains("00/024.sst"), "{e}");
        let size = |n: u64| std::fs::metadata(metadata_of(n)).unwrap().len();
        assert_eq!(tree.counts().1, 3);
        for secs in 1..=120 {
            engine
                .follow_flink_at(&src, &mut retries, at(secs))
                .unwrap();
        }
        // Checkpoints 4 and 6 at 0, 1, 3, 7, 15, 31, 63 s; 5 once.
        let (_, reads, bytes) = tree.counts();
        assert_eq!(reads, 7 * 2 + 1);
        assert_eq!(bytes, 7 * (size(4) + size(6)) + size(5));
        let shown = engine.flink_refused();
        assert_eq!(shown.len(), 1, "{shown:?}");
        assert_eq!((shown[0].job.as_str(), shown[0].checkpoint), (JOB, 5));
        assert_eq!(shown[0].metadata_bytes, Some(size(5)));
        assert!(shown[0].reason.contains("00/024.sst"), "{shown:?}");
        assert_eq!(engine.counters().flink_refused.get(), 1);

        // Written again, as refused as before: read once more.
        set_mtime(&metadata_of(5), 2_000);
        engine.follow_flink_at(&src, &mut retries, at(121)).unwrap();
        assert_eq!(tree.counts().1, reads + 1);
        engine.follow_flink_at(&src, &mut retries, at(122)).unwrap();
        assert_eq!(tree.counts().1, reads + 1);
        assert_eq!(engine.counters().flink_refused.get(), 2);

        // The files are back: 4 and 6 import at their next try (63 + 60 s), 5 once it is
        // a checkpoint ckptfs imports.
        std::fs::rename(dir.path().join("away"), job.join("shared")).unwrap();
        assert_eq!(flink_labels(&engine), Vec::<u64>::new());
        let imported = engine.follow_flink_at(&src, &mut retries, at(123)).unwrap();
        assert!(imported.iter().all(|i| i.result.is_ok()));
        assert_eq!(flink_labels(&engine), [4, 6]);
        std::fs::write(metadata_of(5), &good[&5]).unwrap();
        engine.follow_flink_at(&src, &mut retries, at(124)).unwrap();
        assert_eq!(flink_labels(&engine), [4, 6, 5]);
        assert!(engine.flink_refused().is_empty());
    }

    /// A copy of a job's directory under another name: the job id is read from each
    /// `_metadata` once, and the checkpoints the store holds are not read again at later
    /// looks (every one was, at every look).
    #[test]
    fn a_job_directory_under_another_name_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("job-copy");
        crate::flink::copy_of_fixture(&copy);
        let engine = Engine::open(crate::EngineConfig::new(dir.path().join("store"))).unwrap();
        let tree = Arc::new(CountingTree::open(&copy));
        let src = FlinkSource::of_tree(tree.clone());
        let mut retries = Retries::default();
        for _ in 0..10 {
            engine.follow_flink(&src, &mut retries).unwrap();
        }
        assert_eq!(flink_labels(&engine), [4, 5, 6]);
        assert!(engine
            .status()
            .checkpoints
            .iter()
            .all(|m| m.flink.as_ref().unwrap().job == JOB));
        assert_eq!(tree.counts().1, 3);
        // Written again: read again (and held).
        let metadata = copy.join("chk-6/_metadata");
        set_mtime(&metadata, 3_000);
        engine.follow_flink(&src, &mut retries).unwrap();
        engine.follow_flink(&src, &mut retries).unwrap();
        assert_eq!(tree.counts().1, 4);
        assert_eq!(flink_labels(&engine), [4, 5, 6]);
    }

    /// A `_metadata` written after every checkpoint the store holds of its job is of a
    /// later line (a job restored under the same job id): imported though the store holds
    /// its id and newer ones; once dropped, it stays dropped; a file older than the newest
    /// held is not imported again.
    #[test]
    fn a_later_line_of_a_job_is_imported_and_its_drop_sticks() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join(JOB);
        crate::flink::copy_of_fixture(&job);
        let metadata_of = |n: u64| job.join(format!("chk-{n}/_metadata"));
        for n in [4, 5, 6] {
            set_mtime(&metadata_of(n), 10_000 + n);
        }
        let mut config = crate::EngineConfig::new(dir.path().join("store"));
        config.retain = Some(20);
        let engine = Engine::open(config.clone()).unwrap();
        let src = FlinkSource::of_tree(Arc::new(CountingTree::open(&job)));
        let mut retries = Retries::default();
        engine.follow_flink(&src, &mut retries).unwrap();
        assert_eq!(flink_labels(&engine), [4, 5, 6]);
        // Checkpoint 5 written again, earlier than 6: the same line.
        set_mtime(&metadata_of(5), 10_005 + 1);
        engine.follow_flink(&src, &mut retries).unwrap();
        assert_eq!(flink_labels(&engine), [4, 5, 6]);
        // Later than 6: a later line's 5.
        set_mtime(&metadata_of(5), 20_000);
        engine.follow_flink(&src, &mut retries).unwrap();
        assert_eq!(flink_labels(&engine), [4, 5, 6, 5]);
        engine.follow_flink(&src, &mut retries).unwrap();
        assert_eq!(flink_labels(&engine), [4, 5, 6, 5]);
        let later = engine.checkpoints().last().unwrap().id;
        engine.delete_checkpoint(later).unwrap();
        engine.follow_flink(&src, &mut retries).unwrap();
        assert_eq!(flink_labels(&engine), [4, 5, 6]);
        // And the store reopened (the drop's time is in ckptfs.json).
        drop(engine);
        let engine = Engine::open(config).unwrap();
        engine.follow_flink(&src, &mut Retries::default()).unwrap();
        assert_eq!(flink_labels(&engine), [4, 5, 6]);
    }

    #[test]
    fn pauses_double_up_to_a_minute() {
        let secs: Vec<u64> = (1..=9).map(|n| pause(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(pause(u32::MAX), MAX_PAUSE);
    }
}
