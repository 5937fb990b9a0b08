//! The control protocol, both ends: a request is a UTF-8 line, one command per line, fields
//! separated by one space, keys, values and paths percent-encoded ([`Request`], parsed by
//! the daemon and written by the command line client); every command is answered by one
//! JSON line ([`Answer`]: `{"ok":true,...}` with what it did, or
//! `{"ok":false,"errno":N,"error":"..."}`). Parsing is separate from running so that a
//! write with any invalid line can be refused as a whole before anything changes. The
//! table of docs/tree-and-control.md is checked against these types by a test here.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use ckptfs_core::catalog::Manifest;
use ckptfs_core::coordinator::ImportReport;
use ckptfs_core::error::{Error, ErrorKind, Result};
use ckptfs_core::import::ImportDir;
use ckptfs_core::names::BackendName;
use ckptfs_core::percent;
use ckptfs_core::policy::{Decision, Policy};

/// One control line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Start a checkpoint of every backend.
    Checkpoint,
    /// Write a key of a hosted backend.
    Put {
        /// The hosted backend.
        backend: BackendName,
        /// The key's bytes.
        key: Vec<u8>,
        /// The value's bytes.
        value: Vec<u8>,
    },
    /// Delete a key of a hosted backend.
    Del {
        /// The hosted backend.
        backend: BackendName,
        /// The key's bytes.
        key: Vec<u8>,
    },
    /// Flush a hosted backend's memtables.
    Flush(BackendName),
    /// Compact a hosted backend's whole key range.
    Compact(BackendName),
    /// Keep the newest N checkpoints (at least 1), applied at once.
    Retain(u32),
    /// Drop checkpoint N, as `rmdir cp-N` does.
    Delete(u64),
    /// Replace the retention policy (`keep last=3 daily=7 within=2d`), applied at once.
    Keep(Policy),
    /// What a policy (the store's own when `None`) would keep and drop; changes nothing.
    Forget(Option<Policy>),
    /// Pin checkpoint `id` as `name`.
    Pin {
        /// The checkpoint.
        id: u64,
        /// The pin's name.
        name: String,
    },
    /// Remove pin `name`.
    Unpin(String),
    /// Stage a RocksDB checkpoint directory as the state of an external backend in the
    /// next `checkpoint` of this handle.
    Import(ImportDir),
    /// Import the completed checkpoints of the Flink job in this directory that the store
    /// does not hold yet, one checkpoint each (`ckptfs import-flink SRC MOUNTPOINT`).
    ImportFlink {
        /// The job's checkpoint directory, or a checkpoint root holding its jobs.
        src: PathBuf,
        /// More roots whose files its checkpoints may name (`--source-root`).
        roots: Vec<PathBuf>,
    },
    /// The daemon's status, as `.ckptfs/status` shows it (what `ckptfs status` and `ckptfs
    /// ls` ask a serving daemon, which has no tree).
    Status,
}

impl Request {
    /// put and del: a run of consecutive data lines of one write is applied as one atomic
    /// batch per backend.
    pub fn is_data(&self) -> bool {
        matches!(self, Request::Put { .. } | Request::Del { .. })
    }
}

/// The commands, for error messages.
pub const USAGE: &str = "commands: checkpoint | put BACKEND KEY VALUE | del BACKEND KEY | \
flush BACKEND | compact BACKEND | retain N | keep RULE... | forget [RULE...] | pin N NAME | \
unpin NAME | delete N | import BACKEND DIR | import-flink DIR [ROOT...] | status (RULE: last=N, hourly=N, \
daily=N, weekly=N, monthly=N, yearly=N, within=DURATION)";

