//! Drives `SchedulerState` step by step against the protocol-checking `ShardSim`,
//! without tokio, collecting every event per sequence.
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use super::api::{FinishReason, SchedulerConfig, SequenceEvent, SequenceRequest, Submission};
use super::state::SchedulerState;
use super::test_support::{cached_config, config, request, token_at, ShardSim};
use crate::pb;

pub struct Harness {
    pub state: SchedulerState,
    pub sim: ShardSim,
    pub streams: HashMap<u64, super::SequenceStream>,
    /// Every event received so far, per sequence.
    seen: HashMap<u64, Vec<SequenceEvent>>,
    submitted: u64,
    /// Answers of steps sent in pipelined mode and not applied yet, oldest first.
    unapplied: VecDeque<pb::StepResponse>,
}

impl Harness {
    pub fn new(config: SchedulerConfig) -> Self {
        let sim = ShardSim::new(config.block_size, config.num_blocks);
        Self {
            state: SchedulerState::new(config),
            sim,
            streams: HashMap::new(),
            seen: HashMap::new(),
            submitted: 0,
            unapplied: VecDeque::new(),
        }
    }

    /// Queues `request` with its seed set to the id it gets, so that `token_at(id, ..)`
    /// predicts its tokens.
    pub fn submit(&mut self, mut request: SequenceRequest) -> u64 {
        let (events, stream) = super::event_channel();
        let expected_id = self.submitted;
        self.submitted += 1;
        request.sampling.seed = expected_id;
        let id = self
            .state
            .submit(Submission { request, events }, Instant::now())
            .expect("accepted");
        assert_eq!(id, expected_id, "ids are handed out in submission order");
        self.streams.insert(id, stream);
        id
    }

    /// One scheduler iteration against the simulated shard; returns what was sent.
    pub fn step(&mut self) -> Option<pb::StepRequest> {
        self.state.drop_cancelled();
        let planned = self.state.plan_step(Instant::now())?;
        self.state.deliver(planned.events);
        let response = self.sim.step(&planned.request);
        let deliveries = self.state.apply(response);
        self.state.deliver(deliveries);
        self.check_pool_accounting();
        self.collect();
        Some(planned.request)
    }

    /// One iteration of the real step loop: plans and sends until `depth` steps are in
    /// flight (the simulated shard runs each as it is sent, as the real one does), then
    /// applies the oldest answer. Returns the steps sent; false once idle.
    pub fn pipelined_step(&mut self, depth: usize, sent: &mut Vec<pb::StepRequest>) -> bool {
        self.state.drop_cancelled();
        while self.unapplied.len() < depth && self.state.may_plan_ahead() {
            let Some(planned) = self.state.plan_step(Instant::now()) else {
                break;
            };
            self.state.deliver(planned.events);
            self.unapplied.push_back(self.sim.step(&planned.request));
            sent.push(planned.request);
        }
        let Some(response) = self.unapplied.pop_front() else {
            return false;
        };
        let deliveries = self.state.apply(response);
        self.state.deliver(deliveries);
        self.check_pool_accounting();
        self.collect();
        true
    }

    /// Runs pipelined iterations until idle; returns every step sent.
    pub fn run_pipelined(&mut self, depth: usize, max_steps: usize) -> Vec<pb::StepRequest> {
        let mut sent = Vec::new();
        for _ in 0..max_steps {
            if !self.pipelined_step(depth, &mut sent) {
                return sent;
            }
        }
        panic!("not idle after {max_steps} pipelined iterations");
    }

    pub fn run_to_idle(&mut self, max_steps: usize) -> usize {
        for steps in 0..max_steps {
            if self.step().is_none() {
                return steps;
            }
        }
        panic!("not idle after {max_steps} steps");
    }

    pub fn collect(&mut self) {
        for (&id, stream) in &mut self.streams {
            while let Ok(event) = stream.try_recv() {
                self.seen.entry(id).or_default().push(event);
            }
        }
    }

