//! `ckptfs fsck`: recount references from the manifests and check every object, then,
//! with `--repair`, act on what was found. As a prune plan is computed before anything is
//! deleted, [`Fsck::check`] changes nothing and returns an [`FsckPlan`] (the findings as
//! typed rows, and what a repair would do); [`Fsck::repair`] carries that plan out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};

use crate::catalog::{Manifest, StoreMeta};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::lock::StoreLock;
use crate::registry::Registry;
use crate::repo::Repo;
use crate::store::{hash_file, Location, ObjectId};

/// What `ckptfs fsck` found (and, after a repair, what it repaired). Serialized as
/// `ckptfs fsck --json` prints it: object ids as hex, each row as the line the text output
/// shows.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct FsckReport {
    /// The checkpoints whose manifest was read, ascending.
    pub checkpoints: Vec<u64>,
    /// Objects those manifests reference: files, chunks and file lists.
    pub objects_referenced: usize,
    /// Objects the store holds.
    pub objects_stored: usize,
    /// Bytes of the referenced files and chunks (file lists not sized).
    pub bytes_referenced: u64,
    /// Reference count per object, recomputed from the manifests.
    pub counts: BTreeMap<ObjectId, u32>,
    /// Stored objects no readable manifest references (the young ones among them too, see
    /// `orphans_young`).
    pub orphans: Vec<ObjectId>,
    /// Referenced files and chunks the store does not hold.
    pub missing: Vec<ObjectId>,
    /// Referenced files and chunks the store holds but that fail verification: another
    /// size, another hash, or a read that failed.
    pub corrupt: Vec<ObjectId>,
    /// Checkpoints that reference a missing or corrupt object.
    pub damaged_checkpoints: Vec<u64>,
    /// Manifests that cannot be read. With them present, no object is called an orphan:
    /// the unreadable manifest may reference it.
    pub unreadable_manifests: Vec<UnreadableManifest>,
    /// Where `--repair` moved the unreadable manifests (never deleted).
    pub quarantined: Vec<String>,
    /// Problems of the store as a whole (ckptfs.json, an incomplete store).
    pub problems: Vec<StoreProblem>,
    /// Why orphans are kept rather than deleted, if they are: while the catalog is
    /// incomplete or a manifest unreadable or quarantined, which objects are really
    /// unreferenced is not known.
    pub orphans_kept: Option<OrphansKept>,
    /// Orphans on object storage younger than the grace period: perhaps the uploads of a
    /// daemon still running; never deleted by fsck.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orphans_young: Vec<ObjectId>,
    /// Leftovers of interrupted writes: objects being staged in a local store's `tmp/`,
    /// and temporary files of manifests and metadata.
    pub staged_leftovers: usize,
    /// Missing or corrupt objects that `--repair` stored again from an identical copy
    /// found outside the store.
    pub repaired_objects: Vec<RepairedObject>,
    /// Orphans `--repair` deleted.
    pub repaired_orphans: usize,
    /// Leftovers `--repair` removed.
    pub repaired_leftovers: usize,
}

impl FsckReport {
    /// True when nothing is wrong (after repair, if one ran).
    pub fn is_clean(&self) -> bool {
        let repaired: BTreeSet<ObjectId> = self.repaired_objects.iter().map(|r| r.id).collect();
        self.missing
            .iter()
            .chain(&self.corrupt)
            .all(|id| repaired.contains(id))
            && self.unreadable_manifests.len() == self.quarantined.len()
            && self.problems.is_empty()
            && self.orphans.len() == self.repaired_orphans
            && self.staged_leftovers == self.repaired_leftovers
    }
}

/// Serialize a row as the line it is shown as (its `Display`).
macro_rules! serialize_as_text {
    ($($row:ty),*) => {$(
        impl Serialize for $row {
            fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    )*};
}

serialize_as_text!(
    UnreadableManifest,
    StoreProblem,
    OrphansKept,
    RepairedObject
);

/// A manifest file that cannot be read (shown as `NAME: WHY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableManifest {
    /// Its file name in `checkpoints/`.
    pub name: String,
    /// Why it cannot be read.
    pub error: String,
}

impl fmt::Display for UnreadableManifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.error)
    }
}

/// A problem of the store as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreProblem {
    /// `ckptfs.json` cannot be read (or, for a repair, taken over): why.
    MetaUnreadable(String),
    /// `ckptfs.json` is missing while manifests (or its copy) exist; whether its copy,
    /// `ckptfs.copy.json`, is there to rebuild it from.
    MetaMissing {
        /// The copy is there and can be read.
        copy: bool,
    },
    /// `ckptfs.json` is missing and its copy cannot be read: why. The next start is
    /// refused until the copy is moved aside.
    MetaCopyUnreadable(String),
    /// Objects but no `checkpoints/` directory.
    NoCatalogDir,
}

