//! The daemon's life: mount failures and options (RocksDB options, wal_dir, fstab and
//! mount -t, the systemd unit), periodic checkpoints, unmount and SIGTERM with work in
//! flight, remounting, a private store and a proper daemon, full disks under the store and
//! the state directory, and a soak of writers, checkpoints, readers and drops.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::mounted::*;

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
    let options = crate::common::file_starting_with(&dir, "OPTIONS-");
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

/// Nothing in the store or the state directory is readable by another user,
/// including what RocksDB creates; the daemon runs in / with umask 077.
#[test]
fn the_store_is_private_and_the_daemon_is_a_proper_daemon() {
    let m = Mounted::new(&["--backend", "A/0"]);
    // The test's temporary directory is private itself; open it so that only the store's
    // own modes protect it.
    std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    m.put("A/0", "secret", "value");
    m.checkpoint();
    let mut checked = 0;
    let mut pending = vec![m.store.clone()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o077,
            0,
            "{} is {:o}",
            path.display(),
            meta.permissions().mode()
        );
        if meta.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        checked += 1;
    }
    assert!(checked > 20, "only {checked} entries");
    let object = std::fs::read_dir(m.store.join("objects"))
        .unwrap()
        .flat_map(|shard| std::fs::read_dir(shard.unwrap().path()).unwrap())
        .next()
        .unwrap()
        .unwrap()
        .path();
    for target in [
        &object,
        &m.store.join("checkpoints"),
        &m.store.join("state"),
    ] {
        let out = Command::new("runuser")
            .args(["-u", "nobody", "--", "ls", "-l"])
            .arg(target)
            .output()
            .unwrap();
        assert!(!out.status.success(), "nobody read {}", target.display());
    }
    let pid = daemon_pid(&m);
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(),
        Path::new("/")
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("Umask:\t0077"), "{status}");
}

/// A daemon hosting backend A/0 whose store is on a filesystem of 8 MiB (its state
/// directory, `DIR/state`, is not): the filesystem, the store and the mount.
fn mounted_on_small_store(dir: &Path, extra: &[&str]) -> (SmallFs, PathBuf, Mounted) {
    let small = SmallFs::new(dir.join("small"), "8m");
    let store = small.path.join("store");
    let state = dir.join("state");
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut args = vec!["--backend", "A/0", "--state", state.to_str().unwrap()];
    args.extend_from_slice(extra);
    let m = Mounted::at(&store, &mnt, &args);
    (small, store, m)
}

/// The store's filesystem fills during an upload: the checkpoint fails with a clear answer
/// and status, leaves no partial object or manifest, earlier checkpoints stay intact, the
/// daemon keeps serving, and once there is room again the next checkpoint succeeds.
#[test]
fn a_full_store_fails_the_checkpoint_cleanly_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let (small, store, m) = mounted_on_small_store(dir.path(), &["--retain", "10"]);
    load(&m, "A/0", 0..2000, 1000).unwrap();
    let first = m.checkpoint();
    let first_copy = scan(&m.mnt.join(format!("cp-{first}/A/0")));
    let objects_before = store_files(&store, "objects");
    let manifests_before = store_files(&store, "checkpoints");

    load(&m, "A/0", 2000..20_000, 1000).unwrap();
    let out = ckptfs(&["checkpoint", m.mnt(), "--wait", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("No space left on device"), "{stderr}");
    let status = m.status();
    assert!(
        status["last_error"]
            .as_str()
            .unwrap()
            .contains("No space left"),
        "{status}"
    );
    assert_eq!(
        store_files(&store, "objects"),
        objects_before,
        "a partial object was left"
    );
    assert_eq!(store_files(&store, "checkpoints"), manifests_before);
    assert!(
        store_files(&store, "tmp").is_empty(),
        "staged copies were left"
    );
    assert_eq!(m.checkpoint_ids(), vec![first]);
    assert_eq!(scan(&m.mnt.join(format!("cp-{first}/A/0"))), first_copy);
    // Still serving writes.
    m.put("A/0", "after", "full");

    small.resize("64m");
    let second = m.checkpoint();
    let copy = scan(&m.mnt.join(format!("cp-{second}/A/0")));
    assert_eq!(copy.len(), 20_001);
    m.umount();
    ok(ckptfs(&["fsck", store.to_str().unwrap()]));
}

