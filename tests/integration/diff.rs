//! `ckptfs diff`: what changed between two checkpoints, checked on the real Flink job's
//! checkpoints (tests/fixtures/flink/job1) imported into a fresh store. The file-level
//! report against the checkpoints restored by `ckptfs restore`, compared by name and
//! content, each file's state as Debian's `sst_dump` reads it; `--keys` against the keys and
//! values Debian's `ldb` (RocksDB 7.8) reads from the restored directories.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::common::mounted::{ckptfs, ok};
use crate::du::{restore, state_of, tree_state, Restored};
use crate::flink::{fixture, operator_names};

const JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";

/// A store holding the fixture's checkpoints 4, 5 and 6 as 1, 2 and 3, and each restored
/// under `dir/cp-N`.
fn imported(dir: &Path) -> (String, BTreeMap<u64, Restored>) {
    let store = dir.join("store");
    let s = store.to_str().unwrap().to_string();
    let ids: Vec<u64> = ok(ckptfs(&["import-flink", fixture().to_str().unwrap(), &s]))
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    let restored = ids
        .iter()
        .map(|id| (*id, restore(&store, *id, &dir.join(format!("cp-{id}")))))
        .collect();
    (s, restored)
}

/// The `a` or `b` of the report for checkpoint `id`: its completion time (from `ls`) and
/// Flink label.
fn side(store: &str, id: u64) -> Value {
    let rows: Vec<Value> = serde_json::from_str(&ok(ckptfs(&["ls", store, "--json"]))).unwrap();
    let row = rows.iter().find(|r| r["id"] == id).unwrap();
    json!({
        "id": id,
        "completed_unix_ms": row["completed_unix_ms"],
        "flink": {
            "job": JOB,
            "checkpoint": id + 3,
            "operators": operator_names(),
            "time_unix_ms": crate::flink::fixture_time_ms(id + 3),
        },
    })
}

const FIGURES: [&str; 9] = [
    "files_added",
    "bytes_added",
    "files_removed",
    "bytes_removed",
    "files_changed",
    "bytes_changed_a",
    "bytes_changed_b",
    "files_unchanged",
    "bytes_unchanged",
];

fn zero() -> Value {
    FIGURES.iter().map(|f| (f.to_string(), json!(0))).collect()
}

fn add(to: &mut Value, figure: &str, n: usize) {
    to[figure] = json!(to[figure].as_u64().unwrap() + n as u64);
}

