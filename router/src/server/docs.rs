//! The OpenAPI document, generated from the handlers' own request and response types,
//! at `/api-doc/openapi.json`, and Swagger UI at `/docs` (assets compiled into the binary,
//! so it works offline).
use axum::Router;
use utoipa::{OpenApi, ToSchema};
use utoipa_swagger_ui::SwaggerUi;

use super::{invocations, openai, ops, tgi, AppState};

/// One server-sent event. `data` holds one JSON-encoded item of the stream (the route's
/// chunk type, an error body, or the final `[DONE]` of the OpenAI routes).
#[derive(Debug, ToSchema)]
pub struct SseEvent {
    pub data: String,
    #[serde(default)]
    pub event: Option<String>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "textgen",
        description = "Text generation server: TGI's native API and the OpenAI API",
        license(name = "Apache-2.0")
    ),
    paths(
        tgi::generate,
        tgi::generate_stream,
        tgi::compat_generate,
        tgi::tokenize,
        tgi::chat_tokenize,
        invocations::invocations,
        openai::chat_completions,
        openai::completions,
        openai::models,
        openai::model,
        ops::health,
        ops::info,
        ops::metrics,
    ),
    components(schemas(
        crate::schema::StreamResponse,
        openai::types::ChatCompletionChunk,
    )),
    tags(
        (name = "Text Generation Inference", description = "TGI's native API"),
        (name = "OpenAI", description = "OpenAI-compatible API"),
        (name = "Operations", description = "Health, information and metrics"),
    )
)]
pub struct ApiDoc;

pub fn routes() -> Router<AppState> {
    Router::from(SwaggerUi::new("/docs").url("/api-doc/openapi.json", ApiDoc::openapi()))
}

/// Rejections of a request body, shared by every JSON route's OpenAPI entry.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // documentation only: the handlers answer with `ApiError`
pub enum BodyErrors {
    #[response(status = 400, description = "Malformed JSON")]
    MalformedJson(crate::schema::ErrorBody),
    #[response(status = 413, description = "Body over --payload-limit")]
    PayloadTooLarge(crate::schema::ErrorBody),
    #[response(status = 415, description = "Missing `content-type: application/json`")]
    UnsupportedMediaType(crate::schema::ErrorBody),
}

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
