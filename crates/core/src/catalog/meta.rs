//! The store's small metadata record, `ckptfs.json`: its settings and counters, and on
//! object storage the writer's epoch and the pending and void checkpoints that make its
//! conditional write the commit point (see the catalog's module documentation).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::manifest::{is_zero, FlinkLabel, FORMAT};
use crate::names::BackendName;
use crate::policy::{ByTime, Policy};

/// Store-wide settings and counters, in `ckptfs.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreMeta {
    /// The format this record was written in ([`FORMAT`] for one about to be written).
    pub format: u32,
    /// The id the next checkpoint gets; ids are never reused.
    pub next_checkpoint: u64,
    /// How many checkpoints are retained (at least 1); the oldest beyond it are dropped.
    pub retain: u32,
    /// The hosted backends: those a daemon of the store opens, sorted.
    pub backends: Vec<BackendName>,
    /// Object storage: the writer generation. Every daemon that starts writing raises it,
    /// so the metadata it writes differs from anything an earlier writer read.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
    /// Object storage: writes of this file so far; each write has new bytes (a new ETag),
    /// so a conditional write can never succeed on a version it did not read.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub revision: u64,
    /// Object storage: checkpoints whose id is reserved and whose commit is not confirmed
    /// yet. Their manifests may exist and do not count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<u64>,
    /// Object storage: every manifest with an id below this is void (dropped, or written
    /// by a writer that lost the store before it confirmed it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub void_below: u64,
    /// Object storage: void ids at or above `void_below`, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub void: Vec<u64>,
    /// Backends whose state is imported (`ckptfs import`), not hosted (format 7): never
    /// opened by a daemon, carried over unchanged by every checkpoint that does not import
    /// them. Sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<BackendName>,
    /// Flink checkpoints this store held and dropped (`rmdir`, `delete`, retention), by
    /// job, sorted, the newest [`FLINK_DROPS_KEPT`] of each: never imported again, so a
    /// user's drop sticks while Flink still retains the checkpoint. An optional field: a
    /// store without it reads as one that dropped none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flink_dropped: BTreeMap<String, Vec<u64>>,
    /// By job, the latest time Flink completed a checkpoint the store held and dropped
    /// (its label's `time_unix_ms`, milliseconds since the Unix epoch): a checkpoint of
    /// that job written later is of a later line (a job restored under the same job id),
    /// not the dropped one, though it has its id. An optional field: a store without it
    /// knows no such time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flink_dropped_ms: BTreeMap<String, u64>,
    /// The retention policy's rules by time, beside `retain` (its `last`): see
    /// [`crate::policy`]. Left out when none is set (format 8 too: no release wrote
    /// format 8 without it, and format 7 readers refuse format 8).
    #[serde(default, skip_serializing_if = "ByTime::is_empty")]
    pub keep: ByTime,
    /// Pinned checkpoints, by pin name ([`valid_pin_name`]): never dropped by retention,
    /// and refused to `rmdir` and `delete` while pinned.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pins: BTreeMap<String, u64>,
    /// Pins that expire (leases, such as the `restore-cp-N` a read of a Flink
    /// checkpoint's `_metadata` in the mount takes): pin name -> when it expires, in
    /// milliseconds since the Unix epoch. Each is in `pins` too, so that a reader that does
    /// not know this field keeps the checkpoint as pinned (the safe side); a daemon
    /// removes a pin once its time has passed. An optional field: a store without it has
    /// none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pin_expires: BTreeMap<String, u64>,
}

/// Longest pin name.
pub const MAX_PIN_NAME: usize = 64;

/// Most pins a store holds (each is looked at by every retention decision and shown in
/// the mount): a metadata file with more is damage.
pub const MAX_PINS: usize = 10_000;

/// Check a pin's name: 1 to [`MAX_PIN_NAME`] of `A-Z a-z 0-9 . _ -`, not starting with a
/// dot (it is a file name in the mount's `pinned/`).
pub fn valid_pin_name(name: &str) -> crate::error::Result<()> {
    let fine = !name.is_empty()
        && name.len() <= MAX_PIN_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if fine {
        Ok(())
    } else {
        Err(crate::error::Error::Invalid(format!(
            "invalid pin name {name:?}: 1 to {MAX_PIN_NAME} of A-Z a-z 0-9 . _ -, not \
             starting with a dot"
        )))
    }
}

/// How many ids past the store's next one its copy's next id is (see
/// [`StoreMeta::for_copy`]): the copy is rewritten once in this many checkpoints, not at
/// each, and a store rebuilt from it skips at most this many ids.
pub const COPY_IDS_AHEAD: u64 = 64;

