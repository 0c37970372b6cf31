//! Compiling and checking a [`GrammarRequest`] with llguidance before admission. The shard
//! gets the result as llguidance's TopLevelGrammar JSON and compiles it again to mask; the
//! router's compile is the gate, so a grammar that fails here never reaches a shard.
use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use super::GrammarRequest;
use crate::pb;

/// The JSON compile options every schema gets: fixed separators, so whitespace cannot
/// run away (the one place they are defined).
const JSON_OPTIONS: &str = include_str!("json_options.json");
/// Longest llguidance error kept in a response.
const MAX_ERROR_CHARS: usize = 400;

/// `--max-grammar-bytes` and `--grammar-compile-timeout-ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrammarLimits {
    pub max_bytes: usize,
    pub compile_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    #[error("grammar support is disabled on this server (--disable-grammar-support)")]
    Disabled,
    #[error("the {kind} is {size} bytes, more than the {max} bytes allowed (--max-grammar-bytes)")]
    TooLarge {
        kind: &'static str,
        size: usize,
        max: usize,
    },
    #[error("invalid {kind}: {message}")]
    Invalid { kind: &'static str, message: String },
    #[error("the {kind} did not compile within {ms} ms (--grammar-compile-timeout-ms)")]
    Timeout { kind: &'static str, ms: u128 },
}

impl GrammarRequest {
    /// Names the kind in messages and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonObject => "json_object",
            Self::JsonSchema(_) => "json_schema",
            Self::Regex(_) => "regex",
            Self::Choice(_) => "choice",
            Self::Lark(_) => "grammar",
        }
    }

    /// What the request sent, in bytes, for the size bound.
    fn size(&self) -> usize {
        match self {
            Self::JsonObject => 0,
            Self::JsonSchema(schema) => serde_json::to_string(schema).map_or(0, |s| s.len()),
            Self::Regex(regex) => regex.len(),
            Self::Choice(items) => items.iter().map(String::len).sum(),
            Self::Lark(lark) => lark.len(),
        }
    }

    /// llguidance's own form of the request.
    pub fn to_llguidance(&self) -> TopLevelGrammar {
        match self {
            Self::JsonObject => TopLevelGrammar::from_json_schema(with_json_options(
                serde_json::json!({"type": "object"}),
            )),
            Self::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_json_options(schema.clone()))
            }
            Self::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Self::Choice(items) => TopLevelGrammar::from_lark(choice_lark(items)),
            Self::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// The schema with textgen's compile options in `x-guidance` (replacing any the client
/// sent: they could make whitespace unbounded). `true` is the empty schema.
fn with_json_options(schema: Value) -> Value {
    let options: Value = serde_json::from_str(JSON_OPTIONS).expect("json_options.json is JSON");
    match schema {
        Value::Object(mut map) => {
            map.insert("x-guidance".into(), options);
            Value::Object(map)
        }
        Value::Bool(true) => serde_json::json!({ "x-guidance": options }),
        other => other, // `false` and non-schemas fail to compile, as they should
    }
}

/// One alternative per item; JSON string escapes are Lark string escapes.
fn choice_lark(items: &[String]) -> String {
    let literals: Vec<String> = items
        .iter()
        .map(|item| serde_json::to_string(item).expect("a string serializes"))
        .collect();
    format!("start: {}\n", literals.join(" | "))
}

/// llguidance's message without its internal state dump (`<state>…`, the parser's tokens,
/// timings and grammar: nothing a client can act on), and "no extension" errors said plainly.
fn client_message(message: &str) -> String {
    let head = message.split("<state>").next().unwrap_or_default().trim();
    // The first mask found no token that continues the output: the grammar allows nothing.
    if head.is_empty() || head.contains("NoExtension") {
        return NO_OUTPUT.to_owned();
    }
    shorten(head.to_owned())
}

const NO_OUTPUT: &str = "it matches no output";

fn shorten(message: String) -> String {
    match message.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message,
    }
}

