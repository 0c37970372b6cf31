//! SageMaker's `POST /invocations`: one route for every kind of request, told apart by
//! the body (as TGI does): `messages` → chat completions, `prompt` → completions,
//! anything else → TGI's `POST /`.
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::openai::errors::{OpenAiError, OpenAiJson};
use super::{counted, openai, tgi, ApiJson, AppState};
use crate::errors::ApiError;
use crate::metrics::Route;

fn parse<T: serde::de::DeserializeOwned>(body: Value) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(|err| {
        ApiError::invalid_body(format!("Failed to deserialize the JSON body: {err}"))
    })
}

#[utoipa::path(
    post,
    path = "/invocations",
    tag = "Text Generation Inference",
    request_body(content = Object, description = "A chat completions, completions or TGI `/` request"),
    responses(
        (status = 200, description = "The answer of the route the body belongs to", content(
            (Object = "application/json"),
            (super::doc_types::SseEvent = "text/event-stream"),
        )),
        (status = 400, description = "Malformed JSON or an invalid OpenAI-style request", body = Object),
        (status = 413, description = "Body over --payload-limit", body = Object),
        (status = 415, description = "Missing `content-type: application/json`", body = Object),
        (status = 422, description = "Invalid TGI-style request", body = crate::schema::ErrorBody),
        (status = 424, description = "Generation error (TGI-style request)", body = crate::schema::ErrorBody),
        (status = 429, description = "Too many requests in flight", body = Object),
        (status = 500, description = "Generation failed", body = Object),
    )
)]
pub async fn invocations(
    State(state): State<AppState>,
    body: Result<ApiJson<Value>, ApiError>,
) -> Response {
    let ApiJson(body) = match counted(body, Route::Invocations) {
        Ok(body) => body,
        Err(err) => return err.into_response(),
    };
    let state = State(state);
    if body.get("messages").is_some() {
        let request = parse(body).map(OpenAiJson).map_err(OpenAiError::from);
        return openai::chat_completions(state, request)
            .await
            .into_response();
    }
    if body.get("prompt").is_some() {
        let request = parse(body).map(OpenAiJson).map_err(OpenAiError::from);
        return openai::completions(state, request).await.into_response();
    }
    tgi::compat_generate(state, parse(body).map(ApiJson))
        .await
        .into_response()
}
