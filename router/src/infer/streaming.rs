//! Turns one sequence's events into `/generate_stream` items: one per token, the last
//! with the final text and details, and the request's metrics along the way.
use crate::errors::InferError;
use crate::metrics::{Outcome, RequestMeter};
use crate::scheduler::SequenceEvent;
use crate::schema::{StreamDetails, StreamResponse, Token};

use super::{outcome_of, Progress, SequenceDecoder, StreamItem, TokenUpdate};

/// What to do with the next event's result.
pub enum Step {
    /// Nothing to send yet.
    Wait,
    /// Send this and keep going.
    Send(StreamResponse),
    /// Send this and end the stream.
    Last(StreamItem),
}

pub struct StreamBuilder {
    decoder: SequenceDecoder,
    meter: RequestMeter,
    index: u32,
    last_token: Option<Token>,
    input_length: u32,
    seed: Option<u64>,
    /// The prompt, when `return_full_text` asks for it in front of the text.
    full_text_prefix: Option<String>,
}

impl StreamBuilder {
    pub fn new(
        decoder: SequenceDecoder,
        meter: RequestMeter,
        input_length: u32,
        seed: Option<u64>,
        full_text_prefix: Option<String>,
    ) -> Self {
        Self {
            decoder,
            meter,
            index: 0,
            last_token: None,
            input_length,
            seed,
            full_text_prefix,
        }
    }

    /// The event channel closed before the sequence finished.
    pub fn on_closed(&mut self) -> StreamItem {
        self.meter.finish(Outcome::Incomplete);
        Err(InferError::IncompleteGeneration)
    }

    pub fn on_event(&mut self, event: SequenceEvent) -> Step {
        let update = match self.decoder.on_event(event) {
            Ok(Progress::Pending) => return Step::Wait,
            Ok(Progress::Token(update)) => update,
            Ok(Progress::Finished(reason)) => self.closing_update(reason),
            Err(err) => {
                self.meter.finish(outcome_of(&err));
                return Step::Last(Err(err));
            }
        };
        self.index += 1;
        self.meter.on_token();
        self.last_token = Some(update.token.clone());
        let Some(finish_reason) = update.finish else {
            return Step::Send(StreamResponse {
                index: self.index,
                token: update.token,
                top_tokens: update.top_tokens,
                generated_text: None,
                details: None,
            });
        };
        let generated_tokens = self.decoder.record().tokens.len() as u32;
        let mut text = self.decoder.generated_text();
        if let Some(prefix) = &self.full_text_prefix {
            text.insert_str(0, prefix);
        }
        self.meter.trace().add_finish_reason(finish_reason.as_str());
        self.meter.succeed(self.input_length, generated_tokens);
        Step::Last(Ok(StreamResponse {
            index: self.index,
            token: update.token,
            top_tokens: update.top_tokens,
            generated_text: Some(text),
            details: Some(StreamDetails {
                finish_reason,
                generated_tokens,
                seed: self.seed,
                input_length: self.input_length,
            }),
        }))
    }

    /// The scheduler ended the sequence without a token we saw as last (it should not
    /// happen): close with an empty-text repeat of the last token so clients still get
    /// the final event.
    fn closing_update(&self, reason: crate::schema::FinishReason) -> TokenUpdate {
        let last = self.last_token.clone();
        let token = last.map_or(
            Token {
                id: 0,
                text: String::new(),
                logprob: 0.0,
                special: true,
            },
            |t| Token {
                text: String::new(),
                ..t
            },
        );
        TokenUpdate {
            token,
            top_tokens: vec![],
            finish: Some(reason),
        }
    }
}
