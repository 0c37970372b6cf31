//! How long one step may take before the set counts a rank as hung.
//!
//! A fixed timeout cannot serve every device: a 4,096-token prefill takes milliseconds on a
//! GPU and close to a minute on one CPU core. So a step gets the step timeout plus
//! [`RATE_MARGIN`] times what its tokens cost at the rate the shards measured on warmup's
//! step. The margin covers what that step did not exercise: long contexts cost more per
//! token than its short prompts.
use std::time::Duration;

use crate::pb;

/// Multiple of the warmup rate a step's tokens are allowed on top of the step timeout.
pub const RATE_MARGIN: u32 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepDeadline {
    pub timeout: Duration,
    /// Warmup's step time per token on the slowest rank; zero until warmup reports one.
    pub per_token: Duration,
}

impl StepDeadline {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            per_token: Duration::ZERO,
        }
    }

    /// The slowest rank's warmup rate; a rank that reports no step leaves the rate alone.
    pub fn with_warmup_rate(self, warmups: &[pb::WarmupResponse]) -> Self {
        let per_token = warmups
            .iter()
            .filter(|w| w.step_tokens > 0)
            .map(|w| Duration::from_micros(w.step_us) / w.step_tokens)
            .max()
            .unwrap_or(self.per_token);
        Self { per_token, ..self }
    }

    /// The deadline of a step computing `tokens` tokens, to the millisecond.
    pub fn for_tokens(&self, tokens: u64) -> Duration {
        let nanos = self.per_token.as_nanos() * u128::from(tokens) * u128::from(RATE_MARGIN);
        let millis = u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX);
        self.timeout.saturating_add(Duration::from_millis(millis))
    }
}

/// Tokens a step computes: prefill chunks, decodes and their drafts.
pub fn step_tokens(request: &pb::StepRequest) -> u64 {
    request
        .sequences
        .iter()
        .map(|s| u64::from(s.num_tokens) + u64::from(s.max_draft_tokens))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warmed(step_us: u64, step_tokens: u32) -> pb::WarmupResponse {
        pb::WarmupResponse {
            step_us,
            step_tokens,
            ..Default::default()
        }
    }

    #[test]
    fn a_step_gets_the_timeout_plus_its_tokens_at_the_slowest_ranks_rate() {
        let deadline = StepDeadline::new(Duration::from_secs(60))
            .with_warmup_rate(&[warmed(1_280_000, 128), warmed(2_560_000, 128)]);
        assert_eq!(deadline.per_token, Duration::from_millis(20));
        assert_eq!(deadline.for_tokens(0), Duration::from_secs(60));
        // 4,096 tokens at 20 ms, four times over: 327.68 s on top of the minute.
        assert_eq!(deadline.for_tokens(4096), Duration::from_millis(387_680));
    }

    #[test]
    fn a_fast_device_keeps_about_the_plain_timeout() {
        let deadline =
            StepDeadline::new(Duration::from_secs(3)).with_warmup_rate(&[warmed(40_000, 4096)]);
        assert_eq!(deadline.for_tokens(1), Duration::from_millis(3_001)); // rounded up
        assert_eq!(deadline.for_tokens(256), Duration::from_millis(3_010));
    }

    #[test]
    fn shards_that_report_no_step_leave_the_timeout_alone() {
        let deadline = StepDeadline::new(Duration::from_secs(60))
            .with_warmup_rate(&[warmed(0, 0), pb::WarmupResponse::default()]);
        assert_eq!(deadline.for_tokens(1 << 20), Duration::from_secs(60));
    }

    #[test]
    fn the_flag_docs_state_the_margin() {
        let margin = format!("{RATE_MARGIN}×");
        for (page, text) in [
            (
                "docs/router-http.md",
                include_str!("../../../docs/router-http.md"),
            ),
            ("README.md", include_str!("../../../README.md")),
        ] {
            assert!(text.contains(&margin), "{page} does not say {margin}");
        }
    }

    #[test]
    fn drafts_count_as_tokens() {
        let request = pb::StepRequest {
            sequences: vec![
                pb::ScheduledSequence {
                    num_tokens: 300,
                    ..Default::default()
                },
                pb::ScheduledSequence {
                    num_tokens: 1,
                    max_draft_tokens: 4,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(step_tokens(&request), 305);
    }
}
