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
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
        match secret {
            Some(secret) => command.env("AWS_SECRET_ACCESS_KEY", secret),
            None => command.arg("--no-sign-request"),
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
