//! The control file: lines answered in order, bad writes refused whole, hostile input
//! changing nothing, checkpoint requests that find no slot answered at once, `load`.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::mounted::*;

/// Opens ctl read-write and talks the protocol: write lines, read answer lines.
#[test]
fn the_control_protocol_answers_in_order_and_refuses_bad_writes_whole() {
    // The third checkpoint's asynchronous phase waits 3 s (a failpoint's sleep), so that
    // the request after it surely finds the only slot taken, however fast the machine.
    let m = Mounted::with_env(
        &["--backend", "A/0", "--backend", "B/0"],
        &[(
            "FAILPOINTS",
            "checkpoint::after-sync=2*off->1*sleep(3000)->off",
        )],
    );
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

    // Every error path: the write fails with EINVAL, nothing changes, the error is the
    // answer, with the rule's own errno (EINVAL for what cannot be parsed, ENOENT for what
    // is not there: the engine's).
    for (bad, needle, errno) in [
        (
            "put A/0 applied? no\nbogus\n",
            "unknown command",
            libc::EINVAL,
        ),
        (
            "put C/0 k v\n",
            "no such backend: C/0 (hosted: A/0, B/0)",
            libc::ENOENT,
        ),
        ("put A/0 k\n", "takes 3", libc::EINVAL),
        ("put A/0 k%2 v\n", "percent-escape", libc::EINVAL),
        ("retain 0\n", "at least 1", libc::EINVAL),
        ("delete 999\n", "no such checkpoint: 999", libc::ENOENT),
        (
            "put A/0 k v\ndelete 999\n",
            "command 2: no such checkpoint: 999",
            libc::ENOENT,
        ),
        ("put ../0 k v\n", "invalid backend name", libc::EINVAL),
        // The engine's one rule for an import into a hosted backend, with its line.
        (
            "put A/0 k v\nimport B/0 /tmp\n",
            "command 2: backend B/0 is hosted (a daemon of this store runs its RocksDB): \
             import into another name",
            libc::EINVAL,
        ),
        ("checkpoint now\n", "takes 0", libc::EINVAL),
    ] {
        let err = ctl.send(bad).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{bad:?}");
        let answer = ctl.answer();
        assert_eq!(answer["ok"], false);
        assert_eq!(answer["errno"], errno, "{bad:?}: {answer}");
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

fn threads_of(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// Checkpoint requests that find no free slot are answered busy at once; they do
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
    // The one checkpoint in flight may run its own thread, its backend's staging beside
    // the reservation, and four copies at once: never a thread per request.
    assert!(
        threads <= baseline + 7,
        "{threads} threads after 50 requests (baseline {baseline})"
    );
    let started = Instant::now();
    m.umount();
    assert!(started.elapsed() < Duration::from_secs(60));
}
