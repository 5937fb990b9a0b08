//! `ckptfs mount --metrics-listen ADDR`: the text of `.ckptfs/metrics` over HTTP at
//! `GET /metrics`, for a Prometheus server that scrapes it, and at `GET /` the page for
//! people ([`crate::page`]) (off unless asked for).
//!
//! hyper's HTTP/1 server on a current-thread tokio runtime in one thread of its own:
//! hyper and tokio are in the dependency tree already (object storage's HTTP client), and
//! a scrape endpoint needs nothing more. The address is bound before the engine opens and
//! before the mount (see [`bind`]), so a bad or busy address fails the mount cleanly.
//!
//! What a client may hold of the daemon is bounded, whoever it is (anyone who can reach
//! the address; a local user for a loopback one):
//! - at most [`MAX_CONNECTIONS`] connections are served at once; past that the endpoint
//!   stops accepting and further connections wait in the kernel's listen queue until one
//!   ends, so a scrape that comes during a flood is answered late rather than refused;
//! - a client has [`HEADER_TIMEOUT`] to send its request's headers, and a kept-alive
//!   connection is closed when no next request has arrived [`HEADER_TIMEOUT`] after the
//!   last answer (hyper's header timer starts when it waits for a request);
//! - an answer must be taken by the client: once the socket's buffer is full, the rest of
//!   the answer must be written within [`WRITE_TIMEOUT`], else the connection is dropped
//!   ([`WriteDeadline`]). A client that sends `GET /` and never reads holds its
//!   connection that long, not forever;
//! - the page's large part is rendered once per change of the retained checkpoints and
//!   shared by every answer ([`crate::page::Rendered`]), so the clients reading a page
//!   hold one copy of it between them, not one each. `/metrics` is rendered per request:
//!   it does not grow with the history (the newest checkpoint's operators and states).
//!
//! So what the endpoint holds is at most [`MAX_CONNECTIONS`] connections' buffers (about
//! 20 KiB each) and status parts, plus the page's drawings answers are still sending
//! (one, unless the retained checkpoints change while slow clients read).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use ckptfs_core::coordinator::Engine;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::metrics;

use crate::page::Page;

/// A client that has not sent its request headers after this long is dropped; so is a
/// kept-alive connection that sends no next request this long after an answer.
/// `CKPTFS_HTTP_IDLE_TIMEOUT_MS` sets another (for tests).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Once a connection's socket buffer is full, the rest of the answer must be written
/// within this time, else the connection is dropped (a client that asks and never reads,
/// or reads a byte now and then). The page of 16,000 checkpoints (6 MiB) takes 30 s at
/// 200 KiB/s. `CKPTFS_HTTP_WRITE_TIMEOUT_MS` sets another (for tests).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections served at once; further ones wait in the listen queue until one ends. A
/// Prometheus server keeps one connection per target; 64 leaves room for people's
/// browsers (a few each) and bounds what a flood of connections can hold.
pub const MAX_CONNECTIONS: usize = 64;

/// The limits of one endpoint: the constants above unless the environment sets others.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A request's headers must come within this (and a next request after an answer).
    pub header: Duration,
    /// An answer must be taken within this once the socket's buffer is full.
    pub write: Duration,
}

impl Limits {
    /// [`HEADER_TIMEOUT`] and [`WRITE_TIMEOUT`], unless the environment sets others.
    pub fn from_env() -> Limits {
        let ms = |name: &str, default: Duration| match std::env::var(name) {
            Err(_) => default,
            Ok(v) => match v.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    log::warn!("{name}={v:?} is not a number of milliseconds: ignored");
                    default
                }
            },
        };
        Limits {
            header: ms("CKPTFS_HTTP_IDLE_TIMEOUT_MS", HEADER_TIMEOUT),
            write: ms("CKPTFS_HTTP_WRITE_TIMEOUT_MS", WRITE_TIMEOUT),
        }
    }
}

/// Bind `addr` for the metrics endpoint (its error names the option and the address).
pub fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| Error::io(format!("--metrics-listen {addr}"), e))
}

