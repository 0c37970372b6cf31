//! How many decodes of a step may carry drafts (speculation's step-wide half; a sequence's
//! own pause is `speculation.rs`'s). A step of up to `MAX_DRAFTING_DECODES` decodes lets
//! each carry drafts. A wider one gives drafts to as many of its decodes as pays, maybe
//! none: the tokens the drafts are expected to add, at the rate drafts have been kept
//! lately, against what the wider step costs, as the steps run so far say
//! (`step_cost.rs`). A drafting step gives up pipelining (the shard settles the step before
//! it), so none is the norm there; one wide step in `EXPLORE_EVERY` drafts anyway, to keep
//! the rate and the costs current.
use super::step_cost::StepCosts;

/// Decodes in a step up to which every decode may carry drafts.
pub const MAX_DRAFTING_DECODES: usize = 8;
/// A wider step gives drafts to its decodes only where the estimates say that gives this
/// much more tokens a second than none (estimates are rough; drafting costs host work).
const MIN_GAIN: f64 = 1.1;
/// Wide steps planned without drafts before one drafts for `MAX_DRAFTING_DECODES` decodes
/// all the same: what it costs and how much it keeps keep the estimates current.
const EXPLORE_EVERY: u32 = 32;

/// Which decodes of a step may carry drafts, learned from the verifications answered.
#[derive(Debug, Clone, Default)]
pub struct DraftSeats {
    acceptance: Acceptance,
    /// Wide steps planned without drafts since one drafted.
    plain_wide_steps: u32,
}

impl DraftSeats {
    /// How many of a step's `decodes` decodes may carry `k` drafts each (the oldest first):
    /// all of them up to `MAX_DRAFTING_DECODES`. In a wider step, the count the estimates
    /// expect to give the most tokens a second, where that beats none by `MIN_GAIN` (a
    /// decode with drafts gives 1 + k * the rate kept); else none, except in one wide step
    /// of `EXPLORE_EVERY`.
    pub fn seats(&mut self, decodes: usize, k: u32, costs: &StepCosts) -> usize {
        if k == 0 || decodes <= MAX_DRAFTING_DECODES {
            return decodes;
        }
        let seats = self.paying_seats(decodes, k, costs);
        if seats > 0 {
            self.plain_wide_steps = 0;
            return seats;
        }
        self.plain_wide_steps += 1;
        if self.plain_wide_steps < EXPLORE_EVERY {
            return 0;
        }
        self.plain_wide_steps = 0;
        MAX_DRAFTING_DECODES
    }

    fn paying_seats(&self, decodes: usize, k: u32, costs: &StepCosts) -> usize {
        let Some(rate) = self.acceptance.rate() else {
            return 0;
        };
        let tokens_per_second = |seats: usize| {
            let tokens = decodes as f64 + seats as f64 * f64::from(k) * rate;
            let width = u32::try_from(decodes + seats * k as usize).unwrap_or(u32::MAX);
            costs.estimate(width).map(|seconds| tokens / seconds)
        };
        let Some(plain) = tokens_per_second(0) else {
            return 0;
        };
        let mut best = (0, plain * MIN_GAIN);
        let mut seats = MAX_DRAFTING_DECODES;
        while seats < decodes {
            consider(&mut best, seats, tokens_per_second(seats));
            seats *= 2;
        }
        consider(&mut best, decodes, tokens_per_second(decodes));
        best.0
    }

    /// A verification's answer: `drafted` drafts checked, `kept` of them kept.
    pub fn record(&mut self, drafted: u32, kept: u32) {
        self.acceptance.record(drafted, kept);
    }
}

fn consider(best: &mut (usize, f64), seats: usize, rate: Option<f64>) {
    if let Some(rate) = rate.filter(|&rate| rate > best.1) {
        *best = (seats, rate);
    }
}

/// The share of drafts kept, over the recent verifications of every sequence.
#[derive(Debug, Clone, Default)]
struct Acceptance {
    drafted: f64,
    kept: f64,
}

/// How much of the past a new verification leaves in the counts (about the last 200
/// verifications count).
const ACCEPTANCE_DECAY: f64 = 0.995;
/// Drafts counted before the rate is trusted.
const ACCEPTANCE_MIN_DRAFTS: f64 = 16.0;

