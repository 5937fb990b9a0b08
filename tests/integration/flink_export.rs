//! Every Flink 2.3 checkpoint layout in and out: a job with file merging (FLIP-306: every
//! state file a segment of a shared physical file) and a job on the ForSt backend are
//! imported (the file-merging one from object storage too), read back with Debian's ldb,
//! exported, moved and restored into Flink; an
//! export to object storage (moto_server) restores once its objects are copied anywhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::mounted::{ckptfs, ok, Mounted};
use crate::flink::{check_tree, fixture, imported_from, Job};
use ckptfs_core::flink::metadata::{self, KeyedHandle, StreamHandle};

/// Every stream handle a `_metadata` names: keyed state's files and meta data, and
/// operator state.
fn handles(bytes: &[u8]) -> Vec<StreamHandle> {
    let mut out = Vec::new();
    for op in metadata::parse(bytes).unwrap().operators {
        out.extend(op.coordinator_state);
        for subtask in op.subtasks {
            for state in [subtask.managed_operator_state, subtask.raw_operator_state]
                .into_iter()
                .flatten()
            {
                out.extend(state.handle);
            }
            if let Some(KeyedHandle::Incremental(h)) = subtask.managed_keyed {
                out.push(h.meta);
                out.extend(h.shared.into_iter().chain(h.private).map(|(_, s)| s));
            }
        }
    }
    out
}

/// An exported `_metadata` is relocatable: every file named relative to its directory,
/// each there (below the job's directory `job_dir`) with the size it says; no segment.
pub(crate) fn assert_relocatable(job_dir: &Path, chk: &str) {
    let bytes = std::fs::read(job_dir.join(chk).join("_metadata")).unwrap();
    let mut files = 0;
    for handle in handles(&bytes) {
        match handle {
            StreamHandle::Relative { path, size, .. } => {
                let at = match path.strip_prefix("../") {
                    Some(rest) => job_dir.join(rest),
                    None => job_dir.join(chk).join(&path),
                };
                assert_eq!(std::fs::metadata(&at).unwrap().len(), size, "{path}");
                files += 1;
            }
            StreamHandle::Inline(_) | StreamHandle::EmptySegment => {}
            other => panic!("not relocatable: {other:?}"),
        }
    }
    assert!(files > 0);
}

