//! The OpenAI routes over the real router and a fake scheduler (which answers " world"
//! then EOS to every sequence): response shapes, the stream's framing, request mapping,
//! and hostile input answered with OpenAI's error envelope.
use axum::http::StatusCode;

use super::tests::{app, app_scripted, app_with, call, json, post};
use super::HttpOptions;

/// The test app with room for large hostile bodies.
fn roomy_app() -> axum::Router {
    app_with(
        HttpOptions {
            payload_limit: 1 << 20,
            ..HttpOptions::default()
        },
        true,
    )
}

async fn chat(body: &str) -> (StatusCode, serde_json::Value) {
    let (status, _, text) = call(roomy_app(), post("/v1/chat/completions", body)).await;
    (status, json(&text))
}

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn chat_answers_openai_shape() {
    let (status, body) =
        chat(r#"{"model":"anything","messages":[{"role":"user","content":"hi"}]}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "org/test-model");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], " world");
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    assert_eq!(body["usage"]["prompt_tokens"], 2);
    assert_eq!(body["usage"]["completion_tokens"], 7);
    assert_eq!(body["usage"]["total_tokens"], 9);
}

#[tokio::test]
async fn chat_n_logprobs_and_length_finish() {
    let (status, body) = chat(
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"h"},{"type":"text","text":"i"}]}],
            "n":3,"seed":4,"logprobs":true,"top_logprobs":2,"max_completion_tokens":2}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        assert_eq!(choice["finish_reason"], "length");
        let content = choice["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_eq!(content[0]["token"], " ");
        assert_eq!(content[0]["bytes"], serde_json::json!([32]));
        assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
        // Seeds are 4, 5, 6: the fake's logprob is -(seed % 5) - 0.5.
        let expected = -(((4 + i) % 5) as f64) - 0.5;
        assert_eq!(content[0]["logprob"].as_f64().unwrap(), expected);
    }
    assert_eq!(body["usage"]["completion_tokens"], 6);
}

#[tokio::test]
async fn chat_stream_follows_openai_framing() {
    let (status, headers, body) = call(
        app(),
        post(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":2,
                "stream_options":{"include_usage":true}}"#,
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["content-type"], "text/event-stream");
    let events = events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<serde_json::Value> =
        events[..events.len() - 1].iter().map(|e| json(e)).collect();
    for index in 0..2 {
        let mine: Vec<&serde_json::Value> = chunks
            .iter()
            .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
            .filter(|c| c["choices"][0]["index"] == index)
            .collect();
        assert_eq!(
            mine[0]["choices"][0]["delta"]["role"], "assistant",
            "role first"
        );
        let finishes: Vec<_> = mine
            .iter()
            .filter(|c| !c["choices"][0]["finish_reason"].is_null())
            .collect();
        assert_eq!(finishes.len(), 1, "finish_reason exactly once");
        assert_eq!(finishes[0]["choices"][0]["finish_reason"], "stop");
        let text: String = mine
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, " world", "no EOS text in the content");
    }
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 14);
    for chunk in &chunks[..chunks.len() - 1] {
        assert!(chunk["usage"].is_null());
        assert_eq!(chunk["object"], "chat.completion.chunk");
    }
}

#[tokio::test]
async fn stop_sequences_are_cut_out_of_streamed_and_whole_text() {
    let (status, body) =
        chat(r#"{"messages":[{"role":"user","content":"hi"}],"stop":["rl"]}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], " wo");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let (_, _, streamed) = call(
        app(),
        post(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"stop":"rl","stream":true}"#,
        ),
    )
    .await;
    let text: String = events(&streamed)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            json(e)["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, " wo");
}

