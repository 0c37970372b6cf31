//! The shards' own timings of each step (forward pass, sampling), taken from every rank's
//! Step reply: the router's step duration includes gRPC and queuing; these do not.
use std::time::Duration;

use metrics::{histogram, Histogram};

use crate::metrics::names::{
    SHARD_DEVICE_DURATION, SHARD_DRAFT_DURATION, SHARD_FORWARD_DURATION,
    SHARD_GRAMMAR_MASK_DURATION, SHARD_SAMPLING_DURATION,
};
use crate::pb;

#[derive(Debug, Clone)]
struct RankHistograms {
    forward: Histogram,
    sampling: Histogram,
    device: Histogram,
    mask: Histogram,
    draft: Histogram,
}

/// One set of histograms per rank, created (and so listed at zero) up front.
#[derive(Debug, Clone)]
pub struct ShardTimings {
    ranks: Vec<RankHistograms>,
}

impl ShardTimings {
    pub fn new(num_shard: usize) -> Self {
        let ranks = (0..num_shard)
            .map(|rank| {
                let rank = rank.to_string();
                RankHistograms {
                    forward: histogram!(SHARD_FORWARD_DURATION, "rank" => rank.clone()),
                    sampling: histogram!(SHARD_SAMPLING_DURATION, "rank" => rank.clone()),
                    device: histogram!(SHARD_DEVICE_DURATION, "rank" => rank.clone()),
                    mask: histogram!(SHARD_GRAMMAR_MASK_DURATION, "rank" => rank.clone()),
                    draft: histogram!(SHARD_DRAFT_DURATION, "rank" => rank),
                }
            })
            .collect();
        Self { ranks }
    }

    /// Records each rank's reply (in rank order) to a step that computed something;
    /// a step that only released sequences measures nothing.
    pub fn record(&self, replies: &[pb::StepResponse]) {
        for (rank, reply) in self.ranks.iter().zip(replies) {
            rank.forward.record(Duration::from_nanos(reply.forward_ns));
            rank.sampling.record(Duration::from_nanos(reply.sample_ns));
            if reply.device_ns > 0 {
                // 0: the shard has no device clock (CPU); an empty histogram says so.
                rank.device.record(Duration::from_nanos(reply.device_ns));
            }
            if reply.mask_ns > 0 {
                // Only steps with constrained sequences compute masks.
                rank.mask.record(Duration::from_nanos(reply.mask_ns));
            }
            if reply.draft_ns > 0 {
                // Only a shard with a draft model that drafted this step times it.
                rank.draft.record(Duration::from_nanos(reply.draft_ns));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_is_listed_before_any_step_and_records_its_own_times() {
        let recorder = crate::metrics::builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let timings = ShardTimings::new(2);
            let reply =
                |forward_ms: u64, sample_us: u64, device_ms: u64, draft_ms: u64| pb::StepResponse {
                    forward_ns: forward_ms * 1_000_000,
                    sample_ns: sample_us * 1_000,
                    device_ns: device_ms * 1_000_000,
                    draft_ns: draft_ms * 1_000_000,
                    ..Default::default()
                };
            timings.record(&[reply(3, 200, 3, 5), reply(7, 50, 0, 0)]);
        });
        let text = handle.render();
        for line in [
            r#"textgen_shard_forward_duration_seconds_bucket{rank="0",le="0.004"} 1"#,
            r#"textgen_shard_forward_duration_seconds_bucket{rank="0",le="0.002"} 0"#,
            r#"textgen_shard_forward_duration_seconds_bucket{rank="1",le="0.008"} 1"#,
            r#"textgen_shard_forward_duration_seconds_bucket{rank="1",le="0.006"} 0"#,
            r#"textgen_shard_sampling_duration_seconds_bucket{rank="0",le="0.00025"} 1"#,
            r#"textgen_shard_sampling_duration_seconds_bucket{rank="1",le="0.0001"} 1"#,
            r#"textgen_shard_sampling_duration_seconds_count{rank="1"} 1"#,
            r#"textgen_shard_device_duration_seconds_bucket{rank="0",le="0.004"} 1"#,
            r#"textgen_shard_device_duration_seconds_bucket{rank="0",le="0.002"} 0"#,
            // A shard without a device clock (device_ns 0) records nothing.
            r#"textgen_shard_device_duration_seconds_count{rank="1"} 0"#,
            r#"textgen_shard_draft_duration_seconds_bucket{rank="0",le="0.006"} 1"#,
            r#"textgen_shard_draft_duration_seconds_bucket{rank="0",le="0.004"} 0"#,
            // A step without drafts (draft_ns 0) records nothing.
            r#"textgen_shard_draft_duration_seconds_count{rank="1"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
