//! Test helpers: a simulated shard that checks the step protocol and answers with
//! deterministic tokens, plus small builders.
use std::collections::HashMap;

use super::api::{SchedulerConfig, SequenceRequest};
use crate::pb;

pub fn config(block_size: u32, num_blocks: u32, max_tokens: u32) -> SchedulerConfig {
    SchedulerConfig {
        block_size,
        num_blocks,
        max_batch_prefill_tokens: max_tokens,
        max_batch_size: None,
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
    }
}

/// The token the simulated shard samples for a sequence with `seed` at `position`.
/// Like the real shard's draw, it does not depend on batching or preemption.
pub fn token_at(seed: u64, position: u32) -> u32 {
    ((seed as u32).wrapping_mul(7919) ^ position.wrapping_mul(104_729)) % 50_000 + 1_000
}

/// The logprob the simulated shard reports for prompt token `index`.
pub fn prompt_logprob(index: u32) -> f32 {
    -(index as f32) / 8.0
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
    block_owner: HashMap<u32, u64>,
    next_step_id: u64,
    /// Sequences announced over the sim's life, by id (counts re-announcements).
    pub announcements: HashMap<u64, u32>,
    pub steps: u64,
}

impl ShardSim {
    pub fn new(block_size: u32, num_blocks: u32) -> Self {
        Self {
            block_size,
            num_blocks,
            sequences: HashMap::new(),
            block_owner: HashMap::new(),
            next_step_id: 0,
            announcements: HashMap::new(),
            steps: 0,
        }
    }

    pub fn live_sequences(&self) -> usize {
        self.sequences.len()
    }

    pub fn live_blocks(&self) -> usize {
        self.block_owner.len()
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
            if let Some(sequence) = self.sequences.remove(id) {
                for block in sequence.blocks {
                    self.block_owner.remove(&block);
                }
            }
        }
        for new in &request.new_sequences {
            assert!(
                !self.sequences.contains_key(&new.id),
                "sequence {} announced twice",
                new.id
            );
            assert!(new.prompt_len as usize <= new.input_ids.len());
            *self.announcements.entry(new.id).or_default() += 1;
            self.sequences.insert(
                new.id,
                SimSequence {
                    tokens: new.input_ids.clone(),
                    prompt_len: new.prompt_len,
                    seed: new.sampling.as_ref().map_or(0, |s| s.seed),
                    computed: 0,
                    blocks: Vec::new(),
                    prefill_logprobs: new.prefill_logprobs,
                },
            );
        }
        let mut outputs = Vec::new();
        for scheduled in &request.sequences {
            outputs.extend(self.run_sequence(scheduled));
        }
        pb::StepResponse {
            step_id: request.step_id,
            outputs,
            forward_ns: 1,
            sample_ns: 1,
        }
    }

    fn run_sequence(&mut self, scheduled: &pb::ScheduledSequence) -> Option<pb::SequenceOutput> {
        let id = scheduled.id;
        let sequence = self
            .sequences
            .get_mut(&id)
            .expect("scheduled sequence is unknown");
        for &block in &scheduled.new_block_ids {
            assert!(block < self.num_blocks, "block {block} out of range");
            let previous = self.block_owner.insert(block, id);
            assert!(
                previous.is_none(),
                "block {block} given to {id} while {previous:?} holds it"
            );
            sequence.blocks.push(block);
        }
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
        sequence.computed = end;
        let prefill_logprobs: Vec<f32> = if sequence.prefill_logprobs {
            (start..end)
                .filter(|p| p + 1 < sequence.prompt_len)
                .map(|p| prompt_logprob(p + 1))
                .collect()
        } else {
            Vec::new()
        };
        let token = if scheduled.sample {
            assert_eq!(
                end as usize,
                sequence.tokens.len(),
                "sampling before the prefill ended"
            );
            let id_token = token_at(sequence.seed, end);
            sequence.tokens.push(id_token);
            Some(pb::Token {
                id: id_token,
                logprob: -0.5,
                top_ids: vec![],
                top_logprobs: vec![],
            })
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
        })
    }
}

/// A metrics recorder that keeps counters and histogram samples, for
/// `metrics::with_local_recorder` around synchronous scheduler code.
#[derive(Default)]
pub struct CapturedMetrics {
    counters: std::sync::Mutex<HashMap<String, std::sync::Arc<std::sync::atomic::AtomicU64>>>,
    histograms: std::sync::Mutex<HashMap<String, std::sync::Arc<Samples>>>,
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

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
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
