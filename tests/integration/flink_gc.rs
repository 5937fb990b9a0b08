//! `ckptfs flink-gc`: what Flink leaves in its own checkpoint directory, judged against an
//! independent reading of every `_metadata` (the paths in them found by scanning their
//! bytes for Java's length-prefixed `file:` strings, not by ckptfs's parser): on the real
//! Flink job's fixture laid out where it was written (local and on moto), and on real jobs
//! killed with -9 mid-checkpoint and restored in CLAIM and NO_CLAIM mode, which restore
//! afterwards with their state intact.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::common::mounted::{ckptfs, ok};
use crate::flink::{cp_a, file_handles, fixture, Job};

const JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";

/// Every file path a `_metadata` names, read from its bytes: Java's `writeUTF` puts a
/// big-endian u16 length before each string, and a file handle is type byte 2 and an i64
/// size before it (a `file:` string elsewhere is an inline handle's name, no file).
pub(crate) fn named_paths(bytes: &[u8]) -> Vec<String> {
    named_at(bytes).into_iter().map(|(_, p)| p).collect()
}

/// [`named_paths`], each with the offset of its length prefix.
fn named_at(bytes: &[u8]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut i = 2;
    while i + 5 <= bytes.len() {
        if &bytes[i..i + 5] == b"file:" && i >= 11 && bytes[i - 11] == 2 {
            let len = u16::from_be_bytes([bytes[i - 2], bytes[i - 1]]) as usize;
            if let Some(Ok(s)) = bytes.get(i..i + len).map(std::str::from_utf8) {
                let path = s.trim_start_matches("file:");
                let path = path.strip_prefix("//").unwrap_or(path);
                out.push((i - 2, path.to_string()));
                i += len;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// A file below the checkpoint root: its path relative to it, size and mtime.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    size: u64,
    modified: SystemTime,
}

/// Every regular file below `dir` (links not followed, not listed), by path relative to
/// `root`.
fn files(root: &Path, dir: &Path, out: &mut BTreeMap<String, Seen>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if meta.is_dir() {
            files(root, &entry.path(), out);
        } else if meta.is_file() {
            let rel = entry
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into();
            out.insert(
                rel,
                Seen {
                    size: meta.len(),
                    modified: meta.modified().unwrap(),
                },
            );
        }
    }
}

fn listing(root: &Path) -> BTreeMap<String, Seen> {
    let mut out = BTreeMap::new();
    files(root, root, &mut out);
    out
}

/// The job directories under a checkpoint root.
pub(crate) fn jobs(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| ckptfs_core::flink::import::is_job_id(n))
        .collect();
    out.sort();
    out
}

/// The completed checkpoints of a job directory, oldest first.
pub(crate) fn completed(job: &Path) -> Vec<u64> {
    let mut out: Vec<u64> = std::fs::read_dir(job)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let n = e.file_name().into_string().unwrap();
            let n: u64 = n.strip_prefix("chk-")?.parse().ok()?;
            e.path().join("_metadata").is_file().then_some(n)
        })
        .collect();
    out.sort_unstable();
    out
}

/// What the test judges garbage under `root` (files written before `cutoff`), by the rules
/// of the manual: below a job's chk-N/ (no `_metadata`), shared/ or taskowned/, named by no
/// `_metadata` of a retained checkpoint (each job's newest `retained`) nor of an unretained
/// one, and not in a completed checkpoint's directory.
fn expected_garbage(root: &Path, cutoff: SystemTime) -> BTreeSet<String> {
    let root = root.canonicalize().unwrap();
    let all = listing(&root);
    let mut named = BTreeSet::new();
    let mut complete_dirs = BTreeSet::new();
    for job in jobs(&root) {
        for n in completed(&root.join(&job)) {
            complete_dirs.insert(format!("{job}/chk-{n}/"));
            let bytes = std::fs::read(root.join(&job).join(format!("chk-{n}/_metadata"))).unwrap();
            for path in named_paths(&bytes) {
                if let Ok(rel) = Path::new(&path).strip_prefix(&root) {
                    named.insert(rel.to_string_lossy().into_owned());
                }
            }
        }
    }
    all.iter()
        .filter(|(rel, seen)| {
            let mut parts = rel.splitn(3, '/');
            let (job, top) = (parts.next().unwrap(), parts.next().unwrap_or(""));
            let looked_at = ckptfs_core::flink::import::is_job_id(job)
                && parts.next().is_some()
                && (top.starts_with("chk-") || top == "shared" || top == "taskowned");
            looked_at
                && !named.contains(*rel)
                && !complete_dirs.iter().any(|d| rel.starts_with(d.as_str()))
                && seen.modified < cutoff
        })
        .map(|(rel, _)| rel.clone())
        .collect()
}

fn gc_json(args: &[&str]) -> Value {
    let mut all = vec!["flink-gc"];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&ok(ckptfs(&all))).unwrap()
}

