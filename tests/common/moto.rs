//! A real S3-compatible server for the tests: `moto_server` (Python package `moto[server]`)
//! on 127.0.0.1, one per test binary, with the standard AWS environment variables pointing
//! at it (inherited by the daemons the tests start). And a TCP proxy in front of it that a
//! test can cut, to take the server away without losing what it stores.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub struct Moto {
    pub port: u16,
}

static MOTO: OnceLock<Moto> = OnceLock::new();
static BUCKETS: AtomicU64 = AtomicU64::new(0);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The server of this test binary, started at first use.
pub fn moto() -> &'static Moto {
    MOTO.get_or_init(|| {
        let port = free_port();
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
                .expect("moto_server (pip install 'moto[server]')");
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
        // SAFETY (edition 2021): set once, before any client of this binary reads them.
        for (key, value) in env_for(port) {
            std::env::set_var(key, value);
        }
        Moto { port }
    })
}

/// The AWS environment for a server on `port`.
pub fn env_for(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        ("AWS_ALLOW_HTTP", "true".into()),
    ]
}

impl Moto {
    /// A new empty bucket; returns a store URL in it.
    pub fn store(&self) -> String {
        let n = BUCKETS.fetch_add(1, Ordering::SeqCst);
        let bucket = format!("ckptfs-test-{}-{n}", std::process::id());
        create_bucket(self.port, &bucket);
        format!("s3://{bucket}/store")
    }
}

/// Create a bucket with a plain (unsigned) request, which moto accepts.
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

/// A TCP proxy in front of a server: `cut` closes every connection and refuses new ones
/// until `restore`; `cut_after` lets that many more bytes through towards the server first.
pub struct Proxy {
    pub port: u16,
    up: Arc<AtomicBool>,
    /// Bytes still allowed towards the server before the proxy cuts itself (u64::MAX: no
    /// limit).
    budget: Arc<AtomicU64>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let budget = Arc::new(AtomicU64::new(u64::MAX));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (up2, budget2, open2) = (up.clone(), budget.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !up2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                {
                    let mut open = open2.lock().unwrap();
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (up3, budget3, open3) = (up2.clone(), budget2.clone(), open2.clone());
                std::thread::spawn(move || {
                    pump(client, server, Some((&up3, &budget3, &open3)));
                });
                std::thread::spawn(move || pump(s2, c2, None));
            }
        });
        Proxy {
            port,
            up,
            budget,
            open,
        }
    }

    /// Close every connection and refuse new ones.
    pub fn cut(&self) {
        cut(&self.up, &self.open);
    }

    /// Let `bytes` more bytes through towards the server, then cut.
    pub fn cut_after(&self, bytes: u64) {
        self.budget.store(bytes, Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.budget.store(u64::MAX, Ordering::SeqCst);
        self.up.store(true, Ordering::SeqCst);
    }
}

fn cut(up: &AtomicBool, open: &Mutex<Vec<TcpStream>>) {
    up.store(false, Ordering::SeqCst);
    for stream in open.lock().unwrap().drain(..) {
        let _ = stream.shutdown(Shutdown::Both);
    }
}

type Limit<'a> = (&'a AtomicBool, &'a AtomicU64, &'a Mutex<Vec<TcpStream>>);

fn pump(mut from: TcpStream, mut to: TcpStream, limit: Option<Limit<'_>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((up, budget, open)) = limit {
            if !up.load(Ordering::SeqCst) {
                break;
            }
            let left = budget.load(Ordering::SeqCst);
            if left != u64::MAX {
                if (n as u64) >= left {
                    let _ = to.write_all(&buf[..left as usize]);
                    cut(up, open);
                    break;
                }
                budget.store(left - n as u64, Ordering::SeqCst);
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
