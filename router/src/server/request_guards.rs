//! Request layers that bound how a body arrives, answered in the route's error format
//! (TGI's JSON on native routes, OpenAI's envelope on `/v1/*`):
//! - `--body-read-timeout`: a body still arriving that long after its request's headers
//!   is cut off with 408 (a slowly dripped body cannot hold a connection);
//! - `Content-Encoding` other than `identity`: 415, rather than reading compressed bytes
//!   as JSON (issue 27, defect 8).
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body::Body as _;

use super::openai::errors::OpenAiError;
use crate::errors::ApiError;
use crate::schema::ErrorBody;

fn is_openai(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/")
}

/// The body read ran past `--body-read-timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received within --body-read-timeout")]
pub struct BodyTimeout;

/// A request body that fails once its deadline passes, noting that it did.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.expired.store(true, Ordering::SeqCst);
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimeout))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `--body-read-timeout`: the body must have arrived `timeout` after the headers. The
/// extractor that was reading it fails; its answer is replaced by 408 (and the connection
/// closes, since the rest of the body will never be read).
pub async fn body_read_timeout(
    State(timeout): State<Option<Duration>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(timeout) = timeout else {
        return next.run(request).await;
    };
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let openai = is_openai(request.uri().path());
    let linger = request
        .extensions()
        .get::<super::connections::Linger>()
        .cloned();
    let expired = Arc::new(AtomicBool::new(false));
    let request = request.map(|inner| {
        Body::new(DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            expired: expired.clone(),
        })
    });
    let response = next.run(request).await;
    if !expired.load(Ordering::SeqCst) {
        return response;
    }
    if let Some(linger) = linger {
        // The client may still be sending: drain it so the 408 reaches it.
        linger.on_close();
    }
    let message = format!(
        "Request timeout: the request body was not received within {} s (`--body-read-timeout`)",
        timeout.as_secs_f64()
    );
    let mut response = if openai {
        OpenAiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message,
            param: None,
            code: Some("request_timeout"),
        }
        .into_response()
    } else {
        let body = ErrorBody {
            error: message,
            error_type: "request_timeout".into(),
        };
        (StatusCode::REQUEST_TIMEOUT, Json(body)).into_response()
    };
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A `Content-Encoding` other than `identity` is refused with 415: textgen does not
/// decompress request bodies, and compressed bytes must not be read as JSON.
pub async fn refuse_content_encoding(request: Request, next: Next) -> Response {
    let encodings: Vec<String> = request
        .headers()
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|value| {
            String::from_utf8_lossy(value.as_bytes())
                .split(',')
                .map(|coding| coding.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|coding| !coding.is_empty() && coding != "identity")
        .collect();
    if encodings.is_empty() {
        return next.run(request).await;
    }
    let shown: String = encodings.join(", ").chars().take(64).collect();
    let message = format!(
        "Unsupported Content-Encoding `{shown}`: textgen accepts only uncompressed request bodies (`identity`)"
    );
    if is_openai(request.uri().path()) {
        OpenAiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message,
            param: None,
            code: Some("unsupported_content_encoding"),
        }
        .into_response()
    } else {
        ApiError::BadBody {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message,
        }
        .into_response()
    }
}
