//! One hosted RocksDB instance and its native checkpoint into a staging directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rocksdb::{BlockBasedOptions, IteratorMode, Options, WriteBatch, DB};

use crate::error::{Error, IoContext, Result};
use crate::fsutil::write_atomic;
use crate::names::BackendName;

/// SST format written by default. RocksDB 11 writes format 7, which RocksDB older than 10.4
/// (Debian's ldb, the Python binding rocksdict) cannot read; format 5 is read by every
/// RocksDB since 6.6, so a restored checkpoint opens wherever users run RocksDB.
pub const DEFAULT_FORMAT_VERSION: i32 = 5;

/// RocksDB options ckptfs sets before the user's `--rocksdb-options` (which override them).
///
/// RocksDB lets a MANIFEST grow to 1 GiB by default: with one small flush per checkpoint it
/// reaches 486 KiB per backend after 2,000 checkpoints (scripts/bench-scale). A checkpoint
/// stores only the MANIFEST's chunks appended since the previous one, but a short MANIFEST
/// keeps its chunk list short and a restored database quick to open. A 64 KiB floor with a
/// space amplification of at most 100% (RocksDB rewrites the MANIFEST compacted once it is
/// twice its compacted size, and the floor auto-scales with the database) keeps it at about
/// 64 KiB per backend at any point of that run, for one extra small MANIFEST write now and
/// then.
pub const DEFAULT_ROCKSDB_OPTIONS: &str =
    "max_manifest_file_size=65536;max_manifest_space_amp_pct=100";

/// RocksDB options ckptfs sets in `wal` mode, after [`DEFAULT_ROCKSDB_OPTIONS`] and before
/// the user's. A checkpoint that materializes copies the open WAL file (RocksDB's native
/// checkpoint copies it, cut at a record boundary, and syncs the copy), so its synchronous
/// phase grows with the live WAL: 88 ms per backend at 55 MB (scripts/bench-incremental
/// with BENCH_MODES). A 16 MiB memtable makes RocksDB switch to a new WAL (flushing the
/// memtable in the background) at about 16 MiB instead of 64 MiB. A checkpoint on top of a
/// materialization copies nothing: it hard-links every WAL file ([`Backend::link_wals`]).
/// (`max_total_wal_size` would not do it: RocksDB ignores it with a single column family.)
pub const WAL_MODE_ROCKSDB_OPTIONS: &str = "write_buffer_size=16777216";

/// How a checkpoint captures what is in the memtables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointMode {
    /// Flush every memtable, then store the SSTs that are new: a checkpoint's upload follows
    /// what flushes and compactions rewrote.
    #[default]
    Flush,
    /// No flush: the checkpoint carries the write-ahead log written since the last
    /// materialization (stored incrementally) on top of that materialization's SSTs; stock
    /// RocksDB replays it when it opens the directory.
    Wal,
}

impl std::str::FromStr for CheckpointMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "flush" => Ok(CheckpointMode::Flush),
            "wal" => Ok(CheckpointMode::Wal),
            _ => Err(Error::Invalid(format!(
                "checkpoint mode {s:?}: expected flush or wal"
            ))),
        }
    }
}

impl std::fmt::Display for CheckpointMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CheckpointMode::Flush => "flush",
            CheckpointMode::Wal => "wal",
        })
    }
}

/// WAL archiving in `wal` mode: RocksDB moves a WAL it no longer needs into `archive/`
/// instead of deleting it, and ckptfs deletes it there once no checkpoint to come needs it
/// (see [`Backend::prune_archived_wals`]). RocksDB itself never purges it first.
const WAL_ARCHIVE_TTL_SECONDS: u64 = 100 * 365 * 24 * 3600;

/// How the hosted RocksDB instances are opened and checkpointed; one set for every backend
/// of a daemon.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// The block-based table `format_version` of the SSTs written (default
    /// [`DEFAULT_FORMAT_VERSION`]).
    pub format_version: i32,
    /// Memtable size; small values make more, smaller SSTs (tests use this).
    pub write_buffer_size: Option<usize>,
    /// Further RocksDB options in RocksDB's own `name=value;name=value` syntax, applied
    /// last, e.g. `target_file_size_base=8388608;max_bytes_for_level_base=33554432`.
    pub rocksdb_options: Option<String>,
    /// How a checkpoint captures the memtables.
    pub checkpoint_mode: CheckpointMode,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            format_version: DEFAULT_FORMAT_VERSION,
            write_buffer_size: None,
            rocksdb_options: None,
            checkpoint_mode: CheckpointMode::default(),
        }
    }
}

