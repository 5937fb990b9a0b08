//! The command line's definition: every subcommand and option as clap types, from which
//! `--help`, the man page's test and the fstab/`mount -t` option translation
//! ([`fstab`]) all read. `ckptfs mount`'s options are one struct,
//! [`MountArgs`], checked and turned into the daemon's configuration here.

pub(crate) mod fstab;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use ckptfs::daemon::MountConfig;
use ckptfs_core::backend::{BackendOptions, CheckpointMode, DEFAULT_FORMAT_VERSION};
use ckptfs_core::error::Error;
use ckptfs_core::names::BackendName;
use ckptfs_core::policy::{ByTime, Policy};
use ckptfs_core::store::Location;
use ckptfs_core::{EngineConfig, MaterializePolicy};

/// Incremental RocksDB checkpoints in a deduplicated, reference-counted store.
///
/// Exit codes: 0 success, 1 failure, 2 usage error.
#[derive(Parser)]
#[command(name = "ckptfs", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

// One value per process: the size of the largest variant (mount's options) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum Command {
    /// Host the backends, checkpoint them into STORE and show the checkpoints at MOUNTPOINT.
    ///
    /// STORE is a directory, or s3://BUCKET/PREFIX on S3-compatible object storage, which
    /// needs --state DIR; endpoint, region and credentials come from the AWS environment
    /// variables. Returns once the mount is ready, with the daemon in the background
    /// (logging to STORE/ckptfs.log, or DIR/ckptfs.log for object storage), unless
    /// --foreground is given.
    Mount(MountArgs),
    /// Host the backends and checkpoint them into STORE, as mount does, without a tree:
    /// no FUSE, no root needed.
    ///
    /// Runs in the foreground, logging to stderr, until SIGTERM or SIGINT (in-flight
    /// checkpoints finish first). Commands reach it by the store: `ckptfs checkpoint
    /// STORE` and the others talk to it through the Unix socket ctl.sock in its state
    /// directory (STORE/state, or the DIR of --state DIR), which only the daemon's user
    /// and root may use; it speaks the line protocol of a mount's .ckptfs/ctl, and a
    /// mount's daemon listens there too. Under systemd (NOTIFY_SOCKET) it says READY=1
    /// once it serves.
    Serve(ServeArgs),
    /// Unmount MOUNTPOINT and wait until its daemon has stopped.
    Umount(UmountArgs),
    /// Take a checkpoint of every backend, wait for it, print its id.
    ///
    /// While other checkpoints hold every slot of the mount's --max-concurrent, the daemon
    /// answers busy; this command retries until --wait seconds have passed.
    Checkpoint(CheckpointArgs),
    /// Import RocksDB checkpoint directories as one new checkpoint, print its id.
    ///
    /// Each DIR (a directory made by RocksDB's Checkpoint API, e.g. `ldb checkpoint`, or a
    /// closed database) becomes the state of BACKEND, an external backend: never hosted,
    /// carried over unchanged by later checkpoints until imported again. Every other
    /// backend of the store is carried over too. SSTs whose device, inode, size and mtime
    /// are those of the backend's previous import are not read again. TARGET is a
    /// mountpoint or a store a daemon holds (its daemon imports; a store's through the
    /// socket in its state directory), or else a store written directly: a store
    /// directory, a path that does not exist yet (a new store), or s3://BUCKET/PREFIX,
    /// which needs --state DIR.
    Import(ImportArgs),
    /// Import the completed checkpoints of Flink jobs that the store does not hold yet.
    ///
    /// SRC is one job's checkpoint directory (`<execution.checkpointing.dir>/<job-id>/`, or
    /// a copy of it) or a checkpoint root (execution.checkpointing.dir) holding any number
    /// of jobs, such as a job and the ones restarted from its checkpoints: a directory, a
    /// file:// URL or s3://BUCKET/PREFIX (configured from the AWS environment, as for
    /// stores). Job by job in the order they began (the _metadata time of each one's oldest
    /// checkpoint), each job's oldest first, each completed Flink checkpoint (a chk-N with
    /// _metadata) newer than the newest the store holds of its job becomes one ckptfs
    /// checkpoint, labelled with the job and checkpoint id, in which every subtask with
    /// RocksDB incremental keyed state is an external backend OPERATOR/SUBTASK (the
    /// operator's uid, or its 32-hex id) holding that subtask's RocksDB files under their
    /// original names and Flink's meta data of it (FLINK-KEYED-META); the backend _flink/0
    /// keeps the checkpoint's _metadata and its other files (operator state), which
    /// export-flink needs. An operator the job no longer has is not carried over. Prints
    /// the ids. TARGET is a mountpoint or a store, as for import (a daemon that holds it
    /// imports); importing twice imports nothing new.
    ImportFlink(ImportFlinkArgs),
    /// What Flink left behind in its checkpoint directory, and what is safe to delete.
    ///
    /// SRC is Flink's execution.checkpointing.dir (every job in it: a job restored in CLAIM
    /// mode names another job's files) or one job's directory, local or s3://BUCKET/PREFIX.
    /// Garbage: a file below a job's chk-N/, shared/ or taskowned/ that no completed
    /// checkpoint names, outside every completed checkpoint's directory, and written more
    /// than --grace before the scan (a checkpoint in flight uploads before its _metadata
    /// exists). Completed checkpoints older than the newest --num-retained of their job
    /// are listed apart. A dry run unless --delete. Any _metadata that cannot be parsed
    /// refuses the whole run.
    FlinkGc(FlinkGcArgs),
    /// Give checkpoint N, imported from Flink, back to Flink.
    ///
    /// Writes DEST/<job-id>/chk-<flink-checkpoint>/ with its _metadata (Flink's own, with
    /// every file named relative to that directory: relocatable, it restores wherever it
    /// is moved or copied) and the files (under DEST/<job-id>/shared/), then prints that
    /// directory's path: give it to Flink as execution.state-recovery.path. DEST is a
    /// directory, missing or empty, or s3://BUCKET/PREFIX holding no object (each file
    /// streams from the store into its upload: from a local store or a mount nothing is
    /// written to a local disk; _metadata last). A failed export leaves nothing.
    /// TARGET is a mountpoint or a store (a directory or s3://BUCKET/PREFIX, read
    /// directly).
    ExportFlink(ExportFlinkArgs),
    /// List the retained checkpoints.
    Ls(LsArgs),
    /// Show, change or apply the retention policy: for each retained checkpoint, newest
    /// first, the rules that keep it, or that it is dropped.
    ///
    /// With --keep-* rules, they become the store's whole policy (a rule not given is
    /// off), applied at once and after every checkpoint from then on; without, the
    /// store's policy is shown and applied. With --dry-run nothing changes.
    Forget(ForgetArgs),
    /// Pin checkpoint N as NAME: no retention policy drops it, and rmdir and rm refuse it
    /// (EBUSY) until it is unpinned. The mount shows it as pinned/NAME -> ../cp-N. A NAME
    /// already pinned moves to N.
    Pin(PinArgs),
    /// Remove pin NAME; its checkpoint is left to the retention policy, which applies at
    /// once.
    Unpin(UnpinArgs),
    /// Drop checkpoint N (as rmdir MOUNTPOINT/cp-N does); the newest only with --force.
    Rm(RmArgs),
    /// Show the daemon's state: backends, checkpoints, in flight, retain, last error.
    Status(StatusArgs),
    /// Write KEY=VALUE into a backend.
    Put(PutArgs),
    /// Delete KEY from a backend.
    Del(DelArgs),
    /// Load tab-separated, percent-encoded KEY<TAB>VALUE lines (as `scan` prints them) from
    /// FILE or stdin into a backend, in atomic batches.
    Load(LoadArgs),
    /// Write checkpoint N of STORE to DEST/<operator>/<subtask>/, verifying every object.
    Restore(RestoreArgs),
    /// Draw the checkpoints and the stored objects they reference, with reference counts.
    Graph(GraphArgs),
    /// Show each retained checkpoint's files and bytes per backend, and the bytes of its
    /// objects new to it, shared with an earlier checkpoint, or exclusive to it.
    Du(DuArgs),
    /// Show what changed from checkpoint A to checkpoint B: per backend and state the files
    /// added, removed and changed (same name, other content) with their bytes, from the
    /// manifests; with --keys, the keys added, removed and changed per column family.
    Diff(DiffArgs),
    /// Recount references, verify every object, list orphans, missing and corrupt objects.
    Fsck(FsckArgs),
    /// Print the keys and values of a RocksDB directory (read-only), tab-separated and
    /// percent-encoded.
    Scan(ScanArgs),
    /// Run the built-in workload against a store and checkpoint it (no mount needed).
    Workload(WorkloadArgs),
    /// Print the completion script of SHELL for ckptfs, e.g.
    /// `ckptfs completions bash > /etc/bash_completion.d/ckptfs`.
    Completions(CompletionsArgs),
}