/// The store's filesystem is full before a checkpoint begins: the write that reserves its
/// id fails while its backend is staged beside it. The checkpoint fails with the error, its
/// staging is removed, nothing is stored, and with room again the next checkpoint takes
/// the id (none was reserved) and completes.
#[test]
fn a_reservation_that_fails_beside_the_staging_fails_the_checkpoint_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (small, store, m) = mounted_on_small_store(dir.path(), &[]);
    let state = dir.path().join("state");
    load(&m, "A/0", 0..500, 100).unwrap();
    let first = m.checkpoint();
    let objects_before = store_files(&store, "objects");
    load(&m, "A/0", 500..1000, 100).unwrap();
    // Fill the store's filesystem to the last block.
    let filler = small.path.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
    let out = ckptfs(&["checkpoint", m.mnt(), "--wait", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(store_files(&store, "objects"), objects_before);
    assert_eq!(m.checkpoint_ids(), vec![first]);
    let staging = state.join("staging");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "staging left behind: {left:?}");

    std::fs::remove_file(&filler).unwrap();
    let second = m.checkpoint();
    assert_eq!(second, first + 1, "the failed reservation took no id");
    assert_eq!(scan(&m.mnt.join(format!("cp-{second}/A/0"))).len(), 1000);
    m.umount();
    ok(ckptfs(&["fsck", store.to_str().unwrap()]));
}

/// The state directory fills: RocksDB's write fails and the put is answered with the
/// error; the daemon keeps serving its checkpoints; after a remount with room the
/// backend works again and every completed checkpoint is intact.
#[test]
fn a_full_state_directory_fails_writes_not_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let small = SmallFs::new(dir.path().join("small"), "24m");
    let store = dir.path().join("store");
    let state = small.path.join("state");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let args = [
        "--backend",
        "A/0",
        "--state",
        state.to_str().unwrap(),
        "--retain",
        "10",
    ];
    let m = Mounted::at(&store, &mnt, &args);
    load(&m, "A/0", 0..500, 1000).unwrap();
    let first = m.checkpoint();
    let first_copy = scan(&m.mnt.join(format!("cp-{first}/A/0")));
    let failure = load(&m, "A/0", 500..60_000, 1000)
        .and_then(|_| {
            // Memtables may still hold everything: a flush must hit the disk.
            let mut ctl = Ctl::open(&m);
            ctl.send("flush A/0\n")?;
            let answer = ctl.answer();
            if answer["ok"] == true {
                Ok(())
            } else {
                Err(std::io::Error::other(answer.to_string()))
            }
        })
        .expect_err("60 MB fit into a 24 MB state directory");
    assert!(
        failure.to_string().contains("No space") || failure.to_string().contains("space"),
        "{failure}"
    );
    // Still serving: status, listing and reading checkpoints.
    assert_eq!(m.checkpoint_ids(), vec![first]);
    assert_eq!(scan(&m.mnt.join(format!("cp-{first}/A/0"))), first_copy);
    small.resize("256m");
    m.umount();
    m.mount(&[]);
    m.put("A/0", "after", "room");
    let id = m.checkpoint();
    let copy = scan(&m.mnt.join(format!("cp-{id}/A/0")));
    assert!(copy.contains_key(b"after".as_slice()));
    assert_eq!(scan(&m.mnt.join(format!("cp-{first}/A/0"))), first_copy);
}

fn proc_count(pid: i64, what: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/{what}"))
        .unwrap()
        .count()
}

/// Open file descriptors of a process, not counting RocksDB's open SST files: RocksDB
/// keeps every live SST open (its table cache), so their number follows the SST count at
/// that instant (compactions, small-file merges), not a leak of ours.
fn fds_besides_ssts(pid: i64) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.extension().is_none_or(|x| x != "sst"))
        .count()
}

