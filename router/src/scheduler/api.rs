//! The scheduler's public surface: what the request lifecycle (`infer.rs`) submits,
//! what it gets back, and what the scheduler needs from the shards.
use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;

use super::admission::AdmissionPolicy;
use super::prefill_pacing::PrefillPacing;
use crate::pb;

/// A validated, tokenized generation request, ready to be scheduled.
#[derive(Debug, Clone)]
pub struct SequenceRequest {
    pub input_ids: Vec<u32>,
    pub sampling: pb::SamplingParameters,
    /// The sequence finishes with `FinishReason::Length` after this many tokens.
    pub max_new_tokens: u32,
    /// Sampling one of these finishes the sequence with `FinishReason::EosToken`.
    /// Empty means: ignore EOS.
    pub stop_token_ids: Vec<u32>,
    pub prefill_logprobs: bool,
    pub top_n_tokens: u32,
    /// The compiled output constraint, if any; the shard computes its masks.
    pub grammar: Option<pb::Grammar>,
    /// The request's span when it is traced: its queue and step spans hang under it.
    pub trace: Option<opentelemetry::trace::SpanContext>,
}

/// The scheduler ends a sequence for `Length` or `EosToken`; stop sequences are matched
/// on text by the decoder (`infer::sequence`). Both ask `crate::finish`.
pub use crate::finish::FinishReason;

/// What a submitted sequence hears back, in order.
#[derive(Debug, Clone)]
pub enum SequenceEvent {
    /// The sequence was scheduled for the first time, after waiting this long.
    Started { queue_time: Duration },
    /// Logprobs of prompt tokens 1.. (only with `prefill_logprobs`), sent once before
    /// the first token.
    Prefill { logprobs: Vec<f32> },
    /// One generated token. The last one is followed by `Finished`.
    Token(pb::Token),
    Finished {
        reason: FinishReason,
        generated_tokens: u32,
    },
    /// The sequence cannot continue (a shard failed, or the router cannot run it). Nothing
    /// follows.
    Error(GenerationFailure),
    /// The shard refused this sequence on its own account: its parameters, or its grammar
    /// past the grammar engine's limits. The client's request is at fault. Nothing follows.
    Refused(String),
}

pub use super::failure::{FailureKind, GenerationFailure};

/// A step failed on a shard: which rank, what kind of fault, what a client may read.
pub type StepError = GenerationFailure;

/// Runs one step on every shard and returns rank 0's answer.
/// Implemented over gRPC by `shards.rs`, and by fakes in tests.
///
/// Steps must run in the order `step` is called, and the scheduler calls it for step N+1
/// before step N's answer is in (pipelining). The gRPC implementation sends the request
/// before `step` returns, so the shard can start N+1 the moment N ends; the future only
/// waits for the answer.
pub trait StepExecutor: Send + Sync + 'static {
    fn step(
        &self,
        request: pb::StepRequest,
    ) -> impl Future<Output = Result<pb::StepResponse, StepError>> + Send;
}

/// Sizes the scheduler works within; KV capacity comes from the shards' warmup.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Tokens per KV block (from the shard's `Info`).
    pub block_size: u32,
    /// Blocks in the KV pool (smallest `Warmup` answer across shards).
    pub num_blocks: u32,
    /// Token budget of one step: prefill chunks plus one token per decode.
    pub max_batch_prefill_tokens: u32,
    /// Most sequences in one step, if limited.
    pub max_batch_size: Option<u32>,
    /// Reuse the KV of cached prefixes (the radix cache).
    pub prefix_caching: bool,
    /// The shards' `long_rope_prompt_tokens`: LongRoPE rotates a longer prompt with other
    /// frequencies, so the prefix cache keys its KV apart. None: the model has no LongRoPE.
    pub long_rope_prompt_tokens: Option<u32>,
    /// Order in which waiting sequences are admitted.
    pub admission_policy: AdmissionPolicy,
    /// Under `LongestPrefix`, a sequence waiting this long goes ahead of cached ones.
    pub admission_age_cap: Duration,
    /// A stream this many events behind its reader is dropped (`--max-stream-backlog`).
    pub max_stream_backlog: usize,
    /// Speculative decoding: drafts a decode may verify (`--speculate`); 0 turns it off.
    pub num_draft_tokens: u32,
    /// Prompt tokens of steps beside running decodes held near the decodes' own cost
    /// (`--prefill-pacing-slack`); None: every step may take the whole budget.
    pub prefill_pacing: Option<PrefillPacing>,
}

impl SchedulerConfig {
    /// Rejects sizes the scheduler cannot work with.
    pub fn validate(&self) -> Result<(), InvalidSchedulerConfig> {
        let fail = |message: &str| Err(InvalidSchedulerConfig(message.to_string()));
        if self.block_size == 0 {
            return fail("block_size must be at least 1");
        }
        if self.num_blocks == 0 {
            return fail("the KV pool has no blocks");
        }
        if self.max_batch_prefill_tokens == 0 {
            return fail("max_batch_prefill_tokens must be at least 1");
        }
        if self.max_batch_size == Some(0) {
            return fail("max_batch_size must be at least 1");
        }
        if self.max_stream_backlog == 0 {
            return fail("max_stream_backlog must be at least 1");
        }
        Ok(())
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid scheduler configuration: {0}")]
pub struct InvalidSchedulerConfig(pub String);

/// A request handed to the scheduler together with the channel its events go to.
#[derive(Debug)]
pub struct Submission {
    pub request: SequenceRequest,
    pub events: super::EventSender,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("the scheduler has stopped")]
pub struct SchedulerClosed;

/// Cheap to clone; every request task holds one.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    submissions: mpsc::UnboundedSender<Submission>,
}

impl SchedulerHandle {
    pub fn new(submissions: mpsc::UnboundedSender<Submission>) -> Self {
        Self { submissions }
    }

    /// Queues a sequence; its events arrive on the returned stream.
    pub fn submit(
        &self,
        request: SequenceRequest,
    ) -> Result<super::SequenceStream, SchedulerClosed> {
        let (events, stream) = super::event_channel();
        self.submissions
            .send(Submission { request, events })
            .map_err(|_| SchedulerClosed)?;
        Ok(stream)
    }
}
