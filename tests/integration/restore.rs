//! Restoring checkpoints: the library and `ckptfs restore` write exactly the checkpointed
//! data and refuse to overwrite; restored directories open in stock and older RocksDB
//! (Debian's ldb 7.8, the Python binding rocksdict); backends that lost their local state
//! start from the right checkpoint, and an unfinished restore is neither lost nor silent.

use std::process::Command;

use ckptfs_core::backend::scan_dir;
use ckptfs_core::{Engine, EngineConfig, Error};

use crate::common::cli::*;
use crate::common::mounted::ckptfs;
use crate::common::*;

#[test]
fn restore_round_trip_gives_exactly_the_checkpointed_data() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0", "B/3"])).unwrap();
    let (a, b) = (name("A/0"), name("B/3"));
    put_range(&engine, &a, 0..3000, "one");
    put_range(&engine, &b, 100..200, "two");
    engine.delete(&a, b"k000010").unwrap();
    engine.put(&b, b"bin\0key", &[0, 255, 10]).unwrap();
    let expected = snapshot_all(&engine);
    let cp = engine.checkpoint().unwrap();
    // Writes after the checkpoint are not in it.
    put_range(&engine, &a, 0..10, "later");
    engine.delete(&b, b"bin\0key").unwrap();
    assert_eq!(restored_contents(&store, cp.id), expected);
    assert_consistent(&engine);
}

#[test]
fn restore_refuses_a_non_empty_destination_and_bad_ids_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    engine.put(&name("A/0"), b"k", b"v").unwrap();
    engine.checkpoint().unwrap();
    let dest = dir.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("keep"), b"mine").unwrap();
    let err =
        ckptfs_core::commands::restore::restore_checkpoint(&store, 1, &dest, |_| {}).unwrap_err();
    assert!(matches!(err, Error::NotEmpty(_)), "{err}");
    assert_eq!(std::fs::read(dest.join("keep")).unwrap(), b"mine");

    let fresh = dir.path().join("fresh");
    let err =
        ckptfs_core::commands::restore::restore_checkpoint(&store, 9, &fresh, |_| {}).unwrap_err();
    assert!(matches!(err, Error::NoSuchCheckpoint(9)), "{err}");
    assert!(!fresh.exists());

    let err = ckptfs_core::commands::restore::restore_checkpoint(
        dir.path().join("nostore"),
        1,
        &fresh,
        |_| {},
    )
    .unwrap_err();
    assert_eq!(err.errno(), libc::ENOENT, "{err}");
    assert!(!fresh.exists());
}

#[test]
fn a_restored_directory_opens_in_stock_rocksdb_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    put_range(&engine, &name("A/0"), 0..500, "v");
    let expected = scan(&engine, &name("A/0"));
    let cp = engine.checkpoint().unwrap();
    let out = dir.path().join("out");
    ckptfs_core::commands::restore::restore_checkpoint(&store, cp.id, &out, |_| {}).unwrap();
    let got: Kv = scan_dir(&out.join("A/0")).unwrap().into_iter().collect();
    assert_eq!(got, expected);
    // scan never creates a database where there is none.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(scan_dir(&empty).is_err());
    assert!(std::fs::read_dir(&empty).unwrap().next().is_none());
}

/// Starting from a checkpoint (or rolling back to one) touches no live database unless
/// every backend's snapshot copies, verifies and opens: one bad object leaves all local
/// state as it was.
#[test]
fn a_restore_that_fails_for_one_backend_changes_no_backend() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut cfg = config(&store, &["A/0", "B/0"]);
    cfg.retain = Some(5);
    let engine = Engine::open(cfg.clone()).unwrap();
    put_range(&engine, &name("A/0"), 0..500, "old");
    put_range(&engine, &name("B/0"), 0..500, "old");
    let cp1 = engine.checkpoint().unwrap();
    put_range(&engine, &name("A/0"), 0..500, "new");
    put_range(&engine, &name("B/0"), 0..500, "new");
    engine.checkpoint().unwrap();
    let live = snapshot_all(&engine);
    // Corrupt an object only checkpoint 1 of B/0 has.
    let b1 = cp1.backend(&name("B/0")).unwrap();
    let victim = b1.files.iter().find(|f| f.name.ends_with(".sst")).unwrap();
    let path = engine.object_store().local_path(&victim.object).unwrap();
    std::fs::write(&path, b"rot").unwrap();

    // At run time ...
    assert!(matches!(
        engine.restore_backends(cp1.id),
        Err(Error::Corrupt(_))
    ));
    assert_eq!(snapshot_all(&engine), live);
    drop(engine);
    // ... and at start.
    let mut restore = cfg.clone();
    restore.restore_from = Some(cp1.id);
    assert!(matches!(Engine::open(restore), Err(Error::Corrupt(_))));
    let engine = Engine::open(cfg).unwrap();
    assert_eq!(snapshot_all(&engine), live);

    // A restore from a store that does not exist creates nothing.
    let typo = dir.path().join("typo");
    let mut bad = config(&typo, &["A/0"]);
    bad.restore_from = Some(3);
    assert!(matches!(Engine::open(bad), Err(Error::NoSuchCheckpoint(3))));
    assert!(!typo.exists());
}

