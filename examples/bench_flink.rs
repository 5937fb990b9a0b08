//! Benchmark of `ckptfs mount --flink` following a real Apache Flink job (issue 20): what
//! ckptfs's store holds against what Flink would hold for the same checkpoints, how long each
//! import takes and how far behind the job the follower stays, and `cp -r` of a subtask out of
//! the mount against copying the same files out of Flink's checkpoint directory.
//!
//! 1. `javac` of tests/flink/StateJob.java against Flink's jars (CKPTFS_FLINK_LIB, else the
//!    lib/ of pip's apache-flink-libraries, as the tests find it).
//! 2. `ckptfs mount STORE MNT --flink CKDIR --retain R` (R = max(60, CHECKPOINTS + 10)).
//! 3. `java -Xmx2g StateJob CKDIR --keys K --payload-bytes B --rate RATE --interval-ms I
//!    --retained 3` on a local mini cluster: operator "counter" keeps a B-byte incompressible
//!    payload per key, rewritten by every record (records go round-robin over the keys), so the
//!    keyed state is about K x B bytes and RATE x B bytes of it change per second. Flink keeps
//!    3 checkpoints; ckptfs keeps the history. A thread polls CKDIR every 50 ms and records
//!    each `chk-N/_metadata`'s mtime (Flink deletes all but the newest 3).
//! 4. Once CHECKPOINTS checkpoints are imported (rows of MNT/.ckptfs/checkpoints): SIGKILL the
//!    job (Flink then keeps its newest 3 checkpoints), wait until the follower has imported
//!    the newest one that completed.
//!
//! Figures, over every checkpoint imported (the first ones, taken before every key had a
//! payload, included; figures over those taken with the whole state are in the JSON line):
//! - keyed state: bytes of the subtask files (every `cp-N/<operator>/<subtask>/`) of the
//!   newest checkpoint;
//! - store: `du -sb STORE` and `du -sb STORE/objects`, against the bytes Flink would hold to
//!   keep the same checkpoints: every distinct file (by path) that their `_metadata` files
//!   (read from `MNT/cp-N/_flink/0/_metadata`) reference, plus the `_metadata` files
//!   themselves (which hold the inline handles: their bytes are shown apart, not added);
//! - import time per checkpoint (`completed_unix_ms - started_unix_ms` of the checkpoint,
//!   `started_unix_ms` from the store's `checkpoints/N.json` when the row has none) p50/p99,
//!   and the lag: `completed_unix_ms` minus the mtime of Flink's `_metadata`, p50/p99/max;
//!   the lag splits into the follower noticing (`started_unix_ms` minus the mtime: inotify
//!   wakes it, or with `CKPTFS_FLINK_POLL_ONLY=1` its poll every second) and the import;
//! - the biggest subtask directory of the newest checkpoint: `cp -r` out of the mount (its
//!   first read through the mount; the page cache is not dropped: the store's objects and
//!   Flink's files were both written moments before) against one `cp -t DIR FILES` of the
//!   files its `_metadata` names in Flink's checkpoint directory (its inline files live in
//!   `_metadata`: nothing to copy), seconds and MiB/s; then `cmp` of every file of the two
//!   copies (inline files against their bytes in `_metadata`); a second, warm `cp -r`.
//!
//! Prints a table and one JSON line.
//!
//! Usage: `cargo build --release --bin ckptfs && cargo run --release --example bench_flink`.
//! Environment: BENCH_KEYS (7168), BENCH_PAYLOAD_BYTES (16384: 112 MiB of payload),
//! BENCH_RATE (records per second, 500), BENCH_INTERVAL_MS (Flink's checkpoint interval,
//! 1000), BENCH_CHECKPOINTS (50), BENCH_DIR=DIR works in DIR (new or empty) and keeps it
//! (default: a temporary directory, removed), CKPTFS_BIN (default
//! `$CARGO_TARGET_DIR/release/ckptfs`, else `target/release/ckptfs` in the package),
//! CKPTFS_FLINK_LIB (Flink's lib/). Smoke run: `BENCH_KEYS=200 BENCH_PAYLOAD_BYTES=100
//! BENCH_CHECKPOINTS=5 cargo run --release --example bench_flink`. Needs FUSE 3, a JDK 17
//! and Flink 2.3's jars (`. scripts/env.sh; ckptfs_install_flink_jars`).

// One json! literal of every figure.
#![recursion_limit = "256"]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ckptfs_core::flink::import::layout;
use ckptfs_core::flink::metadata::{self, KeyedHandle, StreamHandle};
use common::{percentile, tree_bytes, Context, Mount, Result};
use serde_json::{json, Value};

const MIB: f64 = (1 << 20) as f64;

struct Args {
    keys: u64,
    payload_bytes: u64,
    rate: f64,
    interval_ms: u64,
    checkpoints: usize,
    dir: Option<PathBuf>,
}

