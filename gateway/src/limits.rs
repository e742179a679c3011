//! **Floor** (uses `config`, `metrics`): shared by `http` (the server) and `mcp` (its streams).
//!
//! HTTP limits: how long a client may take to send a request's head and its body, how long a
//! kept-alive connection may sit idle, how many connections may be open at once, and how many event
//! streams (SSE) one user may hold open.
//!
//! The three timeouts are enforced where the gateway waits for the client: in the connection's
//! reads ([`TrackedIo`]). Each connection is in one phase at a time:
//!
//! - **head** from its first byte (or, for a new connection, from `accept`) until the request's head
//!   has been parsed: at most the header timeout;
//! - **body** from then until the request's body has been read: at most the body timeout;
//! - **busy** while a request is being answered (a model turn or an event stream may take long):
//!   no limit here;
//! - **idle** from the end of the last response until the next request's first byte: at most the
//!   idle timeout.
//!
//! A read that would wait past its phase's deadline fails, and the connection is closed: a client
//! that trickles one header byte every few seconds cannot hold it. Connections beyond the cap are
//! answered `503` and closed at once, before any request is read. Everything refused or cut off is
//! counted in `/metrics`.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::{IncomingStream, Listener};
use axum::{Json, Router};
use http_body::{Body as HttpBody, Frame, SizeHint};
use prometheus::{IntCounterVec, IntGauge, Opts};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

use crate::config::Config;
use crate::metrics::Metrics;

/// Whose event streams are counted together: (tenant, user) as the database verified them.
pub type Who = (String, String);

/// What was refused at once, before any request on the connection was read.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\ncontent-length: 95\r\n\r\n\
{\"error\":{\"code\":\"TOO_MANY_CONNECTIONS\",\"message\":\"the gateway has too many open connections\"}}";

/// The limits, their counters, and the event streams each user holds open.
pub struct Limits {
    header: Duration,
    body: Duration,
    idle: Duration,
    max_connections: usize,
    max_streams: usize,
    open: AtomicUsize,
    streams: Mutex<HashMap<Who, usize>>,
    open_gauge: IntGauge,
    refused: IntCounterVec,
    cut: IntCounterVec,
}

impl Limits {
    /// From the configuration; the counters are registered with `metrics`.
    pub fn new(config: &Config, metrics: &Metrics) -> Limits {
        let open_gauge = IntGauge::new("ctxguard_http_connections_open", "Client connections open")
            .expect("metric");
        let refused = IntCounterVec::new(
            Opts::new(
                "ctxguard_http_refused_total",
                "Connections refused at once (max_connections) and event streams refused (streams_per_user)",
            ),
            &["reason"],
        )
        .expect("metric");
        let cut = IntCounterVec::new(
            Opts::new(
                "ctxguard_http_timeouts_total",
                "Connections closed because the client was too slow (header, body) or idle too long (idle)",
            ),
            &["phase"],
        )
        .expect("metric");
        // Every label exists from the start, so a scrape shows 0 rather than nothing.
        for reason in ["max_connections", "streams_per_user"] {
            refused.with_label_values(&[reason]);
        }
        for phase in ["header", "body", "idle"] {
            cut.with_label_values(&[phase]);
        }
        metrics.register(Box::new(open_gauge.clone()));
        metrics.register(Box::new(refused.clone()));
        metrics.register(Box::new(cut.clone()));
        Limits {
            header: Duration::from_millis(config.http_header_timeout_ms),
            body: Duration::from_millis(config.http_body_timeout_ms),
            idle: Duration::from_millis(config.http_idle_timeout_ms),
            max_connections: config.http_max_connections,
            max_streams: config.http_max_streams_per_user,
            open: AtomicUsize::new(0),
            streams: Mutex::new(HashMap::new()),
            open_gauge,
            refused,
            cut,
        }
    }

    /// A slot for one more connection, or `None` at the cap.
    fn admit(self: &Arc<Self>) -> Option<ConnSlot> {
        let admitted = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_connections).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.refused.with_label_values(&["max_connections"]).inc();
            return None;
        }
        self.open_gauge.inc();
        Some(ConnSlot(self.clone()))
    }

    /// A slot for one more event stream of `who`, or `None` at the per-user cap.
    fn stream_slot(self: &Arc<Self>, who: &Who) -> Option<StreamSlot> {
        let mut streams = self.streams.lock().expect("streams lock");
        let n = streams.entry(who.clone()).or_default();
        if *n >= self.max_streams {
            drop(streams);
            self.refused.with_label_values(&["streams_per_user"]).inc();
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            limits: self.clone(),
            who: who.clone(),
        })
    }

    /// `response`, counted as one of `who`'s open event streams while its body lasts, if it is one
    /// (`text/event-stream`). Over the per-user cap it is dropped (its stream ends) and the caller
    /// gets `429 TOO_MANY_STREAMS` instead.
    pub fn hold_stream(self: &Arc<Self>, who: &Who, response: Response) -> Response {
        if !is_event_stream(&response) {
            return response;
        }
        match self.stream_slot(who) {
            Some(slot) => response.map(|body| {
                Body::new(Held {
                    inner: body,
                    _slot: slot,
                })
            }),
            None => too_many_streams(),
        }
    }

    /// Reserve an event stream for `who` before starting one (`None`: answer [`too_many_streams`]).
    pub fn reserve_stream(self: &Arc<Self>, who: &Who) -> Option<StreamSlot> {
        self.stream_slot(who)
    }
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// `429 TOO_MANY_STREAMS`: the user already holds as many event streams as allowed.
pub fn too_many_streams() -> Response {
    let mut response = (
        StatusCode::TOO_MANY_REQUESTS,
        Json(json!({"error": {"code": "TOO_MANY_STREAMS", "message": "too many open event streams for this user: close one first"}})),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    response
}

/// One open connection (released on drop).
struct ConnSlot(Arc<Limits>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.open_gauge.dec();
    }
}

