//! `ckptfs serve`: the daemon without a tree. No FUSE, no root: it runs as nobody with
//! /dev/fuse replaced by /dev/null; commands reach it through `ctl.sock` in its state
//! directory, which lets in its own user and root only; SIGTERM ends it cleanly.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::mounted::{ok, BIN};

/// The binary where nobody may run it (/root is closed to others): hard-linked (copied
/// when another filesystem holds it) to /tmp/ckptfs-serve-bin/ckptfs, replaced by a
/// rename at each run, so that one file at most is left behind.
fn public_bin() -> &'static str {
    static BIN_COPY: OnceLock<String> = OnceLock::new();
    BIN_COPY.get_or_init(|| {
        let dir = std::env::temp_dir().join("ckptfs-serve-bin");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let staged = dir.join(format!("ckptfs.{}", std::process::id()));
        let _ = std::fs::remove_file(&staged);
        if std::fs::hard_link(BIN, &staged).is_err() {
            std::fs::copy(BIN, &staged).unwrap();
        }
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.join("ckptfs");
        std::fs::rename(&staged, &bin).unwrap();
        bin.to_string_lossy().into_owned()
    })
}

/// A temporary directory others may enter, with `store` in it (owned by nobody when
/// `nobody_owns`).
fn store_dir(nobody_owns: bool) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    if nobody_owns {
        crate::common::run("chown", &["nobody", &store.to_string_lossy()]);
    }
    (dir, store)
}

/// `ckptfs ARGS` run as nobody.
fn as_nobody(args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", "nobody", "--", public_bin()])
        .args(args)
        .output()
        .expect("runuser (util-linux)")
}

/// `ckptfs ARGS` run as root.
fn as_root(args: &[&str]) -> Output {
    Command::new(public_bin())
        .args(args)
        .output()
        .expect("run ckptfs")
}

fn socket_of(store: &Path) -> PathBuf {
    store.join("state/ctl.sock")
}

/// `ckptfs serve ARGS` (words split at spaces) as nobody, in a mount namespace of its own
/// with /dev/null bound over /dev/fuse (setpriv, not runuser: it execs the daemon, whose
/// own exit status the test reads).
fn serve_as_nobody_without_fuse(args: &str) -> Command {
    let script = format!(
        "mount --bind /dev/null /dev/fuse || exit 97; \
         exec setpriv --reuid=nobody --regid=nogroup --clear-groups {} serve {args}",
        public_bin()
    );
    let mut command = Command::new("unshare");
    command.args(["-m", "--propagation", "private", "sh", "-c", &script]);
    command
}

/// A serving daemon, stopped (SIGTERM, then SIGKILL) when dropped.
struct Served {
    child: Option<Child>,
    socket: PathBuf,
}

impl Served {
    /// Start `command` and wait until the socket of `store` answers.
    fn start(command: Command, store: &Path) -> Served {
        Served::start_at(command, socket_of(store))
    }

