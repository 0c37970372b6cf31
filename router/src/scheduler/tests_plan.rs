//! Planning and applying steps without tokio: a harness drives `SchedulerState`
//! against the protocol-checking `ShardSim`.
use std::time::Instant;

use super::api::{FailureKind, FinishReason, SequenceEvent, SequenceRequest, Submission};
use super::state::SchedulerState;
use super::test_harness::{chunks, expected_tokens, Harness};
use super::test_support::{config, prompt_logprob, request, token_at, CapturedMetrics};

#[test]
fn long_prompt_prefills_in_chunks_and_samples_only_on_the_last() {
    let mut h = Harness::new(config(4, 64, 8));
    let id = h.submit(request(20, 3));
    let first = h.step().unwrap();
    assert_eq!(first.new_sequences.len(), 1);
    assert_eq!(first.new_sequences[0].input_ids.len(), 20);
    assert_eq!(chunks(&first), vec![(id, 8, false)]);
    let second = h.step().unwrap();
    assert!(second.new_sequences.is_empty());
    assert_eq!(chunks(&second), vec![(id, 8, false)]);
    assert!(h.tokens(id).is_empty());
    let third = h.step().unwrap();
    assert_eq!(chunks(&third), vec![(id, 4, true)]);
    assert_eq!(h.tokens(id), expected_tokens(id, 20, 1));
    h.run_to_idle(10);
    assert_eq!(h.tokens(id), expected_tokens(id, 20, 3));
    assert_eq!(h.finished(id), Some((FinishReason::Length, 3)));
    let started = h
        .events(id)
        .iter()
        .filter(|e| matches!(e, SequenceEvent::Started { .. }))
        .count();
    assert_eq!(started, 1);
    assert!(matches!(h.events(id)[0], SequenceEvent::Started { .. }));
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(
        h.sim.live_sequences(),
        0,
        "the finished sequence was released on the shard"
    );
}

#[test]
fn decodes_go_first_and_prefill_gets_the_rest_of_the_budget() {
    let mut h = Harness::new(config(4, 64, 8));
    let a = h.submit(request(3, 10));
    let b = h.submit(request(2, 10));
    assert_eq!(chunks(&h.step().unwrap()), vec![(a, 3, true), (b, 2, true)]);
    let c = h.submit(request(30, 2));
    let step = h.step().unwrap();
    assert_eq!(
        chunks(&step),
        vec![(a, 1, true), (b, 1, true), (c, 6, false)]
    );
    let step = h.step().unwrap();
    assert_eq!(
        chunks(&step),
        vec![(a, 1, true), (b, 1, true), (c, 6, false)]
    );
    h.run_to_idle(50);
    for (id, prompt) in [(a, 3), (b, 2)] {
        assert_eq!(h.tokens(id), expected_tokens(id, prompt, 10));
    }
    assert_eq!(h.tokens(c), expected_tokens(c, 30, 2));
}

#[test]
fn max_batch_size_caps_running_sequences() {
    let mut cfg = config(4, 64, 100);
    cfg.max_batch_size = Some(2);
    let mut h = Harness::new(cfg);
    let ids: Vec<u64> = (0..3).map(|_| h.submit(request(2, 2))).collect();
    let step = h.step().unwrap();
    assert_eq!(step.sequences.len(), 2);
    assert_eq!(h.state.waiting_len(), 1);
    h.run_to_idle(20);
    for id in ids {
        assert_eq!(h.finished(id), Some((FinishReason::Length, 2)));
    }
}

#[test]
fn deltas_announce_once_and_send_only_new_blocks() {
    let mut h = Harness::new(config(4, 64, 6));
    let id = h.submit(request(10, 12));
    let mut sent_blocks: Vec<u32> = Vec::new();
    let mut announced = 0;
    while let Some(step) = h.step() {
        announced += step.new_sequences.iter().filter(|n| n.id == id).count();
        for scheduled in step.sequences.iter().filter(|s| s.id == id) {
            for block in &scheduled.new_block_ids {
                assert!(!sent_blocks.contains(block), "block {block} sent twice");
            }
            sent_blocks.extend(&scheduled.new_block_ids);
            let table = h.state.running.get(&id).map(|s| s.blocks.ids().to_vec());
            if let Some(table) = table {
                assert_eq!(table, sent_blocks, "the shard's table equals the router's");
            }
        }
    }
    assert_eq!(announced, 1);
    // 10 prompt + 12 generated, the last never stored: 21 positions in 4-token blocks.
    assert_eq!(sent_blocks.len(), 6);
    assert_eq!(h.tokens(id), expected_tokens(id, 10, 12));
}

