//! What the engine counts from the moment it opened, for the daemon's metrics
//! (`.ckptfs/metrics`, see [`crate::metrics`]): checkpoints completed and failed, the
//! bytes they uploaded and re-referenced, how long their phases took, errors.
//!
//! Each counter is an atomic (prometheus-client's `Counter` and `Histogram` are), bumped
//! where the event happens: a checkpoint's commit, its release without a commit, an error
//! recorded for `status`. Reading them takes no engine lock. What the engine's state
//! already holds (retained checkpoints, objects, small-file compactions) is read from
//! [`super::Engine::status`] at scrape time instead of being counted twice.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::catalog::CheckpointStats;

/// Bucket bounds of the checkpoint phase durations, in seconds: a sync phase of a few
/// milliseconds (hard links) up to an upload of minutes.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Bucket bounds of the durations of Flink checkpoint imports, in seconds: a small job's
/// checkpoint in tens of milliseconds up to a large job's first one, read whole, in half
/// an hour.
pub const IMPORT_BUCKETS: [f64; 15] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0,
];

/// The label of the checkpoint duration histogram: which phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// `sync` (flush, hard links: writers wait) or `async` (upload and commit).
    pub phase: &'static str,
}

/// Checkpoint phase durations, one histogram per phase.
pub type PhaseHistograms = Family<PhaseLabel, Histogram, fn() -> Histogram>;

const SYNC: PhaseLabel = PhaseLabel { phase: "sync" };
const ASYNC: PhaseLabel = PhaseLabel { phase: "async" };

/// The engine's counters since it opened.
#[derive(Debug)]
pub struct Counters {
    /// Checkpoints committed.
    pub checkpoints_completed: Counter,
    /// Checkpoints that got an id and did not commit (an upload or the commit failed, the
    /// sync phase failed, it was aborted). Refused requests (busy, read-only) are not
    /// checkpoints and are not counted.
    pub checkpoints_failed: Counter,
    /// Bytes the committed checkpoints stored: new files, chunks and file lists, and what a
    /// background materialization they adopted stored before them.
    pub bytes_uploaded: Counter,
    /// Of `bytes_uploaded`, the bytes the object store copied from the source itself.
    pub bytes_copied: Counter,
    /// Bytes of the committed checkpoints' files that were stored already (re-referenced):
    /// each checkpoint's `bytes` less the file bytes it (or its materialization) stored.
    pub bytes_reused: Counter,
    /// Duration of the phases of committed checkpoints: `sync` (flush, hard links) and
    /// `async` (upload, commit), both present from the start.
    pub checkpoint_seconds: PhaseHistograms,
    /// Errors recorded for `status` (its `last_error`), failed checkpoints included.
    pub errors: Counter,
    /// When the last of them was recorded, unix ms; 0 if none since start.
    last_error_unix_ms: AtomicU64,
    /// Directories imported (`ckptfs import`, one per backend) by committed checkpoints.
    pub imports_completed: Counter,
    /// Directories of import checkpoints that got an id and did not commit.
    pub imports_failed: Counter,
    /// Bytes the committed imports read from their directories (files not re-referenced
    /// by their source).
    pub import_read_bytes: Counter,
    /// Files the committed imports re-referenced by their source, without reading them.
    pub import_unread_files: Counter,
    /// Flink checkpoints a follower refused for what they are (each once per version of
    /// its `_metadata`: it is not read again until that changes).
    pub flink_refused: Counter,
    /// Flink checkpoints imported (by a follower, or `import-flink` through the daemon).
    pub flink_imports_completed: Counter,
    /// Flink checkpoint imports that failed, refused ones included (each try counts).
    pub flink_imports_failed: Counter,
    /// How long each committed Flink checkpoint import took: its `_metadata` and files
    /// read, its objects stored, its commit.
    pub flink_import_seconds: Histogram,
}

