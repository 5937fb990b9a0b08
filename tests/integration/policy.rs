//! Retention policies (`--keep-*`, `forget`, the control file's `keep`) and pins (`pin`,
//! `unpin`, `pinned/NAME`): what is kept is what the rules say, computed here on their
//! own; pins outlive every policy, `rmdir` and restarts and show on read-only mounts; the
//! store stays exact (fsck).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

use crate::common::mounted::{ckptfs, errno_of, ok, scan, Ctl, Mounted};
use crate::flink::{labels, wait_for, Job};

fn forget(args: &[&str]) -> Value {
    let mut all = vec!["forget"];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&ok(ckptfs(&all))).unwrap()
}

/// The ids a plan keeps, ascending.
fn kept(plan: &Value) -> Vec<u64> {
    let mut ids: Vec<u64> = plan["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| !d["kept_by"].as_array().unwrap().is_empty())
        .map(|d| d["id"].as_u64().unwrap())
        .collect();
    ids.sort_unstable();
    ids
}

fn fsck_clean(store: &Path) {
    let report: Value =
        serde_json::from_str(&ok(ckptfs(&["fsck", store.to_str().unwrap(), "--json"]))).unwrap();
    for key in [
        "problems",
        "orphans",
        "missing",
        "corrupt",
        "damaged_checkpoints",
    ] {
        assert_eq!(report[key], serde_json::json!([]), "{key}: {report}");
    }
}

fn failed(args: &[&str]) -> String {
    let out = ckptfs(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A pin keeps its checkpoint through the policy (`--keep-last 2`), `rmdir` (EBUSY) and
/// `ckptfs rm`, a restart and a move of the pin; `pinned/NAME` leads to it in the mount
/// and in a read-only mount of the store on "another host"; unpinned, the policy drops it.
#[test]
fn a_pinned_checkpoint_outlives_the_policy_rmdir_and_restarts() {
    let m = Mounted::new(&["--keep-last", "2"]);
    let mnt = m.mnt.clone();
    m.put("default/0", "k", "v1");
    let first = m.checkpoint();
    ok(ckptfs(&[
        "pin",
        m.mnt(),
        &first.to_string(),
        "before-deploy",
    ]));
    for (bad, says) in [
        ("../x", "invalid pin name"),
        (".hidden", "invalid pin name"),
        ("", "invalid pin name"),
    ] {
        let e = failed(&["pin", m.mnt(), &first.to_string(), bad]);
        assert!(e.contains(says), "{bad:?}: {e}");
    }
    assert!(failed(&["pin", m.mnt(), "99", "x"]).contains("no such checkpoint"));
    let mut ids = vec![first];
    for round in 2..=5 {
        m.put("default/0", "k", &format!("v{round}"));
        ids.push(m.checkpoint());
    }
    let (c4, c5) = (ids[3], ids[4]);
    assert_eq!(m.checkpoint_ids(), vec![first, c4, c5]);
    let link = mnt.join("pinned/before-deploy");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new(&format!("../cp-{first}"))
    );
    assert_eq!(
        m.root_names(),
        [
            ".ckptfs".to_string(),
            format!("cp-{first}"),
            format!("cp-{c4}"),
            format!("cp-{c5}"),
            "latest".into(),
            "pinned".into()
        ]
    );
    // Restored through the link: the pinned checkpoint's state.
    let out = m.root.join("restored");
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(link.join("."))
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        scan(&out.join("default/0")),
        crate::common::mounted::kv(&[("k", "v1")])
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(mnt.join(format!("cp-{first}")))),
        libc::EBUSY
    );
    let said = failed(&["rm", m.mnt(), &first.to_string()]);
    assert!(
        said.contains(&format!("checkpoint {first} is pinned as before-deploy"))
            && said.contains("ckptfs unpin"),
        "{said}"
    );
    let mut ctl = Ctl::open(&m);
    ctl.send(&format!("delete {first}\n")).unwrap();
    let answer = ctl.answer();
    assert_eq!(answer["errno"], libc::EBUSY, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.contains("pinned as before-deploy") && error.contains("unpin"),
        "{answer}"
    );
    // A dry run of a stricter policy: the pin still keeps it, nothing changes.
    let plan = forget(&[m.mnt(), "--dry-run", "--keep-last", "1"]);
    assert_eq!(kept(&plan), vec![first, c5], "{plan}");
    let newest = &plan["decisions"][0];
    assert_eq!(newest["id"], c5);
    assert_eq!(
        newest["kept_by"],
        serde_json::json!([{"rule": "last", "n": 1}])
    );
    let pinned = plan["decisions"].as_array().unwrap().last().unwrap();
    assert_eq!(
        pinned["kept_by"],
        serde_json::json!([{"rule": "pinned", "name": "before-deploy"}])
    );
    assert_eq!(m.checkpoint_ids(), vec![first, c4, c5]);

    // A restart keeps the pin and the policy (the store holds both).
    drop(ctl);
    m.umount();
    m.mount(&[]);
    assert_eq!(m.checkpoint_ids(), vec![first, c4, c5]);
    let status = m.status();
    assert_eq!(status["pins"], serde_json::json!({"before-deploy": first}));
    assert_eq!(status["policy"], serde_json::json!(["last=2"]));

    // Another host's read-only view shows the pin and follows its move.
    let ro_mnt = m.root.join("ro");
    std::fs::create_dir(&ro_mnt).unwrap();
    let ro = Mounted::at(&m.store, &ro_mnt, &["--read-only"]);
    let ro_link = ro_mnt.join("pinned/before-deploy");
    assert_eq!(
        std::fs::read_link(&ro_link).unwrap(),
        Path::new(&format!("../cp-{first}"))
    );
    assert!(ro_link.join("default/0/CURRENT").is_file());
    assert_eq!(
        errno_of(std::fs::remove_dir(ro_mnt.join(format!("cp-{first}")))),
        libc::EROFS
    );
    // Moved: the old checkpoint is left to the policy, which drops it at once.
    ok(ckptfs(&["pin", m.mnt(), &c5.to_string(), "before-deploy"]));
    assert_eq!(m.checkpoint_ids(), vec![c4, c5]);
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new(&format!("../cp-{c5}"))
    );
    wait_for("the read-only view to follow the pin", || {
        std::fs::read_link(&ro_link).ok() == Some(format!("../cp-{c5}").into())
    });
    ok(ckptfs(&["unpin", m.mnt(), "before-deploy"]));
    assert!(!link.exists());
    assert!(!m.root_names().contains(&"pinned".to_string()));
    assert!(failed(&["unpin", m.mnt(), "before-deploy"]).contains("no pin named"));
    ro.umount();
    m.umount();
    fsck_clean(&m.store);
}

