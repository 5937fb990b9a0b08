//! The command line, run as a user would: restore, fsck, scan, workload; checkpoints open in
//! older RocksDB (Debian's ldb 7.8, the Python binding rocksdict); the man page documents
//! every subcommand and option that `--help` shows.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn ckptfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ckptfs"))
        .args(args)
        .output()
        .expect("run ckptfs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn workload(store: &Path, rounds: &str) {
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
fn scan(dir: &Path) -> Vec<(String, String)> {
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

#[test]
fn restore_writes_every_backend_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    workload(&store, "3");
    let dest = dir.path().join("out");
    let out = ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        "3",
        dest.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pairs = scan(&dest.join("Operator-1/0"));
    assert!(
        pairs.iter().any(|(k, v)| k == "__round" && v == "2"),
        "{:?}",
        &pairs[..3]
    );
    assert_eq!(
        ckptfs(&[
            "scan",
            dest.join("Operator-2/0").to_str().unwrap(),
            "--count"
        ])
        .stdout,
        format!("{}\n", pairs.len()).into_bytes()
    );

    let again = ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        "3",
        dest.to_str().unwrap(),
    ]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("not empty"),
        "{}",
        text(&again.stderr)
    );

    let missing = ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        "99",
        dir.path().join("x").to_str().unwrap(),
    ]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("no such checkpoint: 99"));
    assert!(!dir.path().join("x").exists());

    let usage = ckptfs(&["restore", store.to_str().unwrap(), "notanumber", "x"]);
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn fsck_exit_code_follows_the_store_health() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    workload(&store, "2");
    let clean = ckptfs(&["fsck", store.to_str().unwrap()]);
    assert!(clean.status.success(), "{}", text(&clean.stdout));
    assert!(text(&clean.stdout).contains("clean"));

    let orphan = blake3::hash(b"stray").to_hex().to_string();
    let shard = store.join("objects").join(&orphan[..2]);
    std::fs::create_dir_all(&shard).unwrap();
    std::fs::write(shard.join(&orphan), b"stray").unwrap();
    let dirty = ckptfs(&["fsck", store.to_str().unwrap(), "--json"]);
    assert_eq!(dirty.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&dirty.stdout).unwrap();
    assert_eq!(report["orphans"][0], orphan.as_str());
    let repaired = ckptfs(&["fsck", store.to_str().unwrap(), "--repair"]);
    assert!(repaired.status.success(), "{}", text(&repaired.stdout));
    assert!(!shard.join(&orphan).exists());

    let not_a_store = ckptfs(&["fsck", dir.path().to_str().unwrap()]);
    assert_eq!(not_a_store.status.code(), Some(1));
    assert!(text(&not_a_store.stderr).contains("not a ckptfs store"));
}

/// Checkpoints are written with SST format_version 5 by default, so the RocksDB people run
/// opens them: Debian's ldb (RocksDB 7.8) and the Python binding rocksdict.
#[test]
fn a_restored_checkpoint_opens_in_older_rocksdb_releases() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    workload(&store, "4");
    let dest = dir.path().join("out");
    assert!(ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        "4",
        dest.to_str().unwrap()
    ])
    .status
    .success());
    let db = dest.join("Operator-1/0");
    let expected = scan(&db);

    let ldb_keys: Vec<String> = common::read_with_ldb(&db)
        .into_iter()
        .map(|(k, _)| k.to_uppercase())
        .collect();
    let expected_keys: Vec<String> = expected
        .iter()
        .map(|(k, _)| hex(&ckptfs::percent::decode(k).unwrap()))
        .collect();
    assert_same(&ldb_keys, &expected_keys, "ldb");

    let db2 = dest.join("Operator-2/0");
    let got: Vec<String> = common::read_with_rocksdict(&db2)
        .into_iter()
        .map(|(k, v)| format!("{k} {v}").to_uppercase())
        .collect();
    let want: Vec<String> = scan(&db2)
        .iter()
        .map(|(k, v)| {
            format!(
                "{} {}",
                hex(&ckptfs::percent::decode(k).unwrap()),
                hex(&ckptfs::percent::decode(v).unwrap())
            )
        })
        .collect();
    assert_same(&got, &want, "rocksdict");
}

/// Compare long listings without printing thousands of lines.
fn assert_same(got: &[String], want: &[String], who: &str) {
    assert_eq!(
        got.len(),
        want.len(),
        "{who} saw {} entries, expected {}",
        got.len(),
        want.len()
    );
    if let Some(i) = (0..got.len()).find(|i| got[*i] != want[*i]) {
        panic!("{who} differs at entry {i}: {:?} vs {:?}", got[i], want[i]);
    }
    assert!(!got.is_empty());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect::<String>()
}

/// Every subcommand and every long option that `--help` shows is in man/ckptfs.8.
#[test]
fn the_man_page_documents_every_subcommand_and_option() {
    let man = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/man/ckptfs.8"))
        .unwrap()
        .replace("\\-", "-");
    let help = text(&ckptfs(&["--help"]).stdout);
    let subcommands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(subcommands.len() >= 4, "{help}");
    for sub in &subcommands {
        assert!(
            man.contains(&format!(".B ckptfs {sub}")),
            "man page lacks subcommand {sub}"
        );
        let sub_help = text(&ckptfs(&[sub, "--help"]).stdout);
        for word in sub_help.split_whitespace() {
            let option = word.trim_end_matches([',', '.']);
            let option = option.split(['=', '[', '<']).next().unwrap();
            if option.starts_with("--")
                && option.len() > 2
                && option != "--help"
                && option != "--version"
            {
                assert!(man.contains(option), "man page lacks {option} of {sub}");
            }
        }
    }
}

/// Progress shows on a terminal (script(1) gives the command a pty) and nowhere else.
#[test]
fn restore_shows_progress_only_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    workload(&store, "2");
    let quiet = ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        "2",
        dir.path().join("a").to_str().unwrap(),
    ]);
    assert!(quiet.status.success());
    assert!(
        !text(&quiet.stderr).contains("restoring"),
        "{}",
        text(&quiet.stderr)
    );
    let command = format!(
        "{} restore {} 2 {}",
        env!("CARGO_BIN_EXE_ckptfs"),
        store.display(),
        dir.path().join("b").display()
    );
    let tty = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("script(1) from util-linux");
    assert!(tty.status.success(), "{}", text(&tty.stderr));
    let shown = text(&tty.stdout);
    assert!(
        shown.contains("restoring") && shown.contains("KiB"),
        "{shown:?}"
    );
}
