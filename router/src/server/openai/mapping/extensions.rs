//! vLLM's sampling extensions (sent through the OpenAI SDK's `extra_body`): each field's
//! range rule, checked in f32 as the shard computes, and its meaning where an existing
//! parameter carries it. A field that would change the answer but has no support in the
//! stack is refused by name unless it holds its neutral value; `null` is always unset.
use serde_json::Value;

use super::super::errors::OpenAiError;
use super::super::types::ExtensionFields;

/// What the extensions mean in TGI's terms; `None` where the request left them unset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extensions {
    /// `Some(0)`: top-k explicitly off (-1 or 0), which beats a model default.
    pub top_k: Option<u32>,
    pub repetition_penalty: Option<f32>,
    /// In (0, 1]; `None` when unset or 0.
    pub min_p: Option<f32>,
    /// Keep the last N prompt tokens (TGI's `truncate`).
    pub truncate: Option<usize>,
    pub watermark: bool,
    /// Stop tokens cannot be drawn before this many tokens (`min_tokens`; `ignore_eos`:
    /// never, `u32::MAX`). 0: no floor.
    pub min_new_tokens: u32,
    /// The request's own stop tokens (validation checks them against the vocabulary).
    pub stop_token_ids: Vec<u32>,
    /// `skip_special_tokens: false`.
    pub keep_special_tokens: bool,
    pub include_stop_str_in_output: bool,
}

/// vLLM's structured fields that the stack does not implement: accepted only empty (`null`,
/// `[]`, `{}`; `thinking_token_budget` also -1, vLLM's "unlimited"), refused by name
/// otherwise. The OpenAPI document states exactly that (server/docs.rs).
pub const EMPTY_ONLY_FIELDS: [&str; 6] = [
    "logits_processors",
    "vllm_xargs",
    "kv_transfer_params",
    "logprob_token_ids",
    "repetition_detection",
    "thinking_token_budget",
];

/// Unset, `null`, `[]` and `{}` all mean "nothing asked for".
fn holds_something(value: &Option<Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Array(items)) => !items.is_empty(),
        Some(Value::Object(map)) => !map.is_empty(),
        Some(_) => true,
    }
}

fn refuse(name: &str, why: &str) -> OpenAiError {
    OpenAiError::unsupported(name, why)
}

fn check_top_k(top_k: Option<i64>) -> Result<Option<u32>, OpenAiError> {
    match top_k {
        None => Ok(None),
        Some(-1 | 0) => Ok(Some(0)),
        Some(k) if k >= 1 && k <= i64::from(i32::MAX) => Ok(Some(k as u32)),
        Some(k) => Err(OpenAiError::invalid(
            "top_k",
            format!(
                "`top_k` must be -1 or 0 (disabled) or >= 1 and <= {}. Given: {k}",
                i32::MAX
            ),
        )),
    }
}

fn check_repetition_penalty(value: Option<f32>) -> Result<Option<f32>, OpenAiError> {
    match value {
        Some(r) if !(r > 0.0 && r.is_finite()) => Err(OpenAiError::invalid(
            "repetition_penalty",
            "`repetition_penalty` must be > 0 and finite (1 is no penalty)",
        )),
        other => Ok(other),
    }
}

fn check_min_p(value: Option<f32>) -> Result<Option<f32>, OpenAiError> {
    match value {
        // f32, as the shard computes: 1e39 is infinite there, NaN fails the range too.
        Some(p) if !(0.0..=1.0).contains(&p) => Err(OpenAiError::invalid(
            "min_p",
            format!("`min_p` must be >= 0 and <= 1. Given: {p}"),
        )),
        other => Ok(other.filter(|&p| p > 0.0)),
    }
}

