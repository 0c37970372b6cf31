//! The accept loop and what bounds a client connection (issue 27, defect 4):
//! - `--header-read-timeout`: hyper's HTTP/1 header timer (it also runs while a kept-alive
//!   connection waits for its next request); a connection on which no request has started
//!   that long after accept (no bytes, a dripped HTTP/2 preface) is closed as well;
//! - `--keep-alive-timeout`: a connection with no request in flight and no byte read or
//!   written for that long is closed (HTTP/1 closes, HTTP/2 gets GOAWAY). A request counts
//!   as in flight until its response body is done, so an SSE stream is never idle;
//! - `--max-connections`: connections past the bound are closed at once, except a few
//!   from loopback addresses, so the launcher's own health probe still gets through a
//!   flood and never takes a flooded router for a dead one. It is also the listen
//!   backlog ([`listen`]): a burst of that many clients connecting at once all queue for
//!   accept, where tokio's own `bind` queues 128 (the kernel caps it at `somaxconn`).
//!
//! The body read timeout is a request layer (`request_guards.rs`): it answers 408.
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::Service;

/// Connections from loopback addresses accepted past `--max-connections` (the launcher's
/// health probe, an operator's curl).
pub const LOOPBACK_RESERVE: usize = 8;

/// How long a connection told to shut down (idle, stuck, draining idle) may take before it
/// is dropped outright.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The listener's bounds, from the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectionOptions {
    pub header_read_timeout: Duration,
    pub keep_alive_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ConnectionOptions {
    /// The router's defaults (`config.rs` holds the flags; these mirror them for tests).
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(15),
            max_connections: 1024,
        }
    }
}

/// What the connection's watcher needs to know: requests in flight (until their response
/// body is done) and when bytes last moved.
struct Activity {
    epoch: Instant,
    /// Milliseconds since `epoch` when a byte was last read or written, or a response ended.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    started: AtomicUsize,
    /// Drain what the client still sends before closing (see [`Linger`]).
    linger: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            linger: AtomicBool::new(false),
        }
    }

    fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// In every request's extensions: a layer that answers before the request body has been
/// read (408 for a dripped body) asks for a lingering close. The socket is then drained
/// for up to [`LINGER`] before it is closed, because closing it with the client's bytes
/// still unread makes the kernel answer RST, which can destroy the answer before the
/// client reads it.
#[derive(Clone)]
pub struct Linger(Arc<Activity>);

impl Linger {
    pub fn on_close(&self) {
        self.0.linger.store(true, Ordering::SeqCst);
    }
}

/// The longest a lingering close drains the socket.
const LINGER: Duration = Duration::from_secs(2);

/// Reads and drops what the client still sends, until it closes or `LINGER` passes.
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Ends a request's in-flight span when dropped (with its response body).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(activity: &Arc<Activity>) -> Self {
        activity.started.fetch_add(1, Ordering::Relaxed);
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.touch();
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that holds its request's `InFlight` until hyper has taken all of it (or
/// dropped it: the client went away).
struct TrackedBody {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, noting when bytes move.
struct TrackedIo {
    stream: Option<TcpStream>,
    activity: Arc<Activity>,
}

impl TrackedIo {
    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.stream.as_mut().expect("taken only on drop"))
    }
}

impl Drop for TrackedIo {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            if self.activity.linger.load(Ordering::SeqCst) {
                tokio::spawn(linger(stream));
            }
        }
    }
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = self.stream().poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = self.stream().poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = self.stream().poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }
}

/// `--max-connections` plus the loopback reserve.
struct Slots {
    main: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    max: usize,
}

impl Slots {
    fn new(max: usize) -> Self {
        let max = max.clamp(1, u32::MAX as usize - LOOPBACK_RESERVE);
        Self {
            main: Arc::new(Semaphore::new(max)),
            reserve: Arc::new(Semaphore::new(LOOPBACK_RESERVE)),
            max,
        }
    }

    fn take(&self, peer: &SocketAddr) -> Option<OwnedSemaphorePermit> {
        self.main.clone().try_acquire_owned().ok().or_else(|| {
            is_loopback(peer)
                .then(|| self.reserve.clone().try_acquire_owned().ok())
                .flatten()
        })
    }

    /// Resolves once every connection has ended.
    async fn all_closed(&self) {
        let _main = self.main.acquire_many(self.max as u32).await;
        let _reserve = self.reserve.acquire_many(LOOPBACK_RESERVE as u32).await;
    }
}

