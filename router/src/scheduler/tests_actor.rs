//! The real step loop end to end, driven by a fake executor around the simulated shard.
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::api::{
    FinishReason, SchedulerConfig, SchedulerHandle, SequenceEvent, StepError, StepExecutor,
};
use super::state::SchedulerState;
use super::test_support::{config, request, token_at, ShardSim};
use crate::kv::BlockAllocator;
use crate::pb;

/// Runs steps on a `ShardSim`; steps whose id is in `fail_steps` fail before they
/// reach it, like a lost shard connection.
#[derive(Clone)]
struct FakeExecutor {
    sim: Arc<Mutex<ShardSim>>,
    fail_steps: Arc<HashSet<u64>>,
    /// Steps sent and not yet answered, and the most there ever were.
    in_flight: Arc<AtomicUsize>,
    peak_in_flight: Arc<AtomicUsize>,
}

impl FakeExecutor {
    fn new(sim: Arc<Mutex<ShardSim>>, fail_steps: &[u64]) -> Self {
        Self {
            sim,
            fail_steps: Arc::new(fail_steps.iter().copied().collect()),
            in_flight: Arc::default(),
            peak_in_flight: Arc::default(),
        }
    }
}

impl StepExecutor for FakeExecutor {
    /// Runs the step on the simulated shard at once, as the gRPC executor sends it at once:
    /// pipelined steps reach the shard in the order they were planned.
    fn step(
        &self,
        request: pb::StepRequest,
    ) -> impl std::future::Future<Output = Result<pb::StepResponse, StepError>> + Send {
        let answer = {
            let mut sim = self.sim.lock().unwrap();
            if self.fail_steps.contains(&request.step_id) {
                sim.lose_step();
                Err(StepError::new(
                    Some(0),
                    super::FailureKind::ShardReported,
                    format!("shard 0 failed step {}", request.step_id),
                ))
            } else {
                Ok(sim.step(&request))
            }
        };
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        let in_flight = self.in_flight.clone();
        async move {
            // Let clients run between steps, so cancellations land mid-generation.
            tokio::task::yield_now().await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            answer
        }
    }
}

struct Fixture {
    handle: SchedulerHandle,
    sim: Arc<Mutex<ShardSim>>,
    pool: BlockAllocator,
    peak_in_flight: Arc<AtomicUsize>,
}

fn start(config: SchedulerConfig, fail_steps: &[u64]) -> Fixture {
    let sim = Arc::new(Mutex::new(ShardSim::new(
        config.block_size,
        config.num_blocks,
    )));
    let state = SchedulerState::new(config);
    let pool = state.allocator().clone();
    let executor = FakeExecutor::new(sim.clone(), fail_steps);
    let peak_in_flight = executor.peak_in_flight.clone();
    Fixture {
        handle: super::start(state, executor),
        sim,
        pool,
        peak_in_flight,
    }
}

impl Fixture {
    /// Waits until the shard dropped every sequence and the pool is whole again.
    async fn wait_drained(&self) {
        for _ in 0..1_000 {
            if self.sim.lock().unwrap().live_sequences() == 0 && self.pool.used() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("pool not drained: {} blocks used", self.pool.used());
    }
}

/// Deterministic pseudo-random numbers, so failures reproduce.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % u64::from(bound)) as u32
    }
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Completed(Vec<u32>),
    Failed(String),
    Cancelled,
}

/// Submits one greedy request and reads its stream, checking the event order. With
/// `cancel_after`, drops the stream after that many tokens.
async fn client(
    handle: SchedulerHandle,
    seed: u64,
    prompt_len: u32,
    max_new_tokens: u32,
    cancel_after: Option<usize>,
) -> Outcome {
    let mut req = request(prompt_len, max_new_tokens);
    req.sampling.seed = seed;
    let mut stream = handle.submit(req).expect("scheduler running");
    let mut tokens = Vec::new();
    let mut started = false;
    while let Some(event) = stream.recv().await {
        match event {
            SequenceEvent::Started { .. } => {
                assert!(!started && tokens.is_empty(), "Started comes once, first");
                started = true;
            }
            SequenceEvent::Prefill { .. } => panic!("no prefill logprobs were asked for"),
            SequenceEvent::Token(token) => {
                assert!(started);
                tokens.push(token.id);
                if cancel_after == Some(tokens.len()) {
                    return Outcome::Cancelled;
                }
            }
            SequenceEvent::Finished {
                reason,
                generated_tokens,
            } => {
                assert_eq!(reason, FinishReason::Length);
                assert_eq!(generated_tokens as usize, tokens.len());
                assert!(stream.recv().await.is_none(), "nothing follows Finished");
                return Outcome::Completed(tokens);
            }
            SequenceEvent::Error(failure) => return Outcome::Failed(failure.message),
            SequenceEvent::Refused(message) => return Outcome::Failed(message),
        }
    }
    panic!("stream closed without Finished or Error");
}

fn expected(seed: u64, prompt_len: u32, count: u32) -> Vec<u32> {
    (0..count).map(|k| token_at(seed, prompt_len + k)).collect()
}

