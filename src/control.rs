//! The control protocol: UTF-8 lines, one command per line, fields separated by one space,
//! keys and values percent-encoded. Parsing is separate from running so that a write with
//! any invalid line can be refused as a whole before anything changes.

use std::os::unix::ffi::OsStringExt;

use ckptfs_core::coordinator::ImportReport;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::import::ImportDir;
use ckptfs_core::names::BackendName;
use ckptfs_core::percent;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Start a checkpoint of every backend.
    Checkpoint,
    Put {
        backend: BackendName,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Del {
        backend: BackendName,
        key: Vec<u8>,
    },
    Flush(BackendName),
    Compact(BackendName),
    Retain(u32),
    Delete(u64),
    /// Stage a RocksDB checkpoint directory as the state of an external backend in the
    /// next `checkpoint` of this handle.
    Import(ImportDir),
    /// Import the completed checkpoints of the Flink job in this directory that the store
    /// does not hold yet, one checkpoint each (`ckptfs import-flink SRC MOUNTPOINT`).
    ImportFlink {
        src: std::path::PathBuf,
        /// More roots whose files its checkpoints may name (`--source-root`).
        roots: Vec<std::path::PathBuf>,
    },
}

impl Command {
    /// put and del: a run of consecutive data lines of one write is applied as one atomic
    /// batch per backend.
    pub fn is_data(&self) -> bool {
        matches!(self, Command::Put { .. } | Command::Del { .. })
    }
}

pub const USAGE: &str = "commands: checkpoint | put BACKEND KEY VALUE | del BACKEND KEY | \
flush BACKEND | compact BACKEND | retain N | delete N | import BACKEND DIR | import-flink DIR [ROOT...]";

/// Parse one line (without its newline).
pub fn parse_line(line: &str) -> Result<Command> {
    let fields: Vec<&str> = line.split(' ').collect();
    let arity = |n: usize| -> Result<()> {
        if fields.len() == n {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "{} takes {} argument(s), got {} (fields are separated by exactly one space; \
                 percent-encode spaces in keys and values as %20)",
                fields[0],
                n - 1,
                fields.len() - 1
            )))
        }
    };
    let backend = |i: usize| -> Result<BackendName> { fields[i].parse() };
    // Plain ASCII digits only: no sign, no spaces, no other numerals.
    let number = |i: usize| -> Result<u64> {
        let text = fields[i];
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::Invalid(format!(
                "{text:?} is not a non-negative integer"
            )));
        }
        text.parse::<u64>()
            .map_err(|_| Error::Invalid(format!("{text:?} is too large")))
    };
    match fields[0] {
        "checkpoint" => {
            arity(1)?;
            Ok(Command::Checkpoint)
        }
        "put" => {
            arity(4)?;
            Ok(Command::Put {
                backend: backend(1)?,
                key: percent::decode(fields[2])?,
                value: percent::decode(fields[3])?,
            })
        }
        "del" => {
            arity(3)?;
            Ok(Command::Del {
                backend: backend(1)?,
                key: percent::decode(fields[2])?,
            })
        }
        "flush" => {
            arity(2)?;
            Ok(Command::Flush(backend(1)?))
        }
        "compact" => {
            arity(2)?;
            Ok(Command::Compact(backend(1)?))
        }
        "retain" => {
            arity(2)?;
            let n = number(1)?;
            if n == 0 || n > u32::MAX as u64 {
                return Err(Error::Invalid("retain must be at least 1".into()));
            }
            Ok(Command::Retain(n as u32))
        }
        "delete" => {
            arity(2)?;
            Ok(Command::Delete(number(1)?))
        }
        "import" => {
            arity(3)?;
            let dir =
                std::path::PathBuf::from(std::ffi::OsString::from_vec(percent::decode(fields[2])?));
            if !dir.is_absolute() {
                return Err(Error::Invalid(format!(
                    "import needs an absolute directory, got {:?}",
                    dir.display().to_string()
                )));
            }
            Ok(Command::Import(ImportDir {
                backend: backend(1)?,
                dir,
            }))
        }
        "import-flink" => {
            if fields.len() < 2 {
                arity(2)?;
            }
            let mut dirs = Vec::new();
            for field in &fields[1..] {
                let dir =
                    std::path::PathBuf::from(std::ffi::OsString::from_vec(percent::decode(field)?));
                let url = ["s3://", "file:"]
                    .iter()
                    .any(|scheme| dir.to_string_lossy().starts_with(scheme));
                if !dir.is_absolute() && !url {
                    return Err(Error::Invalid(format!(
                        "import-flink needs absolute directories or URLs, got {:?}",
                        dir.display().to_string()
                    )));
                }
                dirs.push(dir);
            }
            let src = dirs.remove(0);
            Ok(Command::ImportFlink { src, roots: dirs })
        }
        "" => Err(Error::Invalid(format!("empty command; {USAGE}"))),
        other => {
            let shown: String = other.chars().take(40).collect();
            let more = if shown.len() < other.len() { "..." } else { "" };
            Err(Error::Invalid(format!(
                "unknown command {shown:?}{more}; {USAGE}"
            )))
        }
    }
}

