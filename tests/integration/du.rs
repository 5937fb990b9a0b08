//! `ckptfs du`: what each checkpoint holds, added and shares, checked against the files
//! the checkpoints restore to, compared by content, for the real Flink job's checkpoints
//! (tests/fixtures/flink/job1) imported into a fresh store. The figures per state are
//! checked against each restored SST's column family as Debian's `sst_dump` reads it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{json, Value};

use crate::common::mounted::{ckptfs, ok};
use crate::flink::fixture;

/// Every regular file below `dir`: its path relative to `dir`, and its content.
fn contents(dir: &Path, prefix: &str, out: &mut BTreeMap<String, Vec<u8>>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = format!("{prefix}{}", entry.file_name().into_string().unwrap());
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            contents(&entry.path(), &format!("{name}/"), out);
        } else {
            assert!(kind.is_file(), "{name}");
            out.insert(name, std::fs::read(entry.path()).unwrap());
        }
    }
}

/// A checkpoint restored by `ckptfs restore`: `<operator>/<subtask>` -> file -> content.
pub(crate) type Restored = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

pub(crate) fn restore(store: &Path, id: u64, dest: &Path) -> Restored {
    ok(ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        &id.to_string(),
        dest.to_str().unwrap(),
    ]));
    let mut backends = Restored::new();
    for operator in std::fs::read_dir(dest).unwrap() {
        let operator = operator.unwrap();
        for subtask in std::fs::read_dir(operator.path()).unwrap() {
            let subtask = subtask.unwrap();
            let name = format!(
                "{}/{}",
                operator.file_name().into_string().unwrap(),
                subtask.file_name().into_string().unwrap()
            );
            let mut files = BTreeMap::new();
            contents(&subtask.path(), "", &mut files);
            backends.insert(name, files);
        }
    }
    backends
}

/// The figures of files holding `mine` (distinct contents) in checkpoint `n` of
/// `checkpoints` (each one's distinct contents), as du's JSON names them.
fn figures(
    files: usize,
    bytes: usize,
    mine: &BTreeSet<&Vec<u8>>,
    n: usize,
    checkpoints: &[BTreeSet<&Vec<u8>>],
) -> Value {
    let sum = |keep: &dyn Fn(&Vec<u8>) -> bool| -> usize {
        mine.iter().filter(|c| keep(c)).map(|c| c.len()).sum()
    };
    let earlier = |c: &Vec<u8>| checkpoints[..n].iter().any(|s| s.contains(c));
    let elsewhere = |c: &Vec<u8>| {
        checkpoints
            .iter()
            .enumerate()
            .any(|(m, s)| m != n && s.contains(c))
    };
    json!({
        "files": files,
        "bytes": bytes,
        "new": sum(&|c| !earlier(c)),
        "shared": sum(&|c| earlier(c)),
        "exclusive": sum(&|c| !elsewhere(c)),
    })
}

/// The column family of the SST at `path`, as Debian's `sst_dump` (RocksDB 7.8) reads its
/// table properties.
fn sst_dump_column_family(path: &Path) -> String {
    let out = std::process::Command::new("sst_dump")
        .arg(format!("--file={}", path.display()))
        .arg("--show_properties")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sst_dump {}: {stdout}",
        path.display()
    );
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("column family name: "))
        .collect();
    assert_eq!(names.len(), 1, "sst_dump {}: {stdout}", path.display());
    names[0].to_string()
}

/// The state du counts a restored file under: an SST's column family (`sst_dump`),
/// `(other)` for every other file.
pub(crate) fn state_of(path: &Path) -> String {
    if path.extension().is_some_and(|e| e == "sst") {
        sst_dump_column_family(path)
    } else {
        "(other)".to_string()
    }
}