    /// Start `command` and wait until `socket` answers.
    fn start_at(mut command: Command, socket: PathBuf) -> Served {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ckptfs serve");
        let mut served = Served {
            child: Some(child),
            socket,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::os::unix::net::UnixStream::connect(&served.socket).is_err() {
            let child = served.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                let out = served.child.take().unwrap().wait_with_output().unwrap();
                panic!(
                    "serve exited with {status} before its socket answered: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(
                Instant::now() < deadline,
                "no socket at {}",
                served.socket.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        served
    }

    /// SIGTERM; its exit status and what it logged.
    fn stop(&mut self) -> Output {
        let child = self.child.take().expect("running");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        child.wait_with_output().unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A user without root and without FUSE (/dev/null bound over /dev/fuse in a mount
/// namespace of its own) serves a store (setpriv, not runuser: it execs the daemon, whose
/// own exit status the test reads); `ckptfs checkpoint STORE` run as that user and
/// as root reach it through the socket.
#[test]
fn serve_runs_as_nobody_without_fuse_and_checkpoints_through_the_socket() {
    let (_dir, store) = store_dir(true);
    let store_arg = store.to_string_lossy().into_owned();
    let command = serve_as_nobody_without_fuse(&format!("{store_arg} --backend A/0"));
    let mut served = Served::start(command, &store);
    let meta = std::fs::metadata(&served.socket).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "the socket's mode"
    );
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        nix::unistd::User::from_name("nobody")
            .unwrap()
            .unwrap()
            .uid
            .as_raw(),
        "the daemon runs as nobody"
    );
    assert_eq!(ok(as_nobody(&["checkpoint", &store_arg])).trim(), "1");
    assert!(store.join("checkpoints/1.json").exists());
    // Root is let in too.
    assert_eq!(ok(as_root(&["checkpoint", &store_arg])).trim(), "2");
    assert!(store.join("checkpoints/2.json").exists());
    let out = served.stop();
    assert!(
        out.status.success(),
        "serve as nobody: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Another user than the daemon's (and not root) is refused with an answer that says so;
/// the daemon's user and root are let in.
#[test]
fn the_socket_lets_in_its_user_and_root_only() {
    let (_dir, store) = store_dir(false);
    let store_arg = store.to_string_lossy().into_owned();
    let mut command = Command::new(public_bin());
    command.args(["serve", &store_arg, "--backend", "A/0"]);
    let served = Served::start(command, &store);
    // Open the way to the socket: only SO_PEERCRED stands in nobody's way then.
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(store.join("state"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&served.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let refused = as_nobody(&["checkpoint", &store_arg, "--wait", "0"]);
    assert!(!refused.status.success(), "nobody was let in");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("may not control"), "{stderr}");
    assert!(!store.join("checkpoints/1.json").exists());
    assert_eq!(ok(as_root(&["checkpoint", &store_arg])).trim(), "1");
    // A raw client reads the refusal line and then the end of the stream.
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--", "python3", "-c"])
        .arg(format!(
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); \
             s.sendall(b'checkpoint\\n'); print(s.makefile().read())",
            served.socket.to_string_lossy()
        ))
        .output()
        .unwrap();
    let answer = ok(out);
    assert_eq!(answer.trim().lines().count(), 1, "{answer}");
    assert!(answer.contains("\"ok\":false"), "{answer}");
    assert!(!store.join("checkpoints/2.json").exists());
}

/// SIGTERM ends the daemon with exit 0 once the checkpoint in flight is done; the socket
/// is gone, and a new daemon opens the store at once.
#[test]
fn sigterm_ends_serve_cleanly() {
    let (_dir, store) = store_dir(false);
    let store_arg = store.to_string_lossy().into_owned();
    let start = || {
        let mut command = Command::new(public_bin());
        command.args(["serve", &store_arg, "--backend", "A/0"]);
        Served::start(command, &store)
    };
    let mut served = start();
    assert_eq!(ok(as_root(&["put", &store_arg, "A/0", "k", "v"])), "");
    assert_eq!(ok(as_root(&["checkpoint", &store_arg])).trim(), "1");
    let out = served.stop();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!socket_of(&store).exists(), "the socket is left behind");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stopped"), "{stderr}");
    // The databases were closed: the next daemon opens them and checkpoints on.
    let mut again = start();
    assert_eq!(ok(as_root(&["checkpoint", &store_arg])).trim(), "2");
    assert!(again.stop().status.success());
}

/// `serve --flink DIR` imports the job's 3 checkpoints as they are there; `ls STORE` and
/// `status STORE` show them.
#[test]
fn serve_follows_a_flink_job() {
    let (dir, store) = store_dir(false);
    let job = dir.path().join("job");
    crate::flink::cp_a(&crate::flink::fixture(), &job);
    let store_arg = store.to_string_lossy().into_owned();
    let mut command = Command::new(public_bin());
    command
        .args(["serve", &store_arg, "--flink", &job.to_string_lossy()])
        .env("CKPTFS_FLINK_POLL_MS", "200");
    let mut served = Served::start(command, &store);
    let deadline = Instant::now() + Duration::from_secs(60);
    let ids = loop {
        let listed: serde_json::Value =
            serde_json::from_str(&ok(as_root(&["ls", &store_arg, "--json"]))).unwrap();
        let ids: Vec<u64> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["id"].as_u64().unwrap())
            .collect();
        if ids.len() >= 3 || Instant::now() > deadline {
            break ids;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(ids, [1, 2, 3]);
    // status STORE is the daemon's own, asked through the socket: its pid, what it follows.
    let status: serde_json::Value =
        serde_json::from_str(&ok(as_root(&["status", &store_arg, "--json"]))).unwrap();
    assert_eq!(
        status["pid"],
        served.child.as_ref().unwrap().id(),
        "{status}"
    );
    assert_eq!(
        status["checkpoints"].as_array().unwrap().len(),
        3,
        "{status}"
    );
    let out = served.stop();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// --metrics-listen serves the metrics at /metrics.
#[test]
fn serve_serves_its_metrics() {
    let (_dir, store) = store_dir(false);
    let store_arg = store.to_string_lossy().into_owned();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", crate::common::moto::free_port())
        .parse()
        .unwrap();
    let mut command = Command::new(public_bin());
    command.args([
        "serve",
        &store_arg,
        "--backend",
        "A/0",
        "--metrics-listen",
        &addr.to_string(),
    ]);
    let _served = Served::start(command, &store);
    assert_eq!(ok(as_root(&["checkpoint", &store_arg])).trim(), "1");
    let (code, _, body) = crate::metrics::http_get(addr, "/metrics");
    assert_eq!(code, 200);
    assert!(
        body.lines()
            .any(|l| l.starts_with("ckptfs_checkpoints_completed_total") && l.ends_with(" 1")),
        "{body}"
    );
}

/// scripts/ckptfs-serve.service: systemd accepts it, it names a user of its own (not
/// root), and its ExecStart, run as nobody with the example store replaced, serves, takes
/// a checkpoint through the socket and stops with exit 0 on the unit's KillSignal.
#[test]
fn the_serve_unit_is_valid_and_runs_without_root() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/ckptfs-serve.service"
    ))
    .unwrap();
    let user = unit
        .lines()
        .find_map(|l| l.strip_prefix("User="))
        .expect("User=");
    assert!(user != "root" && !user.is_empty(), "User={user}");
    assert!(unit.contains("KillSignal=SIGTERM"));
    let (dir, store) = store_dir(true);
    let tested = dir.path().join("ckptfs-serve.service");
    std::fs::write(&tested, unit.replace("/usr/local/bin/ckptfs", public_bin())).unwrap();
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&tested)
        .output()
        .expect("systemd-analyze");
    let complaints = String::from_utf8_lossy(&verify.stderr).into_owned();
    assert!(
        verify.status.success() && !complaints.contains(&*tested.to_string_lossy()),
        "{complaints}"
    );
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap()
        .replace("/var/lib/ckptfs/store", &store.to_string_lossy());
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/ckptfs"));
    let mut command = Command::new("setpriv");
    command
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            public_bin(),
        ])
        .args(words);
    let mut served = Served::start(command, &store);
    let store_arg = store.to_string_lossy().into_owned();
    assert_eq!(ok(as_nobody(&["checkpoint", &store_arg])).trim(), "1");
    let out = served.stop();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!socket_of(&store).exists());
}