impl BackendOptions {
    /// Check the options before anything is opened: RocksDB parses the option string, then
    /// a scratch database is created and opened with them (which catches values RocksDB
    /// only refuses at open, such as a compression this build lacks).
    pub fn validate(&self) -> Result<()> {
        let mut opts = self.rocksdb_options(true)?;
        let Some(text) = self.rocksdb_options.as_deref() else {
            return Ok(());
        };
        if self.checkpoint_mode == CheckpointMode::Wal
            && top_level_option(text, "wal_dir").is_some_and(|dir| !dir.is_empty())
        {
            return Err(Error::Invalid(format!(
                "RocksDB options {text:?}: wal mode keeps each backend's WAL in its database \
                 directory (its checkpoints are the WAL files there and in RocksDB's archive \
                 beside them): wal_dir cannot be set"
            )));
        }
        let scratch = tempfile::tempdir().map_err(|e| Error::io("create scratch directory", e))?;
        // The scratch database keeps every file in the scratch directory: options that name
        // other directories (wal_dir, db_log_dir) must not find its files there later.
        opts.set_wal_dir(scratch.path().join("wal"));
        opts.set_db_log_dir(scratch.path().join("log"));
        let db = DB::open(&opts, scratch.path().join("db")).map_err(|e| {
            Error::Invalid(format!(
                "RocksDB options {:?}: {}",
                self.rocksdb_options.as_deref().unwrap_or(""),
                e.into_string()
            ))
        })?;
        drop(db);
        Ok(())
    }

    /// The RocksDB options a backend opens with (`create`: create a missing database).
    pub fn rocksdb_options(&self, create: bool) -> Result<Options> {
        let mut opts = Options::default();
        opts.create_if_missing(create);
        opts.set_max_background_jobs(2);
        opts.set_keep_log_file_num(2);
        let mut table = BlockBasedOptions::default();
        table.set_format_version(self.format_version);
        opts.set_block_based_table_factory(&table);
        let mut opts = opts
            .get_options_from_string(DEFAULT_ROCKSDB_OPTIONS)
            .map_err(|e| {
                Error::Invalid(format!("built-in RocksDB options: {}", e.into_string()))
            })?;
        if self.checkpoint_mode == CheckpointMode::Wal {
            opts = opts
                .get_options_from_string(WAL_MODE_ROCKSDB_OPTIONS)
                .map_err(|e| {
                    Error::Invalid(format!("built-in RocksDB options: {}", e.into_string()))
                })?;
        }
        if let Some(size) = self.write_buffer_size {
            opts.set_write_buffer_size(size);
        }
        if let Some(text) = self
            .rocksdb_options
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            opts = opts.get_options_from_string(text).map_err(|e| {
                Error::Invalid(format!("RocksDB options {text:?}: {}", e.into_string()))
            })?;
        }
        // Whatever the user's options say: a recycled WAL is rewritten in place, and ckptfs
        // stores WAL files as chunks of a file that only grows; in `wal` mode the WAL files
        // RocksDB no longer needs go to its archive, for the checkpoints to come.
        opts.set_recycle_log_file_num(0);
        if self.checkpoint_mode == CheckpointMode::Wal {
            opts.set_wal_ttl_seconds(WAL_ARCHIVE_TTL_SECONDS);
            // A checkpoint pairs an older MANIFEST with the WAL files written since, which
            // that MANIFEST cannot have recorded.
            opts = opts
                .get_options_from_string("track_and_verify_wals_in_manifest=false")
                .map_err(|e| {
                    Error::Invalid(format!("built-in RocksDB options: {}", e.into_string()))
                })?;
        }
        Ok(opts)
    }
}

/// One write of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Set a key (the first) to a value (the second).
    Put(Vec<u8>, Vec<u8>),
    /// Remove a key.
    Delete(Vec<u8>),
}

