//! Tool calling through `/v1/chat/completions` (grammars compiled by llguidance), the fake
//! scheduler "saying" a scripted
//! answer: calls parsed into `message.tool_calls`, the streamed deltas adding up to the
//! non-streamed message, and bad tool definitions refused by name.
use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::server::tests::{app_templated, call, json as parse, post};
use crate::server::HttpOptions;
use crate::test_support::{byte_level_tokenizer, Script};

/// Reads `tools` (so no inline fallback) and keeps the prompt within the test limits.
const TEMPLATE: &str = "{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}{{ m.content }}{% endfor %}{% if tools %}[{{ tools | length }}]{% endif %}";

const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"Île\\\"\"}}\n</tool_call>";

fn says(text: &str) -> Script {
    let tokenizer = byte_level_tokenizer();
    let mut ids = tokenizer.encode(text).unwrap();
    ids.push(tokenizer.token_to_id("<eos>").unwrap());
    Script::Tokens(ids)
}

async fn send(text: &str, body: Value) -> (StatusCode, String) {
    let app = app_templated(
        HttpOptions {
            payload_limit: 1 << 20,
            ..HttpOptions::default()
        },
        true,
        says(text),
        TEMPLATE,
    );
    let (status, _, body) = call(app, post("/v1/chat/completions", &body.to_string())).await;
    (status, body)
}

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}}])
}

fn request(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "w?"}], "tools": weather()});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The streamed chunks folded into a message: content, calls and the finish reason.
fn fold_stream(body: &str) -> (Option<String>, Vec<Value>, String) {
    let mut content: Option<String> = None;
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = String::new();
    for data in body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let chunk = parse(data);
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        if let Some(text) = choice["delta"]["content"].as_str() {
            if !text.is_empty() {
                content.get_or_insert_with(String::new).push_str(text);
            }
        }
        for piece in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = piece["index"].as_u64().unwrap() as usize;
            if let Some(id) = piece["id"].as_str() {
                assert_eq!(index, calls.len(), "calls start in order: {piece}");
                assert_eq!(piece["type"], "function");
                assert_eq!(
                    piece["function"]["arguments"], "",
                    "the first piece: {piece}"
                );
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": piece["function"]["name"], "arguments": ""}}));
            }
            let args = calls[index]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_owned()
                + piece["function"]["arguments"].as_str().unwrap();
            calls[index]["function"]["arguments"] = json!(args);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_owned();
        }
    }
    (content, calls, finish)
}

#[tokio::test]
async fn auto_parses_a_call_into_tool_calls() {
    let (status, body) = send(&format!("Checking.\n{CALL}"), request(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    let body = parse(&body);
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Checking.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris \"Île\""}));
}

#[tokio::test]
async fn required_with_only_a_call_has_null_content_and_each_choice_its_own_ids() {
    let (status, body) = send(CALL, request(json!({"tool_choice": "required", "n": 2}))).await;
    assert_eq!(status, 200, "{body}");
    let body = parse(&body);
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for choice in choices {
        assert!(choice["message"]["content"].is_null(), "{choice}");
        assert_eq!(choice["finish_reason"], "tool_calls");
    }
    assert_ne!(
        choices[0]["message"]["tool_calls"][0]["id"],
        choices[1]["message"]["tool_calls"][0]["id"]
    );
}

#[tokio::test]
async fn streamed_deltas_add_up_to_the_message() {
    for (answer, choice) in [
        (format!("Checking.\n{CALL}"), json!("auto")),
        (
            CALL.to_owned(),
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ),
        ("No call needed.".to_owned(), json!("auto")),
    ] {
        let (status, whole) = send(&answer, request(json!({"tool_choice": choice}))).await;
        assert_eq!(status, 200, "{whole}");
        let whole = parse(&whole);
        let message = &whole["choices"][0]["message"];
        let (status, streamed) = send(
            &answer,
            request(json!({"tool_choice": choice, "stream": true})),
        )
        .await;
        assert_eq!(status, 200, "{streamed}");
        let (content, calls, finish) = fold_stream(&streamed);
        assert_eq!(
            content.as_deref(),
            message["content"].as_str(),
            "{streamed}"
        );
        assert_eq!(finish, whole["choices"][0]["finish_reason"]);
        let expected = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(calls.len(), expected.len(), "{streamed}");
        for (got, want) in calls.iter().zip(&expected) {
            // Ids are random per answer; everything else is equal.
            assert_eq!(got["function"], want["function"]);
            assert_eq!(
                got["id"].as_str().unwrap().len(),
                want["id"].as_str().unwrap().len()
            );
        }
    }
}

#[tokio::test]
async fn tool_choice_none_leaves_the_answer_as_text() {
    let (status, body) = send(CALL, request(json!({"tool_choice": "none"}))).await;
    assert_eq!(status, 200, "{body}");
    let body = parse(&body);
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["content"], CALL);
    assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
    assert_eq!(choice["finish_reason"], "stop");
}

