//! Helpers for tests that run the `ckptfs` command as a user would.

use std::path::Path;

use super::mounted::ckptfs;

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn workload(store: &Path, rounds: &str) {
    let out = ckptfs(&[
        "workload",
        store.to_str().unwrap(),
        "--rounds",
        rounds,
        "--keys",
        "2000",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Keys and values of a directory as `ckptfs scan` prints them (percent-encoded).
pub fn scan_printed(dir: &Path) -> Vec<(String, String)> {
    let out = ckptfs(&["scan", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').expect("tab-separated");
            (k.to_string(), v.to_string())
        })
        .collect()
}
