//! A checkpoint source is untrusted input (docs/security.md): whoever writes a Flink job's
//! checkpoint directory, a bucket prefix or an application's checkpoint directory chooses
//! every path and file in it, and ckptfs runs as root. Each test plays that writer: a
//! crafted `_metadata`, a link or FIFO swapped in, a file too large to read; each is
//! refused with the path and the rule, and nothing of what lies outside the source reaches
//! the store.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ckptfs_core::flink::metadata;

use crate::common::mounted::{ckptfs, ok, BIN};
use crate::common::run;
use crate::flink::{cp_a, file_handles, fixture};

/// A copy of the fixture job at `dir/job` and a secret file beside it, outside the job.
fn job_and_secret(dir: &Path) -> (PathBuf, PathBuf) {
    let job = dir.join("job");
    cp_a(&fixture(), &job);
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, SECRET).unwrap();
    (job, secret)
}

const SECRET: &[u8] = b"root:$y$j9T$not-for-a-checkpoint:19000:0:99999:7:::\n";

/// The first file handle (an SST in `shared/`) of a `_metadata`: its path's offset, its
/// path and declared size.
fn first_shared_file(bytes: &[u8]) -> (usize, String, u64) {
    file_handles(bytes)
        .into_iter()
        .next()
        .expect("the fixture names shared files")
}

/// `bytes` with the handle whose path is at `at` (a file handle: type 2, size, path)
/// replaced by a relative handle (type 6: path, then size) naming `path`.
fn as_relative(bytes: &[u8], at: usize, path: &str, size: u64) -> Vec<u8> {
    let old_len = u16::from_be_bytes([bytes[at], bytes[at + 1]]) as usize;
    let start = at - 9; // the type byte, then 8 bytes of size
    assert_eq!(bytes[start], 2);
    let mut out = bytes[..start].to_vec();
    out.push(6);
    out.extend_from_slice(&(path.len() as u16).to_be_bytes());
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(&(size as i64).to_be_bytes());
    out.extend_from_slice(&bytes[at + 2 + old_len..]);
    metadata::parse(&out).expect("still a valid _metadata");
    out
}

/// Import `src` into a new store at `store`: the output, which must be a failure.
fn import_fails(src: &Path, store: &Path) -> String {
    let out = ckptfs(&[
        "import-flink",
        src.to_str().unwrap(),
        store.to_str().unwrap(),
    ]);
    assert!(
        !out.status.success(),
        "imported: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Nothing under `store` holds `needle` (no object, no staging file, no log line).
fn nowhere_in(store: &Path, needle: &[u8]) {
    if !store.exists() {
        return;
    }
    let mut stack = vec![store.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let bytes = std::fs::read(entry.path()).unwrap();
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle),
                    "{} holds what was outside the source",
                    entry.path().display()
                );
            }
        }
    }
}

/// No checkpoint was committed into `store` (if it exists).
fn no_checkpoint_in(store: &Path) {
    if store.join("ckptfs.json").exists() {
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(&ok(ckptfs(&["ls", store.to_str().unwrap(), "--json"]))).unwrap();
        assert!(rows.is_empty(), "{rows:?}");
    }
}