/// Parse one line (without its newline).
pub fn parse_line(line: &str) -> Result<Request> {
    let fields: Vec<&str> = line.split(' ').collect();
    let arity = |n: usize| -> Result<()> {
        if fields.len() == n {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "{} takes {} argument(s), got {} (fields are separated by exactly one space; \
                 percent-encode spaces in keys and values as %20)",
                fields[0],
                n - 1,
                fields.len() - 1
            )))
        }
    };
    let backend = |i: usize| -> Result<BackendName> { fields[i].parse() };
    // Plain ASCII digits only: no sign, no spaces, no other numerals.
    let number = |i: usize| -> Result<u64> {
        let text = fields[i];
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::Invalid(format!(
                "{text:?} is not a non-negative integer"
            )));
        }
        text.parse::<u64>()
            .map_err(|_| Error::Invalid(format!("{text:?} is too large")))
    };
    match fields[0] {
        "checkpoint" => {
            arity(1)?;
            Ok(Request::Checkpoint)
        }
        "put" => {
            arity(4)?;
            Ok(Request::Put {
                backend: backend(1)?,
                key: percent::decode(fields[2])?,
                value: percent::decode(fields[3])?,
            })
        }
        "del" => {
            arity(3)?;
            Ok(Request::Del {
                backend: backend(1)?,
                key: percent::decode(fields[2])?,
            })
        }
        "flush" => {
            arity(2)?;
            Ok(Request::Flush(backend(1)?))
        }
        "compact" => {
            arity(2)?;
            Ok(Request::Compact(backend(1)?))
        }
        "retain" => {
            arity(2)?;
            let n = number(1)?;
            if n == 0 || n > u32::MAX as u64 {
                return Err(Error::Invalid("retain must be at least 1".into()));
            }
            Ok(Request::Retain(n as u32))
        }
        "delete" => {
            arity(2)?;
            Ok(Request::Delete(number(1)?))
        }
        "keep" => {
            if fields.len() < 2 {
                arity(2)?;
            }
            Ok(Request::Keep(Policy::from_rules(
                fields[1..].iter().copied(),
            )?))
        }
        "forget" => Ok(Request::Forget(if fields.len() > 1 {
            Some(Policy::from_rules(fields[1..].iter().copied())?)
        } else {
            None
        })),
        "pin" => {
            arity(3)?;
            ckptfs_core::catalog::meta::valid_pin_name(fields[2])?;
            Ok(Request::Pin {
                id: number(1)?,
                name: fields[2].to_string(),
            })
        }
        "status" => {
            arity(1)?;
            Ok(Request::Status)
        }
        "unpin" => {
            arity(2)?;
            ckptfs_core::catalog::meta::valid_pin_name(fields[1])?;
            Ok(Request::Unpin(fields[1].to_string()))
        }
        "import" => {
            arity(3)?;
            let dir = PathBuf::from(OsString::from_vec(percent::decode(fields[2])?));
            if !dir.is_absolute() {
                return Err(Error::Invalid(format!(
                    "import needs an absolute directory, got {:?}",
                    dir.display().to_string()
                )));
            }
            Ok(Request::Import(ImportDir {
                backend: backend(1)?,
                dir,
            }))
        }
        "import-flink" => {
            if fields.len() < 2 {
                arity(2)?;
            }
            let mut dirs = Vec::new();
            for field in &fields[1..] {
                let dir = PathBuf::from(OsString::from_vec(percent::decode(field)?));
                let url = ["s3://", "file:"]
                    .iter()
                    .any(|scheme| dir.to_string_lossy().starts_with(scheme));
                if !dir.is_absolute() && !url {
                    return Err(Error::Invalid(format!(
                        "import-flink needs absolute directories or URLs, got {:?}",
                        dir.display().to_string()
                    )));
                }
                dirs.push(dir);
            }
            let src = dirs.remove(0);
            Ok(Request::ImportFlink { src, roots: dirs })
        }
        "" => Err(Error::Invalid(format!("empty command; {USAGE}"))),
        other => {
            let shown: String = other.chars().take(40).collect();
            let more = if shown.len() < other.len() { "..." } else { "" };
            Err(Error::Invalid(format!(
                "unknown command {shown:?}{more}; {USAGE}"
            )))
        }
    }
}

/// Parse the lines of one write. Empty lines are skipped; a missing final newline is
/// accepted. The error names the first bad line.
pub fn parse_write(data: &[u8]) -> Result<Vec<Request>> {
    let text = std::str::from_utf8(data)
        .map_err(|e| Error::Invalid(format!("control input is not UTF-8: {e}")))?;
    let mut commands = Vec::new();
    for (n, line) in text.split('\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let command =
            parse_line(line).map_err(|e| Error::Invalid(format!("line {}: {e}", n + 1)))?;
        commands.push(command);
    }
    Ok(commands)
}

