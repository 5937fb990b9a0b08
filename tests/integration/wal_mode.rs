//! `wal` checkpoint mode: checkpoints without a flush carry the write-ahead log written
//! since the backend's last materialization, stored as chunks; stock RocksDB replays it.

use crate::common::*;
use ckptfs_core::backend::{wal_number, WAL_CHUNK_SIZE};
use ckptfs_core::{CheckpointMode, Engine, EngineConfig, MaterializePolicy};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

fn wal_config(store: &Path, backends: &[&str]) -> EngineConfig {
    let mut config = config(store, backends);
    config.backend_options.checkpoint_mode = CheckpointMode::Wal;
    // Large memtables: nothing is flushed unless a test says so.
    config.backend_options.write_buffer_size = None;
    config.retain = Some(100);
    config
}

fn hex(kv: &Kv) -> Vec<(String, String)> {
    let h = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    kv.iter().map(|(k, v)| (h(k), h(v))).collect()
}

/// A checkpoint after writes that were never flushed stores about what was written (the
/// WAL's growth plus at most one chunk, and no SST), and the directory it restores opens in
/// stock RocksDB of today and of older releases with those writes present.
#[test]
fn unflushed_writes_are_checkpointed_through_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = name("A/0");
    let engine = Engine::open(wal_config(&store, &["A/0"])).unwrap();
    put_range(&engine, &a, 0..2000, "first");
    let cp1 = engine.checkpoint().unwrap();
    assert_eq!(cp1.stats.backends_materialized, 1, "{:?}", cp1.stats);
    assert!(cp1.stats.bytes_wal > 0, "{:?}", cp1.stats);
    assert_eq!(
        cp1.stats.bytes_new_sst, 0,
        "nothing was flushed: {:?}",
        cp1.stats
    );

    put_range(&engine, &a, 1500..2600, "second");
    engine.delete(&a, b"k000007").unwrap();
    let expected = scan(&engine, &a);
    let cp2 = engine.checkpoint().unwrap();
    let s = &cp2.stats;
    assert_eq!(s.backends_materialized, 0, "{s:?}");
    assert_eq!(s.bytes_new_sst, 0, "{s:?}");
    let grown = s.bytes_wal - cp1.stats.bytes_wal;
    assert!(grown > 1100 * 64, "the WAL grew by {grown} bytes only");
    assert!(
        s.bytes_uploaded_wal >= grown && s.bytes_uploaded_wal <= grown + WAL_CHUNK_SIZE as u64,
        "the WAL grew by {grown} bytes and {} were stored ({s:?})",
        s.bytes_uploaded_wal
    );
    // Nothing else changed: the MANIFEST, CURRENT, OPTIONS are the materialization's.
    assert!(
        s.bytes_uploaded <= s.bytes_uploaded_wal + 4096,
        "stored {} bytes beyond the WAL ({s:?})",
        s.bytes_uploaded - s.bytes_uploaded_wal
    );
    assert!(cp2.backends[0]
        .files
        .iter()
        .any(|f| wal_number(&f.name).is_some() && f.chunks.is_some()));
    assert_consistent(&engine);
    drop(engine);

    let restored = restored_contents(&store, cp2.id);
    assert_eq!(restored[&a], expected);
    for (who, read) in [
        (
            "ldb 7.8",
            read_with_ldb as fn(&Path) -> Vec<(String, String)>,
        ),
        ("rocksdict", read_with_rocksdict),
    ] {
        let out = dir.path().join(format!("out-{}", who.replace(' ', "")));
        ckptfs_core::commands::restore::restore_checkpoint(&store, cp2.id, &out, |_| {}).unwrap();
        assert_eq!(read(&out.join("A/0")), hex(&expected), "{who}");
    }
}

