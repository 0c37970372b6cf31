//! Startup: shards (connect, ClearCache, Info, Warmup), limits, tokenizer, scheduler,
//! HTTP server, and shutdown on SIGTERM/SIGINT.
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::chat_template::ChatTemplate;
use crate::config::{Args, Limits, ShardCapacity};
use crate::generation_defaults::GenerationDefaults;
use crate::grammar::{GrammarCompiler, GrammarLimits};
use crate::infer::Infer;
use crate::pb;
use crate::scheduler::{self, PrefillPacing, SchedulerConfig};
use crate::server::{self, AppState, HealthProbe, HttpOptions, Info, OpenAiContext};
use crate::shards::ShardSet;
use crate::tokenizer::TextTokenizer;
use crate::validation::{Validation, ValidationLimits, WatermarkSettings};

const HEALTH_TIMEOUT: Duration = Duration::from_secs(10);

impl HealthProbe for ShardSet {
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.health(HEALTH_TIMEOUT)
                .await
                .map_err(|err| err.to_string())
        })
    }
}

/// What the shards told us at startup.
struct ShardReport {
    info: pb::InfoResponse,
    capacity: ShardCapacity,
    warmups: Vec<pb::WarmupResponse>,
}

async fn prepare_shards(args: &Args, shards: &ShardSet) -> anyhow::Result<ShardReport> {
    shards.clear_cache().await?;
    let infos = shards.info().await?;
    let info = infos
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no shard answered Info"))?;
    if let Some(odd) = infos.iter().find(|i| i.block_size != info.block_size) {
        anyhow::bail!(
            "shards disagree on block_size: {} vs {}",
            info.block_size,
            odd.block_size
        );
    }
    let warmups = shards
        .warmup(pb::WarmupRequest {
            max_batch_prefill_tokens: args.max_batch_prefill_tokens,
            max_batch_size: args.warmup_batch_size(),
        })
        .await?;
    // The smallest pool bounds every shard (they hold the same block ids).
    let num_blocks = warmups.iter().map(|w| w.num_blocks).min().unwrap_or(0);
    let slowest_ms = warmups.iter().map(|w| w.warmup_ms).max().unwrap_or(0);
    tracing::info!(
        num_blocks,
        block_size = info.block_size,
        warmup_ms = slowest_ms,
        "shards warmed up"
    );
    let capacity = ShardCapacity {
        block_size: info.block_size,
        num_blocks,
        max_position_embeddings: info.max_position_embeddings,
    };
    Ok(ShardReport {
        info,
        capacity,
        warmups,
    })
}

fn model_info(args: &Args, limits: &Limits, shard: &pb::InfoResponse) -> Info {
    Info {
        model_id: args.model_id.clone(),
        model_sha: None,
        model_pipeline_tag: Some("text-generation".to_owned()),
        model_dtype: shard.dtype.clone(),
        model_device_type: shard.device_type.clone(),
        max_concurrent_requests: args.max_concurrent_requests,
        max_best_of: args.max_best_of,
        max_stop_sequences: args.max_stop_sequences,
        max_top_n_tokens: args.max_top_n_tokens,
        max_input_tokens: limits.max_input_tokens,
        max_total_tokens: limits.max_total_tokens,
        max_batch_prefill_tokens: args.max_batch_prefill_tokens,
        max_batch_total_tokens: limits.max_batch_total_tokens,
        max_batch_size: args.max_batch_size,
        block_size: shard.block_size,
        speculate: args.speculate,
        num_shard: args.num_shard,
        validation_workers: args.validation_workers,
        router: env!("CARGO_PKG_NAME"),
        version: env!("CARGO_PKG_VERSION"),
        sha: (crate::metrics::BUILD.git_sha != "unknown")
            .then(|| crate::metrics::BUILD.git_sha.to_owned()),
        docker_label: None,
    }
}

