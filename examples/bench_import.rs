//! Benchmark of `ckptfs import` against RocksDB's BackupEngine, side by side in one run, for
//! an application that keeps its own RocksDB and checkpoints it with RocksDB's Checkpoint API.
//!
//! One RocksDB database (RocksDB's default options) is loaded with about DB_MIB of
//! incompressible values (fixed-width 16-byte keys, 1 KiB random values). Round 0 checkpoints
//! it in full; then CHECKPOINTS rounds of:
//! 1. overwrite CHANGE_PERCENT of the keys, chosen at random (seeded, distinct within a round);
//! 2. `Checkpoint::create_checkpoint(DIR_i)` (timed on its own: the application's cost, the
//!    same whichever system stores the checkpoint; it flushes the memtable first);
//! 3. `ckptfs import STORE bench/0=DIR_i --json` as a child process, timed; then DIR_{i-1} is
//!    removed (the application keeps only its newest checkpoint directory);
//! 4. BackupEngine `create_new_backup(&db)` + `purge_old_backups(RETAIN)`, timed together;
//! 5. the same import by ckptfs's engine (`ckptfs_core::Engine`) in this process, opened
//!    once on a store of its own (`engine`): what a library call costs, as BackupEngine's
//!    does, without a process's start and the store's open (timed: scan, begin, complete).
//!
//! Bytes read from the source: for ckptfs, the child's `rchar` (its /proc/PID/io, read once
//! it has exited and before it is reaped: `waitid` with `WNOWAIT`; the time taken ends
//! there, so it is the child's alone, from spawn to exit), next to ckptfs's own
//! `bytes_read` figure when its JSON has one; for BackupEngine (in this process), the
//! change of `rchar` around the call, summed over this process's threads except RocksDB's
//! background pool (`rocksdb:*`: compactions and flushes of the live database running
//! meanwhile), with the whole process's change next to it.
//! Both are compared with the bytes of the SSTs that are new in DIR_i (names absent from
//! DIR_{i-1}).
//!
//! BENCH_MOUNT=1 runs ckptfs through a mount instead: round 0 is `ckptfs import STORE
//! bench/0=DIR_0` as above (the store then hosts no backend), then `ckptfs mount STORE MNT`
//! (MNT a new directory; `--retain RETAIN` when RETAIN is not 3), and every later round is
//! `ckptfs import MNT bench/0=DIR_i --json`: the daemon imports, so the bytes read are the
//! change of the daemon's `rchar` (/proc/PID/io, PID the `pid` of MNT/.ckptfs/status) around
//! the command, the child's own `rchar` reported apart. `ckptfs umount MNT` before the
//! restore. The default (no BENCH_MOUNT, or 0) is the store mode above.
//!
//! At the end: the stores' sizes (du), the time to restore the newest checkpoint (`ckptfs
//! restore`, the engine's restore in process, `restore_from_latest_backup`), and a check that
//! each restored database opens
//! (read-only) with the source's number of keys and the last round's values.
//!
//! Prints a table (seconds per checkpoint p50/p99, bytes read and added per checkpoint, store
//! sizes, restore times), where an import's time goes (ckptfs's sync_ms and async_ms against
//! the wall time) and one JSON line; both name the mode that ran. Targets, reported and never
//! asserted: ckptfs import p50 <= BackupEngine p50; ckptfs bytes read <= 1.5 x new SST bytes.
//!
//! Usage: `cargo build --bin ckptfs && cargo run --example bench_import -- [DB_MIB
//! [CHANGE_PERCENT [CHECKPOINTS [RETAIN]]]]` (defaults 256, 1, 50, 3; or the environment
//! variables BENCH_DB_MIB, BENCH_CHANGE_PERCENT, BENCH_CHECKPOINTS, BENCH_RETAIN). Smoke run:
//! `cargo run --example bench_import -- 8 1 5`.
//! CKPTFS_BIN: the ckptfs binary (default `$CARGO_TARGET_DIR/debug/ckptfs`, else
//! `target/debug/ckptfs` in the package). BENCH_SYSTEMS=ckptfs,backup,engine (default all
//! three) picks the systems (`none`: only the database and its checkpoints, for another
//! benchmark to use); BENCH_DIR=DIR works in DIR and keeps it (default: a temporary directory, removed);
//! BENCH_SEED seeds the choice of keys.

mod common;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use ckptfs_core::store::Location;
use ckptfs_core::{BackendName, CheckpointPlan, Engine, EngineConfig};
use common::{key, mix, percentile, value, Context, Mount, Result, KEY_SIZE, VALUE_SIZE};
use rocksdb::backup::{BackupEngine, BackupEngineOptions, RestoreOptions};
use rocksdb::checkpoint::Checkpoint;
use serde_json::{json, Value};

const MIB: f64 = (1 << 20) as f64;
const BATCH: usize = 1000;
const BACKEND: &str = "bench/0";
/// Target: ckptfs reads at most this multiple of the new SST bytes.
const TARGET_READ_RATIO: f64 = 1.5;

struct Args {
    db_mib: u64,
    change_percent: f64,
    checkpoints: u64,
    retain: usize,
    ckptfs: bool,
    backup: bool,
    /// ckptfs's engine in this process, held open across the rounds.
    engine: bool,
    /// BENCH_MOUNT=1: import through a mountpoint (the daemon imports).
    mount: bool,
    seed: u64,
}

