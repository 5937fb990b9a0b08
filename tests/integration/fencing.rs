//! One writer per store on object storage: the lease (taken over when expired or its holder
//! is dead, kept across lost responses and skewed clocks) and the fence (a writer that lost
//! the store writes and deletes nothing that counts), with paused daemons, held requests and
//! a torture of two daemons stopped in turn.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ckptfs_core::catalog::Catalog;
use ckptfs_core::error::Error;
use ckptfs_core::store::records::Put;
use ckptfs_core::store::{Location, ObjectId, OpenedStore};
use ckptfs_core::Engine;

use crate::common::moto::moto;
use crate::common::mounted::{ok, scan, BIN};
use crate::common::s3::*;
use crate::common::{name, put_range};

#[test]
fn one_writer_per_store_with_takeover_of_an_expired_lease() {
    let url = moto().store();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = Engine::open(s3_config(&url, d1.path(), &["A/0"])).unwrap();
    // A second daemon (another state directory, as on another host) is refused.
    let err = Engine::open(s3_config(&url, d2.path(), &["A/0"]))
        .err()
        .unwrap();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("lease held by"), "{err}");
    // So is fsck, which would write.
    let location = Location::parse(&url).unwrap();
    assert!(ckptfs_core::commands::fsck::fsck(&location, false, |_| {}).is_err());
    drop(first);
    // Released at a clean stop: the next daemon starts at once.
    let second = Engine::open(s3_config(&url, d2.path(), &["A/0"])).unwrap();
    drop(second);
    // A lease of a holder on another host that stopped renewing (never released) blocks
    // until the store's clock says it is older than its lease time, whatever expiry the
    // holder's clock wrote into it; then it is taken.
    let opened = OpenedStore::open(&location).unwrap();
    let ghost = |expires: u64| {
        format!(
            r#"{{"holder":"ghost-host pid 1","token":"x","expires_unix_ms":{expires},"ttl_ms":1000}}"#
        )
    };
    opened
        .records
        .put("lease.json", ghost(1).as_bytes(), Put::Overwrite)
        .unwrap();
    let err = Engine::open(s3_config(&url, d1.path(), &["A/0"]))
        .err()
        .unwrap();
    assert!(err.to_string().contains("ghost-host pid 1"), "{err}");
    // Waiting for it (--lease-wait) takes it once it is old enough by the store's clock.
    let mut waiting = s3_config(&url, d1.path(), &["A/0"]);
    waiting.lease_wait = Duration::from_secs(10);
    drop(Engine::open(waiting).unwrap());
    // Released (expiry 0): taken at once.
    opened
        .records
        .put("lease.json", ghost(0).as_bytes(), Put::Overwrite)
        .unwrap();
    let taken = Engine::open(s3_config(&url, d1.path(), &["A/0"])).unwrap();
    let lease = opened.records.get("lease.json").unwrap().unwrap();
    let lease = String::from_utf8(lease.bytes).unwrap();
    assert!(
        lease.contains(&format!("pid {}", std::process::id())),
        "{lease}"
    );
    put_range(&taken, &name("A/0"), 0..10, "t");
    taken.checkpoint().unwrap();
}

