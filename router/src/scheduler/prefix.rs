//! The scheduler's use of the radix prefix cache: looking a waiting sequence up,
//! caching what a sequence computed, and evicting when the free pool runs short.
//!
//! Cached KV may still be being written by a step in flight: the shards run steps in
//! the order they were sent, so any step that reads it comes later. Only known tokens
//! are cached (a pipelined decode computes a position whose token the router has not
//! seen yet), and a failed step clears the whole cache.
use std::borrow::Cow;

use super::admission::Candidate;
use super::sequence::Sequence;
use super::state::SchedulerState;
use crate::kv::{PrefixMatch, RadixCache};
use crate::metrics::names;

/// Whether a sequence may start from cached KV. Prompt logprobs need every prompt
/// position computed, so `decoder_input_details` bypasses the cache (until its first
/// token is out: a preempted one may then reuse its own prefix).
fn may_use_cache(sequence: &Sequence) -> bool {
    !sequence.wants_prefill_logprobs()
}

/// A cache key's tag for KV rotated with LongRoPE's long factors, in a bit no token id
/// reaches (validation bounds prompt ids by the vocabulary; the shards sample inside it).
const LONG_ROTATION: u32 = 1 << 31;

/// The cache key of a sequence's known tokens: the tokens themselves, unless LongRoPE rotates
/// the sequence with its long factors at every position (a prompt longer than `long_rope`, the
/// shards' `long_rope_prompt_tokens`; None: no LongRoPE). Then each token is tagged, so such
/// prompts share KV with one another and never with a shorter prompt's over the same tokens.
fn cache_key(sequence: &Sequence, long_rope: Option<u32>) -> Cow<'_, [u32]> {
    let tokens = sequence.known_tokens();
    if long_rope.is_none_or(|limit| sequence.prompt_len() <= limit) {
        return tokens;
    }
    debug_assert!(tokens.iter().all(|&token| token < LONG_ROTATION));
    Cow::Owned(tokens.iter().map(|&token| token | LONG_ROTATION).collect())
}

/// The tokens a lookup may match: all but the last known one, which is always computed
/// so that the step has logits to sample from.
fn lookup_tokens(tokens: &[u32]) -> &[u32] {
    &tokens[..tokens.len().saturating_sub(1)]
}

/// The cached prefix of `sequence`, with references taken (None: cache off or bypassed).
pub(super) fn lookup(
    cache: Option<&mut RadixCache>,
    sequence: &Sequence,
    long_rope: Option<u32>,
) -> Option<PrefixMatch> {
    let cache = cache?;
    if !may_use_cache(sequence) {
        return None;
    }
    Some(cache.match_prefix(lookup_tokens(&cache_key(sequence, long_rope))))
}

fn insert_computed(cache: &mut RadixCache, sequence: &Sequence, long_rope: Option<u32>) {
    let key = cache_key(sequence, long_rope);
    let computed = (sequence.computed as usize).min(key.len());
    cache.insert(
        &key[..computed],
        &sequence.blocks,
        sequence.prompt_len() as usize,
    );
}

/// What an admission got from the cache, for the metrics.
#[derive(Debug, Clone, Copy)]
pub(super) struct CacheHit {
    pub tokens: usize,
    /// Of `tokens`, those that an earlier request generated (e.g. a previous answer).
    pub generated_tokens: usize,
}

/// Counts an admission's lookup: tokens queried and tokens served from the cache.
pub(super) fn record_lookup(queried: usize, hit: &CacheHit) {
    metrics::counter!(names::PREFIX_CACHE_QUERIES_TOKENS_TOTAL).increment(queried as u64);
    metrics::counter!(names::PREFIX_CACHE_HITS_TOKENS_TOTAL).increment(hit.tokens as u64);
    metrics::counter!(names::PREFIX_CACHE_HITS_GENERATED_TOKENS_TOTAL)
        .increment(hit.generated_tokens as u64);
}

impl SchedulerState {
    /// What the admission policy needs to know about each waiting sequence.
    pub(super) fn admission_candidates(&self, now: std::time::Instant) -> Vec<Candidate> {
        let window = super::admission::RANKED_WINDOW;
        let long_rope = self.config.long_rope_prompt_tokens;
        self.waiting
            .iter()
            .enumerate()
            .map(|(position, sequence)| {
                let cached_tokens = match &self.prefix_cache {
                    Some(cache) if position < window && may_use_cache(sequence) => {
                        cache.match_len(lookup_tokens(&cache_key(sequence, long_rope)))
                    }
                    _ => 0,
                };
                Candidate {
                    id: sequence.id,
                    preempted: sequence.started,
                    waited: now.saturating_duration_since(sequence.submitted_at),
                    cached_tokens,
                }
            })
            .collect()
    }

    /// Caches the whole blocks `sequence` has computed (prompt and generated tokens).
    pub(super) fn cache_computed(&mut self, sequence: &Sequence) {
        if let Some(cache) = self.prefix_cache.as_mut() {
            insert_computed(cache, sequence, self.config.long_rope_prompt_tokens);
        }
    }

    /// Caches the progress of a running sequence (after a step computed a chunk of it).
    pub(super) fn cache_running(&mut self, id: u64) {
        if let (Some(cache), Some(sequence)) = (self.prefix_cache.as_mut(), self.running.get(&id)) {
            insert_computed(cache, sequence, self.config.long_rope_prompt_tokens);
        }
    }

    /// Makes `blocks` free blocks available, evicting unused cached prefixes if the
    /// free pool is short. Returns whether there are enough now.
    pub(super) fn ensure_free(&mut self, blocks: u64) -> bool {
        let free = u64::from(self.allocator.free());
        if free < blocks {
            if let Some(cache) = self.prefix_cache.as_mut() {
                let evicted = cache.evict((blocks - free) as usize);
                if evicted > 0 {
                    metrics::counter!(names::PREFIX_CACHE_EVICTED_BLOCKS_TOTAL)
                        .increment(evicted as u64);
                }
            }
        }
        u64::from(self.allocator.free()) >= blocks
    }

    /// Blocks held by the prefix cache (0 when it is off).
    pub fn cached_blocks(&self) -> usize {
        self.prefix_cache
            .as_ref()
            .map_or(0, RadixCache::cached_blocks)
    }

    /// Blocks held only by the prefix cache (evictable); 0 without prefix caching.
    pub fn cache_only_blocks(&self) -> usize {
        self.prefix_cache
            .as_ref()
            .map_or(0, RadixCache::sole_held_blocks)
    }
}