fn parse_args() -> Result<Args> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "-h" || a == "--help") {
        return Err(
            "usage: bench_import [DB_MIB [CHANGE_PERCENT [CHECKPOINTS [RETAIN]]]] \
                    (defaults 256 1 50 3; see the top of examples/bench_import.rs)"
                .into(),
        );
    }
    // Positional argument `i`, else the environment variable, else the default.
    fn get<T: std::str::FromStr>(argv: &[String], i: usize, var: &str, default: T) -> Result<T> {
        match argv.get(i).cloned().or_else(|| std::env::var(var).ok()) {
            Some(text) => text
                .parse()
                .map_err(|_| format!("{var} (argument {}): cannot read {text:?}", i + 1)),
            None => Ok(default),
        }
    }
    let systems = std::env::var("BENCH_SYSTEMS").unwrap_or_else(|_| "ckptfs,backup,engine".into());
    let mut args = Args {
        db_mib: get(&argv, 0, "BENCH_DB_MIB", 256)?,
        change_percent: get(&argv, 1, "BENCH_CHANGE_PERCENT", 1.0)?,
        checkpoints: get(&argv, 2, "BENCH_CHECKPOINTS", 50)?,
        retain: get(&argv, 3, "BENCH_RETAIN", 3)?,
        ckptfs: false,
        backup: false,
        engine: false,
        mount: match std::env::var("BENCH_MOUNT") {
            Ok(v) => !matches!(v.trim(), "" | "0"),
            Err(_) => false,
        },
        seed: get(&[], 0, "BENCH_SEED", 0x1e5e_ed00_c0ff_ee01)?,
    };
    for s in systems.split(',').map(str::trim) {
        match s {
            "ckptfs" => args.ckptfs = true,
            "backup" => args.backup = true,
            "engine" => args.engine = true,
            "none" => {}
            other => return Err(format!("BENCH_SYSTEMS: unknown system {other:?}")),
        }
    }
    if args.db_mib == 0 || args.retain == 0 || args.change_percent <= 0.0 {
        return Err("DB_MIB, CHANGE_PERCENT and RETAIN must be above 0".into());
    }
    Ok(args)
}

/// A seeded SplitMix64 generator (no random-number crate is a dependency of this package).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// `count` distinct indices below `n`.
    fn distinct(&mut self, n: u64, count: u64) -> Vec<u64> {
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(count as usize);
        while (out.len() as u64) < count.min(n) {
            let i = self.next() % n;
            if seen.insert(i) {
                out.push(i);
            }
        }
        out
    }
}

/// `rchar` from an io file of /proc.
fn rchar(path: &Path) -> Option<u64> {
    parse_rchar(&std::fs::read_to_string(path).ok()?)
}

fn parse_rchar(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `rchar` of this process's threads, except RocksDB's background pool (threads named
/// `rocksdb:low`, `rocksdb:high`, ...: compactions and flushes). BackupEngine's own threads
/// (`copy_engine`) live as long as the engine, so they are counted.
fn rchar_foreground() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .map(|c| !c.starts_with("rocksdb:"))
                .unwrap_or(false)
        })
        .filter_map(|t| rchar(&t.path().join("io")))
        .sum()
}

/// Disk usage of a tree as du counts it: allocated blocks, each inode once.
fn du(dir: &Path) -> u64 {
    fn walk(dir: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        let mut sum = 0;
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if seen.insert((m.dev(), m.ino())) {
                sum += m.blocks() * 512;
            }
            if m.is_dir() {
                sum += walk(&e.path(), seen);
            }
        }
        sum
    }
    walk(dir, &mut HashSet::new())
}

/// Every regular file under `dir` with its size.
fn files(dir: &Path, out: &mut HashMap<PathBuf, u64>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => files(&e.path(), out),
            Ok(t) if t.is_file() => {
                out.insert(e.path(), e.metadata().map(|m| m.len()).unwrap_or(0));
            }
            _ => {}
        }
    }
}

/// Bytes of the files that appeared (or changed size) under a store since the last call.
struct Added {
    dir: PathBuf,
    seen: HashMap<PathBuf, u64>,
}

impl Added {
    fn new(dir: &Path) -> Added {
        Added {
            dir: dir.to_path_buf(),
            seen: HashMap::new(),
        }
    }

    fn next(&mut self) -> u64 {
        let mut now = HashMap::new();
        files(&self.dir, &mut now);
        let added = now
            .iter()
            .filter(|(p, s)| self.seen.get(*p) != Some(*s))
            .map(|(_, s)| *s)
            .sum();
        self.seen = now;
        added
    }
}

