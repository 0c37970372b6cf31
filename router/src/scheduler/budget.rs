//! The per-step budget: how many tokens and sequences one step may carry.
//!
//! Every running decode costs one token and one seat; prefill chunks share what is left
//! of `max_batch_prefill_tokens`, and at most a prompt-token cap while the device backs
//! off after running out of memory (`memory_backoff.rs`). The scheduler reserves the
//! decodes first, so long prompts never stall streams.
use super::api::SchedulerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    tokens_left: u32,
    seats_left: u32,
    tokens_used: u32,
    /// Prompt tokens (prefill chunks) the step may still carry, within `tokens_left`.
    prefill_left: u32,
}

impl StepBudget {
    pub fn new(max_tokens: u32, max_sequences: u32) -> Self {
        Self {
            tokens_left: max_tokens,
            seats_left: max_sequences,
            tokens_used: 0,
            prefill_left: u32::MAX,
        }
    }

    /// The same budget with prefill chunks limited to `cap` tokens in all (None: no cap).
    pub fn with_prefill_cap(mut self, cap: Option<u32>) -> Self {
        self.prefill_left = cap.unwrap_or(u32::MAX);
        self
    }

    pub fn for_config(config: &SchedulerConfig) -> Self {
        Self::new(config.max_batch_prefill_tokens, max_batch_size(config))
    }

    pub fn tokens_left(&self) -> u32 {
        self.tokens_left
    }

    pub fn seats_left(&self) -> u32 {
        self.seats_left
    }

    pub fn tokens_used(&self) -> u32 {
        self.tokens_used
    }

    /// The largest chunk (at most `wanted`) one more sequence could run now; 0 when
    /// the step is full. Consumes nothing.
    pub fn chunk_for(&self, wanted: u32) -> u32 {
        if self.seats_left == 0 {
            return 0;
        }
        wanted.min(self.tokens_left).min(self.prefill_left)
    }

    /// Takes one seat and a prefill chunk of `tokens` (sized by `chunk_for`); false (and
    /// nothing taken) if it does not fit.
    pub fn consume_chunk(&mut self, tokens: u32) -> bool {
        if tokens > self.prefill_left || !self.consume(tokens) {
            return false;
        }
        self.prefill_left -= tokens;
        true
    }

    /// Takes one seat and `tokens` tokens; false (and nothing taken) if they do not fit.
    pub fn consume(&mut self, tokens: u32) -> bool {
        if tokens == 0 || self.seats_left == 0 || tokens > self.tokens_left {
            return false;
        }
        self.seats_left -= 1;
        self.tokens_left -= tokens;
        self.tokens_used += tokens;
        true
    }

    /// Up to `wanted` more tokens for a sequence that already holds its seat (a decode's
    /// drafts); returns how many were taken.
    pub fn extend(&mut self, wanted: u32) -> u32 {
        let taken = wanted.min(self.tokens_left);
        self.tokens_left -= taken;
        self.tokens_used += taken;
        taken
    }

    /// Returns a seat and its tokens (a reserved decode whose sequence was preempted).
    pub fn refund(&mut self, tokens: u32) {
        debug_assert!(
            tokens <= self.tokens_used,
            "refunding more than was consumed"
        );
        self.seats_left += 1;
        self.tokens_left += tokens;
        self.tokens_used -= tokens;
    }
}

/// Most sequences one step carries.
pub fn max_batch_size(config: &SchedulerConfig) -> u32 {
    config.max_batch_size.unwrap_or(u32::MAX)
}

/// Most sequences that may be running (admitted, holding KV) at once. Capped by the
/// token budget too, so that every running decode fits in every step.
pub fn max_running(config: &SchedulerConfig) -> usize {
    max_batch_size(config).min(config.max_batch_prefill_tokens) as usize
}

