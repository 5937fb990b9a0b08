//! Checkpoints through the engine, with real RocksDB instances and a store directory: only
//! new files are stored, identical files once, ids never reused, retention applied at once,
//! concurrent checkpoints share uploads, file lists and append-only files stored as deltas.

use std::collections::BTreeSet;

use ckptfs_core::backend::scan_dir;
use ckptfs_core::store::hash_file;
use ckptfs_core::{Engine, Error};

use crate::common::*;

#[test]
fn a_checkpoint_after_a_small_change_stores_only_the_new_ssts() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["op/0", "op/1"])).unwrap();
    for b in engine.backend_names() {
        put_range(&engine, &b, 0..5000, "a");
        engine.flush(&b).unwrap();
    }
    let first = engine.checkpoint().unwrap();
    assert_eq!(first.id, 1);
    assert_eq!(first.stats.files_reused, 0);
    assert!(first.stats.bytes_uploaded > 0);

    let b0 = name("op/0");
    put_range(&engine, &b0, 0..50, "b");
    let second = engine.checkpoint().unwrap();
    assert_eq!(second.id, 2);
    let s = &second.stats;
    assert!(s.files_reused > 0, "nothing was re-referenced: {s:?}");
    // Every SST of checkpoint 1 that is still live is the same object, not a new copy.
    let old_ssts: BTreeSet<_> = first
        .backends
        .iter()
        .flat_map(|b| {
            b.files
                .iter()
                .filter(|f| f.name.ends_with(".sst"))
                .map(|f| (b.name.clone(), f.name.clone(), f.object))
        })
        .collect();
    let new_ssts: Vec<_> = second
        .backends
        .iter()
        .flat_map(|b| {
            b.files
                .iter()
                .filter(|f| f.name.ends_with(".sst"))
                .map(|f| (b.name.clone(), f.name.clone(), f.object))
        })
        .collect();
    let mut fresh_sst_bytes = 0;
    for (backend, file, object) in &new_ssts {
        match old_ssts.iter().find(|(b, f, _)| b == backend && f == file) {
            Some((_, _, old)) => assert_eq!(old, object, "{backend} {file} changed identity"),
            None => {
                fresh_sst_bytes += second
                    .backends
                    .iter()
                    .flat_map(|b| b.files.iter())
                    .find(|f| &f.name == file && f.object == *object)
                    .unwrap()
                    .size
            }
        }
    }
    assert!(fresh_sst_bytes > 0, "the change made no new SST");
    let private_bytes: u64 = second
        .backends
        .iter()
        .flat_map(|b| {
            b.files
                .iter()
                .filter(|f| !f.name.ends_with(".sst"))
                .map(|f| f.size)
        })
        .sum();
    assert!(
        s.bytes_uploaded <= fresh_sst_bytes + private_bytes,
        "uploaded {} > new SSTs {} + private files {}",
        s.bytes_uploaded,
        fresh_sst_bytes,
        private_bytes
    );
    assert!(s.bytes_uploaded < s.bytes_total / 2, "{s:?}");
    assert_consistent(&engine);
}

#[test]
fn identical_files_are_stored_once_and_the_store_holds_only_referenced_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0", "A/1", "A/2"])).unwrap();
    for b in engine.backend_names() {
        put_range(&engine, &b, 0..100, "same");
    }
    let cp = engine.checkpoint().unwrap();
    // Files with equal bytes (e.g. CURRENT, OPTIONS across backends) share one object.
    let staged = dir.path().join("check");
    ckptfs_core::commands::restore::restore_checkpoint(&store, cp.id, &staged, |_| {}).unwrap();
    let mut by_content = std::collections::BTreeMap::new();
    for b in &cp.backends {
        for f in b.files.iter() {
            let (id, _) = hash_file(&staged.join(b.name.rel_path()).join(&f.name)).unwrap();
            assert_eq!(id, f.object);
            by_content
                .entry(id)
                .or_insert_with(Vec::new)
                .push(f.name.clone());
        }
    }
    assert!(
        by_content.values().any(|files| files.len() > 1),
        "no shared content at all"
    );
    // Plus the backends' file lists (equal lists, as here, are one object too).
    let lists: std::collections::BTreeSet<_> =
        cp.backends.iter().flat_map(|b| b.lists.iter()).collect();
    assert_eq!(cp.backends.iter().map(|b| b.lists.len()).sum::<usize>(), 3);
    // Files are stored whole or, append-only ones (the MANIFEST, the WAL), as chunks.
    let stored: std::collections::BTreeSet<_> = cp
        .backends
        .iter()
        .flat_map(|b| b.files.iter())
        .flat_map(|f| f.stored().map(|(id, _)| id))
        .collect();
    assert_eq!(
        engine.object_store().list().unwrap().len(),
        stored.len() + lists.len()
    );
    assert_eq!(
        cp.stats.files_total as usize,
        cp.backends.iter().map(|b| b.files.len()).sum::<usize>()
    );
}