/// One open event stream of a user (released on drop).
pub struct StreamSlot {
    limits: Arc<Limits>,
    who: Who,
}

impl StreamSlot {
    /// `response` with this slot held until its body ends.
    pub fn hold(self, response: Response) -> Response {
        response.map(|body| {
            Body::new(Held {
                inner: body,
                _slot: self,
            })
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self.limits.streams.lock().expect("streams lock");
        if let Some(n) = streams.get_mut(&self.who) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                streams.remove(&self.who);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading a request's head since the given instant.
    Head(Instant),
    /// Reading a request's body since the given instant.
    Body(Instant),
    /// Answering: no read deadline.
    Busy,
    /// Between requests since the given instant.
    Idle(Instant),
}

/// What the connection's reads and its requests share.
struct ConnState {
    phase: Phase,
    in_flight: usize,
    /// The task waiting in a read, to wake when the phase gains a deadline from outside.
    reader: Option<Waker>,
}

/// One connection's phase, shared by its reads ([`TrackedIo`]) and its requests ([`track`]).
pub struct Conn {
    state: Mutex<ConnState>,
    limits: Arc<Limits>,
}

impl Conn {
    fn with<T>(&self, f: impl FnOnce(&mut ConnState) -> T) -> T {
        f(&mut self.state.lock().expect("connection state lock"))
    }

    /// Bytes arrived: an idle connection starts reading a request head.
    fn bytes_in(&self) {
        self.with(|s| {
            if let Phase::Idle(_) = s.phase {
                s.phase = Phase::Head(Instant::now());
            }
        });
    }

    /// The deadline of the current phase and its name, if the phase has one.
    fn deadline(&self) -> Option<(Instant, &'static str)> {
        let l = &self.limits;
        match self.with(|s| s.phase) {
            Phase::Head(t) => Some((t + l.header, "header")),
            Phase::Body(t) => Some((t + l.body, "body")),
            Phase::Idle(t) => Some((t + l.idle, "idle")),
            Phase::Busy => None,
        }
    }

    fn request_started(&self, has_body: bool) {
        self.with(|s| {
            s.in_flight += 1;
            s.phase = if has_body {
                Phase::Body(Instant::now())
            } else {
                Phase::Busy
            };
        });
    }

    /// The request's body has been read (or the handler answered without reading it).
    fn body_done(&self) {
        self.with(|s| {
            if let Phase::Body(_) = s.phase {
                s.phase = Phase::Busy;
            }
        });
    }

    fn request_finished(&self) {
        let reader = self.with(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            if s.in_flight > 0 {
                return None;
            }
            s.phase = Phase::Idle(Instant::now());
            s.reader.take()
        });
        // A read that went pending while the connection was busy has no timer yet: wake it, so it
        // arms the idle deadline.
        if let Some(w) = reader {
            w.wake();
        }
    }

    /// Remember the task waiting in a read.
    fn waiting(&self, waker: &Waker) {
        self.with(|s| match &s.reader {
            Some(w) if w.will_wake(waker) => {}
            _ => s.reader = Some(waker.clone()),
        });
    }
}

/// A connection's handle, given to every request on it (as `ConnectInfo`).
#[derive(Clone)]
pub struct ConnHandle(Arc<Conn>);

impl Connected<IncomingStream<'_, LimitedListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, LimitedListener>) -> Self {
        ConnHandle(stream.io().conn.clone())
    }
}

