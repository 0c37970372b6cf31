//! The scheduler actor: takes submissions, drops cancelled sequences, plans a step,
//! runs it through the executor and delivers the results, one step at a time.
use std::time::Instant;

use opentelemetry::context::FutureExt as _;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{SequenceEvent, StepExecutor, Submission};
use super::state::SchedulerState;
use crate::metrics::names::{
    KV_BLOCKS_CAPACITY, KV_BLOCKS_USED, PREFIX_CACHE_BLOCKS, RUNNING_REQUESTS, STEP_BATCH_SIZE,
    STEP_DURATION, STEP_TOKENS, WAITING_REQUESTS,
};

pub async fn run<E: StepExecutor>(
    mut state: SchedulerState,
    executor: E,
    mut submissions: UnboundedReceiver<Submission>,
) {
    record_pool_size(&state);
    let mut accepting = true;
    loop {
        if state.is_idle() {
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
        let Some(planned) = state.plan_step(Instant::now()) else {
            record_gauges(&state);
            continue;
        };
        let trace = state.trace_step(&planned);
        state.deliver(planned.events);
        record_queue_gauges(&state);
        // A step that only releases sequences computes nothing: it would skew the step
        // histograms towards zero.
        let computes = !planned.request.sequences.is_empty();
        if computes {
            metrics::histogram!(STEP_BATCH_SIZE).record(planned.request.sequences.len() as f64);
            metrics::histogram!(STEP_TOKENS).record(f64::from(planned.num_tokens));
        }

        let started = Instant::now();
        let step = executor.step(planned.request);
        // The shard client propagates the step span from the current OTel context.
        let result = match &trace {
            Some(trace) => step.with_context(trace.context().clone()).await,
            None => step.await,
        };
        if let Some(trace) = trace {
            trace.end(result.as_ref().map_err(|error| error.0.as_str()));
        }
        let deliveries = match result {
            Ok(response) => state.apply(response),
            Err(error) => {
                tracing::error!(%error, "step failed; failing every running sequence");
                state.fail_all(&error.to_string())
            }
        };
        if computes {
            metrics::histogram!(STEP_DURATION).record(started.elapsed().as_secs_f64());
        }
        state.deliver(deliveries);
        record_gauges(&state);
    }
}

/// Answers every submission with `message`: the scheduler cannot run (bad config).
pub async fn refuse_all(message: String, mut submissions: UnboundedReceiver<Submission>) {
    while let Some(submission) = submissions.recv().await {
        let _ = submission
            .events
            .send(SequenceEvent::Error(message.clone()));
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
