//! Which requests in a planned step are traced: their queue spans, and the step span.
//! Skipped entirely when no traces are exported.
use std::collections::HashSet;

use opentelemetry::trace::SpanContext;

use super::api::SequenceEvent;
use super::plan::PlannedStep;
use super::state::SchedulerState;
use crate::telemetry::step_span::{self, StepShape, StepTrace};

impl SchedulerState {
    fn trace_of(&self, id: u64) -> Option<&SpanContext> {
        self.running.get(&id)?.request.trace.as_ref()
    }

    /// Records the queue spans of the sequences this step starts and opens the step's
    /// span. Call before the step's events are delivered.
    pub fn trace_step(&self, planned: &PlannedStep) -> Option<StepTrace> {
        let tracer = crate::telemetry::tracer()?;
        for delivery in &planned.events {
            if let SequenceEvent::Started { queue_time } = &delivery.event {
                if let Some(parent) = self.trace_of(delivery.id) {
                    step_span::record_queue(tracer, parent, *queue_time);
                }
            }
        }
        let mut traced: Vec<(u64, &SpanContext)> = planned
            .request
            .sequences
            .iter()
            .filter_map(|s| self.trace_of(s.id).map(|trace| (s.id, trace)))
            .collect();
        // Ids grow with submission order: the oldest request becomes the parent. The
        // sequences of one request (best_of, n) share its span: keep it once.
        traced.sort_unstable_by_key(|(id, _)| *id);
        let mut seen = HashSet::with_capacity(traced.len());
        let contexts: Vec<SpanContext> = traced
            .into_iter()
            .filter(|(_, context)| seen.insert(context.span_id()))
            .map(|(_, context)| context.clone())
            .collect();
        let shape = StepShape {
            step_id: planned.request.step_id,
            sequences: planned.request.sequences.len(),
            tokens: planned.num_tokens,
        };
        StepTrace::begin(tracer, shape, &contexts)
    }
}