/// A policy set at mount, through the control file and with `forget`, on a mount and on a
/// store no daemon holds: `--dry-run` changes nothing, an applied policy drops what it
/// does not keep at once and stays the store's; bad rules are refused and change nothing.
#[test]
fn forget_shows_applies_and_keeps_a_policy() {
    let m = Mounted::new(&[]);
    let mut ids = Vec::new();
    for round in 0..6 {
        m.put("default/0", "k", &format!("v{round}"));
        ids.push(m.checkpoint());
    }
    // A new store keeps the newest 3.
    assert_eq!(m.checkpoint_ids(), ids[3..]);
    assert_eq!(m.status()["policy"], serde_json::json!(["last=3"]));
    let mut ctl = Ctl::open(&m);
    ctl.send("keep last=1 within=1h\n").unwrap();
    assert_eq!(ctl.answer()["ok"], true);
    for round in 6..8 {
        m.put("default/0", "k", &format!("v{round}"));
        ids.push(m.checkpoint());
    }
    // Every checkpoint is less than an hour older than the newest.
    assert_eq!(m.checkpoint_ids(), ids[3..]);
    assert_eq!(
        m.status()["policy"],
        serde_json::json!(["last=1", "within=1h"])
    );
    for (line, says) in [
        ("keep", "takes 1 argument"),
        ("keep last=0", "at least 1"),
        ("keep daily=x", "not a non-negative integer"),
        ("keep fortnightly=2", "unknown rule"),
        ("pin 1 a/b", "invalid pin name"),
    ] {
        let err = ctl.send(&format!("{line}\n")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{line}");
        let answer = ctl.answer();
        assert!(
            answer["error"].as_str().unwrap().contains(says),
            "{line}: {answer}"
        );
    }
    assert_eq!(m.checkpoint_ids(), ids[3..]);
    let plan = forget(&[m.mnt(), "--dry-run", "--keep-last", "2"]);
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["policy"], serde_json::json!(["last=2"]));
    assert_eq!(kept(&plan), ids[6..]);
    assert_eq!(m.checkpoint_ids(), ids[3..], "a dry run dropped something");
    let table = ok(ckptfs(&["forget", m.mnt(), "-n", "--keep-last", "2"]));
    assert!(table.contains("policy: --keep-last 2"), "{table}");
    assert!(table.contains("keep 2, would drop 3"), "{table}");
    let applied = forget(&[m.mnt(), "--keep-last", "2"]);
    assert_eq!(applied["dry_run"], false);
    assert_eq!(kept(&applied), ids[6..]);
    assert_eq!(m.checkpoint_ids(), ids[6..]);
    drop(ctl);
    m.umount();

    // The store read directly: its policy, a pin, an applied policy.
    let store = m.store.to_str().unwrap();
    let plan = forget(&[store, "--dry-run"]);
    assert_eq!(plan["policy"], serde_json::json!(["last=2"]));
    assert_eq!(kept(&plan), ids[6..]);
    ok(ckptfs(&["pin", store, &ids[6].to_string(), "keep-me"]));
    let applied = forget(&[store, "--keep-last", "1"]);
    assert_eq!(kept(&applied), ids[6..]);
    let missing = m.root.join("no-store");
    let e = failed(&["forget", missing.to_str().unwrap(), "-n"]);
    assert!(e.contains("neither a ckptfs mount"), "{e}");
    assert!(!missing.exists());
    fsck_clean(&m.store);
    m.mount(&[]);
    assert_eq!(m.checkpoint_ids(), ids[6..]);
    assert_eq!(m.status()["pins"], serde_json::json!({"keep-me": ids[6]}));
    m.umount();
}

