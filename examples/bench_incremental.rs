//! Benchmark of incremental checkpoints: how much a checkpoint uploads after a small change.
//!
//! 1. Load about TOTAL_MIB of incompressible state into BACKENDS backends (`Bench/0..`),
//!    checkpoint 1.
//! 2. Rewrite REWRITE_PERCENT of the keys (spread uniformly over the key space of every
//!    backend), checkpoint 2.
//! 3. Rewrite another REWRITE_PERCENT, fully compact backend 0, checkpoint 3 (shows the
//!    upload spike a compaction causes).
//! 4. Only when the environment variable `BENCH_STEADY_ROUNDS` is N > 0 (default 0: off):
//!    N more rounds of "rewrite REWRITE_PERCENT (evenly spaced keys, a different offset every
//!    round) + checkpoint", without forced compaction, so RocksDB's automatic compactions
//!    happen whenever they happen. Reported: the upload share of every one of these
//!    checkpoints, its min / median / mean / p90 (nearest rank) / max, the bytes uploaded over
//!    the bytes rewritten (write amplification as the store sees it), how many checkpoints
//!    uploaded more than 5% and more than 50% of the state, the mean phase durations, and
//!    which RocksDB jobs (flushes, compactions; read from each backend's info LOG) produced
//!    the uploaded SSTs. All of it also goes under "steady" in the JSON line, which has no
//!    "steady" key when the phase is off.
//!
//! For every checkpoint it reports the state size, what was uploaded (split into SST and
//! private files: MANIFEST, CURRENT, OPTIONS, WAL), the SST files that are new relative to the
//! previous checkpoint (by backend and file name), the synchronous and asynchronous phase
//! durations and the file counts; then one JSON line with every figure.
//!
//! Usage: `[BENCH_STEADY_ROUNDS=N] cargo run --example bench_incremental -- [TOTAL_MIB
//! [BACKENDS [REWRITE_PERCENT [WORKDIR]]]]` (defaults 256, 4, 1, a temporary directory under
//! /tmp removed at the end; N = 0). The number of steady rounds is an environment variable
//! only, not a fifth argument: it would come after WORKDIR, so asking for steady rounds would
//! force a kept working directory.
//! This is a benchmark, not a test: targets are reported, never asserted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use ckptfs_core::catalog::Manifest;
use ckptfs_core::store::ObjectId;
use ckptfs_core::{BackendName, Engine, EngineConfig, WriteOp};
use serde_json::{json, Value};

mod common;
use common::{key, mix, value, KEY_SIZE, VALUE_SIZE};

const MIB: u64 = 1024 * 1024;
const BATCH: u64 = 1000;
const OPERATOR: &str = "Bench";
/// Targets for a checkpoint after a small rewrite (reported, not asserted).
const TARGET_UPLOAD_SHARE: f64 = 0.05;
const TARGET_UPLOAD_RATIO: f64 = 1.05;
/// Environment variable: number of steady-state rounds after checkpoint 3 (0 = none).
const STEADY_ROUNDS_VAR: &str = "BENCH_STEADY_ROUNDS";
/// Upload shares counted in the steady-state phase ("checkpoints above ...").
const SPIKE_SHARES: [f64; 2] = [0.05, 0.50];

struct Args {
    total_mib: u64,
    backends: u32,
    rewrite_percent: f64,
    workdir: Option<PathBuf>,
    /// Steady-state rounds after checkpoint 3 (from BENCH_STEADY_ROUNDS).
    steady_rounds: u64,
}

fn usage() -> String {
    format!(
        "usage: [{STEADY_ROUNDS_VAR}=N] bench_incremental [TOTAL_MIB [BACKENDS \
         [REWRITE_PERCENT [WORKDIR]]]]\n\
         defaults: 256 MiB, 4 backends, 1 percent, a temporary directory under /tmp (removed)\n\
         {STEADY_ROUNDS_VAR}=N (environment only; default 0 = off): after checkpoint 3, N more \
         rounds of\n\
         REWRITE_PERCENT rewrite + checkpoint (no forced compaction), with upload-share \
         statistics"
    )
}

