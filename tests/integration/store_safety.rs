//! What the store protects against: its metadata file lost or damaged, objects without a
//! catalog, a second writer of a store or a state directory, symbolic links planted in or
//! around it, untrusted manifest fields, readers that would delete; its files are private;
//! stores of every earlier format still open and take new checkpoints.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use ckptfs_core::flink::import::FlinkSource;
use ckptfs_core::flink::plan::Plan;
use ckptfs_core::policy::{ByTime, Policy};
use ckptfs_core::store::ObjectId;
use ckptfs_core::{Engine, EngineConfig, Error};

use crate::common::*;

#[test]
fn a_second_engine_on_the_same_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let engine = Engine::open(config(&store, &["A/0"])).unwrap();
    let mut other = config(&store, &["A/0"]);
    other.state = Some(dir.path().join("other-state"));
    let err = Engine::open(other).err().expect("second open succeeded");
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(
        err.to_string().contains(&std::process::id().to_string()),
        "{err}"
    );
    drop(engine);
    Engine::open(config(&store, &["A/0"])).unwrap();
}

/// A lost ckptfs.json is rebuilt from the manifests: the next start must not take the store
/// for a new one (default backends, retain 3), which would delete checkpoints 1-3 and their
/// objects at once. So with its copy (retain 10) and without one (a store last written
/// before the copy existed: a retain that keeps every checkpoint).
#[test]
fn a_lost_store_metadata_file_is_rebuilt_and_nothing_is_deleted() {
    for lose_the_copy in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let before_ids = six_checkpoints(&store);
        let before_objects = objects(&store);
        std::fs::remove_file(store.join("ckptfs.json")).unwrap();
        if lose_the_copy {
            let _ = std::fs::remove_file(store.join("ckptfs.copy.json"));
        }

        let engine = Engine::open(EngineConfig::new(&store)).unwrap();
        assert_eq!(
            retained_ids(&engine),
            before_ids,
            "checkpoints were dropped"
        );
        assert_eq!(objects(&store), before_objects, "objects were deleted");
        assert_eq!(engine.backend_names(), vec![name("A/0")]);
        assert!(
            engine.retain() >= 6,
            "retain lowered to {}",
            engine.retain()
        );
        let next = engine.checkpoint().unwrap();
        assert!(next.id >= 7, "id {} used again", next.id);
        assert!(retained_ids(&engine).contains(&next.id));
    }
}

/// What the store's metadata holds beyond its manifests survives the loss of ckptfs.json
/// (`lose` deletes it): two pins on checkpoints the policy would drop, the policy (keep the
/// last 3 and a rule by time) and the ids used (the newest checkpoint was dropped, so ids
/// went past the newest manifest). Reopened, the pinned checkpoints are there and pinned,
/// the policy is the same (not `--keep-last 4`, the number of manifests), and the next
/// checkpoint takes an id past every one used before, after which the policy keeps what it
/// kept before.
pub(crate) fn settings_survive_a_lost_metadata_file(config: &EngineConfig, lose: &dyn Fn()) {
    let a = name("A/0");
    let policy = Policy {
        last: 3,
        by_time: ByTime {
            daily: 7,
            ..ByTime::default()
        },
    };
    let pins = BTreeMap::from([("before-deploy".to_string(), 2), ("first".to_string(), 1)]);
    {
        let engine = Engine::open(config.clone()).unwrap();
        engine.set_policy(policy.clone()).unwrap();
        let take = |i: u32| {
            put_range(&engine, &a, i * 100..(i + 1) * 100, &format!("r{i}"));
            engine.flush(&a).unwrap();
            engine.checkpoint().unwrap().id
        };
        assert_eq!((0..3).map(take).collect::<Vec<_>>(), [1, 2, 3]);
        for (name, id) in &pins {
            engine.pin(*id, name).unwrap();
        }
        assert_eq!((3..6).map(take).collect::<Vec<_>>(), [4, 5, 6]);
        engine.delete_checkpoint(6).unwrap();
        assert_eq!(retained_ids(&engine), [1, 2, 4, 5]);
    }
    lose();
    let engine = Engine::open(config.clone()).unwrap();
    assert_eq!(engine.pins(), pins, "pins lost");
    assert_eq!(engine.policy(), policy, "the policy changed");
    assert_eq!(retained_ids(&engine), [1, 2, 4, 5]);
    assert_eq!(engine.backend_names(), vec![a.clone()]);
    put_range(&engine, &a, 0..10, "after");
    let next = engine.checkpoint().unwrap().id;
    assert!(next > 6, "checkpoint id {next} used again");
    assert_eq!(retained_ids(&engine), [1, 2, 4, 5, next]);
    assert!(
        engine.delete_checkpoint(1).is_err(),
        "checkpoint 1 is not pinned"
    );
    drop(engine);
    // And the next start finds the same (the rebuilt metadata was written).
    let engine = Engine::open(config.clone()).unwrap();
    assert_eq!(engine.pins(), pins);
    assert_eq!(engine.policy(), policy);
    assert_eq!(retained_ids(&engine), [1, 2, 4, 5, next]);
}