#[tokio::test]
async fn history_with_calls_and_results_renders() {
    let body = json!({"tool_choice": "none", "tools": weather(), "messages": [
        {"role": "user", "content": "w?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5C"}]});
    let (status, text) = send("ok", body).await;
    assert_eq!(status, 200, "{text}");
    // The template indexed the arguments as a mapping (`Oslo`); usage counts the prompt
    // `w?` + `OsloNone` + `5C` + `[1]`.
    let body = parse(&text);
    assert_eq!(body["usage"]["prompt_tokens"], "w?OsloNone5C[1]".len());
}

#[tokio::test]
async fn bad_tool_fields_are_400_naming_the_field() {
    let bad_name = json!([{"type": "function", "function": {"name": "get weather"}}]);
    let duplicate = json!([{"type": "function", "function": {"name": "f"}},
        {"type": "function", "function": {"name": "f"}}]);
    let array_params = json!([{"type": "function", "function": {"name": "f", "parameters": []}}]);
    let string_params = json!([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "string"}}}]);
    let long_name = json!([{"type": "function", "function": {"name": "n".repeat(65)}}]);
    let cases = [
        (json!({"tools": bad_name}), "tools[0].function.name"),
        (json!({"tools": duplicate}), "tools[1].function.name"),
        (
            json!({"tools": array_params}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": string_params}),
            "tools[0].function.parameters.type",
        ),
        (json!({"tools": long_name}), "tools[0].function.name"),
        (json!({"tools": "x"}), "tools"),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "other"}}}),
            "tool_choice.function.name",
        ),
        // TGI's bare-name form: the name must be a tool's.
        (
            json!({"tool_choice": "sometimes"}),
            "tool_choice.function.name",
        ),
        (json!({"tool_choice": "not a name"}), "tool_choice"),
        (
            json!({"tools": null, "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}}}),
            "tool_choice.function.name",
        ),
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": "x"}]}),
            "messages[0].tool_calls",
        ),
        (
            json!({"messages": [{"role": "user", "content": "q", "tool_calls": []}]}),
            "messages[0].tool_calls",
        ),
    ];
    for (extra, param) in cases {
        let (status, body) = send("x", request(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {body}");
        let body = parse(&body);
        assert_eq!(body["error"]["param"], param, "{extra}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    // Both constraints named in one message.
    let (_, body) = send(
        "x",
        request(json!({"response_format": {"type": "json_object"}})),
    )
    .await;
    let message = parse(&body)["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("response_format") && message.contains("tools"),
        "{message}"
    );
    // `parallel_tool_calls` must be a boolean (the body's type check).
    let (status, _) = send("x", request(json!({"parallel_tool_calls": "yes"}))).await;
    assert_eq!(status, 400);
    // The server still serves.
    let (status, _) = send("x", request(json!({"tool_choice": "none"}))).await;
    assert_eq!(status, 200);
}

/// The deprecated `functions` form of `weather()`.
fn legacy(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "w?"}],
        "functions": [weather()[0]["function"].clone()]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test]
async fn legacy_functions_answer_with_function_call_streamed_and_not() {
    let (status, body) = send(
        CALL,
        legacy(json!({"function_call": {"name": "get_weather"}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let whole = parse(&body);
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "function_call");
    assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
    let call = &choice["message"]["function_call"];
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris \"Île\""}));

    let (status, body) = send(
        CALL,
        legacy(json!({"function_call": {"name": "get_weather"}, "stream": true})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (mut name, mut arguments, mut finish) = (String::new(), String::new(), String::new());
    for data in body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        let Some(choice) = (data != "[DONE]").then(|| parse(data)["choices"][0].clone()) else {
            continue;
        };
        assert!(choice["delta"]["tool_calls"].is_null(), "{choice}");
        if let Some(piece) = choice["delta"].get("function_call") {
            name.push_str(piece["name"].as_str().unwrap_or(""));
            arguments.push_str(piece["arguments"].as_str().unwrap());
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_owned();
        }
    }
    assert_eq!(
        (name.as_str(), finish.as_str()),
        ("get_weather", "function_call")
    );
    assert_eq!(arguments, call["arguments"].as_str().unwrap());
}

#[tokio::test]
async fn legacy_function_history_is_rendered_as_tool_calls() {
    // The template writes the city of the assistant's call (one byte-level token per
    // byte), so a longer city in the legacy call gives that many more prompt tokens.
    let prompt_tokens = |city: &str| {
        let arguments = json!({"city": city}).to_string();
        legacy(json!({"messages": [
            {"role": "user", "content": "w?"},
            {"role": "assistant", "content": null,
             "function_call": {"name": "get_weather", "arguments": arguments}},
            {"role": "function", "name": "get_weather", "content": "rain"},
        ], "function_call": "none"}))
    };
    let mut counts = Vec::new();
    for city in ["Oslo", "Oslo-Oslo"] {
        let (status, body) = send("It rains.", prompt_tokens(city)).await;
        assert_eq!(status, 200, "{body}");
        let body = parse(&body);
        assert_eq!(body["choices"][0]["message"]["content"], "It rains.");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        counts.push(body["usage"]["prompt_tokens"].as_u64().unwrap());
    }
    assert_eq!(counts[1], counts[0] + 5);
}

#[tokio::test]
async fn legacy_functions_beside_tools_are_a_400_naming_functions() {
    let (status, body) = send(CALL, legacy(json!({"tools": weather()}))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(parse(&body)["error"]["param"], "functions");
}
