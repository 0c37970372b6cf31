//! Speculative decoding, the router's half: which decodes carry drafts, and how many.
//!
//! The shard drafts (prompt lookup over the sequence's tokens) and verifies them in the
//! decode's own forward (proto `max_draft_tokens`). The router reserves budget and KV slots
//! for the drafts, counting them as kept until the answer says how many were, and plans the
//! next step before that answer as it does after a plain decode: where the sequence stands
//! is the shard's to know. The shard finishes the verification before it prepares the next
//! step (it drafts from the kept tokens on its host), so the device waits for the shard's
//! host work between the two, not for a round trip through the router. How many drafts the
//! next step asks for is decided before the verification's answer.
//!
//! It turns itself off where it costs more than it gives: a wide step gives drafts only to
//! as many of its decodes as pays (`draft_seats.rs`), and a sequence whose drafts are not
//! kept, or that the shard found nothing to draft for, pauses for a number of plain
//! (pipelined) decodes that doubles each time, up to `MAX_PAUSE`.
use std::collections::VecDeque;

use super::api::SequenceRequest;
use crate::metrics::names;

/// Longest pause, in plain decodes, after fruitless verifications. A fruitless verification
/// of 4 drafts cost 1.9 ms more than a plain decode on an H200 at batch 1 (8B, 6.4 against
/// 4.5 ms) plus the pipelining it gives up: one in 65 steps keeps that under ~1 %.
pub const MAX_PAUSE: u32 = 64;

/// Whether a request's tokens may be verified in parallel: each position's token must not
/// read the tokens before it on the host (a grammar's state, penalties, the watermark).
pub fn may_draft(request: &SequenceRequest) -> bool {
    let sampling = &request.sampling;
    request.grammar.is_none()
        && sampling.repetition_penalty.is_none_or(|p| p == 1.0)
        && sampling.frequency_penalty == 0.0
        && sampling.presence_penalty == 0.0
        && !sampling.watermark
}

/// One sequence's speculation state.
#[derive(Debug, Clone, Default)]
pub struct Drafting {
    /// Plain decodes left before it drafts again.
    pause: u32,
    /// The pause the next fruitless verification sets.
    next_pause: u32,
    /// Fruitless verifications answered so far, and for each verification in flight (oldest
    /// first) that count when it was planned. One planned before the latest fruitless answer
    /// came did not know of the pause that answer set, so its own fruitless answer does not
    /// lengthen it.
    fruitless: u32,
    in_flight: VecDeque<u32>,
}

impl Drafting {
    /// Drafts to ask for in the step being planned, where this decode has a seat
    /// (`DraftSeats::seats`): `num_draft_tokens` (the configured k), capped by the tokens the
    /// sequence may still generate after this decode's own. 0 while paused.
    pub fn wanted(&self, num_draft_tokens: u32, remaining_after_decode: u32) -> u32 {
        if self.pause > 0 {
            return 0;
        }
        num_draft_tokens.min(remaining_after_decode)
    }

    /// A plain decode was scheduled: one step of the pause is spent.
    pub fn plain_decode(&mut self) {
        self.pause = self.pause.saturating_sub(1);
    }

    /// A decode carrying drafts was scheduled.
    pub fn verification_planned(&mut self) {
        self.in_flight.push_back(self.fruitless);
    }

    /// The sequence's steps in flight will not be answered to it (preemption, recompute).
    pub fn forget_in_flight(&mut self) {
        self.in_flight.clear();
    }

    /// A verification's answer: `drafted` drafts checked, `kept` of them kept.
    pub fn record(&mut self, drafted: u32, kept: u32) {
        let planned_knowing =
            self.in_flight.pop_front().unwrap_or(self.fruitless) == self.fruitless;
        metrics::counter!(names::SPECULATIVE_DRAFT_TOKENS_TOTAL).increment(u64::from(drafted));
        metrics::counter!(names::SPECULATIVE_ACCEPTED_TOKENS_TOTAL).increment(u64::from(kept));
        if drafted > 0 {
            metrics::histogram!(names::SPECULATIVE_ACCEPTED_LENGTH).record(f64::from(kept));
        }
        if kept > 0 {
            self.next_pause = 0;
        } else if planned_knowing {
            // A verification already in flight (planned before this answer) moves the text
            // on as a plain decode would, and says afresh whether drafting pays: it counts
            // as a step of the pause.
            self.fruitless += 1;
            self.next_pause = (self.next_pause * 2).clamp(1, MAX_PAUSE);
            self.pause = self.next_pause.saturating_sub(self.in_flight.len() as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::request;

    #[test]
    fn requests_that_read_their_history_are_not_drafted_for() {
        assert!(may_draft(&request(4, 8)));
        for change in [
            |r: &mut SequenceRequest| r.sampling.repetition_penalty = Some(1.2),
            |r: &mut SequenceRequest| r.sampling.frequency_penalty = 0.5,
            |r: &mut SequenceRequest| r.sampling.presence_penalty = -0.5,
            |r: &mut SequenceRequest| r.sampling.watermark = true,
            |r: &mut SequenceRequest| r.grammar = Some(Default::default()),
        ] {
            let mut r = request(4, 8);
            change(&mut r);
            assert!(!may_draft(&r), "{r:?}");
        }
        let mut neutral = request(4, 8);
        neutral.sampling.repetition_penalty = Some(1.0);
        neutral.sampling.do_sample = true;
        assert!(
            may_draft(&neutral),
            "sampling and a neutral penalty are fine"
        );
    }

    #[test]
    fn drafts_stop_at_the_last_tokens() {
        let drafting = Drafting::default();
        assert_eq!(drafting.wanted(4, 100), 4);
        assert_eq!(drafting.wanted(4, 2), 2, "never past max_new_tokens");
        assert_eq!(drafting.wanted(0, 100), 0, "speculation off");
    }

    #[test]
    fn a_verification_planned_before_a_fruitless_answer_does_not_lengthen_its_pause() {
        // Two verifications in flight, both fruitless. The second, planned before the
        // first's answer, stands for the one-decode pause that answer sets, and its own
        // fruitless answer does not lengthen it: drafting goes on at once.
        let mut drafting = Drafting::default();
        drafting.verification_planned();
        drafting.verification_planned();
        drafting.record(4, 0);
        assert_eq!(drafting.wanted(4, 100), 4);
        drafting.record(4, 0);
        assert_eq!(drafting.wanted(4, 100), 4);
        // The next one knew of the first fruitless answer: fruitless too, with another in
        // flight behind it, it pauses 2 - 1 plain decodes.
        drafting.verification_planned();
        drafting.verification_planned();
        drafting.record(4, 0);
        assert_eq!(drafting.wanted(4, 100), 0);
        drafting.plain_decode();
        assert_eq!(drafting.wanted(4, 100), 4);
    }

    #[test]
    fn fruitless_verifications_pause_longer_each_time_and_a_kept_draft_resets_it() {
        let mut drafting = Drafting::default();
        let mut pauses = Vec::new();
        for _ in 0..9 {
            drafting.record(0, 0);
            let mut pause = 0;
            while drafting.wanted(4, 100) == 0 {
                drafting.plain_decode();
                pause += 1;
            }
            pauses.push(pause);
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        drafting.record(4, 1);
        assert_eq!(drafting.wanted(4, 100), 4, "a kept draft: no pause");
        drafting.record(4, 0);
        assert_eq!(
            drafting.wanted(4, 100),
            0,
            "and the next fruitless one starts at 1 again"
        );
        drafting.plain_decode();
        assert_eq!(drafting.wanted(4, 100), 4);
    }
}