#[test]
fn a_lost_store_metadata_file_keeps_pins_the_policy_and_the_ids_used() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    settings_survive_a_lost_metadata_file(&config(&store, &["A/0"]), &|| {
        std::fs::remove_file(store.join("ckptfs.json")).unwrap()
    });
}

/// A Flink checkpoint the store held and dropped is not imported again after ckptfs.json
/// was lost, and the id of the dropped checkpoint (the newest) is not given again.
#[test]
fn a_lost_store_metadata_file_keeps_the_dropped_flink_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let src = FlinkSource::parse(&crate::flink::fixture()).unwrap();
    let mut cfg = EngineConfig::new(&store);
    cfg.host_backends = false;
    let job = "a312c9034e3e0d2016dae60431b4c9dc";
    let dropped = BTreeMap::from([(job.to_string(), vec![6])]);
    {
        let engine = Engine::open(cfg.clone()).unwrap();
        let imported: Vec<(u64, u64)> = engine
            .import_flink(&Plan::checked(&src).unwrap())
            .into_iter()
            .map(|i| (i.checkpoint, i.result.unwrap().0.id))
            .collect();
        assert_eq!(imported, [(4, 1), (5, 2), (6, 3)]);
        engine.delete_checkpoint(3).unwrap();
        assert_eq!(engine.flink_dropped(), dropped);
    }
    std::fs::remove_file(store.join("ckptfs.json")).unwrap();
    let engine = Engine::open(cfg.clone()).unwrap();
    assert_eq!(
        engine.flink_dropped(),
        dropped,
        "the dropped checkpoints were lost"
    );
    let again: Vec<(u64, u64)> = engine
        .import_flink(&Plan::checked(&src).unwrap())
        .into_iter()
        .map(|i| (i.checkpoint, i.result.unwrap().0.id))
        .collect();
    assert_eq!(again, [], "a dropped Flink checkpoint was imported again");
    assert_eq!(retained_ids(&engine), [1, 2]);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.join("ckptfs.json")).unwrap()).unwrap();
    let next = meta["next_checkpoint"].as_u64().unwrap();
    assert!(
        next > 3,
        "the next checkpoint is {next}: the dropped one's id"
    );
}

