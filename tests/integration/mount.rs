//! The mounted tree (real FUSE mounts; root and /dev/fuse are required, here and in CI): it
//! follows checkpoints, compactions and drops; `cp -r` gives a directory RocksDB opens;
//! `rmdir` drops a checkpoint; nothing inside a checkpoint changes; other users get in only
//! with --allow-other; `ls`, `status` and `graph` describe what the store holds.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::mounted::*;

#[test]
fn the_tree_follows_checkpoints_compactions_and_drops() {
    let m = Mounted::new(&["--backend", "A/0", "--backend", "B/1", "--retain", "2"]);
    assert_eq!(m.root_names(), vec![".ckptfs"]);
    m.put("A/0", "k1", "v1");
    assert_eq!(m.checkpoint(), 1);
    m.put("B/1", "k2", "v2");
    assert_eq!(m.checkpoint(), 2);
    ok(ckptfs(&["put", m.mnt(), "A/0", "k3", "v3"]));
    let mut ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.mnt.join(".ckptfs/ctl"))
        .unwrap();
    ctl.write_all(b"compact A/0\n").unwrap();
    let mut answer = String::new();
    BufReader::new(&ctl).read_line(&mut answer).unwrap();
    assert_eq!(answer, "{\"ok\":true}\n");
    assert_eq!(m.checkpoint(), 3);
    assert_eq!(m.root_names(), vec![".ckptfs", "cp-2", "cp-3", "latest"]);
    assert_eq!(
        std::fs::read_link(m.mnt.join("latest")).unwrap(),
        PathBuf::from("cp-3")
    );

    for id in [2u64, 3] {
        let manifest = m.manifest(id);
        let cp = m.mnt.join(format!("cp-{id}"));
        let mut ops: Vec<String> = std::fs::read_dir(&cp)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        ops.sort();
        assert_eq!(ops, vec!["A", "B"]);
        let cp_meta = std::fs::metadata(&cp).unwrap();
        assert_eq!(cp_meta.permissions().mode() & 0o7777, 0o555);
        assert_eq!(cp_meta.nlink(), 4);
        let completed = manifest["completed_unix_ms"].as_u64().unwrap() as i64;
        assert_eq!(cp_meta.mtime(), completed / 1000);
        for backend in manifest["backends"].as_array().unwrap() {
            let dir = cp.join(backend["name"].as_str().unwrap());
            let mut want: Vec<(String, u64)> = backend["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["name"].as_str().unwrap().to_string(),
                        f["size"].as_u64().unwrap(),
                    )
                })
                .collect();
            want.sort();
            let mut got: Vec<(String, u64)> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (
                        e.file_name().into_string().unwrap(),
                        e.metadata().unwrap().len(),
                    )
                })
                .collect();
            got.sort();
            assert_eq!(got, want, "cp-{id}/{}", backend["name"]);
            let f = dir.join(&want[0].0);
            let meta = std::fs::metadata(&f).unwrap();
            assert_eq!(meta.permissions().mode() & 0o7777, 0o444);
            assert_eq!(meta.nlink(), 1);
            assert_eq!(
                std::fs::metadata(&f).unwrap().ino(),
                meta.ino(),
                "inode numbers are stable"
            );
            assert_eq!(std::fs::read(&f).unwrap().len() as u64, want[0].1);
        }
    }
    let ctl_meta = std::fs::metadata(m.mnt.join(".ckptfs/ctl")).unwrap();
    assert_eq!(ctl_meta.permissions().mode() & 0o7777, 0o600);
    // The registry lists every stored object with its count and where it appears.
    let registry = std::fs::read_to_string(m.mnt.join(".ckptfs/registry")).unwrap();
    let rows: Vec<serde_json::Value> = registry
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!rows.is_empty());
    // File lists are stored objects too, named as such.
    assert!(rows.iter().any(|r| r["file_list_of"].is_array()));
    let retained = m.checkpoint_ids();
    for row in &rows {
        // Runs of consecutive retained checkpoints: [first, last].
        let runs = row["checkpoint_runs"].as_array().unwrap();
        let refs = retained
            .iter()
            .filter(|id| {
                runs.iter()
                    .any(|r| r[0].as_u64().unwrap() <= **id && **id <= r[1].as_u64().unwrap())
            })
            .count() as u64;
        assert_eq!(row["refcount"].as_u64().unwrap(), refs);
        assert!(std::fs::metadata(
            m.store
                .join("objects")
                .join(&row["id"].as_str().unwrap()[..2])
                .join(row["id"].as_str().unwrap())
        )
        .is_ok());
    }
}

