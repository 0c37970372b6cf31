//! How many decodes of a step may carry drafts (speculation's step-wide half; a sequence's
//! own pause is `speculation.rs`'s). A step of up to `MAX_DRAFTING_DECODES` decodes lets
//! each carry drafts. A wider one gives drafts to as many of its decodes as pays, maybe
//! none: the tokens the drafts are expected to add (at the shares of drafts proposed and
//! kept lately) against what the wider step's forward costs, as the steps run so far say
//! (`step_cost.rs`), plus the time drafting takes, learned by the number of decodes drafted
//! for (prompt lookup's host work, or a draft model's forwards). A drafting step gives up
//! pipelining (the shard settles the step before it), so none is the norm there; a wide
//! step drafts anyway now and then, to keep the shares and the costs current: one in
//! `EXPLORE_EVERY` at most, and only as its expected extra time fits in `EXPLORE_SHARE` of
//! the plain wide steps' since the last (a draft model's exploring steps cost 3-5 % of a
//! burst's throughput at one in 32, `bench/results/speculation_h100_stop51.md`).
use super::step_cost::StepCosts;

/// Decodes in a step up to which every decode may carry drafts.
pub const MAX_DRAFTING_DECODES: usize = 8;
/// A wider step gives drafts to its decodes only where the estimates say that gives this
/// much more tokens a second than none (estimates are rough; drafting costs host work).
const MIN_GAIN: f64 = 1.1;
/// Wide steps planned without drafts before one drafts for `MAX_DRAFTING_DECODES` decodes
/// all the same: what it costs and how much it keeps keep the estimates current.
const EXPLORE_EVERY: u32 = 32;
/// The most an exploring step's expected extra time may be, as a share of the time the plain
/// wide steps took since the last step that drafted.
const EXPLORE_SHARE: f64 = 0.01;

/// Which decodes of a step may carry drafts, learned from the verifications answered.
#[derive(Debug, Clone, Default)]
pub struct DraftSeats {
    acceptance: Acceptance,
    /// The time drafting took, by the number of decodes drafted for.
    proposing: StepCosts,
    /// Wide steps planned without drafts since one drafted, and their estimated seconds.
    plain_wide_steps: u32,
    plain_wide_seconds: f64,
}

impl DraftSeats {
    /// How many of a step's `decodes` decodes may carry `k` drafts each (the oldest first):
    /// all of them up to `MAX_DRAFTING_DECODES`. In a wider step, the count the estimates
    /// expect to give the most tokens a second, where that beats none by `MIN_GAIN` (a
    /// decode with drafts gives 1 + k * the shares proposed and kept); else none, except in
    /// the wide steps that explore (`explores`).
    pub fn seats(&mut self, decodes: usize, k: u32, costs: &StepCosts) -> usize {
        if k == 0 || decodes <= MAX_DRAFTING_DECODES {
            return decodes;
        }
        let seats = self.paying_seats(decodes, k, costs);
        if seats == 0 && !self.explores(decodes, k, costs) {
            return 0;
        }
        self.plain_wide_steps = 0;
        self.plain_wide_seconds = 0.0;
        seats.max(MAX_DRAFTING_DECODES)
    }

    /// Whether this wide step, where no drafts pay, drafts for `MAX_DRAFTING_DECODES` decodes
    /// all the same: one in `EXPLORE_EVERY` at most, and only where the extra time expected
    /// is at most `EXPLORE_SHARE` of the plain wide steps' since the last that drafted (while
    /// that extra time cannot be estimated, at the count alone).
    fn explores(&mut self, decodes: usize, k: u32, costs: &StepCosts) -> bool {
        let width = u32::try_from(decodes).unwrap_or(u32::MAX);
        self.plain_wide_steps += 1;
        self.plain_wide_seconds += costs.estimate(width).unwrap_or(0.0);
        if self.plain_wide_steps < EXPLORE_EVERY {
            return false;
        }
        self.exploring_cost(width, k, costs)
            .is_none_or(|extra| extra <= EXPLORE_SHARE * self.plain_wide_seconds)
    }

    /// What drafting for `MAX_DRAFTING_DECODES` of `decodes` decodes is expected to add to the
    /// step's time: the drafting, and the forward's extra width.
    fn exploring_cost(&self, decodes: u32, k: u32, costs: &StepCosts) -> Option<f64> {
        let expected = self.acceptance.expected()?;
        let seats = MAX_DRAFTING_DECODES as u32;
        let verified = (f64::from(seats * k) * expected.proposed).round() as u32;
        let proposing = self.proposing.estimate_or_scaled(seats)?;
        Some(
            costs.estimate(decodes.saturating_add(verified))? - costs.estimate(decodes)?
                + proposing,
        )
    }

