//! The scheduler's state, owned by the step loop: waiting queue, running set, KV pool
//! and the event channels. Planning (`plan.rs`) and applying results (`apply.rs`) are
//! pure methods on it, testable without tokio.
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use super::api::{GenerationFailure, SchedulerConfig, SequenceEvent, Submission};
use super::budget::blocks_for;
use super::draft_seats::DraftSeats;
use super::events::EventSender;
use super::memory_backoff::MemoryBackoff;
use super::queue::WaitingQueue;
use super::sequence::Sequence;
use super::step_cost::StepCosts;
use crate::kv::{BlockAllocator, RadixCache};
use crate::metrics::names;

/// An event addressed to one sequence's stream.
#[derive(Debug)]
pub struct Delivery {
    pub id: u64,
    pub event: SequenceEvent,
}

impl Delivery {
    pub fn new(id: u64, event: SequenceEvent) -> Self {
        Self { id, event }
    }
}

/// What one sequence does in a step in flight.
#[derive(Debug, Clone, Copy)]
pub struct ScheduledWork {
    pub id: u64,
    /// The sequence's admission the step was planned for (see `Sequence::admission`).
    pub admission: u32,
    pub num_tokens: u32,
    pub sample: bool,
    /// Drafts the decode may verify (speculative decoding); 0 for a plain decode.
    pub drafts: u32,
    /// A prefill chunk (of a prompt, or of a recomputation), not a decode.
    pub prefill: bool,
}

/// A step that was planned and not yet applied: what each sequence in it does.
#[derive(Debug, Clone)]
pub struct InFlightStep {
    pub step_id: u64,
    /// In batch order.
    pub scheduled: Vec<ScheduledWork>,
    /// The step admitted sequences from the waiting queue while none was decoding.
    pub admits_at_idle: bool,
}

#[derive(Debug)]
pub struct SchedulerState {
    pub(super) config: SchedulerConfig,
    pub(super) allocator: BlockAllocator,
    /// The radix prefix cache over the same pool; `None` when prefix caching is off.
    pub(super) prefix_cache: Option<RadixCache>,
    pub(super) waiting: WaitingQueue<Sequence>,
    /// Keyed by id; ids grow with submission order, so the first entry is the oldest.
    pub(super) running: BTreeMap<u64, Sequence>,
    pub(super) subscribers: HashMap<u64, EventSender>,
    /// Streams `deliver` found too far behind: dropped with the cancelled ones.
    behind: Vec<u64>,
    /// Ids the shards must drop at the start of the next step.
    pub(super) pending_releases: Vec<u64>,
    /// Steps sent and not yet applied, oldest first (at most the pipeline depth).
    pub(super) in_flight: VecDeque<InFlightStep>,
    /// The prompt-token cap after the device ran out of memory on a step.
    pub(super) memory_backoff: MemoryBackoff,
    /// What steps cost by their tokens, and how many decodes of a wide step get drafts.
    pub(super) step_costs: StepCosts,
    pub(super) draft_seats: DraftSeats,
    next_sequence_id: u64,
    pub(super) next_step_id: u64,
}

impl SchedulerState {
    /// `config` must have passed [`SchedulerConfig::validate`].
    pub fn new(config: SchedulerConfig) -> Self {
        let allocator = BlockAllocator::new(config.num_blocks);
        let prefix_cache = config
            .prefix_caching
            .then(|| RadixCache::new(allocator.clone(), config.block_size));
        Self {
            config,
            allocator,
            prefix_cache,
            waiting: WaitingQueue::default(),
            running: BTreeMap::new(),
            subscribers: HashMap::new(),
            behind: Vec::new(),
            pending_releases: Vec::new(),
            in_flight: VecDeque::new(),
            memory_backoff: MemoryBackoff::default(),
            step_costs: StepCosts::default(),
            draft_seats: DraftSeats::default(),
            next_sequence_id: 0,
            next_step_id: 0,
        }
    }

    pub fn allocator(&self) -> &BlockAllocator {
        &self.allocator
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// Steps planned whose answers have not been applied yet.
    pub fn steps_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether the next step may be planned before the answers in flight are in. Planning
    /// ahead keeps the device busy between steps (every running stream's next token comes
    /// a host round trip sooner); what it costs is that arrivals landing meanwhile wait for
    /// the step after. So not past a step that admitted sequences while none was decoding:
    /// nobody waits on that round trip, and the rest of a burst lands while its first
    /// request's prefill runs. A step that verifies drafts is planned past like any other
    /// (see `speculation`).
    pub fn may_plan_ahead(&self) -> bool {
        self.in_flight
            .back()
            .is_none_or(|step| !step.admits_at_idle)
    }

    /// Nothing to schedule and nothing for the shards to drop.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.pending_releases.is_empty()
    }

    /// Queues a submission, or answers it with an error if it can never run.
    /// Returns the sequence id when queued.
    pub fn submit(&mut self, submission: Submission, now: Instant) -> Option<u64> {
        let Submission { request, events } = submission;
        if let Err(message) = self.check_fits(request.input_ids.len(), request.max_new_tokens) {
            // The receiver may be gone already; then there is nobody to tell.
            events.send(SequenceEvent::Error(GenerationFailure::router(message)));
            return None;
        }
        let id = self.next_sequence_id;
        self.next_sequence_id += 1;
        self.subscribers.insert(id, events);
        let blocks = self.allocator.empty();
        self.waiting
            .push_back(Sequence::new(id, request, blocks, now));
        Some(id)
    }