#[test]
fn a_daemon_whose_lease_is_taken_stops_writing() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let mut config = s3_config(&url, dir.path(), &["A/0"]);
    config.lease_ttl = Duration::from_secs(3);
    let engine = Engine::open(config).unwrap();
    let a = name("A/0");
    put_range(&engine, &a, 0..10, "x");
    engine.checkpoint().unwrap();
    // Another daemon takes the store (as after an expiry this one missed).
    let opened = OpenedStore::open(&Location::parse(&url).unwrap()).unwrap();
    let until = ckptfs_core::fsutil::now_unix_ms() + 600_000;
    let other = format!(r#"{{"holder":"other pid 2","token":"y","expires_unix_ms":{until}}}"#);
    opened
        .records
        .put("lease.json", other.as_bytes(), Put::Overwrite)
        .unwrap();
    // Within a renewal period (a third of the lease) this daemon notices and stops.
    std::thread::sleep(Duration::from_millis(2500));
    let objects_before = stored(&url);
    put_range(&engine, &a, 10..20, "y");
    let err = engine.checkpoint().unwrap_err();
    assert!(err.to_string().contains("lease"), "{err}");
    // Nor does it drop checkpoints or delete objects the new writer may share.
    let err = engine.delete_checkpoint(1).unwrap_err();
    assert!(err.to_string().contains("lease"), "{err}");
    assert!(stored(&url).is_superset(&objects_before));
    let (ids, _) = Catalog::new(opened.records.clone(), opened.objects.clone())
        .list_ids()
        .unwrap();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), vec![1]);
    // The other holder's lease is left alone when this one stops.
    drop(engine);
    let lease = opened.records.get("lease.json").unwrap().unwrap();
    assert!(String::from_utf8(lease.bytes)
        .unwrap()
        .contains("other pid 2"));
}

/// A daemon whose lease is taken while it starts does not finish starting: it would serve
/// a store it no longer writes.
#[test]
fn a_daemon_whose_lease_is_taken_during_its_start_fails_to_start() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let (mnt, state) = (dir.path().join("m"), dir.path().join("s"));
    std::fs::create_dir_all(&mnt).unwrap();
    let mut args = vec![
        "mount",
        url.as_str(),
        mnt.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--backend",
        "Op/0",
    ];
    args.extend_from_slice(SHORT_LEASE);
    // The start pauses (a failpoint) after taking the lease; meanwhile another holder
    // writes its own lease record.
    let starting = Command::new(BIN)
        .args(&args)
        .env("FAILPOINTS", "open::before-sweep=sleep(4000)")
        .spawn()
        .unwrap();
    let opened = OpenedStore::open(&Location::parse(&url).unwrap()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while opened.records.get("ckptfs.json").unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let other = r#"{"holder":"other-host pid 7","token":"z","expires_unix_ms":1,"ttl_ms":60000}"#;
    opened
        .records
        .put("lease.json", other.as_bytes(), Put::Overwrite)
        .unwrap();
    let out = starting.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "the daemon started without its lease"
    );
    assert!(!mnt.join(".ckptfs/status").exists());
}

/// A daemon killed with SIGKILL is replaced at once by a daemon started on the same host:
/// its lease names a process that is gone.
#[test]
fn a_daemon_killed_on_this_host_is_replaced_at_once() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let (mnt, state) = (dir.path().join("m"), dir.path().join("s"));
    let a = Mount::new(&url, &mnt, &state, &["--backend", "Op/0"], &[]);
    ok(ckptfs_with_env(&["put", a.m(), "Op/0", "k1", "v1"], &[]));
    ok(ckptfs_with_env(&["checkpoint", a.m()], &[]));
    // Gone, as a killed daemon is once the kernel has torn it down (until then it holds
    // the state directory's lock).
    let started = std::time::Instant::now();
    crate::common::mounted::kill_and_wait(daemon_pid(&mnt));
    let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).output();
    std::mem::forget(a);
    let b = Mount::new(&url, &mnt, &state, &["--backend", "Op/0"], &[]);
    assert!(started.elapsed() < Duration::from_secs(20));
    let id: u64 = ok(ckptfs_with_env(&["checkpoint", b.m()], &[]))
        .trim()
        .parse()
        .unwrap();
    let out = dir.path().join("out");
    ok(Command::new("cp")
        .arg("-r")
        .arg(mnt.join(format!("cp-{id}")))
        .arg(&out)
        .output()
        .unwrap());
    assert_eq!(scan(&out.join("Op/0")).len(), 1);
}

