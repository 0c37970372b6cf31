//! The prompt of a chat request: messages → the model's chat template, with vLLM's
//! `add_generation_prompt` and `continue_final_message`, and the request's tools: given
//! to a template that reads `tools`, written into the messages for one that does not
//! (`tools::prompt`).
use serde_json::Value;

use crate::tools::prompt::{arguments_value, inline_tools};
use crate::tools::{ToolRequest, ToolSyntax};

use super::super::errors::OpenAiError;
use super::super::types::{ChatCompletionRequest, ChatMessage, MessageContent};
use crate::chat_template::{ChatTemplate, ChatTemplateError, RenderedChat, TemplateMessage};
use crate::validation::Prompt;

/// The template's view of one message; content parts must all be text.
fn template_message(index: usize, message: &ChatMessage) -> Result<TemplateMessage, OpenAiError> {
    let param = format!("messages[{index}]");
    let role = match message.role.as_str() {
        "system" | "developer" => "system",
        "user" | "assistant" | "tool" => message.role.as_str(),
        other => {
            return Err(OpenAiError::invalid(
                &param,
                format!(
                    "unknown role {other:?}: expected system, developer, user, assistant or tool"
                ),
            ))
        }
    };
    let content = match &message.content {
        None => None,
        Some(MessageContent::Text(text)) => Some(text.clone()),
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(piece)) if part.other.values().all(Value::is_null) => {
                        text.push_str(piece)
                    }
                    ("text", _) => {
                        return Err(OpenAiError::invalid(
                            &param,
                            "a text part needs exactly `type` and `text`",
                        ))
                    }
                    (kind, _) => {
                        return Err(OpenAiError::unsupported(
                            &param,
                            &format!("content parts of type {kind:?} (the model reads text only)"),
                        ))
                    }
                }
            }
            Some(text)
        }
    };
    if content.is_none()
        && !(role == "assistant" && message.tool_calls.as_ref().is_some_and(|v| !v.is_null()))
    {
        return Err(OpenAiError::invalid(&param, "`content` is required"));
    }
    let tool_calls = match &message.tool_calls {
        None | Some(Value::Null) => None,
        Some(_) if role != "assistant" => {
            return Err(OpenAiError::invalid(
                &format!("{param}.tool_calls"),
                "only assistant messages carry `tool_calls`",
            ))
        }
        Some(calls) => Some(template_tool_calls(calls, &format!("{param}.tool_calls"))?),
    };
    Ok(TemplateMessage {
        role: role.to_owned(),
        content,
        name: message.name.clone(),
        tool_calls,
        tool_call_id: message.tool_call_id.clone(),
    })
}

/// An assistant message's `tool_calls` as templates read them: OpenAI sends each
/// call's `function.arguments` as a JSON string, HF templates index it (or `tojson` it)
/// as a mapping, so a string holding a JSON object becomes that object.
fn template_tool_calls(calls: &Value, param: &str) -> Result<Value, OpenAiError> {
    let Value::Array(items) = calls else {
        return Err(OpenAiError::invalid(param, "`tool_calls` must be an array"));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, call) in items.iter().enumerate() {
        let at = format!("{param}[{i}]");
        let mut call = call.clone();
        let function = call
            .as_object_mut()
            .and_then(|c| c.get_mut("function"))
            .and_then(Value::as_object_mut)
            .ok_or_else(|| OpenAiError::invalid(&at, "a tool call needs a `function` object"))?;
        if !function.get("name").is_some_and(Value::is_string) {
            return Err(OpenAiError::invalid(
                &format!("{at}.function.name"),
                "a tool call's `function.name` must be a string",
            ));
        }
        match function.get("arguments") {
            None | Some(Value::Null) => {
                function.insert("arguments".into(), Value::Object(Default::default()));
            }
            Some(args @ (Value::String(_) | Value::Object(_))) => {
                let parsed = arguments_value(args);
                function.insert("arguments".into(), parsed);
            }
            Some(_) => {
                return Err(OpenAiError::invalid(
                    &format!("{at}.function.arguments"),
                    "`arguments` must be a JSON string",
                ))
            }
        }
        out.push(call);
    }
    Ok(Value::Array(out))
}

/// Renders the conversation with the model's chat template, opening the assistant turn
/// (what `/chat_tokenize` shows).
pub fn render_chat(
    template: Result<&ChatTemplate, &ChatTemplateError>,
    messages: &[ChatMessage],
) -> Result<String, OpenAiError> {
    render_chat_segments(template, messages).map(|chat| chat.text)
}

