//! Which retained checkpoints reference each object, as runs, for the registry view and
//! `status` with thousands of checkpoints.
//!
//! Listing every referencing checkpoint of every object costs the sum of all reference
//! counts (millions with 10,000 checkpoints). Consecutive checkpoints differ in a few files,
//! and a backend that did not change shares its file list (one allocation) with the
//! checkpoint before, so walking the checkpoints in order and following only what changed
//! gives each object's references as a few runs of consecutive retained checkpoints.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{BackendSnapshot, FileEntry, Manifest};
use crate::names::BackendName;
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
    /// The (backend, file name) pairs it appears as, sorted, each once.
    pub files: Vec<(String, String)>,
    /// The backends it is a file list of, sorted, each once.
    pub list_of: Vec<String>,
}

/// Insert into a sorted vector of unique items (a set of usually one item: a `BTreeSet`
/// node was most of the memory of 100,000 histories).
fn insert_sorted<T: Ord>(set: &mut Vec<T>, item: T) {
    if let Err(at) = set.binary_search(&item) {
        set.reserve_exact(1);
        set.insert(at, item);
    }
}

/// One object while the checkpoints are walked.
#[derive(Default)]
struct Walk {
    history: ObjectHistory,
    /// How many entries of the current checkpoint name it.
    live: u32,
    /// Where its open run started (position in the sorted checkpoints), while `live > 0`.
    since: usize,
}

/// Every referenced object's history, from the retained checkpoints (in any order).
pub fn object_histories<'a>(
    checkpoints: impl IntoIterator<Item = &'a Manifest>,
) -> BTreeMap<ObjectId, ObjectHistory> {
    let mut sorted: Vec<&Manifest> = checkpoints.into_iter().collect();
    sorted.sort_by_key(|m| m.id);
    let ids: Vec<u64> = sorted.iter().map(|m| m.id).collect();
    // One table for everything known of an object (a third of the time went to missing
    // the cache in three maps of 100,000 and more objects each).
    let mut objects: HashMap<ObjectId, Walk> = HashMap::new();
    let close = |w: &mut Walk, end: usize| {
        w.history.count += (end - w.since + 1) as u64;
        w.history.runs.reserve_exact(1);
        w.history.runs.push((ids[w.since], ids[end]));
    };
    let mut previous: HashMap<&BackendName, &BackendSnapshot> = HashMap::new();
    for (pos, m) in sorted.iter().enumerate() {
        let mut added: Vec<ObjectId> = Vec::new();
        let mut removed: Vec<ObjectId> = Vec::new();
        let mut current: HashMap<&BackendName, &BackendSnapshot> = HashMap::new();
        for b in &m.backends {
            let name = b.name.to_string();
            let mut on_add = |entry: Option<&FileEntry>, id: ObjectId| {
                added.push(id);
                let h = &mut objects.entry(id).or_default().history;
                match entry {
                    Some(f) => {
                        h.size = f.stored().find(|(o, _)| *o == id).map(|(_, size)| size);
                        insert_sorted(&mut h.files, (name.clone(), f.name.clone()));
                    }
                    None => {
                        insert_sorted(&mut h.list_of, name.clone());
                    }
                }
            };
            match previous.remove(&b.name) {
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
            current.insert(&b.name, b);
        }
        // Backends this checkpoint does not have: everything they named goes.
        for old in previous.values() {
            removed.extend(old.files.iter().flat_map(|f| f.stored().map(|(id, _)| id)));
            removed.extend(old.lists.iter());
        }
        previous = current;
        // Adds first: an object that moves between entries keeps its run.
        for id in added {
            let w = objects.get_mut(&id).expect("added objects are known");
            w.live += 1;
            if w.live == 1 {
                w.since = pos;
            }
        }
        for id in removed {
            let Some(w) = objects.get_mut(&id).filter(|w| w.live > 0) else {
                continue;
            };
            w.live -= 1;
            if w.live == 0 {
                close(w, pos - 1);
            }
        }
    }
    let last = ids.len().saturating_sub(1);
    objects
        .into_iter()
        .map(|(id, mut w)| {
            if w.live > 0 {
                close(&mut w, last);
            }
            (id, w.history)
        })
        .collect()
}

/// What changed between a backend's snapshot in two consecutive checkpoints.
fn diff(
    old: &BackendSnapshot,
    new: &BackendSnapshot,
    on_add: &mut impl FnMut(Option<&FileEntry>, ObjectId),
    removed: &mut Vec<ObjectId>,
) {
    if !old.files.ptr_eq(&new.files) {
        // Both sorted by name: one merge walk, after the leading blocks they share.
        let shared = old.files.shared_blocks(&new.files);
        let (mut a, mut b) = (
            old.files.iter_after(shared).peekable(),
            new.files.iter_after(shared).peekable(),
        );
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
                        // A grown append-only file keeps its leading chunks: only the
                        // stored objects that differ at a place come and go.
                        let (mut xs, mut ys) = (x.stored(), y.stored());
                        loop {
                            match (xs.next(), ys.next()) {
                                (None, None) => break,
                                (a, b) if a == b => {}
                                (a, b) => {
                                    removed.extend(a.map(|(id, _)| id));
                                    if let Some((id, _)) = b {
                                        on_add(Some(y), id);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if new.lists.extends(&old.lists) {
        // The usual step: a delta on the previous list.
        on_add(None, new.lists.first().expect("a list"));
    } else if old.lists != new.lists {
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
    use std::collections::BTreeSet;

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
                                    .then(|| Box::new(Chunks::split(c.as_bytes(), 2).0)),
                                source: None,
                                column_family: None,
                            })
                            .collect(),
                    )
                })
                .collect(),
            stats: CheckpointStats::default(),
            flink: None,
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
