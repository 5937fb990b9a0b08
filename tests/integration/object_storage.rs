//! The store on S3-compatible object storage, against a real server (moto_server) on
//! 127.0.0.1: incremental uploads, shared uploads, orphans and their grace period,
//! corruption, the mount, a server gone mid-upload, read-only views, prefixes with special
//! characters; and the HTTP proxy the fault tests use.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use ckptfs_core::error::Error;
use ckptfs_core::store::records::Put;
use ckptfs_core::store::{Location, ObjectId, OpenedStore};
use ckptfs_core::Engine;

use crate::common::moto::{create_bucket, moto, HttpProxy, Proxy};
use crate::common::mounted::{ok, scan};
use crate::common::s3::*;
use crate::common::{assert_consistent, name, put_range, snapshot_all};

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

/// Pins, the policy and the ids used survive the loss of ckptfs.json on object storage too
/// (its copy is an object beside it).
#[test]
fn a_lost_store_metadata_object_keeps_pins_the_policy_and_the_ids_used() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let config = s3_config(&url, dir.path(), &["A/0"]);
    crate::store_safety::settings_survive_a_lost_metadata_file(&config, &|| {
        let opened = OpenedStore::open(&Location::parse(&url).unwrap()).unwrap();
        opened.records.delete("ckptfs.json").unwrap();
    });
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
    let report = ckptfs_core::commands::fsck::fsck(&location, true, |_| {}).unwrap();
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
    let opened = OpenedStore::open(&Location::parse(&url).unwrap()).unwrap();
    let mut bytes = vec![0u8; sst.size as usize];
    bytes[0] = 1;
    opened
        .records
        .put(&format!("objects/{}", sst.object), &bytes, Put::Overwrite)
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let location = Location::parse(&url).unwrap();
    let err = ckptfs_core::commands::restore::restore_checkpoint(
        &location,
        manifest.id,
        &out.path().join("x"),
        |_| {},
    )
    .unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert!(
        !out.path().join("x").exists(),
        "a failed restore left files"
    );
    let report = ckptfs_core::commands::fsck::fsck(&location, false, |_| {}).unwrap();
    assert_eq!(report.corrupt, vec![sst.object], "{report:?}");
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
    let env = crate::common::moto::env_for(proxy.port);
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
    let opened = OpenedStore::open(&Location::parse(&url).unwrap()).unwrap();
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
    assert_eq!(crate::common::scan(&engine, &a).len(), 10);
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

/// `Remote::upload_from` (how `export-flink` sends each file to `s3://`): what is written,
/// in writes of any size, arrives byte for byte: nothing, exactly one part (one PUT), and
/// more than two parts (a multipart upload, `PART_SIZE` parts); when the writer fails
/// halfway, after a multipart upload was started, its error is returned, the upload is
/// aborted (never completed: requests counted by a proxy) and nothing is left under the
/// key.
#[test]
fn an_upload_streams_in_parts_and_leaves_nothing_when_its_writer_fails() {
    use ckptfs_core::store::s3::{Remote, PART_SIZE};
    let moto = moto();
    let bucket = moto.bucket();
    let proxy = HttpProxy::start(moto.port);
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let remote = Remote::connect_to(&bucket, "", Some(&endpoint)).unwrap();
    let content = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    };
    for (key, size) in [
        ("empty", 0),
        ("one-part", PART_SIZE),
        ("three-parts", 2 * PART_SIZE + 12_345),
    ] {
        let bytes = content(size);
        remote
            .upload_from(key, |out| {
                // Writes of odd sizes, none aligned with a part.
                for piece in bytes.chunks(1_000_003) {
                    out.write_all(piece).unwrap();
                }
                Ok(())
            })
            .unwrap();
        assert!(remote.get_bytes(key).unwrap() == bytes, "{key}");
    }
    let bytes = content(2 * PART_SIZE + 1);
    let failed = remote.upload_from("failed", |out| {
        out.write_all(&bytes).unwrap();
        Err(Error::Corrupt(
            "the source does not match its checksum".into(),
        ))
    });
    assert!(
        matches!(&failed, Err(Error::Corrupt(m)) if m.contains("checksum")),
        "{failed:?}"
    );
    assert_eq!(remote.list_keys("failed", false).unwrap(), vec![]);
    assert_eq!(remote.size_of("failed").unwrap(), None);
    assert_eq!(
        proxy.seen("POST", "/one-part?uploads"),
        0,
        "one part is one PUT"
    );
    assert_eq!(proxy.seen("POST", "/three-parts?uploadId="), 1, "completed");
    assert_eq!(
        proxy.seen("POST", "/failed?uploads"),
        1,
        "a multipart upload was started"
    );
    assert_eq!(
        proxy.seen("POST", "/failed?uploadId="),
        0,
        "never completed"
    );
    assert_eq!(proxy.seen("DELETE", "/failed?uploadId="), 1, "aborted");
}