/// The copy of the metadata (ckptfs.copy.json): one a crash left behind is brought up to
/// date by the next start; one behind when ckptfs.json is lost still rebuilds it (a pin on a
/// checkpoint that no longer exists is left out); a damaged one while ckptfs.json is lost
/// stops the start (fsck says so) and changes nothing, until it is moved aside; a damaged
/// one beside an intact ckptfs.json is written again.
#[test]
fn the_copy_of_the_store_metadata_follows_it_and_damage_to_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (meta_file, copy_file) = (store.join("ckptfs.json"), store.join("ckptfs.copy.json"));
    six_checkpoints(&store);
    let pins_in = |file: &Path| -> serde_json::Value {
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        record["pins"].clone()
    };
    {
        let engine = Engine::open(EngineConfig::new(&store)).unwrap();
        engine.pin(3, "old").unwrap();
    }
    let old_copy = std::fs::read(&copy_file).unwrap();
    assert_eq!(pins_in(&copy_file), serde_json::json!({"old": 3}));
    {
        let engine = Engine::open(EngineConfig::new(&store)).unwrap();
        engine.unpin("old").unwrap();
        engine.delete_checkpoint(3).unwrap();
        engine.pin(4, "new").unwrap();
    }
    assert_eq!(pins_in(&copy_file), serde_json::json!({"new": 4}));
    // A crash between the write of ckptfs.json and its copy's left the copy behind: the
    // next start writes it again.
    std::fs::write(&copy_file, &old_copy).unwrap();
    drop(Engine::open(EngineConfig::new(&store)).unwrap());
    assert_eq!(pins_in(&copy_file), serde_json::json!({"new": 4}));
    // Behind, and ckptfs.json lost: the pin on checkpoint 3, gone, is left out.
    std::fs::write(&copy_file, &old_copy).unwrap();
    std::fs::remove_file(&meta_file).unwrap();
    {
        let engine = Engine::open(EngineConfig::new(&store)).unwrap();
        assert_eq!(engine.pins(), BTreeMap::new());
        assert_eq!(retained_ids(&engine), [1, 2, 4, 5, 6]);
    }
    // Damaged, and ckptfs.json lost: refused, nothing changed; fsck names it.
    let before_objects = objects(&store);
    std::fs::remove_file(&meta_file).unwrap();
    let mut damaged = std::fs::read(&copy_file).unwrap();
    let at = damaged.len() / 2;
    damaged[at] ^= 0x01;
    std::fs::write(&copy_file, &damaged).unwrap();
    let err = Engine::open(EngineConfig::new(&store))
        .err()
        .expect("a damaged copy must stop the start");
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("ckptfs.copy.json"), "{err}");
    assert!(!meta_file.exists());
    assert_eq!(std::fs::read(&copy_file).unwrap(), damaged);
    assert_eq!(objects(&store), before_objects);
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.to_string().contains("ckptfs.copy.json")),
        "{report:?}"
    );
    // Moved aside: rebuilt from the manifests alone, every checkpoint kept.
    std::fs::rename(&copy_file, store.join("copy.bad")).unwrap();
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.to_string().contains("has no copy")),
        "{report:?}"
    );
    {
        let engine = Engine::open(EngineConfig::new(&store)).unwrap();
        assert_eq!(retained_ids(&engine), [1, 2, 4, 5, 6]);
        assert_eq!(objects(&store), before_objects);
    }
    // Damaged beside an intact ckptfs.json: written again at the next start.
    std::fs::write(&copy_file, b"{").unwrap();
    drop(Engine::open(EngineConfig::new(&store)).unwrap());
    let read = |file: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap()
    };
    let (meta, copy) = (read(&meta_file), read(&copy_file));
    assert_eq!(
        (&copy["retain"], &copy["backends"]),
        (&meta["retain"], &meta["backends"])
    );
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// An unreadable ckptfs.json: the start is refused with a clear error, nothing changed.
#[test]
fn an_unreadable_store_metadata_file_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    six_checkpoints(&store);
    let before_objects = objects(&store);
    let manifests_before: BTreeSet<_> = std::fs::read_dir(store.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    for garbage in [
        &b"{\"format\":1,"[..],
        b"",
        b"{\"format\":1,\"next_checkpoint\":3,\"retain\":0,\"backends\":[]}",
    ] {
        std::fs::write(store.join("ckptfs.json"), garbage).unwrap();
        let err = Engine::open(EngineConfig::new(&store))
            .err()
            .expect("must refuse");
        assert!(matches!(err, Error::Corrupt(_)), "{err}");
        assert!(err.to_string().contains("ckptfs.json"), "{err}");
        assert_eq!(objects(&store), before_objects);
        let manifests: BTreeSet<_> = std::fs::read_dir(store.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(manifests, manifests_before);
    }
}

/// A partial copy of a store: objects without any metadata are never swept.
#[test]
fn objects_without_any_catalog_are_kept_and_the_start_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    six_checkpoints(&store);
    let before_objects = objects(&store);
    std::fs::remove_file(store.join("ckptfs.json")).unwrap();
    std::fs::remove_dir_all(store.join("checkpoints")).unwrap();
    let err = Engine::open(EngineConfig::new(&store))
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("incomplete"), "{err}");
    assert_eq!(objects(&store), before_objects);
}

