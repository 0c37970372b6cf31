//! The listener's bounds over real sockets (header, body and keep-alive timeouts, the
//! connection bound, SSE streams untouched) and the request guards' answers (408, 415,
//! 401 and 429 headers). Bounds are asserted with wide margins, never timings.
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tests::{app_with, call, json, post};
use super::*;

const SHORT: Duration = Duration::from_millis(300);
/// How long a test waits for something that should happen after SHORT.
const BOUND: Duration = Duration::from_secs(5);

fn bounds(header: Duration, keep_alive: Duration, max: usize) -> ConnectionOptions {
    ConnectionOptions {
        header_read_timeout: header,
        keep_alive_timeout: keep_alive,
        max_connections: max,
    }
}

fn native_app(body_timeout: Option<Duration>) -> Router {
    app_with(
        HttpOptions {
            payload_limit: 1000,
            body_read_timeout: body_timeout,
            ..HttpOptions::default()
        },
        true,
    )
}

/// Serves `app` on a free loopback port; the sender stops the server.
async fn start(
    app: Router,
    options: ConnectionOptions,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(connections::serve(listener, app, options, async move {
        let _ = stopped.await;
    }));
    (addr, stop, served)
}

/// Reads until the server closes the connection (EOF or reset); None if it is still open
/// after `within`.
async fn read_until_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
) -> Option<String> {
    let mut got = Vec::new();
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One `GET /health` on its own connection, answered 200.
async fn health_is_served(addr: std::net::SocketAddr) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut stream, BOUND)
        .await
        .expect("answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn header_drip_is_closed_while_others_are_served() {
    let (addr, _stop, _) = start(native_app(None), bounds(SHORT, BOUND * 4, 64)).await;
    let mut drip = TcpStream::connect(addr).await.unwrap();
    drip.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
    let dripping = tokio::spawn(async move {
        let started = Instant::now();
        // One header line every 100 ms: the connection is never quiet, only slow.
        loop {
            if drip.write_all(b"x-a: b\r\n").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if started.elapsed() > BOUND * 2 {
                return None;
            }
            let mut buf = [0u8; 256];
            match tokio::time::timeout(Duration::from_millis(1), drip.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                _ => {}
            }
        }
        Some(started.elapsed())
    });
    health_is_served(addr).await;
    let closed_after = dripping
        .await
        .unwrap()
        .expect("a header drip was held open");
    assert!(closed_after < BOUND, "{closed_after:?}");
}

#[tokio::test]
async fn silent_connection_is_closed_after_the_header_timeout() {
    let (addr, _stop, _) = start(native_app(None), bounds(SHORT, BOUND * 4, 64)).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(read_until_closed(&mut silent, BOUND).await.is_some());
    // A partial HTTP/2 preface, then nothing: no request ever starts.
    let mut preface = TcpStream::connect(addr).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert!(read_until_closed(&mut preface, BOUND).await.is_some());
}

#[tokio::test]
async fn idle_keep_alive_is_closed() {
    // The header timer is long, so it is the keep-alive bound that closes it.
    let (addr, _stop, _) = start(native_app(None), bounds(BOUND * 4, SHORT, 64)).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut stream, BOUND)
        .await
        .expect("the idle keep-alive connection was held open");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_slow_sse_stream_is_not_idle() {
    // Events 4x further apart than every timeout: the stream is in flight, never idle.
    let app = Router::new().route(
        "/slow",
        get(|| async {
            let events = futures::stream::unfold(0u32, |i| async move {
                if i == 4 {
                    return None;
                }
                tokio::time::sleep(SHORT * 4).await;
                Some((
                    Ok::<_, std::convert::Infallible>(Event::default().data(i.to_string())),
                    i + 1,
                ))
            });
            Sse::new(events)
        }),
    );
    let (addr, _stop, _) = start(app, bounds(SHORT, SHORT, 64)).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut stream, BOUND * 4)
        .await
        .expect("closed after the stream, by the keep-alive bound");
    for i in 0..4 {
        assert!(answer.contains(&format!("data: {i}\n")), "{i}: {answer}");
    }
}

