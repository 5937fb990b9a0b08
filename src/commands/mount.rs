//! `ckptfs mount` (in the background, or serving in this process with `--foreground`) and
//! `ckptfs umount`.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ckptfs_core::error::Error;

use crate::cli::{MountArgs, ServeArgs};
use crate::client::{daemonize, read_status};

pub fn mount(mut args: MountArgs, argv: &[OsString]) -> Result<ExitCode, Error> {
    // Refuse bad options and paths before anything is created or started.
    args.validate()?;
    if !daemonize::is_daemon_child() {
        check_paths(&args)?;
    }
    if args.daemon.state.is_none() && args.read_only {
        args.daemon.state = Some(args.read_only_state()?);
    }
    // The process the user started (not the daemon it forks) removes a store it created
    // if the mount fails.
    let new_store = if daemonize::is_daemon_child() {
        None
    } else {
        NewStore::of(&args)
    };
    if !args.foreground {
        let started = daemonize::daemonize(
            &args.store,
            args.daemon.state.as_deref(),
            args.read_only,
            args.log_file.as_deref(),
            argv.get(1..).unwrap_or_default(),
        );
        // A daemon that died without a word keeps its log, which says why.
        if matches!(started, Err(_) | Ok(daemonize::Daemonized::Refused)) {
            if let Some(new_store) = new_store {
                new_store.remove();
            }
        }
        return started.map(daemonize::Daemonized::exit_code);
    }
    let config = args.into_config()?;
    ckptfs_core::lease::on_wait(daemonize::notify_note);
    if let Err(e) = ckptfs::daemon::serve(config, daemonize::notify_ready) {
        if let Some(new_store) = new_store {
            new_store.remove();
        }
        return Err(e);
    }
    Ok(ExitCode::SUCCESS)
}

/// A local store a mount is about to create (STORE missing, or an empty directory): removed
/// again when the mount fails, so that a failed mount leaves nothing behind.
struct NewStore {
    dir: std::path::PathBuf,
    /// STORE existed (empty): only what is in it is removed.
    existed: bool,
}

impl NewStore {
    fn of(args: &MountArgs) -> Option<NewStore> {
        let dir = args.store.local().filter(|_| !args.read_only)?;
        match std::fs::read_dir(dir) {
            Ok(mut entries) => entries.next().is_none().then(|| NewStore {
                dir: dir.to_path_buf(),
                existed: true,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(NewStore {
                dir: dir.to_path_buf(),
                existed: false,
            }),
            Err(_) => None,
        }
    }

    /// Remove what the failed mount created: never anything once a checkpoint was
    /// committed to it (a manifest in `checkpoints/`). Links are removed, never followed.
    fn remove(self) {
        let committed = std::fs::read_dir(self.dir.join(ckptfs_core::store::layout::CHECKPOINTS))
            .is_ok_and(|mut entries| entries.next().is_some());
        if committed {
            return;
        }
        if !self.existed {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let _ = match entry.file_type() {
                Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
        }
    }
}

/// `ckptfs serve`: the daemon of a mount without its tree, in the foreground, until
/// SIGTERM or SIGINT; commands reach it through its control socket.
pub fn serve(args: ServeArgs) -> Result<ExitCode, Error> {
    args.daemon.validate()?;
    if let Some(store) = args.store.local() {
        check_store_dir(store)?;
    }
    let config = args.into_config()?;
    ckptfs_core::lease::on_wait(daemonize::notify_note);
    ckptfs::daemon::serve(config, daemonize::notify_ready)?;
    Ok(ExitCode::SUCCESS)
}

/// A local STORE must be a ckptfs store, an empty directory or missing: an unrelated
/// directory would get the store's files written into it.
fn check_store_dir(store: &Path) -> Result<(), Error> {
    if store.exists() && !is_store(store) && !is_empty_dir(store)? {
        return Err(Error::Invalid(format!(
            "{} is neither a ckptfs store nor an empty directory: a new store needs an \
             empty or missing directory",
            store.display()
        )));
    }
    Ok(())
}

/// Refuse a mount whose paths are wrong before anything is created: STORE, when local,
/// must be a ckptfs store, an empty directory or missing (an unrelated directory would get
/// the store's files written into it); MOUNTPOINT must be a directory, not a ckptfs store
/// (STORE and MOUNTPOINT swapped would create a new store and hide the real one under
/// it) and empty unless `--nonempty` is given; FUSE must be there (`/dev/fuse`).
fn check_paths(args: &MountArgs) -> Result<(), Error> {
    let swapped = |what: &str| {
        format!(
            "{what}; did you mean `ckptfs mount {} {}` (STORE first, then MOUNTPOINT)?",
            args.mountpoint.display(),
            args.store
        )
    };
    if let Some(store) = args.store.local() {
        if store.exists() && !args.read_only && !is_store(store) && !is_empty_dir(store)? {
            let mut what = format!(
                "{} is neither a ckptfs store nor an empty directory: a new store needs an \
                 empty or missing directory",
                store.display()
            );
            if is_store(&args.mountpoint) {
                what = swapped(&what);
            }
            return Err(Error::Invalid(what));
        }
    }
    let mountpoint = &args.mountpoint;
    match std::fs::symlink_metadata(mountpoint) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::io(
                format!(
                    "mountpoint {} (create it first: mkdir -p {})",
                    mountpoint.display(),
                    mountpoint.display()
                ),
                e,
            ));
        }
        // A dead mount a killed daemon left: the daemon detaches it (and logs it) and
        // checks the directory under it.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return check_fuse(Path::new("/dev/fuse"))
        }
        _ => {}
    }
    // Not a directory, or already a mount point: refused.
    ckptfs::daemon::check_mountpoint(mountpoint)?;
    if is_store(mountpoint) {
        return Err(Error::Invalid(swapped(&format!(
            "mountpoint {} is a ckptfs store: mounting over it would hide it",
            mountpoint.display()
        ))));
    }
    if !args.nonempty && !is_empty_dir(mountpoint)? {
        return Err(Error::Invalid(format!(
            "mountpoint {} is not empty: the mount would hide what it holds (--nonempty, or \
             -o nonempty in fstab, mounts over it all the same)",
            mountpoint.display()
        )));
    }
    check_fuse(Path::new("/dev/fuse"))
}