/// A renewal that landed but whose response was lost does not make the daemon believe it
/// was taken over: it keeps its lease and its checkpoints succeed.
#[test]
fn a_lost_renewal_response_keeps_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let Proxied {
        url,
        proxy,
        env,
        writer: a,
        ..
    } = Proxied::start(dir.path());
    ok(ckptfs_with_env(&["checkpoint", a.m()], &env));
    // The responses of a renewal that lands and of every retry of it are lost, so the
    // daemon retries the renewal itself: with its next record, refused (the version
    // changed), while the record is still its own.
    let renewals = proxy.seen("PUT", "lease.json");
    proxy.drop_response("PUT", "lease.json", 6);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while proxy.seen("PUT", "lease.json") < renewals + 9 {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon stopped renewing its lease (it believes it was taken over)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ok(ckptfs_with_env(&["put", a.m(), "Op/0", "k2", "v2"], &env));
    ok(ckptfs_with_env(&["checkpoint", a.m()], &env));
    let status = ok(ckptfs_with_env(&["status", &url, "--json"], &[]));
    let pid = daemon_pid(&a.mnt);
    assert!(status.contains(&format!("pid {pid}")), "{status}");
}

/// A contender whose clock is 45 s ahead does not take a lease that its holder renews.
#[test]
fn a_contender_whose_clock_is_ahead_does_not_take_a_live_lease() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--backend",
        "Op/0",
        "--lease-ttl",
        "6s",
        "--orphan-grace",
        "6s",
    ];
    let a = Mount::new(
        &url,
        &dir.path().join("ma"),
        &dir.path().join("sa"),
        &args,
        &[],
    );
    ok(ckptfs_with_env(&["put", a.m(), "Op/0", "k1", "v1"], &[]));
    ok(ckptfs_with_env(&["checkpoint", a.m()], &[]));
    let (mnt_b, state_b) = (dir.path().join("mb"), dir.path().join("sb"));
    std::fs::create_dir_all(&mnt_b).unwrap();
    let mut b_args = vec![
        "-f",
        "+45s",
        BIN,
        "mount",
        url.as_str(),
        mnt_b.to_str().unwrap(),
        "--state",
        state_b.to_str().unwrap(),
        "--lease-wait",
        "8s",
    ];
    b_args.extend_from_slice(&args);
    let b = Command::new("faketime")
        .args(&b_args)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .output()
        .expect("faketime (Debian package faketime)");
    let why = String::from_utf8_lossy(&b.stderr);
    assert!(!b.status.success(), "B took a live lease: {why}");
    assert!(why.contains("lease held by"), "{why}");
    // A is still the writer.
    ok(ckptfs_with_env(&["put", a.m(), "Op/0", "k2", "v2"], &[]));
    ok(ckptfs_with_env(&["checkpoint", a.m()], &[]));
    let status = ok(ckptfs_with_env(&["status", &url, "--json"], &[]));
    assert!(
        status.contains(&format!("pid {}", daemon_pid(&a.mnt))),
        "{status}"
    );
}

/// Lease and grace times that would not protect anything are refused before anything
/// starts, naming the option.
#[test]
fn unsafe_lease_and_grace_times_are_refused() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    let state = dir.path().join("s");
    for (extra, says) in [
        (&["--lease-ttl", "0s"][..], "--lease-ttl"),
        (&["--lease-ttl", "300ms"][..], "--lease-ttl"),
        (&["--orphan-grace", "0s"][..], "--orphan-grace"),
        (
            &["--lease-ttl", "10s", "--orphan-grace", "5s"][..],
            "--orphan-grace",
        ),
    ] {
        let mut args = vec![
            "mount",
            url.as_str(),
            mnt.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = ckptfs_with_env(&args, &[]);
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} accepted");
        assert!(why.contains(says), "{extra:?}: {why}");
    }
    assert!(
        !state.exists(),
        "a refused mount created its state directory"
    );
}

