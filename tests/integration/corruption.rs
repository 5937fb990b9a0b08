//! Damaged data is found and contained: checksums on restore and on read through the mount
//! (EIO, never wrong bytes), `fsck` reports corrupt, missing and orphan objects and damaged
//! metadata with its exit code, and `fsck --repair` restores objects from live copies and
//! quarantines unreadable manifests.

use std::path::{Path, PathBuf};

use ckptfs_core::{Engine, EngineConfig, Error};

use crate::common::cli::*;
use crate::common::mounted::scan;
use crate::common::mounted::*;
use crate::common::*;

#[test]
fn restore_verifies_checksums_and_cleans_up_on_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    put_range(&engine, &name("A/0"), 0..2000, "v");
    let cp = engine.checkpoint().unwrap();
    let victim = cp.backends[0]
        .files
        .iter()
        .find(|f| f.name.ends_with(".sst"))
        .unwrap();
    let path = engine.object_store().local_path(&victim.object).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let dest = dir.path().join("out");
    let err = ckptfs_core::commands::restore::restore_checkpoint(&store, cp.id, &dest, |_| {})
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert!(!dest.exists(), "a failed restore left files behind");
}

#[test]
fn fsck_finds_corruption_missing_objects_and_orphans_and_repairs_what_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    put_range(&engine, &name("A/0"), 0..3000, "v");
    let cp1 = engine.checkpoint().unwrap();
    let s = engine.object_store();
    let files = &cp1.backends[0].files;
    let corrupt = files
        .iter()
        .find(|f| f.name.ends_with(".sst"))
        .unwrap()
        .object;
    // The MANIFEST's first stored object (a chunk: it is stored as chunks).
    let missing = files
        .iter()
        .find(|f| f.name.starts_with("MANIFEST"))
        .unwrap()
        .stored()
        .next()
        .unwrap()
        .0;
    let corrupt_path = s.local_path(&corrupt).unwrap();
    let missing_path = s.local_path(&missing).unwrap();
    drop(engine);

    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.counts.len(), report.objects_referenced);

    // fsck refuses while a daemon holds the store.
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    assert!(matches!(
        ckptfs_core::commands::fsck::fsck(&store, false, |_| {}),
        Err(Error::Locked { .. })
    ));
    drop(engine);

    let mut bytes = std::fs::read(&corrupt_path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&corrupt_path, bytes).unwrap();
    std::fs::remove_file(&missing_path).unwrap();
    let orphan = blake3::hash(b"orphan").to_hex().to_string();
    let orphan_dir = store.join("objects").join(&orphan[..2]);
    std::fs::create_dir_all(&orphan_dir).unwrap();
    std::fs::write(orphan_dir.join(&orphan), b"orphan").unwrap();

    let report = ckptfs_core::commands::fsck::fsck(&store, true, |_| {}).unwrap();
    assert_eq!(report.corrupt, vec![corrupt]);
    assert_eq!(report.missing, vec![missing]);
    assert_eq!(report.orphans, vec![orphan.parse().unwrap()]);
    assert_eq!(report.repaired_orphans, 1);
    assert_eq!(report.damaged_checkpoints, vec![cp1.id]);
    assert!(!report.is_clean());
    assert!(!orphan_dir.join(&orphan).exists());
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

/// fsck reads ckptfs.json too, and reports it damaged.
#[test]
fn fsck_reports_a_damaged_store_metadata_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    six_checkpoints(&store);
    std::fs::write(store.join("ckptfs.json"), b"{").unwrap();
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.to_string().contains("ckptfs.json")),
        "{report:?}"
    );
    assert!(!report.is_clean());
}

/// fsck reports an unparseable manifest, and --repair quarantines it (never
/// deletes it) and keeps every object it may reference, at fsck and at the next start.
#[test]
fn fsck_quarantines_an_unreadable_manifest_and_keeps_its_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = six_checkpoints(&store);
    let victim = ids[5];
    let path = store.join(format!("checkpoints/{victim}.json"));
    let text = std::fs::read(&path).unwrap();
    // Truncated mid-way: unparseable, though the object ids before the cut are readable.
    std::fs::write(&path, &text[..text.len() * 2 / 3]).unwrap();
    let before = objects(&store);

    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert_eq!(report.unreadable_manifests.len(), 1, "{report:?}");
    assert!(report.orphans_kept.is_some(), "{report:?}");
    assert!(!report.is_clean());
    let report = ckptfs_core::commands::fsck::fsck(&store, true, |_| {}).unwrap();
    assert_eq!(report.quarantined.len(), 1, "{report:?}");
    assert_eq!(report.repaired_orphans, 0, "{report:?}");
    assert!(!path.exists());
    assert_eq!(
        std::fs::read(store.join(format!("quarantine/{victim}.json"))).unwrap(),
        &text[..text.len() * 2 / 3]
    );
    assert_eq!(objects(&store), before, "repair deleted objects");
    // While the quarantine holds it, the daemon deletes no object at all, even when it
    // drops every other checkpoint.
    let engine = Engine::open(EngineConfig::new(&store)).unwrap();
    assert_eq!(retained_ids(&engine), ids[..5].to_vec());
    let a = name("A/0");
    put_range(&engine, &a, 0..100, "new");
    engine.checkpoint().unwrap();
    engine.set_retain(1).unwrap();
    drop(engine);
    let after = objects(&store);
    assert!(
        after.is_superset(&before),
        "objects were deleted while frozen"
    );
    // Once the operator removes the quarantine, fsck --repair collects the garbage.
    std::fs::remove_dir_all(store.join("quarantine")).unwrap();
    let report = ckptfs_core::commands::fsck::fsck(&store, true, |_| {}).unwrap();
    assert!(report.repaired_orphans > 0, "{report:?}");
    assert!(ckptfs_core::commands::fsck::fsck(&store, false, |_| {})
        .unwrap()
        .is_clean());
}

