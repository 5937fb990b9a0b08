//! Real FUSE mounts of the daemon (root and /dev/fuse are required, here and in CI).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::mounted::*;

#[test]
fn the_tree_follows_checkpoints_compactions_and_drops() {
    let m = Mounted::new(&["--backend", "A/0", "--backend", "B/1", "--retain", "2"]);
    assert_eq!(m.root_names(), vec![".ckptfs"]);
    m.put("A/0", "k1", "v1");
    assert_eq!(m.checkpoint(), 1);
    m.put("B/1", "k2", "v2");
    assert_eq!(m.checkpoint(), 2);
    ok(ckptfs(&["put", m.mnt(), "A/0", "k3", "v3"]));
    let mut ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.mnt.join(".ckptfs/ctl"))
        .unwrap();
    ctl.write_all(b"compact A/0\n").unwrap();
    let mut answer = String::new();
    BufReader::new(&ctl).read_line(&mut answer).unwrap();
    assert_eq!(answer, "{\"ok\":true}\n");
    assert_eq!(m.checkpoint(), 3);
    assert_eq!(m.root_names(), vec![".ckptfs", "cp-2", "cp-3", "latest"]);
    assert_eq!(
        std::fs::read_link(m.mnt.join("latest")).unwrap(),
        PathBuf::from("cp-3")
    );

    for id in [2u64, 3] {
        let manifest = m.manifest(id);
        let cp = m.mnt.join(format!("cp-{id}"));
        let mut ops: Vec<String> = std::fs::read_dir(&cp)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        ops.sort();
        assert_eq!(ops, vec!["A", "B"]);
        let cp_meta = std::fs::metadata(&cp).unwrap();
        assert_eq!(cp_meta.permissions().mode() & 0o7777, 0o555);
        assert_eq!(cp_meta.nlink(), 4);
        let completed = manifest["completed_unix_ms"].as_u64().unwrap() as i64;
        assert_eq!(cp_meta.mtime(), completed / 1000);
        for backend in manifest["backends"].as_array().unwrap() {
            let dir = cp.join(backend["name"].as_str().unwrap());
            let mut want: Vec<(String, u64)> = backend["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["name"].as_str().unwrap().to_string(),
                        f["size"].as_u64().unwrap(),
                    )
                })
                .collect();
            want.sort();
            let mut got: Vec<(String, u64)> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (
                        e.file_name().into_string().unwrap(),
                        e.metadata().unwrap().len(),
                    )
                })
                .collect();
            got.sort();
            assert_eq!(got, want, "cp-{id}/{}", backend["name"]);
            let f = dir.join(&want[0].0);
            let meta = std::fs::metadata(&f).unwrap();
            assert_eq!(meta.permissions().mode() & 0o7777, 0o444);
            assert_eq!(meta.nlink(), 1);
            assert_eq!(
                std::fs::metadata(&f).unwrap().ino(),
                meta.ino(),
                "inode numbers are stable"
            );
            assert_eq!(std::fs::read(&f).unwrap().len() as u64, want[0].1);
        }
    }
    let ctl_meta = std::fs::metadata(m.mnt.join(".ckptfs/ctl")).unwrap();
    assert_eq!(ctl_meta.permissions().mode() & 0o7777, 0o600);
    // The registry lists every stored object with its count and where it appears.
    let registry = std::fs::read_to_string(m.mnt.join(".ckptfs/registry")).unwrap();
    let rows: Vec<serde_json::Value> = registry
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!rows.is_empty());
    // File lists are stored objects too, named as such.
    assert!(rows.iter().any(|r| r["file_list_of"].is_array()));
    let retained = m.checkpoint_ids();
    for row in &rows {
        // Runs of consecutive retained checkpoints: [first, last].
        let runs = row["checkpoint_runs"].as_array().unwrap();
        let refs = retained
            .iter()
            .filter(|id| {
                runs.iter()
                    .any(|r| r[0].as_u64().unwrap() <= **id && **id <= r[1].as_u64().unwrap())
            })
            .count() as u64;
        assert_eq!(row["refcount"].as_u64().unwrap(), refs);
        assert!(std::fs::metadata(
            m.store
                .join("objects")
                .join(&row["id"].as_str().unwrap()[..2])
                .join(row["id"].as_str().unwrap())
        )
        .is_ok());
    }
}