/// A daemon stopped (SIGSTOP) in the middle of its start's sweep of orphans, and continued
/// after another daemon took the store over and stored some of the same content again,
/// deletes nothing more: the new writer's checkpoint keeps every object.
#[test]
fn a_writer_stopped_mid_sweep_deletes_nothing_after_a_takeover() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--backend", "Op/0"];
    args.extend_from_slice(SHORT_LEASE);
    {
        let first = Mount::new(
            &url,
            &dir.path().join("m0"),
            &dir.path().join("s0"),
            &args,
            &[],
        );
        ok(ckptfs_with_env(
            &["put", first.m(), "Op/0", "k0", "v0"],
            &[],
        ));
        ok(ckptfs_with_env(&["checkpoint", first.m()], &[]));
    }
    // Orphans no manifest references, among them every CURRENT file a new backend writes:
    // the next writer's checkpoint stores one of them again, under the same key.
    let opened = OpenedStore::open(&Location::parse(&url).unwrap()).unwrap();
    let mut blobs: Vec<String> = (1..=40).map(|n| format!("MANIFEST-{n:06}\n")).collect();
    blobs.extend((0..300).map(|i| format!("orphan {i}")));
    for blob in &blobs {
        let staged = opened.objects.stage_bytes(blob.as_bytes()).unwrap();
        opened.objects.publish(staged).unwrap();
    }
    std::thread::sleep(Duration::from_secs(4));
    // Daemon A sweeps them at its start, slowly (a failpoint sleeps after each delete).
    let (mnt_a, state_a) = (dir.path().join("ma"), dir.path().join("sa"));
    std::fs::create_dir_all(&mnt_a).unwrap();
    let mut a_args = vec![
        "mount",
        url.as_str(),
        mnt_a.to_str().unwrap(),
        "--state",
        state_a.to_str().unwrap(),
        "--foreground",
    ];
    a_args.extend_from_slice(&args);
    let mut a = Command::new(BIN)
        .args(&a_args)
        .env("FAILPOINTS", "open::mid-sweep=sleep(30)")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let before = stored(&url).len();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while stored(&url).len() + 5 > before {
        assert!(std::time::Instant::now() < deadline, "A never swept");
        std::thread::sleep(Duration::from_millis(50));
    }
    let a_pid = a.id() as i32;
    signal(a_pid, nix::sys::signal::Signal::SIGSTOP);
    // B takes the store over once A's lease has run out, and checkpoints.
    std::thread::sleep(Duration::from_secs(6));
    let b = Mount::new(
        &url,
        &dir.path().join("mb"),
        &dir.path().join("sb"),
        &args,
        &[],
    );
    ok(ckptfs_with_env(&["put", b.m(), "Op/0", "k1", "v1"], &[]));
    let id: u64 = ok(ckptfs_with_env(&["checkpoint", b.m()], &[]))
        .trim()
        .parse()
        .unwrap();
    // The scenario holds: B's checkpoint stored again what was one of the orphans.
    let orphan_ids: BTreeSet<ObjectId> = blobs
        .iter()
        .map(|b| ObjectId::from_hash(blake3::hash(b.as_bytes())))
        .collect();
    let shared: Vec<ObjectId> = referenced(&url)
        .intersection(&orphan_ids)
        .copied()
        .collect();
    assert!(!shared.is_empty(), "B stored none of the orphans' contents");
    // A goes on: it finds its lease gone and deletes nothing more.
    signal(a_pid, nix::sys::signal::Signal::SIGCONT);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while a.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = a.kill();
    let a_out = a.wait_with_output().unwrap();
    let a_log = String::from_utf8_lossy(&a_out.stderr);
    let gone: Vec<&ObjectId> = shared
        .iter()
        .filter(|id| !stored(&url).contains(id))
        .collect();
    assert!(
        gone.is_empty(),
        "A deleted {gone:?}, which B's checkpoint stored again: {a_log}"
    );
    assert!(!a_out.status.success(), "A went on serving: {a_log}");
    assert!(a_log.contains("lease"), "{a_log}");
    assert_whole(&url);
    let got = restored(&url, id);
    assert_eq!(got[&name("Op/0")].len(), 2);
    drop(b);
    let report = ok(ckptfs_with_env(&["fsck", &url], &[]));
    assert!(
        report.contains("missing: 0") || !report.contains("missing"),
        "{report}"
    );
}

