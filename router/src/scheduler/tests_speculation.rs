//! Speculative decoding against the simulated shard, which drafts and keeps drafts by a
//! fixed rule (`drafts_at`) and writes a false KV identity into a rejected draft's slot:
//! every stream gets exactly the tokens it gets without drafts, nothing past its end, and
//! no cached or preempted state ever relies on a rejected draft.
use super::api::{FinishReason, SchedulerConfig};
use super::draft_seats::MAX_DRAFTING_DECODES;
use super::test_harness::{assert_kept_streams_exact, busy_tiny_pool_on, expected_tokens, Harness};
use super::test_support::{cached_config, config, drafts_at, request, token_at, CapturedMetrics};
use crate::metrics::names;
use crate::pb;

const DEPTH: usize = 2;

fn drafting(cfg: SchedulerConfig, k: u32) -> SchedulerConfig {
    SchedulerConfig {
        num_draft_tokens: k,
        ..cfg
    }
}

fn drafts_sent(sent: &[pb::StepRequest]) -> u32 {
    sent.iter()
        .flat_map(|step| &step.sequences)
        .map(|s| s.max_draft_tokens)
        .sum()
}

#[test]
fn a_drafting_stream_gets_exactly_its_tokens_in_fewer_steps() {
    let mut plain = Harness::new(config(4, 64, 64));
    let id = plain.submit(request(5, 40));
    let plain_steps = plain.run_pipelined(DEPTH, 500).len();

    let mut h = Harness::new(drafting(config(4, 64, 64), 4));
    let id2 = h.submit(request(5, 40));
    assert_eq!(id, id2);
    let sent = h.run_pipelined(DEPTH, 500);
    assert_eq!(h.tokens(id), expected_tokens(id, 5, 40));
    assert_eq!(h.finished(id), Some((FinishReason::Length, 40)));
    assert!(drafts_sent(&sent) > 0);
    assert!(
        sent.len() < plain_steps,
        "{} steps with drafts, {plain_steps} without",
        sent.len()
    );
    assert_eq!(h.state.allocator().used(), 0, "every block came back");
}

#[test]
fn drafts_never_reach_past_max_new_tokens() {
    for max_new in 1..12 {
        let mut h = Harness::new(drafting(config(4, 64, 64), 8));
        let id = h.submit(request(3, max_new));
        let sent = h.run_pipelined(DEPTH, 200);
        // Replay the simulated shard's rule over the steps sent, in order.
        let (mut generated, mut position) = (0, 3);
        for scheduled in sent.iter().flat_map(|s| &s.sequences).filter(|s| s.sample) {
            let k = scheduled.max_draft_tokens;
            assert!(
                generated + 1 + k <= max_new,
                "max_new_tokens {max_new}: {generated} generated, then a decode with {k} drafts"
            );
            let kept = if k > 0 {
                drafts_at(id, position, k).1
            } else {
                0
            };
            generated += 1 + kept;
            position += 1 + kept;
        }
        assert_eq!(generated, max_new);
        assert_eq!(
            h.tokens(id),
            expected_tokens(id, 3, max_new),
            "max_new {max_new}"
        );
    }
}

#[test]
fn a_stop_token_inside_a_verified_run_ends_the_stream_there() {
    // Find a position where the simulated shard keeps at least two drafts, and make the
    // first kept one a stop token: the tokens after it in the same answer are dropped.
    let mut h = Harness::new(drafting(config(4, 64, 64), 4));
    let mut req = request(5, 60);
    let id = 0; // the harness seeds each request with its id
    let stop_at = (6..60)
        .find(|&p| drafts_at(id, 5 + p, 4).1 >= 2)
        .expect("the rule keeps two drafts somewhere");
    req.stop_token_ids = vec![token_at(id, 5 + stop_at + 1)];
    assert!(
        !expected_tokens(id, 5, stop_at + 1).contains(&req.stop_token_ids[0]),
        "the stop token does not come earlier"
    );
    assert_eq!(h.submit(req), id);
    h.run_pipelined(DEPTH, 500);
    assert_eq!(h.tokens(id), expected_tokens(id, 5, stop_at + 2));
    assert_eq!(h.finished(id), Some((FinishReason::EosToken, stop_at + 2)));
    assert_eq!(h.state.allocator().used(), 0);
}

