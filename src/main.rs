//! The `ckptfs` command line.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

use ckptfs_core::backend::{scan_dir, BackendOptions};
use ckptfs_core::commands::{fsck, restore};
use ckptfs_core::error::Error;
use ckptfs_core::{percent, workload, Engine, EngineConfig};
use cli::{Cli, Command};

/// The effective command line (after mount-helper translation), for re-running as daemon.
static ARGS: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

fn main() -> ExitCode {
    #[cfg(feature = "failpoints")]
    let _failpoints = ckptfs_core::failpoint::setup();
    // Invoked by mount(8) as mount.fuse.ckptfs (or mount.ckptfs): translate its arguments.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let invoked_as = Path::new(&argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let args: Vec<std::ffi::OsString> = if invoked_as.starts_with("mount.") {
        let command = <Cli as clap::CommandFactory>::command();
        let mount = command
            .find_subcommand("mount")
            .expect("the mount subcommand");
        match client::mount_helper_args(std::env::args().skip(1).collect(), mount) {
            Ok(args) => args.into_iter().map(Into::into).collect(),
            Err(e) => {
                eprintln!("{invoked_as}: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        std::env::args_os().collect()
    };
    let cli = Cli::parse_from(&args);
    ARGS.set(args).expect("set once");
    let default_level = if matches!(cli.command, Command::Mount(_)) {
        "info"
    } else {
        "warn"
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        .init();
    match run(cli.command) {
        Ok(code) => code,
        // `ckptfs scan DIR | head` is not an error.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ckptfs: error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(command: Command) -> Result<ExitCode, Error> {
    match command {
        Command::Mount(mut args) => {
            // Refuse bad options before anything is created or started.
            args.validate()?;
            if args.state.is_none() && args.read_only {
                args.state = Some(args.read_only_state()?);
            }
            if !args.foreground {
                let argv = ARGS.get().map(|a| &a[1..]).unwrap_or_default();
                return client::daemonize(
                    &args.store,
                    args.state.as_deref(),
                    args.read_only,
                    args.log_file.as_deref(),
                    argv,
                );
            }
            let config = args.into_config()?;
            ckptfs_core::lease::on_wait(client::notify_note);
            ckptfs::daemon::serve(config, client::notify_ready)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Umount {
            mountpoint,
            timeout,
        } => client::umount(&mountpoint, timeout),
        Command::Checkpoint {
            mountpoint,
            wait,
            json,
        } => {
            let spinner = client::spinner("checkpoint in progress");
            let answer = client::request_retrying_busy(
                &mountpoint,
                "checkpoint",
                std::time::Duration::from_secs(wait),
            );
            spinner.finish_and_clear();
            let answer = answer?;
            if json {
                println!("{answer}");
            } else {
                println!("{}", answer["id"]);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Import {
            target,
            imports,
            state,
            wait,
            json,
        } => client::import(
            &target,
            &imports,
            state,
            std::time::Duration::from_secs(wait),
            json,
        ),
        Command::ImportFlink {
            src,
            target,
            state,
            source_roots,
            json,
        } => client::import_flink(&src, &source_roots, &target, state, json),
        Command::ExportFlink {
            target,
            checkpoint,
            dest,
            json,
        } => client::export_flink(&target, checkpoint, &dest, json),
        Command::Ls { mountpoint, json } => client::ls(&mountpoint, json),
        Command::Rm {
            mountpoint,
            checkpoint,
        } => {
            let dir = mountpoint.join(format!("cp-{checkpoint}"));
            std::fs::remove_dir(&dir)
                .map_err(|e| Error::io(format!("drop {}", dir.display()), e))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { mountpoint, json } => client::status(&mountpoint, json),
        Command::Put {
            mountpoint,
            backend,
            key,
            value,
        } => {
            use std::os::unix::ffi::OsStrExt;
            let line = format!(
                "put {backend} {} {}",
                percent::encode(key.as_bytes()),
                percent::encode(value.as_bytes())
            );
            client::request(&mountpoint, &line)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Del {
            mountpoint,
            backend,
            key,
        } => {
            use std::os::unix::ffi::OsStrExt;
            client::request(
                &mountpoint,
                &format!("del {backend} {}", percent::encode(key.as_bytes())),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Load {
            mountpoint,
            backend,
            file,
        } => client::load(&mountpoint, &backend, file.as_deref()),
        Command::Restore {
            store,
            checkpoint,
            dest,
            json,
        } => {
            let total = restore::checkpoint_bytes(&store, checkpoint).unwrap_or(0);
            let bar = client::progress_bar(total, "restoring");
            let report = restore::restore_checkpoint(&store, checkpoint, &dest, |n| bar.inc(n))?;
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
        Command::Graph { path, format } => client::graph(&path, format.as_deref()),
        Command::Fsck {
            store,
            repair,
            from,
            json,
        } => {
            let bar =
                client::progress_bar(store.local().map_or(0, client::store_bytes), "verifying");
            let report = fsck::fsck_with_copies(&store, repair, &from, |n| bar.inc(n))?;
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
        Command::Scan { dir, count } => {
            let pairs = scan_dir(&dir)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let io = |e| Error::io("write to stdout", e);
            if count {
                writeln!(out, "{}", pairs.len()).map_err(io)?;
            } else {
                for (k, v) in pairs {
                    writeln!(out, "{}\t{}", percent::encode(&k), percent::encode(&v))
                        .map_err(io)?;
                }
            }
            out.flush().map_err(io)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Workload {
            store,
            state,
            backends,
            rounds,
            keys,
            value_size,
            retain,
            compact_every,
            restore_every,
            format_version,
            rocksdb_options,
            checkpoint_mode,
            import,
        } => {
            let app = import
                .map(|(name, dir)| workload::AppDb::open(name, &dir))
                .transpose()?;
            let mut config = EngineConfig::new(store);
            config.state = state;
            config.backends = if backends.is_empty() {
                vec!["Operator-1/0".parse()?, "Operator-2/0".parse()?]
            } else {
                backends
            };
            config.retain = retain;
            config.backend_options = BackendOptions {
                format_version,
                rocksdb_options,
                checkpoint_mode,
                ..BackendOptions::default()
            };
            let engine = Engine::open(config)?;
            for _ in 0..rounds {
                let mut rounds = workload::step_each(&engine, keys, value_size)?;
                let round = rounds.iter().map(|(_, r)| *r).max().unwrap_or(0);
                if compact_every > 0 && round > 0 && round % compact_every == 0 {
                    for name in engine.backend_names() {
                        engine.compact(&name)?;
                    }
                }
                let manifest = match &app {
                    Some(app) => {
                        rounds.push((app.name().clone(), app.step(keys, value_size)?));
                        let scanned = ckptfs_core::import::scan(app.name(), &app.checkpoint()?)?;
                        engine
                            .begin(ckptfs_core::CheckpointPlan::Import(vec![scanned]))?
                            .complete()?
                    }
                    None => engine.checkpoint()?,
                };
                let s = &manifest.stats;
                println!(
                    "round {round}: checkpoint {} files={} reused={} bytes={} uploaded={} \
                     rounds={}",
                    manifest.id,
                    s.files_total,
                    s.files_reused,
                    s.bytes_total,
                    s.bytes_uploaded,
                    rounds
                        .iter()
                        .map(|(b, r)| format!("{b}:{r}"))
                        .collect::<Vec<_>>()
                        .join(",")
                );
                if restore_every > 0 && round > 0 && round % restore_every == 0 {
                    let ids: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
                    if let Some(&back) = ids.iter().rev().nth(1) {
                        engine.restore_backends(back)?;
                        println!("restored checkpoint {back}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

mod cli;
mod client;

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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn helper(options: &str) -> Result<Vec<String>, String> {
        let command = Cli::command();
        let mount = command.find_subcommand("mount").unwrap();
        client::mount_helper_args(
            vec![
                "s3://bkt/p".into(),
                "/mnt/x".into(),
                "-o".into(),
                options.into(),
            ],
            mount,
        )
    }

    /// Every long option of `ckptfs mount` has its `-o` twin for fstab and `mount -t
    /// fuse.ckptfs` (with `_` for `-`), so no option can be left out of the list again.
    #[test]
    fn every_mount_option_has_its_fstab_twin() {
        let command = Cli::command();
        let mount = command.find_subcommand("mount").unwrap();
        let mut seen = 0;
        for arg in mount.get_arguments() {
            let Some(long) = arg.get_long().filter(|l| *l != "help") else {
                continue;
            };
            let key = long.replace('-', "_");
            let (option, expected) = if arg.get_action().takes_values() {
                (
                    format!("{key}=V"),
                    vec![format!("--{long}"), "V".to_string()],
                )
            } else {
                (key.clone(), vec![format!("--{long}")])
            };
            let out = helper(&option).unwrap_or_else(|e| panic!("-o {option}: {e}"));
            assert_eq!(out[4..], expected[..], "-o {option}");
            seen += 1;
        }
        assert!(seen > 20, "only {seen} options");
    }

    /// What the helper makes of an fstab line is a command line clap accepts; generic
    /// options are ignored, unknown ones and misused ones refused.
    #[test]
    fn fstab_options_parse_as_a_mount_command() {
        let out = helper(
            "state=/var/lib/ckptfs,backend=Op/0,backend=Op/1,lease_ttl=10s,lease-wait=20s,\
             orphan_grace=1h,upload_concurrency=4,allow_other,_netdev,noauto,rw",
        )
        .unwrap();
        let cli = Cli::try_parse_from(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
        let Command::Mount(args) = cli.command else {
            panic!("not a mount: {out:?}");
        };
        assert_eq!(args.lease_ttl, std::time::Duration::from_secs(10));
        assert_eq!(args.lease_wait, std::time::Duration::from_secs(20));
        assert!(args.allow_other);
        assert_eq!(args.backends.len(), 2);
        assert_eq!(args.upload_concurrency, 4);
        // A read-only view from fstab; clap's rules hold (no backends with read_only).
        let view = helper("read_only,cache_size=1GiB").unwrap();
        assert!(matches!(
            Cli::try_parse_from(&view).unwrap().command,
            Command::Mount(args) if args.read_only
        ));
        let both = helper("read_only,backend=Op/0").unwrap();
        assert!(Cli::try_parse_from(&both).is_err());
        assert!(helper("no_such_option=1").unwrap_err().contains("unknown"));
        assert!(helper("retain").unwrap_err().contains("needs a value"));
        assert!(helper("read_only=yes")
            .unwrap_err()
            .contains("takes no value"));
    }
}