#[test]
fn checkpoint_ids_are_never_reused_even_after_deleting_all_and_restarting() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    engine.put(&name("A/0"), b"k", b"v").unwrap();
    assert_eq!(engine.checkpoint().unwrap().id, 1);
    assert_eq!(engine.checkpoint().unwrap().id, 2);
    engine.delete_checkpoint(1).unwrap();
    engine.delete_checkpoint(2).unwrap();
    assert!(matches!(
        engine.delete_checkpoint(2),
        Err(Error::NoSuchCheckpoint(2))
    ));
    assert!(engine.object_store().list().unwrap().is_empty());
    drop(engine);
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    assert_eq!(engine.checkpoint().unwrap().id, 3);
}

#[test]
fn retention_is_applied_at_once_and_refuses_zero() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    assert_eq!(engine.retain(), 3);
    for i in 0..5 {
        put_range(&engine, &name("A/0"), i * 100..i * 100 + 100, "r");
        engine.checkpoint().unwrap();
    }
    let ids: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![3, 4, 5]);
    assert!(matches!(engine.set_retain(0), Err(Error::Invalid(_))));
    assert_eq!(engine.retain(), 3);
    engine.set_retain(1).unwrap();
    let ids: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![5]);
    assert_consistent(&engine);
    drop(engine);
    // The setting is durable.
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    assert_eq!(engine.retain(), 1);
}

#[test]
fn concurrent_checkpoints_share_uploads_and_aborts_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut cfg = config(&store, &["A/0", "B/0"]);
    cfg.max_concurrent = 2;
    cfg.retain = Some(5);
    let engine = Engine::open(cfg).unwrap();
    let a = name("A/0");
    put_range(&engine, &a, 0..3000, "one");
    let first = engine.begin_checkpoint().unwrap();
    let at_first = snapshot_all(&engine);
    put_range(&engine, &a, 3000..3100, "two");
    let second = engine.begin_checkpoint().unwrap();
    let at_second = snapshot_all(&engine);
    assert!(matches!(engine.begin_checkpoint(), Err(Error::Busy(_))));
    // The second is confirmed first; both stored the same SSTs of the first state.
    let m2 = second.complete().unwrap();
    let m1 = first.complete().unwrap();
    assert_eq!(m1.stats.files_reused, 0);
    assert_eq!(
        m2.stats.files_reused, 0,
        "re-referenced an unconfirmed checkpoint's file"
    );
    let shared: BTreeSet<_> = m1.objects().intersection(&m2.objects()).copied().collect();
    assert!(
        !shared.is_empty(),
        "the duplicate uploads did not resolve to one object"
    );
    assert!(
        m1.stats.bytes_uploaded + m2.stats.bytes_uploaded
            < m1.stats.bytes_total + m2.stats.bytes_total
    );
    assert_eq!(restored_contents(&store, m1.id), at_first);
    assert_eq!(restored_contents(&store, m2.id), at_second);
    assert_consistent(&engine);

    // An aborted checkpoint removes what it uploaded and nothing else.
    put_range(&engine, &a, 5000..6000, "three");
    let before: BTreeSet<_> = engine.object_store().list().unwrap().into_iter().collect();
    let doomed = engine.begin_checkpoint().unwrap();
    let alive = engine.begin_checkpoint().unwrap();
    let m_alive = alive.complete().unwrap();
    doomed.abort();
    let after: BTreeSet<_> = engine.object_store().list().unwrap().into_iter().collect();
    assert!(after.is_superset(&before));
    assert_eq!(engine.checkpoints().len(), 3);
    assert_eq!(engine.checkpoints().last().unwrap().id, m_alive.id);
    assert_consistent(&engine);
}

