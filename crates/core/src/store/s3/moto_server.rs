//! Starting `moto_server` (Python package `moto[server]`) on 127.0.0.1 for tests, one per
//! test binary: the core's unit tests (`moto.rs`) and the integration tests
//! (tests/integration/common/moto.rs, which includes this file by its path) share it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Start `moto_server` on `port` from a thread that lives as long as the process (the
/// server is killed, PR_SET_PDEATHSIG, when that thread, i.e. the test binary, ends), and
/// wait until it answers. Panics, saying how to install it, when it is missing: a test that
/// needs it never skips.
#[allow(dead_code)] // Not every test binary that includes this file starts one of each.
pub fn start(port: u16) {
    start_with(port, &[]);
}

/// [`start`], with `env` set for the server (e.g. `S3_UPLOAD_PART_MIN_SIZE`, the smallest
/// part it takes but the last, 5 MiB as on S3 by default).
pub fn start_with(port: u16, env: &[(&str, &str)]) {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (started, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new("moto_server");
        command
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .envs(env)
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
}

/// Create `bucket` with a plain (unsigned) request, which moto accepts.
pub fn create_bucket(port: u16, bucket: &str) {
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
}
