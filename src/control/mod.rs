//! Running control commands: [`protocol`] says what a line means and how it is answered;
//! the [`Controller`] checks a write's commands against the engine, then runs them in the
//! order of their lines, data lines as atomic batches, checkpoints and Flink imports on
//! threads of their own (never on the caller's, a FUSE thread): answers are delivered
//! through a callback. The daemon's periodic tasks (`crate::daemon::tasks`) run against
//! the same controller.

pub mod import_flink;
pub mod protocol;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ckptfs_core::compaction::SmallFilePolicy;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;
use ckptfs_core::import::ImportDir;
use ckptfs_core::names::BackendName;
use ckptfs_core::Engine;

use crate::retry::{is_busy, Backoff};
use protocol::{
    Answer, CheckpointDone, Done, Failure, Imported, Line, Plan, Reply, Request, StagedImport,
    StatusReply,
};

/// What `import` lines staged on one control handle for its next `checkpoint`.
#[derive(Debug, Default)]
pub struct StagedImports {
    /// The directories as their `import` lines listed and checked them (their files held
    /// open since), at most one per backend (a later line replaces an earlier one): the
    /// next `checkpoint` imports these, not a new listing.
    pub dirs: Vec<ckptfs_core::import::Scanned>,
    /// An `import` line was refused: the next `checkpoint` is refused too (and the staged
    /// set dropped), so that a script never gets a checkpoint without what it staged.
    pub refused: Option<String>,
}

/// How long `import-flink` through a mount waits for a checkpoint slot (one in flight).
pub const FLINK_IMPORT_WAIT: Duration = Duration::from_secs(120);

/// One write of a front door (the control file, the control socket) as commands: its
/// lines parsed, then checked by `validate` (the engine's checks); a refused write is
/// recorded by `record` (it shows in status, whoever reads the answer).
pub fn checked_commands(
    text: &[u8],
    validate: impl FnOnce(&[Request]) -> Result<()>,
    record: impl FnOnce(String),
) -> Result<Vec<Request>> {
    let commands = protocol::parse_write(text).and_then(|c| validate(&c).map(|()| c));
    if let Err(e) = &commands {
        record(e.to_string());
    }
    commands
}

/// Runs control commands against an engine.
pub struct Controller {
    engine: Engine,
    /// Checkpoint and import threads, joined at shutdown.
    workers: Mutex<Vec<JoinHandle<()>>>,
    stopping: Arc<AtomicBool>,
    on_change: Mutex<Option<ChangeHook>>,
    /// The small-file compaction's policy, once it runs.
    small_files: Mutex<Option<SmallFilePolicy>>,
    /// Set after a checkpoint that found a backend with twice the policy's number of small
    /// SSTs: the compaction runs at once instead of at its next period.
    compaction_due: Arc<AtomicBool>,
}

/// Called after the set of retained checkpoints may have changed.
pub type ChangeHook = Arc<dyn Fn() + Send + Sync>;
/// Delivers the answer of the command at an index of a write.
pub type AnswerSink = Arc<dyn Fn(usize, Answer) + Send + Sync>;

/// The answer of a command that returns nothing, recording a failure in status.
fn done(engine: &Engine, result: Result<()>) -> Answer {
    result.map(|()| Reply::Done(Done {})).map_err(|e| {
        engine.record_error(e.to_string());
        Failure::of(&e)
    })
}

impl Controller {
    /// A controller of `engine`, with no change hook yet.
    pub fn new(engine: Engine) -> Self {
        Controller {
            engine,
            workers: Default::default(),
            stopping: Default::default(),
            on_change: Default::default(),
            small_files: Default::default(),
            compaction_due: Default::default(),
        }
    }

    /// The engine the commands run against.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    #[cfg(test)]
    pub(crate) fn workers_for_tests(&self) -> &Mutex<Vec<JoinHandle<()>>> {
        &self.workers
    }

    /// Call `hook` whenever the retained checkpoints may have changed.
    pub fn set_change_hook(&self, hook: ChangeHook) {
        *lock(&self.on_change) = Some(hook);
    }

