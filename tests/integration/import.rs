//! Importing the checkpoint directories of RocksDB applications ckptfs does not host
//! (`ckptfs import`, the control file's `import` line): databases written and checkpointed
//! by Debian's `ldb` (RocksDB 7.8) and by a RocksJava program (FRocksDB 8.10 from Flink's
//! distribution), imported into stores and mounts, copied out file for file and opened by
//! the application's RocksDB again; and every refusal, which changes nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::java::{compile_java, JavaTmp};
use crate::common::moto::moto;
use crate::common::mounted::{ckptfs, errno_of, ok, Ctl, Mounted, BIN};
use crate::common::read_with_ldb;

/// `ldb` on a database directory; panics with its output on failure.
fn ldb(db: &Path, args: &[&str]) {
    let out = Command::new("ldb")
        .arg(format!("--db={}", db.display()))
        .args(args)
        .output()
        .expect("ldb (Debian package rocksdb-tools)");
    assert!(
        out.status.success(),
        "ldb {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Write keys `range` (values tagged with `tag`) into the database at `db`, creating it.
fn ldb_write(db: &Path, range: std::ops::Range<u32>, tag: &str) {
    let mut args = vec!["--create_if_missing".to_string(), "batchput".to_string()];
    for i in range {
        args.push(format!("key{i:06}"));
        args.push(format!("{tag}-{i}-{}", "v".repeat(100)));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ldb(db, &args);
}

/// `ldb checkpoint`: RocksDB's Checkpoint API, as an application calls it.
fn ldb_checkpoint(db: &Path, dest: &Path) {
    ldb(
        db,
        &[
            "checkpoint",
            &format!("--checkpoint_dir={}", dest.display()),
        ],
    );
}

/// Every file of a directory and its bytes.
fn files_of(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn import_output(target: &Path, imports: &[(&str, &Path)], extra: &[&str]) -> Output {
    let mut args = vec!["import".to_string(), target.display().to_string()];
    for (backend, dir) in imports {
        args.push(format!("{backend}={}", dir.display()));
    }
    args.push("--json".into());
    args.extend(extra.iter().map(|s| s.to_string()));
    Command::new(BIN).args(&args).output().unwrap()
}

/// `ckptfs import --json` that must succeed: its answer.
fn import(target: &Path, imports: &[(&str, &Path)]) -> serde_json::Value {
    serde_json::from_str(&ok(import_output(target, imports, &[]))).unwrap()
}

/// The engine's one refusal of an import into backend A/0, which the store hosts.
const HOSTED_A: &str =
    "backend A/0 is hosted (a daemon of this store runs its RocksDB): import into another name";

/// `ckptfs import` that must fail: its stderr.
fn refused(target: &Path, imports: &[(&str, &Path)]) -> String {
    let out = import_output(target, imports, &["--wait", "0"]);
    assert!(
        !out.status.success(),
        "import succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The first import into a new store reads each file once (it copies while it hashes:
/// nothing can be stored yet), and a second import of the same directory reads nothing of
/// what it re-references. Bytes read are the import's `rchar` (read by its shell, which
/// reaps it: Linux adds a reaped child's I/O to its parent's).
#[test]
fn a_first_import_reads_each_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("db");
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    let db = rocksdb::DB::open(&options, &src).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..8192u32 {
        // 1 KiB of incompressible bytes a key: 8 MiB of SSTs.
        let value: Vec<u8> = (0..128)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        db.put(format!("k{i:06}"), value).unwrap();
    }
    db.flush().unwrap();
    let cp = dir.path().join("cp");
    rocksdb::checkpoint::Checkpoint::new(&db)
        .unwrap()
        .create_checkpoint(&cp)
        .unwrap();
    drop(db);
    let bytes: u64 = std::fs::read_dir(&cp)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(bytes > 8 << 20, "{bytes}");
    let store = dir.path().join("store");
    let rchar_of_import = || -> u64 {
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#""$0" import "$1" "app/0=$2" >/dev/null && cat /proc/$$/io"#)
            .arg(BIN)
            .arg(&store)
            .arg(&cp)
            .output()
            .unwrap();
        let io = ok(out);
        io.lines()
            .find_map(|l| l.strip_prefix("rchar:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let first = rchar_of_import();
    assert!(
        first < bytes + bytes / 4,
        "the first import read {first} bytes of a {bytes}-byte directory"
    );
    let again = rchar_of_import();
    assert!(
        again < bytes / 4,
        "importing it again read {again} bytes of a {bytes}-byte directory"
    );
    assert_eq!(checkpoint_count(&store), 2);
}

fn checkpoint_count(target: &Path) -> usize {
    let out = ok(ckptfs(&["ls", target.to_str().unwrap(), "--json"]));
    serde_json::from_str::<Vec<serde_json::Value>>(&out)
        .unwrap()
        .len()
}

#[test]
fn ldb_checkpoints_are_imported_incrementally_and_come_back_file_for_file() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store) = (dir.path().join("db"), dir.path().join("store"));
    let cp = |n: u32| dir.path().join(format!("cp{n}"));
    ldb_write(&db, 0..3000, "a");
    ldb_checkpoint(&db, &cp(1));
    let first = import(&store, &[("app/0", &cp(1))]);
    let report = &first["imports"][0];
    assert_eq!(report["backend"], "app/0");
    assert_eq!(report["files"], files_of(&cp(1)).len());
    // Nothing to re-reference yet: every file is read.
    assert_eq!(report["files_read"], report["files"], "{first}");

    ldb_write(&db, 3000..3300, "b");
    ldb_checkpoint(&db, &cp(2));
    let second = import(&store, &[("app/0", &cp(2))]);
    assert_eq!(second["id"], first["id"].as_u64().unwrap() + 1);
    let report = &second["imports"][0];
    // The SST of the first round is the same inode (hard-linked by RocksDB): not read.
    assert!(
        report["files_read"].as_u64() < report["files"].as_u64(),
        "{second}"
    );
    assert!(
        report["bytes_read"].as_u64().unwrap() < report["bytes"].as_u64().unwrap() / 2,
        "{second}"
    );
    assert!(report["bytes_stored"].as_u64() <= report["bytes_read"].as_u64());

    // Offline views name the backend as external.
    let ls = ok(ckptfs(&["ls", store.to_str().unwrap()]));
    assert!(ls.contains("external backends (imported): app/0"), "{ls}");
    let status: serde_json::Value =
        serde_json::from_str(&ok(ckptfs(&["status", store.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(status["external"], serde_json::json!(["app/0"]));
    assert_eq!(status["backends"], serde_json::json!([]));

    // A mount of a store of imports hosts nothing, and shows each import as it was.
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &[]);
    let status = m.status();
    assert_eq!(status["backends"], serde_json::json!([]), "{status}");
    assert_eq!(status["external"], serde_json::json!(["app/0"]));
    for (n, id) in [(1, &first["id"]), (2, &second["id"])] {
        let out = dir.path().join(format!("out{n}"));
        let copied = Command::new("cp")
            .arg("-r")
            .arg(mnt.join(format!("cp-{id}/app/0")))
            .arg(&out)
            .status()
            .unwrap();
        assert!(copied.success());
        // Exactly the files of the directory imported: same names, same bytes.
        assert_eq!(files_of(&out), files_of(&cp(n)));
        let keys = read_with_ldb(&out);
        assert_eq!(keys.len(), if n == 1 { 3000 } else { 3300 });
        assert_eq!(keys, read_with_ldb(&cp(n)));
    }
    m.umount();

    // ckptfs restore writes the same files without a mount.
    let restored = dir.path().join("restored");
    ok(ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        &second["id"].to_string(),
        restored.to_str().unwrap(),
    ]));
    assert_eq!(files_of(&restored.join("app/0")), files_of(&cp(2)));
}

/// An `import` line lists and checks its directory once: the checkpoint line after it stores
/// that listing (the files held open since), without listing the directory again, so a
/// file that appears in between is not in it.
#[test]
fn an_import_line_is_listed_once_and_its_checkpoint_stores_that_listing() {
    let m = Mounted::new(&[]);
    let (db, cp) = (m.root.join("db"), m.root.join("cp"));
    ldb_write(&db, 0..500, "a");
    ldb_checkpoint(&db, &cp);
    let listed = files_of(&cp);
    let mut ctl = Ctl::open(&m);
    let encoded = ckptfs_core::percent::encode(cp.to_str().unwrap().as_bytes());
    ctl.send(&format!("import app/0 {encoded}\n")).unwrap();
    let staged = ctl.answer();
    assert_eq!(staged["files"], listed.len(), "{staged}");
    let sst = listed
        .keys()
        .find(|n| n.ends_with(".sst"))
        .expect("an SST")
        .clone();
    std::fs::copy(cp.join(&sst), cp.join("999999.sst")).unwrap();
    ctl.send("checkpoint\n").unwrap();
    let done = ctl.answer();
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(done["imports"][0]["files"], listed.len(), "{done}");
    let id = done["id"].as_u64().unwrap();
    drop(ctl);
    assert_eq!(files_of(&m.mnt.join(format!("cp-{id}/app/0"))), listed);
    m.umount();
}

#[test]
fn imports_through_the_control_file_join_hosted_backends_and_are_carried_over() {
    let m = Mounted::new(&["--backend", "A/0"]);
    let (db, cp) = (m.root.join("db"), m.root.join("cp"));
    ldb_write(&db, 0..500, "a");
    ldb_checkpoint(&db, &cp);
    m.put("A/0", "hosted", "1");

    // One checkpoint of the hosted backend and the imported directory.
    let mut ctl = Ctl::open(&m);
    let encoded = ckptfs_core::percent::encode(cp.to_str().unwrap().as_bytes());
    ctl.send(&format!("import app/0 {encoded}\ncheckpoint\n"))
        .unwrap();
    let staged = ctl.answer();
    assert_eq!(staged["ok"], true, "{staged}");
    assert_eq!(staged["staged"], "app/0");
    assert_eq!(staged["files"], files_of(&cp).len());
    let done = ctl.answer();
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(done["imports"][0]["backend"], "app/0");
    let id = done["id"].as_u64().unwrap();
    drop(ctl);
    let names = |id: u64| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(m.mnt.join(format!("cp-{id}")))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(id), ["A", "app"]);

    // A plain checkpoint carries the imported backend over unchanged.
    m.put("A/0", "hosted", "2");
    let next = m.checkpoint();
    assert_eq!(names(next), ["A", "app"]);
    assert_eq!(
        files_of(&m.mnt.join(format!("cp-{next}/app/0"))),
        files_of(&cp)
    );
    let manifest = m.manifest(next);
    let manifest_before = m.manifest(id);
    let app = |manifest: &serde_json::Value| {
        manifest["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == "app/0")
            .cloned()
            .unwrap()
    };
    assert_eq!(app(&manifest)["files"], app(&manifest_before)["files"]);
    let status = m.status();
    assert_eq!(status["backends"], serde_json::json!(["A/0"]));
    assert_eq!(status["external"], serde_json::json!(["app/0"]));
    let metrics = std::fs::read_to_string(m.mnt.join(".ckptfs/metrics")).unwrap();
    for line in [
        "ckptfs_imports_completed_total 1",
        "ckptfs_imports_failed_total 0",
        "ckptfs_external_backends 1",
        &format!(
            "ckptfs_import_read_bytes_total {}",
            done["imports"][0]["bytes_read"]
        ),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }

    // Writes, flushes and compactions of an imported backend are refused.
    let out = ckptfs(&["put", m.mnt(), "app/0", "k", "v"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("external"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ctl = Ctl::open(&m);
    assert_eq!(errno_of(ctl.send("flush app/0\n")), libc::EINVAL);
    assert!(ctl.answer()["error"]
        .as_str()
        .unwrap()
        .contains("is external"));
    // An import into a hosted backend's name is refused, and so is a relative directory.
    let hosted = refused(&m.mnt, &[("A/0", &cp)]);
    assert!(hosted.contains(HOSTED_A), "{hosted}");
    assert_eq!(
        errno_of(ctl.send("import app/0 relative/dir\n")),
        libc::EINVAL
    );
    assert!(ctl.answer()["error"].as_str().unwrap().contains("absolute"));
    assert_eq!(m.checkpoint_ids(), [id, next]);

    // Through the command line on the mount: the daemon imports. Given the store, the
    // command reaches the same daemon through its socket (never an offline import beside
    // it): one more checkpoint in the mount's list.
    ldb_write(&db, 500..600, "b");
    let cp2 = m.root.join("cp2");
    ldb_checkpoint(&db, &cp2);
    let answer = import(&m.mnt, &[("app/0", &cp2)]);
    assert_eq!(answer["imports"][0]["backend"], "app/0");
    let by_store = import(&m.store, &[("app/0", &cp2)]);
    assert_eq!(by_store["imports"][0]["backend"], "app/0");
    let ids = m.checkpoint_ids();
    assert_eq!(ids.last(), by_store["id"].as_u64().as_ref(), "{by_store}");
    let out = m.root.join("out");
    assert!(Command::new("cp")
        .arg("-r")
        .arg(m.mnt.join(format!("cp-{}/app/0", answer["id"])))
        .arg(&out)
        .status()
        .unwrap()
        .success());
    assert_eq!(read_with_ldb(&out).len(), 600);

    // A refused import line fails the checkpoint after it: nothing half-imported.
    ctl.send("import app/0 /nonexistent/dir\ncheckpoint\n")
        .unwrap();
    assert_eq!(ctl.answer()["errno"], libc::ENOENT);
    let after_refusal = ctl.answer();
    assert!(
        after_refusal["error"]
            .as_str()
            .unwrap()
            .contains("import line before this checkpoint was refused"),
        "{after_refusal}"
    );
    let e = refused(
        &m.mnt,
        &[("other/0", &cp2), ("app/0", &m.root.join("nonexistent"))],
    );
    assert!(e.contains("nonexistent"), "{e}");
    assert_eq!(checkpoint_count(&m.mnt), 3);

    // After a restart the backend is still external and still carried over.
    drop(ctl);
    m.umount();
    // Offline, a hosted backend's name is refused too, in the same words.
    let hosted = refused(&m.store, &[("A/0", &cp)]);
    assert!(hosted.contains("is hosted"), "{hosted}");
    assert!(hosted.contains(HOSTED_A), "{hosted}");
    m.mount(&[]);
    assert_eq!(m.status()["external"], serde_json::json!(["app/0"]));
    let after = m.checkpoint();
    assert_eq!(
        files_of(&m.mnt.join(format!("cp-{after}/app/0"))),
        files_of(&cp2)
    );
}

/// A directory holding a copy of a small RocksDB checkpoint; returns it.
fn small_checkpoint(root: &Path, name: &str) -> PathBuf {
    let db = root.join(format!("{name}-db"));
    ldb_write(&db, 0..100, name);
    let cp = root.join(name);
    ldb_checkpoint(&db, &cp);
    cp
}

#[test]
fn directories_that_are_no_rocksdb_checkpoint_are_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let good = small_checkpoint(dir.path(), "good");
    import(&store, &[("app/0", &good)]);
    let before = files_of(&store.join("checkpoints"));

    let no_current = small_checkpoint(dir.path(), "no-current");
    std::fs::remove_file(no_current.join("CURRENT")).unwrap();
    let e = refused(&store, &[("app/0", &no_current)]);
    assert!(e.contains("no CURRENT file"), "{e}");

    let link = small_checkpoint(dir.path(), "link");
    std::os::unix::fs::symlink(good.join("CURRENT"), link.join("000099.sst")).unwrap();
    let e = refused(&store, &[("app/0", &link)]);
    assert!(e.contains("symbolic link"), "{e}");

    let stray = small_checkpoint(dir.path(), "stray");
    std::fs::write(stray.join("notes.txt"), "x").unwrap();
    let e = refused(&store, &[("app/0", &stray)]);
    assert!(e.contains("not a file RocksDB writes"), "{e}");

    // A database a running RocksDB holds open (its LOCK is locked): this test's process.
    let live = dir.path().join("live");
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    let db = rocksdb::DB::open(&options, &live).unwrap();
    db.put(b"k", b"v").unwrap();
    db.flush().unwrap();
    let e = refused(&store, &[("app/0", &live)]);
    assert!(e.contains("open in a running RocksDB"), "{e}");
    assert!(e.contains("checkpoint"), "{e}");
    drop(db);

    let e = refused(&store, &[("app/0", &dir.path().join("missing"))]);
    assert!(e.contains("missing"), "{e}");
    // One bad directory among good ones refuses the whole import.
    let e = refused(&store, &[("app/0", &good), ("other/0", &no_current)]);
    assert!(e.contains("no CURRENT file"), "{e}");
    let e = refused(&store, &[("app/0", &good), ("app/0", &good)]);
    assert!(e.contains("imported twice"), "{e}");
    let out = ckptfs(&["import", store.to_str().unwrap(), "app-0=/tmp"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a bad BACKEND=DIR is a usage error"
    );

    // An unmounted mountpoint (an existing directory that is no store) is not made a store.
    let unmounted = dir.path().join("mnt");
    std::fs::create_dir(&unmounted).unwrap();
    let e = refused(&unmounted, &[("app/0", &good)]);
    assert!(e.contains("neither a ckptfs mount"), "{e}");
    assert_eq!(std::fs::read_dir(&unmounted).unwrap().count(), 0);
    // A roll-back a crash interrupted is the daemon's to finish first.
    let intent = store.join("state/restore-intent");
    std::fs::write(&intent, "1\n").unwrap();
    let e = refused(&store, &[("app/0", &good)]);
    assert!(
        e.contains("restore from checkpoint 1 was interrupted"),
        "{e}"
    );
    assert!(intent.exists());
    std::fs::remove_file(&intent).unwrap();

    assert_eq!(files_of(&store.join("checkpoints")), before);
    assert_eq!(checkpoint_count(&store), 1);
}

/// A file written while the import reads the directory fails the import (held between
/// files by a failpoint), and the store is as before.
#[cfg(feature = "failpoints")]
#[test]
fn a_file_changed_during_an_import_fails_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let cp = small_checkpoint(dir.path(), "cp");
    import(&store, &[("app/0", &cp)]);
    let cp2 = small_checkpoint(dir.path(), "cp2");
    let child = Command::new(BIN)
        .args([
            "import",
            store.to_str().unwrap(),
            &format!("other/0={}", cp2.display()),
        ])
        .env("FAILPOINTS", "ingest::before-file=1*sleep(2000)")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    let options = crate::common::file_starting_with(&cp2, "OPTIONS-");
    let mut text = std::fs::read(&options).unwrap();
    text.extend_from_slice(b"\n# changed\n");
    std::fs::write(&options, text).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("changed while it was imported"), "{e}");
    assert_eq!(checkpoint_count(&store), 1);
    // The backend it would have created is not left behind as external.
    let status: serde_json::Value =
        serde_json::from_str(&ok(ckptfs(&["status", store.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(status["external"], serde_json::json!(["app/0"]));
}

/// Two imports of one backend at once: the second is refused as busy while the first runs
/// (held at a failpoint), and the first completes.
#[cfg(feature = "failpoints")]
#[test]
fn concurrent_imports_of_one_backend_are_refused() {
    let m = Mounted::with_env(&[], &[("FAILPOINTS", "ingest::before-file=1*sleep(3000)")]);
    let cp = small_checkpoint(&m.root, "cp");
    let first = Command::new(BIN)
        .args([
            "import",
            m.mnt(),
            &format!("app/0={}", cp.display()),
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    let e = refused(&m.mnt, &[("app/0", &cp)]);
    assert!(e.contains("imports backends"), "{e}");
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(m.checkpoint_ids().len(), 1);
}

#[test]
fn imports_go_to_object_storage_too() {
    let url = moto().store();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cp = small_checkpoint(dir.path(), "cp");
    let target = PathBuf::from(&url);
    let out = import_output(
        &target,
        &[("app/0", &cp)],
        &["--state", state.to_str().unwrap()],
    );
    let answer: serde_json::Value = serde_json::from_str(&ok(out)).unwrap();
    let restored = dir.path().join("restored");
    ok(ckptfs(&[
        "restore",
        &url,
        &answer["id"].to_string(),
        restored.to_str().unwrap(),
    ]));
    assert_eq!(files_of(&restored.join("app/0")), files_of(&cp));
    let e = refused(&target, &[("app/0", &cp)]);
    assert!(e.contains("--state"), "{e}");
}

/// The keys a RocksJava checkpoint held as the application recorded them (`cp-N.keys`),
/// in the form `read_with_ldb` gives.
fn recorded_keys(file: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// A RocksJava application (FRocksDB 8.10 from Flink's distribution) writes while it makes
/// checkpoints with org.rocksdb.Checkpoint and records what each holds; each is imported,
/// and each restores to exactly the keys the application recorded, read by Debian's ldb
/// (RocksDB 7.8). Consecutive checkpoints share SSTs, which are not read again. The live
/// database, held open by the application, is refused.
#[test]
fn checkpoints_of_a_rocksjava_application_restore_to_the_keys_it_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let classpath = compile_java(
        "tests/java/RocksCheckpoints.java",
        &dir.path().join("classes"),
    );
    let (db, out, store) = (
        dir.path().join("db"),
        dir.path().join("out"),
        dir.path().join("store"),
    );
    let rounds = 5;
    // Declared before the JVM's guard: removed after it is killed.
    let tmp = JavaTmp::new();
    let java = tmp
        .java()
        .args(["-cp", &classpath, "RocksCheckpoints"])
        .arg(&db)
        .arg(&out)
        .args([&rounds.to_string(), "1500", "--hold", "60"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut java = KillOnDrop(java);
    {
        use std::io::BufRead;
        let stdout = java.0.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();
        loop {
            let line = lines
                .next()
                .expect("the Java program ended before holding its database")
                .unwrap();
            if line == "holding" {
                break;
            }
        }
    }
    // The application still has its database open.
    let e = refused(&store, &[("app/0", &db)]);
    assert!(e.contains("open in a running RocksDB"), "{e}");

    let mut ids = Vec::new();
    for n in 1..=rounds {
        let answer = import(&store, &[("app/0", &out.join(format!("cp-{n}")))]);
        let report = &answer["imports"][0];
        if n > 1 {
            assert!(
                report["files_read"].as_u64() < report["files"].as_u64(),
                "checkpoint {n}: {answer}"
            );
        }
        ids.push(answer["id"].as_u64().unwrap());
    }
    drop(java);
    // Retention (3) keeps the newest three; each restores to its recorded keys.
    let kept = checkpoint_count(&store);
    assert_eq!(kept, 3);
    for (n, id) in (1..=rounds).zip(&ids).skip(rounds - kept) {
        let restored = dir.path().join(format!("restored-{n}"));
        ok(ckptfs(&[
            "restore",
            store.to_str().unwrap(),
            &id.to_string(),
            restored.to_str().unwrap(),
        ]));
        let cp = out.join(format!("cp-{n}"));
        assert_eq!(files_of(&restored.join("app/0")), files_of(&cp));
        let keys = read_with_ldb(&restored.join("app/0"));
        assert!(!keys.is_empty());
        assert_eq!(
            keys,
            recorded_keys(&out.join(format!("cp-{n}.keys"))),
            "checkpoint {n}"
        );
    }
}

/// A child process killed when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// On a filesystem that shares extents (btrfs), an import into a store there clones each
/// file (`FICLONE`) instead of copying it: the store's objects use almost no space of
/// their own, every object still holds what its name says (fsck reads them all), and a
/// file of the source rewritten afterwards changes nothing stored. A restore there clones
/// the objects back, each checked by reading the clone: the restored database holds the
/// source's keys, in files of almost no bytes of their own.
#[test]
fn an_import_on_btrfs_shares_the_sources_extents() {
    let fs = crate::common::btrfs::Btrfs::new(1 << 30);
    let db = fs.mnt.join("db");
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    options.set_compression_type(rocksdb::DBCompressionType::None);
    {
        let rocks = rocksdb::DB::open(&options, &db).unwrap();
        // 96 MiB of bytes that do not compress, in a few SSTs.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..(96 * 1024) {
            let value: Vec<u8> = (0..1024)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            rocks.put(format!("key{i:08}"), value).unwrap();
        }
        rocks.flush().unwrap();
        rocksdb::checkpoint::Checkpoint::new(&rocks)
            .unwrap()
            .create_checkpoint(fs.mnt.join("cp"))
            .unwrap();
    }
    let cp = fs.mnt.join("cp");
    let sst_bytes: u64 = std::fs::read_dir(&cp)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".sst"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(sst_bytes > 90 << 20, "{sst_bytes}");
    let store = fs.mnt.join("store");
    let answer = import(&store, &[("app/0", &cp)]);
    assert_eq!(answer["id"], 1, "{answer}");
    run_sync();
    let exclusive = crate::common::btrfs::usage(&store.join("objects")).1;
    assert!(
        exclusive < sst_bytes / 20,
        "the store's objects use {exclusive} bytes of their own for {sst_bytes} bytes of SSTs"
    );
    let restored = fs.mnt.join("restored");
    ok(ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        "1",
        restored.to_str().unwrap(),
    ]));
    run_sync();
    let exclusive = crate::common::btrfs::usage(&restored).1;
    assert!(
        exclusive < sst_bytes / 20,
        "the restore uses {exclusive} bytes of its own for {sst_bytes} bytes of SSTs"
    );
    let reopened =
        rocksdb::DB::open_for_read_only(&options, restored.join("app/0"), false).unwrap();
    assert_eq!(
        reopened.iterator(rocksdb::IteratorMode::Start).count(),
        96 * 1024
    );
    drop(reopened);
    // The source's files rewritten in place (same names, other bytes): the store's
    // objects, clones, keep what they held.
    for entry in std::fs::read_dir(&cp).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sst") {
            let len = std::fs::metadata(&path).unwrap().len();
            std::fs::write(&path, vec![0u8; len as usize]).unwrap();
        }
    }
    let report: serde_json::Value =
        serde_json::from_str(&ok(ckptfs(&["fsck", store.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
}

fn run_sync() {
    assert!(Command::new("sync").status().unwrap().success());
}
