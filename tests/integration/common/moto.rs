//! A real S3-compatible server for the tests: `moto_server` (Python package `moto[server]`)
//! on 127.0.0.1, one per test binary, with the standard AWS environment variables pointing
//! at it (inherited by the daemons the tests start). And a TCP proxy in front of it that a
//! test can cut, to take the server away without losing what it stores; and an HTTP proxy
//! that can hold chosen requests or lose their responses.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

#[path = "../../../crates/core/src/store/s3/moto_server.rs"]
mod moto_server;

pub struct Moto {
    pub port: u16,
}

static MOTO: OnceLock<Moto> = OnceLock::new();
static MOTO_SMALL_PARTS: OnceLock<Moto> = OnceLock::new();
static BUCKETS: AtomicU64 = AtomicU64::new(0);

/// A port nobody listens on just now.
pub fn free_port() -> u16 {
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
        moto_server::start(port);
        // SAFETY (edition 2021): set once, before any client of this binary reads them.
        for (key, value) in env_for(port) {
            std::env::set_var(key, value);
        }
        Moto { port }
    })
}

/// A second server, which takes multipart uploads of parts from 1 KiB (S3 and the other
/// server: 5 MiB), so that tests copy objects in parts without copying megabytes. The AWS
/// environment stays [`moto`]'s: give this one's endpoint to each client.
pub fn moto_small_parts() -> &'static Moto {
    moto();
    MOTO_SMALL_PARTS.get_or_init(|| {
        let port = free_port();
        moto_server::start_with(port, &[("S3_UPLOAD_PART_MIN_SIZE", "1024")]);
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
        format!("s3://{}/store", self.bucket())
    }

    /// A new, empty bucket's name.
    pub fn bucket(&self) -> String {
        let n = BUCKETS.fetch_add(1, Ordering::SeqCst);
        let bucket = format!("ckptfs-test-{}-{n}", std::process::id());
        create_bucket(self.port, &bucket);
        bucket
    }
}

pub use moto_server::create_bucket;

/// Put an object with a plain (unsigned) request, as another application would have
/// written it (a Flink job's checkpoint files).
pub fn put_object(port: u16, bucket: &str, key: &str, bytes: &[u8]) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "PUT /{bucket}/{key} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        bytes.len()
    )
    .unwrap();
    stream.write_all(bytes).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "put {key}: {answer}");
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

/// An HTTP/1.1 proxy in front of a server, for faults a byte-level cut cannot make: it reads
/// each request and each response whole (heads, and bodies by Content-Length or chunked
/// framing, forwarded as they came), one exchange at a time per connection, and can hold
/// chosen requests until `release` or lose their responses.
///
/// Each client connection has its own connection to the server, opened when a request is to
/// be forwarded. Client connections are kept alive unless the client asks otherwise: when
/// the server closes its side after a response (moto announces `Connection: close` on every
/// response), the proxy removes that `Connection` header from the response and opens a new
/// connection for the client's next request. A close the server did not announce (while
/// idle, or mid-response) is passed on: the proxy closes the client's connection.
pub struct HttpProxy {
    pub port: u16,
    shared: Arc<HttpShared>,
}

#[derive(Default)]
struct HttpShared {
    state: Mutex<HttpState>,
    changed: Condvar,
}

#[derive(Default)]
struct HttpState {
    /// Faults still to apply, in the order they were added.
    rules: Vec<HttpRule>,
    /// Requests read completely and waiting for `release`.
    held: usize,
    /// How many times `release` was called: a request held before the last call goes on.
    releases: u64,
    /// Method and request-target of every request read so far.
    seen: Vec<(String, String)>,
    /// The headers of each of them (names in lower case), in the same order.
    headers: Vec<Vec<(String, String)>>,
    /// The open streams (client and server sides) by number, closed when the proxy is
    /// dropped.
    open: HashMap<u64, TcpStream>,
    streams: u64,
    closed: bool,
}

