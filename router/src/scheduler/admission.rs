//! In which order waiting sequences are offered a place in the next step.
//!
//! `LongestPrefix` (SGLang's longest-prefix-first) admits first the sequences with the
//! longest cached prefix: they cost the least to start, and they run while their prefix
//! is still cached. Two classes go before it regardless: preempted sequences (they have
//! streamed tokens already) and sequences that waited past the age cap, so nothing
//! starves. `Fifo` keeps the queue order.
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdmissionPolicy {
    #[default]
    LongestPrefix,
    Fifo,
}

impl AdmissionPolicy {
    pub const NAMES: [&'static str; 2] = ["longest-prefix", "fifo"];

    pub fn name(self) -> &'static str {
        match self {
            Self::LongestPrefix => "longest-prefix",
            Self::Fifo => "fifo",
        }
    }
}

impl std::fmt::Display for AdmissionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AdmissionPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "longest-prefix" | "lpm" => Ok(Self::LongestPrefix),
            "fifo" | "fcfs" => Ok(Self::Fifo),
            other => Err(format!(
                "unknown scheduling policy {other:?}; expected one of: {}",
                Self::NAMES.join(", ")
            )),
        }
    }
}

/// What the policy knows about one waiting sequence, in queue order.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub id: u64,
    /// It ran before and was preempted.
    pub preempted: bool,
    pub waited: Duration,
    /// Tokens of its prefix the cache holds now (0 when not looked up).
    pub cached_tokens: usize,
}

/// Waiting sequences ranked by cached prefix, at most this many; the rest of a longer
/// queue follows in FIFO order (ranking costs one lookup per sequence and step).
pub const RANKED_WINDOW: usize = 256;

/// Ids in the order admission should try them. `candidates` are in queue order.
pub fn admission_order(
    policy: AdmissionPolicy,
    age_cap: Duration,
    candidates: &[Candidate],
) -> Vec<u64> {
    if policy == AdmissionPolicy::Fifo {
        return candidates.iter().map(|c| c.id).collect();
    }
    let mut ranked: Vec<(usize, &Candidate)> = candidates.iter().enumerate().collect();
    // Stable sort: equal keys keep queue order.
    ranked.sort_by_key(|&(position, candidate)| {
        let class = if candidate.preempted {
            0
        } else if candidate.waited >= age_cap {
            1
        } else {
            2
        };
        // Within the first two classes queue order rules; in the last, longest prefix.
        let prefix = if class == 2 {
            candidate.cached_tokens
        } else {
            0
        };
        (class, std::cmp::Reverse(prefix), position)
    });
    ranked
        .into_iter()
        .map(|(_, candidate)| candidate.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(id: u64, preempted: bool, waited_ms: u64, cached_tokens: usize) -> Candidate {
        Candidate {
            id,
            preempted,
            waited: Duration::from_millis(waited_ms),
            cached_tokens,
        }
    }

    #[test]
    fn longest_prefix_first_with_preempted_and_aged_ahead() {
        let cap = Duration::from_millis(1_000);
        let queue = [
            candidate(0, false, 50, 0),
            candidate(1, false, 40, 64),
            candidate(2, false, 1_500, 0), // aged: jumps ahead of cached ones
            candidate(3, true, 10, 0),     // preempted: first
            candidate(4, false, 30, 128),
            candidate(5, false, 20, 64),
        ];
        let order = admission_order(AdmissionPolicy::LongestPrefix, cap, &queue);
        assert_eq!(order, vec![3, 2, 4, 1, 5, 0]);
    }

    #[test]
    fn fifo_keeps_queue_order() {
        let queue = [
            candidate(7, false, 0, 0),
            candidate(3, false, 0, 500),
            candidate(9, true, 0, 0),
        ];
        let order = admission_order(AdmissionPolicy::Fifo, Duration::ZERO, &queue);
        assert_eq!(order, vec![7, 3, 9]);
    }

    #[test]
    fn policy_names_parse_and_round_trip() {
        for name in AdmissionPolicy::NAMES {
            let policy: AdmissionPolicy = name.parse().unwrap();
            assert_eq!(policy.to_string(), name);
        }
        assert_eq!(
            "lpm".parse::<AdmissionPolicy>(),
            Ok(AdmissionPolicy::LongestPrefix)
        );
        assert!("random"
            .parse::<AdmissionPolicy>()
            .unwrap_err()
            .contains("fifo"));
    }
}