/// The SSTs of a checkpoint directory: name -> size.
fn ssts(dir: &Path) -> Result<HashMap<String, u64>> {
    let mut out = HashMap::new();
    for e in std::fs::read_dir(dir).ctx(format!("list {}", dir.display()))? {
        let e = e.ctx(format!("list {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".sst") {
            out.insert(name, e.metadata().map(|m| m.len()).unwrap_or(0));
        }
    }
    Ok(out)
}

/// Checks that `bin` has the `import` command; returns extra arguments for it (`--retain N`
/// when RETAIN is not ckptfs's default of 3 and the command takes that option).
fn check_import(bin: &Path, retain: usize) -> Result<Vec<String>> {
    let help = Command::new(bin)
        .args(["import", "--help"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!(
                "cannot run the ckptfs binary {}: {e}\n(build it with `cargo build --bin \
                 ckptfs`, or set CKPTFS_BIN)",
                bin.display()
            )
        })?;
    if !help.status.success() {
        return Err(format!(
            "{} has no `import` command (`import --help` failed: {}).\nBuild a ckptfs that has \
             it (`cargo build --bin ckptfs`) or point CKPTFS_BIN at one; BENCH_SYSTEMS=backup \
             runs the BackupEngine half alone.",
            bin.display(),
            String::from_utf8_lossy(&help.stderr)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
        ));
    }
    if retain == 3 {
        return Ok(Vec::new());
    }
    if String::from_utf8_lossy(&help.stdout).contains("--retain") {
        Ok(vec!["--retain".into(), retain.to_string()])
    } else {
        Err(format!(
            "RETAIN {retain}: `ckptfs import` lists no --retain option (it retains 3)"
        ))
    }
}

/// The floor under every import's time: `ckptfs --version` as a child process, from spawn
/// to exit (p50 of 5 runs).
fn process_start_seconds(bin: &Path) -> f64 {
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let _ = Command::new(bin)
                .arg("--version")
                .stdout(Stdio::null())
                .status();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    percentile(&times, 50.0)
}

/// Wait for `child` to exit without reaping it, read its `rchar` (a zombie's /proc/PID/io
/// still holds its totals), then reap it: its stdout, stderr and status. Returns the
/// instant it was seen exited, so that the time taken is the child's alone.
fn wait_reading_rchar(
    child: std::process::Child,
) -> Result<(std::process::Output, Option<u64>, Instant)> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    let pid = child.id();
    // The pipes hold its few lines of output until it is reaped.
    waitid(
        Id::Pid(nix::unistd::Pid::from_raw(pid as i32)),
        WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
    )
    .map_err(|e| format!("waitid({pid}): {e}"))?;
    let exited = Instant::now();
    let rchar = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|io| parse_rchar(&io));
    let out = child
        .wait_with_output()
        .ctx(format!("reap ckptfs (pid {pid})"))?;
    Ok((out, rchar, exited))
}

/// One `ckptfs import`: its JSON report, the bytes the child read (its `rchar`) and, through
/// a mount, the bytes the daemon read meanwhile (the change of its `rchar`).
struct Import {
    report: Value,
    rchar: Option<u64>,
    daemon_rchar: Option<u64>,
    seconds: f64,
}

/// `ckptfs import TARGET bench/0=DIR --json`: TARGET is the store, or the mountpoint of
/// `daemon` (whose rchar is then read before and after).
fn import(
    bin: &Path,
    target: &Path,
    dir: &Path,
    extra: &[String],
    daemon: Option<&Mount>,
) -> Result<Import> {
    let mut source = OsString::from(format!("{BACKEND}="));
    source.push(dir);
    let daemon_before = daemon.and_then(|m| m.proc_field("io", "rchar:"));
    let t = Instant::now();
    let child = Command::new(bin)
        .arg("import")
        .arg(target)
        .arg(source)
        .arg("--json")
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ctx(format!("run {} import", bin.display()))?;
    let (out, rchar, exited) = wait_reading_rchar(child)?;
    let seconds = exited.duration_since(t).as_secs_f64();
    let daemon_rchar = daemon
        .and_then(|m| m.proc_field("io", "rchar:"))
        .zip(daemon_before)
        .map(|(after, before)| after.saturating_sub(before));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "`ckptfs import {} {BACKEND}={} --json` failed ({}):\n{}{}",
            target.display(),
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            stdout
        ));
    }
    let report = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .next_back()
        .ok_or_else(|| format!("`ckptfs import --json` printed no JSON object:\n{stdout}"))?;
    Ok(Import {
        report,
        rchar,
        daemon_rchar,
        seconds,
    })
}

/// The newest checkpoint of a ckptfs store, from `ckptfs ls STORE --json`.
fn newest_checkpoint(bin: &Path, store: &Path) -> Result<u64> {
    let out = Command::new(bin)
        .arg("ls")
        .arg(store)
        .arg("--json")
        .output()
        .ctx("run ckptfs ls")?;
    let list: Value = serde_json::from_slice(&out.stdout).ctx("read `ckptfs ls --json`")?;
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_u64())
        .max()
        .ok_or_else(|| "`ckptfs ls --json` lists no checkpoint".into())
}

/// A figure of `ckptfs import --json`'s report: the top-level field, else the sum of the field
/// over the per-backend entries (`imports`), else none.
fn own_figure(report: &Value, field: &str) -> Option<u64> {
    report.get(field).and_then(Value::as_u64).or_else(|| {
        let per_backend: Vec<u64> = report
            .get("imports")?
            .as_array()?
            .iter()
            .filter_map(|b| b.get(field).and_then(Value::as_u64))
            .collect();
        (!per_backend.is_empty()).then(|| per_backend.iter().sum())
    })
}

