//! Test helpers: a simulated shard that checks the step protocol and answers with
//! deterministic tokens, plus small builders.
use std::collections::{HashMap, HashSet};

use super::admission::AdmissionPolicy;
use super::api::{SchedulerConfig, SequenceRequest};
use crate::pb;

pub fn config(block_size: u32, num_blocks: u32, max_tokens: u32) -> SchedulerConfig {
    SchedulerConfig {
        block_size,
        num_blocks,
        max_batch_prefill_tokens: max_tokens,
        max_batch_size: None,
        prefix_caching: false,
        long_rope_prompt_tokens: None,
        admission_policy: AdmissionPolicy::Fifo,
        admission_age_cap: std::time::Duration::from_secs(5),
        max_stream_backlog: 1 << 20,
        num_draft_tokens: 0,
        prefill_pacing: None,
    }
}

/// `config` with the prefix cache on and longest-prefix-first admission.
pub fn cached_config(block_size: u32, num_blocks: u32, max_tokens: u32) -> SchedulerConfig {
    SchedulerConfig {
        prefix_caching: true,
        admission_policy: AdmissionPolicy::LongestPrefix,
        ..config(block_size, num_blocks, max_tokens)
    }
}

/// A greedy request with prompt tokens `100, 101, ...`.
pub fn request(prompt_len: u32, max_new_tokens: u32) -> SequenceRequest {
    SequenceRequest {
        input_ids: (100..100 + prompt_len).collect(),
        sampling: pb::SamplingParameters::default(),
        max_new_tokens,
        stop_token_ids: Vec::new(),
        prefill_logprobs: false,
        top_n_tokens: 0,
        grammar: None,
        trace: None,
    }
}

/// The token the simulated shard samples for a sequence with `seed` at `position`.
/// Like the real shard's draw, it does not depend on batching or preemption.
pub fn token_at(seed: u64, position: u32) -> u32 {
    ((seed as u32).wrapping_mul(7919) ^ position.wrapping_mul(104_729)) % 50_000 + 1_000
}

/// What the simulated shard does with a decode allowed `max_drafts` drafts at `position`
/// (the index of its first new token): (drafted, kept). Deterministic, and it covers
/// nothing drafted, every draft rejected, some kept and all kept.
pub fn drafts_at(seed: u64, position: u32, max_drafts: u32) -> (u32, u32) {
    let mix = (seed as u32)
        .wrapping_mul(31)
        .wrapping_add(position.wrapping_mul(17));
    let drafted = if mix.is_multiple_of(5) { 0 } else { max_drafts };
    (drafted, (mix / 5) % (drafted + 1))
}

/// The logprob the simulated shard reports for prompt token `index`.
pub fn prompt_logprob(index: u32) -> f32 {
    -(index as f32) / 8.0
}

/// Identity of the KV at a position: a hash of every token up to and including it.
/// Equal identities mean equal KV, which is what a cached block must hold.
fn prefix_identities(tokens: &[u32]) -> Vec<u64> {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    tokens
        .iter()
        .map(|&token| {
            hash = (hash ^ u64::from(token)).wrapping_mul(0x0100_0000_01b3);
            hash
        })
        .collect()
}

#[derive(Debug)]
struct SimSequence {
    tokens: Vec<u32>,
    prompt_len: u32,
    seed: u64,
    computed: u32,
    blocks: Vec<u32>,
    prefill_logprobs: bool,
}