/// A manifest PUT that passed every check, held in the network until another daemon took
/// the store over, lands too late to count: its daemon reports the checkpoint failed, and
/// the new writer's drops cannot break it because it never appears.
#[test]
fn a_manifest_that_lands_after_a_takeover_never_counts() {
    let dir = tempfile::tempdir().unwrap();
    let Proxied {
        url,
        proxy,
        env,
        args,
        writer: a,
    } = Proxied::start(dir.path());
    ok(ckptfs_with_env(&["checkpoint", a.m()], &env));
    // A's next manifest, and its lease renewals, are held by the network.
    proxy.hold("PUT", "checkpoints/2.json", 1);
    proxy.hold("PUT", "lease.json", 1000);
    ok(ckptfs_with_env(&["put", a.m(), "Op/0", "k2", "v2"], &env));
    let a_mnt = a.m().to_string();
    let env2 = env.clone();
    let pending =
        std::thread::spawn(move || ckptfs_with_env(&["checkpoint", &a_mnt, "--wait", "0"], &env2));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while proxy.seen("PUT", "checkpoints/2.json") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "A never wrote manifest 2"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // B takes over once A's lease has run out (its renewals are held too), and the held
    // requests land afterwards.
    std::thread::sleep(Duration::from_secs(6));
    let b = Mount::new(
        &url,
        &dir.path().join("mb"),
        &dir.path().join("sb"),
        &args,
        &[],
    );
    proxy.release();
    let answer = pending.join().unwrap();
    assert!(
        !answer.status.success(),
        "A reported a checkpoint committed after the takeover: {}",
        String::from_utf8_lossy(&answer.stdout)
    );
    // The late manifest exists and does not count; B goes on and drops checkpoint 1.
    let opened = OpenedStore::open(&Location::parse(&url).unwrap()).unwrap();
    assert!(opened.records.get("checkpoints/2.json").unwrap().is_some());
    ok(ckptfs_with_env(&["put", b.m(), "Op/0", "k3", "v3"], &[]));
    let id: u64 = ok(ckptfs_with_env(&["checkpoint", b.m()], &[]))
        .trim()
        .parse()
        .unwrap();
    assert!(id > 2, "{id}");
    ok(ckptfs_with_env(&["rm", b.m(), "1"], &[]));
    let listed = ok(ckptfs_with_env(&["ls", &url], &[]));
    assert!(
        !listed.contains("cp-2") && !listed.contains(" 2 "),
        "{listed}"
    );
    assert_whole(&url);
    drop(b);
    drop(a);
    ok(ckptfs_with_env(&["fsck", &url], &[]));
}

/// Object storage refuses the write that reserves a checkpoint's id (written while the
/// backend is staged): that checkpoint fails, and the id it would have taken is not voided,
/// so the next checkpoint takes it and counts, for the writer and for any reader.
#[test]
fn a_refused_reservation_voids_no_id() {
    let dir = tempfile::tempdir().unwrap();
    let Proxied {
        proxy,
        env,
        writer: a,
        url,
        ..
    } = Proxied::start(dir.path());
    let first: u64 = ok(ckptfs_with_env(&["checkpoint", a.m()], &env))
        .trim()
        .parse()
        .unwrap();
    ok(ckptfs_with_env(&["put", a.m(), "Op/0", "k2", "v2"], &env));
    let seen = proxy.seen("PUT", "ckptfs.json");
    // The first try and the client's five retries (store/s3.rs), every one refused.
    proxy.unavailable("PUT", "ckptfs.json", 6);
    let refused = ckptfs_with_env(&["checkpoint", a.m(), "--wait", "0"], &env);
    assert!(!refused.status.success(), "the refused reservation passed");
    assert_eq!(proxy.seen("PUT", "ckptfs.json"), seen + 6);
    let second: u64 = ok(ckptfs_with_env(&["checkpoint", a.m()], &env))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(second, first + 1, "the refused reservation took an id");
    let listed = ok(ckptfs_with_env(&["ls", &url], &[]));
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().next() == Some(&second.to_string())),
        "checkpoint {second} does not count:\n{listed}"
    );
    assert_eq!(restored(&url, second).len(), 1);
    assert_whole(&url);
    drop(a);
    ok(ckptfs_with_env(&["fsck", &url], &[]));
}