/// Hostile stores: random damage to ckptfs.json or a manifest (a flipped byte, a cut, an
/// inserted or deleted byte) either is refused at start or changes nothing that matters;
/// it never deletes an object or drops a checkpoint the intact manifests hold.
#[test]
fn random_damage_to_store_metadata_never_deletes_data() {
    let dir = tempfile::tempdir().unwrap();
    let pristine = dir.path().join("pristine");
    let ids = {
        let mut cfg = config(&pristine, &["A/0"]);
        cfg.retain = Some(4);
        let engine = Engine::open(cfg).unwrap();
        let a = name("A/0");
        for i in 0..5u32 {
            put_range(&engine, &a, i * 300..(i + 1) * 300, "v");
            engine.flush(&a).unwrap();
            if i == 3 {
                engine.compact(&a).unwrap();
            }
            engine.checkpoint().unwrap();
        }
        retained_ids(&engine)
    };
    let before = objects(&pristine);
    let rel = |p: &Path, root: &Path| p.strip_prefix(root).unwrap().to_path_buf();
    let before_rel: BTreeSet<PathBuf> = before.iter().map(|p| rel(p, &pristine)).collect();
    let iterations: u64 = std::env::var("CKPTFS_HOSTILE_STORES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut refused, mut started) = (0, 0);
    for i in 0..iterations {
        let store = dir.path().join(format!("copy-{i}"));
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(&pristine)
            .arg(&store)
            .status()
            .unwrap();
        assert!(status.success());
        let victim = match next() % (ids.len() as u64 + 1) {
            0 => store.join("ckptfs.json"),
            n => store.join(format!("checkpoints/{}.json", ids[n as usize - 1])),
        };
        let mut bytes = std::fs::read(&victim).unwrap();
        let at = (next() % bytes.len() as u64) as usize;
        match next() % 4 {
            0 => bytes[at] = (next() % 256) as u8,
            1 => bytes.truncate(at),
            2 => bytes.insert(at, (next() % 256) as u8),
            _ => {
                bytes.remove(at);
            }
        }
        std::fs::write(&victim, &bytes).unwrap();
        match Engine::open(EngineConfig::new(&store)) {
            Err(_) => refused += 1,
            Ok(engine) => {
                started += 1;
                let retained = retained_ids(&engine);
                for id in &ids {
                    let damaged = victim.ends_with(format!("{id}.json"));
                    assert!(
                        damaged || retained.contains(id),
                        "iteration {i}: checkpoint {id} dropped after damage to {}",
                        victim.display()
                    );
                }
            }
        }
        let after: BTreeSet<PathBuf> = objects(&store).iter().map(|p| rel(p, &store)).collect();
        let lost: Vec<_> = before_rel.difference(&after).collect();
        assert!(
            lost.is_empty(),
            "iteration {i}: damage to {} deleted {lost:?}",
            victim.display()
        );
        std::fs::remove_dir_all(&store).unwrap();
    }
    eprintln!("damaged stores: {refused} refused, {started} started without loss");
}

/// A refused start (or a read-only fsck) must not create checkpoints/, or
/// the next start of the incomplete store would sweep every object.
#[test]
fn a_refused_start_leaves_an_incomplete_store_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    six_checkpoints(&store);
    let before = objects(&store);
    std::fs::remove_dir_all(store.join("checkpoints")).unwrap();
    for _ in 0..2 {
        assert!(Engine::open(EngineConfig::new(&store)).is_err());
        let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
        assert!(!report.problems.is_empty(), "{report:?}");
        let report = ckptfs_core::commands::fsck::fsck(&store, true, |_| {}).unwrap();
        assert_eq!(report.repaired_orphans, 0, "{report:?}");
        assert!(!store.join("checkpoints").exists());
    }
    assert_eq!(objects(&store), before);
}