/// `ckptfs umount`'s arguments.
#[derive(clap::Args)]
pub(crate) struct UmountArgs {
    /// The mountpoint of a running ckptfs daemon.
    pub(crate) mountpoint: PathBuf,
    /// Seconds to wait for the daemon to finish in-flight checkpoints.
    #[arg(long, default_value_t = 300)]
    pub(crate) timeout: u64,
}

/// `ckptfs checkpoint`'s arguments.
#[derive(clap::Args)]
pub(crate) struct CheckpointArgs {
    /// A mountpoint, or a store a running daemon holds (mount or serve: through the
    /// socket in its state directory).
    pub(crate) mountpoint: PathBuf,
    /// Seconds to keep retrying while the daemon is busy (0: fail at once).
    #[arg(long, default_value_t = 600)]
    pub(crate) wait: u64,
    /// Print the whole answer as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs import`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ImportArgs {
    /// A mountpoint or a store: its daemon's, when one holds it; else written directly.
    pub(crate) target: PathBuf,
    /// BACKEND=DIR: the backend (OPERATOR/SUBTASK) and its RocksDB checkpoint directory.
    #[arg(required = true, value_name = "BACKEND=DIR", value_parser = parse_import)]
    pub(crate) imports: Vec<(BackendName, PathBuf)>,
    /// A store on object storage: the local state directory.
    #[arg(long)]
    pub(crate) state: Option<PathBuf>,
    /// Seconds to keep retrying while the daemon is busy (0: fail at once).
    #[arg(long, default_value_t = 600)]
    pub(crate) wait: u64,
    /// Print the whole answer as JSON (with what each import read and stored).
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs import-flink`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ImportFlinkArgs {
    /// The Flink job's checkpoint directory, or the checkpoint root of its jobs.
    pub(crate) src: PathBuf,
    /// A mountpoint or a store: its daemon's, when one holds it; else written directly.
    pub(crate) target: PathBuf,
    /// A store on object storage: the local state directory.
    #[arg(long)]
    pub(crate) state: Option<PathBuf>,
    /// Also read the files below DIR that the checkpoints name (a job restored in CLAIM
    /// mode names the files of the job it was restored from: needed only when that
    /// job's directory is not below SRC); files outside SRC and these roots are
    /// refused. Repeatable.
    #[arg(long = "source-root", value_name = "DIR")]
    pub(crate) source_roots: Vec<PathBuf>,
    /// Print one JSON answer per imported checkpoint, as import --json does.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs export-flink`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ExportFlinkArgs {
    /// A mountpoint, or a store read directly.
    pub(crate) target: PathBuf,
    /// The ckptfs checkpoint's id (N of cp-N).
    pub(crate) checkpoint: u64,
    /// Destination: a directory (missing or empty), or s3://BUCKET/PREFIX (no object).
    pub(crate) dest: PathBuf,
    /// Print what was written as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs ls`'s arguments.
#[derive(clap::Args)]
pub(crate) struct LsArgs {
    /// A mountpoint, or a store (a directory or s3://BUCKET/PREFIX) read directly.
    pub(crate) mountpoint: PathBuf,
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs pin`'s arguments.
#[derive(clap::Args)]
pub(crate) struct PinArgs {
    /// A mountpoint or a store: its daemon's, when one holds it; else written directly.
    pub(crate) target: PathBuf,
    /// The checkpoint's id (N of cp-N).
    pub(crate) checkpoint: u64,
    /// 1 to 64 of A-Z a-z 0-9 . _ -, not starting with a dot.
    pub(crate) name: String,
    /// A store on object storage: the local state directory.
    #[arg(long)]
    pub(crate) state: Option<PathBuf>,
}

/// `ckptfs unpin`'s arguments.
#[derive(clap::Args)]
pub(crate) struct UnpinArgs {
    /// A mountpoint or a store: its daemon's, when one holds it; else written directly.
    pub(crate) target: PathBuf,
    /// The pin's name.
    pub(crate) name: String,
    /// A store on object storage: the local state directory.
    #[arg(long)]
    pub(crate) state: Option<PathBuf>,
}

/// `ckptfs rm`'s arguments.
#[derive(clap::Args)]
pub(crate) struct RmArgs {
    /// A mountpoint, or a store a running daemon holds (mount or serve: through the
    /// socket in its state directory).
    pub(crate) mountpoint: PathBuf,
    /// The checkpoint's id (N of cp-N).
    pub(crate) checkpoint: u64,
    /// Drop it even if it is the newest checkpoint, which rmdir refuses: latest moves
    /// back to the one before (the control line `delete N`).
    #[arg(long)]
    pub(crate) force: bool,
}

/// `ckptfs status`'s arguments.
#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    /// A mountpoint, or a store (a directory or s3://BUCKET/PREFIX) read directly.
    pub(crate) mountpoint: PathBuf,
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs put`'s arguments.
#[derive(clap::Args)]
pub(crate) struct PutArgs {
    /// A mountpoint, or a store a running daemon holds (mount or serve: through the
    /// socket in its state directory).
    pub(crate) mountpoint: PathBuf,
    /// The backend, <operator>/<subtask>.
    pub(crate) backend: BackendName,
    /// The key (bytes as given).
    pub(crate) key: std::ffi::OsString,
    /// The value (bytes as given).
    pub(crate) value: std::ffi::OsString,
}

/// `ckptfs del`'s arguments.
#[derive(clap::Args)]
pub(crate) struct DelArgs {
    /// A mountpoint, or a store a running daemon holds (mount or serve: through the
    /// socket in its state directory).
    pub(crate) mountpoint: PathBuf,
    /// The backend, <operator>/<subtask>.
    pub(crate) backend: BackendName,
    /// The key (bytes as given).
    pub(crate) key: std::ffi::OsString,
}

/// `ckptfs load`'s arguments.
#[derive(clap::Args)]
pub(crate) struct LoadArgs {
    /// A mountpoint, or a store a running daemon holds (mount or serve: through the
    /// socket in its state directory).
    pub(crate) mountpoint: PathBuf,
    /// The backend, <operator>/<subtask>.
    pub(crate) backend: BackendName,
    /// The lines to load (default: stdin).
    pub(crate) file: Option<PathBuf>,
}

/// `ckptfs restore`'s arguments.
#[derive(clap::Args)]
pub(crate) struct RestoreArgs {
    /// A store directory or s3://BUCKET/PREFIX.
    #[arg(value_parser = parse_location)]
    pub(crate) store: Location,
    /// The checkpoint's id (N of cp-N).
    pub(crate) checkpoint: u64,
    /// Destination directory; must be missing or empty.
    pub(crate) dest: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs graph`'s arguments.
#[derive(clap::Args)]
pub(crate) struct GraphArgs {
    /// A mountpoint, or a store (a directory or s3://BUCKET/PREFIX).
    pub(crate) path: PathBuf,
    /// dot (Graphviz source) or svg (needs Graphviz `dot`); default svg when `dot` is
    /// installed, dot otherwise.
    #[arg(long, value_parser = ["dot", "svg"])]
    pub(crate) format: Option<String>,
}

/// `ckptfs du`'s arguments.
#[derive(clap::Args)]
pub(crate) struct DuArgs {
    /// A mountpoint, or a store (a directory or s3://BUCKET/PREFIX).
    pub(crate) path: PathBuf,
    /// Only checkpoint ID (still counted against all the retained ones).
    pub(crate) id: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Each operator's and state's figures over the retained checkpoints, oldest to
    /// newest: one row per checkpoint, one column per operator and state.
    #[arg(long, conflicts_with = "id")]
    pub(crate) history: bool,
    /// Draw the history to FILE as SVG (stacked: each checkpoint's bytes new and
    /// shared; each operator's states' bytes); prints nothing else unless --history.
    #[arg(long, value_name = "FILE", conflicts_with = "id")]
    pub(crate) svg: Option<PathBuf>,
}

/// `ckptfs diff`'s arguments.
#[derive(clap::Args)]
pub(crate) struct DiffArgs {
    /// A mountpoint, or a store (a directory or s3://BUCKET/PREFIX).
    pub(crate) path: PathBuf,
    /// The checkpoint compared from.
    pub(crate) a: u64,
    /// The checkpoint compared to (may be older than A, or A itself).
    pub(crate) b: u64,
    /// Print the report as one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also compare keys: write both checkpoints' differing backends out to a private
    /// directory under $TMPDIR and iterate them with RocksDB (read-only).
    #[arg(long)]
    pub(crate) keys: bool,
    /// With --keys, list at most N changed keys per backend and column family (the
    /// counts are always exact).
    #[arg(long, requires = "keys", value_name = "N", default_value_t = ckptfs_core::commands::diff::keys::DEFAULT_LIMIT)]
    pub(crate) limit: usize,
}

/// `ckptfs fsck`'s arguments.
#[derive(clap::Args)]
pub(crate) struct FsckArgs {
    /// A store directory or s3://BUCKET/PREFIX (takes the store's lease).
    #[arg(value_parser = parse_location)]
    pub(crate) store: Location,
    /// Quarantine unreadable manifests, delete orphans and leftovers of interrupted
    /// checkpoints, store missing or corrupt objects again from identical copies in
    /// STORE/state and in each --from directory.
    #[arg(long)]
    pub(crate) repair: bool,
    /// A directory to search for copies of damaged objects (a restored checkpoint, a
    /// backup, a state directory elsewhere); may repeat.
    #[arg(long = "from")]
    pub(crate) from: Vec<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs scan`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ScanArgs {
    /// A RocksDB directory (a checkpoint copied out, a restored backend).
    pub(crate) dir: PathBuf,
    /// Print only the number of keys.
    #[arg(long)]
    pub(crate) count: bool,
}

/// `ckptfs completions`'s arguments.
#[derive(clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    pub(crate) shell: clap_complete::Shell,
}

/// An IP:PORT to listen on; a bare port is refused with the two usual spellings.
fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse().map_err(|_| match s.parse::<u16>() {
        Ok(port) => format!(
            "give IP:PORT: 127.0.0.1:{port} (this host only) or 0.0.0.0:{port} (every \
             interface)"
        ),
        Err(_) => format!("{s:?} is not IP:PORT (e.g. 127.0.0.1:9100 or [::1]:9100)"),
    })
}

/// `ckptfs workload`'s options.
#[derive(clap::Args)]
pub(crate) struct WorkloadArgs {
    /// The store directory (created if missing).
    pub(crate) store: PathBuf,
    /// Local state directory (default STORE/state).
    #[arg(long)]
    pub(crate) state: Option<PathBuf>,
    /// Backend to host; may repeat (default Operator-1/0 and Operator-2/0).
    #[arg(long = "backend")]
    pub(crate) backends: Vec<BackendName>,
    /// Number of rounds, each followed by a checkpoint.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: u64,
    /// Keys per backend.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) keys: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub(crate) value_size: usize,
    /// Retained checkpoints.
    #[arg(long)]
    pub(crate) retain: Option<u32>,
    /// Compact every Nth round (0: never).
    #[arg(long, default_value_t = 3)]
    pub(crate) compact_every: u64,
    /// Every Nth round, after its checkpoint, roll the backends back to the checkpoint
    /// before it (0: never).
    #[arg(long, default_value_t = 0)]
    pub(crate) restore_every: u64,
    /// SST format_version written by the backends.
    #[arg(long, default_value_t = DEFAULT_FORMAT_VERSION)]
    pub(crate) format_version: i32,
    /// Further RocksDB options for the backends (name=value;name=value).
    #[arg(long)]
    pub(crate) rocksdb_options: Option<String>,
    /// flush or wal (see mount).
    #[arg(long, default_value_t = CheckpointMode::Flush)]
    pub(crate) checkpoint_mode: CheckpointMode,
    /// BACKEND=DIR: also run the rounds on an application's own RocksDB in DIR (not
    /// hosted) and import a checkpoint of it as BACKEND into every checkpoint.
    #[arg(long, value_name = "BACKEND=DIR", value_parser = parse_import)]
    pub(crate) import: Option<(BackendName, PathBuf)>,
}

/// `BACKEND=DIR` of `ckptfs import`.
fn parse_import(text: &str) -> Result<(BackendName, PathBuf), String> {
    let (backend, dir) = text.split_once('=').ok_or_else(|| {
        format!("expected BACKEND=DIR, e.g. app/0=/var/lib/app/checkpoint, got {text:?}")
    })?;
    if dir.is_empty() {
        return Err(format!("{text:?} names no directory"));
    }
    Ok((
        backend.parse().map_err(|e: Error| e.to_string())?,
        dir.into(),
    ))
}

/// The options of `ckptfs mount`.
#[derive(clap::Args)]
pub(crate) struct MountArgs {
    /// The store: a directory (a ckptfs store, or empty or missing for a new one) or
    /// s3://BUCKET/PREFIX.
    #[arg(value_parser = parse_location)]
    pub(crate) store: Location,
    /// An empty directory to show the checkpoints in.
    pub(crate) mountpoint: PathBuf,
    #[command(flatten)]
    pub(crate) daemon: DaemonArgs,
    /// Show the checkpoints of a store that another daemon writes (on another host):
    /// no backends, no lease, new checkpoints shown within seconds; rmdir and the
    /// control file answer EROFS. The cache goes to --state DIR (default
    /// ~/.cache/ckptfs/ro-HASH).
    #[arg(long, conflicts_with_all = [
        "backends", "keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly",
        "keep_yearly", "keep_within", "restore", "interval", "flink",
    ])]
    pub(crate) read_only: bool,
    /// Stay attached and log to stderr.
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Let other users in (with default_permissions).
    #[arg(long)]
    pub(crate) allow_other: bool,
    /// Mount over a MOUNTPOINT that is not empty (what it holds is hidden until the
    /// unmount); refused without it.
    #[arg(long)]
    pub(crate) nonempty: bool,
    /// Log file of the background daemon (default STORE/ckptfs.log).
    #[arg(long)]
    pub(crate) log_file: Option<PathBuf>,
    /// Do not verify each stored object's checksum at its first open (faster first
    /// reads; a corrupt object is then served as it is).
    #[arg(long)]
    pub(crate) no_verify: bool,
    /// A read of a Flink checkpoint's cp-N/_metadata (a job restoring from the mount)
    /// pins cp-N as restore-cp-N for DURATION after the last read of its files, so that
    /// no policy or rmdir drops it before the job's first own checkpoint (0: off).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          default_value = "1h", conflicts_with = "read_only")]
    pub(crate) restore_lease: std::time::Duration,
}

