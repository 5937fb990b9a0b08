//! A real S3-compatible server for the core's unit tests: `moto_server` (Python package
//! `moto[server]`, which `scripts/test` installs) on 127.0.0.1, one per test binary, started
//! as the integration tests start theirs (tests/integration/common/moto.rs). A test that
//! needs it fails when it is missing: it is never skipped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::remote::Remote;

static PORT: OnceLock<u16> = OnceLock::new();
static BUCKETS: AtomicU64 = AtomicU64::new(0);

/// The server's port, started at first use, with the standard AWS environment (credentials,
/// region) set for the clients of this process.
pub(crate) fn port() -> u16 {
    *PORT.get_or_init(|| {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // Started from a thread that lives as long as the process: the server is killed
        // (PR_SET_PDEATHSIG) when that thread, i.e. the test binary, ends.
        let (started, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::os::unix::process::CommandExt;
            let mut command = Command::new("moto_server");
            command
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            // SAFETY: prctl is async-signal-safe.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let child = command
                .spawn()
                .expect("moto_server (pip install 'moto[server]'; scripts/test installs it)");
            started.send(()).unwrap();
            let _child = child;
            loop {
                std::thread::park();
            }
        });
        wait.recv().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Set once, before any client of this binary reads them (edition 2021).
        for (key, value) in [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ] {
            std::env::set_var(key, value);
        }
        port
    })
}

/// The endpoint of the server, `http://127.0.0.1:PORT`.
pub(crate) fn endpoint() -> String {
    format!("http://127.0.0.1:{}", port())
}

/// A new, empty bucket's name (created with a plain, unsigned request, which moto accepts).
pub(crate) fn bucket() -> String {
    let port = port();
    let n = BUCKETS.fetch_add(1, Ordering::SeqCst);
    let bucket = format!("ckptfs-unit-{}-{n}", std::process::id());
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "create bucket: {answer}"
    );
    bucket
}

/// A connection to `s3://<a new bucket>/store`.
pub(crate) fn remote() -> Arc<Remote> {
    Remote::connect_to(&bucket(), "store", Some(&endpoint())).unwrap()
}