/// Parse the lines of one write. Empty lines are skipped; a missing final newline is
/// accepted. The error names the first bad line.
pub fn parse_write(data: &[u8]) -> Result<Vec<Command>> {
    let text = std::str::from_utf8(data)
        .map_err(|e| Error::Invalid(format!("control input is not UTF-8: {e}")))?;
    let mut commands = Vec::new();
    for (n, line) in text.split('\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let command =
            parse_line(line).map_err(|e| Error::Invalid(format!("line {}: {e}", n + 1)))?;
        commands.push(command);
    }
    Ok(commands)
}

/// What `import` lines staged on one control handle for its next `checkpoint`.
#[derive(Debug, Default)]
pub struct StagedImports {
    pub dirs: Vec<ImportDir>,
    /// An `import` line was refused: the next `checkpoint` is refused too (and the staged
    /// set dropped), so that a script never gets a checkpoint without what it staged.
    pub refused: Option<String>,
}

/// How long `import-flink` through a mount waits for a checkpoint slot (one in flight).
pub const FLINK_IMPORT_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs control commands against an engine. Checkpoint uploads run on their own threads,
/// never on the caller's (a FUSE thread): answers are delivered through a callback.
pub struct Controller {
    engine: ckptfs_core::Engine,
    workers: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    interval: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    compactor: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    sweeper: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    refresher: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    follower: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    on_change: std::sync::Mutex<Option<ChangeHook>>,
    /// The small-file compaction's policy, once it runs.
    small_files: std::sync::Mutex<Option<ckptfs_core::compaction::SmallFilePolicy>>,
    /// Set after a checkpoint that found a backend with twice the policy's number of small
    /// SSTs: the compaction runs now instead of at its next period.
    compaction_due: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Called after the set of retained checkpoints may have changed.
pub type ChangeHook = std::sync::Arc<dyn Fn() + Send + Sync>;
/// Delivers the JSON answer of the command at an index of a write.
pub type AnswerSink = std::sync::Arc<dyn Fn(usize, String) + Send + Sync>;

fn ok_json(mut fields: serde_json::Map<String, serde_json::Value>) -> String {
    fields.insert("ok".into(), true.into());
    // "ok" first reads better; serde_json keeps insertion order only with preserve_order,
    // so build the line by hand.
    let mut line = String::from("{\"ok\":true");
    for (k, v) in fields.into_iter().filter(|(k, _)| k != "ok") {
        line.push(',');
        line.push_str(&serde_json::to_string(&k).expect("string"));
        line.push(':');
        line.push_str(&v.to_string());
    }
    line.push('}');
    line
}

pub fn error_json(error: &Error) -> String {
    format!(
        "{{\"ok\":false,\"errno\":{},\"error\":{}}}",
        error.errno(),
        serde_json::to_string(&error.to_string()).expect("string")
    )
}

pub fn checkpoint_json(manifest: &ckptfs_core::catalog::Manifest) -> String {
    import_json(manifest, &[])
}

/// A checkpoint's answer, with what each of its imports read and stored (`imports`, only
/// when it imported).
pub fn import_json(manifest: &ckptfs_core::catalog::Manifest, imports: &[ImportReport]) -> String {
    let s = &manifest.stats;
    let mut m = serde_json::Map::new();
    m.insert("id".into(), manifest.id.into());
    m.insert("files".into(), s.files_total.into());
    m.insert("files_new".into(), s.files_new.into());
    m.insert("files_reused".into(), s.files_reused.into());
    m.insert("bytes".into(), s.bytes_total.into());
    m.insert("bytes_uploaded".into(), s.bytes_uploaded.into());
    m.insert("sync_ms".into(), (s.sync_micros as f64 / 1000.0).into());
    m.insert("async_ms".into(), (s.async_micros as f64 / 1000.0).into());
    if !imports.is_empty() {
        m.insert(
            "imports".into(),
            serde_json::to_value(imports).expect("serializes"),
        );
    }
    ok_json(m)
}

impl Controller {
    pub fn new(engine: ckptfs_core::Engine) -> Self {
        Controller {
            engine,
            workers: Default::default(),
            stopping: Default::default(),
            interval: Default::default(),
            compactor: Default::default(),
            sweeper: Default::default(),
            refresher: Default::default(),
            follower: Default::default(),
            on_change: Default::default(),
            small_files: Default::default(),
            compaction_due: Default::default(),
        }
    }

