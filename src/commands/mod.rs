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
        Command::Umount(a) => mount::umount(&a.mountpoint, a.timeout),
        Command::Checkpoint(a) => {
            mounted::checkpoint(&a.mountpoint, Duration::from_secs(a.wait), a.json)
        }
        Command::Import(a) => import::import(
            &a.target,
            &a.imports,
            a.state,
            Duration::from_secs(a.wait),
            a.json,
        ),
        Command::ImportFlink(a) => {
            import::import_flink(&a.src, &a.source_roots, &a.target, a.state, a.json)
        }
        Command::FlinkGc(args) => flink_gc::flink_gc(args),
        Command::ExportFlink(a) => restore::export_flink(&a.target, a.checkpoint, &a.dest, a.json),
        Command::Ls(a) => show::ls(&a.mountpoint, a.json),
        Command::Forget(args) => policy::forget(args),
        Command::Pin(a) => policy::pin(&a.target, a.checkpoint, &a.name, a.state),
        Command::Unpin(a) => policy::unpin(&a.target, &a.name, a.state),
        Command::Rm(a) => mounted::rm(&a.mountpoint, a.checkpoint, a.force),
        Command::Status(a) => show::status(&a.mountpoint, a.json),
        Command::Put(a) => mounted::put(&a.mountpoint, a.backend, &a.key, &a.value),
        Command::Del(a) => mounted::del(&a.mountpoint, a.backend, &a.key),
        Command::Load(a) => mounted::load(&a.mountpoint, &a.backend, a.file.as_deref()),
        Command::Restore(a) => restore::restore(&a.store, a.checkpoint, &a.dest, a.json),
        Command::Graph(a) => show::graph(&a.path, a.format.as_deref()),
        Command::Du(a) if a.history || a.svg.is_some() => {
            show::du_history(&a.path, a.history, a.json, a.svg.as_deref())
        }
        Command::Du(a) => show::du(&a.path, a.id, a.json),
        Command::Diff(a) => diff::diff(&a.path, a.a, a.b, a.json, a.keys.then_some(a.limit)),
        Command::Fsck(a) => fsck::fsck(&a.store, a.repair, &a.from, a.json),
        Command::Scan(a) => tools::scan(&a.dir, a.count),
        Command::Workload(workload) => tools::workload(workload),
        Command::Completions(a) => tools::completions(a.shell),
    }
}