/// The endpoint, serving until dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Serve `engine`'s metrics and page on `listener` (from [`bind`]) in a thread of its
    /// own.
    pub fn start(listener: TcpListener, engine: Engine) -> Result<MetricsServer> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("metrics endpoint address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("--metrics-listen {addr}"), e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            // Answers are made on these (at most two at once: two cores' worth).
            .max_blocking_threads(2)
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::io("start the metrics endpoint", e))?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let page = Arc::new(Page::new(engine.clone()));
        let limits = Limits::from_env();
        let thread = std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || runtime.block_on(serve(listener, engine, page, limits, stopped)))
            .map_err(|e| Error::io("start the metrics endpoint", e))?;
        log::info!("metrics at http://{addr}/metrics, the page at http://{addr}/");
        Ok(MetricsServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the metrics endpoint's thread panicked");
            }
        }
    }
}

/// Accept connections until `stopped`, at most [`MAX_CONNECTIONS`] open at once; each is
/// served by a task of its own. Dropping the runtime afterwards ends the connections still
/// open.
async fn serve(
    listener: TcpListener,
    engine: Engine,
    page: Arc<Page>,
    limits: Limits,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            log::error!("metrics endpoint: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut full_since_logged = false;
    loop {
        // A free slot first: while none is, nothing is accepted (the kernel queues them).
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if !full_since_logged {
                    log::warn!(
                        "metrics endpoint: {MAX_CONNECTIONS} connections open, \
                         accepting more as they end"
                    );
                    full_since_logged = true;
                }
                tokio::select! {
                    _ = &mut stopped => return,
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => return,
                    },
                }
            }
        };
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    log::warn!("metrics endpoint: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if slots.available_permits() > MAX_CONNECTIONS / 2 {
            full_since_logged = false;
        }
        let engine = engine.clone();
        let page = page.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (engine, page) = (engine.clone(), page.clone());
                let get = matches!(request.method(), &Method::GET | &Method::HEAD);
                let path = request.uri().path().to_string();
                // Off the accepting thread: the first page after a checkpoint counts du
                // over every retained checkpoint.
                async move {
                    let answered =
                        tokio::task::spawn_blocking(move || answer(get, &path, &engine, &page));
                    Ok::<_, Infallible>(answered.await.unwrap_or_else(|e| {
                        log::error!("metrics endpoint: {e}");
                        let mut failed = Response::new(Pieces::new(Vec::new()));
                        *failed.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                        failed
                    }))
                }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header)
                .serve_connection(
                    TokioIo::new(WriteDeadline::new(stream, limits.write)),
                    service,
                )
                .await;
            if let Err(e) = served {
                log::debug!("metrics endpoint: connection: {e}");
            }
        });
    }
}

/// `GET /metrics` (or `HEAD`; `get` says whether the method was one of them): the
/// metrics; `GET /`: the page; anything else: 404 or 405 with a hint.
fn answer(get: bool, path: &str, engine: &Engine, page: &Page) -> Response<Pieces> {
    let (status, content_type, body) = match (get, path) {
        (true, "/metrics") => (
            StatusCode::OK,
            metrics::CONTENT_TYPE,
            vec![Bytes::from(metrics::render(engine))],
        ),
        (true, "/") => {
            let page = page.render();
            (
                StatusCode::OK,
                "text/html; charset=utf-8",
                vec![page.head, page.drawn, page.foot],
            )
        }
        (false, "/metrics" | "/") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            vec![Bytes::from_static(b"only GET and HEAD are answered here\n")],
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            vec![Bytes::from_static(
                b"ckptfs serves its metrics at /metrics and a page at /\n",
            )],
        ),
    };
    let mut response = Response::new(Pieces::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
    }
    response
}

/// A response body of several pieces, each handed to hyper as it is: hyper queues them
/// for a vectored write without copying, so the page's shared part stays one allocation
/// however many answers are sending it. Its exact length is known (`Content-Length`).
pub struct Pieces(std::collections::VecDeque<Bytes>);

impl Pieces {
    /// The body of `pieces`, in order (empty ones left out).
    pub fn new(pieces: Vec<Bytes>) -> Pieces {
        Pieces(pieces.into_iter().filter(|b| !b.is_empty()).collect())
    }
}

impl hyper::body::Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|b| b.len() as u64).sum())
    }
}