/// A listener on the first of `host`'s addresses that binds, whose accept queue holds
/// `backlog` connections (the kernel caps it at `net.core.somaxconn`).
pub async fn listen(host: &str, port: u16, backlog: u32) -> io::Result<TcpListener> {
    let backlog = backlog.min(i32::MAX as u32);
    let mut last = io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        format!("{host} resolves to no address"),
    );
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }?;
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| socket.listen(backlog)) {
            Ok(listener) => return Ok(listener),
            Err(err) => last = err,
        }
    }
    Err(last)
}

fn is_loopback(peer: &SocketAddr) -> bool {
    match peer.ip() {
        std::net::IpAddr::V4(ip) => ip.is_loopback(),
        std::net::IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

fn builder(options: &ConnectionOptions) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    builder
}

/// Serves `app` on `listener` within `options` until `shutdown` resolves, then stops
/// accepting, lets in-flight requests (open SSE streams included) finish, closes idle
/// connections, and returns once every connection has ended.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ConnectionOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let builder = Arc::new(builder(&options));
    let slots = Slots::new(options.max_connections);
    let (stop, stopping) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    accept_error(err).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(slot) = slots.take(&peer) else {
            // Past the bound: closed at once, so the client fails fast instead of waiting.
            tracing::debug!(%peer, max = options.max_connections, "connection refused: --max-connections reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = serve_connection(
            stream,
            app.clone(),
            builder.clone(),
            options,
            stopping.clone(),
        );
        tokio::spawn(async move {
            connection.await;
            drop(slot);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    slots.all_closed().await;
    Ok(())
}

async fn accept_error(err: io::Error) {
    if matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    // Out of file descriptors and the like: wait for connections to close, as axum does.
    tracing::error!("accept error: {err}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Why the watcher closed a connection (debug logs only).
#[derive(Debug)]
enum Close {
    Idle,
    NoRequest,
}

async fn serve_connection(
    stream: TcpStream,
    app: Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    options: ConnectionOptions,
    mut stopping: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(TrackedIo {
        stream: Some(stream),
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            let in_flight = InFlight::enter(&activity);
            request.extensions_mut().insert(Linger(activity.clone()));
            let mut app = app.clone();
            async move {
                let response = app.call(request.map(Body::new)).await?;
                Ok::<_, std::convert::Infallible>(response.map(|inner| TrackedBody {
                    inner,
                    _in_flight: in_flight,
                }))
            }
        })
    };
    let connection = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(connection);
    let mut closing: Option<(Close, Instant)> = None;
    let mut draining = *stopping.borrow();
    if draining {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        let wait = match &closing {
            Some((_, since)) => CLOSE_GRACE.saturating_sub(since.elapsed()),
            None => next_check(&activity, &options),
        };
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!("connection ended: {err}");
                }
                return;
            }
            changed = stopping.changed(), if !draining => {
                draining = true;
                if changed.is_ok() {
                    connection.as_mut().graceful_shutdown();
                }
            }
            () = tokio::time::sleep(wait) => {
                let in_flight = activity.in_flight.load(Ordering::Relaxed) > 0;
                if let Some((why, _)) = &closing {
                    if in_flight {
                        // A request came in meanwhile (HTTP/2): let it finish.
                        closing = None;
                        continue;
                    }
                    tracing::debug!(?why, "connection closed");
                    return;
                }
                if let Some(why) = should_close(&activity, &options) {
                    connection.as_mut().graceful_shutdown();
                    closing = Some((why, Instant::now()));
                }
            }
        }
    }
}

/// Why the connection should close now, if it should.
fn should_close(activity: &Activity, options: &ConnectionOptions) -> Option<Close> {
    if activity.in_flight.load(Ordering::Relaxed) > 0 {
        return None;
    }
    if activity.started.load(Ordering::Relaxed) == 0
        && activity.epoch.elapsed() >= options.header_read_timeout
    {
        return Some(Close::NoRequest);
    }
    (activity.quiet_for() >= options.keep_alive_timeout).then_some(Close::Idle)
}

fn next_check(activity: &Activity, options: &ConnectionOptions) -> Duration {
    let idle = options
        .keep_alive_timeout
        .saturating_sub(activity.quiet_for());
    let first = if activity.started.load(Ordering::Relaxed) == 0 {
        options
            .header_read_timeout
            .saturating_sub(activity.epoch.elapsed())
    } else {
        idle
    };
    // A little late rather than early, and never a busy loop.
    idle.min(first).max(Duration::from_millis(50)) + Duration::from_millis(10)
}
