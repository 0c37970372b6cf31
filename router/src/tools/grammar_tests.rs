//! The tool grammars compile in llguidance for every format and choice, and say what
//! the choice means.
use serde_json::json;

use super::*;
use crate::tools::format::{ToolCallFormat, ToolSyntax};
use crate::tools::spec::parse_tool_request;

fn request(choice: serde_json::Value, parallel: bool) -> ToolRequest {
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"},
             "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "no_args"}},
        {"type": "function", "function": {"name": "with_defs", "parameters": {"type": "object",
            "$defs": {"p": {"type": "integer"}}, "properties": {"n": {"$ref": "#/$defs/p"}}}}}
    ]);
    parse_tool_request(Some(&tools), Some(&choice), Some(&json!(parallel))).unwrap()
}

fn syntaxes() -> Vec<ToolSyntax> {
    let mut all: Vec<ToolSyntax> = [
        ToolCallFormat::Hermes,
        ToolCallFormat::Llama3Json,
        ToolCallFormat::Mistral,
        ToolCallFormat::MistralV11,
    ]
    .into_iter()
    .map(ToolSyntax::plain)
    .collect();
    // The same formats with their markers as special tokens.
    let ids = |t: &str| match t {
        "<tool_call>" => Some(10),
        "</tool_call>" => Some(11),
        "<|python_tag|>" => Some(12),
        "[TOOL_CALLS]" => Some(13),
        "[ARGS]" => Some(14),
        _ => None,
    };
    for format in [
        ToolCallFormat::Hermes,
        ToolCallFormat::Llama3Json,
        ToolCallFormat::Mistral,
        ToolCallFormat::MistralV11,
    ] {
        all.push(format.syntax(&ids));
    }
    all
}

#[test]
fn every_format_and_choice_compiles() {
    for syntax in syntaxes() {
        for choice in [
            json!("auto"),
            json!("required"),
            json!({"type": "function", "function": {"name": "with_defs"}}),
        ] {
            for parallel in [true, false] {
                let req = request(choice.clone(), parallel);
                let lark = tool_grammar(&req, &syntax)
                    .unwrap_or_else(|err| panic!("{syntax:?} {choice} {parallel}: {err}"))
                    .expect("calls are enabled");
                assert!(lark.contains("%json"), "{lark}");
            }
        }
    }
}

#[test]
fn none_and_no_tools_have_no_grammar() {
    let none = request(json!("none"), true);
    assert_eq!(tool_grammar(&none, &ToolSyntax::default()), Ok(None));
    let empty = parse_tool_request(None, None, None).unwrap();
    assert_eq!(tool_grammar(&empty, &ToolSyntax::default()), Ok(None));
}

#[test]
fn the_grammar_says_what_the_choice_means() {
    let hermes = ToolSyntax::default();
    let named = build(
        &request(
            json!({"type": "function", "function": {"name": "no_args"}}),
            true,
        ),
        &hermes,
    );
    assert!(
        named.contains("no_args") && !named.contains("get_weather"),
        "{named}"
    );
    // A named function is one call, whatever `parallel_tool_calls` says.
    assert!(!named.contains("call)*"), "{named}");
    let required = build(&request(json!("required"), true), &hermes);
    assert!(
        required.contains("start: call (\"\\n\" call)*"),
        "{required}"
    );
    assert!(
        !required.contains("TEXT"),
        "required allows no free text: {required}"
    );
    let single = build(&request(json!("required"), false), &hermes);
    assert!(
        single.contains("start: call \n") || single.contains("start: call\n"),
        "{single}"
    );
    let auto = build(&request(json!("auto"), true), &hermes);
    assert!(
        auto.contains("head[lazy]") && auto.contains("TEXT"),
        "{auto}"
    );
    let mistral = build(
        &request(json!("required"), false),
        &ToolSyntax::plain(ToolCallFormat::Mistral),
    );
    assert!(mistral.contains("body: \"[\" fn \"]\""), "{mistral}");
}

#[test]
fn client_x_guidance_cannot_loosen_whitespace() {
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "x-guidance": {"whitespace_flexible": true}}}}]);
    let req = parse_tool_request(Some(&tools), Some(&json!("required")), None).unwrap();
    let lark = build(&req, &ToolSyntax::default());
    assert!(!lark.contains("\"whitespace_flexible\":true"), "{lark}");
}

#[test]
fn a_schema_the_engine_refuses_names_its_tool() {
    let tools = json!([
        {"type": "function", "function": {"name": "ok"}},
        {"type": "function", "function": {"name": "bad", "parameters":
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}
    ]);
    let req = parse_tool_request(Some(&tools), Some(&json!("auto")), None).unwrap();
    let err = tool_grammar(&req, &ToolSyntax::default()).unwrap_err();
    assert_eq!(err.param(), "tools[1].function.parameters", "{err}");
    // Not callable under this choice: not compiled, not refused.
    let named = parse_tool_request(
        Some(&tools),
        Some(&json!({"type": "function", "function": {"name": "ok"}})),
        None,
    )
    .unwrap();
    assert!(tool_grammar(&named, &ToolSyntax::default()).is_ok());
}

#[test]
fn hostile_names_and_descriptions_stay_literals() {
    // Names are checked (a-z, 0-9, _ and -), descriptions never reach the grammar.
    let tools = json!([{"type": "function", "function": {"name": "f-1_x",
        "description": "\" } %ignore /x/ \n start: \"", "parameters": {"type": "object",
        "properties": {"q\"\\": {"type": "string", "description": "\u{0}\u{7f}日本"}}}}}]);
    let req = parse_tool_request(Some(&tools), Some(&json!("required")), None).unwrap();
    assert!(tool_grammar(&req, &ToolSyntax::default())
        .unwrap()
        .is_some());
}
