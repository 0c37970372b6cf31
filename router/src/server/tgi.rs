//! TGI's native generation routes: `/generate`, `/generate_stream`, `/`, `/tokenize` and
//! `/chat_tokenize`.
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{counted, sse_response, ApiJson, AppState};
use crate::errors::ApiError;
use crate::infer::{outcome_of, GenerateOutput};
use crate::metrics::{RequestMeter, Route};
use crate::schema::{
    ChatTokenizeResponse, CompatGenerateRequest, ErrorBody, GenerateRequest, GenerateResponse,
    SimpleToken,
};
use crate::validation::ValidationError;

use super::openai::mapping::render_chat_segments;
use super::openai::types::ChatCompletionRequest;

#[utoipa::path(
    post,
    path = "/generate",
    tag = "Text Generation Inference",
    request_body = GenerateRequest,
    responses(
        (status = 200, description = "Generated text", body = GenerateResponse),
        (status = 422, description = "Input validation error", body = ErrorBody),
        super::doc_types::BodyErrors,
        super::doc_types::GenerationErrors,
    )
)]
pub async fn generate(
    State(state): State<AppState>,
    body: Result<ApiJson<GenerateRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let ApiJson(request) = counted(body, Route::Generate)?;
    let characters = request.inputs.chars().count();
    let output = run_generate(&state, request, Route::Generate).await?;
    let headers = generate_headers(&output, &state.info.model_device_type, characters);
    Ok((headers, Json(output.response)).into_response())
}

#[utoipa::path(
    post,
    path = "/generate_stream",
    tag = "Text Generation Inference",
    request_body = GenerateRequest,
    responses(
        (status = 200, description = "SSE stream: one `StreamResponse` per token; the last has the text and details", body = super::doc_types::SseEvent, content_type = "text/event-stream"),
        (status = 422, description = "Input validation error", body = ErrorBody),
        super::doc_types::BodyErrors,
        super::doc_types::GenerationErrors,
    )
)]
pub async fn generate_stream(
    State(state): State<AppState>,
    body: Result<ApiJson<GenerateRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let ApiJson(request) = counted(body, Route::GenerateStream)?;
    run_stream(&state, request, Route::GenerateStream).await
}

/// `POST /`: `stream` picks SSE; otherwise a one-element array, as the old Inference API
/// answered. `return_full_text` defaults to true here, like TGI with no pipeline tag.
#[utoipa::path(
    post,
    path = "/",
    tag = "Text Generation Inference",
    request_body = CompatGenerateRequest,
    responses(
        (status = 200, description = "A one-element array, or with `stream: true` an SSE stream of `StreamResponse`", content(
            ([GenerateResponse] = "application/json"),
            (super::doc_types::SseEvent = "text/event-stream"),
        )),
        (status = 422, description = "Input validation error", body = ErrorBody),
        super::doc_types::BodyErrors,
        super::doc_types::GenerationErrors,
    )
)]
pub async fn compat_generate(
    State(state): State<AppState>,
    body: Result<ApiJson<CompatGenerateRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let ApiJson(request) = counted(body, Route::Compat)?;
    let stream = request.stream;
    let mut request = GenerateRequest::from(request);
    request.parameters.return_full_text.get_or_insert(true);
    if stream {
        return run_stream(&state, request, Route::CompatStream).await;
    }
    let characters = request.inputs.chars().count();
    let output = run_generate(&state, request, Route::Compat).await?;
    let headers = generate_headers(&output, &state.info.model_device_type, characters);
    Ok((headers, Json([output.response])).into_response())
}

#[utoipa::path(
    post,
    path = "/tokenize",
    tag = "Text Generation Inference",
    request_body = GenerateRequest,
    responses(
        (status = 200, description = "The prompt's tokens", body = [SimpleToken]),
        (status = 422, description = "Input validation error", body = ErrorBody),
        super::doc_types::BodyErrors,
    )
)]
/// TGI's `/tokenize` takes `/generate`'s body; it is refused for what `/generate` would
/// refuse before generating (empty `inputs`, a parameter out of range), so one schema holds
/// for both routes. `truncate` keeps the last tokens, as TGI does.
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<GenerateRequest>,
) -> Result<Json<Vec<SimpleToken>>, ApiError> {
    let to_api = |err: ValidationError| ApiError::from(crate::errors::InferError::from(err));
    if request.inputs.is_empty() {
        return Err(to_api(ValidationError::EmptyInput));
    }
    let info = &state.info;
    let limits = crate::validation::ValidationLimits {
        max_best_of: info.max_best_of,
        max_stop_sequences: info.max_stop_sequences,
        max_top_n_tokens: info.max_top_n_tokens,
        max_input_tokens: info.max_input_tokens,
        max_total_tokens: info.max_total_tokens,
        // Only `logit_bias` and token prompts read it; `/tokenize` has neither.
        vocab_size: u32::MAX,
        watermark: Default::default(),
    };
    crate::grammar::from_tgi(request.parameters.grammar.as_ref())
        .map_err(|err| to_api(err.into()))?;
    let checked =
        crate::validation::check_parameters(&request.parameters, false, &limits).map_err(to_api)?;
    let mut tokens = state.infer.tokenize(request.inputs).await?;
    if let Some(truncate) = checked.truncate.filter(|&t| tokens.len() > t) {
        tokens.drain(..tokens.len() - truncate);
    }
    Ok(Json(tokens))
}

/// TGI's `/chat_tokenize`: the chat template's output and its tokens.
#[utoipa::path(
    post,
    path = "/chat_tokenize",
    tag = "Text Generation Inference",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The templated prompt and its tokens", body = ChatTokenizeResponse),
        (status = 422, description = "Invalid messages or a template error", body = ErrorBody),
        super::doc_types::BodyErrors,
    )
)]
pub async fn chat_tokenize(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<ChatCompletionRequest>,
) -> Result<Json<ChatTokenizeResponse>, ApiError> {
    let chat = render_chat_segments(state.openai.chat_template.as_ref(), &request.messages)
        .map_err(|err| crate::errors::InferError::from(ValidationError::Template(err.message)))?;
    let templated_text = chat.text.clone();
    let tokens = state.infer.tokenize_chat(chat).await?;
    Ok(Json(ChatTokenizeResponse {
        tokenize_response: tokens,
        templated_text,
    }))
}

async fn run_generate(
    state: &AppState,
    request: GenerateRequest,
    route: Route,
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
    route: Route,
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
