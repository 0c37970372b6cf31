//! Logprobs in OpenAI's two formats: chat's `{content: [{token, logprob, bytes,
//! top_logprobs}]}` and the legacy completions' parallel lists.
use std::collections::BTreeMap;

use crate::schema::{PrefillToken, Token};
use crate::tokenizer::TextTokenizer;

use super::types::{ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob};

/// Chat logprobs of these tokens, `top` alternatives each.
pub fn chat(tokenizer: &TextTokenizer, tokens: &[(Token, Vec<Token>)], top: usize) -> ChatLogprobs {
    let entry = |token: &Token| {
        (
            tokenizer.token_text(token.id),
            tokenizer.token_bytes(token.id),
        )
    };
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|(token, alternatives)| {
                let (text, bytes) = entry(token);
                TokenLogprob {
                    token: text,
                    logprob: token.logprob,
                    bytes,
                    top_logprobs: alternatives
                        .iter()
                        .take(top)
                        .map(|alt| {
                            let (token, bytes) = entry(alt);
                            TopLogprob {
                                token,
                                logprob: alt.logprob,
                                bytes,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// Accumulates legacy completion logprobs; `text_offset` counts characters from the
/// start of the choice's text.
#[derive(Debug, Default)]
pub struct LegacyLogprobs {
    pub logprobs: CompletionLogprobs,
    offset: u32,
}

impl LegacyLogprobs {
    pub fn starting_at(offset: u32) -> Self {
        Self {
            logprobs: CompletionLogprobs::default(),
            offset,
        }
    }

    fn push_one(&mut self, text: String, logprob: Option<f32>, top: Option<BTreeMap<String, f32>>) {
        self.logprobs.text_offset.push(self.offset);
        self.offset += text.chars().count() as u32;
        self.logprobs.tokens.push(text);
        self.logprobs.token_logprobs.push(logprob);
        self.logprobs.top_logprobs.push(top);
    }

    /// Echoed prompt tokens: the first has no logprob, none has alternatives.
    pub fn push_prompt(&mut self, tokenizer: &TextTokenizer, prefill: &[PrefillToken]) {
        for token in prefill {
            self.push_one(tokenizer.token_text(token.id), token.logprob, None);
        }
    }

    pub fn push_generated(&mut self, tokenizer: &TextTokenizer, tokens: &[(Token, Vec<Token>)]) {
        for (token, alternatives) in tokens {
            let top = alternatives
                .iter()
                .map(|alt| (tokenizer.token_text(alt.id), alt.logprob))
                .collect();
            self.push_one(
                tokenizer.token_text(token.id),
                Some(token.logprob),
                Some(top),
            );
        }
    }
}

/// A record's tokens paired with their alternatives.
pub fn pair_tokens(tokens: &[Token], top_tokens: &[Vec<Token>]) -> Vec<(Token, Vec<Token>)> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), top_tokens.get(i).cloned().unwrap_or_default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::byte_level_tokenizer;

    fn token(tokenizer: &TextTokenizer, text: &str, logprob: f32) -> Token {
        let id = tokenizer.encode(text).unwrap()[0];
        Token {
            id,
            text: text.into(),
            logprob,
            special: false,
        }
    }

    #[test]
    fn chat_logprobs_carry_bytes_and_cap_alternatives() {
        let t = byte_level_tokenizer();
        let hello = token(&t, "hello", -0.1);
        let alts = vec![hello.clone(), token(&t, "a", -2.0), token(&t, "b", -3.0)];
        let out = chat(&t, &[(hello, alts)], 2);
        assert_eq!(out.content.len(), 1);
        let entry = &out.content[0];
        assert_eq!(entry.token, "hello");
        assert_eq!(entry.bytes, b"hello");
        assert_eq!(entry.logprob, -0.1);
        assert_eq!(entry.top_logprobs.len(), 2);
        assert_eq!(entry.top_logprobs[1].token, "a");
    }

    #[test]
    fn legacy_logprobs_are_parallel_lists_with_offsets() {
        let t = byte_level_tokenizer();
        let mut legacy = LegacyLogprobs::starting_at(0);
        let prompt_id = t.encode("hello").unwrap()[0];
        legacy.push_prompt(
            &t,
            &[PrefillToken {
                id: prompt_id,
                text: "hello".into(),
                logprob: None,
            }],
        );
        let a = token(&t, "a", -1.0);
        legacy.push_generated(&t, &[(a.clone(), vec![a])]);
        let lp = legacy.logprobs;
        assert_eq!(lp.tokens, vec!["hello", "a"]);
        assert_eq!(lp.token_logprobs, vec![None, Some(-1.0)]);
        assert_eq!(lp.text_offset, vec![0, 5]);
        assert!(lp.top_logprobs[0].is_none());
        assert_eq!(lp.top_logprobs[1].as_ref().unwrap()["a"], -1.0);
    }
}
