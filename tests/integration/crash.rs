//! Crashes: `kill -9` of a checkpointing process at any moment loses nothing reported
//! complete and leaves no orphan after recovery; an acknowledged put survives a killed
//! daemon; a killed daemon's dead mount is cleared by the next mount.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ckptfs_core::workload::{current_round, expected_after};
use ckptfs_core::Engine;

use crate::common::mounted::scan;
use crate::common::mounted::*;
use crate::common::*;

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
        let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
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

    let engine = Engine::open(ckptfs_core::EngineConfig::new(&store)).unwrap();
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
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn a_crash_mid_upload_leaves_no_trace_after_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    let a = name("A/0");
    put_range(&engine, &a, 0..3000, "one");
    let cp1 = engine.checkpoint().unwrap();
    put_range(&engine, &a, 3000..6000, "two");
    engine.compact(&a).unwrap();
    let pending = engine.begin_checkpoint().unwrap();
    pending.simulate_crash(2);
    let stored_during_crash = engine.object_store().list().unwrap().len();
    assert!(
        stored_during_crash > cp1.objects().len(),
        "the crash stored nothing"
    );
    drop(engine);
    // fsck sees the orphans of the interrupted checkpoint ...
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(!report.orphans.is_empty());
    assert!(!report.is_clean());
    // ... and startup recovery removes them.
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    assert_consistent(&engine);
    assert_eq!(engine.checkpoints().len(), 1);
    let cp = engine.checkpoint().unwrap();
    assert_eq!(cp.id, 3, "the interrupted checkpoint's id was reused");
    drop(engine);
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// Acknowledged writes: a put answered ok is in RocksDB's write-ahead log before the
/// answer, so it survives the daemon being killed (not a power loss; see docs/guarantees.md).
#[test]
fn an_acknowledged_put_survives_a_killed_daemon() {
    let m = Mounted::new(&["--backend", "A/0"]);
    m.put("A/0", "before", "checkpoint");
    m.checkpoint();
    for i in 0..50 {
        m.put("A/0", &format!("acked-{i}"), "yes");
    }
    crate::common::mounted::kill_and_wait(daemon_pid(&m));
    m.mount(&[]);
    let id = m.checkpoint();
    let copy = scan(&m.mnt.join(format!("cp-{id}/A/0")));
    for i in 0..50 {
        assert!(
            copy.contains_key(format!("acked-{i}").as_bytes()),
            "acked-{i} was lost"
        );
    }
}

/// A daemon killed with SIGKILL leaves a dead mount; the next mount detaches it
/// by itself (as systemd's Restart=on-failure needs) and brings back every checkpoint.
#[test]
fn a_mount_after_a_killed_daemon_clears_the_dead_mount() {
    let m = Mounted::new(&["--backend", "A/0"]);
    m.put("A/0", "k", "v");
    let id = m.checkpoint();
    crate::common::mounted::kill_and_wait(daemon_pid(&m));
    assert_eq!(
        std::fs::metadata(&m.mnt).unwrap_err().raw_os_error(),
        Some(libc::ENOTCONN)
    );
    m.mount(&[]);
    assert_eq!(m.checkpoint_ids(), vec![id]);
    assert_eq!(scan(&m.mnt.join(format!("cp-{id}/A/0"))), kv(&[("k", "v")]));
    let log = std::fs::read_to_string(m.store.join("ckptfs.log")).unwrap();
    assert!(log.contains("stale ckptfs mount"), "{log}");
}
