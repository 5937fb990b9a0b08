//! The JSON views of a store, as types: `.ckptfs/status`, `.ckptfs/checkpoints` and
//! `.ckptfs/registry` of a mount, and the status `ckptfs status` shows of a store read
//! without a daemon. The daemon serialises these, the command line deserialises them (or
//! builds them offline with the same functions), so the two sides cannot drift apart.
//!
//! The fields of [`CheckpointRow`], [`Status`] and [`StoreStatus`] are declared in
//! alphabetical order, the order of a `serde_json` map (which sorts its keys): the bytes
//! of these views are those of sorted maps, which the readers of the files expect.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::catalog::history::ObjectHistory;
use crate::catalog::{Manifest, StoreMeta};
use crate::coordinator::Engine;
use crate::store::{Location, ObjectId};

/// Checkpoints [`Status`] describes one by one (the newest); `.ckptfs/checkpoints` lists all.
pub const STATUS_CHECKPOINTS: usize = 100;

/// Checkpoints [`StoreStatus`] describes one by one (the newest).
pub const STORE_STATUS_CHECKPOINTS: usize = 10;

/// One checkpoint as `.ckptfs/checkpoints`, `status` and `ckptfs ls` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRow {
    /// Milliseconds of the asynchronous phase, up to the commit.
    pub async_ms: f64,
    /// Backends whose materialization the checkpoint adopted (`wal` mode).
    pub backends_materialized: u64,
    /// Bytes of the files the checkpoint names.
    pub bytes: u64,
    /// Of `bytes_uploaded`, the bytes the object store copied from the source itself.
    #[serde(default)]
    pub bytes_copied: u64,
    /// Bytes the checkpoint stored as new objects (files, chunks, file lists).
    pub bytes_uploaded: u64,
    /// Of `bytes_uploaded`, bytes of new chunks of append-only files other than WAL files
    /// (MANIFEST).
    pub bytes_uploaded_append_only: u64,
    /// Bytes an adopted background materialization stored before the checkpoint began.
    pub bytes_uploaded_materialization: u64,
    /// Of `bytes_uploaded`, bytes of new WAL chunks.
    pub bytes_uploaded_wal: u64,
    /// Bytes of the WAL files the checkpoint names.
    pub bytes_wal: u64,
    /// When the checkpoint's files were stored, in milliseconds since the Unix epoch.
    pub completed_unix_ms: u64,
    /// Files the checkpoint names.
    pub files: u64,
    /// Files not re-referenced by name (stored, or found stored by their hash).
    pub files_new: u64,
    /// Files re-referenced without being read.
    pub files_reused: u64,
    /// Imported from a Flink checkpoint: which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flink: Option<crate::catalog::FlinkLabel>,
    /// The checkpoint's id.
    pub id: u64,
    /// Milliseconds of the synchronous phase, during which writers wait.
    pub sync_ms: f64,
}

impl CheckpointRow {
    /// The row of the checkpoint `m` describes.
    pub fn of(m: &Manifest) -> CheckpointRow {
        let s = &m.stats;
        CheckpointRow {
            async_ms: s.async_micros as f64 / 1000.0,
            backends_materialized: s.backends_materialized,
            bytes: s.bytes_total,
            bytes_copied: s.bytes_copied,
            bytes_uploaded: s.bytes_uploaded,
            bytes_uploaded_append_only: s.bytes_uploaded_append_only,
            bytes_uploaded_materialization: s.bytes_uploaded_materialization,
            bytes_uploaded_wal: s.bytes_uploaded_wal,
            bytes_wal: s.bytes_wal,
            completed_unix_ms: m.completed_unix_ms,
            files: s.files_total,
            files_new: s.files_new,
            files_reused: s.files_reused,
            flink: m.flink.clone(),
            id: m.id,
            sync_ms: s.sync_micros as f64 / 1000.0,
        }
    }
}

/// Small SSTs merged by small-file compaction since the daemon started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmallFileCompactions {
    /// Bytes of the SSTs merged.
    pub bytes: u64,
    /// SSTs merged.
    pub files: u64,
}

