//! Scale benchmark (issue 9): does the Nth checkpoint cost what the 10th did?
//!
//! BACKENDS backends start with KEYS keys each; then every round changes a little and takes
//! a checkpoint, CHECKPOINTS times, with every checkpoint retained:
//! - `BENCH_MODE=time` (default): one new key per backend, keys in increasing order (time-
//!   keyed state: every flush is a tiny SST that overlaps nothing);
//! - `BENCH_MODE=random`: BENCH_UPDATES (default 500) random existing keys rewritten per
//!   backend.
//!
//! With `BENCH_SMALL_FILES=on` (default) small-file compaction runs every 100 checkpoints,
//! as the daemon's `--small-file-compaction-interval` would; `off` shows the pathology.
//!
//! At each report point (BENCH_REPORT_AT, default "10,100,1000,..." up to CHECKPOINTS):
//! mean checkpoint and sync-phase time over the last tenth of the checkpoints since the
//! previous report point, process RSS (the
//! engine runs in this process, as in the daemon), manifest bytes and private-file bytes
//! per checkpoint, live SSTs per backend. Then one JSON line with every figure.
//!
//! Usage: `BENCH_CHECKPOINTS=N [BENCH_BACKENDS=2] [BENCH_KEYS=20000] [BENCH_MODE=time|random]
//! [BENCH_SMALL_FILES=on|off] [BENCH_ROCKSDB_OPTIONS='name=value;...'] [BENCH_KEEP=DIR]
//! [BENCH_FORGET=1 (the engine is not dropped at the end: heaptrack reports what it holds)]
//! cargo run --example bench_scale` (scripts/bench-scale).
//! A benchmark, not a test: targets are reported, never asserted.