/// The options of `ckptfs serve`: a daemon's, without a tree.
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// The store: a directory (a ckptfs store, or empty or missing for a new one) or
    /// s3://BUCKET/PREFIX.
    #[arg(value_parser = parse_location)]
    pub(crate) store: Location,
    #[command(flatten)]
    pub(crate) daemon: DaemonArgs,
}

/// The options of every daemon (`ckptfs mount` and `ckptfs serve`), spelled once.
#[derive(clap::Args)]
pub(crate) struct DaemonArgs {
    /// Local state directory for the live RocksDB instances and the read cache
    /// (default STORE/state; required for object storage, except by a read-only mount).
    #[arg(long)]
    pub(crate) state: Option<PathBuf>,
    /// Object storage: uploads (and parts of large ones) in flight at once; all uploads
    /// together hold at most this many 8 MiB parts in memory.
    #[arg(long, default_value_t = 8)]
    pub(crate) upload_concurrency: usize,
    /// Object storage: the size of the local cache of fetched objects, e.g. 512MiB or
    /// 4GiB (least recently used objects are evicted).
    #[arg(long, value_parser = parse_size, default_value = "4GiB")]
    pub(crate) cache_size: u64,
    /// Object storage: unreferenced objects younger than this are not deleted (an
    /// upload still in flight of a daemon that lost its lease, or of a failed
    /// checkpoint); older ones are, at start and every such period.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    pub(crate) orphan_grace: std::time::Duration,
    /// Object storage: how long the writer's lease lasts unless renewed (renewed every
    /// third of it), 3s to 1h; another daemon takes the store over once it has expired
    /// by the store's clock, or at once if it was released or its holder died on this
    /// host.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub(crate) lease_ttl: std::time::Duration,
    /// Object storage: how long to wait for the lease of another daemon to be released
    /// or to expire before giving up (0 fails at once).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub(crate) lease_wait: std::time::Duration,
    /// Backend to host, <operator>/<subtask>; may repeat. The store remembers its
    /// backends; a new store with none gets default/0.
    #[arg(long = "backend")]
    pub(crate) backends: Vec<BackendName>,
    /// The retention policy (default: the store's, --keep-last 3 for a new store); any
    /// rule given replaces the store's whole policy.
    #[command(flatten)]
    pub(crate) keep: KeepArgs,
    /// Checkpoints that may be in flight at once.
    #[arg(long, default_value_t = 1)]
    pub(crate) max_concurrent: usize,
    /// Take a checkpoint periodically, e.g. 30s or 5m (default: off).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) interval: Option<std::time::Duration>,
    /// Follow a running Flink job: import each of its completed checkpoints in this
    /// directory (the job's <execution.checkpointing.dir>/<job-id>/, or the checkpoint root,
    /// where a job restarted from a checkpoint writes its new job directory beside the old
    /// one, followed as well without a restart; a path, a file:// URL or s3://BUCKET/PREFIX)
    /// as its _metadata appears (inotify on a local directory, a poll every second as the
    /// fallback; every 2 s on object storage), keeping them as the policy (--keep-*) says. The daemon then hosts no RocksDB of its own.
    #[arg(long, value_name = "SRC", conflicts_with_all = ["backends", "restore", "interval"])]
    pub(crate) flink: Option<PathBuf>,
    /// Also read the files below DIR that the checkpoints of the job followed with --flink
    /// name (a job restored in CLAIM mode names the files of the job it was restored from:
    /// needed only when that job's directory is not below SRC); files outside SRC and these
    /// roots are refused. Repeatable.
    #[arg(long = "flink-root", value_name = "DIR", requires = "flink")]
    pub(crate) flink_roots: Vec<PathBuf>,
    /// How often to merge runs of small SSTs (under 1 MiB, once a backend has 64 or
    /// more) that RocksDB would keep apart, e.g. with time-ordered keys, and at once
    /// after a checkpoint that finds 128 or more; 0 turns it off.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub(crate) small_file_compaction_interval: std::time::Duration,
    /// Start the backends from checkpoint N, discarding their local state.
    #[arg(long)]
    pub(crate) restore: Option<u64>,
    /// Further RocksDB options for the backends, in RocksDB's name=value;name=value
    /// syntax (e.g. target_file_size_base=8388608;max_bytes_for_level_base=33554432);
    /// wal_dir is refused in wal mode.
    #[arg(long)]
    pub(crate) rocksdb_options: Option<String>,
    /// SST format_version the backends write.
    #[arg(long, default_value_t = DEFAULT_FORMAT_VERSION)]
    pub(crate) format_version: i32,
    /// flush: a checkpoint flushes the memtables and stores the new SSTs. wal: no
    /// flush; a checkpoint stores the write-ahead log written since the backend's last
    /// materialization (chunks: about what was written), on top of that
    /// materialization's SSTs.
    #[arg(long, default_value_t = CheckpointMode::Flush)]
    pub(crate) checkpoint_mode: CheckpointMode,
    /// wal mode: a checkpoint materializes (adopts the current SSTs, storing the new
    /// ones) at least this often, e.g. 5m.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub(crate) materialize_interval: std::time::Duration,
    /// wal mode: a checkpoint materializes once a backend's WAL since the last
    /// materialization reached this many MiB (what opening a checkpoint replays).
    #[arg(long, default_value_t = 256)]
    pub(crate) materialize_wal_mib: u64,
    /// Serve the metrics (the text of .ckptfs/metrics, for Prometheus) over HTTP at
    /// http://ADDR/metrics, ADDR being IP:PORT, e.g. 127.0.0.1:9100 (default: off;
    /// the file is always there).
    #[arg(long, value_name = "ADDR", value_parser = parse_listen_addr)]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub(crate) s3: S3DoorArgs,
}

