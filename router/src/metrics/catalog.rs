//! What every metric is: its type, unit and help text. `describe` hands this to the
//! recorder, `register` creates every series known in advance (at zero) so that a scrape
//! before any traffic already lists them and `rate()` has a starting point.
use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

use super::meter::{Outcome, Route};
use super::names::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The Prometheus `# TYPE` word.
    pub fn type_name(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

#[derive(Debug)]
pub struct MetricSpec {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    pub help: &'static str,
}

const fn spec(
    name: &'static str,
    kind: Kind,
    unit: Option<Unit>,
    help: &'static str,
) -> MetricSpec {
    MetricSpec {
        name,
        kind,
        unit,
        help,
    }
}

const SECONDS: Option<Unit> = Some(Unit::Seconds);
const COUNT: Option<Unit> = Some(Unit::Count);

pub const CATALOG: &[MetricSpec] = &[
    spec(
        REQUESTS_TOTAL,
        Kind::Counter,
        COUNT,
        "Generation requests by route and outcome",
    ),
    spec(
        TIME_TO_FIRST_TOKEN,
        Kind::Histogram,
        SECONDS,
        "Request arrival to its first generated token",
    ),
    spec(
        INTER_TOKEN_LATENCY,
        Kind::Histogram,
        SECONDS,
        "Time between consecutive generated tokens of a request",
    ),
    spec(
        REQUEST_DURATION,
        Kind::Histogram,
        SECONDS,
        "Request arrival to its last token, for successful requests",
    ),
    spec(
        QUEUE_DURATION,
        Kind::Histogram,
        SECONDS,
        "Submission of a sequence to the first step it takes part in",
    ),
    spec(
        PROMPT_TOKENS_TOTAL,
        Kind::Counter,
        COUNT,
        "Prompt tokens of successful requests",
    ),
    spec(
        GENERATED_TOKENS_TOTAL,
        Kind::Counter,
        COUNT,
        "Tokens generated for successful requests",
    ),
    spec(
        STEP_BATCH_SIZE,
        Kind::Histogram,
        COUNT,
        "Sequences in one step",
    ),
    spec(
        STEP_TOKENS,
        Kind::Histogram,
        COUNT,
        "Tokens in one step (prefill chunks plus decodes)",
    ),
    spec(
        STEP_DURATION,
        Kind::Histogram,
        SECONDS,
        "One step's round trip from the router to every shard and back",
    ),
    spec(
        WAITING_REQUESTS,
        Kind::Gauge,
        COUNT,
        "Sequences waiting to be scheduled (queue depth)",
    ),
    spec(
        RUNNING_REQUESTS,
        Kind::Gauge,
        COUNT,
        "Sequences being generated",
    ),
    spec(
        KV_BLOCKS_USED,
        Kind::Gauge,
        COUNT,
        "KV blocks held by at least one sequence",
    ),
    spec(
        KV_BLOCKS_CAPACITY,
        Kind::Gauge,
        COUNT,
        "KV blocks in the pool",
    ),
    spec(
        PREFIX_CACHE_BLOCKS,
        Kind::Gauge,
        COUNT,
        "KV blocks held only by the prefix cache (evictable)",
    ),
    spec(
        PREEMPTIONS_TOTAL,
        Kind::Counter,
        COUNT,
        "Sequences preempted for lack of KV blocks",
    ),
    spec(
        OUT_OF_MEMORY_STEPS_TOTAL,
        Kind::Counter,
        COUNT,
        "Steps the device ran out of memory on (their sequences were recomputed)",
    ),
    spec(
        PREFILL_TOKEN_CAP,
        Kind::Gauge,
        COUNT,
        "Prompt tokens a step may carry while backing off after an out-of-memory step (0: no cap)",
    ),
    spec(
        PREFILL_PACED_STEPS_TOTAL,
        Kind::Counter,
        COUNT,
        "Steps planned beside running decodes under a prefill pacing cap on their prompt tokens (--prefill-pacing-slack)",
    ),
    spec(
        SPECULATIVE_DRAFT_TOKENS_TOTAL,
        Kind::Counter,
        COUNT,
        "Draft tokens the shards verified (speculative decoding)",
    ),
    spec(
        SPECULATIVE_ACCEPTED_TOKENS_TOTAL,
        Kind::Counter,
        COUNT,
        "Draft tokens kept by verification (speculative decoding)",
    ),
    spec(
        SPECULATIVE_ACCEPTED_LENGTH,
        Kind::Histogram,
        COUNT,
        "Drafts kept per verification that had drafts (speculative decoding)",
    ),
    spec(
        PREFIX_CACHE_QUERIES_TOKENS_TOTAL,
        Kind::Counter,
        COUNT,
        "Prompt tokens looked up in the prefix cache",
    ),
    spec(
        PREFIX_CACHE_HITS_TOKENS_TOTAL,
        Kind::Counter,
        COUNT,
        "Prompt tokens found in the prefix cache (not computed again)",
    ),
    spec(
        PREFIX_CACHE_HITS_GENERATED_TOKENS_TOTAL,
        Kind::Counter,
        COUNT,
        "Prefix cache hit tokens that an earlier request had generated",
    ),
    spec(
        PREFIX_CACHE_EVICTED_BLOCKS_TOTAL,
        Kind::Counter,
        COUNT,
        "KV blocks evicted from the prefix cache",
    ),
    spec(
        SHARD_FORWARD_DURATION,
        Kind::Histogram,
        SECONDS,
        "Shard-side forward pass of one step, by shard rank",
    ),
    spec(
        SHARD_SAMPLING_DURATION,
        Kind::Histogram,
        SECONDS,
        "Shard-side sampling of one step, by shard rank",
    ),
    spec(
        SHARD_DEVICE_DURATION,
        Kind::Histogram,
        SECONDS,
        "Device (GPU) time of one step, by shard rank; its rate is the device's busy share",
    ),
    spec(
        SHARD_GRAMMAR_MASK_DURATION,
        Kind::Histogram,
        SECONDS,
        "Host time computing the grammar masks of one step with constrained sequences, by shard rank",
    ),
    spec(
        SHARD_DRAFT_DURATION,
        Kind::Histogram,
        SECONDS,
        "Host time spent proposing one step's drafts (prompt lookup or a draft model), by shard rank",
    ),
    spec(
        GRAMMAR_COMPILE_DURATION,
        Kind::Histogram,
        SECONDS,
        "Router-side compile and check of one request's grammar, by kind",
    ),
    spec(
        CONSTRAINED_REQUESTS_TOTAL,
        Kind::Counter,
        COUNT,
        "Requests admitted with an output constraint, by kind",
    ),
    spec(
        GRAMMAR_REFUSALS_TOTAL,
        Kind::Counter,
        COUNT,
        "Requests refused for their grammar, by kind and reason",
    ),
    spec(
        BUILD_INFO,
        Kind::Gauge,
        None,
        "Always 1; the labels say which build is running",
    ),
];

/// Counters whose every series carries labels, created with them in `register`.
const LABELLED_COUNTERS: &[&str] = &[
    REQUESTS_TOTAL,
    CONSTRAINED_REQUESTS_TOTAL,
    GRAMMAR_REFUSALS_TOTAL,
];

/// Hands every metric's help text and unit to the installed recorder.
pub fn describe() {
    for metric in CATALOG {
        match (metric.kind, metric.unit) {
            (Kind::Counter, Some(unit)) => describe_counter!(metric.name, unit, metric.help),
            (Kind::Counter, None) => describe_counter!(metric.name, metric.help),
            (Kind::Gauge, Some(unit)) => describe_gauge!(metric.name, unit, metric.help),
            (Kind::Gauge, None) => describe_gauge!(metric.name, metric.help),
            (Kind::Histogram, Some(unit)) => describe_histogram!(metric.name, unit, metric.help),
            (Kind::Histogram, None) => describe_histogram!(metric.name, metric.help),
        }
    }
}

/// The build: the crate version and the git commit it was built from ("unknown" when
/// the build had no git checkout and no `TEXTGEN_GIT_SHA`).
pub struct BuildInfo {
    pub version: &'static str,
    pub git_sha: &'static str,
}

pub const BUILD: BuildInfo = BuildInfo {
    version: env!("CARGO_PKG_VERSION"),
    git_sha: env!("TEXTGEN_GIT_SHA"),
};

/// Creates every series that does not depend on the deployment: label-less metrics and
/// each route × outcome pair, at zero; build info at 1. Per-rank shard series are
/// created when the shards are known.
pub fn register() {
    for metric in CATALOG {
        match metric.kind {
            Kind::Counter if !LABELLED_COUNTERS.contains(&metric.name) => {
                counter!(metric.name).absolute(0);
            }
            Kind::Gauge if metric.name != BUILD_INFO => {
                gauge!(metric.name).increment(0.0);
            }
            Kind::Histogram
                if metric.name != SHARD_FORWARD_DURATION
                    && metric.name != SHARD_SAMPLING_DURATION
                    && metric.name != SHARD_DEVICE_DURATION
                    && metric.name != SHARD_GRAMMAR_MASK_DURATION
                    && metric.name != SHARD_DRAFT_DURATION
                    && metric.name != GRAMMAR_COMPILE_DURATION =>
            {
                let _ = histogram!(metric.name);
            }
            _ => {}
        }
    }
    for route in Route::ALL {
        for outcome in Outcome::ALL {
            counter!(REQUESTS_TOTAL, "route" => route.label(), "outcome" => outcome.label())
                .absolute(0);
        }
    }
    crate::metrics::grammar::register();
    gauge!(BUILD_INFO, "version" => BUILD.version, "git_sha" => BUILD.git_sha).set(1.0);
}
