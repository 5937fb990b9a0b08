//! A checkpoint root, not one job (issue 30): a Flink job restarted from a checkpoint gets
//! a new job id and writes a new directory beside the old one under
//! `execution.checkpointing.dir`. `mount --flink ROOT` and `import-flink ROOT` take the
//! root with any number of jobs, old and new: a restart never needs the daemon restarted,
//! and a job restored in CLAIM mode reads the older job's files inside the root without
//! `--flink-root`. In the mount, `flink/<job-id>/chk-<N> -> ../../cp-M` names each
//! imported checkpoint by Flink's own ids.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::mounted::{ckptfs, ok, Mounted};
use crate::flink::{check_tree, cp_a, fixture, wait_for, Job};
use crate::flink_gc::{completed, first_metadata, jobs, named_paths, run_until};

/// The fixture job's id (tests/fixtures/flink/job1).
const FIXTURE_JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";

/// The (job, Flink checkpoint) -> ckptfs checkpoint of `ckptfs ls --json` of `target`.
fn flink_labels(target: &Path) -> BTreeMap<(String, u64), u64> {
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&ok(ckptfs(&["ls", target.to_str().unwrap(), "--json"]))).unwrap();
    rows.iter()
        .filter(|r| !r["flink"].is_null())
        .map(|r| {
            (
                (
                    r["flink"]["job"].as_str().unwrap().to_string(),
                    r["flink"]["checkpoint"].as_u64().unwrap(),
                ),
                r["id"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Every link under `mnt/flink/`: (job, chk-N's N) -> the M of its `../../cp-M`. A link
/// (or a job's directory) that goes while it is read, its checkpoint dropped by the
/// store's retention meanwhile, is left out.
fn flink_links(mnt: &Path) -> BTreeMap<(String, u64), u64> {
    let mut out = BTreeMap::new();
    let Ok(jobs) = std::fs::read_dir(mnt.join("flink")) else {
        return out;
    };
    for job in jobs {
        let Ok(job) = job else { continue };
        let name = job.file_name().into_string().unwrap();
        let Ok(links) = std::fs::read_dir(job.path()) else {
            continue;
        };
        for link in links {
            let Ok(link) = link else { continue };
            assert!(link.file_type().unwrap().is_symlink(), "{:?}", link.path());
            let n: u64 = link
                .file_name()
                .to_str()
                .unwrap()
                .strip_prefix("chk-")
                .unwrap()
                .parse()
                .unwrap();
            let Ok(target) = std::fs::read_link(link.path()) else {
                continue;
            };
            let cp: u64 = target
                .to_str()
                .unwrap()
                .strip_prefix("../../cp-")
                .unwrap_or_else(|| panic!("{target:?}"))
                .parse()
                .unwrap();
            out.insert((name.clone(), n), cp);
        }
    }
    out
}

/// The real thing, one run of jobs shared by every check: a follower mounted on an empty
/// checkpoint root; job A runs, is followed, and is killed with -9; job B is restored from
/// A's newest checkpoint in CLAIM mode (its checkpoints name A's files, in A's directory
/// beside it), runs and is killed. The same daemon imports B's checkpoints, with no
/// `--flink-root`; `flink/<A>/chk-*` and `flink/<B>/chk-*` link to the checkpoints `ls
/// --json` labels with them; `cd` and `cp -r` through a link of B give its subtasks with
/// the state of the records its snapshot held (ldb and the rocksdb crate count every
/// column family). `import-flink ROOT` into a new store imports both jobs, A's first, and a
/// second run nothing.
#[test]
fn a_restarted_job_in_the_same_root_is_followed_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let ck = dir.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    let ck = ck.canonicalize().unwrap();
    let (store, mnt) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &["--flink", ck.to_str().unwrap()]);
    assert!(!mnt.join("flink").exists(), "flink/ before any import");

    // A payload per key (1 KiB, rewritten with every record) makes SSTs too large to be
    // inlined into `_metadata`: B's first checkpoint names A's uploaded files.
    let opts = ["--timeout-ms", "10000", "--payload-bytes", "1024"];
    let mut a = Job::start(&classpath, &ck, 0, &opts);
    let mut a_snapshots = BTreeMap::new();
    run_until(&mut a, 3, &mut a_snapshots);
    let job_a = jobs(&ck).pop().unwrap();
    wait_for("one of A's checkpoints imported", || {
        !flink_links(&mnt).is_empty()
    });
    kill_between_checkpoints(&mut a, &mut a_snapshots);
    let a_newest = *completed(&ck.join(&job_a)).last().unwrap();
    // Every checkpoint the killed job left is imported.
    wait_for("A's newest checkpoint imported", || {
        flink_links(&mnt).contains_key(&(job_a.clone(), a_newest))
    });

    let restore_from = ck.join(&job_a).join(format!("chk-{a_newest}"));
    let mut b_args = vec![
        "--restore",
        restore_from.to_str().unwrap(),
        "--claim-mode",
        "CLAIM",
    ];
    b_args.extend_from_slice(&opts);
    let mut b = Job::start(&classpath, &ck, 0, &b_args);
    let mut b_snapshots = BTreeMap::new();
    // B's first checkpoint, read the moment its `_metadata` is there: it still names A's
    // SSTs, which later ones compact away into files of B's own (and Flink deletes it
    // once it retains two newer ones, which a loaded machine may let happen before the
    // job says it is complete).
    let first_b = first_metadata(&ck, &job_a);
    // One checkpoint (and what completes before the kill).
    run_until(&mut b, 1, &mut b_snapshots);
    kill_and_read(&mut b, &mut b_snapshots);
    // B's own check of its restored keyed state (a key's count not what its records make
    // it fails run_until): it started where A's checkpoint was.
    assert_eq!(b.restored, a_snapshots.get(&a_newest).copied());
    let job_b = jobs(&ck).into_iter().find(|j| *j != job_a).unwrap();
    let b_done = completed(&ck.join(&job_b));
    assert!(!b_done.is_empty());
    // What CLAIM means: B's checkpoints name A's files, in A's directory, which the
    // follower then reads with no --flink-root. Flink may have compacted them away before
    // B's first checkpoint (it did on a loaded machine); the read of a sibling job's files
    // is also checked in flink::import's unit tests.
    if !named_paths(&first_b).iter().any(|p| p.contains(&job_a)) {
        eprintln!("this run's job B named none of A's files: Flink compacted them first");
    }

    // The same daemon: B's retained checkpoints imported, with no --flink-root.
    wait_for("B's checkpoints imported", || {
        let links = flink_links(&mnt);
        b_done
            .iter()
            .all(|n| links.contains_key(&(job_b.clone(), *n)))
    });
    let status = m.status();
    assert!(
        !status["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("outside"),
        "{status}"
    );
    // Every link is the label ls gives, and every labelled checkpoint has its link.
    let labels = flink_labels(&mnt);
    assert_eq!(flink_links(&mnt), labels);
    let jobs_linked: Vec<String> = std::fs::read_dir(mnt.join("flink"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(jobs_linked.len(), 2, "{jobs_linked:?}");
    // A's checkpoints were imported before B's.
    let newest_a = labels
        .iter()
        .filter(|((j, _), _)| *j == job_a)
        .map(|(_, cp)| *cp)
        .max()
        .unwrap();
    let oldest_b = labels
        .iter()
        .filter(|((j, _), _)| *j == job_b)
        .map(|(_, cp)| *cp)
        .min()
        .unwrap();
    assert!(newest_a < oldest_b, "{labels:?}");

    // `ls -l` shows the links, and `ckptfs ls` Flink's names.
    let b_chk = b_done[0];
    let cp = labels[&(job_b.clone(), b_chk)];
    let listing = Command::new("ls")
        .arg("-l")
        .arg(mnt.join("flink").join(&job_b))
        .output()
        .unwrap();
    let listing = ok(listing);
    assert!(
        listing.contains(&format!("chk-{b_chk} -> ../../cp-{cp}")),
        "{listing}"
    );
    let table = ok(ckptfs(&["ls", mnt.to_str().unwrap()]));
    assert!(table.lines().next().unwrap().ends_with("FLINK"), "{table}");
    assert!(
        table.contains(&format!("{}…/chk-{b_chk}", &job_b[..8])),
        "{table}"
    );
    // `cd` through the link.
    let link = mnt.join("flink").join(&job_b).join(format!("chk-{b_chk}"));
    let inside = ok(Command::new("sh")
        .arg("-c")
        .arg(format!("cd '{}' && ls", link.display()))
        .output()
        .unwrap());
    assert!(inside.lines().any(|l| l == "_flink"), "{inside}");
    assert!(inside.lines().any(|l| l == "counter"), "{inside}");
    // `cp -r` through it: the subtasks hold the state of the records B's snapshot held.
    let out = dir.path().join("through-the-link");
    assert!(Command::new("cp")
        .arg("-r")
        .arg(format!("{}/.", link.display()))
        .arg(&out)
        .status()
        .unwrap()
        .success());
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    check_tree(&classpath, &out, b_snapshots[&b_chk], &scratch);
    // A dropped checkpoint's link goes (the kernel is told to forget it). The oldest: the
    // newest is not dropped by rmdir.
    let ((job, n), cp) = labels.iter().min_by_key(|(_, cp)| **cp).unwrap();
    let dropped = mnt.join("flink").join(job).join(format!("chk-{n}"));
    assert!(dropped.symlink_metadata().is_ok());
    std::fs::remove_dir(mnt.join(format!("cp-{cp}"))).unwrap();
    assert!(!flink_links(&mnt).contains_key(&(job.clone(), *n)));
    wait_for("the dropped checkpoint's link gone", || {
        dropped.symlink_metadata().is_err()
    });
    m.umount();

    // import-flink of the root into a new store: both jobs, A's first; twice: nothing new.
    assert_intact(&ck);
    let fresh = dir.path().join("fresh");
    let args = [
        "import-flink",
        ck.to_str().unwrap(),
        fresh.to_str().unwrap(),
    ];
    let ids = ok(ckptfs(&args));
    let on_disk: usize = [&job_a, &job_b]
        .iter()
        .map(|j| completed(&ck.join(j)).len())
        .sum();
    assert_eq!(ids.lines().count(), on_disk, "{ids}");
    let imported = flink_labels(&fresh);
    let mut by_id: Vec<(u64, String)> = imported
        .iter()
        .map(|((job, _), cp)| (*cp, job.clone()))
        .collect();
    by_id.sort();
    let order: Vec<&str> = by_id.iter().map(|(_, j)| j.as_str()).collect();
    let first_b = order.iter().position(|j| *j == job_b).unwrap();
    assert!(order[..first_b].iter().all(|j| *j == job_a), "{order:?}");
    assert!(order[first_b..].iter().all(|j| *j == job_b), "{order:?}");
    assert!(first_b > 0, "{order:?}");
    assert_eq!(ok(ckptfs(&args)), "");
}

/// SIGKILL `job` between two checkpoints: a moment after one completes, once Flink has
/// deleted the checkpoint it subsumed (killed while it deletes one, Flink leaves its
/// `_metadata` naming files already gone: a checkpoint no one can restore or import).
fn kill_between_checkpoints(job: &mut Job, snapshots: &mut BTreeMap<u64, u64>) {
    run_until(job, 1, snapshots);
    std::thread::sleep(std::time::Duration::from_millis(400));
    kill_and_read(job, snapshots);
}

/// Every completed checkpoint under `root` names only files that are there.
fn assert_intact(root: &Path) {
    for job in jobs(root) {
        for n in completed(&root.join(&job)) {
            let md = root.join(&job).join(format!("chk-{n}/_metadata"));
            for path in named_paths(&std::fs::read(&md).unwrap()) {
                let file = path.trim_start_matches("file:");
                assert!(
                    Path::new(file).is_file(),
                    "Flink left {} naming {file}, which is gone",
                    md.display()
                );
            }
        }
    }
}

/// SIGKILL `job`, then read what it printed before it died: each snapshot's record count.
fn kill_and_read(job: &mut Job, snapshots: &mut BTreeMap<u64, u64>) {
    let _ = job.child.kill();
    let _ = job.child.wait();
    for line in job.lines.by_ref().map_while(Result::ok) {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["mismatch", ..] => panic!("the job's keyed state is wrong: {line}"),
            ["snapshot", n, "records", m] => {
                snapshots.insert(n.parse().unwrap(), m.parse().unwrap());
            }
            _ => {}
        }
    }
}

/// `dir/ck/<id>`: a copy of the fixture job as the only job of a checkpoint root.
fn root_of_one_job(dir: &Path) -> PathBuf {
    let root = dir.join("ck");
    std::fs::create_dir(&root).unwrap();
    cp_a(&fixture(), &root.join(FIXTURE_JOB));
    root
}

/// A root holding one job imports as that job's directory does: the same checkpoints,
/// labelled alike; and a second job in the root whose `_metadata` names a file outside
/// the root (a copy of the first job's files beside it) is refused, nothing of it imported
/// (the first job's checkpoints, imported before it, stay), while the same job naming the
/// files inside the root imports, and alone: the first job's are held.
#[test]
fn a_root_of_one_job_imports_as_before_and_files_outside_it_stay_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_of_one_job(dir.path());
    let (by_root, by_job) = (dir.path().join("by-root"), dir.path().join("by-job"));
    let job = root.join(FIXTURE_JOB);
    for (src, store) in [(&root, &by_root), (&job, &by_job)] {
        let ids = ok(ckptfs(&[
            "import-flink",
            src.to_str().unwrap(),
            store.to_str().unwrap(),
        ]));
        assert_eq!(ids.lines().collect::<Vec<_>>(), ["1", "2", "3"]);
    }
    assert_eq!(flink_labels(&by_root), flink_labels(&by_job));

    // Job B beside it, restored "in CLAIM mode" from a copy outside the root.
    let outside = dir.path().join("outside");
    cp_a(&fixture(), &outside);
    let job_b = root.join("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b");
    let chk = job_b.join("chk-7");
    std::fs::create_dir_all(&chk).unwrap();
    std::fs::create_dir(job_b.join("shared")).unwrap();
    let bytes = std::fs::read(fixture().join("chk-6/_metadata")).unwrap();
    let naming = |dir: &Path| {
        let paths: Vec<(usize, String)> = crate::flink::file_handles(&bytes)
            .into_iter()
            .map(|(at, path, _)| {
                let name = path.rsplit('/').next().unwrap();
                (at, format!("file:{}/shared/{name}", dir.display()))
            })
            .collect();
        ckptfs_core::flink::metadata::with_paths(&bytes, paths).unwrap()
    };
    std::fs::write(chk.join("_metadata"), naming(&outside)).unwrap();
    let store = dir.path().join("store");
    let out = ckptfs(&[
        "import-flink",
        root.to_str().unwrap(),
        store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("EACCES") && e.contains("outside the source"),
        "{e}"
    );
    let labels = flink_labels(&store);
    assert_eq!(labels.len(), 3, "{labels:?}");
    assert!(
        labels.keys().all(|(job, _)| job == FIXTURE_JOB),
        "{labels:?}"
    );
    // Named inside the root (A's own shared/): imported, after A's.
    std::fs::write(chk.join("_metadata"), naming(&job)).unwrap();
    let ids = ok(ckptfs(&[
        "import-flink",
        root.to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    assert_eq!(ids.trim(), "4");
    let labels = flink_labels(&store);
    assert_eq!(
        labels.get(&("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b".to_string(), 7)),
        Some(&4),
        "{labels:?}"
    );
}