impl fmt::Display for StoreProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreProblem::MetaUnreadable(why) => f.write_str(why),
            StoreProblem::MetaMissing { copy: true } => f.write_str(
                "ckptfs.json is missing (the next mount rebuilds it from its copy, \
                 ckptfs.copy.json, and the manifests)",
            ),
            StoreProblem::MetaMissing { copy: false } => f.write_str(
                "ckptfs.json is missing and has no copy (the next mount rebuilds it from the \
                 manifests alone: the pins, the policy's rules by time and the dropped Flink \
                 checkpoints are lost, and every checkpoint is retained)",
            ),
            StoreProblem::MetaCopyUnreadable(why) => write!(
                f,
                "ckptfs.json is missing and its copy cannot be read, so the next mount is \
                 refused: {why}"
            ),
            StoreProblem::NoCatalogDir => {
                f.write_str("objects but no checkpoints/ directory: the store is incomplete")
            }
        }
    }
}

/// Why orphans are kept rather than deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphansKept {
    /// The store has no `checkpoints/` directory.
    NoCatalogDir,
    /// The store holds objects but neither a readable `ckptfs.json` nor a readable
    /// manifest.
    NoReadableCatalog,
    /// A manifest cannot be read.
    UnreadableManifest,
    /// `quarantine/` holds manifests.
    Quarantine,
}

impl fmt::Display for OrphansKept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OrphansKept::NoCatalogDir => "the store has no checkpoints/ directory",
            OrphansKept::NoReadableCatalog => "the store has objects but no readable catalog",
            OrphansKept::UnreadableManifest => "a manifest cannot be read",
            OrphansKept::Quarantine => {
                "quarantine/ holds manifests (remove it once they are dealt with)"
            }
        })
    }
}

/// A missing or corrupt object stored again from an identical copy (shown as `ID <- PATH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairedObject {
    /// The object stored again.
    pub id: ObjectId,
    /// The file its bytes were read from.
    pub from: PathBuf,
}

impl fmt::Display for RepairedObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} <- {}", self.id, self.from.display())
    }
}

/// What [`Fsck::check`] found and what [`Fsck::repair`] does about it; nothing is changed
/// until then.
#[derive(Debug)]
pub struct FsckPlan {
    /// The findings (the `repaired_*` and `quarantined` rows still empty).
    pub report: FsckReport,
    /// Where each missing or corrupt object's bytes may be found again.
    wanted: BTreeMap<ObjectId, BTreeSet<Want>>,
    /// Unreadable manifests, to move to `quarantine/`.
    quarantine: Vec<String>,
    /// Orphans to delete: none while orphans are kept, and none younger than the grace
    /// period.
    delete: Vec<ObjectId>,
}

/// Check a store that no daemon holds. With `repair`, move unreadable manifests to
/// `quarantine/` (never deleting them), delete orphans and staged leftovers, and store
/// missing or corrupt objects again from identical copies found in `STORE/state` (the live
/// RocksDB files); what cannot be repaired is reported with the checkpoints it damages.
/// Objects that a quarantined manifest may name are never orphans.
pub fn fsck(
    store: impl Into<Location>,
    repair: bool,
    progress: impl FnMut(u64),
) -> Result<FsckReport> {
    fsck_with_copies(store, repair, &[], progress)
}

/// [`fsck`], also searching `copies` (directories: a restored checkpoint, a backup, a
/// state directory elsewhere) for identical copies of damaged objects.
pub fn fsck_with_copies(
    location: impl Into<Location>,
    repair: bool,
    copies: &[PathBuf],
    progress: impl FnMut(u64),
) -> Result<FsckReport> {
    let location = location.into();
    if repair {
        let fsck = Fsck::open_to_repair(&location)?;
        let plan = fsck.check(progress)?;
        fsck.repair(plan, copies)
    } else {
        Ok(Fsck::open(&location)?.check(progress)?.report)
    }
}

/// A store opened for `fsck`: no daemon may write it meanwhile (its lock, or on object
/// storage its lease, is held until this is dropped).
pub struct Fsck {
    location: Location,
    repo: Repo,
    /// `ckptfs.json` as read, or for a repair as taken over.
    meta: Result<Option<StoreMeta>>,
    repairs: bool,
    _lock: Option<StoreLock>,
    _lease: Option<Lease>,
}

