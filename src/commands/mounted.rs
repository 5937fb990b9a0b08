//! Commands that act through a mount's control file (`checkpoint`, `put`, `del`, `load`)
//! or its tree (`rm`: `rmdir cp-N`).

use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use ckptfs::control::protocol::{answer_line, Reply, Request};
use ckptfs_core::error::{Error, IoContext};
use ckptfs_core::names::BackendName;
use ckptfs_core::percent;

use crate::client::{self, progress};

/// Take a checkpoint, retrying while the daemon is busy for up to `wait`; print its id or,
/// with `json`, its answer.
pub fn checkpoint(mountpoint: &Path, wait: Duration, json: bool) -> Result<ExitCode, Error> {
    let spinner = progress::spinner("checkpoint in progress");
    let answer = client::request_while_busy(mountpoint, &[Request::Checkpoint], wait);
    spinner.finish_and_clear();
    let done = answer?.into_checkpoint()?;
    if json {
        println!("{}", answer_line(&Ok(Reply::Checkpoint(done))));
    } else {
        println!("{}", done.id);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn put(
    mountpoint: &Path,
    backend: BackendName,
    key: &std::ffi::OsStr,
    value: &std::ffi::OsStr,
) -> Result<ExitCode, Error> {
    let put = Request::Put {
        backend,
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    };
    client::request(mountpoint, &put)?;
    Ok(ExitCode::SUCCESS)
}

pub fn del(
    mountpoint: &Path,
    backend: BackendName,
    key: &std::ffi::OsStr,
) -> Result<ExitCode, Error> {
    let del = Request::Del {
        backend,
        key: key.as_bytes().to_vec(),
    };
    client::request(mountpoint, &del)?;
    Ok(ExitCode::SUCCESS)
}

/// Drop checkpoint N: `rmdir cp-N`, which refuses the newest; with `force`, the control
/// line `delete N`, which drops it too (and says where `latest` went).
pub fn rm(mountpoint: &Path, checkpoint: u64, force: bool) -> Result<ExitCode, Error> {
    if force {
        client::request(mountpoint, &Request::Delete(checkpoint))?;
        let newest = client::read_status(mountpoint)
            .ok()
            .and_then(|s| s.checkpoints.last().map(|c| c.id));
        match newest {
            Some(id) if id < checkpoint => eprintln!("latest is now cp-{id}"),
            None => eprintln!("no checkpoint is left: latest is gone"),
            Some(_) => {}
        }
        return Ok(ExitCode::SUCCESS);
    }
    let dir = mountpoint.join(format!("cp-{checkpoint}"));
    std::fs::remove_dir(&dir).map_err(|e| refused_drop(mountpoint, checkpoint, &dir, e))?;
    Ok(ExitCode::SUCCESS)
}

/// Why `rmdir cp-N` was refused, said with what to do: a pin names itself, the newest
/// checkpoint says what `--force` would do (`EBUSY` alone said "Device or resource busy").
fn refused_drop(mountpoint: &Path, checkpoint: u64, dir: &Path, e: std::io::Error) -> Error {
    if e.raw_os_error() != Some(libc::EBUSY) {
        return Error::io(format!("drop {}", dir.display()), e);
    }
    let now = ckptfs_core::fsutil::now_unix_ms();
    let status = client::read_status(mountpoint).ok();
    let pins: Vec<(String, String)> = status
        .as_ref()
        .map(|status| {
            status
                .pins
                .iter()
                .filter(|(_, on)| **on == checkpoint)
                .map(|(name, _)| {
                    // A restore lease says when it lets go by itself.
                    let shown = match status.pin_expires.get(name) {
                        Some(at) => format!(
                            "{name} (a restore lease: a read of its _metadata; it expires \
                             in {}s)",
                            at.saturating_sub(now).div_ceil(1000)
                        ),
                        None => name.clone(),
                    };
                    (name.clone(), shown)
                })
                .collect()
        })
        .unwrap_or_default();
    let rows = status.as_ref().map_or(&[][..], |s| &s.checkpoints[..]);
    let newest = rows.last().is_some_and(|c| c.id == checkpoint);
    match pins.first() {
        Some((name, _)) => Error::Busy(format!(
            "checkpoint {checkpoint} is pinned as {}: `ckptfs unpin {} {name}` first",
            pins.iter()
                .map(|(_, shown)| shown.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            mountpoint.display()
        )),
        None if newest => Error::Busy(format!(
            "checkpoint {checkpoint} is the newest (latest -> cp-{checkpoint}): dropping it \
             would {}; `ckptfs rm --force {} {checkpoint}` drops it",
            rows.iter()
                .rev()
                .nth(1)
                .map_or("leave no latest".to_string(), |c| format!(
                    "move latest back to cp-{}",
                    c.id
                )),
            mountpoint.display()
        )),
        None => Error::Busy(format!(
            "drop {}: a listing of it is open (root's or the mount owner's); try again once \
             it is closed",
            dir.display()
        )),
    }
}

/// Keep each write(2) well under the kernel's FUSE write size so it arrives whole.
const LOAD_CHUNK: usize = 64 * 1024;

/// `KEY<TAB>VALUE` lines (percent-encoded) from `file` or stdin, put in batches of one
/// write each.
pub fn load(
    mountpoint: &Path,
    backend: &BackendName,
    file: Option<&Path>,
) -> Result<ExitCode, Error> {
    let input: Box<dyn BufRead> = match file {
        Some(p) => Box::new(BufReader::new(std::fs::File::open(p).ctx("open", p)?)),
        None => Box::new(BufReader::new(std::io::stdin())),
    };
    let mut batch: Vec<Request> = Vec::new();
    let mut batch_bytes = 0;
    let mut loaded = 0usize;
    // Each batch is one atomic write; a refused batch stops the load, and we say how far
    // it got.
    let send = |batch: &mut Vec<Request>, loaded: &mut usize| -> Result<(), Error> {
        match client::requests(mountpoint, batch) {
            Ok(answers) => {
                *loaded += answers.len();
                batch.clear();
                Ok(())
            }
            Err(e) => Err(e.context(format!(
                "a batch of {} keys was refused ({loaded} keys were loaded before it)",
                batch.len()
            ))),
        }
    };
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| Error::io("read input", e))?;
        if line.is_empty() {
            continue;
        }
        let (k, v) = line
            .split_once('\t')
            .ok_or_else(|| Error::Invalid(format!("line {}: expected KEY<TAB>VALUE", n + 1)))?;
        // Decoded here: the daemon gets canonical fields (no raw spaces), so only this
        // line's number can be wrong, and it is reported here.
        let (key, value) = percent::decode(k)
            .and_then(|k| Ok((k, percent::decode(v)?)))
            .map_err(|e| {
                Error::Invalid(format!(
                    "line {}: {e} ({loaded} keys were loaded before it)",
                    n + 1
                ))
            })?;
        let command = Request::Put {
            backend: backend.clone(),
            key,
            value,
        };
        let size = command.to_line().len() + 1;
        if batch_bytes + size > LOAD_CHUNK && !batch.is_empty() {
            send(&mut batch, &mut loaded)?;
            batch_bytes = 0;
        }
        batch_bytes += size;
        batch.push(command);
    }
    if !batch.is_empty() {
        send(&mut batch, &mut loaded)?;
    }
    println!("loaded {loaded} keys into {backend}");
    Ok(ExitCode::SUCCESS)
}