/// A file staged for a checkpoint: of a native checkpoint, hard-linked (or, for the open
/// WAL, copied) into staging; in `wal` mode on top of a materialization, a WAL file
/// hard-linked ([`Backend::link_wals`]), the newest still growing past `size`.
#[derive(Debug, Clone)]
pub struct StagedFile {
    /// The RocksDB file name, the name it gets in the checkpoint.
    pub name: String,
    /// Where its bytes are read from: the link or copy in staging, or for an import the
    /// file's [`crate::import::ScannedFile::path`].
    pub path: PathBuf,
    /// Its length in bytes when staged.
    pub size: u64,
    /// An imported file: where it is read from (see [`crate::import::ScannedFile`]),
    /// recorded in its entry.
    pub source: Option<String>,
    /// An SST's column family, as RocksDB's live file metadata (hosted) or the file's
    /// properties (imported) name it, recorded in its entry.
    pub column_family: Option<String>,
    /// An imported file on object storage that the store copies without reading it
    /// (`path` is then its URI, never opened).
    pub remote: Option<crate::store::s3::RemoteFile>,
}

/// SST and blob files never change once written, so they are shared across checkpoints and
/// re-referenced by name; everything else (MANIFEST, CURRENT, OPTIONS, WAL) is private and
/// stored each time.
pub fn is_shared_file(name: &str) -> bool {
    name.ends_with(".sst") || name.ends_with(".blob")
}

/// Files RocksDB only appends to (until it starts a new one): stored as chunks, so that a
/// checkpoint stores what was appended since the previous one.
pub fn is_append_only(name: &str) -> bool {
    name.starts_with("MANIFEST-") || wal_number(name).is_some()
}

/// MANIFEST chunk size. A MANIFEST is tens of KiB and grows by a few hundred bytes per
/// checkpoint; chosen by `scripts/bench-scale` (4 backends, 300 time-ordered checkpoints):
/// store growth per checkpoint (uploads + manifest and lists) 26.8 KiB with 4 KiB chunks,
/// 26.0 with 2 KiB (3% more objects), 40-61 with 16 KiB.
pub const MANIFEST_CHUNK_SIZE: u32 = 4 * 1024;
/// A larger MANIFEST is stored whole (ckptfs's defaults keep it near 64 KiB).
pub const MAX_CHUNKED_MANIFEST: u64 = 4 << 20;
/// WAL chunk size: a WAL grows by what the workload wrote since the previous checkpoint
/// (hundreds of KiB to MiBs per backend), and a checkpoint stores at most one partial chunk
/// more than that.
pub const WAL_CHUNK_SIZE: u32 = 64 * 1024;

/// How a file is stored: as chunks of this size (an append-only file), or whole (`None`).
pub fn chunk_size_for(name: &str, size: u64) -> Option<u32> {
    if wal_number(name).is_some() {
        Some(WAL_CHUNK_SIZE)
    } else if name.starts_with("MANIFEST-") && size <= MAX_CHUNKED_MANIFEST {
        Some(MANIFEST_CHUNK_SIZE)
    } else {
        None
    }
}

