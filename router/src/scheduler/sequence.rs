//! One sequence's scheduling state: where its prefill is, what it generated, which KV
//! blocks it holds and which of them the shards already know about.
use std::borrow::Cow;
use std::time::Instant;

use super::api::SequenceRequest;
use super::speculation::Drafting;
use crate::kv::KvBlocks;
use crate::pb;

#[derive(Debug)]
pub struct Sequence {
    pub id: u64,
    pub request: SequenceRequest,
    /// Tokens sampled so far; they survive preemption.
    pub generated: Vec<u32>,
    /// This admission's block table; empty while waiting.
    pub blocks: KvBlocks,
    /// How many of `blocks` earlier steps already sent to the shards.
    pub blocks_sent: usize,
    /// Positions whose KV computation has been scheduled since admission.
    pub computed: u32,
    /// Tokens to prefill in this admission: the prompt plus, after a preemption,
    /// everything generated before it.
    pub prefill_len: u32,
    /// Leading positions of this admission whose KV came from the prefix cache, and
    /// the blocks of `blocks` holding them.
    pub cached_len: u32,
    pub cached_blocks: usize,
    /// The shards hold this sequence's state (it was sent as a `NewSequence`).
    pub announced: bool,
    pub submitted_at: Instant,
    /// `Started` was sent.
    pub started: bool,
    /// Prompt logprobs gathered over prefill chunks, until sent as `Prefill`.
    pub prefill_logprobs: Vec<f32>,
    /// The first token was delivered (so `Prefill`, if any, went out before it).
    pub first_token_sent: bool,
    /// Tokens that steps in flight will sample for this admission: pipelined steps are
    /// planned before earlier steps' tokens arrive.
    pub pending_samples: u32,
    /// Counts admissions, so an answer meant for an earlier admission (before a
    /// preemption) is never applied to a later one.
    pub admission: u32,
    /// Steps of this sequence the device ran out of memory on (each one recomputed it).
    pub out_of_memory_steps: u32,
    /// Speculative decoding: whether a verification is in flight, and its pause.
    pub drafting: Drafting,
}

impl Sequence {
    pub fn new(id: u64, request: SequenceRequest, blocks: KvBlocks, now: Instant) -> Self {
        Self {
            id,
            request,
            generated: Vec::new(),
            blocks,
            blocks_sent: 0,
            computed: 0,
            prefill_len: 0,
            cached_len: 0,
            cached_blocks: 0,
            announced: false,
            submitted_at: now,
            started: false,
            prefill_logprobs: Vec::new(),
            first_token_sent: false,
            pending_samples: 0,
            admission: 0,
            out_of_memory_steps: 0,
            drafting: Drafting::default(),
        }
    }

    pub fn prompt_len(&self) -> u32 {
        self.request.input_ids.len() as u32
    }

    /// Prompt plus generated tokens.
    pub fn known_len(&self) -> u32 {
        self.prompt_len() + self.generated.len() as u32
    }