/// Between materializations RocksDB flushes and compacts on its own: checkpoints keep naming
/// the materialization's SSTs plus every WAL since (kept in RocksDB's archive), upload no
/// SST, and each restores exactly its data. A materialization happens once the WAL since the
/// last one passes the size set, and prunes the archive below it.
#[test]
fn flushes_and_compactions_between_materializations_upload_no_sst() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (a, b) = (name("A/0"), name("B/0"));
    let mut config = wal_config(&store, &["A/0", "B/0"]);
    config.backend_options.write_buffer_size = Some(64 * 1024);
    config.materialize = MaterializePolicy {
        interval: Duration::from_secs(3600),
        wal_bytes: 300 * 1024,
        // Materialized by the checkpoint that finds it due (the background way has its
        // own test below).
        background: false,
    };
    let engine = Engine::open(config).unwrap();
    let mut expected = BTreeMap::new();
    let mut materialized = Vec::new();
    for round in 0..12u32 {
        put_range(
            &engine,
            &a,
            round * 300..round * 300 + 900,
            &format!("r{round}"),
        );
        put_range(&engine, &b, 0..200, &format!("r{round}"));
        if round % 4 == 3 {
            engine.compact(&a).unwrap();
        }
        let state = snapshot_all(&engine);
        let cp = engine.checkpoint().unwrap();
        if cp.stats.backends_materialized == 0 {
            assert_eq!(cp.stats.bytes_new_sst, 0, "round {round}: {:?}", cp.stats);
        } else {
            materialized.push(round);
        }
        expected.insert(cp.id, state);
    }
    // Round 0 materializes both; later ones once A's WAL since passed 300 KiB.
    assert!(
        materialized.len() >= 3 && materialized.len() <= 8,
        "materialized at rounds {materialized:?}"
    );
    let live_ssts = engine.live_sst_files(&a).unwrap().len();
    assert!(live_ssts > 0, "RocksDB flushed nothing on its own");
    assert_consistent(&engine);
    // The archive keeps nothing older than the newest materialization needs.
    let newest = engine.checkpoints().last().unwrap().clone();
    let oldest_wal = newest.backends[0]
        .files
        .iter()
        .filter_map(|f| wal_number(&f.name))
        .min()
        .unwrap();
    let archive = engine.state_dir().join("backends/A/0/db/archive");
    if let Ok(entries) = std::fs::read_dir(&archive) {
        for entry in entries {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let n = wal_number(&name).unwrap_or(u64::MAX);
            assert!(
                n >= oldest_wal,
                "archived {name} is older than any checkpoint needs"
            );
        }
    }
    drop(engine);
    for (id, state) in &expected {
        assert_eq!(&restored_contents(&store, *id), state, "checkpoint {id}");
    }
    // The newest (an older materialization's SSTs and MANIFEST, several WAL files, some
    // of them from RocksDB's archive) opens in older RocksDB releases too.
    let (id, state) = expected.last_key_value().unwrap();
    let wal_files = newest.backends[0]
        .files
        .iter()
        .filter(|f| wal_number(&f.name).is_some())
        .count();
    assert!(
        wal_files > 1,
        "checkpoint {id} carries {wal_files} WAL file(s)"
    );
    for (who, read) in [
        (
            "ldb 7.8",
            read_with_ldb as fn(&Path) -> Vec<(String, String)>,
        ),
        ("rocksdict", read_with_rocksdict),
    ] {
        let out = dir.path().join(format!("out-{}", who.replace(' ', "")));
        ckptfs_core::commands::restore::restore_checkpoint(&store, *id, &out, |_| {}).unwrap();
        assert_eq!(read(&out.join("A/0")), hex(&state[&a]), "{who}");
    }
}

