//! Turns one sequence's scheduler events into TGI tokens: detokenizes incrementally,
//! matches stop sequences and decides, at the token itself, whether it is the last one
//! (so the final streamed event needs no extra round trip).
use std::sync::Arc;
use std::time::Duration;

use crate::errors::InferError;
use crate::finish::{finish_reason, AfterToken, FinishReason};
use crate::pb;
use crate::scheduler::{GenerationFailure, SequenceEvent};
use crate::schema::{PrefillToken, Token};
use crate::stop_sequences::StopMatcher;
use crate::tokenizer::{IncrementalDecoder, TextTokenizer};

/// What the decoder needs to know about the sequence it follows.
#[derive(Debug, Clone)]
pub struct SequenceSpec {
    pub input_ids: Vec<u32>,
    pub max_new_tokens: u32,
    /// The model's EOS ids and the request's own stop tokens (vLLM's `stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
    pub stop_sequences: Vec<String>,
    /// Special tokens leave no text (the default; vLLM's `skip_special_tokens`).
    pub skip_special_tokens: bool,
    /// The stop string (or stop token's text) that ended the sequence stays at the end of
    /// the OpenAI text (vLLM's `include_stop_str_in_output`).
    pub include_stop_str_in_output: bool,
}

/// One generated token, ready to be streamed.
#[derive(Debug, Clone)]
pub struct TokenUpdate {
    pub token: Token,
    pub top_tokens: Vec<Token>,
    /// Set on the sequence's last token.
    pub finish: Option<FinishReason>,
}

/// The outcome of feeding one event.
#[derive(Debug, Clone)]
pub enum Progress {
    /// Nothing to emit (bookkeeping event).
    Pending,
    Token(TokenUpdate),
    /// The scheduler ended the sequence without a token we could mark as last.
    Finished(FinishReason),
}

/// Everything known about a finished (or finishing) sequence.
#[derive(Debug, Clone, Default)]
pub struct SequenceRecord {
    pub generated_ids: Vec<u32>,
    pub tokens: Vec<Token>,
    /// The text each token adds to the answer: its piece, empty for a skipped special token
    /// or for the stop token that ended the sequence. Stop strings match on these.
    pub text_pieces: Vec<String>,
    pub top_tokens: Vec<Vec<Token>>,
    pub prefill: Vec<PrefillToken>,
    pub queue_time: Duration,
    /// Decoded text as streamed, cut after the stop sequence when one matched.
    pub stop_cut_text: Option<String>,
    /// The stop sequence that ended the sequence (OpenAI routes leave it out of the text).
    pub matched_stop: Option<String>,
    pub finish: Option<FinishReason>,
}

pub struct SequenceDecoder {
    tokenizer: Arc<TextTokenizer>,
    spec: SequenceSpec,
    detokenizer: IncrementalDecoder,
    stops: StopMatcher,
    record: SequenceRecord,
}

impl SequenceDecoder {
    pub fn new(tokenizer: Arc<TextTokenizer>, spec: SequenceSpec) -> Self {
        let detokenizer = tokenizer.decoder_for(&spec.input_ids);
        let stops = StopMatcher::new(spec.stop_sequences.clone());
        Self {
            tokenizer,
            spec,
            detokenizer,
            stops,
            record: SequenceRecord::default(),
        }
    }

    pub fn is_finished(&self) -> bool {
        self.record.finish.is_some()
    }

    pub fn record(&self) -> &SequenceRecord {
        &self.record
    }

    pub fn into_record(self) -> SequenceRecord {
        self.record
    }

    /// Feeds one scheduler event. Events after the sequence finished are ignored.
    pub fn on_event(&mut self, event: SequenceEvent) -> Result<Progress, InferError> {
        if self.is_finished() {
            return Ok(Progress::Pending);
        }
        match event {
            SequenceEvent::Started { queue_time } => {
                self.record.queue_time = queue_time;
                Ok(Progress::Pending)
            }
            SequenceEvent::Prefill { logprobs } => {
                self.record.prefill = self.prefill_tokens(&logprobs);
                Ok(Progress::Pending)
            }
            SequenceEvent::Token(token) => self.on_token(token).map(Progress::Token),
            SequenceEvent::Finished { reason, .. } => {
                self.record.finish = Some(reason);
                Ok(Progress::Finished(reason))
            }
            SequenceEvent::Error(message) => Err(InferError::Generation(message)),
            SequenceEvent::Refused(message) => Err(InferError::Refused(message)),
        }
    }