/// Concurrency soak: a writer, periodic checkpoints (--interval 200ms), readers copying
/// checkpoints out and checking them, drops of random checkpoints, retain changes, fsck
/// and graph against the live store, for CKPTFS_SOAK_SECS (60 by default). No reader ever
/// sees wrong data, the store is consistent at the end, no thread or fd leaks.
#[test]
fn soak_writers_checkpoints_readers_and_drops() {
    let secs: u64 = std::env::var("CKPTFS_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let m = Mounted::new(&[
        "--backend",
        "A/0",
        "--backend",
        "B/0",
        "--interval",
        "200ms",
        "--retain",
        "5",
    ]);
    let pid = m.status()["pid"].as_i64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let (threads_before, fds_before) = (proc_count(pid, "task"), fds_besides_ssts(pid));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let copies = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failed_copies = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::scope(|scope| {
        // Writer: key w-N and counter=N in one atomic batch per backend.
        scope.spawn(|| {
            let mut ctl = Ctl::open(&m);
            let mut n = 0u64;
            while Instant::now() < deadline {
                ctl.send(&format!(
                    "put A/0 w-{n:08} {n}\nput A/0 counter {n}\nput B/0 w-{n:08} {n}\nput B/0 counter {n}\n"
                ))
                .unwrap();
                for _ in 0..4 {
                    assert_eq!(ctl.answer()["ok"], true);
                }
                n += 1;
            }
        });
        // Readers: copy the newest checkpoint out and check it is one consistent state.
        for reader in 0..2 {
            let (m, stop, copies, failed) = (&m, &stop, copies.clone(), failed_copies.clone());
            scope.spawn(move || {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    i += 1;
                    let Ok(target) = std::fs::read_link(m.mnt.join("latest")) else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    let dest = m.root.join(format!("soak-{reader}-{i}"));
                    let status = Command::new("cp")
                        .arg("-r")
                        .arg(m.mnt.join(&target))
                        .arg(&dest)
                        .stderr(std::process::Stdio::null())
                        .status()
                        .unwrap();
                    if !status.success() {
                        failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let _ = std::fs::remove_dir_all(&dest);
                        continue;
                    }
                    for backend in ["A/0", "B/0"] {
                        let data = scan(&dest.join(backend));
                        let Some(counter) = data.get(b"counter".as_slice()) else {
                            assert!(
                                data.is_empty(),
                                "{target:?} {backend}: data without counter"
                            );
                            continue;
                        };
                        let c: u64 = String::from_utf8_lossy(counter).parse().unwrap();
                        assert_eq!(
                            data.len() as u64,
                            c + 2,
                            "{target:?} {backend}: not one state"
                        );
                        for n in 0..=c {
                            assert_eq!(
                                data.get(format!("w-{n:08}").as_bytes())
                                    .map(|v| v.as_slice()),
                                Some(n.to_string().as_bytes()),
                                "{target:?} {backend}: w-{n}"
                            );
                        }
                    }
                    copies.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::fs::remove_dir_all(&dest).unwrap();
                }
            });
        }
        // Drops, retain changes, fsck and graph against the live store.
        scope.spawn(|| {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                std::thread::sleep(Duration::from_millis(300));
                let ids = m.checkpoint_ids();
                if ids.len() > 1 {
                    let _ = std::fs::remove_dir(
                        m.mnt.join(format!("cp-{}", ids[(i as usize) % ids.len()])),
                    );
                }
                if i.is_multiple_of(5) {
                    let mut ctl = Ctl::open(&m);
                    ctl.send(&format!("retain {}\n", 3 + i % 6)).unwrap();
                    assert_eq!(ctl.answer()["ok"], true);
                }
                if i.is_multiple_of(7) {
                    let out = ckptfs(&["fsck", m.store.to_str().unwrap()]);
                    assert!(
                        String::from_utf8_lossy(&out.stderr).contains("in use"),
                        "fsck ran against a live daemon"
                    );
                    ok(ckptfs(&[
                        "graph",
                        m.store.to_str().unwrap(),
                        "--format",
                        "dot",
                    ]));
                }
            }
        });
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    // Quiesce: no more periodic checkpoints in flight when counting (their workers end
    // with them: on a loaded machine that takes longer than half a second).
    let settled = std::time::Instant::now() + Duration::from_secs(10);
    std::thread::sleep(Duration::from_millis(500));
    while proc_count(pid, "task") > threads_before + 2 && std::time::Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(100));
    }
    let (threads_after, fds_after) = (proc_count(pid, "task"), fds_besides_ssts(pid));
    let copies = copies.load(std::sync::atomic::Ordering::SeqCst);
    let failed = failed_copies.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "soak {secs}s: {copies} verified copies, {failed} copies failed loudly (dropped), \
         {} checkpoints retained; threads {threads_before} -> {threads_after}, fds {fds_before} -> {fds_after}",
        m.checkpoint_ids().len()
    );
    assert!(copies > 0, "no copy completed");
    assert!(
        threads_after <= threads_before + 2,
        "threads {threads_before} -> {threads_after}"
    );
    assert!(
        fds_after <= fds_before + 8,
        "fds {fds_before} -> {fds_after}"
    );
    m.umount();
    let report = ckptfs(&["fsck", m.store.to_str().unwrap(), "--json"]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stdout)
    );
}
