//! `kill -9` of a process in the middle of checkpointing, many times over: afterwards no
//! reported checkpoint is lost, every retained checkpoint restores to exactly the data of
//! its round, and recovery leaves no orphan behind.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ckptfs::workload::{current_round, expected_after};
use ckptfs::Engine;
use common::*;

const KEYS: u32 = 3000;
const VALUE_SIZE: usize = 100;

#[test]
fn kill_9_at_any_moment_loses_nothing_reported_complete() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let backends = ["A/0", "B/1"];
    let mut last_reported: Option<u64> = None;
    for (round, delay_ms) in [250u64, 600, 900, 400, 1300, 700, 150, 1000]
        .iter()
        .enumerate()
    {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ckptfs"))
            .arg("workload")
            .arg(&store)
            .args(["--backend", backends[0], "--backend", backends[1]])
            .args([
                "--rounds",
                "100000",
                "--keys",
                &KEYS.to_string(),
                "--retain",
                "3",
            ])
            .args(["--compact-every", "4"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let id = line
                    .split_whitespace()
                    .skip_while(|w| *w != "checkpoint")
                    .nth(1)
                    .and_then(|w| w.parse::<u64>().ok());
                if let Some(id) = id {
                    let _ = tx.send(id);
                }
            }
        });
        std::thread::sleep(Duration::from_millis(*delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        let reported: Vec<u64> = rx.try_iter().collect();
        if let Some(&last) = reported.last() {
            last_reported = Some(last);
        }
        // Without recovery: nothing referenced is missing or corrupt.
        let report = ckptfs::fsck::fsck(&store, false, |_| {}).unwrap();
        assert!(
            report.missing.is_empty() && report.corrupt.is_empty(),
            "after kill {round}: {report:?}"
        );
        if let Some(last) = last_reported {
            assert!(
                report.checkpoints.contains(&last),
                "checkpoint {last} was reported complete but is gone: {report:?}"
            );
        }
    }
    assert!(
        last_reported.is_some(),
        "no checkpoint completed in any run"
    );

    let engine = Engine::open(ckptfs::EngineConfig::new(&store)).unwrap();
    assert_consistent(&engine);
    let ids: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
    assert!(!ids.is_empty());
    drop(engine);
    for id in ids {
        for (backend, contents) in restored_contents(&store, id) {
            let pairs: Vec<_> = contents.clone().into_iter().collect();
            let round = current_round(&pairs).unwrap().expect("no __round key");
            assert_eq!(
                contents,
                expected_after(&backend, round, KEYS, VALUE_SIZE),
                "checkpoint {id}, backend {backend}, round {round}"
            );
        }
    }
    let report = ckptfs::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(report.is_clean(), "{report:?}");
}