fn env<T: std::str::FromStr>(var: &str, default: T) -> Result<T> {
    match std::env::var(var) {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .map_err(|_| format!("{var}: cannot read {text:?}")),
        _ => Ok(default),
    }
}

fn parse_args() -> Result<Args> {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        return Err(
            "usage: bench_flink (no arguments; the environment variables at the top \
                    of examples/bench_flink.rs)"
                .into(),
        );
    }
    let args = Args {
        keys: env("BENCH_KEYS", 7168)?,
        payload_bytes: env("BENCH_PAYLOAD_BYTES", 16384)?,
        rate: env("BENCH_RATE", 500.0)?,
        interval_ms: env("BENCH_INTERVAL_MS", 1000)?,
        checkpoints: env("BENCH_CHECKPOINTS", 50)?,
        dir: std::env::var_os("BENCH_DIR").map(PathBuf::from),
    };
    if args.keys == 0 || args.rate <= 0.0 || args.checkpoints == 0 || args.interval_ms < 10 {
        return Err(
            "BENCH_KEYS, BENCH_RATE and BENCH_CHECKPOINTS must be above 0, \
                    BENCH_INTERVAL_MS at least 10"
                .into(),
        );
    }
    Ok(args)
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

fn unix_ms(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// Flink's lib/ (flink-dist and RocksJava): CKPTFS_FLINK_LIB, else pip's
/// apache-flink-libraries.
fn flink_lib() -> Result<PathBuf> {
    if let Some(lib) = std::env::var_os("CKPTFS_FLINK_LIB") {
        return Ok(lib.into());
    }
    let script = "import glob, os, pyflink\n\
dirs = [os.path.join(d, 'lib') for d in pyflink.__path__]\n\
print(next(d for d in dirs if glob.glob(os.path.join(d, 'flink-dist*.jar'))))\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .output()
        .ctx("run python3 to find Flink's jars")?;
    if !out.status.success() {
        return Err(format!(
            "Flink's jars are missing (`. scripts/env.sh; ckptfs_install_flink_jars`, or set \
             CKPTFS_FLINK_LIB): {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().into())
}

/// `javac` of StateJob into `classes`: the class path to run it with.
fn compile_job(classes: &Path) -> Result<String> {
    let lib = flink_lib()?;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/flink/StateJob.java");
    let out = Command::new("javac")
        .args(["-nowarn", "-cp", &format!("{}/*", lib.display()), "-d"])
        .arg(classes)
        .arg(&source)
        // No hsperfdata in /tmp.
        .arg("-J-XX:-UsePerfData")
        .output()
        .ctx("run javac (openjdk-17-jdk-headless)")?;
    if !out.status.success() {
        return Err(format!(
            "javac {}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(format!("{}/*:{}", lib.display(), classes.display()))
}

/// What the job printed, with when (unix ms).
#[derive(Default)]
struct JobLog {
    job: Option<String>,
    /// Flink checkpoint -> (when the source snapshotted it, records before its barrier).
    snapshots: BTreeMap<u64, (f64, u64)>,
    /// Flink checkpoint -> when it was reported complete.
    completes: BTreeMap<u64, f64>,
}

/// The Flink job, SIGKILLed when dropped (Flink keeps the retained checkpoints of a job that
/// did not finish), then its temporary files removed.
struct Job {
    child: Child,
    log: Arc<Mutex<JobLog>>,
    stderr: PathBuf,
    /// The JVM's `java.io.tmpdir` (`work/java-tmp`): its mini cluster's working directory
    /// (`minicluster_*`, some 31 MB, which a killed JVM never removes), RocksDB's native
    /// library, Flink's blobs.
    tmp: PathBuf,
}

impl Job {
    fn start(classpath: &str, ck: &Path, args: &Args, work: &Path) -> Result<Job> {
        let stderr = work.join("job.stderr");
        let tmp = work.join("java-tmp");
        std::fs::create_dir_all(&tmp).ctx("create java-tmp/")?;
        let mut child = Command::new("java")
            .arg(format!("-Djava.io.tmpdir={}", tmp.display()))
            // No hsperfdata in /tmp.
            .arg("-XX:-UsePerfData")
            .args(["-Xmx2g", "-cp", classpath, "StateJob"])
            .arg(ck)
            .args(["--keys", &args.keys.to_string()])
            .args(["--payload-bytes", &args.payload_bytes.to_string()])
            .args(["--rate", &args.rate.to_string()])
            .args(["--interval-ms", &args.interval_ms.to_string()])
            .args(["--retained", "3"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).ctx("create job.stderr")?)
            .spawn()
            .ctx("run java (openjdk-17-jdk-headless)")?;
        let log = Arc::new(Mutex::new(JobLog::default()));
        let stdout = child.stdout.take().ok_or("no stdout of java")?;
        let mut copy = std::fs::File::create(work.join("job.stdout")).ctx("create job.stdout")?;
        let shared = log.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let t = now_ms();
                let _ = writeln!(copy, "{t:.0} {line}");
                let w: Vec<&str> = line.split_whitespace().collect();
                let mut log = shared.lock().unwrap();
                match w.as_slice() {
                    ["job", id] => log.job = Some(id.to_string()),
                    ["snapshot", c, "records", m] => {
                        if let (Ok(c), Ok(m)) = (c.parse(), m.parse()) {
                            log.snapshots.insert(c, (t, m));
                        }
                    }
                    ["complete", c] => {
                        if let Ok(c) = c.parse() {
                            log.completes.entry(c).or_insert(t);
                        }
                    }
                    _ => {}
                }
            }
        });
        Ok(Job {
            child,
            log,
            stderr,
            tmp,
        })
    }

    /// An error if the JVM has exited.
    fn check_running(&mut self) -> Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            let tail: Vec<&str> = err.lines().rev().take(20).collect();
            return Err(format!(
                "the Flink job ended early ({status}); the end of {}:\n{}",
                self.stderr.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        Ok(())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One `chk-N/_metadata` as the watcher first saw it.
#[derive(Clone, Copy)]
struct Seen {
    mtime_ms: f64,
    seen_ms: f64,
}

/// Polls CKDIR/<job>/chk-*/_metadata every 50 ms until `stop`.
fn watch(ck: PathBuf, stop: Arc<AtomicBool>, seen: Arc<Mutex<BTreeMap<u64, Seen>>>) {
    while !stop.load(Ordering::Relaxed) {
        for job in std::fs::read_dir(&ck).into_iter().flatten().flatten() {
            for chk in std::fs::read_dir(job.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = chk.file_name().to_string_lossy().into_owned();
                let Some(n) = name
                    .strip_prefix("chk-")
                    .and_then(|n| n.parse::<u64>().ok())
                else {
                    continue;
                };
                if seen.lock().unwrap().contains_key(&n) {
                    continue;
                }
                if let Ok(m) = std::fs::metadata(chk.path().join("_metadata")) {
                    let mtime_ms = m.modified().map(unix_ms).unwrap_or(0.0);
                    seen.lock().unwrap().insert(
                        n,
                        Seen {
                            mtime_ms,
                            seen_ms: now_ms(),
                        },
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The newest `chk-N` with a `_metadata` under CKDIR.
fn newest_completed(ck: &Path) -> Option<u64> {
    std::fs::read_dir(ck)
        .ok()?
        .flatten()
        .flat_map(|job| {
            std::fs::read_dir(job.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|chk| chk.path().join("_metadata").is_file())
        .filter_map(|chk| {
            chk.file_name()
                .to_string_lossy()
                .strip_prefix("chk-")
                .and_then(|n| n.parse().ok())
        })
        .max()
}

/// `du -sb DIR`.
fn du_sb(dir: &Path) -> Result<u64> {
    let out = Command::new("du")
        .arg("-sb")
        .arg(dir)
        .output()
        .ctx("run du")?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            format!(
                "du -sb {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// A path of `_metadata` (`file:/…`, `file:///…`, or a plain path) as a local path.
fn local_path(uri: &str) -> PathBuf {
    let rest = uri
        .strip_prefix("file://")
        .or_else(|| uri.strip_prefix("file:"));
    PathBuf::from(rest.unwrap_or(uri))
}

/// Where a file a handle names is in Flink's checkpoint directory (`None`: inline or empty).
fn handle_path(job_dir: &Path, checkpoint: u64, h: &StreamHandle) -> Option<(PathBuf, u64)> {
    match h {
        StreamHandle::File { path, size, .. } => Some((local_path(path), *size)),
        StreamHandle::Relative { path, size, .. } => {
            Some((job_dir.join(format!("chk-{checkpoint}")).join(path), *size))
        }
        StreamHandle::Segment { path, size, .. } => Some((local_path(path), *size)),
        StreamHandle::Inline(_) | StreamHandle::EmptySegment => None,
    }
}

/// What the `_metadata` files of the imported checkpoints reference.
#[derive(Default)]
struct FlinkBytes {
    /// Distinct files by path: size and kind (shared, private, meta, operator).
    files: HashMap<PathBuf, (u64, &'static str)>,
    metadata_bytes: u64,
    inline_bytes: u64,
    /// Per checkpoint: bytes of the private files (MANIFEST, OPTIONS, CURRENT), inline or
    /// not, and the number of them that are files (not inline).
    private_bytes: Vec<u64>,
    private_files: Vec<u64>,
}

impl FlinkBytes {
    fn add(&mut self, job_dir: &Path, bytes: &[u8]) -> Result<()> {
        let md = metadata::parse(bytes).map_err(|e| e.to_string())?;
        let n = md.checkpoint_id;
        self.metadata_bytes += bytes.len() as u64;
        let (mut private_bytes, mut private_files) = (0, 0);
        let mut note = |h: &StreamHandle, kind: &'static str, this: &mut FlinkBytes| {
            match handle_path(job_dir, n, h) {
                Some((path, size)) => {
                    this.files.entry(path).or_insert((size, kind));
                }
                None => this.inline_bytes += h.size(),
            }
            if kind == "private" {
                private_bytes += h.size();
                private_files += u64::from(handle_path(job_dir, n, h).is_some());
            }
        };
        for op in &md.operators {
            if let Some(h) = &op.coordinator_state {
                note(h, "operator", self);
            }
            for s in &op.subtasks {
                for state in [&s.managed_operator_state, &s.raw_operator_state]
                    .into_iter()
                    .flatten()
                {
                    if let Some(h) = &state.handle {
                        note(h, "operator", self);
                    }
                }
                for keyed in [&s.managed_keyed, &s.raw_keyed].into_iter().flatten() {
                    match keyed {
                        KeyedHandle::Incremental(h) => {
                            note(&h.meta, "meta", self);
                            for (_, f) in &h.shared {
                                note(f, "shared", self);
                            }
                            for (_, f) in &h.private {
                                note(f, "private", self);
                            }
                        }
                        KeyedHandle::KeyGroups { handle, .. } => {
                            if let Some(h) = handle {
                                note(h, "operator", self);
                            }
                        }
                    }
                }
            }
        }
        self.private_bytes.push(private_bytes);
        self.private_files.push(private_files);
        Ok(())
    }

    fn file_bytes(&self, kind: Option<&str>) -> u64 {
        self.files
            .values()
            .filter(|(_, k)| kind.is_none_or(|kind| *k == kind))
            .map(|(s, _)| s)
            .sum()
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// p50, p99 and max of `v`.
fn dist(v: &[f64]) -> (f64, f64, f64) {
    let s = sorted(v.to_vec());
    (
        percentile(&s, 50.0),
        percentile(&s, 99.0),
        s.last().copied().unwrap_or(f64::NAN),
    )
}

fn dist_json(v: &[f64]) -> Value {
    let (p50, p99, max) = dist(v);
    json!({"n": v.len(), "p50": p50, "p99": p99, "max": max})
}

/// Runs `cmd`, timed; an error if it fails.
fn timed(cmd: &mut Command, what: &str) -> Result<f64> {
    let t = Instant::now();
    let out = cmd.output().ctx(format!("run {what}"))?;
    let seconds = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(seconds)
}

/// `cmp A B`: true if identical.
fn cmp(a: &Path, b: &Path) -> Result<bool> {
    Ok(Command::new("cmp")
        .arg("-s")
        .arg(a)
        .arg(b)
        .status()
        .ctx("run cmp")?
        .success())
}

/// One imported checkpoint's figures.
struct Imported {
    id: u64,
    flink: u64,
    started_ms: f64,
    completed_ms: f64,
    bytes_uploaded: u64,
    /// The `_metadata` mtime, if the watcher saw it.
    seen: Option<Seen>,
    /// Records in the Flink checkpoint (from the job's `snapshot` line).
    records: Option<u64>,
}

fn run(args: &Args) -> Result<()> {
    let bin = common::ckptfs_bin("release");
    if !bin.is_file() {
        return Err(format!(
            "no ckptfs binary at {} (`cargo build --release --bin ckptfs`, or set CKPTFS_BIN)",
            bin.display()
        ));
    }
    let temp;
    let work = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).ctx(format!("create {}", dir.display()))?;
            if std::fs::read_dir(dir)
                .ctx("list BENCH_DIR")?
                .next()
                .is_some()
            {
                return Err(format!("BENCH_DIR {} is not empty", dir.display()));
            }
            dir.clone()
        }
        None => {
            temp = tempfile::Builder::new()
                .prefix("ckptfs-bench-flink-")
                .tempdir()
                .ctx("create a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    let (classes, ck, store, mnt) = (
        work.join("classes"),
        work.join("ck"),
        work.join("store"),
        work.join("mnt"),
    );
    std::fs::create_dir_all(&classes).ctx("create classes/")?;
    std::fs::create_dir_all(&ck).ctx("create ck/")?;
    let t = Instant::now();
    let classpath = compile_job(&classes)?;
    eprintln!("bench_flink: javac {:.1} s", t.elapsed().as_secs_f64());

    let retain = args.checkpoints.max(50) + 10;
    let mount_args: Vec<String> = vec![
        "--flink".into(),
        ck.display().to_string(),
        "--retain".into(),
        retain.to_string(),
    ];
    let (mut mount, mount_s) = Mount::new(&bin, &store, &mnt, &mount_args)?;
    let rchar_start = mount.proc_field("io", "rchar:");
    eprintln!(
        "bench_flink: {} mount {} {} --flink {} --retain {retain} ({mount_s:.2} s, pid {})",
        bin.display(),
        store.display(),
        mnt.display(),
        ck.display(),
        mount.pid
    );

    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<BTreeMap<u64, Seen>>> = Arc::default();
    let watcher = {
        let (ck, stop, seen) = (ck.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || watch(ck, stop, seen))
    };
    let started = Instant::now();
    let mut job = Job::start(&classpath, &ck, args, &work)?;
    eprintln!(
        "bench_flink: StateJob --keys {} --payload-bytes {} --rate {} --interval-ms {} \
         --retained 3 (about {:.1} MiB of payload; {:.2} MiB/s rewritten)",
        args.keys,
        args.payload_bytes,
        args.rate,
        args.interval_ms,
        (args.keys * args.payload_bytes) as f64 / MIB,
        args.rate * args.payload_bytes as f64 / MIB
    );
    // Until CHECKPOINTS are imported: the JVM's start, the state's growth, 2 s per look.
    let deadline = started
        + Duration::from_secs(180)
        + Duration::from_millis(args.interval_ms.max(1000) * 10 * args.checkpoints as u64);
    let mut shown = 0;
    loop {
        job.check_running()?;
        let n = mount.rows()?.len();
        if n >= shown + 10 || (n > shown && n >= args.checkpoints) {
            let log = job.log.lock().unwrap();
            eprintln!(
                "bench_flink: {n} imported after {:.0} s (Flink: {} completed, the newest \
                 snapshot at {} records)",
                started.elapsed().as_secs_f64(),
                log.completes.len(),
                log.snapshots.values().last().map(|s| s.1).unwrap_or(0)
            );
            shown = n;
        }
        if n >= args.checkpoints {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{n} of {} checkpoints imported in {:.0} s; status: {}",
                args.checkpoints,
                started.elapsed().as_secs_f64(),
                mount.status().map(|s| s.to_string()).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let run_s = started.elapsed().as_secs_f64();
    job.kill();
    // The follower catches up with the newest checkpoint that completed before the kill.
    let newest = newest_completed(&ck);
    let catch_up = Instant::now();
    loop {
        let rows = mount.rows()?;
        let held = rows
            .iter()
            .filter_map(|r| r["flink"]["checkpoint"].as_u64())
            .max();
        let idle = mount.status()?["in_flight"]
            .as_array()
            .is_none_or(|a| a.is_empty());
        if (held >= newest && idle) || catch_up.elapsed() > Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let rchar_end = mount.proc_field("io", "rchar:");
    let daemon_hwm_kib = mount.proc_field("status", "VmHWM:");
    let status = mount.status()?;

    // The imported checkpoints.
    let rows = mount.rows()?;
    let seen = seen.lock().unwrap().clone();
    let (job_id, snapshots, completes) = {
        let log = job.log.lock().unwrap();
        (
            log.job.clone(),
            log.snapshots.clone(),
            log.completes.clone(),
        )
    };
    let mut imported = Vec::new();
    for r in &rows {
        let id = r["id"].as_u64().ok_or("a row without id")?;
        let flink = r["flink"]["checkpoint"]
            .as_u64()
            .ok_or_else(|| format!("checkpoint {id} has no Flink label: {r}"))?;
        let completed_ms = r["completed_unix_ms"]
            .as_f64()
            .ok_or("no completed_unix_ms")?;
        let started_ms = match r["started_unix_ms"].as_f64() {
            Some(s) => s,
            None => {
                let path = store.join("checkpoints").join(format!("{id}.json"));
                let m: Value = serde_json::from_slice(
                    &std::fs::read(&path).ctx(format!("read {}", path.display()))?,
                )
                .ctx(format!("read {}", path.display()))?;
                m["started_unix_ms"]
                    .as_f64()
                    .ok_or_else(|| format!("{} has no started_unix_ms", path.display()))?
            }
        };
        imported.push(Imported {
            id,
            flink,
            started_ms,
            completed_ms,
            bytes_uploaded: r["bytes_uploaded"].as_u64().unwrap_or(0),
            seen: seen.get(&flink).copied(),
            records: snapshots.get(&flink).map(|s| s.1),
        });
    }
    let last = imported.last().ok_or("no checkpoint imported")?;
    let job_dir = match (&job_id, rows.last()) {
        (Some(job), _) => ck.join(job),
        (None, Some(r)) => ck.join(r["flink"]["job"].as_str().unwrap_or_default()),
        (None, None) => return Err("no job id".into()),
    };
    let full_from = imported
        .iter()
        .position(|c| c.records.is_some_and(|m| m >= args.keys));
    let first_flink = imported.first().map(|c| c.flink).unwrap_or(0);
    let last_flink = last.flink;
    let completed_in_range: Vec<u64> = completes
        .keys()
        .copied()
        .filter(|c| (first_flink..=last_flink).contains(c))
        .collect();
    let skipped: Vec<u64> = completed_in_range
        .iter()
        .copied()
        .filter(|c| !imported.iter().any(|i| i.flink == *c))
        .collect();

    // Flink's bytes for the same checkpoints, from their _metadata as the mount shows it.
    let mut flink_bytes = FlinkBytes::default();
    for c in &imported {
        let path = mnt.join(format!("cp-{}/_flink/0/_metadata", c.id));
        let bytes = std::fs::read(&path).ctx(format!("read {}", path.display()))?;
        flink_bytes
            .add(&job_dir, &bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let flink_total = flink_bytes.file_bytes(None) + flink_bytes.metadata_bytes;
    let store_du = du_sb(&store)?;
    let objects_du = du_sb(&store.join("objects"))?;
    let mut store_parts = BTreeMap::new();
    for e in std::fs::read_dir(&store).ctx("list the store")?.flatten() {
        store_parts.insert(
            e.file_name().to_string_lossy().into_owned(),
            du_sb(&e.path())?,
        );
    }
    let linked_objects = walk_files(&store.join("objects"))
        .iter()
        .filter(|p| std::fs::metadata(p).map(|m| m.nlink() > 1).unwrap_or(false))
        .count();

    // The newest checkpoint: keyed state, and its biggest subtask.
    let tree = mnt.join(format!("cp-{}", last.id));
    let mut keyed_state = 0;
    for e in std::fs::read_dir(&tree)
        .ctx(format!("list {}", tree.display()))?
        .flatten()
    {
        if e.file_name() != "_flink" {
            keyed_state += tree_bytes(&e.path());
        }
    }
    let newest_md_bytes =
        std::fs::read(tree.join("_flink/0/_metadata")).ctx("read the newest _metadata")?;
    let newest_md = metadata::parse(&newest_md_bytes).map_err(|e| e.to_string())?;
    let lay = layout(&newest_md).map_err(|e| e.to_string())?;
    let (backend, files) = lay
        .subtasks
        .iter()
        .max_by_key(|(_, files)| files.iter().map(|(_, s)| s.size()).sum::<u64>())
        .ok_or("the newest checkpoint has no subtask")?;
    let subtask_dir = tree.join(backend.rel_path());
    let subtask_bytes = tree_bytes(&subtask_dir);
    let mut flink_files: Vec<(String, PathBuf, u64)> = Vec::new();
    let mut inline: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, h) in files {
        match (handle_path(&job_dir, newest_md.checkpoint_id, h), h) {
            (Some((path, size)), _) => flink_files.push((name.clone(), path, size)),
            (None, StreamHandle::Inline(b)) => inline.push((name.clone(), b.clone())),
            (None, _) => inline.push((name.clone(), Vec::new())),
        }
    }
    for (name, path, _) in &flink_files {
        if !path.is_file() {
            return Err(format!(
                "{name} of {backend}: Flink no longer has {}",
                path.display()
            ));
        }
    }
    let flink_copy_bytes: u64 = flink_files.iter().map(|f| f.2).sum();
    let (out_mnt, out_mnt2, out_flink) = (
        work.join("copy-mount"),
        work.join("copy-mount-warm"),
        work.join("copy-flink"),
    );
    let cp_mount_s = timed(
        Command::new("cp").arg("-r").arg(&subtask_dir).arg(&out_mnt),
        "cp -r out of the mount",
    )?;
    std::fs::create_dir_all(&out_flink).ctx("create copy-flink/")?;
    let cp_flink_s = timed(
        Command::new("cp")
            .arg("-t")
            .arg(&out_flink)
            .args(flink_files.iter().map(|f| &f.1)),
        "cp of Flink's files",
    )?;
    let cp_mount_warm_s = timed(
        Command::new("cp")
            .arg("-r")
            .arg(&subtask_dir)
            .arg(&out_mnt2),
        "cp -r out of the mount (warm)",
    )?;
    let mut mismatches = Vec::new();
    for (name, path, _) in &flink_files {
        let base = path.file_name().ok_or("a Flink file without a name")?;
        if !cmp(&out_mnt.join(name), &out_flink.join(base))? {
            mismatches.push(name.clone());
        }
    }
    for (name, bytes) in &inline {
        if std::fs::read(out_mnt.join(name)).ok().as_ref() != Some(bytes) {
            mismatches.push(name.clone());
        }
    }
    let copied_names = walk_files(&out_mnt).len();
    if copied_names != flink_files.len() + inline.len() {
        mismatches.push(format!(
            "{copied_names} files out of the mount, {} named by _metadata",
            flink_files.len() + inline.len()
        ));
    }
    let identical = mismatches.is_empty();
    mount.unmount()?;

    // Figures.
    let import_ms: Vec<f64> = imported
        .iter()
        .map(|c| c.completed_ms - c.started_ms)
        .collect();
    let lag_ms: Vec<f64> = imported
        .iter()
        .filter_map(|c| c.seen.map(|s| c.completed_ms - s.mtime_ms))
        .collect();
    let notice_ms: Vec<f64> = imported
        .iter()
        .filter_map(|c| c.seen.map(|s| c.started_ms - s.mtime_ms))
        .collect();
    let watcher_ms: Vec<f64> = imported
        .iter()
        .filter_map(|c| c.seen.map(|s| s.seen_ms - s.mtime_ms))
        .collect();
    let full = &imported[full_from.unwrap_or(imported.len())..];
    let import_full: Vec<f64> = full.iter().map(|c| c.completed_ms - c.started_ms).collect();
    let lag_full: Vec<f64> = full
        .iter()
        .filter_map(|c| c.seen.map(|s| c.completed_ms - s.mtime_ms))
        .collect();
    let flink_ckpt_ms: Vec<f64> = completed_in_range
        .iter()
        .filter_map(|c| Some(completes.get(c)? - snapshots.get(c)?.0))
        .collect();
    let uploaded: Vec<f64> = imported
        .iter()
        .skip(1)
        .map(|c| c.bytes_uploaded as f64 / MIB)
        .collect();
    let uploaded_total: u64 = imported.iter().map(|c| c.bytes_uploaded).sum();
    let daemon_read = rchar_end.zip(rchar_start).map(|(e, s)| e.saturating_sub(s));
    let mibs = |bytes: u64, s: f64| bytes as f64 / MIB / s;
    let (imp50, imp99, impmax) = dist(&import_ms);
    let (lag50, lag99, lagmax) = dist(&lag_ms);
    let (not50, not99, _) = dist(&notice_ms);
    let (up50, up99, upmax) = dist(&uploaded);
    let (fl50, fl99, _) = dist(&flink_ckpt_ms);
    let private_mean = flink_bytes.private_bytes.iter().sum::<u64>() as f64
        / flink_bytes.private_bytes.len().max(1) as f64;
    let private_files_mean = flink_bytes.private_files.iter().sum::<u64>() as f64
        / flink_bytes.private_files.len().max(1) as f64;

    println!();
    println!(
        "bench_flink: {} checkpoints imported (ckptfs {}..{}, Flink {first_flink}..{last_flink}), \
         {} keys x {} B payload at {} records/s, interval {} ms, in {run_s:.0} s",
        imported.len(),
        imported[0].id,
        last.id,
        args.keys,
        args.payload_bytes,
        args.rate,
        args.interval_ms
    );
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| keyed state (subtask files of the newest checkpoint, cp-{}) | {:.1} MiB |",
        last.id,
        keyed_state as f64 / MIB
    );
    println!(
        "| checkpoints with every key's payload | {} of {} (from ckptfs checkpoint {}) |",
        full.len(),
        imported.len(),
        full.first().map(|c| c.id.to_string()).unwrap_or("-".into())
    );
    println!(
        "| ckptfs store, `du -sb STORE` | {:.1} MiB |",
        store_du as f64 / MIB
    );
    println!(
        "| ckptfs store, `du -sb STORE/objects` | {:.1} MiB |",
        objects_du as f64 / MIB
    );
    println!(
        "| Flink, the same checkpoints: distinct files + `_metadata` | {:.1} MiB ({} files: \
         shared {:.1} MiB, private {:.1}, meta {:.1}, operator state {:.1}; `_metadata` {:.2} MiB, \
         of which inline {:.2}) |",
        flink_total as f64 / MIB,
        flink_bytes.files.len(),
        flink_bytes.file_bytes(Some("shared")) as f64 / MIB,
        flink_bytes.file_bytes(Some("private")) as f64 / MIB,
        flink_bytes.file_bytes(Some("meta")) as f64 / MIB,
        flink_bytes.file_bytes(Some("operator")) as f64 / MIB,
        flink_bytes.metadata_bytes as f64 / MIB,
        flink_bytes.inline_bytes as f64 / MIB
    );
    println!(
        "| store / Flink | {:.3} (objects only: {:.3}) |",
        store_du as f64 / flink_total as f64,
        objects_du as f64 / flink_total as f64
    );
    println!(
        "| Flink private files (MANIFEST, OPTIONS, CURRENT) per checkpoint | {:.1} KiB, {:.1} \
         of them files (the rest inline) |",
        private_mean / 1024.0,
        private_files_mean
    );
    println!(
        "| ckptfs bytes_uploaded per checkpoint (after the first) p50 / p99 / max | {up50:.1} / \
         {up99:.1} / {upmax:.1} MiB (total {:.1} MiB) |",
        uploaded_total as f64 / MIB
    );
    println!(
        "| daemon: bytes read (rchar) over the run; peak RSS | {} ; {} |",
        daemon_read
            .map(|b| format!("{:.1} MiB", b as f64 / MIB))
            .unwrap_or("-".into()),
        daemon_hwm_kib
            .map(|k| format!("{:.0} MiB", k as f64 / 1024.0))
            .unwrap_or("-".into())
    );
    println!(
        "| import per checkpoint (completed - started) p50 / p99 / max | {imp50:.0} / {imp99:.0} \
         / {impmax:.0} ms |"
    );
    println!(
        "| lag behind the job (completed - `_metadata` mtime) p50 / p99 / max | {lag50:.0} / \
         {lag99:.0} / {lagmax:.0} ms ({} checkpoints) |",
        lag_ms.len()
    );
    println!("| of which noticing (started - mtime) p50 / p99 | {not50:.0} / {not99:.0} ms |");
    println!(
        "| Flink checkpoint (source snapshot -> complete) p50 / p99 | {fl50:.0} / {fl99:.0} ms |"
    );
    println!(
        "| Flink checkpoints completed in that range, not imported | {} {:?} |",
        skipped.len(),
        skipped
    );
    println!(
        "| `cp -r` of {backend} out of the mount (first read) | {cp_mount_s:.3} s, {:.1} MiB, \
         {:.0} MiB/s |",
        subtask_bytes as f64 / MIB,
        mibs(subtask_bytes, cp_mount_s)
    );
    println!(
        "| `cp` of its {} files from Flink's checkpoint directory | {cp_flink_s:.3} s, {:.1} \
         MiB, {:.0} MiB/s ({} inline files not copied) |",
        flink_files.len(),
        flink_copy_bytes as f64 / MIB,
        mibs(flink_copy_bytes, cp_flink_s),
        inline.len()
    );
    println!(
        "| `cp -r` out of the mount again (warm) | {cp_mount_warm_s:.3} s, {:.0} MiB/s |",
        mibs(subtask_bytes, cp_mount_warm_s)
    );
    println!(
        "| the copies byte-identical (cmp) | {} |",
        if identical {
            "yes".to_string()
        } else {
            format!("NO: {mismatches:?}")
        }
    );
    println!();
    let report = json!({
        "bench": "flink",
        "keys": args.keys,
        "payload_bytes": args.payload_bytes,
        "rate": args.rate,
        "interval_ms": args.interval_ms,
        "checkpoints_imported": imported.len(),
        "ckptfs_checkpoints": [imported[0].id, last.id],
        "flink_checkpoints": [first_flink, last_flink],
        "flink_completed_not_imported": skipped,
        "run_seconds": run_s,
        "mount_seconds": mount_s,
        "keyed_state_bytes": keyed_state,
        "full_state_checkpoints": full.len(),
        "store_du_bytes": store_du,
        "store_objects_du_bytes": objects_du,
        "store_parts_du_bytes": store_parts,
        "store_objects_with_links": linked_objects,
        "flink_bytes": flink_total,
        "flink_distinct_files": flink_bytes.files.len(),
        "flink_shared_bytes": flink_bytes.file_bytes(Some("shared")),
        "flink_private_file_bytes": flink_bytes.file_bytes(Some("private")),
        "flink_meta_file_bytes": flink_bytes.file_bytes(Some("meta")),
        "flink_operator_file_bytes": flink_bytes.file_bytes(Some("operator")),
        "flink_metadata_bytes": flink_bytes.metadata_bytes,
        "flink_inline_bytes": flink_bytes.inline_bytes,
        "flink_private_bytes_per_checkpoint": private_mean,
        "flink_private_files_per_checkpoint": private_files_mean,
        "ckptfs_bytes_uploaded_total": uploaded_total,
        "ckptfs_bytes_uploaded_mib": dist_json(&uploaded),
        "daemon_rchar_bytes": daemon_read,
        "daemon_peak_rss_kib": daemon_hwm_kib,
        "import_ms": dist_json(&import_ms),
        "import_ms_full_state": dist_json(&import_full),
        "lag_ms": dist_json(&lag_ms),
        "lag_ms_full_state": dist_json(&lag_full),
        "notice_ms": dist_json(&notice_ms),
        "watcher_delay_ms": dist_json(&watcher_ms),
        "flink_checkpoint_ms": dist_json(&flink_ckpt_ms),
        "copy": {
            "subtask": backend.to_string(),
            "mount_bytes": subtask_bytes,
            "mount_seconds": cp_mount_s,
            "mount_warm_seconds": cp_mount_warm_s,
            "flink_files": flink_files.len(),
            "flink_bytes": flink_copy_bytes,
            "flink_seconds": cp_flink_s,
            "inline_files": inline.len(),
            "identical": identical,
        },
        "status_last_error": status["last_error"],
        "per_checkpoint": imported.iter().map(|c| json!({
            "id": c.id,
            "flink": c.flink,
            "records": c.records,
            "import_ms": c.completed_ms - c.started_ms,
            "lag_ms": c.seen.map(|s| c.completed_ms - s.mtime_ms),
            "bytes_uploaded": c.bytes_uploaded,
        })).collect::<Vec<_>>(),
    });
    println!("{report}");
    if !identical {
        return Err(format!("the copies differ: {mismatches:?}"));
    }
    if args.dir.is_some() {
        eprintln!("bench_flink: kept {}", work.display());
    }
    Ok(())
}

/// Every regular file under `dir`.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => out.extend(walk_files(&e.path())),
            Ok(t) if t.is_file() => out.push(e.path()),
            _ => {}
        }
    }
    out
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_flink: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_flink: {e}");
            ExitCode::FAILURE
        }
    }
}
