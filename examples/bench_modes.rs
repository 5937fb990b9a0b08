//! Benchmark of the checkpoint modes: `flush`, `wal` and RocksDB's BackupEngine on the same
//! workload, side by side in one run: every system loads its state, then the rounds
//! alternate (round 1 of each system, round 2 of each, ...), so that what the machine does
//! meanwhile falls on every system alike.
//!
//! Each system loads about TOTAL_MIB of incompressible state into BACKENDS RocksDB instances
//! (RocksDB's default options, as ckptfs sets them: SST format 5, a 64 KiB MANIFEST), takes a
//! first full checkpoint, then CHECKPOINTS rounds of "rewrite CHURN_PERCENT of every
//! backend's keys (random keys, the same for every system) + checkpoint", retaining 3. During
//! every checkpoint a writer thread puts small values into the first backend and times each
//! put. BackupEngine runs `create_new_backup_flush(db, true)` per database, then
//! `purge_old_backups(3)`; what it uploaded is what appeared in its backup directories.
//!
//! Reported per system: bytes uploaded per checkpoint (mean, p50, p99, max) as a share of
//! the state and as a multiple of the bytes the workload wrote since the previous
//! checkpoint; checkpoints above 10% of the state (in `wal` mode: outside materializations);
//! the total uploaded, the store size at the end and the amplification (uploaded /
//! written); the synchronous phase p50/p99 and the concurrent writer's put latency p99; the
//! time to restore the newest checkpoint and to open it (which replays its WAL), and their
//! sum. Writes an
//! SVG plot of bytes uploaded per checkpoint (BENCH_SVG, default docs/bench-modes.svg) and
//! one JSON line.
//!
//! Usage: `cargo run --example bench_modes -- [TOTAL_MIB [BACKENDS [CHECKPOINTS
//! [CHURN_PERCENT]]]]` (defaults 256, 4, 200, 1). BENCH_SYSTEMS=flush,wal,backup chooses
//! the systems (`wal:MIB`: `wal` mode with `--materialize-wal-mib MIB`; a run may hold
//! several); BENCH_RESTORES=N restores (and opens) the newest checkpoint of each system N
//! times, alternating, and reports the medians (default 1); BENCH_KEEP=1 keeps each
//! system's directory (its store in `store/`) and prints where.
//! A benchmark, not a test: targets are reported, never asserted.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ckptfs_core::backend::BackendOptions;
use ckptfs_core::{BackendName, CheckpointMode, Engine, EngineConfig, WriteOp};
use common::{key, mix, percentile, tree_bytes, value, KEY_SIZE, VALUE_SIZE};
use rocksdb::backup::{BackupEngine, BackupEngineOptions, RestoreOptions};
use serde_json::json;

const MIB: u64 = 1 << 20;
const BATCH: usize = 1000;
const RETAIN: u32 = 3;
/// The concurrent writer: one put of this many value bytes every WRITER_PAUSE.
const WRITER_VALUE: usize = 100;
const WRITER_PAUSE: Duration = Duration::from_micros(500);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum System {
    Flush,
    /// `wal` mode, with its `--materialize-wal-mib` if not the default.
    Wal(Option<u64>),
    Backup,
}

impl System {
    fn name(self) -> String {
        match self {
            System::Flush => "flush".into(),
            System::Wal(None) => "wal".into(),
            System::Wal(Some(mib)) => format!("wal, --materialize-wal-mib {mib}"),
            System::Backup => "BackupEngine".into(),
        }
    }
}

struct Sample {
    uploaded: u64,
    written: u64,
    sync_us: Option<u64>,
    total_us: u64,
    materialized: bool,
}

struct Run {
    system: System,
    first_upload: u64,
    samples: Vec<Sample>,
    put_latency_us: Vec<u64>,
    store_bytes: u64,
    /// Each restore of the newest checkpoint: (restore ms, open ms).
    restores: Vec<(f64, f64)>,
    seconds: f64,
}

/// What a system must do: write, checkpoint, report.
trait Target: Send {
    fn write(&self, backend: usize, ops: Vec<WriteOp>);
    /// Take a checkpoint: (bytes uploaded, sync phase micros, materialized).
    fn checkpoint(&mut self) -> (u64, Option<u64>, bool);
    fn store_bytes(&self) -> u64;
    /// Restore the newest checkpoint into `dest`; returns each backend's directory.
    fn restore(&mut self, dest: &Path) -> Vec<PathBuf>;
    /// Puts into the first backend, usable while a checkpoint runs.
    fn put_handle(&self) -> Box<dyn Fn(Vec<u8>, Vec<u8>) + Send>;
}