/// The value `text` (RocksDB's `name=value;name=value` syntax, values possibly in braces)
/// gives option `name` at its top level, trimmed; the last one if it names it twice.
fn top_level_option<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let (mut depth, mut start, mut found) = (0usize, 0usize, None);
    let mut pair = |pair: &'a str| {
        if let Some((key, value)) = pair.split_once('=') {
            if key.trim() == name {
                found = Some(value.trim());
            }
        }
    };
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ';' if depth == 0 => {
                pair(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pair(&text[start..]);
    found
}

/// The number of a write-ahead log file (`000123.log`).
pub fn wal_number(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".log")?;
    if stem.is_empty() || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// One hosted RocksDB instance, open for reads and writes: its database lives in
/// `DIR/db` ([`Backend::db_dir`]) and its lineage in `DIR/lineage`.
pub struct Backend {
    name: BackendName,
    dir: PathBuf,
    db: DB,
    lineage: String,
    /// Held shared by every write (RocksDB has written a write's WAL record when the
    /// write returns), exclusively while [`Backend::link_wals`] takes the WAL files' sizes:
    /// every WAL file then ends at a record boundary.
    wal_cut: std::sync::RwLock<()>,
}

impl Backend {
    /// The RocksDB directory of a backend whose state lives in `dir`.
    pub fn db_dir(dir: &Path) -> PathBuf {
        dir.join("db")
    }

    /// Open the backend in `dir`, creating an empty database if there is none yet.
    pub fn open_or_create(dir: &Path, name: &BackendName, opts: &BackendOptions) -> Result<Self> {
        let db_dir = Self::db_dir(dir);
        let create = !db_dir.join("CURRENT").exists();
        // RocksDB would create its directory under the process umask.
        crate::fsutil::create_private_dir_all(&db_dir)?;
        let db = DB::open(&opts.rocksdb_options(create)?, &db_dir)?;
        if opts.checkpoint_mode == CheckpointMode::Flush {
            // What `wal` mode archived for checkpoints to come (in an earlier run).
            prune_wals_in(&db_dir.join("archive"), u64::MAX)?;
        }
        let lineage = match fs::read_to_string(dir.join("lineage")) {
            Ok(text) if !create && !text.trim().is_empty() => text.trim().to_string(),
            _ => {
                let lineage = new_lineage(name);
                write_atomic(&dir.join("lineage"), lineage.as_bytes())?;
                lineage
            }
        };
        Ok(Backend {
            name: name.clone(),
            dir: dir.to_path_buf(),
            db,
            lineage,
            wal_cut: std::sync::RwLock::new(()),
        })
    }

    /// Open a database just materialized from a checkpoint: never create one (a missing
    /// CURRENT would otherwise silently start an empty database), and start a new lineage,
    /// because file numbers after a restore repeat those of abandoned checkpoints.
    pub fn open_restored(dir: &Path, name: &BackendName, opts: &BackendOptions) -> Result<Self> {
        let db_dir = Self::db_dir(dir);
        if !db_dir.join("CURRENT").exists() {
            return Err(Error::Corrupt(format!(
                "restored database {} has no CURRENT file",
                db_dir.display()
            )));
        }
        let db = DB::open(&opts.rocksdb_options(false)?, &db_dir)?;
        let lineage = new_lineage(name);
        write_atomic(&dir.join("lineage"), lineage.as_bytes())?;
        Ok(Backend {
            name: name.clone(),
            dir: dir.to_path_buf(),
            db,
            lineage,
            wal_cut: std::sync::RwLock::new(()),
        })
    }

    /// Open the database in `db_dir` once and close it: proves that a prepared restore
    /// opens with these options before anything live is replaced. Never creates one.
    pub fn check_opens(db_dir: &Path, opts: &BackendOptions) -> Result<()> {
        if !db_dir.join("CURRENT").exists() {
            return Err(Error::Corrupt(format!(
                "restored database {} has no CURRENT file",
                db_dir.display()
            )));
        }
        drop(DB::open(&opts.rocksdb_options(false)?, db_dir)?);
        Ok(())
    }

    /// Remove the lineage of the backend in `dir` (durably), before its database is
    /// replaced. A database without lineage gets a new one when opened.
    pub fn forget_lineage(dir: &Path) -> Result<()> {
        let path = dir.join("lineage");
        match fs::remove_file(&path) {
            Ok(()) => crate::fsutil::fsync_dir(dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
        }
    }

    /// The backend's name.
    pub fn name(&self) -> &BackendName {
        &self.name
    }

    /// The directory of the backend's state (its database in `db/`, its `lineage`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The identity of this database's file numbering: new when the database is created
    /// or restored, so names from one lineage are never matched against another's.
    pub fn lineage(&self) -> &str {
        &self.lineage
    }

    /// Apply `ops` as one atomic batch.
    pub fn write(&self, ops: &[WriteOp]) -> Result<()> {
        let mut batch = WriteBatch::default();
        for op in ops {
            match op {
                WriteOp::Put(k, v) => batch.put(k, v),
                WriteOp::Delete(k) => batch.delete(k),
            }
        }
        let _writing = crate::fsutil::read(&self.wal_cut);
        self.db.write(batch)?;
        Ok(())
    }

    /// The value of `key`, `None` if it is not set.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get(key)?)
    }

    /// Flush the memtables into SSTs (waits for it).
    pub fn flush(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    /// Compact the whole key range (waits for it).
    pub fn compact(&self) -> Result<()> {
        self.db.compact_range(None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }

    /// Every key and value, in key order.
    pub fn scan(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        collect(&self.db)
    }

    /// Merge runs of small SSTs (see [`crate::compaction`]); returns what was compacted.
    pub fn compact_small_files(
        &self,
        policy: &crate::compaction::SmallFilePolicy,
        stop: &dyn Fn() -> bool,
    ) -> Result<Vec<crate::compaction::RangePlan>> {
        let files: Vec<crate::compaction::SstInfo> = self
            .db
            .live_files()?
            .into_iter()
            .filter_map(|f| {
                Some(crate::compaction::SstInfo {
                    name: f.name,
                    size: f.size as u64,
                    level: f.level,
                    start: f.start_key?,
                    end: f.end_key?,
                })
            })
            .collect();
        let mut plans = crate::compaction::plan(&files, policy);
        for (i, range) in plans.iter().enumerate() {
            if stop() {
                plans.truncate(i);
                break;
            }
            let mut opts = rocksdb::CompactOptions::default();
            // Small files in the last level are rewritten too (a trivial move would keep
            // them apart), but not again what this compaction just wrote.
            opts.set_bottommost_level_compaction(
                rocksdb::BottommostLevelCompaction::ForceOptimized,
            );
            self.db
                .compact_range_opt(Some(&range.start), Some(&range.end), &opts);
        }
        Ok(plans)
    }

    /// Names and sizes of the live SST files.
    pub fn live_sst_files(&self) -> Result<Vec<(String, u64)>> {
        Ok(self
            .db
            .live_files()?
            .into_iter()
            .map(|f| (f.name.trim_start_matches('/').to_string(), f.size as u64))
            .collect())
    }

    /// The synchronous phase: RocksDB's native checkpoint into `staging`, which must not
    /// exist yet but whose parent must. It flushes the memtables first when the live WAL
    /// files add up to `flush_at_wal_bytes` or more (0: always; `u64::MAX`: never), then
    /// hard-links the SSTs and the closed WAL files and copies the open one, cut at a
    /// record boundary.
    pub fn checkpoint_into(
        &self,
        staging: &Path,
        flush_at_wal_bytes: u64,
    ) -> Result<Vec<StagedFile>> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)?
            .create_checkpoint_with_log_size(staging, flush_at_wal_bytes)?;
        let mut files = list_files(staging)?;
        // Each SST's column family, as RocksDB names it; an SST compacted away since the
        // checkpoint is no longer listed: its properties (in the link staged) name it.
        let families: std::collections::HashMap<String, String> = self
            .db
            .live_files()?
            .into_iter()
            .map(|f| {
                (
                    f.name.trim_start_matches('/').to_string(),
                    f.column_family_name,
                )
            })
            .collect();
        for file in &mut files {
            file.column_family = match families.get(&file.name) {
                Some(family) => Some(family.clone()),
                None if file.name.ends_with(".sst") => {
                    crate::source::sst::properties_at(&file.path)?.column_family
                }
                None => None,
            };
        }
        Ok(files)
    }

    /// `wal` mode's synchronous phase on top of a materialization, which needs nothing but
    /// the WAL files written since: hard-link into `staging` (created here; its parent
    /// must exist) every WAL file numbered from `from` on, in the database directory or
    /// RocksDB's archive, with no write in progress (so that each ends at a record
    /// boundary: RocksDB's buffer flushed, the sizes taken while no write is in
    /// progress). The newest file goes on growing through its link: a staged file's
    /// `size` is what belongs to the checkpoint. New writes wait for the listing, the
    /// links and the sizes (RocksDB's own checkpoint would copy the open WAL file and link
    /// every SST, and fsync the copies); the listing waits for the writes in progress,
    /// so a write RocksDB stalls (too many L0 files, say) delays it until the stall ends.
    /// Returns what was linked, sorted by name.
    pub fn link_wals(&self, staging: &Path, from: u64) -> Result<Vec<StagedFile>> {
        crate::fsutil::create_private_dir_all(staging)?;
        let _no_write = crate::fsutil::write(&self.wal_cut);
        self.db.flush_wal(false)?;
        let db_dir = Self::db_dir(&self.dir);
        let archive = db_dir.join("archive");
        let mut names = std::collections::BTreeSet::new();
        for dir in [&db_dir, &archive] {
            let entries = match fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
            };
            for entry in entries {
                let name = entry
                    .ctx("list", dir)?
                    .file_name()
                    .to_string_lossy()
                    .into_owned();
                if wal_number(&name).is_some_and(|n| n >= from) {
                    names.insert(name);
                }
            }
        }
        let mut linked = Vec::new();
        for name in names {
            let dest = staging.join(&name);
            // RocksDB may move it into the archive meanwhile (a rename): look there second.
            let source = [db_dir.join(&name), archive.join(&name)]
                .into_iter()
                .find(|source| fs::hard_link(source, &dest).is_ok())
                .ok_or_else(|| {
                    Error::NotFound(format!("WAL file {name} vanished while it was linked"))
                })?;
            let size = fs::metadata(&dest).ctx("stat", &dest)?.len();
            log::debug!("linked {} for a checkpoint", source.display());
            linked.push(StagedFile {
                name,
                path: dest,
                size,
                source: None,
                column_family: None,
                remote: None,
            });
        }
        Ok(linked)
    }

    /// Delete the archived WAL files numbered below `below` (no checkpoint to come needs
    /// them). Returns how many were deleted.
    pub fn prune_archived_wals(&self, below: u64) -> Result<usize> {
        let archive = Self::db_dir(&self.dir).join("archive");
        prune_wals_in(&archive, below)
    }
}

