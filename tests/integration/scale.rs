//! Cost that must not grow with history: small-file compaction keeps the live
//! SST count bounded when every checkpoint flushes a tiny, non-overlapping file.

use crate::common::*;
use ckptfs_core::compaction::SmallFilePolicy;
use ckptfs_core::{Engine, WriteOp};

#[test]
fn small_file_compaction_bounds_the_sst_count_of_time_ordered_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut cfg = config(&store, &["A/0"]);
    cfg.backend_options.write_buffer_size = None;
    cfg.retain = Some(3);
    let engine = Engine::open(cfg).unwrap();
    let a = name("A/0");
    // A large old file (values that do not compress), then one new key per checkpoint,
    // in increasing order.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let ops: Vec<WriteOp> = (0..20_000u32)
        .map(|i| {
            let value: Vec<u8> = (0..200)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    b'a' + (x % 26) as u8
                })
                .collect();
            WriteOp::Put(format!("k{i:08}").into_bytes(), value)
        })
        .collect();
    engine.write(&a, &ops).unwrap();
    engine.flush(&a).unwrap();
    let big: Vec<String> = engine
        .live_sst_files(&a)
        .unwrap()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    for i in 0..150u32 {
        let key = format!("t{i:08}").into_bytes();
        engine
            .write(&a, &[WriteOp::Put(key, b"event".to_vec())])
            .unwrap();
        engine.checkpoint().unwrap();
    }
    let before = engine.live_sst_files(&a).unwrap().len();
    assert!(
        before > 100,
        "only {before} SSTs: the pathology did not show"
    );
    let expected = scan(&engine, &a);

    let policy = SmallFilePolicy::default();
    let (files, bytes) = engine.compact_small_files(&a, &policy).unwrap();
    let after = engine.live_sst_files(&a).unwrap();
    eprintln!(
        "{before} SSTs -> {}; merged {files} files, {bytes} bytes",
        after.len()
    );
    assert!(files >= 100, "merged only {files}");
    assert!(after.len() <= big.len() + 2, "{} SSTs left", after.len());
    for name in &big {
        assert!(
            after.iter().any(|(n, _)| n == name),
            "the large file {name} was rewritten"
        );
    }
    assert_eq!(scan(&engine, &a), expected, "compaction changed the data");
    // Nothing to do a second time.
    assert_eq!(engine.compact_small_files(&a, &policy).unwrap().0, 0);

    // The next checkpoint uploads the merged file, about what the small ones held.
    let cp = engine.checkpoint().unwrap();
    let private: u64 = cp.backends[0]
        .files
        .iter()
        .filter(|f| !f.name.ends_with(".sst"))
        .map(|f| f.size)
        .sum();
    assert!(
        cp.stats.bytes_uploaded <= 2 * bytes + private + 64 * 1024,
        "uploaded {} for {bytes} bytes of small files",
        cp.stats.bytes_uploaded
    );
    assert!(cp.stats.files_total as usize <= after.len() + 5);
    assert_eq!(restored_contents(&store, cp.id)[&a], expected);
}

/// The daemon merges small files in the background (`--small-file-compaction-interval`)
/// and reports it in status.
#[test]
fn the_daemon_merges_small_files_in_the_background() {
    let m = crate::common::mounted::Mounted::new(&[
        "--backend",
        "A/0",
        "--small-file-compaction-interval",
        "200ms",
    ]);
    let mut ctl = crate::common::mounted::Ctl::open(&m);
    for i in 0..80 {
        ctl.send(&format!("put A/0 t{i:06} v\nflush A/0\n"))
            .unwrap();
        assert_eq!(ctl.answer()["ok"], true);
        assert_eq!(ctl.answer()["ok"], true);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let merged = m.status()["small_file_compactions"]["files"]
            .as_u64()
            .unwrap();
        if merged >= 64 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "merged only {merged}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let id = m.checkpoint();
    let manifest = m.manifest(id);
    let ssts = manifest["backends"][0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"].as_str().unwrap().ends_with(".sst"))
        .count();
    // Files flushed after the last merge stay until 64 small ones gather again.
    assert!(ssts <= 80 - 64 + 3, "{ssts} SSTs after the merge");
    assert_eq!(
        crate::common::mounted::scan(&m.mnt.join(format!("cp-{id}/A/0"))).len(),
        80
    );
}

/// Small files that gather faster than the compaction's period are merged as soon as a
/// checkpoint finds twice the policy's number of them (128), not at the next period.
#[test]
fn many_small_files_are_merged_without_waiting_for_the_period() {
    let m = crate::common::mounted::Mounted::new(&[
        "--backend",
        "A/0",
        "--small-file-compaction-interval",
        "1h",
    ]);
    let mut ctl = crate::common::mounted::Ctl::open(&m);
    for i in 0..130 {
        ctl.send(&format!(
            "put A/0 t{i:06} v
flush A/0
"
        ))
        .unwrap();
        assert_eq!(ctl.answer()["ok"], true);
        assert_eq!(ctl.answer()["ok"], true);
    }
    let merged = || {
        m.status()["small_file_compactions"]["files"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(merged(), 0, "merged before any checkpoint");
    m.checkpoint();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while merged() < 128 {
        assert!(
            std::time::Instant::now() < deadline,
            "merged only {}",
            merged()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let id = m.checkpoint();
    assert_eq!(
        crate::common::mounted::scan(&m.mnt.join(format!("cp-{id}/A/0"))).len(),
        130
    );
}

/// RocksDB's MANIFEST is listed in every checkpoint (as chunks); ckptfs's built-in options
/// keep it small (RocksDB's own default lets it grow to 1 GiB).
#[test]
fn the_rocksdb_manifest_stays_small_over_many_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut cfg = config(&store, &["A/0"]);
    cfg.retain = Some(2);
    let engine = Engine::open(cfg).unwrap();
    let a = name("A/0");
    let mut largest = 0;
    for i in 0..400u32 {
        let key = format!("t{i:08}").into_bytes();
        engine
            .write(&a, &[WriteOp::Put(key, vec![b'v'; 100])])
            .unwrap();
        let cp = engine.checkpoint().unwrap();
        let manifest = cp.backends[0]
            .files
            .iter()
            .find(|f| f.name.starts_with("MANIFEST"))
            .unwrap()
            .size;
        largest = largest.max(manifest);
    }
    eprintln!("largest MANIFEST over 400 checkpoints: {largest} bytes");
    assert!(largest < 80 * 1024, "the MANIFEST grew to {largest} bytes");
}
