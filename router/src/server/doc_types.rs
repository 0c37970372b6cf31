//! Types that exist only for the OpenAPI document: the shapes the handlers' entries name
//! for their event streams and their shared error statuses. The handlers answer with
//! `ApiError` and SSE streams; these describe them, so `docs.rs` can list the handlers
//! without the handlers depending on it.
use utoipa::ToSchema;

/// One server-sent event. `data` holds one JSON-encoded item of the stream (the route's
/// chunk type, an error body, or the final `[DONE]` of the OpenAI routes).
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // documentation only: the handlers stream `axum` events
pub struct SseEvent {
    pub data: String,
    #[serde(default)]
    pub event: Option<String>,
}

/// Rejections of a request body, shared by every JSON route's OpenAPI entry.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // documentation only: the handlers answer with `ApiError`
pub enum BodyErrors {
    #[response(status = 400, description = "Malformed JSON")]
    MalformedJson(crate::schema::ErrorBody),
    #[response(
        status = 408,
        description = "Body not received within --body-read-timeout"
    )]
    BodyTimeout(crate::schema::ErrorBody),
    #[response(status = 413, description = "Body over --payload-limit")]
    PayloadTooLarge(crate::schema::ErrorBody),
    #[response(
        status = 415,
        description = "Missing `content-type: application/json`, or a `Content-Encoding` other than `identity`"
    )]
    UnsupportedMediaType(crate::schema::ErrorBody),
}

/// `GET /`: TGI's health check on the root path (`POST /` generates). Documented here so
/// the document lists every method the route table answers (`Allow` on `OPTIONS /`).
#[utoipa::path(
    get,
    path = "/",
    tag = "Operations",
    responses(
        (status = 200, description = "Every shard answers"),
        (status = 503, description = "A shard does not answer", body = crate::schema::ErrorBody),
    )
)]
#[allow(dead_code)] // documentation only: the route is `ops::health`
pub fn root_health() {}

/// `GET /ping`: the same health check.
#[utoipa::path(
    get,
    path = "/ping",
    tag = "Operations",
    responses(
        (status = 200, description = "Every shard answers"),
        (status = 503, description = "A shard does not answer", body = crate::schema::ErrorBody),
    )
)]
#[allow(dead_code)] // documentation only: the route is `ops::health`
pub fn ping() {}

/// Failures of a generation once its input is valid, shared by the generating routes.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // documentation only: the handlers answer with `ApiError`
pub enum GenerationErrors {
    #[response(status = 424, description = "Generation error")]
    Generation(crate::schema::ErrorBody),
    #[response(status = 429, description = "Model is overloaded")]
    Overloaded(crate::schema::ErrorBody),
    #[response(status = 500, description = "Incomplete generation")]
    Incomplete(crate::schema::ErrorBody),
}
