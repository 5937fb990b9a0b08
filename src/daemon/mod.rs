//! The daemon of `ckptfs mount` and `ckptfs serve`: open the engine, start its tasks, the
//! metrics and the front doors (the control socket of both, and the FUSE tree of a mount),
//! serve until unmounted or signalled.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};

use crate::control::Controller;
use crate::fs::fuse::{FuseAdapter, NotifierInvalidator};
use crate::fs::CkptFs;
use crate::metrics_http::MetricsServer;
use ckptfs_core::coordinator::{Engine, EngineConfig};
use ckptfs_core::error::{Error, IoContext, Result};
use tasks::Tasks;

pub mod socket;
pub mod tasks;
mod watch;

/// What a daemon serves, from its options (`crate`'s `cli::MountArgs` and `cli::ServeArgs`).
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// The engine to open: the store, the state directory, the backends, retention.
    pub engine: EngineConfig,
    /// Where the tree is mounted (None: no tree, no FUSE: `ckptfs serve`).
    pub mountpoint: Option<PathBuf>,
    /// Take a checkpoint this often (None: only when asked).
    pub interval: Option<Duration>,
    /// Merge small SSTs this often (None: never).
    pub small_file_compaction: Option<Duration>,
    /// Let other users than the mount's owner read the tree (FUSE `allow_other`, with the
    /// kernel checking permissions).
    pub allow_other: bool,
    /// FUSE worker threads.
    pub threads: usize,
    /// Verify each stored object's checksum at its first open.
    pub verify: bool,
    /// Show a store another daemon writes: no backends, nothing written (EROFS).
    pub read_only: bool,
    /// Serve the metrics over HTTP at this address (`/metrics`), and the page (`/`).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Serve the store read-only over the S3 REST API (`--s3-listen`, [`crate::s3door`]).
    pub s3_door: Option<crate::s3door::DoorConfig>,
    /// Follow the Flink jobs whose checkpoints are in this directory (one job's, or the
    /// checkpoint root of any number of jobs).
    pub flink: Option<PathBuf>,
    /// More roots whose files the job's checkpoints may name (`--flink-root`).
    pub flink_roots: Vec<PathBuf>,
    /// How long a read of a Flink checkpoint's `_metadata` in the tree holds it after the
    /// last read of its files (`--restore-lease`; `None`: not held).
    pub restore_lease: Option<Duration>,
}

/// How often a daemon following a Flink job looks for its new checkpoints: in a directory
/// (a few stat calls; inotify wakes it sooner, [`watch`]), and on object storage (a few
/// LIST and HEAD requests each time). `CKPTFS_FLINK_POLL_MS` sets another period.
pub const FLINK_POLL: Duration = Duration::from_secs(1);
/// [`FLINK_POLL`] for a job on object storage.
pub const FLINK_POLL_S3: Duration = Duration::from_secs(2);

/// How often a writing daemon removes the pins whose time is up (restore leases).
pub const PIN_EXPIRY_PERIOD: Duration = Duration::from_secs(1);

/// How often a read-only mount looks for the writer's new checkpoints.
pub const REFRESH_PERIOD: Duration = Duration::from_secs(2);

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }
            .map_err(|e| Error::io("install signal handler", std::io::Error::from(e)))?;
    }
    Ok(())
}

/// True if `mountpoint` (absolute) is a ckptfs mount according to /proc/self/mountinfo.
fn is_ckptfs_mount(mountpoint: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    // Fields: id parent major:minor root mountpoint options [optional...] - fstype source
    // super-options; the mount point has spaces, tabs, newlines and backslashes escaped.
    let wanted = mountpoint
        .to_string_lossy()
        .replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012");
    // Ours: type fuse (or fuse.ckptfs) with the source "ckptfs:STORE" we mount with.
    info.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            return false;
        };
        let fstype = fields.get(dash + 1).copied().unwrap_or("");
        let source = fields.get(dash + 2).copied().unwrap_or("");
        fields.get(4) == Some(&wanted.as_str())
            && (fstype == "fuse" || fstype == "fuse.ckptfs")
            && source.starts_with("ckptfs:")
    })
}

