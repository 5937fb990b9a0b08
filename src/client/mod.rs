//! The command line's side of a daemon: what a command names (a mount, a store a serving
//! daemon holds, or a store read directly), the control client (typed commands out, typed
//! answers back, a daemon's errno kept) over a mount's control file or a serving daemon's
//! control socket, and the status files it reads. Starting the daemon is
//! [`daemonize`]; terminal progress is [`progress`].

pub mod daemonize;
pub mod progress;

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ckptfs::control::protocol::{parse_answer, Reply, Request};
use ckptfs::retry;
use ckptfs_core::catalog::Manifest;
use ckptfs_core::error::{Error, IoContext};
use ckptfs_core::repo::Repo;
use ckptfs_core::store::Location;
use ckptfs_core::views::{CheckpointRow, Status};

fn ctl_path(mountpoint: &Path) -> PathBuf {
    mountpoint.join(".ckptfs").join("ctl")
}

/// True when `path` is a ckptfs mount: a daemon serves its status there.
pub fn is_mount(path: &Path) -> bool {
    path.join(".ckptfs/status").exists()
}

/// The control socket a serving daemon (`ckptfs serve`) listens at for `path`: `path`
/// itself when it is a socket, else `path/state/ctl.sock` of a store directory (its
/// default state directory) when that socket exists.
pub fn serving_socket(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket());
    if is_socket(path) {
        return Some(path.to_path_buf());
    }
    let socket = path
        .join(ckptfs_core::store::layout::STATE)
        .join(ckptfs::daemon::socket::SOCKET_NAME);
    is_socket(&socket).then_some(socket)
}

/// True when a daemon takes commands for `path`: a mount, or a store (or its socket)
/// whose serving daemon accepts connections.
pub fn has_daemon(path: &Path) -> bool {
    is_mount(path)
        || serving_socket(path)
            .is_some_and(|socket| std::os::unix::net::UnixStream::connect(socket).is_ok())
}

fn not_a_mount(mountpoint: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        Error::NotFound(format!(
            "{} is not a ckptfs mount (no .ckptfs/ctl); mount it with `ckptfs mount STORE {}`",
            mountpoint.display(),
            mountpoint.display()
        ))
    } else {
        Error::io(format!("open {}", ctl_path(mountpoint).display()), e)
    }
}

/// Send commands in one write and read one answer per command. The first refusal is
/// returned as the daemon's error (its message and errno); the commands before it ran.
/// `mountpoint` is a mount (its control file) or a store a serving daemon holds (its
/// control socket, see [`serving_socket`]).
pub fn requests(mountpoint: &Path, commands: &[Request]) -> Result<Vec<Reply>, Error> {
    if !is_mount(mountpoint) {
        if let Some(socket) = serving_socket(mountpoint) {
            let stream = std::os::unix::net::UnixStream::connect(&socket).map_err(|e| {
                Error::io(
                    format!(
                        "connect to {} (is `ckptfs serve` running for this store?)",
                        socket.display()
                    ),
                    e,
                )
            })?;
            return exchange(&stream, &socket, commands);
        }
    }
    let path = ctl_path(mountpoint);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| not_a_mount(mountpoint, e))?;
    exchange(&file, &path, commands)
}

/// Write the command lines to a control file or socket, read one answer each.
fn exchange<T>(file: &T, path: &Path, commands: &[Request]) -> Result<Vec<Reply>, Error>
where
    for<'a> &'a T: Read + Write,
{
    let mut text: String = commands.iter().map(|c| c.to_line() + "\n").collect();
    if text.is_empty() {
        text.push('\n');
    }
    let write = { file }.write_all(text.as_bytes());
    let mut reader = BufReader::new(file);
    let mut answers = Vec::new();
    // A refused write is answered once, with why.
    let expected = if write.is_ok() { commands.len() } else { 1 };
    for _ in 0..expected {
        let mut line = String::new();
        reader.read_line(&mut line).ctx("read answer from", path)?;
        if line.is_empty() {
            break;
        }
        answers.push(parse_answer(&line)?.map_err(|failure| failure.into_error())?);
    }
    write.ctx("write to", path)?;
    Ok(answers)
}