#[test]
fn cp_r_out_of_the_mount_gives_a_directory_rocksdb_opens() {
    let m = Mounted::new(&["--backend", "Operator-2/1", "--backend", "Operator-1/0"]);
    m.put("Operator-2/1", "a key", "a%value");
    m.put("Operator-2/1", "gone", "x");
    ok(ckptfs(&["del", m.mnt(), "Operator-2/1", "gone"]));
    m.put("Operator-1/0", "other", "1");
    let id = m.checkpoint();
    m.put("Operator-2/1", "after", "not in the checkpoint");
    let one = m.root.join("one");
    let status = Command::new("cp")
        .arg("-r")
        .arg(m.mnt.join(format!("cp-{id}/Operator-2/1")))
        .arg(&one)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(scan(&one), kv(&[("a key", "a%value")]));
    let all = m.root.join("all");
    assert!(Command::new("cp")
        .arg("-r")
        .arg(m.mnt.join(format!("cp-{id}")))
        .arg(&all)
        .status()
        .unwrap()
        .success());
    assert_eq!(scan(&all.join("Operator-1/0")), kv(&[("other", "1")]));
    // RocksDB opens the checkpoint in place, read-only.
    assert_eq!(
        scan(&m.mnt.join("latest/Operator-2/1")),
        kv(&[("a key", "a%value")])
    );
    // Bytes read through the mount equal the restored copy.
    let restored = m.root.join("restored");
    ok(ckptfs(&[
        "restore",
        m.store.to_str().unwrap(),
        &id.to_string(),
        restored.to_str().unwrap(),
    ]));
    for entry in std::fs::read_dir(restored.join("Operator-2/1")).unwrap() {
        let entry = entry.unwrap();
        let via_mount = std::fs::read(
            m.mnt
                .join(format!("cp-{id}/Operator-2/1"))
                .join(entry.file_name()),
        )
        .unwrap();
        assert_eq!(
            via_mount,
            std::fs::read(entry.path()).unwrap(),
            "{:?}",
            entry.file_name()
        );
    }
    // find, du and sha256sum see a normal read-only tree.
    let cp_dir = m.mnt.join(format!("cp-{id}"));
    let manifest = m.manifest(id);
    let files: Vec<&serde_json::Value> = manifest["backends"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["files"].as_array().unwrap())
        .collect();
    let total: u64 = files.iter().map(|f| f["size"].as_u64().unwrap()).sum();
    let found = Command::new("find")
        .arg(&cp_dir)
        .args(["-type", "f"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&found.stdout).lines().count(),
        files.len()
    );
    let du = Command::new("du")
        .args(["-sb", "--apparent-size"])
        .arg(&cp_dir)
        .output()
        .unwrap();
    let du_bytes: u64 = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        du_bytes, total,
        "du --apparent-size counts exactly the file sizes"
    );
    let sum = |p: &Path| {
        String::from_utf8_lossy(&Command::new("sha256sum").arg(p).output().unwrap().stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        sum(&cp_dir.join("Operator-2/1/CURRENT")),
        sum(&restored.join("Operator-2/1/CURRENT"))
    );
    // tar sees a normal read-only tree.
    let tar = Command::new("tar")
        .arg("-cf")
        .arg(m.root.join("cp.tar"))
        .arg("-C")
        .arg(&m.mnt)
        .arg(format!("cp-{id}"))
        .output()
        .unwrap();
    assert!(
        tar.status.success(),
        "{}",
        String::from_utf8_lossy(&tar.stderr)
    );
}

