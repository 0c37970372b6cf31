//! JSON shapes of TGI's native API (`/generate`, `/generate_stream`, `/`, `/tokenize`).
//! Field names and defaults follow TGI so existing clients work unchanged.
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

/// Body of `/generate`, `/generate_stream` and `/tokenize`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
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

/// TGI's `parameters`. Unknown fields are rejected (422) instead of ignored; fields TGI has
/// but textgen does not implement (`grammar`, `adapter_id`, `watermark`) are accepted only
/// at their neutral value and rejected by validation otherwise.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateParameters {
    #[serde(default)]
    pub best_of: Option<usize>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub typical_p: Option<f32>,
    #[serde(default)]
    pub do_sample: bool,
    #[serde(default)]
    pub max_new_tokens: Option<u32>,
    #[serde(default)]
    pub return_full_text: Option<bool>,
    #[serde(default)]
    pub stop: Vec<String>,
    #[serde(default)]
    pub truncate: Option<usize>,
    #[serde(default)]
    pub watermark: bool,
    #[serde(default)]
    pub details: bool,
    #[serde(default)]
    pub decoder_input_details: bool,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub top_n_tokens: Option<u32>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub grammar: Option<serde_json::Value>,
    #[serde(default)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Length,
    EosToken,
    StopSequence,
}

impl FinishReason {
    /// The name TGI's API uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::EosToken => "eos_token",
            Self::StopSequence => "stop_sequence",
        }
    }
}

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
