//! Errors of the request path and their single mapping to HTTP: TGI's
//! `{"error", "error_type"}` body with TGI's status codes.
use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::scheduler::{FailureKind, GenerationFailure};
use crate::schema::ErrorBody;
use crate::validation::ValidationError;

/// Why a generation request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InferError {
    #[error("Input validation error: {0}")]
    Validation(#[from] ValidationError),
    #[error("Model is overloaded")]
    Overloaded,
    /// A shard or the router failed the sequence; the rank and kind travel with the text.
    #[error("Request failed during generation: {0}")]
    Generation(GenerationFailure),
    /// The shard refused the request's own parameters or grammar mid-generation: a client
    /// error, like validation, that could not be known before the first steps.
    #[error("Request refused during generation: {0}")]
    Refused(String),
    #[error("Request failed during generation: the scheduler stopped")]
    SchedulerStopped,
    #[error("Incomplete generation")]
    IncompleteGeneration,
}

/// TGI answers every failure during generation with 424, whatever broke; the match is
/// exhaustive so that a new kind of fault is a decision here.
fn generation_status(kind: FailureKind) -> StatusCode {
    match kind {
        FailureKind::Transport
        | FailureKind::Timeout
        | FailureKind::Stopped
        | FailureKind::ShardReported
        | FailureKind::Protocol
        | FailureKind::Unusable
        | FailureKind::OutOfMemory
        | FailureKind::Router => StatusCode::FAILED_DEPENDENCY,
    }
}

/// Everything an HTTP handler of the native API can answer with besides success.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Infer(#[from] InferError),
    /// The body did not parse into the route's JSON shape.
    #[error("{message}")]
    BadBody { status: StatusCode, message: String },
    #[error("unhealthy")]
    Unhealthy,
    #[error("invalid or missing API key")]
    Unauthorized,
    #[error("{0}")]
    Internal(String),
}

impl InferError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Validation(_) | Self::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            Self::Generation(failure) => generation_status(failure.kind),
            Self::SchedulerStopped => StatusCode::FAILED_DEPENDENCY,
            Self::IncompleteGeneration => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Validation(_) | Self::Refused(_) => "validation",
            Self::Overloaded => "overloaded",
            Self::Generation(_) | Self::SchedulerStopped => "generation",
            Self::IncompleteGeneration => "incomplete_generation",
        }
    }

    /// The body sent inside an SSE stream, where the status line is already 200.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.to_string(),
            error_type: self.error_type().to_owned(),
        }
    }
}

impl ApiError {
    /// A well-formed JSON body of the wrong shape (422, like axum's own type errors).
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::BadBody {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Infer(err) => err.status(),
            Self::BadBody { status, .. } => *status,
            Self::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Infer(err) => err.error_type(),
            Self::BadBody { status, .. } => body_error_type(*status),
            Self::Unhealthy => "healthcheck",
            Self::Unauthorized => "unauthorized",
            Self::Internal(_) => "internal",
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.to_string(),
            error_type: self.error_type().to_owned(),
        }
    }
}

/// Malformed JSON (400), wrong field types (422), missing content type (415) and bodies
/// over `--payload-limit` (413) all answer TGI's JSON shape instead of axum's plain text.
fn body_error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNPROCESSABLE_ENTITY => "validation",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "bad_request",
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "Payload too large: the request body exceeds `--payload-limit`".to_owned()
        } else {
            rejection.body_text()
        };
        Self::BadBody { status, message }
    }
}

/// Seconds a 429 asks the client to wait (`Retry-After`): requests in flight finish in
/// about that time on a busy server, and a sooner retry would most likely be refused again.
pub const RETRY_AFTER_SECONDS: &str = "1";

/// `Retry-After` on 429 and `WWW-Authenticate: Bearer` on 401, whatever the route's body
/// format (RFC 9110 §10.2.3, RFC 6750 §3).
pub fn add_status_headers(response: &mut Response) {
    let value = match response.status() {
        StatusCode::TOO_MANY_REQUESTS => (header::RETRY_AFTER, RETRY_AFTER_SECONDS),
        StatusCode::UNAUTHORIZED => (header::WWW_AUTHENTICATE, "Bearer"),
        _ => return,
    };
    response
        .headers_mut()
        .insert(value.0, HeaderValue::from_static(value.1));
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = if let Self::Unauthorized = self {
            // TGI answers a wrong API key with an empty 401.
            StatusCode::UNAUTHORIZED.into_response()
        } else {
            (self.status(), Json(self.body())).into_response()
        };
        add_status_headers(&mut response);
        response
    }
}

impl IntoResponse for InferError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infer_errors_map_to_tgi_statuses() {
        let validation = InferError::Validation(ValidationError::EmptyInput);
        assert_eq!(validation.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(validation.error_type(), "validation");
        assert_eq!(
            validation.to_string(),
            "Input validation error: `inputs` cannot be empty"
        );
        assert_eq!(
            InferError::Overloaded.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(InferError::Overloaded.error_type(), "overloaded");
        let failed = InferError::Generation("shard 0: broken pipe".into());
        assert_eq!(failed.status(), StatusCode::FAILED_DEPENDENCY);
        assert_eq!(failed.error_type(), "generation");
        assert_eq!(InferError::IncompleteGeneration.status().as_u16(), 500);
    }

    #[test]
    fn a_ranks_step_failure_keeps_its_rank_and_kind_up_to_the_http_mapping() {
        let shard = crate::shards::ShardError::Call {
            rank: 1,
            call: "Step",
            status: tonic::Status::internal("RuntimeError: CUDA error: an illegal memory access"),
        };
        let err = InferError::Generation(shard.failure());
        let InferError::Generation(failure) = &err else {
            unreachable!()
        };
        assert_eq!(
            (failure.rank, failure.kind),
            (Some(1), FailureKind::ShardReported)
        );
        assert_eq!(err.status(), StatusCode::FAILED_DEPENDENCY);
        let body = err.body();
        assert_eq!(
            (body.error.as_str(), body.error_type.as_str()),
            (
                "Request failed during generation: shard 1: Step failed (Internal)",
                "generation"
            )
        );
    }

    #[test]
    fn api_errors_map_to_statuses() {
        let too_large = ApiError::BadBody {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: "x".into(),
        };
        assert_eq!(too_large.status().as_u16(), 413);
        assert_eq!(too_large.error_type(), "payload_too_large");
        assert_eq!(ApiError::Unhealthy.status().as_u16(), 503);
        assert_eq!(ApiError::Unhealthy.body().error, "unhealthy");
        assert_eq!(ApiError::Unhealthy.error_type(), "healthcheck");
    }

    #[test]
    fn overloaded_says_when_to_retry_and_unauthorized_names_the_scheme() {
        let overloaded = ApiError::from(InferError::Overloaded).into_response();
        assert_eq!(overloaded.headers()[header::RETRY_AFTER], "1");
        let unauthorized = ApiError::Unauthorized.into_response();
        assert_eq!(unauthorized.status().as_u16(), 401);
        assert_eq!(unauthorized.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let other = ApiError::Unhealthy.into_response();
        assert!(!other.headers().contains_key(header::RETRY_AFTER));
        assert!(!other.headers().contains_key(header::WWW_AUTHENTICATE));
    }

    #[tokio::test]
    async fn response_body_is_tgi_json() {
        let response = ApiError::from(InferError::Overloaded).into_response();
        assert_eq!(response.status().as_u16(), 429);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: ErrorBody = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            body,
            ErrorBody {
                error: "Model is overloaded".into(),
                error_type: "overloaded".into()
            }
        );
    }
}