#[test]
fn cp_r_out_of_the_mount_gives_a_directory_rocksdb_opens() {
    let m = Mounted::new(&["--backend", "Operator-2/1", "--backend", "Operator-1/0"]);
    m.put("Operator-2/1", "a key", "a%value");
    m.put("Operator-2/1", "gone", "x");
    ok(ckptfs(&["del", m.mnt(), "Operator-2/1", "gone"]));
    m.put("Operator-1/0", "other", "1");
    let id = m.checkpoint();
    m.put("Operator-2/1", "after", "not in the checkpoint");
    let one = m.root.join("one");
    let status = Command::new("cp")
        .arg("-r")
        .arg(m.mnt.join(format!("cp-{id}/Operator-2/1")))
        .arg(&one)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(scan(&one), kv(&[("a key", "a%value")]));
    let all = m.root.join("all");
    assert!(Command::new("cp")
        .arg("-r")
        .arg(m.mnt.join(format!("cp-{id}")))
        .arg(&all)
        .status()
        .unwrap()
        .success());
    assert_eq!(scan(&all.join("Operator-1/0")), kv(&[("other", "1")]));
    // RocksDB opens the checkpoint in place, read-only.
    assert_eq!(
        scan(&m.mnt.join("latest/Operator-2/1")),
        kv(&[("a key", "a%value")])
    );
    // Bytes read through the mount equal the restored copy.
    let restored = m.root.join("restored");
    ok(ckptfs(&[
        "restore",
        m.store.to_str().unwrap(),
        &id.to_string(),
        restored.to_str().unwrap(),
    ]));
    for entry in std::fs::read_dir(restored.join("Operator-2/1")).unwrap() {
        let entry = entry.unwrap();
        let via_mount = std::fs::read(
            m.mnt
                .join(format!("cp-{id}/Operator-2/1"))
                .join(entry.file_name()),
        )
        .unwrap();
        assert_eq!(
            via_mount,
            std::fs::read(entry.path()).unwrap(),
            "{:?}",
            entry.file_name()
        );
    }
    // find, du and sha256sum see a normal read-only tree.
    let cp_dir = m.mnt.join(format!("cp-{id}"));
    let manifest = m.manifest(id);
    let files: Vec<&serde_json::Value> = manifest["backends"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["files"].as_array().unwrap())
        .collect();
    let total: u64 = files.iter().map(|f| f["size"].as_u64().unwrap()).sum();
    let found = Command::new("find")
        .arg(&cp_dir)
        .args(["-type", "f"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&found.stdout).lines().count(),
        files.len()
    );
    let du = Command::new("du")
        .args(["-sb", "--apparent-size"])
        .arg(&cp_dir)
        .output()
        .unwrap();
    let du_bytes: u64 = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        du_bytes, total,
        "du --apparent-size counts exactly the file sizes"
    );
    let sum = |p: &Path| {
        String::from_utf8_lossy(&Command::new("sha256sum").arg(p).output().unwrap().stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        sum(&cp_dir.join("Operator-2/1/CURRENT")),
        sum(&restored.join("Operator-2/1/CURRENT"))
    );
    // tar sees a normal read-only tree.
    let tar = Command::new("tar")
        .arg("-cf")
        .arg(m.root.join("cp.tar"))
        .arg("-C")
        .arg(&m.mnt)
        .arg(format!("cp-{id}"))
        .output()
        .unwrap();
    assert!(
        tar.status.success(),
        "{}",
        String::from_utf8_lossy(&tar.stderr)
    );
}

#[test]
fn rmdir_drops_a_checkpoint_and_open_files_stay_readable() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "5"]);
    for i in 0..300 {
        m.put("A/0", &format!("key{i}"), &"v".repeat(50));
    }
    let first = m.checkpoint();
    m.put("A/0", "more", "data");
    let second = m.checkpoint();
    let dir = m.mnt.join(format!("cp-{first}/A/0"));
    let sst = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sst"))
        .unwrap();
    let expected = std::fs::read(&sst).unwrap();
    let mut held = std::fs::File::open(&sst).unwrap();
    let objects_before = m.status()["objects"].as_u64().unwrap();

    std::fs::remove_dir(m.mnt.join(format!("cp-{first}"))).unwrap();
    assert_eq!(m.checkpoint_ids(), vec![second]);
    assert!(!m.root_names().contains(&format!("cp-{first}")));
    assert!(!m.store.join(format!("checkpoints/{first}.json")).exists());
    assert!(m.status()["objects"].as_u64().unwrap() < objects_before);
    let mut content = Vec::new();
    held.read_to_end(&mut content).unwrap();
    assert_eq!(
        content, expected,
        "an open file of a dropped checkpoint must stay readable"
    );

    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join(format!("cp-{first}")))),
        libc::ENOENT
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join(format!("cp-{second}/A")))),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join(".ckptfs"))),
        libc::EPERM
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join("latest"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join("cp-0042"))),
        libc::ENOENT
    );
    // The command-line form.
    ok(ckptfs(&["rm", m.mnt(), &second.to_string()]));
    assert!(m.checkpoint_ids().is_empty());
    assert_eq!(m.root_names(), vec![".ckptfs"]);
    let rm = ckptfs(&["rm", m.mnt(), &second.to_string()]);
    assert_eq!(rm.status.code(), Some(1));
}

