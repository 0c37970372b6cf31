//! Streaming answers, as OpenAI sends them: SSE `data: <chunk>` events; for chat the
//! role first (one chunk per choice), each choice's `finish_reason` exactly once, then
//! with `include_usage` one chunk with empty `choices` and the usage, then `data: [DONE]`.
//! Errors before the first chunk keep their HTTP status; later ones arrive as
//! `data: {"error": {...}}` and end the stream.
use std::convert::Infallible;
use std::pin::Pin;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use super::choices::{ChoiceDelta, ChoiceFollower};
use super::errors::OpenAiError;
use super::logprobs;
use super::mapping::Plan;
use super::tool_calls::{kept_tokens, ChoiceToolStream};
use super::types::{
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, Completion, CompletionChoice, Usage,
};
use super::{fingerprint, response_id, unix_now, AppState};
use crate::errors::InferError;
use crate::infer::{outcome_of, Admitted};
use crate::metrics::{RequestMeter, Route};
use crate::scheduler::SequenceStream;
use crate::tokenizer::TextTokenizer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Chat,
    Completion,
}

type DeltaStream = Pin<Box<dyn Stream<Item = Result<ChoiceDelta, InferError>> + Send>>;

/// One choice's deltas until it finishes (or fails).
fn follow(mut follower: ChoiceFollower, mut events: SequenceStream) -> DeltaStream {
    Box::pin(async_stream::stream! {
        loop {
            let Some(event) = events.recv().await else {
                if !follower.is_finished() {
                    yield Err(InferError::IncompleteGeneration);
                }
                break;
            };
            match follower.on_event(event) {
                Ok(None) => {}
                Ok(Some(delta)) => {
                    let done = delta.finish.is_some();
                    yield Ok(delta);
                    if done {
                        break;
                    }
                }
                Err(err) => {
                    yield Err(err);
                    break;
                }
            }
        }
    })
}

/// Builds the chunks of one response.
struct Chunker {
    format: Format,
    id: String,
    created: u64,
    model: String,
    /// Alternatives per token, when logprobs were asked for.
    logprobs: Option<u32>,
    tokenizer: std::sync::Arc<TextTokenizer>,
}

impl Chunker {
    fn event(&self, json: Result<Event, axum::Error>) -> Event {
        json.unwrap_or_else(|err| Event::default().data(format!(
            r#"{{"error":{{"message":"stream serialization failed: {err}","type":"server_error","param":null,"code":null}}}}"#
        )))
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> Event {
        self.event(Event::default().json_data(ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: fingerprint(),
            choices,
            usage,
        }))
    }

    fn completion_chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Event {
        self.event(Event::default().json_data(Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: fingerprint(),
            choices,
            usage,
        }))
    }

    /// The opening chunk of a choice: the role (chat) or the echoed prompt (completions).
    fn opening(&self, index: u32, echo: Option<&str>) -> Option<Event> {
        match self.format {
            Format::Chat => Some(self.chat_chunk(
                vec![ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        ..ChatDelta::default()
                    },
                    logprobs: None,
                    finish_reason: None,
                }],
                None,
            )),
            Format::Completion => echo.map(|prompt| {
                self.completion_chunk(
                    vec![CompletionChoice {
                        index,
                        text: prompt.to_owned(),
                        logprobs: None,
                        finish_reason: None,
                    }],
                    None,
                )
            }),
        }
    }

    /// The chunk of a delta; `None` when it carries nothing a client could see.
    /// `text_offset` is where the choice's text stands so far, in characters (legacy
    /// logprobs report token offsets from the start of the choice's text).
    fn delta(
        &self,
        delta: ChoiceDelta,
        text_offset: &mut u32,
        tools: Option<&mut ChoiceToolStream>,
    ) -> Vec<Event> {
        let start = *text_offset;
        *text_offset += delta.text.chars().count() as u32;
        let wants_logprobs = self.logprobs.is_some() && !delta.tokens.is_empty();
        let top = self.logprobs.unwrap_or(0);
        if let (Format::Chat, Some(tools)) = (self.format, tools) {
            return self.tool_chunks(delta, tools, wants_logprobs, top);
        }
        if delta.text.is_empty() && delta.finish.is_none() && !wants_logprobs {
            return Vec::new();
        }
        vec![match self.format {
            Format::Chat => self.chat_chunk(
                vec![ChatChunkChoice {
                    index: delta.index,
                    // Every delta names the role: TGI's Python client requires it, and
                    // OpenAI's SDK accepts it.
                    delta: ChatDelta {
                        role: Some("assistant"),
                        content: (!delta.text.is_empty()).then_some(delta.text),
                        ..ChatDelta::default()
                    },
                    logprobs: wants_logprobs
                        .then(|| logprobs::chat(&self.tokenizer, &delta.tokens, top as usize)),
                    finish_reason: delta.finish,
                }],
                None,
            ),
            Format::Completion => {
                let logprobs = wants_logprobs.then(|| {
                    let mut legacy = logprobs::LegacyLogprobs::starting_at(start);
                    legacy.push_generated(&self.tokenizer, &delta.tokens);
                    legacy.logprobs
                });
                self.completion_chunk(
                    vec![CompletionChoice {
                        index: delta.index,
                        text: delta.text,
                        logprobs,
                        finish_reason: delta.finish,
                    }],
                    None,
                )
            }
        }]
    }

    /// The chunks of a delta of a choice that may hold calls: one per content or call
    /// piece, the token's logprobs on the first, the finish reason on the last.
    fn tool_chunks(
        &self,
        delta: ChoiceDelta,
        tools: &mut ChoiceToolStream,
        wants_logprobs: bool,
        top: u32,
    ) -> Vec<Event> {
        let (mut pieces, finish) = tools.push(&delta.text, delta.finish);
        if pieces.is_empty() {
            if finish.is_none() && !wants_logprobs {
                return Vec::new();
            }
            pieces.push(ChatDelta {
                role: Some("assistant"),
                ..ChatDelta::default()
            });
        }
        let last = pieces.len() - 1;
        let mut logprobs =
            wants_logprobs.then(|| logprobs::chat(&self.tokenizer, &delta.tokens, top as usize));
        pieces
            .into_iter()
            .enumerate()
            .map(|(i, piece)| {
                self.chat_chunk(
                    vec![ChatChunkChoice {
                        index: delta.index,
                        delta: piece,
                        logprobs: logprobs.take(),
                        finish_reason: if i == last { finish } else { None },
                    }],
                    None,
                )
            })
            .collect()
    }

    fn usage(&self, usage: Usage) -> Event {
        match self.format {
            Format::Chat => self.chat_chunk(vec![], Some(usage)),
            Format::Completion => self.completion_chunk(vec![], Some(usage)),
        }
    }
}

