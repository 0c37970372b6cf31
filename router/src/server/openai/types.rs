//! JSON shapes of the OpenAI-compatible routes, as OpenAI documents them. The handlers and
//! the OpenAPI document share these types.
//!
//! Unknown-field policy (the same as the native routes): a field that is not part of the
//! route's OpenAI request schema, nor one of the extensions TGI's and vLLM's clients send,
//! is rejected with 400. Every known field is implemented, accepted without effect where
//! it cannot change the answer (`user`, `store`, `metadata`, `request_id`, ...), or refused
//! by name unless it carries its neutral value; `null` always means unset. docs/openai.md
//! lists them all.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// An optional field whose type error names the field (serde's own message does not).
fn named<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    name: &str,
    value: D,
) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(value)
        .map_err(|err| serde::de::Error::custom(format!("`{name}`: {err}")))
}

fn min_p_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f32>, D::Error> {
    named("min_p", d)
}

fn stop_token_ids_field<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<u32>>, D::Error> {
    named("stop_token_ids", d)
}

fn skip_special_tokens_field<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<bool>, D::Error> {
    named("skip_special_tokens", d)
}

fn include_stop_str_field<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<bool>, D::Error> {
    named("include_stop_str_in_output", d)
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(stop) => vec![stop],
            Self::Many(stops) => stops,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// Accepted; textgen sends no obfuscation padding.
    #[serde(default)]
    pub include_obfuscation: Option<bool>,
}

/// A text part of a message; other part types (images, audio) are refused.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// The roles a message may have (documentation of `ChatMessage::role`, which is read as a
/// string so an unknown role is refused with its own message).
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)] // documentation only
pub enum ChatRole {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// Deprecated: a function's result (`functions` API), read as `tool`.
    Function,
}

#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `developer` (treated as `system`), `user`, `assistant`, `tool`, or the
    /// deprecated `function` (read as `tool`).
    #[schema(value_type = ChatRole)]
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_calls: Option<Value>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub refusal: Option<String>,
    /// Deprecated (OpenAI's `functions` API): an assistant's one call; read as a one-call
    /// `tool_calls` (`legacy_functions`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub function_call: Option<Value>,
}