/// A connection's socket whose writes must keep up: once a write finds the socket's
/// buffer full (it writes less than it was given, or nothing), the writes must catch up
/// (write all they are given) within the timeout, else the next write fails with
/// `TimedOut` and hyper drops the connection, and with it the answer it was sending. A
/// deadline, not an inactivity timer: a client that reads a little now and then is
/// dropped as one that never reads. Reads pass through (hyper's header timer bounds
/// them); vectored writes are kept (else hyper would copy each answer into a buffer of
/// its own).
pub struct WriteDeadline<T> {
    inner: T,
    timeout: Duration,
    behind: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteDeadline<T> {
    /// `inner`, whose writes must catch up within `timeout` once behind.
    pub fn new(inner: T, timeout: Duration) -> WriteDeadline<T> {
        WriteDeadline {
            inner,
            timeout,
            behind: None,
        }
    }

    /// The deadline's account of a write of `offered` bytes that returned `written`.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        offered: usize,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) => {
                if n >= offered {
                    self.behind = None;
                } else if self.behind.is_none() {
                    self.behind = Some(Box::pin(tokio::time::sleep(self.timeout)));
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let timeout = self.timeout;
                let deadline = self
                    .behind
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                // Polled here, so that the deadline wakes the connection if the socket
                // never does.
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took no answer for {timeout:?}"),
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(cx, buf.len(), written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let offered = bufs.iter().map(|b| b.len()).sum();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, offered, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A connected pair: the server's end (tokio) and the client's (std).
    async fn pair() -> (tokio::net::TcpStream, std::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (server, client)
    }

    /// Write all of `data` through `w`, vectored in two halves as hyper writes.
    async fn write_all(
        w: &mut WriteDeadline<tokio::net::TcpStream>,
        mut data: &[u8],
    ) -> io::Result<()> {
        while !data.is_empty() {
            let (a, b) = data.split_at(data.len() / 2);
            let n = std::future::poll_fn(|cx| {
                Pin::new(&mut *w)
                    .poll_write_vectored(cx, &[io::IoSlice::new(a), io::IoSlice::new(b)])
            })
            .await?;
            assert!(n > 0);
            data = &data[n..];
        }
        Ok(())
    }

    const DATA: usize = 32 << 20;

    #[tokio::test]
    async fn a_client_that_reads_gets_everything() {
        let (server, mut client) = pair().await;
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            client.read_to_end(&mut got).unwrap();
            got.len()
        });
        let mut w = WriteDeadline::new(server, Duration::from_secs(20));
        assert!(w.is_write_vectored());
        write_all(&mut w, &vec![7u8; DATA]).await.unwrap();
        drop(w);
        assert_eq!(reader.join().unwrap(), DATA);
    }

    #[tokio::test]
    async fn a_client_that_never_reads_times_out() {
        let (server, _client) = pair().await;
        let mut w = WriteDeadline::new(server, Duration::from_millis(200));
        let e = write_all(&mut w, &vec![7u8; DATA]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    }

    /// Reading a little now and then does not hold the deadline off.
    #[tokio::test]
    async fn a_client_that_reads_slowly_times_out() {
        let (server, mut client) = pair().await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trickle = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if client.read(&mut buf).unwrap_or(0) == 0 {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let mut w = WriteDeadline::new(server, Duration::from_millis(500));
        let e = write_all(&mut w, &vec![7u8; DATA]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(w);
        trickle.join().unwrap();
    }

    #[test]
    fn pieces_say_their_length_and_come_in_order() {
        use hyper::body::Body;
        let shared = Bytes::from(vec![b'x'; 1000]);
        let mut body = Pieces::new(vec![
            Bytes::from_static(b"head"),
            Bytes::new(),
            shared.clone(),
            Bytes::from_static(b"foot"),
        ]);
        assert_eq!(body.size_hint().exact(), Some(1008));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut got = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            got.push(frame.unwrap().into_data().unwrap());
        }
        assert!(body.is_end_stream());
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], "head");
        // The shared piece is the same allocation, not a copy.
        assert_eq!(got[1].as_ptr(), shared.as_ptr());
        assert_eq!(got[2], "foot");
    }
}
