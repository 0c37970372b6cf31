//! The per-request meter the HTTP side uses: which route, how the request ended, and its
//! token timings.
use std::time::Instant;

use metrics::{counter, histogram};

use crate::telemetry::request_span::RequestTrace;

use super::names::{
    GENERATED_TOKENS_TOTAL, INTER_TOKEN_LATENCY, PROMPT_TOKENS_TOTAL, REQUESTS_TOTAL,
    REQUEST_DURATION, TIME_TO_FIRST_TOKEN,
};

/// The `route` label: the generating API a request used. SSE variants are told apart
/// because their latency profile differs. `/invocations` counts under the API its body
/// belongs to; `Invocations` is only for bodies that belong to none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Generate,
    GenerateStream,
    /// `POST /` without `stream`.
    Compat,
    CompatStream,
    ChatCompletions,
    ChatCompletionsStream,
    Completions,
    CompletionsStream,
    Invocations,
}

impl Route {
    pub const ALL: [Route; 9] = [
        Route::Generate,
        Route::GenerateStream,
        Route::Compat,
        Route::CompatStream,
        Route::ChatCompletions,
        Route::ChatCompletionsStream,
        Route::Completions,
        Route::CompletionsStream,
        Route::Invocations,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Generate => "generate",
            Self::GenerateStream => "generate_stream",
            Self::Compat => "compat",
            Self::CompatStream => "compat_stream",
            Self::ChatCompletions => "chat_completions",
            Self::ChatCompletionsStream => "chat_completions_stream",
            Self::Completions => "completions",
            Self::CompletionsStream => "completions_stream",
            Self::Invocations => "invocations",
        }
    }

    /// The chat or completions route, streaming or not.
    pub fn openai(chat: bool, stream: bool) -> Self {
        match (chat, stream) {
            (true, false) => Self::ChatCompletions,
            (true, true) => Self::ChatCompletionsStream,
            (false, false) => Self::Completions,
            (false, true) => Self::CompletionsStream,
        }
    }
}

/// How a request ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Rejected as invalid (bad body, parameters, prompt too long, template error).
    Validation,
    /// Turned away: too many requests in flight.
    Overloaded,
    /// Generation failed (a shard error, the scheduler stopped).
    Generation,
    /// The sequence ended without its last token.
    Incomplete,
    /// The client went away before the end.
    Cancelled,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Success,
        Outcome::Validation,
        Outcome::Overloaded,
        Outcome::Generation,
        Outcome::Incomplete,
        Outcome::Cancelled,
    ];

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

/// Counts one request of `route` that ended with `outcome`.
pub fn count_request(route: Route, outcome: Outcome) {
    counter!(REQUESTS_TOTAL, "route" => route.label(), "outcome" => outcome.label()).increment(1);
}

/// Follows one HTTP request: token timings while it runs, its outcome once. Dropped
/// without `finish` (client disconnect), it counts as cancelled. It also carries the
/// request's trace span, which sees the same events.
#[derive(Debug)]
pub struct RequestMeter {
    route: Route,
    arrived: Instant,
    last_token: Option<Instant>,
    finished: bool,
    trace: RequestTrace,
}

impl RequestMeter {
    pub fn start(route: Route) -> Self {
        Self {
            route,
            arrived: Instant::now(),
            last_token: None,
            finished: false,
            trace: RequestTrace::start(route.label()),
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
        if self.finished {
            return;
        }
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
        count_request(self.route, outcome);
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
    use crate::metrics::builder;

    #[test]
    fn meter_records_outcomes_and_timings() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut ok = RequestMeter::start(Route::Generate);
            ok.on_token();
            ok.on_token();
            ok.succeed(7, 2);
            drop(RequestMeter::start(Route::GenerateStream));
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
        assert!(text.contains("textgen_request_duration_seconds_count 1"));
    }

    #[test]
    fn finishing_twice_counts_once_and_success_after_failure_counts_nothing() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut meter = RequestMeter::start(Route::Generate);
            meter.finish(Outcome::Validation);
            meter.finish(Outcome::Generation);
            meter.succeed(3, 3);
        });
        let text = handle.render();
        assert!(text.contains(r#"outcome="validation"} 1"#));
        assert!(!text.contains(r#"outcome="generation""#));
        assert!(!text.contains(r#"outcome="success""#));
        assert!(!text.contains(r#"outcome="cancelled""#));
        assert!(!text.contains("textgen_prompt_tokens_total"), "{text}");
    }

    #[test]
    fn openai_routes_tell_streaming_apart() {
        assert_eq!(Route::openai(true, false).label(), "chat_completions");
        assert_eq!(Route::openai(true, true).label(), "chat_completions_stream");
        assert_eq!(Route::openai(false, false).label(), "completions");
        assert_eq!(Route::openai(false, true).label(), "completions_stream");
    }
}