/// After a roll-back, the restored RocksDB reuses file numbers that later (abandoned)
/// checkpoints also used; the next checkpoints must hold the new files, not the old ones.
#[test]
fn file_numbers_reused_after_a_restore_do_not_alias_abandoned_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut cfg = config(&store, &["A/0"]);
    cfg.retain = Some(20);
    let engine = Engine::open(cfg).unwrap();
    let a = name("A/0");
    put_range(&engine, &a, 0..2000, "base");
    let cp1 = engine.checkpoint().unwrap();
    let at_cp1 = snapshot_all(&engine);
    // Several abandoned checkpoints, so their SSTs cover many file numbers.
    let mut abandoned = std::collections::BTreeMap::new();
    for i in 0..16u32 {
        put_range(&engine, &a, i * 300..(i + 1) * 300, "abandoned");
        engine.flush(&a).unwrap();
        if i % 5 == 2 {
            engine.compact(&a).unwrap();
        }
        let cp = engine.checkpoint().unwrap();
        for f in cp.backends[0]
            .files
            .iter()
            .filter(|f| f.name.ends_with(".sst"))
        {
            if !cp1.backends[0].files.iter().any(|g| g.name == f.name) {
                abandoned
                    .entry(f.name.clone())
                    .or_insert_with(BTreeSet::new)
                    .insert(f.object);
            }
        }
    }

    engine.restore_backends(cp1.id).unwrap();
    assert_eq!(snapshot_all(&engine), at_cp1);
    // Write and flush until a live SST carries a number an abandoned checkpoint used.
    let mut round = 0;
    while !engine
        .live_sst_files(&a)
        .unwrap()
        .iter()
        .any(|(n, _)| abandoned.contains_key(n))
    {
        assert!(
            round < 30,
            "the restored DB never reused a number of {abandoned:?}"
        );
        put_range(&engine, &a, round * 100..(round + 1) * 100, "after-restore");
        engine.flush(&a).unwrap();
        if round % 3 == 1 {
            engine.compact(&a).unwrap();
        }
        round += 1;
    }
    let expected = snapshot_all(&engine);
    let cp = engine.checkpoint().unwrap();
    let mut collisions = 0;
    for f in cp.backends[0].files.iter() {
        if let Some(old) = abandoned.get(&f.name) {
            collisions += 1;
            assert!(
                !old.contains(&f.object),
                "{} aliased an abandoned checkpoint's file",
                f.name
            );
        }
    }
    assert!(collisions > 0);
    assert_eq!(restored_contents(&store, cp.id), expected);
    assert_consistent(&engine);

    // The same holds across a restart: the lineage is durable.
    drop(engine);
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    put_range(&engine, &a, 5000..5100, "x");
    let expected = snapshot_all(&engine);
    let next = engine.checkpoint().unwrap();
    assert!(next.stats.files_reused > 0);
    assert_eq!(restored_contents(&store, next.id), expected);
}

