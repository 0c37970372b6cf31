//! gRPC clients of the shards (one per rank, over unix sockets) and the `StepExecutor`
//! that fans each step out to all of them.
use std::time::{Duration, Instant};

use futures::future::join_all;
use tonic::transport::{Channel, Endpoint};

use crate::pb;
use crate::pb::text_generation_shard_client::TextGenerationShardClient;
use crate::scheduler::{StepError, StepExecutor};

/// Steps carry whole prompts; allow far more than tonic's 4 MiB default.
const MAX_MESSAGE_BYTES: usize = 256 << 20;
const CONNECT_RETRY_INTERVAL: Duration = Duration::from_millis(500);

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
    #[error("no shards to talk to")]
    NoShards,
}

/// One client per rank, in rank order. Cheap to clone (channels are shared).
#[derive(Debug, Clone)]
pub struct ShardSet {
    clients: Vec<TextGenerationShardClient<Channel>>,
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
            tracing::info!(rank, path, "connected to shard");
            clients.push(
                TextGenerationShardClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            );
        }
        Ok(Self { clients })
    }

    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    pub async fn clear_cache(&self) -> Result<(), ShardError> {
        self.on_all("ClearCache", |mut c| async move {
            c.clear_cache(pb::ClearCacheRequest {}).await
        })
        .await
        .map(|_| ())
    }

    /// Every shard's `Info`, in rank order.
    pub async fn info(&self) -> Result<Vec<pb::InfoResponse>, ShardError> {
        self.on_all(
            "Info",
            |mut c| async move { c.info(pb::InfoRequest {}).await },
        )
        .await
    }

    /// Every shard's `Warmup` answer, in rank order.
    pub async fn warmup(
        &self,
        request: pb::WarmupRequest,
    ) -> Result<Vec<pb::WarmupResponse>, ShardError> {
        self.on_all(
            "Warmup",
            move |mut c| async move { c.warmup(request).await },
        )
        .await
    }

    /// Ok when every shard answers `Health` within `timeout`.
    pub async fn health(&self, timeout: Duration) -> Result<(), ShardError> {
        let probe = self.on_all("Health", |mut c| async move {
            c.health(pb::HealthRequest {}).await
        });
        match tokio::time::timeout(timeout, probe).await {
            Ok(result) => result.map(|_| ()),
            Err(_) => Err(ShardError::Call {
                rank: 0,
                call: "Health",
                status: tonic::Status::deadline_exceeded(format!("no answer within {timeout:?}")),
            }),
        }
    }

    /// Runs the same call on every shard concurrently; the first failing rank is reported.
    async fn on_all<T, F, Fut>(&self, call: &'static str, f: F) -> Result<Vec<T>, ShardError>
    where
        F: Fn(TextGenerationShardClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let answers = join_all(self.clients.iter().cloned().map(f)).await;
        answers
            .into_iter()
            .enumerate()
            .map(|(rank, answer)| {
                answer
                    .map(tonic::Response::into_inner)
                    .map_err(|status| ShardError::Call { rank, call, status })
            })
            .collect()
    }
}

impl StepExecutor for ShardSet {
    /// Every shard computes the same step (tensor parallelism); rank 0's tokens count.
    async fn step(&self, request: pb::StepRequest) -> Result<pb::StepResponse, StepError> {
        let answers = self
            .on_all("Step", |mut c| {
                let request = request.clone();
                async move { c.step(request).await }
            })
            .await
            .map_err(|err| StepError(err.to_string()))?;
        answers
            .into_iter()
            .next()
            .ok_or_else(|| StepError("no shards".into()))
    }
}