/// One command, one answer.
pub fn request(mountpoint: &Path, command: &Request) -> Result<Reply, Error> {
    requests(mountpoint, std::slice::from_ref(command))?
        .pop()
        .ok_or_else(|| Error::Corrupt("the daemon gave no answer".into()))
}

/// Commands sent again while the daemon answers busy (a checkpoint slot taken), until
/// `wait` has passed; the answer to the last command.
pub fn request_while_busy(
    mountpoint: &Path,
    commands: &[Request],
    wait: Duration,
) -> Result<Reply, Error> {
    retry::while_busy(wait, || requests(mountpoint, commands))?
        .pop()
        .ok_or_else(|| Error::Corrupt("the daemon gave no answer".into()))
}

/// The text of `.ckptfs/NAME` of a mount.
fn read_meta_file(mountpoint: &Path, name: &str) -> Result<String, Error> {
    let path = mountpoint.join(".ckptfs").join(name);
    let mut text = String::new();
    std::fs::File::open(&path)
        .map_err(|e| not_a_mount(mountpoint, e))?
        .read_to_string(&mut text)
        .ctx("read", &path)?;
    Ok(text)
}

/// The status of the serving daemon (`ckptfs serve`) that holds `path` (a store
/// directory or its socket), asked through its socket; `None` when `path` is a mount or
/// no serving daemon answers for it.
pub fn served_status(path: &Path) -> Result<Option<Status>, Error> {
    if is_mount(path) || !has_daemon(path) {
        return Ok(None);
    }
    Ok(Some(request(path, &Request::Status)?.into_status()?))
}

/// A mount's `.ckptfs/status`.
pub fn read_status(mountpoint: &Path) -> Result<Status, Error> {
    serde_json::from_str(&read_meta_file(mountpoint, "status")?)
        .map_err(|e| Error::Corrupt(format!("unreadable status: {e}")))
}

/// Every retained checkpoint, from `.ckptfs/checkpoints` (one JSON line each).
pub fn read_checkpoints(mountpoint: &Path) -> Result<Vec<CheckpointRow>, Error> {
    read_meta_file(mountpoint, "checkpoints")?
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| Error::Corrupt(format!("unreadable checkpoint list: {e}")))
        })
        .collect()
}

/// What `ls`, `status`, `graph` and `export-flink` read: a mount (its daemon's view) or a
/// store (a directory or a URL, read directly, without a daemon).
pub enum Target {
    Mount(PathBuf),
    Store(Location),
}

impl Target {
    pub fn of(arg: &Path) -> Result<Target, Error> {
        if is_mount(arg) {
            return Ok(Target::Mount(arg.to_path_buf()));
        }
        let location = parse_location(arg)?;
        if let Location::Local(dir) = &location {
            if ckptfs_core::repo::check_is_store(dir).is_err() {
                return Err(Error::NotFound(format!(
                    "{} is not a ckptfs mount (no .ckptfs/ctl), nor a ckptfs store (no \
                     ckptfs.json, no checkpoints/); mount a store there with `ckptfs mount \
                     STORE {}`",
                    dir.display(),
                    dir.display()
                )));
            }
        }
        Ok(Target::Store(location))
    }

    /// The store behind it: a mount's (from its status), or the store itself.
    pub fn store(self) -> Result<Location, Error> {
        match self {
            Target::Mount(mountpoint) => Location::parse(&read_status(&mountpoint)?.store),
            Target::Store(location) => Ok(location),
        }
    }
}

/// A store named on the command line: a directory or a URL.
pub fn parse_location(arg: &Path) -> Result<Location, Error> {
    let text = arg
        .to_str()
        .ok_or_else(|| Error::Invalid(format!("{} is not valid UTF-8", arg.display())))?;
    Location::parse(text)
}

/// The checkpoints of a store read directly, as `.ckptfs/checkpoints` shows them.
pub fn store_checkpoints(location: &Location) -> Result<(Repo, Vec<Manifest>), Error> {
    let repo = Repo::reader(location)?;
    let manifests = repo.catalog.load_all()?.into_values().collect();
    Ok((repo, manifests))
}