#[test]
fn changes_inside_checkpoints_fail_and_change_nothing() {
    let m = Mounted::new(&["--backend", "A/0"]);
    m.put("A/0", "k", "v");
    let id = m.checkpoint();
    let dir = m.mnt.join(format!("cp-{id}/A/0"));
    let before: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let current = dir.join("CURRENT");
    let content = std::fs::read(&current).unwrap();
    assert_eq!(errno_of(std::fs::write(dir.join("new"), b"x")), libc::EROFS);
    assert_eq!(
        errno_of(std::fs::OpenOptions::new().write(true).open(&current)),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::fs::OpenOptions::new().append(true).open(&current)),
        libc::EROFS
    );
    assert_eq!(errno_of(std::fs::remove_file(&current)), libc::EROFS);
    assert_eq!(
        errno_of(std::fs::rename(&current, dir.join("C2"))),
        libc::EROFS
    );
    assert_eq!(errno_of(std::fs::create_dir(dir.join("sub"))), libc::EROFS);
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("x", dir.join("link"))),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::fs::set_permissions(
            &current,
            std::fs::Permissions::from_mode(0o644)
        )),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::fs::create_dir(m.mnt.join("cp-99"))),
        libc::EPERM
    );
    assert_eq!(
        errno_of(std::fs::write(m.mnt.join("file"), b"x")),
        libc::EPERM
    );
    assert_eq!(
        errno_of(std::fs::write(m.mnt.join(".ckptfs/status"), b"x")),
        libc::EROFS
    );
    let after: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before, after);
    assert_eq!(std::fs::read(&current).unwrap(), content);
    assert_eq!(
        m.root_names(),
        vec![".ckptfs", &format!("cp-{id}"), "latest"]
    );
}

/// Opens ctl read-write and talks the protocol: write lines, read answer lines.
#[test]
fn the_control_protocol_answers_in_order_and_refuses_bad_writes_whole() {
    let m = Mounted::new(&["--backend", "A/0", "--backend", "B/0"]);
    let mut ctl = Ctl::open(&m);
    ctl.send("put A/0 k%20one v%251\nput B/0 x y\ndel A/0 nothing\ncheckpoint\nflush A/0\n")
        .unwrap();
    for _ in 0..3 {
        assert_eq!(ctl.answer()["ok"], true);
    }
    let cp = ctl.answer();
    assert_eq!(cp["ok"], true, "{cp}");
    let id = cp["id"].as_u64().unwrap();
    assert!(cp["files"].as_u64().unwrap() > 0 && cp["bytes_uploaded"].as_u64().is_some());
    assert_eq!(ctl.answer()["ok"], true);
    assert_eq!(
        scan(&m.mnt.join(format!("cp-{id}/A/0"))),
        kv(&[("k one", "v%1")])
    );

    // Every error path: the write fails with EINVAL, nothing changes, the error is the answer.
    for (bad, needle) in [
        ("put A/0 applied? no\nbogus\n", "unknown command"),
        ("put C/0 k v\n", "no such backend C/0"),
        ("put A/0 k\n", "takes 3"),
        ("put A/0 k%2 v\n", "percent-escape"),
        ("retain 0\n", "at least 1"),
        ("delete 999\n", "no such checkpoint 999"),
        ("put ../0 k v\n", "invalid backend name"),
        ("checkpoint now\n", "takes 0"),
    ] {
        let err = ctl.send(bad).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{bad:?}");
        let answer = ctl.answer();
        assert_eq!(answer["ok"], false);
        assert!(
            answer["error"].as_str().unwrap().contains(needle),
            "{bad:?}: {answer}"
        );
        assert!(m.status()["last_error"].as_str().unwrap().contains(needle));
    }
    assert_eq!(m.checkpoint_ids(), vec![id]);
    ctl.send("checkpoint\n").unwrap();
    let next = ctl.answer()["id"].as_u64().unwrap();
    assert_eq!(
        scan(&m.mnt.join(format!("cp-{next}/A/0"))),
        kv(&[("k one", "v%1")]),
        "a refused write changed data"
    );

    // A second checkpoint while the first holds the only slot is refused at once (EBUSY),
    // and the line after it still runs.
    ctl.send("checkpoint\ncheckpoint\nput A/0 after busy\n")
        .unwrap();
    let (first, second, put) = (ctl.answer(), ctl.answer(), ctl.answer());
    assert_eq!(first["ok"], true, "{first}");
    assert_eq!(second["errno"], libc::EBUSY, "{second}");
    assert_eq!(put["ok"], true, "{put}");
    // retain and delete, applied at once.
    ctl.send("checkpoint\n").unwrap();
    assert_eq!(ctl.answer()["ok"], true);
    ctl.send("retain 2\n").unwrap();
    assert_eq!(ctl.answer()["ok"], true);
    let ids = m.checkpoint_ids();
    assert_eq!(ids.len(), 2);
    ctl.send(&format!("delete {}\n", ids[0])).unwrap();
    assert_eq!(ctl.answer()["ok"], true);
    assert_eq!(m.checkpoint_ids(), vec![ids[1]]);
    // Nothing more to read: end of stream.
    let mut buf = [0u8; 16];
    assert_eq!(ctl.0.read(&mut buf).unwrap(), 0);

    // `echo checkpoint > ctl` alone, with nobody reading, still checkpoints.
    std::fs::write(m.mnt.join(".ckptfs/ctl"), b"checkpoint\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.checkpoint_ids().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "fire-and-forget checkpoint never completed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Shell form with a fresh handle per command, as scripts do.
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec 3<>{}/.ckptfs/ctl; echo checkpoint >&3; head -n1 <&3",
            m.mnt()
        ))
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["ok"], true, "{answer}");
}

