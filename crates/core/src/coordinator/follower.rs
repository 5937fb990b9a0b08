//! How a Flink follower (`mount --flink SRC`, `serve --flink SRC`) is doing, as its last
//! look left it: when it looked, Flink's newest completed checkpoint then (its id and the
//! time its `_metadata` was written) and how far behind it the store was. The metrics
//! (`ckptfs_flink_*`, [`crate::metrics`]), `.ckptfs/status` (`flink_follower`) and the
//! daemon's page read it from here, so they say the same.
//!
//! The lag is measured at each look, after its imports, against the store's newest
//! checkpoint imported from Flink ([`lag`]); both of its times are Flink's (the
//! `_metadata`'s modification time as the source tells it), so a clock that differs
//! between ckptfs's machine and Flink's storage does not show as lag. A follower that no
//! longer looks leaves its last figures: `last look` says how old they are.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::Engine;
use crate::catalog::Manifest;
use crate::fsutil::lock;

/// Flink's newest completed checkpoint at a follower's look.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlinkNewest {
    /// Its job: the job id, or the job directory's name where the id is not known yet (a
    /// copy of a job's directory under another name whose checkpoint was not read).
    pub job: String,
    /// Its id (`chk-N`).
    pub checkpoint: u64,
    /// When Flink completed it (its `_metadata` written), in milliseconds since the Unix
    /// epoch; `None` where the source does not say.
    pub time_unix_ms: Option<u64>,
}

/// A follower's health, as `.ckptfs/status` shows it (`flink_follower`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowerHealth {
    /// The directory or `s3://` prefix followed.
    pub source: String,
    /// When the last look that could list Flink's checkpoints ended, in milliseconds since
    /// the Unix epoch (`None`: none yet).
    pub looked_unix_ms: Option<u64>,
    /// Flink's newest completed checkpoint at that look (`None`: Flink had none).
    pub newest: Option<FlinkNewest>,
    /// How many checkpoints the store was behind Flink's newest after that look
    /// ([`lag`]): 0 when it holds it (or held it and it was dropped).
    pub lag_checkpoints: u64,
    /// How much older the store's newest Flink checkpoint was than Flink's newest, in
    /// milliseconds ([`lag`]); 0 when it holds Flink's newest.
    pub lag_ms: u64,
}

/// The store's lag behind Flink's newest checkpoint `newest`, given the retained
/// checkpoints (oldest first) and whether the follower has nothing to import for it
/// (`caught_up`: the store holds it, or held it and it was dropped, or holds a newer one
/// of its job; the follower's own rule): `(checkpoints, milliseconds)`.
///
/// Measured from the store's newest checkpoint of `newest`'s job or, where it holds none
/// of that job (a job restarted from a checkpoint writes a new job directory), its newest
/// Flink checkpoint of any job:
/// - none at all (nothing imported yet): `newest`'s id (a job numbers its checkpoints
///   from 1), and the time between `newest` and the look (`looked_ms`);
/// - of the same job with a smaller id, or of an earlier job with a smaller id (a job
///   restored from a checkpoint goes on numbering after it): the difference of the ids;
/// - of the same job with an id not smaller (a later line: the job restored under its own
///   id from an older checkpoint): 1, Flink's newest (how many of the line came before it
///   is not known);
/// - of an earlier job with an id not smaller (a job started afresh): `newest`'s id.
///
/// The time is `newest`'s less that checkpoint's (Flink's time of it, else when ckptfs
/// committed it).
pub fn lag(
    newest: &FlinkNewest,
    retained: &[Arc<Manifest>],
    caught_up: bool,
    looked_ms: u64,
) -> (u64, u64) {
    if caught_up {
        return (0, 0);
    }
    let flink = || {
        retained
            .iter()
            .rev()
            .filter_map(|m| m.flink.as_ref().map(|f| (f, m.completed_unix_ms)))
    };
    let newest_ms = newest.time_unix_ms;
    let reference = flink()
        .find(|(f, _)| f.job == newest.job)
        .or_else(|| flink().next());
    match reference {
        None => (
            newest.checkpoint,
            newest_ms.map_or(0, |t| looked_ms.saturating_sub(t)),
        ),
        Some((f, committed_ms)) => {
            let behind = if f.checkpoint < newest.checkpoint {
                newest.checkpoint - f.checkpoint
            } else if f.job == newest.job {
                1
            } else {
                newest.checkpoint
            };
            let at = f.time_unix_ms.unwrap_or(committed_ms);
            (behind, newest_ms.map_or(0, |t| t.saturating_sub(at)))
        }
    }
}

