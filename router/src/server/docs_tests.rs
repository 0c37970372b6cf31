//! The served document states what the server enforces (issue 27, defect 8).
use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::Request;
use serde_json::Value;

use super::super::tests::{app, call, json, post};

async fn served() -> Value {
    let request = Request::get("/api-doc/openapi.json")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = call(app(), request).await;
    assert_eq!(status, 200);
    json(&body)
}

#[tokio::test]
async fn the_document_carries_the_running_limits_and_the_refused_values() {
    let doc = served().await;
    let schemas = &doc["components"]["schemas"];
    let p = &schemas["GenerateParameters"]["properties"];
    // The test app's Info: best_of 2, stop 4, top_n 5, input 100, total 200.
    assert_eq!(p["best_of"]["maximum"], 2);
    assert_eq!(p["best_of"]["minimum"], 1);
    assert_eq!(p["stop"]["maxItems"], 4);
    assert_eq!(p["stop"]["items"]["minLength"], 1);
    assert_eq!(p["stop"]["items"]["maxLength"], 1024);
    assert_eq!(p["top_n_tokens"]["maximum"], 5);
    assert_eq!(p["truncate"]["maximum"], 100);
    assert_eq!(p["truncate"]["minimum"], 1);
    assert_eq!(p["max_new_tokens"]["maximum"], 199);
    assert_eq!(p["max_new_tokens"]["minimum"], 1);
    assert_eq!(p["top_k"]["minimum"], 1);
    assert_eq!(p["top_p"]["exclusiveMinimum"], 0);
    assert_eq!(p["top_p"]["exclusiveMaximum"], 1);
    assert_eq!(p["temperature"]["exclusiveMinimum"], 0);
    assert_eq!(p["adapter_id"]["maxLength"], 0);
    for request in ["GenerateRequest", "CompatGenerateRequest"] {
        assert_eq!(
            schemas[request]["properties"]["inputs"]["minLength"], 1,
            "{request}"
        );
    }
    let role = &schemas["ChatRole"]["enum"];
    assert_eq!(
        role,
        &serde_json::json!([
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
            "function"
        ])
    );
    let chat = &schemas["ChatCompletionRequest"]["properties"];
    assert_eq!(chat["top_k"]["minimum"], -1);
    assert_eq!(chat["min_p"]["maximum"], 1);
    // Found by schemathesis' negative_data_rejection (bench/openapi_fuzz.py): TGI's u64 seed
    // past int64, and an empty array where the document said object.
    for schema in [
        "GenerateParameters",
        "Details",
        "StreamDetails",
        "BestOfSequence",
    ] {
        let seed = &schemas[schema]["properties"]["seed"];
        assert_eq!(seed["maximum"], u64::MAX, "{schema}");
        assert_eq!(seed["format"], "uint64", "{schema}");
    }
    for body in ["ChatCompletionRequest", "CompletionRequest"] {
        let p = &schemas[body]["properties"];
        assert_eq!(
            p["logprob_token_ids"]["type"],
            serde_json::json!(["object", "array", "null"])
        );
        assert_eq!(p["logprob_token_ids"]["maxItems"], 0);
        assert_eq!(p["thinking_token_budget"]["anyOf"][1]["const"], -1);
    }
}

#[tokio::test]
async fn a_seed_past_int64_is_served_as_tgi_serves_it() {
    let body = r#"{"inputs":"hi","parameters":{"seed":9223372036854775808,"max_new_tokens":2,"do_sample":true}}"#;
    let (status, _, _) = call(app(), post("/generate", body)).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_document_lists_the_request_layers_answers() {
    let doc = served().await;
    for path in [
        "/generate",
        "/tokenize",
        "/v1/chat/completions",
        "/v1/completions",
        "/invocations",
    ] {
        let responses = &doc["paths"][path]["post"]["responses"];
        for status in ["408", "413", "415"] {
            assert!(responses[status].is_object(), "{path} lacks {status}");
        }
    }
    let error = &doc["paths"]["/v1/chat/completions"]["post"]["responses"]["408"];
    assert!(error.to_string().contains("OpenAiErrorBody"), "{error}");
    assert!(doc["paths"]["/health"]["get"]["responses"]["415"].is_object());
}

/// `OPTIONS` answers `Allow` with the methods the route table has; the document must list
/// the same ones (schemathesis' allow_header_conformance).
#[tokio::test]
async fn allow_on_every_documented_path_matches_the_document() {
    let doc = served().await;
    for (path, item) in doc["paths"].as_object().unwrap() {
        if path.contains('{') {
            continue;
        }
        let request = Request::options(path.as_str()).body(Body::empty()).unwrap();
        let (status, headers, _) = call(app(), request).await;
        assert_eq!(status, 405, "{path}");
        let allow = headers
            .get("allow")
            .unwrap()
            .to_str()
            .unwrap()
            .to_lowercase();
        let advertised: BTreeSet<&str> = allow
            .split(',')
            .map(str::trim)
            .filter(|m| !["head", "options"].contains(m))
            .collect();
        let documented: BTreeSet<&str> = item
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(advertised, documented, "{path}: Allow {allow}");
    }
}

#[tokio::test]
async fn tokenize_refuses_what_generate_refuses() {
    for body in [
        r#"{"inputs":""}"#,
        r#"{"inputs":"hi","parameters":{"top_n_tokens":6}}"#,
        r#"{"inputs":"hi","parameters":{"top_k":0}}"#,
        r#"{"inputs":"hi","parameters":{"truncate":0}}"#,
        r#"{"inputs":"hi","parameters":{"best_of":3}}"#,
        r#"{"inputs":"hi","parameters":{"stop":[""]}}"#,
        r#"{"inputs":"hi","parameters":{"grammar":{"type":"nope","value":1}}}"#,
    ] {
        let (status, _, answer) = call(app(), post("/tokenize", body)).await;
        assert_eq!(status, 422, "{body}: {answer}");
        let (generate, _, _) = call(app(), post("/generate", body)).await;
        assert_eq!(generate, 422, "/generate {body}");
        assert_eq!(json(&answer)["error_type"], "validation", "{answer}");
    }
    let (status, _, answer) = call(
        app(),
        post(
            "/tokenize",
            r#"{"inputs":"qzx jvk wq","parameters":{"top_n_tokens":5}}"#,
        ),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let all = json(&answer).as_array().unwrap().len();
    assert!(all > 2, "{answer}");
    // `truncate` keeps the last tokens, as TGI's /tokenize does.
    let (status, _, kept) = call(
        app(),
        post(
            "/tokenize",
            r#"{"inputs":"qzx jvk wq","parameters":{"truncate":2}}"#,
        ),
    )
    .await;
    assert_eq!(status, 200, "{kept}");
    let kept = json(&kept);
    assert_eq!(kept.as_array().unwrap().len(), 2, "{kept}");
    assert_eq!(json(&answer)[all - 1], kept[1]);
}
