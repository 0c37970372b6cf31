//! Prometheus metrics: the recorder (histogram buckets for every `textgen_*` histogram),
//! the catalog of what each metric means, and the per-request meter the HTTP side uses.
//! `docs/metrics.md` documents every metric; a test keeps it and the catalog in step.
mod catalog;
mod grammar;
mod meter;
pub mod names;
#[cfg(test)]
mod tests;

use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

pub use catalog::{Kind, MetricSpec, BUILD, CATALOG};
pub use grammar::{record_grammar_compile, record_refusal};
pub use meter::{count_request, Outcome, RequestMeter, Route};
use names::*;

/// Request latencies from 1 ms to 2 minutes, roughly ×2 apart (TTFT, ITL, end-to-end, queue).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0,
    15.0, 30.0, 60.0, 120.0,
];
/// Step and shard timings: sampling can take well under a millisecond on a GPU.
const STEP_SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Sequences per step.
const BATCH_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// Tokens per step (prefill chunks plus decodes).
const STEP_TOKENS_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
];

/// Drafts kept per verification (speculative decoding): 0 up to `--speculate`.
const ACCEPTED_LENGTH_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0];

/// A recorder builder with buckets for every textgen histogram (a histogram without
/// buckets would be rendered as a summary).
pub fn builder() -> Result<PrometheusBuilder, BuildError> {
    let mut builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(STEP_BATCH_SIZE.into()), BATCH_SIZE_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(STEP_TOKENS.into()), STEP_TOKENS_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(SPECULATIVE_ACCEPTED_LENGTH.into()),
            ACCEPTED_LENGTH_BUCKETS,
        )?;
    for name in [
        STEP_DURATION,
        SHARD_FORWARD_DURATION,
        SHARD_SAMPLING_DURATION,
        SHARD_DEVICE_DURATION,
        SHARD_GRAMMAR_MASK_DURATION,
        SHARD_DRAFT_DURATION,
        GRAMMAR_COMPILE_DURATION,
    ] {
        builder =
            builder.set_buckets_for_metric(Matcher::Full(name.into()), STEP_SECONDS_BUCKETS)?;
    }
    Ok(builder)
}

/// Installs the global recorder, describes and registers the metrics, and keeps
/// histograms trimmed. Must run inside a tokio runtime.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    catalog::describe();
    catalog::register();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The recorder's view of one fresh registry, described and registered as `install` does;
/// for tests that render what a scrape would see.
#[cfg(test)]
pub fn local_recorder() -> metrics_exporter_prometheus::PrometheusRecorder {
    let recorder = builder().unwrap().build_recorder();
    metrics::with_local_recorder(&recorder, || {
        catalog::describe();
        catalog::register();
    });
    recorder
}
