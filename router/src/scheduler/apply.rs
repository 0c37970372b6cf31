//! Applying a step's response (pure): sampled tokens become events, stop conditions
//! finish sequences, and finished sequences give their blocks back at once.
use std::collections::HashMap;

use super::api::{GenerationFailure, SequenceEvent};
use super::state::{Delivery, ScheduledWork, SchedulerState};
use crate::finish::{finish_reason, AfterToken};
use crate::pb;

impl SchedulerState {
    /// Applies rank 0's answer to the oldest step in flight and returns the events to
    /// deliver.
    pub fn apply(&mut self, response: pb::StepResponse) -> Vec<Delivery> {
        let Some(step) = self.in_flight.pop_front() else {
            tracing::error!(step = response.step_id, "response without a step in flight");
            return Vec::new();
        };
        if response.step_id != step.step_id {
            let message = format!(
                "shard answered step {} while step {} was in flight",
                response.step_id, step.step_id
            );
            return self.fail_all(&GenerationFailure::protocol(message));
        }
        let mut outputs: HashMap<u64, pb::SequenceOutput> = response
            .outputs
            .into_iter()
            .map(|output| (output.id, output))
            .collect();
        let mut deliveries = Vec::new();
        for work in step.scheduled {
            if work.num_tokens > 1 {
                // A prefill chunk is now in the KV: later admissions may share it.
                self.cache_running(work.id);
            }
            let output = outputs.remove(&work.id);
            self.apply_output(work, output, &mut deliveries);
        }
        deliveries
    }

    fn apply_output(
        &mut self,
        work: ScheduledWork,
        output: Option<pb::SequenceOutput>,
        deliveries: &mut Vec<Delivery>,
    ) {
        let (id, sample) = (work.id, work.sample);
        let Some(sequence) = self.running.get_mut(&id) else {
            return; // cancelled or finished while the step ran
        };
        if sequence.admission != work.admission {
            return; // preempted since: it recomputes this token
        }
        sequence.pending_samples = sequence.pending_samples.saturating_sub(u32::from(sample));
        let (token, prefill_logprobs) = match output {
            Some(output) if !output.error.is_empty() => {
                // This sequence alone failed on the shard; the rest of the step stands.
                self.fail_one(id, &output.error, deliveries);
                return;
            }
            Some(output) => (output.token, output.prefill_logprobs),
            None => (None, Vec::new()),
        };
        if sequence.wants_prefill_logprobs() {
            sequence.prefill_logprobs.extend(prefill_logprobs);
        }
        if !sample {
            return;
        }
        let Some(token) = token else {
            let message = format!("the shard returned no token for sequence {id}");
            self.finish_with_error(id, message, deliveries);
            return;
        };
        if sequence.wants_prefill_logprobs() {
            let logprobs = std::mem::take(&mut sequence.prefill_logprobs);
            deliveries.push(Delivery::new(id, SequenceEvent::Prefill { logprobs }));
        }
        sequence.first_token_sent = true;
        sequence.generated.push(token.id);
        let generated_tokens = sequence.generated.len() as u32;
        let finish = finish_reason(AfterToken {
            generated_tokens,
            max_new_tokens: sequence.request.max_new_tokens,
            is_stop_token: sequence.request.stop_token_ids.contains(&token.id),
            ends_stop_sequence: false,
        });
        deliveries.push(Delivery::new(id, SequenceEvent::Token(token)));
        if let Some(reason) = finish {
            self.finish(id);
            deliveries.push(Delivery::new(
                id,
                SequenceEvent::Finished {
                    reason,
                    generated_tokens,
                },
            ));
        }
    }

    /// Drops a running sequence: its computed KV to the prefix cache, the rest of its
    /// blocks back now, shards told next step.
    fn finish(&mut self, id: u64) {
        if let Some(sequence) = self.running.remove(&id) {
            self.cache_computed(&sequence);
            self.release_on_shards(&sequence);
        }
    }

    /// A sequence the shard failed on its own account (its parameters were refused, its
    /// grammar reached a dead end): only it ends, with the shard's reason, which names
    /// nothing of any other sequence. What it computed is not cached.
    fn fail_one(&mut self, id: u64, reason: &str, deliveries: &mut Vec<Delivery>) {
        tracing::warn!(sequence = id, %reason, "the shard failed one sequence");
        if let Some(sequence) = self.running.remove(&id) {
            self.release_on_shards(&sequence);
        }
        deliveries.push(Delivery::new(id, SequenceEvent::Refused(reason.to_owned())));
    }

    fn finish_with_error(&mut self, id: u64, message: String, deliveries: &mut Vec<Delivery>) {
        tracing::error!(sequence = id, "{message}");
        // Its KV is not cached: after an answer that broke the protocol, trust none.
        if let Some(sequence) = self.running.remove(&id) {
            self.release_on_shards(&sequence);
        }
        deliveries.push(Delivery::new(
            id,
            SequenceEvent::Error(GenerationFailure::protocol(message)),
        ));
    }
}