/// A `_metadata` naming a host file, five ways, as the issue found them: each refused with
/// EACCES and the rule, the file never read into the store.
#[test]
fn a_crafted_metadata_never_reads_outside_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let (job, secret) = job_and_secret(dir.path());
    let metadata_path = job.join("chk-4/_metadata");
    let original = std::fs::read(&metadata_path).unwrap();
    let (at, _, _) = first_shared_file(&original);
    let secret_len = SECRET.len() as u64;
    let depth = "../".repeat(12);
    let secret_str = secret.to_str().unwrap();
    let crafted: Vec<(&str, Vec<u8>)> = vec![
        (
            "an absolute file: handle",
            pointed(&original, at, &format!("file:{secret_str}"), secret_len),
        ),
        (
            "the moved-job fallback climbing out of shared/",
            pointed(
                &original,
                at,
                &format!("file:/nonexistent/shared/{depth}{secret_str}"),
                secret_len,
            ),
        ),
        (
            "a path below the job that climbs back out",
            pointed(
                &original,
                at,
                &format!("file:{}/shared/{depth}{secret_str}", job.display()),
                secret_len,
            ),
        ),
        (
            "a relative handle",
            as_relative(
                &original,
                at,
                &format!("{depth}{}", secret_str.trim_start_matches('/')),
                secret_len,
            ),
        ),
        (
            "procfs, which stats as 0 bytes",
            pointed(&original, at, "file:/proc/self/cmdline", 0),
        ),
    ];
    for (what, bytes) in crafted {
        std::fs::write(&metadata_path, &bytes).unwrap();
        let store = dir.path().join(format!("store-{}", what.len()));
        let e = import_fails(&job, &store);
        assert!(
            e.contains("EACCES") && (e.contains("outside") || e.contains("plain names")),
            "{what}: {e}"
        );
        assert!(e.contains("refused"), "{what}: {e}");
        no_checkpoint_in(&store);
        nowhere_in(&store, SECRET);
    }
    // The same job, its _metadata as Flink wrote it, imports.
    std::fs::write(&metadata_path, &original).unwrap();
    let store = dir.path().join("store-good");
    let ids = ok(ckptfs(&[
        "import-flink",
        job.to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    assert_eq!(ids.lines().count(), 3, "{ids}");
}

/// `original` with the file handle whose path is at `at` naming `path` and declaring
/// `size` bytes (the size precedes the path).
fn pointed(original: &[u8], at: usize, path: &str, size: u64) -> Vec<u8> {
    let mut bytes = metadata::with_paths(original, vec![(at, path.to_string())]).unwrap();
    bytes[at - 8..at].copy_from_slice(&(size as i64).to_be_bytes());
    metadata::parse(&bytes).expect("still a valid _metadata");
    bytes
}

/// A `_metadata` that is a symbolic link is not followed, and what it points at is never
/// echoed (a follower copies errors into a world-readable status file).
#[test]
fn a_metadata_link_is_refused_and_its_target_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let (job, secret) = job_and_secret(dir.path());
    let metadata_path = job.join("chk-4/_metadata");
    std::fs::remove_file(&metadata_path).unwrap();
    std::os::unix::fs::symlink(&secret, &metadata_path).unwrap();
    let store = dir.path().join("store");
    let e = import_fails(&job, &store);
    assert!(e.contains("ELOOP") && e.contains("symbolic link"), "{e}");
    assert!(!e.contains("root") && !e.contains("726f6f74"), "{e}");
    // A _metadata that is not Flink's is refused without its bytes in the message.
    std::fs::remove_file(&metadata_path).unwrap();
    std::fs::write(&metadata_path, SECRET).unwrap();
    let e = import_fails(&job, &store);
    assert!(e.contains("not a Flink checkpoint's _metadata"), "{e}");
    assert!(!e.contains("726f6f74") && !e.contains("root:"), "{e}");
    no_checkpoint_in(&store);
}

/// A sparse 2 GiB `_metadata` is refused by its size, unread (it took 2.1 GB of memory).
#[test]
fn a_huge_metadata_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let (job, _) = job_and_secret(dir.path());
    let metadata_path = job.join("chk-4/_metadata");
    std::fs::File::create(&metadata_path)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let store = dir.path().join("store");
    let started = Instant::now();
    let e = import_fails(&job, &store);
    assert!(e.contains("more than the") && e.contains("EINVAL"), "{e}");
    // Reading 2 GiB of zeroes would take seconds at the least; refusing it takes none.
    assert!(started.elapsed() < Duration::from_secs(60));
    no_checkpoint_in(&store);
}