/// The store and state directories are owner-only, whatever the umask.
#[test]
fn store_and_state_directories_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    six_checkpoints(&store);
    let mut checked = 0;
    for entry in walk(&store) {
        let meta = std::fs::symlink_metadata(&entry).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        let in_rocksdb = entry.components().any(|c| c.as_os_str() == "db");
        if meta.is_dir() {
            assert_eq!(mode, 0o700, "{} is {mode:o}", entry.display());
        } else if !in_rocksdb && entry.file_name().unwrap() != "ckptfs.log" {
            // RocksDB's own files follow the process umask (the daemon sets 077); they sit
            // inside 0700 directories either way.
            assert_eq!(mode, 0o600, "{} is {mode:o}", entry.display());
        }
        checked += 1;
    }
    assert!(checked > 20, "walked only {checked} entries");
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() && !out[i].is_symlink() {
            for e in std::fs::read_dir(&out[i]).unwrap() {
                out.push(e.unwrap().path());
            }
        }
        i += 1;
    }
    out
}

/// A second daemon sharing a state directory is refused before it touches it.
#[test]
fn a_state_directory_serves_one_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut first = config(&dir.path().join("one"), &["A/0"]);
    first.state = Some(state.clone());
    let engine = Engine::open(first).unwrap();
    // What the first daemon's checkpoint in flight has staged.
    let staged = state.join("staging/1/marker");
    std::fs::create_dir_all(staged.parent().unwrap()).unwrap();
    std::fs::write(&staged, b"x").unwrap();
    let mut second = config(&dir.path().join("two"), &["A/0"]);
    second.state = Some(state.clone());
    let err = Engine::open(second).err().expect("must refuse");
    assert!(
        matches!(
            err,
            Error::Locked {
                what: "state directory",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        staged.exists(),
        "the second daemon cleared the first one's staging"
    );
    drop(engine);
}

/// A symbolic link planted as the lock file is not followed.
#[test]
fn a_planted_lock_symlink_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    six_checkpoints(&store);
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::remove_file(store.join("lock")).unwrap();
    std::os::unix::fs::symlink(&victim, store.join("lock")).unwrap();
    let err = Engine::open(EngineConfig::new(&store))
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("lock"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

/// A store reached through a symbolic link works; a link planted inside
/// the store (a shard directory) is never followed by the sweep or a delete.
#[test]
fn links_to_the_store_work_and_links_inside_it_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    six_checkpoints(&real);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    drop(Engine::open(EngineConfig::new(&link)).unwrap());

    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    // A shard the store does not have (which ones it has depends on the content).
    let shard = (0..=255u8)
        .map(|b| format!("{b:02x}"))
        .find(|s| !real.join("objects").join(s).exists())
        .expect("a free shard");
    let victim = outside.join(shard.repeat(32));
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&outside, real.join("objects").join(&shard)).unwrap();
    drop(Engine::open(EngineConfig::new(&real)).unwrap());
    ckptfs_core::commands::fsck::fsck(&real, true, |_| {}).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

/// An object replaced by a symbolic link is corrupt, never a way
/// to read another file of the host.
#[test]
fn an_object_that_is_a_symlink_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = six_checkpoints(&store);
    let secret = dir.path().join("secret");
    std::fs::write(&secret, b"not yours").unwrap();
    let newest = ckptfs_core::repo::Repo::reader(&store.as_path().into())
        .map(|r| r.catalog)
        .unwrap()
        .load(ids[5])
        .unwrap();
    let path_of = |id: ObjectId| {
        let hex = id.to_hex();
        store.join("objects").join(&hex[..2]).join(hex)
    };
    // A file's object.
    let victim = path_of(newest.backends[0].files.iter().next().unwrap().object);
    std::fs::remove_file(&victim).unwrap();
    std::os::unix::fs::symlink(&secret, &victim).unwrap();
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    let hex = victim.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        report.corrupt.iter().any(|id| id.to_hex() == hex),
        "{report:?}"
    );
    let out = dir.path().join("out");
    let damaged = report.damaged_checkpoints[0];
    let err = ckptfs_core::commands::restore::restore_checkpoint(&store, damaged, &out, |_| {})
        .unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(ids.contains(&damaged));
    // A file list's object: the checkpoints read through it cannot be read at all.
    let list = path_of(newest.backends[0].lists.first().unwrap());
    std::fs::remove_file(&list).unwrap();
    std::os::unix::fs::symlink(&secret, &list).unwrap();
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(
        report
            .unreadable_manifests
            .iter()
            .map(|m| m.to_string())
            .any(|m| m.starts_with(&format!("{}.json", ids[5])) && m.contains("symbolic link")),
        "{report:?}"
    );
    let err = ckptfs_core::commands::restore::restore_checkpoint(&store, ids[5], &out, |_| {})
        .unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(!out.exists());
}

