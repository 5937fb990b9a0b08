//! `ckptfs mount --metrics-listen ADDR`: the text of `.ckptfs/metrics` over HTTP at
//! `GET /metrics`, for a Prometheus server that scrapes it, and at `GET /` the page for
//! people ([`crate::page`]) (off unless asked for).
//!
//! hyper's HTTP/1 server on a current-thread tokio runtime in one thread of its own:
//! hyper and tokio are in the dependency tree already (object storage's HTTP client), and
//! a scrape endpoint needs nothing more. The address is bound before the engine opens and
//! before the mount (see [`bind`]), so a bad or busy address fails the mount cleanly.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use ckptfs_core::coordinator::Engine;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::metrics;

use crate::daemon::tasks::SharedFollowerView;
use crate::page::Page;

/// A client that has not sent its request headers after this long is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// own; `follower` is what the daemon's Flink follower saw, if it follows a job.
    pub fn start(
        listener: TcpListener,
        engine: Engine,
        follower: Option<SharedFollowerView>,
    ) -> Result<MetricsServer> {
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
        let page = Arc::new(Page::new(engine.clone(), follower));
        let thread = std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || runtime.block_on(serve(listener, engine, page, stopped)))
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

/// Accept connections until `stopped`; each is served by a task of its own. Dropping the
/// runtime afterwards ends the connections still open.
async fn serve(
    listener: TcpListener,
    engine: Engine,
    page: Arc<Page>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            log::error!("metrics endpoint: {e}");
            return;
        }
    };
    loop {
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
        let engine = engine.clone();
        let page = page.clone();
        tokio::spawn(async move {
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
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
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

#[cfg(test)]
mod tests {
    use super::*;

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
