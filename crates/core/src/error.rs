//! One error type for the whole crate and its single errno mapping.

use std::io;
use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure, with what we were doing when it happened.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    #[error("invalid backend name {name:?}: {reason}")]
    InvalidBackendName { name: String, reason: &'static str },
    #[error("no such backend: {0}")]
    NoSuchBackend(String),
    #[error("no such checkpoint: {0}")]
    NoSuchCheckpoint(u64),
    /// Bad input from a user (command, option, argument).
    #[error("{0}")]
    Invalid(String),
    /// Something else is in progress that excludes this request (a restore, checkpoints
    /// in flight, a delete of what this needs): a later try may succeed.
    #[error("{0}")]
    Busy(String),
    /// The checkpoint was abandoned before it committed; what it stored is released.
    #[error("checkpoint {checkpoint} aborted")]
    Aborted { checkpoint: u64 },
    /// A test's fault injection stopped the work here, as a crash of the process would.
    #[error("simulated crash")]
    SimulatedCrash,
    #[error("{what} {path} is in use by another ckptfs process{holder}; unmount it first")]
    Locked {
        what: &'static str,
        path: String,
        holder: String,
    },
    /// Stored bytes do not match what the catalog says they are.
    #[error("corrupt: {0}")]
    Corrupt(String),
    #[error("{} is not empty; refusing to write into it", .0.display())]
    NotEmpty(PathBuf),
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// A backend whose database could not be reopened (after a failed restore).
    #[error("backend {0} is not open (a restore failed; see the log)")]
    BackendClosed(String),
    #[error("not found: {0}")]
    NotFound(String),
    /// A create-only write found the record there already.
    #[error("{0} exists already")]
    Exists(String),
    /// A conditional write found the record changed by someone else (another writer).
    #[error("{0}")]
    Conflict(String),
    /// A path of a checkpoint source (a directory, a Flink job, a bucket prefix) that ckptfs
    /// does not read: outside the source's roots (`EACCES`), a symbolic link (`ELOOP`), not
    /// a regular file or too large (`EINVAL`), another filesystem mounted inside (`EXDEV`).
    /// See `crate::source`.
    #[error("refused {path}: {rule} ({})", errno_name(*.errno))]
    Refused {
        path: String,
        rule: String,
        errno: i32,
    },
    /// What a running daemon answered a control request with: its message and its errno,
    /// carried unchanged to the command line client's caller.
    #[error("{message}")]
    Daemon { errno: i32, message: String },
    /// A request to object storage failed (after the client's retries), for a reason other
    /// than the kinds above (a missing object is `NotFound`, a refused conditional write
    /// `Exists` or `Conflict`).
    #[error("{what}: object storage: {source}")]
    ObjectStore {
        what: String,
        #[source]
        source: object_store::Error,
    },
    /// An error with what was being done when it happened; its errno is its cause's.
    #[error("{context}: {source}")]
    Context {
        context: String,
        #[source]
        source: Box<Error>,
    },
}

/// The symbolic name of the errnos ckptfs refuses source paths with.
fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ELOOP => "ELOOP",
        libc::EINVAL => "EINVAL",
        libc::EXDEV => "EXDEV",
        _ => "error",
    }
}

impl Error {
    /// The errno a filesystem caller sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::RocksDb(_) => libc::EIO,
            Error::InvalidBackendName { .. } | Error::Invalid(_) => libc::EINVAL,
            Error::NoSuchBackend(_) | Error::NoSuchCheckpoint(_) | Error::NotFound(_) => {
                libc::ENOENT
            }
            Error::Busy(_) | Error::Locked { .. } => libc::EBUSY,
            Error::Aborted { .. } => libc::ECANCELED,
            Error::SimulatedCrash | Error::ObjectStore { .. } => libc::EIO,
            Error::Corrupt(_) => libc::EIO,
            Error::NotEmpty(_) => libc::ENOTEMPTY,
            Error::ReadOnly(_) => libc::EROFS,
            Error::BackendClosed(_) => libc::EIO,
            Error::Exists(_) => libc::EEXIST,
            Error::Conflict(_) => libc::ESTALE,
            Error::Refused { errno, .. } | Error::Daemon { errno, .. } => *errno,
            Error::Context { source, .. } => source.errno(),
        }
    }

    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// This error, with what was being done when it happened.
    pub fn context(self, context: impl Into<String>) -> Self {
        Error::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// True when the error is "the thing does not exist" at the OS level.
    pub fn is_not_found(&self) -> bool {
        if let Error::Context { source, .. } = self {
            return source.is_not_found();
        }
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
            || matches!(
                self,
                Error::NoSuchBackend(_) | Error::NoSuchCheckpoint(_) | Error::NotFound(_)
            )
    }
}

/// Attach "what we were doing" to an io::Result.
pub trait IoContext<T> {
    fn ctx(self, what: &str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, what: &str, path: &Path) -> Result<T> {
        self.map_err(|e| Error::io(format!("{what} {}", path.display()), e))
    }
}
