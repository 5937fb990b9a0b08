//! Tools for development and demonstrations: `ckptfs scan` (a RocksDB directory's keys)
//! and `ckptfs workload` (the built-in workload against a store, without a mount).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use ckptfs_core::backend::{scan_dir, BackendOptions};
use ckptfs_core::error::Error;
use ckptfs_core::{percent, workload, Engine, EngineConfig};

use crate::cli::WorkloadArgs;

/// Every key and value of the RocksDB directory `dir` (read-only), or their number.
pub fn scan(dir: &Path, count: bool) -> Result<ExitCode, Error> {
    let pairs = scan_dir(dir)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let io = |e| Error::io("write to stdout", e);
    if count {
        writeln!(out, "{}", pairs.len()).map_err(io)?;
    } else {
        for (k, v) in pairs {
            writeln!(out, "{}\t{}", percent::encode(&k), percent::encode(&v)).map_err(io)?;
        }
    }
    out.flush().map_err(io)?;
    Ok(ExitCode::SUCCESS)
}

/// Rounds of the built-in workload, each followed by a checkpoint.
pub fn workload(args: WorkloadArgs) -> Result<ExitCode, Error> {
    let WorkloadArgs {
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
    } = args;
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

/// `ckptfs completions SHELL`: the completion script, from the command line's clap types.
pub fn completions(shell: clap_complete::Shell) -> Result<ExitCode, Error> {
    use clap::CommandFactory;
    let mut command = crate::cli::Cli::command();
    clap_complete::generate(shell, &mut command, "ckptfs", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
