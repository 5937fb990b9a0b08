//! The S3 front door (`serve --s3-listen`, `mount --s3-listen`) read by real clients: the
//! AWS CLI (Debian's `awscli`), boto3 and rclone (Debian's), against a store holding
//! hosted checkpoints (the workload's), a pin and a Flink checkpoint (the fixture's job,
//! imported). What they copy equals `ckptfs restore` byte for byte; every write is refused
//! with nothing changed; unsigned and badly signed requests are refused; a damaged object
//! is never served as good.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::mounted::{ckptfs, ok, BIN};

const ACCESS_KEY: &str = "door-key";
const SECRET_KEY: &str = "door-secret-0123456789";
/// The Flink fixture's job.
const JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";

/// A store of `rounds` hosted checkpoints (about ten files each), the Flink fixture's
/// checkpoints imported after them, and the first hosted one pinned as `first`.
fn store(dir: &Path, rounds: u32) -> PathBuf {
    let store = dir.join("store");
    ok(ckptfs(&[
        "workload",
        store.to_str().unwrap(),
        "--rounds",
        &rounds.to_string(),
        "--keys",
        "300",
        "--retain",
        "1000",
    ]));
    ok(ckptfs(&[
        "import-flink",
        crate::flink::fixture().to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    ok(ckptfs(&["pin", store.to_str().unwrap(), "1", "first"]));
    store
}

/// The retained checkpoints: id, files and whether it came from Flink.
fn checkpoints(store: &Path) -> Vec<(u64, u64, bool)> {
    ok(ckptfs(&["ls", store.to_str().unwrap(), "--json"]))
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .flat_map(|v| match v {
            serde_json::Value::Array(rows) => rows,
            row => vec![row],
        })
        .map(|c| {
            (
                c["id"].as_u64().unwrap(),
                c["files"].as_u64().unwrap(),
                !c["flink"].is_null(),
            )
        })
        .collect()
}

/// A daemon serving a store with the door, stopped when dropped.
struct Door {
    child: Option<Child>,
    port: u16,
}

impl Door {
    /// `ckptfs serve STORE --s3-listen 127.0.0.1:PORT EXTRA...` with the test's key in the
    /// environment; waits until the door answers.
    fn serve(store: &Path, extra: &[&str]) -> Door {
        let port = crate::common::moto::free_port();
        let mut command = Command::new(BIN);
        command
            .args(["serve", store.to_str().unwrap(), "--s3-listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .env("CKPTFS_S3_ACCESS_KEY_ID", ACCESS_KEY)
            .env("CKPTFS_S3_SECRET_ACCESS_KEY", SECRET_KEY);
        Door::start(command, port)
    }

    fn start(mut command: Command, port: u16) -> Door {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut door = Door {
            child: Some(child),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = door.child.as_mut().unwrap().try_wait().unwrap() {
                let out = door.child.take().unwrap().wait_with_output().unwrap();
                panic!(
                    "serve exited with {status}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(Instant::now() < deadline, "the door never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        door
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `aws --endpoint-url ... ARGS` (Debian's AWS CLI) with `secret`, or unsigned.
    fn aws_as(&self, secret: Option<&str>, args: &[&str]) -> Output {
        let mut command = Command::new("/usr/bin/aws");
        command
            .arg("--endpoint-url")
            .arg(self.endpoint())
            .args(args)
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
        match secret {
            Some(secret) => command
                .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
                .env("AWS_SECRET_ACCESS_KEY", secret),
            None => command
                .env_remove("AWS_ACCESS_KEY_ID")
                .env_remove("AWS_SECRET_ACCESS_KEY")
                .arg("--no-sign-request"),
        };
        command.output().expect("aws (Debian's awscli)")
    }

    fn aws(&self, args: &[&str]) -> Output {
        self.aws_as(Some(SECRET_KEY), args)
    }

    /// Stop it (SIGTERM): what it logged.
    fn stop(&mut self) -> String {
        let child = self.child.take().unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
        }
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `ckptfs restore STORE N DEST`.
fn restore(store: &Path, id: u64, dest: &Path) {
    ok(ckptfs(&[
        "restore",
        store.to_str().unwrap(),
        &id.to_string(),
        dest.to_str().unwrap(),
    ]));
}

/// Every file below `dir` by path relative to it, with its bytes.
fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(dir: &Path, rel: &str, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path(), &rel, out);
            } else {
                out.insert(rel, std::fs::read(entry.path()).unwrap());
            }
        }
    }
    let mut out = Default::default();
    walk(dir, "", &mut out);
    out
}

/// Two trees of files are the same (said by name, not by dumping bytes).
fn same(
    got: &std::collections::BTreeMap<String, Vec<u8>>,
    want: &std::collections::BTreeMap<String, Vec<u8>>,
    what: &str,
) {
    let names =
        |m: &std::collections::BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{what}");
    for (name, bytes) in want {
        assert!(got[name] == *bytes, "{what}: {name} differs");
    }
}

/// What the store looks like to its own tools: `ls` and `fsck`.
fn store_state(store: &Path) -> (String, String) {
    let s = store.to_str().unwrap();
    (ok(ckptfs(&["ls", s])), ok(ckptfs(&["fsck", s])))
}

/// The AWS CLI lists the bucket as the mount shows the store, and `s3 cp --recursive` and
/// `s3 sync` of a hosted checkpoint, of its pin and of the Flink checkpoint give exactly
/// what `ckptfs restore` writes (the Flink one with the relocatable `_metadata` on top);
/// every write is refused (AccessDenied) and changes nothing.
#[test]
fn the_aws_cli_copies_and_syncs_checkpoints_as_restore_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 3);
    let cps = checkpoints(&store);
    // The newest Flink checkpoint: the fixture's chk-6.
    let flink_cp = cps.iter().rfind(|c| c.2).unwrap().0;
    let before = store_state(&store);
    let door = Door::serve(&store, &[]);

    let top = ok(door.aws(&["s3", "ls", "s3://ckptfs/"]));
    let mut want: Vec<String> = cps.iter().map(|c| format!("cp-{}/", c.0)).collect();
    want.extend(["flink/".to_string(), "pinned/".to_string()]);
    let mut listed: Vec<String> = top
        .lines()
        .map(|l| l.trim().strip_prefix("PRE ").unwrap().to_string())
        .collect();
    listed.sort();
    want.sort();
    assert_eq!(listed, want);
    assert!(ok(door.aws(&["s3", "ls"])).contains("ckptfs"));

    for (id, _, from_flink) in &cps {
        let restored = dir.path().join(format!("restored-{id}"));
        restore(&store, *id, &restored);
        let copied = dir.path().join(format!("copied-{id}"));
        let synced = dir.path().join(format!("synced-{id}"));
        let from = format!("s3://ckptfs/cp-{id}/");
        ok(door.aws(&[
            "s3",
            "cp",
            "--recursive",
            "--only-show-errors",
            &from,
            copied.to_str().unwrap(),
        ]));
        ok(door.aws(&[
            "s3",
            "sync",
            "--only-show-errors",
            &from,
            synced.to_str().unwrap(),
        ]));
        let mut want = files(&restored);
        let (copied, synced) = (files(&copied), files(&synced));
        if *from_flink {
            // The door's `_metadata` on top: the rest is what restore writes.
            assert!(copied.contains_key("_metadata"));
            want.insert("_metadata".into(), copied["_metadata"].clone());
        }
        same(&copied, &want, &format!("cp-{id} copied"));
        same(&synced, &want, &format!("cp-{id} synced"));
    }
    let pinned = dir.path().join("pinned");
    ok(door.aws(&[
        "s3",
        "sync",
        "--only-show-errors",
        "s3://ckptfs/pinned/first/",
        pinned.to_str().unwrap(),
    ]));
    same(
        &files(&pinned),
        &files(&dir.path().join("restored-1")),
        "pinned/first",
    );
    // Copied as Flink's own directory would be, `<job>/chk-6/`: relocatable, every file
    // it names beside it, relative to it.
    let chk = dir.path().join(JOB).join("chk-6");
    let from = format!("s3://ckptfs/flink/{JOB}/chk-6/");
    ok(door.aws(&[
        "s3",
        "cp",
        "--recursive",
        "--only-show-errors",
        &from,
        chk.to_str().unwrap(),
    ]));
    same(
        &files(&chk),
        &files(&dir.path().join(format!("copied-{flink_cp}"))),
        "chk-6",
    );
    crate::flink_export::assert_relocatable(&dir.path().join(JOB), "chk-6");

    // Writes are refused, before anything is read of them.
    let file = dir.path().join("new");
    std::fs::write(&file, b"new bytes").unwrap();
    let f = file.to_str().unwrap();
    for args in [
        vec!["s3", "cp", f, "s3://ckptfs/cp-1/new"],
        vec!["s3", "cp", f, "s3://ckptfs/cp-1/A/0/CURRENT"],
        vec!["s3", "rm", "s3://ckptfs/cp-1/Operator-1/0/CURRENT"],
        vec!["s3", "rm", "--recursive", "s3://ckptfs/cp-1/"],
        vec![
            "s3api",
            "create-multipart-upload",
            "--bucket",
            "ckptfs",
            "--key",
            "x",
        ],
        vec![
            "s3api",
            "delete-objects",
            "--bucket",
            "ckptfs",
            "--delete",
            "Objects=[{Key=cp-1/Operator-1/0/CURRENT}]",
        ],
        vec!["s3", "mb", "s3://other"],
        vec!["s3", "rb", "s3://ckptfs"],
    ] {
        let out = door.aws(&args);
        let said = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
        assert!(said.contains("AccessDenied"), "{args:?}: {said}");
    }
    let mut door = door;
    door.stop();
    assert_eq!(store_state(&store), before);
}

/// boto3's side of [`boto3_pages_ranges_heads_and_is_refused_writes`]: argv is the
/// endpoint, the key, the secret, a restored checkpoint's directory and its id. It checks
/// ranges, HEAD and the conditional headers against the restored files itself, and prints
/// the listings and what each write got as JSON.
const BOTO3: &str = r#"
import json, os, sys
import boto3, botocore
from botocore.config import Config
from datetime import datetime, timezone, timedelta

ep, ak, sk, restored, cp = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id=ak, aws_secret_access_key=sk,
                  region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))

def code(call):
    try:
        call()
    except botocore.exceptions.ClientError as e:
        if e.response["Error"]["Code"].isdigit():
            print(e.response, file=sys.stderr)
        return e.response["Error"]["Code"]
    return "OK"

def listing(op, **kw):
    keys, prefixes, pages = [], [], 0
    for page in s3.get_paginator(op).paginate(Bucket="ckptfs", **kw):
        pages += 1
        keys += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return {"keys": keys, "prefixes": prefixes, "pages": pages}

out = {
    "v2": listing("list_objects_v2"),
    "v1": listing("list_objects"),
    "v2_by_7": listing("list_objects_v2", PaginationConfig={"PageSize": 7}, Prefix="cp-1"),
    "top_by_3": listing("list_objects_v2", PaginationConfig={"PageSize": 3}, Delimiter="/"),
}
etags = {}
for page in s3.get_paginator("list_objects_v2").paginate(Bucket="ckptfs", Prefix=f"cp-{cp}/"):
    for o in page["Contents"]:
        etags[o["Key"]] = (o["ETag"], o["Size"])

checked = 0
for root, _, names in os.walk(restored):
    for name in names:
        path = os.path.join(root, name)
        key = f"cp-{cp}/" + os.path.relpath(path, restored)
        data = open(path, "rb").read()
        head = s3.head_object(Bucket="ckptfs", Key=key)
        assert head["ContentLength"] == len(data), key
        assert (head["ETag"], len(data)) == etags[key], key
        assert s3.get_object(Bucket="ckptfs", Key=key)["Body"].read() == data, key
        if len(data) < 3:
            continue
        n = len(data)
        for r, want in [(f"bytes=1-{n // 2}", data[1:n // 2 + 1]), ("bytes=-2", data[-2:]),
                        (f"bytes={n - 3}-", data[n - 3:]), (f"bytes=0-{n + 100}", data)]:
            got = s3.get_object(Bucket="ckptfs", Key=key, Range=r)
            assert got["Body"].read() == want, (key, r)
            assert got["ResponseMetadata"]["HTTPStatusCode"] == 206, (key, r)
            assert got["ContentRange"].endswith(f"/{n}"), got["ContentRange"]
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, Range=f"bytes={n}-")) == "InvalidRange"
        etag = head["ETag"]
        later = head["LastModified"] + timedelta(days=1)
        earlier = head["LastModified"] - timedelta(days=1)
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, IfNoneMatch=etag)) == "304"
        assert code(lambda: s3.head_object(Bucket="ckptfs", Key=key, IfNoneMatch=etag)) == "304"
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, IfNoneMatch='"other"')) == "OK"
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, IfMatch=etag)) == "OK"
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, IfMatch='"other"')) == "PreconditionFailed"
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, IfModifiedSince=later)) == "304"
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, IfModifiedSince=earlier)) == "OK"
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, IfUnmodifiedSince=earlier)) == "PreconditionFailed"
        assert code(lambda: s3.get_object(Bucket="ckptfs", Key=key, IfUnmodifiedSince=later)) == "OK"
        checked += 1
