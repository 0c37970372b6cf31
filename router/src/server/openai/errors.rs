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