    fn paying_seats(&self, decodes: usize, k: u32, costs: &StepCosts) -> usize {
        let Some(expected) = self.acceptance.expected() else {
            return 0;
        };
        let tokens_per_second = |seats: usize| {
            // Drafts the shard proposes (it may find fewer than allowed) and of those, kept.
            let verified = seats as f64 * f64::from(k) * expected.proposed;
            let tokens = decodes as f64 + verified * expected.kept;
            let width = (decodes as f64 + verified).round() as u32;
            let proposing = if seats == 0 {
                0.0
            } else {
                let seats = u32::try_from(seats).unwrap_or(u32::MAX);
                self.proposing.estimate_or_scaled(seats).unwrap_or(0.0)
            };
            costs
                .estimate(width)
                .map(|seconds| tokens / (seconds + proposing))
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

    /// A verification answered: `allowed` drafts, of which the shard proposed `drafted`
    /// and the model kept `kept`.
    pub fn record(&mut self, allowed: u32, drafted: u32, kept: u32) {
        self.acceptance.record(allowed, drafted, kept);
    }

    /// A step's drafting for `seats` decodes took `took` (its forward's time excludes it).
    pub fn record_proposing(&mut self, seats: u32, took: std::time::Duration) {
        self.proposing.record(seats, took);
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
    allowed: f64,
    drafted: f64,
    kept: f64,
}

/// What a draft seat gives, by the recent verifications.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Expected {
    /// Drafts proposed per draft allowed (prompt lookup finds no match for some decodes).
    proposed: f64,
    /// Drafts kept per draft proposed.
    kept: f64,
}

/// How much of the past a new verification leaves in the counts (about the last 200
/// verifications count).
const ACCEPTANCE_DECAY: f64 = 0.995;
/// Drafts counted before the rate is trusted.
const ACCEPTANCE_MIN_DRAFTS: f64 = 16.0;

impl Acceptance {
    fn record(&mut self, allowed: u32, drafted: u32, kept: u32) {
        if allowed == 0 {
            return;
        }
        self.allowed = self.allowed * ACCEPTANCE_DECAY + f64::from(allowed);
        self.drafted = self.drafted * ACCEPTANCE_DECAY + f64::from(drafted);
        self.kept = self.kept * ACCEPTANCE_DECAY + f64::from(kept);
    }

    fn expected(&self) -> Option<Expected> {
        (self.drafted >= ACCEPTANCE_MIN_DRAFTS).then(|| Expected {
            proposed: self.drafted / self.allowed,
            kept: self.kept / self.drafted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seats_at(rate: f64) -> DraftSeats {
        let mut seats = DraftSeats::default();
        for _ in 0..100 {
            seats.record(100, 100, (rate * 100.0) as u32);
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
    fn exploring_spends_at_most_a_share_of_the_plain_steps_time() {
        // Steps of 64 decodes cost 8 ms, and 125 us a token more from 64: drafts never pay.
        let dear = costs(8.0, 64, 0.125);
        let exploring_steps = |seats: &mut DraftSeats| -> Vec<u32> {
            (1..=2000)
                .filter(|_| seats.seats(64, 4, &dear) > 0)
                .collect()
        };
        let micros = std::time::Duration::from_micros;
        // Nothing known of the drafting's time: one step in EXPLORE_EVERY, to learn it.
        assert_eq!(exploring_steps(&mut seats_at(0.9)).len(), 2000 / 32);
        // Prompt lookup taking 0.1 ms for 8 decodes: 8 * 4 rows more cost 4 ms, 4.1 ms in
        // all, which 1 % of the plain steps' time covers after 52 steps of 8 ms.
        let mut lookup = seats_at(0.9);
        lookup.record_proposing(8, micros(100));
        let explored = exploring_steps(&mut lookup);
        assert_eq!(explored[..3], [52, 104, 156], "{explored:?}");
        // A draft model taking 17 ms for 8 decodes: 21 ms, every 263 steps.
        let mut draft_model = seats_at(0.9);
        draft_model.record_proposing(8, micros(17_000));
        assert_eq!(exploring_steps(&mut draft_model)[..2], [263, 526]);
    }

    #[test]
    fn the_acceptance_rate_follows_recent_verifications() {
        let mut acceptance = Acceptance::default();
        acceptance.record(4, 4, 4);
        assert_eq!(acceptance.expected(), None, "too few drafts to say");
        acceptance.record(0, 0, 0); // no seat: no evidence either way
        for _ in 0..4 {
            acceptance.record(4, 4, 4);
        }
        let all = Expected {
            proposed: 1.0,
            kept: 1.0,
        };
        assert_eq!(acceptance.expected(), Some(all));
        for _ in 0..2000 {
            acceptance.record(4, 2, 1); // half found, half of those kept
        }
        let now = acceptance.expected().unwrap();
        assert!((0.5..0.51).contains(&now.proposed), "{now:?}");
        assert!((0.5..0.51).contains(&now.kept), "{now:?}");
    }

    #[test]
    fn seats_pay_for_the_time_drafting_takes_with_what_they_propose() {
        // Steps of 64 decodes cost 8 ms, and 20 us a token more from 64 (compute-bound).
        let compute_bound = costs(8.0, 64, 0.02);
        let ms = |ms: u64| std::time::Duration::from_millis(ms);
        let (mut found_all, mut found_few) = (DraftSeats::default(), DraftSeats::default());
        for _ in 0..100 {
            found_all.record(100, 100, 90);
            found_few.record(100, 10, 9); // prompt lookup finds a match for 1 seat in 10
        }
        assert_eq!(found_all.clone().seats(64, 4, &compute_bound), 64);
        assert_eq!(
            found_few.clone().seats(64, 4, &compute_bound),
            64,
            "free to look"
        );
        // Prompt lookup's 2 ms for 64 decodes: paid for where it finds drafts, not where it
        // finds few (without the share proposed, 1 in 10 would be taken for all of them).
        let mut lookup = found_all.clone();
        lookup.record_proposing(64, ms(2));
        assert_eq!(lookup.seats(64, 4, &compute_bound), 64);
        found_few.record_proposing(64, ms(2));
        assert_eq!(found_few.seats(64, 4, &compute_bound), 0);
        // A draft model taking 30 ms for 64 decodes' drafts (8 ms for 8): none pays.
        let mut draft_model = found_all.clone();
        draft_model.record_proposing(8, ms(8));
        draft_model.record_proposing(64, ms(30));
        assert_eq!(draft_model.seats(64, 4, &compute_bound), 0);
        // Known for 8 decodes alone, the time for 64 is taken in proportion (64 ms): none.
        found_all.record_proposing(8, ms(8));
        assert_eq!(found_all.seats(64, 4, &compute_bound), 0);
    }
}
