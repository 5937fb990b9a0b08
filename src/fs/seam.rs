//! The seam between the mounted tree and the engine: the calls the tree makes of the
//! retained checkpoints and their objects ([`Checkpoints`]) and of the control commands
//! ([`ControlLines`]), and their implementation on the daemon's [`Controller`] ([`Live`]).
//! The tree holds these traits, not the controller, so its tests can run on checkpoints
//! held in memory (`double.rs`) without RocksDB.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control::protocol::Request;
use crate::control::{AnswerSink, ChangeHook, Controller, StagedImports};
use ckptfs_core::catalog::Manifest;
use ckptfs_core::error::Result;
use ckptfs_core::fsutil::lock;
use ckptfs_core::store::{ObjectId, ObjectStore};
use ckptfs_core::views;

/// What the tree reads of the retained checkpoints, the one change it makes (`rmdir
/// cp-N`), and where it records what went wrong.
pub trait Checkpoints: Send + Sync {
    /// The retained checkpoints, oldest first.
    fn checkpoints(&self) -> Vec<Arc<Manifest>>;
    /// Checkpoint `id`, if it is retained.
    fn manifest(&self, id: u64) -> Option<Arc<Manifest>>;
    /// Where the checkpoints' files are stored.
    fn object_store(&self) -> &dyn ObjectStore;
    /// How many references each stored object has (`.ckptfs/registry`).
    fn reference_counts(&self) -> BTreeMap<ObjectId, u32>;
    /// Drop checkpoint `id` (`rmdir cp-N`).
    fn delete_checkpoint(&self, id: u64) -> Result<()>;
    /// The pins: name -> checkpoint (`pinned/`).
    fn pins(&self) -> BTreeMap<String, u64>;
    /// The checkpoint pinned as `name` (`pinned/NAME`), without copying every pin.
    fn pinned(&self, name: &str) -> Option<u64>;
    /// A Flink job restored from checkpoint `id` in CLAIM mode tried to delete `path` of
    /// it: keep the checkpoint (the job's checkpoints name its files) and say so.
    fn flink_claimed(&self, id: u64, path: &str);
    /// A file of checkpoint `id`, a Flink checkpoint, was opened for reading: its
    /// `_metadata` (`metadata`: what a Flink job restoring from it opens first) takes or
    /// refreshes the restore lease `restore-cp-N`; any other file refreshes one held.
    fn restore_read(&self, id: u64, metadata: bool);
    /// Keep `message` as the last error (shown in status and metrics).
    fn record_error(&self, message: String);
    /// `.ckptfs/status`, as the checkpoints are at the call.
    fn status_text(&self) -> String;
    /// `.ckptfs/metrics`, as the checkpoints are at the call.
    fn metrics_text(&self) -> String;
    /// The directory whose filesystem `statfs` describes.
    fn room(&self) -> &Path;
    /// Have `hook` called whenever the set of retained checkpoints may have changed.
    fn set_change_hook(&self, hook: ChangeHook);
}

/// What the control file asks of the controller: check a write's commands, then run them.
pub trait ControlLines: Send + Sync {
    /// Checks that need the engine (see [`Controller::validate`]).
    fn validate(&self, commands: &[Request]) -> Result<()>;
    /// Run validated commands in line order, answering each through `answer` (see
    /// [`Controller::execute`]).
    fn execute(&self, commands: Vec<Request>, answer: AnswerSink, imports: &Mutex<StagedImports>);
}

/// Both traits on the daemon's controller and its engine.
pub struct Live(Arc<Controller>, RestoreLeases);

/// The restore leases a mount takes ([`Checkpoints::restore_read`]).
struct RestoreLeases {
    /// How long a lease lasts after the last read that refreshed it; `None`: none taken.
    time: Option<Duration>,
    /// When each checkpoint's lease was last asked for: asked again only a tenth of the
    /// lease time later (a restore opens thousands of files).
    asked: Mutex<HashMap<u64, Instant>>,
}

/// The restore lease a mount takes by default (`mount --restore-lease`).
pub const DEFAULT_RESTORE_LEASE: Duration = Duration::from_secs(3600);

/// The name of the restore lease on checkpoint `id`.
pub fn restore_lease_name(id: u64) -> String {
    format!("restore-cp-{id}")
}

impl Live {
    /// The seam over the daemon's `controller`, taking restore leases of
    /// [`DEFAULT_RESTORE_LEASE`].
    pub fn new(controller: Arc<Controller>) -> Self {
        Self::with_restore_lease(controller, Some(DEFAULT_RESTORE_LEASE))
    }

    /// The seam over the daemon's `controller`, taking restore leases of `time` (`None`:
    /// none).
    pub fn with_restore_lease(controller: Arc<Controller>, time: Option<Duration>) -> Self {
        Live(
            controller,
            RestoreLeases {
                time,
                asked: Mutex::default(),
            },
        )
    }

    /// Whether to ask for checkpoint `id`'s lease now, noting that it is; the interval
    /// between two asks.
    fn ask_lease(&self, id: u64, every: Duration) -> bool {
        let mut asked = lock(&self.1.asked);
        if asked.get(&id).is_some_and(|at| at.elapsed() < every) {
            return false;
        }
        if asked.len() >= 1024 {
            asked.retain(|_, at| at.elapsed() < every);
        }
        asked.insert(id, Instant::now());
        true
    }
}