impl Request {
    /// The line that [`parse_line`] reads back as this command (without its newline).
    pub fn to_line(&self) -> String {
        let path = |p: &std::path::Path| percent::encode(p.as_os_str().as_bytes());
        match self {
            Request::Checkpoint => "checkpoint".into(),
            Request::Put {
                backend,
                key,
                value,
            } => format!(
                "put {backend} {} {}",
                percent::encode(key),
                percent::encode(value)
            ),
            Request::Del { backend, key } => format!("del {backend} {}", percent::encode(key)),
            Request::Flush(backend) => format!("flush {backend}"),
            Request::Compact(backend) => format!("compact {backend}"),
            Request::Retain(n) => format!("retain {n}"),
            Request::Delete(n) => format!("delete {n}"),
            Request::Keep(policy) => format!("keep {}", policy.to_rules().join(" ")),
            Request::Forget(None) => "forget".into(),
            Request::Forget(Some(policy)) => format!("forget {}", policy.to_rules().join(" ")),
            Request::Pin { id, name } => format!("pin {id} {name}"),
            Request::Unpin(name) => format!("unpin {name}"),
            Request::Status => "status".into(),
            Request::Import(import) => format!("import {} {}", import.backend, path(&import.dir)),
            Request::ImportFlink { src, roots } => std::iter::once(src)
                .chain(roots)
                .fold("import-flink".to_string(), |line, dir| {
                    line + " " + &path(dir)
                }),
        }
    }
}

/// The answer to one command: what it did, or why it was refused.
pub type Answer = std::result::Result<Reply, Failure>;

/// What a command that succeeded answers, after `"ok":true`. Read back by trying the
/// variants in this order: each has fields the later ones lack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Reply {
    /// `status`.
    Status(StatusReply),
    /// `import-flink`.
    Imported(Imported),
    /// `checkpoint`.
    Checkpoint(CheckpointDone),
    /// `import`.
    StagedImport(StagedImport),
    /// `forget`.
    Plan(Plan),
    /// Every other command.
    Done(Done),
}

/// `status`'s answer: the daemon's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    /// What `.ckptfs/status` holds.
    pub status: Box<ckptfs_core::views::Status>,
}

/// `forget`'s answer: the policy, and what it decides for each retained checkpoint, newest
/// first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The policy, as `keep` takes it.
    pub policy: Vec<String>,
    /// Each checkpoint, newest first: the rules that keep it (none: dropped).
    pub decisions: Vec<Decision>,
}

/// `{"ok":true}`: done, nothing to report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {}

/// A committed checkpoint: `checkpoint`'s answer (and `ckptfs import`'s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointDone {
    /// The checkpoint's id (`cp-N`).
    pub id: u64,
    /// Files in the checkpoint, of every backend.
    pub files: u64,
    /// Files this checkpoint stored.
    pub files_new: u64,
    /// Files it re-referenced from earlier checkpoints.
    pub files_reused: u64,
    /// Bytes in the checkpoint.
    pub bytes: u64,
    /// Bytes it stored (uploaded, on object storage).
    pub bytes_uploaded: u64,
    /// Of those, the bytes the object store copied from the source itself.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_copied: u64,
    /// The synchronous phase (what blocks writers), in milliseconds.
    pub sync_ms: f64,
    /// The asynchronous phase (storing and committing), in milliseconds.
    pub async_ms: f64,
    /// What each import of the checkpoint read and stored; absent when it imported nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imports: Vec<ImportReport>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl CheckpointDone {
    /// The answer for the committed `manifest` and what its imports did.
    pub fn of(manifest: &Manifest, imports: Vec<ImportReport>) -> Self {
        let s = &manifest.stats;
        CheckpointDone {
            id: manifest.id,
            files: s.files_total,
            files_new: s.files_new,
            files_reused: s.files_reused,
            bytes: s.bytes_total,
            bytes_uploaded: s.bytes_uploaded,
            bytes_copied: s.bytes_copied,
            sync_ms: s.sync_micros as f64 / 1000.0,
            async_ms: s.async_micros as f64 / 1000.0,
            imports,
        }
    }
}

/// An `import` line checked and staged for the handle's next `checkpoint`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedImport {
    /// The external backend the directory is staged for.
    pub staged: BackendName,
    /// Files in the directory.
    pub files: u64,
    /// Bytes in the directory.
    pub bytes: u64,
}

/// `import-flink`: the answer of each checkpoint it committed, as `checkpoint` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Imported {
    /// One answer per committed checkpoint, oldest first (none when the store held them all).
    pub imported: Vec<Line<CheckpointDone>>,
}

/// A refused or failed command: the errno a program can act on, and the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Why, as an errno (`EBUSY`: try again later).
    pub errno: i32,
    /// What kind of failure (`busy`, `not_found`, `conflict`, ...: [`ErrorKind`]), which
    /// the errno alone does not always tell (`corrupt` and `io` are both `EIO`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
    /// What happened, for people.
    pub error: String,
}