/// Declares an OpenAI request with the fields every generation request shares (serde's
/// `flatten` cannot be combined with `deny_unknown_fields`, so they are spelled out in
/// each), plus `sampling_fields()` to read them as one `SamplingFields`.
macro_rules! openai_request {
    ($(#[$meta:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($body)*

    /// 0 to 2; 0 is greedy decoding.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f32>,
    /// In (0, 1]; 1 disables nucleus sampling.
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub top_p: Option<f32>,
    /// Choices to generate (1 to 16).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<u32>,
    /// Makes sampling reproducible; choice i uses seed + i.
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<StopField>,
    /// -2 to 2, additive, on tokens already generated.
    #[serde(default)]
    #[schema(minimum = -2, maximum = 2)]
    pub presence_penalty: Option<f32>,
    /// -2 to 2, additive, proportional to how often a token was generated.
    #[serde(default)]
    #[schema(minimum = -2, maximum = 2)]
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string) to a bias in [-100, 100] added to its logit.
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, f32>>)]
    pub logit_bias: Option<LogitBiasField>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Accepted, no effect.
    #[serde(default)]
    pub user: Option<String>,
    /// Accepted (any name); the answer names the served model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub service_tier: Option<String>,
    #[serde(default)]
    pub safety_identifier: Option<String>,
    #[serde(default)]
    pub prompt_cache_key: Option<String>,

    // Structured output (OpenAI, TGI and vLLM shapes); parsed in `mapping::structured`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub structured_outputs: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub guided_json: Option<Value>,
    #[serde(default)]
    pub guided_regex: Option<String>,
    #[serde(default)]
    pub guided_choice: Option<Vec<String>>,
    #[serde(default)]
    pub guided_grammar: Option<String>,
    #[serde(default)]
    pub guided_decoding_backend: Option<String>,
    #[serde(default)]
    pub guided_whitespace_pattern: Option<String>,

    // vLLM's sampling extensions; `mapping::extensions` gives each its rule.
    /// -1 or 0 (off), or 1 to 2^31 - 1.
    #[serde(default)]
    #[schema(minimum = -1, maximum = 2147483647)]
    pub top_k: Option<i64>,
    /// In [0, 1] (f32); 0 is off. Keeps the tokens at least `min_p` times as likely as the
    /// top token, after temperature.
    #[serde(default, deserialize_with = "min_p_field")]
    #[schema(minimum = 0, maximum = 1)]
    pub min_p: Option<f32>,
    /// Strictly positive and finite in f32; 1 is no penalty.
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 3.4028234663852886e38)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub min_tokens: Option<u32>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Token ids (at most 256, inside the vocabulary) that end generation like EOS; their
    /// text is left out of the answer.
    #[serde(default, deserialize_with = "stop_token_ids_field")]
    #[schema(max_items = 256)]
    pub stop_token_ids: Option<Vec<u32>>,
    /// `false` keeps special tokens' text in the answer.
    #[serde(default, deserialize_with = "skip_special_tokens_field")]
    pub skip_special_tokens: Option<bool>,
    #[serde(default)]
    pub spaces_between_special_tokens: Option<bool>,
    /// `true` keeps the stop string that ended the answer at its end.
    #[serde(default, deserialize_with = "include_stop_str_field")]
    pub include_stop_str_in_output: Option<bool>,
    #[serde(default)]
    pub use_beam_search: Option<bool>,
    /// Finite in f32; no effect without beam search.
    #[serde(default)]
    #[schema(minimum = -3.4028234663852886e38, maximum = 3.4028234663852886e38)]
    pub length_penalty: Option<f32>,
    #[serde(default)]
    pub early_stopping: Option<bool>,
    /// Keep the prompt's last N tokens (N >= 1).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub truncate_prompt_tokens: Option<i64>,
    /// Only `left` is implemented.
    #[serde(default)]
    #[schema(pattern = "^left$")]
    pub truncation_side: Option<String>,
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    #[serde(default)]
    pub watermarking: Option<bool>,
    /// Only 0: the scheduler has no priorities.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 0)]
    pub priority: Option<i64>,
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub logits_processors: Option<Value>,
    /// Only empty: not implemented.
    #[serde(default)]
    #[schema(max_items = 0)]
    pub bad_words: Option<Vec<String>>,
    /// Only empty: not implemented (use `logit_bias`).
    #[serde(default)]
    #[schema(max_items = 0)]
    pub allowed_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub return_tokens_as_token_ids: Option<bool>,
    #[serde(default)]
    pub return_token_ids: Option<bool>,
    #[serde(default)]
    pub cache_salt: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub vllm_xargs: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub kv_transfer_params: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub logprob_token_ids: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub repetition_detection: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub thinking_token_budget: Option<Value>,
    #[serde(default)]
    pub stream_interval: Option<u32>,
        }

        impl $name {
            pub fn sampling_fields(&self) -> SamplingFields {
                SamplingFields {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    n: self.n,
                    seed: self.seed,
                    stop: self.stop.clone(),
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    logit_bias: self.logit_bias.clone(),
                    stream: self.stream,
                    stream_options: self.stream_options.clone(),
                }
            }

            pub fn extension_fields(&self) -> ExtensionFields {
                ExtensionFields {
                    top_k: self.top_k,
                    min_p: self.min_p,
                    repetition_penalty: self.repetition_penalty,
                    min_tokens: self.min_tokens,
                    ignore_eos: self.ignore_eos,
                    stop_token_ids: self.stop_token_ids.clone(),
                    skip_special_tokens: self.skip_special_tokens,
                    include_stop_str_in_output: self.include_stop_str_in_output,
                    use_beam_search: self.use_beam_search,
                    length_penalty: self.length_penalty,
                    truncate_prompt_tokens: self.truncate_prompt_tokens,
                    truncation_side: self.truncation_side.clone(),
                    prompt_logprobs: self.prompt_logprobs,
                    watermarking: self.watermarking,
                    priority: self.priority,
                    logits_processors: self.logits_processors.clone(),
                    bad_words: self.bad_words.clone(),
                    allowed_token_ids: self.allowed_token_ids.clone(),
                    return_tokens_as_token_ids: self.return_tokens_as_token_ids,
                    return_token_ids: self.return_token_ids,
                    cache_salt: self.cache_salt.clone(),
                    vllm_xargs: self.vllm_xargs.clone(),
                    kv_transfer_params: self.kv_transfer_params.clone(),
                    logprob_token_ids: self.logprob_token_ids.clone(),
                    repetition_detection: self.repetition_detection.clone(),
                    thinking_token_budget: self.thinking_token_budget.clone(),
                }
            }

            pub fn structured_fields(&self) -> StructuredFields {
                StructuredFields {
                    response_format: self.response_format.clone(),
                    structured_outputs: self.structured_outputs.clone(),
                    guided_json: self.guided_json.clone(),
                    guided_regex: self.guided_regex.clone(),
                    guided_choice: self.guided_choice.clone(),
                    guided_grammar: self.guided_grammar.clone(),
                    guided_whitespace_pattern: self.guided_whitespace_pattern.clone(),
                }
            }
        }
    };
}

