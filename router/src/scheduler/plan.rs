//! Planning one step (pure): decodes of running sequences first, then their pending
//! prefill chunks, then admissions from the waiting queue, within the step budget and
//! the KV pool. When the pool runs dry the youngest running sequence is preempted, so
//! the oldest one always progresses and the scheduler never deadlocks.
use std::time::Instant;

use super::admission::admission_order;
use super::api::{GenerationFailure, SequenceEvent};
use super::budget::{blocks_for, max_running, StepBudget};
use super::prefill_pacing::StepOutlook;
use super::prefix::{self, CacheHit};
use super::sequence::Sequence;
use super::speculation;
use super::state::{Delivery, InFlightStep, ScheduledWork, SchedulerState};
use crate::metrics::names;
use crate::pb;

/// A step ready to send, with the events it caused (`Started`) and its shape.
#[derive(Debug)]
pub struct PlannedStep {
    pub request: pb::StepRequest,
    pub events: Vec<Delivery>,
    /// Tokens computed in this step (prefill chunks plus decodes).
    pub num_tokens: u32,
}

/// Whether a sequence got the KV room it asked for.
enum Room {
    /// Room for this many tokens (never more than asked, at least one).
    Granted(u32),
    /// The sequence itself was the youngest and has been preempted.
    Preempted,
}

/// What admitting one waiting sequence takes, set aside before it leaves the queue.
struct Reservation {
    table: crate::kv::KvBlocks,
    cached_len: u32,
    cached_blocks: usize,
    chunk: u32,
    /// The cache lookup, for the hit metrics (None: cache off or bypassed).
    hit: Option<CacheHit>,
}

#[derive(Default)]
struct StepBuilder {
    new_sequences: Vec<pb::NewSequence>,
    decodes: Vec<pb::ScheduledSequence>,
    prefills: Vec<pb::ScheduledSequence>,
    events: Vec<Delivery>,
}

impl SchedulerState {
    /// Plans the next step, or `None` when there is nothing to send. Steps may be planned
    /// while earlier ones are in flight: a decode then continues from a token the router
    /// has not seen yet (the shard feeds its own), and a sequence whose remaining tokens
    /// are all in flight sits the step out. Answers go to [`SchedulerState::apply`] in
    /// planning order.
    pub fn plan_step(&mut self, now: Instant) -> Option<PlannedStep> {
        let paced = self.pacing_cap(now);
        if paced.is_some() {
            metrics::counter!(names::PREFILL_PACED_STEPS_TOTAL).increment(1);
        }
        let caps = [self.memory_backoff.prefill_cap(), paced];
        let mut budget =
            StepBudget::for_config(&self.config).with_prefill_cap(caps.into_iter().flatten().min());
        let mut step = StepBuilder::default();

        let preempted = self.schedule_running(&mut budget, &mut step);
        // Room freed by a preemption goes to the running sequences first: admitting now
        // would only thrash (and could readmit the sequence just preempted).
        if !preempted {
            self.admit_waiting(&mut budget, &mut step, now);
        }
        if step.decodes.is_empty() && step.prefills.is_empty() {
            self.reject_unschedulable_head();
        }

        let released_ids = std::mem::take(&mut self.pending_releases);
        let decodes = step.decodes.len(); // the batch's first rows; prefill chunks follow
        let sequences: Vec<pb::ScheduledSequence> =
            step.decodes.into_iter().chain(step.prefills).collect();
        if sequences.is_empty() && released_ids.is_empty() {
            return None;
        }
        let step_id = self.next_step_id;
        self.next_step_id += 1;
        let scheduled = sequences
            .iter()
            .enumerate()
            .map(|(index, s)| ScheduledWork {
                id: s.id,
                admission: self.running[&s.id].admission,
                num_tokens: s.num_tokens,
                sample: s.sample,
                drafts: s.max_draft_tokens,
                prefill: index >= decodes,
            })
            .collect();
        let admits_at_idle = !step.new_sequences.is_empty() && decodes == 0;
        self.in_flight.push_back(InFlightStep {
            step_id,
            scheduled,
            admits_at_idle,
        });
        Some(PlannedStep {
            num_tokens: budget.tokens_used(),
            request: pb::StepRequest {
                step_id,
                new_sequences: step.new_sequences,
                sequences,
                released_ids,
                trace_context: Default::default(),
            },
            events: step.events,
        })
    }

