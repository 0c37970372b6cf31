//! The HTTP server: routes, shared state, layers (body limit, CORS, API key) and
//! graceful shutdown.
mod connections;
mod doc_types;
pub mod docs;
mod invocations;
pub mod openai;
mod ops;
mod request_guards;
mod sse;
mod strict_json;
mod tgi;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use futures::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::errors::ApiError;
use crate::infer::Infer;
use crate::metrics::{count_request, Outcome, Route};
use crate::telemetry::http_span::trace_http;

pub use connections::{listen, ConnectionOptions, LOOPBACK_RESERVE};
pub use openai::OpenAiContext;
pub use ops::Info;
pub use sse::{sse_response, to_event};

/// Answers whether the shards can still serve (`/health`).
pub trait HealthProbe: Send + Sync + 'static {
    fn check(&self) -> BoxFuture<'_, Result<(), String>>;
}

/// Everything the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub infer: Arc<Infer>,
    pub health: Arc<dyn HealthProbe>,
    pub info: Arc<Info>,
    pub prometheus: PrometheusHandle,
    pub openai: Arc<OpenAiContext>,
}

/// HTTP settings from the command line.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    pub payload_limit: usize,
    pub cors_allow_origin: Vec<String>,
    pub api_key: Option<String>,
    /// `--body-read-timeout`; None: no bound (tests).
    pub body_read_timeout: Option<Duration>,
    /// `--header-read-timeout`, `--keep-alive-timeout`, `--max-connections`.
    pub connections: ConnectionOptions,
}

/// JSON body extractor whose rejections (malformed JSON, wrong types, missing content
/// type, body over the payload limit) answer TGI's error JSON.
/// Only a JSON object is accepted as a body.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<S, T> axum::extract::FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let axum::Json(strict_json::UniqueKeys(value)) =
            axum::Json::<strict_json::UniqueKeys>::from_request(request, state).await?;
        if !value.is_object() {
            return Err(ApiError::invalid_body(
                "the request body must be a JSON object",
            ));
        }
        serde_json::from_value(value).map(ApiJson).map_err(|e| {
            ApiError::invalid_body(format!("Failed to deserialize the JSON body: {e}"))
        })
    }
}

/// A request whose body the extractor rejected (malformed JSON, wrong content type, over
/// the payload limit) still counts as a request of its route, ended by validation.
fn counted<T, E>(body: Result<T, E>, route: Route) -> Result<T, E> {
    body.inspect_err(|_| count_request(route, Outcome::Validation))
}

pub fn router(state: AppState, options: &HttpOptions) -> Router {
    let generation = Router::new()
        .route("/", post(tgi::compat_generate))
        .route("/generate", post(tgi::generate))
        .route("/generate_stream", post(tgi::generate_stream))
        .route("/tokenize", post(tgi::tokenize))
        .route("/chat_tokenize", post(tgi::chat_tokenize))
        .route("/invocations", post(invocations::invocations))
        .route_layer(middleware::from_fn_with_state(
            options.api_key.clone(),
            require_api_key,
        ))
        .route_layer(middleware::from_fn(trace_http));
    let openai_routes = Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*model}", get(openai::model))
        .route("/v1/{*rest}", axum::routing::any(openai::not_found))
        .route_layer(middleware::from_fn_with_state(
            options.api_key.clone(),
            require_openai_api_key,
        ))
        .route_layer(middleware::from_fn(trace_http));
    let operations = Router::new()
        .route("/", get(ops::health))
        .route("/health", get(ops::health))
        .route("/ping", get(ops::health))
        .route("/info", get(ops::info))
        .route("/metrics", get(ops::metrics));
    let app = generation
        .merge(openai_routes)
        .merge(operations)
        .merge(docs::routes())
        .layer(DefaultBodyLimit::max(options.payload_limit))
        .layer(middleware::from_fn_with_state(
            options.body_read_timeout,
            request_guards::body_read_timeout,
        ))
        .layer(middleware::from_fn(request_guards::refuse_content_encoding))
        .with_state(state);
    // CORS is off unless the operator names origins (`--cors-allow-origin`, as TGI): a
    // page from any site must not be able to call the server from a visitor's browser.
    // Without the layer no `Access-Control-*` header is sent, and every `OPTIONS`, a
    // preflight too, gets the routes' own answer (405 with `Allow`).
    if options.cors_allow_origin.is_empty() {
        return app;
    }
    app.clone()
        .layer(cors(&options.cors_allow_origin))
        .layer(middleware::from_fn_with_state(app, plain_options))
}

/// With CORS on, only a CORS preflight (`OPTIONS` with `Access-Control-Request-Method`)
/// is answered by the CORS layer; any other `OPTIONS` goes to the routes, which answer 405
/// with an `Allow` naming the route's own methods (the CORS layer would answer 200 for
/// every path and advertise GET on POST-only routes).
async fn plain_options(State(routes): State<Router>, request: Request, next: Next) -> Response {
    use tower::ServiceExt;
    let preflight = request
        .headers()
        .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if request.method() == Method::OPTIONS && !preflight {
        return match routes.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
    }
    next.run(request).await
}

/// The named origins may call with `Content-Type` and `Authorization` (an API key).
fn cors(origins: &[String]) -> CorsLayer {
    CorsLayer::new()
        .allow_methods([Method::GET, Method::POST])
        .allow_origin(AllowOrigin::list(
            origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()),
        ))
        .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
}

fn has_key(request: &Request, key: &str) -> bool {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        == Some(key)
}

/// With `--api-key`, generation routes need `Authorization: Bearer <key>` (compared
/// exactly, unlike TGI's case-insensitive check).
async fn require_api_key(
    State(key): State<Option<String>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(key) = key {
        if !has_key(&request, &key) {
            return Err(ApiError::Unauthorized);
        }
    }
    Ok(next.run(request).await)
}

/// The same check on `/v1/*` (`/v1/models` included, as OpenAI does), answered in
/// OpenAI's error envelope.
async fn require_openai_api_key(
    State(key): State<Option<String>>,
    request: Request,
    next: Next,
) -> Result<Response, openai::errors::OpenAiError> {
    if let Some(key) = key {
        if !has_key(&request, &key) {
            return Err(openai::errors::OpenAiError::unauthorized());
        }
    }
    Ok(next.run(request).await)
}

/// Serves until `shutdown` resolves, then stops accepting and waits for in-flight
/// requests (open SSE streams included) to finish. Connections are bounded by
/// `options.connections` (header and keep-alive timeouts, `--max-connections`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    options: &HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    connections::serve(listener, app, options.connections, shutdown).await
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "openai_tests.rs"]
mod openai_tests;

#[cfg(test)]
#[path = "connections_tests.rs"]
mod connections_tests;

#[cfg(test)]
#[path = "flags_doc_tests.rs"]
mod flags_doc_tests;
