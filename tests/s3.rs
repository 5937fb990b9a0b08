//! The store on S3-compatible object storage, against a real server (moto_server) on
//! 127.0.0.1: the core behaviour (incremental upload, dedup, retention, restore, concurrent
//! checkpoints, crash recovery, corruption), the writer's lease, and the mount.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ckptfs::catalog::Catalog;
use ckptfs::error::Error;
use ckptfs::store::records::Put;
use ckptfs::store::{Location, ObjectId, Opened};
use ckptfs::{BackendName, Engine, EngineConfig};
use common::moto::{create_bucket, moto, HttpProxy, Proxy};
use common::mounted::{ok, scan, BIN};
use common::{assert_consistent, name, put_range, snapshot_all, Kv};

fn s3_config(url: &str, state: &Path, backends: &[&str]) -> EngineConfig {
    let mut config = EngineConfig::new(Location::parse(url).unwrap());
    config.state = Some(state.to_path_buf());
    config.backends = backends.iter().map(|b| name(b)).collect();
    config.backend_options = ckptfs::backend::BackendOptions {
        write_buffer_size: Some(64 * 1024),
        ..Default::default()
    };
    config
}

/// What the bucket holds under the store's `objects/`.
fn stored(url: &str) -> BTreeSet<ObjectId> {
    let opened = Opened::open(&Location::parse(url).unwrap()).unwrap();
    opened.objects.list().unwrap().into_iter().collect()
}

/// The objects the store's manifests reference (objects and file lists).
fn referenced(url: &str) -> BTreeSet<ObjectId> {
    let opened = Opened::open(&Location::parse(url).unwrap()).unwrap();
    let catalog = Catalog::new(opened.records.clone(), opened.objects.clone());
    catalog
        .load_all()
        .unwrap()
        .values()
        .flat_map(|m| m.object_refs().collect::<Vec<_>>())
        .collect()
}

/// Restore checkpoint `id` from the URL with `ckptfs::restore` and read every backend.
fn restored(url: &str, id: u64) -> BTreeMap<BackendName, Kv> {
    let dest = tempfile::tempdir().unwrap();
    let out = dest.path().join("out");
    let location = Location::parse(url).unwrap();
    ckptfs::restore::restore_checkpoint(&location, id, &out, |_| {}).unwrap();
    let mut result = BTreeMap::new();
    for operator in std::fs::read_dir(&out).unwrap() {
        let operator = operator.unwrap();
        for subtask in std::fs::read_dir(operator.path()).unwrap() {
            let subtask = subtask.unwrap();
            let backend: BackendName = format!(
                "{}/{}",
                operator.file_name().to_str().unwrap(),
                subtask.file_name().to_str().unwrap()
            )
            .parse()
            .unwrap();
            let kv = ckptfs::backend::scan_dir(&subtask.path())
                .unwrap()
                .into_iter()
                .collect();
            result.insert(backend, kv);
        }
    }
    result
}