struct Ckptfs {
    engine: Engine,
    names: Vec<BackendName>,
    store: PathBuf,
    last: u64,
}

impl Target for Ckptfs {
    fn write(&self, backend: usize, ops: Vec<WriteOp>) {
        self.engine.write(&self.names[backend], &ops).unwrap();
    }

    fn checkpoint(&mut self) -> (u64, Option<u64>, bool) {
        let m = self.engine.checkpoint().unwrap();
        self.last = m.id;
        let manifest = std::fs::metadata(self.store.join(format!("checkpoints/{}.json", m.id)))
            .map(|m| m.len())
            .unwrap_or(0);
        (
            m.stats.bytes_uploaded + m.stats.bytes_uploaded_materialization + manifest,
            Some(m.stats.sync_micros),
            m.stats.backends_materialized > 0,
        )
    }

    fn store_bytes(&self) -> u64 {
        tree_bytes(&self.store.join("objects")) + tree_bytes(&self.store.join("checkpoints"))
    }

    fn restore(&mut self, dest: &Path) -> Vec<PathBuf> {
        ckptfs_core::commands::restore::restore_checkpoint(&self.store, self.last, dest, |_| {})
            .unwrap();
        self.names.iter().map(|n| dest.join(n.rel_path())).collect()
    }

    fn put_handle(&self) -> Box<dyn Fn(Vec<u8>, Vec<u8>) + Send> {
        let (engine, name) = (self.engine.clone(), self.names[0].clone());
        Box::new(move |k, v| engine.put(&name, &k, &v).unwrap())
    }
}

struct Backup {
    dbs: Vec<Arc<rocksdb::DB>>,
    engines: Vec<BackupEngine>,
    dirs: Vec<PathBuf>,
    seen: HashMap<PathBuf, u64>,
}

impl Backup {
    /// Bytes of files that appeared (or changed size) in the backup directories.
    fn new_bytes(&mut self) -> u64 {
        let mut files = Vec::new();
        for dir in &self.dirs {
            walk(dir, &mut files);
        }
        let mut new = 0;
        let mut now = HashMap::new();
        for (path, size) in files {
            if self.seen.get(&path) != Some(&size) {
                new += size;
            }
            now.insert(path, size);
        }
        self.seen = now;
        new
    }
}

fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&e.path(), out),
            Ok(t) if t.is_file() => {
                out.push((e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)));
            }
            _ => {}
        }
    }
}

impl Target for Backup {
    fn write(&self, backend: usize, ops: Vec<WriteOp>) {
        let mut batch = rocksdb::WriteBatch::default();
        for op in ops {
            if let WriteOp::Put(k, v) = op {
                batch.put(k, v);
            }
        }
        self.dbs[backend].write(batch).unwrap();
    }

    fn checkpoint(&mut self) -> (u64, Option<u64>, bool) {
        for (db, engine) in self.dbs.iter().zip(&mut self.engines) {
            engine.create_new_backup_flush(db, true).unwrap();
            engine.purge_old_backups(RETAIN as usize).unwrap();
        }
        (self.new_bytes(), None, false)
    }

    fn store_bytes(&self) -> u64 {
        self.dirs.iter().map(|d| tree_bytes(d)).sum()
    }

