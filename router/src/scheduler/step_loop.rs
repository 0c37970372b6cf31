//! The scheduler actor: takes submissions, drops cancelled sequences, plans steps and
//! keeps up to [`PIPELINE_DEPTH`] of them in flight, applying their answers in order.
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{GenerationFailure, SequenceEvent, StepError, StepExecutor, Submission};
use super::plan::PlannedStep;
use super::state::SchedulerState;
use crate::metrics::names::{
    KV_BLOCKS_CAPACITY, KV_BLOCKS_USED, PREFIX_CACHE_BLOCKS, RUNNING_REQUESTS, STEP_BATCH_SIZE,
    STEP_DURATION, STEP_TOKENS, WAITING_REQUESTS,
};
use crate::pb;
use crate::telemetry::step_span::StepTrace;

/// Steps in flight at once: one running on the shards and the next queued behind it, so
/// the shards go from one step to the next without waiting for the router.
pub const PIPELINE_DEPTH: usize = 2;

type StepAnswer<'a> =
    Pin<Box<dyn Future<Output = Result<pb::StepResponse, StepError>> + Send + 'a>>;

/// A step handed to the executor, waiting for its answer.
struct Launched<'a> {
    answer: StepAnswer<'a>,
    trace: Option<StepTrace>,
    sent_at: Instant,
    /// False for a step that only releases sequences.
    computes: bool,
    width: StepWidth,
    /// Only while debug records are on: nothing is counted per step otherwise.
    shape: Option<StepShape>,
}

/// What a step was planned to compute, to learn its cost from.
#[derive(Debug, Clone, Copy)]
struct StepWidth {
    /// Tokens (prefill chunks, decodes and the drafts they were allowed).
    tokens: u32,
    /// Drafts its decodes were allowed, and how many decodes were allowed any.
    drafts: u32,
    drafting_seats: u32,
}

/// What a step computes, for its debug record.
#[derive(Debug, Clone, Copy)]
struct StepShape {
    id: u64,
    sequences: usize,
    /// Sequences computing one token (decodes); the rest are prefill chunks.
    decodes: usize,
    /// Budgeted tokens: prefill chunks, one per decode, and the drafts the decodes may verify.
    tokens: u32,
    /// Drafts the step's decodes may verify (the shard may draft fewer: `drafted`).
    drafts: u32,
}

pub async fn run<E: StepExecutor>(
    mut state: SchedulerState,
    executor: E,
    mut submissions: UnboundedReceiver<Submission>,
) {
    record_pool_size(&state);
    let mut accepting = true;
    let mut in_flight: VecDeque<Launched<'_>> = VecDeque::with_capacity(PIPELINE_DEPTH);
    // When the shards last finished a step: a queued step's duration starts there.
    let mut last_answer = Instant::now();
    loop {
        if state.is_idle() && in_flight.is_empty() {
            // Block only when there is nothing else to do.
            match submissions.recv().await {
                Some(submission) => {
                    state.submit(submission, Instant::now());
                }
                None => break,
            }
        }
        while accepting {
            match submissions.try_recv() {
                Ok(submission) => {
                    state.submit(submission, Instant::now());
                }
                Err(TryRecvError::Empty) => break,
                // Every handle is gone: finish what is queued, then stop.
                Err(TryRecvError::Disconnected) => accepting = false,
            }
        }
        state.drop_cancelled();
        if in_flight.len() < PIPELINE_DEPTH && state.may_plan_ahead() {
            if let Some(planned) = state.plan_step(Instant::now()) {
                in_flight.push_back(launch(&mut state, &executor, planned));
                continue; // fill the pipeline before waiting
            }
        }
        let Some(step) = in_flight.pop_front() else {
            record_gauges(&state);
            continue;
        };
        let result = step.answer.await;
        let answered_at = Instant::now();
        if let Some(trace) = step.trace {
            trace.end(result.as_ref().map_err(|error| error.message.as_str()));
        }
        if step.computes {
            let ran_for = answered_at.saturating_duration_since(step.sent_at.max(last_answer));
            metrics::histogram!(STEP_DURATION).record(ran_for.as_secs_f64());
            if let Ok(response) = &result {
                learn_costs(&mut state, step.width, response, ran_for);
            }
            if let Some(shape) = &step.shape {
                log_step(shape, ran_for, result.as_ref().ok());
            }
        }
        last_answer = answered_at;
        let deliveries = match result {
            Ok(response) => state.apply(response),
            Err(error) => {
                tracing::error!(%error, rank = ?error.rank, kind = ?error.kind, "step failed; failing every running sequence");
                // Later steps were planned on top of this one: they are void too.
                in_flight.clear();
                state.fail_all(&error)
            }
        };
        state.deliver(deliveries);
        record_gauges(&state);
    }
}