#[test]
fn checkpoints_upload_what_changed_retain_drop_and_restore_on_object_storage() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let mut config = s3_config(&url, dir.path(), &["A/0", "B/1"]);
    config.retain = Some(2);
    let engine = Engine::open(config.clone()).unwrap();
    let (a, b) = (name("A/0"), name("B/1"));
    let mut expected = BTreeMap::new();
    let mut uploaded = Vec::new();
    for round in 0..4u32 {
        put_range(
            &engine,
            &a,
            round * 300..(round + 1) * 300,
            &format!("a{round}"),
        );
        put_range(&engine, &b, 0..50, &format!("b{round}"));
        let manifest = engine.checkpoint().unwrap();
        uploaded.push((manifest.stats.bytes_uploaded, manifest.stats.bytes_total));
        expected.insert(manifest.id, snapshot_all(&engine));
        assert_consistent(&engine);
    }
    // Incremental: later checkpoints upload a fraction of what they reference.
    for (up, total) in &uploaded[1..] {
        assert!(up < total, "uploaded {up} of {total}");
    }
    // Nothing changed (and no compaction pending): no SST is uploaded again.
    engine.compact(&a).unwrap();
    engine.compact(&b).unwrap();
    let compacted = engine.checkpoint().unwrap();
    expected.insert(compacted.id, snapshot_all(&engine));
    let before = stored(&url).len();
    let same = engine.checkpoint().unwrap();
    assert_eq!(same.stats.bytes_new_sst, 0, "{:?}", same.stats);
    assert!(same.stats.files_reused > 0);
    expected.insert(same.id, snapshot_all(&engine));
    assert!(
        stored(&url).len() <= before + 4,
        "an unchanged checkpoint stored objects"
    );
    // Retention dropped checkpoints 1 to 4 and deleted their objects from the bucket.
    let retained: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
    assert_eq!(retained, vec![5, 6]);
    assert_eq!(stored(&url), referenced(&url));
    for id in [5, 6] {
        assert_eq!(restored(&url, id), expected[&id], "checkpoint {id}");
    }
    // A restart finds the same checkpoints and goes on from them.
    drop(engine);
    let engine = Engine::open(config).unwrap();
    assert_eq!(
        engine
            .checkpoints()
            .iter()
            .map(|m| m.id)
            .collect::<Vec<_>>(),
        vec![5, 6]
    );
    put_range(&engine, &a, 0..10, "again");
    let seventh = engine.checkpoint().unwrap();
    assert_eq!(seventh.id, 7);
    assert!(seventh.stats.files_reused > 0);
    assert_consistent(&engine);
    assert_eq!(restored(&url, 7), snapshot_all(&engine));
}

#[test]
fn concurrent_checkpoints_share_their_uploads() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let mut config = s3_config(&url, dir.path(), &["A/0"]);
    config.max_concurrent = 2;
    config.retain = Some(5);
    let engine = Engine::open(config).unwrap();
    let a = name("A/0");
    put_range(&engine, &a, 0..500, "one");
    let first = engine.begin_checkpoint().unwrap();
    let first_view = snapshot_all(&engine);
    put_range(&engine, &a, 500..900, "two");
    let second = engine.begin_checkpoint().unwrap();
    let second_view = snapshot_all(&engine);
    let (m2, m1) = std::thread::scope(|s| {
        let t2 = s.spawn(|| second.complete().unwrap());
        let t1 = s.spawn(|| first.complete().unwrap());
        (t2.join().unwrap(), t1.join().unwrap())
    });
    assert_consistent(&engine);
    assert_eq!(restored(&url, m1.id), first_view);
    assert_eq!(restored(&url, m2.id), second_view);
    assert_eq!(stored(&url), referenced(&url));
}

#[test]
fn an_interrupted_upload_leaves_orphans_that_only_the_grace_period_lets_go() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let config = s3_config(&url, dir.path(), &["A/0"]);
    let engine = Engine::open(config.clone()).unwrap();
    let a = name("A/0");
    put_range(&engine, &a, 0..500, "kept");
    engine.checkpoint().unwrap();
    put_range(&engine, &a, 500..1500, "lost");
    // Objects land, then the daemon "dies" before the manifest.
    engine.begin_checkpoint().unwrap().simulate_crash(3);
    drop(engine);
    let orphans: BTreeSet<ObjectId> = stored(&url)
        .difference(&referenced(&url))
        .copied()
        .collect();
    assert!(!orphans.is_empty(), "the crash left no uploaded object");
    // fsck reports them young, and even --repair keeps them.
    let location = Location::parse(&url).unwrap();
    let report = ckptfs::fsck::fsck(&location, true, |_| {}).unwrap();
    assert_eq!(report.orphans_young.len(), orphans.len(), "{report:?}");
    assert_eq!(report.repaired_orphans, 0);
    assert!(stored(&url).is_superset(&orphans));
    // Younger than the grace period: possibly a live upload of another daemon; kept.
    let engine = Engine::open(config.clone()).unwrap();
    assert_eq!(engine.sweep_orphans().unwrap(), 0);
    drop(engine);
    assert!(stored(&url).is_superset(&orphans));
    // Past it, the start sweeps them, and the checkpoint is still whole.
    let mut short = config;
    short.orphan_grace = Duration::ZERO;
    let engine = Engine::open(short).unwrap();
    assert_eq!(stored(&url), referenced(&url));
    assert_consistent(&engine);
    let view = snapshot_all(&engine);
    let next = engine.checkpoint().unwrap();
    assert_eq!(restored(&url, next.id), view);
}