#[test]
fn rmdir_drops_a_checkpoint_and_open_files_stay_readable() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "5"]);
    for i in 0..300 {
        m.put("A/0", &format!("key{i}"), &"v".repeat(50));
    }
    let first = m.checkpoint();
    m.put("A/0", "more", "data");
    let second = m.checkpoint();
    let dir = m.mnt.join(format!("cp-{first}/A/0"));
    let sst = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sst"))
        .unwrap();
    let expected = std::fs::read(&sst).unwrap();
    let mut held = std::fs::File::open(&sst).unwrap();
    let objects_before = m.status()["objects"].as_u64().unwrap();

    std::fs::remove_dir(m.mnt.join(format!("cp-{first}"))).unwrap();
    assert_eq!(m.checkpoint_ids(), vec![second]);
    assert!(!m.root_names().contains(&format!("cp-{first}")));
    assert!(!m.store.join(format!("checkpoints/{first}.json")).exists());
    assert!(m.status()["objects"].as_u64().unwrap() < objects_before);
    let mut content = Vec::new();
    held.read_to_end(&mut content).unwrap();
    assert_eq!(
        content, expected,
        "an open file of a dropped checkpoint must stay readable"
    );

    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join(format!("cp-{first}")))),
        libc::ENOENT
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join(format!("cp-{second}/A")))),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join(".ckptfs"))),
        libc::EPERM
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join("latest"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join("cp-0042"))),
        libc::ENOENT
    );
    // The newest checkpoint is not dropped by rmdir or rm: latest would move back. The
    // refusal is logged and in status, and rm says what to do.
    let latest = m.mnt.join("latest");
    let before = std::fs::read_link(&latest).unwrap();
    assert_eq!(before, std::path::Path::new(&format!("cp-{second}")));
    assert_eq!(
        errno_of(std::fs::remove_dir(m.mnt.join(format!("cp-{second}")))),
        libc::EBUSY
    );
    let last_error = m.status()["last_error"].as_str().unwrap().to_string();
    assert!(
        last_error.contains(&format!("rmdir cp-{second} refused: it is the newest"))
            && last_error.contains("--force"),
        "{last_error}"
    );
    let log = std::fs::read_to_string(m.store.join("ckptfs.log")).unwrap();
    assert!(log.contains(&last_error), "{log}");
    let rm = ckptfs(&["rm", m.mnt(), &second.to_string()]);
    assert_eq!(rm.status.code(), Some(1));
    let said = String::from_utf8_lossy(&rm.stderr);
    assert!(
        said.contains(&format!("checkpoint {second} is the newest"))
            && said.contains("leave no latest")
            && said.contains(&format!("ckptfs rm --force {} {second}", m.mnt())),
        "{said}"
    );
    assert_eq!(m.checkpoint_ids(), vec![second]);
    assert_eq!(std::fs::read_link(&latest).unwrap(), before);
    // --force drops it, and says where latest went.
    let forced = ckptfs(&["rm", "--force", m.mnt(), &second.to_string()]);
    assert!(forced.status.success(), "{forced:?}");
    assert!(
        String::from_utf8_lossy(&forced.stderr).contains("latest is gone"),
        "{forced:?}"
    );
    assert!(m.checkpoint_ids().is_empty());
    assert_eq!(m.root_names(), vec![".ckptfs"]);
    let rm = ckptfs(&["rm", m.mnt(), &second.to_string()]);
    assert_eq!(rm.status.code(), Some(1));
}