impl Failure {
    /// The failure the daemon answers for `error`.
    pub fn of(error: &Error) -> Self {
        Failure {
            errno: error.errno(),
            kind: Some(error.kind()),
            error: error.to_string(),
        }
    }

    /// The error the client reports: the daemon's message, with its errno.
    pub fn into_error(self) -> Error {
        Error::Daemon {
            errno: self.errno,
            kind: self.kind,
            message: self.error,
        }
    }
}

/// One answer line as it is written: `"ok"` first, then the fields of `body`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line<T> {
    /// Whether the command succeeded.
    pub ok: bool,
    /// What it answers, after `ok`.
    #[serde(flatten)]
    pub body: T,
}

impl<T> Line<T> {
    /// A success answering `body`.
    pub fn ok(body: T) -> Self {
        Line { ok: true, body }
    }
}

/// The JSON line (without its newline) of an answer.
pub fn answer_line(answer: &Answer) -> String {
    let line = match answer {
        Ok(reply) => serde_json::to_string(&Line::ok(reply)),
        Err(failure) => serde_json::to_string(&Line {
            ok: false,
            body: failure,
        }),
    };
    // Plain structs of numbers and strings: serializing them cannot fail.
    line.unwrap_or_else(|e| format!("{{\"ok\":false,\"errno\":5,\"error\":\"{e}\"}}"))
}

/// An answer line read back (by the client, from the daemon).
pub fn parse_answer(line: &str) -> Result<Answer> {
    #[derive(Deserialize)]
    struct Head {
        ok: bool,
    }
    let unreadable = |e: serde_json::Error| {
        Error::Corrupt(format!("unreadable answer {:?}: {e}", line.trim_end()))
    };
    let head: Head = serde_json::from_str(line).map_err(unreadable)?;
    Ok(if head.ok {
        Ok(serde_json::from_str(line).map_err(unreadable)?)
    } else {
        Err(serde_json::from_str(line).map_err(unreadable)?)
    })
}

impl Reply {
    fn unexpected(self, wanted: &str) -> Error {
        Error::Corrupt(format!(
            "the daemon answered {} where {wanted} was expected",
            answer_line(&Ok(self))
        ))
    }

    /// The committed checkpoint this answer reports.
    pub fn into_checkpoint(self) -> Result<CheckpointDone> {
        match self {
            Reply::Checkpoint(done) => Ok(done),
            other => Err(other.unexpected("a checkpoint")),
        }
    }

    /// The status a `status` answers.
    pub fn into_status(self) -> Result<ckptfs_core::views::Status> {
        match self {
            Reply::Status(reply) => Ok(*reply.status),
            other => Err(other.unexpected("a status")),
        }
    }

    /// The plan a `forget` answers.
    pub fn into_plan(self) -> Result<Plan> {
        match self {
            Reply::Plan(plan) => Ok(plan),
            other => Err(other.unexpected("a retention plan")),
        }
    }

