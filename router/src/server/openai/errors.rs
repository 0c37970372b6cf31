//! The one error mapping of the `/v1/*` routes: OpenAI's envelope
//! `{"error": {"message", "type", "param", "code"}}` with OpenAI's status codes
//! (400 for every invalid request, where TGI's native routes answer 422).
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::errors::{ApiError, InferError};
use crate::validation::ValidationError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OpenAiErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, when known.
    pub param: Option<String>,
    pub code: Option<String>,
}

/// An error answered on a `/v1/*` route.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl OpenAiError {
    /// A request OpenAI would refuse with 400 `invalid_request_error`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_owned()),
            code: None,
        }
    }

    /// A field textgen knows but does not implement (yet): never silently ignored.
    pub fn unsupported(param: &str, why: &str) -> Self {
        Self {
            code: Some("unsupported_parameter"),
            ..Self::invalid(
                param,
                format!("`{param}` is not supported by textgen: {why}"),
            )
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            param: None,
            code: Some("not_found"),
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "Invalid or missing API key (`Authorization: Bearer <key>`)".into(),
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    pub fn body(&self) -> OpenAiErrorBody {
        OpenAiErrorBody {
            error: OpenAiErrorDetail {
                message: self.message.clone(),
                kind: self.kind().to_owned(),
                param: self.param.clone(),
                code: self.code.map(str::to_owned),
            },
        }
    }
}

impl From<InferError> for OpenAiError {
    fn from(err: InferError) -> Self {
        let (status, code) = match &err {
            // OpenAI's code for a prompt (plus max_tokens) past the context: clients such as
            // LiteLLM and LangChain read it to tell a context-window error from others.
            InferError::Validation(
                ValidationError::InputLength(..) | ValidationError::MaxTotalTokens(..),
            ) => (StatusCode::BAD_REQUEST, Some("context_length_exceeded")),
            InferError::Validation(_) | InferError::Refused(_) => (StatusCode::BAD_REQUEST, None),
            InferError::Overloaded => (StatusCode::TOO_MANY_REQUESTS, Some("overloaded")),
            InferError::Generation(_) | InferError::SchedulerStopped => {
                (StatusCode::INTERNAL_SERVER_ERROR, Some("generation"))
            }
            InferError::IncompleteGeneration => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Some("incomplete_generation"),
            ),
        };
        Self {
            status,
            message: err.to_string(),
            param: None,
            code,
        }
    }
}

impl From<ValidationError> for OpenAiError {
    fn from(err: ValidationError) -> Self {
        InferError::from(err).into()
    }
}

/// How one `/v1` request names the fields the shared (native) validation speaks of: the
/// one place where `inputs`, `max_new_tokens`, `truncate` and `top_n_tokens` become the
/// OpenAI fields the client sent, in the message and in `param`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldNames {
    /// `messages` (chat) or `prompt` (completions).
    pub prompt: &'static str,
    /// `max_tokens`, or `max_completion_tokens` when a chat request used that.
    pub max_tokens: &'static str,
    /// `top_logprobs` (chat) or `logprobs` (completions).
    pub top_n: &'static str,
}

impl FieldNames {
    pub const COMPLETIONS: Self = Self {
        prompt: "prompt",
        max_tokens: "max_tokens",
        top_n: "logprobs",
    };

    pub fn chat(used_max_completion_tokens: bool) -> Self {
        Self {
            prompt: "messages",
            max_tokens: if used_max_completion_tokens {
                "max_completion_tokens"
            } else {
                "max_tokens"
            },
            top_n: "top_logprobs",
        }
    }

