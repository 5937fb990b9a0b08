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

use std::sync::Arc;

use super::{CheckpointPlan, Engine, ImportReport};
use crate::catalog::{FlinkLabel, Manifest};
use crate::error::{IoContext, Result};
use crate::flink::import::{self as flink, Completed, FlinkSource};
use crate::flink::listing::Listing;
use crate::names::BackendName;

/// What a follower remembers between its looks: what it listed of Flink's directories
/// ([`Listing`]), and the Flink checkpoints (job directory's name, checkpoint id) that
/// failed to import and are tried again while Flink has them.
#[derive(Debug, Default)]
pub struct Retries {
    failed: std::collections::BTreeSet<(String, u64)>,
    /// The newest completed checkpoint the last look found (job directory's name, id): of
    /// a root's jobs, the newest checkpoint of the job that began last.
    newest: Option<(String, u64)>,
    listing: Listing,
}

impl Retries {
    /// The newest completed checkpoint Flink had at the last look that could list them
    /// (job directory's name, checkpoint id): what a follower's lag is measured against.
    pub fn newest_completed(&self) -> Option<(&str, u64)> {
        self.newest.as_ref().map(|(job, id)| (job.as_str(), *id))
    }
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
}

impl Engine {
    /// Import every completed checkpoint of the Flink jobs under `src` (one job's directory,
    /// or a root of any number of jobs) that is newer than the newest the store holds from
    /// its job and that the store did not hold and drop: job by job in the order they began,
    /// each job's oldest first ([`flink::completed`]). Without `keep_going`, the first failure ends the import; with it
    /// ([`Engine::follow_flink`]), a source no job has written to yet holds nothing.
    pub fn import_flink(&self, src: &FlinkSource, keep_going: bool) -> Result<Vec<FlinkImport>> {
        self.import_flink_with(src, keep_going, &mut Retries::default())
    }

    /// One look of a follower (`mount --flink`): [`Engine::import_flink`], each failure
    /// reported and the later ones still imported; a checkpoint that failed is tried again
    /// at every look while Flink still has it (`retries` remembers them), though a newer
    /// one was imported meanwhile.
    pub fn follow_flink(
        &self,
        src: &FlinkSource,
        retries: &mut Retries,
    ) -> Result<Vec<FlinkImport>> {
        self.import_flink_with(src, true, retries)
    }

    fn import_flink_with(
        &self,
        src: &FlinkSource,
        keep_going: bool,
        retries: &mut Retries,
    ) -> Result<Vec<FlinkImport>> {
        // A checkpoint's files to read are held open while it is imported: a large job's
        // first checkpoint has thousands.
        crate::fsutil::raise_open_files_limit();
        // A follower may look before the job has written anything.
        let completed = if keep_going {
            flink::completed_listed(src, &mut retries.listing)?.unwrap_or_default()
        } else {
            flink::completed(src)?
        };
        if let Some(c) = completed.last() {
            retries.newest = Some((c.job.clone(), c.checkpoint));
        }
        // What Flink no longer has is not tried again.
        retries.failed.retain(|key| {
            completed
                .iter()
                .any(|c| (&c.job, c.checkpoint) == (&key.0, key.1))
        });
        let mut out = Vec::new();
        for checkpoint in completed {
            let key = (checkpoint.job.clone(), checkpoint.checkpoint);
            let retry = retries.failed.contains(&key);
            let (job, result) = match self.import_flink_checkpoint(&checkpoint, retry) {
                Ok(None) => {
                    retries.failed.remove(&key);
                    continue;
                }
                Ok(Some((job, done))) => (job, Ok(done)),
                Err(e) => (checkpoint.job.clone(), Err(e)),
            };
            let failed = result.is_err();
            if failed {
                retries.failed.insert(key);
            } else {
                retries.failed.remove(&key);
            }
            out.push(FlinkImport {
                job,
                checkpoint: checkpoint.checkpoint,
                result,
            });
            if failed && !keep_going {
                break;
            }
        }
        Ok(out)
    }

    /// Whether checkpoint `checkpoint` of `job` is not to be imported: the store holds it,
    /// or held it and it was dropped, or (unless `retry`: it failed before) it holds a
    /// newer one of the job.
    fn skips_flink(&self, job: &str, checkpoint: u64, retry: bool) -> bool {
        let st = self.state();
        let (mut this, mut newest) = (false, None);
        for label in st.manifests.values().filter_map(|m| m.flink.as_ref()) {
            if label.job == job {
                this |= label.checkpoint == checkpoint;
                newest = newest.max(Some(label.checkpoint));
            }
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
        let newest = st.manifests.values().rev().find_map(|m| m.backend(backend));
        newest.is_some_and(|snapshot| {
            snapshot.files.iter().any(|f| {
                f.name == name && super::checkpoint::reusable_by_source(f, name, Some(source), size)
            })
        })
    }

    /// One checkpoint, unless [`Engine::skips_flink`] says so.
    #[allow(clippy::type_complexity)]
    fn import_flink_checkpoint(
        &self,
        checkpoint: &Completed,
        retry: bool,
    ) -> Result<Option<(String, (Arc<Manifest>, Vec<ImportReport>))>> {
        let held = |job: &str| self.skips_flink(job, checkpoint.checkpoint, retry);
        // Named by its id, the job's directory says it without reading the metadata.
        if flink::is_job_id(&checkpoint.job) && held(&checkpoint.job) {
            return Ok(None);
        }
        let staging = tempfile::Builder::new()
            .prefix("flink-import-")
            .tempdir_in(self.state_dir())
            .ctx("create a staging directory in", self.state_dir())?;
        let known = |backend: &BackendName, name: &str, source: &str, size: u64| {
            self.holds_source(backend, name, source, size)
        };
        // The files to read are held open in `backends` until the checkpoint is stored.
        let listed = flink::subtasks(checkpoint, staging.path(), &known)?;
        let (backends, job, operators) = (listed.backends, listed.job, listed.operators);
        if held(&job) {
            return Ok(None);
        }
        crate::failpoint!("flink::before-begin");
        let mut pending = self.begin(CheckpointPlan::Application(backends))?;
        // Asked again in the checkpoint slot, which an import holds alone: another importer
        // (the follower, a control line) may have committed it since the look above.
        if held(&job) {
            pending.abort();
            return Ok(None);
        }
        let time_unix_ms = checkpoint.metadata_time()?.and_then(|t| {
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
        Ok(Some((job, done)))
    }
}