/// `Remote::copy_from`: one CopyObject request, from another bucket of the endpoint or from
/// the same one, with no byte of the object through ckptfs (no GET of the source through a
/// counting proxy), answers the SHA-256 the object store computed, which is the SHA-256 of
/// the bytes, and the copy holds them. A key with a space, `+`, `%` and a non-ASCII letter
/// is copied to and from the right key, with the source's ETag given. A missing source is
/// NotFound.
#[test]
fn an_object_is_copied_across_buckets_by_the_object_store_and_named_by_its_sha256() {
    use ckptfs_core::error::ErrorKind;
    use ckptfs_core::store::s3::Remote;
    use sha2::{Digest, Sha256};
    let moto = moto();
    let (from, to) = (moto.bucket(), moto.bucket());
    let proxy = HttpProxy::start(moto.port);
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let source = Remote::connect_to(&from, "", Some(&endpoint)).unwrap();
    let store = Remote::connect_to(&to, "store", Some(&endpoint)).unwrap();
    assert!(store.can_copy_from(&source));

    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sha256: [u8; 32] = Sha256::digest(&bytes).into();
    let (key, encoded) = ("job/shared/a b+ü%.sst", "job/shared/a%20b%2B%C3%BC%25.sst");
    let mut raw = RawHttp::connect(moto.port);
    let (status, headers, _) = raw
        .request("PUT", &format!("/{from}/{encoded}"), &bytes)
        .unwrap();
    assert_eq!(status, 200);
    let etag = headers.iter().find(|(n, _)| n == "etag").unwrap().1.clone();

    // Across buckets, as long as the source has its ETag.
    let to_key = store.full_key("objects/a b+ü%.sst");
    let size = bytes.len() as u64;
    let copied = store
        .copy_from(&source, key, &to_key, size, Some(&etag))
        .unwrap();
    let sha256 = ObjectId::from_sha256(sha256);
    assert_eq!(copied.id, Some(sha256));
    assert_eq!(copied.etag, etag, "one part: the MD5 of the same bytes");
    let get = |_: &mut RawHttp, path: &str| {
        RawHttp::connect(moto.port)
            .request("GET", path, b"")
            .unwrap()
    };
    let (status, _, got) = get(
        &mut raw,
        &format!("/{to}/store/objects/a%20b%2B%C3%BC%25.sst"),
    );
    assert_eq!(status, 200);
    assert!(got == bytes, "the copy differs");
    assert_eq!(
        proxy.seen("GET", &format!("/{from}/")),
        0,
        "the source was read"
    );
    assert_eq!(proxy.seen("PUT", &format!("/{to}/store/objects/a%20b")), 1);

    // Within one bucket.
    let within = source
        .copy_from(&source, key, "copies/one", size, None)
        .unwrap();
    assert_eq!(within.id, Some(sha256));
    let (_, _, got) = get(&mut raw, &format!("/{from}/copies/one"));
    assert!(got == bytes, "the copy differs");

    // (moto 5.2 ignores `x-amz-copy-source-if-match`: a changed source's 412 is read in
    // store::s3::copy's unit test.)

    // No such source.
    let e = store
        .copy_from(&source, "job/shared/missing.sst", "missing", 1, None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("s3://{from}/job/shared/missing.sst")),
        "{e}"
    );
}