/// A ckptfs mount whose daemon died (ENOTCONN) is detached (lazy unmount) so that the
/// next mount, e.g. systemd's restart, can proceed. Someone else's dead mount is refused.
fn clear_dead_mount(mountpoint: &Path) -> Result<()> {
    let refuse = |why: &str| {
        Error::Busy(format!(
            "{} is a stale mount of a daemon that died ({why}); run `fusermount3 -u {}` \
             first (the store itself is safe: recovery runs at the next mount)",
            mountpoint.display(),
            mountpoint.display()
        ))
    };
    if !is_ckptfs_mount(mountpoint) {
        return Err(refuse("not a ckptfs mount"));
    }
    let detached = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH).is_ok()
        || std::process::Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(mountpoint)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !detached {
        return Err(refuse("detaching it failed"));
    }
    log::warn!(
        "{} was a stale ckptfs mount of a daemon that died; detached it",
        mountpoint.display()
    );
    Ok(())
}

/// Refuse a mountpoint that is missing, not a directory, or already a mount point. A dead
/// ckptfs mount left by a killed daemon is detached first.
pub fn check_mountpoint(mountpoint: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::metadata(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            clear_dead_mount(mountpoint)?;
            std::fs::metadata(mountpoint).ctx("mountpoint", mountpoint)?
        }
        other => other.ctx("mountpoint", mountpoint)?,
    };
    if !meta.is_dir() {
        return Err(Error::io(
            format!("mountpoint {}", mountpoint.display()),
            std::io::Error::from_raw_os_error(libc::ENOTDIR),
        ));
    }
    let parent = mountpoint.join("..");
    let parent_meta = std::fs::metadata(&parent).ctx("stat", &parent)?;
    if parent_meta.dev() != meta.dev() || parent_meta.ino() == meta.ino() {
        return Err(Error::Busy(format!(
            "{} is already a mount point; unmount it first or choose another directory",
            mountpoint.display()
        )));
    }
    Ok(())
}