/// With --state DIR elsewhere, commands name the socket itself: checkpoint, ls and status
/// of DIR/ctl.sock (no store to read there: only the daemon can answer).
#[test]
fn commands_reach_a_daemon_by_its_socket() {
    let (dir, store) = store_dir(false);
    let state = dir.path().join("state-elsewhere");
    let mut command = Command::new(public_bin());
    command.args([
        "serve",
        &store.to_string_lossy(),
        "--state",
        &state.to_string_lossy(),
        "--backend",
        "A/0",
    ]);
    let socket = state.join("ctl.sock");
    let mut served = Served::start_at(command, socket.clone());
    let socket_arg = socket.to_string_lossy().into_owned();
    assert_eq!(ok(as_root(&["checkpoint", &socket_arg])).trim(), "1");
    let listed: serde_json::Value =
        serde_json::from_str(&ok(as_root(&["ls", &socket_arg, "--json"]))).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["id"], 1);
    let status = ok(as_root(&["status", &socket_arg]));
    assert!(status.contains("A/0"), "{status}");
    // pin and unpin go through it too; the pin shows in the daemon's status.
    ok(as_root(&["pin", &socket_arg, "1", "keep"]));
    let status: serde_json::Value =
        serde_json::from_str(&ok(as_root(&["status", &socket_arg, "--json"]))).unwrap();
    assert!(status.to_string().contains("\"keep\""), "{status}");
    ok(as_root(&["unpin", &socket_arg, "keep"]));
    // The store directory has no socket of its own: read directly, it shows the same.
    let direct: serde_json::Value =
        serde_json::from_str(&ok(as_root(&["ls", &store.to_string_lossy(), "--json"]))).unwrap();
    assert_eq!(direct[0]["id"], 1);
    assert!(served.stop().status.success());
    assert!(!socket.exists());
}