/// Hands a planned step to the executor (it is on its way to the shards when this
/// returns) after delivering its `Started` events and opening its trace.
fn launch<'a, E: StepExecutor>(
    state: &mut SchedulerState,
    executor: &'a E,
    mut planned: PlannedStep,
) -> Launched<'a> {
    let trace = state.trace_step(&planned);
    if let Some(trace) = &trace {
        crate::telemetry::propagation::inject_into_map(
            trace.context(),
            &mut planned.request.trace_context,
        );
    }
    state.deliver(planned.events);
    record_queue_gauges(state);
    let computes = !planned.request.sequences.is_empty();
    let allowed = planned.request.sequences.iter().map(|s| s.max_draft_tokens);
    let width = StepWidth {
        tokens: planned.num_tokens,
        drafts: allowed.clone().sum(),
        drafting_seats: allowed.filter(|&d| d > 0).count() as u32,
    };
    let shape = (computes && tracing::enabled!(tracing::Level::DEBUG)).then(|| StepShape {
        id: planned.request.step_id,
        sequences: planned.request.sequences.len(),
        decodes: planned
            .request
            .sequences
            .iter()
            .filter(|s| s.num_tokens == 1)
            .count(),
        tokens: width.tokens,
        drafts: width.drafts,
    });
    if computes {
        metrics::histogram!(STEP_BATCH_SIZE).record(planned.request.sequences.len() as f64);
        metrics::histogram!(STEP_TOKENS).record(f64::from(planned.num_tokens));
    }
    Launched {
        answer: Box::pin(executor.step(planned.request)),
        trace,
        sent_at: Instant::now(),
        computes,
        width,
        shape,
    }
}

/// What the step just answered says a step costs: its forward by the tokens it computed (the
/// drafts the shard proposed, not those allowed), apart from the time drafting took.
fn learn_costs(
    state: &mut SchedulerState,
    step: StepWidth,
    response: &pb::StepResponse,
    ran_for: Duration,
) {
    let drafted: u32 = response.outputs.iter().map(|o| o.drafted).sum();
    let drafting = Duration::from_nanos(response.draft_ns);
    let computed = step.tokens.saturating_sub(step.drafts) + drafted;
    state
        .step_costs
        .record(computed, ran_for.saturating_sub(drafting));
    if step.drafting_seats > 0 {
        state
            .draft_seats
            .record_proposing(step.drafting_seats, drafting);
    }
}

/// One line per computed step at debug level (`--log-level textgen_router=debug`): what a
/// workload's time went to, step by step, without a tracing collector.
fn log_step(shape: &StepShape, ran_for: std::time::Duration, response: Option<&pb::StepResponse>) {
    tracing::debug!(
        step = shape.id,
        sequences = shape.sequences,
        decodes = shape.decodes,
        tokens = shape.tokens,
        ran_us = ran_for.as_micros() as u64,
        device_us = response.map_or(0, |r| r.device_ns / 1_000),
        input_wait_us = response.map_or(0, |r| r.input_wait_ns / 1_000),
        drafts = shape.drafts,
        drafted = response.map_or(0, |r| r.outputs.iter().map(|o| o.drafted).sum::<u32>()),
        draft_us = response.map_or(0, |r| r.draft_ns / 1_000),
        "step"
    );
}

/// Answers every submission with `message`: the scheduler cannot run (bad config).
pub async fn refuse_all(message: String, mut submissions: UnboundedReceiver<Submission>) {
    while let Some(submission) = submissions.recv().await {
        submission
            .events
            .send(SequenceEvent::Error(GenerationFailure::router(
                message.clone(),
            )));
    }
}

fn record_pool_size(state: &SchedulerState) {
    metrics::gauge!(KV_BLOCKS_CAPACITY).set(f64::from(state.allocator().total()));
    record_gauges(state);
}

fn record_gauges(state: &SchedulerState) {
    record_queue_gauges(state);
    let blocks = kv_usage(state);
    metrics::gauge!(KV_BLOCKS_USED).set(f64::from(blocks.used));
    metrics::gauge!(PREFIX_CACHE_BLOCKS).set(f64::from(blocks.cache_only));
}

fn record_queue_gauges(state: &SchedulerState) {
    metrics::gauge!(WAITING_REQUESTS).set(state.waiting_len() as f64);
    metrics::gauge!(RUNNING_REQUESTS).set(state.running_len() as f64);
}

/// The pool split three ways: held by sequences, held only by the prefix cache
/// (evictable), free. `used + cache_only + free == total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KvUsage {
    pub used: u32,
    pub cache_only: u32,
}

pub(super) fn kv_usage(state: &SchedulerState) -> KvUsage {
    let allocator = state.allocator();
    let cache_only = state.cache_only_blocks() as u32;
    KvUsage {
        used: allocator.used().saturating_sub(cache_only),
        cache_only,
    }
}