/// A figure of `ckptfs import --json`'s report that may be fractional (sync_ms, async_ms).
fn own_f64(report: &Value, field: &str) -> Option<f64> {
    report.get(field).and_then(Value::as_f64)
}

/// Opens a restored database read-only: its number of keys, and whether the keys of the last
/// round hold that round's values.
fn verify(dir: &Path, last_keys: &[u64], last_round: u64) -> Result<(u64, bool)> {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(false);
    let db = rocksdb::DB::open_for_read_only(&opts, dir, false)
        .ctx(format!("open {} read-only", dir.display()))?;
    let count = count_keys(&db)?;
    let mut current = true;
    for &i in last_keys.iter().take(100) {
        let got = db.get(key(i)).ctx("read a restored key")?;
        current &= got.as_deref() == Some(&value(0, i, last_round)[..]);
    }
    Ok((count, current))
}

fn count_keys(db: &rocksdb::DB) -> Result<u64> {
    let mut it = db.raw_iterator();
    it.seek_to_first();
    let mut n = 0;
    while it.valid() {
        n += 1;
        it.next();
    }
    it.status().ctx("scan the keys")?;
    Ok(n)
}

/// What one round measured.
#[derive(Default)]
struct Round {
    create_s: f64,
    new_sst_bytes: u64,
    checkpoint_files: usize,
    checkpoint_bytes: u64,
    ckptfs_s: f64,
    /// Bytes ckptfs read: the child's rchar; through a mount, the daemon's.
    ckptfs_rchar: Option<u64>,
    /// Through a mount: the child's (the client's) rchar.
    ckptfs_client_rchar: Option<u64>,
    ckptfs_report: Value,
    ckptfs_added: u64,
    ckptfs_du: u64,
    backup_s: f64,
    backup_rchar: u64,
    backup_rchar_process: u64,
    backup_added: u64,
    backup_du: u64,
    engine_s: f64,
    /// The engine's own `bytes_read` of the import.
    engine_read: u64,
    engine_added: u64,
    engine_du: u64,
}