/// What an independent reading of the rules keeps of checkpoints with these times (ms),
/// given in the order the store took them: restic's `forget`, the calendar in UTC.
fn expected_kept(
    times: &BTreeMap<u64, u64>,
    last: usize,
    daily: usize,
    monthly: usize,
    yearly: usize,
) -> BTreeSet<u64> {
    let mut newest_first: Vec<(u64, u64)> = times.iter().map(|(id, t)| (*t, *id)).collect();
    newest_first.sort_unstable_by(|a, b| b.cmp(a));
    let mut keep: BTreeSet<u64> = newest_first.iter().take(last).map(|(_, id)| *id).collect();
    // Day, month and year of a time, by the civil calendar (days since 1970-01-01).
    let civil = |ms: u64| {
        let days = (ms / 86_400_000) as i64;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        (y, m, d)
    };
    type Bucket<'a> = &'a dyn Fn(u64) -> (i64, i64, i64);
    let rules: [(usize, Bucket); 3] = [
        (daily, &|t| civil(t)),
        (monthly, &|t| {
            let (y, m, _) = civil(t);
            (y, m, 0)
        }),
        (yearly, &|t| (civil(t).0, 0, 0)),
    ];
    for (n, bucket) in rules {
        let mut seen = Vec::new();
        for (t, id) in &newest_first {
            let b = bucket(*t);
            if !seen.contains(&b) {
                seen.push(b);
                if seen.len() <= n {
                    keep.insert(*id);
                }
            }
        }
    }
    keep
}