/// A Flink source in a bucket reads keys under its prefix only: a handle naming another
/// prefix of the same bucket (another tenant's) is refused, never fetched.
#[test]
fn an_s3_source_reads_no_key_outside_its_prefix() {
    let moto = crate::common::moto::moto();
    let bucket = moto.bucket();
    let prefix = "tenant-a/flink/a312c9034e3e0d2016dae60431b4c9dc";
    let put = |key: &str, bytes: &[u8]| {
        crate::common::moto::put_object(moto.port, &bucket, key, bytes);
    };
    put("tenant-b/secret.txt", SECRET);
    for entry in std::fs::read_dir(fixture().join("shared")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        put(
            &format!("{prefix}/shared/{name}"),
            &std::fs::read(entry.path()).unwrap(),
        );
    }
    let original = std::fs::read(fixture().join("chk-4/_metadata")).unwrap();
    let (at, _, _) = first_shared_file(&original);
    let bytes = pointed(
        &original,
        at,
        &format!("s3://{bucket}/tenant-b/secret.txt"),
        SECRET.len() as u64,
    );
    put(&format!("{prefix}/chk-4/_metadata"), &bytes);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let src = format!("s3://{bucket}/tenant-a/flink");
    let proxy = crate::common::moto::HttpProxy::start(moto.port);
    let out = Command::new(BIN)
        .args(["import-flink", &src, store.to_str().unwrap()])
        .env(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", proxy.port),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("outside the source") && e.contains("EACCES"),
        "{e}"
    );
    assert_eq!(
        proxy.seen("GET", "tenant-b"),
        0,
        "the other prefix was read"
    );
    assert_eq!(
        proxy.seen("HEAD", "tenant-b"),
        0,
        "the other prefix was looked up"
    );
    no_checkpoint_in(&store);
    nowhere_in(&store, SECRET);

    // A file of its own prefix larger than its handle says: the download stops there.
    let other = "tenant-c/flink/a312c9034e3e0d2016dae60431b4c9dc";
    for entry in std::fs::read_dir(fixture().join("shared")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        put(
            &format!("{other}/shared/{name}"),
            &std::fs::read(entry.path()).unwrap(),
        );
    }
    let (_, path, _) = first_shared_file(&original);
    let uuid = path.rsplit('/').next().unwrap();
    let bytes = pointed(
        &original,
        at,
        &format!("s3://{bucket}/{other}/shared/{uuid}"),
        10,
    );
    put(&format!("{other}/chk-4/_metadata"), &bytes);
    let out = Command::new(BIN)
        .args([
            "import-flink",
            &format!("s3://{bucket}/tenant-c/flink"),
            store.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("more than the 10 bytes its handle says"), "{e}");
    no_checkpoint_in(&store);
}

/// `ckptfs import` of `db` into a new store beside it, with `env`: its exit status and
/// stderr, failing the test if it runs past a minute (a FIFO opened for reading blocks
/// until a writer comes).
fn import_within_a_minute(db: &Path, env: &[(&str, &str)], during: impl FnOnce()) -> String {
    let store = db.with_extension("store");
    let mut child = Command::new(BIN)
        .args([
            "import",
            store.to_str().unwrap(),
            &format!("app/0={}", db.display()),
        ])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    during();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the import hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    assert!(!status.success(), "imported");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A FIFO in an imported directory, there when it is listed or swapped in for an SST after
/// the listing (held there by a failpoint), fails the import at once with the reason: it
/// is never opened for reading, which would block until a writer came.
#[test]
fn a_fifo_in_an_imported_directory_never_hangs_the_import() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    make_checkpoint_dir(&db);
    let fifo = db.join("000099.sst");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let e = import_within_a_minute(&db, &[], || {});
    assert!(e.contains("a FIFO") && e.contains("EINVAL"), "{e}");
    std::fs::remove_file(&fifo).unwrap();

    #[cfg(feature = "failpoints")]
    {
        let sst = db.join(ssts_of(&db).pop().unwrap());
        let e = import_within_a_minute(
            &db,
            &[("FAILPOINTS", "import::after-listing=1*sleep(3000)")],
            || {
                std::thread::sleep(Duration::from_millis(700));
                std::fs::remove_file(&sst).unwrap();
                nix::unistd::mkfifo(&sst, nix::sys::stat::Mode::S_IRWXU).unwrap();
            },
        );
        assert!(e.contains("a FIFO") && e.contains("EINVAL"), "{e}");
    }
}

/// A RocksDB checkpoint directory made with the rocksdb crate.
fn make_checkpoint_dir(to: &Path) {
    let src = to.with_extension("src");
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    let db = rocksdb::DB::open(&options, &src).unwrap();
    db.put(b"k", b"v").unwrap();
    db.flush().unwrap();
    rocksdb::checkpoint::Checkpoint::new(&db)
        .unwrap()
        .create_checkpoint(to)
        .unwrap();
}

/// What an import stores is the file listed, whatever is swapped in at its path after the
/// listing: a link to a host file put in its place (and the original renamed back after)
/// changes nothing that is read.
#[test]
fn a_link_swapped_in_after_the_listing_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    make_checkpoint_dir(&db);
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, SECRET).unwrap();
    let backend: ckptfs_core::BackendName = "app/0".parse().unwrap();
    let scanned = ckptfs_core::import::scan(&backend, &db).unwrap();
    let name = scanned
        .files
        .iter()
        .find(|f| f.name.ends_with(".sst"))
        .unwrap()
        .name
        .clone();
    let original = std::fs::read(db.join(&name)).unwrap();
    // The swap: the SST renamed away, a link to the secret in its place.
    let aside = db.join("aside");
    std::fs::rename(db.join(&name), &aside).unwrap();
    std::os::unix::fs::symlink(&secret, db.join(&name)).unwrap();
    let store = dir.path().join("store");
    let engine = ckptfs_core::Engine::open(ckptfs_core::EngineConfig::new(&store)).unwrap();
    let manifest = engine
        .begin(ckptfs_core::CheckpointPlan::Import(vec![scanned]))
        .unwrap()
        .complete()
        .unwrap();
    // The original renamed back, as the attacker would, before anyone looks.
    std::fs::remove_file(db.join(&name)).unwrap();
    std::fs::rename(&aside, db.join(&name)).unwrap();
    drop(engine);
    let out = dir.path().join("restored");
    ok(ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        &manifest.id.to_string(),
        out.to_str().unwrap(),
    ]));
    let restored = std::fs::read(out.join("app/0").join(&name)).unwrap();
    assert_eq!(restored, original);
    nowhere_in(&store, SECRET);
}