assert checked > 5, checked
key = sorted(etags)[0]
out["missing"] = code(lambda: s3.head_object(Bucket="ckptfs", Key=f"cp-{cp}/nothing"))
out["other_bucket"] = code(lambda: s3.list_objects_v2(Bucket="other"))
out["location"] = s3.get_bucket_location(Bucket="ckptfs").get("LocationConstraint")
out["refused"] = {
    "PutObject": code(lambda: s3.put_object(Bucket="ckptfs", Key=key, Body=b"x")),
    "PutNew": code(lambda: s3.put_object(Bucket="ckptfs", Key="cp-1/new", Body=b"x")),
    "DeleteObject": code(lambda: s3.delete_object(Bucket="ckptfs", Key=key)),
    "DeleteObjects": code(lambda: s3.delete_objects(Bucket="ckptfs", Delete={"Objects": [{"Key": key}]})),
    "CreateMultipartUpload": code(lambda: s3.create_multipart_upload(Bucket="ckptfs", Key="big")),
    "UploadPart": code(lambda: s3.upload_part(Bucket="ckptfs", Key="big", UploadId="x", PartNumber=1, Body=b"x")),
    "CopyObject": code(lambda: s3.copy_object(Bucket="ckptfs", Key="copy", CopySource={"Bucket": "ckptfs", "Key": key})),
    "DeleteBucket": code(lambda: s3.delete_bucket(Bucket="ckptfs")),
    "PutBucketPolicy": code(lambda: s3.put_bucket_policy(Bucket="ckptfs", Policy="{}")),
}
print(json.dumps(out))
"#;

