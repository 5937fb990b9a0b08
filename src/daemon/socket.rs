//! The control socket of every daemon (`ckptfs serve`, and `ckptfs mount` beside its
//! control file): `ctl.sock` in its state directory, mode 0600, speaking the control file's line protocol (one request line in,
//! one JSON answer line per command out). Only the daemon's own user and root are let in
//! (SO_PEERCRED); anyone else gets one refusal line and is disconnected.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::control::protocol::{answer_line, Failure};
use crate::control::{Controller, StagedImports};
use crate::fs::MAX_LINE;
use ckptfs_core::error::{Error, IoContext, Result};

/// The socket's name in the state directory.
pub const SOCKET_NAME: &str = "ctl.sock";

/// Connections served at once; more are refused (with an answer saying so).
pub const MAX_CONNECTIONS: usize = 64;

/// The listening socket and its accepting thread; dropping it stops both and removes the
/// socket file.
pub struct ControlSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlSocket {
    /// Listen at `path` (a socket left by a daemon that died is replaced; one that
    /// answers belongs to a live daemon and is refused).
    pub fn start(path: PathBuf, controller: &Arc<Controller>) -> Result<ControlSocket> {
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                return Err(Error::Busy(format!(
                    "{} answers: another daemon serves this state directory",
                    path.display()
                )));
            }
            std::fs::remove_file(&path).ctx("remove stale socket", &path)?;
        }
        let listener = UnixListener::bind(&path).ctx("listen at", &path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .ctx("chmod 0600", &path)?;
        listener
            .set_nonblocking(true)
            .ctx("set non-blocking", &path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let weak = Arc::downgrade(controller);
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("ctl-socket".into())
                .spawn(move || accept_loop(listener, weak, stop))
                .map_err(|e| Error::io("start the control socket's thread", e))?
        };
        Ok(ControlSocket {
            path,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(listener: UnixListener, controller: Weak<Controller>, stop: Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    open.fetch_sub(1, Ordering::SeqCst);
                    let e = Error::Busy(format!(
                        "{MAX_CONNECTIONS} connections are open already; try again"
                    ));
                    let _ = refuse(stream, &e);
                    continue;
                }
                let (controller, open) = (controller.clone(), open.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("ctl-conn".into())
                        .spawn(move || {
                            if let Err(e) = serve_connection(stream, &controller) {
                                log::debug!("control connection ended: {e}");
                            }
                            open.fetch_sub(1, Ordering::SeqCst);
                        });
                if let Err(e) = spawned {
                    log::warn!("control socket: cannot start a connection's thread: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                log::warn!("control socket: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// The uid of the process at the other end.
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is a valid socket for the call; cred and len describe a ucred the
    // kernel fills in.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// One answer line saying why, then the connection closes. What the client sent is
/// read (a little, for a second at most) and dropped first: closing a socket with unread
/// input resets it, and the client would lose the answer.
fn refuse(mut stream: UnixStream, e: &Error) -> std::io::Result<()> {
    let line = answer_line(&Err(Failure::of(e))) + "\n";
    stream.write_all(line.as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    let _ = std::io::copy(&mut (&stream).take(64 << 10), &mut std::io::sink());
    Ok(())
}

fn serve_connection(stream: UnixStream, controller: &Weak<Controller>) -> Result<()> {
    let uid = peer_uid(&stream).map_err(|e| Error::io("SO_PEERCRED", e))?;
    let own = nix::unistd::geteuid().as_raw();
    if uid != own && uid != 0 {
        log::warn!("control socket: refused a connection of uid {uid} (only {own} and root)");
        let e = Error::io(
            format!("uid {uid} may not control this daemon (only uid {own} and root)"),
            std::io::Error::from_raw_os_error(libc::EACCES),
        );
        return refuse(stream, &e).map_err(|e| Error::io("write refusal", e));
    }
    let imports = Mutex::new(StagedImports::default());
    let mut writer = stream
        .try_clone()
        .map_err(|e| Error::io("clone socket", e))?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        // One byte more than a line may hold: a longer one is refused, never buffered.
        (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::io("read request", e))?;
        if line.is_empty() {
            return Ok(());
        }
        if line.len() > MAX_LINE {
            let e = Error::Invalid(format!(
                "a control line is longer than {MAX_LINE} bytes; nothing of it runs"
            ));
            return refuse(writer, &e).map_err(|e| Error::io("write refusal", e));
        }
        let Some(controller) = controller.upgrade() else {
            let e = Error::Busy("the daemon is stopping".into());
            return refuse(writer, &e).map_err(|e| Error::io("write refusal", e));
        };
        let answers = run_line(&controller, &line, &imports);
        drop(controller);
        let text: String = answers.into_iter().map(|a| a + "\n").collect();
        writer
            .write_all(text.as_bytes())
            .map_err(|e| Error::io("write answer", e))?;
    }
}

/// Parse, validate and run one line's commands; their answer lines, in order.
fn run_line(
    controller: &Arc<Controller>,
    line: &[u8],
    imports: &Mutex<StagedImports>,
) -> Vec<String> {
    let commands = crate::control::checked_commands(
        line,
        |c| controller.validate(c),
        |e| controller.engine().record_error(e),
    );
    let commands = match commands {
        Ok(c) => c,
        Err(e) => {
            return vec![answer_line(&Err(Failure::of(&e)))];
        }
    };
    let n = commands.len();
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    controller.execute(
        commands,
        Arc::new(move |index, answer| {
            let _ = ckptfs_core::fsutil::lock(&tx).send((index, answer_line(&answer)));
        }),
        imports,
    );
    let mut answers = vec![None; n];
    for _ in 0..n {
        match rx.recv() {
            Ok((index, line)) => {
                if let Some(slot) = answers.get_mut(index) {
                    *slot = Some(line);
                }
            }
            Err(_) => break,
        }
    }
    answers
        .into_iter()
        .map(|a| {
            a.unwrap_or_else(|| {
                answer_line(&Err(Failure::of(&Error::Busy(
                    "the daemon stopped before answering".into(),
                ))))
            })
        })
        .collect()
}