fn check_truncate(value: Option<i64>, side: Option<&str>) -> Result<Option<usize>, OpenAiError> {
    match side {
        None | Some("left") => {}
        Some("right") => {
            return Err(refuse(
                "truncation_side",
                "only `left` (keep the last tokens) is implemented",
            ))
        }
        Some(other) => {
            return Err(OpenAiError::invalid(
                "truncation_side",
                format!("`truncation_side` must be `left` or `right`. Given: {other:?}"),
            ))
        }
    }
    match value {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(-1) => Err(refuse(
            "truncate_prompt_tokens",
            "-1 (truncate to the model's length) is not implemented; send a token count",
        )),
        Some(n) => Err(OpenAiError::invalid(
            "truncate_prompt_tokens",
            format!("`truncate_prompt_tokens` must be >= 1 (or -1). Given: {n}"),
        )),
    }
}

/// Fields whose neutral value is "off" and that nothing in the stack implements yet.
fn refuse_unimplemented(f: &ExtensionFields) -> Result<(), OpenAiError> {
    if f.use_beam_search == Some(true) {
        return Err(refuse("use_beam_search", "beam search is not implemented"));
    }
    if f.length_penalty.is_some_and(|p| !p.is_finite()) {
        return Err(OpenAiError::invalid(
            "length_penalty",
            "`length_penalty` must be finite",
        ));
    }
    if let Some(n) = f.prompt_logprobs {
        if n < -1 {
            return Err(OpenAiError::invalid(
                "prompt_logprobs",
                "`prompt_logprobs` must be >= 0 or -1",
            ));
        }
        return Err(refuse(
            "prompt_logprobs",
            "use `/v1/completions` with `echo` and `logprobs`",
        ));
    }
    if f.priority.is_some_and(|p| p != 0) {
        return Err(refuse(
            "priority",
            "the scheduler has no request priorities",
        ));
    }
    let flags = [
        ("return_tokens_as_token_ids", f.return_tokens_as_token_ids),
        ("return_token_ids", f.return_token_ids),
    ];
    if let Some((name, _)) = flags.iter().find(|(_, v)| *v == Some(true)) {
        return Err(refuse(name, "not implemented"));
    }
    if f.bad_words.as_ref().is_some_and(|w| !w.is_empty()) {
        return Err(refuse("bad_words", "not implemented"));
    }
    if f.allowed_token_ids.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(refuse(
            "allowed_token_ids",
            "not implemented; use `logit_bias`",
        ));
    }
    if f.cache_salt.is_some() {
        return Err(refuse(
            "cache_salt",
            "the prefix cache has no per-tenant salt",
        ));
    }
    // -1 is vLLM's "unlimited", the same as unset.
    let unlimited = f
        .thinking_token_budget
        .as_ref()
        .is_some_and(|v| v.as_i64() == Some(-1));
    // In EMPTY_ONLY_FIELDS' order: the names live there once.
    let values = [
        &f.logits_processors,
        &f.vllm_xargs,
        &f.kv_transfer_params,
        &f.logprob_token_ids,
        &f.repetition_detection,
        &f.thinking_token_budget,
    ];
    match EMPTY_ONLY_FIELDS
        .into_iter()
        .zip(values)
        .filter(|(name, _)| !(*name == "thinking_token_budget" && unlimited))
        .find(|(_, value)| holds_something(value))
    {
        Some((name, _)) => Err(refuse(name, "not implemented")),
        None => Ok(()),
    }
}

/// Checks every extension.
pub fn check(fields: &ExtensionFields) -> Result<Extensions, OpenAiError> {
    refuse_unimplemented(fields)?;
    Ok(Extensions {
        top_k: check_top_k(fields.top_k)?,
        repetition_penalty: check_repetition_penalty(fields.repetition_penalty)?,
        min_p: check_min_p(fields.min_p)?,
        truncate: check_truncate(
            fields.truncate_prompt_tokens,
            fields.truncation_side.as_deref(),
        )?,
        watermark: fields.watermarking.unwrap_or(false),
        min_new_tokens: if fields.ignore_eos == Some(true) {
            u32::MAX
        } else {
            fields.min_tokens.unwrap_or(0)
        },
        stop_token_ids: fields.stop_token_ids.clone().unwrap_or_default(),
        keep_special_tokens: fields.skip_special_tokens == Some(false),
        include_stop_str_in_output: fields.include_stop_str_in_output == Some(true),
    })
}