/// Dropping the newest of several checkpoints: rm names the one latest would move back
/// to; with --force, latest moves back to it and rm says so.
#[test]
fn the_newest_checkpoint_is_dropped_only_with_force() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "5"]);
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            m.put("A/0", "k", &i.to_string());
            m.checkpoint()
        })
        .collect();
    let rm = ckptfs(&["rm", m.mnt(), &ids[2].to_string()]);
    assert_eq!(rm.status.code(), Some(1));
    let said = String::from_utf8_lossy(&rm.stderr);
    assert!(
        said.contains(&format!("move latest back to cp-{}", ids[1])),
        "{said}"
    );
    assert_eq!(m.checkpoint_ids(), ids);
    // An older one goes as before.
    std::fs::remove_dir(m.mnt.join(format!("cp-{}", ids[0]))).unwrap();
    let forced = ok_both(ckptfs(&["rm", "--force", m.mnt(), &ids[2].to_string()]));
    assert!(
        forced.contains(&format!("latest is now cp-{}", ids[1])),
        "{forced}"
    );
    assert_eq!(m.checkpoint_ids(), vec![ids[1]]);
    assert_eq!(
        std::fs::read_link(m.mnt.join("latest")).unwrap(),
        std::path::Path::new(&format!("cp-{}", ids[1]))
    );
}

/// The stderr of a command that succeeded.
fn ok_both(out: std::process::Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn changes_inside_checkpoints_fail_and_change_nothing() {
    let m = Mounted::new(&["--backend", "A/0"]);
    m.put("A/0", "k", "v");
    let id = m.checkpoint();
    let dir = m.mnt.join(format!("cp-{id}/A/0"));
    let before: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let current = dir.join("CURRENT");
    let content = std::fs::read(&current).unwrap();
    assert_eq!(errno_of(std::fs::write(dir.join("new"), b"x")), libc::EROFS);
    assert_eq!(
        errno_of(std::fs::OpenOptions::new().write(true).open(&current)),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::fs::OpenOptions::new().append(true).open(&current)),
        libc::EROFS
    );
    assert_eq!(errno_of(std::fs::remove_file(&current)), libc::EROFS);
    assert_eq!(
        errno_of(std::fs::rename(&current, dir.join("C2"))),
        libc::EROFS
    );
    assert_eq!(errno_of(std::fs::create_dir(dir.join("sub"))), libc::EROFS);
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("x", dir.join("link"))),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::fs::set_permissions(
            &current,
            std::fs::Permissions::from_mode(0o644)
        )),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::fs::create_dir(m.mnt.join("cp-99"))),
        libc::EPERM
    );
    assert_eq!(
        errno_of(std::fs::write(m.mnt.join("file"), b"x")),
        libc::EPERM
    );
    assert_eq!(
        errno_of(std::fs::write(m.mnt.join(".ckptfs/status"), b"x")),
        libc::EROFS
    );
    let after: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before, after);
    assert_eq!(std::fs::read(&current).unwrap(), content);
    assert_eq!(
        m.root_names(),
        vec![".ckptfs", &format!("cp-{id}"), "latest"]
    );
}

/// The kernel caches the root's listing (FUSE's readdir cache), so a warm `ls` of many
/// checkpoints asks nothing of the daemon; yet every listing opened after a checkpoint or
/// a drop shows it, even when a handle opened before the change was read after it (that
/// handle's older picture must not end up in the cache).
#[test]
fn the_root_listing_is_cached_yet_follows_every_checkpoint_and_drop() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "3"]);
    let names = |dir: std::fs::ReadDir| -> Vec<String> {
        let mut names: Vec<String> = dir
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let expected = |m: &Mounted| -> Vec<String> {
        let mut want: Vec<String> = m
            .checkpoint_ids()
            .iter()
            .map(|id| format!("cp-{id}"))
            .chain([".ckptfs".to_string(), "latest".to_string()])
            .collect();
        want.sort();
        want
    };
    for round in 1..=5u32 {
        m.put("A/0", &format!("k{round}"), "v");
        // Opened alone (so it may fill the kernel's cache), read after the change.
        let before = std::fs::read_dir(&m.mnt).unwrap();
        let id = m.checkpoint();
        let old = names(before);
        assert!(!old.contains(&format!("cp-{id}")), "round {round}: {old:?}");
        for _ in 0..3 {
            assert_eq!(m.root_names(), expected(&m), "round {round}");
        }
        // Opened before the change, a second listing opened after it, the old one read
        // last.
        let before = std::fs::read_dir(&m.mnt).unwrap();
        m.put("A/0", &format!("j{round}"), "v");
        let id = m.checkpoint();
        let during = std::fs::read_dir(&m.mnt).unwrap();
        let now = names(during);
        assert!(now.contains(&format!("cp-{id}")), "round {round}: {now:?}");
        let old = names(before);
        assert!(!old.contains(&format!("cp-{id}")), "round {round}: {old:?}");
        for _ in 0..3 {
            assert_eq!(m.root_names(), expected(&m), "round {round}");
        }
    }
    // A drop, with a listing of the old set read after it.
    let ids = m.checkpoint_ids();
    let before = std::fs::read_dir(&m.mnt).unwrap();
    std::fs::remove_dir(m.mnt.join(format!("cp-{}", ids[0]))).unwrap();
    assert!(names(before).contains(&format!("cp-{}", ids[0])));
    for _ in 0..3 {
        let now = m.root_names();
        assert!(!now.contains(&format!("cp-{}", ids[0])), "{now:?}");
        assert_eq!(now, expected(&m));
    }
}