#[test]
fn a_corrupt_object_is_detected_on_read_and_by_fsck() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(s3_config(&url, dir.path(), &["A/0"])).unwrap();
    put_range(&engine, &name("A/0"), 0..300, "v");
    let manifest = engine.checkpoint().unwrap();
    drop(engine);
    let sst = manifest.backends[0]
        .files
        .iter()
        .find(|f| f.name.ends_with(".sst"))
        .unwrap()
        .clone();
    let opened = Opened::open(&Location::parse(&url).unwrap()).unwrap();
    let mut bytes = vec![0u8; sst.size as usize];
    bytes[0] = 1;
    opened
        .records
        .put(&format!("objects/{}", sst.object), &bytes, Put::Overwrite)
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let location = Location::parse(&url).unwrap();
    let err =
        ckptfs::restore::restore_checkpoint(&location, manifest.id, &out.path().join("x"), |_| {})
            .unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert!(
        !out.path().join("x").exists(),
        "a failed restore left files"
    );
    let report = ckptfs::fsck::fsck(&location, false, |_| {}).unwrap();
    assert_eq!(report.corrupt, vec![sst.object.to_hex()], "{report:?}");
    assert_eq!(report.damaged_checkpoints, vec![manifest.id]);
    // Read through a mount: EIO, never the wrong bytes; the other files still read.
    let mnt = dir.path().join("ro");
    std::fs::create_dir(&mnt).unwrap();
    ok(ckptfs_with_env(
        &[
            "mount",
            "--read-only",
            &url,
            mnt.to_str().unwrap(),
            "--state",
            dir.path().join("ro-state").to_str().unwrap(),
        ],
        &[],
    ));
    let view = Mount { mnt };
    let backend = view.mnt.join(format!("cp-{}/A/0", manifest.id));
    let read = std::fs::read(backend.join(&sst.name)).unwrap_err();
    assert_eq!(read.raw_os_error(), Some(libc::EIO));
    let current = std::fs::read(backend.join("CURRENT")).unwrap();
    assert!(current.starts_with(b"MANIFEST-"), "{current:?}");
}

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
    assert!(ckptfs::fsck::fsck(&location, false, |_| {}).is_err());
    drop(first);
    // Released at a clean stop: the next daemon starts at once.
    let second = Engine::open(s3_config(&url, d2.path(), &["A/0"])).unwrap();
    drop(second);
    // A lease of a holder on another host that stopped renewing (never released) blocks
    // until the store's clock says it is older than its lease time, whatever expiry the
    // holder's clock wrote into it; then it is taken.
    let opened = Opened::open(&location).unwrap();
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
    let opened = Opened::open(&Location::parse(&url).unwrap()).unwrap();
    let until = ckptfs::fsutil::now_unix_ms() + 600_000;
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

fn ckptfs_with_env(args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap()
}

struct Mount {
    mnt: std::path::PathBuf,
}

impl Mount {
    fn new(url: &str, mnt: &Path, state: &Path, extra: &[&str], env: &[(&str, String)]) -> Mount {
        std::fs::create_dir_all(mnt).unwrap();
        let mut args = vec![
            "mount",
            url,
            mnt.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        ok(ckptfs_with_env(&args, env));
        Mount {
            mnt: mnt.to_path_buf(),
        }
    }

    fn m(&self) -> &str {
        self.mnt.to_str().unwrap()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["umount", self.m(), "--timeout", "30"])
            .output();
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .output();
    }
}

