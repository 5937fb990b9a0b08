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
use common::moto::{moto, Proxy};
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
    // A lease of a dead holder (never released) blocks until it expires, then is taken.
    let opened = Opened::open(&location).unwrap();
    let now = ckptfs::fsutil::now_unix_ms();
    let ghost = |expires: u64| {
        format!(r#"{{"holder":"ghost-host pid 1","token":"x","expires_unix_ms":{expires}}}"#)
    };
    opened
        .records
        .put("lease.json", ghost(now + 60_000).as_bytes(), Put::Overwrite)
        .unwrap();
    let err = Engine::open(s3_config(&url, d1.path(), &["A/0"]))
        .err()
        .unwrap();
    assert!(err.to_string().contains("ghost-host pid 1"), "{err}");
    opened
        .records
        .put("lease.json", ghost(now - 1).as_bytes(), Put::Overwrite)
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
        &["--backend", "Op/0", "--orphan-grace", "3s"],
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
    // The server returns: the next checkpoint succeeds and holds everything.
    proxy.restore();
    let id: u64 = ok(ckptfs_with_env(&["checkpoint", m], &env))
        .trim()
        .parse()
        .unwrap();
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