fn parse_args() -> Result<Args, String> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "-h" || a == "--help") {
        return Err(usage());
    }
    if argv.len() > 4 {
        return Err(format!("too many arguments\n{}", usage()));
    }
    let bad = |what: &str, text: &str| format!("invalid {what}: {text:?}\n{}", usage());
    let mut args = Args {
        total_mib: 256,
        backends: 4,
        rewrite_percent: 1.0,
        workdir: None,
        steady_rounds: 0,
    };
    if let Some(text) = argv.first() {
        args.total_mib = text
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("TOTAL_MIB", text))?;
    }
    if let Some(text) = argv.get(1) {
        args.backends = text
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("BACKENDS", text))?;
    }
    if let Some(text) = argv.get(2) {
        args.rewrite_percent = text
            .parse()
            .ok()
            .filter(|&p: &f64| p > 0.0 && p <= 100.0)
            .ok_or_else(|| bad("REWRITE_PERCENT", text))?;
    }
    if let Some(text) = argv.get(3) {
        args.workdir = Some(PathBuf::from(text));
    }
    // Unset or empty: off. Anything else must be a whole number.
    if let Some(text) = std::env::var_os(STEADY_ROUNDS_VAR) {
        let text = text.to_string_lossy();
        if !text.trim().is_empty() {
            args.steady_rounds = text
                .trim()
                .parse()
                .map_err(|_| bad(STEADY_ROUNDS_VAR, &text))?;
        }
    }
    Ok(args)
}

/// Write the keys `indices` of every backend, one batch of BATCH keys per backend in turn.
fn write_keys(
    engine: &Engine,
    names: &[BackendName],
    indices: &[u64],
    round: u64,
) -> ckptfs_core::Result<u64> {
    let mut bytes = 0;
    for chunk in indices.chunks(BATCH as usize) {
        for (b, name) in names.iter().enumerate() {
            let ops: Vec<WriteOp> = chunk
                .iter()
                .map(|&i| WriteOp::Put(key(i), value(b as u32, i, round)))
                .collect();
            bytes += ops.len() as u64 * (KEY_SIZE + VALUE_SIZE) as u64;
            engine.write(name, &ops)?;
        }
    }
    Ok(bytes)
}

/// `count` of the `keys` indices, evenly spaced over `0..keys` from a round-dependent offset.
/// Indices are mixed into keys, so they are spread uniformly over the key space too.
fn rewrite_set(keys: u64, percent: f64, round: u64) -> Vec<u64> {
    let count = ((keys as f64 * percent / 100.0).round() as u64).clamp(1, keys);
    let offset = mix(round) % keys;
    (0..count)
        .map(|j| (offset + j * keys / count) % keys)
        .collect()
}

#[derive(Default)]
struct Figures {
    label: String,
    checkpoint: u64,
    keys_written: u64,
    bytes_written: u64,
    write_secs: f64,
    compact_secs: Option<f64>,
    checkpoint_secs: f64,
    bytes_total: u64,
    sst_bytes: u64,
    sst_files: u64,
    private_bytes: u64,
    private_files: u64,
    files_total: u64,
    files_new: u64,
    files_reused: u64,
    bytes_uploaded: u64,
    uploaded_sst: u64,
    uploaded_private: u64,
    uploaded_objects: u64,
    /// SSTs whose (backend, name) is not in the previous checkpoint.
    new_sst_files: u64,
    new_sst_bytes: u64,
    /// The engine's own figure (not re-referenced by name and size from the base).
    engine_bytes_new_sst: u64,
    sync_micros: u64,
    async_micros: u64,
    /// Per backend: SST count and bytes.
    per_backend: Vec<(String, u64, u64, u64)>,
    /// The SSTs this checkpoint uploaded: backend, file name, size.
    uploaded_ssts: Vec<(BackendName, String, u64)>,
}