/// A line longer than the control file takes (4 MiB) is refused with one answer and the
/// connection closed (the daemon never waits for its end); the daemon serves the next
/// client.
#[test]
fn an_overlong_line_is_refused_and_the_connection_closed() {
    use std::io::{Read, Write};
    let (_dir, store) = store_dir(false);
    let store_arg = store.to_string_lossy().into_owned();
    let mut command = Command::new(public_bin());
    command.args(["serve", &store_arg, "--backend", "A/0"]);
    let served = Served::start(command, &store);
    let mut stream = std::os::unix::net::UnixStream::connect(&served.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // "put A/0 k " and a value that makes the line one byte too long, no newline.
    let mut line = b"put A/0 k ".to_vec();
    line.resize((4 << 20) + 1, b'v');
    let _ = stream.write_all(&line);
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert_eq!(answer.lines().count(), 1, "{answer:.200}");
    assert!(answer.contains("\"ok\":false"), "{answer}");
    assert!(answer.contains("longer than"), "{answer}");
    // The daemon answers the next client.
    assert_eq!(ok(as_root(&["checkpoint", &store_arg])).trim(), "1");
    let listed = ok(as_root(&["ls", &store_arg, "--json"]));
    let rows: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
}

/// `ckptfs import-flink SRC STORE` of a served store imports through the daemon (the
/// store's lock is the daemon's: read directly, it would be refused).
#[test]
fn import_flink_into_a_served_store_goes_through_the_daemon() {
    let (dir, store) = store_dir(false);
    let job = dir.path().join("job");
    crate::flink::cp_a(&crate::flink::fixture(), &job);
    let store_arg = store.to_string_lossy().into_owned();
    let mut command = Command::new(public_bin());
    command.args(["serve", &store_arg]);
    let mut served = Served::start(command, &store);
    let ids = ok(as_root(&[
        "import-flink",
        &job.to_string_lossy(),
        &store_arg,
    ]));
    assert_eq!(
        ids.split_whitespace().collect::<Vec<_>>(),
        ["1", "2", "3"],
        "{ids}"
    );
    let out = served.stop();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The daemon did it: its log has the three checkpoints.
    assert!(stderr.contains("checkpoint 3"), "{stderr}");
}

/// Under systemd (`Type=notify`) the daemon says `READY=1` once it serves, its socket
/// answering then, and `STOPPING=1` on SIGTERM.
#[test]
fn serve_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let (dir, store) = store_dir(false);
    let store_arg = store.to_string_lossy().into_owned();
    let notify = dir.path().join("notify.sock");
    let systemd = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    systemd
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let child = Command::new(public_bin())
        .args(["serve", &store_arg, "--backend", "A/0"])
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut served = Served {
        child: Some(child),
        socket: socket_of(&store),
    };
    let said = || {
        let mut buf = [0u8; 4096];
        let n = systemd.recv(&mut buf).expect("a notification within 60 s");
        String::from_utf8_lossy(&buf[..n]).trim().to_string()
    };
    assert_eq!(said(), "READY=1");
    // Ready means serving: the socket answers without waiting for it.
    assert_eq!(ok(as_root(&["checkpoint", &store_arg])).trim(), "1");
    let stopping = std::thread::scope(|s| {
        let told = s.spawn(said);
        let out = served.stop();
        assert_eq!(out.status.code(), Some(0));
        told.join().unwrap()
    });
    assert_eq!(stopping, "STOPPING=1");
}

/// A mount's daemon takes commands by the store too, through the same socket:
/// `ckptfs checkpoint STORE` and `ls STORE` while the store is mounted reach it, with the
/// mount's own answers (its pid, its checkpoints).
#[test]
fn a_mount_takes_commands_by_its_store() {
    let m = crate::common::mounted::Mounted::new(&["--backend", "A/0"]);
    let store_arg = m.store.to_string_lossy().into_owned();
    assert!(socket_of(&m.store).exists(), "no socket beside the mount");
    ok(as_root(&["put", &store_arg, "A/0", "k", "v"]));
    assert_eq!(ok(as_root(&["checkpoint", &store_arg])).trim(), "1");
    assert_eq!(m.checkpoint_ids(), vec![1]);
    let by_store: serde_json::Value =
        serde_json::from_str(&ok(as_root(&["status", &store_arg, "--json"]))).unwrap();
    assert_eq!(by_store["pid"], m.status()["pid"], "{by_store}");
    assert!(m.copy_out(1, &m.root.join("out")));
    m.umount();
    assert!(!socket_of(&m.store).exists(), "the socket is left behind");
}