/// The S3 front door's options (`--s3-*`), of every daemon.
#[derive(clap::Args)]
pub(crate) struct S3DoorArgs {
    /// Serve every retained checkpoint read-only over the S3 REST API at ADDR (IP:PORT, or
    /// PORT alone for 127.0.0.1:PORT), one bucket laid out as the mount is (default: off).
    /// Requests must be signed with the key of --s3-credentials or of
    /// CKPTFS_S3_ACCESS_KEY_ID and CKPTFS_S3_SECRET_ACCESS_KEY, unless --s3-anonymous is
    /// given.
    #[arg(long, value_name = "ADDR", value_parser = ckptfs::s3door::parse_listen)]
    pub(crate) s3_listen: Option<std::net::SocketAddr>,
    /// Let --s3-listen be a non-loopback address (refused without it: the door serves every
    /// checkpoint over plain HTTP to other hosts).
    #[arg(long, requires = "s3_listen")]
    pub(crate) s3_listen_public: bool,
    /// The door's bucket.
    #[arg(
        long,
        value_name = "NAME",
        default_value = ckptfs::s3door::DEFAULT_BUCKET,
        requires = "s3_listen"
    )]
    pub(crate) s3_bucket: String,
    /// The key requests are signed with: a file (mode 0600) of the lines
    /// access_key_id = ... and secret_access_key = ... (an AWS credentials file of one
    /// profile will do).
    #[arg(long, value_name = "FILE", requires = "s3_listen")]
    pub(crate) s3_credentials: Option<PathBuf>,
    /// Let unsigned requests read too (anyone who can reach the address); a signed
    /// request must still be signed with the door's key.
    #[arg(long, requires = "s3_listen")]
    pub(crate) s3_anonymous: bool,
    /// The configuration once made: the key file is read once (it may be a pipe).
    #[arg(skip)]
    made: std::cell::OnceCell<Option<ckptfs::s3door::DoorConfig>>,
}