struct HttpRule {
    method: String,
    path_part: String,
    left: usize,
    fault: HttpFault,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum HttpFault {
    Hold,
    DropResponse,
    Unavailable,
}

/// Whether a request matches a rule's method (ASCII case ignored) and part of the path.
fn http_matches(method: &str, path_part: &str, request: &(String, String)) -> bool {
    request.0.eq_ignore_ascii_case(method) && request.1.contains(path_part)
}

impl HttpProxy {
    /// Forward every request to 127.0.0.1:`target`.
    pub fn start(target: u16) -> HttpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(HttpShared::default());
        let shared2 = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if shared2.lock().closed {
                    break;
                }
                let Ok(client) = client else { continue };
                let shared = shared2.clone();
                std::thread::spawn(move || HttpConnection::serve(shared, client, target));
            }
        });
        HttpProxy { port, shared }
    }

    /// Hold the next `times` requests with this method whose request-target (e.g.
    /// "/bucket/store/checkpoints/2.json?...") contains `path_part`: each is read completely
    /// from the client (with `Expect: 100-continue`, its head only: the client sends the body
    /// after the server's `100 Continue`) and forwarded only at `release`, even if the client
    /// has given up on it meanwhile.
    pub fn hold(&self, method: &str, path_part: &str, times: usize) {
        self.add(HttpFault::Hold, method, path_part, times);
    }

    /// Wait until at least `n` requests are held, at most `timeout`; whether they are.
    pub fn wait_held(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        while state.held < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self.shared.changed.wait_timeout(state, left).unwrap().0;
        }
        true
    }

    /// Forward every held request now (each gets its response as usual) and drop the hold
    /// rules not used up.
    pub fn release(&self) {
        let mut state = self.shared.lock();
        state.releases += 1;
        state.held = 0;
        state.rules.retain(|rule| rule.fault != HttpFault::Hold);
        self.shared.changed.notify_all();
    }

    /// For the next `times` matching requests: forward the request, read the server's whole
    /// response, then close the client's connection without sending it (interim `1xx`
    /// responses still pass). The request took effect; the client never learns.
    pub fn drop_response(&self, method: &str, path_part: &str, times: usize) {
        self.add(HttpFault::DropResponse, method, path_part, times);
    }

    /// For the next `times` matching requests: answer `503 Slow Down` without forwarding
    /// them (the request never takes effect), as a busy S3 does.
    pub fn unavailable(&self, method: &str, path_part: &str, times: usize) {
        self.add(HttpFault::Unavailable, method, path_part, times);
    }

    /// How many requests matching (`method`, `path_part`) the proxy has read so far, whatever
    /// became of them (held ones included).
    pub fn seen(&self, method: &str, path_part: &str) -> usize {
        let state = self.shared.lock();
        state
            .seen
            .iter()
            .filter(|request| http_matches(method, path_part, request))
            .count()
    }

    /// The request-target and headers of every request seen of `method` whose path holds
    /// `path_part`.
    pub fn requests(&self, method: &str, path_part: &str) -> Vec<(String, Vec<(String, String)>)> {
        let state = self.shared.lock();
        state
            .seen
            .iter()
            .zip(&state.headers)
            .filter(|(request, _)| http_matches(method, path_part, request))
            .map(|((_, target), headers)| (target.clone(), headers.clone()))
            .collect()
    }

    fn add(&self, fault: HttpFault, method: &str, path_part: &str, times: usize) {
        if times > 0 {
            self.shared.lock().rules.push(HttpRule {
                method: method.to_string(),
                path_part: path_part.to_string(),
                left: times,
                fault,
            });
        }
    }
}