/// The status of a writer's mount answers while a request of a checkpoint's commit is held
/// in the network: the catalog's requests run without the engine's state lock.
#[test]
fn status_answers_while_a_commit_request_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let Proxied {
        proxy,
        env,
        writer: a,
        ..
    } = Proxied::start(dir.path());
    proxy.hold("PUT", "checkpoints/1.json", 1);
    let (m, env2) = (a.m().to_string(), env.clone());
    let pending = std::thread::spawn(move || ckptfs_with_env(&["checkpoint", &m], &env2));
    assert!(proxy.wait_held(1, Duration::from_secs(30)));
    // Read while the manifest's PUT is held: it must come back before it is released.
    let status_path = a.mnt.join(".ckptfs/status");
    let (done, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(std::fs::read_to_string(status_path));
    });
    let status = answered.recv_timeout(Duration::from_secs(20));
    proxy.release();
    let status = status.expect("status waited for the held request").unwrap();
    assert!(status.contains("\"in_flight\""), "{status}");
    ok(pending.join().unwrap());
}

/// Mount a daemon of the object-storage torture (it waits up to 8 s for the lease);
/// returns whether it became the writer.
fn torture_mount(url: &str, mnt: &Path, state: &Path) -> bool {
    std::fs::create_dir_all(mnt).unwrap();
    let mut args = vec![
        "mount",
        url,
        mnt.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--backend",
        "Op/0",
        "--retain",
        "1000",
        "--lease-wait",
        "8s",
    ];
    args.extend_from_slice(SHORT_LEASE);
    ckptfs_with_env(&args, &[]).status.success()
}