/// A store of format 9 on object storage (tests/fixtures/store-format9-s3: the Flink
/// fixture's three checkpoints imported from one bucket into another, its SSTs copied by
/// the object store and named by their SHA-256), put into a bucket as it was: fsck checks
/// every object, each by the hash function its name says, and a checkpoint restores with
/// the source's SST bytes; one changed byte in a copied object and fsck names it.
#[test]
fn a_format9_store_with_copied_objects_still_reads() {
    a_store_with_copied_objects_reads("store-format9-s3", "sha256-");
}

/// A store of format 10 (tests/fixtures/store-format10-s3: the same import, with the SSTs
/// above 3,000 bytes copied in parts of 1 KiB and named by the SHA-256 of their parts'
/// SHA-256s, `sha256p10-`), as the format 9 one.
#[test]
fn a_format10_store_with_objects_copied_in_parts_still_reads() {
    a_store_with_copied_objects_reads("store-format10-s3", "sha256p10-");
}

/// The store fixture `name`, put into a bucket: fsck clean; checkpoint 1 restores, and
/// each of its files stored as an object named `objects/<copied>...` is one of the source
/// job's files; one changed byte in such an object and fsck names it.
fn a_store_with_copied_objects_reads(name: &str, copied_prefix: &str) {
    let moto = moto();
    let bucket = moto.bucket();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let mut copied = Vec::new();
    for entry in crate::common::files_under(&fixture) {
        let rel = entry
            .strip_prefix(&fixture)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        if rel.starts_with(&format!("objects/{copied_prefix}")) {
            copied.push(rel.clone());
        }
        crate::common::moto::put_object(
            moto.port,
            &bucket,
            &format!("store/{rel}"),
            &std::fs::read(&entry).unwrap(),
        );
    }
    assert!(!copied.is_empty(), "the fixture holds copied objects");
    let store = format!("s3://{bucket}/store");
    let ckptfs = |args: &[&str]| {
        Command::new(crate::common::mounted::BIN)
            .args(args)
            .output()
            .unwrap()
    };
    ok(ckptfs(&["fsck", &store]));
    // Each restored SST stored as a copy is one of the source job's files, byte for byte.
    let sources: BTreeSet<Vec<u8>> = crate::common::files_under(&crate::flink::fixture())
        .into_iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let like: ObjectId = copied[0].trim_start_matches("objects/").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cp1");
    ok(ckptfs(&["restore", &store, "1", out.to_str().unwrap()]));
    let mut from_copies = 0;
    for sst in crate::common::files_under(&out) {
        let bytes = std::fs::read(&sst).unwrap();
        let mut hasher = like.hasher();
        hasher.update(&bytes);
        let name = format!("objects/{}", hasher.finalize().to_hex());
        if copied.contains(&name) {
            assert!(
                sources.contains(&bytes),
                "{} is none of the source's files",
                sst.display()
            );
            from_copies += 1;
        }
    }
    assert!(from_copies > 0, "checkpoint 1 restores from copied objects");
    let remote = ckptfs_core::store::s3::Remote::connect(&bucket, "").unwrap();
    let key = format!("store/{}", copied[0]);
    let good = remote.get_bytes(&key).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 1;
    remote
        .upload_from(&key, |out| {
            std::io::Write::write_all(out, &bad).unwrap();
            Ok(())
        })
        .unwrap();
    let out = ckptfs(&["fsck", &store, "--json"]);
    assert!(!out.status.success());
    let name = copied[0].trim_start_matches("objects/");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(name),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