    /// The `/v1` name of a native field; `None` for the few no `/v1` request has.
    fn param(&self, native: &'static str) -> Option<&'static str> {
        match native {
            "inputs" => Some(self.prompt),
            "max_new_tokens" => Some(self.max_tokens),
            "truncate" => Some("truncate_prompt_tokens"),
            "top_n_tokens" => Some(self.top_n),
            "typical_p" | "decoder_input_details" | "grammar" => None,
            same => Some(same),
        }
    }

    /// A request's error on a `/v1` route: validation names the request's own fields.
    pub fn error(&self, err: InferError) -> OpenAiError {
        let InferError::Validation(invalid) = err else {
            return err.into();
        };
        let name = |native: &'static str| self.param(native).unwrap_or(native);
        OpenAiError {
            param: invalid
                .field()
                .and_then(|native| self.param(native))
                .map(str::to_owned),
            message: format!("Input validation error: {}", invalid.message(&name)),
            ..OpenAiError::from(InferError::Validation(invalid))
        }
    }
}

/// A bad `tools`/`tool_choice`/`parallel_tool_calls` (or a tool schema the grammar
/// engine refuses): 400 naming the field.
impl From<crate::tools::ToolError> for OpenAiError {
    fn from(err: crate::tools::ToolError) -> Self {
        Self::invalid(err.param(), err.to_string())
    }
}

impl From<ApiError> for OpenAiError {
    fn from(err: ApiError) -> Self {
        match err {
            ApiError::Infer(err) => err.into(),
            ApiError::Unauthorized => Self::unauthorized(),
            ApiError::BadBody { status, message } => Self {
                // OpenAI answers every unusable body with 400, except one that is too large.
                status: if status == StatusCode::PAYLOAD_TOO_LARGE {
                    status
                } else {
                    StatusCode::BAD_REQUEST
                },
                message,
                param: None,
                code: None,
            },
            ApiError::Unhealthy => Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the model shards are not healthy".into(),
                param: None,
                code: None,
            },
            ApiError::Internal(message) => Self {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message,
                param: None,
                code: None,
            },
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        crate::errors::add_status_headers(&mut response);
        response
    }
}

/// JSON body extractor of the `/v1/*` routes: the native extractor's checks (JSON object,
/// content type, payload limit), answered in OpenAI's envelope.
#[derive(Debug, Clone)]
pub struct OpenAiJson<T>(pub T);

impl<S, T> FromRequest<S> for OpenAiJson<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = OpenAiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, OpenAiError> {
        let super::super::ApiJson(value) = super::super::ApiJson::<T>::from_request(request, state)
            .await
            .map_err(OpenAiError::from)?;
        Ok(Self(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(err: OpenAiError) -> (u16, serde_json::Value) {
        let response = err.into_response();
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn envelope_has_all_four_fields() {
        let (status, body) = body_of(OpenAiError::invalid("n", "`n` must be >= 1")).await;
        assert_eq!(status, 400);
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "`n` must be >= 1",
                "type": "invalid_request_error", "param": "n", "code": null}})
        );
    }

    #[test]
    fn overloaded_says_when_to_retry_and_unauthorized_names_the_scheme() {
        let overloaded = OpenAiError::from(InferError::Overloaded).into_response();
        assert_eq!(overloaded.headers()["retry-after"], "1");
        let unauthorized = OpenAiError::unauthorized().into_response();
        assert_eq!(unauthorized.headers()["www-authenticate"], "Bearer");
        let invalid = OpenAiError::invalid("n", "bad").into_response();
        assert!(!invalid.headers().contains_key("retry-after"));
    }

    #[test]
    fn infer_errors_map_to_openai_statuses() {
        let validation: OpenAiError = InferError::Validation(ValidationError::EmptyInput).into();
        assert_eq!(validation.status, 400);
        assert_eq!(validation.body().error.kind, "invalid_request_error");
        let overloaded: OpenAiError = InferError::Overloaded.into();
        assert_eq!(
            (overloaded.status.as_u16(), overloaded.kind()),
            (429, "rate_limit_error")
        );
        let failed: OpenAiError = InferError::Generation("shard died".into()).into();
        assert_eq!(
            (failed.status.as_u16(), failed.kind()),
            (500, "server_error")
        );
    }