    /// The prompt tokens `--prefill-pacing-slack` allows the next step (`prefill_pacing.rs`).
    fn pacing_cap(&self, now: Instant) -> Option<u32> {
        let pacing = self.config.prefill_pacing?;
        let running = self.running.values();
        // Every waiting sequence counts: a preempted one's stream is stalled too.
        let unanswered = running
            .clone()
            .filter(|s| !s.first_token_sent)
            .chain(self.waiting.iter());
        let step = StepOutlook {
            decodes: running.filter(|s| s.wants_decode()).count() as u32,
            budget: self.config.max_batch_prefill_tokens,
            longest_first_token_wait: unanswered
                .map(|s| now.saturating_duration_since(s.submitted_at))
                .max(),
        };
        pacing.prompt_cap(step, &self.step_costs)
    }

    /// Decodes and continued prefill chunks, oldest sequence first. Returns whether
    /// anything was preempted.
    fn schedule_running(&mut self, budget: &mut StepBudget, step: &mut StepBuilder) -> bool {
        // Reserve every decode first so that prefill chunks only get what is left.
        let decoding = self.running.values().filter(|s| s.wants_decode()).count();
        for _ in 0..decoding {
            let reserved = budget.consume(1);
            debug_assert!(reserved, "running is capped so every decode fits");
        }
        let mut seats =
            self.draft_seats
                .seats(decoding, self.config.num_draft_tokens, &self.step_costs);
        let mut preempted = false;
        let ids: Vec<u64> = self.running.keys().copied().collect();
        for id in ids {
            let Some(sequence) = self.running.get(&id) else {
                continue; // preempted earlier in this pass
            };
            let decode = !sequence.is_prefilling();
            if decode && !sequence.wants_decode() {
                continue; // its last token is in flight
            }
            let drafts = if decode && seats > 0 {
                self.drafts_for(sequence)
            } else {
                0
            };
            seats -= usize::from(drafts > 0); // oldest first
            let wanted = if decode {
                1 + drafts
            } else {
                budget.chunk_for(sequence.prefill_remaining())
            };
            if wanted == 0 {
                continue; // the step is full; this chunk waits
            }
            let granted = match self.make_room(id, wanted, budget, &mut preempted) {
                Room::Granted(tokens) => tokens,
                Room::Preempted => {
                    if decode {
                        budget.refund(1);
                    }
                    continue;
                }
            };
            if !decode {
                let taken = budget.consume_chunk(granted);
                debug_assert!(taken, "chunk was sized from the budget");
            }
            let sequence = self.running.get_mut(&id).expect("room was granted");
            if decode {
                let drafts = budget.extend(granted - 1);
                step.decodes.push(sequence.schedule_decode(drafts));
            } else {
                step.prefills.push(sequence.schedule(granted));
            }
        }
        preempted
    }

    /// Drafts a decode of `sequence` asks for, given a seat for drafts in the step.
    fn drafts_for(&self, sequence: &Sequence) -> u32 {
        if self.config.num_draft_tokens == 0 || !speculation::may_draft(&sequence.request) {
            return 0;
        }
        let remaining_after_decode = sequence.tokens_left().saturating_sub(1);
        sequence
            .drafting
            .wanted(self.config.num_draft_tokens, remaining_after_decode)
    }

    /// Grows sequence `id`'s blocks for `wanted` more tokens. A decode needs its one
    /// token; a prefill chunk shrinks to the room there is. With no room at all, the
    /// youngest running sequence is preempted until there is (it may be `id` itself).
    fn make_room(
        &mut self,
        id: u64,
        wanted: u32,
        budget: &mut StepBudget,
        preempted: &mut bool,
    ) -> Room {
        let block_size = self.config.block_size;
        loop {
            let spare = self.running[&id].spare_slots(block_size);
            // Unused cached prefixes give way before any running sequence does.
            self.ensure_free(blocks_for(
                u64::from(wanted.saturating_sub(spare)),
                block_size,
            ));
            let free = self.allocator.free();
            let room = spare.saturating_add(free.saturating_mul(block_size));
            if room >= 1 {
                let tokens = wanted.min(room);
                let extra_blocks = blocks_for(u64::from(tokens.saturating_sub(spare)), block_size);
                let sequence = self.running.get_mut(&id).expect("looked up above");
                sequence
                    .blocks
                    .grow(extra_blocks as usize)
                    .expect("room was counted");
                return Room::Granted(tokens);
            }
            let youngest = *self.running.keys().next_back().expect("`id` is running");
            // Younger sequences are planned after this one, so preempting them cannot
            // take back anything already put in this step; give back their decode seat.
            let youngest_decodes = self.running[&youngest].wants_decode();
            self.preempt(youngest);
            *preempted = true;
            if youngest == id {
                return Room::Preempted;
            }
            if youngest_decodes {
                budget.refund(1);
            }
        }
    }

