//! A Flink job restored straight from the mount: `execution.state-recovery.path` is a
//! checkpoint's directory in the mount, whose `_metadata` (made by the mount from Flink's
//! own) names the mount's files; nothing is copied first. Locally, and through a read-only
//! mount of a store on object storage (another host's view).

use std::path::Path;

use crate::common::mounted::{ckptfs, ok};
use crate::flink::{cp_a, fixture, fixture_only_in_a_mount, Job};
use crate::flink_gc::named_paths;

/// The fixture's job and its checkpoint 4, which holds 933 records.
const JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";
const RECORDS_AT_4: u64 = 933;

/// Every file `cp_dir/_metadata` names is below `cp_dir`, there and of the size Flink
/// recorded; the paths Flink named relative to it too.
fn names_only_the_mount(cp_dir: &Path) {
    let bytes = std::fs::read(cp_dir.join("_metadata")).unwrap();
    let named = named_paths(&bytes);
    assert!(named.len() > 5, "{named:?}");
    for path in &named {
        let path = Path::new(path);
        assert!(
            path.starts_with(cp_dir),
            "{} is outside the mount",
            path.display()
        );
        assert!(path.is_file(), "{} is not there", path.display());
    }
    // The original names Flink's directory, which is gone.
    let original = std::fs::read(cp_dir.join("_flink/0/_metadata")).unwrap();
    assert!(named_paths(&original)
        .iter()
        .all(|p| !p.starts_with(cp_dir.to_str().unwrap())));
}

/// A job restored from `chk` (a directory in a mount) goes on from the 933 records of the
/// fixture's checkpoint 4 to 1200, its keyed state checked key by key as it runs.
pub(crate) fn restores_from(classpath: &str, chk: &Path, scratch: &Path) {
    let ck = scratch.join("ck-restored");
    let mut job = Job::start(classpath, &ck, 1200, &["--restore", chk.to_str().unwrap()]);
    job.checkpoint_with(1200);
    let restored = job.restored;
    job.kill();
    assert_eq!(
        restored,
        Some(RECORDS_AT_4),
        "restored from {}",
        chk.display()
    );
}

