//! Command line (TGI's flag names, each with its env twin) and the limits derived from it
//! once the shards have reported their KV capacity.
use std::path::PathBuf;

use clap::Parser;

use crate::scheduler::AdmissionPolicy;

/// `true`/`false` (also `1`/`0`, any case), like the launcher's boolean flags.
fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("expected true or false, got {text:?}")),
    }
}

/// A positive, finite number of seconds (fractions allowed).
fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds.is_finite() && seconds < 1e9 => Ok(seconds),
        _ => Err(format!(
            "expected a positive number of seconds, got {text:?}"
        )),
    }
}

/// `--prefill-pacing-slack`: `off`, or how much longer than its decodes alone a step
/// beside running streams may run to take prompt tokens (0.25: 25 %).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacingSlack(pub Option<f64>);

fn parse_pacing_slack(text: &str) -> Result<PacingSlack, String> {
    match text.trim() {
        "off" => Ok(PacingSlack(None)),
        number => match number.parse::<f64>() {
            Ok(slack) if slack >= 0.0 && slack.is_finite() => Ok(PacingSlack(Some(slack))),
            _ => Err(format!("expected `off` or a fraction >= 0, got {text:?}")),
        },
    }
}

/// textgen-router: HTTP front end of textgen. Every flag can also be set through the
/// environment variable named in `[env: ...]`.
#[derive(Debug, Clone, Parser)]
#[command(name = "textgen-router", version, about)]
pub struct Args {
    /// Model id reported by `/info` (the Hub id or path the user asked for).
    #[arg(long, env = "MODEL_ID")]
    pub model_id: String,
    /// Local model directory holding tokenizer.json, config.json, generation_config.json.
    #[arg(long, env = "MODEL_PATH")]
    pub model_path: PathBuf,
    /// Shard i listens on the unix socket `{shard_uds_path}-{i}`.
    #[arg(
        long,
        env = "SHARD_UDS_PATH",
        default_value = "/tmp/text-generation-server"
    )]
    pub shard_uds_path: String,
    #[arg(long, env = "NUM_SHARD", default_value_t = 1)]
    pub num_shard: u32,
    #[arg(long, env = "HOSTNAME", default_value = "0.0.0.0")]
    pub hostname: String,
    #[arg(short, long, env = "PORT", default_value_t = 3000)]
    pub port: u16,
    /// Requests served at once; more get 429. TGI's 128 capped a 512-request burst at 0.73x
    /// vLLM's throughput on an H200 (1024: 0.86x, and the issue-3 mix 0.90x -> 1.03x;
    /// bench/results/gpu_vs_vllm_h200.md): requests past the KV pool wait in the router's
    /// queue instead of getting 429s.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 1024)]
    pub max_concurrent_requests: usize,
    #[arg(long, env = "MAX_BEST_OF", default_value_t = 2)]
    pub max_best_of: usize,
    #[arg(long, env = "MAX_STOP_SEQUENCES", default_value_t = 4)]
    pub max_stop_sequences: usize,
    #[arg(long, env = "MAX_TOP_N_TOKENS", default_value_t = 5)]
    pub max_top_n_tokens: u32,
    /// Default: max_total_tokens - 1.
    #[arg(long, env = "MAX_INPUT_TOKENS")]
    pub max_input_tokens: Option<u32>,
    /// Default: min(KV pool tokens, max_position_embeddings).
    #[arg(long, env = "MAX_TOTAL_TOKENS")]
    pub max_total_tokens: Option<u32>,
    /// Token budget of one step (prefill chunks plus decodes).
    #[arg(long, env = "MAX_BATCH_PREFILL_TOKENS", default_value_t = 4096)]
    pub max_batch_prefill_tokens: u32,
    /// Caps the KV pool used (in tokens); default: all the pool measured at warmup.
    #[arg(long, env = "MAX_BATCH_TOTAL_TOKENS")]
    pub max_batch_total_tokens: Option<u32>,
    /// Most sequences in one step.
    #[arg(long, env = "MAX_BATCH_SIZE")]
    pub max_batch_size: Option<u32>,
    /// Reuse the KV of prompt and generated prefixes that earlier requests computed
    /// (radix prefix cache): `true` or `false`.
    #[arg(long, env = "PREFIX_CACHING", default_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub prefix_caching: bool,
    /// Apply the model's generation_config.json sampling values (temperature, top_p,
    /// top_k, repetition_penalty) to OpenAI requests that leave them unset: `true` or
    /// `false`. TGI's native routes never apply them.
    #[arg(long, env = "GENERATION_CONFIG_DEFAULTS", default_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub generation_config_defaults: bool,
    /// Speculative decoding (TGI's flag): a decode drafts up to this many tokens by prompt
    /// lookup (n-gram) and verifies them in the same forward pass; the text is unchanged.
    /// 0 turns it off.
    #[arg(long, env = "SPECULATE", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub speculate: u32,
    /// Order of admission: `longest-prefix` (longest cached prefix first, with an age
    /// cap) or `fifo`.
    #[arg(long, env = "SCHEDULING_POLICY", default_value = "longest-prefix")]
    pub scheduling_policy: AdmissionPolicy,
    /// Milliseconds after which a waiting request goes ahead of requests with a longer
    /// cached prefix (`longest-prefix` only).
    #[arg(long, env = "SCHEDULING_AGE_CAP_MS", default_value_t = 2_000)]
    pub scheduling_age_cap_ms: u64,
    /// Prefill pacing: while streams are decoding, a step takes only the prompt tokens that
    /// keep its expected time within this fraction of its decodes' own (learned from the
    /// steps run), so arriving prompts stretch no stream's step much; `off`: each step may
    /// take the whole `--max-batch-prefill-tokens`. Off by default: on an H100 (8B, Poisson
    /// 8 and 32 req/s) slacks of 0.1 and 0.25 left TPOT within 1 % and doubled TTFT p50, a
    /// small mixed step costing ~12 % more than a decode step (bench/results/pacing_h100_stop59.md).
    #[arg(long, env = "PREFILL_PACING_SLACK", default_value = "off", value_parser = parse_pacing_slack)]
    pub prefill_pacing_slack: PacingSlack,
    /// Milliseconds a request may wait for its first token before pacing yields and the
    /// next step takes the whole budget again (bounds what pacing adds to TTFT).
    #[arg(long, env = "PREFILL_PACING_PATIENCE_MS", default_value_t = 50)]
    pub prefill_pacing_patience_ms: u64,
    /// Events a stream may fall behind its reader before it is dropped (its sequence
    /// cancelled, its KV freed): a client that stops reading holds nothing for long.
    #[arg(
        long,
        env = "MAX_STREAM_BACKLOG",
        default_value_t = 1024,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_stream_backlog: u32,
    /// Largest request body in bytes; larger bodies get 413.
    #[arg(long, env = "PAYLOAD_LIMIT", default_value_t = 2_000_000)]
    pub payload_limit: usize,
    /// Seconds a client may take to send a request's headers (HTTP/1); it also bounds the
    /// wait for the next request on a kept-alive connection. Past it the connection closes.
    #[arg(long, env = "HEADER_READ_TIMEOUT", default_value_t = 30.0, value_parser = parse_seconds)]
    pub header_read_timeout: f64,
    /// Seconds a client may take to send a request's body after its headers; past it the
    /// request gets 408 and the connection closes.
    #[arg(long, env = "BODY_READ_TIMEOUT", default_value_t = 30.0, value_parser = parse_seconds)]
    pub body_read_timeout: f64,
    /// Seconds a connection may stay open with no request in flight and no byte moving
    /// (a streaming response is in flight until it ends).
    #[arg(long, env = "KEEP_ALIVE_TIMEOUT", default_value_t = 15.0, value_parser = parse_seconds)]
    pub keep_alive_timeout: f64,
    /// Most client connections open at once; more are closed at once (loopback clients,
    /// such as the launcher's health probe, get a few more). Also the listen backlog: that
    /// many clients connecting at the same instant all wait for accept.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Refuse every request that carries a grammar (TGI's flag): 422 on the native routes,
    /// 400 on the OpenAI routes.
    #[arg(long, env = "DISABLE_GRAMMAR_SUPPORT")]
    pub disable_grammar_support: bool,
    /// Tokenize special-token strings in chat messages (`<|im_end|>` in a user's text) as
    /// special tokens. Off (the default), message text is text; the chat template's own
    /// special tokens are special either way (docs/openai.md).
    #[arg(long, env = "ALLOW_SPECIAL_TOKENS_IN_CONTENT")]
    pub allow_special_tokens_in_content: bool,
    /// Largest grammar a request may send (a JSON schema's JSON, a regex, a Lark grammar,
    /// the choices together), in bytes; larger ones are refused before compiling.
    #[arg(long, env = "MAX_GRAMMAR_BYTES", default_value_t = 1_000_000)]
    pub max_grammar_bytes: usize,
    /// Milliseconds the router may spend compiling one request's grammar; past it the
    /// request is refused.
    #[arg(long, env = "GRAMMAR_COMPILE_TIMEOUT_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub grammar_compile_timeout_ms: u64,
    /// Threads that may tokenize or compile grammars at once.
    #[arg(long, env = "VALIDATION_WORKERS", default_value_t = 2)]
    pub validation_workers: usize,
    /// Allowed CORS origins (repeatable or comma list); none: CORS is off, no
    /// `Access-Control-*` header is sent.
    #[arg(long, env = "CORS_ALLOW_ORIGIN", value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,
    /// Required as `Authorization: Bearer <key>` on generation routes when set.
    #[arg(long, env = "API_KEY")]
    pub api_key: Option<String>,
    /// Seconds to keep retrying the shard sockets at startup.
    #[arg(long, env = "SHARD_CONNECT_TIMEOUT", default_value_t = 600)]
    pub shard_connect_timeout: u64,
    /// Watermark: share of the vocabulary that is green after each token, in (0, 1).
    #[arg(long, env = "WATERMARK_GAMMA", default_value_t = 0.5)]
    pub watermark_gamma: f32,
    /// Watermark: bias added to green tokens' logits, > 0.
    #[arg(long, env = "WATERMARK_DELTA", default_value_t = 2.0)]
    pub watermark_delta: f32,
    /// Seconds a step may take on the shards before the router counts a shard as hung: it
    /// fails the in-flight requests and reports unhealthy on `/health`. Each step also gets
    /// four times what its tokens cost at the rate warmup measured, so a long prefill on a
    /// slow device is not taken for a hang.
    #[arg(long, env = "STEP_TIMEOUT", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub step_timeout: u64,
    /// Log filter (tracing-subscriber syntax), e.g. `info` or `textgen_router=debug`.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    #[arg(long, env = "JSON_OUTPUT")]
    pub json_output: bool,
    /// OpenTelemetry collector to export traces to (e.g. `http://collector:4317`). Without
    /// it, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` are used;
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` picks `grpc` (default) or `http/protobuf`.
    #[arg(long, env = "OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Service name of the exported spans; default `OTEL_SERVICE_NAME`, else
    /// `textgen-router`.
    #[arg(long, env = "OTLP_SERVICE_NAME")]
    pub otlp_service_name: Option<String>,
}

impl Args {
    /// The tracing flags, for [`crate::telemetry::TraceSettings::resolve`].
    pub fn trace_flags(&self) -> crate::telemetry::TraceFlags {
        crate::telemetry::TraceFlags {
            otlp_endpoint: self.otlp_endpoint.clone(),
            otlp_service_name: self.otlp_service_name.clone(),
        }
    }

    /// `--body-read-timeout`.
    pub fn body_read_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.body_read_timeout)
    }

    /// `--header-read-timeout`, `--keep-alive-timeout`, `--max-connections`.
    pub fn connection_options(&self) -> crate::server::ConnectionOptions {
        crate::server::ConnectionOptions {
            header_read_timeout: std::time::Duration::from_secs_f64(self.header_read_timeout),
            keep_alive_timeout: std::time::Duration::from_secs_f64(self.keep_alive_timeout),
            max_connections: self.max_connections as usize,
        }
    }
}

/// What the shards reported at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardCapacity {
    pub block_size: u32,
    pub num_blocks: u32,
    pub max_position_embeddings: u32,
}

/// Request-size limits, consistent with the KV pool: a request that passes validation
/// always fits in the pool on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_input_tokens: u32,
    pub max_total_tokens: u32,
    /// Blocks the scheduler may use (the pool, capped by `--max-batch-total-tokens`).
    pub num_blocks: u32,
    pub max_batch_total_tokens: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error(
        "the shards reported an empty KV pool (block_size {block_size}, num_blocks {num_blocks})"
    )]
    EmptyPool { block_size: u32, num_blocks: u32 },
    #[error("`max_total_tokens` ({max_total}) must fit in the KV pool ({capacity} tokens); lower `--max-total-tokens` or raise the KV pool size")]
    NotEnoughKvMemory { max_total: u32, capacity: u32 },
    #[error("`max_input_tokens` ({max_input}) must be < `max_total_tokens` ({max_total})")]
    InputNotBelowTotal { max_input: u32, max_total: u32 },
    #[error("`--max-batch-total-tokens` ({0}) is smaller than one KV block")]
    BatchTotalBelowBlock(u32),
    #[error("`--max-batch-prefill-tokens` must be > 0")]
    ZeroPrefillBudget,
}

impl Args {
    /// Derives the limits like TGI v3: totals default to what the pool and the model's
    /// positions allow; inputs default to one less.
    pub fn derive_limits(&self, shards: ShardCapacity) -> Result<Limits, LimitsError> {
        if shards.block_size == 0 || shards.num_blocks == 0 {
            return Err(LimitsError::EmptyPool {
                block_size: shards.block_size,
                num_blocks: shards.num_blocks,
            });
        }
        if self.max_batch_prefill_tokens == 0 {
            return Err(LimitsError::ZeroPrefillBudget);
        }
        let num_blocks = match self.max_batch_total_tokens {
            Some(tokens) if tokens < shards.block_size => {
                return Err(LimitsError::BatchTotalBelowBlock(tokens))
            }
            Some(tokens) => shards.num_blocks.min(tokens / shards.block_size),
            None => shards.num_blocks,
        };
        let capacity = num_blocks.saturating_mul(shards.block_size);
        let max_total = self
            .max_total_tokens
            .unwrap_or_else(|| capacity.min(shards.max_position_embeddings.max(2)));
        if max_total > capacity {
            return Err(LimitsError::NotEnoughKvMemory {
                max_total,
                capacity,
            });
        }
        let max_input = self.max_input_tokens.unwrap_or(max_total.saturating_sub(1));
        if max_input >= max_total || max_input == 0 {
            return Err(LimitsError::InputNotBelowTotal {
                max_input,
                max_total,
            });
        }
        Ok(Limits {
            max_input_tokens: max_input,
            max_total_tokens: max_total,
            num_blocks,
            max_batch_total_tokens: capacity,
        })
    }

    /// Sequences per step announced to the shards at warmup: a step never carries more
    /// sequences than tokens, nor more than can be in flight (requests × best_of).
    pub fn warmup_batch_size(&self) -> u32 {
        let in_flight = self
            .max_concurrent_requests
            .saturating_mul(self.max_best_of.max(1));
        let in_flight = u32::try_from(in_flight).unwrap_or(u32::MAX);
        self.max_batch_size
            .unwrap_or(in_flight)
            .min(self.max_batch_prefill_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["textgen-router", "--model-id", "m", "--model-path", "/m"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("valid arguments")
    }

    const POOL: ShardCapacity = ShardCapacity {
        block_size: 16,
        num_blocks: 100,
        max_position_embeddings: 8192,
    };

    #[test]
    fn defaults_follow_tgi() {
        let a = args(&[]);
        assert_eq!(a.port, 3000);
        assert_eq!(a.max_concurrent_requests, 1024);
        assert_eq!(a.max_best_of, 2);
        assert_eq!(a.max_stop_sequences, 4);
        assert_eq!(a.max_top_n_tokens, 5);
        assert_eq!(a.payload_limit, 2_000_000);
        assert_eq!(a.shard_uds_path, "/tmp/text-generation-server");
        assert!(a.prefix_caching);
        assert_eq!(a.scheduling_policy, AdmissionPolicy::LongestPrefix);
    }

    #[test]
    fn connection_bounds_default_and_parse() {
        let a = args(&[]);
        assert_eq!(
            a.connection_options(),
            crate::server::ConnectionOptions::default()
        );
        assert_eq!(a.body_read_timeout(), std::time::Duration::from_secs(30));
        let a = args(&["--header-read-timeout", "0.5", "--max-connections", "3"]);
        assert_eq!(
            a.connection_options().header_read_timeout,
            std::time::Duration::from_millis(500)
        );
        assert_eq!(a.connection_options().max_connections, 3);
        for bad in [
            &["--body-read-timeout", "0"][..],
            &["--keep-alive-timeout", "-1"],
            &["--header-read-timeout", "inf"],
            &["--max-connections", "0"],
        ] {
            let mut argv = vec!["textgen-router", "--model-id", "m", "--model-path", "/m"];
            argv.extend_from_slice(bad);
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prefill_pacing_is_off_or_a_non_negative_slack() {
        assert_eq!(args(&[]).prefill_pacing_slack, PacingSlack(None));
        assert_eq!(args(&[]).prefill_pacing_patience_ms, 50);
        let paced = args(&["--prefill-pacing-slack", "0.25"]);
        assert_eq!(paced.prefill_pacing_slack, PacingSlack(Some(0.25)));
        assert_eq!(
            args(&["--prefill-pacing-slack", "0"]).prefill_pacing_slack,
            PacingSlack(Some(0.0))
        );
        for bad in ["-0.1", "inf", "NaN", "on", ""] {
            let argv = [
                "textgen-router",
                "--model-id",
                "m",
                "--model-path",
                "/m",
                "--prefill-pacing-slack",
                bad,
            ];
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn stream_backlog_is_a_positive_count() {
        assert_eq!(args(&[]).max_stream_backlog, 1024);
        assert_eq!(args(&["--max-stream-backlog", "8"]).max_stream_backlog, 8);
        let argv = ["textgen-router", "--model-id", "m", "--model-path", "/m"];
        for bad in ["0", "-1", "many", "4294967296"] {
            let flag = ["--max-stream-backlog", bad];
            assert!(
                Args::try_parse_from(argv.iter().chain(flag.iter())).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn prefix_caching_and_policy_flags_parse() {
        let a = args(&["--prefix-caching", "false", "--scheduling-policy", "fifo"]);
        assert!(!a.prefix_caching);
        assert_eq!(a.scheduling_policy, AdmissionPolicy::Fifo);
        assert!(args(&["--prefix-caching", "TRUE"]).prefix_caching);
        let argv = ["textgen-router", "--model-id", "m", "--model-path", "/m"];
        for bad in [
            ["--prefix-caching", "maybe"],
            ["--scheduling-policy", "random"],
        ] {
            let error = Args::try_parse_from(argv.iter().chain(bad.iter())).unwrap_err();
            assert!(error.to_string().contains(bad[1]), "{error}");
        }
    }

    #[test]
    fn totals_default_to_pool_or_positions() {
        let limits = args(&[]).derive_limits(POOL).unwrap();
        assert_eq!(limits.max_total_tokens, 1600);
        assert_eq!(limits.max_input_tokens, 1599);
        let small_model = ShardCapacity {
            max_position_embeddings: 512,
            ..POOL
        };
        let limits = args(&[]).derive_limits(small_model).unwrap();
        assert_eq!(
            (limits.max_total_tokens, limits.max_input_tokens),
            (512, 511)
        );
    }

    #[test]
    fn total_over_pool_is_refused() {
        let err = args(&["--max-total-tokens", "2000"])
            .derive_limits(POOL)
            .unwrap_err();
        assert_eq!(
            err,
            LimitsError::NotEnoughKvMemory {
                max_total: 2000,
                capacity: 1600
            }
        );
    }

    #[test]
    fn input_must_stay_below_total() {
        let err = args(&["--max-total-tokens", "100", "--max-input-tokens", "100"])
            .derive_limits(POOL)
            .unwrap_err();
        assert!(matches!(err, LimitsError::InputNotBelowTotal { .. }));
    }

    #[test]
    fn batch_total_caps_the_pool() {
        let limits = args(&["--max-batch-total-tokens", "800"])
            .derive_limits(POOL)
            .unwrap();
        assert_eq!(limits.num_blocks, 50);
        assert_eq!(limits.max_total_tokens, 800);
        let err = args(&["--max-batch-total-tokens", "8"])
            .derive_limits(POOL)
            .unwrap_err();
        assert_eq!(err, LimitsError::BatchTotalBelowBlock(8));
    }

    #[test]
    fn warmup_batch_never_exceeds_token_budget() {
        assert_eq!(
            args(&["--max-batch-prefill-tokens", "64"]).warmup_batch_size(),
            64
        );
        assert_eq!(
            args(&[]).warmup_batch_size(),
            2048,
            "1024 requests x best_of 2, under the 4096-token budget"
        );
        let a = args(&["--max-batch-prefill-tokens", "64", "--max-batch-size", "8"]);
        assert_eq!(a.warmup_batch_size(), 8);
    }
}