/// A real job with `extra` options (its state backend or file merging) checkpoints 600
/// records; its checkpoints are imported (a later one re-referencing what an earlier one
/// stored), read back through the mount with ldb, exported, the export moved elsewhere,
/// and a job restored from the moved copy goes on from 600 records with every key's state
/// (StateJob checks each key's count itself). With `also_s3`, the job's directory is also
/// copied to moto_server as it is (its `_metadata` naming the local paths: a moved job),
/// imported from there into a store in another bucket ([`through_object_storage`]), read
/// back the same, exported inside the object store, and (unless `on_btrfs`) the job
/// restores from that export (downloaded: Flink's S3 plugin cannot be installed here)
/// instead of the moved one. With `on_btrfs`, everything is on a loop-mounted btrfs, and
/// the job restores from an export of the store itself, whose files are clones of the
/// store's objects. Returns the source
/// `_metadata` imported.
fn import_export_restore(extra: &[&str], also_s3: bool, on_btrfs: bool) -> Vec<u8> {
    let btrfs = on_btrfs.then(|| crate::common::btrfs::Btrfs::new(1 << 30));
    let dir = match &btrfs {
        Some(fs) => tempfile::tempdir_in(&fs.mnt).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let ck = dir.path().join("ck");
    let mut job = Job::start(&classpath, &ck, 600, extra);
    let idle = job.checkpoint_with(600);
    // One more checkpoint of the same state: its files re-referenced by the import.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let job_dir = crate::flink::job_dir_in(&ck);
    while !job_dir
        .join(format!("chk-{}/_metadata", idle + 1))
        .is_file()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint after {idle}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    job.kill();
    let source = std::fs::read(job_dir.join(format!("chk-{idle}/_metadata"))).unwrap();
    let from_s3 = also_s3.then(|| {
        let merging = extra.contains(&"--file-merging");
        through_object_storage(&job_dir, idle, &classpath, dir.path(), merging)
    });

    let store = dir.path().join("store");
    let answers: Vec<serde_json::Value> = ok(ckptfs(&[
        "import-flink",
        ck.to_str().unwrap(),
        store.to_str().unwrap(),
        "--json",
    ]))
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    assert!(answers.len() >= 2, "{answers:?}");
    let last = answers.last().unwrap();
    assert!(
        last["bytes_uploaded"].as_u64().unwrap() * 2 < last["bytes"].as_u64().unwrap(),
        "the same state stored again: {last}"
    );
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mounted::at(&store, &mnt, &[]);
    let cp = imported_from(&mnt, idle, None);
    check_tree(&classpath, &mnt.join(format!("cp-{cp}")), 600, dir.path());
    let dest = dir.path().join("exported");
    let printed = ok(ckptfs(&[
        "export-flink",
        mnt.to_str().unwrap(),
        &cp.to_string(),
        dest.to_str().unwrap(),
    ]));
    m.umount();
    let chk = PathBuf::from(printed.trim());
    let (job_id, chk_name) = (
        chk.parent().unwrap().file_name().unwrap().to_owned(),
        chk.file_name().unwrap().to_str().unwrap().to_string(),
    );
    assert_relocatable(&dest.join(&job_id), &chk_name);
    if btrfs.is_some() {
        // From the store itself on btrfs: each file its object's clone (the mount's files
        // cannot be cloned), the export the job restores from below.
        std::fs::remove_dir_all(&dest).unwrap();
        ok(ckptfs(&[
            "export-flink",
            store.to_str().unwrap(),
            &cp.to_string(),
            dest.to_str().unwrap(),
        ]));
        assert_relocatable(&dest.join(&job_id), &chk_name);
        assert!(Command::new("sync").status().unwrap().success());
        let (total, exclusive) = crate::common::btrfs::usage(&dest);
        assert!(
            exclusive * 2 < total,
            "the export uses {exclusive} of its {total} bytes alone: not clones"
        );
    }
    // Moved elsewhere: the export names nothing by where it was written.
    let moved = dir.path().join("elsewhere/copy");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    std::fs::rename(&dest, &moved).unwrap();
    // On btrfs the job restores from the clones; else from the export the object store
    // made, when there is one.
    let chk = match from_s3.filter(|_| btrfs.is_none()) {
        Some(chk) => chk,
        None => moved.join(&job_id).join(&chk_name),
    };
    let mut args = vec!["--restore", chk.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut job = Job::start(&classpath, &dir.path().join("ck2"), 900, &args);
    job.checkpoint_with(900);
    assert_eq!(job.restored, Some(600), "the source starts where it was");
    job.kill();
    source
}

/// The job's directory `job_dir` put into a bucket of moto_server, imported from there into
/// a store in another bucket, read back through the mount (checkpoint `idle` holds 600
/// records), checked by fsck, and exported into the store's bucket; the export downloaded
/// under `scratch`, and its checkpoint directory returned. Each whole SST (every file
/// unless `merging`: then each is a segment of a shared file, downloaded by a ranged GET)
/// is copied by the object store: `bytes_copied` counts every byte of the job's `shared/`,
/// and no GET of one reads its data blocks (each is a ranged read of its footer and
/// properties, past its first byte).
fn through_object_storage(
    job_dir: &Path,
    idle: u64,
    classpath: &str,
    scratch: &Path,
    merging: bool,
) -> PathBuf {
    let moto = crate::common::moto::moto();
    let bucket = moto.bucket();
    let job_id = job_dir.file_name().unwrap().to_str().unwrap();
    put_tree(moto.port, &bucket, &format!("ck/{job_id}"), job_dir);
    let store_bucket = moto.bucket();
    let store = format!("s3://{store_bucket}/store");
    let state = scratch.join("state-s3");
    let src = format!("s3://{bucket}/ck/{job_id}");
    let proxy = crate::common::moto::HttpProxy::start(moto.port);
    let out = Command::new(crate::common::mounted::BIN)
        .args(["import-flink", &src, &store, "--json", "--state"])
        .arg(&state)
        .env(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", proxy.port),
        )
        .output()
        .unwrap();
    let copied: u64 = ok(out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|a| a["bytes_copied"].as_u64().unwrap_or(0))
        .sum();
    let gets = proxy.requests("GET", &format!("/ck/{job_id}/shared/"));
    if merging {
        assert_eq!(copied, 0, "segments are read, not copied");
    } else {
        let ssts = named_ssts(job_dir);
        let sst_bytes: u64 = ssts.values().sum();
        assert_eq!(
            copied, sst_bytes,
            "every SST copied by the object store: {ssts:?}"
        );
        // The requests for SSTs (other files under shared/ are read whole, as they must be).
        let of_ssts = |requests: Vec<(String, Vec<(String, String)>)>| -> Vec<_> {
            requests
                .into_iter()
                .filter(|(target, _)| {
                    ssts.keys()
                        .any(|p| p.ends_with(target.rsplit('/').next().unwrap()))
                })
                .collect()
        };
        let gets = of_ssts(gets);
        assert!(!gets.is_empty(), "each SST's properties are read");
        for (target, headers) in &gets {
            let range = headers
                .iter()
                .find(|(n, _)| n == "range")
                .map(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("GET {target} of the whole file"));
            let start: u64 = range
                .trim_start_matches("bytes=")
                .split('-')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(start > 0, "GET {target} {range} reads its data blocks");
        }
        let uploads = proxy.requests("PUT", "/store/objects/sha256-");
        assert!(!uploads.is_empty());
        for (target, headers) in &uploads {
            assert!(
                headers.iter().any(|(n, _)| n == "x-amz-copy-source"),
                "PUT {target} uploaded a copied object's bytes"
            );
        }
    }
    drop(proxy);
    let mnt = scratch.join("mnt-s3");
    std::fs::create_dir(&mnt).unwrap();
    let state_arg = state.to_str().unwrap();
    let m = Mounted::at(Path::new(&store), &mnt, &["--state", state_arg]);
    let cp = imported_from(&mnt, idle, None);
    check_tree(classpath, &mnt.join(format!("cp-{cp}")), 600, scratch);
    m.umount();
    for entry in std::fs::read_dir(scratch).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("out-")
        {
            std::fs::remove_dir_all(path).unwrap();
        }
    }
    ok(ckptfs(&["fsck", &store]));
    let remote = ckptfs_core::store::s3::Remote::connect(&store_bucket, "").unwrap();
    if !merging {
        // A copied object is checked by its SHA-256 like any other by its BLAKE3: one
        // changed byte and fsck names it.
        let (key, _, _) = remote
            .list_keys("store/objects/", false)
            .unwrap()
            .into_iter()
            .find(|(key, _, _)| key.starts_with("store/objects/sha256-"))
            .expect("a copied object");
        let good = remote.get_bytes(&key).unwrap();
        let mut bad = good.clone();
        bad[0] ^= 1;
        let put = |bytes: &[u8]| {
            remote
                .upload_from(&key, |out| {
                    std::io::Write::write_all(out, bytes).unwrap();
                    Ok(())
                })
                .unwrap()
        };
        put(&bad);
        let out = ckptfs(&["fsck", &store, "--json"]);
        assert!(!out.status.success());
        let id = key.rsplit('/').next().unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains(id), "{out:?}");
        put(&good);
        ok(ckptfs(&["fsck", &store]));
    }
    let exports = format!("s3://{store_bucket}/exports");
    let answer: serde_json::Value = serde_json::from_str(&ok(ckptfs(&[
        "export-flink",
        &store,
        &cp.to_string(),
        &exports,
        "--json",
    ])))
    .unwrap();
    assert!(answer["copied_in_store"].as_u64().unwrap() > 0, "{answer}");
    let down = scratch.join("export-s3");
    let mut chk = None;
    for (key, _, _) in remote.list_keys("exports/", false).unwrap() {
        let rel = key.strip_prefix("exports/").unwrap();
        let to = down.join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(&to, remote.get_bytes(&key).unwrap()).unwrap();
        if rel.ends_with("/_metadata") {
            chk = Some(to.parent().unwrap().to_path_buf());
        }
    }
    chk.expect("the export's _metadata")
}

