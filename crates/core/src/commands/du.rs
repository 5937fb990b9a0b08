//! `ckptfs du`: what is big, and what grew. For each retained checkpoint and each of its
//! backends, the files and their bytes, and how the stored objects holding them are
//! shared with the other retained checkpoints: what the checkpoint added to the store
//! (`new`), what it has in common with an earlier one (`shared`), and what only it holds
//! (`exclusive`: what dropping it alone would free). Computed from the manifests only, no
//! object is read.
//!
//! Objects are the files' content objects (a file stored as chunks counts each chunk);
//! the file lists a manifest names are left out. An object counts once per backend (a
//! backend listing it twice counts it once) and once in a checkpoint's total (an object in
//! two backends of a checkpoint counts once there), so `new + shared` is the bytes of the
//! distinct objects, which is `bytes` unless identical files repeat.
//!
//! Each backend's figures are split by state: an SST's RocksDB column family (for Flink,
//! the state's name), as its manifest entry records it, counted by the same rules (an
//! object once per state). SSTs stored by a ckptfs that did not record column families
//! (store formats 1 to 7) are under [`UNKNOWN_STATE`]; every other file (MANIFEST,
//! OPTIONS, CURRENT, WAL, blob files, Flink's `_metadata`) under [`OTHER_STATE`].
//!
//! Backends are named by their directory, `<operator>/<subtask>` (for Flink, the operator's
//! uid or else its id), and by the operator's name where the checkpoint's Flink label
//! records it ([`FlinkLabel::operators`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::catalog::{FileEntry, FlinkLabel, Manifest};
use crate::names::BackendName;
use crate::store::ObjectId;

/// The state of an SST whose entry records no column family (stored before format 8).
pub const UNKNOWN_STATE: &str = "?";
/// The state of the files that are no SST: MANIFEST, OPTIONS, CURRENT, WAL, blob files and
/// Flink's `_metadata`.
pub const OTHER_STATE: &str = "(other)";

/// The state a file's bytes are counted under (see the module's documentation).
pub fn state_of(file: &FileEntry) -> &str {
    if !file.name.ends_with(".sst") {
        return OTHER_STATE;
    }
    file.column_family.as_deref().unwrap_or(UNKNOWN_STATE)
}

/// The figures of one backend of a checkpoint, or of the whole checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Files listed.
    pub files: u64,
    /// Their logical bytes (the sum of the files' sizes).
    pub bytes: u64,
    /// Bytes of stored objects no earlier retained checkpoint references.
    pub new: u64,
    /// Bytes of stored objects an earlier retained checkpoint references too.
    pub shared: u64,
    /// Bytes of stored objects no other retained checkpoint (earlier or later) references.
    pub exclusive: u64,
}

/// One backend of a checkpoint (`<operator>/<subtask>`, as the mount's `cp-N/` names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendUsage {
    /// The backend's name, `<operator>/<subtask>`.
    pub backend: String,
    /// The operator's name, where the checkpoint's Flink label records it (left out of the
    /// JSON when unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its figures.
    #[serde(flatten)]
    pub usage: Usage,
    /// Its figures per state, sorted by name.
    pub states: Vec<StateUsage>,
}

/// One state of a backend: an SST column family, [`UNKNOWN_STATE`] or [`OTHER_STATE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateUsage {
    /// The state's name.
    pub state: String,
    /// Its figures.
    #[serde(flatten)]
    pub usage: Usage,
}

/// One operator of a checkpoint: the backends `<operator>/*` together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperatorUsage {
    /// The operator's directory name (`<operator>` of its backends).
    pub operator: String,
    /// Its name, where the checkpoint's Flink label records it (left out when unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its figures.
    #[serde(flatten)]
    pub usage: Usage,
}

/// One retained checkpoint: per backend, per operator and in total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointUsage {
    /// The checkpoint's id (`cp-N`).
    pub id: u64,
    /// When its files were stored, in milliseconds since the Unix epoch.
    pub completed_unix_ms: u64,
    /// The Flink checkpoint it was imported from, if it was.
    pub flink: Option<FlinkLabel>,
    /// Its backends, sorted by name.
    pub backends: Vec<BackendUsage>,
    /// Per operator: all its subtasks' backends (an object in several counted once),
    /// sorted by name.
    pub operators: Vec<OperatorUsage>,
    /// The whole checkpoint (an object in several of its backends counted once).
    pub total: Usage,
}

/// `ckptfs du`'s report: the checkpoints asked for, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DuReport {
    /// One entry per checkpoint.
    pub checkpoints: Vec<CheckpointUsage>,
}

/// The name of `backend`'s operator, where the Flink label of `manifest` records it.
pub fn operator_name(manifest: &Manifest, backend: &BackendName) -> Option<String> {
    let label = manifest.flink.as_ref()?;
    label.operator_name(backend.operator()).map(str::to_string)
}