impl Drop for HttpProxy {
    /// Close every connection (held requests are not forwarded) and stop listening.
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closed = true;
        for (_, stream) in state.open.drain() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        self.shared.changed.notify_all();
        drop(state);
        // Wake the listener so that it sees `closed`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl HttpShared {
    fn lock(&self) -> MutexGuard<'_, HttpState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request was read up to its body: the fault to apply to it, if any, and the count of
    /// releases so far.
    fn arrive(
        &self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
    ) -> (Option<HttpFault>, u64) {
        let mut state = self.lock();
        let request = (method.to_string(), target.to_string());
        let mut fault = None;
        if let Some(i) = state
            .rules
            .iter()
            .position(|rule| http_matches(&rule.method, &rule.path_part, &request))
        {
            let rule = &mut state.rules[i];
            fault = Some(rule.fault);
            rule.left -= 1;
            if rule.left == 0 {
                state.rules.remove(i);
            }
        }
        state.seen.push(request);
        state.headers.push(headers.to_vec());
        (fault, state.releases)
    }

    /// Hold a request (that arrived when `releases` was `since`) until released; false when
    /// the proxy was dropped instead.
    fn hold_until_released(&self, since: u64) -> bool {
        let mut state = self.lock();
        if state.releases == since && !state.closed {
            state.held += 1;
            self.changed.notify_all();
            while state.releases == since && !state.closed {
                state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        }
        !state.closed
    }

    /// Remember a stream to close it when the proxy is dropped: its number, or None if the
    /// proxy already was.
    fn register(&self, stream: &TcpStream) -> Option<u64> {
        let clone = stream.try_clone().ok()?;
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        state.streams += 1;
        let id = state.streams;
        state.open.insert(id, clone);
        Some(id)
    }

    /// Close a registered stream.
    fn close(&self, id: u64) {
        if let Some(stream) = self.lock().open.remove(&id) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// The server side of a proxied connection.
struct Upstream {
    /// Its number among the open streams.
    id: u64,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Upstream {
    /// Whether the server closed the connection (or sent something unasked) by now.
    fn gone(&self) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let mut fds = [pollfd(&self.writer)];
        poll(&mut fds, 0).is_err() || fds[0].revents != 0
    }
}

/// One client connection and its connection to the server.
struct HttpConnection {
    shared: Arc<HttpShared>,
    /// The client stream's number among the open streams.
    id: u64,
    target: u16,
    client: BufReader<TcpStream>,
    client_out: TcpStream,
    upstream: Option<Upstream>,
}

/// The longest request or status line, header line or chunk-size line read.
const HTTP_MAX_LINE: u64 = 64 * 1024;
/// The largest head (start line and headers).
const HTTP_MAX_HEAD: usize = 1 << 20;

impl HttpConnection {
    fn serve(shared: Arc<HttpShared>, client: TcpStream, target: u16) {
        let _ = client.set_nodelay(true);
        let Ok(client_out) = client.try_clone() else {
            return;
        };
        let Some(id) = shared.register(&client) else {
            let _ = client.shutdown(Shutdown::Both);
            return;
        };
        let mut connection = HttpConnection {
            shared,
            id,
            target,
            client: BufReader::new(client),
            client_out,
            upstream: None,
        };
        while let Ok(true) = connection.exchange() {}
        connection.close();
    }

    fn close(&mut self) {
        self.shared.close(self.id);
        self.close_upstream();
    }

    fn close_upstream(&mut self) {
        if let Some(upstream) = self.upstream.take() {
            self.shared.close(upstream.id);
        }
    }

    /// Wait for the client's next request: false when the server closes its connection
    /// first, or sends something unasked.
    fn wait_for_request(&self) -> bool {
        if !self.client.buffer().is_empty() {
            return true;
        }
        let Some(upstream) = &self.upstream else {
            // Nothing to watch but the client: reading the head waits.
            return true;
        };
        if !upstream.reader.buffer().is_empty() {
            return false;
        }
        let mut fds = [pollfd(&self.client_out), pollfd(&upstream.writer)];
        poll(&mut fds, -1).is_ok() && fds[1].revents == 0
    }

    /// A connection to the server for the next request: the open one, unless the server
    /// closed it meanwhile (while a request was held), else a new one.
    fn connect(&mut self) -> io::Result<()> {
        if self.upstream.as_ref().is_some_and(Upstream::gone) {
            self.close_upstream();
        }
        if self.upstream.is_none() {
            let stream = TcpStream::connect(("127.0.0.1", self.target))?;
            stream.set_nodelay(true)?;
            let Some(id) = self.shared.register(&stream) else {
                return Err(io::Error::other("proxy dropped"));
            };
            self.upstream = Some(Upstream {
                id,
                reader: BufReader::new(stream.try_clone()?),
                writer: stream,
            });
        }
        Ok(())
    }

    /// Pass one request and its response: whether the connection goes on.
    fn exchange(&mut self) -> io::Result<bool> {
        if !self.wait_for_request() {
            return Ok(false);
        }
        let Some(request_head) = read_head(&mut self.client, true)? else {
            return Ok(false);
        };
        let request = Head::parse(&request_head)?;
        let (method, target, version) = request.request_line()?;
        let body = request.request_body()?;
        let expect_continue = body != Body::Length(0) && request.has("expect", "100-continue");
        let client_keeps = request.keep_alive(&version);
        let (fault, since) = self.shared.arrive(&method, &target, &request.headers);
        let mut held_body = None;
        if fault == Some(HttpFault::Hold) {
            if !expect_continue {
                let mut bytes = Vec::new();
                copy_body(&mut self.client, body, &mut bytes)?;
                held_body = Some(bytes);
            }
            if !self.shared.hold_until_released(since) {
                return Ok(false);
            }
        }
        if fault == Some(HttpFault::Unavailable) {
            if !expect_continue {
                copy_body(&mut self.client, body, &mut io::sink())?;
            }
            (&self.client_out).write_all(
                b"HTTP/1.1 503 Slow Down\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )?;
            return Ok(false);
        }
        let dropping = fault == Some(HttpFault::DropResponse);

        if self.connect().is_err() {
            return Ok(false);
        }
        let upstream = self.upstream.as_mut().unwrap();
        let mut to_server = BufWriter::with_capacity(64 * 1024, &upstream.writer);
        to_server.write_all(&request_head)?;
        // A final response that came instead of `100 Continue`: the body was not sent.
        let mut early = None;
        match held_body {
            Some(bytes) => to_server.write_all(&bytes)?,
            None if expect_continue => {
                to_server.flush()?;
                loop {
                    let head = read_head(&mut upstream.reader, false)?.ok_or_else(eof)?;
                    let status = Head::parse(&head)?.status()?.1;
                    if !is_interim(status) {
                        early = Some(head);
                        break;
                    }
                    (&self.client_out).write_all(&head)?;
                    if status == 100 {
                        copy_body(&mut self.client, body, &mut to_server)?;
                        break;
                    }
                }
            }
            None => copy_body(&mut self.client, body, &mut to_server)?,
        }
        to_server.flush()?;
        drop(to_server);
        let body_skipped = early.is_some();

        // Interim responses pass; then the final one.
        let (response_head, response, version, status) = loop {
            let head = match early.take() {
                Some(head) => head,
                None => read_head(&mut upstream.reader, false)?.ok_or_else(eof)?,
            };
            let response = Head::parse(&head)?;
            let (version, status) = response.status()?;
            if is_interim(status) {
                (&self.client_out).write_all(&head)?;
                continue;
            }
            break (head, response, version, status);
        };
        if status == 101 {
            // Switching protocols: bytes both ways from now on.
            (&self.client_out).write_all(&response_head)?;
            (&self.client_out).write_all(upstream.reader.buffer())?;
            (&upstream.writer).write_all(self.client.buffer())?;
            let (from_server, to_client) = (
                upstream.reader.get_ref().try_clone()?,
                self.client_out.try_clone()?,
            );
            let back = std::thread::spawn(move || pump(from_server, to_client, None));
            pump(
                self.client.get_ref().try_clone()?,
                upstream.writer.try_clone()?,
                None,
            );
            let _ = back.join();
            return Ok(false);
        }
        let response_body = response.response_body(&method, status)?;
        let server_keeps = response_body != Body::UntilClose && response.keep_alive(&version);
        let client_keeps = client_keeps
            && !body_skipped
            && response_body != Body::UntilClose
            && (version != "HTTP/1.0" || server_keeps);
        if dropping {
            copy_body(&mut upstream.reader, response_body, &mut io::sink())?;
            return Ok(false);
        }
        let mut to_client = BufWriter::with_capacity(64 * 1024, &self.client_out);
        if client_keeps && !server_keeps {
            to_client.write_all(&without_header(&response_head, "connection"))?;
        } else {
            to_client.write_all(&response_head)?;
        }
        copy_body(&mut upstream.reader, response_body, &mut to_client)?;
        to_client.flush()?;
        drop(to_client);
        if !server_keeps {
            self.close_upstream();
        }
        Ok(client_keeps)
    }
}

fn eof() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "connection closed mid-message",
    )
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A `1xx` response other than `101 Switching Protocols`: another response follows.
fn is_interim(status: u16) -> bool {
    (100..200).contains(&status) && status != 101
}

fn pollfd(stream: &TcpStream) -> libc::pollfd {
    libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }
}

fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<()> {
    loop {
        // SAFETY: `fds` is a valid slice of pollfd for the whole call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n >= 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// One line with its line ending (empty at the end of the stream; without `\n` when cut
/// short or too long).
fn read_line(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    reader
        .by_ref()
        .take(HTTP_MAX_LINE)
        .read_until(b'\n', &mut line)?;
    Ok(line)
}

/// A whole line, or an error.
fn read_full_line(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let line = read_line(reader)?;
    match line.last() {
        Some(b'\n') => Ok(line),
        _ if line.len() as u64 >= HTTP_MAX_LINE => Err(invalid("line too long")),
        _ => Err(eof()),
    }
}

/// A head (start line and headers, up to and including the empty line) as it came; None
/// when the stream ends before it starts. Empty lines before a request are skipped.
fn read_head(reader: &mut impl BufRead, request: bool) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let line = read_line(reader)?;
        if line.is_empty() && head.is_empty() {
            return Ok(None);
        }
        if line.last() != Some(&b'\n') {
            return Err(if line.len() as u64 >= HTTP_MAX_LINE {
                invalid("line too long")
            } else {
                eof()
            });
        }
        let blank = line == b"\r\n" || line == b"\n";
        if blank && head.is_empty() && request {
            continue;
        }
        head.extend_from_slice(&line);
        if blank {
            return Ok(Some(head));
        }
        if head.len() > HTTP_MAX_HEAD {
            return Err(invalid("head too large"));
        }
    }
}

/// `head` without the header `name` (any case), folded continuation lines included.
fn without_header(head: &[u8], name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len());
    let mut skipping = false;
    for (i, line) in head.split_inclusive(|&b| b == b'\n').enumerate() {
        let continuation = i > 0 && matches!(line.first(), Some(b' ' | b'\t'));
        if !continuation {
            skipping = i > 0
                && line.iter().position(|&b| b == b':').is_some_and(|colon| {
                    line[..colon]
                        .trim_ascii()
                        .eq_ignore_ascii_case(name.as_bytes())
                });
        }
        if !skipping {
            out.extend_from_slice(line);
        }
    }
    out
}

/// How a message's body is delimited.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Body {
    Length(u64),
    Chunked,
    /// Until the server closes the connection.
    UntilClose,
}