    fn on_token(&mut self, sampled: pb::Token) -> Result<TokenUpdate, InferError> {
        let piece = self
            .detokenizer
            .push(&self.tokenizer, sampled.id)
            .map_err(|err| InferError::Generation(GenerationFailure::router(err.to_string())))?;
        let special = self.tokenizer.is_special(sampled.id);
        let stop_token = self.spec.stop_token_ids.contains(&sampled.id);
        // vLLM: the stop token ending the sequence is not detokenized unless asked for.
        let text_piece = if (special && self.spec.skip_special_tokens)
            || (stop_token && !self.spec.include_stop_str_in_output)
        {
            String::new()
        } else {
            piece.clone()
        };
        let stop = self.stops.push(&text_piece);
        let token = Token {
            id: sampled.id,
            text: piece,
            logprob: sampled.logprob,
            special,
        };
        let top_tokens: Vec<Token> = sampled
            .top_ids
            .iter()
            .zip(&sampled.top_logprobs)
            .map(|(&id, &logprob)| Token {
                id,
                text: self.tokenizer.token_text(id),
                logprob,
                special: self.tokenizer.is_special(id),
            })
            .collect();
        self.record.generated_ids.push(sampled.id);
        self.record.tokens.push(token.clone());
        self.record.text_pieces.push(text_piece);
        if !top_tokens.is_empty() {
            self.record.top_tokens.push(top_tokens.clone());
        }
        let finish = finish_reason(AfterToken {
            generated_tokens: self.record.generated_ids.len() as u32,
            max_new_tokens: self.spec.max_new_tokens,
            is_stop_token: stop_token,
            ends_stop_sequence: stop.is_some(),
        });
        if let (Some(FinishReason::StopSequence), Some(found)) = (finish, stop) {
            self.record.stop_cut_text = Some(self.stops.text()[..found.end].to_owned());
            self.record.matched_stop = Some(found.sequence);
        }
        self.record.finish = finish;
        Ok(TokenUpdate {
            token,
            top_tokens,
            finish,
        })
    }

    /// Prompt tokens with the logprob the model gave each; the first has none.
    fn prefill_tokens(&self, logprobs: &[f32]) -> Vec<PrefillToken> {
        self.spec
            .input_ids
            .iter()
            .enumerate()
            .map(|(position, &id)| PrefillToken {
                id,
                text: self.tokenizer.token_text(id),
                logprob: position
                    .checked_sub(1)
                    .and_then(|i| logprobs.get(i).copied()),
            })
            .collect()
    }

    pub fn tokenizer(&self) -> &Arc<TextTokenizer> {
        &self.tokenizer
    }

    pub fn includes_stop_str(&self) -> bool {
        self.spec.include_stop_str_in_output
    }

    /// The text the last token added to the answer (`SequenceRecord::text_pieces`).
    pub fn last_text_piece(&self) -> &str {
        self.record.text_pieces.last().map_or("", String::as_str)
    }

    /// The final text as OpenAI wants it: without the stop sequence that ended it, unless
    /// `include_stop_str_in_output`.
    pub fn text_without_stop(&self) -> String {
        let mut text = self.generated_text();
        if self.spec.include_stop_str_in_output {
            return text;
        }
        if let (Some(stop), Some(_)) = (&self.record.matched_stop, &self.record.stop_cut_text) {
            if text.ends_with(stop.as_str()) {
                text.truncate(text.len() - stop.len());
            }
        }
        text
    }