/// Two daemons on one store, the writer stopped (SIGSTOP) for random times up to 2.5
/// times the lease time and continued, the other one waiting for the lease, for
/// `CKPTFS_TORTURE_S3_SECS` seconds (default 40): every checkpoint a daemon reported
/// complete is kept and restores byte for byte as it was copied out of the mount at that
/// moment, and fsck finds the store clean. Prints trials and problems.
#[test]
fn two_daemons_alternately_stopped_lose_no_committed_checkpoint() {
    use nix::sys::signal::Signal::{SIGCONT, SIGSTOP};
    let secs: u64 = std::env::var("CKPTFS_TORTURE_S3_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let acked_dir = dir.path().join("acked");
    std::fs::create_dir_all(&acked_dir).unwrap();
    let mnts = [dir.path().join("m0"), dir.path().join("m1")];
    let states = [dir.path().join("s0"), dir.path().join("s1")];
    // Mount daemon `d` (waits for the lease); returns whether it became the writer.
    let start = |d: usize| torture_mount(&url, &mnts[d], &states[d]);
    let stop = |d: usize| {
        let _ = Command::new(BIN)
            .args(["umount", mnts[d].to_str().unwrap(), "--timeout", "30"])
            .output();
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&mnts[d])
            .output();
    };
    let mut x: u64 = 0x2545f4914f6cdd1d;
    let mut random = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    assert!(start(0));
    let mut writer = 0usize;
    let mut running = [true, false];
    let mut acked: Vec<u64> = Vec::new();
    let mut problems = Vec::new();
    let (mut trials, mut takeovers, mut refused) = (0u64, 0u64, 0u64);
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    let mut key = 0u64;
    while std::time::Instant::now() < deadline {
        trials += 1;
        // The writer checkpoints a new key; what it reports complete is copied out now.
        let m = mnts[writer].to_str().unwrap().to_string();
        key += 1;
        let put = ckptfs_with_env(&["put", &m, "Op/0", &format!("k{key:06}"), "v"], &[]);
        let answer = ckptfs_with_env(&["checkpoint", &m, "--wait", "0"], &[]);
        if put.status.success() && answer.status.success() {
            let id: u64 = String::from_utf8_lossy(&answer.stdout)
                .trim()
                .parse()
                .unwrap();
            let copy = acked_dir.join(id.to_string());
            ok(Command::new("cp")
                .arg("-r")
                .arg(mnts[writer].join(format!("cp-{id}")))
                .arg(&copy)
                .output()
                .unwrap());
            acked.push(id);
        } else {
            // It lost the store: it stops, and comes back as a contender later.
            refused += 1;
            stop(writer);
            running[writer] = false;
            writer = 1 - writer;
            if !running[writer] {
                assert!(start(writer), "no daemon could take the store");
                running[writer] = true;
            }
            continue;
        }
        // Stop the writer for up to twice the lease time while the other one contends.
        let other = 1 - writer;
        let pid = daemon_pid(&mnts[writer]);
        signal(pid, SIGSTOP);
        // Every other pause is long enough for a takeover (the lease time plus the
        // slack for the store clock), the others are not.
        let pause = Duration::from_millis(if trials % 2 == 0 {
            6000 + random(1500)
        } else {
            300 + random(2500)
        });
        let contender = if running[other] {
            None
        } else {
            let (url, mnt, state) = (url.clone(), mnts[other].clone(), states[other].clone());
            Some(std::thread::spawn(move || {
                torture_mount(&url, &mnt, &state)
            }))
        };
        std::thread::sleep(pause);
        signal(pid, SIGCONT);
        if let Some(contender) = contender {
            if contender.join().unwrap() {
                running[other] = true;
                takeovers += 1;
                // The old writer, continued, can no longer commit anything.
                let old = mnts[writer].to_str().unwrap();
                let late = ckptfs_with_env(&["checkpoint", old, "--wait", "0"], &[]);
                if late.status.success() {
                    problems.push(format!(
                        "the stopped writer committed {} after a takeover",
                        String::from_utf8_lossy(&late.stdout).trim()
                    ));
                } else {
                    refused += 1;
                }
                stop(writer);
                running[writer] = false;
                writer = other;
            }
        }
    }
    for d in 0..2 {
        stop(d);
    }
    // Every reported checkpoint is there and restores to the very bytes copied out.
    for id in &acked {
        let dest = dir.path().join(format!("restored-{id}"));
        if let Err(e) = ckptfs_core::commands::restore::restore_checkpoint(
            Location::parse(&url).unwrap(),
            *id,
            &dest,
            |_| {},
        ) {
            problems.push(format!("checkpoint {id}: {e}"));
            continue;
        }
        let copied = acked_dir.join(id.to_string()).join("Op/0");
        for entry in std::fs::read_dir(&copied).unwrap() {
            let entry = entry.unwrap();
            let there = std::fs::read(dest.join("Op/0").join(entry.file_name()));
            if there.ok() != Some(std::fs::read(entry.path()).unwrap()) {
                problems.push(format!("checkpoint {id}: {:?} differs", entry.file_name()));
            }
        }
    }
    let report =
        ckptfs_core::commands::fsck::fsck(Location::parse(&url).unwrap(), false, |_| {}).unwrap();
    if !report.missing.is_empty()
        || !report.corrupt.is_empty()
        || !report.unreadable_manifests.is_empty()
    {
        problems.push(format!("fsck: {report:?}"));
    }
    println!(
        "torture on object storage: {trials} trials, {} checkpoints reported, {takeovers} \
         takeovers, {refused} checkpoints of a writer that lost the store refused, {} \
         problems",
        acked.len(),
        problems.len()
    );
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        acked.len() >= 3 && takeovers >= 1,
        "the campaign did too little"
    );
}

/// A fence that allows `allowed` checks, then refuses (a lease that ran out meanwhile).
struct Allowing {
    allowed: std::sync::atomic::AtomicUsize,
}

impl ckptfs_core::store::WriteFence for Allowing {
    fn check(&self) -> ckptfs_core::Result<()> {
        use std::sync::atomic::Ordering;
        let left = self.allowed.load(Ordering::SeqCst);
        if left == 0 {
            return Err(Error::Conflict("the lease ran out".into()));
        }
        self.allowed.store(left - 1, Ordering::SeqCst);
        Ok(())
    }
}

