//! `ckptfs fsck`: recount references from the manifests and check every object.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::lock::StoreLock;
use crate::registry::Registry;
use crate::repo::Repo;
use crate::store::{hash_file, Location, ObjectId};

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct FsckReport {
    pub checkpoints: Vec<u64>,
    pub objects_referenced: usize,
    pub objects_stored: usize,
    pub bytes_referenced: u64,
    /// Reference count per object, recomputed from the manifests.
    pub counts: BTreeMap<String, u32>,
    pub orphans: Vec<String>,
    pub missing: Vec<String>,
    pub corrupt: Vec<String>,
    /// Checkpoints that reference a missing or corrupt object.
    pub damaged_checkpoints: Vec<u64>,
    /// Manifests that cannot be read (file name and why). With them present, no object is
    /// called an orphan: the unreadable manifest may reference it.
    pub unreadable_manifests: Vec<String>,
    /// Where `--repair` moved the unreadable manifests (never deleted).
    pub quarantined: Vec<String>,
    /// Problems of the store as a whole (ckptfs.json, an incomplete store).
    pub problems: Vec<String>,
    /// Why orphans are kept rather than deleted, if they are: while the catalog is
    /// incomplete or a manifest unreadable or quarantined, which objects are really
    /// unreferenced is not known.
    pub orphans_kept: Option<String>,
    /// Orphans on object storage younger than the grace period: perhaps the uploads of a
    /// daemon still running; never deleted by fsck.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orphans_young: Vec<String>,
    pub staged_leftovers: usize,
    /// Missing or corrupt objects that `--repair` stored again from an identical copy
    /// found outside the store (`id <- path`).
    pub repaired_objects: Vec<String>,
    pub repaired_orphans: usize,
    pub repaired_leftovers: usize,
}

impl FsckReport {
    /// True when nothing is wrong (after repair, if one ran).
    pub fn is_clean(&self) -> bool {
        let repaired: BTreeSet<&str> = self
            .repaired_objects
            .iter()
            .filter_map(|r| r.split(' ').next())
            .collect();
        self.missing
            .iter()
            .chain(&self.corrupt)
            .all(|id| repaired.contains(id.as_str()))
            && self.unreadable_manifests.len() == self.quarantined.len()
            && self.problems.is_empty()
            && self.orphans.len() == self.repaired_orphans
            && self.staged_leftovers == self.repaired_leftovers
    }
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
    mut progress: impl FnMut(u64),
) -> Result<FsckReport> {
    let location = &location.into();
    // Create nothing: a store the daemon refuses must not look complete afterwards.
    let opened = Repo::reader(location)?;
    let catalog = opened.catalog;
    // No daemon may write meanwhile: the store's lock, or on object storage its lease.
    let (_lock, _lease) = match location.local() {
        Some(root) => (Some(StoreLock::acquire(root)?), None),
        None => (
            None,
            Some(Lease::acquire(
                opened.records.clone(),
                crate::lease::DEFAULT_TTL,
                std::time::Duration::ZERO,
            )?),
        ),
    };
    let catalog = match &_lease {
        Some(lease) => catalog.with_fence(lease.fence()),
        None => catalog,
    };
    let store = opened.objects.as_ref();
    let has_catalog_dir = catalog.has_dir();
    // A repair writes: like a daemon's start, it first fences every earlier writer out.
    let meta = if repair {
        catalog.take_over()
    } else {
        catalog.load_meta()
    };
    let (manifests, unreadable) = catalog.load_all_lenient()?;
    let registry = Registry::from_checkpoints(manifests.iter().map(|(id, m)| (*id, m.objects())));

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
    // File lists were read and verified by their hash when the manifests were loaded (one
    // that cannot be makes its manifest unreadable).
    let list_objects: BTreeSet<ObjectId> = manifests
        .values()
        .flat_map(|m| m.backends.iter().flat_map(|b| b.lists.iter()))
        .collect();
    let listed = store.list_modified()?;
    let stored: BTreeSet<ObjectId> = listed.iter().map(|(id, _)| *id).collect();
    // On object storage, an unreferenced object younger than the grace period may be the
    // upload of a daemon that is still running: reported, never deleted.
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
        counts: registry
            .counts()
            .into_iter()
            .map(|(id, n)| (id.to_hex(), n))
            .collect(),
        ..FsckReport::default()
    };
    let mut bad = BTreeSet::new();
    for (id, size) in &sizes {
        if !stored.contains(id) {
            report.missing.push(id.to_hex());
            bad.insert(*id);
        } else if let Err(e) = store.verify(id, *size) {
            log::error!("{e}");
            report.corrupt.push(id.to_hex());
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
        report.unreadable_manifests.push(format!("{name}: {e}"));
    }
    match &meta {
        Err(e) => report.problems.push(e.to_string()),
        Ok(None) if !manifests.is_empty() || !unreadable.is_empty() => report
            .problems
            .push("ckptfs.json is missing (the next mount rebuilds it from the manifests)".into()),
        _ => {}
    }
    if !has_catalog_dir && !stored.is_empty() {
        report
            .problems
            .push("objects but no checkpoints/ directory: the store is incomplete".into());
    }
    report.orphans_kept = if !has_catalog_dir {
        Some("the store has no checkpoints/ directory".into())
    } else if matches!(meta, Ok(None) | Err(_)) && manifests.is_empty() && !stored.is_empty() {
        Some("the store has objects but no readable catalog".into())
    } else if !unreadable.is_empty() {
        Some("a manifest cannot be read".into())
    } else if catalog.has_quarantine() {
        Some("quarantine/ holds manifests (remove it once they are dealt with)".into())
    } else {
        None
    };
    let orphans: Vec<ObjectId> = stored
        .iter()
        .filter(|id| !sizes.contains_key(id) && !list_objects.contains(id))
        .copied()
        .collect();
    report.orphans = orphans.iter().map(|id| id.to_hex()).collect();
    report.orphans_young = orphans
        .iter()
        .filter(|id| young.contains(id))
        .map(|id| id.to_hex())
        .collect();
    report.staged_leftovers = location
        .local()
        .and_then(|root| std::fs::read_dir(root.join(crate::store::layout::TMP)).ok())
        .map_or(0, |d| d.count())
        + catalog.leftovers()?.len();
    if repair && !bad.is_empty() {
        let mut dirs: Vec<PathBuf> = location
            .local()
            .map(|r| r.join(crate::store::layout::STATE))
            .into_iter()
            .collect();
        dirs.extend(copies.iter().cloned());
        // Where each damaged object's bytes may be found again: a file of the same name and
        // size, or (a chunk of an append-only file) the same range of a file of the same
        // name that is at least that long, such as the live MANIFEST that kept growing.
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
                .push(format!("{} <- {}", id.to_hex(), path.display()));
        }
    }
    if repair {
        for (name, _) in &unreadable {
            let dest = catalog.quarantine(name)?;
            report.quarantined.push(dest);
        }
        report.repaired_leftovers += catalog.clear_leftovers()?;
        if report.orphans_kept.is_none() {
            for id in &orphans {
                if young.contains(id) {
                    continue;
                }
                catalog.check_writer()?;
                store.delete(id)?;
                report.repaired_orphans += 1;
            }
        }
        report.repaired_leftovers += store.clear_staging()?;
    }
    Ok(report)
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
