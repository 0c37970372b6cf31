//! Tools for models whose chat template ignores them (its source never mentions
//! `tools`; SmolLM2's is one). The template would render the conversation without the
//! tool definitions and fail on or drop calls and results, so textgen writes them into
//! the messages itself, in the model's call format (Hermes for SmolLM2):
//!
//! - the tool definitions and the call instructions go into the system message (appended
//!   to the client's, or as a new first system message, which replaces a template's
//!   default system prompt);
//! - an assistant message's `tool_calls` become call blocks appended to its content;
//! - `tool` messages become a `user` message of `<tool_response>` blocks (consecutive ones
//!   merged), as Qwen 2.5's template writes them.
//!
//! Templates that mention `tools` get the tools and messages as they are.
use serde_json::Value;

use super::format::ToolCallFormat;
use super::py_json::dumps;
use crate::chat_template::TemplateMessage;

/// The system-prompt section that describes `tools` and how to call them.
pub fn tools_system_prompt(tools: &[Value], format: ToolCallFormat) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        out.push('\n');
        out.push_str(&dumps(tool, None, false));
    }
    out.push_str("\n</tools>\n\n");
    out.push_str(match format {
        ToolCallFormat::Hermes => {
            "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
        }
        ToolCallFormat::Llama3Json => {
            "To call a function, respond only with a JSON object in the format {\"name\": <function-name>, \"parameters\": <args-json-object>}; separate several calls with \"; \"."
        }
        ToolCallFormat::Mistral => {
            "To call functions, respond with [TOOL_CALLS] followed by a JSON list: [TOOL_CALLS][{\"name\": <function-name>, \"arguments\": <args-json-object>}]"
        }
        ToolCallFormat::MistralV11 => {
            "To call a function, respond with [TOOL_CALLS]<function-name>[ARGS]<args-json-object>, once per call."
        }
    });
    out
}

/// A call's `function.arguments` as a mapping when it is a JSON string of an object
/// (OpenAI sends a string; templates index or `tojson` it as a mapping), else as given.
pub fn arguments_value(arguments: &Value) -> Value {
    match arguments {
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(parsed @ Value::Object(_)) => parsed,
            _ => arguments.clone(),
        },
        other => other.clone(),
    }
}

/// One call written in the format, as the model would have written it.
pub fn render_call(name: &str, arguments: &Value, format: ToolCallFormat) -> String {
    let args = match arguments_value(arguments) {
        Value::String(raw) => raw,
        value => dumps(&value, None, false),
    };
    let name_json = serde_json::to_string(name).expect("a name serializes");
    match format {
        ToolCallFormat::Hermes => {
            format!("<tool_call>\n{{\"name\": {name_json}, \"arguments\": {args}}}\n</tool_call>")
        }
        ToolCallFormat::Llama3Json => format!("{{\"name\": {name_json}, \"parameters\": {args}}}"),
        ToolCallFormat::Mistral => {
            format!("[TOOL_CALLS][{{\"name\": {name_json}, \"arguments\": {args}}}]")
        }
        ToolCallFormat::MistralV11 => format!("[TOOL_CALLS]{name}[ARGS]{args}"),
    }
}

fn calls_text(tool_calls: &Value, format: ToolCallFormat) -> Vec<String> {
    let Value::Array(calls) = tool_calls else {
        return Vec::new();
    };
    calls
        .iter()
        .filter_map(|call| {
            let function = call.get("function").unwrap_or(call);
            let name = function.get("name")?.as_str()?;
            let args = function
                .get("arguments")
                .cloned()
                .unwrap_or_else(|| Value::Object(Default::default()));
            Some(render_call(name, &args, format))
        })
        .collect()
}

/// The messages with tools, calls and results written in, for a template that ignores
/// `tools`. With no tools and no calls or results in the history, they are unchanged.
pub fn inline_tools(
    messages: &[TemplateMessage],
    tools: Option<&[Value]>,
    format: ToolCallFormat,
) -> Vec<TemplateMessage> {
    let mut out: Vec<TemplateMessage> = Vec::with_capacity(messages.len() + 1);
    for message in messages {
        if message.role == "tool" {
            let block = format!(
                "<tool_response>\n{}\n</tool_response>",
                message.content.as_deref().unwrap_or("")
            );
            match out.last_mut() {
                Some(prev) if prev.role == "user" && prev.tool_call_id.is_some() => {
                    let content = prev.content.get_or_insert_with(String::new);
                    content.push('\n');
                    content.push_str(&block);
                }
                _ => out.push(TemplateMessage {
                    role: "user".into(),
                    content: Some(block),
                    name: None,
                    tool_calls: None,
                    // Marks a merged results message (never rendered by such templates).
                    tool_call_id: message.tool_call_id.clone().or(Some(String::new())),
                }),
            }
            continue;
        }
        let mut message = message.clone();
        if let Some(tool_calls) = message.tool_calls.take() {
            let calls = calls_text(&tool_calls, format);
            let mut content = message.content.take().unwrap_or_default();
            for call in calls {
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&call);
            }
            message.content = Some(content);
        }
        out.push(message);
    }
    for message in &mut out {
        if message.role == "user" {
            message.tool_call_id = None;
        }
    }
    if let Some(tools) = tools.filter(|t| !t.is_empty()) {
        let section = tools_system_prompt(tools, format);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                let content = first.content.get_or_insert_with(String::new);
                if !content.is_empty() {
                    content.push_str("\n\n");
                }
                content.push_str(&section);
            }
            _ => out.insert(
                0,
                TemplateMessage {
                    role: "system".into(),
                    content: Some(section),
                    name: None,
                    tool_calls: None,
                    tool_call_id: None,
                },
            ),
        }
    }
    out
}

#[cfg(test)]
#[path = "prompt_tests.rs"]
mod tests;
