//! Helpers the subjects share: engines on a store directory, what a store holds, readers of
//! restored directories in other RocksDB releases.

#![allow(dead_code)]

pub mod btrfs;
pub mod cli;
pub mod java;
pub mod moto;
pub mod mounted;
pub mod s3;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use ckptfs_core::backend::BackendOptions;
use ckptfs_core::catalog::Manifest;
use ckptfs_core::store::ObjectId;
use ckptfs_core::{BackendName, Engine, EngineConfig};

pub type Kv = BTreeMap<Vec<u8>, Vec<u8>>;

/// Every regular file below `dir`, at any depth.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            out.extend(files_under(&entry.path()));
        } else {
            out.push(entry.path());
        }
    }
    out
}

pub fn name(text: &str) -> BackendName {
    text.parse().unwrap()
}

/// Small memtables so a little data makes several SSTs.
pub fn config(store: &Path, backends: &[&str]) -> EngineConfig {
    let mut config = EngineConfig::new(store);
    config.backends = backends.iter().map(|b| name(b)).collect();
    config.backend_options = BackendOptions {
        write_buffer_size: Some(64 * 1024),
        ..BackendOptions::default()
    };
    config
}

pub fn scan(engine: &Engine, backend: &BackendName) -> Kv {
    engine.scan(backend).unwrap().into_iter().collect()
}

pub fn snapshot_all(engine: &Engine) -> BTreeMap<BackendName, Kv> {
    engine
        .backend_names()
        .into_iter()
        .map(|n| {
            let kv = scan(engine, &n);
            (n, kv)
        })
        .collect()
}

/// Restore checkpoint `id` with the CLI-level restore and read every backend back.
pub fn restored_contents(
    store: impl Into<ckptfs_core::store::Location>,
    id: u64,
) -> BTreeMap<BackendName, Kv> {
    let store = store.into();
    let dest = tempfile::tempdir().unwrap();
    let out = dest.path().join("out");
    ckptfs_core::commands::restore::restore_checkpoint(&store, id, &out, |_| {}).unwrap();
    let manifest = ckptfs_core::repo::Repo::reader(&store)
        .unwrap()
        .catalog
        .load(id)
        .unwrap();
    manifest
        .backends
        .iter()
        .map(|b| {
            let kv = ckptfs_core::backend::scan_dir(&out.join(b.name.rel_path()))
                .unwrap()
                .into_iter()
                .collect();
            (b.name.clone(), kv)
        })
        .collect()
}