#[test]
fn pool_exhaustion_preempts_the_youngest_and_it_finishes_later() {
    // 6 blocks of 4 = 24 slots; each sequence needs 4 + 12 - 1 = 15 slots (4 blocks).
    let mut h = Harness::new(config(4, 6, 64));
    let old = h.submit(request(4, 12));
    let young = h.submit(request(4, 12));
    let mut preempted_step = None;
    for n in 0..100 {
        let Some(step) = h.step() else { break };
        if step.released_ids.contains(&young) && preempted_step.is_none() {
            preempted_step = Some(n);
            assert!(h.state.running.contains_key(&old));
        }
        let readmitted = step.new_sequences.iter().find(|s| s.id == young);
        if let (Some(new), Some(_)) = (readmitted, preempted_step) {
            // Recompute: the prompt plus what was generated, prompt_len unchanged.
            assert_eq!(new.prompt_len, 4);
            assert!(new.input_ids.len() > 4);
            assert_eq!(
                &new.input_ids[4..],
                &h.tokens(young)[..new.input_ids.len() - 4]
            );
        }
    }
    assert!(
        preempted_step.is_some(),
        "the pool was too small for both: one must be preempted"
    );
    assert_eq!(h.sim.announcements[&young], 2);
    assert_eq!(h.sim.announcements[&old], 1);
    assert_eq!(h.tokens(old), expected_tokens(old, 4, 12));
    assert_eq!(h.tokens(young), expected_tokens(young, 4, 12));
    assert_eq!(h.finished(young), Some((FinishReason::Length, 12)));
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.sim.live_blocks(), 0);
}

#[test]
fn many_sequences_on_a_tiny_pool_all_finish() {
    let mut h = Harness::new(config(2, 10, 7));
    let mut expected = Vec::new();
    for i in 0..12u32 {
        let prompt = 1 + (i * 7) % 9;
        let new_tokens = 1 + (i * 5) % 11;
        expected.push((h.submit(request(prompt, new_tokens)), prompt, new_tokens));
    }
    h.run_to_idle(2_000);
    for (id, prompt, new_tokens) in expected {
        assert_eq!(
            h.tokens(id),
            expected_tokens(id, prompt, new_tokens),
            "sequence {id}"
        );
        assert_eq!(h.finished(id), Some((FinishReason::Length, new_tokens)));
    }
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.sim.live_sequences(), 0);
}

#[test]
fn a_dropped_stream_frees_blocks_before_the_next_step() {
    let mut h = Harness::new(config(4, 16, 64));
    let keep = h.submit(request(8, 20));
    let gone = h.submit(request(8, 20));
    h.step();
    h.step();
    let held = h.state.running[&gone].blocks.len() as u32;
    assert!(held > 0);
    let used_before = h.state.allocator.used();
    h.streams.remove(&gone);
    let step = h.step().unwrap();
    assert_eq!(step.released_ids, vec![gone]);
    assert!(step.sequences.iter().all(|s| s.id != gone));
    assert!(h.state.allocator.used() <= used_before - held + 1);
    assert_eq!(h.sim.live_sequences(), 1);
    h.run_to_idle(50);
    assert_eq!(h.tokens(keep).len(), 20);
}

#[test]
fn the_last_allowed_token_being_eos_finishes_for_length_as_the_decoder_says() {
    // The 4th token is a stop token and max_new_tokens is 4: `crate::finish` says Length
    // (TGI's order), here as in `infer::sequence`, where the same case is tested.
    let mut h = Harness::new(config(4, 16, 64));
    let mut req = request(5, 4);
    req.stop_token_ids = vec![token_at(0, 5 + 3)];
    let id = h.submit(req);
    h.run_to_idle(20);
    assert_eq!(h.tokens(id), expected_tokens(id, 5, 4));
    assert_eq!(h.finished(id), Some((FinishReason::Length, 4)));
}

#[test]
fn eos_finishes_early_with_the_eos_token_last() {
    let mut h = Harness::new(config(4, 16, 64));
    let mut req = request(5, 50);
    let stop = token_at(0, 5 + 3);
    req.stop_token_ids = vec![stop];
    let id = h.submit(req);
    assert_eq!(id, 0);
    h.run_to_idle(20);
    assert_eq!(h.tokens(id), expected_tokens(id, 5, 4));
    assert_eq!(h.finished(id), Some((FinishReason::EosToken, 4)));
    assert!(matches!(
        h.events(id).last(),
        Some(SequenceEvent::Finished { .. })
    ));
}

