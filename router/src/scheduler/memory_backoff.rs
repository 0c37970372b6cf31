//! Backing off after the device runs out of memory on a step.
//!
//! A step's activations grow with the prompt tokens it carries; decodes add little (and
//! replay CUDA graphs that allocate nothing). So after an out-of-memory step the next
//! steps carry at most half of that step's prompt tokens, halving again on each further
//! failure, and the cap doubles back after every `RECOVERY_STEPS` steps in a row that
//! succeed, until it no longer binds. A prompt that failed at 4,096 tokens a step is then
//! prefilled in smaller chunks instead of failing, and the streams beside it go on.
//!
//! Which sequences a failure counts against is decided here too: those that carried
//! prompt tokens in the step, since they made it large. A decode-only step that fails
//! counts against all of its sequences.
use super::state::ScheduledWork;
use crate::metrics::names;

/// Steps in a row that must succeed before the prompt-token cap doubles.
pub const RECOVERY_STEPS: u32 = 256;

#[derive(Debug, Default)]
pub struct MemoryBackoff {
    /// Most prompt tokens a step may carry; `None` when not backing off.
    cap: Option<u32>,
    /// Steps applied without running out of memory since the cap last changed.
    clean_steps: u32,
}

impl MemoryBackoff {
    /// Most prompt tokens the next step may carry (`None`: the configured budget only).
    pub fn prefill_cap(&self) -> Option<u32> {
        self.cap
    }

    /// The device ran out of memory on a step that carried `prompt_tokens`.
    pub fn out_of_memory(&mut self, prompt_tokens: u32) {
        self.clean_steps = 0;
        if prompt_tokens == 0 {
            return; // nothing to shrink: the decodes are recomputed (and charged)
        }
        let halved = (prompt_tokens / 2).max(1);
        self.set_cap(Some(self.cap.map_or(halved, |cap| cap.min(halved))));
        tracing::warn!(
            cap = halved,
            "after running out of device memory, steps carry at most this many prompt tokens \
             until {RECOVERY_STEPS} steps in a row succeed"
        );
    }

    /// A step succeeded; `limit` is the configured prompt-token budget of a step.
    pub fn succeeded(&mut self, limit: u32) {
        let Some(cap) = self.cap else {
            return;
        };
        self.clean_steps += 1;
        if self.clean_steps < RECOVERY_STEPS {
            return;
        }
        self.clean_steps = 0;
        let doubled = cap.saturating_mul(2);
        self.set_cap((doubled < limit).then_some(doubled));
    }

    fn set_cap(&mut self, cap: Option<u32>) {
        self.cap = cap;
        metrics::gauge!(names::PREFILL_TOKEN_CAP).set(f64::from(cap.unwrap_or(0)));
    }
}

/// Prompt tokens a step's work carried.
pub fn prompt_tokens(scheduled: &[ScheduledWork]) -> u32 {
    scheduled
        .iter()
        .filter(|work| work.prefill)
        .map(|work| work.num_tokens)
        .sum()
}

/// Whether a failed step counts against this work's sequence: it carried prompt tokens,
/// or the step carried none at all.
pub fn charged(work: &ScheduledWork, step_prompt_tokens: u32) -> bool {
    work.prefill || step_prompt_tokens == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_halves_on_each_failure_and_doubles_back_after_clean_runs() {
        let mut backoff = MemoryBackoff::default();
        assert_eq!(backoff.prefill_cap(), None);
        backoff.out_of_memory(4096);
        assert_eq!(backoff.prefill_cap(), Some(2048));
        backoff.out_of_memory(4096); // planned before the first answer came
        assert_eq!(
            backoff.prefill_cap(),
            Some(2048),
            "never raised by a failure"
        );
        backoff.out_of_memory(2048);
        assert_eq!(backoff.prefill_cap(), Some(1024));
        for _ in 0..RECOVERY_STEPS - 1 {
            backoff.succeeded(4096);
        }
        assert_eq!(backoff.prefill_cap(), Some(1024));
        backoff.succeeded(4096);
        assert_eq!(backoff.prefill_cap(), Some(2048));
        for _ in 0..RECOVERY_STEPS - 1 {
            backoff.succeeded(4096);
        }
        backoff.out_of_memory(0); // a decode-only step: the cap stays, the count restarts
        for _ in 0..RECOVERY_STEPS - 1 {
            backoff.succeeded(4096);
        }
        assert_eq!(
            backoff.prefill_cap(),
            Some(2048),
            "a failure restarts the count"
        );
        backoff.succeeded(4096);
        assert_eq!(backoff.prefill_cap(), None, "doubled to the budget: off");
    }

    #[test]
    fn a_one_token_step_still_leaves_room_for_one_token() {
        let mut backoff = MemoryBackoff::default();
        backoff.out_of_memory(1);
        assert_eq!(backoff.prefill_cap(), Some(1));
    }

    fn work(prefill: bool, num_tokens: u32) -> ScheduledWork {
        ScheduledWork {
            id: 0,
            admission: 0,
            num_tokens,
            sample: true,
            drafts: 0,
            prefill,
        }
    }

    #[test]
    fn a_failure_counts_against_the_prompts_that_made_the_step_large() {
        let step = [work(false, 1), work(false, 1), work(true, 300)];
        let tokens = prompt_tokens(&step);
        assert_eq!(tokens, 300);
        let charges: Vec<bool> = step.iter().map(|w| charged(w, tokens)).collect();
        assert_eq!(charges, [false, false, true]);
        let decodes_only = [work(false, 1), work(false, 5)];
        assert!(decodes_only.iter().all(|w| charged(w, 0)));
    }
}
