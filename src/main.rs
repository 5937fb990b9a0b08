//! The `ckptfs` command line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use ckptfs::backend::{scan_dir, BackendOptions, DEFAULT_FORMAT_VERSION};
use ckptfs::error::Error;
use ckptfs::names::BackendName;
use ckptfs::{fsck, percent, restore, workload, Engine, EngineConfig};

/// Incremental RocksDB checkpoints in a deduplicated, reference-counted store.
///
/// Exit codes: 0 success, 1 failure, 2 usage error.
#[derive(Parser)]
#[command(name = "ckptfs", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write checkpoint N of STORE to DEST/<operator>/<subtask>/, verifying every object.
    Restore {
        store: PathBuf,
        checkpoint: u64,
        /// Destination directory; must be missing or empty.
        dest: PathBuf,
    },
    /// Recount references, verify every object, list orphans, missing and corrupt objects.
    Fsck {
        store: PathBuf,
        /// Delete orphans and leftovers of interrupted checkpoints.
        #[arg(long)]
        repair: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the keys and values of a RocksDB directory (read-only), tab-separated and
    /// percent-encoded.
    Scan {
        dir: PathBuf,
        /// Print only the number of keys.
        #[arg(long)]
        count: bool,
    },
    /// Run the built-in workload against a store and checkpoint it (no mount needed).
    Workload {
        store: PathBuf,
        /// Local state directory (default STORE/state).
        #[arg(long)]
        state: Option<PathBuf>,
        /// Backend to host; may repeat (default Operator-1/0 and Operator-2/0).
        #[arg(long = "backend")]
        backends: Vec<BackendName>,
        /// Number of rounds, each followed by a checkpoint.
        #[arg(long, default_value_t = 5)]
        rounds: u64,
        /// Keys per backend.
        #[arg(long, default_value_t = 10_000)]
        keys: u32,
        /// Bytes per value.
        #[arg(long, default_value_t = 100)]
        value_size: usize,
        /// Retained checkpoints.
        #[arg(long)]
        retain: Option<u32>,
        /// Compact every Nth round (0: never).
        #[arg(long, default_value_t = 3)]
        compact_every: u64,
        /// SST format_version written by the backends.
        #[arg(long, default_value_t = DEFAULT_FORMAT_VERSION)]
        format_version: i32,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ckptfs: error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(command: Command) -> Result<ExitCode, Error> {
    match command {
        Command::Restore {
            store,
            checkpoint,
            dest,
        } => {
            let report = restore::restore_checkpoint(&store, checkpoint, &dest, |_| {})?;
            println!(
                "restored checkpoint {checkpoint}: {} backends, {} files, {} bytes into {}",
                report.backends,
                report.files,
                report.bytes,
                dest.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Fsck {
            store,
            repair,
            json,
        } => {
            let report = fsck::fsck(&store, repair, |_| {})?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("serializes")
                );
            } else {
                print_fsck(&report, repair);
            }
            Ok(if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Scan { dir, count } => {
            let pairs = scan_dir(&dir)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let io = |e| Error::io("write to stdout", e);
            if count {
                writeln!(out, "{}", pairs.len()).map_err(io)?;
            } else {
                for (k, v) in pairs {
                    writeln!(out, "{}\t{}", percent::encode(&k), percent::encode(&v))
                        .map_err(io)?;
                }
            }
            out.flush().map_err(io)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Workload {
            store,
            state,
            backends,
            rounds,
            keys,
            value_size,
            retain,
            compact_every,
            format_version,
        } => {
            let mut config = EngineConfig::new(store);
            config.state = state;
            config.backends = if backends.is_empty() {
                vec!["Operator-1/0".parse()?, "Operator-2/0".parse()?]
            } else {
                backends
            };
            config.retain = retain;
            config.backend_options = BackendOptions {
                format_version,
                ..BackendOptions::default()
            };
            let engine = Engine::open(config)?;
            for _ in 0..rounds {
                let round = workload::step(&engine, keys, value_size)?;
                if compact_every > 0 && round > 0 && round % compact_every == 0 {
                    for name in engine.backend_names() {
                        engine.compact(&name)?;
                    }
                }
                let manifest = engine.checkpoint()?;
                let s = &manifest.stats;
                println!(
                    "round {round}: checkpoint {} files={} reused={} bytes={} uploaded={}",
                    manifest.id, s.files_total, s.files_reused, s.bytes_total, s.bytes_uploaded
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_fsck(report: &fsck::FsckReport, repair: bool) {
    println!(
        "checkpoints: {} ({:?})",
        report.checkpoints.len(),
        report.checkpoints
    );
    println!(
        "objects: {} referenced ({} bytes), {} stored",
        report.objects_referenced, report.bytes_referenced, report.objects_stored
    );
    for id in &report.missing {
        println!("missing: {id}");
    }
    for id in &report.corrupt {
        println!("corrupt: {id}");
    }
    for id in &report.orphans {
        println!("orphan: {id}{}", if repair { " (deleted)" } else { "" });
    }
    if report.staged_leftovers > 0 {
        println!(
            "leftovers of interrupted checkpoints: {}{}",
            report.staged_leftovers,
            if repair { " (deleted)" } else { "" }
        );
    }
    if !report.damaged_checkpoints.is_empty() {
        println!(
            "damaged checkpoints (cannot be repaired; drop them or restore an older one): {:?}",
            report.damaged_checkpoints
        );
    }
    if report.is_clean() {
        println!("clean");
    } else if !repair && (!report.orphans.is_empty() || report.staged_leftovers > 0) {
        println!("run `ckptfs fsck --repair` to delete orphans and leftovers");
    }
}