/// A stored object whose bytes no longer match its checksum is refused with EIO at open,
/// never copied out silently wrong; intact files of the same checkpoint still read.
#[test]
fn a_corrupt_object_is_an_io_error_not_wrong_bytes() {
    let m = Mounted::new(&["--backend", "A/0"]);
    for i in 0..200 {
        m.put("A/0", &format!("key{i}"), "value");
    }
    let id = m.checkpoint();
    m.umount();
    let manifest = m.manifest(id);
    let files = manifest["backends"][0]["files"].as_array().unwrap().clone();
    let sst = files
        .iter()
        .find(|f| f["name"].as_str().unwrap().ends_with(".sst"))
        .unwrap();
    let object = sst["object"].as_str().unwrap();
    let path = m.store.join("objects").join(&object[..2]).join(object);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    m.mount(&[]);
    let dir = m.mnt.join(format!("cp-{id}/A/0"));
    let err = std::fs::read(dir.join(sst["name"].as_str().unwrap())).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(m.status()["last_error"].as_str().unwrap().contains(object));
    assert_eq!(
        std::fs::read(dir.join("CURRENT")).unwrap().len() as u64,
        files.iter().find(|f| f["name"] == "CURRENT").unwrap()["size"]
            .as_u64()
            .unwrap()
    );
    // With --no-verify the bytes are served as they are.
    m.umount();
    m.mount(&["--no-verify"]);
    let served = std::fs::read(dir.join(sst["name"].as_str().unwrap())).unwrap();
    assert_eq!(served, std::fs::read(&path).unwrap());
}

