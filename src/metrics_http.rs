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
//! - at most [`MAX_CONNECTIONS`](crate::http::MAX_CONNECTIONS) connections are served at once; past that the endpoint
//!   stops accepting and further connections wait in the kernel's listen queue until one
//!   ends, so a scrape that comes during a flood is answered late rather than refused;
//! - a client has [`HEADER_TIMEOUT`](crate::http::HEADER_TIMEOUT) to send its request's headers, and a kept-alive
//!   connection is closed when no next request has arrived [`HEADER_TIMEOUT`](crate::http::HEADER_TIMEOUT) after the
//!   last answer (hyper's header timer starts when it waits for a request);
//! - an answer must be taken by the client: once the socket's buffer is full, the rest of
//!   the answer must be written within [`WRITE_TIMEOUT`](crate::http::WRITE_TIMEOUT), else the connection is dropped
//!   ([`WriteDeadline`](crate::http::WriteDeadline)). A client that sends `GET /` and never reads holds its
//!   connection that long, not forever;
//! - the page's large part is rendered once per change of the retained checkpoints and
//!   shared by every answer ([`crate::page::Rendered`]), so the clients reading a page
//!   hold one copy of it between them, not one each. `/metrics` is rendered per request:
//!   it does not grow with the history (the newest checkpoint's operators and states).
//!
//! So what the endpoint holds is at most [`MAX_CONNECTIONS`](crate::http::MAX_CONNECTIONS) connections' buffers (about
//! 20 KiB each) and status parts, plus the page's drawings answers are still sending
//! (one, unless the retained checkpoints change while slow clients read).

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};

use ckptfs_core::coordinator::Engine;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::metrics;

use crate::http::{serve_connections, Endpoint, Limits, MAX_CONNECTIONS};
use crate::page::Page;

/// Bind `addr` for the metrics endpoint (its error names the option and the address).
pub fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| Error::io(format!("--metrics-listen {addr}"), e))
}

/// The endpoint, serving until dropped.
pub struct MetricsServer(Endpoint);

impl MetricsServer {
    /// Serve `engine`'s metrics and page on `listener` (from [`bind`]) in a thread of its
    /// own.
    pub fn start(listener: TcpListener, engine: Engine) -> Result<MetricsServer> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            // Answers are made on these (at most two at once: two cores' worth).
            .max_blocking_threads(2)
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::io("start the metrics endpoint", e))?;
        let page = Arc::new(Page::new(engine.clone()));
        let limits = Limits::from_env();
        let endpoint = Endpoint::start(
            WHAT,
            "metrics-http",
            listener,
            runtime,
            move |listener, stopped| {
                serve_connections(
                    WHAT,
                    listener,
                    limits,
                    MAX_CONNECTIONS,
                    stopped,
                    move || {
                        let (engine, page) = (engine.clone(), page.clone());
                        hyper::service::service_fn(move |request: Request<Incoming>| {
                            let (engine, page) = (engine.clone(), page.clone());
                            let get = matches!(request.method(), &Method::GET | &Method::HEAD);
                            let path = request.uri().path().to_string();
                            // Off the accepting thread: the first page after a checkpoint
                            // counts du over every retained checkpoint.
                            async move {
                                let answered = tokio::task::spawn_blocking(move || {
                                    answer(get, &path, &engine, &page)
                                });
                                Ok::<_, Infallible>(answered.await.unwrap_or_else(|e| {
                                    log::error!("{WHAT}: {e}");
                                    let mut failed = Response::new(Pieces::new(Vec::new()));
                                    *failed.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                                    failed
                                }))
                            }
                        })
                    },
                )
            },
        )?;
        let addr = endpoint.local_addr();
        log::info!("metrics at http://{addr}/metrics, the page at http://{addr}/");
        Ok(MetricsServer(endpoint))
    }

    /// The address it listens on (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr()
    }
}

/// The endpoint, in messages.
const WHAT: &str = "metrics endpoint";

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