/// An object found missing at start is never shared: the next checkpoint stores its bytes
/// again, which also repairs the older checkpoints that reference it.
#[test]
fn a_missing_object_is_stored_again_not_shared() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    put_range(&engine, &name("A/0"), 0..2000, "v");
    let cp1 = engine.checkpoint().unwrap();
    let sst = cp1.backends[0]
        .files
        .iter()
        .find(|f| f.name.ends_with(".sst"))
        .unwrap()
        .clone();
    let path = engine.object_store().local_path(&sst.object).unwrap();
    drop(engine);
    std::fs::remove_file(&path).unwrap();
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    assert!(engine.status().last_error.unwrap().contains("missing"));
    let cp2 = engine.checkpoint().unwrap();
    assert!(
        cp2.backends[0].files.iter().any(|f| f.object == sst.object),
        "test setup: same SST"
    );
    assert!(
        path.exists(),
        "the missing object was shared instead of stored again"
    );
    assert!(cp2.stats.bytes_uploaded >= sst.size);
    drop(engine);
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A manifest names one stored file list per backend instead of repeating every
/// file. A backend that did not change shares its list with the previous checkpoint; one
/// that changed stores a small delta, so what a checkpoint adds to the store follows what
/// changed, not how many files the backend has. After a restart every checkpoint reads back
/// the same, with unchanged entries shared in memory; retention keeps the lists deltas need.
#[test]
fn manifests_share_file_lists_and_store_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut cfg = config(&store, &["A/0", "B/0"]);
    cfg.retain = Some(100);
    // Every checkpoint leaves one more SST: A's file count grows with history.
    cfg.backend_options.rocksdb_options = Some("disable_auto_compactions=true".into());
    let engine = Engine::open(cfg.clone()).unwrap();
    let (a, b) = (name("A/0"), name("B/0"));
    put_range(&engine, &b, 0..50, "b");
    let mut cps = Vec::new();
    for i in 0..40u32 {
        put_range(&engine, &a, i * 10..i * 10 + 10, "a");
        cps.push(engine.checkpoint().unwrap());
    }
    let object_len = |id: &ckptfs_core::store::ObjectId| {
        let hex = id.to_hex();
        std::fs::metadata(store.join("objects").join(&hex[..2]).join(&hex))
            .unwrap()
            .len()
    };
    let newest = cps.last().unwrap();
    let files_of_a = newest.backend(&a).unwrap().files.len();
    assert!(files_of_a > 40, "A has {files_of_a} files");
    let mut deltas = 0;
    for pair in cps.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert_eq!(
            before.backend(&b).unwrap().lists,
            after.backend(&b).unwrap().lists,
            "unchanged B shares its list"
        );
        let lists: Vec<_> = after.backend(&a).unwrap().lists.iter().collect();
        let old: Vec<_> = before.backend(&a).unwrap().lists.iter().collect();
        assert_ne!(lists[0], old[0]);
        assert!(lists.len() <= ckptfs_core::catalog::lists::MAX_CHAIN);
        if lists.len() > 1 {
            deltas += 1;
            assert_eq!(lists[1..], old[..lists.len() - 1]);
            assert!(
                object_len(&lists[0]) < 1024,
                "a delta of a few changes is small"
            );
        }
    }
    assert!(deltas >= 30, "{deltas} of 39 lists are deltas");
    // Manifests do not grow with the file count.
    for cp in &cps {
        let len = std::fs::metadata(store.join(format!("checkpoints/{}.json", cp.id)))
            .unwrap()
            .len();
        assert!(len < 2048, "manifest {} has {len} bytes", cp.id);
    }
    assert_consistent(&engine);

    // A restart reads every checkpoint back as it was, sharing unchanged entries.
    drop(engine);
    let engine = Engine::open(cfg).unwrap();
    let reloaded = engine.checkpoints();
    assert_eq!(reloaded, cps);
    let first_sst = |m: &ckptfs_core::catalog::Manifest| {
        m.backend(&a)
            .unwrap()
            .files
            .iter()
            .find(|f| f.name.ends_with(".sst"))
            .unwrap()
            .clone()
    };
    assert!(std::sync::Arc::ptr_eq(
        &first_sst(&reloaded[5]),
        &first_sst(&reloaded[30])
    ));

    // Retention drops the checkpoints whose lists later deltas are built on: the lists stay
    // as long as a delta needs them, and every retained checkpoint restores exactly.
    engine.set_retain(3).unwrap();
    assert_consistent(&engine);
    let live = scan(&engine, &a);
    let restored = restored_contents(&store, cps.last().unwrap().id);
    assert_eq!(restored[&a], live);
    drop(engine);
    assert!(ckptfs_core::commands::fsck::fsck(&store, false, |_| {})
        .unwrap()
        .is_clean());
}