#[test]
fn prefill_logprobs_are_concatenated_and_sent_once_before_the_first_token() {
    let mut h = Harness::new(config(4, 32, 5));
    let mut req = request(12, 2);
    req.prefill_logprobs = true;
    let id = h.submit(req);
    h.run_to_idle(20);
    let events = h.events(id);
    let prefill: Vec<&Vec<f32>> = events
        .iter()
        .filter_map(|e| match e {
            SequenceEvent::Prefill { logprobs } => Some(logprobs),
            _ => None,
        })
        .collect();
    assert_eq!(prefill.len(), 1);
    let expected: Vec<f32> = (1..12).map(prompt_logprob).collect();
    assert_eq!(prefill[0], &expected);
    assert!(matches!(events[1], SequenceEvent::Prefill { .. }));
    assert!(matches!(events[2], SequenceEvent::Token(_)));
}

#[test]
fn a_failed_step_errors_running_sequences_and_serving_continues() {
    let mut h = Harness::new(config(4, 16, 64));
    let a = h.submit(request(4, 10));
    h.step();
    let used = h.state.allocator.used();
    assert!(used > 0);
    let planned = h.state.plan_step(Instant::now()).unwrap();
    h.sim.lose_step();
    let deliveries = h.state.fail_all(&"shard 1 is gone".into());
    h.state.deliver(deliveries);
    drop(planned);
    h.collect();
    assert!(
        matches!(h.events(a).last(), Some(SequenceEvent::Error(m)) if m.message == "shard 1 is gone")
    );
    assert_eq!(h.state.allocator.used(), 0);
    assert_eq!(h.state.running_len(), 0);
    let b = h.submit(request(4, 3));
    let step = h.step().unwrap();
    assert_eq!(step.released_ids, vec![a]);
    h.run_to_idle(10);
    assert_eq!(h.tokens(b), expected_tokens(b, 4, 3));
}

#[test]
fn a_response_for_the_wrong_step_fails_the_batch() {
    let mut h = Harness::new(config(4, 16, 64));
    let a = h.submit(request(4, 10));
    let planned = h.state.plan_step(Instant::now()).unwrap();
    let mut response = h.sim.step(&planned.request);
    response.step_id += 7;
    let deliveries = h.state.apply(response);
    h.state.deliver(deliveries);
    h.collect();
    assert!(
        matches!(h.events(a).last(), Some(SequenceEvent::Error(m)) if m.message.contains("step 7") && m.kind == FailureKind::Protocol)
    );
    assert_eq!(h.state.allocator.used(), 0);
}

#[test]
fn a_sequence_the_shard_refused_fails_alone_with_only_its_reason() {
    let mut h = Harness::new(config(4, 16, 64));
    let a = h.submit(request(4, 3));
    let b = h.submit(request(4, 3));
    let planned = h.state.plan_step(Instant::now()).unwrap();
    let mut response = h.sim.step(&planned.request);
    let refused = response.outputs.iter_mut().find(|o| o.id == a).unwrap();
    refused.token = None;
    refused.error = "temperature must be finite and > 0, got inf".into();
    let deliveries = h.state.apply(response);
    h.state.deliver(deliveries);
    h.collect();
    assert!(matches!(h.events(a).last(),
        Some(SequenceEvent::Refused(m)) if m == "temperature must be finite and > 0, got inf"));
    // The other sequence of the step goes on, and the refused one is released.
    let step = h.step().unwrap();
    assert_eq!(step.released_ids, vec![a]);
    h.run_to_idle(10);
    assert_eq!(h.tokens(b), expected_tokens(b, 4, 3));
    assert!(h
        .events(b)
        .iter()
        .all(|e| !matches!(e, SequenceEvent::Error(_) | SequenceEvent::Refused(_))));
}

#[test]
fn a_missing_token_fails_only_that_sequence() {
    let mut h = Harness::new(config(4, 16, 64));
    let a = h.submit(request(4, 3));
    let b = h.submit(request(4, 3));
    let planned = h.state.plan_step(Instant::now()).unwrap();
    let mut response = h.sim.step(&planned.request);
    response.outputs.retain(|o| o.id != a);
    let deliveries = h.state.apply(response);
    h.state.deliver(deliveries);
    h.collect();
    assert!(
        matches!(h.events(a).last(), Some(SequenceEvent::Error(m)) if m.message.contains("no token"))
    );
    h.run_to_idle(10);
    assert_eq!(h.tokens(b), expected_tokens(b, 4, 3));
}