/// An object delete the server answers `503 Slow Down` is sent again only after the fence
/// is checked again: once the lease has run out, never (the client re-sent it by itself,
/// whenever its backoff said, however long after the check). While the lease holds, it
/// is sent again until it lands.
#[test]
fn a_refused_delete_is_sent_again_only_while_the_fence_holds() {
    use ckptfs_core::store::s3::{Remote, S3Objects, S3Options};
    use ckptfs_core::store::ObjectStore;
    let moto = moto();
    let bucket = moto.bucket();
    let proxy = crate::common::moto::HttpProxy::start(moto.port);
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let dir = tempfile::tempdir().unwrap();
    let objects = |allowed: usize| {
        let remote = Remote::connect_to(&bucket, "store", Some(&endpoint)).unwrap();
        S3Objects::new(
            remote,
            S3Options::default(),
            &dir.path().join(format!("cache-{allowed}")),
        )
        .unwrap()
        .with_fence(std::sync::Arc::new(Allowing {
            allowed: allowed.into(),
        }))
    };
    let store = objects(usize::MAX);
    let (a, b) = (b"object a".as_slice(), b"object b".as_slice());
    let mut ids = Vec::new();
    for bytes in [a, b] {
        let staged = store.stage_bytes(bytes).unwrap();
        ids.push(staged.id);
        store.publish(staged).unwrap();
    }

    // The lease holds for the first check only: one DELETE, refused, and no other.
    // object_store deletes even one key with S3's DeleteObjects (a POST to `?delete`).
    proxy.unavailable("POST", "?delete", 1);
    let e = objects(1).delete(&ids[0]).unwrap_err();
    assert_eq!(e.errno(), libc::ESTALE, "{e}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(proxy.seen("POST", "?delete"), 1);
    assert!(
        store.open(&ids[0]).is_ok(),
        "deleted after the lease ran out"
    );

    // The lease holds: sent again after each refusal until it lands.
    proxy.unavailable("POST", "?delete", 2);
    store.delete(&ids[1]).unwrap();
    assert_eq!(proxy.seen("POST", "?delete"), 1 + 3);
    assert!(store.open(&ids[1]).is_err(), "not deleted");
}

/// A lease released at a clean stop is taken by the next process without a warning (one
/// `import-flink` after another); one whose holder died without releasing it (the same
/// record, not released, its process gone) is taken over with a warning naming it.
#[test]
fn a_released_lease_is_taken_quietly_and_a_dead_holders_with_a_warning() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let src = crate::flink::fixture();
    let import = || {
        let out = ckptfs_with_env(
            &[
                "import-flink",
                src.to_str().unwrap(),
                &url,
                "--state",
                state.to_str().unwrap(),
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        ok(out);
        stderr
    };
    let first = import();
    assert!(!first.contains("took over"), "{first}");
    let second = import();
    assert!(!second.contains("took over"), "{second}");
    assert!(!second.contains("WARN"), "{second}");
    // The second import's lease, as if it had been killed before releasing it.
    let location = Location::parse(&url).unwrap();
    let opened = OpenedStore::open(&location).unwrap();
    let lease = opened.records.get("lease.json").unwrap().unwrap();
    let mut record: serde_json::Value = serde_json::from_slice(&lease.bytes).unwrap();
    assert_eq!(record["expires_unix_ms"], 0, "released: {record}");
    let holder = record["holder"].as_str().unwrap().to_string();
    record["expires_unix_ms"] = serde_json::json!(u64::MAX / 2);
    opened
        .records
        .put(
            "lease.json",
            &serde_json::to_vec(&record).unwrap(),
            Put::Overwrite,
        )
        .unwrap();
    let third = import();
    assert!(
        third.contains(&format!(
            "took over the lease of {holder}, a process of this host that is gone"
        )),
        "{third}"
    );
}