    /// A sequence must fit the whole pool alone, or it could never finish.
    fn check_fits(&self, prompt_len: usize, max_new_tokens: u32) -> Result<(), String> {
        if prompt_len == 0 {
            return Err("the prompt has no tokens".into());
        }
        if max_new_tokens == 0 {
            return Err("max_new_tokens must be at least 1".into());
        }
        // The last sampled token is never fed back, so its KV is never stored.
        let kv_tokens = prompt_len as u64 + u64::from(max_new_tokens) - 1;
        let needed = blocks_for(kv_tokens, self.config.block_size);
        if needed > u64::from(self.config.num_blocks) {
            let capacity = u64::from(self.config.num_blocks) * u64::from(self.config.block_size);
            return Err(format!(
                "the request needs {kv_tokens} tokens of KV cache but the pool holds {capacity}"
            ));
        }
        Ok(())
    }

    /// Drops sequences whose receiver is gone (client left, or a stop sequence
    /// was hit) or whose reader fell too far behind (`deliver`). Their blocks return to
    /// the pool now; the shards hear next step.
    pub fn drop_cancelled(&mut self) -> usize {
        let mut cancelled = std::mem::take(&mut self.behind);
        cancelled.extend(
            self.subscribers
                .iter()
                .filter(|(_, sender)| sender.is_closed())
                .map(|(&id, _)| id),
        );
        for &id in &cancelled {
            self.subscribers.remove(&id);
            if let Some(sequence) = self.running.remove(&id) {
                // What it computed stays valid (steps in flight write it before any later
                // step can read it): keep it cached.
                self.cache_computed(&sequence);
                self.release_on_shards(&sequence);
            }
        }
        if !cancelled.is_empty() {
            self.waiting
                .extract_if(|sequence| cancelled.contains(&sequence.id));
        }
        cancelled.len()
    }

    pub(super) fn release_on_shards(&mut self, sequence: &Sequence) {
        if sequence.announced {
            self.pending_releases.push(sequence.id);
        }
    }

    /// Frees a running sequence's blocks and requeues it at the front for recompute.
    /// Its computed KV goes to the prefix cache first, so that on readmission it finds
    /// its own prefix again unless the pool needed those blocks meanwhile.
    pub(super) fn preempt(&mut self, id: u64) {
        let Some(sequence) = self.running.remove(&id) else {
            return;
        };
        self.cache_computed(&sequence);
        self.requeue_for_recompute(sequence);
        metrics::counter!(names::PREEMPTIONS_TOTAL).increment(1);
        tracing::debug!(sequence = id, "preempted for recompute");
    }

    /// Gives a sequence taken out of `running` back to the front of the queue, blocks
    /// freed, to be computed again from its prompt and what it generated.
    pub(super) fn requeue_for_recompute(&mut self, mut sequence: Sequence) {
        self.release_on_shards(&sequence);
        sequence.reset_for_recompute(self.allocator.empty());
        self.waiting.push_front(sequence);
    }

    /// A step failed: every running sequence gets the error and is dropped. Waiting
    /// sequences never reached the shards and keep their place.
    pub fn fail_all(&mut self, failure: &GenerationFailure) -> Vec<Delivery> {
        self.in_flight.clear();
        // The failed step may have written into cached blocks' neighbours, and a shard
        // that failed may come back empty: trust no cached KV.
        if let Some(cache) = self.prefix_cache.as_mut() {
            cache.clear();
        }
        let running = std::mem::take(&mut self.running);
        let mut deliveries = Vec::with_capacity(running.len());
        for (id, sequence) in running {
            self.release_on_shards(&sequence);
            deliveries.push(Delivery::new(id, SequenceEvent::Error(failure.clone())));
        }
        deliveries
    }

    /// Sends events to their streams; a terminal event closes the stream's entry. A
    /// stream too far behind its reader gets a last error, and its sequence is dropped
    /// with the cancelled ones.
    pub fn deliver(&mut self, deliveries: Vec<Delivery>) {
        let limit = self.config.max_stream_backlog;
        for Delivery { id, event } in deliveries {
            let terminal = matches!(
                event,
                SequenceEvent::Finished { .. }
                    | SequenceEvent::Error(_)
                    | SequenceEvent::Refused(_)
            );
            if let Some(sender) = self.subscribers.get(&id) {
                // A closed stream is cleaned up by `drop_cancelled` before the next step.
                sender.send(event);
                if !terminal && sender.backlog() >= limit {
                    tracing::warn!(sequence = id, limit, "the client reads too slowly; dropped");
                    sender.send(SequenceEvent::Error(GenerationFailure::router(format!(
                        "the client read its stream too slowly: {limit} events were waiting \
                         (--max-stream-backlog)"
                    ))));
                    self.behind.push(id);
                    self.subscribers.remove(&id);
                    continue;
                }
            }
            if terminal {
                self.subscribers.remove(&id);
            }
        }
    }
}