/// `ckptfs ls` lists every retained checkpoint (from `.ckptfs/checkpoints`), while
/// `.ckptfs/status` describes the newest 100 one by one and all of them as runs of ids;
/// `ckptfs status` shows the runs. A dropped checkpoint splits a run.
#[test]
fn ls_lists_every_checkpoint_and_status_summarises() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "1000"]);
    let mut ids = Vec::new();
    for i in 0..105 {
        m.put("A/0", &format!("k{i}"), "v");
        ids.push(m.checkpoint());
    }
    std::fs::remove_dir(m.mnt.join(format!("cp-{}", ids[50]))).unwrap();
    let retained: Vec<u64> = ids.iter().copied().filter(|id| *id != ids[50]).collect();
    let listed: serde_json::Value =
        serde_json::from_str(&ok(ckptfs(&["ls", m.mnt(), "--json"]))).unwrap();
    let listed: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, retained);
    let table = ok(ckptfs(&["ls", m.mnt()]));
    assert_eq!(table.lines().count(), 1 + retained.len(), "{table}");
    let status = m.status();
    assert_eq!(status["checkpoints_total"], 104);
    let newest: Vec<u64> = status["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(newest, retained[retained.len() - 100..].to_vec());
    assert_eq!(
        status["checkpoint_runs"],
        serde_json::json!([[ids[0], ids[49]], [ids[51], ids[104]]])
    );
    let text = ok(ckptfs(&["status", m.mnt()]));
    assert!(
        text.contains(&format!(
            "{}-{} {}-{} (104 retained",
            ids[0], ids[49], ids[51], ids[104]
        )),
        "{text}"
    );
}

