//! The daemon's periodic work, each task on a thread of its own against the mount's
//! [`Controller`]: checkpoints every `--interval`, the small-file compaction, the orphan
//! sweep of object storage, a read-only view's refresh, the expiry of restore leases, and
//! following a Flink job. A tick
//! that takes longer than its period delays the next one rather than piling up; all of
//! them end at [`Tasks::stop`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ckptfs_core::compaction::SmallFilePolicy;
use ckptfs_core::coordinator::{Retries, Retry};
use ckptfs_core::error::{Error, Result};
use ckptfs_core::flink::import::FlinkSource;
use ckptfs_core::fsutil::lock;

use crate::control::Controller;
use crate::retry::is_busy;

/// The running periodic tasks of one mount.
pub struct Tasks {
    controller: Arc<Controller>,
    running: Vec<JoinHandle<()>>,
}

impl Tasks {
    /// No tasks yet, for the mount `controller` runs.
    pub fn new(controller: Arc<Controller>) -> Self {
        Tasks {
            controller,
            running: Vec::new(),
        }
    }

    /// Take a checkpoint every `period`, skipping a tick while one is still in flight.
    pub fn interval(&mut self, period: Duration) -> Result<()> {
        self.every(period, None, "ckptfs-interval", |this| {
            match this.engine().begin_checkpoint() {
                Ok(p) => {
                    if let Err(e) = p.complete() {
                        log::warn!("periodic checkpoint failed: {e}");
                    }
                    this.changed();
                    this.check_small_files();
                }
                Err(e) if is_busy(&e) => log::info!("periodic checkpoint skipped: {e}"),
                Err(e) => log::warn!("periodic checkpoint failed: {e}"),
            }
        })
    }

    /// Merge small SSTs of every backend every `period`, and as soon as a checkpoint finds
    /// many (see [`ckptfs_core::compaction`] and [`Controller::check_small_files`]).
    pub fn small_file_compaction(
        &mut self,
        period: Duration,
        policy: SmallFilePolicy,
    ) -> Result<()> {
        let due = self.controller.watch_small_files(policy);
        self.every(period, Some(due), "ckptfs-small-files", move |this| {
            for name in this.engine().backend_names() {
                if this.stopping() {
                    break;
                }
                let stop = || this.stopping();
                if let Err(e) = this
                    .engine()
                    .compact_small_files_until(&name, &policy, &stop)
                {
                    log::warn!("small-file compaction of {name} failed: {e}");
                }
            }
        })
    }

    /// Delete orphans older than the grace period every `period` (object storage: uploads
    /// that landed for checkpoints that then failed).
    pub fn orphan_sweep(&mut self, period: Duration) -> Result<()> {
        self.every(period, None, "ckptfs-sweep", |this| {
            match this.engine().sweep_orphans() {
                Ok(0) => {}
                Ok(n) => log::info!("deleted {n} orphaned objects older than the grace period"),
                Err(e) => log::warn!("orphan sweep failed: {e}"),
            }
        })
    }

    /// Remove the pins whose time is up (restore leases) every `period`; the policy then
    /// decides what they held.
    pub fn expire_pins(&mut self, period: Duration) -> Result<()> {
        self.every(period, None, "ckptfs-expire", |this| {
            match this
                .engine()
                .expire_pins(ckptfs_core::fsutil::now_unix_ms())
            {
                Ok(gone) if gone.is_empty() => {}
                Ok(gone) => {
                    for (name, id) in gone {
                        log::info!("{name} on cp-{id} expired: cp-{id} is left to the policy");
                    }
                    this.changed();
                }
                Err(e) if is_busy(&e) => {}
                Err(e) => log::warn!("could not remove the expired pins: {e}"),
            }
        })
    }

    /// A read-only view: look for checkpoints the writer committed or dropped every
    /// `period`, and show them.
    pub fn refresh(&mut self, period: Duration) -> Result<()> {
        self.every(period, None, "ckptfs-refresh", |this| {
            match this.engine().refresh_checkpoints() {
                Ok(true) => this.changed(),
                Ok(false) => {}
                Err(e) => log::warn!("could not read the store's checkpoints: {e}"),
            }
        })
    }

