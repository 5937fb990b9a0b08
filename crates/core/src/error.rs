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
    /// What a running daemon answered a control request with: its message, errno and kind,
    /// carried unchanged to the command line client's caller. Its errno is the daemon's.
    #[error("{message}")]
    Daemon {
        /// The errno the daemon answered with.
        errno: i32,
        /// The kind of the daemon's error (`None` from a daemon that did not say: then the
        /// errno's, [`ErrorKind::of_errno`]).
        kind: Option<ErrorKind>,
        /// The daemon's message.
        message: String,
    },
    /// A request to object storage failed (after the client's retries). Its kind is the
    /// client's: a missing object is [`ErrorKind::NotFound`], a refused create-only write
    /// [`ErrorKind::Exists`], a refused conditional write [`ErrorKind::Conflict`]; anything
    /// else [`ErrorKind::Io`] (`EIO`).
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

/// What went wrong, as a caller asks it: the one question to match on. It looks through
/// [`Error::Context`] and through a daemon's answer ([`Error::Daemon`]), so a branch on it
/// keeps working when someone wraps the error or moves the work behind the control socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input: a command, an option, a name, a manifest or source that breaks a rule.
    /// `EINVAL`.
    Invalid,
    /// Not there: a store, backend, checkpoint, record, file or object. `ENOENT`.
    NotFound,
    /// Something in progress excludes this request; a later try may succeed. `EBUSY`.
    Busy,
    /// Another process holds the store's lock or lease; retrying does not help until it
    /// lets go. `EBUSY`.
    Locked,
    /// Someone else changed a record a conditional write expected unchanged. `ESTALE`.
    Conflict,
    /// A create-only write found the record there already. `EEXIST`.
    Exists,
    /// Stored bytes are not what the catalog says. `EIO`.
    Corrupt,
    /// A write to something that cannot be written. `EROFS`.
    ReadOnly,
    /// A destination that holds something. `ENOTEMPTY`.
    NotEmpty,
    /// A source path ckptfs does not read (its own errno: `EACCES`, `ELOOP`, ...).
    Refused,
    /// A checkpoint abandoned before it committed. `ECANCELED`.
    Aborted,
    /// The OS, RocksDB or object storage failed (the OS's errno, else `EIO`).
    Io,
}

impl ErrorKind {
    /// The errno of this kind, for the kinds that carry none of their own.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::Invalid => libc::EINVAL,
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::Busy | ErrorKind::Locked => libc::EBUSY,
            ErrorKind::Conflict => libc::ESTALE,
            ErrorKind::Exists => libc::EEXIST,
            ErrorKind::Corrupt | ErrorKind::Io => libc::EIO,
            ErrorKind::ReadOnly => libc::EROFS,
            ErrorKind::NotEmpty => libc::ENOTEMPTY,
            ErrorKind::Refused => libc::EACCES,
            ErrorKind::Aborted => libc::ECANCELED,
        }
    }

    /// The kind of an errno a daemon answered with. `EBUSY` is [`ErrorKind::Busy`]: a
    /// daemon that answers at all holds its store.
    pub fn of_errno(errno: i32) -> ErrorKind {
        match errno {
            libc::EINVAL => ErrorKind::Invalid,
            libc::ENOENT => ErrorKind::NotFound,
            libc::EBUSY => ErrorKind::Busy,
            libc::ESTALE => ErrorKind::Conflict,
            libc::EEXIST => ErrorKind::Exists,
            libc::EROFS => ErrorKind::ReadOnly,
            libc::ENOTEMPTY => ErrorKind::NotEmpty,
            libc::EACCES | libc::EPERM | libc::ELOOP | libc::EXDEV => ErrorKind::Refused,
            libc::ECANCELED => ErrorKind::Aborted,
            _ => ErrorKind::Io,
        }
    }

    /// True when the same request may succeed later without anyone's help: only
    /// [`ErrorKind::Busy`] (not [`ErrorKind::Locked`], whose holder must let go first).
    pub fn is_temporary(self) -> bool {
        self == ErrorKind::Busy
    }
}

