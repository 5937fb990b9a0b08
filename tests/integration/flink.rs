//! Apache Flink's own checkpoints (`ckptfs import-flink`), from the fixture of a real
//! Flink 2.3 job (tests/fixtures/flink/job1, made by scripts/make-flink-fixtures): each
//! completed checkpoint becomes a ckptfs checkpoint whose subtask directories Debian's ldb
//! opens with every column family holding what the job wrote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::java::JavaTmp;
use crate::common::mounted::{ckptfs, ok, Mounted};

/// Flink's time of the fixture's checkpoint `n` as an import records it: its `_metadata`'s
/// modification time, in milliseconds since the Unix epoch.
pub(crate) fn fixture_time_ms(n: u64) -> u64 {
    let md = fixture().join(format!("chk-{n}/_metadata"));
    std::fs::metadata(md)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

pub(crate) fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flink/job1")
}

/// `checkpoint N state OP CF subtask S entries E` lines of EXPECTED: (N, OP, S, CF) -> E.
pub(crate) fn expected() -> BTreeMap<(u64, String, u32, String), usize> {
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

/// The names tests/flink/StateJob.java gives the fixture job's keyed operators
/// (`.name("counter")`, `.name("totals")`), by the directory of their backends: `counter`
/// is its uid; `totals` has none, so its operator id (tests/fixtures/flink/README.md).
pub(crate) fn operator_names() -> BTreeMap<&'static str, &'static str> {
    [
        ("counter", "counter"),
        ("e0efb6bbd58638af795020b0769bc3d6", "totals"),
    ]
    .into()
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

/// Entries of every column family, as the `rocksdb` crate (RocksDB 10) reads them: opened
/// read-only (never created), with Flink's merge operator for list state
/// (`stringappendtest`, `,` between values).
fn rocksdb_entries(db: &Path) -> BTreeMap<String, usize> {
    fn append(
        _key: &[u8],
        existing: Option<&[u8]>,
        operands: &rocksdb::MergeOperands,
    ) -> Option<Vec<u8>> {
        let mut out = existing.map(<[u8]>::to_vec);
        for op in operands {
            match &mut out {
                Some(v) => {
                    v.push(b',');
                    v.extend_from_slice(op);
                }
                None => out = Some(op.to_vec()),
            }
        }
        out
    }
    let mut options = rocksdb::Options::default();
    options.create_if_missing(false);
    let names = rocksdb::DB::list_cf(&options, db).unwrap();
    let cfs = names.iter().map(|name| {
        let mut cf = rocksdb::Options::default();
        cf.set_merge_operator_associative("stringappendtest", append);
        rocksdb::ColumnFamilyDescriptor::new(name, cf)
    });
    let opened = rocksdb::DB::open_cf_descriptors_read_only(&options, db, cfs, false)
        .unwrap_or_else(|e| panic!("rocksdb opens {}: {e}", db.display()));
    names
        .iter()
        .map(|name| {
            let cf = opened.cf_handle(name).unwrap();
            let mut count = 0;
            for item in opened.iterator_cf(&cf, rocksdb::IteratorMode::Start) {
                item.unwrap_or_else(|e| panic!("rocksdb reads {} {name}: {e}", db.display()));
                count += 1;
            }
            (name.clone(), count)
        })
        .collect()
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
    // Two operators of two subtasks, and the job's own files.
    assert_eq!(status["external"].as_array().unwrap().len(), 5, "{status}");
    let expected = expected();
    let mut checked = 0;
    for (id, flink_checkpoint) in ids.iter().zip([4u64, 5, 6]) {
        let tree = mnt.join(format!("cp-{id}"));
        let mut operators: Vec<String> = std::fs::read_dir(&tree)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        operators.sort();
        assert_eq!(operators.len(), 3, "{operators:?}");
        // Beside them, the _metadata a job restores from (naming the mount's files).
        assert!(tree.join("_metadata").is_file());
        assert_eq!(operators[0], "_flink", "{operators:?}");
        // Flink's _metadata of the checkpoint, as Flink wrote it (export-flink needs it).
        assert_eq!(
            std::fs::read(tree.join("_flink/0/_metadata")).unwrap(),
            std::fs::read(fixture().join(format!("chk-{flink_checkpoint}/_metadata"))).unwrap()
        );
        assert!(operators.contains(&"counter".to_string()));
        for operator in &operators[1..] {
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
                let by_crate = rocksdb_entries(&out);
                for ((n, op, s, cf), entries) in &expected {
                    if *n == flink_checkpoint && op == name && *s == subtask {
                        assert_eq!(
                            ldb_entries(&out, cf),
                            *entries,
                            "checkpoint {n} {op} subtask {s} column family {cf}"
                        );
                        assert_eq!(by_crate.get(cf), Some(entries), "rocksdb crate: {cf}");
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
    // One checkpoint's directory (as a savepoint's would be): said so.
    let out = ckptfs(&[
        "import-flink",
        fixture().join("chk-4").to_str().unwrap(),
        store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("savepoint") && e.contains("chk-N"), "{e}");

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

/// The file handles of the subtasks' RocksDB files in a `_metadata` (`shared/` and
/// private ones uploaded as files): where each path is in the bytes, the path, the size.
pub(crate) fn file_handles(bytes: &[u8]) -> Vec<(usize, String, u64)> {
    use ckptfs_core::flink::metadata::{self, KeyedHandle, StreamHandle};
    let mut out = Vec::new();
    for op in metadata::parse(bytes).unwrap().operators {
        for subtask in op.subtasks {
            if let Some(KeyedHandle::Incremental(h)) = subtask.managed_keyed {
                for (_, stream) in h.shared.into_iter().chain(h.private) {
                    if let StreamHandle::File { path, at, size, .. } = stream {
                        out.push((at, path, size));
                    }
                }
            }
        }
    }
    out
}

/// Copy `from` (a file or directory) to `to` with `cp -a`.
pub(crate) fn cp_a(from: &Path, to: &Path) {
    assert!(Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success());
}

/// The Flink labels of the retained checkpoints, oldest first.
pub(crate) fn labels(m: &Mounted) -> Vec<u64> {
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

/// The id of the first retained checkpoint imported from Flink checkpoint `from` or a
/// later one, of a job other than `not_job` (if given).
pub(crate) fn imported_from(mnt: &Path, from: u64, not_job: Option<&str>) -> u64 {
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(mnt.join(".ckptfs/checkpoints"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    rows.iter()
        .find(|r| {
            r["flink"]["checkpoint"].as_u64() >= Some(from)
                && not_job.is_none_or(|job| r["flink"]["job"] != job)
        })
        .and_then(|r| r["id"].as_u64())
        .unwrap_or_else(|| panic!("no checkpoint from Flink's {from} on: {rows:?}"))
}

/// Wait up to 60 s for `done` (the follower looks every second; a loaded machine slows it).
pub(crate) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited in vain for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Following a local directory, the daemon looks when inotify says a `_metadata` was
/// written or moved into place, not only at its poll: with the poll an hour apart
/// (`CKPTFS_FLINK_POLL_MS`), checkpoints written into a root the way Flink writes them (the
/// job's directory made, its files, then each `_metadata`, one copied, one renamed into
/// place) are imported as they complete; a daemon with the poll alone
/// (`CKPTFS_FLINK_POLL_ONLY`) has imported nothing meanwhile.
#[test]
fn a_local_flink_root_is_followed_by_inotify_between_polls() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    std::fs::create_dir(&root).unwrap();
    // Named by URL, as fstab lines often do.
    let url = format!("file://{}", root.display());
    let args = ["--flink", url.as_str()];
    let hour = ("CKPTFS_FLINK_POLL_MS", "3600000");
    let watched = Mounted::with_env(&args, &[hour]);
    let polled = Mounted::with_env(&args, &[hour, ("CKPTFS_FLINK_POLL_ONLY", "1")]);
    let job = root.join("a312c9034e3e0d2016dae60431b4c9dc");
    std::fs::create_dir(&job).unwrap();
    cp_a(&fixture().join("shared"), &job);
    for n in [4, 5, 6] {
        let (from, to) = (
            fixture().join(format!("chk-{n}")),
            job.join(format!("chk-{n}")),
        );
        std::fs::create_dir(&to).unwrap();
        for entry in std::fs::read_dir(&from).unwrap() {
            let name = entry.unwrap().file_name();
            if name != "_metadata" {
                std::fs::copy(from.join(&name), to.join(&name)).unwrap();
            }
        }
        if n == 5 {
            std::fs::copy(from.join("_metadata"), to.join("_metadata.inprogress")).unwrap();
            std::fs::rename(to.join("_metadata.inprogress"), to.join("_metadata")).unwrap();
        } else {
            std::fs::copy(from.join("_metadata"), to.join("_metadata")).unwrap();
        }
        wait_for(&format!("checkpoint {n} through inotify"), || {
            labels(&watched).contains(&n)
        });
    }
    assert_eq!(labels(&watched), [4, 5, 6]);
    assert_eq!(labels(&polled), Vec::<u64>::new());
    watched.umount();
    polled.umount();
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
    assert_eq!(status["external"].as_array().unwrap().len(), 5, "{status}");
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
    let tmp = JavaTmp::new();
    let out = tmp
        .java()
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

/// The Flink fixture copied to `dir/<name>`, imported into `dir/store`, its copy removed
/// (only the store has the checkpoints then), and the store mounted at `dir/mnt` with
/// `args`; with StateJob compiled: the classpath, the mountpoint and the mount.
pub(crate) fn fixture_only_in_a_mount(
    dir: &Path,
    name: &str,
    args: &[&str],
) -> (String, PathBuf, Mounted) {
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.join("classes"));
    let src = dir.join(name);
    cp_a(&fixture(), &src);
    let store = dir.join("store");
    ok(ckptfs(&[
        "import-flink",
        src.to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    std::fs::remove_dir_all(&src).unwrap();
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, args);
    (classpath, mnt, m)
}

/// A StateJob (tests/flink/StateJob.java) running on a Flink 2.3 mini cluster, its
/// stdout read line by line.
pub(crate) struct Job {
    pub(crate) child: std::process::Child,
    pub(crate) lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    /// "restored records M", if the job started from a checkpoint.
    pub(crate) restored: Option<u64>,
    /// The JVM's temporary files (its mini cluster's working directory): removed after
    /// [`Drop`] has killed it.
    _tmp: JavaTmp,
}

impl Job {
    /// StateJob writing checkpoints under `ck` (every second, 50 keys, parallelism 2,
    /// files over 2 KiB uploaded), until `records` records are out; `extra` options added.
    pub(crate) fn start(classpath: &str, ck: &Path, records: u64, extra: &[&str]) -> Job {
        let tmp = JavaTmp::new();
        let mut child = tmp
            .java()
            .args(["-Xmx768m", "-cp", classpath, "StateJob"])
            .arg(ck)
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
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::BufRead;
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Job {
            child,
            lines,
            restored: None,
            _tmp: tmp,
        }
    }

    /// The id of the first completed checkpoint whose snapshot holds `records` records.
    pub(crate) fn checkpoint_with(&mut self, records: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        let mut snapshots = Vec::new();
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "the job made no checkpoint of {records} records"
            );
            let Some(Ok(line)) = self.lines.next() else {
                let _ = self.child.kill();
                panic!("the Flink job ended early");
            };
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["restored", "records", m] => self.restored = m.parse().ok(),
                ["mismatch", ..] => panic!("the job's keyed state is wrong: {line}"),
                ["snapshot", n, "records", m] if m.parse::<u64>() == Ok(records) => {
                    snapshots.push(n.parse::<u64>().unwrap())
                }
                ["complete", n] if snapshots.contains(&n.parse().unwrap()) => {
                    return n.parse().unwrap()
                }
                _ => {}
            }
        }
    }

    /// SIGKILL: Flink keeps the retained checkpoints of a job that did not finish.
    pub(crate) fn kill(self) {
        drop(self)
    }
}

impl Drop for Job {
    /// Also when a test fails: no JVM outlives its test.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every subtask directory of `tree` (`cp-N/` of a mount) copied out and each column
/// family counted by Debian's ldb against StateJob's `--expected` figures for `records`.
pub(crate) fn check_tree(classpath: &str, tree: &Path, records: u64, scratch: &Path) {
    let expected = job_expected(classpath, records);
    let mut checked = 0;
    for operator in std::fs::read_dir(tree).unwrap() {
        let operator = operator.unwrap().file_name().into_string().unwrap();
        let name = match operator.as_str() {
            "counter" => "counter",
            "_flink" | "_metadata" => continue,
            _ => "totals",
        };
        for subtask in 0..2u32 {
            let out = scratch.join(format!("out-{operator}-{subtask}"));
            cp_a(&tree.join(&operator).join(subtask.to_string()), &out);
            let by_crate = rocksdb_entries(&out);
            for ((op, cf, s), entries) in &expected {
                if op == name && *s == subtask {
                    assert_eq!(ldb_entries(&out, cf), *entries, "{op} {cf} subtask {s}");
                    assert_eq!(by_crate.get(cf), Some(entries), "rocksdb crate: {cf}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, expected.len());
}

/// A real Flink 2.3 job (tests/flink/StateJob.java on a local mini cluster, RocksDB
/// incremental checkpoints every second) followed by `mount --flink`: its checkpoints are
/// imported while it runs, and the newest one, taken after the job's last record, holds in
/// every column family of every subtask what the job wrote (Debian's ldb counts).
#[test]
fn a_running_flink_job_is_followed_and_its_state_reads_back() {
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
    let mut job = Job::start(&classpath, &ck, records, &[]);
    // The first checkpoint whose snapshot holds every record, once complete. Every later
    // one holds the same state (the source is idle); a follower that falls behind under
    // load may find it deleted by Flink already (the job retains 2) and import later ones.
    let idle = job.checkpoint_with(records);
    wait_for("a checkpoint after the last record imported", || {
        labels(&m).iter().any(|c| *c >= idle)
    });
    job.kill();
    // Started before the job made its directory: that was no error.
    let status = m.status();
    assert!(
        !status["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("holds no Flink job"),
        "{status}"
    );
    let imported = labels(&m);
    assert!(imported.len() >= 2, "{imported:?}");
    let cp = imported_from(&mnt, idle, None);
    check_tree(
        &classpath,
        &mnt.join(format!("cp-{cp}")),
        records,
        dir.path(),
    );
    m.umount();
}

/// `ckptfs export-flink` gives a checkpoint back to Flink: checkpoint 4 of the fixture job
/// (933 records; imported from a moved copy, so no path in its _metadata is valid any
/// more), exported out of a mount, restores a real Flink job: its source goes on from
/// record 933 and every key's state from what it held, so that once 1200 records are out
/// the job's state is that of 1200 records, as if it had never stopped.
#[test]
fn an_exported_checkpoint_restores_a_flink_job_with_its_state() {
    let dir = tempfile::tempdir().unwrap();
    // Flink's files are gone: only ckptfs has them.
    let (classpath, mnt, m) = fixture_only_in_a_mount(dir.path(), "copied-job", &[]);
    let store = dir.path().join("store");
    let dest = dir.path().join("restore-from");
    let printed = ok(ckptfs(&[
        "export-flink",
        mnt.to_str().unwrap(),
        "1",
        dest.to_str().unwrap(),
    ]));
    let chk = PathBuf::from(printed.trim());
    assert_eq!(
        chk,
        dest.join("a312c9034e3e0d2016dae60431b4c9dc/chk-4"),
        "{printed}"
    );
    assert!(chk.join("_metadata").is_file());
    m.umount();

    let ck = dir.path().join("ck2");
    let mut job = Job::start(&classpath, &ck, 1200, &["--restore", chk.to_str().unwrap()]);
    let done = job.checkpoint_with(1200);
    let restored = job.restored;
    job.kill();
    assert_eq!(
        restored,
        Some(933),
        "the source starts where checkpoint 4 was"
    );
    // Into the same store: the restored job is another job (its own id and checkpoint
    // ids); the files it uploads anew under other names but with the bytes the store
    // holds (its first checkpoint after a restore is a full one) are stored once.
    let answers: Vec<serde_json::Value> = ok(ckptfs(&[
        "import-flink",
        ck.to_str().unwrap(),
        store.to_str().unwrap(),
        "--json",
    ]))
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    let first = &answers[0];
    assert!(
        first["bytes_uploaded"].as_u64() < first["bytes"].as_u64(),
        "nothing deduplicated: {first}"
    );
    let m2 = Mounted::at(&store, &mnt, &[]);
    let cp = imported_from(&mnt, done, Some("a312c9034e3e0d2016dae60431b4c9dc"));
    check_tree(&classpath, &mnt.join(format!("cp-{cp}")), 1200, dir.path());
    m2.umount();
}

/// `ckptfs import-flink SRC MOUNTPOINT`: the daemon imports (a bad checkpoint refused with
/// nothing imported, twice imports nothing new), and `export-flink` from the store read
/// directly writes a checkpoint directory whose `_metadata` names only files it holds, with
/// their sizes, relative to its own directory; what cannot be exported is refused with
/// nothing written.
#[test]
fn import_flink_through_a_mount_and_export_from_the_store() {
    use ckptfs_core::flink::metadata::{self, KeyedHandle, StreamHandle};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("job");
    cp_a(&fixture(), &src);
    let m = Mounted::new(&["--backend", "app/0"]);
    let import = |src: &Path| {
        ckptfs(&[
            "import-flink",
            src.to_str().unwrap(),
            m.mnt.to_str().unwrap(),
        ])
    };

    // A damaged _metadata among them: refused, nothing imported.
    let bad = dir.path().join("bad");
    cp_a(&fixture(), &bad);
    let metadata_of_5 = bad.join("chk-5/_metadata");
    let bytes = std::fs::read(&metadata_of_5).unwrap();
    std::fs::write(&metadata_of_5, &bytes[..bytes.len() / 2]).unwrap();
    let out = import(&bad);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("Flink checkpoint 5") && e.contains("nothing was imported"),
        "{e}"
    );
    assert_eq!(labels(&m), Vec::<u64>::new());

    let ids: Vec<u64> = ok(import(&src))
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(labels(&m), [4, 5, 6]);
    assert_eq!(ok(import(&src)), "");
    // The daemon's own backend is in every checkpoint beside the job's.
    assert!(m.mnt.join(format!("cp-{}/app/0/CURRENT", ids[2])).is_file());
    m.umount();

    let store = m.store.to_str().unwrap();
    let dest = dir.path().join("export");
    let out = ckptfs(&[
        "export-flink",
        store,
        &ids[1].to_string(),
        dest.to_str().unwrap(),
        "--json",
    ]);
    let exported: serde_json::Value = serde_json::from_str(&ok(out)).unwrap();
    let chk = dest.join("a312c9034e3e0d2016dae60431b4c9dc/chk-5");
    assert_eq!(exported["path"], chk.to_str().unwrap());
    assert_eq!(exported["checkpoint"], 5);
    let parsed = metadata::parse(&std::fs::read(chk.join("_metadata")).unwrap()).unwrap();
    assert_eq!(parsed.checkpoint_id, 5);
    let mut named = 0;
    for op in &parsed.operators {
        for subtask in &op.subtasks {
            let Some(KeyedHandle::Incremental(h)) = &subtask.managed_keyed else {
                continue;
            };
            for (_, stream) in h.shared.iter().chain(&h.private) {
                // Relocatable: Flink's shared files named relative to chk-5/.
                match stream {
                    StreamHandle::Relative { path, size, .. } => {
                        let rest = path.strip_prefix("../shared/").unwrap();
                        let local = chk.parent().unwrap().join("shared").join(rest);
                        assert_eq!(std::fs::metadata(local).unwrap().len(), *size, "{path}");
                        named += 1;
                    }
                    StreamHandle::Inline(_) => {}
                    other => panic!("not relocatable: {other:?}"),
                }
            }
        }
    }
    assert!(named > 4, "the fixture uploads files: {named}");
    let written = crate::common::files_under(&dest).len();
    assert_eq!(written as u64, exported["files"].as_u64().unwrap());

    // Refused, nothing written: a destination that is not empty, a checkpoint that is no
    // Flink checkpoint, one the store does not have.
    let out = ckptfs(&[
        "export-flink",
        store,
        &ids[1].to_string(),
        dest.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert_eq!(crate::common::files_under(&dest).len(), written);
    let other = Mounted::new(&["--backend", "app/0"]);
    ok(ckptfs(&["checkpoint", other.mnt.to_str().unwrap()]));
    let nowhere = dir.path().join("nowhere");
    let out = ckptfs(&[
        "export-flink",
        other.mnt.to_str().unwrap(),
        "1",
        nowhere.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not imported from Flink"));
    let out = ckptfs(&["export-flink", store, "99", nowhere.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!nowhere.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".ckptfs-export-"))
        .collect();
    assert_eq!(leftovers, Vec::<String>::new());
    other.umount();
}

/// The Flink fixture's job put into `bucket` under `prefix` (`flink/ck/<job>`) as Flink on
/// S3 writes it: `shared/<uuid>`, and each `chk-N/_metadata` naming its files by `s3://` URI.
pub(crate) fn put_fixture_job(port: u16, bucket: &str, prefix: &str) {
    use ckptfs_core::flink::metadata;
    let put = |key: &str, bytes: &[u8]| {
        crate::common::moto::put_object(port, bucket, &format!("{prefix}/{key}"), bytes)
    };
    for entry in std::fs::read_dir(fixture().join("shared")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        put(
            &format!("shared/{name}"),
            &std::fs::read(entry.path()).unwrap(),
        );
    }
    for n in [4, 5, 6] {
        let chk = fixture().join(format!("chk-{n}"));
        let bytes = std::fs::read(chk.join("_metadata")).unwrap();
        let paths: Vec<(usize, String)> = file_handles(&bytes)
            .into_iter()
            .map(|(at, path, _)| {
                let uuid = path.rsplit('/').next().unwrap();
                (at, format!("s3://{bucket}/{prefix}/shared/{uuid}"))
            })
            .collect();
        assert!(!paths.is_empty());
        put(
            &format!("chk-{n}/_metadata"),
            &metadata::with_paths(&bytes, paths).unwrap(),
        );
        for entry in std::fs::read_dir(&chk).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if name != "_metadata" {
                put(
                    &format!("chk-{n}/{name}"),
                    &std::fs::read(entry.path()).unwrap(),
                );
            }
        }
    }
}

/// A Flink job that checkpoints to object storage (`execution.checkpointing.dir:
/// s3://...`): the fixture job's files put into a bucket of a real S3 server, each
/// `_metadata` naming its files by `s3://` URI as Flink on S3 writes them. `import-flink
/// s3://BUCKET/PREFIX` imports every checkpoint, reading each `_metadata` once; a file the
/// store holds from the previous checkpoint (same key and size) is not fetched again; the
/// state reads back in ldb.
#[test]
fn a_flink_job_on_object_storage_is_imported_fetching_each_file_once() {
    let moto = crate::common::moto::moto();
    let bucket = &moto.bucket();
    let job = "a312c9034e3e0d2016dae60431b4c9dc";
    let prefix = format!("flink/ck/{job}");
    let put = |key: &str, bytes: &[u8]| {
        crate::common::moto::put_object(moto.port, bucket, &format!("{prefix}/{key}"), bytes)
    };
    put_fixture_job(moto.port, bucket, &prefix);
    // In flight: a chk-7 without _metadata.
    put("chk-7/0b8e3c52-2f1e-4c1a-9d7e-000000000000", b"partial");

    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let src = format!("s3://{bucket}/flink/ck");
    // Through a proxy that counts the requests.
    let proxy = crate::common::moto::HttpProxy::start(moto.port);
    let out = std::process::Command::new(crate::common::mounted::BIN)
        .args(["import-flink", &src, store.to_str().unwrap()])
        .env(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", proxy.port),
        )
        .output()
        .unwrap();
    assert_eq!(ok(out).lines().count(), 3);
    // Every uploaded file is fetched once, though the later checkpoints name most of them
    // again.
    let mut named = Vec::new();
    for n in [4, 5, 6] {
        let bytes = std::fs::read(fixture().join(format!("chk-{n}/_metadata"))).unwrap();
        named.extend(file_handles(&bytes).into_iter().map(|(_, path, _)| path));
    }
    let distinct: std::collections::BTreeSet<&String> = named.iter().collect();
    assert!(
        distinct.len() < named.len(),
        "later checkpoints reuse files"
    );
    assert_eq!(proxy.seen("GET", "/shared/"), distinct.len());
    // A file named where the store holds it is not looked at again; a new one once.
    assert_eq!(proxy.seen("HEAD", "/shared/"), distinct.len());
    // Each `_metadata` is read once: checked, then imported from the bytes read, by one
    // GET (its size from the answer, no HEAD before it).
    assert_eq!(proxy.seen("GET", "/_metadata"), 3);
    // Each `chk-N/` is looked into once, for its `_metadata`'s size and time (chk-7 has
    // none): the checkpoint's time is that one, not listed again.
    assert_eq!(proxy.seen("HEAD", "/_metadata"), 4);
    // The source root and the job's directory, each listed once.
    assert_eq!(proxy.seen("GET", "list-type=2"), 2);
    assert_eq!(
        ok(ckptfs(&["import-flink", &src, store.to_str().unwrap()])),
        ""
    );
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &[]);
    assert_eq!(labels(&m), [4, 5, 6]);
    let out = dir.path().join("out");
    cp_a(&mnt.join("cp-3/counter/0"), &out);
    let expected = expected();
    let mut checked = 0;
    for ((n, op, s, cf), entries) in &expected {
        if *n == 6 && op == "counter" && *s == 0 {
            assert_eq!(ldb_entries(&out, cf), *entries, "{cf}");
            checked += 1;
        }
    }
    assert!(checked >= 2);
    m.umount();
}

/// A Flink job's SSTs larger than one part (1 GiB; 3,000 bytes here,
/// with parts of 1 KiB on a server that takes them) are copied by the object store in parts
/// (UploadPartCopy), into the store and again to their object's key: none is downloaded,
/// each is named by the SHA-256 of its parts' SHA-256s (`sha256p10-`), the smaller ones by
/// their SHA-256. The checkpoints restore with the source's bytes, fsck checks every object
/// by its own hash function, and names one changed byte.
#[test]
fn a_flink_jobs_files_above_one_copy_are_copied_in_parts() {
    use ckptfs_core::store::s3::Remote;
    use ckptfs_core::store::ObjectId;
    let moto = crate::common::moto::moto_small_parts();
    let (from, to) = (moto.bucket(), moto.bucket());
    let job = "a312c9034e3e0d2016dae60431b4c9dc";
    put_fixture_job(moto.port, &from, &format!("flink/ck/{job}"));
    let proxy = crate::common::moto::HttpProxy::start(moto.port);
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let store = format!("s3://{to}/store");
    let ckptfs = |args: &[&str]| {
        Command::new(crate::common::mounted::BIN)
            .args(args)
            .env("AWS_ENDPOINT_URL", &endpoint)
            .env("CKPTFS_TEST_COPY_PARTS", "3000,10")
            .output()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    ok(ckptfs(&[
        "import-flink",
        &format!("s3://{from}/flink/ck"),
        &store,
        "--state",
        state.to_str().unwrap(),
    ]));

    // The source's SSTs (by the block-based table's magic number at their end) above
    // 3,000 bytes.
    let sources: Vec<Vec<u8>> = std::fs::read_dir(fixture().join("shared"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    let large: Vec<&Vec<u8>> = sources
        .iter()
        .filter(|b| b.ends_with(&0x88e2_41b7_85f4_cff7u64.to_le_bytes()) && b.len() > 3000)
        .collect();
    assert!(large.len() >= 3, "the fixture has SSTs above 3,000 bytes");
    let parts: usize = large.iter().map(|b| b.len().div_ceil(1024)).sum();
    // Each large file: a multipart upload of its parts into staging, and again to its key.
    assert_eq!(proxy.seen("PUT", "partNumber="), 2 * parts);
    for (target, headers) in proxy.requests("PUT", "partNumber=") {
        assert!(
            headers
                .iter()
                .any(|(n, v)| n == "x-amz-copy-source-range" && v.starts_with("bytes=")),
            "{target}: not a copy of a range"
        );
    }
    // No SST was read whole: only ranged reads of footers and properties (OPTIONS and
    // MANIFEST files are read).
    let is_sst = |target: &str| {
        let uuid = target.rsplit('/').next().unwrap();
        std::fs::read(fixture().join("shared").join(uuid))
            .unwrap()
            .ends_with(&0x88e2_41b7_85f4_cff7u64.to_le_bytes())
    };
    for (target, headers) in proxy.requests("GET", "/shared/") {
        if !is_sst(&target) {
            continue;
        }
        let range = headers.iter().find(|(n, _)| n == "range").map(|(_, v)| v);
        assert!(
            range.is_some_and(|r| !r.starts_with("bytes=0-")),
            "{target} read whole ({range:?})"
        );
    }
    let remote = Remote::connect_to(&to, "", Some(&endpoint)).unwrap();
    let objects: Vec<(String, u64)> = remote
        .list_keys("store/objects/", false)
        .unwrap()
        .into_iter()
        .map(|(key, size, _)| (key.rsplit('/').next().unwrap().to_string(), size))
        .collect();
    let in_parts: Vec<&(String, u64)> = objects
        .iter()
        .filter(|(name, _)| name.starts_with("sha256p10-"))
        .collect();
    assert_eq!(in_parts.len(), large.len(), "{objects:?}");
    for (name, size) in &in_parts {
        assert!(*size > 3000, "{name}: {size} bytes");
        let id: ObjectId = name.parse().unwrap();
        let bytes = large
            .iter()
            .find(|b| {
                let mut hasher = id.hasher();
                hasher.update(b);
                hasher.finalize() == id
            })
            .unwrap_or_else(|| panic!("{name} is no SHA-256 of a source file's parts"));
        assert_eq!(bytes.len() as u64, *size);
    }
    assert!(objects.iter().any(|(name, _)| name.starts_with("sha256-")));
    assert_eq!(
        remote.list_keys("store/tmp/", false).unwrap().len(),
        0,
        "staging copies stayed"
    );

    // Restored byte for byte, checked by fsck; one changed byte named.
    let out = dir.path().join("cp3");
    ok(ckptfs(&["restore", &store, "3", out.to_str().unwrap()]));
    let restored: Vec<Vec<u8>> = crate::common::files_under(&out)
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert!(
        large.iter().any(|b| restored.contains(b)),
        "checkpoint 3 restores a file copied in parts"
    );
    ok(ckptfs(&["fsck", &store]));

    // Exported into another bucket: copied in parts again, the source's bytes.
    let export = moto.bucket();
    let before = proxy.seen("PUT", "partNumber=");
    ok(ckptfs(&[
        "export-flink",
        &store,
        "3",
        &format!("s3://{export}/flink"),
    ]));
    assert!(
        proxy.seen("PUT", "partNumber=") > before,
        "no copy in parts"
    );
    let exported = Remote::connect_to(&export, "", Some(&endpoint)).unwrap();
    let mut copies = 0;
    for (key, _, _) in exported.list_keys("flink/", false).unwrap() {
        let bytes = exported.get_bytes(&key).unwrap();
        if large.contains(&&bytes) {
            copies += 1;
        }
    }
    assert!(
        copies > 0,
        "the export holds none of the SSTs copied in parts"
    );

    let key = format!("store/objects/{}", in_parts[0].0);
    let mut bad = remote.get_bytes(&key).unwrap();
    bad[2000] ^= 1;
    remote
        .upload_from(&key, |w| {
            std::io::Write::write_all(w, &bad).unwrap();
            Ok(())
        })
        .unwrap();
    let checked = ckptfs(&["fsck", &store]);
    assert!(!checked.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(said.contains(&in_parts[0].0), "{said}");
}

/// Full (not incremental) checkpoints: Flink 2.3's RocksDB backend writes them in RocksDB's
/// own format too (every file of the database, beside `_metadata` in chk-N/, each time):
/// they import like incremental ones and read back with the job's state. The heap state
/// backend's keyed snapshots are streams of key groups, not RocksDB files: refused, naming
/// the checkpoint and the reason, with nothing changed.
#[test]
fn full_snapshots_import_when_rocksdb_and_are_refused_when_heap() {
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let ck = dir.path().join("ck");
    let mut job = Job::start(&classpath, &ck, 100, &["--incremental", "false"]);
    let done = job.checkpoint_with(100);
    job.kill();
    let store = dir.path().join("store");
    let ids = ok(ckptfs(&[
        "import-flink",
        ck.to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    assert!(!ids.is_empty());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &[]);
    let cp = imported_from(&mnt, done, None);
    check_tree(&classpath, &mnt.join(format!("cp-{cp}")), 100, dir.path());
    m.umount();

    let heap = dir.path().join("heap");
    let mut job = Job::start(&classpath, &heap, 100, &["--state-backend", "hashmap"]);
    job.checkpoint_with(100);
    job.kill();
    let store = dir.path().join("store-heap");
    let out = ckptfs(&[
        "import-flink",
        heap.to_str().unwrap(),
        store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("keyed state as key groups")
            && e.contains("state.backend.type: rocksdb")
            && e.contains("nothing was imported")
            && e.contains("Flink checkpoint "),
        "{e}"
    );
    assert!(!store.exists());
}

/// Flink deletes a checkpoint it no longer retains, files and all, possibly while ckptfs
/// imports it: the files are held open once listed, so the import completes and the state
/// reads back (held at a failpoint before the first file is read, the job's directory is
/// removed).
#[cfg(feature = "failpoints")]
#[test]
fn a_checkpoint_flink_deletes_while_it_is_imported_is_imported_whole() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("a312c9034e3e0d2016dae60431b4c9dc");
    std::fs::create_dir(&src).unwrap();
    cp_a(&fixture().join("shared"), &src);
    cp_a(&fixture().join("chk-4"), &src);
    let store = dir.path().join("store");
    let child = std::process::Command::new(crate::common::mounted::BIN)
        .args([
            "import-flink",
            src.to_str().unwrap(),
            store.to_str().unwrap(),
        ])
        .env("FAILPOINTS", "ingest::before-file=1*sleep(2000)")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    std::fs::remove_dir_all(&src).unwrap();
    assert_eq!(ok(child.wait_with_output().unwrap()).trim(), "1");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &[]);
    let expected = expected();
    let mut checked = 0;
    for operator in std::fs::read_dir(mnt.join("cp-1")).unwrap() {
        let operator = operator.unwrap().file_name().into_string().unwrap();
        let name = match operator.as_str() {
            "counter" => "counter",
            "_flink" | "_metadata" => continue,
            _ => "totals",
        };
        for subtask in 0..2u32 {
            let out = dir.path().join(format!("out-{operator}-{subtask}"));
            cp_a(
                &mnt.join("cp-1").join(&operator).join(subtask.to_string()),
                &out,
            );
            for ((n, op, s, cf), entries) in &expected {
                if *n == 4 && op == name && *s == subtask {
                    assert_eq!(ldb_entries(&out, cf), *entries, "{op} {cf} subtask {s}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, expected.keys().filter(|k| k.0 == 4).count());
    m.umount();
}

/// A user's drop sticks: `rmdir` of a checkpoint imported from Flink is remembered in the
/// store (status shows it under `flink_dropped`), and the follower does not import that
/// Flink checkpoint again, not even after a restart, while Flink still has it.
#[test]
fn a_dropped_flink_checkpoint_is_not_imported_again() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("a312c9034e3e0d2016dae60431b4c9dc");
    cp_a(&fixture(), &job);
    let store = dir.path().join("store");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let args = ["--flink", job.to_str().unwrap()];
    let m = Mounted::at(&store, &mnt, &args);
    wait_for("checkpoints 4 to 6", || labels(&m) == [4, 5, 6]);
    let newest = imported_from(&mnt, 6, None);
    // The newest: rmdir refuses it, rm --force drops it.
    assert_eq!(
        crate::common::mounted::errno_of(std::fs::remove_dir(mnt.join(format!("cp-{newest}")))),
        libc::EBUSY
    );
    ok(ckptfs(&["rm", "--force", m.mnt(), &newest.to_string()]));
    // The follower looks every second: a few looks later, still dropped.
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert_eq!(labels(&m), [4, 5]);
    let status = m.status();
    assert_eq!(
        status["flink_dropped"],
        serde_json::json!({"a312c9034e3e0d2016dae60431b4c9dc": [6]}),
        "{status}"
    );
    m.umount();
    let m = Mounted::at(&store, &mnt, &args);
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert_eq!(labels(&m), [4, 5], "imported again after a restart");
    m.umount();
}

/// A checkpoint that fails to import while a newer one goes in is tried again at every
/// look, and imported once it can be, though the store holds a newer one of the job.
#[test]
fn a_failed_flink_checkpoint_is_retried_after_a_newer_one_is_in() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("a312c9034e3e0d2016dae60431b4c9dc");
    cp_a(&fixture(), &job);
    // Checkpoint 5 cannot be read yet.
    let metadata = job.join("chk-5/_metadata");
    let good = std::fs::read(&metadata).unwrap();
    std::fs::write(&metadata, &good[..good.len() / 2]).unwrap();
    let m = Mounted::new(&["--flink", job.to_str().unwrap()]);
    wait_for("checkpoints 4 and 6", || labels(&m) == [4, 6]);
    let error = m.status()["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(error.contains("checkpoint 5 of Flink job"), "{error}");
    // Readable now (written in place, as a retried upload would).
    std::fs::write(&metadata, &good).unwrap();
    wait_for("checkpoint 5", || labels(&m) == [4, 6, 5]);
    m.umount();
}

/// Bytes process `pid` has read so far: `rchar` of /proc/PID/io (every read(2), whatever
/// it read from).
fn bytes_read_by(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .parse()
        .unwrap()
}

/// `bytes` (a `_metadata`) with the RocksDB file name `000024.sst` written `00/024.sst`, as
/// the changelog backend and unaligned checkpoints name files: refused by ckptfs.
pub(crate) fn with_a_slash(bytes: &[u8]) -> Vec<u8> {
    let (from, to) = (b"\x00\x0a000024.sst", b"\x00\x0a00/024.sst");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the name 000024.sst");
    let mut out = bytes.to_vec();
    out[at..at + from.len()].copy_from_slice(to);
    out
}

/// A checkpoint the follower refuses (a file named with `/`) whose `_metadata` is 8 MiB is
/// read once, not at every look: over 10 s the daemon reads less than twice its size (it
/// read it at every look, about once a second). It is shown in status (`flink_refused`)
/// and counted (`ckptfs_flink_refused_total`); written again, it is read again; the
/// checkpoint after it is imported all the same.
#[test]
fn a_refused_checkpoint_is_not_read_again_until_its_metadata_changes() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("a312c9034e3e0d2016dae60431b4c9dc");
    std::fs::create_dir(&job).unwrap();
    for part in ["shared", "chk-4", "chk-5"] {
        cp_a(&fixture().join(part), &job.join(part));
    }
    let metadata = job.join("chk-5/_metadata");
    // Flink's reader ignores what follows the checkpoint's properties, and so does ckptfs.
    let mut refused = with_a_slash(&std::fs::read(&metadata).unwrap());
    refused.resize(8 << 20, 0);
    std::fs::write(&metadata, &refused).unwrap();
    let m = Mounted::new(&["--flink", job.to_str().unwrap()]);
    let refused_bytes = |m: &Mounted| m.status()["flink_refused"][0]["metadata_bytes"].as_u64();
    wait_for("checkpoint 5 refused", || refused_bytes(&m).is_some());
    wait_for("checkpoint 4", || labels(&m) == [4]);
    let status = m.status();
    assert_eq!(status["flink_refused"][0]["checkpoint"], 5, "{status}");
    let reason = status["flink_refused"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("00/024.sst"), "{status}");
    let error = status["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("read again once its _metadata changes"),
        "{status}"
    );
    let pid = crate::common::mounted::daemon_pid(&m);
    let before = bytes_read_by(pid);
    std::thread::sleep(std::time::Duration::from_secs(10));
    let read = bytes_read_by(pid) - before;
    let size = refused.len() as u64;
    eprintln!("read {read} bytes in 10 s, the refused _metadata has {size}");
    assert!(
        read < 2 * size,
        "read {read} bytes in 10 s with a refused _metadata of {size}"
    );
    let metrics = std::fs::read_to_string(m.mnt.join(".ckptfs/metrics")).unwrap();
    assert!(
        metrics.contains("ckptfs_flink_refused_total 1\n"),
        "{metrics}"
    );
    // Written again: read again.
    refused.push(0);
    std::fs::write(&metadata, &refused).unwrap();
    wait_for("checkpoint 5 read again", || {
        refused_bytes(&m) == Some(size + 1)
    });
    // The next one is imported.
    cp_a(&fixture().join("chk-6"), &job.join("chk-6"));
    wait_for("checkpoint 6", || labels(&m) == [4, 6]);
    m.umount();
}

/// The one job directory a StateJob run made under `ck`.
pub(crate) fn job_dir_in(ck: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(ck)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            ckptfs_core::flink::import::is_job_id(&p.file_name().unwrap().to_string_lossy())
        })
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.into_iter().next().unwrap()
}

/// A real job restored in CLAIM mode: its incremental checkpoints go on naming the files
/// of the job it was restored from, in that job's directory. Imported alone they are
/// refused (outside the source); with that directory named by `--source-root` they import,
/// and the subtasks read back with the restored job's whole state.
#[test]
fn a_job_restored_in_claim_mode_imports_with_its_source_root() {
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let (ck_a, ck_b) = (dir.path().join("ck-a"), dir.path().join("ck-b"));
    let mut first = Job::start(&classpath, &ck_a, 600, &[]);
    let done = first.checkpoint_with(600);
    first.kill();
    let job_a = job_dir_in(&ck_a);
    let restore_from = job_a.join(format!("chk-{done}"));
    // Few records after the restore: its first checkpoints still hold the restored SSTs
    // (more would compact them away into files of its own).
    let mut second = Job::start(
        &classpath,
        &ck_b,
        650,
        &[
            "--restore",
            restore_from.to_str().unwrap(),
            "--claim-mode",
            "CLAIM",
        ],
    );
    let done = second.checkpoint_with(650);
    second.kill();
    let job_b = job_dir_in(&ck_b);
    // What CLAIM means: the checkpoints name files of the first job's directory.
    let mut in_a = Vec::new();
    for entry in std::fs::read_dir(&job_b).unwrap() {
        let metadata = entry.unwrap().path().join("_metadata");
        if let Ok(bytes) = std::fs::read(&metadata) {
            let named = file_handles(&bytes)
                .into_iter()
                .filter(|(_, path, _)| path.contains(job_a.to_str().unwrap()))
                .count();
            in_a.push((metadata, named));
        }
    }
    assert!(
        in_a.iter().any(|(_, n)| *n > 0),
        "the restored job names none of the first job's files ({}): {in_a:?}",
        job_a.display()
    );

    let store = dir.path().join("store");
    let out = ckptfs(&[
        "import-flink",
        job_b.to_str().unwrap(),
        store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("outside the source") && e.contains("EACCES"),
        "{e}"
    );
    ok(ckptfs(&[
        "import-flink",
        job_b.to_str().unwrap(),
        store.to_str().unwrap(),
        "--source-root",
        job_a.to_str().unwrap(),
    ]));
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &[]);
    let cp = imported_from(&mnt, done, None);
    check_tree(&classpath, &mnt.join(format!("cp-{cp}")), 650, dir.path());
    m.umount();
}
