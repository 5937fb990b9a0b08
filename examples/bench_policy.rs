//! Retention policy benchmark (issue 30): what a policy costs over many checkpoints.
//!
//! 1. The policy alone ([`ckptfs_core::policy::apply`]) over N checkpoints a minute apart,
//!    with `--keep-last 10 --keep-hourly 24 --keep-daily 7 --keep-weekly 4 --keep-monthly 12
//!    --keep-yearly 3 --keep-within 1h`: the time of one evaluation.
//! 2. The engine: N checkpoints of one hosted backend (one key each; small-file compaction
//!    every 100, as the daemon runs it), all retained; then
//!    the mean time of a checkpoint (which applies the store's policy after its commit)
//!    with `--keep-last` alone and with the calendar rules added (keeping everything
//!    still: `last` stays above N); `forget --dry-run` of the calendar policy
//!    (`Engine::forget_plan`); and `forget --keep-last 10` (`Engine::set_policy`), which
//!    drops all but 10 and deletes what only they held.
//!
//! Usage: `BENCH_CHECKPOINTS=N (10000) cargo run --example bench_policy`. A benchmark, not
//! a test: figures are reported, never asserted.

use std::process::ExitCode;
use std::time::Instant;

use ckptfs_core::compaction::SmallFilePolicy;
use ckptfs_core::policy::{apply, ByTime, Candidate, Policy};
use ckptfs_core::{BackendName, Engine, EngineConfig, WriteOp};

fn calendar() -> Policy {
    Policy {
        last: 10,
        by_time: ByTime {
            hourly: 24,
            daily: 7,
            weekly: 4,
            monthly: 12,
            yearly: 3,
            within_ms: 3_600_000,
        },
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn main() -> ExitCode {
    let n: u64 = std::env::var("BENCH_CHECKPOINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let policy = calendar();

    // 1. The policy alone.
    let candidates: Vec<Candidate> = (0..n)
        .map(|i| Candidate {
            id: i + 1,
            time_ms: 1_735_689_600_000 + i * 60_000,
            pins: Vec::new(),
            restore: false,
        })
        .collect();
    let rounds = 20;
    let clock = Instant::now();
    let mut kept = 0;
    for _ in 0..rounds {
        kept = apply(&policy, &candidates)
            .iter()
            .filter(|d| d.kept())
            .count();
    }
    let eval_ms = ms(clock) / rounds as f64;
    println!(
        "policy over {n} checkpoints a minute apart: {eval_ms:.2} ms per evaluation, keeps {kept}"
    );

    // 2. The engine.
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut config = EngineConfig::new(dir.path().join("store"));
    let backend = BackendName::new("Policy", 0).expect("name");
    config.backends = vec![backend.clone()];
    config.retain = Some(u32::try_from(n + 100).unwrap_or(u32::MAX));
    let engine = match Engine::open(config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("bench_policy: {e}");
            return ExitCode::FAILURE;
        }
    };
    let take = |i: u64| -> f64 {
        engine
            .write(
                &backend,
                &[WriteOp::Put(
                    format!("k{i:010}").into_bytes(),
                    vec![b'v'; 100],
                )],
            )
            .expect("write");
        let clock = Instant::now();
        engine.checkpoint().expect("checkpoint");
        let took = ms(clock);
        // As the daemon's --small-file-compaction-interval would: one tiny SST per
        // checkpoint otherwise piles up and every checkpoint links and lists them all.
        if i % 100 == 99 {
            engine
                .compact_small_files(&backend, &SmallFilePolicy::default())
                .expect("compact");
        }
        took
    };
    let clock = Instant::now();
    for i in 0..n {
        take(i);
    }
    println!(
        "{n} checkpoints taken in {:.1} s",
        clock.elapsed().as_secs_f64()
    );
    let mean = |from: u64, count: u64| -> f64 {
        (from..from + count).map(&take).sum::<f64>() / count as f64
    };
    let last_only = mean(n, 20);
    engine
        .set_policy(Policy {
            last: u32::try_from(n + 100).unwrap_or(u32::MAX),
            ..calendar()
        })
        .expect("set policy");
    let with_calendar = mean(n + 20, 20);
    let retained = engine.checkpoints().len();
    let clock = Instant::now();
    let plan = engine.forget_plan(Some(&calendar()));
    let plan_ms = ms(clock);
    let clock = Instant::now();
    let decided = engine.set_policy(Policy::last(10)).expect("apply");
    let drop_ms = ms(clock);
    let dropped = decided.iter().filter(|d| !d.kept()).count();
    println!(
        "| retained | checkpoint ms, --keep-last | checkpoint ms, calendar rules | forget --dry-run ms | apply --keep-last 10 ms (drops) |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {retained} | {last_only:.2} | {with_calendar:.2} | {plan_ms:.2} ({} decisions) | {drop_ms:.0} ({dropped}) |",
        plan.len()
    );
    println!(
        "{}",
        serde_json::json!({
            "checkpoints": n,
            "policy_eval_ms": eval_ms,
            "checkpoint_ms_keep_last": last_only,
            "checkpoint_ms_calendar": with_calendar,
            "forget_plan_ms": plan_ms,
            "apply_ms": drop_ms,
            "dropped": dropped,
            "retained_after": engine.checkpoints().len(),
        })
    );
    ExitCode::SUCCESS
}
