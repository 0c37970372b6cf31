//! gRPC clients of the shards (one per rank, over unix sockets) and the `StepExecutor`
//! that fans each step out to all of them, through one open step stream per rank
//! (`pipe.rs`).
//!
//! A step that fails on any rank, or that outlasts the step timeout (a hung rank), leaves
//! the ranks out of step with each other and with the router's block tables, so the set
//! latches the failure: later steps fail at once and `Health` reports it (`/health` 503)
//! until the launcher restarts everything.
//!
//! A shard that is silent is not always broken: a native call holding its GIL keeps it from
//! answering while it works. /proc (`process.rs`) tells the cases apart. A rank stopped
//! (SIGSTOP) for [`STOPPED_GRACE`] fails the step it holds at once, without waiting out the
//! step timeout, and `/health` answers 503 for it at once; a rank that misses `Health` while
//! its CPU time grows is busy, and counts as healthy.
mod deadline;
mod fanout;
mod pipe;
mod process;
mod public;
pub(crate) mod timings;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tokio::sync::oneshot;
use tonic::transport::{Channel, Endpoint};

use deadline::{step_tokens, StepDeadline};
use fanout::{on_every_rank, FanOutError};
use pipe::{StepAnswer, StepPipe};
use timings::ShardTimings;

use crate::pb;
use crate::pb::text_generation_shard_client::TextGenerationShardClient;
use crate::scheduler::{StepError, StepExecutor};

/// Steps carry whole prompts; allow far more than tonic's 4 MiB default.
const MAX_MESSAGE_BYTES: usize = 256 << 20;
const CONNECT_RETRY_INTERVAL: Duration = Duration::from_millis(500);
/// After a step timed out, how long each rank gets to answer `Health` (to name the hung one).
const DIAGNOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest `health` waits on the shards, whatever its caller allows: /health must turn
/// 503 promptly when a shard stops answering.
pub const HEALTH_PROBE_LIMIT: Duration = Duration::from_secs(2);
/// How long a rank may be seen stopped (SIGSTOP) before the step it holds fails.
pub const STOPPED_GRACE: Duration = Duration::from_secs(4);
const STOPPED_CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// The step timeout unless `with_step_timeout` sets one.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("shard {rank} at {path}: could not connect within {waited:?}: {reason}")]
    Connect {
        rank: usize,
        path: String,
        waited: Duration,
        reason: String,
    },
    #[error("shard {rank}: {call} failed: {status}")]
    Call {
        rank: usize,
        call: &'static str,
        status: tonic::Status,
    },
    #[error("{}", describe_timeout(call, pending, *waited, unresponsive))]
    TimedOut {
        call: &'static str,
        pending: Vec<usize>,
        waited: Duration,
        /// Ranks that did not answer `Health` either: hung or stopped processes.
        unresponsive: Vec<usize>,
    },
    #[error("shard(s) {ranks:?} are stopped (SIGSTOP or a debugger) and cannot answer {call}")]
    Stopped {
        call: &'static str,
        ranks: Vec<usize>,
    },
    #[error("the shards are unusable after an earlier failure: {0}")]
    Failed(String),
    #[error("no shards to talk to")]
    NoShards,
}

fn describe_timeout(
    call: &str,
    pending: &[usize],
    waited: Duration,
    unresponsive: &[usize],
) -> String {
    let mut text = format!("shard(s) {pending:?} did not answer {call} within {waited:?}");
    if !unresponsive.is_empty() {
        text +=
            &format!("; shard(s) {unresponsive:?} do not answer Health either (hung or stopped)");
    }
    text
}

/// One client per rank, in rank order. Cheap to clone (channels and the failure latch are
/// shared).
#[derive(Debug, Clone)]
pub struct ShardSet {
    clients: Vec<TextGenerationShardClient<Channel>>,
    /// Each rank's step stream, in rank order.
    pipes: Arc<Vec<StepPipe>>,
    deadline: StepDeadline,
    /// The first step failure; once set, the set is unusable.
    failure: Arc<OnceLock<String>>,
    timings: ShardTimings,
    /// Each rank's pid (from the socket's peer credentials), where the kernel told it.
    pids: Arc<Vec<Option<u32>>>,
}

