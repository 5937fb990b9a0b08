//! `ckptfs forget` (show, change or apply the retention policy), `pin` and `unpin`: through
//! a mount's daemon, or on a store that no daemon holds, taking its lock or lease as a
//! daemon would.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ckptfs::control::protocol::{Plan, Request};
use ckptfs_core::error::Error;
use ckptfs_core::policy::Policy;
use ckptfs_core::store::Location;
use ckptfs_core::Engine;

use crate::cli::ForgetArgs;
use crate::client;

use super::show::when;

/// Open the existing store at `target` (never a new one: a mistyped path or an unmounted
/// mountpoint must not become a store): to change it, or (`read_only`) as a view that
/// takes no lock or lease and changes nothing, in a private cache directory unless
/// `state` is given.
fn open_store(
    target: &Path,
    state: Option<PathBuf>,
    read_only: bool,
) -> Result<(Engine, Option<tempfile::TempDir>), Error> {
    let location = client::parse_location(target)?;
    let exists = match &location {
        Location::Local(dir) => ckptfs_core::repo::check_is_store(dir).is_ok(),
        remote => ckptfs_core::repo::Repo::reader(remote)?
            .catalog
            .load_meta()?
            .is_some(),
    };
    if !exists {
        return Err(Error::NotFound(format!(
            "{} is neither a ckptfs mount (not mounted?) nor a ckptfs store",
            target.display()
        )));
    }
    let mut config = ckptfs_core::EngineConfig::new(location);
    config.host_backends = false;
    if !read_only {
        config.state = state;
        return Ok((Engine::open(config)?, None));
    }
    let scratch = match state {
        Some(dir) => {
            config.state = Some(dir);
            None
        }
        None => {
            let dir = tempfile::Builder::new()
                .prefix("ckptfs-forget-")
                .tempdir()
                .map_err(|e| Error::io("create a temporary directory", e))?;
            config.state = Some(dir.path().to_path_buf());
            Some(dir)
        }
    };
    Ok((Engine::open_read_only(config)?, scratch))
}

pub fn forget(args: ForgetArgs) -> Result<ExitCode, Error> {
    let given = args.keep.policy()?;
    let plan = if client::has_daemon(&args.target) {
        let request = match (args.dry_run, given) {
            (true, policy) => Request::Forget(policy),
            (false, Some(policy)) => Request::Keep(policy),
            // Apply the daemon's own policy: `keep` with its rules.
            (false, None) => {
                let own = client::request(&args.target, &Request::Forget(None))?.into_plan()?;
                Request::Keep(Policy::from_rules(own.policy.iter().map(String::as_str))?)
            }
        };
        client::request(&args.target, &request)?.into_plan()?
    } else {
        // A dry run reads the store as a view: no lock, no recovery, nothing dropped.
        let (engine, _scratch) = open_store(&args.target, args.state.clone(), args.dry_run)?;
        let policy = given.unwrap_or_else(|| engine.policy());
        let decisions = if args.dry_run {
            engine.forget_plan(Some(&policy))
        } else {
            engine.set_policy(policy.clone())?
        };
        Plan {
            policy: policy.to_rules(),
            decisions,
        }
    };
    print_plan(&plan, args.dry_run, args.json)?;
    Ok(ExitCode::SUCCESS)
}

fn print_plan(plan: &Plan, dry_run: bool, json: bool) -> Result<(), Error> {
    if json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            dry_run: bool,
            #[serde(flatten)]
            plan: &'a Plan,
        }
        let text = serde_json::to_string(&Out { dry_run, plan })
            .map_err(|e| Error::Invalid(format!("cannot write the plan as JSON: {e}")))?;
        println!("{text}");
        return Ok(());
    }
    let policy = Policy::from_rules(plan.policy.iter().map(String::as_str))?;
    println!("policy: {policy}");
    println!(
        "{:>8}  {:<20}  {:<6}  KEPT BY",
        "ID", "TIME (UTC)", "ACTION"
    );
    let (mut kept, mut dropped) = (0, 0);
    for d in &plan.decisions {
        let action = if d.kept() { "keep" } else { "drop" };
        if d.kept() {
            kept += 1;
        } else {
            dropped += 1;
        }
        let why: Vec<String> = d.kept_by.iter().map(|r| r.to_string()).collect();
        println!(
            "{:>8}  {:<20}  {:<6}  {}",
            d.id,
            when(d.time_ms),
            action,
            why.join(", ")
        );
    }
    let verb = if dry_run { "would drop" } else { "dropped" };
    println!("keep {kept}, {verb} {dropped}");
    Ok(())
}

pub fn pin(
    target: &Path,
    checkpoint: u64,
    name: &str,
    state: Option<PathBuf>,
) -> Result<ExitCode, Error> {
    ckptfs_core::catalog::meta::valid_pin_name(name)?;
    if client::has_daemon(target) {
        client::request(
            target,
            &Request::Pin {
                id: checkpoint,
                name: name.to_string(),
            },
        )?;
    } else {
        open_store(target, state, false)?.0.pin(checkpoint, name)?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn unpin(target: &Path, name: &str, state: Option<PathBuf>) -> Result<ExitCode, Error> {
    ckptfs_core::catalog::meta::valid_pin_name(name)?;
    if client::has_daemon(target) {
        client::request(target, &Request::Unpin(name.to_string()))?;
    } else {
        open_store(target, state, false)?.0.unpin(name)?;
    }
    Ok(ExitCode::SUCCESS)
}
