use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use super::*;
use crate::test_support::{byte_level_tokenizer, fake_scheduler, Script};
use crate::validation::{Validation, ValidationLimits};

struct FlagProbe(AtomicBool);

impl HealthProbe for FlagProbe {
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        let healthy = self.0.load(Ordering::SeqCst);
        Box::pin(async move {
            if healthy {
                Ok(())
            } else {
                Err("shard 0 down".into())
            }
        })
    }
}

const LIMITS: ValidationLimits = ValidationLimits {
    max_best_of: 2,
    max_stop_sequences: 4,
    max_top_n_tokens: 5,
    max_input_tokens: 100,
    max_total_tokens: 200,
    vocab_size: 300,
    watermark: crate::validation::WatermarkSettings {
        gamma: 0.5,
        delta: 2.0,
    },
};

fn info() -> Info {
    Info {
        model_id: "test/model".into(),
        model_sha: None,
        model_pipeline_tag: Some("text-generation".into()),
        model_dtype: "float32".into(),
        model_device_type: "cpu".into(),
        max_concurrent_requests: 4,
        max_best_of: 2,
        max_stop_sequences: 4,
        max_top_n_tokens: 5,
        max_input_tokens: 100,
        max_total_tokens: 200,
        max_batch_prefill_tokens: 64,
        max_batch_total_tokens: 256,
        max_batch_size: None,
        block_size: 16,
        speculate: 0,
        num_shard: 1,
        validation_workers: 1,
        router: "textgen-router",
        version: "0",
        sha: None,
        docker_label: None,
    }
}

/// Refuses conversations that do not start with a user turn, like many real templates.
/// The rendered prompt is the contents alone, so it stays within the tiny test limits.
pub const TEST_CHAT_TEMPLATE: &str = "{% if messages[0].role == 'assistant' %}{{ raise_exception('Conversation must not start with the assistant') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}";

pub fn app_with(options: HttpOptions, healthy: bool) -> Router {
    let tokenizer = byte_level_tokenizer();
    let eos = tokenizer.token_to_id("<eos>").unwrap();
    let mut ids = tokenizer.encode(" world").unwrap();
    ids.push(eos);
    app_scripted(options, healthy, Script::Tokens(ids))
}

/// The app whose fake scheduler plays `script` for every sequence.
pub fn app_scripted(options: HttpOptions, healthy: bool, script: Script) -> Router {
    app_built(options, healthy, script, TEST_CHAT_TEMPLATE, false)
}

/// `app_scripted` with this chat template and grammars compiled (llguidance over the
/// byte-level tokenizer; the fake scheduler still plays its script).
pub fn app_templated(
    options: HttpOptions,
    healthy: bool,
    script: Script,
    template: &str,
) -> Router {
    app_built(options, healthy, script, template, true)
}

fn app_built(
    options: HttpOptions,
    healthy: bool,
    script: Script,
    template: &str,
    grammar: bool,
) -> Router {
    let tokenizer = Arc::new(byte_level_tokenizer());
    let eos = tokenizer.token_to_id("<eos>").unwrap();
    let (scheduler, _) = fake_scheduler(move |_| script.clone());
    let mut validation = Validation::new(tokenizer.clone(), LIMITS, 1);
    if grammar {
        use crate::grammar::{token_env, GrammarCompiler, GrammarLimits};
        let env = token_env(tokenizer.clone(), LIMITS.vocab_size, &[eos]).unwrap();
        let limits = GrammarLimits {
            max_bytes: 100_000,
            compile_timeout: std::time::Duration::from_secs(30),
        };
        let compiler = GrammarCompiler::new(env, vec![eos], limits).unwrap();
        validation = validation.with_grammar(Arc::new(compiler));
    }
    let state = AppState {
        infer: Arc::new(Infer::new(scheduler, validation, tokenizer, 4, vec![eos])),
        health: Arc::new(FlagProbe(AtomicBool::new(healthy))),
        info: Arc::new(info()),
        prometheus: crate::metrics::builder().unwrap().build_recorder().handle(),
        openai: Arc::new(crate::server::OpenAiContext {
            model_id: "org/test-model".into(),
            created: 1_700_000_000,
            chat_template: crate::chat_template::ChatTemplate::new(
                template.into(),
                None,
                Some("<eos>".into()),
            ),
            defaults: crate::server::openai::mapping::ModelDefaults {
                stop_token_ids: vec![eos],
                ..Default::default()
            },
        }),
    };
    router(state, &options)
}