/// `.ckptfs/status` of a mount: a summary whose cost does not follow the number of
/// checkpoints (the newest [`STATUS_CHECKPOINTS`] one by one, all of them as runs of ids).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The hosted backends, sorted.
    pub backends: Vec<String>,
    /// How checkpoints capture the memtables: `flush` or `wal`.
    pub checkpoint_mode: String,
    /// Every retained checkpoint, as runs of consecutive ids: [first, last].
    pub checkpoint_runs: Vec<[u64; 2]>,
    /// The newest [`STATUS_CHECKPOINTS`] retained checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointRow>,
    /// How many checkpoints are retained.
    pub checkpoints_total: usize,
    /// Backends whose state is imported (`ckptfs import`), not hosted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<String>,
    /// Flink checkpoints imported and dropped since, by job: never imported again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flink_dropped: BTreeMap<String, Vec<u64>>,
    /// Flink checkpoints the follower refuses for what they are: not read again until
    /// their `_metadata` changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flink_refused: Vec<crate::coordinator::FlinkRefused>,
    /// The Flink follower (`mount --flink`): when it last looked, Flink's newest
    /// checkpoint then, the store's lag behind it. Absent where no job is followed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flink_follower: Option<crate::coordinator::FollowerHealth>,
    /// The checkpoints begun and not yet committed or failed, ascending.
    pub in_flight: Vec<u64>,
    /// The newest error the daemon recorded, if any
    /// ([`EngineStatus::last_error`](crate::coordinator::EngineStatus::last_error)).
    pub last_error: Option<String>,
    /// `wal` mode: the checkpoint each backend's newest confirmed materialization is.
    pub materializations: BTreeMap<String, u64>,
    /// Most checkpoints in flight at once.
    pub max_concurrent: usize,
    /// Stored objects the retained checkpoints reference.
    pub objects: usize,
    /// The daemon's process id.
    pub pid: u32,
    /// The pins: name -> checkpoint.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pins: BTreeMap<String, u64>,
    /// The pins that expire (restore leases): name -> when, in milliseconds since the
    /// Unix epoch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pin_expires: BTreeMap<String, u64>,
    /// The retention policy, as the control file's `keep` takes it (`last=3 daily=7`).
    #[serde(default)]
    pub policy: Vec<String>,
    /// A read-only view of a store another daemon writes (`mount --read-only`).
    pub read_only: bool,
    /// How many checkpoints the store retains.
    pub retain: u32,
    /// Small SSTs merged since the daemon started.
    pub small_file_compactions: SmallFileCompactions,
    /// Where the store is: a path or an `s3://` URL.
    pub store: String,
    /// Bytes of the objects the retained checkpoints reference (file lists not sized).
    pub store_bytes: u64,
}

impl Status {
    /// The status of this process's engine.
    pub fn of(engine: &Engine) -> Status {
        let status = engine.status();
        let newest = status.checkpoints.len().saturating_sub(STATUS_CHECKPOINTS);
        Status {
            backends: status.backends.iter().map(|b| b.to_string()).collect(),
            checkpoint_mode: status.checkpoint_mode.to_string(),
            checkpoint_runs: checkpoint_runs(status.checkpoints.iter().map(|m| m.id)),
            checkpoints: status.checkpoints[newest..]
                .iter()
                .map(|m| CheckpointRow::of(m))
                .collect(),
            checkpoints_total: status.checkpoints.len(),
            external: status.external.iter().map(|b| b.to_string()).collect(),
            flink_dropped: engine.flink_dropped(),
            flink_refused: engine.flink_refused(),
            flink_follower: engine.follower_health(),
            in_flight: status.in_flight,
            last_error: status.last_error,
            materializations: status
                .materializations
                .iter()
                .map(|(b, id)| (b.to_string(), *id))
                .collect(),
            max_concurrent: status.max_concurrent,
            objects: status.objects,
            pid: std::process::id(),
            pins: engine.pins(),
            pin_expires: engine.pin_expires(),
            policy: engine.policy().to_rules(),
            read_only: engine.is_read_only(),
            retain: status.retain,
            small_file_compactions: SmallFileCompactions {
                files: status.small_file_compactions.0,
                bytes: status.small_file_compactions.1,
            },
            store: engine.location().to_string(),
            store_bytes: status.referenced_bytes,
        }
    }
}

/// Who holds the lease of a store on object storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// When the lease expires unless renewed, by the holder's clock, in milliseconds since
    /// the Unix epoch (0: released). Shown to people; clocks differ.
    pub expires_unix_ms: u64,
    /// Who holds it: host and process id.
    pub holder: String,
}