/// Rewrite manifest `id` with `edit` applied, as a format-1 manifest (no checksum, as old
/// stores have them), so that the content checks, not the checksum, must catch it.
fn edit_manifest(store: &Path, id: u64, edit: &dyn Fn(&mut serde_json::Value)) {
    let path = store.join(format!("checkpoints/{id}.json"));
    let mut manifest = crate::common::manifest_json(store, id);
    edit(&mut manifest);
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
}

fn plant_name(store: &Path, id: u64, evil: &str) {
    edit_manifest(store, id, &|m| {
        m["backends"][0]["files"][0]["name"] = evil.into()
    });
}

/// File names from a manifest never leave the destination.
#[test]
fn a_manifest_with_a_path_in_a_file_name_is_refused() {
    for evil in [
        "../../escaped",
        "/tmp/ckptfs-escaped",
        "a/b",
        "..",
        ".",
        "",
        "x\u{0}y",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let ids = six_checkpoints(&store);
        plant_name(&store, ids[5], evil);
        let dest = dir.path().join("deep/er/out");
        let err = ckptfs_core::commands::restore::restore_checkpoint(&store, ids[5], &dest, |_| {})
            .err()
            .unwrap_or_else(|| panic!("{evil:?} was restored"));
        assert!(err.to_string().contains("invalid"), "{evil:?}: {err}");
        assert!(!dir.path().join("deep/escaped").exists());
        assert!(!dest.exists(), "{evil:?}: something was written");
        // The daemon starts without that checkpoint, says why, and deletes nothing it may
        // name, even when every other checkpoint is dropped.
        let before = objects(&store);
        let text =
            std::fs::read_to_string(store.join(format!("checkpoints/{}.json", ids[5]))).unwrap();
        let engine = Engine::open(EngineConfig::new(&store)).unwrap();
        assert_eq!(retained_ids(&engine), ids[..5].to_vec());
        let status = engine.status().last_error.unwrap_or_default();
        assert!(status.contains("fsck"), "{status}");
        engine.checkpoint().unwrap();
        engine.set_retain(1).unwrap();
        drop(engine);
        let after = objects(&store);
        for object in &before {
            let hex = object.file_name().unwrap().to_string_lossy().into_owned();
            if text.contains(&hex) {
                assert!(after.contains(object), "{evil:?}: {hex} was deleted");
            }
        }
    }
    assert!(!Path::new("/tmp/ckptfs-escaped").exists());
}