pub fn app() -> Router {
    app_with(
        HttpOptions {
            payload_limit: 1000,
            ..HttpOptions::default()
        },
        true,
    )
}

pub fn post(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

pub async fn call(
    app: Router,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
}

pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|err| panic!("not JSON ({err}): {body:?}"))
}

#[tokio::test]
async fn generate_answers_text_details_and_timing_headers() {
    let (status, headers, body) = call(
        app(),
        post(
            "/generate",
            r#"{"inputs":"hello","parameters":{"details":true}}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let body = json(&body);
    assert_eq!(body["generated_text"], " world");
    assert_eq!(body["details"]["finish_reason"], "eos_token");
    assert_eq!(
        headers["x-generated-tokens"], "7",
        "six byte tokens and EOS"
    );
    assert_eq!(headers["x-prompt-tokens"], "1");
    assert_eq!(headers["x-compute-type"], "cpu");
    for name in [
        "x-total-time",
        "x-validation-time",
        "x-queue-time",
        "x-inference-time",
        "x-time-per-token",
    ] {
        assert!(headers.contains_key(name), "{name}");
    }
}

#[tokio::test]
async fn body_errors_answer_tgi_json() {
    let cases = [
        (post("/generate", "{not json"), 400, "bad_request"),
        (
            post("/generate", r#"{"inputs":"x","parameters":{"top_k":"a"}}"#),
            422,
            "validation",
        ),
        (
            post("/generate", r#"{"inputs":"x","parameters":{"grammer":1}}"#),
            422,
            "validation",
        ),
        // serde would otherwise build a struct from an array of its fields.
        (
            post("/generate", r#"{"inputs":"x","parameters":[1]}"#),
            422,
            "validation",
        ),
        (post("/generate", r#"["x"]"#), 422, "validation"),
        // The last of two values would otherwise win silently.
        (
            post(
                "/generate",
                r#"{"inputs":"x","parameters":{"seed":1,"seed":2}}"#,
            ),
            422,
            "validation",
        ),
        (
            Request::post("/generate")
                .body(Body::from(r#"{"inputs":"x"}"#))
                .unwrap(),
            415,
            "unsupported_media_type",
        ),
        (
            post(
                "/generate",
                &format!(r#"{{"inputs":"{}"}}"#, "a".repeat(2000)),
            ),
            413,
            "payload_too_large",
        ),
    ];
    for (request, status, error_type) in cases {
        let (got, _, body) = call(app(), request).await;
        assert_eq!(got.as_u16(), status, "{body}");
        let body = json(&body);
        assert_eq!(body["error_type"], error_type);
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
}

#[tokio::test]
async fn validation_errors_are_422_with_tgi_messages() {
    let (status, _, body) = call(
        app(),
        post("/generate", r#"{"inputs":"x","parameters":{"top_p":1.0}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        json(&body),
        serde_json::json!({"error":"Input validation error: `top_p` must be > 0.0 and < 1.0","error_type":"validation"})
    );
    let (status, _, body) = call(app(), post("/generate_stream", r#"{"inputs":""}"#)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json(&body)["error_type"], "validation");
}

#[tokio::test]
async fn generate_stream_sends_sse() {
    let (status, headers, body) =
        call(app(), post("/generate_stream", r#"{"inputs":"hello"}"#)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/event-stream");
    let events: Vec<serde_json::Value> = body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(json)
        .collect();
    assert_eq!(events.len(), 7);
    assert_eq!(events[6]["generated_text"], " world");
    assert_eq!(events[6]["details"]["input_length"], 1);
}

#[tokio::test]
async fn compat_route_picks_array_or_stream() {
    let (status, _, body) = call(app(), post("/", r#"{"inputs":"hello"}"#)).await;
    assert_eq!(status, StatusCode::OK);
    let body = json(&body);
    assert_eq!(body.as_array().unwrap().len(), 1);
    assert_eq!(
        body[0]["generated_text"], "hello world",
        "return_full_text defaults to true here"
    );
    let (_, headers, body) = call(app(), post("/", r#"{"inputs":"hello","stream":true}"#)).await;
    assert_eq!(headers["content-type"], "text/event-stream");
    assert!(body.starts_with("data: "));
}

#[tokio::test]
async fn tokenize_returns_char_offsets() {
    let (status, _, body) = call(app(), post("/tokenize", r#"{"inputs":"é hello"}"#)).await;
    assert_eq!(status, StatusCode::OK);
    let tokens = json(&body);
    let last = tokens.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["stop"], 7);
}

#[tokio::test]
async fn health_info_metrics() {
    let (status, _, _) = call(app(), Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let sick = app_with(
        HttpOptions {
            payload_limit: 1000,
            ..HttpOptions::default()
        },
        false,
    );
    let (status, _, body) = call(sick, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        json(&body),
        serde_json::json!({"error":"unhealthy","error_type":"healthcheck"})
    );
    let (_, _, body) = call(app(), Request::get("/info").body(Body::empty()).unwrap()).await;
    let info = json(&body);
    assert_eq!(info["model_id"], "test/model");
    assert_eq!(info["max_total_tokens"], 200);
    let (status, headers, _) =
        call(app(), Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
}

#[tokio::test]
async fn api_key_guards_generation_routes_only() {
    let options = HttpOptions {
        payload_limit: 1000,
        api_key: Some("secret".into()),
        ..HttpOptions::default()
    };
    let (status, _, _) = call(
        app_with(options.clone(), true),
        post("/generate", r#"{"inputs":"x"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let mut request = post("/generate", r#"{"inputs":"x"}"#);
    request
        .headers_mut()
        .insert("authorization", "Bearer secret".parse().unwrap());
    let (status, _, _) = call(app_with(options.clone(), true), request).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = call(
        app_with(options, true),
        Request::get("/health").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

fn preflight(origin: &str) -> Request<Body> {
    Request::options("/generate")
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
        .body(Body::empty())
        .unwrap()
}

fn from_origin(mut request: Request<Body>, origin: &str) -> Request<Body> {
    request
        .headers_mut()
        .insert("origin", origin.parse().unwrap());
    request
}

fn cors_headers(headers: &axum::http::HeaderMap) -> Vec<String> {
    headers
        .keys()
        .map(|name| name.as_str().to_owned())
        .filter(|name| name.starts_with("access-control-"))
        .collect()
}

#[tokio::test]
async fn cors_is_off_without_named_origins() {
    let page = "https://page.example";
    // A page's request is served as any other, without a header letting the page read it.
    let (status, headers, _) = call(
        app(),
        from_origin(post("/generate", r#"{"inputs":"x"}"#), page),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cors_headers(&headers), Vec::<String>::new());
    let health = Request::get("/health").body(Body::empty()).unwrap();
    let (status, headers, _) = call(app(), from_origin(health, page)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cors_headers(&headers), Vec::<String>::new());
    // A preflight gets the route's own answer to OPTIONS, which allows nothing.
    let (status, headers, _) = call(app(), preflight(page)).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "POST");
    assert_eq!(cors_headers(&headers), Vec::<String>::new());
}

#[tokio::test]
async fn cors_lets_only_named_origins_call_and_send_an_api_key() {
    let named = || {
        app_with(
            HttpOptions {
                payload_limit: 1000,
                cors_allow_origin: vec!["https://page.example".into()],
                ..HttpOptions::default()
            },
            true,
        )
    };
    let (status, headers, _) = call(named(), preflight("https://page.example")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://page.example"
    );
    let allowed = headers["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"));
    let request = from_origin(
        post("/generate", r#"{"inputs":"x"}"#),
        "https://page.example",
    );
    let (status, headers, _) = call(named(), request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://page.example"
    );
    // Another origin is not let in.
    let (_, headers, _) = call(named(), preflight("https://other.example")).await;
    assert!(!headers.contains_key("access-control-allow-origin"));
    let request = from_origin(
        post("/generate", r#"{"inputs":"x"}"#),
        "https://other.example",
    );
    let (_, headers, _) = call(named(), request).await;
    assert!(!headers.contains_key("access-control-allow-origin"));
}
