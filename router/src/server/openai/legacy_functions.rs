//! OpenAI's deprecated function-calling fields, which older SDKs and agent frameworks still
//! send: `functions` and `function_call` in the request, assistant messages with
//! `function_call` and `function`-role results in the history, and `message.function_call`
//! with `finish_reason: "function_call"` in the answer.
//!
//! A request in this form is rewritten once into the `tools` form (one tool per function,
//! at most one call, as the legacy API answers), so templates, grammars and parsers are the
//! same code; only the answer's shape is translated back.
use serde_json::{json, Value};

use super::errors::OpenAiError;
use super::types::{AssistantMessage, ChatCompletionRequest, ChatDelta, FunctionCallDelta};

/// The id given to the call of a legacy assistant message `i` (the legacy form has none):
/// the `function` message after it answers it.
fn call_id(message: usize) -> String {
    format!("call_function_{message}")
}

/// Rewrites a request that uses `functions`/`function_call` into the tools form; returns
/// whether it did (its answer is then written in the legacy shape).
pub fn into_tools(request: &mut ChatCompletionRequest) -> Result<bool, OpenAiError> {
    let functions = request.functions.take().filter(|v| !v.is_null());
    let choice = request.function_call.take().filter(|v| !v.is_null());
    let history_uses_functions = request
        .messages
        .iter()
        .any(|m| m.role == "function" || m.function_call.as_ref().is_some_and(|v| !v.is_null()));
    if functions.is_none() {
        if choice.is_some() {
            return Err(OpenAiError::invalid(
                "function_call",
                "`function_call` needs `functions`",
            ));
        }
        if history_uses_functions {
            rewrite_history(request)?;
        }
        return Ok(false);
    }
    if request.tools.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(OpenAiError::invalid(
            "functions",
            "`functions` (deprecated) and `tools` cannot be combined: send the functions as tools",
        ));
    }
    let Some(Value::Array(functions)) = functions else {
        return Err(OpenAiError::invalid(
            "functions",
            "`functions` must be an array of function definitions",
        ));
    };
    request.tools = Some(Value::Array(
        functions
            .into_iter()
            .map(|f| json!({"type": "function", "function": f}))
            .collect(),
    ));
    request.tool_choice = match choice {
        None => None,
        Some(Value::String(mode)) if mode == "none" || mode == "auto" => Some(Value::String(mode)),
        Some(named @ Value::Object(_)) => Some(json!({"type": "function", "function": named})),
        Some(_) => {
            return Err(OpenAiError::invalid(
                "function_call",
                "`function_call` must be \"none\", \"auto\" or {\"name\": ...}",
            ))
        }
    };
    request.parallel_tool_calls = Some(false);
    rewrite_history(request)?;
    Ok(true)
}

/// Assistant `function_call`s become one-call `tool_calls`, and each `function` message the
/// `tool` answer to the call before it.
fn rewrite_history(request: &mut ChatCompletionRequest) -> Result<(), OpenAiError> {
    let mut last_call: Option<String> = None;
    for (i, message) in request.messages.iter_mut().enumerate() {
        let param = format!("messages[{i}]");
        if let Some(call) = message.function_call.take().filter(|v| !v.is_null()) {
            if message.role != "assistant" {
                return Err(OpenAiError::invalid(
                    &format!("{param}.function_call"),
                    "only assistant messages carry `function_call`",
                ));
            }
            if message.tool_calls.as_ref().is_some_and(|v| !v.is_null()) {
                return Err(OpenAiError::invalid(
                    &format!("{param}.function_call"),
                    "a message carries `function_call` or `tool_calls`, not both",
                ));
            }
            let id = call_id(i);
            message.tool_calls = Some(json!([{"id": id, "type": "function", "function": call}]));
            last_call = Some(id);
        } else if message.role == "function" {
            if message.name.is_none() {
                return Err(OpenAiError::invalid(
                    &format!("{param}.name"),
                    "a `function` message needs the `name` of the function it answers",
                ));
            }
            message.role = "tool".to_owned();
            message.tool_call_id = last_call.clone();
        }
    }
    Ok(())
}

/// A non-streamed answer in the legacy shape: its (at most one) call as `function_call`.
pub fn legacy_message(
    mut message: AssistantMessage,
    finish: &'static str,
) -> (AssistantMessage, &'static str) {
    let call = message
        .tool_calls
        .take()
        .and_then(|calls| calls.into_iter().next());
    match call {
        Some(call) => {
            message.function_call = Some(call.function);
            (message, "function_call")
        }
        None => (message, finish),
    }
}

/// A streamed delta in the legacy shape: a call's pieces as `function_call` (name first,
/// then the arguments' text), never `tool_calls`.
pub fn legacy_delta(mut delta: ChatDelta) -> ChatDelta {
    if let Some(piece) = delta
        .tool_calls
        .take()
        .and_then(|calls| calls.into_iter().next())
    {
        delta.function_call = Some(FunctionCallDelta {
            name: piece.function.name,
            arguments: piece.function.arguments,
        });
    }
    delta
}

