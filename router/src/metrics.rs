//! Prometheus metrics: the recorder (with histogram buckets for every `textgen_*`
//! histogram, the scheduler's included) and the per-request meter the HTTP side uses.
use std::time::{Duration, Instant};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, histogram, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::telemetry::request_span::RequestTrace;

pub const REQUESTS_TOTAL: &str = "textgen_requests_total";
pub const TIME_TO_FIRST_TOKEN: &str = "textgen_time_to_first_token_seconds";
pub const INTER_TOKEN_LATENCY: &str = "textgen_inter_token_latency_seconds";
pub const REQUEST_DURATION: &str = "textgen_request_duration_seconds";
pub const PROMPT_TOKENS_TOTAL: &str = "textgen_prompt_tokens_total";
pub const GENERATED_TOKENS_TOTAL: &str = "textgen_generated_tokens_total";

/// Latency buckets from 1 ms to 2 minutes, roughly ×2 apart (TTFT, ITL, end-to-end, queue).
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0,
    15.0, 30.0, 60.0, 120.0,
];
/// Sequences per step.
const BATCH_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// Tokens per step (prefill chunks plus decodes).
const STEP_TOKENS_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
];

/// A recorder builder with every textgen histogram's buckets registered.
pub fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full("textgen_batch_size".into()),
            BATCH_SIZE_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("textgen_step_tokens".into()),
            STEP_TOKENS_BUCKETS,
        )
}

/// Installs the global recorder, describes the metrics and keeps histograms trimmed.
/// Must run inside a tokio runtime.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe();
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

fn describe() {
    describe_counter!(REQUESTS_TOTAL, "Requests by route and outcome");
    describe_histogram!(
        TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Arrival to first generated token"
    );
    describe_histogram!(
        INTER_TOKEN_LATENCY,
        Unit::Seconds,
        "Time between consecutive tokens"
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Arrival to last token (end to end)"
    );
    describe_counter!(PROMPT_TOKENS_TOTAL, "Prompt tokens of finished requests");
    describe_counter!(
        GENERATED_TOKENS_TOTAL,
        "Tokens generated for finished requests"
    );
    describe_gauge!(
        "textgen_waiting_requests",
        "Sequences waiting to be scheduled"
    );
    describe_gauge!("textgen_running_requests", "Sequences being generated");
    describe_gauge!("textgen_kv_blocks_used", "KV blocks in use");
    describe_gauge!("textgen_kv_blocks_total", "KV blocks in the pool");
    describe_counter!(
        "textgen_preemptions_total",
        "Sequences preempted for lack of KV blocks"
    );
    describe_histogram!(
        "textgen_queue_duration_seconds",
        Unit::Seconds,
        "Submission to first step"
    );
    describe_histogram!("textgen_batch_size", "Sequences per step");
    describe_histogram!("textgen_step_tokens", "Tokens per step");
}

/// How a request ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Validation,
    Overloaded,
    Generation,
    Incomplete,
    /// The client went away before the end.
    Cancelled,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Validation => "validation",
            Self::Overloaded => "overloaded",
            Self::Generation => "generation",
            Self::Incomplete => "incomplete",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Follows one request: token timings while it runs, its outcome once. Dropped without
/// `finish` (client disconnect), it counts as cancelled. It also carries the request's
/// trace span, which sees the same events.
#[derive(Debug)]
pub struct RequestMeter {
    route: &'static str,
    arrived: Instant,
    last_token: Option<Instant>,
    finished: bool,
    trace: RequestTrace,
}

impl RequestMeter {
    pub fn start(route: &'static str) -> Self {
        Self {
            route,
            arrived: Instant::now(),
            last_token: None,
            finished: false,
            trace: RequestTrace::start(route),
        }
    }

    pub fn trace(&mut self) -> &mut RequestTrace {
        &mut self.trace
    }

    pub fn arrived(&self) -> Instant {
        self.arrived
    }

    pub fn on_token(&mut self) {
        let now = Instant::now();
        match self.last_token {
            None => histogram!(TIME_TO_FIRST_TOKEN).record(now - self.arrived),
            Some(previous) => histogram!(INTER_TOKEN_LATENCY).record(now - previous),
        }
        self.last_token = Some(now);
        self.trace.on_chunk();
    }

    pub fn succeed(&mut self, prompt_tokens: u32, generated_tokens: u32) {
        counter!(PROMPT_TOKENS_TOTAL).increment(u64::from(prompt_tokens));
        counter!(GENERATED_TOKENS_TOTAL).increment(u64::from(generated_tokens));
        histogram!(REQUEST_DURATION).record(self.arrived.elapsed());
        self.trace.succeed(prompt_tokens, generated_tokens);
        self.finish(Outcome::Success);
    }

    pub fn finish(&mut self, outcome: Outcome) {
        if self.finished {
            return;
        }
        self.finished = true;
        if outcome != Outcome::Success {
            self.trace.fail(outcome.label());
        }
        counter!(REQUESTS_TOTAL, "route" => self.route, "outcome" => outcome.label()).increment(1);
    }
}

impl Drop for RequestMeter {
    fn drop(&mut self) {
        self.finish(Outcome::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meter_records_outcomes_and_buckets() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut ok = RequestMeter::start("generate");
            ok.on_token();
            ok.on_token();
            ok.succeed(7, 2);
            drop(RequestMeter::start("generate_stream"));
            histogram!("textgen_batch_size").record(3.0);
        });
        let text = handle.render();
        assert!(
            text.contains(r#"textgen_requests_total{route="generate",outcome="success"} 1"#),
            "{text}"
        );
        assert!(text
            .contains(r#"textgen_requests_total{route="generate_stream",outcome="cancelled"} 1"#));
        assert!(text.contains("textgen_prompt_tokens_total 7"));
        assert!(text.contains("textgen_generated_tokens_total 2"));
        assert!(
            text.contains(r#"textgen_time_to_first_token_seconds_bucket{le="0.001"}"#),
            "{text}"
        );
        assert!(text.contains("textgen_inter_token_latency_seconds_count 1"));
        assert!(
            text.contains(r#"textgen_batch_size_bucket{le="4"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn finishing_twice_counts_once() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut meter = RequestMeter::start("generate");
            meter.finish(Outcome::Validation);
            meter.finish(Outcome::Generation);
        });
        let text = handle.render();
        assert!(text.contains(r#"outcome="validation"} 1"#));
        assert!(!text.contains(r#"outcome="generation""#));
        assert!(!text.contains(r#"outcome="cancelled""#));
    }
}