    /// The final text: cut after the stop sequence when one matched, otherwise the full
    /// decode, without special tokens unless asked for (TGI leaves EOS out of
    /// `generated_text`) and without the stop token that ended it.
    pub fn generated_text(&self) -> String {
        if let Some(cut) = &self.record.stop_cut_text {
            return cut.clone();
        }
        let mut ids = self.record.generated_ids.as_slice();
        if let Some((last, rest)) = ids.split_last() {
            if self.spec.stop_token_ids.contains(last) && !self.spec.include_stop_str_in_output {
                ids = rest;
            }
        }
        self.tokenizer
            .decode(ids, self.spec.skip_special_tokens)
            .unwrap_or_else(|_| self.stops.text().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::byte_level_tokenizer;

    fn decoder(max_new_tokens: u32, stops: &[&str]) -> (SequenceDecoder, Arc<TextTokenizer>) {
        let tokenizer = Arc::new(byte_level_tokenizer());
        let eos = tokenizer.token_to_id("<eos>").unwrap();
        let spec = SequenceSpec {
            input_ids: tokenizer.encode("hello").unwrap(),
            max_new_tokens,
            stop_token_ids: vec![eos],
            stop_sequences: stops.iter().map(|s| s.to_string()).collect(),
            skip_special_tokens: true,
            include_stop_str_in_output: false,
        };
        (SequenceDecoder::new(tokenizer.clone(), spec), tokenizer)
    }

    fn token(id: u32) -> SequenceEvent {
        SequenceEvent::Token(pb::Token {
            id,
            logprob: -0.5,
            top_ids: vec![],
            top_logprobs: vec![],
        })
    }

    fn feed_text(d: &mut SequenceDecoder, t: &TextTokenizer, text: &str) -> Vec<TokenUpdate> {
        let mut updates = vec![];
        for id in t.encode(text).unwrap() {
            if let Progress::Token(update) = d.on_event(token(id)).unwrap() {
                updates.push(update);
            }
        }
        updates
    }

    #[test]
    fn stop_sequence_finishes_and_cuts_text() {
        let (mut d, t) = decoder(100, &["lo w"]);
        let updates = feed_text(&mut d, &t, " hello world");
        let last = updates.iter().position(|u| u.finish.is_some()).unwrap();
        assert_eq!(updates[last].finish, Some(FinishReason::StopSequence));
        assert!(
            updates[last + 1..].is_empty(),
            "nothing is emitted after the stop"
        );
        assert_eq!(d.generated_text(), " hello w");
        assert_eq!(d.text_without_stop(), " hel");
    }

    #[test]
    fn eos_finishes_without_its_text() {
        let (mut d, t) = decoder(100, &[]);
        feed_text(&mut d, &t, "hi");
        let eos = t.token_to_id("<eos>").unwrap();
        let Progress::Token(update) = d.on_event(token(eos)).unwrap() else {
            panic!()
        };
        assert_eq!(update.finish, Some(FinishReason::EosToken));
        assert!(update.token.special);
        assert_eq!(d.generated_text(), "hi");
        // The scheduler's own Finished event is then ignored.
        let finished = SequenceEvent::Finished {
            reason: FinishReason::EosToken,
            generated_tokens: 3,
        };
        assert!(matches!(d.on_event(finished).unwrap(), Progress::Pending));
    }

    fn spec_with(
        t: &TextTokenizer,
        stop_token_ids: Vec<u32>,
        stops: &[&str],
        skip_special_tokens: bool,
        include_stop_str_in_output: bool,
    ) -> SequenceDecoder {
        let spec = SequenceSpec {
            input_ids: t.encode("hello").unwrap(),
            max_new_tokens: 100,
            stop_token_ids,
            stop_sequences: stops.iter().map(|s| s.to_string()).collect(),
            skip_special_tokens,
            include_stop_str_in_output,
        };
        SequenceDecoder::new(Arc::new(t.clone()), spec)
    }

    #[test]
    fn a_requests_stop_token_ends_like_eos_without_its_text() {
        let t = byte_level_tokenizer();
        let eos = t.token_to_id("<eos>").unwrap();
        let bang = t.encode("!").unwrap()[0];
        for include in [false, true] {
            let mut d = spec_with(&t, vec![eos, bang], &[], true, include);
            let updates = feed_text(&mut d, &t, "hi! more");
            assert_eq!(updates.len(), 3, "nothing after the stop token");
            assert_eq!(updates[2].finish, Some(FinishReason::EosToken));
            assert_eq!(
                updates[2].token.text, "!",
                "the token itself still carries its text"
            );
            // vLLM leaves the stop token out unless include_stop_str_in_output.
            let expected = if include { "hi!" } else { "hi" };
            assert_eq!(d.generated_text(), expected);
            assert_eq!(d.text_without_stop(), expected);
            assert_eq!(d.last_text_piece(), if include { "!" } else { "" });
        }
    }

    #[test]
    fn special_tokens_leave_text_only_when_not_skipped() {
        let t = byte_level_tokenizer();
        let eos = t.token_to_id("<eos>").unwrap();
        let ids = [t.encode("a").unwrap()[0], eos, t.encode("b").unwrap()[0]];
        for (skip, expected) in [(true, "ab"), (false, "a<eos>b")] {
            // <eos> is not a stop token here: it is only a special token mid-answer.
            let mut d = spec_with(&t, vec![], &[], skip, false);
            for &id in &ids {
                d.on_event(token(id)).unwrap();
            }
            assert_eq!(d.generated_text(), expected);
            assert_eq!(d.record().text_pieces.concat(), expected);
            assert!(d.record().tokens[1].special);
        }
        // A stop string can span a kept special token's text.
        let mut d = spec_with(&t, vec![], &["<eos>b"], false, false);
        for &id in &ids {
            d.on_event(token(id)).unwrap();
        }
        assert_eq!(d.record().finish, Some(FinishReason::StopSequence));
        assert_eq!(d.text_without_stop(), "a");
        // EOS ending the answer stays out of it even when special tokens are kept (vLLM).
        let mut d = spec_with(&t, vec![eos], &[], false, false);
        feed_text(&mut d, &t, "ok");
        d.on_event(token(eos)).unwrap();
        assert_eq!(
            (d.generated_text(), d.text_without_stop()),
            ("ok".into(), "ok".into())
        );
    }

    #[test]
    fn include_stop_str_in_output_keeps_the_stop_string() {
        let t = byte_level_tokenizer();
        let mut d = spec_with(&t, vec![], &["lo w"], true, true);
        feed_text(&mut d, &t, " hello world");
        assert_eq!(d.record().finish, Some(FinishReason::StopSequence));
        assert_eq!(d.text_without_stop(), " hello w");
        assert_eq!(d.generated_text(), " hello w");
    }

    #[test]
    fn the_last_allowed_token_being_eos_finishes_for_length_as_the_scheduler_says() {
        // The scheduler's side of this case is tested in scheduler/tests_plan.rs.
        let (mut d, t) = decoder(3, &[]);
        feed_text(&mut d, &t, "hi");
        let eos = t.token_to_id("<eos>").unwrap();
        let Progress::Token(update) = d.on_event(token(eos)).unwrap() else {
            panic!()
        };
        assert_eq!(update.finish, Some(FinishReason::Length));
        assert_eq!(d.generated_text(), "hi", "the EOS still leaves no text");
    }

    #[test]
    fn length_finishes_at_max_new_tokens() {
        let (mut d, t) = decoder(2, &[]);
        let updates = feed_text(&mut d, &t, "abc");
        assert_eq!(updates.len(), 2);
        assert_eq!(updates[1].finish, Some(FinishReason::Length));
        assert_eq!(d.record().tokens.len(), 2);
    }

    #[test]
    fn prefill_logprobs_align_with_prompt_tokens() {
        let (mut d, _) = decoder(5, &[]);
        let spec_len = d.spec.input_ids.len();
        d.spec.input_ids = vec![1, 2, 3];
        d.on_event(SequenceEvent::Prefill {
            logprobs: vec![-1.0, -2.0],
        })
        .unwrap();
        let prefill = &d.record().prefill;
        assert!(spec_len > 0);
        assert_eq!(
            prefill.iter().map(|p| p.logprob).collect::<Vec<_>>(),
            vec![None, Some(-1.0), Some(-2.0)]
        );
    }

    #[test]
    fn shard_error_becomes_generation_error() {
        let (mut d, _) = decoder(5, &[]);
        let err = d
            .on_event(SequenceEvent::Error("shard 1 died".into()))
            .unwrap_err();
        assert_eq!(err.error_type(), "generation");
    }

    #[test]
    fn shard_refusal_is_the_clients_error() {
        let (mut d, _) = decoder(5, &[]);
        let err = d
            .on_event(SequenceEvent::Refused(
                "grammar dead end: row too large".into(),
            ))
            .unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(err.error_type(), "validation");
        let openai = crate::server::openai::errors::OpenAiError::from(err);
        assert_eq!(openai.status, axum::http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn top_tokens_carry_text_and_logprobs() {
        let (mut d, t) = decoder(5, &[]);
        let h = t.encode("h").unwrap()[0];
        let event = SequenceEvent::Token(pb::Token {
            id: h,
            logprob: -0.1,
            top_ids: vec![h, h + 1],
            top_logprobs: vec![-0.1, -2.0],
        });
        let Progress::Token(update) = d.on_event(event).unwrap() else {
            panic!()
        };
        assert_eq!(update.top_tokens.len(), 2);
        assert_eq!(update.top_tokens[0].text, "h");
        assert_eq!(update.top_tokens[1].logprob, -2.0);
    }
}