impl Counters {
    /// Counters of an engine; `error_at_open`: it found a problem to report while opening.
    pub fn new(error_at_open: bool) -> Counters {
        let counters = Counters {
            checkpoints_completed: Counter::default(),
            checkpoints_failed: Counter::default(),
            bytes_uploaded: Counter::default(),
            bytes_copied: Counter::default(),
            bytes_reused: Counter::default(),
            checkpoint_seconds: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
            errors: Counter::default(),
            last_error_unix_ms: AtomicU64::new(0),
            imports_completed: Counter::default(),
            imports_failed: Counter::default(),
            import_read_bytes: Counter::default(),
            import_unread_files: Counter::default(),
            flink_refused: Counter::default(),
            flink_imports_completed: Counter::default(),
            flink_imports_failed: Counter::default(),
            flink_import_seconds: Histogram::new(IMPORT_BUCKETS),
        };
        for phase in [SYNC, ASYNC] {
            drop(counters.checkpoint_seconds.get_or_create(&phase));
        }
        if error_at_open {
            counters.error_recorded();
        }
        counters
    }

    /// A checkpoint committed with these figures; `list_bytes` of its `bytes_uploaded`
    /// were file lists (which `bytes_total` does not count).
    pub fn checkpoint_completed(&self, stats: &CheckpointStats, list_bytes: u64) {
        self.checkpoints_completed.inc();
        self.bytes_uploaded
            .inc_by(stats.bytes_uploaded + stats.bytes_uploaded_materialization);
        self.bytes_copied.inc_by(stats.bytes_copied);
        let file_bytes_stored =
            stats.bytes_uploaded.saturating_sub(list_bytes) + stats.bytes_uploaded_materialization;
        self.bytes_reused
            .inc_by(stats.bytes_total.saturating_sub(file_bytes_stored));
        let seconds = |micros: u64| micros as f64 / 1e6;
        self.checkpoint_seconds
            .get_or_create(&SYNC)
            .observe(seconds(stats.sync_micros));
        self.checkpoint_seconds
            .get_or_create(&ASYNC)
            .observe(seconds(stats.async_micros));
    }

    /// A checkpoint that got an id ended without a commit.
    pub fn checkpoint_failed(&self) {
        self.checkpoints_failed.inc();
    }

    /// A committed checkpoint imported these directories.
    pub fn imports_completed(&self, reports: &[super::ImportReport]) {
        for report in reports {
            self.imports_completed.inc();
            self.import_read_bytes.inc_by(report.bytes_read);
            self.import_unread_files
                .inc_by(report.files.saturating_sub(report.files_read));
        }
    }

    /// A Flink checkpoint import ended (`committed`, or failed) after `took`.
    pub fn flink_import_ended(&self, committed: bool, took: std::time::Duration) {
        if committed {
            self.flink_imports_completed.inc();
            self.flink_import_seconds.observe(took.as_secs_f64());
        } else {
            self.flink_imports_failed.inc();
        }
    }

    /// An error was recorded for `status`.
    pub fn error_recorded(&self) {
        self.errors.inc();
        self.last_error_unix_ms
            .store(crate::fsutil::now_unix_ms(), Ordering::Relaxed);
    }

    /// When the last error was recorded (unix ms), if any was since the engine opened.
    pub fn last_error_unix_ms(&self) -> Option<u64> {
        Some(self.last_error_unix_ms.load(Ordering::Relaxed)).filter(|ms| *ms > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_splits_its_bytes_into_uploaded_and_reused() {
        let counters = Counters::new(false);
        let stats = CheckpointStats {
            bytes_total: 10_000,
            bytes_uploaded: 3_100,
            bytes_uploaded_materialization: 500,
            sync_micros: 2_000,
            async_micros: 1_500_000,
            ..CheckpointStats::default()
        };
        counters.checkpoint_completed(&stats, 100);
        assert_eq!(counters.checkpoints_completed.get(), 1);
        assert_eq!(counters.bytes_uploaded.get(), 3_600);
        // 3,000 file bytes uploaded, 500 by the materialization: the rest was reused.
        assert_eq!(counters.bytes_reused.get(), 6_500);
        assert_eq!(counters.last_error_unix_ms(), None);
        counters.checkpoint_failed();
        counters.error_recorded();
        assert_eq!(counters.checkpoints_failed.get(), 1);
        assert!(counters.last_error_unix_ms().is_some());
        assert!(Counters::new(true).last_error_unix_ms().is_some());
    }
}