fn garbage_of(report: &Value) -> BTreeSet<String> {
    report["garbage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["path"].as_str().unwrap().to_string())
        .collect()
}

fn set_age(path: &Path, age: Duration) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

/// The fixture job laid out as Flink wrote it, at `root/<job>/`: every `_metadata` naming
/// its files where they now are, every file two hours old.
pub(crate) fn fixture_at(root: &Path) -> PathBuf {
    use ckptfs_core::flink::metadata;
    std::fs::create_dir_all(root).unwrap();
    let job = root.join(JOB);
    cp_a(&fixture(), &job);
    for n in [4, 5, 6] {
        let md = job.join(format!("chk-{n}/_metadata"));
        let bytes = std::fs::read(&md).unwrap();
        // Every path, the chk-N/ files' too.
        let paths = named_at(&bytes)
            .into_iter()
            .map(|(at, path)| {
                let (_, below) = path.split_once(&format!("/{JOB}/")).unwrap();
                (at, format!("file:{}/{below}", job.display()))
            })
            .collect();
        std::fs::write(&md, metadata::with_paths(&bytes, paths).unwrap()).unwrap();
    }
    for (rel, _) in listing(&job) {
        set_age(&job.join(rel), Duration::from_secs(7200));
    }
    job
}

/// The fixture in place, with what failovers leave planted beside it: the dry run finds
/// exactly the garbage the test computes and leaves young files, links and what is no
/// checkpoint's alone; a `_metadata` that does not parse, a moved copy and a grace below
/// the checkpoint timeout refuse the run; `--delete` deletes exactly the garbage, the
/// checkpoints still import, and `--delete-unretained` drops the checkpoints Flink no
/// longer retains, saying which the store holds.
#[test]
fn flink_gc_finds_exactly_the_garbage_of_a_flink_directory_and_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ck");
    let job = fixture_at(&root);
    let old = Duration::from_secs(7200);
    let plant = |rel: &str, age: Option<Duration>| {
        let path = job.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("left behind: {rel}")).unwrap();
        if let Some(age) = age {
            set_age(&path, age);
        }
    };
    plant("chk-7/1f0c7a52-in-flight", Some(old));
    plant("shared/9d3e0b11-aborted-upload", Some(old));
    plant("taskowned/5e2a-old", Some(old));
    plant("shared/7a1b-young", None);
    plant("stray-file", Some(old));
    std::os::unix::fs::symlink("/etc/hostname", job.join("shared/link")).unwrap();
    let root_s = root.to_str().unwrap();

    let expected = expected_garbage(&root, SystemTime::now() - Duration::from_secs(3600));
    for planted in [
        "chk-7/1f0c7a52-in-flight",
        "shared/9d3e0b11-aborted-upload",
        "taskowned/5e2a-old",
    ] {
        assert!(
            expected.contains(&format!("{JOB}/{planted}")),
            "{expected:?}"
        );
    }
    let report = gc_json(&[root_s, "--num-retained", "3"]);
    assert_eq!(garbage_of(&report), expected, "{report}");
    assert_eq!(report["young"]["files"], 1, "{report}");
    assert_eq!(report["left_alone"][0][0], format!("{JOB}/shared/link"));
    assert_eq!(report["jobs"][0]["completed"], serde_json::json!([4, 5, 6]));
    assert_eq!(report["jobs"][0]["incomplete"], serde_json::json!([7]));
    assert!(report["unretained"].as_array().unwrap().is_empty());
    assert!(report["deleted"].is_null());
    let bytes: u64 = expected
        .iter()
        .map(|p| std::fs::metadata(root.join(p)).unwrap().len())
        .sum();
    assert_eq!(report["garbage_total"]["bytes"], bytes);
    // The table says the same.
    let table = ok(ckptfs(&["flink-gc", root_s, "--num-retained", "3"]));
    assert!(
        table.contains("in the directory of a checkpoint that never completed: 1 files"),
        "{table}"
    );
    assert!(table.contains("dry run: nothing deleted"), "{table}");

    // Refused, nothing changed: a grace below the timeout, a `_metadata` that does not parse,
    // a moved copy.
    let before = listing(&root);
    let out = ckptfs(&["flink-gc", root_s, "--grace", "5m", "--delete"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("shorter than the checkpoint timeout"),
        "{e}"
    );
    plant("chk-8/_metadata", Some(old));
    let out = ckptfs(&["flink-gc", root_s, "--delete"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains("chk-8/_metadata") && e.contains("nothing was deleted"),
        "{e}"
    );
    std::fs::remove_dir_all(job.join("chk-8")).unwrap();
    let moved = dir.path().join("moved");
    std::fs::create_dir(&moved).unwrap();
    cp_a(&job, &moved.join(JOB));
    let out = ckptfs(&["flink-gc", moved.to_str().unwrap(), "--delete"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("moved or copied"),
        "{e}"
    );
    assert_eq!(listing(&root), before);

    // The checkpoints Flink no longer retains, with --store: which ones the store holds.
    let store = dir.path().join("store");
    ok(ckptfs(&[
        "import-flink",
        job.to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    let report = gc_json(&[
        root_s,
        "--num-retained",
        "1",
        "--store",
        store.to_str().unwrap(),
    ]);
    let unretained: Vec<u64> = report["unretained"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["checkpoint"].as_u64().unwrap())
        .collect();
    assert_eq!(unretained, [4, 5], "{report}");
    assert_eq!(report["imported"], serde_json::json!([1, 2]), "{report}");
    // What deleting them frees: their directories, and the files only they name.
    let named = |n: u64| -> BTreeSet<String> {
        let bytes = std::fs::read(job.join(format!("chk-{n}/_metadata"))).unwrap();
        named_paths(&bytes)
            .into_iter()
            .map(|p| {
                let rel = Path::new(&p)
                    .strip_prefix(root.canonicalize().unwrap())
                    .unwrap();
                rel.to_string_lossy().into_owned()
            })
            .collect()
    };
    assert!(report["broken"].as_array().unwrap().is_empty(), "{report}");
    let newest = named(6);
    let mut freed: BTreeSet<String> = named(4).union(&named(5)).cloned().collect();
    freed.retain(|p| !newest.contains(p));
    for n in [4, 5] {
        for (rel, _) in listing(&job.join(format!("chk-{n}"))) {
            freed.insert(format!("{JOB}/chk-{n}/{rel}"));
        }
    }
    let listed: BTreeSet<String> = report["unretained_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, freed, "{report:#}");
    assert_eq!(
        garbage_of(&report),
        expected,
        "unretained files are not garbage"
    );

    // --delete: exactly the garbage goes.
    let report = gc_json(&[root_s, "--num-retained", "3", "--delete"]);
    assert_eq!(
        report["deleted"]["deleted"]["files"],
        expected.len(),
        "{report}"
    );
    let after = listing(&root);
    let mut kept = before.clone();
    kept.retain(|rel, _| !expected.contains(rel));
    assert_eq!(after, kept);
    assert!(!job.join("chk-7").exists(), "the emptied chk-7/ is removed");
    assert!(std::fs::symlink_metadata(job.join("shared/link")).is_ok());
    assert!(garbage_of(&gc_json(&[root_s, "--num-retained", "3"])).is_empty());
    let again = dir.path().join("store-again");
    let imported = ok(ckptfs(&[
        "import-flink",
        job.to_str().unwrap(),
        again.to_str().unwrap(),
    ]));
    assert_eq!(imported.lines().count(), 3, "{imported}");

    // --delete-unretained: checkpoints 4 and 5 go, with the files only they name; 6 stays
    // whole.
    gc_json(&[
        root_s,
        "--num-retained",
        "1",
        "--delete",
        "--delete-unretained",
    ]);
    assert!(!job.join("chk-4").exists() && !job.join("chk-5").exists());
    for rel in &freed {
        assert!(!root.join(rel).exists(), "{rel}");
    }
    for rel in &newest {
        assert!(root.join(rel).is_file(), "{rel}");
    }
    let last = dir.path().join("store-last");
    let imported = ok(ckptfs(&[
        "import-flink",
        job.to_str().unwrap(),
        last.to_str().unwrap(),
    ]));
    assert_eq!(imported.lines().count(), 1, "{imported}");
    // A file a checkpoint names, lost: the checkpoint is reported broken.
    std::fs::remove_file(root.join(newest.iter().next().unwrap())).unwrap();
    let report = gc_json(&[root_s]);
    assert_eq!(
        report["broken"],
        serde_json::json!([{"job": JOB, "checkpoint": 6, "missing": 1}])
    );
}

/// The same on object storage: the fixture's objects on moto, their `_metadata` naming
/// them by `s3://` URI. Objects cannot be made old, so the grace is 2 s (the jobs'
/// timeout said to be as short): what is older goes, in one DeleteObjects request; the
/// young object stays.
#[test]
fn flink_gc_on_object_storage_deletes_the_unreferenced_objects() {
    use ckptfs_core::flink::metadata;
    let moto = crate::common::moto::moto();
    let bucket = &moto.bucket();
    let prefix = format!("gc/ck/{JOB}");
    let put = |key: &str, bytes: &[u8]| {
        crate::common::moto::put_object(moto.port, bucket, &format!("{prefix}/{key}"), bytes)
    };
    let mut named = BTreeSet::new();
    for entry in std::fs::read_dir(fixture().join("shared")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        put(
            &format!("shared/{name}"),
            &std::fs::read(entry.path()).unwrap(),
        );
    }
    let mut all_shared: BTreeSet<String> = std::fs::read_dir(fixture().join("shared"))
        .unwrap()
        .map(|e| {
            format!(
                "{JOB}/shared/{}",
                e.unwrap().file_name().into_string().unwrap()
            )
        })
        .collect();
    for n in [4, 5, 6] {
        let chk = fixture().join(format!("chk-{n}"));
        let bytes = std::fs::read(chk.join("_metadata")).unwrap();
        let paths: Vec<(usize, String)> = file_handles(&bytes)
            .into_iter()
            .map(|(at, path, _)| {
                let uuid = path.rsplit('/').next().unwrap();
                named.insert(format!("{JOB}/shared/{uuid}"));
                (at, format!("s3://{bucket}/{prefix}/shared/{uuid}"))
            })
            .collect();
        put(
            &format!("chk-{n}/_metadata"),
            &metadata::with_paths(&bytes, paths).unwrap(),
        );
    }
    put("chk-7/0b8e3c52-in-flight", b"partial");
    put("shared/3c1d-aborted", b"never named");
    all_shared.insert(format!("{JOB}/shared/3c1d-aborted"));
    std::thread::sleep(Duration::from_secs(3));
    put("shared/4e2f-young", b"being uploaded");
    let src = format!("s3://{bucket}/gc/ck");
    let args = [
        src.as_str(),
        "--grace",
        "2s",
        "--checkpoint-timeout",
        "2s",
        "--num-retained",
        "3",
    ];
    let env = crate::common::moto::env_for(moto.port);
    // The delete goes through a proxy that counts its requests.
    let proxy = crate::common::moto::HttpProxy::start(moto.port);
    let counted = crate::common::moto::env_for(proxy.port);
    let run_with = |extra: &[&str], env: &[(&str, String)]| -> Value {
        let mut all = vec!["flink-gc"];
        all.extend_from_slice(&args);
        all.extend_from_slice(extra);
        all.push("--json");
        serde_json::from_str(&ok(crate::common::s3::ckptfs_with_env(&all, env))).unwrap()
    };
    let run = |extra: &[&str]| run_with(extra, &env);
    let mut expected: BTreeSet<String> = all_shared.difference(&named).cloned().collect();
    expected.insert(format!("{JOB}/chk-7/0b8e3c52-in-flight"));
    let report = run(&[]);
    assert_eq!(garbage_of(&report), expected, "{report}");
    assert_eq!(report["young"]["files"], 1);
    let scanned = report["scanned"]["files"].as_u64().unwrap();
    let report = run_with(&["--delete"], &counted);
    assert_eq!(
        report["deleted"]["deleted"]["files"],
        expected.len(),
        "{report}"
    );
    // One DeleteObjects request for them all, checked by the second scan's listing: no
    // object deleted one by one.
    assert_eq!(proxy.seen("POST", "?delete"), 1);
    assert_eq!(proxy.seen("DELETE", "/"), 0);
    let report = run(&[]);
    assert!(garbage_of(&report).is_empty(), "{report}");
    assert_eq!(
        report["scanned"]["files"].as_u64().unwrap(),
        scanned - expected.len() as u64
    );
    // What is left still imports.
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out =
        crate::common::s3::ckptfs_with_env(&["import-flink", &src, store.to_str().unwrap()], &env);
    assert_eq!(ok(out).lines().count(), 3);
}

/// Lines of a running job until `completes` more checkpoints are complete: the ids, and
/// each snapshot's record count. A "mismatch" line (a key's count not what its records make
/// it: state lost or restored wrong) fails the test.
pub(crate) fn run_until(
    job: &mut Job,
    completes: usize,
    snapshots: &mut BTreeMap<u64, u64>,
) -> Vec<u64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let mut done = Vec::new();
    while done.len() < completes {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint completed"
        );
        let Some(Ok(line)) = job.lines.next() else {
            panic!("the Flink job ended early")
        };
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["mismatch", ..] => panic!("the job's keyed state is wrong: {line}"),
            ["restored", "records", m] => job.restored = m.parse().ok(),
            ["snapshot", n, "records", m] => {
                snapshots.insert(n.parse().unwrap(), m.parse().unwrap());
            }
            ["complete", n] => done.push(n.parse().unwrap()),
            _ => {}
        }
    }
    done
}

/// SIGKILL the job while one of its checkpoints is in flight with files uploaded: a
/// `chk-N/` without `_metadata` beside a file in `shared/` no `_metadata` names. Seen so,
/// the job is frozen (SIGSTOP) and everything read again: only a leak that is still there
/// with the job stopped (no checkpoint completing in between, no `_metadata` half
/// written) kills it; otherwise it goes on (SIGCONT). Then what the job printed up to its
/// death is read: the record counts of the checkpoints it took meanwhile go to
/// `snapshots`.
fn kill_mid_checkpoint(
    mut job: Job,
    root: &Path,
    job_dir: impl Fn() -> Option<PathBuf>,
    snapshots: &mut BTreeMap<u64, u64>,
) {
    use nix::sys::signal::{kill, Signal};
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let root = root.canonicalize().unwrap();
    let pid = nix::unistd::Pid::from_raw(job.child.id() as i32);
    // A completed `_metadata` never changes: parsed once (the look while the job runs).
    let mut parsed: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "never saw a checkpoint in flight with files uploaded"
        );
        let Some(dir) = job_dir() else { continue };
        if leaked(&root, &dir, &mut parsed) {
            kill(pid, Signal::SIGSTOP).unwrap();
            if leaked(&root, &dir, &mut BTreeMap::new()) {
                let _ = job.child.kill();
                let _ = job.child.wait();
                break;
            }
            kill(pid, Signal::SIGCONT).unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    read_to_death(job, snapshots);
}

/// What a killed job printed up to its death, read: the record counts of the checkpoints
/// it took after the lines read so far go to `snapshots`.
fn read_to_death(mut job: Job, snapshots: &mut BTreeMap<u64, u64>) {
    for line in job.lines.by_ref().map_while(Result::ok) {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let ["snapshot", n, "records", m] = w.as_slice() {
            snapshots.insert(n.parse().unwrap(), m.parse().unwrap());
        }
    }
}

/// Whether job directory `dir` has a checkpoint in flight (a `chk-N/` without a complete
/// `_metadata`) and a file in `shared/` that no completed checkpoint of any job under
/// `root` names (a CLAIM job's name the other job's files). `parsed` caches `_metadata`
/// reads.
fn leaked(root: &Path, dir: &Path, parsed: &mut BTreeMap<PathBuf, Vec<String>>) -> bool {
    // Listed first: a file that appears later belongs to a later look.
    let shared: Vec<String> = std::fs::read_dir(dir.join("shared"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().to_str().unwrap().to_string())
        .collect();
    let mut in_flight = false;
    let mut named = BTreeSet::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().into_string().unwrap();
        if name.starts_with("chk-") && !entry.path().join("_metadata").is_file() {
            in_flight = true;
        }
    }
    for other in jobs(root) {
        for n in completed(&root.join(&other)) {
            let md = root.join(&other).join(format!("chk-{n}/_metadata"));
            if let Ok(bytes) = std::fs::read(&md) {
                let paths = parsed.entry(md).or_insert_with(|| named_paths(&bytes));
                named.extend(paths.iter().cloned());
            }
        }
    }
    in_flight && shared.iter().any(|p| !named.contains(p))
}

/// Real jobs leaking the ways production does, then cleaned while a job runs: job A killed
/// with -9 mid-checkpoint; job B restored from A's newest checkpoint in CLAIM mode (its
/// checkpoints name A's files), killed the same way; job C restored from B's newest in
/// NO_CLAIM mode and left running. The dry run finds exactly what the test computes from
/// every `_metadata`; `--delete`, run again and again while C checkpoints, deletes nothing
/// that was younger than the grace or that any checkpoint names; afterwards B's and C's
/// newest checkpoints restore with every key's count intact.
#[test]
fn flink_gc_cleans_after_killed_and_restored_jobs_while_one_runs() {
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let ck = dir.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    let ck = ck.canonicalize().unwrap();
    let opts = ["--timeout-ms", "10000", "--payload-bytes", "1024"];
    let job_other_than = |known: Vec<String>| {
        let ck = ck.clone();
        move || {
            jobs(&ck)
                .into_iter()
                .find(|j| !known.contains(j))
                .map(|j| ck.join(j))
        }
    };
    let mut snapshots = BTreeMap::new();

    let mut a = Job::start(&classpath, &ck, 0, &opts);
    run_until(&mut a, 3, &mut snapshots);
    kill_mid_checkpoint(a, &ck, job_other_than(vec![]), &mut snapshots);
    let job_a = jobs(&ck).pop().unwrap();
    let a_newest = *completed(&ck.join(&job_a)).last().unwrap();
    let chk = ck.join(&job_a).join(format!("chk-{a_newest}"));
    let mut b_args = vec!["--restore", chk.to_str().unwrap(), "--claim-mode", "CLAIM"];
    b_args.extend_from_slice(&opts);
    let mut b = Job::start(&classpath, &ck, 0, &b_args);
    let first_b = first_metadata(&ck, &job_a);
    let mut b_snapshots = BTreeMap::new();
    // One checkpoint only: later ones compact A's SSTs away into files of B's own.
    run_until(&mut b, 1, &mut b_snapshots);
    kill_mid_checkpoint(
        b,
        &ck,
        job_other_than(vec![job_a.clone()]),
        &mut b_snapshots,
    );
    let killed = SystemTime::now();
    let job_b = jobs(&ck).into_iter().find(|j| *j != job_a).unwrap();
    let b_newest = *completed(&ck.join(&job_b)).last().unwrap();
    let b_chk = ck.join(&job_b).join(format!("chk-{b_newest}"));
    let b_records = *b_snapshots
        .get(&b_newest)
        .unwrap_or_else(|| panic!("B printed no snapshot {b_newest}: {b_snapshots:?}"));
    // What CLAIM means: B's checkpoints name A's files (its first one, read as it
    // completed: later ones compact A's SSTs away; on a loaded machine Flink may compact
    // them before B's first checkpoint, and then this run checks everything but that).
    if !named_paths(&first_b).iter().any(|p| p.contains(&job_a)) {
        eprintln!("this run's job B named none of A's files: Flink compacted them first");
    }

    let mut c_args = vec![
        "--restore",
        b_chk.to_str().unwrap(),
        "--claim-mode",
        "NO_CLAIM",
    ];
    c_args.extend_from_slice(&opts);
    let mut c = Job::start(&classpath, &ck, 0, &c_args);
    let mut c_snapshots = BTreeMap::new();
    run_until(&mut c, 1, &mut c_snapshots);
    assert_eq!(
        c.restored,
        Some(b_records),
        "C starts where B's checkpoint was"
    );
    let job_c = jobs(&ck)
        .into_iter()
        .find(|j| *j != job_a && *j != job_b)
        .unwrap();
    // A's and B's leftovers older than the grace (10 s, the jobs' timeout).
    let grace = Duration::from_secs(10);
    let wait = (killed + grace + Duration::from_secs(1))
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    std::thread::sleep(wait);
    let cutoff = SystemTime::now() - grace;
    let expected: BTreeSet<String> = expected_garbage(&ck, cutoff)
        .into_iter()
        .filter(|p| !p.starts_with(&job_c))
        .collect();
    assert!(
        expected
            .iter()
            .any(|p| p.starts_with(&job_a) && p.contains("/shared/")),
        "A's in-flight checkpoint left no file: {expected:?}"
    );
    let args = [
        ck.to_str().unwrap(),
        "--grace",
        "10s",
        "--checkpoint-timeout",
        "10s",
        "--num-retained",
        "2",
    ];
    let report = gc_json(&args);
    let found: BTreeSet<String> = garbage_of(&report)
        .into_iter()
        .filter(|p| !p.starts_with(&job_c))
        .collect();
    assert_eq!(found, expected, "{report}");

    // --delete, again and again while C checkpoints.
    let mut deleted = BTreeSet::new();
    let mut with_delete = args.to_vec();
    with_delete.push("--delete");
    for round in 0..4 {
        let before = listing(&ck);
        let start = SystemTime::now();
        let report = gc_json(&with_delete);
        assert_eq!(
            report["deleted"]["failed"],
            serde_json::json!([]),
            "{report}"
        );
        for path in garbage_of(&report) {
            let seen = before
                .get(&path)
                .unwrap_or_else(|| panic!("{path} was not there"));
            assert!(
                seen.modified + grace < start,
                "{path} was younger than the grace"
            );
            if round == 0 {
                assert!(
                    !ck.join(&path).exists() || path.starts_with(&job_c),
                    "{path}"
                );
            }
            deleted.insert(path);
        }
        if round == 0 {
            assert!(expected.is_subset(&deleted));
        }
        run_until(&mut c, 1, &mut c_snapshots);
    }
    let c_done = run_until(&mut c, 2, &mut c_snapshots);
    // Killed, then read to its end: while the deletes ran, its lines waited in the pipe,
    // and the job went on checkpointing past the last one read.
    let _ = c.child.kill();
    let _ = c.child.wait();
    read_to_death(c, &mut c_snapshots);
    // No checkpoint left names a deleted file.
    for job in jobs(&ck) {
        for n in completed(&ck.join(&job)) {
            let bytes = std::fs::read(ck.join(&job).join(format!("chk-{n}/_metadata"))).unwrap();
            for path in named_paths(&bytes) {
                let rel = Path::new(&path).strip_prefix(&ck).unwrap();
                assert!(!deleted.contains(rel.to_str().unwrap()), "{path}");
            }
        }
    }
    // B's newest (naming A's files) and C's newest restore, every key's count intact.
    // C's newest completed checkpoint whose record count the job printed before it was
    // killed (one that completed as it died printed its count unread).
    let c_newest = completed(&ck.join(&job_c))
        .into_iter()
        .rev()
        .find(|n| c_snapshots.contains_key(n))
        .unwrap_or_else(|| {
            panic!(
                "no retained checkpoint of C ({:?}) has its record count: {c_snapshots:?}, \
                 completes read {c_done:?}",
                completed(&ck.join(&job_c))
            )
        });
    assert!(c_done.contains(&c_newest) || c_newest >= c_done[0]);
    for (chk, records) in [
        (b_chk, b_records),
        (
            ck.join(&job_c).join(format!("chk-{c_newest}")),
            c_snapshots[&c_newest],
        ),
    ] {
        let out = dir.path().join("ck-restored");
        let mut job = Job::start(&classpath, &out, 0, &["--restore", chk.to_str().unwrap()]);
        run_until(&mut job, 2, &mut BTreeMap::new());
        assert_eq!(job.restored, Some(records), "{}", chk.display());
    }
}

/// The `_metadata` of the first checkpoint completed under `root` by a job other than
/// `other`, read as soon as it is there (polled every 10 ms, for up to 3 minutes).
pub(crate) fn first_metadata(root: &Path, other: &str) -> Vec<u8> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint of a second job completed"
        );
        if let Some(job) = jobs(root).into_iter().find(|j| j != other) {
            if let Some(n) = completed(&root.join(&job)).first() {
                let md = root.join(&job).join(format!("chk-{n}/_metadata"));
                // Whole: the same bytes a moment later (Flink may still be writing it).
                if let Ok(bytes) = std::fs::read(&md) {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    if !bytes.is_empty() && std::fs::read(&md).ok().as_ref() == Some(&bytes) {
                        return bytes;
                    }
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The physical files a `_metadata`'s file-merging segments name: type byte 15, an i64
/// offset, an i64 size and an i32 scope before the length-prefixed `file:` string.
fn segment_paths(bytes: &[u8]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for i in 23..bytes.len().saturating_sub(5) {
        if &bytes[i..i + 5] == b"file:" && bytes[i - 23] == 15 {
            let len = u16::from_be_bytes([bytes[i - 2], bytes[i - 1]]) as usize;
            if let Some(Ok(s)) = bytes.get(i..i + len).map(std::str::from_utf8) {
                let path = s.trim_start_matches("file:");
                out.insert(path.strip_prefix("//").unwrap_or(path).to_string());
            }
        }
    }
    out
}

/// The files in job `job`'s file-merging directories (`shared/<dir>/`, `taskowned/<dir>/`),
/// by path below `ck`.
fn merged_files(ck: &Path, job: &str) -> BTreeMap<String, Seen> {
    listing(ck)
        .into_iter()
        .filter(|(rel, _)| {
            let parts: Vec<&str> = rel.split('/').collect();
            parts.len() == 4 && parts[0] == job && ["shared", "taskowned"].contains(&parts[1])
        })
        .collect()
}

/// Every physical file job `job`'s completed checkpoints name by a segment, below `ck`.
fn named_segments(ck: &Path, job: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for n in completed(&ck.join(job)) {
        let Ok(bytes) = std::fs::read(ck.join(job).join(format!("chk-{n}/_metadata"))) else {
            continue;
        };
        for path in segment_paths(&bytes) {
            if let Ok(rel) = Path::new(&path).strip_prefix(ck) {
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// Lines of a running job until one is `want` (a "mismatch" fails the test).
fn wait_line(job: &mut Job, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the job never said {want}"
        );
        let Some(Ok(line)) = job.lines.next() else {
            panic!("the Flink job ended early")
        };
        assert!(!line.starts_with("mismatch"), "{line}");
        if line == want {
            return;
        }
    }
}

/// File merging across checkpoint boundaries: a physical file stays open in its pool after
/// a checkpoint, and later checkpoints append to it. Job A's checkpoint 1 expires after
/// "counter" wrote its files into new pooled files; then its checkpoints expire with nothing
/// written (the source holds the barrier, as under backpressure) until those files, named
/// by no completed checkpoint, are older than the grace. `flink-gc --delete` then runs: it
/// must not delete them, for A's next checkpoints append to them and name them (before the
/// fix it deleted them, and A's checkpoints named files that were gone). Job B, killed
/// after the same first checkpoint, has nothing that will ever append to its files: they
/// are deleted, and so are A's unnamed ones once A is killed. A's newest checkpoint
/// restores with every key's count intact.
#[test]
fn flink_gc_keeps_the_pooled_files_of_a_job_merging_across_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let ck = dir.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    let ck = ck.canonicalize().unwrap();
    let grace = Duration::from_secs(5);
    let with = |stall: &'static str| {
        [
            "--file-merging-across",
            "true",
            "--timeout-ms",
            "2000",
            "--payload-bytes",
            "1024",
            "--rate",
            "150",
            "--stall",
            stall,
        ]
    };

    // B: killed while its checkpoints stall, its files written for checkpoint 1 only.
    let mut b = Job::start(&classpath, &ck, 0, &with("1:600000"));
    wait_line(&mut b, "stall 2");
    b.kill();
    let job_b = jobs(&ck).pop().unwrap();
    let b_files: BTreeSet<String> = merged_files(&ck, &job_b).into_keys().collect();
    assert!(
        b_files.iter().any(|p| p.contains("/shared/")),
        "{b_files:?}"
    );

    // A: its checkpoints stall 12 s after checkpoint 1 expired.
    let mut a = Job::start(&classpath, &ck, 0, &with("1:12000"));
    wait_line(&mut a, "stall 2");
    let job_a = jobs(&ck).into_iter().find(|j| *j != job_b).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let pooled = loop {
        assert!(std::time::Instant::now() < deadline, "no pooled file aged");
        let files: BTreeMap<String, Seen> = merged_files(&ck, &job_a)
            .into_iter()
            .filter(|(p, _)| p.contains("/shared/"))
            .collect();
        let newest = files.values().map(|s| s.modified).max();
        if newest.is_some_and(|t| t + grace + Duration::from_secs(1) < SystemTime::now()) {
            break files;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let report = gc_json(&[
        ck.to_str().unwrap(),
        "--grace",
        "5s",
        "--checkpoint-timeout",
        "2s",
        "--num-retained",
        "2",
        "--delete",
    ]);
    // What this test is about: A's pooled files were named by no completed checkpoint
    // and older than the grace when flink-gc ran.
    assert!(
        completed(&ck.join(&job_a)).is_empty(),
        "A completed a checkpoint before flink-gc ran: the machine was too slow for this test"
    );
    let deleted = garbage_of(&report);
    let mut snapshots = BTreeMap::new();
    run_until(&mut a, 2, &mut snapshots);
    let named = named_segments(&ck, &job_a);
    let lost: Vec<&String> = named.intersection(&deleted).collect();
    assert!(
        lost.is_empty(),
        "flink-gc deleted files that A, running, appended to and its later checkpoints name: \
         {lost:?}\n{report}"
    );
    assert!(
        pooled.keys().any(|p| named.contains(p)),
        "A's later checkpoints name none of the pooled files: {pooled:?}"
    );
    assert!(deleted.iter().all(|p| !p.starts_with(&job_a)), "{report}");
    assert!(b_files.is_subset(&deleted), "{b_files:?}\n{report}");
    assert!(
        report["pooled"]["files"].as_u64().unwrap() >= pooled.len() as u64,
        "{report}"
    );

    // A killed: once it wrote nothing for the grace, what its checkpoints do not name in
    // its file-merging directories is garbage (usually nothing: its last checkpoints name
    // every pooled file again; B's files are the ones that surely go), and nothing they
    // name is.
    let _ = a.child.kill();
    let _ = a.child.wait();
    read_to_death(a, &mut snapshots);
    std::thread::sleep(grace + Duration::from_secs(1));
    let named = named_segments(&ck, &job_a);
    let unnamed: BTreeSet<String> = merged_files(&ck, &job_a)
        .into_keys()
        .filter(|p| !named.contains(p))
        .collect();
    let report = gc_json(&[
        ck.to_str().unwrap(),
        "--grace",
        "5s",
        "--checkpoint-timeout",
        "2s",
        "--num-retained",
        "2",
        "--delete",
    ]);
    let deleted = garbage_of(&report);
    eprintln!(
        "A killed: {} files of its file-merging directories named by no checkpoint",
        unnamed.len()
    );
    assert!(unnamed.is_subset(&deleted), "{unnamed:?}\n{report}");
    assert!(named.is_disjoint(&deleted), "{report}");
    assert_eq!(report["pooled"]["files"], 0, "{report}");

    // A's newest checkpoint restores, every key's count intact.
    let newest = completed(&ck.join(&job_a))
        .into_iter()
        .rev()
        .find(|n| snapshots.contains_key(n))
        .unwrap();
    let chk = ck.join(&job_a).join(format!("chk-{newest}"));
    let out = dir.path().join("ck-restored");
    let mut job = Job::start(&classpath, &out, 0, &["--restore", chk.to_str().unwrap()]);
    run_until(&mut job, 2, &mut BTreeMap::new());
    assert_eq!(job.restored, Some(snapshots[&newest]), "{}", chk.display());
}

/// The modification time of directory `path` (and of every directory below it) set to
/// `age` ago.
fn set_dirs_age(path: &Path, age: Duration) {
    for entry in std::fs::read_dir(path).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            set_dirs_age(&entry.path(), age);
        }
    }
    let dir = std::fs::File::open(path).unwrap();
    dir.set_modified(SystemTime::now() - age).unwrap();
}

/// The file-merging rule without Flink, on the fixture: a file in a file-merging directory
/// that no checkpoint names, older than the grace, is kept (`pooled`) while anything below
/// its job's directory was written within the grace, and is garbage once nothing was; it
/// is kept again, whatever the job's last write, when the job's completed checkpoints came
/// further apart than the grace minus the checkpoint timeout.
#[test]
fn flink_gc_judges_file_merging_directories_by_their_jobs_last_write() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ck");
    let job = fixture_at(&root);
    let old = Duration::from_secs(7200);
    let pooled = [
        format!("shared/job_{JOB}_op_0a448493b4782967b150582570326227_0_2/3c1f-pooled"),
        format!("taskowned/job_{JOB}_tm_localhost-1/77aa-pooled"),
    ];
    for rel in &pooled {
        let path = job.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "a pooled physical file").unwrap();
        set_age(&path, old);
    }
    let root_s = root.to_str().unwrap();
    let args = [root_s, "--num-retained", "3"];
    let is_garbage = |report: &Value| {
        let garbage = garbage_of(report);
        pooled
            .iter()
            .map(|rel| garbage.contains(&format!("{JOB}/{rel}")))
            .collect::<Vec<bool>>()
    };

    // Its directories were made just now: the job wrote within the grace.
    let report = gc_json(&args);
    assert_eq!(is_garbage(&report), [false, false], "{report}");
    assert_eq!(report["pooled"]["files"], 2, "{report}");
    assert_eq!(report["jobs"][0]["writing"], true, "{report}");
    let table = ok(ckptfs(&["flink-gc", root_s, "--num-retained", "3"]));
    assert!(
        table.contains("kept, in the file-merging directories"),
        "{table}"
    );

    // Nothing below the job's directory, nor the directory itself, written for the grace.
    set_dirs_age(&root, old);
    let report = gc_json(&args);
    assert_eq!(is_garbage(&report), [true, true], "{report}");
    assert_eq!(report["pooled"]["files"], 0, "{report}");
    assert_eq!(report["jobs"][0]["writing"], false, "{report}");

    // Checkpoints 4, 5 and 6 completed 5 h, 3 h and 2 h ago: up to 2 h apart, more than
    // the grace (1 h) minus the timeout (10 min).
    for (n, hours) in [(4, 5), (5, 3), (6, 2)] {
        set_age(
            &job.join(format!("chk-{n}/_metadata")),
            Duration::from_secs(hours * 3600),
        );
    }
    let report = gc_json(&args);
    assert_eq!(is_garbage(&report), [false, false], "{report}");
    assert_eq!(report["pooled"]["files"], 2, "{report}");
    assert_eq!(
        report["jobs"][0]["checkpoints_apart_ms"], 7_200_000,
        "{report}"
    );
    let table = ok(ckptfs(&["flink-gc", root_s, "--num-retained", "3"]));
    assert!(
        table.contains("its checkpoints came up to 2h apart"),
        "{table}"
    );
}