mod common;

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use ckptfs_core::compaction::SmallFilePolicy;
use ckptfs_core::{BackendName, Engine, EngineConfig, WriteOp};
use serde_json::json;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn main() -> ExitCode {
    let checkpoints: u64 = env_or("BENCH_CHECKPOINTS", 1000);
    let backends: u32 = env_or("BENCH_BACKENDS", 2);
    let keys: u32 = env_or("BENCH_KEYS", 20_000);
    let updates: u32 = env_or("BENCH_UPDATES", 500);
    let mode: String = env_or("BENCH_MODE", "time".to_string());
    let small_files = env_or("BENCH_SMALL_FILES", "on".to_string()) == "on";
    let report_at: Vec<u64> = match std::env::var("BENCH_REPORT_AT") {
        Ok(list) => list
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect(),
        Err(_) => std::iter::successors(Some(10u64), |n| Some(n * 10))
            .take_while(|n| *n <= checkpoints)
            .chain(std::iter::once(checkpoints))
            .collect(),
    };
    // BENCH_KEEP=DIR keeps the store (DIR/store) for a look through the mount afterwards.
    let keep = std::env::var_os("BENCH_KEEP").map(std::path::PathBuf::from);
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = match &keep {
        Some(dir) => dir.join("store"),
        None => dir.path().join("store"),
    };
    let mut config = EngineConfig::new(&store);
    config.backends = (0..backends)
        .map(|i| BackendName::new("Scale", i).expect("name"))
        .collect();
    config.retain = Some(u32::MAX);
    config.backend_options.rocksdb_options = std::env::var("BENCH_ROCKSDB_OPTIONS").ok();
    let engine = match Engine::open(config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("bench_scale: {e}");
            return ExitCode::FAILURE;
        }
    };
    let names = engine.backend_names();
    let mut rng = Rng(0x5ca1_ab1e_0000_0001);
    let value =
        |rng: &mut Rng| -> Vec<u8> { (0..100).map(|_| b'a' + (rng.next() % 26) as u8).collect() };
    for name in &names {
        let ops: Vec<WriteOp> = (0..keys)
            .map(|k| WriteOp::Put(format!("k{k:010}").into_bytes(), value(&mut rng)))
            .collect();
        engine.write(name, &ops).expect("load");
    }
    println!(
        "mode {mode}, {backends} backends x {keys} keys, {checkpoints} checkpoints, \
         small-file compaction {}",
        if small_files { "on" } else { "off" }
    );
    println!(
        "| checkpoint | ckpt ms (mean) | sync ms (mean) | RSS MiB | manifest+list KiB/ckpt | private KiB listed | MANIFEST KiB stored/ckpt (mean) | uploaded KiB/ckpt (mean) | live SSTs/backend | merged files | stored objects |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    // Per checkpoint: total ms, sync ms, MANIFEST chunk bytes stored, bytes uploaded.
    let mut window: Vec<[f64; 4]> = Vec::new();
    let mut merged = 0usize;
    let started = Instant::now();
    for i in 1..=checkpoints {
        for (b, name) in names.iter().enumerate() {
            let ops: Vec<WriteOp> = if mode == "random" {
                (0..updates)
                    .map(|_| {
                        let k = rng.next() % keys as u64;
                        WriteOp::Put(format!("k{k:010}").into_bytes(), value(&mut rng))
                    })
                    .collect()
            } else {
                vec![WriteOp::Put(
                    format!("t{i:010}-{b}").into_bytes(),
                    value(&mut rng),
                )]
            };
            engine.write(name, &ops).expect("write");
        }
        let clock = Instant::now();
        let manifest = engine.checkpoint().expect("checkpoint");
        // Memory as the checkpoint left it (before this loop's own figures allocate).
        let rss = common::rss_kib();
        window.push([
            clock.elapsed().as_secs_f64() * 1000.0,
            manifest.stats.sync_micros as f64 / 1000.0,
            manifest.stats.bytes_uploaded_append_only as f64,
            manifest.stats.bytes_uploaded as f64,
        ]);
        if small_files && i % 100 == 0 {
            for name in &names {
                merged += engine
                    .compact_small_files(name, &SmallFilePolicy::default())
                    .expect("compact")
                    .0;
            }
        }
        if report_at.contains(&i) {
            let tail = window.len().div_ceil(10).max(1);
            let recent = &window[window.len() - tail..];
            let mean = |k: usize| recent.iter().map(|w| w[k]).sum::<f64>() / recent.len() as f64;
            let private: u64 = manifest
                .backends
                .iter()
                .flat_map(|b| b.files.iter())
                .filter(|f| !f.name.ends_with(".sst"))
                .map(|f| f.size)
                .sum();
            // Manifests proper, plus the file lists they name (stored as objects).
            let lists: std::collections::BTreeSet<_> = engine
                .checkpoints()
                .iter()
                .flat_map(|m| {
                    m.backends
                        .iter()
                        .flat_map(|b| b.lists.iter())
                        .collect::<Vec<_>>()
                })
                .collect();
            let list_bytes: u64 = lists
                .iter()
                .filter_map(|id| engine.object_store().local_path(id))
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum();
            let manifests = dir_bytes(&store.join("checkpoints")) + list_bytes;
            let ssts: usize = names
                .iter()
                .map(|n| engine.live_sst_files(n).map(|f| f.len()).unwrap_or(0))
                .sum::<usize>()
                / names.len();
            let row = json!({
                "checkpoint": i,
                "checkpoint_ms": mean(0),
                "sync_ms": mean(1),
                "manifest_chunks_kib_stored_per_checkpoint": mean(2) / 1024.0,
                "uploaded_kib_per_checkpoint": mean(3) / 1024.0,
                "rss_mib": rss as f64 / 1024.0,
                "manifest_kib_per_checkpoint": manifests as f64 / 1024.0 / i as f64,
                "newest_manifest_kib": std::fs::metadata(store.join(format!("checkpoints/{}.json", manifest.id))).map(|m| m.len()).unwrap_or(0) as f64 / 1024.0,
                "private_kib_listed": private as f64 / 1024.0,
                "live_ssts_per_backend": ssts,
                "stored_objects": engine.reference_counts().len(),
                "merged_files": merged,
            });
            println!(
                "| {i} | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {ssts} | {merged} | {} |",
                row["checkpoint_ms"].as_f64().unwrap_or(0.0),
                row["sync_ms"].as_f64().unwrap_or(0.0),
                row["rss_mib"].as_f64().unwrap_or(0.0),
                row["manifest_kib_per_checkpoint"].as_f64().unwrap_or(0.0),
                row["private_kib_listed"].as_f64().unwrap_or(0.0),
                row["manifest_chunks_kib_stored_per_checkpoint"].as_f64().unwrap_or(0.0),
                row["uploaded_kib_per_checkpoint"].as_f64().unwrap_or(0.0),
                row["stored_objects"],
            );
            rows.push(row);
            window.clear();
        }
    }
    println!(
        "{}",
        json!({
            "mode": mode,
            "backends": backends,
            "keys": keys,
            "checkpoints": checkpoints,
            "small_file_compaction": small_files,
            "seconds": started.elapsed().as_secs_f64(),
            "rows": rows,
        })
    );
    if std::env::var_os("BENCH_FORGET").is_some() {
        // For heap profilers (heaptrack): what the engine holds at the end shows as leaked.
        std::mem::forget(engine);
    }
    ExitCode::SUCCESS
}
