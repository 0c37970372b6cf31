//! JSON shapes of TGI's native API (`/generate`, `/generate_stream`, `/`, `/tokenize`).
//! Field names and defaults follow TGI so existing clients work unchanged.
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

/// Body of `/generate`, `/generate_stream` and `/tokenize`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    /// The prompt; not empty, and at most `--max-input-tokens` tokens (after `truncate`).
    #[schema(min_length = 1)]
    pub inputs: String,
    /// TGI asymmetry: an omitted `parameters` object means `do_sample: true`.
    #[serde(
        default = "GenerateParameters::when_omitted",
        deserialize_with = "json_object"
    )]
    pub parameters: GenerateParameters,
}

/// Body of the compatibility route `POST /`: `stream` picks SSE or a one-element array.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompatGenerateRequest {
    /// The prompt; not empty, and at most `--max-input-tokens` tokens (after `truncate`).
    #[schema(min_length = 1)]
    pub inputs: String,
    #[serde(
        default = "GenerateParameters::when_omitted",
        deserialize_with = "json_object"
    )]
    pub parameters: GenerateParameters,
    #[serde(default)]
    pub stream: bool,
}

impl From<CompatGenerateRequest> for GenerateRequest {
    fn from(request: CompatGenerateRequest) -> Self {
        Self {
            inputs: request.inputs,
            parameters: request.parameters,
        }
    }
}

/// TGI's `parameters`. Unknown fields are rejected (422) instead of ignored; the one field
/// TGI has but textgen does not implement (`adapter_id`) is accepted only at its neutral
/// value and rejected by validation otherwise.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateParameters {
    /// 1 to `--max-best-of`; above 1 it needs sampling, no `seed`, and no streaming.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2)]
    pub best_of: Option<usize>,
    /// Strictly positive and finite in f32.
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 3.4028234663852886e38)]
    pub temperature: Option<f32>,
    /// Strictly positive and finite in f32; 1 is no penalty.
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 3.4028234663852886e38)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    #[schema(minimum = -2, maximum = 2)]
    pub frequency_penalty: Option<f32>,
    /// Strictly positive.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub top_k: Option<i32>,
    /// Strictly between 0 and 1.
    #[serde(default)]
    #[schema(exclusive_minimum = 0, exclusive_maximum = 1)]
    pub top_p: Option<f32>,
    /// Strictly between 0 and 1.
    #[serde(default)]
    #[schema(exclusive_minimum = 0, exclusive_maximum = 1)]
    pub typical_p: Option<f32>,
    #[serde(default)]
    pub do_sample: bool,
    /// At least 1; the prompt's tokens plus `max_new_tokens` must be at most
    /// `--max-total-tokens` (so at most `--max-total-tokens` - 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2047)]
    pub max_new_tokens: Option<u32>,
    #[serde(default)]
    pub return_full_text: Option<bool>,
    /// At most `--max-stop-sequences`, each 1 to 1024 characters.
    #[serde(default)]
    #[schema(max_items = 4)]
    pub stop: Vec<String>,
    /// Keep the prompt's last `truncate` tokens: 1 to `--max-input-tokens`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1024)]
    pub truncate: Option<usize>,
    /// Green-list watermark (Kirchenbauer et al.), with `--watermark-gamma` and
    /// `--watermark-delta`; the shard applies it (`shard_server/watermark.py`).
    #[serde(default)]
    pub watermark: bool,
    #[serde(default)]
    pub details: bool,
    /// Not with streaming.
    #[serde(default)]
    pub decoder_input_details: bool,
    #[serde(default)]
    pub seed: Option<u64>,
    /// 0 to `--max-top-n-tokens`.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 5)]
    pub top_n_tokens: Option<u32>,
    /// `{"type": "json" | "json_object" | "json_schema" | "regex", "value": ...}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub grammar: Option<serde_json::Value>,
    /// Accepted only empty: textgen serves no adapters.
    #[serde(default)]
    #[schema(max_length = 0)]
    pub adapter_id: Option<String>,
}

impl GenerateParameters {
    fn when_omitted() -> Self {
        Self {
            do_sample: true,
            ..Self::default()
        }
    }
}

/// Decided by `crate::finish`, the one place that says why a sequence ended.
pub use crate::finish::FinishReason;

/// A generated token as TGI reports it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub special: bool,
}

/// A prompt token; the first one has no logprob (`null`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PrefillToken {
    pub id: u32,
    pub text: String,
    pub logprob: Option<f32>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BestOfSequence {
    pub generated_text: String,
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub prefill: Vec<PrefillToken>,
    pub tokens: Vec<Token>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Details {
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub prefill: Vec<PrefillToken>,
    pub tokens: Vec<Token>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_of_sequences: Option<Vec<BestOfSequence>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GenerateResponse {
    pub generated_text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StreamDetails {
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub input_length: u32,
}

/// One SSE event of `/generate_stream`; `generated_text` and `details` only on the last.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StreamResponse {
    pub index: u32,
    pub token: Token,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Token>,
    pub generated_text: Option<String>,
    pub details: Option<StreamDetails>,
}

/// One entry of `/tokenize`; `start`/`stop` are character offsets into `inputs`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SimpleToken {
    pub id: u32,
    pub text: String,
    pub start: usize,
    pub stop: usize,
}

/// `/chat_tokenize`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatTokenizeResponse {
    pub tokenize_response: Vec<SimpleToken>,
    pub templated_text: String,
}

/// TGI's error body, used by every native route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    pub error_type: String,
}

/// Deserializes `T` only from a JSON object. serde's derive would also build a struct from
/// an array of its fields in order (`"parameters": [1]`), which no client means.
pub fn json_object<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let object = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
    T::deserialize(serde_json::Value::Object(object)).map_err(serde::de::Error::custom)
}
