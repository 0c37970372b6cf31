//! Tools for templates that ignore them: definitions, calls and results written into
//! the messages.
use serde_json::json;

use super::*;

fn message(role: &str, content: Option<&str>) -> TemplateMessage {
    TemplateMessage {
        role: role.into(),
        content: content.map(str::to_owned),
        name: None,
        tool_calls: None,
        tool_call_id: None,
    }
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
}

#[test]
fn tools_go_into_the_system_message() {
    let messages = [
        message("system", Some("Be brief.")),
        message("user", Some("Weather?")),
    ];
    let out = inline_tools(&messages, Some(&[weather()]), ToolCallFormat::Hermes);
    assert_eq!(out.len(), 2);
    let system = out[0].content.as_deref().unwrap();
    assert!(system.starts_with("Be brief.\n\n# Tools"), "{system}");
    // Python's `json.dumps` form (key order as serde_json keeps it).
    assert!(
        system.contains(r#""name": "get_weather", "parameters": {"#),
        "{system}"
    );
    assert!(system.contains("<tool_call></tool_call>"), "{system}");
    // Without a system message, one is put first.
    let out = inline_tools(&messages[1..], Some(&[weather()]), ToolCallFormat::Mistral);
    assert_eq!(out[0].role, "system");
    assert!(out[0].content.as_deref().unwrap().contains("[TOOL_CALLS]"));
    assert_eq!(out[1], messages[1]);
}

#[test]
fn calls_and_results_are_written_as_the_model_writes_them() {
    let mut assistant = message("assistant", None);
    assistant.tool_calls = Some(json!([
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    ]));
    let mut first = message("tool", Some("20C"));
    first.tool_call_id = Some("call_1".into());
    let mut second = message("tool", Some("5C"));
    second.tool_call_id = Some("call_2".into());
    let messages = [message("user", Some("q")), assistant, first, second];
    let out = inline_tools(&messages, None, ToolCallFormat::Hermes);
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(
        out[1].content.as_deref(),
        Some("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>")
    );
    assert!(out[1].tool_calls.is_none());
    // Consecutive results merge into one user turn; no marker field leaks.
    assert_eq!(out[2].role, "user");
    assert_eq!(
        out[2].content.as_deref(),
        Some("<tool_response>\n20C\n</tool_response>\n<tool_response>\n5C\n</tool_response>")
    );
    assert_eq!(out[2].tool_call_id, None);
}

#[test]
fn without_tools_or_history_the_messages_are_unchanged() {
    let messages = [message("system", Some("s")), message("user", Some("u"))];
    assert_eq!(
        inline_tools(&messages, None, ToolCallFormat::Hermes),
        messages
    );
    assert_eq!(
        inline_tools(&messages, Some(&[]), ToolCallFormat::Hermes),
        messages
    );
}

#[test]
fn arguments_strings_become_objects_only_when_they_are_objects() {
    assert_eq!(arguments_value(&json!("{\"a\": [1]}")), json!({"a": [1]}));
    assert_eq!(arguments_value(&json!("not json")), json!("not json"));
    assert_eq!(arguments_value(&json!("[1]")), json!("[1]"));
    assert_eq!(arguments_value(&json!({"b": 2})), json!({"b": 2}));
    assert_eq!(
        render_call(
            "f",
            &json!("{\"x\": \"日\\\"\"}"),
            ToolCallFormat::MistralV11
        ),
        "[TOOL_CALLS]f[ARGS]{\"x\": \"日\\\"\"}"
    );
    assert_eq!(
        render_call("f", &json!({}), ToolCallFormat::Llama3Json),
        "{\"name\": \"f\", \"parameters\": {}}"
    );
}
