//! A finished answer split into its content and its tool calls (the non-streamed
//! `message`). It is the streaming parser fed the whole text at once, so a streamed
//! answer's deltas always add up to exactly this.
use serde::Serialize;

use super::format::ToolSyntax;
use super::ids::IdGenerator;
use super::stream::{ToolCallStream, ToolStreamEvent};

/// One call of `message.tool_calls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON string, as the model wrote them less the whitespace
    /// between JSON tokens. Under the tool grammar it is always a JSON object that
    /// matches the tool's schema.
    pub arguments: String,
}

impl ToolCall {
    /// Whether `arguments` is a JSON object (false only for unconstrained or cut-off
    /// output).
    pub fn arguments_are_an_object(&self) -> bool {
        matches!(
            serde_json::from_str::<serde_json::Value>(&self.arguments),
            Ok(serde_json::Value::Object(_))
        )
    }

    /// OpenAI's wire shape: `{"id", "type": "function", "function": {"name", "arguments"}}`.
    pub fn to_openai(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// An answer's content (None when empty, as OpenAI's is next to calls) and calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

impl ParsedOutput {
    /// OpenAI's `finish_reason` for an answer that stopped for `reason` (`stop`,
    /// `length`, ...): `tool_calls` when it made calls and was not cut off.
    pub fn finish_reason<'a>(&self, reason: &'a str) -> &'a str {
        if !self.tool_calls.is_empty() && reason == "stop" {
            "tool_calls"
        } else {
            reason
        }
    }
}

/// Splits a finished generated text into content and calls.
pub fn parse_tool_calls(syntax: &ToolSyntax, text: &str, ids: IdGenerator) -> ParsedOutput {
    let mut stream = ToolCallStream::new(syntax, ids);
    let mut events = stream.push(text);
    events.extend(stream.finish());
    collect(events)
}

/// Folds streamed pieces into the answer they make up.
pub fn collect(events: impl IntoIterator<Item = ToolStreamEvent>) -> ParsedOutput {
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for event in events {
        match event {
            ToolStreamEvent::Content(text) => content.push_str(&text),
            ToolStreamEvent::CallStart { index, id, name } => {
                debug_assert_eq!(index, calls.len());
                calls.push(ToolCall {
                    id,
                    name,
                    arguments: String::new(),
                });
            }
            ToolStreamEvent::Arguments { index, delta } => {
                if let Some(call) = calls.get_mut(index) {
                    call.arguments.push_str(&delta);
                }
            }
        }
    }
    ParsedOutput {
        content: (!content.is_empty()).then_some(content),
        tool_calls: calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collect_folds_pieces_and_maps_the_finish_reason() {
        let parsed = collect([
            ToolStreamEvent::Content("a".into()),
            ToolStreamEvent::Content("b".into()),
            ToolStreamEvent::CallStart {
                index: 0,
                id: "call_x".into(),
                name: "f".into(),
            },
            ToolStreamEvent::Arguments {
                index: 0,
                delta: "{\"k\":".into(),
            },
            ToolStreamEvent::Arguments {
                index: 0,
                delta: "\"\\u00e9\"}".into(),
            },
            // A piece for a call never announced is dropped, not a panic.
            ToolStreamEvent::Arguments {
                index: 5,
                delta: "x".into(),
            },
        ]);
        assert_eq!(parsed.content.as_deref(), Some("ab"));
        assert_eq!(parsed.tool_calls[0].arguments, "{\"k\":\"\\u00e9\"}");
        assert!(parsed.tool_calls[0].arguments_are_an_object());
        assert_eq!(
            parsed.tool_calls[0].to_openai(),
            serde_json::json!({"id": "call_x", "type": "function",
                "function": {"name": "f", "arguments": "{\"k\":\"\\u00e9\"}"}})
        );
        assert_eq!(parsed.finish_reason("stop"), "tool_calls");
        assert_eq!(parsed.finish_reason("length"), "length");
        assert_eq!(collect([]).finish_reason("stop"), "stop");
        assert_eq!(collect([]).content, None);
    }
}
