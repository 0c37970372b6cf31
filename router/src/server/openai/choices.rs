//! One choice of an OpenAI answer, followed token by token: text without special tokens
//! (unless `skip_special_tokens: false`), with any stop sequence left out (text that could
//! still become a stop sequence is held back until it cannot) unless
//! `include_stop_str_in_output`, and OpenAI's finish reasons (`stop` or `length`, never TGI's
//! `stop_sequence` or `eos_token`).
use crate::errors::InferError;
use crate::infer::{Progress, SequenceDecoder};
use crate::scheduler::SequenceEvent;
use crate::schema::{FinishReason, Token};

pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::EosToken | FinishReason::StopSequence => "stop",
    }
}

/// What one event added to a choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceDelta {
    pub index: u32,
    pub text: String,
    /// The generated token with its alternatives (empty for a closing delta).
    pub tokens: Vec<(Token, Vec<Token>)>,
    pub finish: Option<&'static str>,
    /// Tokens generated so far.
    pub generated: u32,
}

/// Releases text that can no longer turn into a stop sequence.
#[derive(Debug, Clone, Default)]
pub struct StopHoldback {
    stops: Vec<String>,
    pending: String,
    released: String,
}

impl StopHoldback {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            ..Self::default()
        }
    }

    /// Longest tail of `pending` that starts some stop sequence.
    fn held_len(&self) -> usize {
        let mut held = 0;
        for stop in &self.stops {
            for (end, _) in stop.char_indices().skip(1) {
                if end > held && self.pending.ends_with(&stop[..end]) {
                    held = end;
                }
            }
        }
        held
    }

    pub fn push(&mut self, piece: &str) -> String {
        self.pending.push_str(piece);
        let cut = self.pending.len() - self.held_len();
        let out: String = self.pending.drain(..cut).collect();
        self.released.push_str(&out);
        out
    }

    /// The rest of `final_text` not released yet (nothing if the two disagree).
    pub fn finish(&mut self, final_text: &str) -> String {
        self.pending.clear();
        let rest = final_text
            .strip_prefix(self.released.as_str())
            .unwrap_or_default()
            .to_owned();
        self.released.push_str(&rest);
        rest
    }
}

/// Follows one choice's sequence events.
pub struct ChoiceFollower {
    pub index: u32,
    pub decoder: SequenceDecoder,
    holdback: StopHoldback,
    finished: bool,
    /// Special tokens whose text is kept (tool-call markers), as `answer_text` keeps them.
    kept: Vec<(u32, String)>,
}

impl ChoiceFollower {
    pub fn new(index: u32, decoder: SequenceDecoder, stops: Vec<String>) -> Self {
        // A stop string that stays in the text never needs holding back.
        let stops = if decoder.includes_stop_str() {
            Vec::new()
        } else {
            stops
        };
        Self {
            index,
            decoder,
            holdback: StopHoldback::new(stops),
            finished: false,
            kept: Vec::new(),
        }
    }

