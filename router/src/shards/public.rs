//! What a client may read of a shard failure. The log keeps the whole error; a client gets
//! which shard and call failed and how, never the transport's error chain (hyper and h2
//! messages, socket paths) or the text of another request's failure.
use super::ShardError;
use crate::scheduler::{FailureKind, GenerationFailure};

impl ShardError {
    /// The rank at fault (the lowest, when several are) and the kind of fault, with the
    /// public message.
    pub fn failure(&self) -> GenerationFailure {
        let (rank, kind) = match self {
            Self::Connect { rank, .. } => (Some(*rank), FailureKind::Transport),
            Self::Call { rank, status, .. } => (Some(*rank), call_kind(status.code())),
            Self::TimedOut {
                pending,
                unresponsive,
                ..
            } => (
                unresponsive.first().or(pending.first()).copied(),
                FailureKind::Timeout,
            ),
            Self::Stopped { ranks, .. } => (ranks.first().copied(), FailureKind::Stopped),
            Self::Failed(_) | Self::NoShards => (None, FailureKind::Unusable),
        };
        GenerationFailure::new(rank, kind, self.public_message())
    }

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

/// The shard maps its own failures to these codes (`shard_server/service.py`): a step it
/// found invalid, one it could not run, an exception while running it. Any other code came
/// from the transport (a closed stream, a broken pipe).
fn call_kind(code: tonic::Code) -> FailureKind {
    match code {
        tonic::Code::InvalidArgument => FailureKind::Protocol,
        tonic::Code::Internal | tonic::Code::FailedPrecondition => FailureKind::ShardReported,
        _ => FailureKind::Transport,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn transport_chains_and_earlier_failures_stay_in_the_log() {
        let chain =
            "h2 protocol error: error reading a body from connection: Broken pipe (os error 32)";
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

    #[test]
    fn each_failure_names_its_rank_and_kind_with_the_public_message() {
        let call = |code| ShardError::Call {
            rank: 2,
            call: "Step",
            status: tonic::Status::new(code, "detail"),
        };
        let broken = call(tonic::Code::Unknown).failure();
        assert_eq!(
            (broken.rank, broken.kind),
            (Some(2), FailureKind::Transport)
        );
        assert_eq!(broken.message, "shard 2: Step failed (Unknown)");
        assert_eq!(
            call(tonic::Code::Internal).failure().kind,
            FailureKind::ShardReported
        );
        assert_eq!(
            call(tonic::Code::InvalidArgument).failure().kind,
            FailureKind::Protocol
        );
        let timed_out = ShardError::TimedOut {
            call: "Step",
            pending: vec![0, 1],
            waited: Duration::from_secs(60),
            unresponsive: vec![1],
        }
        .failure();
        assert_eq!(
            (timed_out.rank, timed_out.kind),
            (Some(1), FailureKind::Timeout)
        );
        let latched = ShardError::Failed("step 3: shard 0: boom".into()).failure();
        assert_eq!((latched.rank, latched.kind), (None, FailureKind::Unusable));
    }
}