/// A real Flink job's checkpoints, with Flink's checkpoint times spread over hours, days,
/// months and years (each `_metadata`'s modification time, set after the job was killed),
/// followed by a daemon whose policy keeps by calendar: it keeps exactly what the rules
/// say of those times, a dry run of another policy too, a pinned one outlives a stricter
/// policy, and the store stays exact.
#[test]
fn a_followed_flink_job_is_kept_by_the_calendar_of_its_checkpoint_times() {
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let ck = dir.path().join("ck");
    let mut job = Job::start(&classpath, &ck, 0, &["--retained", "30"]);
    let mut completed = 0;
    while completed < 10 {
        let Some(Ok(line)) = job.lines.next() else {
            panic!("the Flink job ended early")
        };
        if line.starts_with("complete ") {
            completed += 1;
        }
        assert!(!line.starts_with("mismatch"), "{line}");
    }
    job.kill();
    let job_dir = crate::flink::job_dir_in(&ck);
    let mut chks: Vec<u64> = std::fs::read_dir(&job_dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let n: u64 = e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok()?;
            e.path().join("_metadata").is_file().then_some(n)
        })
        .collect();
    chks.sort_unstable();
    assert!(chks.len() >= 10, "{chks:?}");
    // Flink's times: from 2024-12-30 (a Monday) on, hours, days, months and years apart.
    const HOUR: u64 = 3_600_000;
    const DAY: u64 = 24 * HOUR;
    let base = 1_735_516_800_000u64;
    let offsets = [
        0,
        HOUR,
        2 * DAY,
        2 * DAY + HOUR,
        40 * DAY,
        70 * DAY,
        70 * DAY + 3 * HOUR,
        400 * DAY,
        401 * DAY,
        401 * DAY + 2 * HOUR,
    ];
    let mut flink_time = BTreeMap::new();
    for (i, n) in chks.iter().enumerate() {
        let at = base
            + offsets
                .get(i)
                .copied()
                .unwrap_or(402 * DAY + i as u64 * HOUR);
        let file = std::fs::File::options()
            .write(true)
            .open(job_dir.join(format!("chk-{n}/_metadata")))
            .unwrap();
        file.set_modified(UNIX_EPOCH + Duration::from_millis(at))
            .unwrap();
        flink_time.insert(*n, at);
    }
    let store = dir.path().join("store");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let policy = [
        "--keep-last",
        "2",
        "--keep-daily",
        "3",
        "--keep-monthly",
        "3",
        "--keep-yearly",
        "5",
    ];
    let mut args = vec!["--flink", ck.to_str().unwrap()];
    args.extend_from_slice(&policy);
    let m = Mounted::at(&store, &mnt, &args);
    let newest = *chks.last().unwrap();
    wait_for("every checkpoint imported", || {
        labels(&m).last() == Some(&newest)
    });
    // Applied import by import, the policy keeps what it keeps of them all at once.
    let expected: BTreeSet<u64> = expected_kept(&flink_time, 2, 3, 3, 5);
    assert!(
        expected.len() < chks.len() && expected.len() > 3,
        "{expected:?}"
    );
    let held: BTreeSet<u64> = labels(&m).into_iter().collect();
    assert_eq!(held, expected);
    // Their times are Flink's, as the manifests and `forget` show them.
    let rows: Vec<Value> = std::fs::read_to_string(mnt.join(".ckptfs/checkpoints"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by_flink: BTreeMap<u64, u64> = rows
        .iter()
        .map(|r| {
            let n = r["flink"]["checkpoint"].as_u64().unwrap();
            assert_eq!(
                r["flink"]["time_unix_ms"].as_u64(),
                Some(flink_time[&n]),
                "{r}"
            );
            (r["id"].as_u64().unwrap(), n)
        })
        .collect();
    let plan = forget(&[
        m.mnt(),
        "--dry-run",
        "--keep-last",
        "1",
        "--keep-monthly",
        "2",
    ]);
    let held_times: BTreeMap<u64, u64> = by_flink.values().map(|n| (*n, flink_time[n])).collect();
    let would: BTreeSet<u64> = kept(&plan).iter().map(|id| by_flink[id]).collect();
    assert_eq!(would, expected_kept(&held_times, 1, 0, 2, 0), "{plan}");
    for d in plan["decisions"].as_array().unwrap() {
        let n = by_flink[&d["id"].as_u64().unwrap()];
        assert_eq!(d["time_ms"].as_u64(), Some(flink_time[&n]));
    }
    // The oldest held is pinned; a stricter policy keeps it and the newest only.
    let (oldest, _) = by_flink.iter().next().unwrap();
    ok(ckptfs(&["pin", m.mnt(), &oldest.to_string(), "first-year"]));
    forget(&[m.mnt(), "--keep-last", "1"]);
    let left: Vec<u64> = m.checkpoint_ids();
    assert_eq!(left, vec![*oldest, *by_flink.keys().last().unwrap()]);
    m.umount();
    fsck_clean(&store);
}
