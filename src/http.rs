//! The HTTP/1 endpoints of a daemon (the metrics and the page, [`crate::metrics_http`]; the
//! S3 door, [`crate::s3door`]): hyper's server on a tokio runtime in a thread of its own
//! ([`Endpoint`]), with what bounds a client ([`serve_connections`]): at most a number of
//! connections at once, past which further ones wait in the kernel's listen queue; a
//! request's headers within [`HEADER_TIMEOUT`] (and a kept-alive connection's next request);
//! an answer taken within [`WRITE_TIMEOUT`] once the socket's buffer is full
//! ([`WriteDeadline`]).

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use ckptfs_core::error::{Error, Result};

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

/// One endpoint, serving in a thread of its own until dropped.
pub struct Endpoint {
    what: &'static str,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// Run `serve` (given `listener`, non-blocking, and the signal to stop) on `runtime`
    /// in a thread named `thread`; `what` names the endpoint in messages.
    pub fn start<F>(
        what: &'static str,
        thread: &str,
        listener: TcpListener,
        runtime: tokio::runtime::Runtime,
        serve: impl FnOnce(TcpListener, tokio::sync::oneshot::Receiver<()>) -> F + Send + 'static,
    ) -> Result<Endpoint>
    where
        F: Future<Output = ()>,
    {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(format!("{what} address"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("{what} at {addr}"), e))?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || runtime.block_on(serve(listener, stopped)))
            .map_err(|e| Error::io(format!("start the {what}"), e))?;
        Ok(Endpoint {
            what,
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

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the {}'s thread panicked", self.what);
            }
        }
    }
}

/// Accept connections on `listener` until `stopped`, at most `max` open at once (past
/// that nothing is accepted: further connections wait in the kernel's queue), each served
/// by a task of its own with a service from `make`, within `limits`. Dropping the runtime
/// afterwards ends the connections still open.
pub async fn serve_connections<S, B>(
    what: &'static str,
    listener: TcpListener,
    limits: Limits,
    max: usize,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    make: impl Fn() -> S,
) where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            log::error!("{what}: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    let mut full_since_logged = false;
    loop {
        // A free slot first: while none is, nothing is accepted (the kernel queues them).
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if !full_since_logged {
                    log::warn!("{what}: {max} connections open, accepting more as they end");
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
                    log::warn!("{what}: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if slots.available_permits() > max / 2 {
            full_since_logged = false;
        }
        let _ = stream.set_nodelay(true);
        let service = make();
        tokio::spawn(async move {
            let _slot = slot;
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header)
                .serve_connection(
                    TokioIo::new(WriteDeadline::new(stream, limits.write)),
                    service,
                )
                .await;
            if let Err(e) = served {
                log::debug!("{what}: connection: {e}");
            }
        });
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
}