    /// Tell the tree that the retained checkpoints may have changed.
    pub(crate) fn changed(&self) {
        let hook = lock(&self.on_change).clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// Set once the daemon stops: periodic tasks and waits end.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Checks that need the engine, each the engine's own (`Engine::check_*`: one rule,
    /// one message, one errno): a written backend is hosted, an import's is not, a dropped
    /// or pinned checkpoint is retained. A refusal names its line when the write has
    /// several.
    pub fn validate(&self, commands: &[Request]) -> Result<()> {
        for (i, command) in commands.iter().enumerate() {
            let checked = match command {
                Request::Import(import) => self.engine.check_import_into(&import.backend),
                Request::Put { backend, .. }
                | Request::Del { backend, .. }
                | Request::Flush(backend)
                | Request::Compact(backend) => self.engine.check_hosted(backend),
                Request::Delete(n) | Request::Pin { id: n, .. } => self.engine.check_checkpoint(*n),
                _ => Ok(()),
            };
            // The engine's rule, message and errno; which line, where there are several.
            checked.map_err(|e| match commands.len() {
                1 => e,
                _ => e.context(format!("command {}", i + 1)),
            })?;
        }
        Ok(())
    }

    /// Run validated commands in the order of their lines. A run of consecutive data lines
    /// (put, del) is applied as one atomic batch per backend at its position; any other
    /// command ends the run. A `checkpoint` takes its synchronous phase right here, so it
    /// holds exactly the data lines before it and none after.
    pub fn execute(
        self: &Arc<Self>,
        commands: Vec<Request>,
        answer: AnswerSink,
        imports: &Mutex<StagedImports>,
    ) {
        let mut i = 0;
        while i < commands.len() {
            if commands[i].is_data() {
                let end = commands[i..]
                    .iter()
                    .position(|c| !c.is_data())
                    .map_or(commands.len(), |n| i + n);
                self.apply_data(i, &commands[i..end], &answer);
                i = end;
                continue;
            }
            match &commands[i] {
                Request::Put { .. } | Request::Del { .. } => unreachable!("data runs above"),
                Request::Checkpoint => {
                    let staged = std::mem::take(&mut *lock(imports));
                    match staged.refused {
                        // The checkpoint would lack what the script meant it to hold.
                        Some(why) => {
                            let e = Error::Invalid(format!(
                                "an import line before this checkpoint was refused ({why}): \
                                 nothing was checkpointed, and the imports staged on this \
                                 handle are dropped; stage them again"
                            ));
                            self.engine.record_error(e.to_string());
                            answer(i, Err(Failure::of(&e)));
                        }
                        None => self.start_checkpoint(i, answer.clone(), staged.dirs, imports),
                    }
                }
                Request::Import(import) => answer(i, self.stage_import(import, imports)),
                Request::ImportFlink { src, roots } => {
                    self.start_flink_import(i, answer.clone(), src, roots)
                }
                Request::Flush(b) => answer(i, done(&self.engine, self.engine.flush(b))),
                Request::Compact(b) => answer(i, done(&self.engine, self.engine.compact(b))),
                Request::Retain(n) => {
                    let result = self.engine.set_retain(*n);
                    self.changed();
                    answer(i, done(&self.engine, result));
                }
                Request::Delete(n) => {
                    let result = self.engine.delete_checkpoint(*n);
                    self.changed();
                    answer(i, done(&self.engine, result));
                }
                Request::Keep(policy) => {
                    let result = self.engine.set_policy(policy.clone());
                    self.changed();
                    let result = result.map(|decisions| {
                        Reply::Plan(Plan {
                            policy: policy.to_rules(),
                            decisions,
                        })
                    });
                    answer(
                        i,
                        result.map_err(|e| {
                            self.engine.record_error(e.to_string());
                            Failure::of(&e)
                        }),
                    );
                }
                Request::Forget(policy) => {
                    let used = policy.clone().unwrap_or_else(|| self.engine.policy());
                    answer(
                        i,
                        Ok(Reply::Plan(Plan {
                            policy: used.to_rules(),
                            decisions: self.engine.forget_plan(Some(&used)),
                        })),
                    );
                }
                Request::Pin { id, name } => {
                    let result = self.engine.pin(*id, name);
                    self.changed();
                    answer(i, done(&self.engine, result));
                }
                Request::Unpin(name) => {
                    let result = self.engine.unpin(name).map(|_| ());
                    self.changed();
                    answer(i, done(&self.engine, result));
                }
                Request::Status => {
                    let status = Box::new(ckptfs_core::views::Status::of(&self.engine));
                    answer(i, Ok(Reply::Status(StatusReply { status })));
                }
            }
            i += 1;
        }
    }

    /// An `import` line: listed and checked now (a bad directory is refused at its line);
    /// the checkpoint that stores it imports this listing, each file held open since (one
    /// written meanwhile fails it), without listing the directory again.
    fn stage_import(&self, import: &ImportDir, imports: &Mutex<StagedImports>) -> Answer {
        match ckptfs_core::import::scan(&import.backend, &import.dir) {
            Ok(scanned) => {
                let reply = StagedImport {
                    staged: import.backend.clone(),
                    files: scanned.files.len() as u64,
                    bytes: scanned.bytes(),
                };
                let mut staged = lock(imports);
                staged.dirs.retain(|s| s.backend != import.backend);
                staged.dirs.push(scanned);
                Ok(Reply::StagedImport(reply))
            }
            Err(e) => {
                self.engine.record_error(e.to_string());
                lock(imports).refused.get_or_insert_with(|| e.to_string());
                Err(Failure::of(&e))
            }
        }
    }

    /// Apply a run of data lines (starting at index `first` of the write) as one atomic
    /// batch per backend.
    fn apply_data(&self, first: usize, commands: &[Request], answer: &AnswerSink) {
        let mut batches: BTreeMap<&BackendName, Vec<ckptfs_core::WriteOp>> = Default::default();
        for command in commands {
            match command {
                Request::Put {
                    backend,
                    key,
                    value,
                } => batches
                    .entry(backend)
                    .or_default()
                    .push(ckptfs_core::WriteOp::Put(key.clone(), value.clone())),
                Request::Del { backend, key } => batches
                    .entry(backend)
                    .or_default()
                    .push(ckptfs_core::WriteOp::Delete(key.clone())),
                _ => {}
            }
        }
        let mut results = BTreeMap::new();
        for (backend, ops) in &batches {
            let result = self.engine.write(backend, ops);
            if let Err(e) = &result {
                self.engine
                    .record_error(format!("write to {backend} failed: {e}"));
            }
            let answer: Answer = result
                .map(|()| Reply::Done(Done {}))
                .map_err(|e| Failure::of(&e));
            results.insert(*backend, answer);
        }
        for (i, command) in commands.iter().enumerate() {
            if let Request::Put { backend, .. } | Request::Del { backend, .. } = command {
                answer(first + i, results[backend].clone());
            }
        }
    }

    /// The synchronous phase runs now, in line order, so the checkpoint holds exactly what
    /// was written before the command; the upload runs on its own thread. With no free
    /// slot (`max_concurrent` checkpoints in flight, or a restore running) the answer is
    /// EBUSY at once: nothing queues up behind a slow upload, and a checkpoint never holds
    /// data written after its line. `ckptfs checkpoint` retries busy answers.
    fn start_checkpoint(
        self: &Arc<Self>,
        index: usize,
        answer: AnswerSink,
        dirs: Vec<ckptfs_core::import::Scanned>,
        staging: &Mutex<StagedImports>,
    ) {
        let began = self
            .engine
            .begin(ckptfs_core::CheckpointPlan::Import(dirs.clone()));
        let pending = match began {
            Ok(p) => p,
            Err(e) => {
                // Still staged: a checkpoint line that retries (after EBUSY) imports them.
                let mut staged = lock(staging);
                if staged.dirs.is_empty() {
                    staged.dirs = dirs;
                }
                drop(staged);
                if !is_busy(&e) {
                    self.engine.record_error(e.to_string());
                }
                answer(index, Err(Failure::of(&e)));
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
                result
                    .map(|(m, imports)| Reply::Checkpoint(CheckpointDone::of(&m, imports)))
                    .map_err(|e| Failure::of(&e)),
            );
        });
        // The pending checkpoint moved into the closure that failed to start and was
        // dropped there, which aborted it.
        if let Err(e) = started {
            answer(
                index,
                Err(Failure::of(&Error::io("spawn checkpoint thread", e))),
            );
        }
    }