impl S3DoorArgs {
    /// The door's configuration (None without --s3-listen), its key read and checked.
    pub(crate) fn config(&self) -> Result<Option<ckptfs::s3door::DoorConfig>, Error> {
        if let Some(made) = self.made.get() {
            return Ok(made.clone());
        }
        let made = self.make_config()?;
        let _ = self.made.set(made.clone());
        Ok(made)
    }

    fn make_config(&self) -> Result<Option<ckptfs::s3door::DoorConfig>, Error> {
        use ckptfs::s3door;
        let Some(listen) = self.s3_listen else {
            return Ok(None);
        };
        s3door::check_exposure(listen, self.s3_listen_public)?;
        if !is_bucket_name(&self.s3_bucket) {
            return Err(Error::Invalid(format!(
                "--s3-bucket {:?}: a bucket name is 3 to 63 lowercase letters, digits, dots \
                 and hyphens, starting and ending with a letter or digit",
                self.s3_bucket
            )));
        }
        let credentials = match &self.s3_credentials {
            Some(path) => Some(s3door::read_credentials(path)?),
            None => s3door::env_credentials()?,
        };
        if credentials.is_none() && !self.s3_anonymous {
            return Err(Error::Invalid(format!(
                "--s3-listen needs the key requests are signed with: --s3-credentials FILE, \
                 or {} and {} set; or --s3-anonymous to serve unsigned requests",
                s3door::ENV_ACCESS_KEY,
                s3door::ENV_SECRET_KEY
            )));
        }
        Ok(Some(s3door::DoorConfig {
            listen,
            bucket: self.s3_bucket.clone(),
            credentials,
            anonymous: self.s3_anonymous,
        }))
    }
}