#[test]
fn a_wide_batch_with_nothing_known_drafts_only_to_explore_and_history_readers_never() {
    let mut h = Harness::new(drafting(config(4, 256, 256), 4));
    for _ in 0..=MAX_DRAFTING_DECODES {
        h.submit(request(3, 6));
    }
    let sent = h.run_pipelined(DEPTH, 500);
    let busy = sent
        .iter()
        .filter(|s| s.sequences.iter().filter(|q| q.num_tokens == 1).count() > MAX_DRAFTING_DECODES)
        .collect::<Vec<_>>();
    assert!(!busy.is_empty());
    assert!(
        busy.iter()
            .all(|s| s.sequences.iter().all(|q| q.max_draft_tokens == 0)),
        "a wide step drafted with nothing known (fewer than EXPLORE_EVERY wide steps here)"
    );

    let mut h = Harness::new(drafting(config(4, 64, 64), 4));
    let mut penalised = request(3, 20);
    penalised.sampling.repetition_penalty = Some(1.3);
    let id = h.submit(penalised);
    let sent = h.run_pipelined(DEPTH, 500);
    assert_eq!(drafts_sent(&sent), 0);
    assert_eq!(h.tokens(id), expected_tokens(id, 3, 20));
}

#[test]
fn a_verification_is_planned_past_with_slots_for_every_draft_kept() {
    let mut h = Harness::new(drafting(config(4, 64, 64), 4));
    let id = h.submit(request(5, 30));
    let other = h.submit(request(4, 30));
    h.step(); // both prefills, answered
    let now = std::time::Instant::now();
    let first = h.state.plan_step(now).expect("two decodes");
    assert!(first
        .request
        .sequences
        .iter()
        .all(|s| s.max_draft_tokens == 4));
    assert!(
        h.state.may_plan_ahead(),
        "the next step goes out before the verification's answer"
    );
    let second = h.state.plan_step(now).expect("both decode again");
    assert!(second
        .request
        .sequences
        .iter()
        .all(|s| s.max_draft_tokens == 4));
    // Each sequence's blocks cover its positions as if the first step kept every draft:
    // 6 known tokens (5 of prompt, 1 sampled), 5 + 5 positions in flight.
    let sequence = &h.state.running[&id];
    assert_eq!(sequence.computed, 5 + 5 + 5);
    assert!(sequence.blocks.len() as u32 * 4 >= sequence.computed);
    run_planned(&mut h, vec![first, second]);
    h.check_pool_accounting();
    h.run_pipelined(DEPTH, 500);
    assert_eq!(h.tokens(id), expected_tokens(id, 5, 30));
    assert_eq!(h.tokens(other), expected_tokens(other, 4, 30));
}

/// Runs planned steps on the simulated shard and applies their answers, in order.
fn run_planned(h: &mut Harness, steps: Vec<super::PlannedStep>) {
    let answers: Vec<_> = steps
        .into_iter()
        .map(|planned| {
            h.state.deliver(planned.events);
            h.sim.step(&planned.request)
        })
        .collect();
    for answer in answers {
        let deliveries = h.state.apply(answer);
        h.state.deliver(deliveries);
    }
    h.collect();
}

#[test]
fn a_drafting_sequence_never_sits_out_a_step() {
    // Verifications and the plain decodes of a pause are each planned before the step in
    // flight answers: the shard finishes that step before it drafts for the next.
    let mut h = Harness::new(drafting(config(4, 64, 64), 4));
    let id = h.submit(request(5, 80));
    h.step(); // the prefill
    let now = std::time::Instant::now();
    let mut ahead_of = std::collections::BTreeMap::<(bool, bool), u32>::new();
    while let Some(first) = h.state.plan_step(now) {
        if first.request.sequences.is_empty() {
            run_planned(&mut h, vec![first]); // its release
            continue;
        }
        assert!(h.state.may_plan_ahead());
        let Some(second) = h.state.plan_step(now) else {
            assert_eq!(
                h.state.running[&id].tokens_left(),
                0,
                "it sat out with tokens left, counting the drafts in flight as kept"
            );
            run_planned(&mut h, vec![first]);
            continue;
        };
        let drafts =
            |p: &super::PlannedStep| p.request.sequences.iter().any(|s| s.max_draft_tokens > 0);
        *ahead_of
            .entry((drafts(&first), drafts(&second)))
            .or_default() += 1;
        run_planned(&mut h, vec![first, second]);
    }
    assert_eq!(h.tokens(id), expected_tokens(id, 5, 80));
    // A verification planned past a verification, and past a plain decode of a pause.
    assert!(
        ahead_of.get(&(true, true)).is_some_and(|&n| n > 0),
        "{ahead_of:?}"
    );
    assert!(
        ahead_of.get(&(false, true)).is_some_and(|&n| n > 0),
        "{ahead_of:?}"
    );
}