impl Fsck {
    /// Open a store to check it, creating nothing (a store the daemon refuses must not
    /// look complete afterwards).
    pub fn open(location: &Location) -> Result<Fsck> {
        Self::open_with(location, false)
    }

    /// Open a store to check and repair it: like a daemon's start, this first fences every
    /// earlier writer out (on object storage it takes the store over).
    pub fn open_to_repair(location: &Location) -> Result<Fsck> {
        Self::open_with(location, true)
    }

    fn open_with(location: &Location, repairs: bool) -> Result<Fsck> {
        let mut repo = Repo::reader(location)?;
        let (lock, lease) = match location.local() {
            Some(root) => (Some(StoreLock::acquire(root)?), None),
            None => (
                None,
                Some(Lease::acquire(
                    repo.records.clone(),
                    crate::lease::DEFAULT_TTL,
                    std::time::Duration::ZERO,
                )?),
            ),
        };
        if let Some(lease) = &lease {
            repo.catalog = repo.catalog.with_fence(lease.fence());
        }
        let meta = if repairs {
            repo.catalog.take_over()
        } else {
            repo.catalog.load_meta()
        };
        Ok(Fsck {
            location: location.clone(),
            repo,
            meta,
            repairs,
            _lock: lock,
            _lease: lease,
        })
    }

    /// Recount the references, verify every referenced object (`progress` gets each one's
    /// bytes) and list what is wrong; nothing is changed.
    pub fn check(&self, mut progress: impl FnMut(u64)) -> Result<FsckPlan> {
        let catalog = &self.repo.catalog;
        let store = self.repo.objects.as_ref();
        let has_catalog_dir = catalog.has_dir();
        let (manifests, unreadable) = catalog.load_all_lenient()?;
        let registry =
            Registry::from_checkpoints(manifests.iter().map(|(id, m)| (*id, m.objects())));

        let sizes = referenced_sizes(&manifests)?;
        // File lists were read and verified by their hash when the manifests were loaded
        // (one that cannot be makes its manifest unreadable).
        let list_objects: BTreeSet<ObjectId> = manifests
            .values()
            .flat_map(|m| m.backends.iter().flat_map(|b| b.lists.iter()))
            .collect();
        let listed = store.list_modified()?;
        let stored: BTreeSet<ObjectId> = listed.iter().map(|(id, _)| *id).collect();
        // On object storage, an unreferenced object younger than the grace period may be
        // the upload of a daemon that is still running: reported, never deleted.
        let young: BTreeSet<ObjectId> = listed
            .iter()
            .filter(|(_, modified)| {
                crate::store::is_young(*modified, crate::store::DEFAULT_ORPHAN_GRACE)
            })
            .map(|(id, _)| *id)
            .collect();
        let mut report = FsckReport {
            checkpoints: manifests.keys().copied().collect(),
            objects_referenced: sizes.len() + list_objects.len(),
            objects_stored: stored.len(),
            bytes_referenced: sizes.values().sum(),
            counts: registry.counts(),
            ..FsckReport::default()
        };
        let mut bad = BTreeSet::new();
        for (id, size) in &sizes {
            if !stored.contains(id) {
                report.missing.push(*id);
                bad.insert(*id);
            } else if let Err(e) = store.verify(id, *size) {
                log::error!("{e}");
                report.corrupt.push(*id);
                bad.insert(*id);
            }
            progress(*size);
        }
        for (cp, manifest) in &manifests {
            if manifest.objects().iter().any(|o| bad.contains(o)) {
                report.damaged_checkpoints.push(*cp);
            }
        }
        for (name, e) in &unreadable {
            log::error!("unreadable manifest {name}: {e}");
            report.unreadable_manifests.push(UnreadableManifest {
                name: name.clone(),
                error: e.to_string(),
            });
        }
        match &self.meta {
            Err(e) => report
                .problems
                .push(StoreProblem::MetaUnreadable(e.to_string())),
            Ok(None) => match catalog.load_meta_copy() {
                Err(e) => report
                    .problems
                    .push(StoreProblem::MetaCopyUnreadable(e.to_string())),
                Ok(copy) if copy.is_some() || !manifests.is_empty() || !unreadable.is_empty() => {
                    report.problems.push(StoreProblem::MetaMissing {
                        copy: copy.is_some(),
                    })
                }
                Ok(_) => {}
            },
            _ => {}
        }
        if !has_catalog_dir && !stored.is_empty() {
            report.problems.push(StoreProblem::NoCatalogDir);
        }
        report.orphans_kept = if !has_catalog_dir {
            Some(OrphansKept::NoCatalogDir)
        } else if matches!(self.meta, Ok(None) | Err(_))
            && manifests.is_empty()
            && !stored.is_empty()
        {
            Some(OrphansKept::NoReadableCatalog)
        } else if !unreadable.is_empty() {
            Some(OrphansKept::UnreadableManifest)
        } else if catalog.has_quarantine() {
            Some(OrphansKept::Quarantine)
        } else {
            None
        };
        report.orphans = stored
            .iter()
            .filter(|id| !sizes.contains_key(id) && !list_objects.contains(id))
            .copied()
            .collect();
        report.orphans_young = report
            .orphans
            .iter()
            .filter(|id| young.contains(id))
            .copied()
            .collect();
        report.staged_leftovers = self
            .location
            .local()
            .and_then(|root| std::fs::read_dir(root.join(crate::store::layout::TMP)).ok())
            .map_or(0, |d| d.count())
            + catalog.leftovers()?.len();

        let wanted = wanted_copies(&manifests, &bad);
        let delete = match report.orphans_kept {
            Some(_) => Vec::new(),
            None => report
                .orphans
                .iter()
                .filter(|id| !young.contains(id))
                .copied()
                .collect(),
        };
        Ok(FsckPlan {
            report,
            wanted,
            quarantine: unreadable.into_iter().map(|(name, _)| name).collect(),
            delete,
        })
    }