/// Other untrusted fields (format, object ids, duplicates) are refused too.
#[test]
fn manifests_with_bad_fields_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = six_checkpoints(&store);
    let path = store.join(format!("checkpoints/{}.json", ids[0]));
    let good = std::fs::read(&path).unwrap();
    let catalog = ckptfs_core::repo::Repo::reader(&store.as_path().into())
        .map(|r| r.catalog)
        .unwrap();
    // An old-format manifest without checksum is still read.
    edit_manifest(&store, ids[0], &|_| {});
    assert_eq!(catalog.load(ids[0]).unwrap().id, ids[0]);
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let edits: Vec<Edit> = vec![
        Box::new(|m| m["format"] = 99.into()),
        Box::new(|m| m["backends"][0]["files"][0]["object"] = "../../etc/passwd".into()),
        Box::new(|m| m["backends"][0]["name"] = "../x/0".into()),
        Box::new(|m| {
            let dup = m["backends"][0]["files"][0].clone();
            m["backends"][0]["files"].as_array_mut().unwrap().push(dup);
        }),
        Box::new(|m| {
            let dup = m["backends"][0].clone();
            m["backends"].as_array_mut().unwrap().push(dup);
        }),
        Box::new(|m| m["backends"][0]["files"][0]["size"] = (-1).into()),
    ];
    for (i, edit) in edits.iter().enumerate() {
        std::fs::write(&path, &good).unwrap();
        edit_manifest(&store, ids[0], edit.as_ref());
        assert!(
            matches!(catalog.load(ids[0]), Err(Error::Corrupt(_))),
            "edit {i} was accepted"
        );
    }
    // A current manifest carries a checksum: a changed digit anywhere is caught, and so
    // is a removed checksum.
    let text = String::from_utf8(good.clone()).unwrap();
    let size_at = text.find("\"completed_unix_ms\": ").unwrap() + 21;
    let mut flipped = text.clone().into_bytes();
    flipped[size_at] = if flipped[size_at] == b'1' { b'2' } else { b'1' };
    std::fs::write(&path, &flipped).unwrap();
    let err = catalog.load(ids[0]).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    let mut unsealed: serde_json::Value = serde_json::from_slice(&good).unwrap();
    unsealed.as_object_mut().unwrap().remove("checksum");
    std::fs::write(&path, serde_json::to_vec(&unsealed).unwrap()).unwrap();
    let err = catalog.load(ids[0]).unwrap_err();
    assert!(err.to_string().contains("without its checksum"), "{err}");
    std::fs::write(&path, &good).unwrap();
    assert!(catalog.load(ids[0]).is_ok());
}

/// Reading the catalog (graph, fsck's progress bar) deletes nothing, not even
/// what looks like a leftover: it may be a live daemon's manifest being written.
#[test]
fn reading_the_catalog_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    six_checkpoints(&store);
    let in_flight = store.join("checkpoints/.7.json.tmp-abc123");
    std::fs::write(&in_flight, b"{").unwrap();
    let catalog = ckptfs_core::repo::Repo::reader(&store.as_path().into())
        .map(|r| r.catalog)
        .unwrap();
    assert_eq!(catalog.load_all().unwrap().len(), 6);
    assert!(in_flight.exists(), "a reader removed a live daemon's file");
    // The lock holder does clean it up.
    drop(Engine::open(EngineConfig::new(&store)).unwrap());
    assert!(!in_flight.exists());
}

/// A file set aside by hand in checkpoints/ (`6.json.bad`) may name
/// objects: it freezes deletions like an unreadable manifest, and fsck lists it.
#[test]
fn a_manifest_set_aside_by_hand_freezes_deletions() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = six_checkpoints(&store);
    let path = store.join(format!("checkpoints/{}.json", ids[5]));
    std::fs::rename(&path, path.with_extension("json.bad")).unwrap();
    let before = objects(&store);
    let engine = Engine::open(EngineConfig::new(&store)).unwrap();
    engine.set_retain(1).unwrap();
    drop(engine);
    assert!(objects(&store).is_superset(&before), "objects were deleted");
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(
        report.unreadable_manifests[0]
            .to_string()
            .starts_with(&format!("{}.json.bad", ids[5])),
        "{report:?}"
    );
}

