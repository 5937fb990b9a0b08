//! Apache Flink's own checkpoints (`ckptfs import-flink`), from the fixture of a real
//! Flink 2.3 job (tests/fixtures/flink/job1, made by scripts/make-flink-fixtures): each
//! completed checkpoint becomes a ckptfs checkpoint whose subtask directories Debian's ldb
//! opens with every column family holding what the job wrote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::mounted::{ckptfs, ok, Mounted};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flink/job1")
}

/// `checkpoint N state OP CF subtask S entries E` lines of EXPECTED: (N, OP, S, CF) -> E.
fn expected() -> BTreeMap<(u64, String, u32, String), usize> {
    std::fs::read_to_string(fixture().join("EXPECTED"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 9 && w[0] == "checkpoint" && w[2] == "state").then(|| {
                (
                    (
                        w[1].parse().unwrap(),
                        w[3].to_string(),
                        w[6].parse().unwrap(),
                        w[4].to_string(),
                    ),
                    w[8].parse().unwrap(),
                )
            })
        })
        .collect()
}

/// Entries of one column family, as Debian's ldb (RocksDB 7.8) reads them.
fn ldb_entries(db: &Path, cf: &str) -> usize {
    let out = Command::new("ldb")
        .arg(format!("--db={}", db.display()))
        .args([
            "--try_load_options",
            "--ignore_unknown_options",
            "--hex",
            "scan",
        ])
        .arg(format!("--column_family={cf}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ldb {}: {}",
        db.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn a_flink_jobs_checkpoints_are_imported_labelled_and_open_in_ldb() {
    let dir = tempfile::tempdir().unwrap();
    // A moved copy, under another name: the paths in _metadata point elsewhere.
    let src = dir.path().join("copied-job");
    cp_a(&fixture(), &src);
    let store = dir.path().join("store");
    let args = [
        "import-flink",
        src.to_str().unwrap(),
        store.to_str().unwrap(),
    ];
    let ids: Vec<u64> = ok(ckptfs(&args))
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    // Twice: nothing new.
    assert_eq!(ok(ckptfs(&args)), "");

    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&ok(ckptfs(&["ls", store.to_str().unwrap(), "--json"]))).unwrap();
    let labels: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["flink"]["job"].as_str().unwrap().to_string(),
                r["flink"]["checkpoint"].as_u64().unwrap(),
            )
        })
        .collect();
    let job = "a312c9034e3e0d2016dae60431b4c9dc".to_string();
    assert_eq!(
        labels,
        [(job.clone(), 4), (job.clone(), 5), (job.clone(), 6)]
    );

    // Through a mount: cp -r of every subtask, opened by ldb, every column family as the
    // job wrote it. `counter` is the operator's uid; the other keyed operator has none.
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &[]);
    let status = m.status();
    assert_eq!(status["backends"], serde_json::json!([]));
    assert_eq!(status["external"].as_array().unwrap().len(), 4, "{status}");
    let expected = expected();
    let mut checked = 0;
    for (id, flink_checkpoint) in ids.iter().zip([4u64, 5, 6]) {
        let tree = mnt.join(format!("cp-{id}"));
        let mut operators: Vec<String> = std::fs::read_dir(&tree)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        operators.sort();
        assert_eq!(operators.len(), 2, "{operators:?}");
        assert!(operators.contains(&"counter".to_string()));
        for operator in &operators {
            let name = if operator == "counter" {
                "counter"
            } else {
                assert_eq!(operator.len(), 32, "an operator without uid: its id");
                "totals"
            };
            for subtask in 0..2u32 {
                let out = dir.path().join(format!("out-{id}-{operator}-{subtask}"));
                assert!(Command::new("cp")
                    .arg("-r")
                    .arg(tree.join(operator).join(subtask.to_string()))
                    .arg(&out)
                    .status()
                    .unwrap()
                    .success());
                assert!(out.join("FLINK-KEYED-META").is_file());
                for ((n, op, s, cf), entries) in &expected {
                    if *n == flink_checkpoint && op == name && *s == subtask {
                        assert_eq!(
                            ldb_entries(&out, cf),
                            *entries,
                            "checkpoint {n} {op} subtask {s} column family {cf}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, expected.len());
    m.umount();
}

#[test]
fn what_is_no_flink_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = ckptfs(&[
        "import-flink",
        empty.to_str().unwrap(),
        store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Flink job"));

    // A damaged _metadata: refused, naming the checkpoint; the store is not created.
    let src = dir.path().join("job");
    cp_a(&fixture(), &src);
    let metadata = src.join("chk-4/_metadata");
    let bytes = std::fs::read(&metadata).unwrap();
    std::fs::write(&metadata, &bytes[..bytes.len() / 3]).unwrap();
    let out = ckptfs(&[
        "import-flink",
        src.to_str().unwrap(),
        store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("Flink checkpoint 4"), "{e}");
    assert!(!store.exists());
}

/// Copy `from` (a file or directory) to `to` with `cp -a`.
fn cp_a(from: &Path, to: &Path) {
    assert!(Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success());
}

/// The Flink labels of the retained checkpoints, oldest first.
fn labels(m: &Mounted) -> Vec<u64> {
    std::fs::read_to_string(m.mnt.join(".ckptfs/checkpoints"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["flink"]["checkpoint"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

/// Wait up to 20 s for `done` (the follower looks every 2 s).
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited in vain for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `mount --flink SRC` follows a job: each checkpoint that completes (its _metadata
/// appears) is imported within seconds; one that cannot be read is reported in status and
/// does not hold back the next.
#[test]
fn a_daemon_follows_a_jobs_checkpoints_as_they_complete() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("a312c9034e3e0d2016dae60431b4c9dc");
    std::fs::create_dir(&job).unwrap();
    cp_a(&fixture().join("shared"), &job);
    // In flight: no _metadata yet.
    std::fs::create_dir(job.join("chk-4")).unwrap();
    let store = dir.path().join("store");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &["--flink", job.to_str().unwrap()]);
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(labels(&m), Vec::<u64>::new());
    assert_eq!(m.status()["backends"], serde_json::json!([]));

    // Completed: its _metadata appears.
    std::fs::copy(
        fixture().join("chk-4/_metadata"),
        job.join("chk-4/_metadata"),
    )
    .unwrap();
    wait_for("checkpoint 4", || labels(&m) == [4]);

    // A damaged checkpoint, then a good one: the good one is imported all the same.
    std::fs::create_dir(job.join("chk-5")).unwrap();
    std::fs::write(job.join("chk-5/_metadata"), b"\x49\x60\x67\x2d\0\0\0\x06").unwrap();
    cp_a(&fixture().join("chk-6"), &job.join("chk-6"));
    wait_for("checkpoint 6", || labels(&m) == [4, 6]);
    let status = m.status();
    let error = status["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("checkpoint 5 of Flink job"), "{status}");
    assert_eq!(status["external"].as_array().unwrap().len(), 4, "{status}");
    // Flink deletes what it no longer retains: the store keeps it.
    std::fs::remove_dir_all(job.join("chk-4")).unwrap();
    let out = dir.path().join("out");
    cp_a(&mnt.join("cp-1/counter/0"), &out);
    assert_eq!(ldb_entries(&out, "count"), 21);
    m.umount();
}

/// `StateJob --expected` for `records` records: (operator name, column family, subtask) ->
/// entries.
fn job_expected(classpath: &str, records: u64) -> BTreeMap<(String, String, u32), usize> {
    let out = Command::new("java")
        .args(["-cp", classpath, "StateJob", "--expected", "--keys", "50"])
        .args(["--records", &records.to_string()])
        .args(["--parallelism", "2", "--max-parallelism", "128"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 7 && w[0] == "state").then(|| {
                (
                    (w[1].to_string(), w[2].to_string(), w[4].parse().unwrap()),
                    w[6].parse().unwrap(),
                )
            })
        })
        .collect()
}

/// A real Flink 2.3 job (tests/flink/StateJob.java on a local mini cluster, RocksDB
/// incremental checkpoints every second) followed by `mount --flink`: its checkpoints are
/// imported while it runs, and the newest one, taken after the job's last record, holds in
/// every column family of every subtask what the job wrote (Debian's ldb counts).
#[test]
fn a_running_flink_job_is_followed_and_its_state_reads_back() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let (ck, store, mnt) = (
        dir.path().join("ck"),
        dir.path().join("store"),
        dir.path().join("mnt"),
    );
    std::fs::create_dir_all(&ck).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    // Following the checkpoint root before the job has made its directory.
    let m = Mounted::at(&store, &mnt, &["--flink", ck.to_str().unwrap()]);
    let records = 600u64;
    let mut job = Command::new("java")
        .args(["-Xmx768m", "-cp", &classpath, "StateJob"])
        .arg(&ck)
        .args([
            "--keys",
            "50",
            "--records",
            &records.to_string(),
            "--rate",
            "300",
        ])
        .args([
            "--interval-ms",
            "1000",
            "--retained",
            "2",
            "--parallelism",
            "2",
        ])
        .args(["--max-parallelism", "128", "--inline-threshold", "2048"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The first checkpoint whose snapshot holds every record, once complete.
    let mut idle = None;
    let mut lines = std::io::BufReader::new(job.stdout.take().unwrap()).lines();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let mut last_record_snapshots = Vec::new();
    while idle.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the job made no idle checkpoint"
        );
        let Some(Ok(line)) = lines.next() else {
            let _ = job.kill();
            panic!("the Flink job ended early");
        };
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["snapshot", n, "records", m] if m.parse::<u64>() == Ok(records) => {
                last_record_snapshots.push(n.parse::<u64>().unwrap())
            }
            ["complete", n] if last_record_snapshots.contains(&n.parse().unwrap()) => {
                idle = Some(n.parse::<u64>().unwrap())
            }
            _ => {}
        }
    }
    let idle = idle.unwrap();
    wait_for("the idle checkpoint imported", || {
        labels(&m).contains(&idle)
    });
    let _ = job.kill();
    let _ = job.wait();
    let imported = labels(&m);
    assert!(imported.len() >= 2, "{imported:?}");
    let id = imported.iter().position(|c| *c == idle).unwrap() + 1;
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(mnt.join(".ckptfs/checkpoints"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cp = rows[id - 1]["id"].as_u64().unwrap();
    let expected = job_expected(&classpath, records);
    let mut checked = 0;
    let tree = mnt.join(format!("cp-{cp}"));
    for operator in std::fs::read_dir(&tree).unwrap() {
        let operator = operator.unwrap().file_name().into_string().unwrap();
        let name = if operator == "counter" {
            "counter"
        } else {
            "totals"
        };
        for subtask in 0..2u32 {
            let out = dir.path().join(format!("out-{operator}-{subtask}"));
            cp_a(&tree.join(&operator).join(subtask.to_string()), &out);
            for ((op, cf, s), entries) in &expected {
                if op == name && *s == subtask {
                    assert_eq!(ldb_entries(&out, cf), *entries, "{op} {cf} subtask {s}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, expected.len());
    m.umount();
}