/// How many dropped Flink checkpoints [`StoreMeta::flink_dropped`] remembers per job (Flink
/// retains a few; one that was dropped longer ago than that is gone from Flink's directory).
pub const FLINK_DROPS_KEPT: usize = 1024;

impl Default for StoreMeta {
    fn default() -> Self {
        StoreMeta {
            format: FORMAT,
            next_checkpoint: 1,
            retain: 3,
            backends: Vec::new(),
            epoch: 0,
            revision: 0,
            pending: Vec::new(),
            void_below: 0,
            void: Vec::new(),
            external: Vec::new(),
            flink_dropped: BTreeMap::new(),
            flink_dropped_ms: BTreeMap::new(),
            keep: ByTime::default(),
            pins: BTreeMap::new(),
            pin_expires: BTreeMap::new(),
        }
    }
}

impl StoreMeta {
    /// The retention policy: `retain` newest, and the rules by time.
    pub fn policy(&self) -> Policy {
        Policy {
            last: self.retain,
            by_time: self.keep.clone(),
        }
    }

    /// The names of the pins on checkpoint `id`.
    pub fn pins_of(&self, id: u64) -> Vec<String> {
        self.pins
            .iter()
            .filter(|(_, on)| **on == id)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// This record as its copy (`ckptfs.copy.json`) holds it: the settings (retain and the
    /// policy, pins, backends, dropped Flink checkpoints) and a next id
    /// [`COPY_IDS_AHEAD`] past this one's, so that the copy need not be rewritten at every
    /// checkpoint and still names an id past every one used; none of a writer's bookkeeping
    /// on object storage (epoch, revision, pending and void ids): the copy is no commit
    /// point, only what rebuilds the record when it is lost.
    pub fn for_copy(&self) -> StoreMeta {
        StoreMeta {
            format: FORMAT,
            next_checkpoint: self.next_checkpoint.saturating_add(COPY_IDS_AHEAD),
            epoch: 0,
            revision: 0,
            pending: Vec::new(),
            void_below: 0,
            void: Vec::new(),
            ..self.clone()
        }
    }

    /// True if this copy ([`StoreMeta::for_copy`]) still stands for `meta`: the same
    /// settings, and a next id at or past `meta`'s.
    pub fn covers(&self, meta: &StoreMeta) -> bool {
        self.next_checkpoint >= meta.next_checkpoint
            && *self
                == StoreMeta {
                    next_checkpoint: self.next_checkpoint,
                    ..meta.for_copy()
                }
    }

    /// Remember that the checkpoint imported from `label` was dropped.
    pub fn record_flink_drop(&mut self, label: &FlinkLabel) {
        let dropped = self.flink_dropped.entry(label.job.clone()).or_default();
        if let Err(at) = dropped.binary_search(&label.checkpoint) {
            dropped.insert(at, label.checkpoint);
        }
        if dropped.len() > FLINK_DROPS_KEPT {
            dropped.drain(..dropped.len() - FLINK_DROPS_KEPT);
        }
        if let Some(t) = label.time_unix_ms {
            let latest = self.flink_dropped_ms.entry(label.job.clone()).or_default();
            *latest = (*latest).max(t);
        }
    }

    /// Whether checkpoint `checkpoint` of Flink job `job` was imported and dropped.
    pub fn flink_was_dropped(&self, job: &str, checkpoint: u64) -> bool {
        self.flink_dropped
            .get(job)
            .is_some_and(|d| d.binary_search(&checkpoint).is_ok())
    }

    /// True if a manifest of checkpoint `id` is a committed checkpoint: not pending, not
    /// void. (Always true on a local store, which keeps neither list.)
    pub fn counts(&self, id: u64) -> bool {
        id >= self.void_below
            && self.void.binary_search(&id).is_err()
            && !self.pending.contains(&id)
    }

    /// Make `id` void: its manifest, if one exists or lands later, never counts.
    pub fn make_void(&mut self, id: u64) {
        self.pending.retain(|p| *p != id);
        if id >= self.void_below {
            if let Err(at) = self.void.binary_search(&id) {
                self.void.insert(at, id);
            }
        }
    }

    /// Keep the void list short: every id below the smallest one that may still count
    /// (`live`: the committed and in-flight checkpoints) is void as a range.
    pub fn compact_void(&mut self, live: impl IntoIterator<Item = u64>) {
        let floor = live
            .into_iter()
            .chain(self.pending.iter().copied())
            .chain(std::iter::once(self.next_checkpoint))
            .min()
            .unwrap_or(self.next_checkpoint);
        if floor > self.void_below {
            self.void_below = floor;
        }
        let below = self.void_below;
        self.void.retain(|id| *id >= below);
    }
}
