//! Server-sent events for `/generate_stream`: one `data: <json>` event per token, errors
//! as a TGI error event (the status line has already gone out as 200).
use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use crate::infer::StreamItem;

/// The event for one stream item. Serializing our own types cannot fail; if it ever
/// did, the client still gets a well-formed error event.
pub fn to_event(item: StreamItem) -> Event {
    let event = match &item {
        Ok(response) => Event::default().json_data(response),
        Err(err) => Event::default().json_data(err.body()),
    };
    event.unwrap_or_else(|err| {
        Event::default().data(format!(
            r#"{{"error":"stream serialization failed: {err}","error_type":"stream_serialization_error"}}"#
        ))
    })
}

/// The SSE response, with TGI's streaming headers.
pub fn sse_response<S>(items: S, compute_type: &str, compute_characters: usize) -> Response
where
    S: Stream<Item = StreamItem> + Send + 'static,
{
    let events = items.map(|item| Ok::<_, std::convert::Infallible>(to_event(item)));
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    let headers = response.headers_mut();
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Ok(value) = HeaderValue::from_str(compute_type) {
        headers.insert("x-compute-type", value);
    }
    headers.insert(
        "x-compute-characters",
        HeaderValue::from(compute_characters),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::InferError;
    use crate::schema::{FinishReason, StreamDetails, StreamResponse, Token};

    fn token(id: u32, text: &str) -> Token {
        Token {
            id,
            text: text.into(),
            logprob: -0.25,
            special: false,
        }
    }

    async fn body_of(items: Vec<StreamItem>) -> (Response, String) {
        let response = sse_response(futures::stream::iter(items), "cpu", 5);
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        (
            Response::from_parts(parts, axum::body::Body::empty()),
            String::from_utf8(bytes.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn each_item_is_one_data_event() {
        let items = vec![
            Ok(StreamResponse {
                index: 1,
                token: token(5, "he"),
                top_tokens: vec![],
                generated_text: None,
                details: None,
            }),
            Ok(StreamResponse {
                index: 2,
                token: token(6, "llo"),
                top_tokens: vec![],
                generated_text: Some("hello".into()),
                details: Some(StreamDetails {
                    finish_reason: FinishReason::Length,
                    generated_tokens: 2,
                    seed: Some(3),
                    input_length: 1,
                }),
            }),
        ];
        let (response, body) = body_of(items).await;
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        assert_eq!(response.headers()["x-accel-buffering"], "no");
        assert_eq!(response.headers()["x-compute-characters"], "5");
        let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 2, "{body:?}");
        for event in &events {
            assert!(
                event.starts_with("data: ") && !event.contains('\n'),
                "{event:?}"
            );
        }
        let first: serde_json::Value = serde_json::from_str(&events[0]["data: ".len()..]).unwrap();
        assert_eq!(first["token"]["text"], "he");
        assert!(first["generated_text"].is_null() && first["details"].is_null());
        let last: serde_json::Value = serde_json::from_str(&events[1]["data: ".len()..]).unwrap();
        assert_eq!(last["generated_text"], "hello");
        assert_eq!(last["details"]["finish_reason"], "length");
        assert_eq!(last["details"]["input_length"], 1);
    }

    #[tokio::test]
    async fn errors_become_tgi_error_events() {
        let (_, body) = body_of(vec![Err(InferError::Generation("shard 0 died".into()))]).await;
        let json: serde_json::Value =
            serde_json::from_str(body.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(json["error_type"], "generation");
        assert_eq!(
            json["error"],
            "Request failed during generation: shard 0 died"
        );
    }

    #[tokio::test]
    async fn newlines_in_text_stay_inside_one_event() {
        let items = vec![Ok(StreamResponse {
            index: 1,
            token: token(1, "a\n\nb"),
            top_tokens: vec![],
            generated_text: None,
            details: None,
        })];
        let (_, body) = body_of(items).await;
        assert_eq!(body.matches("data: ").count(), 1);
        assert!(body.contains(r#""text":"a\n\nb""#));
    }
}