/// The file-level report from `a` to `b`, computed from the restored checkpoints: by name
/// and content, each file under its state in B (in A if removed) as `sst_dump` says.
fn independent(
    store: &str,
    scratch: &Path,
    all: &BTreeMap<u64, Restored>,
    a: u64,
    b: u64,
) -> Value {
    let (ra, rb) = (&all[&a], &all[&b]);
    let names: BTreeSet<&String> = ra.keys().chain(rb.keys()).collect();
    let mut total = zero();
    let backends: Vec<Value> = names
        .into_iter()
        .map(|backend| {
            let empty = BTreeMap::new();
            let fa = ra.get(backend).unwrap_or(&empty);
            let fb = rb.get(backend).unwrap_or(&empty);
            let dir = |id: u64| scratch.join(format!("cp-{id}")).join(backend);
            let mut states: BTreeMap<String, Value> = BTreeMap::new();
            fn state(states: &mut BTreeMap<String, Value>, name: String) -> &mut Value {
                states.entry(name.clone()).or_insert_with(|| {
                    let mut s = zero();
                    s["state"] = json!(name);
                    s["added"] = json!([]);
                    s["removed"] = json!([]);
                    s["changed"] = json!([]);
                    s
                })
            }
            for (file, content) in fa {
                match fb.get(file) {
                    None => {
                        let s = state(&mut states, state_of(&dir(a).join(file)));
                        add(s, "files_removed", 1);
                        add(s, "bytes_removed", content.len());
                        s["removed"]
                            .as_array_mut()
                            .unwrap()
                            .push(json!({"name": file, "bytes": content.len()}));
                    }
                    Some(other) if other == content => {
                        let s = state(&mut states, state_of(&dir(b).join(file)));
                        add(s, "files_unchanged", 1);
                        add(s, "bytes_unchanged", content.len());
                    }
                    Some(other) => {
                        let s = state(&mut states, state_of(&dir(b).join(file)));
                        add(s, "files_changed", 1);
                        add(s, "bytes_changed_a", content.len());
                        add(s, "bytes_changed_b", other.len());
                        s["changed"].as_array_mut().unwrap().push(
                            json!({"name": file, "bytes_a": content.len(), "bytes_b": other.len()}),
                        );
                    }
                }
            }
            for (file, content) in fb {
                if !fa.contains_key(file) {
                    let s = state(&mut states, state_of(&dir(b).join(file)));
                    add(s, "files_added", 1);
                    add(s, "bytes_added", content.len());
                    s["added"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": file, "bytes": content.len()}));
                }
            }
            let mut row = zero();
            for s in states.values() {
                for f in FIGURES {
                    let n = s[f].as_u64().unwrap() as usize;
                    add(&mut row, f, n);
                    add(&mut total, f, n);
                }
            }
            row["backend"] = json!(backend);
            let (op, _) = backend.split_once('/').unwrap();
            if let Some(name) = operator_names().get(op) {
                row["name"] = json!(name);
            }
            row["presence"] = json!(match (ra.contains_key(backend), rb.contains_key(backend)) {
                (true, true) => "both",
                (true, false) => "only_a",
                _ => "only_b",
            });
            row["states"] = states.into_values().collect();
            row
        })
        .collect();
    json!({"a": side(store, a), "b": side(store, b), "backends": backends, "total": total})
}

fn diff_json(store: &str, a: u64, b: u64, extra: &[&str]) -> Value {
    let (a, b) = (a.to_string(), b.to_string());
    let mut args = vec!["diff", store, &a, &b, "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(ckptfs(&args))).unwrap()
}

#[test]
fn diff_of_flink_checkpoints_matches_the_restored_files() {
    let dir = tempfile::tempdir().unwrap();
    let (s, restored) = imported(dir.path());
    let before = tree_state(Path::new(&s));
    for (a, b) in [(1, 3), (1, 2), (2, 3), (3, 1), (2, 2)] {
        let report = diff_json(&s, a, b, &[]);
        assert_eq!(
            report,
            independent(&s, dir.path(), &restored, a, b),
            "diff {a} {b}"
        );
    }
    // What the fixture's README says of its checkpoints: between chk-4 and chk-5 a
    // compaction replaced most SSTs (totals/0: 000016.sst of 2718 bytes out, 000028.sst of
    // 2838 in, in state `rounds` or wherever sst_dump puts them: the test above checks that);
    // chk-5 and chk-6 hold the same state, only Flink's `_metadata` differs.
    let r = diff_json(&s, 1, 2, &[]);
    let totals0 = r["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backend"] == "e0efb6bbd58638af795020b0769bc3d6/0")
        .unwrap();
    assert_eq!(totals0["name"], "totals");
    let listed = |kind: &str| -> BTreeSet<(String, u64)> {
        totals0["states"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s[kind].as_array().unwrap())
            .map(|f| {
                (
                    f["name"].as_str().unwrap().into(),
                    f["bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert!(
        listed("removed").contains(&("000016.sst".into(), 2718)),
        "{totals0}"
    );
    assert!(
        listed("added").contains(&("000028.sst".into(), 2838)),
        "{totals0}"
    );
    let r = diff_json(&s, 2, 3, &[]);
    for b in r["backends"].as_array().unwrap() {
        let same = b["files_added"] == 0 && b["files_removed"] == 0 && b["files_changed"] == 0;
        assert_eq!(same, b["backend"] != "_flink/0", "{b}");
    }
    assert_eq!(r["total"]["files_changed"], 1, "{r}");

    // The table: both sides, a row per backend with its operator's name, per state, the
    // files, and the total.
    let table = ok(ckptfs(&["diff", &s, "1", "2"]));
    assert!(
        table.starts_with("from cp-1 ") && table.contains("(flink job"),
        "{table}"
    );
    assert!(table.contains("checkpoint 5)\n"), "{table}");
    assert!(table.contains("  counter/0 (counter) "), "{table}");
    // Sizes for people (KiB, MiB), bytes in --json.
    assert!(table.contains("      - 000016.sst (2.7 KiB)"), "{table}");
    assert!(table.contains("      + 000028.sst (2.8 KiB)"), "{table}");
    let last = table.lines().last().unwrap();
    let t = &diff_json(&s, 1, 2, &[])["total"];
    let expected: Vec<String> = FIGURES
        .iter()
        .map(|f| match f.starts_with("bytes") {
            true => ckptfs::units::human_bytes(t[f].as_u64().unwrap()),
            false => t[f].to_string(),
        })
        .collect();
    let expected = format!("total {}", expected.join(" "));
    assert_eq!(
        last.split_whitespace().collect::<Vec<_>>(),
        expected.split_whitespace().collect::<Vec<_>>()
    );

    // Bad input: an unknown checkpoint, a directory that is no store, --limit without
    // --keys. Each refused with its reason, nothing written.
    let out = ckptfs(&["diff", &s, "1", "99"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no checkpoint 99 in"), "{stderr}");
    assert!(out.stdout.is_empty());
    let nowhere = dir.path().join("cp-1");
    let out = ckptfs(&["diff", nowhere.to_str().unwrap(), "1", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nor a ckptfs store"), "{stderr}");
    let out = ckptfs(&["diff", &s, "1", "2", "--limit", "3"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(tree_state(Path::new(&s)), before);
}

/// Every column family of the RocksDB directory `db`, as Debian's ldb lists them.
fn ldb_column_families(db: &Path) -> Vec<String> {
    let out = Command::new("ldb")
        .arg(format!("--db={}", db.display()))
        .arg("list_column_families")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let inner = text
        .split_once('{')
        .and_then(|(_, rest)| rest.rsplit_once('}'))
        .unwrap()
        .0;
    inner.split(", ").map(str::to_string).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    let text = text.trim().trim_start_matches("0x");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// Every key and value of column family `cf` of `db`, as Debian's ldb reads them (its
/// options from the directory's OPTIONS file: Flink's merge operator for list state).
fn ldb_scan(db: &Path, cf: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let out = Command::new("ldb")
        .arg(format!("--db={}", db.display()))
        .args(["--try_load_options", "--ignore_unknown_options", "--hex"])
        .arg(format!("--column_family={cf}"))
        .arg("scan")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(" : ").unwrap();
            (unhex(k), unhex(v))
        })
        .collect()
}

/// Bytes as `diff` shows them: Rust's byte-string escaping.
fn escaped(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// The `keys` of one backend, computed from ldb's scans of `a` and `b` (either may be
/// missing), listing at most `limit` changes per column family.
fn independent_keys(a: Option<&Path>, b: Option<&Path>, limit: usize) -> Value {
    let mut families: Vec<String> = a
        .iter()
        .chain(&b)
        .flat_map(|d| ldb_column_families(d))
        .collect();
    families.sort();
    families.dedup();
    let scan = |d: Option<&Path>, cf: &str| -> BTreeMap<Vec<u8>, Vec<u8>> {
        d.filter(|d| ldb_column_families(d).iter().any(|f| f == cf))
            .map(|d| ldb_scan(d, cf))
            .unwrap_or_default()
    };
    let shown = |v: &[u8]| escaped(&v[..v.len().min(256)]);
    let column_families: Vec<Value> = families
        .iter()
        .map(|cf| {
            let (ka, kb) = (scan(a, cf), scan(b, cf));
            let keys: BTreeSet<&Vec<u8>> = ka.keys().chain(kb.keys()).collect();
            let (mut added, mut removed, mut changed, mut unchanged) = (0, 0, 0, 0);
            let mut listed = Vec::new();
            for k in keys {
                let change = match (ka.get(k), kb.get(k)) {
                    (Some(x), Some(y)) if x == y => {
                        unchanged += 1;
                        continue;
                    }
                    (Some(x), Some(y)) => {
                        changed += 1;
                        json!({"change": "changed", "key": escaped(k), "a": shown(x),
                               "a_bytes": x.len(), "b": shown(y), "b_bytes": y.len()})
                    }
                    (Some(x), None) => {
                        removed += 1;
                        json!({"change": "removed", "key": escaped(k), "a": shown(x),
                               "a_bytes": x.len()})
                    }
                    (None, Some(y)) => {
                        added += 1;
                        json!({"change": "added", "key": escaped(k), "b": shown(y),
                               "b_bytes": y.len()})
                    }
                    (None, None) => unreachable!(),
                };
                if listed.len() < limit {
                    listed.push(change);
                }
            }
            let all = listed.len() == added + removed + changed;
            json!({"column_family": cf, "added": added, "removed": removed,
                   "changed": changed, "unchanged": unchanged, "listed": listed,
                   "listed_all": all})
        })
        .collect();
    json!({"comparison": "iterated", "column_families": column_families})
}

/// The `keys` the report must hold for every backend from `a` to `b`, from the restored
/// directories: not compared where there is no CURRENT (`_flink/0`), not opened where
/// every file is the same (then ldb must find the same keys too), else ldb's scans.
fn expected_keys(
    scratch: &Path,
    all: &BTreeMap<u64, Restored>,
    a: u64,
    b: u64,
    limit: usize,
) -> BTreeMap<String, Value> {
    let names: BTreeSet<&String> = all[&a].keys().chain(all[&b].keys()).collect();
    names
        .into_iter()
        .map(|backend| {
            let (fa, fb) = (all[&a].get(backend), all[&b].get(backend));
            let dir = |id: u64, files: Option<&BTreeMap<String, Vec<u8>>>| {
                files
                    .filter(|f| f.contains_key("CURRENT"))
                    .map(|_| scratch.join(format!("cp-{id}")).join(backend))
            };
            let (da, db) = (dir(a, fa), dir(b, fb));
            let keys = if da.is_none() && db.is_none() {
                json!({"comparison": "not_rocks_db", "column_families": []})
            } else {
                let compared = independent_keys(da.as_deref(), db.as_deref(), limit);
                if fa == fb {
                    for cf in compared["column_families"].as_array().unwrap() {
                        assert_eq!(cf["listed"], json!([]), "{backend}: same files, other keys");
                    }
                    json!({"comparison": "same_files", "column_families": []})
                } else {
                    compared
                }
            };
            (backend.clone(), keys)
        })
        .collect()
}

fn keys_of(report: &Value) -> BTreeMap<String, Value> {
    report["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["backend"].as_str().unwrap().to_string(),
                b["keys"].clone(),
            )
        })
        .collect()
}

#[test]
fn diff_keys_of_flink_checkpoints_match_ldb() {
    let dir = tempfile::tempdir().unwrap();
    let (s, restored) = imported(dir.path());
    let before = tree_state(Path::new(&s));
    // chk-4 (933 records) to chk-6 (1000): keys added (`seqs`: a map entry per record),
    // changed (`count`, `sum`, `recent`) and unchanged; chk-5 to chk-6: the same state;
    // chk-6 back to chk-4: the mirror image.
    for (a, b) in [(1, 3), (2, 3), (3, 1)] {
        let report = diff_json(&s, a, b, &["--keys"]);
        assert_eq!(
            keys_of(&report),
            expected_keys(dir.path(), &restored, a, b, 1000),
            "{a} {b}"
        );
        // The file-level part is the same as without --keys.
        let mut files = report.clone();
        for b in files["backends"].as_array_mut().unwrap() {
            b.as_object_mut().unwrap().remove("keys");
        }
        assert_eq!(files, diff_json(&s, a, b, &[]));
    }
    let report = diff_json(&s, 1, 3, &["--keys"]);
    let keys = keys_of(&report);
    let cf = |backend: &str, name: &str| -> Value {
        keys[backend]["column_families"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["column_family"] == name)
            .unwrap()
            .clone()
    };
    // EXPECTED: seqs of counter/0 holds 393 entries in chk-4 and 420 in chk-6.
    let seqs = cf("counter/0", "seqs");
    let count = |c: &Value, f: &str| c[f].as_u64().unwrap();
    assert_eq!(
        count(&seqs, "removed") + count(&seqs, "changed") + count(&seqs, "unchanged"),
        393
    );
    assert_eq!(
        count(&seqs, "added") + count(&seqs, "changed") + count(&seqs, "unchanged"),
        420
    );
    assert!(count(&seqs, "added") > 0 && count(&cf("counter/0", "count"), "changed") > 0);
    assert_eq!(keys["_flink/0"]["comparison"], "not_rocks_db");

    // --limit bounds the listing, never the counts.
    let limited = diff_json(&s, 1, 3, &["--keys", "--limit", "5"]);
    assert_eq!(
        keys_of(&limited),
        expected_keys(dir.path(), &restored, 1, 3, 5)
    );
    let seqs5 = keys_of(&limited)["counter/0"]["column_families"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["column_family"] == "seqs")
        .unwrap()
        .clone();
    assert_eq!(seqs5["listed"].as_array().unwrap().len(), 5);
    assert_eq!(seqs5["listed_all"], false);
    assert_eq!(seqs5["added"], seqs["added"]);
    let table = ok(ckptfs(&["diff", &s, "1", "3", "--keys", "--limit", "5"]));
    assert!(table.contains("    keys of seqs: "), "{table}");
    assert!(
        table.contains("more changes not listed (raise --limit)"),
        "{table}"
    );
    assert!(
        table.contains("    keys: not a RocksDB directory"),
        "{table}"
    );
    // Read-only: the store is as it was; the directories written out are under $TMPDIR,
    // and removed again.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = Command::new(crate::common::mounted::BIN)
        .args(["diff", &s, "1", "3", "--keys", "--json"])
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert_eq!(serde_json::from_str::<Value>(&ok(out)).unwrap(), report);
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
    assert_eq!(tree_state(Path::new(&s)), before);
}