/// A shard that keeps the per-sequence state table the protocol describes and panics
/// on any step that breaks the protocol.
#[derive(Debug)]
pub struct ShardSim {
    block_size: u32,
    num_blocks: u32,
    sequences: HashMap<u64, SimSequence>,
    /// Live sequences whose block table lists each block.
    block_holders: HashMap<u32, Vec<u64>>,
    /// What each KV slot holds (see `prefix_identities`); survives releases, like
    /// the shard's KV tensors do.
    slots: HashMap<u32, Vec<Option<u64>>>,
    /// Positions announced as cached (`cached_len`) and verified.
    pub cached_positions: u64,
    next_step_id: u64,
    /// Sequences announced over the sim's life, by id (counts re-announcements).
    pub announcements: HashMap<u64, u32>,
    pub steps: u64,
    /// Steps (by id) the device "runs out of memory" on, as the shard answers them: nothing
    /// written, every sequence scheduled dropped and skipped by later steps until released.
    pub out_of_memory_steps: HashSet<u64>,
    /// Steps carrying more prompt tokens than this run out of memory too (activations
    /// grow with them). A sequence scheduled for more tokens than a decode with its
    /// drafts carries prompt tokens.
    pub out_of_memory_above: Option<u32>,
    failed: HashSet<u64>,
}

impl ShardSim {
    pub fn new(block_size: u32, num_blocks: u32) -> Self {
        Self {
            block_size,
            num_blocks,
            sequences: HashMap::new(),
            block_holders: HashMap::new(),
            slots: HashMap::new(),
            cached_positions: 0,
            next_step_id: 0,
            announcements: HashMap::new(),
            steps: 0,
            out_of_memory_steps: HashSet::new(),
            out_of_memory_above: None,
            failed: HashSet::new(),
        }
    }

    pub fn live_sequences(&self) -> usize {
        self.sequences.len()
    }

    pub fn live_blocks(&self) -> usize {
        self.block_holders.len()
    }

    fn hold(&mut self, block: u32, id: u64) {
        self.block_holders.entry(block).or_default().push(id);
    }

    /// Checks that the KV of `tokens[..cached_len]` really is in `blocks`.
    fn check_cached(&self, id: u64, tokens: &[u32], cached_len: u32, blocks: &[u32]) {
        let identities = prefix_identities(tokens);
        for position in 0..cached_len as usize {
            let block = blocks[position / self.block_size as usize];
            let slot = self
                .slots
                .get(&block)
                .and_then(|slots| slots[position % self.block_size as usize]);
            assert_eq!(
                slot,
                Some(identities[position]),
                "sequence {id}: cached position {position} (block {block}) holds other KV"
            );
        }
    }

    /// Skips a step id (the router sent it but it never arrived here).
    pub fn lose_step(&mut self) {
        self.next_step_id += 1;
    }

    pub fn step(&mut self, request: &pb::StepRequest) -> pb::StepResponse {
        assert_eq!(
            request.step_id, self.next_step_id,
            "step ids must increase by one"
        );
        self.next_step_id += 1;
        self.steps += 1;
        for id in &request.released_ids {
            // Unknown ids are tolerated: the router cannot tell whether a failed step
            // reached the shard.
            self.failed.remove(id);
            self.drop_sequence(*id);
        }
        for new in &request.new_sequences {
            assert!(
                !self.sequences.contains_key(&new.id),
                "sequence {} announced twice",
                new.id
            );
            assert!(new.prompt_len as usize <= new.input_ids.len());
            *self.announcements.entry(new.id).or_default() += 1;
            assert!(
                (new.cached_len as usize) < new.input_ids.len(),
                "the last known token must be computed"
            );
            assert_eq!(
                new.block_ids.len() as u32,
                new.cached_len.div_ceil(self.block_size),
                "cached blocks hold exactly the cached prefix"
            );
            self.check_cached(new.id, &new.input_ids, new.cached_len, &new.block_ids);
            self.cached_positions += u64::from(new.cached_len);
            for &block in &new.block_ids {
                self.hold(block, new.id);
            }
            self.sequences.insert(
                new.id,
                SimSequence {
                    tokens: new.input_ids.clone(),
                    prompt_len: new.prompt_len,
                    seed: new.sampling.as_ref().map_or(0, |s| s.seed),
                    computed: new.cached_len,
                    blocks: new.block_ids.clone(),
                    prefill_logprobs: new.prefill_logprobs,
                },
            );
        }
        let prompt_tokens: u32 = request
            .sequences
            .iter()
            .filter(|s| s.num_tokens > 1 + s.max_draft_tokens)
            .map(|s| s.num_tokens)
            .sum();
        let too_large = self
            .out_of_memory_above
            .is_some_and(|limit| prompt_tokens > limit);
        let out_of_memory = (self.out_of_memory_steps.contains(&request.step_id) || too_large)
            && !request.sequences.is_empty();
        let mut outputs = Vec::new();
        for scheduled in &request.sequences {
            if self.failed.contains(&scheduled.id) {
                continue; // planned before the router heard
            }
            if out_of_memory {
                self.fail(scheduled);
            } else {
                outputs.extend(self.run_sequence(scheduled));
            }
        }
        pb::StepResponse {
            step_id: request.step_id,
            outputs,
            out_of_memory,
            forward_ns: 1,
            sample_ns: 1,
            device_ns: 0,
            mask_ns: 0,
            draft_ns: 0,
            input_wait_ns: 0,
        }
    }