/// The keys the bucket holds: each checkpoint's files (and the door's `_metadata` at the
/// top of a Flink one) under `cp-N/`, the pin's under `pinned/first/`, each Flink one's
/// again under `flink/<job>/chk-N/`.
fn key_count(cps: &[(u64, u64, bool)]) -> u64 {
    let of = |c: &(u64, u64, bool)| c.1 + u64::from(c.2);
    let all: u64 = cps.iter().map(of).sum();
    let flink: u64 = cps.iter().filter(|c| c.2).map(of).sum();
    all + flink + of(&cps[0])
}

/// boto3 pages through more than 1,000 keys (ListObjectsV2 and V1 alike, in pages of
/// 1,000 and of 7, and the top level by 3 with a delimiter), reads ranges, HEADs and
/// conditional GETs of every file of a checkpoint equal to its restored copy, and is
/// refused every write (AccessDenied), with the store unchanged.
#[test]
fn boto3_pages_ranges_heads_and_is_refused_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 100);
    let cps = checkpoints(&store);
    let before = store_state(&store);
    let flink_cp = cps.iter().rfind(|c| c.2).unwrap().0;
    let restored = dir.path().join("restored");
    restore(&store, flink_cp, &restored);
    let mut door = Door::serve(&store, &[]);
    let out = Command::new("python3")
        .args(["-c", BOTO3, &door.endpoint(), ACCESS_KEY, SECRET_KEY])
        .arg(&restored)
        .arg(flink_cp.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        v["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect()
    };
    let all = keys(&got["v2"]);
    assert!(all.len() > 1000, "{}", all.len());
    assert_eq!(all.len() as u64, key_count(&cps));
    let mut sorted = all.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, all, "in order, each once");
    assert_eq!(got["v2"]["pages"], all.len().div_ceil(1000));
    assert_eq!(keys(&got["v1"]), all);
    assert_eq!(got["v1"]["pages"], all.len().div_ceil(1000));
    let cp1: Vec<String> = all
        .iter()
        .filter(|k| k.starts_with("cp-1"))
        .cloned()
        .collect();
    assert_eq!(keys(&got["v2_by_7"]), cp1);
    let mut top: Vec<String> = cps.iter().map(|c| format!("cp-{}/", c.0)).collect();
    top.extend(["flink/".into(), "pinned/".into()]);
    top.sort();
    assert_eq!(got["top_by_3"]["prefixes"], serde_json::json!(top));
    assert_eq!(got["top_by_3"]["pages"], top.len().div_ceil(3));
    assert_eq!(got["missing"], "404");
    assert_eq!(got["other_bucket"], "NoSuchBucket");
    assert!(got["location"].is_null());
    for (call, code) in got["refused"].as_object().unwrap() {
        assert_eq!(code, "AccessDenied", "{call}: {}", stderr(&out));
    }
    door.stop();
    assert_eq!(store_state(&store), before);
}