/// Writers keep writing while checkpoints take the open WAL: every checkpoint restores to a
/// prefix of the writes that holds every write acknowledged before the checkpoint began.
#[test]
fn checkpoints_taken_while_writers_run_restore_a_consistent_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = name("A/0");
    let mut config = wal_config(&store, &["A/0"]);
    config.backend_options.write_buffer_size = Some(256 * 1024);
    config.materialize.wal_bytes = 2 << 20;
    let engine = Engine::open(config).unwrap();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (engine, written, stop, a) = (engine.clone(), written.clone(), stop.clone(), a.clone());
        std::thread::spawn(move || {
            let mut i = 0u32;
            // Keys are k000000..k999999: stop short of a seventh digit (which would sort
            // before the six-digit ones).
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 990_000 {
                put_range(&engine, &a, i..i + 10, "w");
                i += 10;
                std::thread::sleep(Duration::from_micros(100));
                written.store(i, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    let mut taken = Vec::new();
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(30));
        let acknowledged = written.load(std::sync::atomic::Ordering::SeqCst);
        let cp = engine.checkpoint().unwrap();
        taken.push((cp.id, acknowledged));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    drop(engine);
    for (id, acknowledged) in taken {
        let kv = &restored_contents(&store, id)[&a];
        let n = kv.len() as u32;
        assert!(
            n >= acknowledged,
            "checkpoint {id}: {n} keys, {acknowledged} acknowledged"
        );
        let prefix: Vec<Vec<u8>> = (0..n).map(|i| format!("k{i:06}").into_bytes()).collect();
        assert!(
            kv.keys().eq(prefix.iter()),
            "checkpoint {id} is not a prefix of the writes"
        );
    }
}

/// `wal` mode's checkpoints are the WAL files in each backend's database directory and
/// RocksDB's archive beside them: an option moving the WAL elsewhere is refused before
/// anything is created, with a message that names it (`flush` mode takes it: the daemon
/// test `a_wal_dir_option_works_from_the_first_mount`).
#[test]
fn wal_mode_refuses_a_wal_dir_option_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let wal = dir.path().join("wal");
    let mut config = wal_config(&store, &["A/0"]);
    config.backend_options.rocksdb_options =
        Some(format!("max_open_files=100;wal_dir={}", wal.display()));
    let err = Engine::open(config)
        .err()
        .expect("a wal_dir in wal mode was taken");
    assert!(
        matches!(err, ckptfs_core::Error::Invalid(_)) && err.to_string().contains("wal_dir"),
        "{err}"
    );
    assert!(
        !store.exists() && !wal.exists(),
        "the refused open created something"
    );
}

/// Where a WAL file (RocksDB's log format: 32 KiB blocks of records, each a 7-byte header
/// of checksum, length and type, then its payload) stops: `Ok` at the end of a whole
/// record (a FULL or LAST fragment, or a metadata record), else where the torn record
/// began.
fn wal_cut(bytes: &[u8]) -> Result<(), String> {
    const BLOCK: usize = 32 * 1024;
    const HEADER: usize = 7;
    let (mut at, mut open_record) = (0usize, None);
    while at < bytes.len() {
        let left_in_block = BLOCK - at % BLOCK;
        if left_in_block < HEADER {
            at += left_in_block; // the block's zero trailer
            continue;
        }
        if at + HEADER > bytes.len() {
            return Err(format!("a torn header at {at}"));
        }
        let len = u16::from_le_bytes([bytes[at + 4], bytes[at + 5]]) as usize;
        let kind = bytes[at + 6];
        if at + HEADER + len > bytes.len() {
            return Err(format!("a torn record at {at} (type {kind}, {len} bytes)"));
        }
        // 2 FIRST and 3 MIDDLE leave a record open; 1 FULL, 4 LAST and the rest close it.
        open_record = match kind {
            2 => Some(at),
            3 => open_record.or(Some(at)),
            _ => None,
        };
        at += HEADER + len;
    }
    match open_record {
        Some(begun) => Err(format!("a record begun at {begun} never ends")),
        None => Ok(()),
    }
}

/// A checkpoint on top of a materialization links the WAL files instead of copying them,
/// and the newest goes on growing through its link while writers run: what the checkpoint
/// stores of each still ends at a record boundary, never in a record half written. Large
/// batches from two writers (records spanning many blocks), checkpoints back to back.
#[test]
fn wal_files_linked_while_writers_run_end_at_a_record_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = name("A/0");
    let mut config = wal_config(&store, &["A/0"]);
    config.materialize.wal_bytes = u64::MAX;
    config.retain = Some(2000);
    // RocksDB then writes a large record in many write(2) calls, one per fragment: the
    // file's size passes through many points inside a record while it is written.
    config.backend_options.rocksdb_options = Some("writable_file_max_buffer_size=4096".into());
    let engine = Engine::open(config).unwrap();
    put_range(&engine, &a, 0..10, "first");
    assert_eq!(engine.checkpoint().unwrap().stats.backends_materialized, 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Each writer stops after WRITER_BYTES.
    const WRITER_BYTES: usize = 256 << 20;
    let writers: Vec<_> = (0..2u32)
        .map(|w| {
            let (engine, stop, a) = (engine.clone(), stop.clone(), a.clone());
            std::thread::spawn(move || {
                let (mut round, mut bytes) = (0u32, 0usize);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && bytes < WRITER_BYTES {
                    // 3 KiB to 1 MiB a batch: one WAL record over up to 32 blocks, written
                    // long enough for a checkpoint to come in the middle.
                    let ops: Vec<_> = (0..1 + (round * 7 + w) % 4)
                        .map(|i| {
                            let len = if round % 3 == 0 { 3000 } else { 256 << 10 };
                            ckptfs_core::WriteOp::Put(
                                format!("w{w}-{round}-{i}").into_bytes(),
                                vec![b'a' + (round % 26) as u8; len],
                            )
                        })
                        .collect();
                    bytes += ops
                        .iter()
                        .map(|op| match op {
                            ckptfs_core::WriteOp::Put(_, v) => v.len(),
                            ckptfs_core::WriteOp::Delete(_) => 0,
                        })
                        .sum::<usize>();
                    engine.write(&a, &ops).unwrap();
                    round += 1;
                    std::thread::sleep(Duration::from_millis(8));
                }
            })
        })
        .collect();
    let mut ids = Vec::new();
    for _ in 0..60 {
        std::thread::sleep(Duration::from_millis(1));
        let cp = engine.checkpoint().unwrap();
        assert_eq!(cp.stats.backends_materialized, 0, "{:?}", cp.stats);
        ids.push(cp.id);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let expected = scan(&engine, &a);
    let last = engine.checkpoint().unwrap();
    assert_eq!(last.stats.backends_materialized, 0, "{:?}", last.stats);
    ids.push(last.id);
    assert_consistent(&engine);
    drop(engine);
    // Every WAL file each checkpoint stored (the older ones were complete when linked,
    // the newest was growing), read back out of the store and walked; each content once.
    let repo = ckptfs_core::repo::Repo::reader(&store.as_path().into()).unwrap();
    let scratch = dir.path().join("wal");
    let mut seen = std::collections::HashSet::new();
    let mut checked = 0;
    for id in &ids {
        let manifest = repo.catalog.load(*id).unwrap();
        for file in manifest.backends[0].files.iter() {
            if wal_number(&file.name).is_none() || !seen.insert(file.object) {
                continue;
            }
            file.copy_verified(repo.objects.as_ref(), &scratch).unwrap();
            let bytes = std::fs::read(&scratch).unwrap();
            std::fs::remove_file(&scratch).unwrap();
            if let Err(e) = wal_cut(&bytes) {
                panic!(
                    "checkpoint {id}: {} ({} bytes) ends in {e}",
                    file.name,
                    bytes.len()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} WAL files checked");
    // And stock RocksDB replays the last, taken after the writers stopped: every write.
    assert!(restored_contents(&store, last.id)[&a] == expected);
}

/// After a restart (or a restore) nothing is known about earlier materializations: the
/// first checkpoint materializes, and checkpoints before and after restore their data.
#[test]
fn the_first_checkpoint_after_a_restart_or_a_restore_materializes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = name("A/0");
    let engine = Engine::open(wal_config(&store, &["A/0"])).unwrap();
    put_range(&engine, &a, 0..500, "one");
    let cp1 = engine.checkpoint().unwrap();
    put_range(&engine, &a, 500..700, "two");
    let cp2 = engine.checkpoint().unwrap();
    assert_eq!(cp2.stats.backends_materialized, 0);
    let at_cp2 = scan(&engine, &a);
    drop(engine);

    let engine = Engine::open(wal_config(&store, &["A/0"])).unwrap();
    put_range(&engine, &a, 700..800, "three");
    let cp3 = engine.checkpoint().unwrap();
    assert_eq!(cp3.stats.backends_materialized, 1);
    engine.restore_backends(cp1.id).unwrap();
    put_range(&engine, &a, 0..50, "four");
    let at_cp4 = scan(&engine, &a);
    let cp4 = engine.checkpoint().unwrap();
    assert_eq!(cp4.stats.backends_materialized, 1);
    put_range(&engine, &a, 50..60, "five");
    let at_cp5 = scan(&engine, &a);
    let cp5 = engine.checkpoint().unwrap();
    assert_eq!(cp5.stats.backends_materialized, 0);
    assert_consistent(&engine);
    drop(engine);
    assert_eq!(restored_contents(&store, cp2.id)[&a], at_cp2);
    assert_eq!(restored_contents(&store, cp4.id)[&a], at_cp4);
    assert_eq!(restored_contents(&store, cp5.id)[&a], at_cp5);
}

/// Through the mount: `cp -r` of a `wal` mode checkpoint whose WAL is larger than what is
/// assembled in memory (read chunk by chunk) gives the bytes `ckptfs restore` writes, and a
/// directory RocksDB opens with every key.
#[test]
fn a_large_wal_copies_out_of_the_mount() {
    use crate::common::mounted::{ckptfs, ok, scan as scan_dir, Mounted};
    let m = Mounted::new(&["--backend", "A/0", "--checkpoint-mode", "wal"]);
    m.load_keys("A/0", 25_000);
    let first = m.checkpoint();
    m.put("A/0", "after", "the first checkpoint");
    let second = m.checkpoint();
    for (id, keys) in [(first, 25_000), (second, 25_001)] {
        let copy = m.root.join(format!("copy-{id}"));
        assert!(m.copy_out(id, &copy), "cp -r of cp-{id}");
        let db = copy.join("A/0");
        let wal: Vec<_> = std::fs::read_dir(&db)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| wal_number(&e.file_name().to_string_lossy()).is_some())
            .collect();
        let largest = wal.iter().map(|e| e.metadata().unwrap().len()).max();
        assert!(
            largest > Some(ckptfs_core::store::chunks::MAX_ASSEMBLED),
            "cp-{id}: largest WAL file {largest:?} bytes"
        );
        let restored = m.root.join(format!("restored-{id}"));
        ok(ckptfs(&[
            "restore",
            m.store.to_str().unwrap(),
            &id.to_string(),
            restored.to_str().unwrap(),
        ]));
        for e in &wal {
            let copied = std::fs::read(e.path()).unwrap();
            let want = std::fs::read(restored.join("A/0").join(e.file_name())).unwrap();
            assert!(copied == want, "cp-{id}: {:?} differs", e.file_name());
        }
        let kv = scan_dir(&db);
        assert_eq!(kv.len(), keys, "cp-{id}");
    }
    let status = m.status();
    assert!(status["last_error"].is_null(), "{status}");
    assert_eq!(status["checkpoint_mode"], "wal", "{status}");
    // The first checkpoint materialized; the second carried the WAL on top of it.
    assert_eq!(status["materializations"]["A/0"], first, "{status}");
    let rows = status["checkpoints"].as_array().unwrap();
    assert_eq!(rows[0]["backends_materialized"], 1, "{status}");
    assert_eq!(rows[1]["backends_materialized"], 0, "{status}");
    assert!(
        rows[1]["bytes_uploaded_wal"].as_u64().unwrap() > 0,
        "{status}"
    );
}

/// A checkpoint resumes cutting a WAL file where the previous one stopped; when that
/// checkpoint was dropped meanwhile (its chunks deleted), the chunks are stored again from
/// the file, and the checkpoint restores whole.
#[test]
fn a_wal_whose_earlier_chunks_were_dropped_is_stored_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = name("A/0");
    let engine = Engine::open(wal_config(&store, &["A/0"])).unwrap();
    put_range(&engine, &a, 0..3000, "first");
    let cp1 = engine.checkpoint().unwrap();
    put_range(&engine, &a, 0..10, "second");
    let cp2 = engine.checkpoint().unwrap();
    assert!(
        cp2.stats.bytes_uploaded_wal <= 2 * WAL_CHUNK_SIZE as u64,
        "{:?}",
        cp2.stats
    );
    engine.delete_checkpoint(cp1.id).unwrap();
    engine.delete_checkpoint(cp2.id).unwrap();
    put_range(&engine, &a, 10..20, "third");
    let expected = scan(&engine, &a);
    let cp3 = engine.checkpoint().unwrap();
    assert!(
        cp3.stats.bytes_uploaded_wal >= cp2.stats.bytes_wal,
        "the WAL was not stored again: {:?}",
        cp3.stats
    );
    assert_consistent(&engine);
    drop(engine);
    assert_eq!(restored_contents(&store, cp3.id)[&a], expected);
}

/// A materialization found due is prepared in the background: the checkpoint that found it
/// due and the ones after it build on the previous materialization and store no SST; the
/// first checkpoint after the preparation finished adopts it (its SSTs stored before it
/// began), and every checkpoint restores its data.
#[test]
fn a_due_materialization_is_prepared_in_the_background_and_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = name("A/0");
    let mut config = wal_config(&store, &["A/0"]);
    config.backend_options.write_buffer_size = Some(64 * 1024);
    config.materialize.wal_bytes = 200 * 1024;
    let engine = Engine::open(config).unwrap();
    let mut expected = BTreeMap::new();
    let mut checkpoint = |engine: &Engine, range: std::ops::Range<u32>, tag: &str| {
        put_range(engine, &a, range, tag);
        let state = scan(engine, &a);
        let cp = engine.checkpoint().unwrap();
        expected.insert(cp.id, state);
        cp
    };
    let first = checkpoint(&engine, 0..1000, "one");
    assert_eq!(first.stats.backends_materialized, 1);
    // Past 200 KiB of WAL since the materialization: the next checkpoint finds it due.
    let big = checkpoint(&engine, 0..3000, "two");
    assert_eq!(big.stats.backends_materialized, 0, "{:?}", big.stats);
    let due = checkpoint(&engine, 0..10, "three");
    assert_eq!(due.stats.backends_materialized, 0, "{:?}", due.stats);
    assert_eq!(due.stats.bytes_new_sst, 0, "{:?}", due.stats);
    engine.wait_idle();
    assert!(
        !engine.prepared_objects().is_empty(),
        "nothing was prepared"
    );
    assert_consistent(&engine);
    let adopting = checkpoint(&engine, 10..20, "four");
    let s = &adopting.stats;
    assert_eq!(s.backends_materialized, 1, "{s:?}");
    assert!(s.bytes_uploaded_materialization > 0, "{s:?}");
    assert_eq!(
        s.bytes_new_sst, 0,
        "its SSTs were stored before it began: {s:?}"
    );
    assert!(engine.prepared_objects().is_empty());
    // The next one builds on the adopted materialization: only its WAL since.
    let after = checkpoint(&engine, 20..30, "five");
    assert_eq!(after.stats.backends_materialized, 0);
    assert!(
        after.stats.bytes_wal < adopting.stats.bytes_wal + big.stats.bytes_wal,
        "the WAL before the adopted materialization is still carried: {:?}",
        after.stats
    );
    assert_consistent(&engine);
    drop(engine);
    for (id, state) in &expected {
        assert_eq!(
            &restored_contents(&store, *id)[&a],
            state,
            "checkpoint {id}"
        );
    }
}