/// `render_chat` with where the messages' text lies in the prompt (`/chat_tokenize`).
pub fn render_chat_segments(
    template: Result<&ChatTemplate, &ChatTemplateError>,
    messages: &[ChatMessage],
) -> Result<RenderedChat, OpenAiError> {
    render(template, messages, Ending::GenerationPrompt, &NO_TOOLS)
}

/// The prompt a chat plan tokenizes: its text prompt with the messages' ranges, so their
/// special-token strings are tokenized as text.
pub fn with_message_ranges(prompt: Prompt, chat: &RenderedChat) -> Prompt {
    match prompt {
        Prompt::Text {
            text,
            add_special_tokens,
        } if text == chat.text => Prompt::Chat {
            chat: chat.clone(),
            add_special_tokens,
        },
        other => other,
    }
}

/// The tools part of rendering: the checked tools and the model's call syntax.
struct Tools<'a> {
    tools: Option<&'a ToolRequest>,
    syntax: Option<&'a ToolSyntax>,
}

const NO_TOOLS: Tools<'static> = Tools {
    tools: None,
    syntax: None,
};

/// How the rendered prompt ends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ending {
    /// The assistant turn is opened (`add_generation_prompt`, the default).
    GenerationPrompt,
    /// The messages as they are.
    Closed,
    /// The final message is left open for the model to continue.
    ContinueFinal,
}

fn render(
    template: Result<&ChatTemplate, &ChatTemplateError>,
    messages: &[ChatMessage],
    ending: Ending,
    tools: &Tools,
) -> Result<RenderedChat, OpenAiError> {
    if messages.is_empty() {
        return Err(OpenAiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let template = template.map_err(|err| OpenAiError::invalid("messages", err.to_string()))?;
    let tool_objects = tools.tools.map(ToolRequest::template_tools);
    let generation_prompt = ending == Ending::GenerationPrompt;
    let mut rendered = match tools.syntax {
        Some(syntax) if !template.reads_tools() => {
            let messages = inline_tools(&messages, tool_objects.as_deref(), syntax.format);
            template.render_chat(&messages, None, generation_prompt)
        }
        _ => template.render_chat(&messages, tool_objects.as_deref(), generation_prompt),
    }
    .map_err(|err| OpenAiError::invalid("messages", format!("chat template error: {err}")))?;
    if ending != Ending::ContinueFinal {
        return Ok(rendered);
    }
    // As transformers does: cut the prompt right after the final message's text, dropping
    // the end-of-turn tokens the template writes after it.
    let last = messages
        .last()
        .and_then(|m| m.content.as_deref())
        .unwrap_or("");
    let needle = last.trim();
    match rendered.text.rfind(needle).filter(|_| !needle.is_empty()) {
        Some(at) => {
            rendered.truncate(at + needle.len());
            Ok(rendered)
        }
        None => Err(OpenAiError::invalid(
            "continue_final_message",
            "the final message's text does not appear in the rendered chat",
        )),
    }
}

fn has_entries(value: &Option<Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Object(map)) => !map.is_empty(),
        Some(Value::Array(items)) => !items.is_empty(),
        Some(_) => true,
    }
}

/// The prompt of a chat request, with vLLM's template extensions applied.
pub fn chat_prompt(
    template: Result<&ChatTemplate, &ChatTemplateError>,
    request: &ChatCompletionRequest,
    tools: &ToolRequest,
    syntax: &ToolSyntax,
) -> Result<RenderedChat, OpenAiError> {
    if request.chat_template.is_some() {
        return Err(OpenAiError::unsupported(
            "chat_template",
            "the model's own chat template is always used",
        ));
    }
    // The template renderer takes no extra variables (yet): a template that reads them
    // would render differently from what the client asked for.
    for (name, value) in [
        ("chat_template_kwargs", &request.chat_template_kwargs),
        ("documents", &request.documents),
    ] {
        if has_entries(value) {
            return Err(OpenAiError::unsupported(
                name,
                "the chat template gets no extra variables",
            ));
        }
    }
    let generation_prompt = request.add_generation_prompt.unwrap_or(true);
    let ending = match request.continue_final_message {
        Some(true) if request.add_generation_prompt == Some(true) => {
            return Err(OpenAiError::invalid(
                "continue_final_message",
                "`continue_final_message` and `add_generation_prompt` cannot both be true",
            ))
        }
        Some(true) => Ending::ContinueFinal,
        _ if generation_prompt => Ending::GenerationPrompt,
        _ => Ending::Closed,
    };
    let tools = Tools {
        tools: Some(tools),
        syntax: Some(syntax),
    };
    render(template, &request.messages, ending, &tools)
}
