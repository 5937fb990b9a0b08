//! Which retained checkpoints reference each object, as runs, for the registry view and
//! `status` with thousands of checkpoints.
//!
//! Listing every referencing checkpoint of every object costs the sum of all reference
//! counts (millions with 10,000 checkpoints). Consecutive checkpoints differ in a few files,
//! and a backend that did not change shares its file list (one allocation) with the
//! checkpoint before, so walking the checkpoints in order and following only what changed
//! gives each object's references as a few runs of consecutive retained checkpoints.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::{BackendSnapshot, FileEntry, Manifest};
use crate::store::ObjectId;

/// One stored object as the retained checkpoints reference it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ObjectHistory {
    /// The file size (`None` for a file list, whose size the manifests do not record).
    pub size: Option<u64>,
    /// Runs of consecutive retained checkpoints that reference it: (first id, last id).
    pub runs: Vec<(u64, u64)>,
    /// How many retained checkpoints reference it (its reference count).
    pub count: u64,
    /// The (backend, file name) pairs it appears as.
    pub files: BTreeSet<(String, String)>,
    /// The backends it is a file list of.
    pub list_of: BTreeSet<String>,
}

/// Every referenced object's history, from the retained checkpoints (in any order).
pub fn object_histories<'a>(
    checkpoints: impl IntoIterator<Item = &'a Manifest>,
) -> BTreeMap<ObjectId, ObjectHistory> {
    let mut sorted: Vec<&Manifest> = checkpoints.into_iter().collect();
    sorted.sort_by_key(|m| m.id);
    let ids: Vec<u64> = sorted.iter().map(|m| m.id).collect();
    let mut out: BTreeMap<ObjectId, ObjectHistory> = BTreeMap::new();
    // Runs by position in `sorted`; an open run ends at usize::MAX until closed.
    let mut runs: HashMap<ObjectId, Vec<(usize, usize)>> = HashMap::new();
    // How many entries of the current checkpoint name each object.
    let mut live: HashMap<ObjectId, u32> = HashMap::new();
    let mut previous: HashMap<String, &BackendSnapshot> = HashMap::new();
    for (pos, m) in sorted.iter().enumerate() {
        let mut added: Vec<ObjectId> = Vec::new();
        let mut removed: Vec<ObjectId> = Vec::new();
        let mut current: HashMap<String, &BackendSnapshot> = HashMap::new();
        for b in &m.backends {
            let name = b.name.to_string();
            let mut on_add = |entry: Option<&FileEntry>, id: ObjectId| {
                added.push(id);
                let h = out.entry(id).or_default();
                match entry {
                    Some(f) => {
                        h.size = f.stored().find(|(o, _)| *o == id).map(|(_, size)| size);
                        h.files.insert((name.clone(), f.name.clone()));
                    }
                    None => {
                        h.list_of.insert(name.clone());
                    }
                }
            };
            match previous.remove(&name) {
                Some(old) => diff(old, b, &mut on_add, &mut removed),
                None => {
                    for f in b.files.iter() {
                        for (id, _) in f.stored() {
                            on_add(Some(f), id);
                        }
                    }
                    for l in b.lists.iter() {
                        on_add(None, l);
                    }
                }
            }
            current.insert(name, b);
        }
        // Backends this checkpoint does not have: everything they named goes.
        for old in previous.values() {
            removed.extend(old.files.iter().flat_map(|f| f.stored().map(|(id, _)| id)));
            removed.extend(old.lists.iter());
        }
        previous = current;
        // Adds first: an object that moves between entries keeps its run.
        for id in added {
            let n = live.entry(id).or_insert(0);
            *n += 1;
            if *n == 1 {
                runs.entry(id).or_default().push((pos, usize::MAX));
            }
        }
        for id in removed {
            let Some(n) = live.get_mut(&id) else { continue };
            *n -= 1;
            if *n == 0 {
                live.remove(&id);
                if let Some(run) = runs.get_mut(&id).and_then(|r| r.last_mut()) {
                    run.1 = pos - 1;
                }
            }
        }
    }
    let last = ids.len().saturating_sub(1);
    for (id, object_runs) in runs {
        let h = out.entry(id).or_default();
        for (first, end) in object_runs {
            let end = end.min(last);
            h.count += (end - first + 1) as u64;
            h.runs.push((ids[first], ids[end]));
        }
    }
    out
}

