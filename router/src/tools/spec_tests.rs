use serde_json::json;

use super::*;

fn weather() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})
}

fn err(tools: Value, choice: Option<Value>) -> ToolError {
    parse_tool_request(Some(&tools), choice.as_ref(), None).unwrap_err()
}

#[test]
fn parses_tools_and_defaults() {
    let tools = json!([weather(), {"type": "function", "function": {"name": "noargs"}}]);
    let req = parse_tool_request(Some(&tools), None, None).unwrap();
    assert_eq!(req.choice, ToolChoice::Auto);
    assert!(req.parallel);
    assert_eq!(req.tools[0].name, "get_weather");
    assert_eq!(
        req.tools[0].description.as_deref(),
        Some("Weather in a city")
    );
    // No parameters: an object schema; the raw tool is kept as given.
    assert_eq!(req.tools[1].parameters, json!({"type": "object"}));
    assert_eq!(
        req.template_tools()[1],
        json!({"type": "function", "function": {"name": "noargs"}})
    );
    assert!(req.calls_enabled());

    let none = parse_tool_request(None, None, None).unwrap();
    assert_eq!(none.choice, ToolChoice::None);
    assert!(!none.calls_enabled());
    let null =
        parse_tool_request(Some(&Value::Null), Some(&Value::Null), Some(&Value::Null)).unwrap();
    assert!(null.tools.is_empty());
}

#[test]
fn parses_every_tool_choice() {
    let tools = json!([weather()]);
    for (choice, want) in [
        (json!("none"), ToolChoice::None),
        (json!("auto"), ToolChoice::Auto),
        (json!("required"), ToolChoice::Required),
        (
            json!({"type": "function", "function": {"name": "get_weather"}}),
            ToolChoice::Function("get_weather".into()),
        ),
        // TGI's form: a bare function name.
        (
            json!("get_weather"),
            ToolChoice::Function("get_weather".into()),
        ),
    ] {
        let req = parse_tool_request(Some(&tools), Some(&choice), Some(&json!(false))).unwrap();
        assert_eq!(req.choice, want);
        assert!(!req.parallel);
    }
    let req = parse_tool_request(
        Some(&json!([weather(), {"type": "function", "function": {"name": "b"}}])),
        Some(&json!({"type": "function", "function": {"name": "b"}})),
        None,
    )
    .unwrap();
    assert_eq!(req.callable().len(), 1);
    assert_eq!(req.callable()[0].name, "b");
}

#[test]
fn names_the_field_of_each_malformed_tool() {
    let cases = [
        (json!({"a": 1}), "tools"),
        (json!([1]), "tools[0]"),
        (json!([{"type": "code_interpreter"}]), "tools[0].type"),
        (json!([{"function": {"name": "f"}}]), "tools[0].type"),
        (json!([{"type": "function"}]), "tools[0].function"),
        (
            json!([{"type": "function", "function": "f"}]),
            "tools[0].function",
        ),
        (
            json!([weather(), {"type": "function", "function": {}}]),
            "tools[1].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": ""}}]),
            "tools[0].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": 7}}]),
            "tools[0].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": "a b"}}]),
            "tools[0].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": "x\"}<tool_call>"}}]),
            "tools[0].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": "fü"}}]),
            "tools[0].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": "a".repeat(65)}}]),
            "tools[0].function.name",
        ),
        (
            json!([weather(), weather(), weather()]),
            "tools[1].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters": "{}"}}]),
            "tools[0].function.parameters",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters": []}}]),
            "tools[0].function.parameters",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
            "tools[0].function.parameters.type",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "description": 3}}]),
            "tools[0].function.description",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "strict": "yes"}}]),
            "tools[0].function.strict",
        ),
    ];
    for (tools, param) in cases {
        let e = err(tools.clone(), None);
        assert_eq!(e.param(), param, "{tools}: {e}");
        assert!(e.to_string().starts_with(param));
    }
    // 64 characters is fine.
    let ok = json!([{"type": "function", "function": {"name": "a".repeat(64)}}]);
    assert!(parse_tool_request(Some(&ok), None, None).is_ok());
}

#[test]
fn rejects_bad_tool_choices() {
    let tools = json!([weather()]);
    let cases = [
        // A bare name must name a tool, and be a valid name.
        (json!("sometimes"), "tool_choice.function.name"),
        (json!("no way"), "tool_choice"),
        (json!(""), "tool_choice"),
        (json!(1), "tool_choice"),
        (json!({"type": "function"}), "tool_choice.function"),
        (
            json!({"function": {"name": "get_weather"}}),
            "tool_choice.type",
        ),
        (
            json!({"type": "function", "function": {"name": "other"}}),
            "tool_choice.function.name",
        ),
        (
            json!({"type": "function", "function": {"name": "no way"}}),
            "tool_choice.function.name",
        ),
    ];
    for (choice, param) in cases {
        assert_eq!(err(tools.clone(), Some(choice)).param(), param);
    }
    // `required`, `auto` and a named function need tools.
    for choice in [
        json!("required"),
        json!("auto"),
        json!({"type": "function", "function": {"name": "f"}}),
    ] {
        let e = parse_tool_request(None, Some(&choice), None).unwrap_err();
        assert!(e.param().starts_with("tool_choice"), "{e}");
    }
    // `none` without tools is fine.
    assert!(parse_tool_request(None, Some(&json!("none")), None).is_ok());
    let e = parse_tool_request(Some(&tools), None, Some(&json!("no"))).unwrap_err();
    assert_eq!(e.param(), "parallel_tool_calls");
}

#[test]
fn caps_count_and_size_but_allows_long_descriptions() {
    let many: Vec<Value> = (0..=MAX_TOOLS)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    assert_eq!(err(Value::Array(many.clone()), None).param(), "tools");
    assert!(parse_tools(&Value::Array(many[..MAX_TOOLS].to_vec())).is_ok());

    let long = json!([{"type": "function", "function": {"name": "f", "description": "d".repeat(100_000)}}]);
    assert!(parse_tools(&long).is_ok());
    let huge = json!([{"type": "function", "function": {"name": "f", "description": "d".repeat(MAX_TOOLS_BYTES)}}]);
    let e = parse_tools(&huge).unwrap_err();
    assert_eq!(e.param(), "tools");
    assert!(e.message().contains("bytes"));
}

#[test]
fn error_messages_truncate_hostile_strings() {
    let e = err(json!([{"type": "x".repeat(10_000)}]), None);
    assert!(e.to_string().len() < 200, "{e}");
}