    /// Follow a Flink job (`mount --flink SRC`): every `period`, import its completed
    /// checkpoints the store does not hold yet. One that fails is reported in status, never
    /// blocking later ones, and tried again while Flink has it: one refused for what it is
    /// once its `_metadata` changes, one that failed otherwise after a pause growing from a
    /// second to a minute ([`Retries`]). Each look that lists Flink's checkpoints is noted
    /// in `view`.
    pub fn flink_follow(
        &mut self,
        src: PathBuf,
        roots: Vec<PathBuf>,
        period: Duration,
    ) -> Result<()> {
        let source = OnceLock::new();
        // What the follower remembers between its looks: the listing, failed checkpoints.
        let retries = Mutex::new(Retries::default());
        let due = self.flink_watch(&src)?;
        // Its health is shown from now on (metrics, status), before its first look.
        self.controller
            .engine()
            .follow_flink_from(src.display().to_string());
        self.every(period, due, "ckptfs-flink", move |this| {
            // Connected here, in the daemon (an S3 client's threads do not survive a fork).
            let source = match source.get() {
                Some(s) => s,
                None => match FlinkSource::open(&src, &roots) {
                    Ok(s) => source.get_or_init(|| s),
                    Err(e) => {
                        this.engine()
                            .record_error(format!("--flink {}: {e}", src.display()));
                        return;
                    }
                },
            };
            let mut retries = lock(&retries);
            match this.engine().follow_flink(source, &mut retries) {
                Ok(imports) => {
                    for imported in &imports {
                        if let Err(e) = &imported.result {
                            let again = match imported.retry {
                                Some(Retry::WhenChanged) => {
                                    "refused: read again once its _metadata changes".to_string()
                                }
                                Some(Retry::After(wait)) => {
                                    format!("tried again in {}", humantime::format_duration(wait))
                                }
                                None => "not tried again".to_string(),
                            };
                            this.engine().record_error(format!(
                                "could not import checkpoint {} of Flink job {} from {}: {e} \
                                 ({again})",
                                imported.checkpoint,
                                imported.job,
                                src.display(),
                            ));
                        }
                    }
                    if imports.iter().any(|i| i.result.is_ok()) {
                        this.changed();
                    }
                }
                Err(e) => this.engine().record_error(format!(
                    "could not read Flink checkpoints in {}: {e}",
                    src.display()
                )),
            }
        })
    }

    /// Run `tick` every `period` (and as soon as `due` is set, which the tick clears) on a
    /// thread of its own until the controller stops.
    /// Where `src` is a local directory (and `CKPTFS_FLINK_POLL_ONLY` is not set): an
    /// inotify watcher of it ([`super::watch`]) on a thread of its own, and the flag it
    /// sets when the follower should look now.
    fn flink_watch(&mut self, src: &std::path::Path) -> Result<Option<Arc<AtomicBool>>> {
        if src.to_string_lossy().starts_with("s3://")
            || std::env::var_os("CKPTFS_FLINK_POLL_ONLY").is_some()
        {
            return Ok(None);
        }
        // `--flink` takes a path or a file:// URL.
        let shown = src.to_string_lossy();
        let path = shown
            .strip_prefix("file://")
            .or_else(|| shown.strip_prefix("file:"))
            .map_or_else(|| src.to_path_buf(), std::path::PathBuf::from);
        let due = Arc::new(AtomicBool::new(false));
        let watcher = match super::watch::Watcher::new(&path, due.clone()) {
            Ok(w) => w,
            Err(e) => {
                log::warn!("inotify: {e}; the poll alone follows {}", src.display());
                return Ok(None);
            }
        };
        let this = self.controller.clone();
        let handle = std::thread::Builder::new()
            .name("ckptfs-flink-watch".into())
            .spawn(move || watcher.run(|| this.stopping()))
            .map_err(|e| Error::io("start the Flink watcher", e))?;
        self.running.push(handle);
        Ok(Some(due))
    }

    fn every(
        &mut self,
        period: Duration,
        due: Option<Arc<AtomicBool>>,
        name: &str,
        tick: impl Fn(&Controller) + Send + 'static,
    ) -> Result<()> {
        let this = self.controller.clone();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut next = Instant::now() + period;
                while !this.stopping() {
                    let now_due = due
                        .as_ref()
                        .is_some_and(|d| d.swap(false, Ordering::SeqCst));
                    if Instant::now() < next && !now_due {
                        // A task others can make due looks at its flag more often.
                        let nap = if due.is_some() { 10 } else { 50 };
                        std::thread::sleep(Duration::from_millis(nap).min(period));
                        continue;
                    }
                    next += period;
                    tick(&this);
                    next = next.max(Instant::now());
                }
            })
            .map_err(|e| Error::io(format!("start the periodic task {name}"), e))?;
        self.running.push(handle);
        Ok(())
    }

    /// Stop every task and wait for its tick in progress to end.
    pub fn stop(self) {
        self.controller.stop();
        for handle in self.running {
            if handle.join().is_err() {
                log::warn!("a periodic task panicked");
            }
        }
    }
}