#[tokio::test]
async fn completions_handle_batches_echo_and_legacy_logprobs() {
    let tokenizer = crate::test_support::byte_level_tokenizer();
    let hello = tokenizer.encode("hello").unwrap();
    let hi = tokenizer.encode("hi").unwrap();
    let request = format!(
        r#"{{"model":"m","prompt":[{hello:?},{hi:?}],"echo":true,"logprobs":1,"max_tokens":3}}"#
    );
    let (status, _, body) = call(app(), post("/v1/completions", &request)).await;
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    assert_eq!(body["object"], "text_completion");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(choices[0]["text"], "hello wo");
    assert_eq!(choices[1]["text"], "hi wo");
    assert_eq!(choices[0]["finish_reason"], "length");
    let logprobs = &choices[1]["logprobs"];
    assert_eq!(
        logprobs["tokens"],
        serde_json::json!(["h", "i", " ", "w", "o"])
    );
    assert!(
        logprobs["token_logprobs"][0].is_null(),
        "the first prompt token has none"
    );
    assert_eq!(logprobs["token_logprobs"][1], -1.0);
    assert_eq!(logprobs["text_offset"], serde_json::json!([0, 1, 2, 3, 4]));
    assert_eq!(
        body["usage"]["prompt_tokens"], 3,
        "hello is one merged token"
    );
    assert_eq!(body["usage"]["completion_tokens"], 6);
    let (status, _, texts) = call(
        app(),
        post(
            "/v1/completions",
            r#"{"prompt":["hello","hi"],"max_tokens":1}"#,
        ),
    )
    .await;
    assert_eq!(status, 200, "{texts}");
    assert_eq!(json(&texts)["choices"][1]["text"], " ");
}