impl Figures {
    fn upload_share(&self) -> f64 {
        ratio(self.bytes_uploaded, self.bytes_total).unwrap_or(0.0)
    }
    fn ratio_incl_private(&self) -> Option<f64> {
        ratio(self.bytes_uploaded, self.new_sst_bytes)
    }
    fn ratio_sst_only(&self) -> Option<f64> {
        ratio(self.uploaded_sst, self.new_sst_bytes)
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

fn is_sst(name: &str) -> bool {
    name.ends_with(".sst") || name.ends_with(".blob")
}

/// Figures of checkpoint `m`, given the checkpoint before it and every object the store held
/// when `m` started (the objects of the retained checkpoints).
fn measure(
    m: &Manifest,
    previous: Option<&Manifest>,
    stored_before: &HashSet<ObjectId>,
) -> Figures {
    let mut f = Figures {
        checkpoint: m.id,
        files_total: m.stats.files_total,
        files_new: m.stats.files_new,
        files_reused: m.stats.files_reused,
        bytes_total: m.stats.bytes_total,
        bytes_uploaded: m.stats.bytes_uploaded,
        engine_bytes_new_sst: m.stats.bytes_new_sst,
        sync_micros: m.stats.sync_micros,
        async_micros: m.stats.async_micros,
        ..Figures::default()
    };
    let before: HashSet<(&BackendName, &str)> = previous
        .map(|p| {
            p.backends
                .iter()
                .flat_map(|b| {
                    b.files
                        .iter()
                        .map(move |file| (&b.name, file.name.as_str()))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut counted: HashSet<ObjectId> = HashSet::new();
    for backend in &m.backends {
        let (mut n, mut bytes, mut new) = (0, 0, 0);
        for file in backend.files.iter() {
            let sst = is_sst(&file.name);
            if sst {
                f.sst_files += 1;
                f.sst_bytes += file.size;
                n += 1;
                bytes += file.size;
                if !before.contains(&(&backend.name, file.name.as_str())) {
                    f.new_sst_files += 1;
                    f.new_sst_bytes += file.size;
                    new += 1;
                }
            } else {
                f.private_files += 1;
                f.private_bytes += file.size;
            }
            // The stored objects: the file, or its chunks (an append-only MANIFEST).
            for (object, size) in file.stored() {
                if !stored_before.contains(&object) && counted.insert(object) {
                    f.uploaded_objects += 1;
                    if sst {
                        f.uploaded_sst += size;
                        f.uploaded_ssts
                            .push((backend.name.clone(), file.name.clone(), size));
                    } else {
                        f.uploaded_private += size;
                    }
                }
            }
        }
        f.per_backend
            .push((backend.name.to_string(), n, new, bytes));
    }
    f
}

fn stored_objects(engine: &Engine) -> HashSet<ObjectId> {
    engine
        .checkpoints()
        .iter()
        .flat_map(|m| m.objects())
        .collect()
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / MIB as f64)
}

fn ms(micros: u64) -> String {
    format!("{:.1} ms", micros as f64 / 1000.0)
}

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

fn times(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".to_string(), |x| format!("{x:.3}x"))
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn print_table(rounds: &[Figures]) {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, cell: &dyn Fn(&Figures) -> String| {
        rows.push((name.to_string(), rounds.iter().map(cell).collect()));
    };
    row("", &|f| format!("checkpoint {}", f.checkpoint));
    row("round", &|f| f.label.clone());
    row("keys written", &|f| f.keys_written.to_string());
    row("bytes written (key+value)", &|f| mib(f.bytes_written));
    row("write time", &|f| format!("{:.2} s", f.write_secs));
    row("compaction time", &|f| {
        f.compact_secs
            .map_or_else(|| "-".to_string(), |s| format!("{s:.2} s"))
    });
    row("state: bytes_total", &|f| mib(f.bytes_total));
    row("state: SST files only", &|f| {
        format!("{} ({} files)", mib(f.sst_bytes), f.sst_files)
    });
    row("state: private files", &|f| {
        format!("{} ({} files)", mib(f.private_bytes), f.private_files)
    });
    row("files total/new/reused", &|f| {
        format!("{}/{}/{}", f.files_total, f.files_new, f.files_reused)
    });
    row("new SSTs vs previous cp", &|f| {
        format!("{} ({} files)", mib(f.new_sst_bytes), f.new_sst_files)
    });
    row("engine bytes_new_sst", &|f| mib(f.engine_bytes_new_sst));
    row("uploaded (bytes_uploaded)", &|f| mib(f.bytes_uploaded));
    row("  of which SST", &|f| mib(f.uploaded_sst));
    row("  of which private", &|f| mib(f.uploaded_private));
    row("uploaded / state", &|f| pct(f.upload_share()));
    row("uploaded / new SST bytes", &|f| {
        times(f.ratio_incl_private())
    });
    row("uploaded SST / new SST", &|f| times(f.ratio_sst_only()));
    row("sync phase (sync_micros)", &|f| ms(f.sync_micros));
    row("async phase (async_micros)", &|f| ms(f.async_micros));
    row("checkpoint wall time", &|f| {
        format!("{:.1} ms", f.checkpoint_secs * 1000.0)
    });
    let backends = rounds.first().map_or(0, |f| f.per_backend.len());
    for b in 0..backends {
        let name = rounds[0].per_backend[b].0.clone();
        row(&format!("{name}: SSTs (new) size"), &|f| {
            let (_, n, new, bytes) = &f.per_backend[b];
            format!("{n} ({new}) {}", mib(*bytes))
        });
    }

    let label_width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..rounds.len())
        .map(|c| {
            rows.iter()
                .map(|(_, cells)| cells[c].len())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, (name, cells)) in rows.iter().enumerate() {
        let mut line = format!("{name:<label_width$}");
        for (cell, width) in cells.iter().zip(&widths) {
            line.push_str(&format!(" | {cell:>width$}"));
        }
        println!("{line}");
        if i == 1 {
            let total = label_width + widths.iter().map(|w| w + 3).sum::<usize>();
            println!("{}", "-".repeat(total));
        }
    }
}

fn figures_json(f: &Figures) -> Value {
    json!({
        "checkpoint": f.checkpoint,
        "round": f.label,
        "keys_written": f.keys_written,
        "bytes_written": f.bytes_written,
        "write_secs": f.write_secs,
        "compact_secs": f.compact_secs,
        "checkpoint_secs": f.checkpoint_secs,
        "bytes_total": f.bytes_total,
        "sst_bytes": f.sst_bytes,
        "sst_files": f.sst_files,
        "private_bytes": f.private_bytes,
        "private_files": f.private_files,
        "files_total": f.files_total,
        "files_new": f.files_new,
        "files_reused": f.files_reused,
        "bytes_uploaded": f.bytes_uploaded,
        "uploaded_sst_bytes": f.uploaded_sst,
        "uploaded_private_bytes": f.uploaded_private,
        "uploaded_objects": f.uploaded_objects,
        "new_sst_files": f.new_sst_files,
        "new_sst_bytes": f.new_sst_bytes,
        "engine_bytes_new_sst": f.engine_bytes_new_sst,
        "upload_share": f.upload_share(),
        "ratio_uploaded_to_new_sst": f.ratio_incl_private(),
        "ratio_uploaded_sst_to_new_sst": f.ratio_sst_only(),
        "sync_micros": f.sync_micros,
        "async_micros": f.async_micros,
        "per_backend": f.per_backend.iter().map(|(name, n, new, bytes)| json!({
            "backend": name, "sst_files": n, "new_sst_files": new, "sst_bytes": bytes,
        })).collect::<Vec<_>>(),
    })
}

/// Write the keys `indices` of every backend as round `round`, compact backend 0 if asked,
/// checkpoint, and measure the checkpoint against `previous`.
fn checkpoint_round(
    engine: &Engine,
    names: &[BackendName],
    indices: &[u64],
    round: u64,
    label: String,
    compact: bool,
    previous: Option<&Manifest>,
) -> Result<(Figures, Arc<Manifest>), Box<dyn std::error::Error>> {
    let clock = Instant::now();
    let bytes_written = write_keys(engine, names, indices, round)?;
    let write_secs = clock.elapsed().as_secs_f64();
    let compact_secs = if compact {
        let clock = Instant::now();
        engine.compact(&names[0])?;
        Some(clock.elapsed().as_secs_f64())
    } else {
        None
    };
    let stored_before = stored_objects(engine);
    let clock = Instant::now();
    let manifest = engine.checkpoint()?;
    let checkpoint_secs = clock.elapsed().as_secs_f64();
    let mut f = measure(&manifest, previous, &stored_before);
    f.label = label;
    f.keys_written = indices.len() as u64 * names.len() as u64;
    f.bytes_written = bytes_written;
    f.write_secs = write_secs;
    f.compact_secs = compact_secs;
    f.checkpoint_secs = checkpoint_secs;
    if f.uploaded_sst + f.uploaded_private != f.bytes_uploaded {
        eprintln!(
            "note: checkpoint {}: bytes_uploaded {} != new objects' bytes {} + {}",
            f.checkpoint, f.bytes_uploaded, f.uploaded_sst, f.uploaded_private
        );
    }
    Ok((f, manifest))
}

/// What the benchmark measured: the three fixed rounds, then the steady-state rounds (empty
/// when the phase is off) and what produced the SSTs each of those uploaded.
struct Outcome {
    rounds: Vec<Figures>,
    steady: Vec<Figures>,
    producers: Vec<Producers>,
}

fn run(args: &Args, workdir: &Path) -> Result<Outcome, Box<dyn std::error::Error>> {
    let store = workdir.join("store");
    if store.exists() {
        return Err(format!(
            "{} already exists: give an empty or new WORKDIR",
            store.display()
        )
        .into());
    }
    let names: Vec<BackendName> = (0..args.backends)
        .map(|b| BackendName::new(OPERATOR, b))
        .collect::<Result<_, _>>()?;
    let mut config = EngineConfig::new(&store);
    config.backends = names.clone();
    config.retain = Some(3);
    // The same option string `ckptfs mount --rocksdb-options` takes.
    config.backend_options.rocksdb_options = std::env::var("BENCH_ROCKSDB_OPTIONS").ok();
    if let Some(options) = &config.backend_options.rocksdb_options {
        println!("RocksDB options: {options}");
    }
    let engine = Engine::open(config)?;

    let per_entry = (KEY_SIZE + VALUE_SIZE) as u64;
    let keys = (args.total_mib * MIB / per_entry / u64::from(args.backends)).max(1);
    println!(
        "bench_incremental: {} MiB target, {} backends ({OPERATOR}/0..{}), {keys} keys of \
         {KEY_SIZE}+{VALUE_SIZE} bytes per backend, {}% rewrite per round, store {}",
        args.total_mib,
        args.backends,
        args.backends - 1,
        args.rewrite_percent,
        store.display()
    );

    let mut rounds = Vec::new();
    let mut previous: Option<Arc<Manifest>> = None;
    for round in 0..3u64 {
        let indices: Vec<u64> = if round == 0 {
            (0..keys).collect()
        } else {
            rewrite_set(keys, args.rewrite_percent, round)
        };
        let label = match round {
            0 => "full load".to_string(),
            1 => format!("{}% rewrite", args.rewrite_percent),
            _ => format!("{}% rewrite + compact {}", args.rewrite_percent, names[0]),
        };
        eprintln!(
            "round {}: {label} ({} keys per backend)",
            round + 1,
            indices.len()
        );
        let (f, manifest) = checkpoint_round(
            &engine,
            &names,
            &indices,
            round,
            label,
            round == 2,
            previous.as_deref(),
        )?;
        rounds.push(f);
        previous = Some(manifest);
    }

    let mut steady = Vec::new();
    if args.steady_rounds > 0 {
        eprintln!(
            "rounds 4..{}: steady state, {}% rewrite + checkpoint, no forced compaction ({} \
             keys per backend)",
            3 + args.steady_rounds,
            args.rewrite_percent,
            rewrite_set(keys, args.rewrite_percent, 3).len()
        );
    }
    for round in 3..3 + args.steady_rounds {
        let indices = rewrite_set(keys, args.rewrite_percent, round);
        let label = format!("steady {}: {}% rewrite", round - 2, args.rewrite_percent);
        let (f, manifest) = checkpoint_round(
            &engine,
            &names,
            &indices,
            round,
            label,
            false,
            previous.as_deref(),
        )?;
        steady.push(f);
        previous = Some(manifest);
    }

    // RocksDB buffers its info LOG (flushed every few seconds and at close): read the LOGs
    // only once every database is closed.
    let state_dir = engine.state_dir().to_path_buf();
    drop(engine);
    let mut producers = Vec::new();
    if !steady.is_empty() {
        let mut logs = BTreeMap::new();
        for name in &names {
            // The layout of the engine's state directory: backends/<operator>/<subtask>/db.
            let path = state_dir
                .join("backends")
                .join(name.rel_path())
                .join("db")
                .join("LOG");
            match RocksLog::read(&path) {
                Ok(log) => {
                    logs.insert(name.clone(), log);
                }
                Err(e) => eprintln!(
                    "note: cannot read {} ({e}): its uploads count as unknown",
                    path.display()
                ),
            }
        }
        producers = steady.iter().map(|f| attribute(f, &logs)).collect();
    }
    Ok(Outcome {
        rounds,
        steady,
        producers,
    })
}

/// What a RocksDB job was, from the EVENT_LOG_v1 lines of the database's info LOG.
enum Job {
    Flush,
    Compaction {
        reason: String,
        /// Input files per level.
        inputs: BTreeMap<u32, usize>,
        output_level: Option<u64>,
    },
}

/// The jobs of one database and the job that wrote each table file.
#[derive(Default)]
struct RocksLog {
    jobs: HashMap<u64, Job>,
    file_job: HashMap<u64, u64>,
}

impl RocksLog {
    fn read(path: &Path) -> std::io::Result<RocksLog> {
        let text = String::from_utf8_lossy(&std::fs::read(path)?).into_owned();
        let mut log = RocksLog::default();
        for line in text.lines() {
            let Some(at) = line.find("EVENT_LOG_v1 ") else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<Value>(&line[at + "EVENT_LOG_v1 ".len()..])
            else {
                continue;
            };
            let Some(job) = event["job"].as_u64() else {
                continue;
            };
            match event["event"].as_str().unwrap_or("") {
                "flush_started" => {
                    log.jobs.insert(job, Job::Flush);
                }
                "compaction_started" => {
                    let inputs = event
                        .as_object()
                        .into_iter()
                        .flatten()
                        .filter_map(|(k, v)| {
                            let level = k.strip_prefix("files_L")?.parse().ok()?;
                            Some((level, v.as_array()?.len()))
                        })
                        .collect();
                    let reason = event["compaction_reason"].as_str().unwrap_or("?");
                    log.jobs.insert(
                        job,
                        Job::Compaction {
                            reason: reason.to_string(),
                            inputs,
                            output_level: None,
                        },
                    );
                }
                "compaction_finished" => {
                    if let Some(Job::Compaction { output_level, .. }) = log.jobs.get_mut(&job) {
                        *output_level = event["output_level"].as_u64();
                    }
                }
                "table_file_creation" => {
                    if let Some(number) = event["file_number"].as_u64() {
                        log.file_job.insert(number, job);
                    }
                }
                _ => {}
            }
        }
        Ok(log)
    }

    /// The job that wrote SST `name` (e.g. `000123.sst`), if the LOG tells.
    fn job_of(&self, name: &str) -> Option<(u64, &Job)> {
        let number: u64 = name.strip_suffix(".sst")?.parse().ok()?;
        let job = *self.file_job.get(&number)?;
        Some((job, self.jobs.get(&job)?))
    }
}

/// Uploaded bytes of one steady-state checkpoint by the kind of RocksDB job that wrote them.
#[derive(Default)]
struct Producers {
    flush_bytes: u64,
    compaction_bytes: u64,
    unknown_bytes: u64,
    compactions: Vec<CompactionUpload>,
}

/// The uploaded outputs of one compaction job.
struct CompactionUpload {
    backend: String,
    job: u64,
    reason: String,
    inputs: BTreeMap<u32, usize>,
    output_level: Option<u64>,
    files: u64,
    bytes: u64,
}

impl CompactionUpload {
    /// E.g. `Bench/1 job 6 LevelL0FilesNum L0x4+L6x1 -> L6`.
    fn describe(&self) -> String {
        let inputs: Vec<String> = self
            .inputs
            .iter()
            .map(|(level, n)| format!("L{level}x{n}"))
            .collect();
        let output = self
            .output_level
            .map_or_else(|| "?".to_string(), |l| format!("L{l}"));
        format!(
            "{} job {} {} {} -> {output}",
            self.backend,
            self.job,
            self.reason,
            inputs.join("+")
        )
    }
}

fn attribute(f: &Figures, logs: &BTreeMap<BackendName, RocksLog>) -> Producers {
    let mut p = Producers::default();
    let mut by_job: BTreeMap<(String, u64), CompactionUpload> = BTreeMap::new();
    for (backend, name, size) in &f.uploaded_ssts {
        match logs.get(backend).and_then(|log| log.job_of(name)) {
            Some((_, Job::Flush)) => p.flush_bytes += size,
            Some((
                job,
                Job::Compaction {
                    reason,
                    inputs,
                    output_level,
                },
            )) => {
                p.compaction_bytes += size;
                let entry =
                    by_job
                        .entry((backend.to_string(), job))
                        .or_insert_with(|| CompactionUpload {
                            backend: backend.to_string(),
                            job,
                            reason: reason.clone(),
                            inputs: inputs.clone(),
                            output_level: *output_level,
                            files: 0,
                            bytes: 0,
                        });
                entry.files += 1;
                entry.bytes += size;
            }
            None => p.unknown_bytes += size,
        }
    }
    p.compactions = by_job.into_values().collect();
    p
}

/// Min, median, mean, p90 (nearest rank) and max of a non-empty list.
struct Spread {
    min: f64,
    median: f64,
    mean: f64,
    p90: f64,
    max: f64,
}

fn spread(values: &[f64]) -> Spread {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let rank = ((0.9 * n as f64).ceil() as usize).clamp(1, n);
    Spread {
        min: sorted[0],
        median,
        mean: sorted.iter().sum::<f64>() / n as f64,
        p90: sorted[rank - 1],
        max: sorted[n - 1],
    }
}

/// The steady-state figures: printed, and the "steady" object of the JSON line.
fn steady_report(steady: &[Figures], producers: &[Producers], rewrite_percent: f64) -> Value {
    let n = steady.len() as u64;
    let shares: Vec<f64> = steady.iter().map(Figures::upload_share).collect();
    let s = spread(&shares);
    let uploaded: u64 = steady.iter().map(|f| f.bytes_uploaded).sum();
    let written: u64 = steady.iter().map(|f| f.bytes_written).sum();
    let amplification = ratio(uploaded, written);
    let above: Vec<usize> = SPIKE_SHARES
        .iter()
        .map(|&limit| shares.iter().filter(|&&x| x > limit).count())
        .collect();
    let mean_sync = steady.iter().map(|f| f.sync_micros).sum::<u64>() as f64 / n as f64;
    let mean_async = steady.iter().map(|f| f.async_micros).sum::<u64>() as f64 / n as f64;
    let mean_wall = steady.iter().map(|f| f.checkpoint_secs).sum::<f64>() / n as f64;
    let flush: u64 = producers.iter().map(|p| p.flush_bytes).sum();
    let compaction: u64 = producers.iter().map(|p| p.compaction_bytes).sum();
    let unknown: u64 = producers.iter().map(|p| p.unknown_bytes).sum();
    let private: u64 = steady.iter().map(|f| f.uploaded_private).sum();
    let (first, last) = (steady[0].checkpoint, steady[steady.len() - 1].checkpoint);

    println!(
        "steady state: {n} rounds of {rewrite_percent}% rewrite + checkpoint, no forced \
         compaction (checkpoints {first}..{last})"
    );
    println!("upload share per checkpoint (% of state):");
    for chunk in steady.chunks(10) {
        let cells: Vec<String> = chunk
            .iter()
            .map(|f| format!("{:6.2}", f.upload_share() * 100.0))
            .collect();
        println!(
            "  cp {:>3}-{:<3} {}",
            chunk[0].checkpoint,
            chunk[chunk.len() - 1].checkpoint,
            cells.join(" ")
        );
    }
    println!(
        "upload share: min {}, median {}, mean {}, p90 {}, max {}",
        pct(s.min),
        pct(s.median),
        pct(s.mean),
        pct(s.p90),
        pct(s.max)
    );
    println!(
        "uploaded / rewritten: {} / {} = {} (write amplification seen by the store)",
        mib(uploaded),
        mib(written),
        times(amplification)
    );
    println!(
        "checkpoints above {}: {} of {n}; above {}: {} of {n}",
        pct(SPIKE_SHARES[0]),
        above[0],
        pct(SPIKE_SHARES[1]),
        above[1]
    );
    println!(
        "mean phases: sync {}, async {} (checkpoint wall time {:.1} ms)",
        ms(mean_sync.round() as u64),
        ms(mean_async.round() as u64),
        mean_wall * 1000.0
    );
    println!(
        "mean upload share {} < target {}: {} ({} of {n} single checkpoints below it)",
        pct(s.mean),
        pct(TARGET_UPLOAD_SHARE),
        verdict(s.mean < TARGET_UPLOAD_SHARE),
        shares.iter().filter(|&&x| x < TARGET_UPLOAD_SHARE).count()
    );
    println!(
        "uploaded bytes by producer (RocksDB LOG): flushes {}, compactions {}, private files \
         {}, unknown {}",
        mib(flush),
        mib(compaction),
        mib(private),
        mib(unknown)
    );
    println!("compactions whose outputs a checkpoint uploaded:");
    let mut any = false;
    for (f, p) in steady.iter().zip(producers) {
        for (i, c) in p.compactions.iter().enumerate() {
            any = true;
            let head = if i == 0 {
                format!("cp {:>3} ({:>6})", f.checkpoint, pct(f.upload_share()))
            } else {
                String::new()
            };
            println!(
                "  {head:<16} {}: {} file(s), {}",
                c.describe(),
                c.files,
                mib(c.bytes)
            );
        }
    }
    if !any {
        println!("  none");
    }

    json!({
        "rounds": n,
        "first_checkpoint": first,
        "last_checkpoint": last,
        "upload_shares": shares,
        "bytes_uploaded": steady.iter().map(|f| f.bytes_uploaded).collect::<Vec<_>>(),
        "upload_share": {
            "min": s.min,
            "median": s.median,
            "mean": s.mean,
            "p90": s.p90,
            "max": s.max,
        },
        "bytes_uploaded_total": uploaded,
        "bytes_written_total": written,
        "write_amplification": amplification,
        "checkpoints_above_5pct": above[0],
        "checkpoints_above_50pct": above[1],
        "mean_sync_micros": mean_sync,
        "mean_async_micros": mean_async,
        "mean_checkpoint_secs": mean_wall,
        "mean_upload_share_met": s.mean < TARGET_UPLOAD_SHARE,
        "uploaded_by_producer": {
            "flush_bytes": flush,
            "compaction_bytes": compaction,
            "private_bytes": private,
            "unknown_bytes": unknown,
        },
        "compactions": steady.iter().zip(producers).flat_map(|(f, p)| {
            p.compactions.iter().map(move |c| json!({
                "checkpoint": f.checkpoint,
                "backend": c.backend,
                "job": c.job,
                "reason": c.reason,
                "inputs": c.inputs.iter().map(|(l, n)| (format!("L{l}"), json!(n)))
                    .collect::<serde_json::Map<_, _>>(),
                "output_level": c.output_level,
                "uploaded_files": c.files,
                "uploaded_bytes": c.bytes,
            }))
        }).collect::<Vec<_>>(),
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let (tempdir, workdir) = match &args.workdir {
        Some(dir) => (None, dir.clone()),
        None => match tempfile::Builder::new()
            .prefix("ckptfs-bench-")
            .tempdir_in("/tmp")
        {
            Ok(t) => {
                let path = t.path().to_path_buf();
                (Some(t), path)
            }
            Err(e) => {
                eprintln!("cannot create a temporary directory: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let result = run(&args, &workdir);
    // The engine is closed by now (dropped inside `run`): the directory can go.
    if let Some(t) = tempdir {
        if let Err(e) = t.close() {
            eprintln!("could not remove {}: {e}", workdir.display());
        }
    }
    let Outcome {
        rounds,
        steady,
        producers,
    } = match result {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("bench_incremental failed: {e}");
            return ExitCode::FAILURE;
        }
    };

    println!();
    print_table(&rounds);
    println!();
    let second = &rounds[1];
    println!(
        "targets for checkpoint {} ({}): uploaded/state {} < {} {}; uploaded/new SST {} <= \
         {TARGET_UPLOAD_RATIO:.2}x {} (SST only: {} {})",
        second.checkpoint,
        second.label,
        pct(second.upload_share()),
        pct(TARGET_UPLOAD_SHARE),
        verdict(second.upload_share() < TARGET_UPLOAD_SHARE),
        times(second.ratio_incl_private()),
        verdict(
            second
                .ratio_incl_private()
                .is_some_and(|r| r <= TARGET_UPLOAD_RATIO)
        ),
        times(second.ratio_sst_only()),
        verdict(
            second
                .ratio_sst_only()
                .is_some_and(|r| r <= TARGET_UPLOAD_RATIO)
        ),
    );
    let third = &rounds[2];
    println!(
        "checkpoint {} ({}): uploaded {} = {} of the state ({}x checkpoint {})",
        third.checkpoint,
        third.label,
        mib(third.bytes_uploaded),
        pct(third.upload_share()),
        ratio(third.bytes_uploaded, second.bytes_uploaded)
            .map_or_else(|| "n/a".to_string(), |r| format!("{r:.1}")),
        second.checkpoint,
    );
    let steady_json = if steady.is_empty() {
        None
    } else {
        println!();
        Some(steady_report(&steady, &producers, args.rewrite_percent))
    };
    let mut out = json!({
        "bench": "incremental",
        "total_mib": args.total_mib,
        "backends": args.backends,
        "rewrite_percent": args.rewrite_percent,
        "key_size": KEY_SIZE,
        "value_size": VALUE_SIZE,
        "targets": {
            "upload_share_max": TARGET_UPLOAD_SHARE,
            "upload_ratio_max": TARGET_UPLOAD_RATIO,
            "upload_share_met": second.upload_share() < TARGET_UPLOAD_SHARE,
            "upload_ratio_met": second.ratio_incl_private().is_some_and(|r| r <= TARGET_UPLOAD_RATIO),
            "upload_ratio_sst_only_met": second.ratio_sst_only().is_some_and(|r| r <= TARGET_UPLOAD_RATIO),
        },
        "checkpoints": rounds.iter().map(figures_json).collect::<Vec<_>>(),
    });
    if let Some(steady) = steady_json {
        out["steady"] = steady;
    }
    println!("{out}");
    ExitCode::SUCCESS
}
