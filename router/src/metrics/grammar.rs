//! Grammar metrics recorded by the router: compile time, admitted constrained requests and
//! refusals, each by the kind of constraint.
use std::time::Duration;

use metrics::{counter, histogram};

use super::names::{CONSTRAINED_REQUESTS_TOTAL, GRAMMAR_COMPILE_DURATION, GRAMMAR_REFUSALS_TOTAL};
use crate::grammar::GrammarError;

/// Every `kind` label (GrammarRequest::kind).
const KINDS: &[&str] = &["json_object", "json_schema", "regex", "choice", "grammar"];

fn reason(error: &GrammarError) -> &'static str {
    match error {
        GrammarError::Disabled => "disabled",
        GrammarError::TooLarge { .. } => "too_large",
        GrammarError::Invalid { .. } => "invalid",
        GrammarError::Timeout { .. } => "timeout",
    }
}

const REASONS: &[&str] = &["disabled", "too_large", "invalid", "timeout"];

/// One compile's time and outcome (`error` None: the request was admitted with it).
pub fn record_grammar_compile(kind: &'static str, took: Duration, error: Option<&GrammarError>) {
    histogram!(GRAMMAR_COMPILE_DURATION, "kind" => kind).record(took);
    match error {
        None => counter!(CONSTRAINED_REQUESTS_TOTAL, "kind" => kind).increment(1),
        Some(error) => record_refusal(kind, error),
    }
}

pub fn record_refusal(kind: &'static str, error: &GrammarError) {
    counter!(GRAMMAR_REFUSALS_TOTAL, "kind" => kind, "reason" => reason(error)).increment(1);
}

/// Creates every kind (× reason) series (counters at zero), so `rate()` has a starting point.
pub(super) fn register() {
    for &kind in KINDS {
        let _ = histogram!(GRAMMAR_COMPILE_DURATION, "kind" => kind);
        counter!(CONSTRAINED_REQUESTS_TOTAL, "kind" => kind).absolute(0);
        for &reason in REASONS {
            counter!(GRAMMAR_REFUSALS_TOTAL, "kind" => kind, "reason" => reason).absolute(0);
        }
    }
}
