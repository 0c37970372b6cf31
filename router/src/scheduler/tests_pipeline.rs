//! Two steps in flight: step N+1 is planned and sent before step N's tokens arrive, as
//! the real step loop does. The simulated shard runs each step as it is sent.
use std::time::Instant;

use super::api::FinishReason;
use super::test_harness::{busy_tiny_pool, expected_tokens, Harness};
use super::test_support::{config, request, token_at};

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
        let (h, submitted) = busy_tiny_pool(cached, DEPTH);
        for &(id, len, new_tokens) in &submitted {
            if h.streams.contains_key(&id) {
                assert_eq!(
                    h.tokens(id),
                    expected_tokens(id, len, new_tokens),
                    "sequence {id}"
                );
                assert_eq!(h.finished(id), Some((FinishReason::Length, new_tokens)));
            }
        }
        assert_eq!(h.state.allocator().used() as usize, h.state.cached_blocks());
        assert_eq!(h.sim.live_sequences(), 0);
        assert_eq!(
            h.sim.cached_positions > 0,
            cached,
            "shared prefixes reused iff cached"
        );
    }
}
