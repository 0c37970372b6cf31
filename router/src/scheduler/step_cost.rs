//! What a step costs, learned from the steps run so far: the time between two answers by
//! the step's token count. Speculation weighs a wider step (each verification adds its
//! drafts' tokens) against the drafts it expects kept (`draft_seats.rs`).
//!
//! Steps fall into buckets by powers of two of their tokens. Each bucket keeps a moving
//! average of its steps' tokens and times, and an estimate between two buckets is linear.
//! Steps of a batch of decodes cost about the same until the batch's tokens make the step
//! compute-bound, and more in proportion after. So the estimate is high, never low, across
//! a bend; a wider step is then judged too dear, which only costs a gain, not time.
use std::time::Duration;

/// Buckets of 1, 2-3, 4-7, ... tokens, up to 2^(BUCKETS - 1) and more.
const BUCKETS: usize = 17;
/// The weight of a new step in its bucket's averages.
const WEIGHT: f64 = 0.1;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    seconds: f64,
}

#[derive(Debug, Clone, Default)]
pub struct StepCosts {
    buckets: [Option<Bucket>; BUCKETS],
}

impl StepCosts {
    /// A step of `tokens` tokens took `ran_for`.
    pub fn record(&mut self, tokens: u32, ran_for: Duration) {
        if tokens == 0 {
            return;
        }
        let (tokens, seconds) = (f64::from(tokens), ran_for.as_secs_f64());
        let slot = &mut self.buckets[bucket_of(tokens)];
        *slot = Some(match *slot {
            None => Bucket { tokens, seconds },
            Some(b) => Bucket {
                tokens: b.tokens + WEIGHT * (tokens - b.tokens),
                seconds: b.seconds + WEIGHT * (seconds - b.seconds),
            },
        });
    }

    /// Seconds a step of `tokens` tokens is expected to take: linear between the buckets
    /// around it, the smallest bucket's time below it (fewer tokens cost no more). None
    /// past the widest step seen, or before any.
    pub fn estimate(&self, tokens: u32) -> Option<f64> {
        let tokens = f64::from(tokens);
        let mut below: Option<Bucket> = None;
        for bucket in self.buckets.iter().flatten() {
            if bucket.tokens >= tokens {
                return Some(match below {
                    None => bucket.seconds,
                    Some(low) => {
                        let share = (tokens - low.tokens) / (bucket.tokens - low.tokens);
                        low.seconds + share * (bucket.seconds - low.seconds)
                    }
                });
            }
            below = Some(*bucket);
        }
        None
    }

    /// As `estimate`, but past the widest step seen in proportion to it (for a cost that
    /// grows with its count, as drafting does with the decodes drafted for); None before any.
    pub fn estimate_or_scaled(&self, tokens: u32) -> Option<f64> {
        self.estimate(tokens).or_else(|| {
            let widest = self.buckets.iter().flatten().last()?;
            Some(widest.seconds * f64::from(tokens) / widest.tokens)
        })
    }
}

fn bucket_of(tokens: f64) -> usize {
    (tokens.log2().floor() as usize).min(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1e3)
    }

    #[test]
    fn nothing_is_known_before_a_step_or_past_the_widest() {
        let mut costs = StepCosts::default();
        assert_eq!(costs.estimate(1), None);
        costs.record(64, ms(8.0));
        assert_eq!(costs.estimate(64), Some(0.008));
        assert_eq!(costs.estimate(1), Some(0.008), "fewer tokens cost no more");
        assert_eq!(costs.estimate(65), None);
        assert_eq!(
            costs.estimate_or_scaled(128),
            Some(0.016),
            "in proportion past it"
        );
        assert_eq!(StepCosts::default().estimate_or_scaled(1), None);
        costs.record(0, ms(1.0)); // a step that computed nothing teaches nothing
        assert_eq!(costs.estimate(1), Some(0.008));
    }

    #[test]
    fn estimates_are_linear_between_buckets() {
        let mut costs = StepCosts::default();
        costs.record(64, ms(8.0));
        costs.record(4096, ms(300.0));
        let at = |t: u32| costs.estimate(t).unwrap() * 1e3;
        assert!((at(64) - 8.0).abs() < 1e-9);
        assert!((at(2080) - 154.0).abs() < 1e-9, "{}", at(2080));
        assert!((at(4096) - 300.0).abs() < 1e-9);
        assert_eq!(costs.estimate(4097), None);
    }

    #[test]
    fn a_bucket_follows_its_recent_steps() {
        let mut costs = StepCosts::default();
        costs.record(256, ms(20.0));
        for _ in 0..60 {
            costs.record(256, ms(10.0));
        }
        let now = costs.estimate(256).unwrap() * 1e3;
        assert!((10.0..10.1).contains(&now), "{now}");
        // Very wide steps share the last bucket.
        costs.record(u32::MAX, ms(5_000.0));
        assert!(costs.estimate(1 << 20).is_some());
    }
}