    fn restore(&mut self, dest: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for (i, engine) in self.engines.iter_mut().enumerate() {
            let dir = dest.join(format!("Bench/{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            engine
                .restore_from_latest_backup(&dir, &dir, &RestoreOptions::default())
                .unwrap();
            out.push(dir);
        }
        out
    }

    fn put_handle(&self) -> Box<dyn Fn(Vec<u8>, Vec<u8>) + Send> {
        let db = self.dbs[0].clone();
        Box::new(move |k, v| db.put(k, v).unwrap())
    }
}

fn open_target(system: System, work: &Path, backends: usize) -> Box<dyn Target> {
    let names: Vec<BackendName> = (0..backends)
        .map(|i| format!("Bench/{i}").parse().unwrap())
        .collect();
    match system {
        System::Flush | System::Wal(_) => {
            let store = work.join("store");
            let mut config = EngineConfig::new(&store);
            config.backends = names.clone();
            config.retain = Some(RETAIN);
            config.backend_options.checkpoint_mode = if let System::Wal(mib) = system {
                if let Some(mib) = mib {
                    config.materialize.wal_bytes = mib << 20;
                }
                CheckpointMode::Wal
            } else {
                CheckpointMode::Flush
            };
            let engine = Engine::open(config).unwrap();
            Box::new(Ckptfs {
                engine,
                names,
                store,
                last: 0,
            })
        }
        System::Backup => {
            let opts = BackendOptions::default().rocksdb_options(true).unwrap();
            let env = rocksdb::Env::new().unwrap();
            let mut dbs = Vec::new();
            let mut engines = Vec::new();
            let mut dirs = Vec::new();
            for i in 0..backends {
                dbs.push(Arc::new(
                    rocksdb::DB::open(&opts, work.join(format!("db/{i}"))).unwrap(),
                ));
                let dir = work.join(format!("backup/{i}"));
                std::fs::create_dir_all(&dir).unwrap();
                engines.push(
                    BackupEngine::open(&BackupEngineOptions::new(&dir).unwrap(), &env).unwrap(),
                );
                dirs.push(dir);
            }
            Box::new(Backup {
                dbs,
                engines,
                dirs,
                seen: HashMap::new(),
            })
        }
    }
}

/// The keys of round `round`: `count` random indices below `keys` (the same for every
/// system).
fn churn_set(keys: u64, count: u64, round: u64, backend: usize) -> Vec<u64> {
    (0..count)
        .map(|j| mix(j ^ (round << 32) ^ ((backend as u64) << 56)) % keys)
        .collect()
}

/// One system's run, a round at a time: the systems' rounds alternate (round 1 of each,
/// then round 2 of each, ...), so that whatever the machine does meanwhile falls on all of
/// them alike.
struct Runner {
    system: System,
    work: tempfile::TempDir,
    clock: Instant,
    target: Arc<Mutex<Box<dyn Target>>>,
    keys: u64,
    churn: u64,
    backends: usize,
    checkpoints: u64,
    first_upload: u64,
    latencies: Arc<Mutex<Vec<u64>>>,
    samples: Vec<Sample>,
    writer_bytes: u64,
    writer_key: u64,
    restores: Vec<(f64, f64)>,
}

impl Runner {
    /// Open the system and load the state, then take the first, full checkpoint.
    fn start(system: System, args: &Args) -> Runner {
        let work = tempfile::Builder::new()
            .prefix("ckptfs-bench-modes-")
            .tempdir()
            .unwrap();
        let clock = Instant::now();
        let target = Arc::new(Mutex::new(open_target(system, work.path(), args.backends)));
        let keys = args.total_mib * MIB / args.backends as u64 / (KEY_SIZE + VALUE_SIZE) as u64;
        let churn = ((keys as f64 * args.churn_percent / 100.0).round() as u64).max(1);
        eprintln!(
            "{}: loading {} keys into each of {} backends",
            system.name(),
            keys,
            args.backends
        );
        let all: Vec<u64> = (0..keys).collect();
        for chunk in all.chunks(BATCH) {
            let t = target.lock().unwrap();
            for b in 0..args.backends {
                t.write(
                    b,
                    chunk
                        .iter()
                        .map(|&i| WriteOp::Put(key(i), value(b as u32, i, 0)))
                        .collect(),
                );
            }
        }
        let first_upload = target.lock().unwrap().checkpoint().0;
        Runner {
            system,
            work,
            clock,
            target,
            keys,
            churn,
            backends: args.backends,
            checkpoints: args.checkpoints,
            first_upload,
            latencies: Arc::new(Mutex::new(Vec::new())),
            samples: Vec::new(),
            writer_bytes: 0,
            writer_key: 0,
            restores: Vec::new(),
        }
    }

    /// Round `round`: rewrite the churn set, then checkpoint while a writer puts.
    fn round(&mut self, round: u64) {
        let (keys, churn) = (self.keys, self.churn);
        let mut written = std::mem::take(&mut self.writer_bytes);
        {
            let t = self.target.lock().unwrap();
            for b in 0..self.backends {
                let set = churn_set(keys, churn, round, b);
                for chunk in set.chunks(BATCH) {
                    t.write(
                        b,
                        chunk
                            .iter()
                            .map(|&i| WriteOp::Put(key(i), value(b as u32, i, round)))
                            .collect(),
                    );
                }
                written += churn * (KEY_SIZE + VALUE_SIZE) as u64;
            }
        }
        // The concurrent writer: its puts go through a second handle on the same databases.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (stop, latencies) = (stop.clone(), self.latencies.clone());
            let writer_handle = writer_handle(&self.target);
            let start_key = self.writer_key;
            std::thread::spawn(move || {
                let mut k = start_key;
                let mut mine = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    writer_handle(k);
                    mine.push(t.elapsed().as_micros() as u64);
                    k += 1;
                    std::thread::sleep(WRITER_PAUSE);
                }
                latencies.lock().unwrap().extend(&mine);
                k
            })
        };
        let t = Instant::now();
        let (uploaded, sync_us, materialized) = self.target.lock().unwrap().checkpoint();
        let total_us = t.elapsed().as_micros() as u64;
        stop.store(true, Ordering::Relaxed);
        let next = writer.join().unwrap();
        self.writer_bytes += (next - self.writer_key) * (WRITER_VALUE + 9) as u64;
        self.writer_key = next;
        self.samples.push(Sample {
            uploaded,
            written,
            sync_us,
            total_us,
            materialized,
        });
        if round.is_multiple_of(20) {
            eprintln!(
                "{}: checkpoint {round}/{}: {:.2} MiB uploaded",
                self.system.name(),
                self.checkpoints,
                uploaded as f64 / MIB as f64
            );
        }
    }

