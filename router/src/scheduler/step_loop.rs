//! The scheduler actor: takes submissions, drops cancelled sequences, plans a step,
//! runs it through the executor and delivers the results, one step at a time.
use std::time::Instant;

use opentelemetry::context::FutureExt as _;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{SequenceEvent, StepExecutor, Submission};
use super::state::SchedulerState;

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
        record_gauges(&state);
        metrics::histogram!("textgen_batch_size").record(planned.request.sequences.len() as f64);
        metrics::histogram!("textgen_step_tokens").record(f64::from(planned.num_tokens));

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
        metrics::histogram!("textgen_step_duration_seconds")
            .record(started.elapsed().as_secs_f64());
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
    metrics::gauge!("textgen_kv_blocks_total").set(f64::from(state.allocator().total()));
    record_gauges(state);
}

fn record_gauges(state: &SchedulerState) {
    metrics::gauge!("textgen_waiting_requests").set(state.waiting_len() as f64);
    metrics::gauge!("textgen_running_requests").set(state.running_len() as f64);
    metrics::gauge!("textgen_kv_blocks_used").set(f64::from(state.allocator().used()));
    metrics::gauge!("textgen_prefix_cache_blocks").set(state.cached_blocks() as f64);
}
