//! Two steps in flight: step N+1 is planned and sent before step N's tokens arrive, as
//! the real step loop does. The simulated shard runs each step as it is sent.
use std::time::Instant;

use super::api::{FailureKind, FinishReason, SequenceEvent};
use super::apply::MAX_OUT_OF_MEMORY_STEPS;
use super::test_harness::{assert_kept_streams_exact, busy_tiny_pool, expected_tokens, Harness};
use super::test_support::{cached_config, config, request, token_at, CapturedMetrics};

const DEPTH: usize = 2;

fn tokens_computed(sent: &[crate::pb::StepRequest], id: u64) -> u32 {
    sent.iter()
        .flat_map(|step| &step.sequences)
        .filter(|s| s.id == id)
        .map(|s| s.num_tokens)
        .sum()
}

#[test]
fn decodes_are_planned_and_sent_before_the_step_before_answers() {
    let mut h = Harness::new(config(4, 64, 8));
    let id = h.submit(request(3, 5));
    let mut sent = Vec::new();
    assert!(h.pipelined_step(DEPTH, &mut sent));
    assert_eq!(
        sent.len(),
        1,
        "the admitting step is answered before the next is planned"
    );
    assert!(h.pipelined_step(DEPTH, &mut sent));
    assert_eq!(
        sent.len(),
        3,
        "two decodes went out before the first of them was applied"
    );
    assert_eq!(
        (sent[2].sequences[0].id, sent[2].sequences[0].num_tokens),
        (id, 1)
    );
    assert_eq!(h.tokens(id).len(), 2, "only the first two answers are in");
}

#[test]
fn a_burst_that_lands_during_its_first_requests_prefill_shares_the_next_step() {
    let mut h = Harness::new(config(4, 64, 64));
    let first = h.submit(request(3, 5));
    let step = h.state.plan_step(Instant::now()).unwrap();
    assert!(!h.state.may_plan_ahead(), "the step admitted a sequence");
    let burst: Vec<u64> = (0..15).map(|_| h.submit(request(3, 5))).collect();
    h.state.deliver(step.events);
    let answer = h.sim.step(&step.request);
    let deliveries = h.state.apply(answer);
    h.state.deliver(deliveries);
    let next = h.state.plan_step(Instant::now()).unwrap();
    let admitted: Vec<u64> = next.request.new_sequences.iter().map(|s| s.id).collect();
    assert_eq!(admitted, burst);
    assert!(next
        .request
        .sequences
        .iter()
        .any(|s| s.id == first && s.num_tokens == 1));
}

#[test]
fn a_step_that_admits_beside_running_decodes_is_planned_past() {
    let mut h = Harness::new(config(4, 64, 64));
    let streaming = h.submit(request(3, 20));
    h.step(); // its prefill: now it decodes
    let arrival = h.submit(request(6, 5));
    let admitting = h.state.plan_step(Instant::now()).unwrap();
    assert_eq!(admitting.request.new_sequences.len(), 1);
    assert!(
        h.state.may_plan_ahead(),
        "the running stream's next token should not wait for this step's answer"
    );
    // Planned before the admitting step answers: the stream decodes, and so does the
    // arrival, whose whole prompt went into the admitting step.
    let ahead = h.state.plan_step(Instant::now()).unwrap();
    let scheduled: Vec<(u64, u32)> = ahead
        .request
        .sequences
        .iter()
        .map(|s| (s.id, s.num_tokens))
        .collect();
    assert_eq!(scheduled, [(streaming, 1), (arrival, 1)]);
    assert!(ahead.request.new_sequences.is_empty());
    for planned in [admitting, ahead] {
        h.state.deliver(planned.events);
        let answer = h.sim.step(&planned.request);
        let deliveries = h.state.apply(answer);
        h.state.deliver(deliveries);
    }
    h.run_to_idle(100);
    assert_eq!(h.tokens(arrival), expected_tokens(arrival, 6, 5));
    assert_eq!(h.tokens(streaming), expected_tokens(streaming, 3, 20));
}