/// Every file handle of `bytes` pointed at `dir/shared/<its last name>`.
fn shared_files_under(bytes: &[u8], dir: &Path) -> Vec<u8> {
    let paths: Vec<(usize, String)> = file_handles(bytes)
        .into_iter()
        .map(|(at, path, _)| {
            let uuid = path.rsplit('/').next().unwrap();
            (at, format!("file:{}/shared/{uuid}", dir.display()))
        })
        .collect();
    assert!(!paths.is_empty());
    metadata::with_paths(bytes, paths).unwrap()
}

/// A job restored in CLAIM mode names the files of the job it was restored from, in that
/// job's directory: refused (outside the source) until that directory is named as a root
/// too, then imported with the same bytes.
#[test]
fn a_job_restored_in_claim_mode_imports_when_its_roots_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old-job");
    cp_a(&fixture(), &old);
    let new = dir.path().join("new-job");
    for n in [4, 5, 6] {
        let chk = new.join(format!("chk-{n}"));
        std::fs::create_dir_all(&chk).unwrap();
        let bytes = std::fs::read(fixture().join(format!("chk-{n}/_metadata"))).unwrap();
        std::fs::write(chk.join("_metadata"), shared_files_under(&bytes, &old)).unwrap();
    }
    let store = dir.path().join("store");
    let e = import_fails(&new, &store);
    assert!(
        e.contains("outside the source") && e.contains("--source-root"),
        "{e}"
    );
    no_checkpoint_in(&store);
    let ids = ok(ckptfs(&[
        "import-flink",
        new.to_str().unwrap(),
        store.to_str().unwrap(),
        "--source-root",
        old.to_str().unwrap(),
    ]));
    assert_eq!(ids.lines().count(), 3, "{ids}");
    // The bytes are those of the old job's files.
    let out = dir.path().join("restored");
    ok(ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        "3",
        out.to_str().unwrap(),
    ]));
    let counter = out.join("counter/0");
    let mut compared = 0;
    for entry in std::fs::read_dir(&counter).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        // Small SSTs are inlined into _metadata; the others come from old-job/shared/.
        if name.ends_with(".sst") {
            let bytes = std::fs::read(entry.path()).unwrap();
            let from_old = std::fs::read_dir(old.join("shared"))
                .unwrap()
                .any(|f| std::fs::read(f.unwrap().path()).unwrap() == bytes);
            compared += usize::from(from_old);
        }
    }
    assert!(compared > 0, "no SST of the old job's shared/ restored");
}

/// A RocksDB database at `dir` holding 200 keys whose values are `fill` repeated,
/// uncompressed and flushed once: two of them with different fills have SSTs of one size.
fn database(dir: &Path, fill: u8) {
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    options.set_compression_type(rocksdb::DBCompressionType::None);
    let db = rocksdb::DB::open(&options, dir).unwrap();
    for i in 0..200 {
        db.put(format!("key{i:04}"), vec![fill; 100]).unwrap();
    }
    db.flush().unwrap();
}

/// The SSTs of a directory, by name.
fn ssts_of(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".sst"))
        .collect();
    names.sort();
    names
}