impl Error {
    /// What went wrong, looking through [`Error::Context`] and a daemon's errno.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Io { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => ErrorKind::NotFound,
                io::ErrorKind::AlreadyExists => ErrorKind::Exists,
                _ => ErrorKind::Io,
            },
            Error::ObjectStore { source, .. } => match source {
                object_store::Error::NotFound { .. } => ErrorKind::NotFound,
                object_store::Error::AlreadyExists { .. } => ErrorKind::Exists,
                object_store::Error::Precondition { .. } => ErrorKind::Conflict,
                _ => ErrorKind::Io,
            },
            Error::RocksDb(_) | Error::SimulatedCrash | Error::BackendClosed(_) => ErrorKind::Io,
            Error::InvalidBackendName { .. } | Error::Invalid(_) => ErrorKind::Invalid,
            Error::NoSuchBackend(_) | Error::NoSuchCheckpoint(_) | Error::NotFound(_) => {
                ErrorKind::NotFound
            }
            Error::Busy(_) => ErrorKind::Busy,
            Error::Locked { .. } => ErrorKind::Locked,
            Error::Aborted { .. } => ErrorKind::Aborted,
            Error::Corrupt(_) => ErrorKind::Corrupt,
            Error::NotEmpty(_) => ErrorKind::NotEmpty,
            Error::ReadOnly(_) => ErrorKind::ReadOnly,
            Error::Exists(_) => ErrorKind::Exists,
            Error::Conflict(_) => ErrorKind::Conflict,
            Error::Refused { .. } => ErrorKind::Refused,
            Error::Daemon { errno, kind, .. } => kind.unwrap_or(ErrorKind::of_errno(*errno)),
            Error::Context { source, .. } => source.kind(),
        }
    }

    /// The errno a filesystem caller sees for this error: its kind's, or the one it
    /// carries (an OS error's, a refusal's, a daemon's answer's).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Refused { errno, .. } | Error::Daemon { errno, .. } => *errno,
            Error::Context { source, .. } => source.errno(),
            other => other.kind().errno(),
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

    /// True when the error is "the thing does not exist": [`ErrorKind::NotFound`].
    pub fn is_not_found(&self) -> bool {
        self.kind() == ErrorKind::NotFound
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wrapped(e: Error) -> Error {
        e.context("load checkpoint 3").context("command 2")
    }

    #[test]
    fn the_kind_survives_context_and_the_control_socket() {
        let cases = [
            (
                Error::Conflict("meta".into()),
                ErrorKind::Conflict,
                libc::ESTALE,
            ),
            (Error::Exists("k".into()), ErrorKind::Exists, libc::EEXIST),
            (
                Error::NoSuchCheckpoint(3),
                ErrorKind::NotFound,
                libc::ENOENT,
            ),
            (Error::Busy("slot".into()), ErrorKind::Busy, libc::EBUSY),
            (Error::Invalid("x".into()), ErrorKind::Invalid, libc::EINVAL),
            (Error::Corrupt("x".into()), ErrorKind::Corrupt, libc::EIO),
            (
                Error::ReadOnly("x".into()),
                ErrorKind::ReadOnly,
                libc::EROFS,
            ),
            (
                Error::NotEmpty("/d".into()),
                ErrorKind::NotEmpty,
                libc::ENOTEMPTY,
            ),
            (
                Error::Aborted { checkpoint: 1 },
                ErrorKind::Aborted,
                libc::ECANCELED,
            ),
        ];
        for (error, kind, errno) in cases {
            let shown = error.to_string();
            let wrapped = wrapped(error);
            assert_eq!(wrapped.kind(), kind, "{wrapped}");
            assert_eq!(wrapped.errno(), errno, "{wrapped}");
            // What the client rebuilds from a daemon's answer has the same kind.
            let answered = Error::Daemon {
                errno: wrapped.errno(),
                kind: Some(wrapped.kind()),
                message: shown,
            };
            assert_eq!(answered.kind(), kind, "{answered}");
        }
    }

    #[test]
    fn a_lock_held_elsewhere_is_not_worth_retrying_and_a_busy_engine_is() {
        let locked = Error::Locked {
            what: "store",
            path: "/s".into(),
            holder: " (pid 1)".into(),
        };
        assert_eq!(locked.errno(), libc::EBUSY);
        assert!(!wrapped(locked).kind().is_temporary());
        assert!(wrapped(Error::Busy("a restore is in progress".into()))
            .kind()
            .is_temporary());
        assert!(Error::Daemon {
            errno: libc::EBUSY,
            kind: None,
            message: "busy".into()
        }
        .kind()
        .is_temporary());
    }

    #[test]
    fn object_storage_errors_keep_their_cause_and_say_what_they_are() {
        let missing = Error::ObjectStore {
            what: "get checkpoints/7.json".into(),
            source: object_store::Error::NotFound {
                path: "checkpoints/7.json".into(),
                source: "404".into(),
            },
        };
        assert!(std::error::Error::source(&missing).is_some());
        let missing = wrapped(missing);
        assert_eq!(
            (missing.kind(), missing.errno()),
            (ErrorKind::NotFound, libc::ENOENT)
        );
        let refused = Error::ObjectStore {
            what: "put ckptfs.json".into(),
            source: object_store::Error::Precondition {
                path: "ckptfs.json".into(),
                source: "412".into(),
            },
        };
        assert_eq!(
            (refused.kind(), refused.errno()),
            (ErrorKind::Conflict, libc::ESTALE)
        );
    }

    #[test]
    fn io_errors_keep_their_errno_and_say_what_they_are() {
        let missing = Error::io("open /x", io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(wrapped(missing).kind(), ErrorKind::NotFound);
        let denied = Error::io("open /x", io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(
            (denied.kind(), denied.errno()),
            (ErrorKind::Io, libc::EACCES)
        );
        let refused = Error::Refused {
            path: "/x".into(),
            rule: "a symbolic link".into(),
            errno: libc::ELOOP,
        };
        assert_eq!(
            (refused.kind(), wrapped(refused).errno()),
            (ErrorKind::Refused, libc::ELOOP)
        );
    }
}
