//! One error type for the whole crate and its single errno mapping.

use std::io;
use std::path::{Path, PathBuf};

/// A result whose error is the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of the engine. Each kind maps to one errno ([`Error::errno`]), which a
/// filesystem caller sees and the control protocol carries to the command line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure, with what we were doing when it happened. Its errno is the OS
    /// error's, `EIO` if it has none.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and to which path.
        context: String,
        /// The failure the OS reported.
        #[source]
        source: io::Error,
    },
    /// A failure RocksDB reported (opening, writing, flushing or checkpointing a
    /// database). `EIO`.
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    /// A backend name, operator or subtask that is not in the one accepted spelling
    /// (see [`crate::names`]). `EINVAL`.
    #[error("invalid backend name {name:?}: {reason}")]
    InvalidBackendName {
        /// The text as given.
        name: String,
        /// The rule it broke.
        reason: &'static str,
    },
    /// A request named a backend this daemon does not host. `ENOENT`.
    #[error("no such backend: {0}")]
    NoSuchBackend(String),
    /// A request named a checkpoint the store does not hold: never taken, dropped, or
    /// pending or void (its manifest does not count). `ENOENT`.
    #[error("no such checkpoint: {0}")]
    NoSuchCheckpoint(u64),
    /// Bad input from a user (command, option, argument). `EINVAL`.
    #[error("{0}")]
    Invalid(String),
    /// Something else is in progress that excludes this request (a restore, checkpoints
    /// in flight, a delete of what this needs): a later try may succeed. `EBUSY`.
    #[error("{0}")]
    Busy(String),
    /// The checkpoint was abandoned before it committed; what it stored is released.
    /// `ECANCELED`.
    #[error("checkpoint {checkpoint} aborted")]
    Aborted {
        /// The id of the abandoned checkpoint.
        checkpoint: u64,
    },
    /// A test's fault injection stopped the work here, as a crash of the process would.
    /// `EIO`.
    #[error("simulated crash")]
    SimulatedCrash,
    /// Another process holds what this one needs alone: the lock file of a local store or
    /// state directory, or the lease of a store on object storage. `EBUSY`.
    #[error("{what} {path} is in use by another ckptfs process{holder}; unmount it first")]
    Locked {
        /// What is held: `store` or `state directory`.
        what: &'static str,
        /// The held directory or store, as shown to a user.
        path: String,
        /// Who holds it, with a leading space (` (pid 1234)`, or the lease's holder and
        /// when it can be taken over); empty if unknown.
        holder: String,
    },
    /// Stored bytes do not match what the catalog says they are. `EIO`.
    #[error("corrupt: {0}")]
    Corrupt(String),
    /// A restore or export refuses a destination directory that exists and holds
    /// something. `ENOTEMPTY`.
    #[error("{} is not empty; refusing to write into it", .0.display())]
    NotEmpty(PathBuf),
    /// A write to something that cannot be written: a read-only view of a store (another
    /// daemon writes it), or a file of the mount that is not writable. `EROFS`.
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// A backend whose database could not be reopened (after a failed restore). `EIO`.
    #[error("backend {0} is not open (a restore failed; see the log)")]
    BackendClosed(String),
    /// Something named is not there: a store, a bucket, a record, a RocksDB directory, a
    /// file of a checkpoint or a Flink checkpoint. `ENOENT`.
    #[error("not found: {0}")]
    NotFound(String),
    /// A create-only write found the record there already. `EEXIST`.
    #[error("{0} exists already")]
    Exists(String),
    /// A conditional write found the record changed by someone else (another writer).
    /// `ESTALE`.
    #[error("{0}")]
    Conflict(String),
    /// A path of a checkpoint source (a directory, a Flink job, a bucket prefix) that ckptfs
    /// does not read: outside the source's roots (`EACCES`), a symbolic link (`ELOOP`), not
    /// a regular file or too large (`EINVAL`), another filesystem mounted inside (`EXDEV`).
    /// See `crate::source`.
    #[error("refused {path}: {rule} ({})", errno_name(*.errno))]
    Refused {
        /// The refused path, as shown to a user.
        path: String,
        /// The rule it broke.
        rule: String,
        /// The errno of the refusal, which is also this error's.
        errno: i32,
    },
    /// What a running daemon answered a control request with: its message and its errno,
    /// carried unchanged to the command line client's caller. Its errno is the daemon's.
    #[error("{message}")]
    Daemon {
        /// The errno the daemon answered with.
        errno: i32,
        /// The daemon's message.
        message: String,
    },
    /// A request to object storage failed (after the client's retries), for a reason other
    /// than the kinds above (a missing object is `NotFound`, a refused conditional write
    /// `Exists` or `Conflict`). `EIO`.
    #[error("{what}: object storage: {source}")]
    ObjectStore {
        /// What was being done, and to which object.
        what: String,
        /// The client's error.
        #[source]
        source: object_store::Error,
    },
    /// An error with what was being done when it happened; its errno is its cause's.
    #[error("{context}: {source}")]
    Context {
        /// What was being done.
        context: String,
        /// The error it failed with.
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

    /// An [`Error::Io`]: `source`, which happened while doing `context`.
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
    /// The error, if any, as an [`Error::Io`] whose context is `what` and `path` (e.g.
    /// `open /var/lib/ckptfs/lock`).
    fn ctx(self, what: &str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, what: &str, path: &Path) -> Result<T> {
        self.map_err(|e| Error::io(format!("{what} {}", path.display()), e))
    }
}