/// Device, inode, size and mtime do not identify an SST's content: one rewritten in place
/// with another's bytes of the same size and its mtime set back (what `cp -p`, `rsync -t`
/// and restores from backup leave) is read again on the next import, and the store keeps
/// the new bytes, because its identity (database, session, file number) differs.
#[test]
fn an_sst_rewritten_in_place_with_its_stamp_kept_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    database(&a, b'a');
    database(&b, b'b');
    let store = dir.path().join("store");
    let import = || {
        ok(ckptfs(&[
            "import",
            store.to_str().unwrap(),
            &format!("app/0={}", a.display()),
            "--json",
        ]))
    };
    import();
    let name = ssts_of(&a).pop().unwrap();
    assert_eq!(
        ssts_of(&b).pop().unwrap(),
        name,
        "both databases number it alike"
    );
    let (in_a, in_b) = (a.join(&name), b.join(&name));
    let (before, other) = (std::fs::read(&in_a).unwrap(), std::fs::read(&in_b).unwrap());
    assert_eq!(before.len(), other.len(), "the two SSTs have one size");
    assert_ne!(before, other);
    // Rewritten in place (the same inode), its mtime set back.
    let meta = std::fs::metadata(&in_a).unwrap();
    let mtime = meta.modified().unwrap();
    std::fs::write(&in_a, &other).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&in_a)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    use std::os::unix::fs::MetadataExt;
    let after = std::fs::metadata(&in_a).unwrap();
    assert_eq!(
        (after.ino(), after.size(), after.mtime(), after.mtime_nsec()),
        (meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec()),
        "the stamp is what it was"
    );
    let second: serde_json::Value = serde_json::from_str(&import()).unwrap();
    let report = &second["imports"][0];
    // Every file read, the SST among them (the first import's stamp would have kept it).
    assert_eq!(
        report["files_read"], report["files"],
        "the SST was not read again: {report}"
    );
    let out = dir.path().join("restored");
    ok(ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        &second["id"].to_string(),
        out.to_str().unwrap(),
    ]));
    assert_eq!(std::fs::read(out.join("app/0").join(&name)).unwrap(), other);

    // Unchanged, the next import re-references it without reading it.
    let third: serde_json::Value = serde_json::from_str(&import()).unwrap();
    let report = &third["imports"][0];
    assert_eq!(
        report["files_read"].as_u64().unwrap() + 1,
        report["files"].as_u64().unwrap(),
        "the unchanged SST was read again: {report}"
    );
    assert!(
        report["bytes_read"].as_u64().unwrap() + other.len() as u64
            <= report["bytes"].as_u64().unwrap(),
        "{report}"
    );
}

/// The names of the files in `shared/` that checkpoint `n`'s `_metadata` names.
fn shared_names(n: u32) -> Vec<String> {
    let bytes = std::fs::read(fixture().join(format!("chk-{n}/_metadata"))).unwrap();
    file_handles(&bytes)
        .into_iter()
        .map(|(_, path, _)| path.rsplit('/').next().unwrap().to_string())
        .collect()
}

/// An `import-flink` that fails part way says what it committed and what it did not: the
/// ids of the checkpoints imported before the failure on stdout (and in `--json`, then a
/// line for the failure), the failed Flink checkpoint on stderr.
#[test]
fn a_partial_flink_import_says_what_it_committed() {
    let dir = tempfile::tempdir().unwrap();
    let job = job_failing_at_6(dir.path());
    let store = dir.path().join("store");
    let out = ckptfs(&[
        "import-flink",
        job.to_str().unwrap(),
        store.to_str().unwrap(),
        "--json",
    ]);
    assert!(!out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["id"], 1);
    assert_eq!(lines[1]["id"], 2);
    assert_eq!(lines[2]["ok"], false);
    assert_eq!(lines[2]["flink"]["checkpoint"], 6);
    // The file is neither where Flink wrote it (outside this copy) nor in its shared/.
    assert_eq!(lines[2]["errno"], libc::EACCES);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("checkpoint 6 of Flink job")
            && e.contains("Flink checkpoints 4, 5 as checkpoints 1, 2"),
        "{e}"
    );
}

/// The job of [`a_partial_flink_import_says_what_it_committed`] at `dir/job`: checkpoint 6
/// misses a file of its own.
fn job_failing_at_6(dir: &Path) -> PathBuf {
    let job = dir.join("job");
    cp_a(&fixture(), &job);
    let earlier: Vec<String> = shared_names(4).into_iter().chain(shared_names(5)).collect();
    let only_in_6 = shared_names(6)
        .into_iter()
        .find(|n| !earlier.contains(n))
        .expect("checkpoint 6 uploads a file of its own");
    std::fs::remove_file(job.join("shared").join(&only_in_6)).unwrap();
    job
}

