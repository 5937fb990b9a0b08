//! Faults around a live mount (issue 7's campaign): a full disk under the store and under
//! the state directory, hostile control input, and a daemon killed after acknowledging
//! writes.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::mounted::*;

/// A size-limited tmpfs that fills like a real disk; unmounted on drop.
struct SmallFs {
    path: PathBuf,
}

impl SmallFs {
    fn new(path: PathBuf, size: &str) -> SmallFs {
        std::fs::create_dir_all(&path).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs");
        SmallFs { path }
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(status.success(), "remount tmpfs");
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Values that do not compress, so their size on disk is what was written.
fn noise(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

fn load(
    m: &Mounted,
    backend: &str,
    keys: std::ops::Range<u32>,
    value_len: usize,
) -> std::io::Result<()> {
    let mut ctl = Ctl::open(m);
    for chunk in keys.collect::<Vec<_>>().chunks(200) {
        let lines: String = chunk
            .iter()
            .map(|k| format!("put {backend} key{k:07} {}\n", noise(*k as u64, value_len)))
            .collect();
        ctl.send(&lines)?;
        for _ in chunk {
            let answer = ctl.answer();
            if answer["ok"] != true {
                return Err(std::io::Error::other(answer.to_string()));
            }
        }
    }
    Ok(())
}

fn store_files(store: &Path, sub: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![store.join(sub)];
    while let Some(dir) = pending.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                pending.push(p);
            } else {
                out.push(p.strip_prefix(store).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// The store's filesystem fills during an upload: the checkpoint fails with a clear answer
/// and status, leaves no partial object or manifest, earlier checkpoints stay intact, the
/// daemon keeps serving, and once there is room again the next checkpoint succeeds.
#[test]
fn a_full_store_fails_the_checkpoint_cleanly_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let small = SmallFs::new(dir.path().join("small"), "8m");
    let store = small.path.join("store");
    let state = dir.path().join("state");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(
        &store,
        &mnt,
        &[
            "--backend",
            "A/0",
            "--state",
            state.to_str().unwrap(),
            "--retain",
            "10",
        ],
    );
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
    let report = ckptfs(&["fsck", store.to_str().unwrap()]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stdout)
    );
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

/// Hostile control input: >= 10,000 writes of random bytes, overlong and badly encoded
/// lines, huge numbers and every command with wrong arities, each with valid lines around
/// it. Every write fails with EINVAL and changes nothing; the daemon stays up and its
/// memory bounded.
#[test]
fn hostile_control_writes_are_refused_whole_and_change_nothing() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "5"]);
    m.put("A/0", "k", "v");
    let id = m.checkpoint();
    let pid = m.status()["pid"].as_i64().unwrap();
    let rss = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    let rss_before = rss();
    let writes: u64 = std::env::var("CKPTFS_HOSTILE_WRITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let bad_lines: &[&str] = &[
        "put A/0 k",
        "put A/0 k v extra",
        "put A/0",
        "put",
        "del A/0",
        "del A/0 k x",
        "del",
        "checkpoint now",
        "flush",
        "flush A/0 x",
        "compact",
        "compact A/0 A/0",
        "retain",
        "retain 1 2",
        "retain 0",
        "retain -1",
        "retain 99999999999999999999999",
        "retain 1e3",
        "delete",
        "delete x",
        "delete 18446744073709551616",
        "delete 424242",
        "delete -0",
        "put ../0 k v",
        "put A/01 k v",
        "put A/0/1 k v",
        "put /0 k v",
        "flush B/9",
        "compact Z/0",
        "put A/0 %zz v",
        "put A/0 k %",
        "put A/0 k %4",
        "put A/0  k v",
        "put A/0 k v ",
        " checkpoint",
        "checkpoint\r",
        "CHECKPOINT",
        "put\tA/0\tk\tv",
        "\u{0}",
        "checkpoint\u{0}",
        "ckeckpoint",
        "retain +3",
        "retain ３",
    ];
    // One write-only and one reading handle: both must refuse.
    let mut wo = std::fs::OpenOptions::new()
        .write(true)
        .open(m.mnt.join(".ckptfs/ctl"))
        .unwrap();
    let mut rw = Ctl::open(&m);
    let started = Instant::now();
    for i in 0..writes {
        let mut data: Vec<u8> = Vec::new();
        for _ in 0..rand(3) {
            data.extend_from_slice(format!("put A/0 fuzz-{i} value\n").as_bytes());
        }
        match rand(4) {
            0 => {
                let len = 1 + rand(300) as usize;
                let mut junk: Vec<u8> = (0..len).map(|_| rand(256) as u8).collect();
                junk[rand(len as u64) as usize] = 0xff; // never valid UTF-8
                data.extend_from_slice(&junk);
            }
            1 => {
                data.extend_from_slice(format!("put A/0 k{} v", rand(1000)).as_bytes());
                data.extend_from_slice(&[0xc3, 0x28]); // an invalid UTF-8 sequence
            }
            _ => {
                data.extend_from_slice(bad_lines[rand(bad_lines.len() as u64) as usize].as_bytes())
            }
        }
        data.push(b'\n');
        if rand(2) == 0 {
            data.extend_from_slice(b"retain 1\ncheckpoint\n");
        }
        let result = if i % 2 == 0 {
            wo.write(&data)
        } else {
            rw.0.write(&data)
        };
        let errno = result.err().and_then(|e| e.raw_os_error());
        assert_eq!(
            errno,
            Some(libc::EINVAL),
            "write {i} was not refused: {:?}",
            String::from_utf8_lossy(&data)
        );
        if i % 2 == 1 {
            assert_eq!(rw.answer()["ok"], false);
        }
    }
    let elapsed = started.elapsed();
    // Overlong lines: refused once past the limit, and the handle works on.
    let long = vec![b'x'; 5 << 20];
    let mut refused = false;
    for chunk in long.chunks(1 << 20) {
        if rw.0.write_all(chunk).is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused, "an endless line was accepted");
    let _ = rw.answer();
    assert_eq!(
        m.checkpoint_ids(),
        vec![id],
        "a refused write changed checkpoints"
    );
    assert_eq!(m.status()["retain"], 5);
    let next = m.checkpoint();
    let copy = scan(&m.mnt.join(format!("cp-{next}/A/0")));
    assert_eq!(copy, kv(&[("k", "v")]), "a refused write changed data");
    let rss_after = rss();
    eprintln!(
        "{writes} hostile writes in {:.1}s; daemon RSS {rss_before} kB -> {rss_after} kB",
        elapsed.as_secs_f64()
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} to {rss_after} kB"
    );
}