/// Where Flink runs: `ckptfs serve` as nobody, with /dev/fuse unusable, follows a real
/// Flink job as it checkpoints; through the socket nobody's CLI lists the imports, pins
/// one, applies a policy that keeps the newest only (the pin outlives it) and unpins; the
/// page answers, following the job; another user (daemon) is refused at the socket and
/// changes nothing; SIGTERM ends it with exit 0.
#[test]
fn serve_as_nobody_follows_a_running_flink_job() {
    let (dir, store) = store_dir(true);
    let store_arg = store.to_string_lossy().into_owned();
    let classpath =
        crate::common::java::compile_java("tests/flink/StateJob.java", &dir.path().join("classes"));
    let ck = dir.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    std::fs::set_permissions(&ck, std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = crate::common::moto::free_port();
    let mut command = serve_as_nobody_without_fuse(&format!(
        "{store_arg} --flink {} --metrics-listen 127.0.0.1:{port}",
        ck.display()
    ));
    command.env("CKPTFS_FLINK_POLL_MS", "200");
    let mut served = Served::start(command, &store);
    let listed = || -> Vec<serde_json::Value> {
        let out = ok(as_nobody(&["ls", &store_arg, "--json"]));
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    let mut job = crate::flink::Job::start(&classpath, &ck, 300, &[]);
    let idle = job.checkpoint_with(300);
    crate::flink::wait_for("the follower to import the job's checkpoints", || {
        let ids: Vec<u64> = listed()
            .iter()
            .filter_map(|c| c["flink"]["checkpoint"].as_u64())
            .collect();
        ids.len() >= 2 && ids.iter().any(|&n| n >= idle)
    });
    job.kill();
    let before = listed();
    let oldest = before[0]["id"].as_u64().unwrap();
    let newest = before.last().unwrap()["id"].as_u64().unwrap();
    assert!(oldest < newest, "{before:?}");
    // Another uid: refused at the socket (its directory is nobody's, 0700), nothing done.
    let other = Command::new("runuser")
        .args(["-u", "daemon", "--", public_bin(), "pin", &store_arg])
        .args([&oldest.to_string(), "theirs"])
        .output()
        .unwrap();
    assert!(!other.status.success(), "the user daemon was let in");
    // nobody pins the oldest, keeps the newest only: the pin outlives the policy.
    ok(as_nobody(&[
        "pin",
        &store_arg,
        &oldest.to_string(),
        "first",
    ]));
    ok(as_nobody(&["forget", &store_arg, "--keep-last", "1"]));
    let kept: Vec<u64> = listed().iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert_eq!(kept, [oldest, newest]);
    let status: serde_json::Value =
        serde_json::from_str(&ok(as_nobody(&["status", &store_arg, "--json"]))).unwrap();
    assert_eq!(status["pins"]["first"], oldest, "{status}");
    assert!(status["pins"].get("theirs").is_none(), "{status}");
    // The page answers, following the job.
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (code, _, page) = crate::metrics::http_get(addr, "/");
    assert_eq!(code, 200);
    assert!(page.contains("data-followed=\"true\""), "{page}");
    ok(as_nobody(&["unpin", &store_arg, "first"]));
    ok(as_nobody(&["forget", &store_arg]));
    let kept: Vec<u64> = listed().iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert_eq!(kept, [newest]);
    let out = served.stop();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A mount that fails (here nobody may not mount on root's directory) leaves no store
/// behind: a STORE that did not exist is gone again, log included, and an empty one is
/// empty again; a store that held anything is left as it was.
#[test]
fn a_failed_mount_leaves_no_store_behind() {
    let (dir, _) = store_dir(false);
    let parent = dir.path().join("nobodys");
    std::fs::create_dir(&parent).unwrap();
    crate::common::run("chown", &["nobody", &parent.to_string_lossy()]);
    let mnt = dir.path().join("roots-mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mount_as_nobody = |store: &Path| {
        let out = as_nobody(&["mount", &store.to_string_lossy(), &mnt.to_string_lossy()]);
        assert!(!out.status.success(), "mounted");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.contains("mountpoint"), "{stderr}");
    };
    let missing = parent.join("new-store");
    mount_as_nobody(&missing);
    assert!(!missing.exists(), "the failed mount left a store behind");
    let empty = parent.join("empty-store");
    std::fs::create_dir(&empty).unwrap();
    crate::common::run("chown", &["nobody", &empty.to_string_lossy()]);
    mount_as_nobody(&empty);
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    // A store with a checkpoint in it: the same failure changes nothing in it.
    let (_kept_dir, kept) = store_dir(true);
    let kept_arg = kept.to_string_lossy().into_owned();
    let mut command = Command::new("setpriv");
    command
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            public_bin(),
        ])
        .args(["serve", &kept_arg, "--backend", "A/0"]);
    let mut served = Served::start(command, &kept);
    assert_eq!(ok(as_nobody(&["checkpoint", &kept_arg])).trim(), "1");
    assert!(served.stop().status.success());
    mount_as_nobody(&kept);
    assert!(kept.join("checkpoints/1.json").exists());
}
