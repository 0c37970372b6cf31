//! The prompt of a chat request: messages → the model's chat template, with vLLM's
//! `add_generation_prompt` and `continue_final_message`.
use serde_json::Value;

use super::super::errors::OpenAiError;
use super::super::types::{ChatCompletionRequest, ChatMessage, MessageContent};
use crate::chat_template::{ChatTemplate, ChatTemplateError, TemplateMessage};

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
    Ok(TemplateMessage {
        role: role.to_owned(),
        content,
        name: message.name.clone(),
        tool_calls: message.tool_calls.clone(),
        tool_call_id: message.tool_call_id.clone(),
    })
}

/// Renders the conversation with the model's chat template, opening the assistant turn
/// (what `/chat_tokenize` shows).
pub fn render_chat(
    template: Result<&ChatTemplate, &ChatTemplateError>,
    messages: &[ChatMessage],
) -> Result<String, OpenAiError> {
    render(template, messages, Ending::GenerationPrompt)
}

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
) -> Result<String, OpenAiError> {
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
    let rendered = template
        .render(&messages, ending == Ending::GenerationPrompt)
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
    match rendered.rfind(needle).filter(|_| !needle.is_empty()) {
        Some(at) => Ok(rendered[..at + needle.len()].to_owned()),
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
) -> Result<String, OpenAiError> {
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
    render(template, &request.messages, ending)
}