#[test]
fn a_mount_on_object_storage_serves_copies_and_drops_checkpoints() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let mount = Mount::new(
        &url,
        &dir.path().join("mnt"),
        &dir.path().join("state"),
        &["--backend", "Op/0", "--cache-size", "1MiB"],
        &[],
    );
    let m = mount.m();
    ok(ckptfs_with_env(&["put", m, "Op/0", "k1", "v1"], &[]));
    ok(ckptfs_with_env(&["checkpoint", m], &[]));
    ok(ckptfs_with_env(&["put", m, "Op/0", "k2", "v2"], &[]));
    ok(ckptfs_with_env(&["checkpoint", m], &[]));
    // cp -r of a checkpoint opens in stock RocksDB, read through the (tiny) cache.
    for (id, keys) in [(1, vec!["k1"]), (2, vec!["k1", "k2"])] {
        let out = dir.path().join(format!("out{id}"));
        let copied = Command::new("cp")
            .arg("-r")
            .arg(mount.mnt.join(format!("cp-{id}")))
            .arg(&out)
            .status()
            .unwrap();
        assert!(copied.success());
        let got: Vec<String> = scan(&out.join("Op/0"))
            .into_keys()
            .map(|k| String::from_utf8(k).unwrap())
            .collect();
        assert_eq!(got, keys);
    }
    // A second daemon on the same URL is refused, naming the holder.
    std::fs::create_dir(dir.path().join("mnt2")).unwrap();
    let refused = ckptfs_with_env(
        &[
            "mount",
            &url,
            dir.path().join("mnt2").to_str().unwrap(),
            "--state",
            dir.path().join("state2").to_str().unwrap(),
        ],
        &[],
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("lease held by"), "{stderr}");
    // ls, status and graph read the store by its URL, without the daemon.
    let listed: serde_json::Value =
        serde_json::from_str(&ok(ckptfs_with_env(&["ls", &url, "--json"], &[]))).unwrap();
    let ids: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 2]);
    let status: serde_json::Value =
        serde_json::from_str(&ok(ckptfs_with_env(&["status", &url, "--json"], &[]))).unwrap();
    assert_eq!(status["checkpoints_total"], 2);
    assert_eq!(status["backends"][0], "Op/0");
    let daemon: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(mount.mnt.join(".ckptfs/status")).unwrap())
            .unwrap();
    let holder = status["lease"]["holder"].as_str().unwrap();
    assert!(
        holder.ends_with(&format!("pid {}", daemon["pid"])),
        "{holder}"
    );
    let text = ok(ckptfs_with_env(&["status", &url], &[]));
    assert!(
        text.contains("writer:") && text.contains("lease until"),
        "{text}"
    );
    let dot = ok(ckptfs_with_env(&["graph", &url, "--format", "dot"], &[]));
    assert!(dot.contains("cp-2"), "{dot}");
    // rmdir drops a checkpoint and its objects leave the bucket.
    std::fs::remove_dir(mount.mnt.join("cp-1")).unwrap();
    assert_eq!(stored(&url), referenced(&url));
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(mount.mnt.join(".ckptfs/status")).unwrap())
            .unwrap();
    assert_eq!(status["store"], url.as_str());
}