    /// Carry out `plan`: store missing or corrupt objects again from identical copies
    /// found in `STORE/state` and `copies`, move unreadable manifests to `quarantine/`,
    /// delete staged leftovers and the orphans the plan names. Returns the plan's report
    /// with what was repaired. Only a store opened with [`Fsck::open_to_repair`] is
    /// repaired.
    pub fn repair(&self, plan: FsckPlan, copies: &[PathBuf]) -> Result<FsckReport> {
        if !self.repairs {
            return Err(Error::Invalid(
                "the store was opened to check it, not to repair it".into(),
            ));
        }
        let catalog = &self.repo.catalog;
        let store = self.repo.objects.as_ref();
        let FsckPlan {
            mut report,
            wanted,
            quarantine,
            delete,
        } = plan;
        if !wanted.is_empty() {
            let mut dirs: Vec<PathBuf> = self
                .location
                .local()
                .map(|r| r.join(crate::store::layout::STATE))
                .into_iter()
                .collect();
            dirs.extend(copies.iter().cloned());
            for (id, path, want) in find_copies(&dirs, &wanted)? {
                let staged = if want.whole {
                    store.stage(&path)?
                } else {
                    match read_range(&path, want.offset, want.len) {
                        Ok(bytes) => store.stage_bytes(&bytes)?,
                        Err(_) => continue,
                    }
                };
                if staged.id != id {
                    store.discard(staged); // changed since it was hashed
                    continue;
                }
                store.publish(staged)?;
                log::info!("object {id} stored again from {}", path.display());
                report
                    .repaired_objects
                    .push(RepairedObject { id, from: path });
            }
        }
        for name in &quarantine {
            report.quarantined.push(catalog.quarantine(name)?);
        }
        report.repaired_leftovers += catalog.clear_leftovers()?;
        for id in &delete {
            catalog.check_writer()?;
            store.delete(id)?;
            report.repaired_orphans += 1;
        }
        report.repaired_leftovers += store.clear_staging()?;
        Ok(report)
    }
}

/// The size of every object the manifests' files name; fails if two manifests disagree.
fn referenced_sizes(manifests: &BTreeMap<u64, Manifest>) -> Result<BTreeMap<ObjectId, u64>> {
    let mut sizes: BTreeMap<ObjectId, u64> = BTreeMap::new();
    for manifest in manifests.values() {
        for backend in &manifest.backends {
            for (object, size) in backend.files.iter().flat_map(|f| f.stored()) {
                if let Some(previous) = sizes.insert(object, size) {
                    if previous != size {
                        return Err(Error::Corrupt(format!(
                            "manifests disagree on the size of object {object}"
                        )));
                    }
                }
            }
        }
    }
    Ok(sizes)
}

