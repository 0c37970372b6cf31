//! Lookup cost of the radix cache, shared by a unit test (which asserts a bound) and
//! `examples/radix_lookup.rs` (which writes the numbers under bench/results/).
//!
//! The tree is grown from documents that each reuse a random-length prefix of an
//! earlier one and continue with fresh tokens, so it has many splits and branches, as a
//! busy server's would. Lookups are prompts that share a long prefix with a cached
//! document and then diverge.
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{BlockAllocator, RadixCache};

#[derive(Debug, Clone, serde::Serialize)]
pub struct LookupReport {
    pub block_size: usize,
    pub prompt_tokens: usize,
    pub cached_blocks: usize,
    pub nodes_inserted: usize,
    pub lookups: usize,
    /// Mean tokens matched per lookup. Times are means per lookup, best of 5 rounds.
    pub hit_tokens_per_lookup: usize,
    /// Mean µs of `match_len` (read-only ranking lookup).
    pub match_len_us: f64,
    /// Mean µs of `match_prefix` plus dropping its references (the admission lookup);
    /// each query diverges inside a node, so each lookup also splits one.
    pub match_prefix_us: f64,
    /// The same lookups again, now ending on node boundaries (no splits).
    pub match_prefix_repeat_us: f64,
}

/// Builds a tree of at least `tree_blocks` blocks of `prompt_tokens`-token documents
/// and times lookups of `prompt_tokens`-token prompts against it.
pub fn measure(tree_blocks: usize, prompt_tokens: usize, block_size: usize) -> LookupReport {
    let mut rng = StdRng::seed_from_u64(6);
    let pool = BlockAllocator::new((tree_blocks + 2 * prompt_tokens / block_size + 16) as u32);
    let mut cache = RadixCache::new(pool.clone(), block_size as u32);
    let mut documents: Vec<Vec<u32>> = Vec::new();
    while cache.cached_blocks() < tree_blocks {
        let document = derived_prompt(&mut rng, &documents, prompt_tokens, block_size);
        let mut table = cache.match_prefix(&document).blocks;
        let fresh = document.len().div_ceil(block_size) - table.len();
        table.grow(fresh).expect("pool sized for the tree");
        cache.insert(&document, &table, document.len());
        documents.push(document);
    }

    // Best of several rounds of fresh queries: the bound is about the lookup, not
    // about whatever else shares the CPU at that moment.
    let (rounds, per_round) = (5, 400);
    let (mut match_len_us, mut match_prefix_us, mut match_prefix_repeat_us) =
        (f64::MAX, f64::MAX, f64::MAX);
    let mut hit_tokens = 0;
    for _ in 0..rounds {
        let queries: Vec<Vec<u32>> = (0..per_round)
            .map(|_| derived_prompt(&mut rng, &documents, prompt_tokens, block_size))
            .collect();
        let started = Instant::now();
        for query in &queries {
            hit_tokens += cache.match_len(query);
        }
        match_len_us = match_len_us.min(mean_us(started, per_round));
        for repeat in [false, true] {
            let started = Instant::now();
            for query in &queries {
                let hit = cache.match_prefix(query);
                std::hint::black_box(&hit);
            }
            let us = mean_us(started, per_round);
            if repeat {
                match_prefix_repeat_us = match_prefix_repeat_us.min(us);
            } else {
                match_prefix_us = match_prefix_us.min(us);
            }
        }
    }
    let lookups = rounds * per_round;
    LookupReport {
        block_size,
        prompt_tokens,
        cached_blocks: cache.cached_blocks(),
        nodes_inserted: documents.len(),
        lookups,
        hit_tokens_per_lookup: hit_tokens / lookups,
        match_len_us,
        match_prefix_us,
        match_prefix_repeat_us,
    }
}

fn mean_us(started: Instant, count: usize) -> f64 {
    started.elapsed().as_secs_f64() * 1e6 / count as f64
}

/// A prompt that repeats between half and all of an earlier document, then goes its
/// own way (random tokens from a 32k vocabulary).
fn derived_prompt(
    rng: &mut StdRng,
    documents: &[Vec<u32>],
    len: usize,
    block_size: usize,
) -> Vec<u32> {
    let mut prompt = Vec::with_capacity(len);
    if !documents.is_empty() {
        let source = &documents[rng.random_range(0..documents.len())];
        let blocks = len / block_size;
        let shared = rng.random_range(blocks / 2..=blocks) * block_size;
        prompt.extend_from_slice(&source[..shared.min(source.len())]);
    }
    while prompt.len() < len {
        prompt.push(rng.random_range(0..32_000));
    }
    prompt
}