/// An S3 bucket name clients accept in a path-style URL.
fn is_bucket_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
        && !name.contains("..")
}

/// The rules of a retention policy (restic's `forget` semantics): the union of the rules
/// is kept; each calendar rule keeps the newest checkpoint of each of its newest N hours,
/// days, ISO weeks, months or years (UTC) that hold one; times are the checkpoints' own
/// (Flink's checkpoint time for an imported one). Pinned checkpoints are always kept.
#[derive(clap::Args, Clone, Default)]
pub(crate) struct KeepArgs {
    /// Keep the newest N checkpoints (1 when only other rules are given); --retain N is
    /// the same.
    #[arg(long, alias = "retain", value_name = "N")]
    pub(crate) keep_last: Option<u32>,
    /// Keep the newest checkpoint of each of the newest N hours that hold one.
    #[arg(long, value_name = "N")]
    pub(crate) keep_hourly: Option<u32>,
    /// The same by day.
    #[arg(long, value_name = "N")]
    pub(crate) keep_daily: Option<u32>,
    /// The same by ISO week (Monday to Sunday).
    #[arg(long, value_name = "N")]
    pub(crate) keep_weekly: Option<u32>,
    /// The same by month.
    #[arg(long, value_name = "N")]
    pub(crate) keep_monthly: Option<u32>,
    /// The same by year.
    #[arg(long, value_name = "N")]
    pub(crate) keep_yearly: Option<u32>,
    /// Keep every checkpoint less than DURATION older than the newest, e.g. 36h or 7d.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) keep_within: Option<std::time::Duration>,
}