#[test]
fn requests_that_can_never_run_are_refused_at_submission() {
    let mut state = SchedulerState::new(config(4, 4, 64));
    let refuse = |state: &mut SchedulerState, request: SequenceRequest| {
        let (events, mut stream) = super::event_channel();
        assert!(state
            .submit(Submission { request, events }, Instant::now())
            .is_none());
        match stream.try_recv() {
            Ok(SequenceEvent::Error(failure)) => failure.message,
            other => panic!("expected an error, got {other:?}"),
        }
    };
    assert!(refuse(&mut state, request(0, 4)).contains("no tokens"));
    assert!(refuse(&mut state, request(4, 0)).contains("max_new_tokens"));
    // 16 slots; 10 + 8 - 1 = 17 needed.
    assert!(refuse(&mut state, request(10, 8)).contains("17 tokens"));
    let (events, _stream) = super::event_channel();
    assert!(state
        .submit(
            Submission {
                request: request(10, 7),
                events
            },
            Instant::now()
        )
        .is_some());
    assert!(!state.is_idle());
}

#[test]
fn preemptions_and_queue_time_are_measured() {
    let recorder = CapturedMetrics::default();
    let announcements = metrics::with_local_recorder(&recorder, || {
        let mut h = Harness::new(config(4, 6, 64));
        h.submit(request(4, 12));
        h.submit(request(4, 12));
        h.run_to_idle(100);
        h.sim.announcements.clone()
    });
    let recomputes: u32 = announcements.values().map(|count| count - 1).sum();
    assert!(recomputes > 0);
    assert_eq!(
        recorder.counter("textgen_preemptions_total"),
        u64::from(recomputes)
    );
    let queue_times = recorder.samples("textgen_queue_duration_seconds");
    assert_eq!(
        queue_times.len(),
        2,
        "recorded once per request, not per readmission"
    );
    assert!(queue_times.iter().all(|&seconds| seconds >= 0.0));
}

#[test]
fn a_stream_too_far_behind_its_reader_is_dropped_and_the_batch_goes_on() {
    let mut cfg = config(4, 16, 64);
    cfg.max_stream_backlog = 3;
    let mut h = Harness::new(cfg);
    let slow = h.submit(request(4, 10));
    let b = h.submit(request(4, 10));
    let mut unread = h.streams.remove(&slow).unwrap();
    h.run_to_idle(40);
    assert_eq!(
        h.tokens(b),
        expected_tokens(b, 4, 10),
        "the reader that keeps up is served whole"
    );
    let mut seen = Vec::new();
    while let Ok(event) = unread.try_recv() {
        seen.push(event);
    }
    // Started and two tokens made the backlog of 3; then the error, then nothing.
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        matches!(seen.last(), Some(SequenceEvent::Error(m)) if m.message.contains("too slowly"))
    );
    assert!(
        h.state.is_idle(),
        "its blocks went back and the shards released it"
    );
}

/// Steps timed flat at 7 ms up to 256 tokens, then 25 us a token more.
fn bent_step_costs(state: &mut SchedulerState) {
    let ms = |ms: f64| std::time::Duration::from_secs_f64(ms / 1e3);
    for tokens in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
        state.step_costs.record(tokens, ms(7.0));
    }
    for tokens in [512u32, 1024] {
        state
            .step_costs
            .record(tokens, ms(7.0 + 0.025 * f64::from(tokens - 256)));
    }
}

#[test]
fn pacing_holds_a_prompt_beside_decodes_to_the_bend_until_its_patience_runs_out() {
    use super::api::SchedulerConfig;
    use super::prefill_pacing::PrefillPacing;
    let paced = |patience_ms: u64| SchedulerConfig {
        prefill_pacing: Some(PrefillPacing {
            slack: 0.11,
            patience: std::time::Duration::from_millis(patience_ms),
        }),
        ..config(16, 1024, 1024)
    };
    for (patience_ms, chunk, paced_steps) in [(3_600_000, 286 - 2, 1), (0, 1024 - 2, 0)] {
        let recorder = CapturedMetrics::default();
        let mut h = Harness::new(paced(patience_ms));
        bent_step_costs(&mut h.state);
        let a = h.submit(request(3, 50));
        let b = h.submit(request(3, 50));
        let c = metrics::with_local_recorder(&recorder, || {
            // At idle nothing is paced: the first step admits both at once.
            assert_eq!(chunks(&h.step().unwrap()), vec![(a, 3, true), (b, 3, true)]);
            let c = h.submit(request(2000, 2));
            // 2 decodes cost 7 ms; 11 % more allows 286 tokens (30 past the bend).
            let step = h.step().unwrap();
            assert_eq!(
                chunks(&step),
                vec![(a, 1, true), (b, 1, true), (c, chunk, false)],
                "patience {patience_ms} ms"
            );
            c
        });
        assert_eq!(
            recorder.counter("textgen_prefill_paced_steps_total"),
            paced_steps
        );
        h.run_to_idle(100);
        assert_eq!(h.tokens(c), expected_tokens(c, 2000, 2));
        for id in [a, b] {
            assert_eq!(h.tokens(id), expected_tokens(id, 3, 50));
        }
    }
}
