//! Tool calls in chat answers: a choice's text split into content and
//! `message.tool_calls` (non-streamed), or into OpenAI's `delta.tool_calls` pieces
//! (streamed). Both come from the one `tools::ToolCallStream`, so the streamed pieces
//! always add up to the non-streamed message.
use super::legacy_functions::{legacy_delta, legacy_finish};
use super::types::{
    AssistantMessage, ChatDelta, FunctionCallDelta, FunctionCallOut, ToolCallDelta, ToolCallOut,
};
use crate::infer::SequenceDecoder;
use crate::tools::{
    parse_tool_calls, random_ids, ParsedOutput, ToolCallStream, ToolStreamEvent, ToolSyntax,
};

/// The marker tokens whose text the answer keeps: special tokens are left out of the
/// text, but a call's `[TOOL_CALLS]` or `<|python_tag|>` is what the parser looks for.
pub fn kept_tokens(syntax: &ToolSyntax) -> Vec<(u32, String)> {
    [&syntax.open, &syntax.close, &syntax.args]
        .into_iter()
        .flatten()
        .filter_map(|m| m.token.map(|id| (id, m.text.clone())))
        .collect()
}

/// A choice's final text, with the `kept` special tokens written in. Without kept tokens
/// it is the OpenAI text (`text_without_stop`); with them it is built from the streamed
/// token texts the same way the stream follower builds it, so the two agree.
pub fn answer_text(decoder: &SequenceDecoder, kept: &[(u32, String)]) -> String {
    if kept.is_empty() {
        return decoder.text_without_stop();
    }
    let record = decoder.record();
    let mut text = String::new();
    for (token, piece) in record.tokens.iter().zip(&record.text_pieces) {
        match kept.iter().find(|(id, _)| *id == token.id) {
            Some((_, marker)) => text.push_str(marker),
            None => text.push_str(piece),
        }
    }
    if let Some(stop) = record
        .matched_stop
        .as_ref()
        .filter(|_| !decoder.includes_stop_str())
    {
        if let Some(at) = text.rfind(stop.as_str()) {
            text.truncate(at);
        }
    }
    text
}

fn openai_calls(parsed: &ParsedOutput) -> Vec<ToolCallOut> {
    parsed
        .tool_calls
        .iter()
        .map(|call| ToolCallOut {
            id: call.id.clone(),
            kind: "function",
            function: FunctionCallOut {
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            },
        })
        .collect()
}

/// The non-streamed message and finish reason of a choice that may hold calls.
pub fn message(
    syntax: &ToolSyntax,
    text: &str,
    reason: &'static str,
) -> (AssistantMessage, &'static str) {
    let parsed = parse_tool_calls(syntax, text, random_ids(syntax.format));
    let finish = parsed.finish_reason(reason);
    let calls = openai_calls(&parsed);
    // `null` next to calls; an empty answer without calls is `""`, as without tools.
    let content = match parsed.content {
        None if calls.is_empty() => Some(String::new()),
        content => content,
    };
    let message = AssistantMessage {
        role: "assistant",
        content,
        refusal: None,
        tool_calls: (!calls.is_empty()).then_some(calls),
        function_call: None,
    };
    (message, finish)
}

/// One streamed choice's parser.
pub struct ChoiceToolStream {
    stream: ToolCallStream,
    /// Write calls as the deprecated `function_call` (the request sent `functions`).
    legacy_functions: bool,
}

fn delta_of(event: ToolStreamEvent) -> ChatDelta {
    let call = |index: usize, id, kind, name, arguments| ToolCallDelta {
        index: index as u32,
        id,
        kind,
        function: FunctionCallDelta { name, arguments },
    };
    let tool_calls = match event {
        ToolStreamEvent::Content(text) => {
            return ChatDelta {
                role: Some("assistant"),
                content: Some(text),
                ..ChatDelta::default()
            }
        }
        ToolStreamEvent::CallStart { index, id, name } => {
            call(index, Some(id), Some("function"), Some(name), String::new())
        }
        ToolStreamEvent::Arguments { index, delta } => call(index, None, None, None, delta),
    };
    ChatDelta {
        role: Some("assistant"),
        tool_calls: Some(vec![tool_calls]),
        ..ChatDelta::default()
    }
}

impl ChoiceToolStream {
    pub fn new(syntax: &ToolSyntax, legacy_functions: bool) -> Self {
        Self {
            stream: ToolCallStream::new(syntax, random_ids(syntax.format)),
            legacy_functions,
        }
    }

    /// The deltas for the next piece of text; at the choice's end (`finish`) also what
    /// was held back, and the finish reason (`tool_calls` once a call was made).
    pub fn push(
        &mut self,
        text: &str,
        finish: Option<&'static str>,
    ) -> (Vec<ChatDelta>, Option<&'static str>) {
        let mut events = self.stream.push(text);
        let finish = finish.map(|reason| {
            events.extend(self.stream.finish());
            if self.stream.calls() > 0 && reason == "stop" {
                "tool_calls"
            } else {
                reason
            }
        });
        let deltas = events.into_iter().map(delta_of);
        if self.legacy_functions {
            return (deltas.map(legacy_delta).collect(), legacy_finish(finish));
        }
        (deltas.collect(), finish)
    }
}