/// rclone (Debian's) with the door as an S3 remote: `lsf` lists a checkpoint, `copy`
/// copies it, and `check` (sizes, then every byte with `--download`) finds it equal to
/// its restored copy; `check` tells a changed copy apart.
#[test]
fn rclone_lists_copies_and_checks_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 2);
    let cps = checkpoints(&store);
    let id = cps[1].0;
    let restored = dir.path().join("restored");
    restore(&store, id, &restored);
    let door = Door::serve(&store, &[]);
    let rclone = |args: &[&str]| -> Output {
        Command::new("rclone")
            .args(args)
            .env("RCLONE_CONFIG", "/dev/null")
            // A CA bundle for https makes rclone refuse an http endpoint.
            .env_remove("AWS_CA_BUNDLE")
            .env("RCLONE_CONFIG_DOOR_TYPE", "s3")
            .env("RCLONE_CONFIG_DOOR_PROVIDER", "Other")
            .env("RCLONE_CONFIG_DOOR_ENDPOINT", door.endpoint())
            .env("RCLONE_CONFIG_DOOR_ACCESS_KEY_ID", ACCESS_KEY)
            .env("RCLONE_CONFIG_DOOR_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("RCLONE_CONFIG_DOOR_FORCE_PATH_STYLE", "true")
            .output()
            .expect("rclone (Debian's)")
    };
    let remote = format!("door:ckptfs/cp-{id}");
    let listed = ok(rclone(&["lsf", "-R", "--files-only", &remote]));
    let mut listed: Vec<&str> = listed.lines().collect();
    listed.sort();
    let want = files(&restored);
    assert_eq!(listed, want.keys().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        ok(rclone(&["lsf", "door:ckptfs"])).lines().count(),
        cps.len() + 2
    );
    let copied = dir.path().join("copied");
    ok(rclone(&["copy", &remote, copied.to_str().unwrap()]));
    same(&files(&copied), &want, "rclone copy");
    ok(rclone(&["check", &remote, restored.to_str().unwrap()]));
    ok(rclone(&[
        "check",
        "--download",
        &remote,
        restored.to_str().unwrap(),
    ]));
    ok(rclone(&[
        "check",
        "--download",
        &remote,
        copied.to_str().unwrap(),
    ]));
    // A copy changed in one byte (same size) is found different by --download.
    let (name, bytes) = want.iter().find(|(_, b)| b.len() > 100).unwrap();
    let mut changed = bytes.clone();
    changed[50] ^= 1;
    std::fs::write(copied.join(name), changed).unwrap();
    let out = rclone(&["check", "--download", &remote, copied.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 differences found"),
        "{}",
        stderr(&out)
    );
}

/// `ckptfs serve STORE ARGS...` with `env`, expected to refuse to start: its message.
fn refused_to_serve(store: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(BIN)
        .args(["serve", store.to_str().unwrap()])
        .args(args)
        .env_remove("CKPTFS_S3_ACCESS_KEY_ID")
        .env_remove("CKPTFS_S3_SECRET_ACCESS_KEY")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success(), "started: {args:?}");
    stderr(&out)
}