#[test]
fn preemption_and_the_prefix_cache_never_keep_a_rejected_draft() {
    // The busy tiny pool: shared prefixes, preemptions, clients leaving, with drafts. The
    // simulated shard checks that every cached position announced holds its true KV, so
    // a rejected draft's slot counted as computed would fail it.
    for cfg in [cached_config(2, 24, 9), config(2, 24, 9)] {
        for depth in [1, DEPTH] {
            let (h, submitted) = busy_tiny_pool_on(drafting(cfg.clone(), 3), depth, &[]);
            assert_kept_streams_exact(&h, &submitted);
            assert_eq!(h.sim.live_sequences(), 0);
        }
    }
}

#[test]
fn drafted_and_kept_tokens_are_counted() {
    let recorder = CapturedMetrics::default();
    let (id, sent) = metrics::with_local_recorder(&recorder, || {
        let mut h = Harness::new(drafting(config(4, 64, 64), 4));
        let id = h.submit(request(5, 40));
        (id, h.run_pipelined(DEPTH, 500))
    });
    let mut drafted = 0;
    let mut kept = 0;
    let mut position = 5;
    for scheduled in sent.iter().flat_map(|s| &s.sequences).filter(|s| s.sample) {
        if scheduled.num_tokens > 1 {
            position += 1; // the prefill's token
            continue;
        }
        let (d, k) = drafts_at(id, position, scheduled.max_draft_tokens);
        drafted += d;
        kept += k;
        position += 1 + k;
    }
    assert!(drafted > 0 && kept > 0);
    assert_eq!(
        recorder.counter(names::SPECULATIVE_DRAFT_TOKENS_TOTAL),
        u64::from(drafted)
    );
    assert_eq!(
        recorder.counter(names::SPECULATIVE_ACCEPTED_TOKENS_TOTAL),
        u64::from(kept)
    );
    let lengths = recorder.samples(names::SPECULATIVE_ACCEPTED_LENGTH);
    assert_eq!(lengths.iter().sum::<f64>(), f64::from(kept));
}

#[test]
fn an_answer_with_more_tokens_than_drafts_verified_fails_only_that_sequence() {
    let mut h = Harness::new(drafting(config(4, 64, 64), 4));
    let id = h.submit(request(5, 30));
    let other = h.submit(request(4, 3));
    h.step(); // both prefills
    let planned = h
        .state
        .plan_step(std::time::Instant::now())
        .expect("two decodes");
    h.state.deliver(planned.events);
    let mut answer = h.sim.step(&planned.request);
    let output = answer
        .outputs
        .iter_mut()
        .find(|o| o.id == id)
        .expect("its output");
    output.drafted = 0;
    output.next_tokens.push(pb::Token::default()); // a token past what was verified
    let deliveries = h.state.apply(answer);
    h.state.deliver(deliveries);
    h.collect();
    assert!(matches!(
        h.events(id).last(),
        Some(super::api::SequenceEvent::Error(_))
    ));
    h.run_pipelined(DEPTH, 100);
    assert_eq!(h.tokens(other), expected_tokens(other, 4, 3));
    assert_eq!(h.state.allocator().used(), 0);
}

#[test]
fn a_wide_batch_drafts_on_every_decode_where_steps_stay_cheap_and_drafts_are_kept() {
    use std::time::Duration;
    let wide = 2 * MAX_DRAFTING_DECODES;
    let mut h = Harness::new(drafting(config(4, 256, 256), 4));
    // As if learned: steps cost 8 ms up to 1,024 tokens, and 9 drafts in 10 were kept.
    for tokens in [1, 16, 64, 256, 1024] {
        h.state.step_costs.record(tokens, Duration::from_millis(8));
    }
    for _ in 0..50 {
        h.state.draft_seats.record(10, 10, 9);
    }
    let ids: Vec<u64> = (0..wide).map(|_| h.submit(request(3, 24))).collect();
    let sent = h.run_pipelined(DEPTH, 500);
    let full = sent
        .iter()
        .filter(|s| s.sequences.iter().filter(|q| q.num_tokens == 1).count() == wide)
        .collect::<Vec<_>>();
    assert!(!full.is_empty(), "no step decoded every sequence");
    assert!(
        full.iter()
            .any(|s| s.sequences.iter().all(|q| q.max_draft_tokens > 0)),
        "no step of {wide} decodes gave each of them drafts"
    );
    for id in ids {
        assert_eq!(h.tokens(id), expected_tokens(id, 3, 24));
    }
    assert_eq!(h.state.allocator().used(), 0);
}