    /// Restore the newest checkpoint into a new directory, then open each backend
    /// (replaying its WAL) and check one key of the last round; the directory is removed
    /// again.
    fn restore_once(&mut self) {
        let dest = self
            .work
            .path()
            .join(format!("restored-{}", self.restores.len()));
        let t = Instant::now();
        let dirs = self.target.lock().unwrap().restore(&dest);
        let restore_ms = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        for (b, dir) in dirs.iter().enumerate() {
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(false);
            let db = rocksdb::DB::open(&opts, dir).unwrap();
            let i = churn_set(self.keys, self.churn, self.checkpoints, b)[0];
            let got = db.get(key(i)).unwrap();
            assert_eq!(
                got,
                Some(value(b as u32, i, self.checkpoints)),
                "{}: restored backend {b} lacks the last round",
                self.system.name()
            );
        }
        let open_ms = t.elapsed().as_secs_f64() * 1000.0;
        self.restores.push((restore_ms, open_ms));
        std::fs::remove_dir_all(&dest).unwrap();
    }

    fn finish(self) -> Run {
        let store_bytes = self.target.lock().unwrap().store_bytes();
        let put_latency_us = std::mem::take(&mut *self.latencies.lock().unwrap());
        let seconds = self.clock.elapsed().as_secs_f64();
        drop(self.target);
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!(
                "{}: kept {}",
                self.system.name(),
                self.work.keep().display()
            );
        }
        Run {
            system: self.system,
            first_upload: self.first_upload,
            samples: self.samples,
            put_latency_us,
            store_bytes,
            restores: self.restores,
            seconds,
        }
    }
}

/// A put into the first backend that does not wait for the lock the checkpoint holds:
/// ckptfs's engine and RocksDB's DB are both safe to share, so the writer gets its own handle.
fn writer_handle(target: &Arc<Mutex<Box<dyn Target>>>) -> Box<dyn Fn(u64) + Send> {
    let put = target.lock().unwrap().put_handle();
    Box::new(move |k| put(format!("w{k:015}").into_bytes(), vec![b'w'; WRITER_VALUE]))
}

struct Args {
    total_mib: u64,
    backends: usize,
    checkpoints: u64,
    churn_percent: f64,
}