#[test]
fn the_server_gone_mid_upload_fails_the_checkpoint_and_the_next_succeeds() {
    let moto = moto();
    let url = moto.store();
    let proxy = Proxy::start(moto.port);
    let env = common::moto::env_for(proxy.port);
    let dir = tempfile::tempdir().unwrap();
    let mount = Mount::new(
        &url,
        &dir.path().join("mnt"),
        &dir.path().join("state"),
        &[
            "--backend",
            "Op/0",
            "--orphan-grace",
            "3s",
            "--lease-ttl",
            "3s",
        ],
        &env,
    );
    let m = mount.m();
    ok(ckptfs_with_env(&["put", m, "Op/0", "first", "1"], &env));
    ok(ckptfs_with_env(&["checkpoint", m], &env));
    // About 6 MiB of new, incompressible SST data; the server goes away after 2 MiB.
    let mut data = String::new();
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for i in 0..3000 {
        let value: String = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect();
        data.push_str(&format!("key{i:05}\t{value}\n"));
    }
    let file = dir.path().join("load.tsv");
    std::fs::write(&file, data).unwrap();
    ok(ckptfs_with_env(
        &["load", m, "Op/0", file.to_str().unwrap()],
        &env,
    ));
    proxy.cut_after(2 << 20);
    let failed = ckptfs_with_env(&["checkpoint", m, "--wait", "0"], &env);
    assert!(
        !failed.status.success(),
        "the checkpoint succeeded without the server"
    );
    let why = String::from_utf8_lossy(&failed.stderr);
    assert!(
        why.contains("object storage") || why.contains("upload"),
        "{why}"
    );
    // The daemon keeps serving what it has.
    let ls = std::fs::read_dir(&mount.mnt).unwrap().count();
    assert!(ls >= 1);
    assert!(mount.mnt.join("cp-1/Op/0/CURRENT").exists());
    // The server returns: once the lease is renewed (it could not be while the server was
    // away, and a daemon whose lease ran out writes nothing until then, within a second),
    // the next checkpoint succeeds and holds everything.
    proxy.restore();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let answer = loop {
        let answer = ckptfs_with_env(&["checkpoint", m], &env);
        let why = String::from_utf8_lossy(&answer.stderr).into_owned();
        if answer.status.success()
            || !why.contains("renewed in time")
            || std::time::Instant::now() > deadline
        {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let id: u64 = ok(answer).trim().parse().unwrap();
    let out = dir.path().join("out");
    ok(Command::new("cp")
        .arg("-r")
        .arg(mount.mnt.join(format!("cp-{id}")))
        .arg(&out)
        .output()
        .unwrap());
    assert_eq!(scan(&out.join("Op/0")).len(), 3001);
    // What the failed checkpoint uploaded is swept once older than the grace period.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let orphans = stored(&url).difference(&referenced(&url)).count();
        if orphans == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{orphans} orphans remain after the grace period"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_read_only_mount_elsewhere_follows_the_writer_and_refuses_changes() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let writer = Mount::new(
        &url,
        &dir.path().join("mnt"),
        &dir.path().join("state"),
        &["--backend", "Op/0"],
        &[],
    );
    ok(ckptfs_with_env(
        &["put", writer.m(), "Op/0", "k1", "v1"],
        &[],
    ));
    ok(ckptfs_with_env(&["checkpoint", writer.m()], &[]));
    // A second host's view: no --state (its own cache), no lease taken.
    let ro_mnt = dir.path().join("ro");
    std::fs::create_dir(&ro_mnt).unwrap();
    ok(ckptfs_with_env(
        &["mount", "--read-only", &url, ro_mnt.to_str().unwrap()],
        &[],
    ));
    let reader = Mount { mnt: ro_mnt };
    let names = |m: &Mount| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&m.mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("cp-"))
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&reader), vec!["cp-1"]);
    // The writer goes on: its new checkpoint shows up in the view within seconds.
    ok(ckptfs_with_env(
        &["put", writer.m(), "Op/0", "k2", "v2"],
        &[],
    ));
    ok(ckptfs_with_env(&["checkpoint", writer.m()], &[]));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while names(&reader) != vec!["cp-1", "cp-2"] {
        assert!(std::time::Instant::now() < deadline, "{:?}", names(&reader));
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = dir.path().join("out");
    ok(Command::new("cp")
        .arg("-r")
        .arg(reader.mnt.join("cp-2"))
        .arg(&out)
        .output()
        .unwrap());
    assert_eq!(scan(&out.join("Op/0")).len(), 2);
    // Changes are refused with EROFS; the checkpoint stays.
    let rmdir = std::fs::remove_dir(reader.mnt.join("cp-1")).unwrap_err();
    assert_eq!(rmdir.raw_os_error(), Some(libc::EROFS));
    let ctl = std::fs::OpenOptions::new()
        .write(true)
        .open(reader.mnt.join(".ckptfs/ctl"))
        .unwrap_err();
    assert_eq!(ctl.raw_os_error(), Some(libc::EROFS));
    let refused = ckptfs_with_env(&["checkpoint", reader.m(), "--wait", "0"], &[]);
    assert!(!refused.status.success());
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reader.mnt.join(".ckptfs/status")).unwrap())
            .unwrap();
    assert_eq!(status["read_only"], true);
    // The writer drops a checkpoint: the view follows.
    std::fs::remove_dir(writer.mnt.join("cp-1")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while names(&reader) != vec!["cp-2"] {
        assert!(std::time::Instant::now() < deadline, "{:?}", names(&reader));
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_missing_bucket_is_a_clear_error() {
    moto();
    let dir = tempfile::tempdir().unwrap();
    let url = "s3://ckptfs-no-such-bucket/store";
    let err = Engine::open(s3_config(url, dir.path(), &["A/0"]))
        .err()
        .unwrap();
    assert!(err.to_string().contains("does not exist"), "{err}");
    let out = ckptfs_with_env(&["ls", url], &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bucket ckptfs-no-such-bucket does not exist"),
        "{stderr}"
    );
}

/// A plain HTTP/1.1 client connection (moto takes any signature) for the proxy's test.
struct RawHttp {
    reader: std::io::BufReader<std::net::TcpStream>,
    stream: std::net::TcpStream,
}

/// A response: status, headers (names in lower case) and body.
type Reply = (u16, Vec<(String, String)>, Vec<u8>);

impl RawHttp {
    fn connect(port: u16) -> RawHttp {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        RawHttp {
            reader: std::io::BufReader::new(stream.try_clone().unwrap()),
            stream,
        }
    }

    /// Send a request: its head with `headers` (whole lines) added, then `body` as given.
    fn send(&mut self, method: &str, path: &str, headers: &str, body: &[u8]) {
        use std::io::Write;
        let auth = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, \
                    SignedHeaders=host, Signature=00";
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth}\r\n{headers}\r\n"
        );
        self.stream.write_all(head.as_bytes()).unwrap();
        self.stream.write_all(body).unwrap();
    }

    /// The next response head; None when the connection closes before it.
    fn head(&mut self) -> Option<(u16, Vec<(String, String)>)> {
        use std::io::BufRead;
        let mut line = String::new();
        if self.reader.read_line(&mut line).unwrap() == 0 {
            return None;
        }
        let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            line.clear();
            assert!(self.reader.read_line(&mut line).unwrap() > 0, "cut head");
            let line = line.trim_end();
            if line.is_empty() {
                return Some((status, headers));
            }
            let (name, value) = line.split_once(':').unwrap();
            headers.push((name.to_lowercase(), value.trim().to_string()));
        }
    }

    /// The final response to a request (interim ones skipped); None when the connection
    /// closes before it.
    fn response(&mut self, method: &str) -> Option<Reply> {
        use std::io::Read;
        loop {
            let (status, headers) = self.head()?;
            if status < 200 {
                continue;
            }
            let length = match method {
                "HEAD" => 0,
                _ => headers
                    .iter()
                    .find(|(name, _)| name == "content-length")
                    .map(|(_, value)| value.parse().unwrap())
                    .expect("moto sends Content-Length"),
            };
            let mut body = vec![0; length];
            self.reader.read_exact(&mut body).unwrap();
            return Some((status, headers, body));
        }
    }

    fn request(&mut self, method: &str, path: &str, body: &[u8]) -> Option<Reply> {
        let headers = format!(
            "Content-Length: {}\r\nContent-Type: application/octet-stream\r\n",
            body.len()
        );
        self.send(method, path, &headers, body);
        self.response(method)
    }
}

