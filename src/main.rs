//! The `ckptfs` command line.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use ckptfs_core::backend::{scan_dir, BackendOptions, CheckpointMode, DEFAULT_FORMAT_VERSION};
use ckptfs_core::error::Error;
use ckptfs_core::names::BackendName;
use ckptfs_core::store::Location;
use ckptfs_core::{fsck, percent, restore, workload, Engine, EngineConfig};

/// Incremental RocksDB checkpoints in a deduplicated, reference-counted store.
///
/// Exit codes: 0 success, 1 failure, 2 usage error.
#[derive(Parser)]
#[command(name = "ckptfs", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// One value per process: the size of the largest variant (mount's options) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Host the backends, checkpoint them into STORE and show the checkpoints at MOUNTPOINT.
    ///
    /// STORE is a directory, or s3://BUCKET/PREFIX on S3-compatible object storage, which
    /// needs --state DIR; endpoint, region and credentials come from the AWS environment
    /// variables. Returns once the mount is ready, with the daemon in the background
    /// (logging to STORE/ckptfs.log, or DIR/ckptfs.log for object storage), unless
    /// --foreground is given.
    Mount {
        #[arg(value_parser = parse_location)]
        store: Location,
        mountpoint: PathBuf,
        /// Local state directory for the live RocksDB instances and the read cache
        /// (default STORE/state; required for object storage unless --read-only is given).
        #[arg(long)]
        state: Option<PathBuf>,
        /// Show the checkpoints of a store that another daemon writes (on another host):
        /// no backends, no lease, new checkpoints shown within seconds; rmdir and the
        /// control file answer EROFS. The cache goes to --state DIR (default
        /// ~/.cache/ckptfs/ro-HASH).
        #[arg(long, conflicts_with_all = ["backends", "retain", "restore", "interval"])]
        read_only: bool,
        /// Object storage: uploads (and parts of large ones) in flight at once; all uploads
        /// together hold at most this many 8 MiB parts in memory.
        #[arg(long, default_value_t = 8)]
        upload_concurrency: usize,
        /// Object storage: the size of the local cache of fetched objects, e.g. 512MiB or
        /// 4GiB (least recently used objects are evicted).
        #[arg(long, value_parser = parse_size, default_value = "4GiB")]
        cache_size: u64,
        /// Object storage: unreferenced objects younger than this are not deleted (an
        /// upload still in flight of a daemon that lost its lease, or of a failed
        /// checkpoint); older ones are, at start and every such period.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
        orphan_grace: std::time::Duration,
        /// Object storage: how long the writer's lease lasts unless renewed (renewed every
        /// third of it), 3s to 1h; another daemon takes the store over once it has expired
        /// by the store's clock, or at once if it was released or its holder died on this
        /// host.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
        lease_ttl: std::time::Duration,
        /// Object storage: how long to wait for the lease of another daemon to be released
        /// or to expire before giving up (0 fails at once).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        lease_wait: std::time::Duration,
        /// Backend to host, <operator>/<subtask>; may repeat. The store remembers its
        /// backends; a new store with none gets default/0.
        #[arg(long = "backend")]
        backends: Vec<BackendName>,
        /// Number of retained checkpoints (default: the store's setting, 3 for a new store).
        #[arg(long)]
        retain: Option<u32>,
        /// Checkpoints that may be in flight at once.
        #[arg(long, default_value_t = 1)]
        max_concurrent: usize,
        /// Take a checkpoint periodically, e.g. 30s or 5m (default: off).
        #[arg(long, value_parser = humantime::parse_duration)]
        interval: Option<std::time::Duration>,
        /// How often to merge runs of small SSTs (under 1 MiB, once a backend has 64 or
        /// more) that RocksDB would keep apart, e.g. with time-ordered keys, and at once
        /// after a checkpoint that finds 128 or more; 0 turns it off.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        small_file_compaction_interval: std::time::Duration,
        /// Start the backends from checkpoint N, discarding their local state.
        #[arg(long)]
        restore: Option<u64>,
        /// Stay attached and log to stderr.
        #[arg(long)]
        foreground: bool,
        /// Let other users in (with default_permissions).
        #[arg(long)]
        allow_other: bool,
        /// Log file of the background daemon (default STORE/ckptfs.log).
        #[arg(long)]
        log_file: Option<PathBuf>,
        /// Do not verify each stored object's checksum at its first open (faster first
        /// reads; a corrupt object is then served as it is).
        #[arg(long)]
        no_verify: bool,
        /// Further RocksDB options for the backends, in RocksDB's name=value;name=value
        /// syntax (e.g. target_file_size_base=8388608;max_bytes_for_level_base=33554432).
        #[arg(long)]
        rocksdb_options: Option<String>,
        /// SST format_version the backends write.
        #[arg(long, default_value_t = DEFAULT_FORMAT_VERSION)]
        format_version: i32,
        /// flush: a checkpoint flushes the memtables and stores the new SSTs. wal: no
        /// flush; a checkpoint stores the write-ahead log written since the backend's last
        /// materialization (chunks: about what was written), on top of that
        /// materialization's SSTs.
        #[arg(long, default_value_t = CheckpointMode::Flush)]
        checkpoint_mode: CheckpointMode,
        /// wal mode: a checkpoint materializes (adopts the current SSTs, storing the new
        /// ones) at least this often, e.g. 5m.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
        materialize_interval: std::time::Duration,
        /// wal mode: a checkpoint materializes once a backend's WAL since the last
        /// materialization reached this many MiB (what opening a checkpoint replays).
        #[arg(long, default_value_t = 256)]
        materialize_wal_mib: u64,
        /// Serve the metrics (the text of .ckptfs/metrics, for Prometheus) over HTTP at
        /// http://ADDR/metrics, ADDR being IP:PORT, e.g. 127.0.0.1:9100 (default: off;
        /// the file is always there).
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<std::net::SocketAddr>,
    },
    /// Unmount MOUNTPOINT and wait until its daemon has stopped.
    Umount {
        mountpoint: PathBuf,
        /// Seconds to wait for the daemon to finish in-flight checkpoints.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Take a checkpoint of every backend, wait for it, print its id.
    ///
    /// While other checkpoints hold every slot of the mount's --max-concurrent, the daemon
    /// answers busy; this command retries until --wait seconds have passed.
    Checkpoint {
        mountpoint: PathBuf,
        /// Seconds to keep retrying while the daemon is busy (0: fail at once).
        #[arg(long, default_value_t = 600)]
        wait: u64,
        /// Print the whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the retained checkpoints.
    Ls {
        /// A mountpoint, or a store (a directory or s3://BUCKET/PREFIX) read directly.
        mountpoint: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Drop checkpoint N (as rmdir MOUNTPOINT/cp-N does).
    Rm {
        mountpoint: PathBuf,
        checkpoint: u64,
    },
    /// Show the daemon's state: backends, checkpoints, in flight, retain, last error.
    Status {
        /// A mountpoint, or a store (a directory or s3://BUCKET/PREFIX) read directly.
        mountpoint: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Write KEY=VALUE into a backend.
    Put {
        mountpoint: PathBuf,
        backend: BackendName,
        key: std::ffi::OsString,
        value: std::ffi::OsString,
    },
    /// Delete KEY from a backend.
    Del {
        mountpoint: PathBuf,
        backend: BackendName,
        key: std::ffi::OsString,
    },
    /// Load tab-separated, percent-encoded KEY<TAB>VALUE lines (as `scan` prints them) from
    /// FILE or stdin into a backend, in atomic batches.
    Load {
        mountpoint: PathBuf,
        backend: BackendName,
        file: Option<PathBuf>,
    },
    /// Write checkpoint N of STORE to DEST/<operator>/<subtask>/, verifying every object.
    Restore {
        /// A store directory or s3://BUCKET/PREFIX.
        #[arg(value_parser = parse_location)]
        store: Location,
        checkpoint: u64,
        /// Destination directory; must be missing or empty.
        dest: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Draw the checkpoints and the stored objects they reference, with reference counts.
    Graph {
        /// A mountpoint, or a store (a directory or s3://BUCKET/PREFIX).
        path: PathBuf,
        /// dot (Graphviz source) or svg (needs Graphviz `dot`); default svg when `dot` is
        /// installed, dot otherwise.
        #[arg(long, value_parser = ["dot", "svg"])]
        format: Option<String>,
    },
    /// Recount references, verify every object, list orphans, missing and corrupt objects.
    Fsck {
        /// A store directory or s3://BUCKET/PREFIX (takes the store's lease).
        #[arg(value_parser = parse_location)]
        store: Location,
        /// Quarantine unreadable manifests, delete orphans and leftovers of interrupted
        /// checkpoints, store missing or corrupt objects again from identical copies in
        /// STORE/state and in each --from directory.
        #[arg(long)]
        repair: bool,
        /// A directory to search for copies of damaged objects (a restored checkpoint, a
        /// backup, a state directory elsewhere); may repeat.
        #[arg(long = "from")]
        from: Vec<PathBuf>,
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
        /// Every Nth round, after its checkpoint, roll the backends back to the checkpoint
        /// before it (0: never).
        #[arg(long, default_value_t = 0)]
        restore_every: u64,
        /// SST format_version written by the backends.
        #[arg(long, default_value_t = DEFAULT_FORMAT_VERSION)]
        format_version: i32,
        /// Further RocksDB options for the backends (name=value;name=value).
        #[arg(long)]
        rocksdb_options: Option<String>,
        /// flush or wal (see mount).
        #[arg(long, default_value_t = CheckpointMode::Flush)]
        checkpoint_mode: CheckpointMode,
    },
}

/// The effective command line (after mount-helper translation), for re-running as daemon.
static ARGS: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

fn main() -> ExitCode {
    #[cfg(feature = "failpoints")]
    let _failpoints = ckptfs_core::failpoint::setup();
    // Invoked by mount(8) as mount.fuse.ckptfs (or mount.ckptfs): translate its arguments.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let invoked_as = Path::new(&argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let args: Vec<std::ffi::OsString> = if invoked_as.starts_with("mount.") {
        let command = <Cli as clap::CommandFactory>::command();
        let mount = command
            .find_subcommand("mount")
            .expect("the mount subcommand");
        match client::mount_helper_args(std::env::args().skip(1).collect(), mount) {
            Ok(args) => args.into_iter().map(Into::into).collect(),
            Err(e) => {
                eprintln!("{invoked_as}: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        std::env::args_os().collect()
    };
    let cli = Cli::parse_from(&args);
    ARGS.set(args).expect("set once");
    let default_level = if matches!(cli.command, Command::Mount { .. }) {
        "info"
    } else {
        "warn"
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        .init();
    match run(cli.command) {
        Ok(code) => code,
        // `ckptfs scan DIR | head` is not an error.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ckptfs: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// The default state directory of a read-only mount: its own cache per store and
/// mountpoint, under ~/.cache/ckptfs.
fn read_only_state(store: &Location, mountpoint: &Path) -> Result<PathBuf, Error> {
    let mountpoint =
        std::path::absolute(mountpoint).map_err(|e| Error::io("resolve mountpoint", e))?;
    let key = format!("{store}\0{}", mountpoint.display());
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Ok(PathBuf::from(home).join(".cache/ckptfs").join(format!(
        "ro-{}",
        &blake3::hash(key.as_bytes()).to_hex()[..16]
    )))
}

fn parse_location(arg: &str) -> Result<Location, String> {
    Location::parse(arg).map_err(|e| e.to_string())
}

/// A size in bytes: a number with an optional unit (KiB, MiB, GiB, TiB; K, M, G, T).
fn parse_size(arg: &str) -> Result<u64, String> {
    let arg = arg.trim();
    let split = arg.find(|c: char| !c.is_ascii_digit()).unwrap_or(arg.len());
    let (digits, unit) = arg.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{arg:?} is not a size (e.g. 512MiB, 4GiB)"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        other => return Err(format!("unknown size unit {other:?} (KiB, MiB, GiB, TiB)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{arg:?} is too large"))
}

fn run(command: Command) -> Result<ExitCode, Error> {
    match command {
        Command::Mount {
            store,
            mountpoint,
            state,
            read_only,
            upload_concurrency,
            cache_size,
            orphan_grace,
            lease_ttl,
            lease_wait,
            backends,
            retain,
            max_concurrent,
            interval,
            small_file_compaction_interval,
            restore,
            foreground,
            allow_other,
            log_file,
            no_verify,
            rocksdb_options,
            format_version,
            checkpoint_mode,
            materialize_interval,
            materialize_wal_mib,
            metrics_listen,
        } => {
            let backend_options = BackendOptions {
                format_version,
                rocksdb_options,
                checkpoint_mode,
                ..BackendOptions::default()
            };
            // Refuse bad options before anything is created or started.
            backend_options.validate()?;
            ckptfs_core::lease::validate_ttl(lease_ttl)
                .map_err(|e| Error::Invalid(format!("--lease-ttl: {e}")))?;
            if orphan_grace < lease_ttl {
                return Err(Error::Invalid(format!(
                    "--orphan-grace {} is shorter than the lease time {}: an upload of a \
                     daemon that has just lost its lease may still land that long after",
                    humantime::format_duration(orphan_grace),
                    humantime::format_duration(lease_ttl)
                )));
            }
            if let Some(addr) = metrics_listen {
                // Free to bind? Asked here, before the daemon creates anything (the daemon
                // binds it again before it opens the store).
                drop(ckptfs::metrics_http::bind(addr)?);
            }
            let state = match state {
                None if read_only => Some(read_only_state(&store, &mountpoint)?),
                state => state,
            };
            if !foreground {
                let args = ARGS.get().map(|a| &a[1..]).unwrap_or_default();
                return client::daemonize(
                    &store,
                    state.as_deref(),
                    read_only,
                    log_file.as_deref(),
                    args,
                );
            }
            // Absolute paths: the daemon's log, status and fsname stay meaningful.
            let store = match store {
                Location::Local(path) => Location::Local(
                    std::path::absolute(&path).map_err(|e| Error::io("resolve store path", e))?,
                ),
                remote => remote,
            };
            let mountpoint =
                std::path::absolute(&mountpoint).map_err(|e| Error::io("resolve mountpoint", e))?;
            // The daemon changes to / (nothing kept busy): every path must be absolute.
            let state = state
                .map(std::path::absolute)
                .transpose()
                .map_err(|e| Error::io("resolve state path", e))?;
            let mut engine = EngineConfig::new(store);
            engine.state = state;
            engine.s3 = ckptfs_core::store::s3::S3Options {
                upload_concurrency: upload_concurrency.max(1),
                cache_size,
            };
            engine.orphan_grace = orphan_grace;
            engine.lease_ttl = lease_ttl;
            engine.lease_wait = lease_wait;
            engine.backends = backends;
            engine.retain = retain;
            engine.max_concurrent = max_concurrent;
            engine.restore_from = restore;
            engine.backend_options = backend_options;
            engine.materialize = ckptfs_core::MaterializePolicy {
                interval: materialize_interval,
                wal_bytes: materialize_wal_mib.saturating_mul(1 << 20),
                ..ckptfs_core::MaterializePolicy::default()
            };
            let config = ckptfs::daemon::MountConfig {
                engine,
                mountpoint,
                interval,
                small_file_compaction: Some(small_file_compaction_interval)
                    .filter(|d| !d.is_zero()),
                allow_other,
                threads: 4,
                verify: !no_verify,
                read_only,
                metrics_listen,
            };
            ckptfs_core::lease::on_wait(client::notify_note);
            ckptfs::daemon::serve(config, client::notify_ready)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Umount {
            mountpoint,
            timeout,
        } => client::umount(&mountpoint, timeout),
        Command::Checkpoint {
            mountpoint,
            wait,
            json,
        } => {
            let spinner = client::spinner("checkpoint in progress");
            let answer = client::request_retrying_busy(
                &mountpoint,
                "checkpoint",
                std::time::Duration::from_secs(wait),
            );
            spinner.finish_and_clear();
            let answer = answer?;
            if json {
                println!("{answer}");
            } else {
                println!("{}", answer["id"]);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ls { mountpoint, json } => client::ls(&mountpoint, json),
        Command::Rm {
            mountpoint,
            checkpoint,
        } => {
            let dir = mountpoint.join(format!("cp-{checkpoint}"));
            std::fs::remove_dir(&dir)
                .map_err(|e| Error::io(format!("drop {}", dir.display()), e))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { mountpoint, json } => client::status(&mountpoint, json),
        Command::Put {
            mountpoint,
            backend,
            key,
            value,
        } => {
            use std::os::unix::ffi::OsStrExt;
            let line = format!(
                "put {backend} {} {}",
                percent::encode(key.as_bytes()),
                percent::encode(value.as_bytes())
            );
            client::request(&mountpoint, &line)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Del {
            mountpoint,
            backend,
            key,
        } => {
            use std::os::unix::ffi::OsStrExt;
            client::request(
                &mountpoint,
                &format!("del {backend} {}", percent::encode(key.as_bytes())),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Load {
            mountpoint,
            backend,
            file,
        } => client::load(&mountpoint, &backend, file.as_deref()),
        Command::Restore {
            store,
            checkpoint,
            dest,
            json,
        } => {
            let total = restore::checkpoint_bytes(&store, checkpoint).unwrap_or(0);
            let bar = client::progress_bar(total, "restoring");
            let report = restore::restore_checkpoint(&store, checkpoint, &dest, |n| bar.inc(n))?;
            bar.finish_and_clear();
            if json {
                println!("{}", serde_json::to_string(&report).expect("json"));
            } else {
                println!(
                    "restored checkpoint {checkpoint}: {} backends, {} files, {} bytes into {}",
                    report.backends,
                    report.files,
                    report.bytes,
                    dest.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Graph { path, format } => client::graph(&path, format.as_deref()),
        Command::Fsck {
            store,
            repair,
            from,
            json,
        } => {
            let bar =
                client::progress_bar(store.local().map_or(0, client::store_bytes), "verifying");
            let report = fsck::fsck_with_copies(&store, repair, &from, |n| bar.inc(n))?;
            bar.finish_and_clear();
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
            restore_every,
            format_version,
            rocksdb_options,
            checkpoint_mode,
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
                rocksdb_options,
                checkpoint_mode,
                ..BackendOptions::default()
            };
            let engine = Engine::open(config)?;
            for _ in 0..rounds {
                let rounds = workload::step_each(&engine, keys, value_size)?;
                let round = rounds.iter().map(|(_, r)| *r).max().unwrap_or(0);
                if compact_every > 0 && round > 0 && round % compact_every == 0 {
                    for name in engine.backend_names() {
                        engine.compact(&name)?;
                    }
                }
                let manifest = engine.checkpoint()?;
                let s = &manifest.stats;
                println!(
                    "round {round}: checkpoint {} files={} reused={} bytes={} uploaded={} \
                     rounds={}",
                    manifest.id,
                    s.files_total,
                    s.files_reused,
                    s.bytes_total,
                    s.bytes_uploaded,
                    rounds
                        .iter()
                        .map(|(b, r)| format!("{b}:{r}"))
                        .collect::<Vec<_>>()
                        .join(",")
                );
                if restore_every > 0 && round > 0 && round % restore_every == 0 {
                    let ids: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
                    if let Some(&back) = ids.iter().rev().nth(1) {
                        engine.restore_backends(back)?;
                        println!("restored checkpoint {back}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

mod client;

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
    for line in &report.repaired_objects {
        println!("repaired: {line}");
    }
    for line in &report.unreadable_manifests {
        println!("unreadable manifest: {line}");
    }
    for path in &report.quarantined {
        println!("quarantined: {path} (its objects are kept)");
    }
    for id in &report.corrupt {
        println!("corrupt: {id}");
    }
    for line in &report.problems {
        println!("problem: {line}");
    }
    let deleted = repair && report.orphans_kept.is_none();
    for id in &report.orphans {
        let young = report.orphans_young.contains(id);
        let what = match (deleted, young) {
            (_, true) => " (younger than the grace period of an hour: kept)",
            (true, false) => " (deleted)",
            (false, false) => "",
        };
        println!("orphan: {id}{what}");
    }
    if let (Some(why), false) = (&report.orphans_kept, report.orphans.is_empty()) {
        println!("orphans are kept, not deleted: {why}");
    }
    if report.staged_leftovers > 0 {
        println!(
            "leftovers of interrupted checkpoints: {}{}",
            report.staged_leftovers,
            if repair { " (deleted)" } else { "" }
        );
    }
    if !report.damaged_checkpoints.is_empty() && !report.is_clean() {
        println!(
            "damaged checkpoints (no intact copy found; drop them, restore an older one, or \
             give a directory with copies to --repair --from): {:?}",
            report.damaged_checkpoints
        );
    }
    if report.is_clean() {
        println!("clean");
    } else if !repair && !report.unreadable_manifests.is_empty() {
        println!(
            "run `ckptfs fsck --repair` to move unreadable manifests to quarantine/ \
             (nothing is deleted; their checkpoints are no longer shown)"
        );
    } else if !repair && (!report.orphans.is_empty() || report.staged_leftovers > 0) {
        println!("run `ckptfs fsck --repair` to delete orphans and leftovers");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn helper(options: &str) -> Result<Vec<String>, String> {
        let command = Cli::command();
        let mount = command.find_subcommand("mount").unwrap();
        client::mount_helper_args(
            vec![
                "s3://bkt/p".into(),
                "/mnt/x".into(),
                "-o".into(),
                options.into(),
            ],
            mount,
        )
    }

    /// Every long option of `ckptfs mount` has its `-o` twin for fstab and `mount -t
    /// fuse.ckptfs` (with `_` for `-`), so no option can be left out of the list again.
    #[test]
    fn every_mount_option_has_its_fstab_twin() {
        let command = Cli::command();
        let mount = command.find_subcommand("mount").unwrap();
        let mut seen = 0;
        for arg in mount.get_arguments() {
            let Some(long) = arg.get_long().filter(|l| *l != "help") else {
                continue;
            };
            let key = long.replace('-', "_");
            let (option, expected) = if arg.get_action().takes_values() {
                (
                    format!("{key}=V"),
                    vec![format!("--{long}"), "V".to_string()],
                )
            } else {
                (key.clone(), vec![format!("--{long}")])
            };
            let out = helper(&option).unwrap_or_else(|e| panic!("-o {option}: {e}"));
            assert_eq!(out[4..], expected[..], "-o {option}");
            seen += 1;
        }
        assert!(seen > 20, "only {seen} options");
    }

    /// What the helper makes of an fstab line is a command line clap accepts; generic
    /// options are ignored, unknown ones and misused ones refused.
    #[test]
    fn fstab_options_parse_as_a_mount_command() {
        let out = helper(
            "state=/var/lib/ckptfs,backend=Op/0,backend=Op/1,lease_ttl=10s,lease-wait=20s,\
             orphan_grace=1h,upload_concurrency=4,allow_other,_netdev,noauto,rw",
        )
        .unwrap();
        let cli = Cli::try_parse_from(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
        let Command::Mount {
            lease_ttl,
            lease_wait,
            allow_other,
            backends,
            upload_concurrency,
            ..
        } = cli.command
        else {
            panic!("not a mount: {out:?}");
        };
        assert_eq!(lease_ttl, std::time::Duration::from_secs(10));
        assert_eq!(lease_wait, std::time::Duration::from_secs(20));
        assert!(allow_other);
        assert_eq!(backends.len(), 2);
        assert_eq!(upload_concurrency, 4);
        // A read-only view from fstab; clap's rules hold (no backends with read_only).
        let view = helper("read_only,cache_size=1GiB").unwrap();
        assert!(matches!(
            Cli::try_parse_from(&view).unwrap().command,
            Command::Mount {
                read_only: true,
                ..
            }
        ));
        let both = helper("read_only,backend=Op/0").unwrap();
        assert!(Cli::try_parse_from(&both).is_err());
        assert!(helper("no_such_option=1").unwrap_err().contains("unknown"));
        assert!(helper("retain").unwrap_err().contains("needs a value"));
        assert!(helper("read_only=yes")
            .unwrap_err()
            .contains("takes no value"));
    }
}
