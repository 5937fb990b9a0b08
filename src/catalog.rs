//! Durable checkpoint manifests and the store's small metadata file.
//!
//! A manifest says, for one checkpoint, which original file of which backend is which stored
//! object. Writing the manifest (atomically, after every object it names is durable) is the
//! commit point of a checkpoint; removing it is the commit point of a drop.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::fsutil::{fsync_dir, write_atomic};
use crate::names::BackendName;
use crate::store::ObjectId;

pub const FORMAT: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEntry {
    /// The original RocksDB file name, e.g. `000012.sst` or `MANIFEST-000005`.
    pub name: String,
    pub object: ObjectId,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendSnapshot {
    pub name: BackendName,
    /// Identity of the local RocksDB instance that produced the files: file names are only
    /// meaningful within one lineage (a restore starts a new one).
    pub lineage: String,
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CheckpointStats {
    pub files_total: u64,
    pub files_new: u64,
    pub files_reused: u64,
    pub bytes_total: u64,
    pub bytes_uploaded: u64,
    /// Bytes of the SST (shared) files that were not re-referenced from the previous
    /// confirmed checkpoint, whether uploaded or found already stored.
    pub bytes_new_sst: u64,
    pub sync_micros: u64,
    pub async_micros: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub format: u32,
    pub id: u64,
    pub started_unix_ms: u64,
    pub completed_unix_ms: u64,
    pub backends: Vec<BackendSnapshot>,
    pub stats: CheckpointStats,
}

impl Manifest {
    pub fn objects(&self) -> BTreeSet<ObjectId> {
        self.backends
            .iter()
            .flat_map(|b| b.files.iter().map(|f| f.object))
            .collect()
    }

    pub fn backend(&self, name: &BackendName) -> Option<&BackendSnapshot> {
        self.backends.iter().find(|b| &b.name == name)
    }
}

/// Store-wide settings and counters, in `ckptfs.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreMeta {
    pub format: u32,
    /// The id the next checkpoint gets; ids are never reused.
    pub next_checkpoint: u64,
    pub retain: u32,
    pub backends: Vec<BackendName>,
}

impl Default for StoreMeta {
    fn default() -> Self {
        StoreMeta {
            format: FORMAT,
            next_checkpoint: 1,
            retain: 3,
            backends: Vec::new(),
        }
    }
}

/// The manifests directory (`checkpoints/<id>.json`) and `ckptfs.json` of one store.
pub struct Catalog {
    root: PathBuf,
    dir: PathBuf,
}

impl Catalog {
    pub fn open(root: &Path) -> Result<Self> {
        let dir = root.join("checkpoints");
        fs::create_dir_all(&dir).ctx("create", &dir)?;
        Ok(Catalog {
            root: root.to_path_buf(),
            dir,
        })
    }

    /// Open the catalog of an existing store without creating anything.
    pub fn open_existing(root: &Path) -> Result<Self> {
        let dir = root.join("checkpoints");
        if !dir.is_dir() {
            return Err(Error::NotFound(format!(
                "{} is not a ckptfs store (no checkpoints/)",
                root.display()
            )));
        }
        Ok(Catalog {
            root: root.to_path_buf(),
            dir,
        })
    }

    fn meta_path(&self) -> PathBuf {
        self.root.join("ckptfs.json")
    }

    pub fn load_meta(&self) -> Result<Option<StoreMeta>> {
        let path = self.meta_path();
        match fs::read(&path) {
            Ok(bytes) => {
                let meta: StoreMeta = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::Corrupt(format!("{} cannot be parsed: {e}", path.display()))
                })?;
                if meta.format != FORMAT {
                    return Err(Error::Invalid(format!(
                        "{} has format {}, this ckptfs reads format {FORMAT}",
                        path.display(),
                        meta.format
                    )));
                }
                Ok(Some(meta))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
        }
    }

    pub fn save_meta(&self, meta: &StoreMeta) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(meta).expect("meta serializes");
        write_atomic(&self.meta_path(), &bytes)
    }

    fn manifest_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Durably write a manifest: from here on the checkpoint exists.
    pub fn commit(&self, manifest: &Manifest) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
        write_atomic(&self.manifest_path(manifest.id), &bytes)
    }

    /// Durably remove a manifest: from here on the checkpoint is gone.
    pub fn remove(&self, id: u64) -> Result<()> {
        let path = self.manifest_path(id);
        match fs::remove_file(&path) {
            Ok(()) => fsync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
        }
    }

    pub fn load(&self, id: u64) -> Result<Manifest> {
        let path = self.manifest_path(id);
        let bytes = fs::read(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::NoSuchCheckpoint(id)
            } else {
                Error::io(format!("read {}", path.display()), e)
            }
        })?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Corrupt(format!("{} cannot be parsed: {e}", path.display())))?;
        if manifest.id != id {
            return Err(Error::Corrupt(format!(
                "{} claims to be checkpoint {}",
                path.display(),
                manifest.id
            )));
        }
        Ok(manifest)
    }

    /// Every committed manifest; leftovers of interrupted atomic writes are removed.
    pub fn load_all(&self) -> Result<BTreeMap<u64, Manifest>> {
        let mut manifests = BTreeMap::new();
        for entry in fs::read_dir(&self.dir).ctx("list", &self.dir)? {
            let entry = entry.ctx("list", &self.dir)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.contains(".tmp-") {
                fs::remove_file(entry.path()).ctx("remove leftover", &entry.path())?;
                continue;
            }
            let Some(id) = name
                .strip_suffix(".json")
                .and_then(|n| n.parse::<u64>().ok())
            else {
                log::warn!("ignoring stray file {}", entry.path().display());
                continue;
            };
            manifests.insert(id, self.load(id)?);
        }
        Ok(manifests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(id: u64) -> Manifest {
        Manifest {
            format: FORMAT,
            id,
            started_unix_ms: 1,
            completed_unix_ms: 2,
            backends: vec![BackendSnapshot {
                name: "op/0".parse().unwrap(),
                lineage: "l1".into(),
                files: vec![FileEntry {
                    name: "000007.sst".into(),
                    object: ObjectId::from_hash(blake3::hash(b"x")),
                    size: 1,
                }],
            }],
            stats: CheckpointStats::default(),
        }
    }

    #[test]
    fn manifests_round_trip_and_removal_is_final() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        catalog.commit(&sample(4)).unwrap();
        catalog.commit(&sample(9)).unwrap();
        let all = catalog.load_all().unwrap();
        assert_eq!(all.keys().copied().collect::<Vec<_>>(), vec![4, 9]);
        assert_eq!(all[&4], sample(4));
        catalog.remove(4).unwrap();
        assert!(matches!(catalog.load(4), Err(Error::NoSuchCheckpoint(4))));
        assert_eq!(catalog.load_all().unwrap().len(), 1);
    }

    #[test]
    fn a_corrupt_manifest_is_reported_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        fs::write(dir.path().join("checkpoints/3.json"), b"{not json").unwrap();
        assert!(matches!(catalog.load_all(), Err(Error::Corrupt(_))));
    }

    #[test]
    fn meta_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        assert!(catalog.load_meta().unwrap().is_none());
        let meta = StoreMeta {
            next_checkpoint: 12,
            ..StoreMeta::default()
        };
        catalog.save_meta(&meta).unwrap();
        assert_eq!(catalog.load_meta().unwrap(), Some(meta));
    }
}