/// Delete the WAL files numbered below `below` in `dir` (a RocksDB WAL archive).
pub fn prune_wals_in(dir: &Path, below: u64) -> Result<usize> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
    };
    let mut deleted = 0;
    for entry in entries {
        let entry = entry.ctx("list", dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if wal_number(&name).is_some_and(|n| n < below) {
            match fs::remove_file(entry.path()) {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("remove {}", entry.path().display()), e)),
            }
        }
    }
    Ok(deleted)
}

/// The regular files of a staging directory, sorted by name.
fn list_files(staging: &Path) -> Result<Vec<StagedFile>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(staging).ctx("list", staging)? {
        let entry = entry.ctx("list", staging)?;
        let meta = entry.metadata().ctx("stat", &entry.path())?;
        if !meta.is_file() {
            continue;
        }
        files.push(StagedFile {
            name: entry.file_name().to_string_lossy().into_owned(),
            path: entry.path(),
            size: meta.len(),
            source: None,
            column_family: None,
            remote: None,
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

fn collect(db: &DB) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for item in db.iterator(IteratorMode::Start) {
        let (k, v) = item?;
        out.push((k.to_vec(), v.to_vec()));
    }
    Ok(out)
}

/// Open any RocksDB directory read-only (a restored checkpoint, or a checkpoint directory
/// inside the mount) and return its contents. Refuses a directory without CURRENT rather
/// than creating a database there.
pub fn scan_dir(dir: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    if !dir.join("CURRENT").is_file() {
        return Err(Error::NotFound(format!(
            "{} is not a RocksDB directory (no CURRENT file)",
            dir.display()
        )));
    }
    let mut opts = Options::default();
    opts.create_if_missing(false);
    // RocksDB writes an info LOG even when reading; keep it out of the (possibly read-only)
    // directory being scanned.
    let log_dir = tempfile::tempdir().ctx("create temporary log directory for", dir)?;
    opts.set_db_log_dir(log_dir.path());
    let db = DB::open_for_read_only(&opts, dir, false)?;
    collect(&db)
}

fn new_lineage(name: &BackendName) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let seed = format!(
        "{name} {nanos} {} {}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    blake3::hash(seed.as_bytes()).to_hex()[..16].to_string()
}

#[cfg(test)]
mod tests {
    use super::top_level_option;

    #[test]
    fn an_option_is_found_at_the_top_level_only() {
        let text = "max_open_files=10; wal_dir = /x/y ;db_log_dir=/z";
        assert_eq!(top_level_option(text, "wal_dir"), Some("/x/y"));
        assert_eq!(top_level_option(text, "db_log_dir"), Some("/z"));
        assert_eq!(top_level_option(text, "wal"), None);
        // Inside braces it is another option's value, not this one.
        let nested = "table_factory={wal_dir=/no;block_size=4096};write_buffer_size=1";
        assert_eq!(top_level_option(nested, "wal_dir"), None);
        assert_eq!(top_level_option(nested, "write_buffer_size"), Some("1"));
        assert_eq!(top_level_option("wal_dir=/a;wal_dir=", "wal_dir"), Some(""));
        assert_eq!(top_level_option("", "wal_dir"), None);
    }
}
