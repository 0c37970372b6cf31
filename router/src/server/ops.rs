//! Operational routes: `/health`, `/info`, `/metrics`.
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use crate::errors::ApiError;

/// `/info`: TGI's fields plus what textgen learned from the shards.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Info {
    pub model_id: String,
    pub model_sha: Option<String>,
    pub model_pipeline_tag: Option<String>,
    pub model_dtype: String,
    pub model_device_type: String,
    pub max_concurrent_requests: usize,
    pub max_best_of: usize,
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: u32,
    pub max_input_tokens: u32,
    pub max_total_tokens: u32,
    pub max_batch_prefill_tokens: u32,
    pub max_batch_total_tokens: u32,
    pub max_batch_size: Option<u32>,
    pub block_size: u32,
    /// Drafts a decode may verify (`--speculate`); 0: speculative decoding is off.
    pub speculate: u32,
    pub num_shard: u32,
    pub validation_workers: usize,
    pub router: &'static str,
    pub version: &'static str,
    pub sha: Option<String>,
    pub docker_label: Option<String>,
}

#[utoipa::path(
    get,
    path = "/health",
    tag = "Operations",
    responses(
        (status = 200, description = "Every shard answers"),
        (status = 503, description = "A shard does not answer", body = crate::schema::ErrorBody),
    )
)]
pub async fn health(State(state): State<AppState>) -> Result<StatusCode, ApiError> {
    match state.health.check().await {
        Ok(()) => Ok(StatusCode::OK),
        Err(reason) => {
            tracing::warn!(%reason, "health check failed");
            Err(ApiError::Unhealthy)
        }
    }
}

#[utoipa::path(
    get,
    path = "/info",
    tag = "Operations",
    responses((status = 200, description = "Model and router settings", body = Info))
)]
pub async fn info(State(state): State<AppState>) -> Json<Info> {
    Json(state.info.as_ref().clone())
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "Operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"))
)]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.prometheus.render(),
    )
}