/// `ckptfs status` of a store read without a daemon: its settings, checkpoints, size and,
/// on object storage, who holds its lease. The settings are `None` where the store has no
/// metadata record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreStatus {
    /// The hosted backends the metadata names.
    pub backends: Option<Vec<String>>,
    /// Every retained checkpoint, as runs of consecutive ids: [first, last].
    pub checkpoint_runs: Vec<[u64; 2]>,
    /// The newest [`STORE_STATUS_CHECKPOINTS`] retained checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointRow>,
    /// How many checkpoints are retained.
    pub checkpoints_total: usize,
    /// Backends whose state is imported (`ckptfs import`), not hosted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<String>,
    /// The format the metadata was written in.
    pub format: Option<u32>,
    /// Who holds the store's lease; `None` where there is no lease record (a local store,
    /// or one no daemon wrote to).
    pub lease: Option<LeaseView>,
    /// The id the next checkpoint gets.
    pub next_checkpoint: Option<u64>,
    /// Stored objects the retained checkpoints' files reference (files and chunks; file
    /// lists not counted).
    pub objects: usize,
    /// The pins: name -> checkpoint.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pins: BTreeMap<String, u64>,
    /// The retention policy, as the control file's `keep` takes it.
    #[serde(default)]
    pub policy: Option<Vec<String>>,
    /// How many checkpoints the store retains.
    pub retain: Option<u32>,
    /// Where the store is: a path or an `s3://` URL.
    pub store: String,
    /// Bytes of those objects.
    pub store_bytes: u64,
}

impl StoreStatus {
    /// The status of the store at `location` with this metadata, these retained
    /// checkpoints (oldest first) and this lease holder (name, expiry in unix ms).
    pub fn build(
        location: &Location,
        meta: Option<&StoreMeta>,
        manifests: &[Manifest],
        lease: Option<(String, u64)>,
    ) -> StoreStatus {
        let mut sizes = BTreeMap::new();
        for m in manifests {
            sizes.extend(m.stored_sizes());
        }
        let newest = manifests.len().saturating_sub(STORE_STATUS_CHECKPOINTS);
        StoreStatus {
            backends: meta.map(|m| m.backends.iter().map(|b| b.to_string()).collect()),
            checkpoint_runs: checkpoint_runs(manifests.iter().map(|m| m.id)),
            checkpoints: manifests[newest..].iter().map(CheckpointRow::of).collect(),
            checkpoints_total: manifests.len(),
            external: meta.map_or_else(Vec::new, |m| {
                m.external.iter().map(|b| b.to_string()).collect()
            }),
            format: meta.map(|m| m.format),
            lease: lease.map(|(holder, expires_unix_ms)| LeaseView {
                expires_unix_ms,
                holder,
            }),
            next_checkpoint: meta.map(|m| m.next_checkpoint),
            objects: sizes.len(),
            pins: meta.map_or_else(BTreeMap::new, |m| m.pins.clone()),
            policy: meta.map(|m| m.policy().to_rules()),
            retain: meta.map(|m| m.retain),
            store: location.to_string(),
            store_bytes: sizes.values().sum(),
        }
    }
}

/// Ids (ascending) as runs of consecutive ones, `[first, last]`: "1-9999 10001" instead of
/// ten thousand numbers.
pub fn checkpoint_runs(ids: impl IntoIterator<Item = u64>) -> Vec<[u64; 2]> {
    let mut runs: Vec<[u64; 2]> = Vec::new();
    for id in ids {
        match runs.last_mut() {
            Some(run) if run[1].checked_add(1) == Some(id) => run[1] = id,
            _ => runs.push([id, id]),
        }
    }
    runs
}

/// One stored object as a line of `.ckptfs/registry` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryRow {
    /// The object.
    pub id: ObjectId,
    /// Its length in bytes.
    pub size: u64,
    /// How many retained checkpoints reference it.
    pub refcount: u32,
    /// The retained checkpoints that reference it, as runs: [first, last].
    pub checkpoint_runs: Vec<[u64; 2]>,
    /// The files it is, in which backend.
    pub files: Vec<RegistryFile>,
    /// The backends it is a file list of (absent for a file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file_list_of: Vec<String>,
}

/// One file a stored object is, as [`RegistryRow::files`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryFile {
    /// The backend the file belongs to.
    pub backend: String,
    /// The file's RocksDB name.
    pub name: String,
}