#[test]
fn the_test_proxy_holds_and_drops_requests() {
    use std::io::{BufRead, Read, Write};
    let moto = moto();
    let bucket = format!("ckptfs-proxy-{}", std::process::id());
    create_bucket(moto.port, &bucket);
    let proxy = HttpProxy::start(moto.port);
    let path = |key: &str| format!("/{bucket}/{key}");
    // What moto holds, asked directly.
    let direct = |key: &str| {
        let (status, _, body) = RawHttp::connect(moto.port)
            .request("GET", &path(key), b"")
            .unwrap();
        (status, body)
    };
    let answered = |reply: Option<Reply>| {
        let (status, headers, body) = reply.expect("a response");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        (headers, body)
    };

    // Keep-alive through the proxy, though moto closes its connection after every
    // response: a PUT, a chunked PUT with `Expect: 100-continue` (moto's interim responses
    // pass), and a GET, on one connection.
    let mut client = RawHttp::connect(proxy.port);
    let (headers, _) = answered(client.request("PUT", &path("plain"), b"plain"));
    assert!(
        !headers.iter().any(|(name, _)| name == "connection"),
        "{headers:?}"
    );
    client.send(
        "PUT",
        &path("chunked"),
        "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\
         Content-Type: application/octet-stream\r\n",
        b"",
    );
    assert_eq!(client.head().unwrap().0, 100);
    client
        .stream
        .write_all(b"4\r\nchun\r\n6\r\nked-pu\r\n1\r\nt\r\n0\r\n\r\n")
        .unwrap();
    answered(client.response("PUT"));
    assert_eq!(
        answered(client.request("GET", &path("plain"), b"")).1,
        b"plain"
    );
    assert_eq!(direct("chunked"), (200, b"chunked-put".to_vec()));

    // A held PUT, the second request of its connection: read whole (8 MiB, more than the
    // sockets buffer if it were not read), not forwarded until `release`, while other
    // connections go on.
    proxy.hold("PUT", "/held", 1);
    let port = proxy.port;
    let (plain_path, held_path) = (path("plain"), path("held"));
    let held_body: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (body, sent2) = (held_body.clone(), sent.clone());
    let held = std::thread::spawn(move || {
        let mut client = RawHttp::connect(port);
        answered(client.request("GET", &plain_path, b""));
        let length = format!("Content-Length: {}\r\n", body.len());
        client.send("PUT", &held_path, &length, &body);
        sent2.store(true, std::sync::atomic::Ordering::SeqCst);
        client.response("PUT")
    });
    assert!(proxy.wait_held(1, Duration::from_secs(10)));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !sent.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "held, but not read whole"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(direct("held").0, 404);
    assert_eq!(
        answered(client.request("GET", &path("plain"), b"")).1,
        b"plain"
    );
    answered(RawHttp::connect(proxy.port).request("PUT", &path("other"), b"other"));
    assert!(!held.is_finished());
    assert_eq!(proxy.seen("PUT", "/held"), 1);
    proxy.release();
    answered(held.join().unwrap());
    assert!(
        direct("held") == (200, held_body),
        "the held PUT landed whole"
    );
    // The rule is used up: the next one goes straight through.
    answered(client.request("PUT", &path("held"), b"not held"));
    assert_eq!(direct("held"), (200, b"not held".to_vec()));

    // A lost response on a kept-alive connection: the PUT lands, the client sees its
    // connection closed without an answer; the next matching request is answered.
    proxy.drop_response("PUT", "/dropped", 1);
    assert_eq!(client.request("PUT", &path("dropped"), b"dropped"), None);
    assert_eq!(direct("dropped"), (200, b"dropped".to_vec()));
    let mut again = RawHttp::connect(proxy.port);
    answered(again.request("PUT", &path("dropped"), b"again"));
    assert_eq!(direct("dropped"), (200, b"again".to_vec()));

    assert_eq!(proxy.seen("PUT", "/held"), 2);
    assert_eq!(proxy.seen("PUT", "/dropped"), 2);
    assert_eq!(proxy.seen("GET", "/plain"), 3);
    assert_eq!(proxy.seen("PUT", ""), 7);
    assert_eq!(proxy.seen("HEAD", ""), 0);

    // Framing moto never sends, from a server that keeps one connection alive: a chunked
    // body with extensions and trailers, a HEAD, a 204, and a body until close.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server_port = server.local_addr().unwrap().port();
    let answers: [&[u8]; 4] = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
          5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nuntil close",
    ];
    std::thread::spawn(move || {
        let (stream, _) = server.accept().unwrap();
        let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
        for answer in answers {
            let mut line = String::new();
            while line != "\r\n" {
                line.clear();
                assert!(reader.read_line(&mut line).unwrap() > 0, "request cut");
            }
            (&stream).write_all(answer).unwrap();
        }
    });
    let proxy = HttpProxy::start(server_port);
    let mut client = RawHttp::connect(proxy.port);
    for (method, answer) in ["GET", "HEAD", "GET", "GET"].into_iter().zip(answers) {
        client.send(method, "/", "", b"");
        let mut got = vec![0; answer.len()];
        client.reader.read_exact(&mut got).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(answer)
        );
    }
    let mut rest = Vec::new();
    client.reader.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