    /// Forgets a sequence and its hold on its blocks (their KV stays, as on a shard).
    fn drop_sequence(&mut self, id: u64) {
        let Some(sequence) = self.sequences.remove(&id) else {
            return;
        };
        for block in sequence.blocks {
            let holders = self.block_holders.get_mut(&block).expect("held");
            holders.retain(|holder| *holder != id);
            if holders.is_empty() {
                self.block_holders.remove(&block);
            }
        }
    }

    /// A sequence of a step that ran out of memory: dropped, nothing of the step written
    /// (its new blocks are never held), skipped until the router releases it.
    fn fail(&mut self, scheduled: &pb::ScheduledSequence) {
        assert!(
            self.sequences.contains_key(&scheduled.id),
            "scheduled sequence is unknown"
        );
        self.drop_sequence(scheduled.id);
        self.failed.insert(scheduled.id);
    }

    fn run_sequence(&mut self, scheduled: &pb::ScheduledSequence) -> Option<pb::SequenceOutput> {
        let id = scheduled.id;
        assert!(
            self.sequences.contains_key(&id),
            "scheduled sequence is unknown"
        );
        for &block in &scheduled.new_block_ids {
            assert!(block < self.num_blocks, "block {block} out of range");
            let holders = self.block_holders.get(&block);
            assert!(
                holders.is_none(),
                "fresh block {block} given to {id} while {holders:?} hold it"
            );
            self.hold(block, id);
        }
        let sequence = self.sequences.get_mut(&id).expect("checked above");
        sequence.blocks.extend(&scheduled.new_block_ids);
        assert!(scheduled.num_tokens > 0, "empty chunk");
        let start = sequence.computed;
        let end = start + scheduled.num_tokens;
        assert!(
            end as usize <= sequence.tokens.len(),
            "computing tokens nobody knows yet"
        );
        assert!(
            end <= sequence.blocks.len() as u32 * self.block_size,
            "KV slots missing"
        );
        let k = scheduled.max_draft_tokens;
        let (drafted, kept) = if k > 0 {
            assert!(
                scheduled.num_tokens == 1 && scheduled.sample,
                "drafts need a decode"
            );
            assert!(
                end + k <= sequence.blocks.len() as u32 * self.block_size,
                "KV slots missing for the drafts"
            );
            drafts_at(sequence.seed, end, k)
        } else {
            (0, 0)
        };
        // A verification's tokens are the plain decodes' tokens at their positions: the
        // kept drafts, then the target's own. Known before the KV is written, so that the
        // kept drafts' slots get their true identity and the rejected ones a false one.
        let produced: Vec<u32> = if scheduled.sample && end as usize == sequence.tokens.len() {
            (0..=kept)
                .map(|j| token_at(sequence.seed, end + j))
                .collect()
        } else {
            Vec::new()
        };
        let mut future = sequence.tokens.clone();
        future.extend(&produced);
        sequence.computed = end + kept;
        // Write the KV of positions start..end (and of the drafts); nobody else may be
        // reading those blocks.
        let identities = prefix_identities(&future);
        let block_size = self.block_size as usize;
        for position in start as usize..(end + drafted) as usize {
            let block = sequence.blocks[position / block_size];
            assert_eq!(
                self.block_holders[&block],
                vec![id],
                "sequence {id} writes into block {block}, which others hold"
            );
            let slots = self
                .slots
                .entry(block)
                .or_insert_with(|| vec![None; block_size]);
            let rejected_draft = position >= (end + kept) as usize;
            slots[position % block_size] = Some(if rejected_draft {
                !identities[position.min(identities.len() - 1)]
            } else {
                identities[position]
            });
        }
        let prefill_logprobs: Vec<f32> = if sequence.prefill_logprobs {
            (start..end)
                .filter(|p| p + 1 < sequence.prompt_len)
                .map(|p| prompt_logprob(p + 1))
                .collect()
        } else {
            Vec::new()
        };
        let mut tokens = produced.iter().map(|&id| pb::Token {
            id,
            logprob: -0.5,
            top_ids: vec![],
            top_logprobs: vec![],
        });
        let token = if scheduled.sample {
            assert_eq!(
                end as usize,
                sequence.tokens.len(),
                "sampling before the prefill ended"
            );
            sequence.tokens.extend(&produced);
            tokens.next()
        } else {
            assert!(
                (end as usize) < sequence.tokens.len(),
                "a finished prefill must sample"
            );
            None
        };
        (token.is_some() || !prefill_logprobs.is_empty()).then_some(pb::SequenceOutput {
            id,
            token,
            prefill_logprobs,
            error: String::new(),
            next_tokens: tokens.collect(),
            drafted,
        })
    }
}

