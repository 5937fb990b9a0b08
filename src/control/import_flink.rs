//! `import-flink` once (not a follower): the one rule that both callers run, the command
//! line against a store no daemon holds (`commands/import.rs`) and a control line of a
//! daemon ([`super::Controller`]). The source is opened, its checkpoints listed and every
//! `_metadata` read and checked before the store is touched ([`checked_plan`]); then each
//! checkpoint of that plan is imported in turn ([`import`]) from the `_metadata` it read,
//! and a failure part way is described the same way on both paths: which Flink checkpoint
//! was not imported, and what was imported before it.

use std::path::{Path, PathBuf};

use serde::Serialize;

use ckptfs_core::error::{Error, Result};
use ckptfs_core::flink::import::FlinkSource;
use ckptfs_core::flink::plan::Plan;
use ckptfs_core::Engine;

use super::protocol::CheckpointDone;
use crate::retry::is_busy;

/// A Flink checkpoint: its job and id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlinkCheckpoint {
    /// The Flink job id; for a failed import, the name of the job's directory.
    pub job: String,
    /// The Flink checkpoint's id.
    pub checkpoint: u64,
}

/// One Flink checkpoint imported: which, and the checkpoint it became.
#[derive(Debug, Clone)]
pub struct FlinkDone {
    /// The Flink checkpoint.
    pub flink: FlinkCheckpoint,
    /// What the store committed for it.
    pub done: CheckpointDone,
}

/// An import that ended in a failure: what was committed before it stays.
#[derive(Debug)]
pub struct NotImported {
    /// The checkpoints imported before the failure, in order.
    pub done: Vec<FlinkDone>,
    /// The Flink checkpoint that failed.
    pub failed: FlinkCheckpoint,
    /// Why, with the failed checkpoint and what was imported before it said in front
    /// ([`describe`]); its errno is the cause's.
    pub error: Error,
}

/// The plan of `import-flink SRC [--root ROOT]...` ([`Plan::checked`]): every completed
/// checkpoint listed, its `_metadata` read and its layout checked, so that a bad one is
/// refused before the store is touched, with nothing imported.
pub fn checked_plan(src: &Path, roots: &[PathBuf]) -> Result<Plan> {
    Plan::checked(&FlinkSource::open(src, roots)?)
}

/// Import every checkpoint of `plan` the store does not hold yet
/// ([`Engine::import_flink`]), oldest first, until the first failure. When a checkpoint
/// finds the engine's checkpoint slot taken (another checkpoint in flight), `wait` is
/// asked: it pauses and says whether to try again (true: the same plan, neither listed
/// nor read again) or to fail with that answer.
pub fn import(
    engine: &Engine,
    plan: &Plan,
    mut wait: impl FnMut() -> bool,
) -> std::result::Result<Vec<FlinkDone>, Box<NotImported>> {
    let mut done: Vec<FlinkDone> = Vec::new();
    'again: loop {
        for imported in engine.import_flink(plan) {
            let flink = FlinkCheckpoint {
                job: imported.job,
                checkpoint: imported.checkpoint,
            };
            match imported.result {
                Ok((manifest, reports)) => done.push(FlinkDone {
                    flink,
                    done: CheckpointDone::of(&manifest, reports),
                }),
                // The import stops at its first failure: nothing after it was tried.
                Err(e) if is_busy(&e) && wait() => continue 'again,
                Err(e) => {
                    let error = e.context(describe(&flink, &done));
                    return Err(Box::new(NotImported {
                        done,
                        failed: flink,
                        error,
                    }));
                }
            }
        }
        return Ok(done);
    }
}

/// "checkpoint 6 of Flink job J was not imported (imported before it: Flink checkpoints 4,
/// 5 as checkpoints 1, 2)", or "(nothing was imported)".
pub fn describe(failed: &FlinkCheckpoint, before: &[FlinkDone]) -> String {
    let before = if before.is_empty() {
        "nothing was imported".to_string()
    } else {
        format!(
            "imported before it: Flink checkpoints {} as checkpoints {}",
            join(before.iter().map(|d| d.flink.checkpoint)),
            join(before.iter().map(|d| d.done.id))
        )
    };
    format!(
        "checkpoint {} of Flink job {} was not imported ({before})",
        failed.checkpoint, failed.job
    )
}

/// `a, b, c`.
fn join(items: impl Iterator<Item = u64>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(checkpoint: u64, id: u64) -> FlinkDone {
        FlinkDone {
            flink: FlinkCheckpoint {
                job: "j".into(),
                checkpoint,
            },
            done: CheckpointDone {
                id,
                files: 0,
                files_new: 0,
                files_reused: 0,
                bytes: 0,
                bytes_uploaded: 0,
                bytes_copied: 0,
                sync_ms: 0.0,
                async_ms: 0.0,
                imports: Vec::new(),
            },
        }
    }

    #[test]
    fn a_partial_failure_names_the_checkpoint_and_what_came_before_it() {
        let failed = FlinkCheckpoint {
            job: "j".into(),
            checkpoint: 6,
        };
        assert_eq!(
            describe(&failed, &[done(4, 1), done(5, 2)]),
            "checkpoint 6 of Flink job j was not imported (imported before it: Flink \
             checkpoints 4, 5 as checkpoints 1, 2)"
        );
        assert_eq!(
            describe(&failed, &[]),
            "checkpoint 6 of Flink job j was not imported (nothing was imported)"
        );
    }
}