#[test]
fn periodic_checkpoints_with_interval() {
    let m = Mounted::new(&["--backend", "A/0", "--interval", "300ms", "--retain", "10"]);
    m.put("A/0", "k", "v");
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.checkpoint_ids().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "only {:?} after 30s",
            m.checkpoint_ids()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn unmount_with_a_checkpoint_in_flight_leaves_a_clean_store() {
    let m = Mounted::new(&["--backend", "A/0", "--backend", "B/0"]);
    m.load_keys("A/0", 20_000);
    std::fs::write(m.mnt.join(".ckptfs/ctl"), b"checkpoint\n").unwrap();
    m.umount();
    let report = ckptfs(&["fsck", m.store.to_str().unwrap()]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stdout)
    );
    // The checkpoint finished before the daemon stopped.
    let checkpoints: Vec<_> = std::fs::read_dir(m.store.join("checkpoints"))
        .unwrap()
        .collect();
    assert_eq!(checkpoints.len(), 1);
    m.mount(&[]);
    let id = m.checkpoint_ids()[0];
    assert_eq!(scan(&m.mnt.join(format!("cp-{id}/A/0"))).len(), 20_000);
}

#[test]
fn remounting_brings_back_backends_checkpoints_and_data() {
    let m = Mounted::new(&["--backend", "A/0", "--backend", "B/7"]);
    m.put("A/0", "k", "v1");
    let first = m.checkpoint();
    m.put("A/0", "k", "v2");
    m.put("B/7", "unsaved", "but in the WAL");
    m.umount();
    m.mount(&[]);
    assert_eq!(m.status()["backends"], serde_json::json!(["A/0", "B/7"]));
    assert_eq!(m.checkpoint_ids(), vec![first]);
    let second = m.checkpoint();
    assert_eq!(second, first + 1);
    assert_eq!(
        scan(&m.mnt.join(format!("cp-{second}/A/0"))),
        kv(&[("k", "v2")])
    );
    assert_eq!(
        scan(&m.mnt.join(format!("cp-{second}/B/7"))),
        kv(&[("unsaved", "but in the WAL")])
    );

    // Roll back with --restore: the backends continue from checkpoint `first`.
    m.umount();
    m.mount(&["--restore", &first.to_string()]);
    let third = m.checkpoint();
    assert_eq!(
        scan(&m.mnt.join(format!("cp-{third}/A/0"))),
        kv(&[("k", "v1")])
    );
    assert_eq!(scan(&m.mnt.join(format!("cp-{third}/B/7"))), kv(&[]));

    // Local state lost: the backends start from the latest checkpoint.
    m.umount();
    std::fs::remove_dir_all(m.store.join("state")).unwrap();
    m.mount(&[]);
    let fourth = m.checkpoint();
    assert_eq!(
        scan(&m.mnt.join(format!("cp-{fourth}/A/0"))),
        kv(&[("k", "v1")])
    );
}