/// `t` in milliseconds since the Unix epoch.
pub(crate) fn unix_ms(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

impl Engine {
    /// This engine's daemon follows the Flink checkpoints at `source`: its health is shown
    /// (metrics, status) from now on, before its first look.
    pub fn follow_flink_from(&self, source: String) {
        let mut health = lock(&self.inner.follower);
        *health = Some(FollowerHealth {
            source,
            ..health.take().unwrap_or_default()
        });
    }

    /// The follower's health as its last look left it; `None` if this engine's daemon
    /// follows no Flink job.
    pub fn follower_health(&self) -> Option<FollowerHealth> {
        lock(&self.inner.follower).clone()
    }

    /// A follower's look could list Flink's checkpoints, and its imports are done:
    /// `newest` is Flink's newest completed checkpoint (job, id, time), if it has one, and
    /// whether the follower has nothing to import for it (see [`lag`]).
    pub(crate) fn note_look(&self, newest: Option<(FlinkNewest, bool)>) {
        let looked_ms = crate::fsutil::now_unix_ms();
        let (lag_checkpoints, lag_ms) = match &newest {
            Some((n, caught_up)) => {
                let retained: Vec<Arc<Manifest>> =
                    self.state().held.manifests.values().cloned().collect();
                lag(n, &retained, *caught_up, looked_ms)
            }
            None => (0, 0),
        };
        let newest = newest.map(|(n, _)| n);
        let mut health = lock(&self.inner.follower);
        let h = health.get_or_insert_with(FollowerHealth::default);
        h.looked_unix_ms = Some(looked_ms);
        h.newest = newest;
        h.lag_checkpoints = lag_checkpoints;
        h.lag_ms = lag_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::FlinkLabel;

    fn imported(id: u64, job: &str, checkpoint: u64, time: Option<u64>) -> Arc<Manifest> {
        Arc::new(Manifest {
            format: crate::catalog::FORMAT,
            id,
            started_unix_ms: 0,
            completed_unix_ms: 9_000_000 + id,
            backends: Vec::new(),
            stats: Default::default(),
            flink: Some(FlinkLabel {
                job: job.into(),
                checkpoint,
                operators: Default::default(),
                time_unix_ms: time,
            }),
        })
    }

    fn newest(job: &str, checkpoint: u64, time: u64) -> FlinkNewest {
        FlinkNewest {
            job: job.into(),
            checkpoint,
            time_unix_ms: Some(time),
        }
    }

    #[test]
    fn the_lag_is_measured_from_the_stores_newest_flink_checkpoint() {
        let held = [
            imported(1, "a", 4, Some(1_000)),
            imported(2, "a", 6, Some(3_000)),
        ];
        // Nothing to import (held, dropped, a newer one held): no lag.
        assert_eq!(lag(&newest("a", 7, 4_000), &held, true, 10_000), (0, 0));
        // Behind by two checkpoints of the same job, 5 s of Flink's time.
        assert_eq!(
            lag(&newest("a", 8, 8_000), &held, false, 10_000),
            (2, 5_000)
        );
        // A job restored from a.6 numbers on from 7; one started afresh from 1.
        assert_eq!(
            lag(&newest("b", 9, 9_000), &held, false, 10_000),
            (3, 6_000)
        );
        assert_eq!(
            lag(&newest("c", 2, 9_000), &held, false, 10_000),
            (2, 6_000)
        );
        // A later line of job a (restored under its own id from a.4): its newest, after
        // the store's newest of the earlier line.
        assert_eq!(
            lag(&newest("a", 5, 9_000), &held, false, 10_000),
            (1, 6_000)
        );
        // Nothing imported yet: every checkpoint of the job, since Flink wrote the newest.
        assert_eq!(lag(&newest("a", 3, 4_000), &[], false, 10_000), (3, 6_000));
        // A checkpoint without Flink's time is measured from its commit.
        let untimed = [imported(5, "a", 6, None)];
        assert_eq!(lag(&newest("a", 7, 9_000_010), &untimed, false, 0), (1, 5));
    }
}
