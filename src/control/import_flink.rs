//! `import-flink` once (not a follower): the one rule that both callers run, the command
//! line against a store no daemon holds (`commands/import.rs`) and a control line of a
//! daemon ([`super::Controller`]). The source is opened and every `_metadata` read and
//! checked before the store is touched ([`checked_source`]); then each checkpoint is
//! imported in turn ([`import`]), and a failure part way is described the same way on both
//! paths: which Flink checkpoint was not imported, and what was imported before it.

use std::path::{Path, PathBuf};

use serde::Serialize;

use ckptfs_core::error::{Error, Result};
use ckptfs_core::flink::import::{self as flink, FlinkSource};
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
    /// The Flink checkpoint that failed (none when the source itself could not be listed).
    pub failed: Option<FlinkCheckpoint>,
    /// Why, with the failed checkpoint and what was imported before it said in front
    /// ([`describe`]); its errno is the cause's.
    pub error: Error,
}

/// The source of `import-flink SRC [--root ROOT]...`, checked: every completed
/// checkpoint's `_metadata` read and its layout checked, so that a bad one is refused
/// before the store is touched, with nothing imported.
pub fn checked_source(src: &Path, roots: &[PathBuf]) -> Result<FlinkSource> {
    let src = FlinkSource::open(src, roots)?;
    flink::check_all(&flink::completed(&src)?)?;
    Ok(src)
}

/// Import every completed checkpoint of `src` the store does not hold yet
/// ([`Engine::import_flink`]), oldest first, until the first failure. When a checkpoint
/// finds the engine's checkpoint slot taken (another checkpoint in flight), `wait` is
/// asked: it pauses and says whether to try again (true) or to fail with that answer.
pub fn import(
    engine: &Engine,
    src: &FlinkSource,
    mut wait: impl FnMut() -> bool,
) -> std::result::Result<Vec<FlinkDone>, Box<NotImported>> {
    let mut done: Vec<FlinkDone> = Vec::new();
    'again: loop {
        let imports = match engine.import_flink(src, false) {
            Ok(imports) => imports,
            Err(error) => {
                return Err(Box::new(NotImported {
                    done,
                    failed: None,
                    error,
                }))
            }
        };
        for imported in imports {
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
                        failed: Some(flink),
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