#[tokio::test]
async fn connections_past_the_bound_are_closed_and_service_resumes() {
    let max = 2;
    let (addr, _stop, _) = start(native_app(None), bounds(BOUND * 4, BOUND * 4, max)).await;
    // Loopback clients also get the reserve kept for the launcher's probe.
    let mut held = Vec::new();
    for _ in 0..max + LOOPBACK_RESERVE {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // The accept loop has taken every held connection once a request on one is answered.
    held[0]
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(BOUND, held[0].read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let mut refused = TcpStream::connect(addr).await.unwrap();
    let _ = refused
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let answer = read_until_closed(&mut refused, BOUND)
        .await
        .expect("a connection past the bound was held open");
    assert!(answer.is_empty(), "{answer}");
    drop(held);
    let deadline = Instant::now() + BOUND;
    loop {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until_closed(&mut stream, BOUND)
            .await
            .unwrap_or_default();
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not served once the load dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The kernel's bound on any listen backlog (`net.core.somaxconn`; Linux's default since 5.4).
fn somaxconn() -> usize {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(4096)
}

#[tokio::test]
async fn a_burst_of_clients_past_128_all_connect_before_the_first_accept() {
    // Nothing accepts until every client is connected: the accept queue alone holds them.
    // With tokio's `bind` (backlog 128) a burst's SYNs past the 129th were dropped, and
    // those clients waited for retransmits (1 s, then 3 s, ...) while the rest were served.
    let burst = 400.min(somaxconn());
    let listener = listen("127.0.0.1", 0, 1024).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connects = (0..burst).map(|_| tokio::time::timeout(BOUND, TcpStream::connect(addr)));
    let mut streams: Vec<TcpStream> = futures::future::join_all(connects)
        .await
        .into_iter()
        .filter_map(|connected| connected.ok()?.ok())
        .collect();
    assert_eq!(
        streams.len(),
        burst,
        "clients left outside the accept queue"
    );
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(connections::serve(
        listener,
        native_app(None),
        bounds(BOUND * 4, BOUND * 4, 1024),
        async move {
            let _ = stopped.await;
        },
    ));
    let last = streams.last_mut().unwrap();
    last.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(last, BOUND).await.unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn listen_takes_any_backlog_and_refuses_a_taken_port() {
    let listener = listen("127.0.0.1", 0, u32::MAX).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    assert!(listen("127.0.0.1", port, 1).await.is_err(), "bound twice");
    assert!(listen("no-such-host.invalid", 0, 8).await.is_err());
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_returns() {
    let (addr, stop, served) = start(native_app(None), bounds(BOUND * 4, BOUND * 4, 64)).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(BOUND, idle.read(&mut buf))
        .await
        .unwrap();
    let _never_sent = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    tokio::time::timeout(BOUND, served)
        .await
        .expect("serve returned")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn dripped_body_gets_408_over_a_socket() {
    let (addr, _stop, _) = start(native_app(Some(SHORT)), bounds(BOUND * 4, BOUND * 4, 64)).await;
    let drip = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = drip.into_split();
    writer.write_all(
        b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"inp",
    )
    .await
    .unwrap();
    // A byte every 20 ms, on and on: bytes still arrive when the server answers and
    // closes, so the 408 must survive a close with unread input (lingering close).
    let dripping = tokio::spawn(async move {
        for _ in 0..500 {
            if writer.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let answer = read_until_closed(&mut reader, BOUND)
        .await
        .expect("a body drip was held open");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains(r#""error_type":"request_timeout""#),
        "{answer}"
    );
    dripping.abort();
    health_is_served(addr).await;
}

/// A request whose body sends `head` and then nothing more.
fn stalled_post(path: &str, head: &'static str) -> Request<Body> {
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<axum::body::Bytes, std::io::Error>>();
    tx.unbounded_send(Ok(head.into())).unwrap();
    std::mem::forget(tx); // never ends
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from_stream(rx))
        .unwrap()
}

#[tokio::test]
async fn body_timeout_answers_in_each_route_format() {
    let (status, headers, body) = call(
        native_app(Some(SHORT)),
        stalled_post("/generate", r#"{"inputs":"#),
    )
    .await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert_eq!(headers["connection"], "close");
    let body = json(&body);
    assert_eq!(body["error_type"], "request_timeout");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("--body-read-timeout"));
    let (status, _, body) = call(
        native_app(Some(SHORT)),
        stalled_post("/v1/completions", r#"{"prompt":"#),
    )
    .await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    let body = json(&body);
    assert_eq!(body["error"]["code"], "request_timeout");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    // A body that arrives in time is served.
    let (status, _, body) = call(
        native_app(Some(SHORT)),
        post("/generate", r#"{"inputs":"hello"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn compressed_bodies_are_refused_with_415() {
    let mut native = post("/generate", r#"{"inputs":"hello"}"#);
    native
        .headers_mut()
        .insert("content-encoding", "gzip".parse().unwrap());
    let (status, _, body) = call(native_app(None), native).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    let body = json(&body);
    assert_eq!(body["error_type"], "unsupported_media_type");
    assert!(body["error"].as_str().unwrap().contains("gzip"));
    let mut openai = post("/v1/completions", r#"{"prompt":"hello"}"#);
    openai
        .headers_mut()
        .insert("content-encoding", "identity, br".parse().unwrap());
    let (status, _, body) = call(native_app(None), openai).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    let body = json(&body);
    assert_eq!(body["error"]["code"], "unsupported_content_encoding");
    assert!(body["error"]["message"].as_str().unwrap().contains("br"));
    let mut identity = post("/generate", r#"{"inputs":"hello"}"#);
    identity
        .headers_mut()
        .insert("content-encoding", "identity".parse().unwrap());
    let (status, _, body) = call(native_app(None), identity).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn unauthorized_names_the_bearer_scheme_on_both_apis() {
    let options = HttpOptions {
        payload_limit: 1000,
        api_key: Some("secret".into()),
        ..HttpOptions::default()
    };
    for path in ["/generate", "/v1/completions"] {
        let (status, headers, _) = call(
            app_with(options.clone(), true),
            post(path, r#"{"inputs":"x","prompt":"x"}"#),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(headers["www-authenticate"], "Bearer", "{path}");
    }
}
