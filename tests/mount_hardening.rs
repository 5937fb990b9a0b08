//! Regression tests on real mounts for defects that lost, misplaced or exposed data
//! (issue 7); each failed before its fix.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::mounted::*;

fn daemon_pid(m: &Mounted) -> i32 {
    m.status()["pid"].as_i64().unwrap() as i32
}

fn threads_of(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// Defect 3: nothing in the store or the state directory is readable by another user,
/// including what RocksDB creates; defect 12: the daemon runs in / with umask 077.
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

/// Defect 6: checkpoint requests that find no free slot are answered busy at once; they do
/// not queue a thread each (and unmount has nothing to wait for).
#[test]
fn checkpoint_requests_never_pile_up() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "100"]);
    m.load_keys("A/0", 40_000);
    let pid = daemon_pid(&m);
    let baseline = threads_of(pid);
    let ctl = m.mnt.join(".ckptfs/ctl");
    let script = format!(
        "for i in $(seq 50); do echo checkpoint > {0}; done; ls /proc/{pid}/task | wc -l",
        ctl.display()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    let threads: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        threads <= baseline + 2,
        "{threads} threads after 50 requests (baseline {baseline})"
    );
    let started = Instant::now();
    m.umount();
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Defect 10: a daemon killed with SIGKILL leaves a dead mount; the next mount detaches it
/// by itself (as systemd's Restart=on-failure needs) and brings back every checkpoint.
#[test]
fn a_mount_after_a_killed_daemon_clears_the_dead_mount() {
    let m = Mounted::new(&["--backend", "A/0"]);
    m.put("A/0", "k", "v");
    let id = m.checkpoint();
    let pid = nix::unistd::Pid::from_raw(daemon_pid(&m));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while nix::sys::signal::kill(pid, None).is_ok() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// Defect 11: `cp -r` racing with the drop of the checkpoint it copies either copies all
/// of it or fails; it never succeeds with part of it.
#[test]
fn a_copy_racing_a_drop_is_whole_or_fails() {
    let m = Mounted::new(&["--backend", "a/0", "--backend", "b/0", "--retain", "1000"]);
    let mut ctl = Ctl::open(&m);
    for backend in ["a/0", "b/0"] {
        let lines: String = (0..3000)
            .map(|i| format!("put {backend} key{i:05} {}\n", "v".repeat(100)))
            .collect();
        ctl.send(&lines).unwrap();
        for _ in 0..3000 {
            assert_eq!(ctl.answer()["ok"], true);
        }
        ctl.send(&format!("flush {backend}\n")).unwrap();
        assert_eq!(ctl.answer()["ok"], true);
    }
    let iterations: u64 = std::env::var("CKPTFS_RACE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let (mut whole, mut failed) = (0, 0);
    for i in 0..iterations {
        ctl.send(&format!("put a/0 round {i}\ncheckpoint\n"))
            .unwrap();
        assert_eq!(ctl.answer()["ok"], true);
        let id = ctl.answer()["id"].as_u64().unwrap();
        let manifest = m.manifest(id);
        let dest = m.root.join(format!("copy-{i}"));
        let src = m.mnt.join(format!("cp-{id}"));
        let mut cp = Command::new("cp")
            .arg("-r")
            .arg(&src)
            .arg(&dest)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros((i * 3967) % 30_000));
        let _ = std::fs::remove_dir(&src);
        let status = cp.wait().unwrap();
        if !status.success() {
            failed += 1;
            continue;
        }
        whole += 1;
        for backend in manifest["backends"].as_array().unwrap() {
            let dir = dest.join(backend["name"].as_str().unwrap());
            for f in backend["files"].as_array().unwrap() {
                let path = dir.join(f["name"].as_str().unwrap());
                let len = std::fs::metadata(&path)
                    .unwrap_or_else(|e| panic!("cp succeeded without {}: {e}", path.display()))
                    .len();
                assert_eq!(len, f["size"].as_u64().unwrap(), "{}", path.display());
            }
        }
        let names: Vec<_> = std::fs::read_dir(&dest).unwrap().collect();
        assert_eq!(names.len(), 2, "cp succeeded with {names:?}");
    }
    eprintln!("copy/drop races: {whole} whole copies, {failed} loud failures");
}

/// Review finding: the kernel releases a closed directory asynchronously, so `ls cp-N`
/// followed at once by `rmdir cp-N` must not fail with EBUSY.
#[test]
fn rmdir_right_after_a_listing_succeeds() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "100"]);
    let ids: Vec<u64> = (0..20).map(|_| m.checkpoint()).collect();
    for id in ids {
        let dir = m.mnt.join(format!("cp-{id}"));
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("ls {0} >/dev/null && rmdir {0}", dir.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(m.checkpoint_ids().is_empty());
}