/// A metrics recorder that keeps counters, gauges and histogram samples, for
/// `metrics::with_local_recorder` around synchronous scheduler code.
#[derive(Default)]
pub struct CapturedMetrics {
    counters: std::sync::Mutex<HashMap<String, std::sync::Arc<std::sync::atomic::AtomicU64>>>,
    gauges: std::sync::Mutex<HashMap<String, std::sync::Arc<GaugeValue>>>,
    histograms: std::sync::Mutex<HashMap<String, std::sync::Arc<Samples>>>,
}

#[derive(Default)]
pub struct GaugeValue(std::sync::Mutex<f64>);

impl metrics::GaugeFn for GaugeValue {
    fn increment(&self, value: f64) {
        *self.0.lock().unwrap() += value;
    }
    fn decrement(&self, value: f64) {
        *self.0.lock().unwrap() -= value;
    }
    fn set(&self, value: f64) {
        *self.0.lock().unwrap() = value;
    }
}

#[derive(Default)]
pub struct Samples(std::sync::Mutex<Vec<f64>>);

impl metrics::HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

impl CapturedMetrics {
    pub fn counter(&self, name: &str) -> u64 {
        let counters = self.counters.lock().unwrap();
        counters
            .get(name)
            .map_or(0, |c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub fn gauge(&self, name: &str) -> f64 {
        let gauges = self.gauges.lock().unwrap();
        gauges.get(name).map_or(0.0, |g| *g.0.lock().unwrap())
    }

    pub fn samples(&self, name: &str) -> Vec<f64> {
        let histograms = self.histograms.lock().unwrap();
        histograms
            .get(name)
            .map_or_else(Vec::new, |h| h.0.lock().unwrap().clone())
    }
}

impl metrics::Recorder for CapturedMetrics {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let mut counters = self.counters.lock().unwrap();
        let counter = counters.entry(key.name().to_string()).or_default();
        metrics::Counter::from_arc(counter.clone())
    }

    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        let mut gauges = self.gauges.lock().unwrap();
        let gauge = gauges.entry(key.name().to_string()).or_default();
        metrics::Gauge::from_arc(gauge.clone())
    }

    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        let mut histograms = self.histograms.lock().unwrap();
        let histogram = histograms.entry(key.name().to_string()).or_default();
        metrics::Histogram::from_arc(histogram.clone())
    }
}