    /// Prompt then generated tokens (borrowed while nothing was generated).
    pub fn known_tokens(&self) -> Cow<'_, [u32]> {
        if self.generated.is_empty() {
            Cow::Borrowed(&self.request.input_ids)
        } else {
            let mut tokens = self.request.input_ids.clone();
            tokens.extend_from_slice(&self.generated);
            Cow::Owned(tokens)
        }
    }

    pub fn is_prefilling(&self) -> bool {
        self.computed < self.prefill_len
    }

    /// Decoding, with tokens left to ask for: the ones in flight do not reach
    /// `max_new_tokens` yet, counting every draft in flight as kept.
    pub fn wants_decode(&self) -> bool {
        !self.is_prefilling() && self.tokens_left() > 0
    }

    /// Tokens it may still generate beyond those in flight.
    pub fn tokens_left(&self) -> u32 {
        self.request
            .max_new_tokens
            .saturating_sub(self.generated.len() as u32)
            .saturating_sub(self.pending_samples)
    }

    pub fn prefill_remaining(&self) -> u32 {
        self.prefill_len.saturating_sub(self.computed)
    }

    /// Token positions the held blocks can take beyond what is already computed.
    pub fn spare_slots(&self, block_size: u32) -> u32 {
        (self.blocks.len() as u32 * block_size).saturating_sub(self.computed)
    }

    /// Prompt logprobs are wanted and the shards have not delivered them all yet.
    pub fn wants_prefill_logprobs(&self) -> bool {
        self.request.prefill_logprobs && !self.first_token_sent
    }

    /// Readies a (possibly preempted) waiting sequence to be sent afresh with `table`,
    /// whose first `cached_blocks` blocks hold the KV of its first `cached_len` tokens.
    pub fn admit(&mut self, table: KvBlocks, cached_len: u32, cached_blocks: usize) {
        debug_assert!(
            cached_len < self.known_len(),
            "the last token is always computed"
        );
        self.blocks = table;
        self.prefill_len = self.known_len();
        self.computed = cached_len;
        self.cached_len = cached_len;
        self.cached_blocks = cached_blocks;
        // The cached blocks travel in the `NewSequence`, the rest with the chunks.
        self.blocks_sent = cached_blocks;
        self.announced = false;
        self.pending_samples = 0;
        self.drafting.forget_in_flight();
        self.admission += 1;
    }

    /// Frees the KV blocks and forgets shard-side progress; generated tokens stay.
    pub fn reset_for_recompute(&mut self, empty_blocks: KvBlocks) {
        self.blocks = empty_blocks;
        self.blocks_sent = 0;
        self.computed = 0;
        self.prefill_len = 0;
        self.cached_len = 0;
        self.cached_blocks = 0;
        self.announced = false;
        self.pending_samples = 0;
        self.drafting.forget_in_flight();
        if !self.first_token_sent {
            self.prefill_logprobs.clear();
        }
    }

    /// The full description the shards get once per admission.
    pub fn new_sequence_message(&self) -> pb::NewSequence {
        pb::NewSequence {
            id: self.id,
            input_ids: self.known_tokens().into_owned(),
            prompt_len: self.prompt_len(),
            sampling: Some(self.request.sampling.clone()),
            cached_len: self.cached_len,
            block_ids: self.blocks.ids()[..self.cached_blocks].to_vec(),
            prefill_logprobs: self.wants_prefill_logprobs(),
            top_n_tokens: self.request.top_n_tokens,
            grammar: self.request.grammar.clone(),
        }
    }

    /// Schedules `num_tokens` more positions and returns the step's entry for them,
    /// carrying the blocks the shards have not seen yet.
    pub fn schedule(&mut self, num_tokens: u32) -> pb::ScheduledSequence {
        let sample = !self.is_prefilling() || self.computed + num_tokens == self.prefill_len;
        self.computed += num_tokens;
        self.pending_samples += u32::from(sample);
        let new_block_ids = self.blocks.ids()[self.blocks_sent..].to_vec();
        self.blocks_sent = self.blocks.len();
        pb::ScheduledSequence {
            id: self.id,
            num_tokens,
            new_block_ids,
            sample,
            max_draft_tokens: 0,
        }
    }

    /// Schedules a decode that may verify up to `drafts` drafts: positions and samples are
    /// counted for the most it can produce, and given back when its answer comes. So while a
    /// verification is in flight, `computed` is where the sequence is at most, and a step
    /// planned then reserves KV slots up to there.
    pub fn schedule_decode(&mut self, drafts: u32) -> pb::ScheduledSequence {
        debug_assert!(!self.is_prefilling() && drafts < self.tokens_left());
        let mut scheduled = self.schedule(1);
        if drafts == 0 {
            self.drafting.plain_decode();
            return scheduled;
        }
        self.computed += drafts;
        self.pending_samples += drafts;
        self.drafting.verification_planned();
        scheduled.max_draft_tokens = drafts;
        scheduled
    }

    /// A step's answer for this sequence's decode, planned with up to `max_drafts` drafts:
    /// `produced` tokens (1 + the drafts kept, at most 1 + `max_drafts`) came back, after the
    /// shard drafted `drafted`. The positions and samples held for the rest are given back.
    pub fn settle_decode(&mut self, max_drafts: u32, drafted: u32, produced: u32) {
        let unused = max_drafts + 1 - produced;
        self.pending_samples = self.pending_samples.saturating_sub(max_drafts + 1);
        if max_drafts > 0 {
            self.computed -= unused;
            self.drafting.record(drafted, produced - 1);
        }
    }
}
