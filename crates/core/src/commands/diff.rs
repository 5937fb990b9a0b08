//! `ckptfs diff`: what changed between two checkpoints of a store. Per backend
//! (`<operator>/<subtask>`) and per state (an SST's column family, as [`du`] counts it), the
//! files added, removed and changed, with their bytes; computed from the two manifests, no
//! object is read. [`keys`] goes further: the keys added, removed and changed, by iterating
//! both checkpoints' RocksDB directories.
//!
//! Files are matched by their RocksDB name within a backend. A name in both checkpoints
//! whose content differs (another object or size: a file replaced under its old name, which
//! RocksDB does not do within one database but a restore, a new Flink upload of `OPTIONS` or
//! `MANIFEST`, or another imported database may) is *changed*: listed once, with both sizes,
//! and counted in neither added nor removed. A backend in one checkpoint only is shown as
//! such, every file of it added (only in B) or removed (only in A).
//!
//! A file is listed under the state of its entry in B (in A for a removed one). A and B
//! may be any two retained checkpoints, in either order (B older than A shows the way
//! back), and the same one (nothing changed).
//!
//! [`du`]: super::du

pub mod keys;

use std::collections::BTreeMap;

use serde::Serialize;

use super::du::{operator_name, state_of};
use crate::catalog::{BackendSnapshot, FileEntry, FlinkLabel, Manifest};
use crate::error::{Error, Result};

/// One side of the comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Side {
    /// The checkpoint's id (`cp-N`).
    pub id: u64,
    /// When its files were stored, in milliseconds since the Unix epoch.
    pub completed_unix_ms: u64,
    /// The Flink checkpoint it was imported from, if it was.
    pub flink: Option<FlinkLabel>,
}

/// Where a backend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    /// In both checkpoints.
    Both,
    /// In A only: every file removed.
    OnlyA,
    /// In B only: every file added.
    OnlyB,
}

/// Files and bytes added, removed, changed and unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Figures {
    /// Files only in B.
    pub files_added: u64,
    /// Their bytes.
    pub bytes_added: u64,
    /// Files only in A.
    pub files_removed: u64,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Files in both under one name, with other content.
    pub files_changed: u64,
    /// Their bytes in A.
    pub bytes_changed_a: u64,
    /// Their bytes in B.
    pub bytes_changed_b: u64,
    /// Files in both, the same content.
    pub files_unchanged: u64,
    /// Their bytes.
    pub bytes_unchanged: u64,
}

impl Figures {
    fn add(&mut self, other: &Figures) {
        self.files_added += other.files_added;
        self.bytes_added += other.bytes_added;
        self.files_removed += other.files_removed;
        self.bytes_removed += other.bytes_removed;
        self.files_changed += other.files_changed;
        self.bytes_changed_a += other.bytes_changed_a;
        self.bytes_changed_b += other.bytes_changed_b;
        self.files_unchanged += other.files_unchanged;
        self.bytes_unchanged += other.bytes_unchanged;
    }

    /// True if the two sides hold the same files.
    pub fn is_same(&self) -> bool {
        self.files_added == 0 && self.files_removed == 0 && self.files_changed == 0
    }
}

/// A file added or removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileRow {
    /// Its RocksDB name.
    pub name: String,
    /// Its size.
    pub bytes: u64,
}

/// A file in both checkpoints under one name, with other content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedFile {
    /// Its RocksDB name.
    pub name: String,
    /// Its size in A.
    pub bytes_a: u64,
    /// Its size in B.
    pub bytes_b: u64,
}

/// One state of a backend: an SST column family, `?` or `(other)` (as `du` names them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateDiff {
    /// The state's name.
    pub state: String,
    /// Its figures.
    #[serde(flatten)]
    pub figures: Figures,
    /// The files added, by name.
    pub added: Vec<FileRow>,
    /// The files removed, by name.
    pub removed: Vec<FileRow>,
    /// The files changed, by name.
    pub changed: Vec<ChangedFile>,
}