/// Stores written by earlier versions (tests/fixtures/store-formatN, see its README: format
/// 1 without checksums, 2 with checksums and files inline, 3 with file lists but whole
/// MANIFESTs, 4 with MANIFEST chunks but whole WAL files, 5 with WAL chunks, 7 with an
/// imported backend, App/0, whose rounds are checked like the others', 8 with SSTs' column
/// families) still restore
/// and pass fsck, are migrated at mount (file lists stored by content), and take new
/// checkpoints beside the old ones.
#[test]
fn stores_of_earlier_formats_still_work() {
    for format in [1, 2, 3, 4, 5, 6, 7, 8] {
        a_store_of_an_earlier_format_still_works(format);
    }
}

fn a_store_of_an_earlier_format_still_works(format: u32) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let fixture = format!(
        "{}/tests/fixtures/store-format{format}",
        env!("CARGO_MANIFEST_DIR")
    );
    let status = std::process::Command::new("cp")
        .args(["-a", &fixture])
        .arg(&store)
        .status()
        .unwrap();
    assert!(status.success());
    let before: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.join("ckptfs.json")).unwrap()).unwrap();
    assert_eq!(
        before["format"], format,
        "the fixture is of format {format}"
    );
    let keys = 200;
    let value_size = 20;
    let check = |id: u64| {
        for (backend, contents) in restored_contents(&store, id) {
            let pairs: Vec<_> = contents.clone().into_iter().collect();
            let round = ckptfs_core::workload::current_round(&pairs)
                .unwrap()
                .unwrap();
            assert_eq!(
                contents,
                ckptfs_core::workload::expected_after(&backend, round, keys, value_size),
                "checkpoint {id} {backend}"
            );
        }
    };
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.checkpoints, vec![2, 3]);
    check(2);
    check(3);
    let engine = Engine::open(EngineConfig::new(&store)).unwrap();
    assert_eq!(engine.backend_names(), vec![name("A/0"), name("B/1")]);
    assert_eq!(retained_ids(&engine), vec![2, 3]);
    // Migrated at mount: the manifests now name stored file lists, and read back to the
    // same files; ckptfs.json says the current format, so that older versions refuse the
    // store instead of finding every manifest unreadable.
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.join("ckptfs.json")).unwrap()).unwrap();
    assert_eq!(meta["format"], ckptfs_core::catalog::FORMAT);
    for id in [2, 3] {
        let text = std::fs::read_to_string(store.join(format!("checkpoints/{id}.json"))).unwrap();
        let stored: serde_json::Value = serde_json::from_str(&text).unwrap();
        // Manifests that listed files inline are rewritten; format 3 ones already name
        // lists and stay as they are.
        let expected = if format < 3 {
            ckptfs_core::catalog::FORMAT
        } else {
            format
        };
        assert_eq!(stored["format"], expected, "{text}");
        for b in stored["backends"].as_array().unwrap() {
            assert!(b["files"].is_null() && b["list"].is_string(), "{text}");
        }
    }
    check(2);
    check(3);
    let a = name("A/0");
    let restored: Vec<_> = engine.scan(&a).unwrap();
    assert_eq!(
        ckptfs_core::workload::current_round(&restored).unwrap(),
        Some(2)
    );
    ckptfs_core::workload::step(&engine, keys, value_size).unwrap();
    let new = engine.checkpoint().unwrap();
    assert_eq!(new.id, 4);
    drop(engine);
    let text = std::fs::read_to_string(store.join("checkpoints/4.json")).unwrap();
    assert!(text.contains("\"checksum\""));
    check(3);
    check(4);
    let report = ckptfs_core::commands::fsck::fsck(&store, false, |_| {}).unwrap();
    assert!(report.is_clean(), "format {format}: {report:?}");
}