/// Copy a body as it comes (chunk framing and trailers included).
fn copy_body(reader: &mut impl BufRead, body: Body, out: &mut impl Write) -> io::Result<()> {
    match body {
        Body::Length(n) => copy_exact(reader, n, out),
        Body::UntilClose => io::copy(reader, out).map(drop),
        Body::Chunked => loop {
            let line = read_full_line(reader)?;
            out.write_all(&line)?;
            let text = std::str::from_utf8(&line).map_err(|_| invalid("chunk size"))?;
            let size = text.split(';').next().unwrap_or("").trim();
            let size = u64::from_str_radix(size, 16).map_err(|_| invalid("chunk size"))?;
            if size == 0 {
                // Trailers, up to an empty line.
                loop {
                    let line = read_full_line(reader)?;
                    out.write_all(&line)?;
                    if line == b"\r\n" || line == b"\n" {
                        return Ok(());
                    }
                }
            }
            // The data and its CRLF.
            copy_exact(reader, size, out)?;
            let end = read_full_line(reader)?;
            if end != b"\r\n" && end != b"\n" {
                return Err(invalid("chunk end"));
            }
            out.write_all(&end)?;
        },
    }
}

fn copy_exact(reader: &mut impl BufRead, n: u64, out: &mut impl Write) -> io::Result<()> {
    if io::copy(&mut reader.by_ref().take(n), out)? < n {
        return Err(eof());
    }
    Ok(())
}

