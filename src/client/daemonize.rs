//! Starting a mount's daemon in the background: `ckptfs mount` runs itself again with
//! `--foreground`, detached, and waits on a pipe for the daemon to say the mount is ready
//! or why it is not (the daemon's side is [`notify_note`] and [`notify_ready`]).

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ExitCode, Stdio};

use ckptfs_core::error::{Error, IoContext};

const NOTIFY_ENV: &str = "CKPTFS_NOTIFY_READY";

/// Re-run this command with `--foreground` as a detached daemon, and return once it says
/// the mount is ready (exit 0) or why it is not (exit 1).
pub fn daemonize(
    store: &ckptfs_core::store::Location,
    state: Option<&Path>,
    read_only: bool,
    log_file: Option<&Path>,
    args: &[std::ffi::OsString],
) -> Result<Daemonized, Error> {
    let default_dir = match (store.local(), state) {
        (Some(root), _) if !read_only => ckptfs_core::repo::ensure_store_dir(root)?,
        (_, Some(state)) => {
            ckptfs_core::fsutil::create_private_dir_all(state)?;
            state.to_path_buf()
        }
        (_, None) => {
            return Err(Error::Invalid(format!(
                "a store on object storage ({store}) needs --state DIR: a local directory \
                 for the live databases and the read cache"
            )))
        }
    };
    let log_path = log_file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| default_dir.join(ckptfs_core::store::layout::LOG));
    let log = ckptfs_core::fsutil::open_private()
        .create(true)
        .append(true)
        .open(&log_path)
        .ctx("open log file", &log_path)?;
    let exe = std::env::current_exe().map_err(|e| Error::io("find own executable", e))?;
    let mut command = std::process::Command::new(exe);
    command
        .args(args)
        .arg("--foreground")
        .env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| Error::io("start the daemon", e))?;
    let stdout = child.stdout.take().expect("piped");
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        stdout
            .read_line(&mut line)
            .map_err(|e| Error::io("wait for the daemon", e))?;
        // What the daemon says while it starts (e.g. that it waits for a lease).
        match line.trim_end().strip_prefix("note: ") {
            Some(note) => eprintln!("ckptfs: {note}"),
            None => break,
        }
    }
    let line = line.trim_end();
    if line == "ready" {
        eprintln!(
            "ckptfs: mounted (daemon pid {}, log {})",
            child.id(),
            log_path.display()
        );
        return Ok(Daemonized::Ready);
    }
    let _ = child.wait();
    let message = line.strip_prefix("error: ").unwrap_or(line);
    if message.is_empty() {
        eprintln!(
            "ckptfs: error: the daemon exited before the mount was ready; see {}",
            log_path.display()
        );
        Ok(Daemonized::Died)
    } else {
        eprintln!("ckptfs: error: {message}");
        Ok(Daemonized::Refused)
    }
}

/// How a daemon [`daemonize`] started came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemonized {
    /// It serves.
    Ready,
    /// It failed to start and said why (printed).
    Refused,
    /// It exited without a word: its log says why.
    Died,
}

impl Daemonized {
    /// The exit status of the command that started it.
    pub fn exit_code(self) -> ExitCode {
        match self {
            Daemonized::Ready => ExitCode::SUCCESS,
            Daemonized::Refused | Daemonized::Died => ExitCode::from(1),
        }
    }
}

/// True in the daemon a `ckptfs mount` started (its parent checked the paths and made
/// the store's directory and log).
pub fn is_daemon_child() -> bool {
    std::env::var_os(NOTIFY_ENV).is_some()
}

/// Tell a waiting `ckptfs mount` (our parent) something while the daemon starts.
pub fn notify_note(note: &str) {
    if std::env::var_os(NOTIFY_ENV).is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "note: {}", note.replace('\n', " "));
    let _ = out.flush();
}

/// Tell a waiting `ckptfs mount` (our parent) whether the mount is ready, then stop
/// writing to the pipe so the parent can exit.
pub fn notify_ready(result: Result<(), &Error>) {
    if std::env::var_os(NOTIFY_ENV).is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = match &result {
        Ok(()) => writeln!(out, "ready"),
        Err(e) => writeln!(out, "error: {e}"),
    };
    let _ = out.flush();
    if let Ok(null) = OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto fd 1 replaces our stdout with /dev/null; both fds are valid.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}
