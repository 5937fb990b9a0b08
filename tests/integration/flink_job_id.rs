//! A job restored under the job id of the job it came from (issue 42): application mode on
//! Kubernetes fixes the job id (`$internal.pipeline.job-id`), so the restored job writes
//! into the same `<job-id>/` directory, its checkpoint ids going on from the restored
//! checkpoint's: below the newest the store holds of that job, and the same ids as
//! checkpoints it holds. The follower imports that later line (its `_metadata` written after
//! every checkpoint the store holds of the job), and the mount's `flink/<job>/chk-N` names
//! the later line's checkpoints and the history below them.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::mounted::{ckptfs, ok, Mounted};
use crate::flink::{wait_for, Job};

/// The fixed job id of both lines.
const JOB: &str = "0000000000000000000000000000b042";

/// The records of each checkpoint `job` completes ("snapshot C records M", "complete C"),
/// read until checkpoint `until` completes.
fn completed_until(job: &mut Job, until: u64) -> BTreeMap<u64, u64> {
    let (mut snapshots, mut done) = (BTreeMap::new(), BTreeMap::new());
    while !done.contains_key(&until) {
        let Some(Ok(line)) = job.lines.next() else {
            panic!("the job ended before checkpoint {until} completed: {done:?}");
        };
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["restored", "records", m] => job.restored = m.parse().ok(),
            ["mismatch", ..] => panic!("the job's keyed state is wrong: {line}"),
            ["snapshot", c, "records", m] => {
                snapshots.insert(c.parse::<u64>().unwrap(), m.parse::<u64>().unwrap());
            }
            ["complete", c] => {
                let c: u64 = c.parse().unwrap();
                done.insert(c, snapshots[&c]);
            }
            _ => {}
        }
    }
    done
}

/// Flink checkpoint id -> the ckptfs checkpoints imported from it (of job `JOB`), oldest
/// first.
fn imported(mnt: &Path) -> BTreeMap<u64, Vec<u64>> {
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&ok(ckptfs(&["ls", mnt.to_str().unwrap(), "--json"]))).unwrap();
    let mut out: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r["flink"]["job"] == JOB) {
        out.entry(r["flink"]["checkpoint"].as_u64().unwrap())
            .or_default()
            .push(r["id"].as_u64().unwrap());
    }
    out
}

/// `flink/JOB/chk-N` -> the M of its `../../cp-M`.
fn links(mnt: &Path) -> BTreeMap<u64, u64> {
    std::fs::read_dir(mnt.join("flink").join(JOB))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let n = e.file_name().to_str().unwrap()["chk-".len()..]
                .parse()
                .unwrap();
            let to = std::fs::read_link(e.path()).unwrap();
            let cp = to.to_str().unwrap()["../../cp-".len()..].parse().unwrap();
            (n, cp)
        })
        .collect()
}

/// A real job with a fixed id runs to its checkpoint 7 (followed by the mount), is killed,
/// and is restored under the same id from the mount's `flink/<job>/chk-2`, at half the
/// rate: its checkpoints 3 and 4 (written into the same directory, below the newest the
/// store holds, with ids the store holds) are imported beside the first line's; the mount
/// names them `chk-3`, `chk-4`, and the first line's 5 to 7 keep their `cp-M` only; a job
/// restored from `flink/<job>/chk-4` starts from the later line's records, its state
/// checked key by key. Before, the follower skipped the later line (ids at or below the
/// newest it held) and `chk-4` restored the first line's state.
#[test]
fn a_job_restored_under_the_same_job_id_is_imported_as_a_later_line() {
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let root = dir.path().join("checkpoints");
    std::fs::create_dir(&root).unwrap();
    let store = dir.path().join("store");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(
        &store,
        &mnt,
        &["--flink", root.to_str().unwrap(), "--keep-last", "50"],
    );
    let fixed = ["--job-id", JOB];

    let mut first = Job::start(&classpath, &root, 0, &fixed);
    let first_line = completed_until(&mut first, 7);
    wait_for("the first line's checkpoint 2", || {
        imported(&mnt).contains_key(&2)
    });
    first.kill();
    wait_for("the first line's checkpoint 7", || {
        imported(&mnt).contains_key(&7)
    });
    let before = imported(&mnt);

    let from = mnt.join(format!("flink/{JOB}/chk-2"));
    let mut args = vec!["--restore", from.to_str().unwrap(), "--rate", "150"];
    args.extend(fixed);
    let mut second = Job::start(&classpath, &root, 0, &args);
    let later_line = completed_until(&mut second, 4);
    // It went on from the first line's checkpoint 2.
    assert_eq!(second.restored, Some(first_line[&2]));
    second.kill();
    assert_ne!(
        later_line[&4], first_line[&4],
        "{later_line:?} {first_line:?}"
    );
    wait_for("the later line's checkpoints 3 and 4", || {
        let now = imported(&mnt);
        now[&3].len() == 2 && now[&4].len() == 2
    });
    let after = imported(&mnt);
    for n in [3, 4] {
        assert_eq!(after[&n][0], before[&n][0]);
        assert!(after[&n][1] > before[&7][0], "{after:?}");
    }
    // flink/JOB/ names the later line and the history below it; the first line's 5 to 7
    // keep their cp-M.
    let named = links(&mnt);
    assert_eq!(
        named,
        [
            (1, before[&1][0]),
            (2, before[&2][0]),
            (3, after[&3][1]),
            (4, after[&4][1])
        ]
        .into(),
        "{after:?}"
    );
    for n in 5..=7 {
        assert!(mnt.join(format!("cp-{}", before[&n][0])).is_dir());
    }

    // Restored from chk-4 of the mount: the later line's state.
    let records = later_line[&4];
    let by_name = mnt.join(format!("flink/{JOB}/chk-4"));
    let mut third = Job::start(
        &classpath,
        &dir.path().join("third"),
        records + 100,
        &["--restore", by_name.to_str().unwrap()],
    );
    third.checkpoint_with(records + 100);
    let restored = third.restored;
    third.kill();
    assert_eq!(restored, Some(records));
    m.umount();
}