fn stats_line(run: &Run, state: u64) -> serde_json::Value {
    let mut shares: Vec<f64> = run
        .samples
        .iter()
        .map(|s| s.uploaded as f64 / state as f64 * 100.0)
        .collect();
    let mut multiples: Vec<f64> = run
        .samples
        .iter()
        .map(|s| s.uploaded as f64 / s.written.max(1) as f64)
        .collect();
    shares.sort_by(f64::total_cmp);
    multiples.sort_by(f64::total_cmp);
    let mut sync: Vec<u64> = run.samples.iter().filter_map(|s| s.sync_us).collect();
    sync.sort();
    let mut total: Vec<u64> = run.samples.iter().map(|s| s.total_us).collect();
    total.sort();
    let mut lat = run.put_latency_us.clone();
    lat.sort();
    let uploaded: u64 = run.samples.iter().map(|s| s.uploaded).sum();
    let written: u64 = run.samples.iter().map(|s| s.written).sum();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let spikes = run
        .samples
        .iter()
        .filter(|s| s.uploaded * 10 > state && !s.materialized)
        .count();
    json!({
        "system": run.system.name(),
        "checkpoints": run.samples.len(),
        "first_upload_mib": run.first_upload as f64 / MIB as f64,
        "share_pct": {"mean": mean(&shares), "p50": percentile(&shares, 50.0),
            "p99": percentile(&shares, 99.0), "max": shares.last().copied().unwrap_or(0.0)},
        "x_written": {"mean": mean(&multiples), "p50": percentile(&multiples, 50.0),
            "p99": percentile(&multiples, 99.0), "max": multiples.last().copied().unwrap_or(0.0)},
        "spikes_over_10pct_outside_materializations": spikes,
        "materializations": run.samples.iter().filter(|s| s.materialized).count(),
        "uploaded_mib": uploaded as f64 / MIB as f64,
        "written_mib": written as f64 / MIB as f64,
        "amplification": uploaded as f64 / written.max(1) as f64,
        "store_mib": run.store_bytes as f64 / MIB as f64,
        "sync_ms": {"p50": percentile(&sync, 50.0) as f64 / 1000.0,
            "p99": percentile(&sync, 99.0) as f64 / 1000.0},
        "checkpoint_ms": {"p50": percentile(&total, 50.0) as f64 / 1000.0,
            "p99": percentile(&total, 99.0) as f64 / 1000.0},
        "put_p99_ms": percentile(&lat, 99.0) as f64 / 1000.0,
        "puts": lat.len(),
        "restore_ms": median(run.restores.iter().map(|r| r.0)),
        "open_ms": median(run.restores.iter().map(|r| r.1)),
        "restore_and_open_ms": median(run.restores.iter().map(|r| r.0 + r.1)),
        "restores": run.restores.iter().map(|r| json!([r.0, r.1])).collect::<Vec<_>>(),
        "seconds": run.seconds,
    })
}

