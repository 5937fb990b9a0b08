//! Getting a checkpoint out: `ckptfs restore` (RocksDB directories, every object verified)
//! and `ckptfs export-flink` (a Flink checkpoint directory Flink restores from).

use std::path::Path;
use std::process::ExitCode;

use ckptfs_core::commands::restore;
use ckptfs_core::error::Error;
use ckptfs_core::flink::export;
use ckptfs_core::store::Location;

use crate::client::{progress, read_checkpoints, Target};

pub fn restore(
    store: &Location,
    checkpoint: u64,
    dest: &Path,
    json: bool,
) -> Result<ExitCode, Error> {
    let total = restore::checkpoint_bytes(store, checkpoint).unwrap_or(0);
    let bar = progress::progress_bar(total, "restoring");
    let report = restore::restore_checkpoint(store, checkpoint, dest, |n| bar.inc(n))
        .map_err(|e| with_retained(e, store))?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string(&report).expect("json"));
    } else {
        println!(
            "restored checkpoint {checkpoint}: {} backends, {} files, {} bytes into {}",
            report.backends,
            report.files,
            report.bytes,
            dest.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `e`, and when it is "no such checkpoint", which checkpoints the store holds.
fn with_retained(e: Error, store: &Location) -> Error {
    let Error::NoSuchCheckpoint(id) = e else {
        return e;
    };
    let ids: Vec<String> = match crate::client::store_checkpoints(store) {
        Ok((_, manifests)) => manifests.iter().map(|m| m.id.to_string()).collect(),
        Err(_) => return e,
    };
    let held = match ids.len() {
        0 => "none".to_string(),
        n if n > 20 => format!(
            "{} ... {} ({n}; ckptfs ls lists them)",
            ids[..10].join(", "),
            ids[n - 10..].join(", ")
        ),
        _ => ids.join(", "),
    };
    Error::NotFound(format!(
        "no such checkpoint: {id} in {store}; it holds {held}"
    ))
}

/// `ckptfs export-flink`: from a mount, its `cp-N/` files and its label of N; from a store,
/// read directly.
pub fn export_flink(target: &Path, id: u64, dest: &Path, json: bool) -> Result<ExitCode, Error> {
    let dest = ckptfs_core::store::Location::parse(&dest.to_string_lossy())?;
    let spinner = progress::spinner(&format!("exporting checkpoint {id} to {dest}"));
    let exported = match Target::of(target)? {
        Target::Mount(mountpoint) => {
            let row = read_checkpoints(&mountpoint)?
                .into_iter()
                .find(|row| row.id == id)
                .ok_or_else(|| {
                    Error::NotFound(format!("no checkpoint {id} in {}", mountpoint.display()))
                })?;
            let label = row.flink.ok_or_else(|| export::not_flink(id))?;
            let files = export::MountedCheckpoint(mountpoint.join(format!("cp-{id}")));
            ckptfs_core::commands::export_flink::export_to(
                &files,
                &label.job,
                label.checkpoint,
                &dest,
            )?
        }
        Target::Store(location) => {
            ckptfs_core::commands::export_flink::export_from_store(&location, id, &dest)?
        }
    };
    spinner.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string(&exported).expect("json"));
    } else {
        println!("{}", exported.path.display());
    }
    Ok(ExitCode::SUCCESS)
}