#[test]
fn pipelined_steps_give_every_token_once_and_never_pass_max_new_tokens() {
    let mut h = Harness::new(config(4, 64, 8));
    let specs = [(3, 1), (5, 2), (20, 3), (2, 9)];
    let ids: Vec<u64> = specs
        .iter()
        .map(|&(p, n)| h.submit(request(p, n)))
        .collect();
    let sent = h.run_pipelined(DEPTH, 100);
    for (&id, &(prompt, new)) in ids.iter().zip(&specs) {
        assert_eq!(h.tokens(id), expected_tokens(id, prompt, new));
        assert_eq!(h.finished(id), Some((FinishReason::Length, new)));
        // KV for every kept token but the last, and nothing more.
        assert_eq!(
            tokens_computed(&sent, id),
            prompt + new - 1,
            "sequence {id}"
        );
    }
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.sim.live_sequences(), 0);
}

#[test]
fn a_stop_token_seen_a_step_late_costs_one_decode_whose_token_is_dropped() {
    let mut h = Harness::new(config(4, 64, 8));
    let mut req = request(5, 20);
    // Harness seeds are ids; this is the first submission (id 0). Stop on the 4th token.
    let expected: Vec<u32> = expected_tokens(0, 5, 4);
    req.stop_token_ids = vec![token_at(0, 5 + 3)];
    let id = h.submit(req);
    let stop_at = expected.iter().position(|t| *t == token_at(0, 8)).unwrap() + 1;
    let sent = h.run_pipelined(DEPTH, 50);
    assert_eq!(h.tokens(id), expected[..stop_at]);
    assert_eq!(
        h.finished(id),
        Some((FinishReason::EosToken, stop_at as u32))
    );
    let steps_with_it = sent
        .iter()
        .filter(|s| s.sequences.iter().any(|x| x.id == id))
        .count();
    assert_eq!(
        steps_with_it,
        stop_at + 1,
        "the prefill, the kept decodes and one more"
    );
    assert!(sent.last().unwrap().released_ids.contains(&id));
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.sim.live_sequences(), 0);
}

#[test]
fn a_preemption_with_a_step_in_flight_drops_the_stale_answer_and_recomputes() {
    // 6 blocks of 4 = 24 slots; each sequence needs 4 + 12 - 1 = 15 slots (4 blocks).
    let mut h = Harness::new(config(4, 6, 64));
    let old = h.submit(request(4, 12));
    let young = h.submit(request(4, 12));
    let sent = h.run_pipelined(DEPTH, 200);
    assert!(
        sent.iter().any(|s| s.released_ids.contains(&young)),
        "the pool was too small for both: one must be preempted"
    );
    assert_eq!(h.sim.announcements[&young], 2);
    assert_eq!(h.tokens(old), expected_tokens(old, 4, 12));
    assert_eq!(h.tokens(young), expected_tokens(young, 4, 12));
    assert_eq!(h.finished(young), Some((FinishReason::Length, 12)));
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.sim.live_blocks(), 0);
}

/// Sharing, eviction, preemption and cancellations on a tiny pool, pipelined: the
/// simulated shard checks every cached position it is handed, and the pool ends exact.
#[test]
fn a_busy_tiny_pool_pipelined_with_the_prefix_cache_stays_exact() {
    for cached in [true, false] {
        let (h, submitted) = busy_tiny_pool(cached, DEPTH, &[]);
        assert_kept_streams_exact(&h, &submitted);
        assert_eq!(h.state.allocator().used() as usize, h.state.cached_blocks());
        assert_eq!(h.sim.live_sequences(), 0);
        assert_eq!(
            h.sim.cached_positions > 0,
            cached,
            "shared prefixes reused iff cached"
        );
    }
}

/// Submits greedy requests of (prompt, new tokens); returns (id, prompt, new) of each.
fn submit_all(h: &mut Harness, shapes: &[(u32, u32)]) -> Vec<(u64, u32, u32)> {
    shapes
        .iter()
        .map(|&(prompt, new)| (h.submit(request(prompt, new)), prompt, new))
        .collect()
}

/// Every request got exactly the tokens it would have alone, all of them.
fn assert_all_served_exactly(h: &Harness, submitted: &[(u64, u32, u32)]) {
    for &(id, prompt, new) in submitted {
        assert_eq!(
            h.tokens(id),
            expected_tokens(id, prompt, new),
            "sequence {id}"
        );
        assert_eq!(h.finished(id), Some((FinishReason::Length, new)));
    }
}

