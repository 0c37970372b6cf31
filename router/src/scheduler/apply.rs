//! Applying a step's response (pure): sampled tokens become events, stop conditions
//! finish sequences, and finished sequences give their blocks back at once. A step the
//! device ran out of memory on sends its sequences back to be computed again, and later
//! steps carry fewer prompt tokens for a while (`memory_backoff.rs`).
use std::collections::HashMap;

use super::api::{FailureKind, GenerationFailure, SequenceEvent};
use super::memory_backoff::{charged, prompt_tokens};
use super::state::{Delivery, InFlightStep, ScheduledWork, SchedulerState};
use crate::finish::{finish_reason, AfterToken};
use crate::metrics::names;
use crate::pb;

/// Steps the device may run out of memory on that count against one sequence (see
/// `memory_backoff::charged`): each one recomputes it, the last fails it (an out-of-memory
/// that keeps coming back, on ever smaller steps, is the request's size).
pub const MAX_OUT_OF_MEMORY_STEPS: u32 = 3;

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
        if response.out_of_memory {
            return self.recompute_out_of_memory(step, outputs);
        }
        self.memory_backoff
            .succeeded(self.config.max_batch_prefill_tokens);
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
        let output = match output {
            Some(output) if !output.error.is_empty() => {
                // This sequence alone failed on the shard; the rest of the step stands.
                self.fail_one(id, &output.error, deliveries);
                return;
            }
            Some(output) => output,
            None => pb::SequenceOutput::default(),
        };
        let pb::SequenceOutput {
            token,
            prefill_logprobs,
            next_tokens,
            drafted,
            ..
        } = output;
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
        let produced = 1 + next_tokens.len() as u32;
        // At most one token past the drafts verified, and no more drafts than allowed.
        if produced > 1 + drafted || drafted > work.drafts {
            let message = format!(
                "the shard returned {produced} tokens ({drafted} drafted) for sequence {id}, \
                 which was allowed {} drafts",
                work.drafts
            );
            self.finish_with_error(id, message, deliveries);
            return;
        }
        sequence.settle_decode(work.drafts, drafted, produced);
        if work.drafts > 0 {
            self.draft_seats.record(work.drafts, drafted, produced - 1);
        }
        if sequence.wants_prefill_logprobs() {
            let logprobs = std::mem::take(&mut sequence.prefill_logprobs);
            deliveries.push(Delivery::new(id, SequenceEvent::Prefill { logprobs }));
        }
        sequence.first_token_sent = true;
        for token in std::iter::once(token).chain(next_tokens) {
            if self.take_token(id, token, deliveries) {
                break; // it finished: a verification's later tokens are past its end
            }
        }
    }

    /// Hands one generated token to a running sequence and its stream; finishes the
    /// sequence when the token ends it. Returns whether it did.
    fn take_token(&mut self, id: u64, token: pb::Token, deliveries: &mut Vec<Delivery>) -> bool {
        let sequence = self
            .running
            .get_mut(&id)
            .expect("the caller checked it runs");
        sequence.generated.push(token.id);
        let generated_tokens = sequence.generated.len() as u32;
        let finish = finish_reason(AfterToken {
            generated_tokens,
            max_new_tokens: sequence.request.max_new_tokens,
            is_stop_token: sequence.request.stop_token_ids.contains(&token.id),
            ends_stop_sequence: false,
        });
        deliveries.push(Delivery::new(id, SequenceEvent::Token(token)));
        let Some(reason) = finish else {
            return false;
        };
        self.finish(id);
        deliveries.push(Delivery::new(
            id,
            SequenceEvent::Finished {
                reason,
                generated_tokens,
            },
        ));
        true
    }

    /// The device ran out of memory on this step and kept nothing of it. Its sequences go
    /// back to the queue to be computed again (a sequence refused on its own still ends),
    /// and later steps carry fewer prompt tokens. A sequence the failure counts against
    /// (it brought prompt tokens) fails once that has happened MAX_OUT_OF_MEMORY_STEPS
    /// times, as it does not fit what the device has free; the decodes beside it never
    /// do. The prefix cache is cleared: it may hold blocks this step was to write (a
    /// prefill chunk is cached when the chunk before it is applied).
    fn recompute_out_of_memory(
        &mut self,
        step: InFlightStep,
        mut outputs: HashMap<u64, pb::SequenceOutput>,
    ) -> Vec<Delivery> {
        tracing::warn!(
            step = step.step_id,
            sequences = step.scheduled.len(),
            "the device ran out of memory on a step; its sequences are recomputed"
        );
        metrics::counter!(names::OUT_OF_MEMORY_STEPS_TOTAL).increment(1);
        let step_prompt_tokens = prompt_tokens(&step.scheduled);
        self.memory_backoff.out_of_memory(step_prompt_tokens);
        if let Some(cache) = self.prefix_cache.as_mut() {
            cache.clear();
        }
        let mut deliveries = Vec::new();
        for work in step.scheduled {
            if let Some(output) = outputs.remove(&work.id).filter(|o| !o.error.is_empty()) {
                self.fail_one(work.id, &output.error, &mut deliveries);
                continue;
            }
            let current = self.running.get(&work.id).map(|s| s.admission);
            if current != Some(work.admission) {
                continue; // finished, cancelled or already recomputing since
            }
            let mut sequence = self.running.remove(&work.id).expect("looked up above");
            if charged(&work, step_prompt_tokens) {
                sequence.out_of_memory_steps += 1;
            }
            if sequence.out_of_memory_steps < MAX_OUT_OF_MEMORY_STEPS {
                self.requeue_for_recompute(sequence);
                continue;
            }
            self.release_on_shards(&sequence);
            let message = format!(
                "the device ran out of memory on this request's steps {MAX_OUT_OF_MEMORY_STEPS} times"
            );
            let failure = GenerationFailure::new(None, FailureKind::OutOfMemory, message);
            deliveries.push(Delivery::new(work.id, SequenceEvent::Error(failure)));
        }
        deliveries
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