fn error_event(err: InferError) -> Event {
    let body = OpenAiError::from(err).body();
    Event::default()
        .json_data(&body)
        .unwrap_or_else(|_| Event::default().data(r#"{"error":{"message":"generation failed","type":"server_error","param":null,"code":null}}"#))
}

/// Admits and validates every prompt, submits its choices, and streams them merged.
pub async fn respond(
    state: &AppState,
    plan: Plan,
    format: Format,
) -> Result<Response, OpenAiError> {
    let route = Route::openai(format == Format::Chat, true);
    let mut meter = RequestMeter::start(route);
    let mut admitted: Vec<Admitted> = Vec::with_capacity(plan.inputs.len());
    let mut followers = Vec::new();
    let mut openings = Vec::new();
    // One call parser per choice, when the answer may hold calls.
    let mut tool_streams: Vec<Option<ChoiceToolStream>> = Vec::new();
    let submitted = async {
        for input in plan.inputs.iter().cloned() {
            let prompt = state.infer.admit_valid(input, true).await?;
            meter.trace().on_validated(crate::infer::RequestShape {
                // The OpenAI routes keep the client's seed in the plan.
                seed: plan.seed,
                ..crate::infer::request_shape(&prompt.valid)
            });
            let trace = meter.trace().span_context();
            for run in 0..plan.runs {
                let index = followers.len() as u32;
                let seed = plan.seed_of(prompt.valid.params.sampling.seed, run);
                let (decoder, events) = state.infer.start(&prompt.valid, seed, trace.clone())?;
                let mut follower =
                    ChoiceFollower::new(index, decoder, prompt.valid.params.stop.clone());
                if let Some(tools) = &plan.tools {
                    follower = follower.keeping(kept_tokens(&tools.syntax));
                }
                tool_streams.push(
                    plan.tools
                        .as_ref()
                        .map(|t| ChoiceToolStream::new(&t.syntax, t.legacy_functions)),
                );
                followers.push(follow(follower, events));
                openings.push((index, plan.echo.then(|| prompt.valid.inputs.clone())));
            }
            admitted.push(prompt);
        }
        Ok::<_, InferError>(())
    };
    if let Err(err) = submitted.await {
        meter.finish(outcome_of(&err));
        return Err(plan.fields.error(err));
    }
    let prompt_tokens: u32 = admitted
        .iter()
        .map(|a| a.valid.input_ids.len() as u32)
        .sum();
    let chunker = Chunker {
        format,
        id: response_id(if format == Format::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: unix_now(),
        model: state.openai.model_id.clone(),
        logprobs: plan.logprobs,
        tokenizer: state.infer.tokenizer().clone(),
    };
    let include_usage = plan.include_usage;
    let mut generated = vec![0u32; followers.len()];
    // Echoed prompts come first in the text.
    let mut text_offsets: Vec<u32> = openings
        .iter()
        .map(|(_, echo)| echo.as_deref().map_or(0, |p| p.chars().count() as u32))
        .collect();
    let events = async_stream::stream! {
        // The concurrency slots live as long as the stream.
        let _admitted = admitted;
        for (index, echo) in &openings {
            if let Some(event) = chunker.opening(*index, echo.as_deref()) {
                yield event;
            }
        }
        let mut merged = futures::stream::select_all(followers);
        while let Some(item) = merged.next().await {
            match item {
                Ok(delta) => {
                    if delta.index == 0 && !delta.tokens.is_empty() {
                        meter.on_token();
                    }
                    if let Some(reason) = delta.finish {
                        meter.trace().add_finish_reason(reason);
                    }
                    generated[delta.index as usize] = delta.generated;
                    let index = delta.index as usize;
                    let offset = &mut text_offsets[index];
                    for event in chunker.delta(delta, offset, tool_streams[index].as_mut()) {
                        yield event;
                    }
                }
                Err(err) => {
                    meter.finish(outcome_of(&err));
                    yield error_event(err);
                    return;
                }
            }
        }
        let completion_tokens: u32 = generated.iter().sum();
        meter.succeed(prompt_tokens, completion_tokens);
        if include_usage {
            yield chunker.usage(Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
            });
        }
        yield Event::default().data("[DONE]");
    };
    let events = events.map(Ok::<_, Infallible>);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