/// RocksDB's MANIFEST only grows between checkpoints. Stored as chunks, a
/// checkpoint stores what was appended since the previous one plus at most one partial
/// chunk, re-references the rest, and restores byte-identical; its chunks are counted and
/// deleted like any object.
#[test]
fn append_only_files_store_what_was_appended() {
    use ckptfs_core::backend::MANIFEST_CHUNK_SIZE as CHUNK_SIZE;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut cfg = config(&store, &["A/0"]);
    cfg.retain = Some(2);
    // A large MANIFEST limit, so that it only grows during the test.
    cfg.backend_options.rocksdb_options = Some("max_manifest_file_size=1073741824".into());
    let engine = Engine::open(cfg).unwrap();
    let a = name("A/0");
    // Each flush appends a version edit: grow the MANIFEST past a few chunks.
    for i in 0..400u32 {
        put_range(&engine, &a, i..i + 1, "m");
        engine.flush(&a).unwrap();
    }
    let manifest_of = |cp: &ckptfs_core::catalog::Manifest| {
        cp.backends[0]
            .files
            .iter()
            .find(|f| f.name.starts_with("MANIFEST-"))
            .unwrap()
            .clone()
    };
    let first = engine.checkpoint().unwrap();
    let before = manifest_of(&first);
    let chunks_before = before.chunks.clone().expect("stored as chunks");
    assert!(
        chunks_before.ids.len() >= 3,
        "{} chunks",
        chunks_before.ids.len()
    );
    put_range(&engine, &a, 1000..1010, "n");
    let second = engine.checkpoint().unwrap();
    let after = manifest_of(&second);
    let chunks_after = after.chunks.clone().unwrap();
    assert_eq!(after.name, before.name, "the MANIFEST was not rotated");
    assert!(after.size > before.size);
    let full = (before.size / CHUNK_SIZE as u64) as usize;
    assert_eq!(chunks_after.ids[..full], chunks_before.ids[..full]);
    let appended = after.size - before.size;
    let stored = second.stats.bytes_uploaded_append_only;
    assert!(
        stored > 0 && stored <= appended + CHUNK_SIZE as u64,
        "stored {stored} bytes for {appended} appended"
    );
    // Restores byte-identical (the restore checks the whole file's hash).
    let out = dir.path().join("out");
    ckptfs_core::commands::restore::restore_checkpoint(&store, second.id, &out, |_| {}).unwrap();
    let restored = std::fs::read(out.join("A/0").join(&after.name)).unwrap();
    assert_eq!(restored.len() as u64, after.size);
    assert_eq!(
        ckptfs_core::store::hash_file(&out.join("A/0").join(&after.name))
            .unwrap()
            .0,
        after.object
    );
    let restored_kv: Kv = scan_dir(&out.join("A/0")).unwrap().into_iter().collect();
    assert_eq!(restored_kv, scan(&engine, &a));
    // The whole-file hash is not an object; the chunks are, and retention deletes the
    // chunks no retained checkpoint needs.
    assert!(
        !engine
            .object_store()
            .list()
            .unwrap()
            .contains(&after.object)
            || chunks_after.ids.len() == 1
    );
    assert_consistent(&engine);
    let newest = engine.checkpoint().unwrap();
    engine.checkpoint().unwrap();
    assert_consistent(&engine);

    // A damaged chunk is found by fsck and stored again from the live MANIFEST, which
    // still holds those bytes at the same offset (it only grew).
    let chunk = manifest_of(&newest).chunks.as_ref().unwrap().ids[0];
    let path = engine.object_store().local_path(&chunk).unwrap();
    drop(engine);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x20;
    std::fs::write(&path, bytes).unwrap();
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert_eq!(report.corrupt, vec![chunk], "{report:?}");
    let report = ckptfs_core::commands::fsck::fsck(&store, true, |_| {}).unwrap();
    assert_eq!(report.repaired_objects.len(), 1, "{report:?}");
    assert!(ckptfs_core::commands::fsck::fsck(&store, false, |_| {})
        .unwrap()
        .is_clean());
}