    /// Keeps the text of these special tokens (`tool_calls::kept_tokens`).
    pub fn keeping(mut self, kept: Vec<(u32, String)>) -> Self {
        self.kept = kept;
        self
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The delta an event produces, if any.
    pub fn on_event(&mut self, event: SequenceEvent) -> Result<Option<ChoiceDelta>, InferError> {
        if self.finished {
            return Ok(None);
        }
        let (token, finish) = match self.decoder.on_event(event)? {
            Progress::Pending => return Ok(None),
            Progress::Token(update) => (Some((update.token, update.top_tokens)), update.finish),
            Progress::Finished(reason) => (None, Some(reason)),
        };
        // The last token's text comes from the final text, which leaves out a stop
        // sequence the token may have completed.
        let kept = |id: u32| {
            self.kept
                .iter()
                .find(|(k, _)| *k == id)
                .map(|(_, t)| t.clone())
        };
        let text = match (&token, finish) {
            (_, Some(_)) => {
                self.finished = true;
                let text = super::tool_calls::answer_text(&self.decoder, &self.kept);
                self.holdback.finish(&text)
            }
            (Some((token, _)), None) => match kept(token.id) {
                Some(marker) => self.holdback.push(&marker),
                None => self.holdback.push(self.decoder.last_text_piece()),
            },
            _ => String::new(),
        };
        Ok(Some(ChoiceDelta {
            index: self.index,
            text,
            tokens: token.into_iter().collect(),
            finish: finish.map(finish_reason),
            generated: self.decoder.record().tokens.len() as u32,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release_all(stops: &[&str], pieces: &[&str]) -> Vec<String> {
        let mut holdback = StopHoldback::new(stops.iter().map(|s| s.to_string()).collect());
        pieces.iter().map(|p| holdback.push(p)).collect()
    }

    #[test]
    fn text_that_may_start_a_stop_is_held() {
        assert_eq!(
            release_all(&["END"], &["abc E", "N", "x"]),
            vec!["abc ", "", "ENx"]
        );
        assert_eq!(release_all(&[], &["a", "b"]), vec!["a", "b"]);
    }

    #[test]
    fn finish_releases_the_rest_of_the_final_text() {
        let mut holdback = StopHoldback::new(vec!["END".into()]);
        assert_eq!(holdback.push("hi E"), "hi ");
        assert_eq!(holdback.push("N"), "");
        // The sequence stopped on "END": the final text excludes it.
        assert_eq!(holdback.finish("hi "), "");
        let mut other = StopHoldback::new(vec!["END".into()]);
        other.push("hi E");
        // Finished by length: the held "E" is released.
        assert_eq!(other.finish("hi E"), "E");
    }

    #[test]
    fn multibyte_stops_hold_on_character_boundaries() {
        assert_eq!(release_all(&["é!"], &["aé", "b"]), vec!["a", "éb"]);
    }

    /// Streams `ids` through a follower; returns the deltas' text and the whole answer.
    fn follow(
        ids: &[u32],
        stop_token_ids: Vec<u32>,
        stops: &[&str],
        skip: bool,
        include: bool,
    ) -> (String, String) {
        let t = std::sync::Arc::new(crate::test_support::byte_level_tokenizer());
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let spec = crate::infer::SequenceSpec {
            input_ids: t.encode("hi").unwrap(),
            max_new_tokens: 100,
            stop_token_ids,
            stop_sequences: stops.clone(),
            skip_special_tokens: skip,
            include_stop_str_in_output: include,
        };
        let mut follower = ChoiceFollower::new(0, SequenceDecoder::new(t, spec), stops);
        let mut streamed = String::new();
        for &id in ids {
            let event = SequenceEvent::Token(crate::pb::Token {
                id,
                logprob: -0.1,
                top_ids: vec![],
                top_logprobs: vec![],
            });
            if let Some(delta) = follower.on_event(event).unwrap() {
                streamed.push_str(&delta.text);
            }
        }
        (streamed, follower.decoder.text_without_stop())
    }

    #[test]
    fn streamed_deltas_add_up_to_the_whole_answer_for_every_output_flag() {
        let t = crate::test_support::byte_level_tokenizer();
        let eos = t.token_to_id("<eos>").unwrap();
        let mut ids = t.encode("say END now").unwrap();
        ids.insert(1, eos);
        let bang = t.encode("!").unwrap()[0];
        let mut with_bang = t.encode("wow! no").unwrap();
        with_bang.insert(0, eos);
        // (ids, stop token ids, stop strings, skip special tokens, include the stop, text)
        type Case<'a> = (&'a [u32], Vec<u32>, &'a [&'a str], bool, bool, &'a str);
        let cases: [Case; 6] = [
            (&ids, vec![], &["END"], true, false, "say "),
            (&ids, vec![], &["END"], true, true, "say END"),
            (&ids, vec![], &["END"], false, false, "s<eos>ay "),
            (&ids, vec![], &["END"], false, true, "s<eos>ay END"),
            (&with_bang, vec![bang], &[], false, false, "<eos>wow"),
            (&with_bang, vec![bang], &[], true, true, "wow!"),
        ];
        for (ids, stop_ids, stops, skip, include, expected) in cases {
            let (streamed, whole) = follow(ids, stop_ids, stops, skip, include);
            assert_eq!(whole, expected, "skip {skip} include {include}");
            assert_eq!(streamed, whole, "skip {skip} include {include}");
        }
    }

    #[test]
    fn finish_reasons_are_openai_values() {
        assert_eq!(finish_reason(FinishReason::Length), "length");
        assert_eq!(finish_reason(FinishReason::EosToken), "stop");
        assert_eq!(finish_reason(FinishReason::StopSequence), "stop");
    }
}