async fn with_deadline<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("scheduler deadlocked")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_random_sequences_on_a_tiny_pool_all_finish() {
    // 24 blocks of 4 = 96 slots; the largest request needs 40 + 40 - 1 = 79.
    let fixture = start(config(4, 24, 16), &[]);
    let mut rng = Lcg(7);
    let mut clients = Vec::new();
    for seed in 0..80u64 {
        let (prompt, new_tokens) = (1 + rng.below(40), 1 + rng.below(40));
        let handle = fixture.handle.clone();
        let task = tokio::spawn(client(handle, seed, prompt, new_tokens, None));
        clients.push((seed, prompt, new_tokens, task));
    }
    for (seed, prompt, new_tokens, task) in clients {
        let outcome = with_deadline(task).await.unwrap();
        assert_eq!(
            outcome,
            Outcome::Completed(expected(seed, prompt, new_tokens)),
            "seed {seed}"
        );
    }
    fixture.wait_drained().await;
    let sim = fixture.sim.lock().unwrap();
    assert_eq!(sim.live_blocks(), 0);
    let recomputed = sim
        .announcements
        .values()
        .filter(|&&count| count > 1)
        .count();
    assert!(
        recomputed > 0,
        "the pool is small enough that preemption must happen"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_streams_give_their_blocks_back() {
    let fixture = start(config(4, 16, 32), &[]);
    let mut clients = Vec::new();
    for seed in 0..20u64 {
        let cancel = (seed % 3 == 0).then_some(1 + seed as usize % 5);
        let task = tokio::spawn(client(fixture.handle.clone(), seed, 6, 20, cancel));
        clients.push((seed, cancel, task));
    }
    for (seed, cancel, task) in clients {
        let outcome = with_deadline(task).await.unwrap();
        match cancel {
            Some(_) => assert_eq!(outcome, Outcome::Cancelled),
            None => assert_eq!(outcome, Outcome::Completed(expected(seed, 6, 20))),
        }
    }
    fixture.wait_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_step_errors_the_batch_and_later_requests_succeed() {
    let fixture = start(config(4, 64, 64), &[3]);
    let mut first = Vec::new();
    for seed in 0..4u64 {
        first.push(tokio::spawn(client(
            fixture.handle.clone(),
            seed,
            5,
            30,
            None,
        )));
    }
    let mut failed = 0;
    for task in first {
        match with_deadline(task).await.unwrap() {
            Outcome::Failed(message) => {
                assert_eq!(message, "shard 0 failed step 3");
                failed += 1;
            }
            Outcome::Completed(tokens) => assert_eq!(tokens.len(), 30),
            Outcome::Cancelled => unreachable!(),
        }
    }
    assert!(failed > 0, "step 3 ran while requests were in flight");
    let later = client(fixture.handle.clone(), 99, 5, 8, None);
    assert_eq!(
        with_deadline(later).await,
        Outcome::Completed(expected(99, 5, 8))
    );
    fixture.wait_drained().await;
}

#[tokio::test]
async fn the_loop_keeps_the_next_step_queued_behind_the_running_one() {
    let fixture = start(config(4, 32, 8), &[]);
    let mut req = request(5, 12);
    req.sampling.seed = 9;
    let mut stream = fixture.handle.submit(req).unwrap();
    let mut tokens = Vec::new();
    while let Some(event) = with_deadline(stream.recv()).await {
        match event {
            SequenceEvent::Token(token) => tokens.push(token.id),
            SequenceEvent::Finished { reason, .. } => {
                assert_eq!(reason, FinishReason::Length);
                break;
            }
            SequenceEvent::Error(message) => panic!("{message}"),
            _ => {}
        }
    }
    assert_eq!(tokens, expected(9, 5, 12));
    assert_eq!(
        fixture.peak_in_flight.load(Ordering::SeqCst),
        super::step_loop::PIPELINE_DEPTH
    );
    fixture.wait_drained().await;
}

#[tokio::test]
async fn queued_work_finishes_after_every_handle_is_dropped() {
    let fixture = start(config(4, 32, 8), &[]);
    let mut req = request(9, 5);
    req.sampling.seed = 3;
    let mut stream = fixture.handle.submit(req).unwrap();
    drop(fixture.handle);
    let mut tokens = Vec::new();
    while let Some(event) = with_deadline(stream.recv()).await {
        if let SequenceEvent::Token(token) = event {
            tokens.push(token.id);
        }
    }
    assert_eq!(tokens, expected(3, 9, 5));
}

#[tokio::test]
async fn an_invalid_config_answers_every_request_with_its_reason() {
    let mut bad = config(4, 0, 8);
    bad.max_batch_size = Some(4);
    let executor = FakeExecutor::new(Arc::new(Mutex::new(ShardSim::new(4, 1))), &[]);
    let handle = super::spawn(bad, executor);
    let mut stream = handle.submit(request(3, 3)).unwrap();
    match with_deadline(stream.recv()).await {
        Some(SequenceEvent::Error(failure)) => {
            assert!(failure.message.contains("no blocks"), "{failure}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
}