/// The objects a manifest (as JSON) references for one backend, by file name (files stored
/// whole: SSTs).
fn objects_of(manifest: &serde_json::Value, backend: &str) -> Vec<(String, String)> {
    manifest["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["name"] == backend)
        .flat_map(|b| b["files"].as_array().unwrap().clone())
        .filter(|f| f["chunks"].is_null())
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["object"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn object_path(store: &Path, hex: &str) -> PathBuf {
    store.join("objects").join(&hex[..2]).join(hex)
}

/// Corruption: a flipped byte, a truncated object, a missing object and a truncated
/// manifest. Reads fail with EIO (logged with the object and the checkpoint's path), `cp -r`
/// of a damaged checkpoint fails, the undamaged one copies whole, fsck names every fault,
/// and `fsck --repair` stores the objects again from the live RocksDB files (identical
/// copies), quarantines the manifest, and reports what it could not repair.
#[test]
fn corruption_is_detected_contained_and_repaired_from_copies() {
    let args = [
        "--backend",
        "A/0",
        "--backend",
        "B/0",
        "--retain",
        "10",
        // Keep every SST alive in the live database, so that copies exist to repair from.
        "--rocksdb-options",
        "disable_auto_compactions=true",
    ];
    let m = Mounted::new(&args);
    let mut ids = Vec::new();
    for round in 0..5u32 {
        load(&m, "A/0", round * 300..(round + 1) * 300, 200).unwrap();
        let mut ctl = Ctl::open(&m);
        ctl.send("flush A/0\n").unwrap();
        assert_eq!(ctl.answer()["ok"], true);
        if round == 0 {
            load(&m, "B/0", 0..300, 200).unwrap();
        }
        ids.push(m.checkpoint());
    }
    let cp1_copy = scan(&m.mnt.join(format!("cp-{}/A/0", ids[0])));
    m.umount();
    // The SST that first appears in checkpoint k (index k-1) of A/0.
    let new_sst = |k: usize| -> String {
        let before: Vec<_> = objects_of(&m.manifest(ids[k - 1]), "A/0");
        objects_of(&m.manifest(ids[k]), "A/0")
            .into_iter()
            .find(|(name, obj)| name.ends_with(".sst") && !before.iter().any(|(_, o)| o == obj))
            .unwrap()
            .1
    };
    let (flipped, truncated, missing) = (new_sst(1), new_sst(2), new_sst(3));
    // A private file of checkpoint 3 that the live database no longer has as it was.
    // Stored as chunks: one that no other checkpoint shares (a MANIFEST that only grew
    // shares its full chunks with the checkpoints after it).
    let manifest_chunks = |id: u64| -> Vec<String> {
        let manifest = m.manifest(id);
        let backend = manifest["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == "A/0")
            .unwrap()
            .clone();
        let file = backend["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"].as_str().unwrap().starts_with("MANIFEST"))
            .unwrap()
            .clone();
        match file["chunks"]["ids"].as_array() {
            Some(ids) => ids
                .iter()
                .map(|i| i.as_str().unwrap().to_string())
                .collect(),
            None => vec![file["object"].as_str().unwrap().to_string()],
        }
    };
    let shared: std::collections::BTreeSet<String> = ids
        .iter()
        .filter(|id| **id != ids[2])
        .flat_map(|id| manifest_chunks(*id))
        .collect();
    let manifest_obj = manifest_chunks(ids[2])
        .into_iter()
        .rev()
        .find(|c| !shared.contains(c))
        .expect("a chunk only checkpoint 3 has");
    let mut bytes = std::fs::read(object_path(&m.store, &flipped)).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(object_path(&m.store, &flipped), &bytes).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(object_path(&m.store, &truncated))
        .unwrap();
    f.set_len(100).unwrap();
    std::fs::remove_file(object_path(&m.store, &missing)).unwrap();
    let mut bytes = std::fs::read(object_path(&m.store, &manifest_obj)).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(object_path(&m.store, &manifest_obj), &bytes).unwrap();
    let last = m.store.join(format!("checkpoints/{}.json", ids[4]));
    let text = std::fs::read(&last).unwrap();
    std::fs::write(&last, &text[..text.len() / 2]).unwrap();

    // The mount comes up without the unreadable checkpoint and says so.
    m.mount(&[]);
    assert_eq!(m.checkpoint_ids(), ids[..4].to_vec());
    assert!(m.status()["last_error"]
        .as_str()
        .unwrap()
        .contains(&format!("{}.json", ids[4])));
    // Reading a corrupt object is EIO, logged with the object and where it is served.
    let file = objects_of(&m.manifest(ids[1]), "A/0")
        .into_iter()
        .find(|(_, o)| *o == flipped)
        .unwrap()
        .0;
    let path = m.mnt.join(format!("cp-{}/A/0/{file}", ids[1]));
    assert_eq!(
        std::fs::read(&path).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    let log = std::fs::read_to_string(m.store.join("ckptfs.log")).unwrap();
    assert!(
        log.contains(&flipped) && log.contains(&format!("cp-{}/A/0/{file}", ids[1])),
        "the log does not name the object and its checkpoint"
    );
    // Damaged checkpoints fail to copy; the undamaged one copies whole.
    for (i, id) in ids[..4].iter().enumerate() {
        let dest = m.root.join(format!("copy-{id}"));
        assert_eq!(m.copy_out(*id, &dest), i == 0, "cp -r of cp-{id}");
    }
    assert_eq!(scan(&m.root.join(format!("copy-{}/A/0", ids[0]))), cp1_copy);
    m.umount();

    // fsck names each fault.
    let out = ckptfs(&["fsck", m.store.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = |key: &str| -> Vec<String> {
        report[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    for id in [&flipped, &truncated, &manifest_obj] {
        assert!(
            listed("corrupt").contains(id),
            "{id} not reported corrupt: {report}"
        );
    }
    assert_eq!(listed("missing"), vec![missing.clone()]);
    assert!(listed("unreadable_manifests")[0].starts_with(&format!("{}.json", ids[4])));
    assert_eq!(report["damaged_checkpoints"], serde_json::json!(ids[1..4]));
    assert!(
        report["orphans_kept"].is_string(),
        "orphans are not kept while a manifest is unreadable: {report}"
    );

    // Repair: the three SSTs come back from the live database; the MANIFEST copy cannot.
    let out = ckptfs(&["fsck", m.store.to_str().unwrap(), "--repair", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the MANIFEST object cannot be repaired"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let repaired: Vec<String> = report["repaired_objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().split(' ').next().unwrap().to_string())
        .collect();
    for id in [&flipped, &truncated, &missing] {
        assert!(repaired.contains(id), "{id} not repaired: {report}");
    }
    assert!(!repaired.contains(&manifest_obj));
    assert_eq!(report["quarantined"].as_array().unwrap().len(), 1);
    let out = ckptfs(&["fsck", m.store.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("corrupt: {manifest_obj}")), "{text}");
    assert!(text.contains("damaged checkpoints"), "{text}");

    // Checkpoints 2 and 4 copy whole again; 3 still fails (its MANIFEST copy is gone).
    m.mount(&[]);
    for (id, whole) in [(ids[1], true), (ids[2], false), (ids[3], true)] {
        let dest = m.root.join(format!("again-{id}"));
        assert_eq!(
            m.copy_out(id, &dest),
            whole,
            "cp -r of cp-{id} after repair"
        );
        if whole {
            assert_eq!(
                scan(&dest.join("A/0")).len(),
                (id as usize - ids[0] as usize + 1) * 300
            );
        }
    }
}