/// Checkpoint `id` of a store as JSON in the shape of a format-1 manifest (every backend's
/// files listed inline, whatever file lists the stored manifest names).
pub fn manifest_json(store: &Path, id: u64) -> serde_json::Value {
    let m = ckptfs_core::repo::Repo::reader(&store.into())
        .map(|r| r.catalog)
        .unwrap()
        .load(id)
        .unwrap();
    serde_json::json!({
        "format": 1,
        "id": m.id,
        "started_unix_ms": m.started_unix_ms,
        "completed_unix_ms": m.completed_unix_ms,
        "backends": m.backends.iter().map(|b| serde_json::json!({
            "name": b.name.to_string(),
            "lineage": b.lineage,
            "files": b.files.iter().map(|f| serde_json::to_value(&**f).unwrap()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "stats": serde_json::to_value(&m.stats).unwrap(),
    })
}

/// Reference counts recomputed here from the manifests, independently of the registry: a
/// checkpoint references its files' objects and its file lists (each backend's list and the
/// lists it is a delta on).
pub fn recount(manifests: &[std::sync::Arc<Manifest>]) -> BTreeMap<ObjectId, u32> {
    let mut counts = BTreeMap::new();
    for m in manifests {
        let objects: BTreeSet<ObjectId> = m.objects();
        for o in objects {
            *counts.entry(o).or_insert(0) += 1;
        }
    }
    counts
}

/// With nothing in flight: counts equal a recount, and the store holds exactly the
/// referenced objects (and what prepared materializations hold for the next checkpoint),
/// each with the right content.
pub fn assert_consistent(engine: &Engine) {
    engine.wait_idle();
    let manifests = engine.checkpoints();
    let counts = recount(&manifests);
    assert_eq!(
        engine.reference_counts(),
        counts,
        "registry differs from a recount"
    );
    // The registry view's runs of referencing checkpoints agree with the recount too.
    let runs: BTreeMap<ObjectId, u32> =
        ckptfs_core::catalog::history::object_histories(manifests.iter().map(|m| &**m))
            .into_iter()
            .map(|(id, h)| (id, h.count as u32))
            .collect();
    assert_eq!(runs, counts, "object histories differ from a recount");
    let stored: BTreeSet<ObjectId> = engine.object_store().list().unwrap().into_iter().collect();
    let referenced: BTreeSet<ObjectId> = counts.keys().copied().collect();
    let prepared = engine.prepared_objects();
    assert_eq!(
        stored
            .difference(&referenced)
            .filter(|id| !prepared.contains(id))
            .count(),
        0,
        "store holds unreferenced objects"
    );
    assert_eq!(
        referenced.difference(&stored).count(),
        0,
        "referenced objects are missing"
    );
}

pub fn put_range(engine: &Engine, backend: &BackendName, range: std::ops::Range<u32>, tag: &str) {
    let ops: Vec<ckptfs_core::WriteOp> = range
        .map(|i| {
            ckptfs_core::WriteOp::Put(
                format!("k{i:06}").into_bytes(),
                format!("{tag}-{i}-{}", "x".repeat(64)).into_bytes(),
            )
        })
        .collect();
    engine.write(backend, &ops).unwrap();
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The path of the file in `dir` whose name starts with `prefix` (e.g. `OPTIONS-`).
/// Run a command that must succeed.
pub fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn file_starting_with(dir: &Path, prefix: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix}* in {}", dir.display()))
}

/// Keys and values of a RocksDB directory as read by Debian's ldb (RocksDB 7.8), in hex.
pub fn read_with_ldb(db: &Path) -> Vec<(String, String)> {
    let out = Command::new("ldb")
        .arg(format!("--db={}", db.display()))
        .args(["--ignore_unknown_options", "--hex", "scan"])
        .output()
        .expect("ldb (Debian package rocksdb-tools) must be installed: scripts/test installs it");
    assert!(out.status.success(), "ldb 7.8: {}", lossy(&out.stderr));
    lossy(&out.stdout)
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(" : ").expect("ldb prints key : value");
            (
                k.trim_start_matches("0x").to_lowercase(),
                v.trim_start_matches("0x").to_lowercase(),
            )
        })
        .collect()
}

/// The same through the Python binding rocksdict, opened read-only.
pub fn read_with_rocksdict(db: &Path) -> Vec<(String, String)> {
    let script = "import sys\nfrom rocksdict import Rdict, Options, AccessType\n\
db = Rdict(sys.argv[1], options=Options(raw_mode=True), access_type=AccessType.read_only())\n\
for k, v in db.items():\n    print(k.hex(), v.hex())\ndb.close()\n";
    let out = Command::new("python3")
        .args(["-c", script, db.to_str().unwrap()])
        .output()
        .expect("python3");
    assert!(out.status.success(), "rocksdict: {}", lossy(&out.stderr));
    lossy(&out.stdout)
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Every object file of a store.
pub fn objects(store: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for shard in std::fs::read_dir(store.join("objects")).unwrap() {
        for entry in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            out.insert(entry.unwrap().path());
        }
    }
    out
}

pub fn six_checkpoints(store: &Path) -> Vec<u64> {
    let mut cfg = config(store, &["A/0"]);
    cfg.retain = Some(10);
    let engine = Engine::open(cfg).unwrap();
    let a = name("A/0");
    let mut ids = Vec::new();
    for i in 0..6u32 {
        put_range(&engine, &a, i * 200..(i + 1) * 200, &format!("r{i}"));
        engine.flush(&a).unwrap();
        ids.push(engine.checkpoint().unwrap().id);
    }
    ids
}

pub fn retained_ids(engine: &Engine) -> Vec<u64> {
    engine.checkpoints().iter().map(|m| m.id).collect()
}