    /// Run `work` on a thread of its own, joined at shutdown.
    fn spawn_worker(
        &self,
        name: &str,
        work: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let handle = std::thread::Builder::new().name(name.into()).spawn(work)?;
        let mut workers = lock(&self.workers);
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
        self: &Arc<Self>,
        index: usize,
        answer: AnswerSink,
        src: &Path,
        roots: &[PathBuf],
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
                    Ok(done) => Ok(Reply::Imported(Imported {
                        imported: done.into_iter().map(Line::ok).collect(),
                    })),
                    Err(e) => {
                        this.engine.record_error(e.to_string());
                        Err(Failure::of(&e))
                    }
                },
            );
        });
        if let Err(e) = started {
            answer(
                index,
                Err(Failure::of(&Error::io("spawn import thread", e))),
            );
        }
    }

    /// [`import_flink::import`] of a checked plan, a checkpoint slot taken waited for
    /// until [`FLINK_IMPORT_WAIT`] has passed or the daemon stops: what each imported
    /// checkpoint answers.
    fn import_flink_waiting(&self, src: &Path, roots: &[PathBuf]) -> Result<Vec<CheckpointDone>> {
        let plan = import_flink::checked_plan(src, roots)?;
        let mut backoff = Backoff::new(FLINK_IMPORT_WAIT);
        import_flink::import(&self.engine, &plan, || !self.stopping() && backoff.pause())
            .map(|done| done.into_iter().map(|d| d.done).collect())
            .map_err(|failed| failed.error)
    }

    /// After a checkpoint: if a backend has gathered twice as many small SSTs as the
    /// compaction waits for, run the compaction at once (as RocksDB compacts L0 by file
    /// count): checkpoints every few milliseconds with time-ordered keys make hundreds of
    /// them within one period, and each one costs the sync phase.
    pub(crate) fn check_small_files(&self) {
        let Some(policy) = *lock(&self.small_files) else {
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

    /// Ask [`Controller::check_small_files`] to watch for `policy`; the flag it sets.
    pub(crate) fn watch_small_files(&self, policy: SmallFilePolicy) -> Arc<AtomicBool> {
        *lock(&self.small_files) = Some(policy);
        self.compaction_due.clone()
    }

    /// The daemon stops: periodic tasks and waits end at their next look.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Let the in-flight checkpoints and imports finish (after [`Controller::stop`] and
    /// the periodic tasks have ended).
    pub fn shutdown(&self) {
        self.stop();
        let workers: Vec<_> = lock(&self.workers).drain(..).collect();
        for w in workers {
            let _ = w.join();
        }
        self.engine.wait_idle();
    }
}