/// The pid of the daemon serving `mnt` (from its status file).
fn daemon_pid(mnt: &Path) -> i32 {
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(mnt.join(".ckptfs/status")).unwrap())
            .unwrap();
    status["pid"].as_i64().unwrap() as i32
}

fn signal(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
}

/// Referenced objects missing from the store, and whether every checkpoint restores.
fn assert_whole(url: &str) {
    let missing: Vec<ObjectId> = referenced(url).difference(&stored(url)).copied().collect();
    assert!(
        missing.is_empty(),
        "referenced objects missing: {missing:?}"
    );
    let opened = Opened::open(&Location::parse(url).unwrap()).unwrap();
    let catalog = Catalog::new(opened.records.clone(), opened.objects.clone());
    for id in catalog.list_ids().unwrap().0 {
        restored(url, id);
    }
}

const SHORT_LEASE: &[&str] = &["--lease-ttl", "3s", "--orphan-grace", "3s"];

/// A writer (backend Op/0, lease 3 s, one key written) that reaches the store through an
/// HTTP proxy, in a new bucket.
struct Proxied {
    url: String,
    proxy: common::moto::HttpProxy,
    env: Vec<(&'static str, String)>,
    /// The writer's mount options, for another daemon of the same store.
    args: Vec<&'static str>,
    writer: Mount,
}

impl Proxied {
    fn start(dir: &Path) -> Proxied {
        let moto = moto();
        let url = moto.store();
        let proxy = common::moto::HttpProxy::start(moto.port);
        let env = common::moto::env_for(proxy.port);
        let mut args = vec!["--backend", "Op/0"];
        args.extend_from_slice(SHORT_LEASE);
        let writer = Mount::new(&url, &dir.join("ma"), &dir.join("sa"), &args, &env);
        ok(ckptfs_with_env(
            &["put", writer.m(), "Op/0", "k1", "v1"],
            &env,
        ));
        Proxied {
            url,
            proxy,
            env,
            args,
            writer,
        }
    }
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
    let opened = Opened::open(&Location::parse(&url).unwrap()).unwrap();
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
    let opened = Opened::open(&Location::parse(&url).unwrap()).unwrap();
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
    signal(daemon_pid(&mnt), nix::sys::signal::Signal::SIGKILL);
    let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).output();
    std::mem::forget(a);
    let started = std::time::Instant::now();
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

/// A store under a prefix with characters that keys spell percent-encoded (`~`, `#`, `%`,
/// non-ASCII letters) lists its checkpoints and objects like any other.
#[test]
fn a_prefix_with_special_characters_lists_its_checkpoints() {
    let url = moto().store().replace("/store", "/caf\u{e9}~#%x/store");
    let dir = tempfile::tempdir().unwrap();
    let a = name("A/0");
    {
        let engine = Engine::open(s3_config(&url, dir.path(), &["A/0"])).unwrap();
        put_range(&engine, &a, 0..10, "x");
        engine.checkpoint().unwrap();
    }
    assert!(!stored(&url).is_empty());
    let listed = ok(ckptfs_with_env(&["ls", &url], &[]));
    assert!(listed.contains('1'), "{listed}");
    let engine = Engine::open(s3_config(&url, dir.path(), &["A/0"])).unwrap();
    assert_eq!(engine.checkpoints().len(), 1);
    assert_eq!(common::scan(&engine, &a).len(), 10);
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
        if let Err(e) =
            ckptfs::restore::restore_checkpoint(Location::parse(&url).unwrap(), *id, &dest, |_| {})
        {
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
    let report = ckptfs::fsck::fsck(Location::parse(&url).unwrap(), false, |_| {}).unwrap();
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

/// A read-only view reports a manifest it cannot read (in status, naming the checkpoint),
/// shows the others, and does not read it again at every refresh.
#[test]
fn a_read_only_view_reports_an_unreadable_manifest() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let a = name("A/0");
    {
        let engine = Engine::open(s3_config(&url, &dir.path().join("w"), &["A/0"])).unwrap();
        for round in 0..2 {
            put_range(&engine, &a, round * 10..round * 10 + 10, "x");
            engine.checkpoint().unwrap();
        }
    }
    let opened = Opened::open(&Location::parse(&url).unwrap()).unwrap();
    opened
        .records
        .put("checkpoints/2.json", b"{not a manifest", Put::Overwrite)
        .unwrap();
    let mut config = s3_config(&url, &dir.path().join("r"), &[]);
    config.backends.clear();
    let view = Engine::open_read_only(config).unwrap();
    let ids: Vec<u64> = view.checkpoints().iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![1]);
    let error = view.status().last_error.unwrap_or_default();
    assert!(error.contains("checkpoint 2"), "{error:?}");
    assert!(!view.refresh_checkpoints().unwrap());
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
    let opened = Opened::open(&Location::parse(&url).unwrap()).unwrap();
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
