//! TGI's native generation routes: `/generate`, `/generate_stream`, `/` and `/tokenize`.
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{sse_response, ApiJson, AppState};
use crate::errors::ApiError;
use crate::infer::{outcome_of, GenerateOutput};
use crate::metrics::RequestMeter;
use crate::schema::{CompatGenerateRequest, GenerateRequest, SimpleToken};

pub async fn generate(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<GenerateRequest>,
) -> Result<Response, ApiError> {
    let characters = request.inputs.chars().count();
    let output = run_generate(&state, request, "generate").await?;
    let headers = generate_headers(&output, &state.info.model_device_type, characters);
    Ok((headers, Json(output.response)).into_response())
}

pub async fn generate_stream(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<GenerateRequest>,
) -> Result<Response, ApiError> {
    run_stream(&state, request, "generate_stream").await
}

/// `POST /`: `stream` picks SSE; otherwise a one-element array, as the old Inference API
/// answered. `return_full_text` defaults to true here, like TGI with no pipeline tag.
pub async fn compat_generate(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<CompatGenerateRequest>,
) -> Result<Response, ApiError> {
    let stream = request.stream;
    let mut request = GenerateRequest::from(request);
    request.parameters.return_full_text.get_or_insert(true);
    if stream {
        return run_stream(&state, request, "compat_stream").await;
    }
    let characters = request.inputs.chars().count();
    let output = run_generate(&state, request, "compat").await?;
    let headers = generate_headers(&output, &state.info.model_device_type, characters);
    Ok((headers, Json([output.response])).into_response())
}

pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<GenerateRequest>,
) -> Result<Json<Vec<SimpleToken>>, ApiError> {
    Ok(Json(state.infer.tokenize(request.inputs).await?))
}

async fn run_generate(
    state: &AppState,
    request: GenerateRequest,
    route: &'static str,
) -> Result<GenerateOutput, ApiError> {
    let mut meter = RequestMeter::start(route);
    match state.infer.generate(request, &mut meter).await {
        Ok(output) => {
            meter.succeed(output.input_length, output.generated_tokens);
            Ok(output)
        }
        Err(err) => {
            meter.finish(outcome_of(&err));
            Err(err.into())
        }
    }
}

async fn run_stream(
    state: &AppState,
    request: GenerateRequest,
    route: &'static str,
) -> Result<Response, ApiError> {
    let characters = request.inputs.chars().count();
    match state
        .infer
        .generate_stream(request, RequestMeter::start(route))
        .await
    {
        Ok((_, items)) => Ok(sse_response(
            items,
            &state.info.model_device_type,
            characters,
        )),
        Err(err) => Err(err.into()),
    }
}

/// TGI's timing headers: durations in milliseconds, `x-compute-time` in seconds.
fn generate_headers(output: &GenerateOutput, compute_type: &str, characters: usize) -> HeaderMap {
    let t = &output.timings;
    let per_token = t.inference.as_millis() / u128::from(output.generated_tokens.max(1));
    let mut headers = HeaderMap::new();
    let mut put = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    };
    put("x-compute-type", compute_type.to_owned());
    put("x-compute-time", t.total.as_secs_f64().to_string());
    put("x-compute-characters", characters.to_string());
    put("x-total-time", t.total.as_millis().to_string());
    put("x-validation-time", t.validation.as_millis().to_string());
    put("x-queue-time", t.queue.as_millis().to_string());
    put("x-inference-time", t.inference.as_millis().to_string());
    put("x-time-per-token", per_token.to_string());
    put("x-prompt-tokens", output.input_length.to_string());
    put("x-generated-tokens", output.generated_tokens.to_string());
    headers
}