/// Through a mount, the same partial failure is described as without one (one rule, in
/// `control::import_flink`): the control line's answer has the errno of the cause and
/// names the failed Flink checkpoint and what was imported before it, and so does the
/// command's error; a failure with nothing imported before it names its checkpoint too.
#[test]
fn a_partial_flink_import_through_a_mount_says_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let job = job_failing_at_6(dir.path());
    let m = crate::common::mounted::Mounted::new(&[]);
    let mut ctl = crate::common::mounted::Ctl::open(&m);
    ctl.send(&format!("import-flink {}\n", job.display()))
        .unwrap();
    let answer = ctl.answer();
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["errno"], libc::EACCES, "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.starts_with("checkpoint 6 of Flink job ")
            && message.contains(
                " was not imported (imported before it: Flink checkpoints 4, 5 as \
                 checkpoints 1, 2): "
            ),
        "{message}"
    );
    drop(ctl);
    // Checkpoint 6 again, now with nothing imported before it.
    let out = ckptfs(&[
        "import-flink",
        job.to_str().unwrap(),
        m.mnt.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("checkpoint 6 of Flink job ")
            && e.contains(" was not imported (nothing was imported): "),
        "{e}"
    );
    m.umount();
}

/// The follower and a control-line `import-flink` of the same job never both import one
/// Flink checkpoint: the follower looks, then is held (failpoint) while the control line
/// imports everything; when it goes on it finds the checkpoint held, in the checkpoint
/// slot, and imports nothing.
#[cfg(feature = "failpoints")]
#[test]
fn the_follower_and_a_control_line_never_import_one_checkpoint_twice() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("a312c9034e3e0d2016dae60431b4c9dc");
    cp_a(&fixture(), &job);
    let m = crate::common::mounted::Mounted::with_env(
        &["--flink", job.to_str().unwrap()],
        &[("FAILPOINTS", "flink::before-begin=1*sleep(4000)")],
    );
    // The follower's first look reaches the failpoint and waits there.
    std::thread::sleep(Duration::from_millis(1500));
    let ids = ok(ckptfs(&[
        "import-flink",
        job.to_str().unwrap(),
        m.mnt.to_str().unwrap(),
    ]));
    assert_eq!(ids.lines().count(), 3, "{ids}");
    // The follower wakes and looks again (every second).
    std::thread::sleep(Duration::from_secs(5));
    let labels: Vec<u64> = std::fs::read_to_string(m.mnt.join(".ckptfs/checkpoints"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["flink"]["checkpoint"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(labels, [4, 5, 6]);
    m.umount();
}

/// A store holding the fixture job's three checkpoints (ids 1 to 3), made in `dir`.
fn store_with_the_fixture(dir: &Path) -> PathBuf {
    let job = dir.join("job");
    cp_a(&fixture(), &job);
    let store = dir.join("store");
    ok(ckptfs(&[
        "import-flink",
        job.to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    store
}

/// The regular files below `dir`, at any depth.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out
}

/// `export-flink` into a directory another user owns gives that user the files (Flink runs
/// as its own user and must read them): the user reads them, which root's 0600 files
/// forbade.
#[test]
fn an_export_belongs_to_the_owner_of_its_destination() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = store_with_the_fixture(dir.path());
    let home = dir.path().join("flink-home");
    std::fs::create_dir(&home).unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    nix::unistd::chown(&home, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let dest = home.join("restore");
    let printed = ok(ckptfs(&[
        "export-flink",
        store.to_str().unwrap(),
        "3",
        dest.to_str().unwrap(),
    ]));
    let files = files_below(&dest);
    assert!(files.len() > 4, "{files:?}");
    for file in &files {
        assert_eq!(
            std::fs::metadata(file).unwrap().uid(),
            nobody.uid.as_raw(),
            "{file:?}"
        );
    }
    let metadata = PathBuf::from(printed.trim()).join("_metadata");
    let read = Command::new("runuser")
        .args(["-u", "nobody", "--", "cat"])
        .arg(&metadata)
        .output()
        .unwrap();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(read.stdout, std::fs::read(&metadata).unwrap());
}

/// `export-flink` writes through a descriptor of its temporary directory: another user who
/// can write DEST's parent (not sticky) renames that directory during the copy and plants a
/// link to a directory of their choice under its name; nothing is written there, and the
/// export fails naming what changed, leaving nothing at DEST.
#[cfg(feature = "failpoints")]
#[test]
fn an_export_is_never_redirected_by_a_link_planted_in_its_place() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_the_fixture(dir.path());
    let parent = dir.path().join("open-to-all");
    std::fs::create_dir(&parent).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let dest = parent.join("restore");
    let child = Command::new(BIN)
        .args([
            "export-flink",
            store.to_str().unwrap(),
            "3",
            dest.to_str().unwrap(),
        ])
        .env("FAILPOINTS", "export::before-copy=1*sleep(3000)")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let tmp = std::fs::read_dir(&parent)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".ckptfs-export-")
        })
        .expect("the export's temporary directory, to swap");
    std::fs::rename(&tmp, parent.join("moved-away")).unwrap();
    std::os::unix::fs::symlink(&victim, &tmp).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("changed during the export"), "{e}");
    assert_eq!(files_below(&victim), Vec::<PathBuf>::new());
    assert!(
        std::fs::symlink_metadata(&dest).is_err(),
        "something at DEST"
    );
    assert_eq!(
        files_below(&parent.join("moved-away")),
        Vec::<PathBuf>::new()
    );
}