/// Everything below `dir` with its size and modification time.
pub(crate) fn tree_state(dir: &Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            out.push((
                entry.path().display().to_string(),
                meta.len(),
                meta.modified().unwrap(),
            ));
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

/// The report `ckptfs du STORE --json` must give, computed independently: every retained
/// checkpoint (`ids`, labelled `flink`) restored below `scratch`, its files compared by
/// content.
fn independent(store: &Path, ids: &[u64], flink: &[Value], scratch: &Path) -> Vec<Value> {
    let restored: Vec<Restored> = ids
        .iter()
        .map(|id| restore(store, *id, &scratch.join(format!("cp-{id}"))))
        .collect();
    let distinct: Vec<BTreeSet<&Vec<u8>>> = restored
        .iter()
        .map(|r| r.values().flat_map(|files| files.values()).collect())
        .collect();
    let rows: Vec<Value> =
        serde_json::from_str(&ok(ckptfs(&["ls", store.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(rows.len(), ids.len());
    ids.iter()
        .enumerate()
        .map(|(n, id)| {
            let backends: Vec<Value> = restored[n]
                .iter()
                .map(|(name, files)| {
                    let mut row = figures(
                        files.len(),
                        files.values().map(Vec::len).sum(),
                        &files.values().collect(),
                        n,
                        &distinct,
                    );
                    row["backend"] = json!(name);
                    let dir = scratch.join(format!("cp-{id}")).join(name);
                    let mut states: BTreeMap<String, Vec<&Vec<u8>>> = BTreeMap::new();
                    for (file, content) in files {
                        states
                            .entry(state_of(&dir.join(file)))
                            .or_default()
                            .push(content);
                    }
                    row["states"] = states
                        .into_iter()
                        .map(|(state, contents)| {
                            let mut s = figures(
                                contents.len(),
                                contents.iter().map(|c| c.len()).sum(),
                                &contents.into_iter().collect(),
                                n,
                                &distinct,
                            );
                            s["state"] = json!(state);
                            s
                        })
                        .collect();
                    row
                })
                .collect();
            // Per operator: its subtasks' backends together, a content counted once.
            let mut operators: BTreeMap<&str, Vec<&BTreeMap<String, Vec<u8>>>> = BTreeMap::new();
            for (name, files) in &restored[n] {
                operators
                    .entry(name.split_once('/').unwrap().0)
                    .or_default()
                    .push(files);
            }
            let operators: Vec<Value> = operators
                .into_iter()
                .map(|(op, backends)| {
                    let mut row = figures(
                        backends.iter().map(|f| f.len()).sum(),
                        backends.iter().flat_map(|f| f.values()).map(Vec::len).sum(),
                        &backends.iter().flat_map(|f| f.values()).collect(),
                        n,
                        &distinct,
                    );
                    row["operator"] = json!(op);
                    row
                })
                .collect();
            let files: usize = restored[n].values().map(BTreeMap::len).sum();
            let bytes: usize = restored[n]
                .values()
                .flat_map(|f| f.values())
                .map(Vec::len)
                .sum();
            json!({
                "id": id,
                "completed_unix_ms": rows[n]["completed_unix_ms"],
                "flink": flink[n],
                "backends": backends,
                "operators": operators,
                "total": figures(files, bytes, &distinct[n], n, &distinct),
            })
        })
        .collect()
}

#[test]
fn du_of_a_flink_import_matches_the_restored_files_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let ids: Vec<u64> = ok(ckptfs(&["import-flink", fixture().to_str().unwrap(), s]))
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    let before = tree_state(&store);
    let report: Value = serde_json::from_str(&ok(ckptfs(&["du", s, "--json"]))).unwrap();
    let job = "a312c9034e3e0d2016dae60431b4c9dc";
    // The names tests/flink/StateJob.java gives its keyed operators (`.name(..)`), by
    // their directories: `counter` has a uid, `totals` none (its operator id, in the
    // fixture's README).
    let names = crate::flink::operator_names();
    let labels: Vec<Value> = [4, 5, 6]
        .iter()
        .map(|n| {
            json!({"job": job, "checkpoint": n, "operators": names,
                "time_unix_ms": crate::flink::fixture_time_ms(*n)})
        })
        .collect();
    let mut expected = independent(&store, &ids, &labels, dir.path());
    for c in &mut expected {
        for b in c["backends"].as_array_mut().unwrap() {
            let (op, _) = b["backend"].as_str().unwrap().split_once('/').unwrap();
            if let Some(name) = names.get(op) {
                b["name"] = json!(name);
            }
        }
        for o in c["operators"].as_array_mut().unwrap() {
            if let Some(name) = names.get(o["operator"].as_str().unwrap()) {
                o["name"] = json!(name);
            }
        }
    }
    // The fixture exercises every figure: something new, shared and exclusive, objects
    // repeated across subtasks (the total counts them once).
    let total = |n: usize, f: &str| expected[n]["total"][f].as_u64().unwrap();
    assert!(total(1, "new") > 0 && total(1, "shared") > 0 && total(1, "exclusive") > 0);
    assert!(total(0, "new") < total(0, "bytes"), "{}", expected[0]);
    assert_eq!(report, json!({ "checkpoints": expected }));
    // Every column family EXPECTED lists for a checkpoint and subtask is a state of that
    // subtask's backend (the keyed operator without a uid is named by its id: `totals`).
    let listed = crate::flink::expected();
    let mut checked = 0;
    for (c, n) in report["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .zip([4, 5, 6])
    {
        for b in c["backends"].as_array().unwrap() {
            let (op, subtask) = b["backend"].as_str().unwrap().split_once('/').unwrap();
            let op = match op {
                "_flink" => continue,
                "counter" => "counter",
                _ => "totals",
            };
            let states: BTreeSet<&str> = b["states"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["state"].as_str().unwrap())
                .collect();
            assert!(!states.contains("?") && !states.contains("default"), "{b}");
            for (cp, o, s, cf) in listed.keys() {
                if *cp == n && o == op && s.to_string() == subtask {
                    assert!(states.contains(cf.as_str()), "{cf} not in {b}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, listed.len());

    // One checkpoint alone, counted against all: its entry of the whole report.
    let one: Value = serde_json::from_str(&ok(ckptfs(&["du", s, "2", "--json"]))).unwrap();
    assert_eq!(one, json!({ "checkpoints": [expected[1].clone()] }));
    let table = ok(ckptfs(&["du", s, "2"]));
    assert!(table.starts_with("cp-2  "), "{table}");
    assert!(
        !table.contains("cp-1") && !table.contains("cp-3"),
        "{table}"
    );
    assert!(
        table.contains(&format!("flink job {job} checkpoint 5")),
        "{table}"
    );
    // Each backend row names its operator.
    for (op, name) in &names {
        for subtask in [0, 1] {
            let row = format!("  {op}/{subtask} ({name}) ");
            assert!(table.contains(&row), "{row:?} not in {table}");
        }
    }
    let header = table.lines().nth(1).unwrap();
    let columns: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        columns,
        ["BACKEND", "FILES", "BYTES", "NEW", "SHARED", "EXCLUSIVE"]
    );
    let last = table.lines().last().unwrap();
    let t = &expected[1]["total"];
    // Sizes for people (KiB, MiB), bytes in --json.
    let figures: Vec<String> = ["files", "bytes", "new", "shared", "exclusive"]
        .iter()
        .map(|f| match *f {
            "files" => t[f].to_string(),
            _ => ckptfs::units::human_bytes(t[f].as_u64().unwrap()),
        })
        .collect();
    let want = format!("total {}", figures.join(" "));
    assert_eq!(
        last.split_whitespace().collect::<Vec<_>>(),
        want.split_whitespace().collect::<Vec<_>>()
    );
    assert!(
        figures[2].ends_with("B") && figures[2].contains(' '),
        "{figures:?}"
    );
    // One indented line per state under its backend row.
    let lines: Vec<&str> = table.lines().collect();
    let first = &expected[1]["backends"][0];
    let at = lines
        .iter()
        .position(|l| l.split_whitespace().next() == first["backend"].as_str())
        .unwrap();
    for (k, state) in first["states"].as_array().unwrap().iter().enumerate() {
        let line = lines[at + 1 + k];
        assert!(
            line.starts_with(&format!("    {} ", state["state"].as_str().unwrap())),
            "{table}"
        );
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cells[2..4].join(" "),
            ckptfs::units::human_bytes(state["bytes"].as_u64().unwrap()),
            "{table}"
        );
    }
    // Right-aligned: every row ends where the header does.
    assert!(
        table.lines().skip(1).all(|l| l.len() == header.len()),
        "{table}"
    );

    // An unknown checkpoint: a clear error naming it, exit 1.
    let out = ckptfs(&["du", s, "99"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no checkpoint 99 in"), "{stderr}");
    assert!(out.stdout.is_empty());
    // Nothing was written to the store.
    assert_eq!(tree_state(&store), before);
}

/// Hosted backends (`ckptfs workload`, two backends, retain 3 of 5 rounds): the same
/// figures from the restored files.
#[test]
fn du_of_hosted_backends_matches_the_restored_files_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    crate::common::cli::workload(&store, "5");
    let rows: Vec<Value> =
        serde_json::from_str(&ok(ckptfs(&["ls", store.to_str().unwrap(), "--json"]))).unwrap();
    let ids: Vec<u64> = rows.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert!(ids.len() >= 2, "{ids:?}");
    let report: Value =
        serde_json::from_str(&ok(ckptfs(&["du", store.to_str().unwrap(), "--json"]))).unwrap();
    let expected = independent(&store, &ids, &vec![Value::Null; ids.len()], dir.path());
    let some = |f: &str| expected.iter().any(|c| c["total"][f].as_u64().unwrap() > 0);
    assert!(
        some("new") && some("shared") && some("exclusive"),
        "{expected:?}"
    );
    assert_eq!(report, json!({ "checkpoints": expected }));
}
