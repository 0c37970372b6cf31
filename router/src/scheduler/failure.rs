//! Why a sequence could not go on, typed from where it happened to the one HTTP mapping
//! (`crate::errors`): which rank is to blame when one is, the kind of fault, and the text a
//! client may read. The log keeps the whole error where it happened (`shards.rs`).

/// The kind of fault that ended a step, or one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The call or step stream to a rank broke (closed stream, broken pipe, unavailable).
    Transport,
    /// Ranks did not answer within the step timeout.
    Timeout,
    /// A rank is stopped (SIGSTOP or a debugger) and cannot answer.
    Stopped,
    /// The shard answered with an error of its own (an exception while it ran the step).
    ShardReported,
    /// An answer or a request broke the step protocol (an unknown step, a missing token,
    /// a step the shard called invalid).
    Protocol,
    /// The shards are unusable after an earlier failure, or there are none.
    Unusable,
    /// The device ran out of memory on the sequence's steps more times than it is retried.
    OutOfMemory,
    /// The router could not run the sequence: it cannot fit the KV pool, the scheduler
    /// cannot start, the client read too slowly, a token would not detokenize.
    Router,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct GenerationFailure {
    /// The rank at fault, when one is.
    pub rank: Option<usize>,
    pub kind: FailureKind,
    /// What a client may read: ranks, calls, codes and durations, never the transport's
    /// error chain or another request's text.
    pub message: String,
}

impl GenerationFailure {
    pub fn new(rank: Option<usize>, kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            rank,
            kind,
            message: message.into(),
        }
    }

    /// A fault of the router's own, blaming no rank.
    pub fn router(message: impl Into<String>) -> Self {
        Self::new(None, FailureKind::Router, message)
    }

    /// An answer that broke the step protocol (the router reads rank 0's).
    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new(Some(0), FailureKind::Protocol, message)
    }
}

/// Tests build failures from text; the code always names the kind.
#[cfg(test)]
impl From<&str> for GenerationFailure {
    fn from(message: &str) -> Self {
        Self::router(message)
    }
}