impl Checkpoints for Live {
    fn checkpoints(&self) -> Vec<Arc<Manifest>> {
        self.0.engine().checkpoints()
    }

    fn manifest(&self, id: u64) -> Option<Arc<Manifest>> {
        self.0.engine().manifest(id)
    }

    fn object_store(&self) -> &dyn ObjectStore {
        self.0.engine().object_store()
    }

    fn reference_counts(&self) -> BTreeMap<ObjectId, u32> {
        self.0.engine().reference_counts()
    }

    fn delete_checkpoint(&self, id: u64) -> Result<()> {
        self.0.engine().delete_checkpoint(id)
    }

    fn pins(&self) -> BTreeMap<String, u64> {
        self.0.engine().pins()
    }

    fn pinned(&self, name: &str) -> Option<u64> {
        self.0.engine().pinned(name)
    }

    /// Pinned as `flink-claim-cp-N` off the FUSE thread (a pin waits for the catalog, which
    /// a checkpoint's commit may hold); on a read-only view only said.
    fn flink_claimed(&self, id: u64, path: &str) {
        let controller = self.0.clone();
        let path = path.to_string();
        let spawned = std::thread::Builder::new()
            .name("ckptfs-claim".into())
            .spawn(move || {
                let engine = controller.engine();
                let name = format!("flink-claim-cp-{id}");
                let kept = if engine.is_read_only() {
                    "this read-only view cannot pin it: pin it on the writer's host".to_string()
                } else {
                    match engine.pin(id, &name) {
                        Ok(()) => {
                            format!("pinned as {name}: unpin it once that job no longer needs it")
                        }
                        Err(e) => format!("and pinning it as {name} failed: {e}"),
                    }
                };
                let msg = format!(
                    "a Flink job restored from cp-{id} in CLAIM mode tried to delete {path} \
                     (refused: read-only). ckptfs supports restoring from the mount in \
                     NO_CLAIM mode only; in CLAIM mode the job's checkpoints name this \
                     checkpoint's files. cp-{id} is {kept}"
                );
                log::error!("{msg}");
                engine.record_error(msg);
                controller.changed();
            });
        if let Err(e) = spawned {
            log::error!("cp-{id} was claimed by a Flink job and cannot be pinned: {e}");
        }
    }

    /// Taken or moved later off the FUSE thread (as a pin, it waits for the catalog); a
    /// read-only view takes none (its writer's host must pin).
    fn restore_read(&self, id: u64, metadata: bool) {
        let Some(time) = self.1.time else {
            return;
        };
        let name = restore_lease_name(id);
        let engine = self.0.engine();
        let held = engine.pinned(&name) == Some(id);
        if engine.is_read_only() || !(metadata || held) {
            return;
        }
        // A lease held is moved later at most once a tenth of its time; one not held (never
        // taken, expired, unpinned) is taken at once.
        let every = (time / 10).max(Duration::from_millis(100));
        if held && !self.ask_lease(id, every) {
            return;
        }
        let controller = self.0.clone();
        let spawned = std::thread::Builder::new()
            .name("ckptfs-lease".into())
            .spawn(move || {
                let engine = controller.engine();
                let until = ckptfs_core::fsutil::now_unix_ms()
                    .saturating_add(time.as_millis().try_into().unwrap_or(u64::MAX));
                let slack = every.as_millis().try_into().unwrap_or(u64::MAX);
                match engine.lease(id, &name, until, slack) {
                    Ok(true) => {
                        log::info!(
                            "cp-{id} read as a restore: held as {name} for {}",
                            humantime::format_duration(time)
                        );
                        controller.changed();
                    }
                    Ok(false) => {}
                    // Dropped meanwhile: nothing to hold.
                    Err(ckptfs_core::error::Error::NoSuchCheckpoint(_)) => {}
                    Err(e) => {
                        let msg = format!("could not hold cp-{id} as {name}: {e}");
                        log::warn!("{msg}");
                        engine.record_error(msg);
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("could not hold cp-{id} with a restore lease: {e}");
        }
    }

    fn record_error(&self, message: String) {
        self.0.engine().record_error(message);
    }

    fn status_text(&self) -> String {
        views::to_pretty_text(&views::Status::of(self.0.engine()))
    }

    fn metrics_text(&self) -> String {
        ckptfs_core::metrics::render(self.0.engine())
    }

    /// Room in a local store, or in the state directory (cache) of one on object storage.
    fn room(&self) -> &Path {
        let engine = self.0.engine();
        engine.location().local().unwrap_or(engine.state_dir())
    }

    fn set_change_hook(&self, hook: ChangeHook) {
        self.0.set_change_hook(hook);
    }
}

impl ControlLines for Live {
    fn validate(&self, commands: &[Request]) -> Result<()> {
        self.0.validate(commands)
    }

    fn execute(&self, commands: Vec<Request>, answer: AnswerSink, imports: &Mutex<StagedImports>) {
        self.0.execute(commands, answer, imports);
    }
}