/// The device runs out of memory on two steps: nothing of them is kept, their sequences
/// are computed again, and every client gets exactly the tokens it would have.
#[test]
fn steps_out_of_device_memory_recompute_their_sequences_and_lose_nothing() {
    let recorder = CapturedMetrics::default();
    let (h, submitted) = metrics::with_local_recorder(&recorder, || {
        let mut h = Harness::new(config(4, 64, 8));
        h.sim.out_of_memory_steps.extend([3, 6]);
        let submitted = submit_all(&mut h, &[(3, 6), (5, 7), (20, 5), (2, 9)]);
        h.run_pipelined(DEPTH, 200);
        (h, submitted)
    });
    assert_all_served_exactly(&h, &submitted);
    let recomputed = submitted
        .iter()
        .filter(|&&(id, _, _)| h.sim.announcements[&id] > 1)
        .count();
    assert!(
        recomputed > 0,
        "the failed steps' sequences were announced again"
    );
    assert_eq!(recorder.counter("textgen_out_of_memory_steps_total"), 2);
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.sim.live_sequences(), 0);
}

#[test]
fn a_sequence_the_device_keeps_running_out_of_memory_on_fails_with_a_clear_error() {
    let mut h = Harness::new(config(4, 64, 8));
    h.sim.out_of_memory_steps.extend(0..100);
    let id = h.submit(request(3, 5));
    h.run_pipelined(DEPTH, 100);
    let last = h.events(id).last().expect("an event");
    assert!(
        matches!(last, SequenceEvent::Error(f) if f.kind == FailureKind::OutOfMemory
            && f.message.contains("ran out of memory")),
        "{last:?}"
    );
    assert_eq!(h.sim.announcements[&id], MAX_OUT_OF_MEMORY_STEPS);
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.sim.live_sequences(), 0);
}

/// The device runs out of memory on every step carrying more than 12 prompt tokens while
/// steps may carry 32. Two streams are decoding when three prompts arrive: the steps back
/// off to chunks that fit, and every request is served with exactly its tokens (before the
/// backoff, each retry carried as many prompt tokens as the step that failed, and the
/// third failure ended the requests in it, streams included).
#[test]
fn steps_too_large_for_the_device_back_off_until_every_request_is_served() {
    let recorder = CapturedMetrics::default();
    let (h, submitted) = metrics::with_local_recorder(&recorder, || {
        let mut h = Harness::new(config(4, 256, 32));
        h.sim.out_of_memory_above = Some(12);
        let mut submitted = submit_all(&mut h, &[(3, 20), (5, 20)]);
        let mut sent = Vec::new();
        for _ in 0..4 {
            assert!(h.pipelined_step(DEPTH, &mut sent)); // both streams decoding
        }
        submitted.extend(submit_all(&mut h, &[(50, 6), (30, 6), (9, 4)]));
        h.run_pipelined(DEPTH, 400);
        (h, submitted)
    });
    assert_all_served_exactly(&h, &submitted);
    assert!(recorder.counter("textgen_out_of_memory_steps_total") >= 2);
    let cap = h.state.memory_backoff.prefill_cap();
    assert!(cap.is_some_and(|cap| cap <= 12), "{cap:?}");
    assert_eq!(
        recorder.gauge("textgen_prefill_token_cap"),
        f64::from(cap.unwrap())
    );
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.sim.live_sequences(), 0);
}

/// Out-of-memory steps amid sharing, eviction, preemption and cancellations: every
/// client still gets its exact tokens, and the pool ends exact (the simulated shard checks
/// every cached position it is handed against what was written).
#[test]
fn out_of_memory_steps_on_a_busy_cached_pool_leave_no_unwritten_kv_in_the_cache() {
    let (h, submitted) = busy_tiny_pool(true, DEPTH, &[5, 17, 33]);
    assert_kept_streams_exact(&h, &submitted);
    assert_eq!(h.state.allocator().used() as usize, h.state.cached_blocks());
    assert_eq!(h.sim.live_sequences(), 0);
}

/// A 12-token prompt prefills in chunks of 4. Step 2 (the last chunk) is planned while
/// step 1 runs, so applying step 1 caches all 12 positions before step 2 writes the last
/// four; the device runs out of memory on step 2. Readmitted, the sequence must not find
/// those positions in the cache (the simulated shard checks what it is handed).
#[test]
fn a_chunk_cached_before_its_step_ran_out_of_memory_is_not_served_from_the_cache() {
    let mut h = Harness::new(cached_config(2, 64, 4));
    h.sim.out_of_memory_steps.insert(2);
    let id = h.submit(request(12, 3));
    h.run_pipelined(DEPTH, 100);
    assert_eq!(h.tokens(id), expected_tokens(id, 12, 3));
    assert_eq!(h.sim.announcements[&id], 2, "recomputed once");
}
