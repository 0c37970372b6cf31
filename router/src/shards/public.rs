//! What a client may read of a shard failure. The log keeps the whole error; a client gets
//! which shard and call failed and how, never the transport's error chain (hyper and h2
//! messages, socket paths) or the text of another request's failure.
use super::ShardError;

impl ShardError {
    pub fn public_message(&self) -> String {
        match self {
            Self::Connect { rank, .. } => format!("shard {rank} is unreachable"),
            Self::Call { rank, call, status } => {
                format!("shard {rank}: {call} failed ({:?})", status.code())
            }
            // Ours, naming only ranks, calls and durations.
            Self::TimedOut { .. } | Self::Stopped { .. } | Self::NoShards => self.to_string(),
            // The earlier failure's own text may hold any of the above.
            Self::Failed(_) => "the shards are unusable after an earlier failure".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn transport_chains_and_earlier_failures_stay_in_the_log() {
        let chain = "h2 protocol error: error reading a body from connection: Broken pipe (os error 32)";
        let call = ShardError::Call {
            rank: 1,
            call: "Step",
            status: tonic::Status::unknown(chain),
        };
        assert!(call.to_string().contains("Broken pipe"), "the log keeps it");
        assert_eq!(call.public_message(), "shard 1: Step failed (Unknown)");
        let connect = ShardError::Connect {
            rank: 0,
            path: "/tmp/secret-socket-0".into(),
            waited: Duration::from_secs(5),
            reason: chain.into(),
        };
        assert_eq!(connect.public_message(), "shard 0 is unreachable");
        let failed = ShardError::Failed(format!("step 7: {call}"));
        assert!(!failed.public_message().contains("h2"));
        let stopped = ShardError::Stopped {
            call: "Step",
            ranks: vec![0],
        };
        assert_eq!(stopped.public_message(), stopped.to_string());
    }
}