#[test]
fn backends_start_from_the_latest_checkpoint_when_local_state_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0", "B/1"])).unwrap();
    put_range(&engine, &name("A/0"), 0..1000, "kept");
    put_range(&engine, &name("B/1"), 0..10, "kept");
    engine.checkpoint().unwrap();
    let expected = snapshot_all(&engine);
    put_range(&engine, &name("A/0"), 0..1000, "lost");
    drop(engine);
    std::fs::remove_dir_all(store.join("state")).unwrap();
    // No --backend given: the store remembers its backends.
    let engine = Engine::open(ckptfs_core::EngineConfig::new(&store)).unwrap();
    assert_eq!(engine.backend_names(), vec![name("A/0"), name("B/1")]);
    assert_eq!(snapshot_all(&engine), expected);
    // And it checkpoints incrementally from there.
    put_range(&engine, &name("B/1"), 10..20, "more");
    let cp = engine.checkpoint().unwrap();
    assert!(cp.stats.files_reused > 0);
    assert_consistent(&engine);
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
    let pairs = scan_printed(&dest.join("Operator-1/0"));
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
    let expected = scan_printed(&db);

    let ldb_keys: Vec<String> = crate::common::read_with_ldb(&db)
        .into_iter()
        .map(|(k, _)| k.to_uppercase())
        .collect();
    let expected_keys: Vec<String> = expected
        .iter()
        .map(|(k, _)| hex(&ckptfs_core::percent::decode(k).unwrap()))
        .collect();
    assert_same(&ldb_keys, &expected_keys, "ldb");

    let db2 = dest.join("Operator-2/0");
    let got: Vec<String> = crate::common::read_with_rocksdict(&db2)
        .into_iter()
        .map(|(k, v)| format!("{k} {v}").to_uppercase())
        .collect();
    let want: Vec<String> = scan_printed(&db2)
        .iter()
        .map(|(k, v)| {
            format!(
                "{} {}",
                hex(&ckptfs_core::percent::decode(k).unwrap()),
                hex(&ckptfs_core::percent::decode(v).unwrap())
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

/// With the local state lost and the newest manifest unreadable, a backend
/// must not start from an older checkpoint in silence.
#[test]
fn no_silent_rollback_past_an_unreadable_newest_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = six_checkpoints(&store);
    std::fs::remove_dir_all(store.join("state")).unwrap();
    let newest = store.join(format!("checkpoints/{}.json", ids[5]));
    let text = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &text[..text.len() / 2]).unwrap();
    let err = Engine::open(EngineConfig::new(&store))
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("no local state"), "{err}");
    // Choosing explicitly works.
    let mut cfg = EngineConfig::new(&store);
    cfg.restore_from = Some(ids[4]);
    let engine = Engine::open(cfg).unwrap();
    assert!(!engine.scan(&name("A/0")).unwrap().is_empty());
}

/// An interrupted restore whose checkpoint became unreadable is not
/// silently abandoned (that would leave backends half restored).
#[test]
fn an_interrupted_restore_that_cannot_finish_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = six_checkpoints(&store);
    std::fs::write(store.join("state/restore-intent"), ids[2].to_string()).unwrap();
    let path = store.join(format!("checkpoints/{}.json", ids[2]));
    let text = std::fs::read(&path).unwrap();
    std::fs::write(&path, &text[..10]).unwrap();
    let err = Engine::open(EngineConfig::new(&store))
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("interrupted"), "{err}");
    std::fs::write(&path, &text).unwrap();
    // Readable again: the restore is finished, and the intent is gone.
    let engine = Engine::open(EngineConfig::new(&store)).unwrap();
    assert!(!store.join("state/restore-intent").exists());
    drop(engine);
}

/// `--restore N` of a store whose state is lost starts a backend that N
/// does not hold from that backend's newest checkpoint, not empty.
#[test]
fn a_restore_starts_backends_the_checkpoint_lacks_from_their_newest() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = six_checkpoints(&store);
    let mut cfg = config(&store, &["A/0", "B/0"]);
    cfg.retain = Some(20);
    let engine = Engine::open(cfg).unwrap();
    put_range(&engine, &name("B/0"), 0..50, "b");
    engine.checkpoint().unwrap();
    drop(engine);
    std::fs::remove_dir_all(store.join("state")).unwrap();
    let mut cfg = EngineConfig::new(&store);
    cfg.restore_from = Some(ids[2]);
    let engine = Engine::open(cfg).unwrap();
    assert_eq!(
        engine.scan(&name("B/0")).unwrap().len(),
        50,
        "B/0 started empty"
    );
}

/// While a restore is unfinished (its intent left by a failed swap), its
/// checkpoint is neither dropped nor retired by retention.
#[test]
fn the_checkpoint_of_an_unfinished_restore_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = six_checkpoints(&store);
    let mut cfg = EngineConfig::new(&store);
    cfg.retain = Some(10);
    let engine = Engine::open(cfg).unwrap();
    std::fs::write(store.join("state/restore-intent"), ids[1].to_string()).unwrap();
    let err = engine.delete_checkpoint(ids[1]).unwrap_err();
    assert!(matches!(err, Error::Busy(_)), "{err}");
    engine.set_retain(1).unwrap();
    assert!(retained_ids(&engine).contains(&ids[1]));
}