/// Takes one token the first mask allows and masks again. llguidance builds a regex's lexer
/// states as tokens arrive, so a grammar whose lexer runs out of fuel at its first step (a
/// regex bomb such as `(a{1000}){1000}`) is refused here, at admission, and never at the
/// first token it generates. llguidance's per-step fuel bounds the work.
fn probe_one_token(
    matcher: &mut Matcher,
    mask: &llguidance::toktrie::SimpleVob,
) -> Result<(), String> {
    let Some(token) = mask.first_bit_set() else {
        return Ok(());
    };
    let stepped = matcher.consume_token(token as u32).and_then(|()| {
        if matcher.is_stopped() {
            Ok(())
        } else {
            matcher.compute_mask().map(|_| ())
        }
    });
    match (stepped, matcher.get_error()) {
        (_, Some(error)) => Err(error),
        (Err(error), None) => Err(error.to_string()),
        (Ok(()), None) => Ok(()),
    }
}

/// Compiles grammars against the served model's vocabulary; shared by every request.
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    stop_token_ids: Vec<u32>,
    limits: GrammarLimits,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("stop_token_ids", &self.stop_token_ids)
            .field("limits", &self.limits)
            .finish()
    }
}

impl GrammarCompiler {
    pub fn new(
        env: llguidance::toktrie::TokEnv,
        stop_token_ids: Vec<u32>,
        limits: GrammarLimits,
    ) -> anyhow::Result<Self> {
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            stop_token_ids,
            limits,
        })
    }

    pub fn limits(&self) -> GrammarLimits {
        self.limits
    }

    /// Compiles and checks on the calling thread (blocking: up to the compile bound).
    /// The first mask is computed too, so a grammar that allows nothing is refused here, and
    /// one step past it (`probe_one_token`).
    pub fn compile_blocking(&self, request: &GrammarRequest) -> Result<pb::Grammar, GrammarError> {
        let kind = request.kind();
        let size = request.size();
        if size > self.limits.max_bytes {
            return Err(GrammarError::TooLarge {
                kind,
                size,
                max: self.limits.max_bytes,
            });
        }
        let grammar = request.to_llguidance();
        let llguidance = serde_json::to_string(&grammar).map_err(|err| GrammarError::Invalid {
            kind,
            message: err.to_string(),
        })?;
        let invalid = |message: String| GrammarError::Invalid {
            kind,
            message: client_message(&message),
        };
        let mut matcher = Matcher::new(self.factory.create_parser(grammar));
        let mask = matcher
            .compute_mask()
            .map_err(|err| invalid(err.to_string()))?;
        if let Some(error) = matcher.get_error() {
            return Err(invalid(error));
        }
        if mask.is_zero() {
            return Err(invalid(NO_OUTPUT.into()));
        }
        probe_one_token(&mut matcher, &mask).map_err(invalid)?;
        Ok(pb::Grammar {
            llguidance,
            stop_token_ids: self.stop_token_ids.clone(),
        })
    }

    /// Compiles on a blocking thread within `--grammar-compile-timeout-ms`. Past the bound
    /// the request is refused at once; llguidance's own fuel limits end the work itself.
    pub async fn compile(
        self: &Arc<Self>,
        request: GrammarRequest,
    ) -> Result<pb::Grammar, GrammarError> {
        let kind = request.kind();
        let started = Instant::now();
        let compiler = self.clone();
        let work = tokio::task::spawn_blocking(move || compiler.compile_blocking(&request));
        let outcome = match tokio::time::timeout(self.limits.compile_timeout, work).await {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => Err(GrammarError::Invalid {
                kind,
                message: format!("the compiler failed: {panic}"),
            }),
            Err(_) => Err(GrammarError::Timeout {
                kind,
                ms: self.limits.compile_timeout.as_millis(),
            }),
        };
        crate::metrics::record_grammar_compile(kind, started.elapsed(), outcome.as_ref().err());
        outcome
    }
}

#[cfg(test)]
#[path = "compile_tests.rs"]
mod tests;
