//! How many prompt tokens a step that carries running decodes may take (`--prefill-pacing-slack`).
//!
//! A decode step reads every weight once for its whole batch, so until a step's tokens
//! make it compute-bound, prompt tokens ride along almost free; past that bend each one
//! lengthens the step, and every running stream waits for it (TPOT). Pacing caps a step's
//! prompt tokens where its learned cost (`step_cost.rs`) stays within `slack` of the
//! decodes' own, so arriving prompts fill the bend instead of stretching steps.
//!
//! Pacing trades TTFT for TPOT, so it yields: with no decodes running (idle, a burst's
//! start) there is nothing to protect, and once a sequence has waited `patience` for its
//! first token (prompts arriving faster than paced steps take them, a burst's backlog) the
//! step gets the whole budget again. Before any step has been timed nothing is capped.
use std::time::Duration;

use super::step_cost::StepCosts;

/// A paced step still takes this many prompt tokens, so that prompts always progress
/// even when the decodes alone are past the bend.
pub const MIN_PACED_PROMPT_TOKENS: u32 = 64;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillPacing {
    /// How much longer than its decodes alone a paced step may be expected to run (0.25: 25 %).
    pub slack: f64,
    /// A sequence waiting this long for its first token lifts the cap.
    pub patience: Duration,
}

/// What the next step looks like, for pacing.
#[derive(Debug, Clone, Copy)]
pub struct StepOutlook {
    /// Running sequences that decode in the step.
    pub decodes: u32,
    /// The step's token budget (`--max-batch-prefill-tokens`).
    pub budget: u32,
    /// The longest any sequence has waited for its first token since its submission. A
    /// preempted sequence back in the queue counts from its submission too, so its stalled
    /// stream lifts the cap at once.
    pub longest_first_token_wait: Option<Duration>,
}

impl PrefillPacing {
    /// Most prompt tokens the step may carry; `None`: no cap from pacing.
    pub fn prompt_cap(&self, step: StepOutlook, costs: &StepCosts) -> Option<u32> {
        if step.decodes == 0 || step.longest_first_token_wait? >= self.patience {
            return None; // nothing to protect, a prompt out of patience, or nobody waiting
        }
        let alone = costs.estimate(step.decodes)?;
        let allowed = alone * (1.0 + self.slack);
        let within = |tokens: u32| {
            costs
                .estimate(tokens)
                .is_some_and(|seconds| seconds <= allowed)
        };
        // The widest step within the allowance (the estimate grows with the tokens).
        let (mut fits, mut too_wide) = (step.decodes, step.budget.max(step.decodes) + 1);
        while too_wide - fits > 1 {
            let middle = fits + (too_wide - fits) / 2;
            if within(middle) {
                fits = middle;
            } else {
                too_wide = middle;
            }
        }
        Some((fits - step.decodes).max(MIN_PACED_PROMPT_TOKENS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1e3)
    }

    /// Steps flat at 7 ms up to 256 tokens, then 25 us a token more (a bend at 256).
    fn bent_costs() -> StepCosts {
        let mut costs = StepCosts::default();
        for tokens in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
            costs.record(tokens, ms(7.0));
        }
        for tokens in [512u32, 1024, 2048, 4096] {
            costs.record(tokens, ms(7.0 + 0.025 * f64::from(tokens - 256)));
        }
        costs
    }

    fn pacing(slack: f64) -> PrefillPacing {
        PrefillPacing {
            slack,
            patience: ms(50.0),
        }
    }

    fn outlook(decodes: u32, waited_ms: f64) -> StepOutlook {
        StepOutlook {
            decodes,
            budget: 4096,
            longest_first_token_wait: Some(ms(waited_ms)),
        }
    }

    #[test]
    fn prompts_fill_the_bend_and_a_slack_beyond_it() {
        let costs = bent_costs();
        // 48 decodes: 256 tokens cost what 48 do; 11 % of 7 ms is 30.8 tokens past the bend.
        assert_eq!(
            pacing(0.0).prompt_cap(outlook(48, 1.0), &costs),
            Some(256 - 48)
        );
        assert_eq!(
            pacing(0.11).prompt_cap(outlook(48, 1.0), &costs),
            Some(256 + 30 - 48)
        );
        // A wider slack takes more, within the budget.
        let wide = pacing(100.0).prompt_cap(outlook(48, 1.0), &costs).unwrap();
        assert_eq!(wide, 4096 - 48);
    }

    #[test]
    fn a_step_past_the_bend_still_takes_the_floor() {
        let costs = bent_costs();
        assert_eq!(
            pacing(0.0).prompt_cap(outlook(1000, 1.0), &costs),
            Some(MIN_PACED_PROMPT_TOKENS)
        );
    }

    #[test]
    fn pacing_yields_without_decodes_waiters_or_timings() {
        let costs = bent_costs();
        assert_eq!(
            pacing(0.1).prompt_cap(outlook(0, 1.0), &costs),
            None,
            "no stream to protect"
        );
        assert_eq!(
            pacing(0.1).prompt_cap(outlook(48, 50.0), &costs),
            None,
            "a prompt out of patience"
        );
        let nobody = StepOutlook {
            longest_first_token_wait: None,
            ..outlook(48, 0.0)
        };
        assert_eq!(
            pacing(0.1).prompt_cap(nobody, &costs),
            None,
            "nobody waits for a first token"
        );
        assert_eq!(
            pacing(0.1).prompt_cap(outlook(48, 1.0), &StepCosts::default()),
            None,
            "nothing timed yet"
        );
    }

    #[test]
    fn steps_wider_than_any_timed_count_as_too_dear() {
        let mut costs = StepCosts::default();
        costs.record(32, ms(7.0));
        costs.record(300, ms(7.0));
        // Nothing is known past 300 tokens: the cap stops there, however wide the slack.
        assert_eq!(
            pacing(10.0).prompt_cap(outlook(32, 1.0), &costs),
            Some(300 - 32)
        );
    }
}
