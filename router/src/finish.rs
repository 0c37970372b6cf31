//! Why a sequence finished, decided in one place. The scheduler asks it to free a
//! sequence's KV after a token, and the decoder asks it to mark the streamed token as the
//! last one; both must give the same answer for the same token.
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Length,
    EosToken,
    StopSequence,
}

impl FinishReason {
    /// The name TGI's API uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::EosToken => "eos_token",
            Self::StopSequence => "stop_sequence",
        }
    }
}

/// What is known about a sequence right after it produced a token.
#[derive(Debug, Clone, Copy)]
pub struct AfterToken {
    /// Tokens generated so far, this one included.
    pub generated_tokens: u32,
    pub max_new_tokens: u32,
    /// The token is one of the model's EOS ids or the request's stop tokens.
    pub is_stop_token: bool,
    /// A stop sequence ends in the text so far (only the decoder knows the text; the
    /// scheduler passes `false`).
    pub ends_stop_sequence: bool,
}

/// The reason the sequence ends at this token, if it does.
///
/// TGI's order (`StoppingCriteria` in its shard): length, then EOS, then stop sequences.
/// So when the last allowed token is also EOS, the answer is `length`, as TGI says; a
/// client comparing `finish_reason` across the two servers sees no difference.
pub fn finish_reason(after: AfterToken) -> Option<FinishReason> {
    if after.generated_tokens >= after.max_new_tokens {
        Some(FinishReason::Length)
    } else if after.is_stop_token {
        Some(FinishReason::EosToken)
    } else if after.ends_stop_sequence {
        Some(FinishReason::StopSequence)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(generated: u32, stop_token: bool, stop_sequence: bool) -> Option<FinishReason> {
        finish_reason(AfterToken {
            generated_tokens: generated,
            max_new_tokens: 4,
            is_stop_token: stop_token,
            ends_stop_sequence: stop_sequence,
        })
    }

    #[test]
    fn length_wins_over_eos_and_stop_sequence_at_the_last_allowed_token() {
        assert_eq!(after(4, true, true), Some(FinishReason::Length));
        assert_eq!(after(4, true, false), Some(FinishReason::Length));
    }

    #[test]
    fn eos_wins_over_a_stop_sequence_before_the_limit() {
        assert_eq!(after(2, true, true), Some(FinishReason::EosToken));
        assert_eq!(after(2, false, true), Some(FinishReason::StopSequence));
        assert_eq!(after(3, false, false), None);
    }
}