impl KeepArgs {
    /// The policy these rules make, `None` when no rule is given.
    pub(crate) fn policy(&self) -> Result<Option<Policy>, Error> {
        let given = [
            self.keep_last,
            self.keep_hourly,
            self.keep_daily,
            self.keep_weekly,
            self.keep_monthly,
            self.keep_yearly,
        ]
        .iter()
        .any(Option::is_some)
            || self.keep_within.is_some();
        if !given {
            return Ok(None);
        }
        let within_ms = match self.keep_within {
            Some(d) => u64::try_from(d.as_millis())
                .map_err(|_| Error::Invalid("--keep-within: too long".into()))?,
            None => 0,
        };
        Policy {
            last: self.keep_last.unwrap_or(1),
            by_time: ByTime {
                hourly: self.keep_hourly.unwrap_or(0),
                daily: self.keep_daily.unwrap_or(0),
                weekly: self.keep_weekly.unwrap_or(0),
                monthly: self.keep_monthly.unwrap_or(0),
                yearly: self.keep_yearly.unwrap_or(0),
                within_ms,
            },
        }
        .validate()
        .map(Some)
        .map_err(|e| Error::Invalid(format!("--keep-last: {e}")))
    }
}

/// `ckptfs forget`'s options.
#[derive(clap::Args)]
pub(crate) struct ForgetArgs {
    /// A mountpoint or a store a daemon holds (its daemon decides; a store's through the
    /// socket in its state directory), or else a store written directly: a directory, or
    /// s3://BUCKET/PREFIX with --state DIR as well.
    pub(crate) target: PathBuf,
    /// Show what the policy would keep and drop; change nothing.
    #[arg(long, short = 'n')]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) keep: KeepArgs,
    /// A store on object storage: the local state directory.
    #[arg(long)]
    pub(crate) state: Option<PathBuf>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ckptfs flink-gc`'s options.
#[derive(clap::Args)]
pub(crate) struct FlinkGcArgs {
    /// Flink's checkpoint directory: a directory, file:///PATH or s3://BUCKET/PREFIX.
    pub(crate) src: PathBuf,
    /// Delete the garbage (after scanning a second time: only what both scans judge
    /// garbage is deleted).
    #[arg(long)]
    pub(crate) delete: bool,
    /// Also delete the completed checkpoints Flink no longer retains (their _metadata
    /// first) and the shared files only they name.
    #[arg(long, requires = "delete")]
    pub(crate) delete_unretained: bool,
    /// Files written less than this long before the scan are never garbage; at least
    /// --checkpoint-timeout.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    pub(crate) grace: std::time::Duration,
    /// The jobs' execution.checkpointing.timeout (Flink's default: 10 min): a checkpoint
    /// in flight may name a file this young.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub(crate) checkpoint_timeout: std::time::Duration,
    /// The jobs' execution.checkpointing.num-retained: per job, the newest N completed
    /// checkpoints are Flink's; older ones are listed apart.
    #[arg(long, default_value_t = 1)]
    pub(crate) num_retained: usize,
    /// Another checkpoint root whose completed checkpoints may name files under SRC (a
    /// job elsewhere restored from SRC in CLAIM mode): its references count, nothing in it
    /// is deleted. Repeatable.
    #[arg(long = "reference-root", value_name = "DIR")]
    pub(crate) reference_roots: Vec<PathBuf>,
    /// A ckptfs mountpoint or store: say for each checkpoint Flink no longer retains
    /// whether this store holds an import of it.
    #[arg(long, value_name = "TARGET")]
    pub(crate) store: Option<PathBuf>,
    /// List every garbage file (the table lists the first 20 of each kind).
    #[arg(long)]
    pub(crate) all: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

impl DaemonArgs {
    fn backend_options(&self) -> BackendOptions {
        BackendOptions {
            format_version: self.format_version,
            rocksdb_options: self.rocksdb_options.clone(),
            checkpoint_mode: self.checkpoint_mode,
            ..BackendOptions::default()
        }
    }

    /// Refuse options that would not work (or not protect anything) before anything is
    /// created or started.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        self.backend_options().validate()?;
        ckptfs_core::lease::validate_ttl(self.lease_ttl)
            .map_err(|e| Error::Invalid(format!("--lease-ttl: {e}")))?;
        if self.orphan_grace < self.lease_ttl {
            return Err(Error::Invalid(format!(
                "--orphan-grace {} is shorter than the lease time {}: an upload of a \
                 daemon that has just lost its lease may still land that long after",
                humantime::format_duration(self.orphan_grace),
                humantime::format_duration(self.lease_ttl)
            )));
        }
        if let Some(addr) = self.metrics_listen {
            // Free to bind? Asked here, before the daemon creates anything (the daemon
            // binds it again before it opens the store).
            drop(ckptfs::metrics_http::bind(addr)?);
        }
        if let Some(door) = self.s3.config()? {
            drop(ckptfs::s3door::bind(door.listen)?);
        }
        Ok(())
    }

    /// The daemon's configuration, with absolute paths (the daemon changes to /, and its
    /// log, status and fsname stay meaningful); no tree unless `mountpoint` is given.
    pub(crate) fn into_config(
        self,
        store: Location,
        mountpoint: Option<PathBuf>,
    ) -> Result<MountConfig, Error> {
        let backend_options = self.backend_options();
        let s3_door = self.s3.config()?;
        let store = match store {
            Location::Local(path) => Location::Local(
                std::path::absolute(&path).map_err(|e| Error::io("resolve store path", e))?,
            ),
            remote => remote,
        };
        let mountpoint = mountpoint
            .map(std::path::absolute)
            .transpose()
            .map_err(|e| Error::io("resolve mountpoint", e))?;
        let state = self
            .state
            .map(std::path::absolute)
            .transpose()
            .map_err(|e| Error::io("resolve state path", e))?;
        let mut engine = EngineConfig::new(store);
        engine.state = state;
        engine.s3 = ckptfs_core::store::s3::S3Options {
            upload_concurrency: self.upload_concurrency.max(1),
            cache_size: self.cache_size,
        };
        engine.orphan_grace = self.orphan_grace;
        engine.lease_ttl = self.lease_ttl;
        engine.lease_wait = self.lease_wait;
        engine.backends = self.backends;
        // A follower of a Flink job hosts nothing: every backend is the job's.
        engine.host_backends = self.flink.is_none();
        let flink = self
            .flink
            .as_deref()
            .map(ckptfs_core::flink::import::FlinkSource::absolute)
            .transpose()?;
        let flink_roots = self
            .flink_roots
            .iter()
            .map(|r| ckptfs_core::flink::import::FlinkSource::absolute(r))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(policy) = self.keep.policy()? {
            engine.retain = Some(policy.last);
            engine.keep = Some(policy.by_time);
        }
        engine.max_concurrent = self.max_concurrent;
        engine.restore_from = self.restore;
        engine.backend_options = backend_options;
        engine.materialize = MaterializePolicy {
            interval: self.materialize_interval,
            wal_bytes: self.materialize_wal_mib.saturating_mul(1 << 20),
            ..MaterializePolicy::default()
        };
        Ok(MountConfig {
            engine,
            mountpoint,
            interval: self.interval,
            small_file_compaction: Some(self.small_file_compaction_interval)
                .filter(|d| !d.is_zero()),
            allow_other: false,
            threads: 4,
            verify: true,
            read_only: false,
            metrics_listen: self.metrics_listen,
            s3_door,
            flink,
            flink_roots,
            restore_lease: None,
        })
    }
}

impl MountArgs {
    /// Refuse options that would not work before anything is created or started.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        self.daemon.validate()
    }

    /// The default state directory of a read-only mount: its own cache per store and
    /// mountpoint, under ~/.cache/ckptfs.
    pub(crate) fn read_only_state(&self) -> Result<PathBuf, Error> {
        let mountpoint = std::path::absolute(&self.mountpoint)
            .map_err(|e| Error::io("resolve mountpoint", e))?;
        let key = format!("{}\0{}", self.store, mountpoint.display());
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
        Ok(PathBuf::from(home).join(".cache/ckptfs").join(format!(
            "ro-{}",
            &blake3::hash(key.as_bytes()).to_hex()[..16]
        )))
    }

    /// The mount daemon's configuration: the daemon's, with the tree at MOUNTPOINT.
    pub(crate) fn into_config(self) -> Result<MountConfig, Error> {
        let (allow_other, verify, read_only) = (self.allow_other, !self.no_verify, self.read_only);
        let restore_lease = Some(self.restore_lease).filter(|d| !d.is_zero());
        let mut config = self.daemon.into_config(self.store, Some(self.mountpoint))?;
        config.restore_lease = restore_lease;
        config.allow_other = allow_other;
        config.verify = verify;
        config.read_only = read_only;
        Ok(config)
    }
}

impl ServeArgs {
    /// The serving daemon's configuration: no tree; commands reach it through the
    /// control socket in its state directory, as they reach a mount's daemon.
    pub(crate) fn into_config(self) -> Result<MountConfig, Error> {
        self.daemon.into_config(self.store, None)
    }
}

pub(crate) fn parse_location(arg: &str) -> Result<Location, String> {
    Location::parse(arg).map_err(|e| e.to_string())
}

/// A size in bytes: a number with an optional unit (KiB, MiB, GiB, TiB; K, M, G, T).
pub(crate) fn parse_size(arg: &str) -> Result<u64, String> {
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
