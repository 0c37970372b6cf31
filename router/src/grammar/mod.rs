//! Constrained decoding, router side: what a request asks its output to match
//! ([`GrammarRequest`], from TGI's `grammar`, OpenAI's `response_format`, vLLM's
//! `structured_outputs`/`guided_*` and tool definitions), compiled and checked with
//! llguidance before admission, so a bad grammar never reaches a shard. The shard gets
//! the compiled grammar's llguidance JSON and computes the token masks.

mod compile;
mod tgi;
mod token_env;

pub use compile::{GrammarCompiler, GrammarError, GrammarLimits};
pub use tgi::from_tgi;
pub use token_env::token_env;

/// What a request asks its output to match, before compilation.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarRequest {
    /// Any JSON object (OpenAI's `{"type": "json_object"}`).
    JsonObject,
    /// A JSON Schema (TGI's `json`, OpenAI's `json_schema`, vLLM's `json`).
    JsonSchema(serde_json::Value),
    /// A regular expression the whole output must match.
    Regex(String),
    /// Exactly one of these strings (vLLM's `choice`).
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect (vLLM's `grammar`, tool calls).
    Lark(String),
}
