//! `ckptfs mount` (in the background, or serving in this process with `--foreground`) and
//! `ckptfs umount`.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ckptfs_core::error::Error;

use crate::cli::MountArgs;
use crate::client::{daemonize, read_status};

pub fn mount(mut args: MountArgs, argv: &[OsString]) -> Result<ExitCode, Error> {
    // Refuse bad options before anything is created or started.
    args.validate()?;
    if args.state.is_none() && args.read_only {
        args.state = Some(args.read_only_state()?);
    }
    if !args.foreground {
        return daemonize::daemonize(
            &args.store,
            args.state.as_deref(),
            args.read_only,
            args.log_file.as_deref(),
            argv.get(1..).unwrap_or_default(),
        );
    }
    let config = args.into_config()?;
    ckptfs_core::lease::on_wait(daemonize::notify_note);
    ckptfs::daemon::serve(config, daemonize::notify_ready)?;
    Ok(ExitCode::SUCCESS)
}

pub fn umount(mountpoint: &Path, timeout: u64) -> Result<ExitCode, Error> {
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