/// Every SST file the completed checkpoints in `job_dir` name by path (not inline), once,
/// with its size.
fn named_ssts(job_dir: &Path) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(job_dir).unwrap() {
        let Ok(bytes) = std::fs::read(entry.unwrap().path().join("_metadata")) else {
            continue;
        };
        for op in metadata::parse(&bytes).unwrap().operators {
            for subtask in op.subtasks {
                if let Some(KeyedHandle::Incremental(h)) = subtask.managed_keyed {
                    for (name, handle) in h.shared.into_iter().chain(h.private) {
                        if let (true, StreamHandle::File { path, size, .. }) =
                            (name.ends_with(".sst"), handle)
                        {
                            out.insert(path, size);
                        }
                    }
                }
            }
        }
    }
    out
}

/// File merging (FLIP-306): every file of the job's checkpoints is a segment of a shared
/// physical file; each subtask's RocksDB files are taken out of their segments.
#[test]
fn a_file_merging_jobs_checkpoints_import_export_and_restore() {
    let source = import_export_restore(&["--file-merging", "true"], true, false);
    let segments = handles(&source)
        .iter()
        .filter(|h| matches!(h, StreamHandle::Segment { .. }))
        .count();
    assert!(
        segments > 10,
        "the job merged no files: {segments} segments"
    );
}