/// The legacy finish reason of a streamed choice.
pub fn legacy_finish(finish: Option<&'static str>) -> Option<&'static str> {
    finish.map(|reason| match reason {
        "tool_calls" => "function_call",
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::openai::types::{FunctionCallOut, ToolCallDelta, ToolCallOut};

    fn request(body: Value) -> ChatCompletionRequest {
        serde_json::from_value(body).unwrap()
    }

    const WEATHER: &str = r#"{"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}"#;

    #[test]
    fn functions_become_one_call_tools_and_function_call_the_tool_choice() {
        let weather: Value = serde_json::from_str(WEATHER).unwrap();
        let cases = [
            (json!(null), None),
            (json!("auto"), Some(json!("auto"))),
            (json!("none"), Some(json!("none"))),
            (
                json!({"name": "weather"}),
                Some(json!({"type": "function", "function": {"name": "weather"}})),
            ),
        ];
        for (choice, expected) in cases {
            let mut r = request(json!({
                "messages": [{"role": "user", "content": "hi"}],
                "functions": [weather.clone()],
                "function_call": choice,
            }));
            assert!(into_tools(&mut r).unwrap());
            assert_eq!(
                r.tools,
                Some(json!([{"type": "function", "function": weather.clone()}]))
            );
            assert_eq!(r.tool_choice, expected);
            assert_eq!(r.parallel_tool_calls, Some(false));
            assert!(r.functions.is_none() && r.function_call.is_none());
        }
    }

    #[test]
    fn a_request_without_functions_is_left_alone() {
        let mut r = request(json!({"messages": [{"role": "user", "content": "hi"}]}));
        let before = r.clone();
        assert!(!into_tools(&mut r).unwrap());
        assert_eq!(r, before);
    }

    #[test]
    fn the_history_is_rewritten_into_tool_calls_and_tool_answers() {
        let mut r = request(json!({
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": null,
                 "function_call": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"role": "function", "name": "weather", "content": "sunny"},
            ],
            "functions": [serde_json::from_str::<Value>(WEATHER).unwrap()],
        }));
        assert!(into_tools(&mut r).unwrap());
        let call = &r.messages[1];
        assert_eq!(
            call.tool_calls,
            Some(json!([{"id": "call_function_1", "type": "function",
                         "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]))
        );
        assert!(call.function_call.is_none());
        let answer = &r.messages[2];
        assert_eq!(answer.role, "tool");
        assert_eq!(answer.tool_call_id.as_deref(), Some("call_function_1"));
        assert_eq!(answer.name.as_deref(), Some("weather"));
    }

    #[test]
    fn malformed_legacy_fields_are_refused_naming_the_field() {
        let weather: Value = serde_json::from_str(WEATHER).unwrap();
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "hi"}], "function_call": "auto"}),
                "function_call",
            ),
            (
                json!({"messages": [{"role": "user", "content": "hi"}], "functions": {"name": "x"}}),
                "functions",
            ),
            (
                json!({"messages": [{"role": "user", "content": "hi"}], "functions": [weather],
                       "function_call": 3}),
                "function_call",
            ),
            (
                json!({"messages": [{"role": "user", "content": "hi"}], "functions": [weather],
                       "tools": [{"type": "function", "function": weather}]}),
                "functions",
            ),
            (
                json!({"messages": [{"role": "function", "content": "sunny"}], "functions": [weather]}),
                "messages[0].name",
            ),
            (
                json!({"messages": [{"role": "user", "content": "hi",
                                     "function_call": {"name": "weather", "arguments": "{}"}}],
                       "functions": [weather]}),
                "messages[0].function_call",
            ),
        ];
        for (body, param) in cases {
            let err = into_tools(&mut request(body.clone())).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn answers_are_translated_back_into_the_legacy_shape() {
        let call = ToolCallOut {
            id: "call_1".into(),
            kind: "function",
            function: FunctionCallOut {
                name: "weather".into(),
                arguments: "{\"city\": \"Paris\"}".into(),
            },
        };
        let message = AssistantMessage {
            role: "assistant",
            content: None,
            refusal: None,
            tool_calls: Some(vec![call.clone()]),
            function_call: None,
        };
        let (legacy, finish) = legacy_message(message, "tool_calls");
        assert_eq!(finish, "function_call");
        assert!(legacy.tool_calls.is_none());
        assert_eq!(legacy.function_call, Some(call.function));
        let text = AssistantMessage {
            role: "assistant",
            content: Some("hello".into()),
            refusal: None,
            tool_calls: None,
            function_call: None,
        };
        assert_eq!(legacy_message(text.clone(), "stop"), (text, "stop"));

        let piece = ChatDelta {
            role: Some("assistant"),
            content: None,
            tool_calls: Some(vec![ToolCallDelta {
                index: 0,
                id: Some("call_1".into()),
                kind: Some("function"),
                function: FunctionCallDelta {
                    name: Some("weather".into()),
                    arguments: String::new(),
                },
            }]),
            function_call: None,
        };
        let legacy = legacy_delta(piece);
        assert!(legacy.tool_calls.is_none());
        assert_eq!(
            legacy.function_call.map(|f| f.name),
            Some(Some("weather".to_owned()))
        );
        assert_eq!(legacy_finish(Some("tool_calls")), Some("function_call"));
        assert_eq!(legacy_finish(Some("length")), Some("length"));
        assert_eq!(legacy_finish(None), None);
    }
}