/// One backend, `<operator>/<subtask>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendDiff {
    /// The backend's name.
    pub backend: String,
    /// The operator's name, where a Flink label records it (B's, else A's); left out of
    /// the JSON when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// In both checkpoints, or one.
    pub presence: Presence,
    /// Its figures.
    #[serde(flatten)]
    pub figures: Figures,
    /// Per state, sorted by name; states with no file on either side are left out.
    pub states: Vec<StateDiff>,
    /// Its keys compared ([`keys::compare`]); left out of the JSON unless asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<keys::BackendKeys>,
}

/// `ckptfs diff`'s report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiffReport {
    /// Checkpoint A (the one compared from).
    pub a: Side,
    /// Checkpoint B (the one compared to).
    pub b: Side,
    /// The backends of either, sorted by name.
    pub backends: Vec<BackendDiff>,
    /// The sum over the backends.
    pub total: Figures,
}

fn side(m: &Manifest) -> Side {
    Side {
        id: m.id,
        completed_unix_ms: m.completed_unix_ms,
        flink: m.flink.clone(),
    }
}

/// Same content: the same object (BLAKE3 of the whole file, chunked or not) and size.
fn same_content(x: &FileEntry, y: &FileEntry) -> bool {
    x.object == y.object && x.size == y.size
}

fn backend_diff(a: Option<&BackendSnapshot>, b: Option<&BackendSnapshot>) -> BackendDiff {
    let presence = match (a, b) {
        (Some(_), Some(_)) => Presence::Both,
        (Some(_), None) => Presence::OnlyA,
        _ => Presence::OnlyB,
    };
    let files = |s: Option<&BackendSnapshot>| -> BTreeMap<String, std::sync::Arc<FileEntry>> {
        s.map(|s| {
            s.files
                .iter()
                .map(|f| (f.name.clone(), f.clone()))
                .collect()
        })
        .unwrap_or_default()
    };
    let (in_a, in_b) = (files(a), files(b));
    let mut states: BTreeMap<String, StateDiff> = BTreeMap::new();
    fn state<'a>(states: &'a mut BTreeMap<String, StateDiff>, name: &str) -> &'a mut StateDiff {
        states.entry(name.to_string()).or_insert_with(|| StateDiff {
            state: name.to_string(),
            figures: Figures::default(),
            added: Vec::new(),
            removed: Vec::new(),
            changed: Vec::new(),
        })
    }
    for (name, fa) in &in_a {
        match in_b.get(name) {
            None => {
                let s = state(&mut states, state_of(fa));
                s.figures.files_removed += 1;
                s.figures.bytes_removed += fa.size;
                s.removed.push(FileRow {
                    name: name.clone(),
                    bytes: fa.size,
                });
            }
            Some(fb) if same_content(fa, fb) => {
                let s = state(&mut states, state_of(fb));
                s.figures.files_unchanged += 1;
                s.figures.bytes_unchanged += fb.size;
            }
            Some(fb) => {
                let s = state(&mut states, state_of(fb));
                s.figures.files_changed += 1;
                s.figures.bytes_changed_a += fa.size;
                s.figures.bytes_changed_b += fb.size;
                s.changed.push(ChangedFile {
                    name: name.clone(),
                    bytes_a: fa.size,
                    bytes_b: fb.size,
                });
            }
        }
    }
    for (name, fb) in &in_b {
        if !in_a.contains_key(name) {
            let s = state(&mut states, state_of(fb));
            s.figures.files_added += 1;
            s.figures.bytes_added += fb.size;
            s.added.push(FileRow {
                name: name.clone(),
                bytes: fb.size,
            });
        }
    }
    let mut figures = Figures::default();
    for s in states.values() {
        figures.add(&s.figures);
    }
    let snapshot = b.or(a).expect("a backend of one side at least");
    BackendDiff {
        backend: snapshot.name.to_string(),
        name: None,
        presence,
        figures,
        states: states.into_values().collect(),
        keys: None,
    }
}

/// Checkpoint `id` among `manifests`, or a clear error naming `store`.
pub fn find<'a>(manifests: &'a [Manifest], id: u64, store: &str) -> Result<&'a Manifest> {
    manifests.iter().find(|m| m.id == id).ok_or_else(|| {
        Error::NotFound(format!(
            "no checkpoint {id} in {store} (not retained, or never taken)"
        ))
    })
}