#[test]
fn mount_failures_are_clear_and_change_nothing() {
    let m = Mounted::new(&["--backend", "A/0"]);
    let other = m.root.join("other");
    std::fs::create_dir(&other).unwrap();
    let out = ckptfs(&["mount", m.store.to_str().unwrap(), other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another ckptfs process"), "{err}");
    assert!(!other.join(".ckptfs").exists());

    let fresh = m.root.join("fresh-store");
    let out = ckptfs(&[
        "mount",
        fresh.to_str().unwrap(),
        m.root.join("missing").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"));

    let out = ckptfs(&["mount", fresh.to_str().unwrap(), m.mnt()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already a mount point"));

    let out = ckptfs(&[
        "mount",
        fresh.to_str().unwrap(),
        other.to_str().unwrap(),
        "--backend",
        "../0",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "bad backend names are usage errors"
    );
    assert!(
        m.mnt.join(".ckptfs/ctl").exists(),
        "the first mount must be untouched"
    );
}

#[test]
fn sigterm_unmounts_cleanly() {
    let m = Mounted::new(&["--backend", "A/0"]);
    m.put("A/0", "k", "v");
    m.checkpoint();
    let pid = m.status()["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok() {
        assert!(Instant::now() < deadline, "daemon did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!m.mnt.join(".ckptfs").exists(), "still mounted");
    let report = ckptfs(&["fsck", m.store.to_str().unwrap()]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stdout)
    );
}

/// mount(8) runs `/sbin/mount.fuse.ckptfs STORE MOUNTPOINT -o OPTIONS` for
/// `mount -t fuse.ckptfs` and fstab lines; ckptfs answers to that name.
#[test]
fn the_mount_helper_name_translates_mount_options() {
    let dir = tempfile::tempdir().unwrap();
    let helper = dir.path().join("mount.fuse.ckptfs");
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    let store = dir.path().join("store");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let bad = Command::new(&helper)
        .args([
            store.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            "rw,frobnicate=1",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown mount option"));
    assert!(!store.exists(), "a refused mount created the store");

    let out = Command::new(&helper)
        .args([store.to_str().unwrap(), mnt.to_str().unwrap()])
        .args([
            "-o",
            "rw,nosuid,nodev,_netdev,backend=Op/0,backend=Op/1,retain=4,interval=1h",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(mnt.join(".ckptfs/status")).unwrap())
            .unwrap();
    assert_eq!(status["backends"], serde_json::json!(["Op/0", "Op/1"]));
    assert_eq!(status["retain"], 4);
    ok(ckptfs(&["umount", mnt.to_str().unwrap()]));
}

#[test]
fn graph_draws_checkpoints_objects_and_counts() {
    let m = Mounted::new(&["--backend", "Operator-2/1", "--retain", "2"]);
    m.put("Operator-2/1", "a", "1");
    m.checkpoint();
    m.put("Operator-2/1", "b", "2");
    m.checkpoint();
    let dot = ok(ckptfs(&["graph", m.mnt(), "--format", "dot"]));
    assert!(dot.starts_with("digraph ckptfs"));
    assert!(dot.contains("\"cp-1\"") && dot.contains("\"cp-2\""));
    // Objects shared by both checkpoints (at least the first SST) have refs=2.
    assert!(dot.contains("refs=2"), "{dot}");
    let edges = dot.matches(" -> ").count();
    let registry = std::fs::read_to_string(m.mnt.join(".ckptfs/registry")).unwrap();
    let refs: u64 = registry
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["refcount"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(edges as u64, refs, "one edge per reference");
    // The same from the store path, and as SVG through Graphviz.
    assert_eq!(
        ok(ckptfs(&[
            "graph",
            m.store.to_str().unwrap(),
            "--format",
            "dot"
        ])),
        dot
    );
    let svg = ok(ckptfs(&["graph", m.mnt(), "--format", "svg"]));
    assert!(
        svg.contains("<svg"),
        "Graphviz dot must be installed (scripts/test installs it)"
    );
}

/// Only the mounting user gets in, unless --allow-other; then the kernel checks the modes
/// (default_permissions): checkpoints readable by all, the control file and drops not.
#[test]
fn other_users_get_in_only_with_allow_other_and_then_read_only() {
    let as_nobody = |script: String| {
        Command::new("runuser")
            .args(["-u", "nobody", "--", "sh", "-c", &script])
            .output()
            .expect("runuser (util-linux)")
    };
    for allow_other in [false, true] {
        let args: &[&str] = if allow_other {
            &["--backend", "A/0", "--allow-other"]
        } else {
            &["--backend", "A/0"]
        };
        let m = Mounted::new(args);
        std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
        m.put("A/0", "k", "v");
        let id = m.checkpoint();
        let listing = as_nobody(format!(
            "ls {}/cp-{id}/A/0 && cat {}/cp-{id}/A/0/CURRENT",
            m.mnt(),
            m.mnt()
        ));
        assert_eq!(
            listing.status.success(),
            allow_other,
            "{}",
            String::from_utf8_lossy(&listing.stderr)
        );
        if allow_other {
            assert!(String::from_utf8_lossy(&listing.stdout).contains("MANIFEST-"));
            let ctl = as_nobody(format!("echo checkpoint > {}/.ckptfs/ctl", m.mnt()));
            assert!(!ctl.status.success());
            assert!(String::from_utf8_lossy(&ctl.stderr).contains("Permission denied"));
            let rm = as_nobody(format!("rmdir {}/cp-{id}", m.mnt()));
            assert!(!rm.status.success());
            assert_eq!(m.checkpoint_ids(), vec![id]);
        }
    }
}

/// A stored object whose bytes no longer match its checksum is refused with EIO at open,
/// never copied out silently wrong; intact files of the same checkpoint still read.
#[test]
fn a_corrupt_object_is_an_io_error_not_wrong_bytes() {
    let m = Mounted::new(&["--backend", "A/0"]);
    for i in 0..200 {
        m.put("A/0", &format!("key{i}"), "value");
    }
    let id = m.checkpoint();
    m.umount();
    let manifest = m.manifest(id);
    let files = manifest["backends"][0]["files"].as_array().unwrap().clone();
    let sst = files
        .iter()
        .find(|f| f["name"].as_str().unwrap().ends_with(".sst"))
        .unwrap();
    let object = sst["object"].as_str().unwrap();
    let path = m.store.join("objects").join(&object[..2]).join(object);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    m.mount(&[]);
    let dir = m.mnt.join(format!("cp-{id}/A/0"));
    let err = std::fs::read(dir.join(sst["name"].as_str().unwrap())).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(m.status()["last_error"].as_str().unwrap().contains(object));
    assert_eq!(
        std::fs::read(dir.join("CURRENT")).unwrap().len() as u64,
        files.iter().find(|f| f["name"] == "CURRENT").unwrap()["size"]
            .as_u64()
            .unwrap()
    );
    // With --no-verify the bytes are served as they are.
    m.umount();
    m.mount(&["--no-verify"]);
    let served = std::fs::read(dir.join(sst["name"].as_str().unwrap())).unwrap();
    assert_eq!(served, std::fs::read(&path).unwrap());
}

/// scripts/ckptfs.service: systemd accepts it, and its ExecStart, run as systemd would
/// (with the example paths replaced), mounts in the foreground and stops cleanly on the
/// unit's KillSignal.
#[test]
fn the_systemd_unit_is_valid_and_its_command_serves_and_stops() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/ckptfs.service"
    ))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tested = dir.path().join("ckptfs.service");
    std::fs::write(&tested, unit.replace("/usr/local/bin/ckptfs", BIN)).unwrap();
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&tested)
        .output()
        .expect("systemd-analyze");
    let complaints = String::from_utf8_lossy(&verify.stderr).into_owned();
    assert!(
        verify.status.success() && !complaints.contains(&*tested.to_string_lossy()),
        "{complaints}"
    );
    assert!(unit.contains("KillSignal=SIGTERM"));

    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    let (store, mnt) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let exec = exec
        .replace("/srv/ckpt", store.to_str().unwrap())
        .replace("/mnt/ckpt", mnt.to_str().unwrap());
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/ckptfs"));
    let mut child = Command::new(BIN)
        .args(words)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mnt.join(".ckptfs/status").exists() {
        assert!(
            Instant::now() < deadline,
            "the unit's command never mounted"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the unit's command exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ok(ckptfs(&["checkpoint", mnt.to_str().unwrap()]));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!mnt.join(".ckptfs").exists());
    assert!(store.join("checkpoints/1.json").exists());
}

/// --rocksdb-options reaches the backends (it shows in the checkpoint's OPTIONS file,
/// next to ckptfs's own format_version); a bad option string is refused before anything
/// is created.
#[test]
fn rocksdb_options_reach_the_backends_and_bad_ones_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bad_store = dir.path().join("bad-store");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = ckptfs(&[
        "mount",
        bad_store.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "--rocksdb-options",
        "no_such_option=1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_option"));
    assert!(!bad_store.exists(), "a refused mount created the store");
    // RocksDB parses this one, but refuses it only when a database opens.
    let out = ckptfs(&[
        "mount",
        bad_store.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "--rocksdb-options",
        "compression=kXpressCompression",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!bad_store.exists(), "a refused mount created the store");

    let m = Mounted::new(&[
        "--backend",
        "A/0",
        "--rocksdb-options",
        "target_file_size_base=8388608;max_bytes_for_level_base=33554432",
    ]);
    m.put("A/0", "k", "v");
    let id = m.checkpoint();
    let dir = m.mnt.join(format!("cp-{id}/A/0"));
    let options = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("OPTIONS-")
        })
        .unwrap();
    let text = std::fs::read_to_string(options).unwrap();
    assert!(
        text.contains("target_file_size_base=8388608"),
        "option not applied"
    );
    assert!(text.contains("max_bytes_for_level_base=33554432"));
    assert!(
        text.contains("format_version=5"),
        "the option string reset the table format"
    );
}

/// An option naming another directory (`wal_dir`) works from the first mount: checking
/// the options leaves nothing there that the real database would then trip over.
#[test]
fn a_wal_dir_option_works_from_the_first_mount() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    std::fs::create_dir(&wal).unwrap();
    let option = format!("wal_dir={}", wal.display());
    let m = Mounted::new(&["--backend", "A/0", "--rocksdb-options", &option]);
    m.put("A/0", "k", "v");
    let id = m.checkpoint();
    let out = m.root.join("out");
    assert!(m.copy_out(id, &out));
    assert_eq!(scan(&out.join("A/0")), kv(&[("k", "v")]));
    assert!(
        std::fs::read_dir(&wal).unwrap().count() > 0,
        "the backend does not write its WAL to wal_dir"
    );
}

/// `load` re-encodes what it reads, reports the input line of a bad escape, and says how
/// far it got.
#[test]
fn load_reports_input_lines_and_progress() {
    let m = Mounted::new(&["--backend", "A/0"]);
    let file = m.root.join("in.tsv");
    std::fs::write(&file, "a b\tvalue with spaces\nk2\tv%252\n").unwrap();
    let out = ok(ckptfs(&["load", m.mnt(), "A/0", file.to_str().unwrap()]));
    assert!(out.contains("loaded 2 keys"), "{out}");
    let id = m.checkpoint();
    assert_eq!(
        scan(&m.mnt.join(format!("cp-{id}/A/0"))),
        kv(&[("a b", "value with spaces"), ("k2", "v%2")])
    );
    let lines: String = (0..5000)
        .map(|i| format!("key{i}\tv\n"))
        .collect::<String>()
        + "bad\tx%zz\n";
    std::fs::write(&file, lines).unwrap();
    let out = ckptfs(&["load", m.mnt(), "A/0", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 5001"), "{err}");
    assert!(err.contains("keys were loaded before it"), "{err}");
}

/// `ckptfs ls` lists every retained checkpoint (from `.ckptfs/checkpoints`), while
/// `.ckptfs/status` describes the newest 100 one by one and all of them as runs of ids;
/// `ckptfs status` shows the runs. A dropped checkpoint splits a run.
#[test]
fn ls_lists_every_checkpoint_and_status_summarises() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "1000"]);
    let mut ids = Vec::new();
    for i in 0..105 {
        m.put("A/0", &format!("k{i}"), "v");
        ids.push(m.checkpoint());
    }
    std::fs::remove_dir(m.mnt.join(format!("cp-{}", ids[50]))).unwrap();
    let retained: Vec<u64> = ids.iter().copied().filter(|id| *id != ids[50]).collect();
    let listed: serde_json::Value =
        serde_json::from_str(&ok(ckptfs(&["ls", m.mnt(), "--json"]))).unwrap();
    let listed: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, retained);
    let table = ok(ckptfs(&["ls", m.mnt()]));
    assert_eq!(table.lines().count(), 1 + retained.len(), "{table}");
    let status = m.status();
    assert_eq!(status["checkpoints_total"], 104);
    let newest: Vec<u64> = status["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(newest, retained[retained.len() - 100..].to_vec());
    assert_eq!(
        status["checkpoint_runs"],
        serde_json::json!([[ids[0], ids[49]], [ids[51], ids[104]]])
    );
    let text = ok(ckptfs(&["status", m.mnt()]));
    assert!(
        text.contains(&format!(
            "{}-{} {}-{} (104 retained",
            ids[0], ids[49], ids[51], ids[104]
        )),
        "{text}"
    );
}

/// Stores written by earlier versions (tests/fixtures/store-formatN) mount: their
/// checkpoints are shown, `cp -r` of each gives exactly the data of its round (checkpoint
/// N holds round N-1 of `ckptfs workload`), and a new checkpoint can be taken.
#[test]
fn stores_of_earlier_formats_mount_and_copy_out() {
    for format in [1, 2, 3, 4, 5] {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let fixture = format!(
            "{}/tests/fixtures/store-format{format}",
            env!("CARGO_MANIFEST_DIR")
        );
        assert!(Command::new("cp")
            .args(["-a", &fixture])
            .arg(&store)
            .status()
            .unwrap()
            .success());
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let m = Mounted::at(&store, &mnt, &[]);
        assert_eq!(m.checkpoint_ids(), vec![2, 3], "format {format}");
        for id in [2u64, 3] {
            let dest = dir.path().join(format!("copy-{id}"));
            assert!(m.copy_out(id, &dest), "format {format}: cp -r of cp-{id}");
            for backend in ["A/0", "B/1"] {
                let expected =
                    ckptfs::workload::expected_after(&backend.parse().unwrap(), id - 1, 200, 20);
                assert_eq!(
                    scan(&dest.join(backend)),
                    expected,
                    "format {format} {backend}"
                );
            }
        }
        let new = m.checkpoint();
        assert_eq!(new, 4, "format {format}");
        m.umount();
    }
}

/// The kernel caches the root's listing (FUSE's readdir cache), so a warm `ls` of many
/// checkpoints asks nothing of the daemon; yet every listing opened after a checkpoint or
/// a drop shows it, even when a handle opened before the change was read after it (that
/// handle's older picture must not end up in the cache).
#[test]
fn the_root_listing_is_cached_yet_follows_every_checkpoint_and_drop() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "3"]);
    let names = |dir: std::fs::ReadDir| -> Vec<String> {
        let mut names: Vec<String> = dir
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let expected = |m: &Mounted| -> Vec<String> {
        let mut want: Vec<String> = m
            .checkpoint_ids()
            .iter()
            .map(|id| format!("cp-{id}"))
            .chain([".ckptfs".to_string(), "latest".to_string()])
            .collect();
        want.sort();
        want
    };
    for round in 1..=5u32 {
        m.put("A/0", &format!("k{round}"), "v");
        // Opened alone (so it may fill the kernel's cache), read after the change.
        let before = std::fs::read_dir(&m.mnt).unwrap();
        let id = m.checkpoint();
        let old = names(before);
        assert!(!old.contains(&format!("cp-{id}")), "round {round}: {old:?}");
        for _ in 0..3 {
            assert_eq!(m.root_names(), expected(&m), "round {round}");
        }
        // Opened before the change, a second listing opened after it, the old one read
        // last.
        let before = std::fs::read_dir(&m.mnt).unwrap();
        m.put("A/0", &format!("j{round}"), "v");
        let id = m.checkpoint();
        let during = std::fs::read_dir(&m.mnt).unwrap();
        let now = names(during);
        assert!(now.contains(&format!("cp-{id}")), "round {round}: {now:?}");
        let old = names(before);
        assert!(!old.contains(&format!("cp-{id}")), "round {round}: {old:?}");
        for _ in 0..3 {
            assert_eq!(m.root_names(), expected(&m), "round {round}");
        }
    }
    // A drop, with a listing of the old set read after it.
    let ids = m.checkpoint_ids();
    let before = std::fs::read_dir(&m.mnt).unwrap();
    std::fs::remove_dir(m.mnt.join(format!("cp-{}", ids[0]))).unwrap();
    assert!(names(before).contains(&format!("cp-{}", ids[0])));
    for _ in 0..3 {
        let now = m.root_names();
        assert!(!now.contains(&format!("cp-{}", ids[0])), "{now:?}");
        assert_eq!(now, expected(&m));
    }
}
