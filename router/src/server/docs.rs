//! The OpenAPI document, generated from the handlers' own request and response types,
//! at `/api-doc/openapi.json`, and Swagger UI at `/docs` (assets compiled into the binary,
//! so it works offline). The limits that come from the command line (`--max-best-of`,
//! `--max-stop-sequences`, `--max-top-n-tokens`, `--max-input-tokens`,
//! `--max-total-tokens`) are written into the document from the running configuration
//! (`document`); the annotations hold TGI's defaults.
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use utoipa::OpenApi;
use utoipa_swagger_ui::{Config, SwaggerUi};

use super::openai::mapping::EMPTY_ONLY_FIELDS;
use super::{invocations, openai, ops, tgi, AppState};
use crate::validation::MAX_STOP_SEQUENCE_CHARS;

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
        super::doc_types::root_health,
        super::doc_types::ping,
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

const DOCUMENT_PATH: &str = "/api-doc/openapi.json";

pub fn routes() -> Router<AppState> {
    let swagger = SwaggerUi::new("/docs").config(Config::from(DOCUMENT_PATH));
    // Built on the first request, from this server's `Info` (the running configuration).
    let built: Arc<OnceLock<Arc<Value>>> = Arc::default();
    let served = move |State(state): State<AppState>| {
        let built = built.clone();
        async move {
            Json(
                built
                    .get_or_init(|| Arc::new(document(&state.info)))
                    .clone(),
            )
        }
    };
    Router::from(swagger).route(DOCUMENT_PATH, get(served))
}

/// `ApiDoc` with the limits of the running configuration filled in.
pub fn document(info: &ops::Info) -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    let max_new_tokens = info.max_total_tokens.saturating_sub(1).max(1);
    let limits = [
        ("best_of", "maximum", json!(info.max_best_of)),
        ("stop", "maxItems", json!(info.max_stop_sequences)),
        ("top_n_tokens", "maximum", json!(info.max_top_n_tokens)),
        ("truncate", "maximum", json!(info.max_input_tokens)),
        ("max_new_tokens", "maximum", json!(max_new_tokens)),
    ];
    if let Some(props) = doc.pointer_mut("/components/schemas/GenerateParameters/properties") {
        for (field, key, value) in limits {
            if let Some(Value::Object(field)) = props.get_mut(field) {
                field.insert(key.to_owned(), value);
            }
        }
        // Each stop sequence: not empty, at most MAX_STOP_SEQUENCE_CHARS characters.
        if let Some(Value::Object(items)) = props.pointer_mut("/stop/items") {
            items.insert("minLength".into(), json!(1));
            items.insert("maxLength".into(), json!(MAX_STOP_SEQUENCE_CHARS));
        }
    }
    for body in ["ChatCompletionRequest", "CompletionRequest"] {
        let props = format!("/components/schemas/{body}/properties");
        if let Some(Value::Object(props)) = doc.pointer_mut(&props) {
            for field in EMPTY_ONLY_FIELDS {
                props.insert(field.to_owned(), empty_only(field));
            }
        }
    }
    // TGI's seeds are u64: utoipa writes `int64`, whose range stops at 2^63 - 1.
    if let Some(Value::Object(schemas)) = doc.pointer_mut("/components/schemas") {
        for schema in schemas.values_mut() {
            if let Some(Value::Object(seed)) = schema.pointer_mut("/properties/seed") {
                if seed.get("minimum") == Some(&json!(0)) {
                    seed.insert("format".into(), json!("uint64"));
                    seed.insert("maximum".into(), json!(u64::MAX));
                }
            }
        }
    }
    add_transport_errors(&mut doc);
    doc
}

/// What `extensions.rs` accepts for a field it does not implement: an empty value.
fn empty_only(field: &str) -> Value {
    let empty = json!({"type": ["object", "array", "null"], "maxItems": 0, "maxProperties": 0,
                       "description": "Only empty: not implemented."});
    if field == "thinking_token_budget" {
        return json!({"anyOf": [empty, {"const": -1}],
                      "description": "Only empty or -1 (unlimited): not implemented."});
    }
    empty
}

/// The request layers' answers, on every operation: 415 for a `Content-Encoding` other
/// than `identity` (any route), 408 when a body is not in within `--body-read-timeout`
/// (routes that read one). Each in the route's error format.
fn add_transport_errors(doc: &mut Value) {
    let Some(Value::Object(paths)) = doc.get_mut("paths") else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let body = if path.starts_with("/v1/") {
            "OpenAiErrorBody"
        } else {
            "ErrorBody"
        };
        let content = json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{body}")}}});
        let Value::Object(item) = item else { continue };
        for operation in item.values_mut() {
            let reads_body = operation.get("requestBody").is_some();
            let Some(Value::Object(responses)) = operation.get_mut("responses") else {
                continue;
            };
            responses.entry("415").or_insert_with(|| {
                json!({"description": "A `Content-Encoding` other than `identity`", "content": content})
            });
            if reads_body {
                responses.entry("408").or_insert_with(|| {
                    json!({"description": "Body not received within --body-read-timeout", "content": content})
                });
            }
        }
    }
}

#[cfg(test)]
#[path = "docs_tests.rs"]
mod tests;