impl Acceptance {
    fn record(&mut self, drafted: u32, kept: u32) {
        if drafted == 0 {
            return; // nothing to draft from: the pause handles it, the rate is not about it
        }
        self.drafted = self.drafted * ACCEPTANCE_DECAY + f64::from(drafted);
        self.kept = self.kept * ACCEPTANCE_DECAY + f64::from(kept);
    }

    fn rate(&self) -> Option<f64> {
        (self.drafted >= ACCEPTANCE_MIN_DRAFTS).then(|| self.kept / self.drafted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seats_at(rate: f64) -> DraftSeats {
        let mut seats = DraftSeats::default();
        for _ in 0..100 {
            seats.record(100, (rate * 100.0) as u32);
        }
        seats
    }

    /// Steps that cost `floor_ms` up to `bend` tokens, and `per_token_ms` a token past it.
    fn costs(floor_ms: f64, bend: u32, per_token_ms: f64) -> StepCosts {
        let mut costs = StepCosts::default();
        for tokens in (0..14).map(|i| 1u32 << i) {
            let ms = floor_ms + per_token_ms * f64::from(tokens.saturating_sub(bend));
            costs.record(tokens, std::time::Duration::from_secs_f64(ms / 1e3));
        }
        costs
    }

    #[test]
    fn a_small_step_drafts_on_every_decode_and_a_wide_one_as_pays() {
        let memory_bound = costs(8.0, 512, 0.05);
        let at = |rate: f64, costs: &StepCosts| seats_at(rate).seats(64, 4, costs);
        assert_eq!(
            seats_at(0.2).seats(MAX_DRAFTING_DECODES, 4, &memory_bound),
            MAX_DRAFTING_DECODES
        );
        assert_eq!(
            DraftSeats::default().seats(64, 4, &memory_bound),
            0,
            "nothing verified yet"
        );
        // Wide steps that cost little more: every decode drafts while the step stays cheap.
        assert_eq!(at(0.9, &memory_bound), 64);
        assert_eq!(at(0.2, &memory_bound), 64);
        // Compute-bound from 64 tokens (320 tokens: 13 ms against 8): at 0.9 every decode
        // drafts; at 0.1 the drafts do not pay for the wider step.
        let compute_bound = costs(8.0, 64, 0.02);
        assert_eq!(at(0.9, &compute_bound), 64);
        assert_eq!(at(0.1, &compute_bound), 0);
        // Five times dearer with the drafts: not even 0.9 pays for it.
        assert_eq!(at(0.9, &costs(8.0, 64, 0.125)), 0);
        // Nothing known as wide as the drafts would make the step.
        assert_eq!(seats_at(0.9).seats(4096, 4, &compute_bound), 0);
        assert_eq!(
            seats_at(0.9).seats(64, 0, &memory_bound),
            64,
            "k = 0: drafts_for asks none"
        );
    }

    #[test]
    fn a_wide_step_that_does_not_pay_drafts_once_in_a_while_to_stay_informed() {
        let mut seats = DraftSeats::default();
        let dear = costs(8.0, 64, 0.125);
        let mut drafting = Vec::new();
        for step in 1..=3 * EXPLORE_EVERY {
            if seats.seats(64, 4, &dear) > 0 {
                drafting.push(step);
            }
        }
        assert_eq!(
            drafting,
            [EXPLORE_EVERY, 2 * EXPLORE_EVERY, 3 * EXPLORE_EVERY]
        );
        // A step that pays drafts restarts the count.
        let cheap = costs(8.0, 512, 0.05);
        let mut seats = seats_at(0.9);
        for _ in 0..EXPLORE_EVERY - 1 {
            assert_eq!(seats.seats(64, 4, &dear), 0);
        }
        assert_eq!(seats.seats(64, 4, &cheap), 64);
        assert_eq!(seats.seats(64, 4, &dear), 0, "the count started again");
    }

    #[test]
    fn the_acceptance_rate_follows_recent_verifications() {
        let mut acceptance = Acceptance::default();
        acceptance.record(4, 4);
        assert_eq!(acceptance.rate(), None, "too few drafts to say");
        acceptance.record(0, 0); // nothing drafted: no evidence either way
        for _ in 0..4 {
            acceptance.record(4, 4);
        }
        assert_eq!(acceptance.rate(), Some(1.0));
        for _ in 0..2000 {
            acceptance.record(4, 1);
        }
        let rate = acceptance.rate().unwrap();
        assert!((0.25..0.26).contains(&rate), "{rate}");
    }
}