    /// Admits waiting sequences, in the order the admission policy ranks them, while
    /// their first chunk fits the budget and the free blocks (after evicting unused
    /// cached prefixes). Stops at the first that does not fit, so it is not overtaken
    /// forever. Admission never preempts.
    fn admit_waiting(&mut self, budget: &mut StepBudget, step: &mut StepBuilder, now: Instant) {
        let candidates = self.admission_candidates(now);
        let order = admission_order(
            self.config.admission_policy,
            self.config.admission_age_cap,
            &candidates,
        );
        for id in order {
            if self.running.len() >= max_running(&self.config) {
                break;
            }
            let Some(reservation) = self.reserve(id, budget) else {
                break;
            };
            let mut sequence = self
                .waiting
                .remove_first(|s| s.id == id)
                .expect("ranked ids are waiting");
            if let Some(hit) = &reservation.hit {
                prefix::record_lookup(sequence.known_len() as usize, hit);
            }
            sequence.admit(
                reservation.table,
                reservation.cached_len,
                reservation.cached_blocks,
            );
            let taken = budget.consume_chunk(reservation.chunk);
            debug_assert!(taken, "chunk was sized from the budget");
            step.new_sequences.push(sequence.new_sequence_message());
            sequence.announced = true;
            if !sequence.started {
                sequence.started = true;
                let queue_time = now.saturating_duration_since(sequence.submitted_at);
                metrics::histogram!(names::QUEUE_DURATION).record(queue_time.as_secs_f64());
                step.events.push(Delivery::new(
                    sequence.id,
                    SequenceEvent::Started { queue_time },
                ));
            }
            step.prefills.push(sequence.schedule(reservation.chunk));
            self.running.insert(sequence.id, sequence);
        }
    }

    /// The blocks and first chunk for waiting sequence `id`: its cached prefix (if
    /// any) plus fresh blocks for the chunk. `None` when the step or the pool is full.
    fn reserve(&mut self, id: u64, budget: &StepBudget) -> Option<Reservation> {
        let block_size = self.config.block_size;
        let sequence = self.waiting.iter().find(|s| s.id == id)?;
        let known_len = sequence.known_len();
        let long_rope = self.config.long_rope_prompt_tokens;
        let hit = prefix::lookup(self.prefix_cache.as_mut(), sequence, long_rope);
        let (mut table, cached_len, hit) = match hit {
            Some(hit) => {
                let stats = CacheHit {
                    tokens: hit.tokens,
                    generated_tokens: hit.generated_tokens,
                };
                (hit.blocks, hit.tokens as u32, Some(stats))
            }
            None => (self.allocator.empty(), 0, None),
        };
        let chunk = budget.chunk_for(known_len - cached_len);
        if chunk == 0 {
            return None;
        }
        let cached_blocks = table.len();
        let fresh = blocks_for(u64::from(cached_len + chunk), block_size) - cached_blocks as u64;
        if !self.ensure_free(fresh) {
            return None;
        }
        table
            .grow(fresh as usize)
            .expect("free blocks were counted");
        Some(Reservation {
            table,
            cached_len,
            cached_blocks,
            chunk,
            hit,
        })
    }

    /// Nothing runs and the queue head still cannot start: the pool is too small for
    /// it (submission checks make this unreachable). Fail it rather than spin.
    fn reject_unschedulable_head(&mut self) {
        if !self.running.is_empty() {
            return;
        }
        if let Some(sequence) = self.waiting.pop_front() {
            tracing::error!(
                sequence = sequence.id,
                "sequence cannot be scheduled on an idle pool"
            );
            let message = "the request does not fit the KV cache".to_string();
            self.deliver(vec![Delivery::new(
                sequence.id,
                SequenceEvent::Error(GenerationFailure::router(message)),
            )]);
        }
    }
}
