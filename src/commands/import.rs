//! `ckptfs import` (RocksDB checkpoint directories as one checkpoint) and `ckptfs
//! import-flink` (a Flink job's completed checkpoints, one checkpoint each): through a
//! mount's daemon, or into a store that no daemon holds, taking its lock or lease as a
//! daemon would (a store a daemon holds is refused, naming it).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use ckptfs::control::import_flink::{self, FlinkCheckpoint, NotImported};
use ckptfs::control::protocol::{answer_line, CheckpointDone, Failure, Line, Reply, Request};
use ckptfs_core::error::{Error, IoContext};
use ckptfs_core::flink::import as flink;
use ckptfs_core::import::ImportDir;
use ckptfs_core::names::BackendName;
use ckptfs_core::store::Location;

use crate::client::{self, progress};

/// One committed checkpoint, as the command prints it: its id, or with `json` its answer.
fn print_done(done: &CheckpointDone, json: bool) {
    if json {
        println!("{}", answer_line(&Ok(Reply::Checkpoint(done.clone()))));
    } else {
        println!("{}", done.id);
    }
}

pub fn import(
    target: &Path,
    imports: &[(BackendName, PathBuf)],
    state: Option<PathBuf>,
    wait: Duration,
    json: bool,
) -> Result<ExitCode, Error> {
    let done = if client::has_daemon(target) {
        import_through_daemon(target, imports, wait)?
    } else {
        import_into_store(target, imports, state)?
    };
    print_done(&done, json);
    Ok(ExitCode::SUCCESS)
}

fn import_through_daemon(
    mountpoint: &Path,
    imports: &[(BackendName, PathBuf)],
    wait: Duration,
) -> Result<CheckpointDone, Error> {
    let mut commands = Vec::new();
    for (backend, dir) in imports {
        commands.push(Request::Import(ImportDir {
            backend: backend.clone(),
            // The daemon runs elsewhere: it needs the whole path.
            dir: std::fs::canonicalize(dir).ctx("import", dir)?,
        }));
    }
    commands.push(Request::Checkpoint);
    let spinner = progress::spinner("import in progress");
    let answer = client::request_while_busy(mountpoint, &commands, wait);
    spinner.finish_and_clear();
    answer?.into_checkpoint()
}

fn import_into_store(
    store: &Path,
    imports: &[(BackendName, PathBuf)],
    state: Option<PathBuf>,
) -> Result<CheckpointDone, Error> {
    // Every directory is checked before the store is touched.
    let scanned = imports
        .iter()
        .map(|(backend, dir)| ckptfs_core::import::scan(backend, dir))
        .collect::<Result<Vec<_>, Error>>()?;
    let engine = open_for_import(store, state)?;
    let spinner = progress::spinner("import in progress");
    let done = engine
        .begin(ckptfs_core::CheckpointPlan::Import(scanned))
        .and_then(|pending| pending.complete_with_imports());
    spinner.finish_and_clear();
    let (manifest, reports) = done?;
    Ok(CheckpointDone::of(&manifest, reports))
}

/// The failure of one Flink checkpoint's import, as `import-flink --json` prints it.
#[derive(Serialize)]
struct FlinkFailure<'a> {
    #[serde(flatten)]
    failure: Failure,
    flink: &'a FlinkCheckpoint,
}

/// `ckptfs import-flink`: every completed checkpoint of the jobs under `src` (one job's
/// directory, or a checkpoint root of any number of jobs) newer than the newest the store
/// holds of its job, job by job, oldest first, one checkpoint each; through the daemon when
/// `target` is a mountpoint.
pub fn import_flink(
    src: &Path,
    roots: &[PathBuf],
    target: &Path,
    state: Option<PathBuf>,
    json: bool,
) -> Result<ExitCode, Error> {
    let done = if client::has_daemon(target) {
        // The daemon runs elsewhere: it needs the whole paths.
        let command = Request::ImportFlink {
            src: flink::FlinkSource::absolute(src)?,
            roots: roots
                .iter()
                .map(|root| flink::FlinkSource::absolute(root))
                .collect::<Result<_, _>>()?,
        };
        let spinner = progress::spinner("import in progress");
        let answer = client::request(target, &command);
        spinner.finish_and_clear();
        answer?.into_imported()?
    } else {
        // Every checkpoint's metadata is read before the store is touched.
        let plan = import_flink::checked_plan(src, roots)?;
        let engine = open_for_import(target, state)?;
        // No daemon holds the store: no other checkpoint can take the slot.
        match import_flink::import(&engine, &plan, || false) {
            Ok(done) => done.into_iter().map(|d| d.done).collect(),
            Err(failed) => return Err(said_partly(*failed, json)),
        }
    };
    for d in &done {
        print_done(d, json);
    }
    Ok(ExitCode::SUCCESS)
}

/// A Flink import that failed part way: what was committed before the failure is printed
/// as a success would print it, then with `json` a line for the failure; the error (which
/// says the same) is returned.
fn said_partly(failed: NotImported, json: bool) -> Error {
    for d in &failed.done {
        print_done(&d.done, json);
    }
    if json {
        let line = Line {
            ok: false,
            body: FlinkFailure {
                failure: Failure::of(&failed.error),
                flink: &failed.failed,
            },
        };
        match serde_json::to_string(&line) {
            Ok(line) => println!("{line}"),
            Err(e) => return Error::Invalid(format!("cannot write the failure as JSON: {e}")),
        }
    }
    failed.error
}

/// The engine of a store written without a daemon: it hosts nothing and carries every
/// backend over. An existing directory that is no store is refused.
pub fn open_for_import(store: &Path, state: Option<PathBuf>) -> Result<ckptfs_core::Engine, Error> {
    let location = client::parse_location(store)?;
    if let Location::Local(dir) = &location {
        // An unmounted mountpoint is an existing directory that is no store: never turn it
        // into one by mistake.
        if dir.exists() && ckptfs_core::repo::check_is_store(dir).is_err() {
            return Err(Error::NotFound(format!(
                "{} is neither a ckptfs mount (not mounted?) nor a ckptfs store; to create a \
                 new store, give a path that does not exist yet",
                dir.display()
            )));
        }
    }
    let mut config = ckptfs_core::EngineConfig::new(location);
    config.state = state;
    config.host_backends = false;
    ckptfs_core::Engine::open(config)
}