/// The ForSt backend (Flink 2's disaggregated state, a RocksDB fork): its checkpoints are
/// RocksDB files too. From object storage, its SSTs are copied by the object store.
#[test]
fn a_forst_jobs_checkpoints_import_export_and_restore() {
    let source = import_export_restore(&["--state-backend", "forst"], true, true);
    assert!(!handles(&source).is_empty());
}

/// Every file below `dir` put under `prefix` of `bucket`, as another program would.
fn put_tree(port: u16, bucket: &str, prefix: &str, dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let key = format!("{prefix}/{name}");
        if entry.file_type().unwrap().is_dir() {
            put_tree(port, bucket, &key, &entry.path());
        } else {
            let bytes = std::fs::read(entry.path()).unwrap();
            crate::common::moto::put_object(port, bucket, &key, &bytes);
        }
    }
}

/// The Flink fixture imported into a new store, `store/` under `dir` (its checkpoint 4 is the
/// store's checkpoint 1).
fn imported_fixture(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    ok(ckptfs(&[
        "import-flink",
        fixture().to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    store
}

/// `export-flink` to `s3://`: the fixture's checkpoint 4 exported to moto_server as a
/// relocatable job directory; its objects copied to a local directory restore a real job
/// (933 records, as the checkpoint held). An export into a prefix that holds anything is
/// refused, nothing written.
#[test]
fn an_export_to_object_storage_restores_once_copied() {
    let moto = crate::common::moto::moto();
    let bucket = moto.bucket();
    let dir = tempfile::tempdir().unwrap();
    let store = imported_fixture(dir.path());
    let url = format!("s3://{bucket}/exports/one");
    let printed = ok(ckptfs(&[
        "export-flink",
        store.to_str().unwrap(),
        "1",
        &url,
    ]));
    let job = "a312c9034e3e0d2016dae60431b4c9dc";
    assert_eq!(printed.trim(), format!("{url}/{job}/chk-4"));
    let again = ckptfs(&["export-flink", store.to_str().unwrap(), "1", &url]);
    assert!(!again.status.success());
    let e = String::from_utf8_lossy(&again.stderr);
    assert!(e.contains("not empty") || e.contains("empty"), "{e}");

    let remote = ckptfs_core::store::s3::Remote::connect(&bucket, "").unwrap();
    let keys = remote.list_keys("exports/one/", false).unwrap();
    assert!(keys.iter().any(|(k, _, _)| k.ends_with("/chk-4/_metadata")));
    let copy = dir.path().join("copy");
    for (key, _, _) in &keys {
        let to = copy.join(key.strip_prefix("exports/one/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        remote.download(key, &to, u64::MAX).unwrap().unwrap();
    }
    assert_relocatable(&copy.join(job), "chk-4");
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let chk = copy.join(job).join("chk-4");
    let mut flink = Job::start(
        &classpath,
        &dir.path().join("ck"),
        1000,
        &["--restore", chk.to_str().unwrap()],
    );
    flink.checkpoint_with(1000);
    assert_eq!(flink.restored, Some(933));
    flink.kill();
}

/// Every file below `dir`, by its `/`-separated path, with its bytes.
fn tree_files(dir: &Path, rel: &str, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
    for entry in std::fs::read_dir(dir.join(rel)).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if entry.file_type().unwrap().is_dir() {
            tree_files(dir, &path, out);
        } else {
            out.insert(path, std::fs::read(entry.path()).unwrap());
        }
    }
}

/// `export-flink` to `s3://` streams each file from the store into its upload: with no
/// usable temporary directory ($TMPDIR missing) it writes the very objects, byte for byte,
/// that an export to a directory writes as files. An object of the store that no longer
/// matches its checksum fails the export, and nothing is left under the prefix (the
/// files uploaded before the mismatch was found are removed, `_metadata` never sent).
#[test]
fn an_export_to_object_storage_streams_from_the_store_and_leaves_nothing_on_a_bad_object() {
    let moto = crate::common::moto::moto();
    let bucket = moto.bucket();
    let dir = tempfile::tempdir().unwrap();
    let store = imported_fixture(dir.path());
    let local = dir.path().join("local");
    ok(ckptfs(&[
        "export-flink",
        store.to_str().unwrap(),
        "1",
        local.to_str().unwrap(),
    ]));
    let mut expected = std::collections::BTreeMap::new();
    tree_files(&local, "", &mut expected);
    assert!(expected.len() > 5, "{:?}", expected.keys());

    // Through a proxy that counts the requests.
    let proxy = crate::common::moto::HttpProxy::start(moto.port);
    let export = |prefix: &str| {
        std::process::Command::new(crate::common::mounted::BIN)
            .args(["export-flink", store.to_str().unwrap(), "1"])
            .arg(format!("s3://{bucket}/{prefix}"))
            .env("TMPDIR", dir.path().join("no-such-directory"))
            .env(
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", proxy.port),
            )
            .output()
            .unwrap()
    };
    ok(export("streamed"));
    let remote = ckptfs_core::store::s3::Remote::connect(&bucket, "").unwrap();
    let keys = remote.list_keys("streamed/", false).unwrap();
    let mut got = std::collections::BTreeMap::new();
    for (key, _, _) in &keys {
        got.insert(
            key.strip_prefix("streamed/").unwrap().to_string(),
            remote.get_bytes(key).unwrap(),
        );
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (rel, bytes) in &expected {
        assert!(got[rel] == *bytes, "{rel} differs from the local export's");
    }

    // Every object the exported files are stored in, damaged (same size): the first one
    // read fails the export.
    let mut damaged = 0;
    for (rel, bytes) in &expected {
        if !rel.contains("/shared/") {
            continue;
        }
        let id = blake3::hash(bytes).to_hex().to_string();
        let object = store.join("objects").join(&id[..2]).join(&id);
        let mut content = std::fs::read(&object).unwrap();
        let last = content.len() - 1;
        content[last] ^= 0xff;
        std::fs::set_permissions(&object, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        std::fs::write(&object, &content).unwrap();
        damaged += 1;
    }
    assert!(damaged > 0);
    let out = export("damaged");
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("checksum"), "{e}");
    assert_eq!(remote.list_keys("damaged/", false).unwrap(), vec![]);
    // `_metadata` was never sent: at no moment did the prefix hold a checkpoint.
    assert_eq!(proxy.seen("PUT", "/damaged/"), 0, "a damaged file was sent");
    assert_eq!(proxy.seen("PUT", "/streamed/"), expected.len());
}

/// From a store on object storage into the same bucket, `export-flink` has the object store
/// copy each file stored whole (CopyObject from the store's object): not one GET of a
/// whole-file object goes through ckptfs, and the export holds, byte for byte, what an
/// export to a directory writes. Into another bucket of the same endpoint, the same.
#[test]
fn an_export_from_object_storage_into_its_endpoint_is_copied_by_the_object_store() {
    let moto = crate::common::moto::moto();
    let bucket = moto.bucket();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("s3://{bucket}/store");
    let state = dir.path().join("state");
    ok(ckptfs(&[
        "import-flink",
        fixture().to_str().unwrap(),
        &store,
        "--state",
        state.to_str().unwrap(),
    ]));
    let local = dir.path().join("local");
    ok(ckptfs(&[
        "export-flink",
        &store,
        "1",
        local.to_str().unwrap(),
    ]));
    let mut expected = std::collections::BTreeMap::new();
    tree_files(&local, "", &mut expected);

    let proxy = crate::common::moto::HttpProxy::start(moto.port);
    let export = |to: &str| -> serde_json::Value {
        let out = std::process::Command::new(crate::common::mounted::BIN)
            .args(["export-flink", &store, "1", to, "--json"])
            .env(
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", proxy.port),
            )
            .output()
            .unwrap();
        serde_json::from_str(&ok(out)).unwrap()
    };
    let copied = export(&format!("s3://{bucket}/exports"));
    let files = copied["files"].as_u64().unwrap();
    let in_store = copied["copied_in_store"].as_u64().unwrap();
    assert_eq!(files as usize, expected.len(), "{copied}");
    // Every file but `_metadata` (rewritten) and those stored as chunks.
    let shared = expected.keys().filter(|k| k.contains("/shared/")).count() as u64;
    assert!(in_store >= shared && shared > 0, "{copied}");
    let gets_copied = proxy.seen("GET", "/store/objects/");
    assert_eq!(proxy.seen("PUT", "/exports/"), files as usize);

    let remote = ckptfs_core::store::s3::Remote::connect(&bucket, "").unwrap();
    for (rel, bytes) in &expected {
        let got = remote.get_bytes(&format!("exports/{rel}")).unwrap();
        assert!(got == *bytes, "{rel} differs from the local export's");
    }

    assert_eq!(in_store as usize, expected.len() - 1, "{copied}");

    // Another bucket of the same endpoint: copied by the object store the same way (from
    // the store's bucket): the same objects read (those of files stored as chunks), none
    // more.
    let other = moto.bucket();
    let across = export(&format!("s3://{other}/exports"));
    assert_eq!(
        across["copied_in_store"], copied["copied_in_store"],
        "{across}"
    );
    assert_eq!(across["files"], copied["files"]);
    assert_eq!(
        proxy.seen("GET", "/store/objects/"),
        2 * gets_copied,
        "an object of a file stored whole was read"
    );
    let remote = ckptfs_core::store::s3::Remote::connect(&other, "").unwrap();
    for (rel, bytes) in &expected {
        let got = remote.get_bytes(&format!("exports/{rel}")).unwrap();
        assert!(got == *bytes, "{rel} differs from the local export's");
    }
}