fn socket_path(base: &str, rank: usize) -> String {
    format!("{base}-{rank}")
}

async fn connect_one(path: &str) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("unix://{path}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

impl ShardSet {
    /// Connects to `{base}-0 .. {base}-{n-1}`, retrying until `timeout`: shards may still be
    /// loading weights when the router starts.
    pub async fn connect(
        base: &str,
        num_shard: usize,
        timeout: Duration,
    ) -> Result<Self, ShardError> {
        if num_shard == 0 {
            return Err(ShardError::NoShards);
        }
        let started = Instant::now();
        let mut clients = Vec::with_capacity(num_shard);
        let mut pids = Vec::with_capacity(num_shard);
        for rank in 0..num_shard {
            let path = socket_path(base, rank);
            let channel = loop {
                match connect_one(&path).await {
                    Ok(channel) => break channel,
                    Err(err) if started.elapsed() >= timeout => {
                        return Err(ShardError::Connect {
                            rank,
                            path,
                            waited: started.elapsed(),
                            reason: format!("{err:?}"),
                        })
                    }
                    Err(_) => tokio::time::sleep(CONNECT_RETRY_INTERVAL).await,
                }
            };
            let pid = process::listener_pid(&path).await;
            tracing::info!(rank, path, pid, "connected to shard");
            pids.push(pid);
            clients.push(
                TextGenerationShardClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            );
        }
        let pipes = clients.iter().cloned().map(StepPipe::open).collect();
        Ok(Self {
            clients,
            pipes: Arc::new(pipes),
            deadline: StepDeadline::new(DEFAULT_STEP_TIMEOUT),
            failure: Arc::default(),
            timings: ShardTimings::new(num_shard),
            pids: Arc::new(pids),
        })
    }

    /// Longest a step may take before the set counts it as hung, plus an allowance per token
    /// once `with_warmup_rate` has one (`deadline.rs`).
    pub fn with_step_timeout(mut self, step_timeout: Duration) -> Self {
        self.deadline.timeout = step_timeout;
        self
    }

    /// Lets each step's tokens take a multiple of warmup's measured rate on top of the step
    /// timeout.
    pub fn with_warmup_rate(mut self, warmups: &[pb::WarmupResponse]) -> Self {
        self.deadline = self.deadline.with_warmup_rate(warmups);
        tracing::info!(
            timeout = ?self.deadline.timeout,
            per_token = ?self.deadline.per_token * deadline::RATE_MARGIN,
            "step deadline: the step timeout plus this per token"
        );
        self
    }

    /// Why the set is unusable, once a step has failed.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    pub async fn clear_cache(&self) -> Result<(), ShardError> {
        self.on_all("ClearCache", None, |mut c| async move {
            c.clear_cache(pb::ClearCacheRequest {}).await
        })
        .await
        .map(|_| ())
    }

    /// Every shard's `Info`, in rank order.
    pub async fn info(&self) -> Result<Vec<pb::InfoResponse>, ShardError> {
        self.on_all("Info", None, |mut c| async move {
            c.info(pb::InfoRequest {}).await
        })
        .await
    }

    /// Every shard's `Warmup` answer, in rank order.
    pub async fn warmup(
        &self,
        request: pb::WarmupRequest,
    ) -> Result<Vec<pb::WarmupResponse>, ShardError> {
        self.on_all("Warmup", None, move |mut c| async move {
            c.warmup(request).await
        })
        .await
    }

    /// Ok when no step has failed and every shard answers `Health` within `timeout` (at most
    /// [`HEALTH_PROBE_LIMIT`]), or is busy: a rank that misses it while its CPU time grows is
    /// working (a native call holds its GIL), not broken. A stopped rank fails at once.
    pub async fn health(&self, timeout: Duration) -> Result<(), ShardError> {
        if let Some(reason) = self.failure() {
            return Err(ShardError::Failed(reason.to_owned()));
        }
        let stopped = self.stopped_ranks();
        if !stopped.is_empty() {
            return Err(ShardError::Stopped {
                call: "Health",
                ranks: stopped,
            });
        }
        let before = self.samples();
        let answered = self
            .on_all(
                "Health",
                Some(timeout.min(HEALTH_PROBE_LIMIT)),
                |mut c| async move { c.health(pb::HealthRequest {}).await },
            )
            .await;
        match answered {
            Ok(_) => Ok(()),
            Err(ShardError::TimedOut { pending, .. }) if self.busy(&before, &pending) => {
                tracing::debug!(
                    ?pending,
                    "shards busy past the Health probe; counted healthy"
                );
                Ok(())
            }
            Err(err @ ShardError::TimedOut { .. }) => {
                let stopped = self.stopped_ranks();
                if stopped.is_empty() {
                    Err(err)
                } else {
                    Err(ShardError::Stopped {
                        call: "Health",
                        ranks: stopped,
                    })
                }
            }
            Err(err) => Err(err),
        }
    }

    fn samples(&self) -> Vec<Option<process::Sample>> {
        self.pids
            .iter()
            .map(|pid| pid.and_then(process::sample))
            .collect()
    }

    /// Ranks whose process is stopped now.
    fn stopped_ranks(&self) -> Vec<usize> {
        self.samples()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some_and(|s| s.stopped))
            .map(|(rank, _)| rank)
            .collect()
    }

    /// True when every rank in `ranks` used CPU since `before` and is not stopped.
    fn busy(&self, before: &[Option<process::Sample>], ranks: &[usize]) -> bool {
        let now = self.samples();
        ranks.iter().all(|&rank| {
            match (
                before.get(rank).copied().flatten(),
                now.get(rank).copied().flatten(),
            ) {
                (Some(then), Some(now)) => !now.stopped && now.cpu_ticks > then.cpu_ticks,
                _ => false,
            }
        })
    }

    /// Resolves with the ranks once any has been seen stopped for [`STOPPED_GRACE`]; never
    /// where no pid is known.
    async fn stopped_for_grace(&self) -> Vec<usize> {
        if self.pids.iter().all(Option::is_none) {
            return std::future::pending().await;
        }
        let mut since: Vec<Option<Instant>> = vec![None; self.pids.len()];
        loop {
            tokio::time::sleep(STOPPED_CHECK_INTERVAL).await;
            let now = Instant::now();
            for (rank, sample) in self.samples().into_iter().enumerate() {
                since[rank] = match sample {
                    Some(s) if s.stopped => Some(since[rank].unwrap_or(now)),
                    _ => None,
                };
            }
            let ranks: Vec<usize> = since
                .iter()
                .enumerate()
                .filter(|(_, at)| at.is_some_and(|at| now.duration_since(at) >= STOPPED_GRACE))
                .map(|(rank, _)| rank)
                .collect();
            if !ranks.is_empty() {
                return ranks;
            }
        }
    }

    /// Ranks whose process is stopped (SIGSTOP) now; empty where no pid is known.
    pub fn stopped(&self) -> Vec<usize> {
        self.stopped_ranks()
    }

    /// Ranks that do not answer `Health` within `timeout`.
    async fn unresponsive_ranks(&self, timeout: Duration) -> Vec<usize> {
        let probes = self.clients.iter().cloned().map(|mut c| async move {
            tokio::time::timeout(timeout, c.health(pb::HealthRequest {})).await
        });
        join_all(probes)
            .await
            .into_iter()
            .enumerate()
            .filter(|(_, answer)| !matches!(answer, Ok(Ok(_))))
            .map(|(rank, _)| rank)
            .collect()
    }

    /// Runs the same call on every shard concurrently; the first failing rank ends it.
    async fn on_all<T, F, Fut>(
        &self,
        call: &'static str,
        timeout: Option<Duration>,
        f: F,
    ) -> Result<Vec<T>, ShardError>
    where
        F: Fn(TextGenerationShardClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let calls = self.clients.iter().cloned().map(f).collect();
        match on_every_rank(calls, timeout).await {
            Ok(answers) => Ok(answers
                .into_iter()
                .map(tonic::Response::into_inner)
                .collect()),
            Err(FanOutError::Failed { rank, error }) => Err(ShardError::Call {
                rank,
                call,
                status: error,
            }),
            Err(FanOutError::TimedOut { pending, waited }) => Err(ShardError::TimedOut {
                call,
                pending,
                waited,
                unresponsive: Vec::new(),
            }),
        }
    }

    /// Puts `request` on every rank's step stream now, without waiting for earlier answers.
    fn send_step(
        &self,
        request: &pb::StepRequest,
    ) -> Result<Vec<oneshot::Receiver<StepAnswer>>, ShardError> {
        if let Some(reason) = self.failure() {
            return Err(ShardError::Failed(reason.to_owned()));
        }
        Ok(self
            .pipes
            .iter()
            .map(|pipe| pipe.send(request.clone()))
            .collect())
    }

    /// Waits for every rank's answer to a sent step; on failure latches the set as unusable.
    async fn finish_step(
        &self,
        step_id: u64,
        tokens: u64,
        answers: Vec<oneshot::Receiver<StepAnswer>>,
    ) -> Result<pb::StepResponse, ShardError> {
        let waits = answers
            .into_iter()
            .map(|answer| async move {
                answer
                    .await
                    .unwrap_or_else(|_| Err(tonic::Status::unavailable("the step stream stopped")))
            })
            .collect();
        let answered = tokio::select! {
            answered = on_every_rank(waits, Some(self.deadline.for_tokens(tokens))) => answered,
            ranks = self.stopped_for_grace() => {
                return Err(self.latch(step_id, ShardError::Stopped { call: "Step", ranks }));
            }
        };
        let error = match answered {
            Ok(answers) => {
                if tokens > 0 {
                    // Only steps that compute (not bare releases) say how the shards spend time.
                    self.timings.record(&answers);
                }
                // A step any rank ran out of memory on is void on every rank.
                let out_of_memory = answers.iter().any(|answer| answer.out_of_memory);
                let mut first = answers.into_iter().next().ok_or(ShardError::NoShards)?;
                first.out_of_memory |= out_of_memory;
                return Ok(first);
            }
            Err(FanOutError::Failed { rank, error }) => ShardError::Call {
                rank,
                call: "Step",
                status: error,
            },
            Err(FanOutError::TimedOut { pending, waited }) => {
                // Ranks blocked in a collective still answer Health; the hung one does not.
                let unresponsive = self.unresponsive_ranks(DIAGNOSE_TIMEOUT).await;
                ShardError::TimedOut {
                    call: "Step",
                    pending,
                    waited,
                    unresponsive,
                }
            }
        };
        Err(self.latch(step_id, error))
    }

    /// Marks the set unusable because step `step_id` failed with `error`.
    fn latch(&self, step_id: u64, error: ShardError) -> ShardError {
        let reason = format!("step {step_id}: {error}");
        tracing::error!(%reason, "shard failure: failing in-flight requests, reporting unhealthy");
        let _ = self.failure.set(reason);
        error
    }
}

impl StepExecutor for ShardSet {
    /// Every shard computes the same step (tensor parallelism); rank 0's tokens count.
    /// The step is on every rank's stream when this returns.
    fn step(
        &self,
        request: pb::StepRequest,
    ) -> impl std::future::Future<Output = Result<pb::StepResponse, StepError>> + Send {
        let sent = self.send_step(&request);
        let set = self.clone();
        let (step_id, tokens) = (request.step_id, step_tokens(&request));
        // The log gets the whole error (`latch`, the step loop); the failed requests get
        // only its public message.
        async move {
            let answers = sent.map_err(|err| err.failure())?;
            set.finish_step(step_id, tokens, answers)
                .await
                .map_err(|err| err.failure())
        }
    }
}