impl RegistryRow {
    /// The row of object `id` with this history, size and reference count.
    pub fn of(id: ObjectId, history: &ObjectHistory, size: u64, refcount: u32) -> RegistryRow {
        RegistryRow {
            id,
            size,
            refcount,
            checkpoint_runs: history.runs.iter().map(|(a, b)| [*a, *b]).collect(),
            files: history
                .files
                .iter()
                .map(|(backend, name)| RegistryFile {
                    backend: backend.clone(),
                    name: name.clone(),
                })
                .collect(),
            file_list_of: history.list_of.clone(),
        }
    }
}

/// Pretty JSON with a final newline (as `.ckptfs/status` and `status --json` show it).
pub fn to_pretty_text<T: Serialize>(view: &T) -> String {
    // These views hold only strings, numbers and maps with string keys: they always
    // serialise.
    let mut text = serde_json::to_string_pretty(view).unwrap_or_default();
    text.push('\n');
    text
}

/// `.ckptfs/checkpoints`: one JSON line per checkpoint, in the order given.
pub fn checkpoint_lines<'a>(manifests: impl IntoIterator<Item = &'a Manifest>) -> String {
    let mut out = String::new();
    for m in manifests {
        out.push_str(&serde_json::to_string(&CheckpointRow::of(m)).unwrap_or_default());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::CheckpointStats;

    fn manifest(id: u64) -> Manifest {
        Manifest {
            format: crate::catalog::FORMAT,
            id,
            started_unix_ms: 1_700_000_000_000,
            completed_unix_ms: 1_700_000_000_500 + id,
            backends: Vec::new(),
            stats: CheckpointStats {
                files_total: 7,
                files_new: 2,
                files_reused: 5,
                bytes_total: 9000,
                bytes_uploaded: 1200,
                bytes_new_sst: 1000,
                bytes_uploaded_append_only: 100,
                bytes_wal: 50,
                bytes_uploaded_wal: 40,
                backends_materialized: 1,
                bytes_uploaded_materialization: 30,
                bytes_copied: 20,
                sync_micros: 1500,
                async_micros: 2250,
            },
            flink: None,
        }
    }

    /// The row's text, field by field, as `ckptfs ls --json` and scripts read it.
    #[test]
    fn a_checkpoint_row_keeps_its_field_names_and_order() {
        let text = serde_json::to_string(&CheckpointRow::of(&manifest(3))).unwrap();
        assert_eq!(
            text,
            "{\"async_ms\":2.25,\"backends_materialized\":1,\"bytes\":9000,\
             \"bytes_copied\":20,\"bytes_uploaded\":1200,\"bytes_uploaded_append_only\":100,\
             \"bytes_uploaded_materialization\":30,\"bytes_uploaded_wal\":40,\
             \"bytes_wal\":50,\"completed_unix_ms\":1700000000503,\"files\":7,\
             \"files_new\":2,\"files_reused\":5,\"id\":3,\"sync_ms\":1.5}"
        );
        let back: CheckpointRow = serde_json::from_str(&text).unwrap();
        assert_eq!(back, CheckpointRow::of(&manifest(3)));
        assert_eq!(checkpoint_lines(&[manifest(3)]), format!("{text}\n"));
    }

    #[test]
    fn ids_become_runs_of_consecutive_ones() {
        assert!(checkpoint_runs([]).is_empty());
        assert_eq!(checkpoint_runs([4]), vec![[4, 4]]);
        assert_eq!(
            checkpoint_runs([1, 2, 3, 5, 7, 8, u64::MAX]),
            vec![[1, 3], [5, 5], [7, 8], [u64::MAX, u64::MAX]]
        );
    }

    /// A store read without a daemon: the newest checkpoints one by one, sizes counted
    /// once per object, the lease named; without metadata the settings are null.
    #[test]
    fn a_store_status_is_built_from_its_records() {
        let location = Location::parse("s3://bucket/prefix").unwrap();
        let manifests: Vec<Manifest> = (1..=12).chain([20]).map(manifest).collect();
        let meta = StoreMeta {
            format: 4,
            next_checkpoint: 21,
            retain: 13,
            backends: vec!["A/0".parse().unwrap()],
            epoch: 0,
            revision: 0,
            pending: Vec::new(),
            void_below: 0,
            void: Vec::new(),
            external: Vec::new(),
            flink_dropped: Default::default(),
            flink_dropped_ms: Default::default(),
            keep: Default::default(),
            pins: [("before-deploy".to_string(), 12)].into(),
            pin_expires: Default::default(),
        };
        let status = StoreStatus::build(
            &location,
            Some(&meta),
            &manifests,
            Some(("host:1".into(), 99)),
        );
        assert_eq!(status.checkpoint_runs, vec![[1, 12], [20, 20]]);
        assert_eq!(status.checkpoints_total, 13);
        let shown: Vec<u64> = status.checkpoints.iter().map(|c| c.id).collect();
        assert_eq!(shown, (4..=12).chain([20]).collect::<Vec<_>>());
        assert_eq!(status.backends, Some(vec!["A/0".to_string()]));
        assert_eq!(status.next_checkpoint, Some(21));
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(value["lease"]["holder"], "host:1");
        assert_eq!(value["lease"]["expires_unix_ms"], 99);
        assert_eq!(value["store"], "s3://bucket/prefix");
        let back: StoreStatus = serde_json::from_value(value).unwrap();
        assert_eq!(back, status);

        let bare = StoreStatus::build(&location, None, &[], None);
        let value = serde_json::to_value(&bare).unwrap();
        for key in [
            "format",
            "retain",
            "next_checkpoint",
            "backends",
            "lease",
            "policy",
        ] {
            assert!(value[key].is_null(), "{key}: {value}");
        }
        assert_eq!(value["objects"], 0);
    }

    /// The status of a real engine: what it holds, serialised with the fields the mount
    /// has always shown, and read back whole.
    #[test]
    fn a_daemon_status_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = crate::EngineConfig::new(dir.path().join("store"));
        config.backends = vec!["A/0".parse().unwrap(), "B/1".parse().unwrap()];
        config.retain = Some(2);
        let engine = Engine::open(config).unwrap();
        for i in 0..3 {
            engine
                .put(&"A/0".parse().unwrap(), b"k", i.to_string().as_bytes())
                .unwrap();
            engine.checkpoint().unwrap();
        }
        let status = Status::of(&engine);
        assert_eq!(status.checkpoint_runs, vec![[2, 3]]);
        assert_eq!(status.checkpoints_total, 2);
        assert_eq!(status.backends, vec!["A/0", "B/1"]);
        assert_eq!(status.retain, 2);
        assert_eq!(status.pid, std::process::id());
        assert!(status.objects > 0 && status.store_bytes > 0);
        let text = to_pretty_text(&status);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "backends",
                "checkpoint_mode",
                "checkpoint_runs",
                "checkpoints",
                "checkpoints_total",
                "in_flight",
                "last_error",
                "materializations",
                "max_concurrent",
                "objects",
                "pid",
                "policy",
                "read_only",
                "retain",
                "small_file_compactions",
                "store",
                "store_bytes"
            ]
        );
        // The same bytes as a sorted map of the same values (what the view always was).
        let mut sorted = serde_json::to_string_pretty(&value).unwrap();
        sorted.push('\n');
        assert_eq!(text, sorted);
        let back: Status = serde_json::from_str(&text).unwrap();
        assert_eq!(back, status);
    }

    #[test]
    fn a_registry_row_names_lists_only_for_lists() {
        let id = ObjectId::from_hash(blake3::hash(b"x"));
        let file = ObjectHistory {
            size: Some(5),
            runs: vec![(1, 2), (4, 4)],
            count: 3,
            files: vec![("A/0".into(), "000007.sst".into())],
            list_of: Vec::new(),
        };
        let text = serde_json::to_string(&RegistryRow::of(id, &file, 5, 3)).unwrap();
        assert_eq!(
            text,
            format!(
                "{{\"id\":\"{id}\",\"size\":5,\"refcount\":3,\"checkpoint_runs\":[[1,2],[4,4]],\
                 \"files\":[{{\"backend\":\"A/0\",\"name\":\"000007.sst\"}}]}}"
            )
        );
        let list = ObjectHistory {
            size: None,
            runs: vec![(1, 1)],
            count: 1,
            files: Vec::new(),
            list_of: vec!["A/0".into()],
        };
        let row = RegistryRow::of(id, &list, 80, 1);
        let text = serde_json::to_string(&row).unwrap();
        assert!(
            text.ends_with(",\"files\":[],\"file_list_of\":[\"A/0\"]}"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<RegistryRow>(&text).unwrap(), row);
    }
}
