//! One daemon per store and per state directory: an exclusive `flock` on `DIR/lock`,
//! holding the owner's pid.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, IoContext, Result};
use crate::fsutil::open_private;

/// Held for the lifetime of an engine or fsck; released when dropped (or when the process
/// dies, so a crashed daemon never leaves the directory locked).
pub struct DirLock {
    _lock: Flock<File>,
}

/// The lock of a store.
pub type StoreLock = DirLock;

impl DirLock {
    /// Lock a store directory.
    pub fn acquire(store: &Path) -> Result<Self> {
        Self::acquire_for(store, "store")
    }

    /// Lock `dir` (a store or a state directory; `what` names it in the error).
    /// The lock file is opened without following symbolic links.
    pub fn acquire_for(dir: &Path, what: &'static str) -> Result<Self> {
        let path = dir.join(crate::store::layout::LOCK);
        let file = open_private()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .ctx("open", &path)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                lock.set_len(0).ctx("truncate", &path)?;
                lock.rewind().ctx("seek", &path)?;
                write!(lock, "{}", std::process::id()).ctx("write", &path)?;
                Ok(DirLock { _lock: lock })
            }
            Err((mut file, errno)) if errno == nix::errno::Errno::EWOULDBLOCK => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let holder = if pid.trim().is_empty() {
                    String::new()
                } else {
                    format!(" (pid {})", pid.trim())
                };
                Err(Error::Locked {
                    what,
                    path: dir.display().to_string(),
                    holder,
                })
            }
            Err((_, errno)) => Err(Error::io(
                format!("lock {}", path.display()),
                std::io::Error::from_raw_os_error(errno as i32),
            )),
        }
    }
}
