//! Memory benchmark (issue 43): a store of OBJECTS stored objects and CHECKPOINTS retained
//! checkpoints, built quickly through ckptfs's own import, for a daemon to be started on it
//! (scripts/bench-million measures its memory).
//!
//! Making a million SSTs by RocksDB flushes takes hours; RocksDB's `SstFileWriter` writes
//! real SSTs (block-based tables, each with its properties block) in microseconds. One
//! backend's source is a RocksDB checkpoint directory per round: CURRENT, MANIFEST and
//! OPTIONS of a real (empty) RocksDB checkpoint, and a sliding window of LIVE SSTs of a few
//! keys each, of which NEW (OBJECTS / CHECKPOINTS) are new in each round and the rest are
//! hard links of the previous round's newest ones, as RocksDB links unchanged SSTs into each
//! checkpoint. Each round is imported by ckptfs's engine in this process, as `ckptfs import
//! STORE` does (`import::scan`, then `begin(Import)` and `complete_with_imports`), into a
//! store that retains every checkpoint; the previous round's directory is then removed. The
//! last round's successor is left in DIR/src/next, not imported (for a new import into the
//! finished store).
//!
//! What differs from a live database: `SstFileWriter` records no database identity (its
//! `db_id` is "SST Writer"), so ckptfs re-reads every SST of each round instead of
//! re-referencing the unchanged ones unread (their bytes dedupe to the same objects all the
//! same); and the MANIFEST does not name the SSTs (ckptfs does not read it).
//!
//! Usage: `BENCH_DIR=DIR [BENCH_OBJECTS=1000000] [BENCH_CHECKPOINTS=1000] [BENCH_LIVE=4000]
//! [BENCH_KEYS=4] cargo run --example bench_million` builds DIR/store (DIR new or empty;
//! without BENCH_DIR a temporary directory, removed at the end). Prints progress every tenth
//! of the rounds and one JSON line. A benchmark, not a test: nothing is asserted but the
//! import's success.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use ckptfs_core::store::Location;
use ckptfs_core::{BackendName, CheckpointPlan, Engine, EngineConfig};
use common::{Context, Result};
use serde_json::json;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}: cannot read {v:?}")),
        Err(_) => Ok(default),
    }
}

/// The SST numbered `n`: its name, and its keys' prefix (distinct bytes in every file).
fn sst_name(n: u64) -> String {
    format!("{:06}.sst", 100_000 + n)
}

/// Write SST `n` with `keys` keys into `dir`.
fn write_sst(writer: &mut rocksdb::SstFileWriter, dir: &Path, n: u64, keys: u32) -> Result<()> {
    let path = dir.join(sst_name(n));
    writer.open(&path).ctx(format!("open {}", path.display()))?;
    for k in 0..keys {
        let key = format!("file{n:010}-key{k:04}");
        let value = common::value(0, n * u64::from(keys) + u64::from(k), 0);
        writer.put(key.as_bytes(), &value[..64]).ctx("put")?;
    }
    writer.finish().ctx(format!("finish {}", path.display()))
}

/// A real RocksDB checkpoint of an empty database: its files other than SSTs (CURRENT,
/// MANIFEST, OPTIONS, the WAL), linked into every round's directory.
fn private_files(work: &Path) -> Result<Vec<PathBuf>> {
    let db_dir = work.join("seed-db");
    let ckpt = work.join("seed");
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    let db = rocksdb::DB::open(&opts, &db_dir).ctx("open the seed database")?;
    rocksdb::checkpoint::Checkpoint::new(&db)
        .and_then(|c| c.create_checkpoint(&ckpt))
        .ctx("checkpoint the seed database")?;
    drop(db);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&ckpt)
        .ctx("list the seed checkpoint")?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_none_or(|e| e != "sst"))
        .collect();
    files.sort();
    Ok(files)
}

/// Make a round's directory `dir`: the private files, hard links of the newest `kept` SSTs
/// of `previous` (numbered below `next`), then `count` new SSTs numbered from `next` on.
fn next_round(
    writer: &mut rocksdb::SstFileWriter,
    private: &[PathBuf],
    previous: Option<&Path>,
    dir: &Path,
    next: &mut u64,
    (kept, count): (u64, u64),
    keys: u32,
) -> Result<()> {
    std::fs::create_dir(dir).ctx(format!("create {}", dir.display()))?;
    for file in private {
        let name = file.file_name().expect("a file name");
        std::fs::hard_link(file, dir.join(name)).ctx("link a private file")?;
    }
    if let Some(prev) = previous {
        for n in next.saturating_sub(kept)..*next {
            std::fs::hard_link(prev.join(sst_name(n)), dir.join(sst_name(n))).ctx("link an SST")?;
        }
    }
    for _ in 0..count {
        write_sst(writer, dir, *next, keys)?;
        *next += 1;
    }
    Ok(())
}

