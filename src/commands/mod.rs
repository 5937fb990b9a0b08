//! What each subcommand does, one file per family: [`mount`] (mount, serve, umount), [`mounted`]
//! (checkpoint, put, del, load, rm: through a mount's control file), [`policy`] (forget,
//! pin, unpin), [`show`] (ls, status, graph, du), [`diff`], [`import`] (import,
//! import-flink), [`restore`] (restore, export-flink), [`flink_gc`], [`fsck`], and [`tools`]
//! (scan, workload). The engine's work is in `ckptfs-core`; these turn arguments into its
//! calls and its answers into output.

mod diff;
mod flink_gc;
mod fsck;
mod import;
mod mount;
mod mounted;
mod policy;
mod restore;
mod show;
mod tools;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use ckptfs_core::error::Error;

use crate::cli::Command;

/// Run one subcommand. `args` is the effective command line (after the mount helper's
/// translation), which `mount` runs again as the daemon.
pub fn run(command: Command, args: &[OsString]) -> Result<ExitCode, Error> {
    match command {
        Command::Mount(mount) => mount::mount(mount, args),
        Command::Serve(serve) => mount::serve(serve),
        Command::Umount {
            mountpoint,
            timeout,
        } => mount::umount(&mountpoint, timeout),
        Command::Checkpoint {
            mountpoint,
            wait,
            json,
        } => mounted::checkpoint(&mountpoint, Duration::from_secs(wait), json),
        Command::Import {
            target,
            imports,
            state,
            wait,
            json,
        } => import::import(&target, &imports, state, Duration::from_secs(wait), json),
        Command::ImportFlink {
            src,
            target,
            state,
            source_roots,
            json,
        } => import::import_flink(&src, &source_roots, &target, state, json),
        Command::FlinkGc(args) => flink_gc::flink_gc(args),
        Command::ExportFlink {
            target,
            checkpoint,
            dest,
            json,
        } => restore::export_flink(&target, checkpoint, &dest, json),
        Command::Ls { mountpoint, json } => show::ls(&mountpoint, json),
        Command::Forget(args) => policy::forget(args),
        Command::Pin {
            target,
            checkpoint,
            name,
            state,
        } => policy::pin(&target, checkpoint, &name, state),
        Command::Unpin {
            target,
            name,
            state,
        } => policy::unpin(&target, &name, state),
        Command::Rm {
            mountpoint,
            checkpoint,
            force,
        } => mounted::rm(&mountpoint, checkpoint, force),
        Command::Status { mountpoint, json } => show::status(&mountpoint, json),
        Command::Put {
            mountpoint,
            backend,
            key,
            value,
        } => mounted::put(&mountpoint, backend, &key, &value),
        Command::Del {
            mountpoint,
            backend,
            key,
        } => mounted::del(&mountpoint, backend, &key),
        Command::Load {
            mountpoint,
            backend,
            file,
        } => mounted::load(&mountpoint, &backend, file.as_deref()),
        Command::Restore {
            store,
            checkpoint,
            dest,
            json,
        } => restore::restore(&store, checkpoint, &dest, json),
        Command::Graph { path, format } => show::graph(&path, format.as_deref()),
        Command::Du {
            path,
            id: _,
            json,
            history,
            svg,
        } if history || svg.is_some() => show::du_history(&path, history, json, svg.as_deref()),
        Command::Du { path, id, json, .. } => show::du(&path, id, json),
        Command::Diff {
            path,
            a,
            b,
            json,
            keys,
            limit,
        } => diff::diff(&path, a, b, json, keys.then_some(limit)),
        Command::Fsck {
            store,
            repair,
            from,
            json,
        } => fsck::fsck(&store, repair, &from, json),
        Command::Scan { dir, count } => tools::scan(&dir, count),
        Command::Workload(workload) => tools::workload(workload),
        Command::Completions { shell } => tools::completions(shell),
    }
}