/// `logit_bias`: OpenAI's map, or the list TGI's Python client types it as (TGI ignores
/// it; a non-empty list is refused, an empty one is unset).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum LogitBiasField {
    Map(BTreeMap<String, f32>),
    List(Vec<f32>),
}

/// The vLLM extensions that change generation (the no-effect ones are not read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtensionFields {
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_tokens: Option<u32>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub skip_special_tokens: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
    pub use_beam_search: Option<bool>,
    pub length_penalty: Option<f32>,
    pub truncate_prompt_tokens: Option<i64>,
    pub truncation_side: Option<String>,
    pub prompt_logprobs: Option<i64>,
    pub watermarking: Option<bool>,
    pub priority: Option<i64>,
    pub logits_processors: Option<Value>,
    pub bad_words: Option<Vec<String>>,
    pub allowed_token_ids: Option<Vec<u32>>,
    pub return_tokens_as_token_ids: Option<bool>,
    pub return_token_ids: Option<bool>,
    pub cache_salt: Option<String>,
    pub vllm_xargs: Option<Value>,
    pub kv_transfer_params: Option<Value>,
    pub logprob_token_ids: Option<Value>,
    pub repetition_detection: Option<Value>,
    pub thinking_token_budget: Option<Value>,
}

/// The output-constraint fields, as sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StructuredFields {
    pub response_format: Option<Value>,
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub guided_whitespace_pattern: Option<String>,
}

/// The shared fields that change generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingFields {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<u32>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<LogitBiasField>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

openai_request! {
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// 0 to 20; needs `logprobs: true`.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u32>,
    /// Function tools (at most 128); see docs/openai.md. The deprecated `functions` and
    /// `function_call` are read as tools (`legacy_functions`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tools: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// Default true; false allows at most one call.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub functions: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub function_call: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub modalities: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub audio: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub prediction: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub reasoning_effort: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub verbosity: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub web_search_options: Option<Value>,
    /// TGI: text put before the tool definitions. Accepted without effect: the model's
    /// chat template writes the tools.
    #[serde(default)]
    pub tool_prompt: Option<String>,
    /// vLLM: generate this many (at least `n`, at most 16) and return the `n` with the
    /// highest mean logprob.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 16)]
    pub best_of: Option<u32>,
    /// vLLM: open the assistant turn after the messages (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// vLLM: leave the final (assistant) message open, so the model continues it.
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// vLLM: refused when true (it prepends the last message to the answer).
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub documents: Option<Value>,
    #[serde(default)]
    pub chat_template: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<Value>,
    #[serde(default)]
    pub include_reasoning: Option<bool>,
}
}

/// `prompt`: a string, a token list, or a batch of either.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

openai_request! {
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    /// Defaults to 16, as in OpenAI's API.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// 0 to 5 most likely alternatives per token (legacy format).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 5)]
    pub logprobs: Option<u32>,
    /// Put the prompt in front of the completion.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Generate this many (at least `n`, at most 16) and return the `n` with the highest
    /// mean logprob.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 16)]
    pub best_of: Option<u32>,
    /// Refused: textgen has no fill-in-the-middle.
    #[serde(default)]
    pub suffix: Option<String>,
}
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// The text; `null` when the answer is only tool calls.
    pub content: Option<String>,
    pub refusal: Option<String>,
    /// Present when the answer made calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
    /// Instead of `tool_calls` when the request used the deprecated `functions`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionCallOut>,
}

/// One call of `message.tool_calls`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FunctionCallOut {
    pub name: String,
    /// The arguments as a JSON string (an object matching the tool's `parameters`).
    pub arguments: String,
}

/// One piece of `delta.tool_calls`: the first for a call carries `id`, `type` and
/// `function.name` (with `arguments: ""`), later ones only `function.arguments`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length`, or `tool_calls` when the answer made calls.
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Always present, `null` without calls: TGI's Python client requires the key in every
    /// delta (OpenAI's SDK and LangChain take `null` as none).
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// Instead of `tool_calls` when the request used the deprecated `functions`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionCallDelta>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChunkChoice>,
    pub usage: Option<Usage>,
}

/// The legacy logprobs of `/v1/completions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// `null` for the first prompt token when echoed.
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    pub text_offset: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The answer of `/v1/completions`, and each of its stream chunks.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Model {
    pub id: String,
    pub object: &'static str,
    /// Unix time the model's files were written.
    pub created: u64,
    /// The organisation part of the model id (`HuggingFaceTB` of `HuggingFaceTB/SmolLM2`).
    pub owned_by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}