struct Args {
    objects: u64,
    checkpoints: u64,
    live: u64,
    keys: u32,
}

fn run(work: &Path, args: &Args) -> Result<serde_json::Value> {
    let new = (args.objects / args.checkpoints).max(1);
    let live = args.live.max(new);
    let store = work.join("store");
    let sources = work.join("src");
    std::fs::create_dir_all(&sources).ctx("create the sources' directory")?;
    let private = private_files(work)?;
    let mut config = EngineConfig::new(Location::Local(store.clone()));
    config.host_backends = false;
    config.retain = Some(u32::try_from(args.checkpoints).ctx("BENCH_CHECKPOINTS")?);
    let engine = Engine::open(config).ctx("open the store")?;
    let backend = BackendName::new("bench", 0).ctx("backend name")?;
    let sst_options = rocksdb::Options::default();
    let mut writer = rocksdb::SstFileWriter::create(&sst_options);
    println!(
        "{} checkpoints, {new} new SSTs each of {} keys, {live} per checkpoint, into {}",
        args.checkpoints,
        args.keys,
        store.display()
    );
    let started = Instant::now();
    let (mut write_s, mut import_s) = (0.0, 0.0);
    let mut next = 0u64; // the next SST's number
    let mut previous: Option<PathBuf> = None;
    let mut last_id = 0;
    for round in 1..=args.checkpoints {
        let dir = sources.join(format!("round-{round}"));
        let clock = Instant::now();
        let count = if previous.is_none() { live } else { new };
        next_round(
            &mut writer,
            &private,
            previous.as_deref(),
            &dir,
            &mut next,
            (live - new, count),
            args.keys,
        )?;
        write_s += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let (manifest, _) = ckptfs_core::import::scan(&backend, &dir)
            .and_then(|scanned| engine.begin(CheckpointPlan::Import(vec![scanned])))
            .and_then(|pending| pending.complete_with_imports())
            .ctx(format!("import {}", dir.display()))?;
        import_s += clock.elapsed().as_secs_f64();
        last_id = manifest.id;
        if let Some(prev) = previous.replace(dir) {
            std::fs::remove_dir_all(&prev).ctx(format!("remove {}", prev.display()))?;
        }
        if round % (args.checkpoints / 10).max(1) == 0 || round == args.checkpoints {
            println!(
                "round {round}: {next} SSTs written, {:.0} s (writing {write_s:.0} s, \
                 importing {import_s:.0} s), this process's RSS {} MiB",
                started.elapsed().as_secs_f64(),
                common::rss_kib() / 1024
            );
        }
    }
    // The next round's directory, not imported: for a new import into the finished store.
    let after = sources.join("next");
    if let Some(prev) = previous {
        next_round(
            &mut writer,
            &private,
            Some(&prev),
            &after,
            &mut next,
            (live - new, new),
            args.keys,
        )?;
        std::fs::remove_dir_all(&prev).ctx(format!("remove {}", prev.display()))?;
    }
    let objects = engine.reference_counts().len();
    let retained = engine.checkpoints().len();
    Ok(json!({
        "checkpoints": retained,
        "stored_objects": objects,
        "ssts_written": next,
        "ssts_per_checkpoint": live,
        "new_per_checkpoint": new,
        "newest_checkpoint": last_id,
        "seconds": started.elapsed().as_secs_f64(),
        "write_seconds": write_s,
        "import_seconds": import_s,
        "builder_rss_mib": common::rss_kib() / 1024,
    }))
}

fn main() -> ExitCode {
    let args = (|| -> Result<Args> {
        Ok(Args {
            objects: env_or("BENCH_OBJECTS", 1_000_000)?,
            checkpoints: env_or::<u64>("BENCH_CHECKPOINTS", 1000)?.max(1),
            live: env_or("BENCH_LIVE", 4000)?,
            keys: env_or::<u32>("BENCH_KEYS", 4)?.max(1),
        })
    })();
    let temporary = tempfile::tempdir();
    let work = match (std::env::var_os("BENCH_DIR"), &temporary) {
        (Some(dir), _) => PathBuf::from(dir),
        (None, Ok(t)) => t.path().to_path_buf(),
        (None, Err(e)) => {
            eprintln!("bench_million: temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.and_then(|a| run(&work, &a)) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench_million: {e}");
            ExitCode::FAILURE
        }
    }
}