    #[test]
    fn validation_names_the_openai_fields() {
        let chat = FieldNames::chat(false);
        let cases = [
            (chat, ValidationError::MaxNewTokens, "max_tokens", "`max_tokens` must be strictly positive"),
            (FieldNames::chat(true), ValidationError::MaxNewTokens, "max_completion_tokens",
             "`max_completion_tokens` must be strictly positive"),
            (FieldNames::COMPLETIONS, ValidationError::EmptyInput, "prompt", "`prompt` cannot be empty"),
            (chat, ValidationError::EmptyInput, "messages", "`messages` cannot be empty"),
            (chat, ValidationError::Truncate(8191, 9), "truncate_prompt_tokens",
             "`truncate_prompt_tokens` must be strictly positive and less than 8191. Given: 9"),
            (chat, ValidationError::InputLength(10, 11), "messages", "`messages` must have less than 10 tokens. Given: 11"),
            (FieldNames::COMPLETIONS, ValidationError::MaxTotalTokens(16, 10, 7), "prompt",
             "`prompt` tokens + `max_tokens` must be <= 16. Given: 10 `prompt` tokens and 7 `max_tokens`"),
            (chat, ValidationError::TopNTokens(5, 6), "top_logprobs", "`top_logprobs` must be >= 0 and <= 5. Given: 6"),
            (FieldNames::COMPLETIONS, ValidationError::TopNTokens(5, 6), "logprobs", "`logprobs` must be >= 0"),
            (FieldNames::COMPLETIONS, ValidationError::PromptToken(9, 5), "prompt", "prompt token 9 is outside"),
            (chat, ValidationError::Temperature, "temperature", "`temperature` must be strictly positive"),
            (chat, ValidationError::EmptyStopSequence, "stop", "`stop` sequences must not be empty"),
        ];
        for (names, invalid, param, message) in cases {
            let err = names.error(InferError::Validation(invalid.clone()));
            assert_eq!(
                (err.status.as_u16(), err.param.as_deref()),
                (400, Some(param)),
                "{invalid:?}"
            );
            assert!(
                err.message
                    .starts_with(&format!("Input validation error: {message}")),
                "{}",
                err.message
            );
        }
        // Fields no `/v1` request has, and errors about no one field, name none.
        let grammar = chat.error(InferError::Validation(ValidationError::TwoConstraints(
            "regex",
        )));
        assert_eq!(grammar.param, None);
        let tokenizer = chat.error(InferError::Validation(ValidationError::Tokenizer(
            "x".into(),
        )));
        assert_eq!(tokenizer.param, None);
        // Other errors are mapped as without names.
        assert_eq!(
            chat.error(InferError::Overloaded),
            OpenAiError::from(InferError::Overloaded)
        );
    }

    #[test]
    fn context_errors_carry_openais_code() {
        let names = FieldNames::chat(false);
        for invalid in [
            ValidationError::InputLength(10, 11),
            ValidationError::MaxTotalTokens(16, 10, 7),
        ] {
            let err = names.error(InferError::Validation(invalid));
            assert_eq!(err.code, Some("context_length_exceeded"));
            assert_eq!(err.param.as_deref(), Some("messages"));
        }
        let other = names.error(InferError::Validation(ValidationError::MaxNewTokens));
        assert_eq!(other.code, None);
    }

    #[test]
    fn native_messages_keep_the_native_names() {
        assert_eq!(
            ValidationError::MaxNewTokens.to_string(),
            "`max_new_tokens` must be strictly positive"
        );
        assert_eq!(
            ValidationError::EmptyInput.to_string(),
            "`inputs` cannot be empty"
        );
        assert_eq!(
            ValidationError::MaxTotalTokens(16, 10, 7).to_string(),
            "`inputs` tokens + `max_new_tokens` must be <= 16. Given: 10 `inputs` tokens and 7 `max_new_tokens`"
        );
        assert_eq!(
            ValidationError::Truncate(10, 0).to_string(),
            "`truncate` must be strictly positive and less than 10. Given: 0"
        );
    }

    #[test]
    fn api_errors_map_to_openai_statuses() {
        let too_large: OpenAiError = ApiError::BadBody {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: "big".into(),
        }
        .into();
        assert_eq!(too_large.status, 413);
        let wrong_type: OpenAiError = ApiError::invalid_body("bad type").into();
        assert_eq!(wrong_type.status, 400);
        let unauthorized: OpenAiError = ApiError::Unauthorized.into();
        assert_eq!(
            (unauthorized.status.as_u16(), unauthorized.kind()),
            (401, "authentication_error")
        );
        let unhealthy: OpenAiError = ApiError::Unhealthy.into();
        assert_eq!(unhealthy.status, 503);
        assert_eq!(OpenAiError::not_found("x").status, 404);
    }
}

/// The error answers of the generating `/v1` routes, for their OpenAPI entries.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // documentation only: the handlers answer with `OpenAiError`
pub enum GenerationErrors {
    #[response(status = 400, description = "Invalid request")]
    Invalid(OpenAiErrorBody),
    #[response(status = 401, description = "Missing or wrong API key")]
    Unauthorized(OpenAiErrorBody),
    #[response(status = 413, description = "Body over --payload-limit")]
    PayloadTooLarge(OpenAiErrorBody),
    #[response(status = 429, description = "Too many requests in flight")]
    Overloaded(OpenAiErrorBody),
    #[response(status = 500, description = "Generation failed")]
    Failed(OpenAiErrorBody),
}