/// The file-level report from checkpoint `a` to checkpoint `b` (which may be the same).
pub fn compare(a: &Manifest, b: &Manifest) -> DiffReport {
    let mut names: Vec<&crate::names::BackendName> = a
        .backends
        .iter()
        .chain(&b.backends)
        .map(|s| &s.name)
        .collect();
    names.sort();
    names.dedup();
    let mut total = Figures::default();
    let backends = names
        .into_iter()
        .map(|name| {
            let mut diff = backend_diff(a.backend(name), b.backend(name));
            diff.name = operator_name(b, name).or_else(|| operator_name(a, name));
            total.add(&diff.figures);
            diff
        })
        .collect();
    DiffReport {
        a: side(a),
        b: side(b),
        backends,
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{CheckpointStats, FORMAT};
    use crate::store::ObjectId;

    fn entry(name: &str, content: &str) -> FileEntry {
        let mut entry = FileEntry::whole(
            name,
            ObjectId::from_hash(blake3::hash(content.as_bytes())),
            content.len() as u64,
        );
        if name.ends_with(".sst") {
            entry.column_family = Some(content[..1].into());
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

    #[test]
    fn files_are_added_removed_changed_or_kept_by_name_and_content() {
        let a = manifest(
            3,
            &[
                (
                    "op/0",
                    &[("1.sst", "xaaa"), ("2.sst", "ybb"), ("CURRENT", "m1")],
                ),
                ("gone/0", &[("1.sst", "xq")]),
            ],
        );
        let b = manifest(
            5,
            &[
                (
                    "op/0",
                    &[("1.sst", "xaaa"), ("3.sst", "ycccc"), ("CURRENT", "m22")],
                ),
                ("new/1", &[("7.sst", "zz")]),
            ],
        );
        let report = compare(&a, &b);
        let names: Vec<&str> = report.backends.iter().map(|d| d.backend.as_str()).collect();
        assert_eq!(names, ["gone/0", "new/1", "op/0"]);
        let [gone, new, op] = &report.backends[..] else {
            panic!()
        };
        assert_eq!(gone.presence, Presence::OnlyA);
        assert_eq!(
            (gone.figures.files_removed, gone.figures.bytes_removed),
            (1, 2)
        );
        assert_eq!(new.presence, Presence::OnlyB);
        assert_eq!((new.figures.files_added, new.figures.bytes_added), (1, 2));
        assert_eq!(op.presence, Presence::Both);
        let f = &op.figures;
        assert_eq!((f.files_added, f.bytes_added), (1, 5));
        assert_eq!((f.files_removed, f.bytes_removed), (1, 3));
        assert_eq!(
            (f.files_changed, f.bytes_changed_a, f.bytes_changed_b),
            (1, 2, 3)
        );
        assert_eq!((f.files_unchanged, f.bytes_unchanged), (1, 4));
        let states: Vec<&str> = op.states.iter().map(|s| s.state.as_str()).collect();
        assert_eq!(states, ["(other)", "x", "y"]);
        assert_eq!(op.states[0].changed[0].name, "CURRENT");
        assert_eq!(op.states[2].added[0].name, "3.sst");
        assert_eq!(op.states[2].removed[0].name, "2.sst");
        assert_eq!(report.total.files_added, 2);
        assert_eq!(report.total.files_removed, 2);

        // The same checkpoint: nothing changed; either way round: the mirror image.
        let same = compare(&b, &b);
        assert!(same.backends.iter().all(|d| d.figures.is_same()));
        let back = compare(&b, &a);
        assert_eq!(back.total.files_added, report.total.files_removed);
        assert_eq!(back.total.bytes_changed_a, report.total.bytes_changed_b);

        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["backends"][0]["presence"], "only_a");
        assert_eq!(json["backends"][2]["files_changed"], 1);
        assert_eq!(json["backends"][2]["states"][2]["added"][0]["bytes"], 5);
        assert!(json["backends"][2].get("keys").is_none());
        assert_eq!(json["a"]["id"], 3);
    }
}