#[test]
fn graph_draws_checkpoints_objects_and_counts() {
    let m = Mounted::new(&["--backend", "Operator-2/1", "--retain", "2"]);
    m.put("Operator-2/1", "a", "1");
    m.checkpoint();
    m.put("Operator-2/1", "b", "2");
    m.checkpoint();
    let dot = ok(ckptfs(&["graph", m.mnt(), "--format", "dot"]));
    assert!(dot.starts_with("digraph ckptfs"));
    assert!(dot.contains("\"cp-1\"") && dot.contains("\"cp-2\""));
    // Objects shared by both checkpoints (at least the first SST) have refs=2.
    assert!(dot.contains("refs=2"), "{dot}");
    let edges = dot.matches(" -> ").count();
    let registry = std::fs::read_to_string(m.mnt.join(".ckptfs/registry")).unwrap();
    let refs: u64 = registry
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["refcount"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(edges as u64, refs, "one edge per reference");
    // The same from the store path, and as SVG through Graphviz.
    assert_eq!(
        ok(ckptfs(&[
            "graph",
            m.store.to_str().unwrap(),
            "--format",
            "dot"
        ])),
        dot
    );
    let svg = ok(ckptfs(&["graph", m.mnt(), "--format", "svg"]));
    assert!(
        svg.contains("<svg"),
        "Graphviz dot must be installed (scripts/test installs it)"
    );
}

/// Only the mounting user gets in, unless --allow-other; then the kernel checks the modes
/// (default_permissions): checkpoints readable by all, the control file and drops not.
#[test]
fn other_users_get_in_only_with_allow_other_and_then_read_only() {
    let as_nobody = |script: String| {
        Command::new("runuser")
            .args(["-u", "nobody", "--", "sh", "-c", &script])
            .output()
            .expect("runuser (util-linux)")
    };
    for allow_other in [false, true] {
        let args: &[&str] = if allow_other {
            &["--backend", "A/0", "--allow-other"]
        } else {
            &["--backend", "A/0"]
        };
        let m = Mounted::new(args);
        std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
        m.put("A/0", "k", "v");
        let id = m.checkpoint();
        let listing = as_nobody(format!(
            "ls {}/cp-{id}/A/0 && cat {}/cp-{id}/A/0/CURRENT",
            m.mnt(),
            m.mnt()
        ));
        assert_eq!(
            listing.status.success(),
            allow_other,
            "{}",
            String::from_utf8_lossy(&listing.stderr)
        );
        if allow_other {
            assert!(String::from_utf8_lossy(&listing.stdout).contains("MANIFEST-"));
            let ctl = as_nobody(format!("echo checkpoint > {}/.ckptfs/ctl", m.mnt()));
            assert!(!ctl.status.success());
            assert!(String::from_utf8_lossy(&ctl.stderr).contains("Permission denied"));
            let rm = as_nobody(format!("rmdir {}/cp-{id}", m.mnt()));
            assert!(!rm.status.success());
            assert_eq!(m.checkpoint_ids(), vec![id]);
        }
    }
}

/// With --allow-other, another user holding `cp-N` open (`exec 3< cp-N` and then waiting)
/// cannot keep root from dropping it: `rmdir` waits its 2 s and goes ahead, and the daemon
/// logs whose listing it cut. A listing of root's own (the mount owner's) still holds the
/// drop: EBUSY until it is closed, as it protects that user's `cp -r`.
#[test]
fn another_users_open_checkpoint_does_not_block_a_drop_but_the_owners_does() {
    use std::process::Stdio;
    let m = Mounted::new(&["--backend", "A/0", "--allow-other", "--retain", "5"]);
    std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    m.put("A/0", "k", "v");
    // The newest (third) is not dropped by rmdir at all.
    let (first, second, third) = (m.checkpoint(), m.checkpoint(), m.checkpoint());
    let cp = |id: u64| m.mnt.join(format!("cp-{id}"));
    // As nobody: cp-N opened (FUSE's opendir, as that user), held until stdin closes.
    let mut holder = Command::new("runuser")
        .args(["-u", "nobody", "--", "sh", "-c"])
        .arg(r#"exec 3< "$1" && echo held && read _"#)
        .arg("sh")
        .arg(cp(first))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "held\n", "nobody could not open cp-{first}");
    let started = std::time::Instant::now();
    let dropped = std::fs::remove_dir(cp(first));
    let waited = started.elapsed();
    drop(holder.stdin.take());
    holder.wait().unwrap();
    dropped.unwrap_or_else(|e| panic!("rmdir while nobody holds cp-{first}: {e}"));
    assert_eq!(m.checkpoint_ids(), vec![second, third]);
    assert!(
        waited >= Duration::from_secs(1),
        "rmdir did not wait: {waited:?}"
    );
    let log = std::fs::read_to_string(m.store.join("ckptfs.log")).unwrap();
    let uid = nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .uid
        .to_string();
    assert!(
        log.lines()
            .any(|l| l.contains(&format!("cp-{first}")) && l.contains(&format!("uid {uid}"))),
        "{log}"
    );
    // Root's own listing holds the drop until it is closed.
    let held = std::fs::File::open(cp(second)).unwrap();
    assert_eq!(errno_of(std::fs::remove_dir(cp(second))), libc::EBUSY);
    assert_eq!(m.checkpoint_ids(), vec![second, third]);
    drop(held);
    std::fs::remove_dir(cp(second)).unwrap();
    assert_eq!(m.checkpoint_ids(), vec![third]);
}

/// Stores written by earlier versions (tests/fixtures/store-formatN) mount: their
/// checkpoints are shown, `cp -r` of each gives exactly the data of its round (checkpoint
/// N holds round N-1 of `ckptfs workload`), and a new checkpoint can be taken.
#[test]
fn stores_of_earlier_formats_mount_and_copy_out() {
    for format in [1, 2, 3, 4, 5, 6, 7, 8] {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let fixture = format!(
            "{}/tests/fixtures/store-format{format}",
            env!("CARGO_MANIFEST_DIR")
        );
        assert!(Command::new("cp")
            .args(["-a", &fixture])
            .arg(&store)
            .status()
            .unwrap()
            .success());
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let m = Mounted::at(&store, &mnt, &[]);
        assert_eq!(m.checkpoint_ids(), vec![2, 3], "format {format}");
        for id in [2u64, 3] {
            let dest = dir.path().join(format!("copy-{id}"));
            assert!(m.copy_out(id, &dest), "format {format}: cp -r of cp-{id}");
            // Format 7 holds an imported backend too.
            let imported: &[&str] = if format >= 7 { &["App/0"] } else { &[] };
            for backend in ["A/0", "B/1"].iter().chain(imported) {
                let expected = ckptfs_core::workload::expected_after(
                    &backend.parse().unwrap(),
                    id - 1,
                    200,
                    20,
                );
                assert_eq!(
                    scan(&dest.join(backend)),
                    expected,
                    "format {format} {backend}"
                );
            }
        }
        let new = m.checkpoint();
        assert_eq!(new, 4, "format {format}");
        m.umount();
    }
}

/// `cp -r` racing with the drop of the checkpoint it copies either copies all
/// of it or fails; it never succeeds with part of it.
#[test]
fn a_copy_racing_a_drop_is_whole_or_fails() {
    let m = Mounted::new(&["--backend", "a/0", "--backend", "b/0", "--retain", "1000"]);
    let mut ctl = Ctl::open(&m);
    for backend in ["a/0", "b/0"] {
        let lines: String = (0..3000)
            .map(|i| format!("put {backend} key{i:05} {}\n", "v".repeat(100)))
            .collect();
        ctl.send(&lines).unwrap();
        for _ in 0..3000 {
            assert_eq!(ctl.answer()["ok"], true);
        }
        ctl.send(&format!("flush {backend}\n")).unwrap();
        assert_eq!(ctl.answer()["ok"], true);
    }
    let iterations: u64 = std::env::var("CKPTFS_RACE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let (mut whole, mut failed) = (0, 0);
    for i in 0..iterations {
        ctl.send(&format!("put a/0 round {i}\ncheckpoint\n"))
            .unwrap();
        assert_eq!(ctl.answer()["ok"], true);
        let id = ctl.answer()["id"].as_u64().unwrap();
        // A newer checkpoint after it: the newest is not dropped by rmdir.
        m.checkpoint();
        let manifest = m.manifest(id);
        let dest = m.root.join(format!("copy-{i}"));
        let src = m.mnt.join(format!("cp-{id}"));
        let mut cp = Command::new("cp")
            .arg("-r")
            .arg(&src)
            .arg(&dest)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros((i * 3967) % 30_000));
        let _ = std::fs::remove_dir(&src);
        let status = cp.wait().unwrap();
        if !status.success() {
            failed += 1;
            continue;
        }
        whole += 1;
        for backend in manifest["backends"].as_array().unwrap() {
            let dir = dest.join(backend["name"].as_str().unwrap());
            for f in backend["files"].as_array().unwrap() {
                let path = dir.join(f["name"].as_str().unwrap());
                let len = std::fs::metadata(&path)
                    .unwrap_or_else(|e| panic!("cp succeeded without {}: {e}", path.display()))
                    .len();
                assert_eq!(len, f["size"].as_u64().unwrap(), "{}", path.display());
            }
        }
        let names: Vec<_> = std::fs::read_dir(&dest).unwrap().collect();
        assert_eq!(names.len(), 2, "cp succeeded with {names:?}");
    }
    eprintln!("copy/drop races: {whole} whole copies, {failed} loud failures");
}

/// The kernel releases a closed directory asynchronously, so `ls cp-N`
/// followed at once by `rmdir cp-N` must not fail with EBUSY.
#[test]
fn rmdir_right_after_a_listing_succeeds() {
    let m = Mounted::new(&["--backend", "A/0", "--retain", "100"]);
    let ids: Vec<u64> = (0..20).map(|_| m.checkpoint()).collect();
    // The newest is not dropped by rmdir.
    let newest = m.checkpoint();
    for id in ids {
        let dir = m.mnt.join(format!("cp-{id}"));
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("ls {0} >/dev/null && rmdir {0}", dir.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(m.checkpoint_ids(), vec![newest]);
}

/// Everything below `dir`, as relative paths (what a refused mount must leave as it was).
fn tree_of(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if path.is_dir() && !path.is_symlink() {
                pending.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A mount whose paths are wrong is refused with what to do, and creates nothing: STORE
/// and MOUNTPOINT swapped (it made a new store and mounted it over the real one), an
/// unrelated non-empty directory as STORE (the store's files were written into it), a
/// missing MOUNTPOINT (it left STORE/ckptfs.log), a non-empty MOUNTPOINT (mounted over
/// silently; `--nonempty` still does).
#[test]
fn a_mount_with_wrong_paths_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let m = Mounted::at(&store, &mkdir(dir.path(), "mnt"), &["--backend", "A/0"]);
    m.put("A/0", "k", "v");
    assert_eq!(m.checkpoint(), 1);
    m.umount();
    let before = tree_of(&store);

    let empty = mkdir(dir.path(), "empty");
    let refused = ckptfs(&["mount", empty.to_str().unwrap(), store.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success());
    assert!(
        err.contains("is a ckptfs store") && err.contains("did you mean"),
        "{err}"
    );
    assert!(tree_of(&empty).is_empty(), "{:?}", tree_of(&empty));
    assert_eq!(tree_of(&store), before);

    let unrelated = mkdir(dir.path(), "photos");
    std::fs::write(unrelated.join("cat.jpg"), b"meow").unwrap();
    let mnt = mkdir(dir.path(), "mnt2");
    let refused = ckptfs(&["mount", unrelated.to_str().unwrap(), mnt.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success());
    assert!(
        err.contains("neither a ckptfs store nor an empty directory"),
        "{err}"
    );
    assert_eq!(tree_of(&unrelated), vec!["cat.jpg"]);

    let new_store = dir.path().join("new-store");
    let missing = dir.path().join("nowhere");
    let refused = ckptfs(&[
        "mount",
        new_store.to_str().unwrap(),
        missing.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success());
    assert!(err.contains("mkdir -p"), "{err}");
    assert!(
        !new_store.exists(),
        "a refused mount created {}",
        new_store.display()
    );

    std::fs::write(mnt.join("notes.txt"), b"keep me").unwrap();
    let refused = ckptfs(&["mount", new_store.to_str().unwrap(), mnt.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success());
    assert!(
        err.contains("is not empty") && err.contains("--nonempty"),
        "{err}"
    );
    assert!(!new_store.exists());
    let over = Mounted::at(&new_store, &mnt, &["--nonempty"]);
    assert!(!over.mnt.join("notes.txt").exists());
    over.umount();
    assert_eq!(std::fs::read(mnt.join("notes.txt")).unwrap(), b"keep me");
}

/// Without FUSE's device (a container that lacks it: here a mount namespace with
/// /dev/null bound over /dev/fuse), the mount fails naming /dev/fuse, and creates no store.
#[test]
fn a_mount_without_fuse_names_the_device_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mnt = mkdir(dir.path(), "mnt");
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind /dev/null /dev/fuse && exec "$0" mount "$1" "$2""#)
        .arg(BIN)
        .arg(&store)
        .arg(&mnt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("/dev/fuse") && err.contains("FUSE is not available"),
        "{err}"
    );
    assert!(!store.exists(), "a refused mount created the store");
}

fn mkdir(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir(&dir).unwrap();
    dir
}