/// `export-flink DEST` resolves DEST as a source's root is (docs/security.md): the Flink
/// user, who owns a directory on DEST's path, replaces a directory in it with a link to a
/// directory only root may write; root's export through it is refused (EACCES, naming the
/// link) and writes nothing there. A link only root could have put there is followed.
#[test]
fn an_export_follows_no_link_another_user_planted_on_its_path() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = store_with_the_fixture(dir.path());
    let root_only = dir.path().join("root-only");
    std::fs::create_dir(&root_only).unwrap();
    let home = dir.path().join("flink-home");
    std::fs::create_dir(&home).unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    nix::unistd::chown(&home, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let link = home.join("restores");
    let planted = Command::new("runuser")
        .args(["-u", "nobody", "--", "ln", "-s"])
        .arg(&root_only)
        .arg(&link)
        .output()
        .unwrap();
    assert!(
        planted.status.success(),
        "{}",
        String::from_utf8_lossy(&planted.stderr)
    );
    assert_eq!(
        std::fs::symlink_metadata(&link).unwrap().uid(),
        nobody.uid.as_raw()
    );
    let export = |dest: &Path| {
        ckptfs(&[
            "export-flink",
            store.to_str().unwrap(),
            "3",
            dest.to_str().unwrap(),
        ])
    };
    // Below the link, and the link itself as DEST.
    for dest in [link.join("chk-6"), link.clone()] {
        let out = export(&dest);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "exported to {}", dest.display());
        assert!(e.contains("EACCES") && e.contains("restores"), "{e}");
        assert_eq!(
            std::fs::read_dir(&root_only).unwrap().count(),
            0,
            "written through the link"
        );
    }
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // The same link where only root can have put it is followed, as on a source's path.
    let roots = dir.path().join("root-links");
    std::fs::create_dir(&roots).unwrap();
    std::os::unix::fs::symlink(&root_only, roots.join("restores")).unwrap();
    let printed = ok(export(&roots.join("restores/chk-6")));
    let written = std::fs::canonicalize(&root_only).unwrap().join("chk-6");
    assert!(
        PathBuf::from(printed.trim()).starts_with(&written),
        "{printed}"
    );
    let files = files_below(&written);
    assert!(files.len() > 4, "{files:?}");
    assert!(files
        .iter()
        .all(|f| std::fs::metadata(f).unwrap().uid() == 0));
}

/// A database a running RocksDB holds open on a btrfs subvolume is refused like anywhere
/// else: its LOCK's device in `/proc/locks` is not the file's `st_dev` there.
#[test]
fn a_live_database_on_a_btrfs_subvolume_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let fs = crate::common::btrfs::Btrfs::new(256 << 20);
    let sub = fs.mnt.join("sub");
    run("btrfs", &["subvolume", "create", sub.to_str().unwrap()]);
    let db_dir = sub.join("db");
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    let db = rocksdb::DB::open(&options, &db_dir).unwrap();
    db.put(b"k", b"v").unwrap();
    db.flush().unwrap();
    // The case this is about: the two devices differ.
    let st_dev = std::fs::metadata(db_dir.join("LOCK")).unwrap().dev();
    let ino = std::fs::metadata(db_dir.join("LOCK")).unwrap().ino();
    let listed = std::fs::read_to_string("/proc/locks").unwrap();
    let line = listed
        .lines()
        .find(|l| l.contains(&format!(":{ino} ")))
        .expect("RocksDB's lock is listed");
    let shown = format!("{:02x}:{:02x}:", libc::major(st_dev), libc::minor(st_dev));
    assert!(
        !line.contains(&shown),
        "st_dev is the listed device: {line}"
    );
    let backend: ckptfs_core::BackendName = "app/0".parse().unwrap();
    let e = ckptfs_core::import::scan(&backend, &db_dir)
        .unwrap_err()
        .to_string();
    assert!(e.contains("open in a running RocksDB"), "{e}");
    drop(db);
    ckptfs_core::import::scan(&backend, &db_dir).unwrap();
}