    pub fn engine(&self) -> &ckptfs_core::Engine {
        &self.engine
    }

    #[cfg(test)]
    pub(crate) fn workers_for_tests(&self) -> &std::sync::Mutex<Vec<std::thread::JoinHandle<()>>> {
        &self.workers
    }

    pub fn set_change_hook(&self, hook: ChangeHook) {
        *self.on_change.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    fn changed(&self) {
        let hook = self
            .on_change
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// Checks that need the engine: named backends exist, dropped checkpoints exist.
    pub fn validate(&self, commands: &[Command]) -> Result<()> {
        let backends = self.engine.backend_names();
        let external = self.engine.external_names();
        for (i, command) in commands.iter().enumerate() {
            if let Command::Import(import) = command {
                if backends.contains(&import.backend) {
                    return Err(Error::Invalid(format!(
                        "command {}: backend {} is hosted by this daemon; import into \
                         another name",
                        i + 1,
                        import.backend
                    )));
                }
            }
            let backend = match command {
                Command::Put { backend, .. }
                | Command::Del { backend, .. }
                | Command::Flush(backend)
                | Command::Compact(backend) => Some(backend),
                _ => None,
            };
            if let Some(b) = backend {
                if external.contains(b) {
                    return Err(Error::Invalid(format!(
                        "command {}: backend {b} is external: its state is imported from its \
                         own application's RocksDB checkpoints (`ckptfs import`); put, del, \
                         flush and compact are refused",
                        i + 1
                    )));
                }
                if !backends.contains(b) {
                    return Err(Error::Invalid(format!(
                        "command {}: no such backend {b} (hosted: {})",
                        i + 1,
                        backends
                            .iter()
                            .map(|b| b.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
            if let Command::Delete(n) = command {
                if self.engine.manifest(*n).is_none() {
                    return Err(Error::Invalid(format!(
                        "command {}: no such checkpoint {n}",
                        i + 1
                    )));
                }
            }
        }
        Ok(())
    }

    /// Run validated commands in the order of their lines. A run of consecutive data lines
    /// (put, del) is applied as one atomic batch per backend at its position; any other
    /// command ends the run. A `checkpoint` takes its synchronous phase right here, so it
    /// holds exactly the data lines before it and none after.
    pub fn execute(
        self: &std::sync::Arc<Self>,
        commands: Vec<Command>,
        answer: AnswerSink,
        imports: &std::sync::Mutex<StagedImports>,
    ) {
        let mut i = 0;
        while i < commands.len() {
            let command = &commands[i];
            if command.is_data() {
                let end = commands[i..]
                    .iter()
                    .position(|c| !c.is_data())
                    .map_or(commands.len(), |n| i + n);
                self.apply_data(i, &commands[i..end], &answer);
                i = end;
                continue;
            }
            match command {
                Command::Put { .. } | Command::Del { .. } => unreachable!("data runs above"),
                Command::Checkpoint => {
                    let staged = std::mem::take(&mut *ckptfs_core::fsutil::lock(imports));
                    match staged.refused {
                        // The checkpoint would lack what the script meant it to hold.
                        Some(why) => {
                            let e = Error::Invalid(format!(
                                "an import line before this checkpoint was refused ({why}): \
                                 nothing was checkpointed, and the imports staged on this \
                                 handle are dropped; stage them again"
                            ));
                            self.engine.record_error(e.to_string());
                            answer(i, error_json(&e));
                        }
                        None => self.start_checkpoint(i, answer.clone(), staged.dirs, imports),
                    }
                }
                Command::Import(import) => {
                    // Checked now (a bad directory is refused at its line), listed again
                    // by the checkpoint that stores it.
                    let answer_line = match ckptfs_core::import::scan(&import.backend, &import.dir)
                    {
                        Ok(scanned) => {
                            let mut staged = ckptfs_core::fsutil::lock(imports);
                            staged.dirs.retain(|s| s.backend != import.backend);
                            staged.dirs.push(import.clone());
                            let mut m = serde_json::Map::new();
                            m.insert("staged".into(), import.backend.to_string().into());
                            m.insert("files".into(), scanned.files.len().into());
                            m.insert("bytes".into(), scanned.bytes().into());
                            ok_json(m)
                        }
                        Err(e) => {
                            self.engine.record_error(e.to_string());
                            ckptfs_core::fsutil::lock(imports)
                                .refused
                                .get_or_insert_with(|| e.to_string());
                            error_json(&e)
                        }
                    };
                    answer(i, answer_line);
                }
                Command::ImportFlink { src, roots } => {
                    self.start_flink_import(i, answer.clone(), src, roots)
                }
                Command::Flush(b) => answer(i, self.simple(self.engine.flush(b))),
                Command::Compact(b) => answer(i, self.simple(self.engine.compact(b))),
                Command::Retain(n) => {
                    let result = self.engine.set_retain(*n);
                    self.changed();
                    answer(i, self.simple(result));
                }
                Command::Delete(n) => {
                    let result = self.engine.delete_checkpoint(*n);
                    self.changed();
                    answer(i, self.simple(result));
                }
            }
            i += 1;
        }
    }

    fn simple(&self, result: Result<()>) -> String {
        match result {
            Ok(()) => ok_json(Default::default()),
            Err(e) => {
                self.engine.record_error(e.to_string());
                error_json(&e)
            }
        }
    }

    /// Apply a run of data lines (starting at index `first` of the write) as one atomic
    /// batch per backend.
    fn apply_data(&self, first: usize, commands: &[Command], answer: &AnswerSink) {
        let mut batches: std::collections::BTreeMap<&BackendName, Vec<ckptfs_core::WriteOp>> =
            Default::default();
        for command in commands {
            match command {
                Command::Put {
                    backend,
                    key,
                    value,
                } => batches
                    .entry(backend)
                    .or_default()
                    .push(ckptfs_core::WriteOp::Put(key.clone(), value.clone())),
                Command::Del { backend, key } => batches
                    .entry(backend)
                    .or_default()
                    .push(ckptfs_core::WriteOp::Delete(key.clone())),
                _ => {}
            }
        }
        let mut results = std::collections::BTreeMap::new();
        for (backend, ops) in &batches {
            let r = self.engine.write(backend, ops);
            if let Err(e) = &r {
                self.engine
                    .record_error(format!("write to {backend} failed: {e}"));
            }
            results.insert(*backend, r.map_err(|e| error_json(&e)));
        }
        for (i, command) in commands.iter().enumerate() {
            if let Command::Put { backend, .. } | Command::Del { backend, .. } = command {
                match &results[backend] {
                    Ok(()) => answer(first + i, ok_json(Default::default())),
                    Err(json) => answer(first + i, json.clone()),
                }
            }
        }
    }

    /// The synchronous phase runs now, in line order, so the checkpoint holds exactly what
    /// was written before the command; the upload runs on its own thread. With no free
    /// slot (`max_concurrent` checkpoints in flight, or a restore running) the answer is
    /// EBUSY at once: nothing queues up behind a slow upload, and a checkpoint never holds
    /// data written after its line. `ckptfs checkpoint` retries busy answers.
    fn start_checkpoint(
        self: &std::sync::Arc<Self>,
        index: usize,
        answer: AnswerSink,
        dirs: Vec<ImportDir>,
        staging: &std::sync::Mutex<StagedImports>,
    ) {
        let began = dirs
            .iter()
            .map(|i| ckptfs_core::import::scan(&i.backend, &i.dir))
            .collect::<Result<Vec<_>>>()
            .and_then(|scanned| {
                self.engine
                    .begin(ckptfs_core::CheckpointPlan::Import(scanned))
            });
        let pending = match began {
            Ok(p) => p,
            Err(e) => {
                // Still staged: a checkpoint line that retries (after EBUSY) imports them.
                let mut staged = ckptfs_core::fsutil::lock(staging);
                if staged.dirs.is_empty() {
                    staged.dirs = dirs;
                }
                drop(staged);
                if !matches!(e, Error::Busy(_)) {
                    self.engine.record_error(e.to_string());
                }
                answer(index, error_json(&e));
                return;
            }
        };
        let this = self.clone();
        let answer_later = answer.clone();
        let started = self.spawn_worker("ckptfs-checkpoint", move || {
            let result = pending.complete_with_imports();
            this.changed();
            this.check_small_files();
            answer_later(
                index,
                match result {
                    Ok((m, imports)) => import_json(&m, &imports),
                    Err(e) => error_json(&e),
                },
            );
        });
        // The pending checkpoint moved into the closure that failed to start and was
        // dropped there, which aborted it.
        if let Err(e) = started {
            answer(index, error_json(&Error::io("spawn checkpoint thread", e)));
        }
    }

    /// Run `work` on a thread of its own, joined at shutdown.
    fn spawn_worker(
        &self,
        name: &str,
        work: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let handle = std::thread::Builder::new().name(name.into()).spawn(work)?;
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        workers.retain(|w| !w.is_finished());
        workers.push(handle);
        Ok(())
    }

    /// `import-flink SRC`: every completed checkpoint of the job that the store does not
    /// hold yet, on a thread of its own. Every `_metadata` is read first (a bad one is
    /// refused with nothing imported); a checkpoint slot taken (another checkpoint in
    /// flight) is waited for, up to [`FLINK_IMPORT_WAIT`]. The answer lists what was
    /// imported, or the error of the first checkpoint that failed (those before it stay).
    fn start_flink_import(
        self: &std::sync::Arc<Self>,
        index: usize,
        answer: AnswerSink,
        src: &std::path::Path,
        roots: &[std::path::PathBuf],
    ) {
        let this = self.clone();
        let src = src.to_path_buf();
        let roots = roots.to_vec();
        let answer_later = answer.clone();
        let started = self.spawn_worker("ckptfs-import-flink", move || {
            let result = this.import_flink_waiting(&src, &roots);
            if result.as_ref().map_or(true, |done| !done.is_empty()) {
                this.changed();
            }
            answer_later(
                index,
                match result {
                    Ok(done) => {
                        let mut m = serde_json::Map::new();
                        let done: Vec<serde_json::Value> = done
                            .iter()
                            .map(|line| serde_json::from_str(line).expect("an answer is JSON"))
                            .collect();
                        m.insert("imported".into(), done.into());
                        ok_json(m)
                    }
                    Err(e) => {
                        this.engine.record_error(e.to_string());
                        error_json(&e)
                    }
                },
            );
        });
        if let Err(e) = started {
            answer(index, error_json(&Error::io("spawn import thread", e)));
        }
    }

    /// [`ckptfs_core::Engine::import_flink`], retried while a checkpoint slot is taken: the
    /// answer of each imported checkpoint ([`import_json`]).
    fn import_flink_waiting(
        &self,
        src: &std::path::Path,
        roots: &[std::path::PathBuf],
    ) -> Result<Vec<String>> {
        use ckptfs_core::flink::import as flink;
        let src = flink::FlinkSource::open(src, roots)?;
        flink::check_all(&flink::completed(&src)?)?;
        let deadline = std::time::Instant::now() + FLINK_IMPORT_WAIT;
        let mut pause = std::time::Duration::from_millis(20);
        let mut done = Vec::new();
        loop {
            let mut busy = false;
            for imported in self.engine.import_flink(&src, false)? {
                match imported.result {
                    Ok((manifest, reports)) => done.push(import_json(&manifest, &reports)),
                    Err(Error::Busy(_)) if std::time::Instant::now() + pause < deadline => {
                        busy = true
                    }
                    Err(e) if done.is_empty() => return Err(e),
                    Err(e) => {
                        let ids: Vec<String> = done
                            .iter()
                            .map(|line| {
                                serde_json::from_str::<serde_json::Value>(line)
                                    .map(|a| a["id"].to_string())
                                    .unwrap_or_default()
                            })
                            .collect();
                        return Err(Error::Invalid(format!(
                            "checkpoint {} of Flink job {} was not imported: {e} (imported \
                             before it as checkpoints {})",
                            imported.checkpoint,
                            imported.job,
                            ids.join(", ")
                        )));
                    }
                }
            }
            if !busy || self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(done);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(500));
        }
    }

    /// Take a checkpoint every `period`, skipping a tick while one is still in flight.
    pub fn start_interval(self: &std::sync::Arc<Self>, period: std::time::Duration) {
        let handle = self.every(period, "ckptfs-interval", |this| {
            match this.engine.begin_checkpoint() {
                Ok(p) => {
                    if let Err(e) = p.complete() {
                        log::warn!("periodic checkpoint failed: {e}");
                    }
                    this.changed();
                    this.check_small_files();
                }
                Err(Error::Busy(why)) => log::info!("periodic checkpoint skipped: {why}"),
                Err(e) => log::warn!("periodic checkpoint failed: {e}"),
            }
        });
        *self.interval.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// After a checkpoint: if a backend has gathered twice as many small SSTs as the
    /// compaction waits for, run the compaction now (as RocksDB compacts L0 by file count):
    /// checkpoints every few milliseconds with time-ordered keys make hundreds of them
    /// within one period, and each one costs the sync phase.
    fn check_small_files(&self) {
        use std::sync::atomic::Ordering;
        let Some(policy) = *self.small_files.lock().unwrap_or_else(|p| p.into_inner()) else {
            return;
        };
        if self.compaction_due.load(Ordering::SeqCst) {
            return;
        }
        for name in self.engine.backend_names() {
            let small = self.engine.live_sst_files(&name).map_or(0, |files| {
                files
                    .iter()
                    .filter(|(_, size)| *size < policy.small_below)
                    .count()
            });
            if small >= policy.min_small_files.saturating_mul(2) {
                log::info!("backend {name} has {small} small SSTs: merging them now");
                self.compaction_due.store(true, Ordering::SeqCst);
                return;
            }
        }
    }

    /// Merge small SSTs of every backend every `period`, and as soon as a checkpoint finds
    /// many (see [`ckptfs_core::compaction`] and [`Controller::check_small_files`]).
    pub fn start_small_file_compaction(
        self: &std::sync::Arc<Self>,
        period: std::time::Duration,
        policy: ckptfs_core::compaction::SmallFilePolicy,
    ) {
        *self.small_files.lock().unwrap_or_else(|p| p.into_inner()) = Some(policy);
        let due = self.compaction_due.clone();
        let handle = self.every_or_when(period, Some(due), "ckptfs-small-files", move |this| {
            for name in this.engine.backend_names() {
                if this.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let stop = || this.stopping.load(std::sync::atomic::Ordering::SeqCst);
                if let Err(e) = this.engine.compact_small_files_until(&name, &policy, &stop) {
                    log::warn!("small-file compaction of {name} failed: {e}");
                }
            }
        });
        *self.compactor.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// Delete orphans older than the grace period every `period` (object storage: uploads
    /// that landed for checkpoints that then failed).
    pub fn start_orphan_sweep(self: &std::sync::Arc<Self>, period: std::time::Duration) {
        let handle = self.every(period, "ckptfs-sweep", |this| {
            match this.engine.sweep_orphans() {
                Ok(0) => {}
                Ok(n) => log::info!("deleted {n} orphaned objects older than the grace period"),
                Err(e) => log::warn!("orphan sweep failed: {e}"),
            }
        });
        *self.sweeper.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// A read-only view: look for checkpoints the writer committed or dropped every
    /// `period`, and show them.
    pub fn start_refresh(self: &std::sync::Arc<Self>, period: std::time::Duration) {
        let handle = self.every(period, "ckptfs-refresh", |this| {
            match this.engine.refresh_checkpoints() {
                Ok(true) => this.changed(),
                Ok(false) => {}
                Err(e) => log::warn!("could not read the store's checkpoints: {e}"),
            }
        });
        *self.refresher.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// Follow a Flink job (`mount --flink SRC`): every `period`, import its completed
    /// checkpoints the store does not hold yet. One that fails is reported in status and
    /// tried again at the next look (while it is still the newest), never blocking later
    /// ones.
    pub fn start_flink_follow(
        self: &std::sync::Arc<Self>,
        src: std::path::PathBuf,
        roots: Vec<std::path::PathBuf>,
        period: std::time::Duration,
    ) {
        let source = std::sync::OnceLock::new();
        // Failed checkpoints, tried again at every look while Flink has them.
        let retries = std::sync::Mutex::new(ckptfs_core::coordinator::Retries::default());
        let handle = self.every(period, "ckptfs-flink", move |this| {
            // Connected here, in the daemon (an S3 client's threads do not survive a fork).
            let source = match source.get() {
                Some(s) => s,
                None => match ckptfs_core::flink::import::FlinkSource::open(&src, &roots) {
                    Ok(s) => source.get_or_init(|| s),
                    Err(e) => {
                        this.engine
                            .record_error(format!("--flink {}: {e}", src.display()));
                        return;
                    }
                },
            };
            let mut retries = ckptfs_core::fsutil::lock(&retries);
            match this.engine.follow_flink(source, &mut retries) {
                Ok(imports) => {
                    for imported in &imports {
                        if let Err(e) = &imported.result {
                            this.engine.record_error(format!(
                                "could not import checkpoint {} of Flink job {} from {}: {e} \
                                 (tried again in {})",
                                imported.checkpoint,
                                imported.job,
                                src.display(),
                                humantime::format_duration(period)
                            ));
                        }
                    }
                    if imports.iter().any(|i| i.result.is_ok()) {
                        this.changed();
                    }
                }
                Err(e) => this.engine.record_error(format!(
                    "could not read Flink checkpoints in {}: {e}",
                    src.display()
                )),
            }
        });
        *self.follower.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// Run `tick` every `period` on a thread of its own until shutdown; a tick that takes
    /// longer than `period` delays the next one rather than piling up.
    fn every(
        self: &std::sync::Arc<Self>,
        period: std::time::Duration,
        name: &str,
        tick: impl Fn(&Self) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        self.every_or_when(period, None, name, tick)
    }

    /// [`Controller::every`], and also as soon as `due` is set (which the tick clears).
    fn every_or_when(
        self: &std::sync::Arc<Self>,
        period: std::time::Duration,
        due: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
        name: &str,
        tick: impl Fn(&Self) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let this = self.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                use std::sync::atomic::Ordering;
                let mut next = std::time::Instant::now() + period;
                while !this.stopping.load(Ordering::SeqCst) {
                    let now_due = due
                        .as_ref()
                        .is_some_and(|d| d.swap(false, Ordering::SeqCst));
                    if std::time::Instant::now() < next && !now_due {
                        std::thread::sleep(std::time::Duration::from_millis(50).min(period));
                        continue;
                    }
                    next += period;
                    tick(&this);
                    next = next.max(std::time::Instant::now());
                }
            })
            .expect("spawn a periodic thread")
    }

    /// Stop periodic checkpoints and let the in-flight ones finish.
    pub fn shutdown(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(h) = self
            .interval
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = h.join();
        }
        for handle in [
            &self.compactor,
            &self.sweeper,
            &self.refresher,
            &self.follower,
        ] {
            if let Some(h) = handle.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = h.join();
            }
        }
        let workers: Vec<_> = self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for w in workers {
            let _ = w.join();
        }
        self.engine.wait_idle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        let cmds = parse_write(
            b"checkpoint\nput op/1 a%20b v%25\ndel op/1 k\nflush op/1\ncompact op/1\nretain 2\ndelete 7\n",
        )
        .unwrap();
        let b: BackendName = "op/1".parse().unwrap();
        assert_eq!(
            cmds,
            vec![
                Command::Checkpoint,
                Command::Put {
                    backend: b.clone(),
                    key: b"a b".to_vec(),
                    value: b"v%".to_vec()
                },
                Command::Del {
                    backend: b.clone(),
                    key: b"k".to_vec()
                },
                Command::Flush(b.clone()),
                Command::Compact(b),
                Command::Retain(2),
                Command::Delete(7),
            ]
        );
    }

    #[test]
    fn no_final_newline_and_blank_lines_are_fine() {
        assert_eq!(
            parse_write(b"\ncheckpoint").unwrap(),
            vec![Command::Checkpoint]
        );
    }

    #[test]
    fn every_error_names_its_line() {
        for (input, needle) in [
            (&b"checkpoint\nbogus\n"[..], "line 2: unknown command"),
            (b"put op/1 k\n", "line 1: put takes 3"),
            (b"put op/1  k v\n", "takes 3"),
            (b"put ../1 k v\n", "invalid backend name"),
            (b"put op/1 k%zz v\n", "percent-escape"),
            (b"retain 0\n", "at least 1"),
            (b"retain -1\n", "not a non-negative integer"),
            (b"delete x\n", "not a non-negative integer"),
            (b"checkpoint now\n", "takes 0"),
            (b"\xff\n", "not UTF-8"),
            (b" \n", "empty command"),
        ] {
            let err = parse_write(input).unwrap_err().to_string();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
    }

    proptest::proptest! {
        /// Any input is either parsed or refused with an error, never a panic; and a
        /// parsed put carries exactly the bytes that were percent-encoded.
        #[test]
        fn parsing_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = parse_write(&data);
        }

        #[test]
        fn put_round_trips_any_key_and_value(
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let line = format!("put op/0 {} {}", percent::encode(&key), percent::encode(&value));
            let parsed = parse_write(line.as_bytes()).unwrap();
            proptest::prop_assert_eq!(parsed, vec![Command::Put {
                backend: "op/0".parse().unwrap(),
                key,
                value,
            }]);
        }
    }
}
