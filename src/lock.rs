//! One daemon per store: an exclusive `flock` on `STORE/lock`, holding the owner's pid.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, IoContext, Result};

/// Held for the lifetime of an engine or fsck; released when dropped (or when the process
/// dies, so a crashed daemon never leaves the store locked).
pub struct StoreLock {
    _lock: Flock<File>,
}

impl StoreLock {
    pub fn acquire(store: &Path) -> Result<Self> {
        let path = store.join("lock");
        let file = OpenOptions::new()
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
                Ok(StoreLock { _lock: lock })
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
                    path: store.display().to_string(),
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