#[test]
fn a_flink_job_restores_from_the_mount_with_nothing_copied() {
    let dir = tempfile::tempdir().unwrap();
    // Flink's directory is gone: only the store has the checkpoints.
    let (classpath, mnt, m) = fixture_only_in_a_mount(dir.path(), JOB, &[]);
    let store = dir.path().join("store");
    let cp = mnt.join("cp-1");
    names_only_the_mount(&cp);
    // By Flink's own name: flink/<job>/chk-4 -> ../../cp-1.
    let by_name = mnt.join(format!("flink/{JOB}/chk-4"));
    assert_eq!(
        std::fs::read_link(&by_name).unwrap(),
        Path::new("../../cp-1")
    );
    restores_from(&classpath, &by_name, dir.path());
    // Flink wrote nothing into the mount, and the store is whole.
    assert!(!cp.join("shared").exists());
    // Someone's `rm` (no JVM) is refused and nothing else: no pin.
    assert_eq!(
        crate::common::mounted::errno_of(std::fs::remove_file(cp.join("_metadata"))),
        libc::EROFS
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The job's read of cp-1/_metadata took a restore lease (and nothing else did).
    assert_eq!(
        m.status()["pins"],
        serde_json::json!({"restore-cp-1": 1}),
        "{}",
        m.status()
    );

    // In CLAIM mode the job's checkpoints name the mount's files, and once it has
    // subsumed the one it restored from (it retains 2) it deletes that one's files: the
    // deletes are refused, the checkpoint pinned (the job needs it), the error said.
    let ck = dir.path().join("ck-claim");
    let chk = cp.to_str().unwrap();
    let mut job = Job::start(
        &classpath,
        &ck,
        0,
        &["--restore", chk, "--claim-mode", "CLAIM"],
    );
    crate::flink::wait_for("the CLAIM job to delete from the mount", || {
        while let Some(Ok(line)) = job.lines.next() {
            assert!(!line.starts_with("mismatch"), "{line}");
            if let Some(m) = line.strip_prefix("restored records ") {
                job.restored = m.parse().ok();
            }
            if line.starts_with("complete ") {
                break;
            }
        }
        m.status()["pins"]["flink-claim-cp-1"] == 1
    });
    let status = m.status();
    let error = status["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("CLAIM mode") && error.contains("NO_CLAIM mode only"),
        "{status}"
    );
    assert_eq!(job.restored, Some(RECORDS_AT_4));
    job.kill();
    assert_eq!(
        crate::common::mounted::errno_of(std::fs::remove_dir(&cp)),
        libc::EBUSY
    );
    assert!(cp.join("_metadata").is_file());
    ok(ckptfs(&["unpin", m.mnt(), "flink-claim-cp-1"]));
    m.umount();
    let report: serde_json::Value =
        serde_json::from_str(&ok(ckptfs(&["fsck", store.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
}

/// Another host: the store on object storage, mounted read-only (its own mountpoint, its own
/// paths in `_metadata`), and the job restored from it.
#[test]
fn a_flink_job_restores_from_a_read_only_mount_of_an_s3_store() {
    let moto = crate::common::moto::moto();
    let env = crate::common::moto::env_for(moto.port);
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let src = dir.path().join(JOB);
    cp_a(&fixture(), &src);
    let url = format!("{}/restore-from-mount", moto.store());
    let state = dir.path().join("state");
    ok(crate::common::s3::ckptfs_with_env(
        &[
            "import-flink",
            src.to_str().unwrap(),
            &url,
            "--state",
            state.to_str().unwrap(),
        ],
        &env,
    ));
    std::fs::remove_dir_all(&src).unwrap();
    let ro = crate::common::s3::Mount::new(
        &url,
        &dir.path().join("elsewhere/mnt"),
        &dir.path().join("ro-state"),
        &["--read-only"],
        &env,
    );
    let cp = ro.mnt.join("cp-1");
    names_only_the_mount(&cp);
    restores_from(&classpath, &cp, dir.path());
}

/// A job restored from the mount in NO_CLAIM mode (Flink's default) reads the checkpoint's
/// files while it restores, and depends on them until its own first checkpoint (a full
/// one in NO_CLAIM mode) completes: its read of `cp-N/_metadata` holds cp-N as
/// `restore-cp-N` (a listing or a stat does not), through a policy that would drop it
/// (`--keep-last 1`) and `rm`, which says why; the job restores its whole state; the lease
/// ends by itself `--restore-lease` after the last read, and the policy drops cp-N then.
#[test]
fn a_no_claim_restore_from_the_mount_holds_its_checkpoint_with_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let (classpath, mnt, m) = fixture_only_in_a_mount(dir.path(), JOB, &["--restore-lease", "20s"]);
    let store = dir.path().join("store");
    assert_eq!(m.checkpoint_ids(), [1, 2, 3]);
    let cp = mnt.join("cp-1");
    // A listing and a stat are no restore.
    assert!(std::fs::read_dir(&cp).unwrap().count() > 2);
    assert!(std::fs::metadata(cp.join("_metadata")).unwrap().len() > 0);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(m.status()["pins"].is_null(), "{}", m.status());

    let by_name = mnt.join(format!("flink/{JOB}/chk-4"));
    let ck = dir.path().join("ck-restored");
    let mut job = Job::start(
        &classpath,
        &ck,
        1200,
        &["--restore", by_name.to_str().unwrap()],
    );
    crate::flink::wait_for("the restore's lease on cp-1", || {
        m.status()["pins"]["restore-cp-1"] == 1
    });
    // The policy now keeps the newest only: cp-2 goes, cp-1 stays while the job needs it.
    ok(ckptfs(&["forget", m.mnt(), "--keep-last", "1"]));
    assert_eq!(m.checkpoint_ids(), [1, 3]);
    let out = ckptfs(&["rm", m.mnt(), "1"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("pinned as restore-cp-1 (a restore lease") && said.contains("expires in"),
        "{said}"
    );
    assert!(m.status()["pin_expires"]["restore-cp-1"].as_u64() > Some(0));
    // Its keyed state checked key by key as it runs (a mismatch fails the test).
    job.checkpoint_with(1200);
    let restored = job.restored;
    job.kill();
    assert_eq!(restored, Some(RECORDS_AT_4));
    // Nothing reads cp-1 any more: the lease ends and the policy drops it.
    crate::flink::wait_for("the lease to expire", || m.checkpoint_ids() == [3]);
    assert!(m.status()["pins"].is_null(), "{}", m.status());
    m.umount();
    let report: serde_json::Value =
        serde_json::from_str(&ok(ckptfs(&["fsck", store.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
}