/// An operator's figures so far, the objects counted, its name.
type OperatorCount = (Usage, BTreeMap<ObjectId, u64>, Option<String>);

/// Where an object is referenced: the first retained checkpoint that does, and how many do.
struct Refs {
    first: u64,
    checkpoints: u64,
}

/// Add the figures of the distinct `objects` (with their sizes) of checkpoint `id` to `usage`.
fn count(
    usage: &mut Usage,
    id: u64,
    objects: &BTreeMap<ObjectId, u64>,
    refs: &BTreeMap<ObjectId, Refs>,
) {
    for (object, size) in objects {
        let r = &refs[object];
        if r.first == id {
            usage.new += size;
        } else {
            usage.shared += size;
        }
        if r.checkpoints == 1 {
            usage.exclusive += size;
        }
    }
}

/// The report over `manifests` (every retained checkpoint of a store, in any order): for
/// all of them, or for checkpoint `only` alone (counted against all of them). `None` if
/// `only` is not among them.
pub fn usage(manifests: &[Manifest], only: Option<u64>) -> Option<DuReport> {
    usage_of(manifests, only)
}

/// [`usage`] over manifests held elsewhere (the engine's, behind their `Arc`s).
pub fn usage_of<'a>(
    manifests: impl IntoIterator<Item = &'a Manifest>,
    only: Option<u64>,
) -> Option<DuReport> {
    let mut manifests: Vec<&Manifest> = manifests.into_iter().collect();
    manifests.sort_by_key(|m| m.id);
    let mut refs: BTreeMap<ObjectId, Refs> = BTreeMap::new();
    for m in &manifests {
        let objects: BTreeSet<ObjectId> = m.stored_sizes().map(|(id, _)| id).collect();
        for object in objects {
            refs.entry(object)
                .and_modify(|r| r.checkpoints += 1)
                .or_insert(Refs {
                    first: m.id,
                    checkpoints: 1,
                });
        }
    }
    if only.is_some_and(|id| !manifests.iter().any(|m| m.id == id)) {
        return None;
    }
    let checkpoints = manifests
        .iter()
        .filter(|m| only.is_none_or(|id| m.id == id))
        .map(|m| {
            let mut total = Usage::default();
            let mut all = BTreeMap::new();
            let backends = m
                .backends
                .iter()
                .map(|b| {
                    let mut usage = Usage::default();
                    let mut objects = BTreeMap::new();
                    let mut states: BTreeMap<&str, (Usage, BTreeMap<ObjectId, u64>)> =
                        BTreeMap::new();
                    for f in b.files.iter() {
                        usage.files += 1;
                        usage.bytes += f.size;
                        objects.extend(f.stored());
                        let (state, state_objects) = states.entry(state_of(f)).or_default();
                        state.files += 1;
                        state.bytes += f.size;
                        state_objects.extend(f.stored());
                    }
                    count(&mut usage, m.id, &objects, &refs);
                    let states = states
                        .into_iter()
                        .map(|(name, (mut usage, objects))| {
                            count(&mut usage, m.id, &objects, &refs);
                            StateUsage {
                                state: name.to_string(),
                                usage,
                            }
                        })
                        .collect();
                    total.files += usage.files;
                    total.bytes += usage.bytes;
                    all.extend(objects);
                    BackendUsage {
                        backend: b.name.to_string(),
                        name: operator_name(m, &b.name),
                        usage,
                        states,
                    }
                })
                .collect();
            count(&mut total, m.id, &all, &refs);
            let mut by_operator: BTreeMap<&str, OperatorCount> = BTreeMap::new();
            for b in &m.backends {
                let (usage, objects, _) =
                    by_operator.entry(b.name.operator()).or_insert_with(|| {
                        (Usage::default(), BTreeMap::new(), operator_name(m, &b.name))
                    });
                for f in b.files.iter() {
                    usage.files += 1;
                    usage.bytes += f.size;
                    objects.extend(f.stored());
                }
            }
            let operators = by_operator
                .into_iter()
                .map(|(operator, (mut usage, objects, name))| {
                    count(&mut usage, m.id, &objects, &refs);
                    OperatorUsage {
                        operator: operator.to_string(),
                        name,
                        usage,
                    }
                })
                .collect();
            CheckpointUsage {
                id: m.id,
                completed_unix_ms: m.completed_unix_ms,
                flink: m.flink.clone(),
                backends,
                operators,
                total,
            }
        })
        .collect();
    Some(DuReport { checkpoints })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{BackendSnapshot, CheckpointStats, FileEntry, FORMAT};

    fn entry(name: &str, content: &str) -> FileEntry {
        let mut entry = FileEntry::whole(
            name,
            ObjectId::from_hash(blake3::hash(content.as_bytes())),
            content.len() as u64,
        );
        // `9.sst` as stored before format 8: no column family.
        if name.ends_with(".sst") && name != "9.sst" {
            entry.column_family = Some(
                if content.len() % 2 == 0 {
                    "even"
                } else {
                    "odd"
                }
                .into(),
            );
        }
        entry
    }

    fn manifest(id: u64, backends: &[(&str, &[(&str, &str)])]) -> Manifest {
        Manifest {
            format: FORMAT,
            id,
            started_unix_ms: 0,
            completed_unix_ms: id * 1000,
            backends: backends
                .iter()
                .map(|(name, files)| {
                    BackendSnapshot::inline(
                        name.parse().unwrap(),
                        "l".into(),
                        files.iter().map(|(n, c)| entry(n, c)).collect(),
                    )
                })
                .collect(),
            stats: CheckpointStats::default(),
            flink: None,
        }
    }

    fn figures(u: &Usage) -> [u64; 5] {
        [u.files, u.bytes, u.new, u.shared, u.exclusive]
    }

    #[test]
    fn new_shared_and_exclusive_count_each_object_once() {
        let ms = vec![
            manifest(
                4,
                &[
                    ("op/0", &[("1.sst", "aaaa"), ("2.sst", "bb")]),
                    ("op/1", &[("1.sst", "aaaa"), ("3.sst", "c")]),
                ],
            ),
            manifest(3, &[("op/0", &[("1.sst", "aaaa"), ("9.sst", "zzzzz")])]),
            manifest(
                5,
                &[(
                    "op/0",
                    // The same content twice in one backend: one object.
                    &[("2.sst", "bb"), ("5.sst", "dddddd"), ("6.sst", "dddddd")],
                )],
            ),
        ];
        let report = usage(&ms, None).unwrap();
        let ids: Vec<u64> = report.checkpoints.iter().map(|c| c.id).collect();
        assert_eq!(ids, [3, 4, 5]);
        let [c3, c4, c5] = &report.checkpoints[..] else {
            panic!()
        };
        assert_eq!(figures(&c3.total), [2, 9, 9, 0, 5]);
        assert_eq!(figures(&c4.backends[0].usage), [2, 6, 2, 4, 0]);
        // `c` is exclusive to cp-4; `aaaa` is shared with cp-3.
        assert_eq!(figures(&c4.backends[1].usage), [2, 5, 1, 4, 1]);
        // aaaa (shared) once, bb and c new; only c exclusive.
        assert_eq!(figures(&c4.total), [4, 11, 3, 4, 1]);
        assert_eq!(figures(&c5.total), [3, 14, 6, 2, 6]);
        assert_eq!(c5.backends[0].backend, "op/0");
        // By state: aaaa (shared) and bb (new) are `even`, c (new, exclusive) `odd`.
        let states = |b: &BackendUsage| -> Vec<(String, [u64; 5])> {
            b.states
                .iter()
                .map(|s| (s.state.clone(), figures(&s.usage)))
                .collect()
        };
        assert_eq!(
            states(&c4.backends[1]),
            [
                ("even".into(), [1, 4, 0, 4, 0]),
                ("odd".into(), [1, 1, 1, 0, 1])
            ]
        );
        assert_eq!(
            states(&c3.backends[0]),
            [
                ("?".into(), [1, 5, 5, 0, 5]),
                ("even".into(), [1, 4, 4, 0, 0])
            ]
        );
        // The same object twice in one state counts once there.
        assert_eq!(states(&c5.backends[0]), [("even".into(), [3, 14, 6, 2, 6])]);

        assert_eq!(c4.backends[0].name, None);
        let mut labelled = ms.clone();
        labelled[0].flink = Some(FlinkLabel {
            job: "j".into(),
            checkpoint: 9,
            operators: [("op".to_string(), "My op".to_string())].into(),
            time_unix_ms: None,
        });
        let named = usage(&labelled, Some(4)).unwrap();
        assert_eq!(
            named.checkpoints[0].backends[1].name.as_deref(),
            Some("My op")
        );
        let json = serde_json::to_value(&named).unwrap();
        assert_eq!(json["checkpoints"][0]["backends"][0]["name"], "My op");
        assert_eq!(json["checkpoints"][0]["flink"]["operators"]["op"], "My op");

        let one = usage(&ms, Some(4)).unwrap();
        assert_eq!(one.checkpoints, vec![c4.clone()]);
        assert!(usage(&ms, Some(7)).is_none());
        let json = serde_json::to_value(&one).unwrap();
        assert_eq!(json["checkpoints"][0]["backends"][1]["backend"], "op/1");
        assert!(json["checkpoints"][0]["backends"][1].get("name").is_none());
        assert!(json["checkpoints"][0]["flink"].is_null());
        assert_eq!(json["checkpoints"][0]["backends"][1]["exclusive"], 1);
        assert_eq!(json["checkpoints"][0]["total"]["new"], 3);
        let odd = &json["checkpoints"][0]["backends"][1]["states"][1];
        assert_eq!(odd["state"], "odd");
        assert_eq!(odd["exclusive"], 1);
    }
}
