//! The scheduler: one actor that owns the waiting queue, the running set and the KV
//! block pool, and drives one step per iteration through a [`StepExecutor`].
mod api;

pub use api::*;

/// Starts the step loop on the current tokio runtime and returns the handle that
/// request tasks submit through.
pub fn spawn<E: StepExecutor>(config: SchedulerConfig, executor: E) -> SchedulerHandle {
    let (submissions, mut receiver) = tokio::sync::mpsc::unbounded_channel::<Submission>();
    let _ = (config, executor);
    tokio::spawn(async move {
        // Placeholder until the step loop lands: fail every request clearly.
        while let Some(submission) = receiver.recv().await {
            let _ = submission
                .events
                .send(SequenceEvent::Error("scheduler not implemented yet".into()));
        }
    });
    SchedulerHandle::new(submissions)
}
