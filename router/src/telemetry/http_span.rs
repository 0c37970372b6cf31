//! The HTTP server span of a generation request, a child of the caller's `traceparent`
//! when it sent one. For an SSE answer the span lasts until the last event is sent.
use std::task::Poll;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;
use tracing::field::Empty;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::propagation;

/// Middleware: wraps the request in its server span when traces are exported.
pub async fn trace_http(request: Request, next: Next) -> Response {
    if super::tracer().is_none() {
        return next.run(request).await;
    }
    let route = request.extensions().get::<MatchedPath>().map_or_else(
        || request.uri().path().to_owned(),
        |p| p.as_str().to_owned(),
    );
    let method = request.method().as_str().to_owned();
    let span = tracing::info_span!(
        "http_request",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = method.as_str(),
        http.route = route.as_str(),
        url.path = request.uri().path(),
        http.response.status_code = Empty,
    );
    let _ = span.set_parent(propagation::extract(request.headers()));
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
    if is_event_stream(&response) {
        return hold_until_sent(response, span);
    }
    response
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"))
}

/// Keeps the span open while the body streams. tracing-opentelemetry ends a span at its
/// last exit, so every poll runs inside the span, and the finished body (which owns the
/// request span) is dropped inside it too: the HTTP span ends last.
fn hold_until_sent(response: Response, span: tracing::Span) -> Response {
    let (parts, body) = response.into_parts();
    let mut body = Some(body.into_data_stream());
    let stream = futures::stream::poll_fn(move |cx| {
        let _entered = span.enter();
        let Some(inner) = body.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = inner.poll_next_unpin(cx);
        if matches!(polled, Poll::Ready(None)) {
            body = None;
        }
        polled
    });
    Response::from_parts(parts, Body::from_stream(stream))
}