    pub fn events(&self, id: u64) -> &[SequenceEvent] {
        self.seen.get(&id).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn tokens(&self, id: u64) -> Vec<u32> {
        self.events(id)
            .iter()
            .filter_map(|event| match event {
                SequenceEvent::Token(token) => Some(token.id),
                _ => None,
            })
            .collect()
    }

    pub fn finished(&self, id: u64) -> Option<(FinishReason, u32)> {
        self.events(id).iter().find_map(|event| match event {
            SequenceEvent::Finished {
                reason,
                generated_tokens,
            } => Some((*reason, *generated_tokens)),
            _ => None,
        })
    }

    /// Blocks in use are exactly the blocks running sequences or the prefix cache hold.
    pub fn check_pool_accounting(&self) {
        let mut held: HashSet<u32> = self
            .state
            .running
            .values()
            .flat_map(|s| s.blocks.ids().iter().copied())
            .collect();
        if let Some(cache) = &self.state.prefix_cache {
            cache.check_invariants();
            held.extend(cache.entries().into_iter().map(|(_, block)| block));
        }
        assert_eq!(self.state.allocator.used() as usize, held.len());
    }
}

/// The `i`-th request of the busy-pool tests: prompts from three families that share
/// prefixes (so the radix cache has something to find), with varied tails and lengths.
fn busy_prompt(i: u32) -> SequenceRequest {
    let mut tokens: Vec<u32> = (0..(3 + i % 4) * 2)
        .map(|t| 100 + t + 50 * (i % 3))
        .collect();
    tokens.extend((0..i % 5).map(|t| 1_000 + t + i));
    SequenceRequest {
        input_ids: tokens,
        ..request(1, 1 + (i * 7) % 9)
    }
}

/// A submitted request of the busy-pool scenario: (id, prompt length, max_new_tokens).
pub type Submitted = (u64, u32, u32);

/// The busy tiny-pool scenario: 30 requests over shared prefixes on a pool of 24 two-token
/// blocks (with or without the prefix cache), arriving while steps run, every seventh
/// client leaving early; `depth` steps in flight (1: one step at a time); the device runs
/// out of memory on the steps `out_of_memory_steps` names. Runs to idle.
pub fn busy_tiny_pool(
    cached: bool,
    depth: usize,
    out_of_memory_steps: &[u64],
) -> (Harness, Vec<Submitted>) {
    let cfg = if cached {
        cached_config(2, 24, 9)
    } else {
        config(2, 24, 9)
    };
    busy_tiny_pool_on(cfg, depth, out_of_memory_steps)
}

/// `busy_tiny_pool` under any scheduler configuration.
pub fn busy_tiny_pool_on(
    cfg: SchedulerConfig,
    depth: usize,
    out_of_memory_steps: &[u64],
) -> (Harness, Vec<Submitted>) {
    let mut h = Harness::new(cfg);
    h.sim.out_of_memory_steps.extend(out_of_memory_steps);
    let mut submitted = Vec::new();
    let mut sent = Vec::new();
    for i in 0..30u32 {
        let req = busy_prompt(i);
        let (len, new_tokens) = (req.input_ids.len() as u32, req.max_new_tokens);
        submitted.push((h.submit(req), len, new_tokens));
        if i % 3 == 0 {
            h.pipelined_step(depth, &mut sent);
        }
        if i % 7 == 6 {
            h.streams.remove(&u64::from(i - 1)); // the client of the previous one left
        }
    }
    h.run_pipelined(depth, 5_000);
    (h, submitted)
}

/// Every client that stayed got exactly its tokens and finished at its length.
pub fn assert_kept_streams_exact(h: &Harness, submitted: &[Submitted]) {
    for &(id, len, new_tokens) in submitted {
        if h.streams.contains_key(&id) {
            assert_eq!(
                h.tokens(id),
                expected_tokens(id, len, new_tokens),
                "sequence {id}"
            );
            assert_eq!(h.finished(id), Some((FinishReason::Length, new_tokens)));
        }
    }
}

pub fn expected_tokens(seed: u64, prompt_len: u32, count: u32) -> Vec<u32> {
    (0..count).map(|k| token_at(seed, prompt_len + k)).collect()
}

pub fn chunks(step: &pb::StepRequest) -> Vec<(u64, u32, bool)> {
    step.sequences
        .iter()
        .map(|s| (s.id, s.num_tokens, s.sample))
        .collect()
}