#[tokio::test]
async fn completions_best_of_returns_the_best_n() {
    let (status, _, body) = call(
        app(),
        post(
            "/v1/completions",
            r#"{"prompt":"hi","n":1,"best_of":3,"seed":2,"max_tokens":2}"#,
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    assert_eq!(body["choices"].as_array().unwrap().len(), 1);
    // Seeds 2, 3, 4 give logprobs -2.5, -3.5, -4.5: seed 2 wins, and all three count.
    assert_eq!(body["usage"]["completion_tokens"], 6);
}

#[tokio::test]
async fn completion_stream_ends_with_done() {
    let (status, _, body) = call(
        app(),
        post(
            "/v1/completions",
            r#"{"prompt":"hi","stream":true,"max_tokens":3,"echo":true}"#,
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let sent = events(&body);
    assert_eq!(sent.last().unwrap(), "[DONE]");
    let text: String = sent[..sent.len() - 1]
        .iter()
        .map(|e| json(e)["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "hi wo");
    let (_, _, body) = call(
        app(),
        post(
            "/v1/completions",
            r#"{"prompt":"hi","stream":true,"max_tokens":3,"echo":true,"logprobs":1}"#,
        ),
    )
    .await;
    let offsets: Vec<u64> = events(&body)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| json(e)["choices"][0]["logprobs"]["text_offset"][0].as_u64())
        .collect();
    assert_eq!(
        offsets,
        vec![2, 3, 4],
        "offsets count from the start of the echoed text"
    );
}

#[tokio::test]
async fn models_report_the_served_model() {
    let (status, _, body) = call(
        app(),
        axum::http::Request::get("/v1/models")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let body = json(&body);
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], "org/test-model");
    assert_eq!(body["data"][0]["owned_by"], "org");
    assert_eq!(body["data"][0]["created"], 1_700_000_000);
    let (status, _, _) = call(
        app(),
        axum::http::Request::get("/v1/models/org/test-model")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, body) = call(
        app(),
        axum::http::Request::get("/v1/models/other")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"]["type"], "not_found_error");
    let (status, _, body) = call(app(), post("/v1/embeddings", "{}")).await;
    assert_eq!(status, 404);
    assert!(json(&body)["error"]["message"].is_string());
}

#[tokio::test]
async fn hostile_chat_requests_get_400_envelopes() {
    let user = r#""messages":[{"role":"user","content":"hi"}]"#;
    let cases: Vec<(String, &str)> = vec![
        (format!(r#"{{{user},"n":-1}}"#), ""),
        (format!(r#"{{{user},"n":0}}"#), "n"),
        (format!(r#"{{{user},"n":100000}}"#), "n"),
        (format!(r#"{{{user},"logprobs":true,"top_logprobs":21}}"#), "top_logprobs"),
        (format!(r#"{{{user},"top_logprobs":2}}"#), "top_logprobs"),
        (format!(r#"{{{user},"logit_bias":{{"999999":5}}}}"#), ""),
        (format!(r#"{{{user},"logit_bias":{{"5":500}}}}"#), ""),
        (format!(r#"{{{user},"logit_bias":{{"abc":5}}}}"#), "logit_bias"),
        (format!(r#"{{{user},"stop":[1,2]}}"#), ""),
        (format!(r#"{{{user},"stop":"{}"}}"#, "x".repeat(10_000)), ""),
        (format!(r#"{{{user},"stop":["a","b","c","d","e"]}}"#), ""),
        (format!(r#"{{{user},"temperature":"hot"}}"#), ""),
        (format!(r#"{{{user},"temperature":3}}"#), "temperature"),
        (format!(r#"{{{user},"top_p":0}}"#), "top_p"),
        (format!(r#"{{{user},"presence_penalty":9}}"#), ""),
        (format!(r#"{{{user},"max_tokens":0}}"#), ""),
        (format!(r#"{{{user},"stream_options":{{"include_usage":true}}}}"#), "stream_options"),
        (format!(r#"{{{user},"response_format":{{"type":"xml"}}}}"#), "response_format"),
        (format!(r#"{{{user},"response_format":{{"type":"json_schema"}}}}"#), "response_format.json_schema"),
        (format!(r#"{{{user},"tools":[{{"type":"function"}}]}}"#), "tools[0].function"),
        (format!(r#"{{{user},"tool_choice":"required"}}"#), "tool_choice"),
        (format!(r#"{{{user},"unknown_field":1}}"#), ""),
        (r#"{"messages":[]}"#.to_owned(), "messages"),
        (r#"{"messages":"hi"}"#.to_owned(), ""),
        (r#"{"messages":[{"role":"wizard","content":"hi"}]}"#.to_owned(), "messages[0]"),
        (r#"{"messages":[{"role":"user"}]}"#.to_owned(), "messages[0]"),
        (r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#.to_owned(), "messages[0]"),
        (r#"{"messages":[{"role":"assistant","content":"hi"}]}"#.to_owned(), "messages"),
        ("{not json".to_owned(), ""),
        ("[1]".to_owned(), ""),
        (format!(r#"{{{user},"max_tokens":1,"max_tokens":9}}"#), ""),
    ];
    for (request, param) in cases {
        let (status, body) = chat(&request).await;
        assert_eq!(status, 400, "{request}: {body}");
        let error = &body["error"];
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        if !param.is_empty() {
            assert_eq!(error["param"], param, "{request}: {body}");
        }
    }
}

/// The shared validation's refusals name the field the `/v1` client sent (issue 27), in
/// the message and in `param`, streamed or not.
#[tokio::test]
async fn validation_errors_name_the_openai_fields() {
    let user = r#""messages":[{"role":"user","content":"hi"}]"#;
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "/v1/chat/completions",
            format!(r#"{{{user},"max_tokens":0}}"#),
            "max_tokens",
            "Input validation error: `max_tokens` must be strictly positive",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{{user},"max_tokens":0,"stream":true}}"#),
            "max_tokens",
            "`max_tokens` must be strictly positive",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{{user},"max_completion_tokens":0}}"#),
            "max_completion_tokens",
            "`max_completion_tokens` must be strictly positive",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{{user},"truncate_prompt_tokens":9223372036854775807}}"#),
            "truncate_prompt_tokens",
            "`truncate_prompt_tokens` must be strictly positive and less than",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","max_tokens":0}"#.to_owned(),
            "max_tokens",
            "`max_tokens` must be strictly positive",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"","max_tokens":1}"#.to_owned(),
            "prompt",
            "Input validation error: `prompt` cannot be empty",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"","stream":true}"#.to_owned(),
            "prompt",
            "`prompt` cannot be empty",
        ),
        (
            "/v1/completions",
            r#"{"prompt":[[1,2],[]]}"#.to_owned(),
            "prompt",
            "`prompt` cannot be empty",
        ),
        (
            "/v1/completions",
            r#"{"prompt":[99999]}"#.to_owned(),
            "prompt",
            "prompt token 99999 is outside",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","truncate_prompt_tokens":9223372036854775807}"#.to_owned(),
            "truncate_prompt_tokens",
            "`truncate_prompt_tokens` must be strictly positive",
        ),
        (
            "/invocations",
            r#"{"prompt":""}"#.to_owned(),
            "prompt",
            "`prompt` cannot be empty",
        ),
    ];
    for (route, request, param, fragment) in cases {
        let (status, _, body) = call(roomy_app(), post(route, &request)).await;
        assert_eq!(status, 400, "{request}: {body}");
        let error = &json(&body)["error"];
        assert_eq!(error["param"], param, "{request}: {body}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(fragment), "{request}: {message}");
        for native in ["max_new_tokens", "`inputs`", "`truncate`"] {
            assert!(!message.contains(native), "{request}: {message}");
        }
    }
}

#[tokio::test]
async fn template_exceptions_reach_the_client() {
    let (status, body) = chat(r#"{"messages":[{"role":"assistant","content":"hi"}]}"#).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Conversation must not start with the assistant"));
}

#[tokio::test]
async fn sdk_metadata_fields_are_accepted() {
    let (status, body) = chat(
        r#"{"messages":[{"role":"developer","content":"hi"}],"user":"u","store":false,
            "metadata":{"a":"b"},"service_tier":"auto","parallel_tool_calls":true,
            "tools":[],"tool_choice":"none","response_format":{"type":"text"},
            "modalities":["text"],"stream":false,"seed":-5}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn hostile_completion_requests_get_400_envelopes() {
    for request in [
        r#"{"prompt":"hi","suffix":"x"}"#,
        r#"{"prompt":"hi","logprobs":6}"#,
        r#"{"prompt":"hi","best_of":1,"n":2}"#,
        r#"{"prompt":"hi","best_of":3,"stream":true}"#,
        r#"{"prompt":[]}"#,
        r#"{"prompt":[[]]}"#,
        r#"{"prompt":[1,-2]}"#,
        r#"{"prompt":[99999]}"#,
        r#"{"prompt":{"a":1}}"#,
        r#"{"prompt":["a","b","c","d","e","f","g","h","i"],"n":4}"#,
        r#"{"prompt":""}"#,
    ] {
        let (status, _, body) = call(app(), post("/v1/completions", request)).await;
        assert_eq!(status, 400, "{request}: {body}");
        assert_eq!(json(&body)["error"]["type"], "invalid_request_error");
    }
}

#[tokio::test]
async fn api_key_failures_use_the_openai_envelope() {
    let app = || {
        app_with(
            HttpOptions {
                payload_limit: 1000,
                api_key: Some("k".into()),
                ..HttpOptions::default()
            },
            true,
        )
    };
    let (status, _, body) = call(app(), post("/v1/chat/completions", "{}")).await;
    assert_eq!(status, 401);
    assert_eq!(json(&body)["error"]["type"], "authentication_error");
    let mut request = post("/v1/completions", r#"{"prompt":"hi","max_tokens":1}"#);
    request
        .headers_mut()
        .insert("authorization", "Bearer k".parse().unwrap());
    let (status, _, body) = call(app(), request).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(
        app(),
        post(
            "/v1/completions",
            &format!(r#"{{"prompt":"{}"}}"#, "a".repeat(2000)),
        ),
    )
    .await;
    assert_eq!(status, 401, "{body}");
}

#[tokio::test]
async fn oversized_bodies_get_413_envelopes() {
    let (status, _, body) = call(
        app(),
        post(
            "/v1/completions",
            &format!(r#"{{"prompt":"{}"}}"#, "a".repeat(2000)),
        ),
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(json(&body)["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn chat_tokenize_and_invocations_route_by_body() {
    let (status, _, body) = call(
        app(),
        post(
            "/chat_tokenize",
            r#"{"messages":[{"role":"user","content":"hello"}]}"#,
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let body = json(&body);
    assert_eq!(body["templated_text"], "hello");
    assert_eq!(body["tokenize_response"][0]["text"], "hello");
    let (status, _, body) = call(
        app(),
        post(
            "/chat_tokenize",
            r#"{"messages":[{"role":"assistant","content":"x"}]}"#,
        ),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(json(&body)["error_type"], "validation");

    let (_, _, chat) = call(
        app(),
        post(
            "/invocations",
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        ),
    )
    .await;
    assert_eq!(json(&chat)["object"], "chat.completion");
    let (_, _, completion) = call(
        app(),
        post("/invocations", r#"{"prompt":"hi","max_tokens":1}"#),
    )
    .await;
    assert_eq!(json(&completion)["object"], "text_completion");
    let (_, _, native) = call(
        app(),
        post(
            "/invocations",
            r#"{"inputs":"hi","parameters":{"max_new_tokens":2}}"#,
        ),
    )
    .await;
    assert_eq!(json(&native)[0]["generated_text"], "hi w");
    let (status, _, bad) = call(app(), post("/invocations", r#"{"messages":[],"x":1}"#)).await;
    assert_eq!(status, 400);
    assert!(json(&bad)["error"]["message"].is_string());
}

#[tokio::test]
async fn openapi_document_and_swagger_ui_are_served() {
    let get = |path: &str| {
        axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let (status, _, body) = call(app(), get("/api-doc/openapi.json")).await;
    assert_eq!(status, 200);
    let doc = json(&body);
    for path in [
        "/generate",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/chat_tokenize",
        "/invocations",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    assert!(
        doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["logit_bias"]
            .is_object()
    );
    let (status, _, html) = call(app(), get("/docs/")).await;
    assert_eq!(status, 200);
    assert!(html.contains("swagger"), "{html}");
}

fn failing_app(script: crate::test_support::Script) -> axum::Router {
    app_scripted(
        HttpOptions {
            payload_limit: 1000,
            ..HttpOptions::default()
        },
        true,
        script,
    )
}

#[tokio::test]
async fn shard_failures_are_500_envelopes_or_a_final_error_event() {
    use crate::test_support::Script;
    let ids = crate::test_support::byte_level_tokenizer()
        .encode(" w")
        .unwrap();
    let body = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let failing = || failing_app(Script::FailAfter(ids.clone(), "shard 0 died".into()));
    let (status, _, whole) = call(failing(), post("/v1/chat/completions", body)).await;
    assert_eq!(status, 500);
    let error = &json(&whole)["error"];
    assert_eq!(error["type"], "server_error");
    assert!(error["message"].as_str().unwrap().contains("shard 0 died"));

    let stream = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    let (status, _, streamed) = call(failing(), post("/v1/chat/completions", stream)).await;
    assert_eq!(status, 200);
    let events = events(&streamed);
    let last = json(events.last().unwrap());
    assert_eq!(last["error"]["type"], "server_error", "{streamed}");
    assert!(!events.iter().any(|e| e == "[DONE]"));

    let truncated = failing_app(Script::Truncated(ids.clone()));
    let (status, _, body) = call(truncated, post("/v1/completions", r#"{"prompt":"hi"}"#)).await;
    assert_eq!(status, 500);
    assert_eq!(json(&body)["error"]["code"], "incomplete_generation");
}
