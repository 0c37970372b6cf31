//! The OpenAPI document, generated from the handlers' own request and response types,
//! at `/api-doc/openapi.json`, and Swagger UI at `/docs` (assets compiled into the binary,
//! so it works offline).
use axum::Router;
use utoipa::OpenApi;
use utoipa_swagger_ui::SwaggerUi;

use super::{invocations, openai, ops, tgi, AppState};

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
