//! `ckptfs fsck`: recount references, verify every object, and with `--repair` mend what
//! can be mended; the report as text or JSON, exit 1 unless the store is clean.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ckptfs_core::commands::fsck;
use ckptfs_core::store::Location;

use ckptfs_core::error::Error;

use crate::client::progress;

pub fn fsck(
    store: &Location,
    repair: bool,
    from: &[PathBuf],
    json: bool,
) -> Result<ExitCode, Error> {
    let bar = progress::progress_bar(store.local().map_or(0, store_bytes), "verifying");
    let report = fsck::fsck_with_copies(store, repair, from, |n| bar.inc(n))?;
    bar.finish_and_clear();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serializes")
        );
    } else {
        print_fsck(&report, repair);
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Bytes referenced by a store's manifests (for fsck's progress bar); 0 if unreadable.
fn store_bytes(store: &Path) -> u64 {
    let Ok(repo) = ckptfs_core::repo::Repo::reader(&Location::from(store)) else {
        return 0;
    };
    let mut sizes = std::collections::BTreeMap::new();
    for m in repo.catalog.load_all().unwrap_or_default().values() {
        for b in &m.backends {
            for f in b.files.iter() {
                sizes.extend(f.stored());
            }
        }
    }
    sizes.values().sum()
}

fn print_fsck(report: &fsck::FsckReport, repair: bool) {
    println!(
        "checkpoints: {} ({:?})",
        report.checkpoints.len(),
        report.checkpoints
    );
    println!(
        "objects: {} referenced ({} bytes), {} stored",
        report.objects_referenced, report.bytes_referenced, report.objects_stored
    );
    for id in &report.missing {
        println!("missing: {id}");
    }
    for line in &report.repaired_objects {
        println!("repaired: {line}");
    }
    for line in &report.unreadable_manifests {
        println!("unreadable manifest: {line}");
    }
    for path in &report.quarantined {
        println!("quarantined: {path} (its objects are kept)");
    }
    for id in &report.corrupt {
        println!("corrupt: {id}");
    }
    for line in &report.problems {
        println!("problem: {line}");
    }
    let deleted = repair && report.orphans_kept.is_none();
    for id in &report.orphans {
        let young = report.orphans_young.contains(id);
        let what = match (deleted, young) {
            (_, true) => " (younger than the grace period of an hour: kept)",
            (true, false) => " (deleted)",
            (false, false) => "",
        };
        println!("orphan: {id}{what}");
    }
    if let (Some(why), false) = (&report.orphans_kept, report.orphans.is_empty()) {
        println!("orphans are kept, not deleted: {why}");
    }
    if report.staged_leftovers > 0 {
        println!(
            "leftovers of interrupted checkpoints: {}{}",
            report.staged_leftovers,
            if repair { " (deleted)" } else { "" }
        );
    }
    if !report.damaged_checkpoints.is_empty() && !report.is_clean() {
        println!(
            "damaged checkpoints (no intact copy found; drop them, restore an older one, or \
             give a directory with copies to --repair --from): {:?}",
            report.damaged_checkpoints
        );
    }
    if report.is_clean() {
        println!("clean");
    } else if !repair && !report.unreadable_manifests.is_empty() {
        println!(
            "run `ckptfs fsck --repair` to move unreadable manifests to quarantine/ \
             (nothing is deleted; their checkpoints are no longer shown)"
        );
    } else if !repair && (!report.orphans.is_empty() || report.staged_leftovers > 0) {
        println!("run `ckptfs fsck --repair` to delete orphans and leftovers");
    }
}
