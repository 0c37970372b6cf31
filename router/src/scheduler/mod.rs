//! The scheduler: one actor that owns the waiting queue, the running set and the KV
//! block pool, and drives one step per iteration through a [`StepExecutor`].
//!
//! Planning (`plan.rs`) and applying a response (`apply.rs`) are pure methods on
//! [`SchedulerState`]; `step_loop.rs` is the thin async actor around them. The plan
//! tracks positions scheduled, not tokens received, so the loop plans and sends step
//! N+1 before step N's tokens arrive (two steps in flight): the shard never waits for a
//! round trip through the router between steps.
pub mod admission;
mod api;
mod apply;
pub mod budget;
mod draft_seats;
mod events;
mod failure;
mod memory_backoff;
mod plan;
mod prefill_pacing;
mod prefix;
pub mod queue;
mod sequence;
mod speculation;
mod state;
mod step_cost;
mod step_loop;
mod traced;

#[cfg(test)]
mod test_harness;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests_actor;
#[cfg(test)]
mod tests_pipeline;
#[cfg(test)]
mod tests_plan;
#[cfg(test)]
mod tests_prefix;
#[cfg(test)]
mod tests_speculation;

pub use admission::AdmissionPolicy;
pub use api::*;
pub use events::{channel as event_channel, EventSender, SequenceStream};
pub use plan::PlannedStep;
pub use prefill_pacing::PrefillPacing;
pub use state::{Delivery, SchedulerState};

/// Starts the step loop on the current tokio runtime and returns the handle that
/// request tasks submit through. An invalid config makes every request fail with the
/// reason (callers should run [`SchedulerConfig::validate`] at startup).
pub fn spawn<E: StepExecutor>(config: SchedulerConfig, executor: E) -> SchedulerHandle {
    match config.validate() {
        Ok(()) => start(SchedulerState::new(config), executor),
        Err(error) => {
            tracing::error!(%error, "scheduler cannot start");
            let (submissions, receiver) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(step_loop::refuse_all(error.to_string(), receiver));
            SchedulerHandle::new(submissions)
        }
    }
}

/// Runs the step loop over an existing state (tests keep a handle on its pool).
fn start<E: StepExecutor>(state: SchedulerState, executor: E) -> SchedulerHandle {
    let (submissions, receiver) = tokio::sync::mpsc::unbounded_channel::<Submission>();
    tokio::spawn(step_loop::run(state, executor, receiver));
    SchedulerHandle::new(submissions)
}