/// Blocks needed to hold `tokens` positions.
pub fn blocks_for(tokens: u64, block_size: u32) -> u64 {
    tokens.div_ceil(u64::from(block_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_tokens: u32, max_batch: Option<u32>) -> SchedulerConfig {
        SchedulerConfig {
            block_size: 16,
            num_blocks: 8,
            max_batch_prefill_tokens: max_tokens,
            max_batch_size: max_batch,
            prefix_caching: false,
            long_rope_prompt_tokens: None,
            admission_policy: Default::default(),
            admission_age_cap: std::time::Duration::ZERO,
            max_stream_backlog: 1,
            num_draft_tokens: 0,
            prefill_pacing: None,
        }
    }

    #[test]
    fn a_prefill_cap_limits_chunks_but_not_decodes() {
        let mut budget = StepBudget::new(100, 8).with_prefill_cap(Some(10));
        assert!(budget.consume(1), "a decode");
        assert_eq!(budget.chunk_for(50), 10);
        assert!(budget.consume_chunk(6));
        assert_eq!(
            budget.chunk_for(50),
            4,
            "the cap is shared by the step's chunks"
        );
        assert!(!budget.consume_chunk(5), "past the cap");
        assert!(budget.consume(1), "decodes are not prompt tokens");
        assert_eq!(budget.tokens_used(), 8);
        assert_eq!(
            StepBudget::new(100, 8).with_prefill_cap(None).chunk_for(50),
            50
        );
    }

    #[test]
    fn decodes_then_prefill_share_the_token_budget() {
        let mut budget = StepBudget::new(10, 8);
        for _ in 0..3 {
            assert!(budget.consume(1));
        }
        assert_eq!(budget.tokens_left(), 7);
        assert_eq!(budget.chunk_for(100), 7);
        assert!(budget.consume(7));
        assert_eq!(budget.chunk_for(5), 0);
        assert!(!budget.consume(1));
        assert_eq!(budget.tokens_used(), 10);
    }

    #[test]
    fn seats_limit_the_batch_even_with_tokens_left() {
        let mut budget = StepBudget::new(100, 2);
        assert!(budget.consume(1));
        assert!(budget.consume(5));
        assert_eq!(budget.chunk_for(3), 0);
        assert!(!budget.consume(1));
        assert_eq!(budget.tokens_left(), 94);
    }

    #[test]
    fn refund_restores_seat_and_tokens() {
        let mut budget = StepBudget::new(4, 1);
        assert!(budget.consume(1));
        assert!(!budget.consume(1));
        budget.refund(1);
        assert_eq!(
            (
                budget.tokens_left(),
                budget.seats_left(),
                budget.tokens_used()
            ),
            (4, 1, 0)
        );
        assert!(budget.consume(4));
    }

    #[test]
    fn drafts_take_tokens_but_no_seat() {
        let mut budget = StepBudget::new(6, 2);
        assert!(budget.consume(1));
        assert_eq!(budget.extend(4), 4);
        assert_eq!((budget.tokens_left(), budget.seats_left()), (1, 1));
        assert_eq!(budget.extend(4), 1, "only what is left");
        assert_eq!(budget.tokens_used(), 6);
    }

    #[test]
    fn zero_or_oversized_consumption_is_refused() {
        let mut budget = StepBudget::new(4, 3);
        assert!(!budget.consume(0));
        assert!(!budget.consume(5));
        assert_eq!((budget.tokens_left(), budget.seats_left()), (4, 3));
    }

    #[test]
    fn running_cap_is_the_smaller_of_batch_size_and_token_budget() {
        assert_eq!(max_running(&config(4096, Some(32))), 32);
        assert_eq!(max_running(&config(8, Some(32))), 8);
        assert_eq!(max_running(&config(8, None)), 8);
        assert_eq!(
            StepBudget::for_config(&config(8, None)).seats_left(),
            u32::MAX
        );
    }

    #[test]
    fn blocks_round_up() {
        assert_eq!(blocks_for(0, 16), 0);
        assert_eq!(blocks_for(1, 16), 1);
        assert_eq!(blocks_for(16, 16), 1);
        assert_eq!(blocks_for(17, 16), 2);
    }
}