impl Round {
    fn json(&self, round: u64) -> Value {
        json!({
            "round": round,
            "create_checkpoint_s": self.create_s,
            "new_sst_bytes": self.new_sst_bytes,
            "checkpoint_files": self.checkpoint_files,
            "checkpoint_bytes": self.checkpoint_bytes,
            "ckptfs_s": self.ckptfs_s,
            "ckptfs_rchar": self.ckptfs_rchar,
            "ckptfs_client_rchar": self.ckptfs_client_rchar,
            "ckptfs_report": self.ckptfs_report,
            "ckptfs_added_bytes": self.ckptfs_added,
            "ckptfs_store_du": self.ckptfs_du,
            "backup_s": self.backup_s,
            "backup_rchar": self.backup_rchar,
            "backup_rchar_process": self.backup_rchar_process,
            "backup_added_bytes": self.backup_added,
            "backup_store_du": self.backup_du,
            "engine_s": self.engine_s,
            "engine_bytes_read": self.engine_read,
            "engine_added_bytes": self.engine_added,
            "engine_store_du": self.engine_du,
        })
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

fn p50_p99(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    (percentile(&v, 50.0), percentile(&v, 99.0))
}

fn run(args: &Args) -> Result<()> {
    let bin = common::ckptfs_bin("debug");
    let mount_mode = args.ckptfs && args.mount;
    // Through a mount, RETAIN is the mount's --retain (the store's setting); the one store
    // import before the mount (round 0) needs none: retention drops nothing that early.
    let (import_args, mount_args) = if !args.ckptfs {
        (Vec::new(), Vec::new())
    } else if mount_mode {
        check_import(&bin, 3)?;
        let retain = if args.retain == 3 {
            Vec::new()
        } else {
            vec!["--retain".to_string(), args.retain.to_string()]
        };
        (Vec::new(), retain)
    } else {
        (check_import(&bin, args.retain)?, Vec::new())
    };
    let mode = if mount_mode {
        "mount (BENCH_MOUNT=1): round 0 is `ckptfs import STORE`, then `ckptfs mount STORE \
         MNT` and every later round `ckptfs import MNT` (the daemon imports; bytes read are the \
         daemon's rchar); `ckptfs umount MNT` before the restore"
    } else {
        "store: every round `ckptfs import STORE` (a process that opens the store as its \
         writer; bytes read are its rchar)"
    };
    if args.ckptfs {
        eprintln!("bench_import: ckptfs mode: {mode}");
    }
    let start_s = if args.ckptfs {
        process_start_seconds(&bin)
    } else {
        f64::NAN
    };
    let temp;
    let work = match std::env::var_os("BENCH_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).ctx(format!("create {}", dir.display()))?;
            dir
        }
        None => {
            temp = tempfile::Builder::new()
                .prefix("ckptfs-bench-import-")
                .tempdir()
                .ctx("create a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    let (db_dir, ckpt_dir) = (work.join("db"), work.join("checkpoints"));
    let (store, backup_dir) = (work.join("store"), work.join("backup"));
    let engine_store = work.join("engine-store");
    let mnt = work.join("mnt");
    for dir in [&db_dir, &ckpt_dir, &store, &backup_dir, &engine_store, &mnt] {
        if dir.exists() {
            return Err(format!(
                "{} exists already: BENCH_DIR must be new",
                dir.display()
            ));
        }
    }
    std::fs::create_dir_all(&ckpt_dir).ctx("create the checkpoint directory")?;
    std::fs::create_dir_all(&backup_dir).ctx("create the backup directory")?;

    let record = (KEY_SIZE + VALUE_SIZE) as u64;
    let keys = (args.db_mib << 20) / record;
    let per_round = ((keys as f64 * args.change_percent / 100.0).round() as u64).clamp(1, keys);
    eprintln!(
        "bench_import: loading {keys} keys ({} MiB) into {}",
        args.db_mib,
        db_dir.display()
    );
    // RocksDB's default options, as an application would open its database.
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    let db = rocksdb::DB::open(&opts, &db_dir).ctx("open the source database")?;
    let all: Vec<u64> = (0..keys).collect();
    for chunk in all.chunks(BATCH) {
        let mut batch = rocksdb::WriteBatch::default();
        for &i in chunk {
            batch.put(key(i), value(0, i, 0));
        }
        db.write(batch).ctx("load")?;
    }
    let env = rocksdb::Env::new().ctx("RocksDB Env")?;
    let mut engine = if args.backup {
        let opts = BackupEngineOptions::new(&backup_dir).ctx("BackupEngine options")?;
        Some(BackupEngine::open(&opts, &env).ctx("open the BackupEngine")?)
    } else {
        None
    };
    // ckptfs's engine, opened once as `ckptfs import STORE` opens it each time (no
    // backend hosted), with the same retention.
    let held = if args.engine {
        let mut config = EngineConfig::new(Location::Local(engine_store.clone()));
        config.host_backends = false;
        config.retain = Some(args.retain as u32);
        Some(Engine::open(config).ctx("open ckptfs's engine")?)
    } else {
        None
    };
    let backend = BackendName::new("bench", 0).ctx("backend name")?;
    let mut ckptfs_added = Added::new(&store);
    let mut backup_added = Added::new(&backup_dir);
    let mut engine_added = Added::new(&engine_store);
    let mut engine_last = None;
    let mut rng = Rng(args.seed);
    let mut rounds: Vec<Round> = Vec::new();
    let mut previous: Option<(PathBuf, HashMap<String, u64>)> = None;
    let mut last_keys = Vec::new();
    let mut last_id = None;
    let mut mount: Option<Mount> = None;
    let mut mount_s = None;
    let started = Instant::now();
    for round in 0..=args.checkpoints {
        let mut r = Round::default();
        if round > 0 {
            last_keys = rng.distinct(keys, per_round);
            for chunk in last_keys.chunks(BATCH) {
                let mut batch = rocksdb::WriteBatch::default();
                for &i in chunk {
                    batch.put(key(i), value(0, i, round));
                }
                db.write(batch).ctx("overwrite")?;
            }
        }
        // The application's checkpoint (Checkpoint::create_checkpoint flushes the memtable
        // first: log_size_for_flush 0), timed apart: both systems start from it.
        let dir = ckpt_dir.join(round.to_string());
        let t = Instant::now();
        Checkpoint::new(&db)
            .and_then(|c| c.create_checkpoint(&dir))
            .ctx(format!("create checkpoint {}", dir.display()))?;
        r.create_s = t.elapsed().as_secs_f64();
        let now = ssts(&dir)?;
        r.new_sst_bytes = now
            .iter()
            .filter(|(name, _)| {
                previous
                    .as_ref()
                    .is_none_or(|(_, p)| !p.contains_key(*name))
            })
            .map(|(_, size)| *size)
            .sum();
        let mut listing = HashMap::new();
        files(&dir, &mut listing);
        r.checkpoint_files = listing.len();
        r.checkpoint_bytes = listing.values().sum();

        if args.ckptfs {
            let done = match &mount {
                Some(m) => import(&bin, &mnt, &dir, &import_args, Some(m))?,
                None => import(&bin, &store, &dir, &import_args, None)?,
            };
            r.ckptfs_s = done.seconds;
            if done.daemon_rchar.is_some() {
                r.ckptfs_rchar = done.daemon_rchar;
                r.ckptfs_client_rchar = done.rchar;
            } else {
                r.ckptfs_rchar = done.rchar;
            }
            last_id = done.report["id"].as_u64();
            r.ckptfs_report = done.report;
            if mount_mode && mount.is_none() {
                // The store now holds bench/0 (external) and hosts nothing: the daemon
                // starts no backend. What the mount adds to the store counts in round 0.
                let (m, seconds) = Mount::new(&bin, &store, &mnt, &mount_args)?;
                eprintln!(
                    "bench_import: mounted {} at {} in {seconds:.3} s (daemon pid {})",
                    store.display(),
                    mnt.display(),
                    m.pid
                );
                mount = Some(m);
                mount_s = Some(seconds);
            }
            r.ckptfs_added = ckptfs_added.next();
            r.ckptfs_du = du(&store);
        }
        if let Some(held) = &held {
            let t = Instant::now();
            let (manifest, reports) = ckptfs_core::import::scan(&backend, &dir)
                .and_then(|scanned| held.begin(CheckpointPlan::Import(vec![scanned])))
                .and_then(|pending| pending.complete_with_imports())
                .ctx(format!("engine import of {}", dir.display()))?;
            r.engine_s = t.elapsed().as_secs_f64();
            r.engine_read = reports.iter().map(|i| i.bytes_read).sum();
            engine_last = Some(manifest.id);
            r.engine_added = engine_added.next();
            r.engine_du = du(&engine_store);
        }
        // The application keeps only its newest checkpoint directory.
        if let Some((old, _)) = previous.take() {
            std::fs::remove_dir_all(&old).ctx(format!("remove {}", old.display()))?;
        }
        previous = Some((dir, now));

        if let Some(engine) = engine.as_mut() {
            // create_new_backup, i.e. create_new_backup_flush(db, false): the checkpoint above
            // has just flushed the memtable, so the live database holds the same SSTs as DIR_i
            // plus an empty WAL (which BackupEngine copies); a second flush would find nothing
            // to flush.
            let (process, foreground) = (rchar(Path::new("/proc/self/io")), rchar_foreground());
            let t = Instant::now();
            engine.create_new_backup(&db).ctx("create_new_backup")?;
            engine
                .purge_old_backups(args.retain)
                .ctx("purge_old_backups")?;
            r.backup_s = t.elapsed().as_secs_f64();
            r.backup_rchar = rchar_foreground().saturating_sub(foreground);
            r.backup_rchar_process = rchar(Path::new("/proc/self/io"))
                .zip(process)
                .map(|(after, before)| after.saturating_sub(before))
                .unwrap_or(0);
            r.backup_added = backup_added.next();
            r.backup_du = du(&backup_dir);
        }
        let every = (args.checkpoints / 10).max(1);
        if round % every == 0 || round == args.checkpoints {
            let mut line = format!(
                "bench_import: round {round}/{}: new SSTs {:.2} MiB",
                args.checkpoints,
                r.new_sst_bytes as f64 / MIB
            );
            if args.ckptfs {
                line += &format!(
                    "; ckptfs import {:.3} s, read {:.2} MiB",
                    r.ckptfs_s,
                    r.ckptfs_rchar.unwrap_or(0) as f64 / MIB
                );
            }
            if args.backup {
                line += &format!(
                    "; BackupEngine {:.3} s, read {:.2} MiB",
                    r.backup_s,
                    r.backup_rchar as f64 / MIB
                );
            }
            eprintln!("{line}");
        }
        rounds.push(r);
    }
    let loop_seconds = started.elapsed().as_secs_f64();
    if !(args.ckptfs || args.backup || args.engine) {
        // BENCH_SYSTEMS=none: only the database and its checkpoints (kept in BENCH_DIR).
        eprintln!(
            "bench_import: no system to measure; checkpoints in {}",
            ckpt_dir.display()
        );
        return Ok(());
    }
    let umount_s = match mount.as_mut() {
        Some(m) => Some(m.unmount()?),
        None => None,
    };
    // The mount's figures (store mode: null).
    let mount_json = json!({"mount_seconds": mount_s, "umount_seconds": umount_s});

    // The source at its last checkpoint (nothing was written since).
    let source_keys = count_keys(&db)?;
    let db_du = du(&db_dir);

    // Restores of the newest checkpoint, each into a fresh directory.
    let mut ckptfs_restore = None;
    if args.ckptfs {
        let id = match last_id {
            Some(id) => id,
            None => newest_checkpoint(&bin, &store)?,
        };
        let dest = work.join("restore-ckptfs");
        let t = Instant::now();
        let out = Command::new(&bin)
            .arg("restore")
            .arg(&store)
            .arg(id.to_string())
            .arg(&dest)
            .stdin(Stdio::null())
            .output()
            .ctx("run ckptfs restore")?;
        let seconds = t.elapsed().as_secs_f64();
        if !out.status.success() {
            return Err(format!(
                "`ckptfs restore {} {id} {}` failed ({}):\n{}",
                store.display(),
                dest.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let (count, current) = verify(&dest.join(BACKEND), &last_keys, args.checkpoints)?;
        ckptfs_restore = Some((seconds, count, current));
    }
    let mut engine_restore = None;
    if let (Some(held), Some(id)) = (held, engine_last) {
        drop(held);
        let dest = work.join("restore-engine");
        let t = Instant::now();
        ckptfs_core::commands::restore::restore_checkpoint(
            Location::Local(engine_store.clone()),
            id,
            &dest,
            |_| {},
        )
        .ctx("restore the engine's newest checkpoint")?;
        let seconds = t.elapsed().as_secs_f64();
        let (count, current) = verify(&dest.join(BACKEND), &last_keys, args.checkpoints)?;
        engine_restore = Some((seconds, count, current));
    }
    let mut backup_restore = None;
    if let Some(engine) = engine.as_mut() {
        let dest = work.join("restore-backup");
        std::fs::create_dir_all(&dest).ctx("create the restore directory")?;
        let t = Instant::now();
        engine
            .restore_from_latest_backup(&dest, &dest, &RestoreOptions::default())
            .ctx("restore_from_latest_backup")?;
        let seconds = t.elapsed().as_secs_f64();
        let (count, current) = verify(&dest, &last_keys, args.checkpoints)?;
        backup_restore = Some((seconds, count, current));
    }

    // Figures over the incremental rounds (round 0 is the full first checkpoint).
    let inc = &rounds[1..];
    let first = &rounds[0];
    let last = rounds.last().unwrap_or(first);
    let new_sst = mean(inc.iter().map(|r| r.new_sst_bytes as f64));
    let create = p50_p99(inc.iter().map(|r| r.create_s));
    let report = |r: &Round, field: &str| own_figure(&r.ckptfs_report, field);
    let own_mean = |field: &str| {
        let v: Vec<f64> = inc
            .iter()
            .filter_map(|r| report(r, field))
            .map(|v| v as f64)
            .collect();
        (!v.is_empty()).then(|| mean(v.into_iter()))
    };
    let mut systems = Vec::new();
    let mut targets = json!({});
    println!(
        "\nRocksDB {} MiB ({keys} keys of {record} B, default options, {:.0} MiB on disk), \
         {}% ({per_round} keys) overwritten per round, {} checkpoints after a full first \
         one, retain {}\n",
        args.db_mib,
        db_du as f64 / MIB,
        args.change_percent,
        args.checkpoints,
        args.retain
    );
    if args.ckptfs {
        println!("ckptfs mode: {mode}\n");
    }
    println!(
        "| system | s/ckpt p50 | s/ckpt p99 | read MiB/ckpt (mean) | read / new SST | added \
         MiB/ckpt (mean) | store MiB (du) | first ckpt s / read MiB | restore s | restored \
         keys / source | last round's values |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| application: Checkpoint::create_checkpoint | {:.3} | {:.3} | - | - | - | - | {:.3} \
         / - | - | - | - |",
        create.0, create.1, first.create_s
    );
    let mut row = |name: &str,
                   secs: &dyn Fn(&Round) -> f64,
                   read: &dyn Fn(&Round) -> Option<u64>,
                   added: &dyn Fn(&Round) -> u64,
                   store_du: &dyn Fn(&Round) -> u64,
                   restore: (f64, u64, bool)| {
        let (p50, p99) = p50_p99(inc.iter().map(secs));
        let reads: Vec<u64> = inc.iter().filter_map(read).collect();
        let read_mean = if reads.len() == inc.len() {
            mean(reads.iter().map(|&b| b as f64))
        } else {
            f64::NAN
        };
        let added_mean = mean(inc.iter().map(|r| added(r) as f64));
        // Net growth of the store from the first checkpoint to the last (retention included).
        let du_end = store_du(last);
        let growth = (du_end as f64 - store_du(first) as f64) / inc.len().max(1) as f64;
        println!(
            "| {name} | {p50:.3} | {p99:.3} | {:.2} | {:.2} | {:.2} | {:.1} | {:.3} / {:.1} | \
             {:.3} | {} / {source_keys} | {} |",
            read_mean / MIB,
            read_mean / new_sst,
            added_mean / MIB,
            du_end as f64 / MIB,
            secs(first),
            read(first).unwrap_or(0) as f64 / MIB,
            restore.0,
            restore.1,
            if restore.2 { "yes" } else { "NO" },
        );
        let s = json!({
            "system": name,
            "seconds_per_checkpoint": {"p50": p50, "p99": p99},
            "read_bytes_per_checkpoint_mean": read_mean,
            "read_over_new_sst": read_mean / new_sst,
            "added_bytes_per_checkpoint_mean": added_mean,
            "net_growth_bytes_per_checkpoint": growth,
            "store_du_bytes": du_end,
            "first_checkpoint": {"seconds": secs(first), "read_bytes": read(first),
                "added_bytes": added(first)},
            "restore_seconds": restore.0,
            "restored_keys": restore.1,
            "restored_last_round_values": restore.2,
        });
        systems.push(s.clone());
        s
    };
    let ck = ckptfs_restore.map(|restore| {
        row(
            if mount_mode {
                "ckptfs import (through a mount)"
            } else {
                "ckptfs import (store)"
            },
            &|r| r.ckptfs_s,
            &|r| r.ckptfs_rchar,
            &|r| r.ckptfs_added,
            &|r| r.ckptfs_du,
            restore,
        )
    });
    let be = backup_restore.map(|restore| {
        row(
            "BackupEngine",
            &|r| r.backup_s,
            &|r| Some(r.backup_rchar),
            &|r| r.backup_added,
            &|r| r.backup_du,
            restore,
        )
    });
    let held_row = engine_restore.map(|restore| {
        row(
            "ckptfs engine in process (held open)",
            &|r| r.engine_s,
            &|r| Some(r.engine_read),
            &|r| r.engine_added,
            &|r| r.engine_du,
            restore,
        )
    });
    println!(
        "\nnew SST bytes per checkpoint (mean): {:.2} MiB",
        new_sst / MIB
    );
    if args.ckptfs {
        let own = |field: &str| match own_mean(field) {
            Some(v) if field.contains("bytes") => format!("{field} {:.2} MiB", v / MIB),
            Some(v) => format!("{field} {v:.1}"),
            None => format!("{field} -"),
        };
        println!(
            "ckptfs's own figures per checkpoint (mean): {}, {}, {}, {}",
            own("bytes_read"),
            own("bytes_stored"),
            own("files_read"),
            own("files_reused")
        );
        // Where an import's time goes: ckptfs's own sync and async phases, and the rest of
        // the wall time (process start, opening the store or talking to the daemon, ...).
        let phase = |f: &dyn Fn(&Round) -> Option<f64>| {
            let v: Vec<f64> = inc.iter().filter_map(f).collect();
            (v.len() == inc.len()).then(|| p50_p99(v.into_iter()))
        };
        let sync = phase(&|r| own_f64(&r.ckptfs_report, "sync_ms").map(|ms| ms / 1000.0));
        let asyn = phase(&|r| own_f64(&r.ckptfs_report, "async_ms").map(|ms| ms / 1000.0));
        let rest = phase(&|r| {
            let sync = own_f64(&r.ckptfs_report, "sync_ms")?;
            let asyn = own_f64(&r.ckptfs_report, "async_ms")?;
            Some(r.ckptfs_s - (sync + asyn) / 1000.0)
        });
        let show = |p: Option<(f64, f64)>| match p {
            Some((p50, p99)) => format!("{p50:.3} / {p99:.3}"),
            None => "-".into(),
        };
        println!(
            "ckptfs import time per checkpoint, p50 / p99 s: wall {}; sync phase {}; async \
             phase {}; rest of the wall time {}",
            show(Some(p50_p99(inc.iter().map(|r| r.ckptfs_s)))),
            show(sync),
            show(asyn),
            show(rest)
        );
        if mount_mode {
            println!(
                "mount: ckptfs mount {:.3} s, ckptfs umount {:.3} s; the client's own reads \
                 (the child's rchar, not in the table): {:.3} MiB/ckpt (mean)",
                mount_s.unwrap_or(f64::NAN),
                umount_s.unwrap_or(f64::NAN),
                mean(
                    inc.iter()
                        .map(|r| r.ckptfs_client_rchar.unwrap_or(0) as f64)
                ) / MIB
            );
        }
    }
    if args.ckptfs {
        println!(
            "ckptfs process start (`ckptfs --version` spawned to exit, p50), included in every import's \
             time: {start_s:.3} s ({})",
            bin.display()
        );
    }
    if args.backup {
        println!(
            "BackupEngine bytes read, whole process (with compactions running meanwhile): \
             {:.2} MiB/ckpt (mean)",
            mean(inc.iter().map(|r| r.backup_rchar_process as f64)) / MIB
        );
    }
    // A system's row's p50 seconds per checkpoint.
    let p50 = |row: &Value| {
        row["seconds_per_checkpoint"]["p50"]
            .as_f64()
            .unwrap_or(f64::NAN)
    };
    if let (Some(ck), Some(be)) = (&ck, &be) {
        let (a, b) = (p50(ck), p50(be));
        println!(
            "target ckptfs import p50 <= BackupEngine p50: {} ({a:.3} s vs {b:.3} s)",
            if a <= b { "met" } else { "NOT met" }
        );
        targets["import_p50_le_backup_p50"] = json!(a <= b);
    }
    if let (Some(held), Some(be)) = (&held_row, &be) {
        let (a, b) = (p50(held), p50(be));
        // Not a target: what the import costs as a library call, as BackupEngine's is.
        println!(
            "ckptfs engine in process p50 against BackupEngine p50: {:.2} x ({a:.3} s vs \
             {b:.3} s)",
            a / b
        );
    }
    if let Some(ck) = &ck {
        let ratio = ck["read_over_new_sst"].as_f64().unwrap_or(f64::NAN);
        println!(
            "target ckptfs bytes read <= {TARGET_READ_RATIO} x new SST bytes: {} ({ratio:.2} x)",
            if ratio <= TARGET_READ_RATIO {
                "met"
            } else {
                "NOT met"
            }
        );
        targets["read_le_1_5x_new_sst"] = json!(ratio <= TARGET_READ_RATIO);
    }
    println!(
        "{}",
        json!({
            "db_mib": args.db_mib,
            "change_percent": args.change_percent,
            "checkpoints": args.checkpoints,
            "retain": args.retain,
            "keys": keys,
            "keys_per_round": per_round,
            "db_du_bytes": db_du,
            "source_keys": source_keys,
            "new_sst_bytes_per_checkpoint_mean": new_sst,
            "create_checkpoint_seconds": {"p50": create.0, "p99": create.1},
            "ckptfs_own_per_checkpoint_mean": {
                "bytes_read": own_mean("bytes_read"),
                "bytes_stored": own_mean("bytes_stored"),
                "files_read": own_mean("files_read"),
                "files_reused": own_mean("files_reused"),
            },
            "ckptfs_process_start_seconds": if args.ckptfs { json!(start_s) } else { Value::Null },
            "ckptfs_mode": if !args.ckptfs { "none" } else if mount_mode { "mount" } else { "store" },
            "ckptfs_mount": mount_json,
            "backup_read_bytes_process_mean":
                mean(inc.iter().map(|r| r.backup_rchar_process as f64)),
            "systems": systems,
            "targets": targets,
            "loop_seconds": loop_seconds,
            "rounds": rounds.iter().enumerate().map(|(i, r)| r.json(i as u64)).collect::<Vec<_>>(),
        })
    );
    Ok(())
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|args| run(&args));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_import: {e}");
            ExitCode::FAILURE
        }
    }
}