    /// The checkpoints an `import-flink` committed.
    pub fn into_imported(self) -> Result<Vec<CheckpointDone>> {
        match self {
            Reply::Imported(imported) => {
                Ok(imported.imported.into_iter().map(|l| l.body).collect())
            }
            other => Err(other.unexpected("a list of imported checkpoints")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        let cmds = parse_write(
            b"checkpoint\nput op/1 a%20b v%25\ndel op/1 k\nflush op/1\ncompact op/1\nretain 2\ndelete 7\n",
        )
        .unwrap();
        let b: BackendName = "op/1".parse().unwrap();
        assert_eq!(
            cmds,
            vec![
                Request::Checkpoint,
                Request::Put {
                    backend: b.clone(),
                    key: b"a b".to_vec(),
                    value: b"v%".to_vec()
                },
                Request::Del {
                    backend: b.clone(),
                    key: b"k".to_vec()
                },
                Request::Flush(b.clone()),
                Request::Compact(b),
                Request::Retain(2),
                Request::Delete(7),
            ]
        );
    }

    #[test]
    fn no_final_newline_and_blank_lines_are_fine() {
        assert_eq!(
            parse_write(b"\ncheckpoint").unwrap(),
            vec![Request::Checkpoint]
        );
    }

    #[test]
    fn every_error_names_its_line() {
        for (input, needle) in [
            (&b"checkpoint\nbogus\n"[..], "line 2: unknown command"),
            (b"put op/1 k\n", "line 1: put takes 3"),
            (b"put op/1  k v\n", "takes 3"),
            (b"put ../1 k v\n", "invalid backend name"),
            (b"put op/1 k%zz v\n", "percent-escape"),
            (b"retain 0\n", "at least 1"),
            (b"retain -1\n", "not a non-negative integer"),
            (b"delete x\n", "not a non-negative integer"),
            (b"checkpoint now\n", "takes 0"),
            (b"\xff\n", "not UTF-8"),
            (b" \n", "empty command"),
        ] {
            let err = parse_write(input).unwrap_err().to_string();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
    }

    fn every_command() -> Vec<Request> {
        let b: BackendName = "op/1".parse().unwrap();
        vec![
            Request::Checkpoint,
            Request::Put {
                backend: b.clone(),
                key: b"a b\n%".to_vec(),
                value: vec![0, 255, b' '],
            },
            Request::Del {
                backend: b.clone(),
                key: b"k".to_vec(),
            },
            Request::Flush(b.clone()),
            Request::Compact(b.clone()),
            Request::Retain(3),
            Request::Delete(7),
            Request::Keep(Policy::from_rules(["last=2", "daily=7", "within=36h"]).unwrap()),
            Request::Forget(None),
            Request::Forget(Some(Policy::last(1))),
            Request::Pin {
                id: 4,
                name: "before-deploy_2.1".into(),
            },
            Request::Unpin("before-deploy_2.1".into()),
            Request::Status,
            Request::Import(ImportDir {
                backend: b,
                dir: "/var/lib/app checkpoints/cp 1".into(),
            }),
            Request::ImportFlink {
                src: "s3://bucket/flink jobs".into(),
                roots: vec!["/a".into(), "/b c".into()],
            },
        ]
    }

    /// What the client writes is what the daemon reads, for every command.
    #[test]
    fn every_command_round_trips_through_its_line() {
        for command in every_command() {
            let line = command.to_line();
            assert_eq!(parse_line(&line).unwrap(), command, "{line}");
        }
    }

    fn sample_answers() -> Vec<(&'static str, Answer)> {
        let checkpoint = CheckpointDone {
            id: 4,
            files: 3,
            files_new: 1,
            files_reused: 2,
            bytes: 100,
            bytes_uploaded: 10,
            bytes_copied: 0,
            sync_ms: 1.5,
            async_ms: 0.0,
            imports: Vec::new(),
        };
        let with_imports = CheckpointDone {
            imports: vec![ImportReport {
                backend: "app/0".parse().unwrap(),
                files: 1,
                bytes: 2,
                files_read: 3,
                bytes_read: 4,
                bytes_stored: 5,
            }],
            ..checkpoint.clone()
        };
        vec![
            ("put", Ok(Reply::Done(Done {}))),
            ("checkpoint", Ok(Reply::Checkpoint(checkpoint))),
            (
                "import",
                Ok(Reply::StagedImport(StagedImport {
                    staged: "app/0".parse().unwrap(),
                    files: 1,
                    bytes: 2,
                })),
            ),
            (
                "import-flink",
                Ok(Reply::Imported(Imported {
                    imported: vec![Line::ok(with_imports)],
                })),
            ),
            (
                "forget",
                Ok(Reply::Plan(Plan {
                    policy: vec!["last=1".into(), "daily=7".into()],
                    decisions: vec![
                        Decision {
                            id: 9,
                            time_ms: 1_764_633_600_000,
                            kept_by: vec![
                                ckptfs_core::policy::Reason::Last { n: 1 },
                                ckptfs_core::policy::Reason::Daily {
                                    bucket: "2025-12-02".into(),
                                },
                            ],
                        },
                        Decision {
                            id: 8,
                            time_ms: 1_764_630_000_000,
                            kept_by: Vec::new(),
                        },
                    ],
                })),
            ),
            (
                "failure",
                Err(Failure {
                    errno: libc::EBUSY,
                    kind: Some(ErrorKind::Busy),
                    error: "checkpoint 3 is still in flight".into(),
                }),
            ),
        ]
    }

    /// Every answer reads back as itself: the client and the daemon agree on each type.
    #[test]
    fn every_answer_round_trips_through_its_line() {
        for (what, answer) in sample_answers() {
            let line = answer_line(&answer);
            assert_eq!(parse_answer(&line).unwrap(), answer, "{what}: {line}");
        }
        assert_eq!(answer_line(&Ok(Reply::Done(Done {}))), r#"{"ok":true}"#);
        // The client reports a refusal with the daemon's errno, whatever it is.
        for errno in [libc::EIO, libc::EACCES, libc::ENOENT, libc::EBUSY] {
            let failure = Failure {
                errno,
                kind: None,
                error: "refused".into(),
            };
            let line = answer_line(&Err(failure));
            let error = parse_answer(&line).unwrap().unwrap_err().into_error();
            assert_eq!(
                (error.errno(), error.to_string().as_str()),
                (errno, "refused")
            );
        }
        // The kind tells what the errno cannot: EIO is a damaged object or an I/O failure.
        let corrupt = Failure::of(&Error::Corrupt("object 5ab0 is damaged".into()));
        let line = answer_line(&Err(corrupt));
        assert!(line.contains(r#""kind":"corrupt""#), "{line}");
        let error = parse_answer(&line).unwrap().unwrap_err().into_error();
        assert_eq!(
            (error.errno(), error.kind()),
            (libc::EIO, ErrorKind::Corrupt)
        );
        assert!(parse_answer("{\"ok\":tru").is_err());
        assert!(parse_answer(r#"{"ok":false,"error":"no errno"}"#).is_err());
    }

    /// The keys of a JSON example in the docs (`{"ok":true,"id":4,"files":..}`), in order.
    fn keys_of(example: &str) -> Vec<String> {
        example
            .split('"')
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[1].starts_with(':'))
            .map(|w| w[0].to_string())
            .collect()
    }

    /// docs/tree-and-control.md documents every command of the protocol and every answer
    /// with exactly the fields, in the order, the daemon writes.
    #[test]
    fn the_protocol_doc_matches_the_types() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tree-and-control.md"),
        )
        .unwrap();
        let section = doc
            .split("## The control protocol")
            .nth(1)
            .expect("a protocol section")
            .split("\n## ")
            .next()
            .unwrap();
        let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| `")).collect();
        for command in every_command() {
            let line = command.to_line();
            let word = line.split(' ').next().unwrap();
            assert!(
                rows.iter()
                    .any(|r| r.contains(&format!("`{word} ")) || r.contains(&format!("`{word}`"))),
                "{word} is not in the protocol table"
            );
            assert!(USAGE.contains(word), "{word} is not in USAGE");
        }
        // Each example the doc gives, against the answer it documents.
        let example = |start: &str| -> Vec<String> {
            let from = section
                .find(start)
                .unwrap_or_else(|| panic!("no {start} in the doc"));
            let text = &section[from..];
            keys_of(&text[..text.find('}').unwrap() + 1])
        };
        let answers: std::collections::BTreeMap<_, _> = sample_answers().into_iter().collect();
        let line = |what: &str| answer_line(&answers[what]);
        assert_eq!(example(r#"{"ok":true,"id":"#), keys_of(&line("checkpoint")));
        assert_eq!(example(r#"{"ok":true,"staged":"#), keys_of(&line("import")));
        assert_eq!(example(r#"{"ok":false,"#), keys_of(&line("failure")));
        assert_eq!(example(r#"{"ok":true}"#), keys_of(&line("put")));
        assert_eq!(
            example(r#"{"ok":true,"policy":"#),
            keys_of(&line("forget"))[..8]
        );
        assert_eq!(
            example(r#"{"ok":true,"imported":"#),
            keys_of(&line("import-flink"))[..2]
        );
        let imports = example(r#""imports":[{"#);
        let nested = line("import-flink");
        let nested = &nested[nested.find(r#""imports":[{"#).unwrap()..];
        assert_eq!(imports, keys_of(&nested[..nested.find('}').unwrap() + 1]));
    }

    proptest::proptest! {
        /// Any input is either parsed or refused with an error, never a panic; and a
        /// parsed put carries exactly the bytes that were percent-encoded.
        #[test]
        fn parsing_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = parse_write(&data);
        }

        #[test]
        fn put_round_trips_any_key_and_value(
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let line = format!("put op/0 {} {}", percent::encode(&key), percent::encode(&value));
            let parsed = parse_write(line.as_bytes()).unwrap();
            proptest::prop_assert_eq!(parsed, vec![Request::Put {
                backend: "op/0".parse().unwrap(),
                key,
                value,
            }]);
        }
    }
}