/// Requests must be signed with the door's key: unsigned ones are refused (AccessDenied)
/// and so are ones signed with another secret or key, unless `--s3-anonymous` lets
/// unsigned ones read (never write; a signature must still be right). The key comes from
/// a private file as well as from the environment. A non-loopback address, or a door
/// with no key and no `--s3-anonymous`, is refused at start with what to do.
#[test]
fn unsigned_and_badly_signed_requests_are_refused_unless_anonymous() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 1);
    let door = Door::serve(&store, &[]);
    let ls = ["s3", "ls", "s3://ckptfs/cp-1/", "--recursive"];
    assert!(ok(door.aws(&ls)).contains("CURRENT"));
    let said = |out: Output| {
        assert!(!out.status.success());
        stderr(&out)
    };
    assert!(said(door.aws_as(None, &ls)).contains("AccessDenied"));
    assert!(said(door.aws_as(Some("not-the-secret"), &ls)).contains("SignatureDoesNotMatch"));
    let other_key = Command::new("/usr/bin/aws")
        .arg("--endpoint-url")
        .arg(door.endpoint())
        .args(ls)
        .env("AWS_ACCESS_KEY_ID", "another-key")
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .output()
        .unwrap();
    assert!(said(other_key).contains("AccessDenied"));
    drop(door);

    // A key file instead of the environment; unsigned reads allowed, writes never.
    let key_file = dir.path().join("door.key");
    std::fs::write(
        &key_file,
        format!(
            "[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let k = key_file.to_str().unwrap();
    assert!(
        refused_to_serve(&store, &["--s3-listen", "9", "--s3-credentials", k], &[])
            .contains("chmod 600")
    );
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = crate::common::moto::free_port();
    let mut command = Command::new(BIN);
    command
        .args([
            "serve",
            store.to_str().unwrap(),
            "--s3-anonymous",
            "--s3-credentials",
            k,
        ])
        .arg("--s3-listen")
        .arg(port.to_string())
        .env_remove("CKPTFS_S3_ACCESS_KEY_ID")
        .env_remove("CKPTFS_S3_SECRET_ACCESS_KEY");
    let door = Door::start(command, port);
    assert!(ok(door.aws_as(None, &ls)).contains("CURRENT"));
    assert!(ok(door.aws(&ls)).contains("CURRENT"));
    assert!(said(door.aws_as(Some("not-the-secret"), &ls)).contains("SignatureDoesNotMatch"));
    let got = dir.path().join("CURRENT");
    ok(door.aws_as(
        None,
        &[
            "s3",
            "cp",
            "s3://ckptfs/cp-1/Operator-1/0/CURRENT",
            got.to_str().unwrap(),
        ],
    ));
    assert!(std::fs::read_to_string(&got)
        .unwrap()
        .starts_with("MANIFEST-"));
    let out = door.aws_as(
        None,
        &["s3", "cp", got.to_str().unwrap(), "s3://ckptfs/cp-1/x"],
    );
    assert!(said(out).contains("AccessDenied"));
    drop(door);

    let public = format!("0.0.0.0:{}", crate::common::moto::free_port());
    let key = [
        ("CKPTFS_S3_ACCESS_KEY_ID", ACCESS_KEY),
        ("CKPTFS_S3_SECRET_ACCESS_KEY", SECRET_KEY),
    ];
    let message = refused_to_serve(&store, &["--s3-listen", &public], &key);
    assert!(message.contains("--s3-listen-public"), "{message}");
    let message = refused_to_serve(&store, &["--s3-listen", "9"], &[]);
    assert!(
        message.contains("--s3-anonymous") && message.contains("--s3-credentials"),
        "{message}"
    );
    let message = refused_to_serve(&store, &["--s3-listen", "9"], &key[..1]);
    assert!(message.contains("CKPTFS_S3_SECRET_ACCESS_KEY"), "{message}");
    let message = refused_to_serve(
        &store,
        &["--s3-listen", "9", "--s3-bucket", "Bad_Name"],
        &key,
    );
    assert!(message.contains("--s3-bucket"), "{message}");
    for alone in [&["--s3-anonymous"][..], &["--s3-bucket", "other"]] {
        let message = refused_to_serve(&store, alone, &[]);
        assert!(message.contains("--s3-listen"), "{message}");
    }
    // Asked for, a public address is served.
    let port = crate::common::moto::free_port();
    let mut command = Command::new(BIN);
    command
        .args([
            "serve",
            store.to_str().unwrap(),
            "--s3-listen-public",
            "--s3-anonymous",
        ])
        .arg("--s3-listen")
        .arg(format!("0.0.0.0:{port}"));
    let door = Door::start(command, port);
    assert!(ok(door.aws_as(None, &ls)).contains("CURRENT"));
}

/// A damaged object is never served as good: a whole GET ends short of its length (the
/// AWS CLI's copy fails and leaves no file, boto3's read raises), a ranged GET is an
/// error (500) with no bytes, and the door records what it could not serve; the other
/// files are served as before.
#[test]
fn a_damaged_object_is_never_served_as_good() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // SSTs of a few MiB: the first pieces of a whole GET go out before the damage is seen.
    ok(ckptfs(&[
        "workload",
        store.to_str().unwrap(),
        "--rounds",
        "1",
        "--keys",
        "80000",
        "--value-size",
        "200",
    ]));
    let restored = dir.path().join("restored");
    restore(&store, 1, &restored);
    let want = files(&restored);
    let (name, bytes) = want.iter().max_by_key(|(_, b)| b.len()).unwrap();
    assert!(bytes.len() > 3 << 19, "{name}: {}", bytes.len());
    let mut door = Door::serve(&store, &[]);
    let key = format!("cp-1/{name}");
    let head = ok(door.aws(&["s3api", "head-object", "--bucket", "ckptfs", "--key", &key]));
    let head: serde_json::Value = serde_json::from_str(&head).unwrap();
    let etag = head["ETag"].as_str().unwrap().trim_matches('"').to_string();
    let object = store.join("objects").join(&etag[..2]).join(&etag);
    let mut damaged = std::fs::read(&object).unwrap();
    let at = damaged.len() - 100;
    damaged[at] ^= 0x40;
    std::fs::write(&object, &damaged).unwrap();

    let copy = dir.path().join("copy");
    let out = door.aws(&[
        "s3",
        "cp",
        &format!("s3://ckptfs/{key}"),
        copy.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "copied a damaged object");
    assert!(!copy.exists() || std::fs::read(&copy).unwrap() != damaged);
    let script = r#"
import sys, boto3, botocore
from botocore.config import Config
ep, ak, sk, key = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id=ak, aws_secret_access_key=sk,
                  region_name="us-east-1", config=Config(retries={"max_attempts": 1}))
try:
    got = s3.get_object(Bucket="ckptfs", Key=key)["Body"].read()
    print("whole: read", len(got))
except Exception as e:
    print("whole: failed", type(e).__name__)
try:
    s3.get_object(Bucket="ckptfs", Key=key, Range="bytes=0-99")["Body"].read()
    print("range: read")
except botocore.exceptions.ClientError as e:
    print("range:", e.response["Error"]["Code"])
"#;
    let out = Command::new("python3")
        .args(["-c", script, &door.endpoint(), ACCESS_KEY, SECRET_KEY, &key])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("whole: failed"), "{said}{}", stderr(&out));
    assert!(
        said.contains("range: InternalError"),
        "{said}{}",
        stderr(&out)
    );
    // The rest is served as before.
    let (other, other_bytes) = want.iter().find(|(n, _)| *n != name).unwrap();
    let other_copy = dir.path().join("other");
    ok(door.aws(&[
        "s3",
        "cp",
        &format!("s3://ckptfs/cp-1/{other}"),
        other_copy.to_str().unwrap(),
    ]));
    assert!(std::fs::read(&other_copy).unwrap() == *other_bytes);
    let status = ok(ckptfs(&["status", store.to_str().unwrap(), "--json"]));
    assert!(status.contains(&etag), "{status}");
    let log = door.stop();
    assert!(log.contains(&format!("cannot serve cp-1/{name}")), "{log}");
}