/// The FUSE front door: mount the tree at `mountpoint` and serve it on background threads.
fn mount_tree(
    config: &MountConfig,
    mountpoint: &Path,
    engine: &Engine,
    controller: &Arc<Controller>,
) -> Result<fuser::BackgroundSession> {
    let fs = CkptFs::with_options(controller.clone(), config.verify, config.restore_lease);
    let mut options = vec![
        MountOption::FSName(format!("ckptfs:{}", engine.location())),
        MountOption::Subtype("ckptfs".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    if config.read_only {
        // The kernel answers EROFS to rmdir and to writes of the control file.
        options.push(MountOption::RO);
    }
    if config.allow_other {
        options.push(MountOption::DefaultPermissions);
    }
    let mut fuse_config = Config::default();
    fuse_config.mount_options = options;
    fuse_config.acl = if config.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    fuse_config.n_threads = Some(config.threads.max(1));
    fuse_config.clone_fd = true;
    let session = fuser::Session::new(FuseAdapter::new(fs.clone()), mountpoint, &fuse_config)
        .map_err(|e| Error::io(format!("mount {}", mountpoint.display()), e))?;
    fs.set_invalidator(NotifierInvalidator::start(session.notifier()));
    fs.set_mountpoint(mountpoint.to_path_buf());
    let background = session
        .spawn()
        .map_err(|e| Error::io("start the FUSE session", e))?;
    Ok(background)
}

/// Mount and serve in this process. `ready` is called once the mount is usable (or with
/// the error that prevented it); serving continues until an unmount or a signal.
pub fn serve(
    config: MountConfig,
    ready: impl FnOnce(std::result::Result<(), &Error>),
) -> Result<()> {
    let started = (|| -> Result<_> {
        // A daemon keeps no directory busy and creates nothing others can read.
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        std::env::set_current_dir("/").map_err(|e| Error::io("chdir /", e))?;
        if let Some(mountpoint) = &config.mountpoint {
            check_mountpoint(mountpoint)?;
        }
        // Bound before the engine opens: a busy address fails the mount, not the scrape.
        let metrics_listener = config
            .metrics_listen
            .map(crate::metrics_http::bind)
            .transpose()?;
        let s3_listener = config
            .s3_door
            .as_ref()
            .map(|door| crate::s3door::bind(door.listen))
            .transpose()?;
        install_signal_handlers()?;
        let engine = if config.read_only {
            Engine::open_read_only(config.engine.clone())?
        } else {
            Engine::open(config.engine.clone())?
        };
        let metrics_server = metrics_listener
            .map(|listener| MetricsServer::start(listener, engine.clone()))
            .transpose()?;
        let controller = Arc::new(Controller::new(engine.clone()));
        let background = match &config.mountpoint {
            Some(mountpoint) => Some(mount_tree(&config, mountpoint, &engine, &controller)?),
            None => None,
        };
        // The S3 door: the same retained checkpoints as the tree, through the same seam.
        let s3_door = match (s3_listener, &config.s3_door) {
            (Some(listener), Some(door)) => Some(crate::s3door::S3Door::start(
                listener,
                door,
                Arc::new(crate::fs::seam::Live::new(controller.clone())),
            )?),
            _ => None,
        };
        // Every daemon, mounted or not, takes commands at `ctl.sock` in its state directory:
        // `ckptfs checkpoint STORE` reaches a mount's daemon as it reaches `serve`.
        let socket = socket::ControlSocket::start(
            engine.state_dir().join(socket::SOCKET_NAME),
            &controller,
        )?;
        let mut tasks = Tasks::new(controller.clone());
        if let Some(period) = config.interval.filter(|_| !config.read_only) {
            tasks.interval(period)?;
        }
        if config.read_only {
            tasks.refresh(REFRESH_PERIOD)?;
        } else if engine.location().local().is_none() {
            tasks.orphan_sweep(config.engine.orphan_grace.max(Duration::from_secs(1)))?;
        }
        if let Some(src) = &config.flink {
            let on_s3 = src.to_string_lossy().starts_with("s3://");
            let poll = std::env::var("CKPTFS_FLINK_POLL_MS")
                .ok()
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis)
                .unwrap_or(if on_s3 { FLINK_POLL_S3 } else { FLINK_POLL });
            tasks.flink_follow(src.clone(), config.flink_roots.clone(), poll)?;
        }
        if let Some(period) = config.small_file_compaction.filter(|_| !config.read_only) {
            tasks.small_file_compaction(period, Default::default())?;
        }
        if !config.read_only {
            tasks.expire_pins(PIN_EXPIRY_PERIOD)?;
        }
        Ok((
            engine,
            controller,
            tasks,
            background,
            socket,
            metrics_server,
            s3_door,
        ))
    })();
    let (engine, controller, tasks, background, socket, metrics_server, s3_door) = match started {
        Ok(parts) => {
            ready(Ok(()));
            // systemd (Type=notify): ready now, with the socket listening. Without
            // NOTIFY_SOCKET this does nothing.
            notify_systemd(&[sd_notify::NotifyState::Ready]);
            parts
        }
        Err(e) => {
            ready(Err(&e));
            return Err(e);
        }
    };
    let front = match &config.mountpoint {
        Some(mountpoint) => format!(
            "at {} and {}",
            mountpoint.display(),
            socket.path().display()
        ),
        None => format!("through {}", socket.path().display()),
    };
    log::info!("serving {} {front}", engine.location());
    let unmounted = || background.as_ref().is_some_and(|b| b.guard.is_finished());
    while !STOP.load(Ordering::SeqCst) && !unmounted() {
        std::thread::sleep(Duration::from_millis(100));
    }
    notify_systemd(&[sd_notify::NotifyState::Stopping]);
    let signalled = STOP.load(Ordering::SeqCst);
    if signalled {
        log::info!("signal received: stopping ({front})");
    } else {
        log::info!("{front}: unmounted");
    }
    if let Some(background) = background {
        // After an external unmount the session has ended and our own unmount fails with
        // EINVAL; asking explicitly keeps fuser from warning about it on drop.
        match background.umount_and_join() {
            Ok(()) => {}
            Err(e) if !signalled => log::debug!("unmount after an external unmount: {e}"),
            Err(e) => log::warn!("FUSE session ended with: {e}"),
        }
    }
    // No new commands; those running hold the controller until they have answered.
    drop(socket);
    // No new S3 requests (the door holds the controller too).
    drop(s3_door);
    // Stop the periodic tasks, let in-flight checkpoints finish, then close the databases.
    tasks.stop();
    controller.shutdown();
    // It holds the engine too: stopped before the engine closes.
    drop(metrics_server);
    drop(controller);
    drop(engine);
    log::info!("stopped");
    Ok(())
}

/// Tell systemd (when it started us with `NOTIFY_SOCKET`) how the daemon is; a failure
/// to tell it is logged, never fatal.
fn notify_systemd(states: &[sd_notify::NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        if let Err(e) = sd_notify::notify(states) {
            log::warn!("cannot notify systemd: {e}");
        }
    }
}