/// Where each damaged object's bytes may be found again: a file of the same name and size,
/// or (a chunk of an append-only file) the same range of a file of the same name that is
/// at least that long, such as the live MANIFEST that kept growing.
fn wanted_copies(
    manifests: &BTreeMap<u64, Manifest>,
    bad: &BTreeSet<ObjectId>,
) -> BTreeMap<ObjectId, BTreeSet<Want>> {
    let mut wanted: BTreeMap<ObjectId, BTreeSet<Want>> = BTreeMap::new();
    for f in manifests
        .values()
        .flat_map(|m| &m.backends)
        .flat_map(|b| b.files.iter())
    {
        match &f.chunks {
            None if bad.contains(&f.object) => {
                wanted.entry(f.object).or_default().insert(Want {
                    name: f.name.clone(),
                    offset: 0,
                    len: f.size,
                    whole: true,
                });
            }
            None => {}
            Some(chunks) => {
                for (i, (id, len)) in chunks.with_lengths(f.size).enumerate() {
                    if bad.contains(&id) {
                        wanted.entry(id).or_default().insert(Want {
                            name: f.name.clone(),
                            offset: i as u64 * chunks.size as u64,
                            len,
                            whole: false,
                        });
                    }
                }
            }
        }
    }
    wanted
}

/// Where a damaged object's bytes may be found: `len` bytes at `offset` of a file named
/// `name` (`whole`: the file is exactly the object).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Want {
    name: String,
    offset: u64,
    len: u64,
    whole: bool,
}

fn read_range(path: &Path, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, offset)?;
    Ok(bytes)
}

/// Files under `dirs` (not following links) that hold a wanted object's exact content where
/// a [`Want`] says: the object, the file and where in it.
fn find_copies(
    dirs: &[PathBuf],
    wanted: &BTreeMap<ObjectId, BTreeSet<Want>>,
) -> Result<Vec<(ObjectId, PathBuf, Want)>> {
    let mut found: BTreeMap<ObjectId, (PathBuf, Want)> = BTreeMap::new();
    let mut pending: Vec<PathBuf> = dirs.iter().filter(|d| d.is_dir()).cloned().collect();
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                pending.push(path);
                continue;
            }
            if !kind.is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            let mut whole_hash = None;
            for (id, wants) in wanted {
                if found.contains_key(id) {
                    continue;
                }
                for want in wants.iter().filter(|w| w.name == name) {
                    let fits = if want.whole {
                        size == want.len
                    } else {
                        size >= want.offset + want.len
                    };
                    if !fits {
                        continue;
                    }
                    let content = if want.whole {
                        *whole_hash.get_or_insert_with(|| hash_file(&path).ok().map(|(h, _)| h))
                    } else {
                        read_range(&path, want.offset, want.len)
                            .ok()
                            .map(|b| ObjectId::from_hash(blake3::hash(&b)))
                    };
                    if content == Some(*id) {
                        found.insert(*id, (path.clone(), want.clone()));
                        break;
                    }
                }
            }
        }
    }
    Ok(found
        .into_iter()
        .map(|(id, (path, want))| (id, path, want))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--json` shows every typed row as the text line it is: ids as hex, a repaired
    /// object as `ID <- PATH`, an unreadable manifest as `NAME: WHY`, problems and the
    /// reason orphans are kept as their sentences.
    #[test]
    fn typed_rows_serialize_as_their_lines() {
        let id = ObjectId::from_hash(blake3::hash(b"x"));
        let hex = id.to_hex();
        let report = FsckReport {
            counts: BTreeMap::from([(id, 2)]),
            orphans: vec![id],
            orphans_young: vec![id],
            unreadable_manifests: vec![UnreadableManifest {
                name: "7.json".into(),
                error: "corrupt: damaged".into(),
            }],
            problems: vec![
                StoreProblem::MetaMissing { copy: true },
                StoreProblem::NoCatalogDir,
            ],
            orphans_kept: Some(OrphansKept::Quarantine),
            repaired_objects: vec![RepairedObject {
                id,
                from: PathBuf::from("/state/A/0/000007.sst"),
            }],
            ..FsckReport::default()
        };
        let value = serde_json::to_value(&report).unwrap();
        assert_eq!(value["counts"], serde_json::json!({ hex.clone(): 2 }));
        assert_eq!(value["orphans"], serde_json::json!([hex.clone()]));
        assert_eq!(value["orphans_young"], serde_json::json!([hex.clone()]));
        assert_eq!(
            value["unreadable_manifests"],
            serde_json::json!(["7.json: corrupt: damaged"])
        );
        assert_eq!(
            value["problems"],
            serde_json::json!([
                "ckptfs.json is missing (the next mount rebuilds it from its copy, \
                 ckptfs.copy.json, and the manifests)",
                "objects but no checkpoints/ directory: the store is incomplete"
            ])
        );
        assert_eq!(
            value["orphans_kept"],
            "quarantine/ holds manifests (remove it once they are dealt with)"
        );
        assert_eq!(
            value["repaired_objects"],
            serde_json::json!([format!("{hex} <- /state/A/0/000007.sst")])
        );
        // Every field is shown, none added or left out.
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(keys.len(), 18, "{keys:?}");
    }
}