/// `mount --s3-listen`: the daemon of a mount serves the door too, by the same startup as
/// `serve`: the bucket's top level is the mount's, and a file read through the door is
/// the one read through the mount.
#[test]
fn a_mount_serves_the_door_as_serve_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 2);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let port = crate::common::moto::free_port();
    let listen = format!("127.0.0.1:{port}");
    let m = crate::common::mounted::Mounted::at_with_env(
        &store,
        &mnt,
        &["--s3-listen", &listen],
        &[
            ("CKPTFS_S3_ACCESS_KEY_ID", ACCESS_KEY),
            ("CKPTFS_S3_SECRET_ACCESS_KEY", SECRET_KEY),
        ],
    );
    let door = Door { child: None, port };
    let mut top: Vec<String> = ok(door.aws(&["s3", "ls", "s3://ckptfs/"]))
        .lines()
        .map(|l| {
            l.trim()
                .trim_start_matches("PRE ")
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    top.sort();
    let mut shown: Vec<String> = m
        .root_names()
        .into_iter()
        .filter(|n| n != ".ckptfs" && n != "latest")
        .collect();
    shown.sort();
    assert_eq!(top, shown);
    let through_door = dir.path().join("cp-2");
    ok(door.aws(&[
        "s3",
        "sync",
        "--only-show-errors",
        "s3://ckptfs/cp-2/",
        through_door.to_str().unwrap(),
    ]));
    same(
        &files(&through_door),
        &files(&mnt.join("cp-2")),
        "cp-2 through the door and the mount",
    );
    m.umount();
}

/// A Flink checkpoint copied through the door (`flink/<job>/chk-4/`, the AWS CLI) to a
/// local directory, the door stopped: a real Flink job restores from the copy and goes on
/// from the 933 records of the fixture's checkpoint 4, its keyed state checked key by
/// key (Flink's S3 filesystems cannot be installed here: the copy stands for them).
#[test]
fn a_flink_job_restores_from_a_checkpoint_copied_through_the_door() {
    let dir = tempfile::tempdir().unwrap();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let store = store(dir.path(), 1);
    let mut door = Door::serve(&store, &[]);
    let chk = dir.path().join("copied").join(JOB).join("chk-4");
    let from = format!("s3://ckptfs/flink/{JOB}/chk-4/");
    ok(door.aws(&[
        "s3",
        "cp",
        "--recursive",
        "--only-show-errors",
        &from,
        chk.to_str().unwrap(),
    ]));
    door.stop();
    crate::flink_export::assert_relocatable(&dir.path().join("copied").join(JOB), "chk-4");
    crate::flink_mount::restores_from(&classpath, &chk, dir.path());
}