/// A ckptfs store (or one that lost its `ckptfs.json`).
fn is_store(dir: &Path) -> bool {
    ckptfs_core::repo::check_is_store(dir).is_ok()
}

/// A directory with no entries.
fn is_empty_dir(dir: &Path) -> Result<bool, Error> {
    let mut entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
    Ok(entries.next().is_none())
}

/// FUSE's device is there and may be opened: a container without it (or with another
/// device in its place) fails here with the device named, not later at the mountpoint.
fn check_fuse(device: &Path) -> Result<(), Error> {
    use std::os::unix::fs::FileTypeExt;
    const FUSE: (u64, u64) = (10, 229);
    let missing = |e: std::io::Error| {
        Error::io(
            format!(
                "{}: FUSE is not available to this process (a container needs the device, \
                 and an unprivileged user read and write access to it)",
                device.display()
            ),
            e,
        )
    };
    let meta = std::fs::metadata(device).map_err(missing)?;
    let rdev = std::os::unix::fs::MetadataExt::rdev(&meta);
    if !meta.file_type().is_char_device()
        || (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)) != FUSE
    {
        return Err(missing(std::io::Error::from_raw_os_error(libc::ENODEV)));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .map(drop)
        .map_err(missing)
}

pub fn umount(mountpoint: &Path, timeout: u64) -> Result<ExitCode, Error> {
    if !crate::client::is_mount(mountpoint) {
        return Err(Error::NotFound(format!(
            "nothing to unmount: {} is not a ckptfs mount (no .ckptfs/ctl)",
            mountpoint.display()
        )));
    }
    let pid = nix::unistd::Pid::from_raw(read_status(mountpoint)?.pid as i32);
    let out = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .output();
    let ok = match &out {
        Ok(o) if o.status.success() => true,
        _ if nix::unistd::geteuid().is_root() => std::process::Command::new("umount")
            .arg(mountpoint)
            .status()
            .map(|s| s.success())
            .unwrap_or(false),
        _ => false,
    };
    if !ok {
        let detail = out
            .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
            .unwrap_or_else(|e| e.to_string());
        return Err(Error::Busy(format!(
            "could not unmount {}: {detail}",
            mountpoint.display()
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(timeout);
    while nix::sys::signal::kill(pid, None).is_ok() {
        if Instant::now() > deadline {
            return Err(Error::Busy(format!(
                "unmounted, but daemon pid {pid} is still finishing after {timeout}s"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(ExitCode::SUCCESS)
}