/// A parsed head: the start line and the headers, names in lower case.
struct Head {
    start: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn parse(raw: &[u8]) -> io::Result<Head> {
        let text = String::from_utf8_lossy(raw);
        let mut lines = text.lines();
        let start = lines.next().unwrap_or("").to_string();
        let mut headers: Vec<(String, String)> = Vec::new();
        for line in lines {
            if line.is_empty() {
                break;
            }
            if line.starts_with([' ', '\t']) {
                let last = headers.last_mut().ok_or_else(|| invalid("header line"))?;
                last.1.push(' ');
                last.1.push_str(line.trim());
                continue;
            }
            let (name, value) = line.split_once(':').ok_or_else(|| invalid("header line"))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
        Ok(Head { start, headers })
    }

    /// Method, request-target and version of a request.
    fn request_line(&self) -> io::Result<(String, String, String)> {
        match self.start.split_whitespace().collect::<Vec<_>>()[..] {
            [method, target, version] => {
                Ok((method.to_string(), target.to_string(), version.to_string()))
            }
            _ => Err(invalid("request line")),
        }
    }

    /// Version and status code of a response.
    fn status(&self) -> io::Result<(String, u16)> {
        let mut words = self.start.split_whitespace();
        let version = words.next().unwrap_or("");
        let status = words.next().and_then(|s| s.parse().ok());
        match status {
            Some(status) if version.starts_with("HTTP/") => Ok((version.to_string(), status)),
            _ => Err(invalid("status line")),
        }
    }

    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The comma-separated elements of a header, all its lines.
    fn elements<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.values(name)
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|e| !e.is_empty())
    }

    /// Whether header `name` lists `token` (any case).
    fn has(&self, name: &str, token: &str) -> bool {
        self.elements(name).any(|e| e.eq_ignore_ascii_case(token))
    }

    /// Whether the connection stays open after this message, by its `version`.
    fn keep_alive(&self, version: &str) -> bool {
        if version == "HTTP/1.0" {
            self.has("connection", "keep-alive")
        } else {
            !self.has("connection", "close")
        }
    }

    fn content_length(&self) -> io::Result<Option<u64>> {
        let mut length = None;
        for element in self.elements("content-length") {
            let n: u64 = element.parse().map_err(|_| invalid("content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(invalid("content-length"));
            }
            length = Some(n);
        }
        Ok(length)
    }

    /// Whether the message has a Transfer-Encoding, and whether it ends in chunked.
    fn chunked(&self) -> Option<bool> {
        let last = self.elements("transfer-encoding").last()?;
        Some(last.eq_ignore_ascii_case("chunked"))
    }

    fn request_body(&self) -> io::Result<Body> {
        match self.chunked() {
            Some(true) => Ok(Body::Chunked),
            Some(false) => Err(invalid("request transfer-encoding")),
            None => Ok(Body::Length(self.content_length()?.unwrap_or(0))),
        }
    }

    fn response_body(&self, method: &str, status: u16) -> io::Result<Body> {
        if method.eq_ignore_ascii_case("HEAD") || status < 200 || status == 204 || status == 304 {
            return Ok(Body::Length(0));
        }
        Ok(match self.chunked() {
            Some(true) => Body::Chunked,
            Some(false) => Body::UntilClose,
            None => match self.content_length()? {
                Some(n) => Body::Length(n),
                None => Body::UntilClose,
            },
        })
    }
}
