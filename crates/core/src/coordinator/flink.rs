//! Importing a Flink job's completed checkpoints (`ckptfs import-flink`, and a daemon that
//! follows a job with `mount --flink`): each one newer than the newest the store holds from
//! that job becomes one checkpoint, labelled with the job and checkpoint id, whose backends
//! are the job's subtasks and its own files ([`crate::flink::import`]): nothing else is
//! carried over, so an operator the job no longer has is not in its later checkpoints.

use std::sync::Arc;

use super::{Engine, ImportReport};
use crate::catalog::{FlinkLabel, Manifest};
use crate::error::{IoContext, Result};
use crate::flink::import::{self as flink, Completed, Source};
use crate::names::BackendName;

/// What importing one Flink checkpoint gave.
pub struct FlinkImport {
    pub job: String,
    pub checkpoint: u64,
    pub result: Result<(Arc<Manifest>, Vec<ImportReport>)>,
}

impl Engine {
    /// Import every completed checkpoint of the Flink job under `src` that is newer than
    /// the newest the store holds from that job, oldest first. With `keep_going` (a
    /// follower), a source no job has written to yet holds nothing to import, and one that
    /// fails is reported and the later ones are still imported (a follower tries it again
    /// at its next look, while it is still newer than what the store holds); without, the
    /// first failure ends the import.
    pub fn import_flink(&self, src: &Source, keep_going: bool) -> Result<Vec<FlinkImport>> {
        // A checkpoint's files to read are held open while it is imported: a large job's
        // first checkpoint has thousands.
        crate::fsutil::raise_open_files_limit();
        // A follower may look before the job has written anything.
        let completed = if keep_going {
            flink::completed_if_any(src)?.unwrap_or_default()
        } else {
            flink::completed(src)?
        };
        let mut out = Vec::new();
        for checkpoint in completed {
            let (job, result) = match self.import_flink_checkpoint(&checkpoint) {
                Ok(None) => continue,
                Ok(Some((job, done))) => (job, Ok(done)),
                Err(e) => (checkpoint.job.clone(), Err(e)),
            };
            let failed = result.is_err();
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

    /// The newest checkpoint of `job` the store holds.
    fn newest_flink(&self, job: &str) -> Option<u64> {
        self.state()
            .manifests
            .values()
            .filter_map(|m| m.flink.as_ref())
            .filter(|label| label.job == job)
            .map(|label| label.checkpoint)
            .max()
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

    /// One checkpoint, unless the store holds it or a newer one of its job.
    #[allow(clippy::type_complexity)]
    fn import_flink_checkpoint(
        &self,
        checkpoint: &Completed,
    ) -> Result<Option<(String, (Arc<Manifest>, Vec<ImportReport>))>> {
        let held = |job: &str| self.newest_flink(job) >= Some(checkpoint.checkpoint);
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
        let (backends, job) = (listed.backends, listed.job);
        if held(&job) {
            return Ok(None);
        }
        crate::failpoint!("flink::before-begin");
        let mut pending = self.begin_checkpoint_of(backends)?;
        // Asked again in the checkpoint slot, which an import holds alone: another importer
        // (the follower, a control line) may have committed it since the look above.
        if held(&job) {
            pending.abort();
            return Ok(None);
        }
        pending.set_flink(FlinkLabel {
            job: job.clone(),
            checkpoint: checkpoint.checkpoint,
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