/// What changed between a backend's snapshot in two consecutive checkpoints.
fn diff(
    old: &BackendSnapshot,
    new: &BackendSnapshot,
    on_add: &mut impl FnMut(Option<&FileEntry>, ObjectId),
    removed: &mut Vec<ObjectId>,
) {
    if !old.files.ptr_eq(&new.files) {
        // Both sorted by name: one merge walk.
        let (mut a, mut b) = (old.files.iter().peekable(), new.files.iter().peekable());
        loop {
            let order = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) => x.name.cmp(&y.name),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => break,
            };
            match order {
                std::cmp::Ordering::Less => {
                    let x = a.next().expect("peeked");
                    removed.extend(x.stored().map(|(id, _)| id));
                }
                std::cmp::Ordering::Greater => {
                    let y = b.next().expect("peeked");
                    for (id, _) in y.stored() {
                        on_add(Some(y), id);
                    }
                }
                std::cmp::Ordering::Equal => {
                    let (x, y) = (a.next().expect("peeked"), b.next().expect("peeked"));
                    if !Arc::ptr_eq(x, y) && x != y {
                        removed.extend(x.stored().map(|(id, _)| id));
                        for (id, _) in y.stored() {
                            on_add(Some(y), id);
                        }
                    }
                }
            }
        }
    }
    if old.lists != new.lists {
        removed.extend(old.lists.iter().filter(|l| !new.lists.contains(l)));
        for l in new.lists.iter().filter(|l| !old.lists.contains(l)) {
            on_add(None, l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{CheckpointStats, FORMAT};
    use crate::store::chunks::Chunks;

    fn obj(content: &str) -> ObjectId {
        ObjectId::from_hash(blake3::hash(content.as_bytes()))
    }

    fn manifest(id: u64, backends: &[(&str, &[(&str, &str)])]) -> Arc<Manifest> {
        Arc::new(Manifest {
            format: FORMAT,
            id,
            started_unix_ms: 0,
            completed_unix_ms: 0,
            backends: backends
                .iter()
                .map(|(name, files)| {
                    super::super::BackendSnapshot::inline(
                        name.parse().unwrap(),
                        "l".into(),
                        files
                            .iter()
                            .map(|(n, c)| FileEntry {
                                name: n.to_string(),
                                object: obj(c),
                                size: c.len() as u64,
                                // MANIFESTs as chunks of 2 bytes.
                                chunks: n
                                    .starts_with("MANIFEST-")
                                    .then(|| Chunks::split(c.as_bytes(), 2).0),
                            })
                            .collect(),
                    )
                })
                .collect(),
            stats: CheckpointStats::default(),
        })
    }

    fn assert_runs_match_a_recount(cps: &[Arc<Manifest>]) -> BTreeMap<ObjectId, ObjectHistory> {
        let histories = object_histories(cps.iter().map(|m| &**m));
        for (id, h) in &histories {
            let referencing: Vec<u64> = cps
                .iter()
                .filter(|m| m.objects().contains(id))
                .map(|m| m.id)
                .collect();
            assert_eq!(h.count, referencing.len() as u64, "{id:?}");
            let from_runs: Vec<u64> = cps
                .iter()
                .map(|m| m.id)
                .filter(|cp| h.runs.iter().any(|(a, b)| a <= cp && cp <= b))
                .collect();
            assert_eq!(from_runs, referencing, "{id:?}");
        }
        let all: BTreeSet<ObjectId> = cps.iter().flat_map(|m| m.objects()).collect();
        assert_eq!(histories.keys().copied().collect::<BTreeSet<_>>(), all);
        histories
    }

    /// A MANIFEST that grows shares its full chunks between checkpoints; one chunk may
    /// appear twice in a file; a new MANIFEST starts over.
    #[test]
    fn chunked_files_count_each_chunk() {
        let cps = vec![
            manifest(1, &[("A/0", &[("MANIFEST-1", "aabbc")])]),
            manifest(2, &[("A/0", &[("MANIFEST-1", "aabbcc")])]),
            manifest(3, &[("A/0", &[("MANIFEST-1", "aabbccaa")])]),
            manifest(4, &[("A/0", &[("MANIFEST-9", "cc")])]),
        ];
        let h = assert_runs_match_a_recount(&cps);
        let chunk = |s: &str| obj(s);
        assert_eq!(h[&chunk("aa")].runs, vec![(1, 3)]);
        assert_eq!(h[&chunk("cc")].runs, vec![(2, 4)]);
        assert_eq!(h[&chunk("c")].runs, vec![(1, 1)]);
        assert_eq!(h[&chunk("aa")].size, Some(2));
    }

    /// The runs and counts equal a plain per-checkpoint recount, including objects shared
    /// by two backends, files whose content changes under the same name, an object that
    /// moves between backends, and a backend missing from one checkpoint.
    #[test]
    fn runs_match_a_recount() {
        let cps = vec![
            manifest(
                2,
                &[
                    ("A/0", &[("1.sst", "x"), ("CURRENT", "c")]),
                    ("B/0", &[("CURRENT", "c")]),
                ],
            ),
            manifest(
                3,
                &[
                    ("A/0", &[("1.sst", "x"), ("CURRENT", "c2")]),
                    ("B/0", &[("CURRENT", "c")]),
                ],
            ),
            manifest(5, &[("A/0", &[("2.sst", "y"), ("CURRENT", "c")])]),
            manifest(
                6,
                &[
                    ("A/0", &[("2.sst", "y")]),
                    ("B/0", &[("9.sst", "x"), ("CURRENT", "c")]),
                ],
            ),
            manifest(9, &[("A/0", &[("2.sst", "y")]), ("B/0", &[("9.sst", "x")])]),
        ];
        let histories = assert_runs_match_a_recount(&cps);
        assert_eq!(histories[&obj("x")].runs, vec![(2, 3), (6, 9)]);
        assert_eq!(histories[&obj("c")].runs, vec![(2, 6)]);
        assert_eq!(histories.len(), 4);
    }
}
