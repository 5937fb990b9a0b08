//! `ckptfs flink-gc SRC`: what Flink left behind in its checkpoint directory (the rules are
//! `ckptfs_core::flink::gc`'s), a dry run unless `--delete`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::SystemTime;

use ckptfs_core::error::Error;
use ckptfs_core::flink::gc::{self, GcDone, GcFile, GcOptions, GcPlan, Reason};
use ckptfs_core::flink::import::FlinkSource;
use serde::Serialize;

use super::show::when;
use crate::cli::FlinkGcArgs;
use crate::client::{progress, store_checkpoints, Target};

/// The report, as `--json` prints it.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    plan: &'a GcPlan,
    /// Per unretained checkpoint (same order): the ckptfs checkpoint importing it, where
    /// `--store` was given (`null` inside: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    imported: Option<Vec<Option<u64>>>,
    /// What `--delete` did.
    deleted: Option<&'a GcDone>,
}

pub fn flink_gc(args: FlinkGcArgs) -> Result<ExitCode, Error> {
    let options = GcOptions {
        grace: args.grace,
        checkpoint_timeout: args.checkpoint_timeout,
        num_retained: args.num_retained,
        now: SystemTime::now(),
    };
    options.check()?;
    // Which store checkpoints import which Flink checkpoint: asked before anything is
    // deleted, so that a wrong --store fails a run that changed nothing.
    let imports = match &args.store {
        Some(target) => {
            let location = Target::of(target)?.store()?;
            let mut by_label = BTreeMap::new();
            for manifest in store_checkpoints(&location)?.1 {
                if let Some(label) = manifest.flink {
                    by_label.insert((label.job, label.checkpoint), manifest.id);
                }
            }
            Some(by_label)
        }
        None => None,
    };
    let source = FlinkSource::open(&args.src, &args.reference_roots)?;
    let spinner = progress::spinner(&format!(
        "looking for what Flink no longer needs in {}",
        args.src.display()
    ));
    let plan = gc::plan(&source, &options)?;
    let imported = imports.map(|by_label| {
        plan.unretained
            .iter()
            .map(|u| by_label.get(&(u.job_id.clone(), u.checkpoint)).copied())
            .collect::<Vec<_>>()
    });
    let done = if args.delete {
        spinner.set_message(format!("deleting garbage in {}", args.src.display()));
        Some(gc::delete(
            &source,
            &plan,
            &options,
            args.delete_unretained,
        )?)
    } else {
        None
    };
    spinner.finish_and_clear();
    if args.json {
        let report = Report {
            plan: &plan,
            imported,
            deleted: done.as_ref(),
        };
        let text = serde_json::to_string(&report)
            .map_err(|e| Error::Invalid(format!("cannot write the report as JSON: {e}")))?;
        println!("{text}");
    } else {
        print_report(&plan, imported.as_deref(), done.as_ref(), args.all);
    }
    Ok(match &done {
        Some(d) if !d.failed.is_empty() => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    })
}

fn print_report(plan: &GcPlan, imported: Option<&[Option<u64>]>, done: Option<&GcDone>, all: bool) {
    println!(
        "{}: {} jobs, {} files ({} bytes) looked at, scanned {}, grace {}",
        plan.source,
        plan.jobs.len(),
        plan.scanned.files,
        plan.scanned.bytes,
        when(plan.scanned_unix_ms),
        humantime::format_duration(std::time::Duration::from_secs_f64(plan.grace_s))
    );
    for job in &plan.jobs {
        let ids = |v: &[u64]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
            }
        };
        println!(
            "  job {}: completed {}; retained {}; never completed {}; last written {}{}",
            if job.job.is_empty() { "." } else { &job.job },
            ids(&job.completed),
            ids(&job.retained),
            ids(&job.incomplete),
            if job.last_written_unix_ms == 0 {
                "unknown".to_string()
            } else {
                when(job.last_written_unix_ms)
            },
            if job.writing {
                " (within the grace: still running?)"
            } else {
                ""
            }
        );
        let apart = std::time::Duration::from_millis(job.checkpoints_apart_ms);
        if apart + std::time::Duration::from_secs_f64(plan.checkpoint_timeout_s)
            > std::time::Duration::from_secs_f64(plan.grace_s)
        {
            println!(
                "    its checkpoints came up to {} apart: longer than the grace minus the \
                 checkpoint timeout, so its file-merging files are kept whatever its last \
                 write (give a longer --grace)",
                humantime::format_duration(apart)
            );
        }
    }
    println!();
    println!(
        "garbage: {} files, {} bytes",
        plan.garbage_total.files, plan.garbage_total.bytes
    );
    let mut by_reason: BTreeMap<Reason, Vec<&GcFile>> = BTreeMap::new();
    for g in &plan.garbage {
        by_reason.entry(g.reason).or_default().push(g);
    }
    for (reason, files) in by_reason {
        let bytes: u64 = files.iter().map(|g| g.bytes).sum();
        println!(
            "  {}: {} files, {bytes} bytes",
            reason.describe(),
            files.len()
        );
        let shown = if all {
            files.len()
        } else {
            files.len().min(20)
        };
        for g in &files[..shown] {
            println!(
                "    {}  {} bytes  written {}",
                g.path,
                g.bytes,
                when(g.modified_unix_ms)
            );
        }
        if shown < files.len() {
            println!("    ... {} more (--all lists them)", files.len() - shown);
        }
    }
    println!(
        "kept, younger than the grace: {} files, {} bytes",
        plan.young.files, plan.young.bytes
    );
    if plan.pooled.files > 0 {
        println!(
            "kept, in the file-merging directories of jobs that wrote within the grace (their \
             pools may append to them): {} files, {} bytes",
            plan.pooled.files, plan.pooled.bytes
        );
    }
    if plan.outside > 0 {
        println!(
            "not judged: {} files the checkpoints name outside {}",
            plan.outside, plan.source
        );
    }
    for b in &plan.broken {
        println!(
            "broken: {} checkpoint {} names {} files that are gone (it cannot be restored)",
            if b.job.is_empty() { "." } else { &b.job },
            b.checkpoint,
            b.missing
        );
    }
    for (path, why) in &plan.left_alone {
        println!("left alone: {path}: {why}");
    }
    if !plan.unretained.is_empty() {
        println!();
        println!(
            "completed checkpoints Flink no longer retains (each job's newest {} are): {} \
             files, {} bytes in all (--delete-unretained deletes them)",
            plan.num_retained, plan.unretained_total.files, plan.unretained_total.bytes
        );
        for (i, u) in plan.unretained.iter().enumerate() {
            let store = match imported.map(|v| v[i]) {
                Some(Some(id)) => format!("; imported into the store as checkpoint {id}"),
                Some(None) => "; NOT in the store".to_string(),
                None => String::new(),
            };
            println!(
                "  {} (completed {}): {} files, {} bytes of its own, {} shared files, {} \
                 bytes only such checkpoints name{store}",
                u.path,
                when(u.completed_unix_ms),
                u.own.files,
                u.own.bytes,
                u.shared.files,
                u.shared.bytes
            );
        }
    }
    println!();
    match done {
        None => println!("dry run: nothing deleted (--delete deletes the garbage)"),
        Some(d) => {
            println!(
                "deleted: {} files, {} bytes; {} directories removed; {} gone meanwhile; {} \
                 kept by the second scan",
                d.deleted.files, d.deleted.bytes, d.dirs_removed, d.gone, d.kept_by_second_scan
            );
            for (path, e) in &d.failed {
                println!("not deleted: {path}: {e}");
            }
        }
    }
}