/// The chat template and the model's identity for the OpenAI routes. A model without a
/// (working) chat template still serves everything else; chat requests then get a 400
/// that says why.
fn openai_context(args: &Args, stop_token_ids: &[u32]) -> anyhow::Result<OpenAiContext> {
    let chat_template = ChatTemplate::from_model_dir(&args.model_path)
        .map(|t| t.allow_special_tokens_in_content(args.allow_special_tokens_in_content));
    match &chat_template {
        Ok(_) => tracing::info!("chat template loaded"),
        Err(err) => tracing::warn!(%err, "chat completions are unavailable"),
    }
    // The model files' write time stands for when the model was created.
    let created = std::fs::metadata(args.model_path.join("config.json"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or_else(server::openai::unix_now, |d| d.as_secs());
    // Off, requests fall back to OpenAI's defaults alone (vLLM's `--generation-config vllm`).
    let generation = if args.generation_config_defaults {
        GenerationDefaults::from_model_dir(&args.model_path)?
    } else {
        GenerationDefaults::default()
    };
    tracing::info!(?generation, "OpenAI routes' sampling defaults");
    let tool_syntax =
        crate::tools::model_tool_syntax(&args.model_path, chat_template.as_ref().ok());
    Ok(OpenAiContext {
        model_id: args.model_id.clone(),
        created,
        chat_template,
        defaults: server::openai::mapping::ModelDefaults {
            generation,
            stop_token_ids: stop_token_ids.to_vec(),
            tool_syntax,
        },
    })
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => tracing::info!("SIGINT received, draining"),
        _ = terminate => tracing::info!("SIGTERM received, draining"),
    }
}

/// The grammar compiler for the served vocabulary; None with `--disable-grammar-support`.
fn grammar_compiler(
    args: &Args,
    tokenizer: &Arc<TextTokenizer>,
    vocab_size: u32,
    stop_token_ids: &[u32],
) -> anyhow::Result<Option<Arc<GrammarCompiler>>> {
    if args.disable_grammar_support {
        tracing::info!("grammar support disabled");
        return Ok(None);
    }
    let started = std::time::Instant::now();
    let env = crate::grammar::token_env(tokenizer.clone(), vocab_size, stop_token_ids)?;
    let limits = GrammarLimits {
        max_bytes: args.max_grammar_bytes,
        compile_timeout: Duration::from_millis(args.grammar_compile_timeout_ms),
    };
    let compiler = GrammarCompiler::new(env, stop_token_ids.to_vec(), limits)?;
    tracing::info!(
        took_ms = started.elapsed().as_millis() as u64,
        "grammar compiler ready"
    );
    Ok(Some(Arc::new(compiler)))
}

/// Runs the router until a signal has drained it.
pub async fn run(args: Args) -> anyhow::Result<()> {
    crate::telemetry::set_served_model(&args.model_id);
    if args.validation_workers == 0 {
        anyhow::bail!("--validation-workers must be > 0");
    }
    if !(args.watermark_gamma > 0.0 && args.watermark_gamma < 1.0) {
        anyhow::bail!("--watermark-gamma must be in (0, 1)");
    }
    if !(args.watermark_delta > 0.0 && args.watermark_delta.is_finite()) {
        anyhow::bail!("--watermark-delta must be > 0");
    }
    let prometheus = crate::metrics::install()?;
    let tokenizer = Arc::new(TextTokenizer::from_file(
        &args.model_path.join("tokenizer.json"),
    )?);
    let stop_token_ids = crate::model_files::stop_token_ids(&args.model_path, &tokenizer)?;
    tracing::info!(?stop_token_ids, "tokenizer loaded");
    let openai = openai_context(&args, &stop_token_ids)?;

    let shards = ShardSet::connect(
        &args.shard_uds_path,
        args.num_shard as usize,
        Duration::from_secs(args.shard_connect_timeout),
    )
    .await?
    .with_step_timeout(Duration::from_secs(args.step_timeout));
    let report = prepare_shards(&args, &shards).await?;
    let shards = shards.with_warmup_rate(&report.warmups);
    let limits = args.derive_limits(report.capacity)?;
    tracing::info!(?limits, "limits");

    let scheduler_config = SchedulerConfig {
        block_size: report.capacity.block_size,
        num_blocks: limits.num_blocks,
        max_batch_prefill_tokens: args.max_batch_prefill_tokens,
        max_batch_size: args.max_batch_size,
        prefix_caching: args.prefix_caching,
        long_rope_prompt_tokens: (report.info.long_rope_prompt_tokens > 0)
            .then_some(report.info.long_rope_prompt_tokens),
        admission_policy: args.scheduling_policy,
        admission_age_cap: Duration::from_millis(args.scheduling_age_cap_ms),
        max_stream_backlog: args.max_stream_backlog as usize,
        num_draft_tokens: args.speculate,
        prefill_pacing: args.prefill_pacing_slack.0.map(|slack| PrefillPacing {
            slack,
            patience: Duration::from_millis(args.prefill_pacing_patience_ms),
        }),
    };
    tracing::info!(
        prefix_caching = args.prefix_caching,
        long_rope_prompt_tokens = ?scheduler_config.long_rope_prompt_tokens,
        policy = %args.scheduling_policy,
        prefill_pacing = ?scheduler_config.prefill_pacing,
        "scheduler"
    );
    scheduler_config.validate()?;
    let scheduler = scheduler::spawn(scheduler_config, shards.clone());

    let validation_limits = ValidationLimits {
        max_best_of: args.max_best_of,
        max_stop_sequences: args.max_stop_sequences,
        max_top_n_tokens: args.max_top_n_tokens,
        max_input_tokens: limits.max_input_tokens,
        max_total_tokens: limits.max_total_tokens,
        vocab_size: report.info.vocab_size,
        watermark: WatermarkSettings {
            gamma: args.watermark_gamma,
            delta: args.watermark_delta,
        },
    };
    let validation = Validation::new(
        tokenizer.clone(),
        validation_limits,
        args.validation_workers,
    );
    let validation =
        match grammar_compiler(&args, &tokenizer, report.info.vocab_size, &stop_token_ids)? {
            Some(compiler) => validation.with_grammar(compiler),
            None => validation,
        };
    let infer = Infer::new(
        scheduler,
        validation,
        tokenizer,
        args.max_concurrent_requests,
        stop_token_ids,
    );
    let drain_watch = shards.clone();
    let state = AppState {
        infer: Arc::new(infer),
        health: Arc::new(shards),
        info: Arc::new(model_info(&args, &limits, &report.info)),
        prometheus,
        openai: Arc::new(openai),
    };
    let options = HttpOptions {
        payload_limit: args.payload_limit,
        cors_allow_origin: args.cors_allow_origin.clone(),
        api_key: args.api_key.clone(),
        body_read_timeout: Some(args.body_read_timeout()),
        connections: args.connection_options(),
    };
    let listener = server::listen(&args.hostname, args.port, args.max_connections).await?;
    tracing::info!(address = %listener.local_addr()?, "serving");
    // The drain is bounded: it ends early on a second signal, or on shards that cannot
    // finish the requests it waits for (failed, or stopped).
    let (signalled, on_signal) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown_signal().await;
        let _ = signalled.send(true);
    };
    let serving = server::serve(
        listener,
        server::router(state, &options),
        &options,
        shutdown,
    );
    tokio::select! {
        served = serving => {
            served?;
            tracing::info!("drained, exiting");
        }
        why = drain_cut_short(on_signal, drain_watch) => {
            tracing::warn!(why, "exiting before every request drained");
        }
    }
    Ok(())
}

/// After the shards failed, how long the drain still runs, so that the error events of the
/// requests they failed reach their clients.
const FAILED_DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Resolves, once a shutdown signal has come, when the drain cannot finish or should not:
/// a second signal, or shards that are unusable (failed, or stopped past the time their
/// steps get to fail), on which in-flight requests would wait forever.
async fn drain_cut_short(
    mut on_signal: tokio::sync::watch::Receiver<bool>,
    shards: ShardSet,
) -> &'static str {
    if on_signal.wait_for(|signalled| *signalled).await.is_err() {
        return std::future::pending().await;
    }
    let second = shutdown_signal();
    tokio::pin!(second);
    let mut stopped_since: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            _ = &mut second => return "a second signal",
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        if shards.failure().is_some() {
            tokio::time::sleep(FAILED_DRAIN_GRACE).await;
            return "the shards failed; their requests have been failed";
        }
        if shards.stopped().is_empty() {
            stopped_since = None;
        } else {
            let since = *stopped_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= crate::shards::STOPPED_GRACE + Duration::from_secs(2) {
                return "a shard is stopped (SIGSTOP)";
            }
        }
    }
}