/// A client connection whose reads enforce the deadline of its phase.
pub struct TrackedIo {
    io: TcpStream,
    conn: Arc<Conn>,
    sleep: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    _slot: ConnSlot,
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.conn.bytes_in();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                this.conn.waiting(cx.waker());
                // Waiting for the client: not past the phase's deadline.
                let Some((deadline, phase)) = this.conn.deadline() else {
                    return Poll::Pending;
                };
                if this.armed != Some(deadline) {
                    this.sleep.as_mut().reset(deadline);
                    this.armed = Some(deadline);
                }
                if this.sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.conn.limits.cut.with_label_values(&[phase]).inc();
                tracing::debug!(
                    phase,
                    "closing a connection: the client was too slow or idle"
                );
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{phase} timeout"),
                )))
            }
        }
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A TCP listener that refuses connections beyond the cap and tracks the others' phases.
pub struct LimitedListener {
    inner: TcpListener,
    limits: Arc<Limits>,
}

impl Listener for LimitedListener {
    type Io = TrackedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TrackedIo, SocketAddr) {
        loop {
            let (io, addr) = Listener::accept(&mut self.inner).await;
            let Some(slot) = self.limits.admit() else {
                // At once, before reading anything: a best-effort 503, then close.
                let _ = io.try_write(REFUSED);
                tracing::debug!(%addr, "connection refused: too many open connections");
                continue;
            };
            // Events and answer deltas are small writes that must leave at once: without
            // TCP_NODELAY, Nagle held one back until the client's delayed ACK (~40 ms on Linux).
            if io.set_nodelay(true).is_err() {
                tracing::debug!(%addr, "could not set TCP_NODELAY");
            }
            let now = Instant::now();
            let conn = Arc::new(Conn {
                state: Mutex::new(ConnState {
                    phase: Phase::Head(now),
                    in_flight: 0,
                    reader: None,
                }),
                limits: self.limits.clone(),
            });
            let io = TrackedIo {
                io,
                conn,
                sleep: Box::pin(tokio::time::sleep_until(now)),
                armed: None,
                _slot: slot,
            };
            return (io, addr);
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// Outermost middleware: tells the request's connection when its head was read, when its body has
/// been read, and when its response has ended. (Without a tracked connection, e.g. a router driven
/// directly in tests, it does nothing.)
pub async fn track(req: Request, next: Next) -> Response {
    let Some(ConnectInfo(ConnHandle(conn))) =
        req.extensions().get::<ConnectInfo<ConnHandle>>().cloned()
    else {
        return next.run(req).await;
    };
    conn.request_started(!req.body().is_end_stream());
    // Created before the handler runs, so a request cancelled mid-way (the client went away) also
    // ends its part of the connection's business.
    let finished = Finished(conn.clone());
    let req = req.map(|body| {
        Body::new(BodyRead {
            inner: body,
            conn: conn.clone(),
        })
    });
    let response = next.run(req).await;
    conn.body_done();
    response.map(|body| {
        Body::new(Held {
            inner: body,
            _slot: finished,
        })
    })
}

/// Ends a request's part of its connection's business on drop.
struct Finished(Arc<Conn>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// A request body that tells its connection when it has been read to the end.
struct BodyRead {
    inner: Body,
    conn: Arc<Conn>,
}

impl HttpBody for BodyRead {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || this.inner.is_end_stream() {
            this.conn.body_done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps something alive (a slot, a guard) until it ends or is dropped.
struct Held<T> {
    inner: Body,
    _slot: T,
}

impl<T: Send + Unpin + 'static> HttpBody for Held<T> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serve `app` on `listener` with the limits, until `shutdown` completes (then drain).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Arc<Limits>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let listener = LimitedListener {
        inner: listener,
        limits,
    };
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<ConnHandle>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn limits(streams: &str) -> Arc<Limits> {
        let config = Config::try_parse_from([
            "ctxguard-gateway",
            "--database-url",
            "host=/nonexistent",
            "--http-max-streams-per-user",
            streams,
        ])
        .unwrap();
        Arc::new(Limits::new(&config, &Metrics::new()))
    }

    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = inner.local_addr().unwrap();
        let mut listener = LimitedListener {
            inner,
            limits: limits("4"),
        };
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (io, _) = listener.accept().await;
        assert!(
            io.io.nodelay().unwrap(),
            "TCP_NODELAY on the accepted connection"
        );
    }

    #[test]
    fn refused_bytes_are_a_complete_response() {
        let text = std::str::from_utf8(REFUSED).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }

    #[test]
    fn streams_are_capped_per_user_and_released() {
        let l = limits("2");
        let alice = ("acme".to_string(), "alice".to_string());
        let bob = ("acme".to_string(), "bob".to_string());
        let a1 = l.reserve_stream(&alice).unwrap();
        let _a2 = l.reserve_stream(&alice).unwrap();
        assert!(
            l.reserve_stream(&alice).is_none(),
            "a third stream of alice"
        );
        assert!(l.reserve_stream(&bob).is_some(), "bob has his own count");
        drop(a1);
        assert!(
            l.reserve_stream(&alice).is_some(),
            "a released slot is free again"
        );
        assert!(l.refused.with_label_values(&["streams_per_user"]).get() == 1);
    }
}