/// Acknowledged writes: a put answered ok is in RocksDB's write-ahead log before the
/// answer, so it survives the daemon being killed (not a power loss; see the README).
#[test]
fn an_acknowledged_put_survives_a_killed_daemon() {
    let m = Mounted::new(&["--backend", "A/0"]);
    m.put("A/0", "before", "checkpoint");
    m.checkpoint();
    for i in 0..50 {
        m.put("A/0", &format!("acked-{i}"), "yes");
    }
    let pid = nix::unistd::Pid::from_raw(m.status()["pid"].as_i64().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while nix::sys::signal::kill(pid, None).is_ok() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
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
                if i % 5 == 0 {
                    let mut ctl = Ctl::open(&m);
                    ctl.send(&format!("retain {}\n", 3 + i % 6)).unwrap();
                    assert_eq!(ctl.answer()["ok"], true);
                }
                if i % 7 == 0 {
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
    // Quiesce: no more periodic checkpoints in flight when counting.
    std::thread::sleep(Duration::from_millis(500));
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

/// The objects a manifest (as JSON) references for one backend, by file name (files stored
/// whole: SSTs).
fn objects_of(manifest: &serde_json::Value, backend: &str) -> Vec<(String, String)> {
    manifest["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["name"] == backend)
        .flat_map(|b| b["files"].as_array().unwrap().clone())
        .filter(|f| f["chunks"].is_null())
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["object"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn object_path(store: &Path, hex: &str) -> PathBuf {
    store.join("objects").join(&hex[..2]).join(hex)
}

/// Corruption: a flipped byte, a truncated object, a missing object and a truncated
/// manifest. Reads fail with EIO (logged with the object and the checkpoint's path), `cp -r`
/// of a damaged checkpoint fails, the undamaged one copies whole, fsck names every fault,
/// and `fsck --repair` stores the objects again from the live RocksDB files (identical
/// copies), quarantines the manifest, and reports what it could not repair.
#[test]
fn corruption_is_detected_contained_and_repaired_from_copies() {
    let args = [
        "--backend",
        "A/0",
        "--backend",
        "B/0",
        "--retain",
        "10",
        // Keep every SST alive in the live database, so that copies exist to repair from.
        "--rocksdb-options",
        "disable_auto_compactions=true",
    ];
    let m = Mounted::new(&args);
    let mut ids = Vec::new();
    for round in 0..5u32 {
        load(&m, "A/0", round * 300..(round + 1) * 300, 200).unwrap();
        let mut ctl = Ctl::open(&m);
        ctl.send("flush A/0\n").unwrap();
        assert_eq!(ctl.answer()["ok"], true);
        if round == 0 {
            load(&m, "B/0", 0..300, 200).unwrap();
        }
        ids.push(m.checkpoint());
    }
    let cp1_copy = scan(&m.mnt.join(format!("cp-{}/A/0", ids[0])));
    m.umount();
    // The SST that first appears in checkpoint k (index k-1) of A/0.
    let new_sst = |k: usize| -> String {
        let before: Vec<_> = objects_of(&m.manifest(ids[k - 1]), "A/0");
        objects_of(&m.manifest(ids[k]), "A/0")
            .into_iter()
            .find(|(name, obj)| name.ends_with(".sst") && !before.iter().any(|(_, o)| o == obj))
            .unwrap()
            .1
    };
    let (flipped, truncated, missing) = (new_sst(1), new_sst(2), new_sst(3));
    // A private file of checkpoint 3 that the live database no longer has as it was.
    // Stored as chunks: one that no other checkpoint shares (a MANIFEST that only grew
    // shares its full chunks with the checkpoints after it).
    let manifest_chunks = |id: u64| -> Vec<String> {
        let manifest = m.manifest(id);
        let backend = manifest["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == "A/0")
            .unwrap()
            .clone();
        let file = backend["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"].as_str().unwrap().starts_with("MANIFEST"))
            .unwrap()
            .clone();
        match file["chunks"]["ids"].as_array() {
            Some(ids) => ids
                .iter()
                .map(|i| i.as_str().unwrap().to_string())
                .collect(),
            None => vec![file["object"].as_str().unwrap().to_string()],
        }
    };
    let shared: std::collections::BTreeSet<String> = ids
        .iter()
        .filter(|id| **id != ids[2])
        .flat_map(|id| manifest_chunks(*id))
        .collect();
    let manifest_obj = manifest_chunks(ids[2])
        .into_iter()
        .rev()
        .find(|c| !shared.contains(c))
        .expect("a chunk only checkpoint 3 has");
    let mut bytes = std::fs::read(object_path(&m.store, &flipped)).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(object_path(&m.store, &flipped), &bytes).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(object_path(&m.store, &truncated))
        .unwrap();
    f.set_len(100).unwrap();
    std::fs::remove_file(object_path(&m.store, &missing)).unwrap();
    let mut bytes = std::fs::read(object_path(&m.store, &manifest_obj)).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(object_path(&m.store, &manifest_obj), &bytes).unwrap();
    let last = m.store.join(format!("checkpoints/{}.json", ids[4]));
    let text = std::fs::read(&last).unwrap();
    std::fs::write(&last, &text[..text.len() / 2]).unwrap();

    // The mount comes up without the unreadable checkpoint and says so.
    m.mount(&[]);
    assert_eq!(m.checkpoint_ids(), ids[..4].to_vec());
    assert!(m.status()["last_error"]
        .as_str()
        .unwrap()
        .contains(&format!("{}.json", ids[4])));
    // Reading a corrupt object is EIO, logged with the object and where it is served.
    let file = objects_of(&m.manifest(ids[1]), "A/0")
        .into_iter()
        .find(|(_, o)| *o == flipped)
        .unwrap()
        .0;
    let path = m.mnt.join(format!("cp-{}/A/0/{file}", ids[1]));
    assert_eq!(
        std::fs::read(&path).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    let log = std::fs::read_to_string(m.store.join("ckptfs.log")).unwrap();
    assert!(
        log.contains(&flipped) && log.contains(&format!("cp-{}/A/0/{file}", ids[1])),
        "the log does not name the object and its checkpoint"
    );
    // Damaged checkpoints fail to copy; the undamaged one copies whole.
    for (i, id) in ids[..4].iter().enumerate() {
        let dest = m.root.join(format!("copy-{id}"));
        assert_eq!(m.copy_out(*id, &dest), i == 0, "cp -r of cp-{id}");
    }
    assert_eq!(scan(&m.root.join(format!("copy-{}/A/0", ids[0]))), cp1_copy);
    m.umount();

    // fsck names each fault.
    let out = ckptfs(&["fsck", m.store.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = |key: &str| -> Vec<String> {
        report[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    for id in [&flipped, &truncated, &manifest_obj] {
        assert!(
            listed("corrupt").contains(id),
            "{id} not reported corrupt: {report}"
        );
    }
    assert_eq!(listed("missing"), vec![missing.clone()]);
    assert!(listed("unreadable_manifests")[0].starts_with(&format!("{}.json", ids[4])));
    assert_eq!(report["damaged_checkpoints"], serde_json::json!(ids[1..4]));
    assert!(
        report["orphans_kept"].is_string(),
        "orphans are not kept while a manifest is unreadable: {report}"
    );

    // Repair: the three SSTs come back from the live database; the MANIFEST copy cannot.
    let out = ckptfs(&["fsck", m.store.to_str().unwrap(), "--repair", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the MANIFEST object cannot be repaired"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let repaired: Vec<String> = report["repaired_objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().split(' ').next().unwrap().to_string())
        .collect();
    for id in [&flipped, &truncated, &missing] {
        assert!(repaired.contains(id), "{id} not repaired: {report}");
    }
    assert!(!repaired.contains(&manifest_obj));
    assert_eq!(report["quarantined"].as_array().unwrap().len(), 1);
    let out = ckptfs(&["fsck", m.store.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("corrupt: {manifest_obj}")), "{text}");
    assert!(text.contains("damaged checkpoints"), "{text}");

    // Checkpoints 2 and 4 copy whole again; 3 still fails (its MANIFEST copy is gone).
    m.mount(&[]);
    for (id, whole) in [(ids[1], true), (ids[2], false), (ids[3], true)] {
        let dest = m.root.join(format!("again-{id}"));
        assert_eq!(
            m.copy_out(id, &dest),
            whole,
            "cp -r of cp-{id} after repair"
        );
        if whole {
            assert_eq!(
                scan(&dest.join("A/0")).len(),
                (id as usize - ids[0] as usize + 1) * 300
            );
        }
    }
}