/// What an import process read and wrote (`rchar` and `wchar` of `/proc/PID/io`), read by
/// its shell, which reaps it (Linux adds a reaped child's I/O to its parent's); the import
/// must succeed.
fn io_of_import(src: &Path, store: &Path) -> (u64, u64) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#""$0" import-flink "$1" "$2" >/dev/null && cat /proc/$$/io"#)
        .arg(BIN)
        .arg(src)
        .arg(store)
        .output()
        .unwrap();
    let io = ok(out);
    let field = |name: &str| -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    (field("rchar:"), field("wchar:"))
}

/// A crafted `_metadata` whose every SST handle names one 16 MiB file, as a plain file
/// handle or as the same segment of it (file merging), is imported by copying that file
/// once: what the import reads and writes (staging and store) stays near the file's
/// bytes, not the number of handles times them (the review's 40 handles to one file
/// filled a 320 MiB store).
#[test]
fn one_file_named_by_many_handles_is_copied_once() {
    use ckptfs_core::flink::metadata::{KeyedHandle, StreamHandle};
    const BIG: u64 = 16 << 20;
    for as_segments in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("job");
        cp_a(&fixture(), &job);
        let big = job.join("shared/big");
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let bytes: Vec<u8> = (0..BIG / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        std::fs::write(&big, bytes).unwrap();
        let uri = format!("file:{}", big.display());
        // chk-4 alone (a job of one checkpoint), its SSTs all pointed at `big`.
        for n in [5, 6] {
            std::fs::remove_dir_all(job.join(format!("chk-{n}"))).unwrap();
        }
        let path = job.join("chk-4/_metadata");
        let original = std::fs::read(&path).unwrap();
        let mut edits = Vec::new();
        for op in metadata::parse(&original).unwrap().operators {
            for subtask in op.subtasks {
                if let Some(KeyedHandle::Incremental(h)) = subtask.managed_keyed {
                    for (name, stream) in h.shared.into_iter().chain(h.private) {
                        if let (true, StreamHandle::File { span, .. }) =
                            (name.ends_with(".sst"), stream)
                        {
                            let handle = if as_segments {
                                let mut h = vec![15u8];
                                h.extend_from_slice(&0i64.to_be_bytes());
                                h.extend_from_slice(&(BIG as i64).to_be_bytes());
                                h.extend_from_slice(&0i32.to_be_bytes());
                                for s in [uri.as_str(), "logical"] {
                                    h.extend_from_slice(&(s.len() as u16).to_be_bytes());
                                    h.extend_from_slice(s.as_bytes());
                                }
                                h
                            } else {
                                metadata::file_handle(&uri, BIG).unwrap()
                            };
                            edits.push((span, handle));
                        }
                    }
                }
            }
        }
        let handles = edits.len() as u64;
        assert!(handles >= 4, "the fixture's chk-4 names {handles} SSTs");
        std::fs::write(&path, metadata::rewrite(&original, edits).unwrap()).unwrap();
        let store = dir.path().join("store");
        let (read, written) = io_of_import(&job, &store);
        // Once into the store; a segment first out of its file into staging.
        let copies = if as_segments { 2 } else { 1 };
        assert!(
            read < (copies + 1) * BIG && written < (copies + 1) * BIG,
            "an import of {handles} handles to one {BIG}-byte file read {read} and wrote \
             {written} bytes (as segments: {as_segments})"
        );
        // Every name the handles gave is there, with the file's bytes.
        let restored = dir.path().join("restored");
        ok(ckptfs(&[
            "restore",
            store.to_str().unwrap(),
            "1",
            restored.to_str().unwrap(),
        ]));
        let big_bytes = std::fs::read(&big).unwrap();
        let mut named = 0;
        for file in files_below(&restored) {
            if std::fs::metadata(&file).unwrap().len() == BIG {
                assert_eq!(
                    std::fs::read(&file).unwrap(),
                    big_bytes,
                    "{}",
                    file.display()
                );
                named += 1;
            }
        }
        assert_eq!(named, handles, "{as_segments}");
    }
}