/// Bytes uploaded per checkpoint, one line per system, log scale.
fn svg(runs: &[Run], state: u64) -> String {
    let (w, h, left, bottom, top, right) = (900.0, 420.0, 70.0, 50.0, 30.0, 150.0);
    let n = runs
        .iter()
        .map(|r| r.samples.len())
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    let lo = 10.0f64.ln(); // 10 KiB .. state
    let hi = (state as f64 / 1024.0).max(100.0).ln();
    let x = |i: usize| left + (w - left - right) * i as f64 / (n - 1.0);
    let y = |bytes: u64| {
        let v = (bytes as f64 / 1024.0).max(10.0).ln();
        top + (h - top - bottom) * (1.0 - (v - lo) / (hi - lo))
    };
    let colors = ["#d62728", "#1f77b4", "#7f7f7f"];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>\n<text x=\"{left}\" y=\"18\">bytes uploaded per checkpoint (log \
         scale)</text>\n"
    );
    let ticks = [
        (10 << 10, "10 KiB"),
        (100 << 10, "100 KiB"),
        (MIB, "1 MiB"),
        (10 * MIB, "10 MiB"),
        (100 * MIB, "100 MiB"),
        (1 << 30, "1 GiB"),
        (10 << 30, "10 GiB"),
    ];
    for (tick, label) in ticks
        .into_iter()
        .filter(|(t, _)| *t as f64 <= state as f64 * 1.01)
    {
        let ty = y(tick);
        out += &format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{ty:.1}\" y2=\"{ty:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>\n",
            w - right,
            left - 6.0,
            ty + 4.0
        );
    }
    out += &format!(
        "<text x=\"{:.0}\" y=\"{}\" text-anchor=\"middle\">checkpoint</text>\n",
        (left + w - right) / 2.0,
        h - 12.0
    );
    for (k, run) in runs.iter().enumerate() {
        let points: Vec<String> = run
            .samples
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{:.1},{:.1}", x(i), y(s.uploaded)))
            .collect();
        let color = colors[k % colors.len()];
        out += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.2\" points=\"{}\"/>\n\
             <text x=\"{}\" y=\"{}\" fill=\"{color}\">{}</text>\n",
            points.join(" "),
            w - right + 10.0,
            top + 20.0 * (k as f64 + 1.0),
            run.system.name()
        );
    }
    out + "</svg>\n"
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| argv.get(i).cloned().unwrap_or(default.to_string());
    let args = Args {
        total_mib: arg(0, "256").parse().expect("TOTAL_MIB"),
        backends: arg(1, "4").parse().expect("BACKENDS"),
        checkpoints: arg(2, "200").parse().expect("CHECKPOINTS"),
        churn_percent: arg(3, "1").parse().expect("CHURN_PERCENT"),
    };
    let systems: Vec<System> = std::env::var("BENCH_SYSTEMS")
        .unwrap_or("flush,wal,backup".into())
        .split(',')
        .map(|s| match s {
            "flush" => System::Flush,
            "wal" => System::Wal(None),
            wal if wal.starts_with("wal:") => System::Wal(Some(wal[4..].parse().expect("wal:MIB"))),
            "backup" => System::Backup,
            other => panic!("unknown system {other}"),
        })
        .collect();
    let restores: usize = std::env::var("BENCH_RESTORES")
        .map(|v| v.parse().expect("BENCH_RESTORES"))
        .unwrap_or(1);
    let keys = args.total_mib * MIB / args.backends as u64 / (KEY_SIZE + VALUE_SIZE) as u64;
    let state = keys * args.backends as u64 * (KEY_SIZE + VALUE_SIZE) as u64;
    let mut runners: Vec<Runner> = systems.iter().map(|s| Runner::start(*s, &args)).collect();
    for round in 1..=args.checkpoints {
        for runner in &mut runners {
            runner.round(round);
        }
    }
    // The restores alternate too.
    for _ in 0..restores {
        for runner in &mut runners {
            runner.restore_once();
        }
    }
    let runs: Vec<Run> = runners.into_iter().map(Runner::finish).collect();
    println!(
        "\n{} MiB in {} backends, {} checkpoints, {}% of the keys rewritten before each\n",
        args.total_mib, args.backends, args.checkpoints, args.churn_percent
    );
    println!(
        "| system | uploaded/ckpt % of state: mean / p50 / p99 / max | x written: mean / p50 / \
         p99 / max | >10% outside mat. | materializations | total uploaded MiB | store MiB | \
         amplification | sync ms p50 / p99 | checkpoint ms p50 / p99 | put p99 ms | restore \
         ms | open ms | restore + open ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut lines = Vec::new();
    for run in &runs {
        let s = stats_line(run, state);
        let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
        println!(
            "| {} | {:.2} / {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} / {:.2} | {} | {} | \
             {:.0} | {:.0} | {:.2} | {} | {:.0} / {:.0} | {:.1} | {:.0} | {:.0} | {:.0} |",
            run.system.name(),
            f(&s["share_pct"]["mean"]),
            f(&s["share_pct"]["p50"]),
            f(&s["share_pct"]["p99"]),
            f(&s["share_pct"]["max"]),
            f(&s["x_written"]["mean"]),
            f(&s["x_written"]["p50"]),
            f(&s["x_written"]["p99"]),
            f(&s["x_written"]["max"]),
            s["spikes_over_10pct_outside_materializations"],
            s["materializations"],
            f(&s["uploaded_mib"]),
            f(&s["store_mib"]),
            f(&s["amplification"]),
            if run.system == System::Backup {
                "-".to_string()
            } else {
                format!(
                    "{:.1} / {:.1}",
                    f(&s["sync_ms"]["p50"]),
                    f(&s["sync_ms"]["p99"])
                )
            },
            f(&s["checkpoint_ms"]["p50"]),
            f(&s["checkpoint_ms"]["p99"]),
            f(&s["put_p99_ms"]),
            f(&s["restore_ms"]),
            f(&s["open_ms"]),
            f(&s["restore_and_open_ms"]),
        );
        lines.push(s);
    }
    let path = std::env::var("BENCH_SVG").unwrap_or("docs/bench-modes.svg".into());
    if let Some(parent) = Path::new(&path).parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&path, svg(&runs, state)).unwrap();
    println!("\nplot: {path}");
    println!(
        "{}",
        json!({"total_mib": args.total_mib, "backends": args.backends,
            "checkpoints": args.checkpoints, "churn_percent": args.churn_percent,
            "state_bytes": state, "systems": lines})
    );
}

/// The median of some figures (NaN for none).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
