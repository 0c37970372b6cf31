//! TGI's request validation: parameter ranges, length limits against the KV-consistent
//! limits, truncation, and tokenization. Messages follow TGI's wording.
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::grammar::{GrammarCompiler, GrammarError, GrammarRequest};
use crate::pb;
use crate::sampling_rules as rules;
use crate::schema::{GenerateParameters, GenerateRequest};
use crate::tokenizer::{TextTokenizer, TokenizerError};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("`best_of` must be > 0 and <= {0}. Given: {1}")]
    BestOf(usize, usize),
    #[error("you must use sampling when `best_of` is > 1")]
    BestOfSampling,
    #[error("`seed` must not be set when `best_of` > 1")]
    BestOfSeed,
    #[error("`best_of` != 1 is not supported when streaming tokens")]
    BestOfStream,
    #[error("{}", self.message(&native_name))]
    TopNTokens(u32, u32),
    #[error("`decoder_input_details` == true is not supported when streaming tokens")]
    PrefillDetailsStream,
    #[error("`temperature` must be strictly positive and finite")]
    Temperature,
    #[error("`repetition_penalty` must be strictly positive and finite")]
    RepetitionPenalty,
    #[error("`frequency_penalty` must be >= -2.0 and <= 2.0")]
    FrequencyPenalty,
    #[error("`top_p` must be > 0.0 and < 1.0")]
    TopP,
    #[error("`top_k` must be strictly positive")]
    TopK,
    #[error("`typical_p` must be > 0.0 and < 1.0")]
    TypicalP,
    #[error("`min_p` must be >= 0.0 and <= 1.0")]
    MinP,
    #[error("{}", self.message(&native_name))]
    Truncate(u32, usize),
    #[error("{}", self.message(&native_name))]
    MaxNewTokens,
    #[error("{}", self.message(&native_name))]
    MaxTotalTokens(u32, u32, u32),
    #[error("{}", self.message(&native_name))]
    InputLength(u32, u32),
    #[error("{}", self.message(&native_name))]
    EmptyInput,
    #[error("`stop` supports up to {0} stop sequences. Given: {1}")]
    StopSequence(usize, usize),
    #[error("`stop` sequences must not be empty strings")]
    EmptyStopSequence,
    #[error("`stop` sequences must be at most {0} characters long")]
    LongStopSequence(usize),
    #[error("`stop_token_ids` supports up to {0} token ids. Given: {1}")]
    StopTokenIds(usize, usize),
    #[error("`stop_token_ids` token {0} is outside the vocabulary (size {1})")]
    StopTokenId(u32, u32),
    #[error("`{0}` is not supported by textgen")]
    Unsupported(&'static str),
    #[error("`presence_penalty` must be >= -2.0 and <= 2.0")]
    PresencePenalty,
    #[error("`logit_bias` token {0} is outside the vocabulary (size {1})")]
    LogitBiasToken(u32, u32),
    #[error("`logit_bias` values must be >= -100 and <= 100")]
    LogitBiasValue,
    #[error("prompt token {0} is outside the vocabulary (size {1})")]
    PromptToken(u32, u32),
    #[error("chat template error: {0}")]
    Template(String),
    #[error("tokenizer error {0}")]
    Tokenizer(String),
    #[error("{0}")]
    Grammar(#[from] GrammarError),
    #[error("only one output constraint per request; got `grammar` and {0}")]
    TwoConstraints(&'static str),
}

/// The native API's name of a field validation speaks of: the name itself. Other APIs
/// name some fields differently (`/v1`: `max_tokens`, `prompt`, ...) and pass their own
/// naming to [`ValidationError::message`] (server/openai/errors.rs).
pub fn native_name(field: &'static str) -> &'static str {
    field
}

impl ValidationError {
    /// The request field at fault, by its native name (`inputs`, `max_new_tokens`, ...);
    /// `None` when the error is about no one field (tokenizer, template).
    pub fn field(&self) -> Option<&'static str> {
        use ValidationError::*;
        Some(match self {
            BestOf(..) | BestOfSampling | BestOfSeed | BestOfStream => "best_of",
            TopNTokens(..) => "top_n_tokens",
            PrefillDetailsStream => "decoder_input_details",
            Temperature => "temperature",
            RepetitionPenalty => "repetition_penalty",
            FrequencyPenalty => "frequency_penalty",
            TopP => "top_p",
            TopK => "top_k",
            TypicalP => "typical_p",
            MinP => "min_p",
            Truncate(..) => "truncate",
            MaxNewTokens => "max_new_tokens",
            // The prompt is what leaves no room, as OpenAI names a context-length error.
            MaxTotalTokens(..) | InputLength(..) | EmptyInput | PromptToken(..) => "inputs",
            StopSequence(..) | EmptyStopSequence | LongStopSequence(..) => "stop",
            StopTokenIds(..) | StopTokenId(..) => "stop_token_ids",
            Unsupported(field) => field,
            PresencePenalty => "presence_penalty",
            LogitBiasToken(..) | LogitBiasValue => "logit_bias",
            TwoConstraints(..) => "grammar",
            Template(_) | Tokenizer(_) | Grammar(_) => return None,
        })
    }

    /// The message, each field named by `name` (given the native name). The native API's
    /// messages (`Display`) are `message(&native_name)`; only the variants that name a
    /// field some API calls differently are written here, the rest are their `Display`.
    pub fn message(&self, name: &dyn Fn(&'static str) -> &'static str) -> String {
        use ValidationError::*;
        let (inputs, max_new_tokens) = (name("inputs"), name("max_new_tokens"));
        match self {
            TopNTokens(max, given) => format!(
                "`{}` must be >= 0 and <= {max}. Given: {given}",
                name("top_n_tokens")
            ),
            Truncate(max, given) => format!(
                "`{}` must be strictly positive and less than {max}. Given: {given}",
                name("truncate")
            ),
            MaxNewTokens => format!("`{max_new_tokens}` must be strictly positive"),
            MaxTotalTokens(max, input, new) => format!(
                "`{inputs}` tokens + `{max_new_tokens}` must be <= {max}. Given: {input} `{inputs}` tokens and {new} `{max_new_tokens}`"
            ),
            InputLength(max, given) => {
                format!("`{inputs}` must have less than {max} tokens. Given: {given}")
            }
            EmptyInput => format!("`{inputs}` cannot be empty"),
            other => other.to_string(),
        }
    }
}

/// Longest stop sequence, in characters: matching cost grows with it and no real stop
/// sequence comes close.
pub const MAX_STOP_SEQUENCE_CHARS: usize = 1024;

/// Most stop token ids one request may add: each is checked on every generated token and
/// sent to the shard with `min_tokens`; real requests name a handful.
pub const MAX_STOP_TOKEN_IDS: usize = 256;

/// The caps validation enforces (from the command line and the derived limits).
#[derive(Debug, Clone, Copy)]
pub struct ValidationLimits {
    pub max_best_of: usize,
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: u32,
    pub max_input_tokens: u32,
    pub max_total_tokens: u32,
    /// The model's vocabulary (from the shard), bounding `logit_bias` and prompt token ids.
    pub vocab_size: u32,
    pub watermark: WatermarkSettings,
}

/// `--watermark-gamma` / `--watermark-delta`: the share of green tokens and their bonus.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WatermarkSettings {
    pub gamma: f32,
    pub delta: f32,
}

impl Default for WatermarkSettings {
    /// TGI's defaults.
    fn default() -> Self {
        Self {
            gamma: 0.5,
            delta: 2.0,
        }
    }
}

/// What only the OpenAI routes can ask for, on top of TGI's parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingExtras {
    /// OpenAI's additive presence penalty, in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// vLLM's min-p, in [0, 1] (0: off).
    pub min_p: Option<f32>,
    /// (token id, bias in [-100, 100]) pairs.
    pub logit_bias: Vec<(u32, f32)>,
    /// Replaces `--max-top-n-tokens` (OpenAI's `top_logprobs` has its own cap of 20).
    pub max_top_n_tokens: Option<u32>,
    /// The output constraint (`response_format`, `structured_outputs`, `guided_*`, tools).
    /// TGI's native routes carry theirs in `GenerateParameters::grammar` instead.
    pub grammar: Option<GrammarRequest>,
    /// vLLM's `min_tokens` / `ignore_eos`.
    pub stop_floor: Option<StopFloor>,
    /// vLLM's `stop_token_ids`: generating one of these ends the sequence, like EOS.
    pub stop_token_ids: Vec<u32>,
    /// vLLM's `skip_special_tokens: false`: special tokens' text stays in the answer.
    pub keep_special_tokens: bool,
    /// vLLM's `include_stop_str_in_output`.
    pub include_stop_str_in_output: bool,
}

/// The stop tokens cannot be drawn until `min_new_tokens` tokens exist (`u32::MAX`: never).
#[derive(Debug, Clone, PartialEq)]
pub struct StopFloor {
    pub min_new_tokens: u32,
    pub stop_token_ids: Vec<u32>,
}

/// The prompt: text to tokenize, or token ids given by the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// `add_special_tokens: false` for chat prompts, whose template already wrote them.
    Text {
        text: String,
        add_special_tokens: bool,
    },
    /// A chat template's output: the messages' text in it is tokenized as text, their
    /// special-token strings included (`TextTokenizer::encode_chat`).
    Chat {
        chat: crate::chat_template::RenderedChat,
        add_special_tokens: bool,
    },
    Tokens(Vec<u32>),
}

/// Everything validation takes.
#[derive(Debug, Clone)]
pub struct GenerationInput {
    pub prompt: Prompt,
    pub parameters: GenerateParameters,
    pub extras: SamplingExtras,
}

impl From<GenerateRequest> for GenerationInput {
    fn from(request: GenerateRequest) -> Self {
        Self {
            prompt: Prompt::Text {
                text: request.inputs,
                add_special_tokens: true,
            },
            parameters: request.parameters,
            extras: SamplingExtras::default(),
        }
    }
}

/// Parameters after the range checks, before the prompt is tokenized.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedParameters {
    /// Seed still 0 here when none was given; `Validation` draws one.
    pub sampling: pb::SamplingParameters,
    pub seed: Option<u64>,
    pub best_of: usize,
    pub max_new_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub truncate: Option<usize>,
    pub details: bool,
    pub decoder_input_details: bool,
    pub top_n_tokens: u32,
    pub return_full_text: bool,
    /// The compiled output constraint, if any.
    pub grammar: Option<pb::Grammar>,
    /// The request's own stop tokens, on top of the model's EOS ids.
    pub stop_token_ids: Vec<u32>,
    pub skip_special_tokens: bool,
    pub include_stop_str_in_output: bool,
}

/// A request ready for the scheduler.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// The prompt text (decoded when the client sent token ids).
    pub inputs: String,
    pub input_ids: Vec<u32>,
    pub max_new_tokens: u32,
    pub params: CheckedParameters,
}

/// Checks every parameter that does not need the tokenized prompt.
pub fn check_parameters(
    p: &GenerateParameters,
    streaming: bool,
    limits: &ValidationLimits,
) -> Result<CheckedParameters, ValidationError> {
    check_parameters_with(p, &SamplingExtras::default(), streaming, limits)
}

/// `check_parameters` with the OpenAI-only extras.
pub fn check_parameters_with(
    p: &GenerateParameters,
    extras: &SamplingExtras,
    streaming: bool,
    limits: &ValidationLimits,
) -> Result<CheckedParameters, ValidationError> {
    reject_unsupported(p)?;
    // Each rule holds in f32, the precision the shard computes in: JSON's 1e308 parses
    // into an f32 as infinity, which is not a temperature.
    let temperature = p.temperature.unwrap_or(1.0);
    if !rules::TEMPERATURE.allows(temperature) {
        return Err(ValidationError::Temperature);
    }
    if p.repetition_penalty
        .is_some_and(|r| !rules::REPETITION_PENALTY.allows(r))
    {
        return Err(ValidationError::RepetitionPenalty);
    }
    let frequency_penalty = p.frequency_penalty.unwrap_or(0.0);
    if !rules::FREQUENCY_PENALTY.allows(frequency_penalty) {
        return Err(ValidationError::FrequencyPenalty);
    }
    let top_p = p.top_p.unwrap_or(1.0);
    if p.top_p.is_some() && !rules::TOP_P.allows(top_p) {
        return Err(ValidationError::TopP);
    }
    let typical_p = p.typical_p.unwrap_or(1.0);
    if p.typical_p.is_some() && !rules::TYPICAL_P.allows(typical_p) {
        return Err(ValidationError::TypicalP);
    }
    let top_k = match p.top_k {
        Some(k) if !rules::TOP_K.allows(k as f32) => return Err(ValidationError::TopK),
        Some(k) => k as u32,
        None => 0,
    };
    if p.max_new_tokens == Some(0) {
        return Err(ValidationError::MaxNewTokens);
    }
    // Sampling is on when asked for or when any warper would change the distribution.
    let do_sample =
        p.do_sample || temperature != 1.0 || top_k != 0 || top_p < 1.0 || typical_p < 1.0;
    let best_of = check_best_of(p, do_sample, streaming, limits)?;
    if p.stop.len() > limits.max_stop_sequences {
        return Err(ValidationError::StopSequence(
            limits.max_stop_sequences,
            p.stop.len(),
        ));
    }
    if p.stop.iter().any(String::is_empty) {
        return Err(ValidationError::EmptyStopSequence);
    }
    if p.stop
        .iter()
        .any(|s| s.chars().count() > MAX_STOP_SEQUENCE_CHARS)
    {
        return Err(ValidationError::LongStopSequence(MAX_STOP_SEQUENCE_CHARS));
    }
    let top_n_tokens = p.top_n_tokens.unwrap_or(0);
    let max_top_n_tokens = extras.max_top_n_tokens.unwrap_or(limits.max_top_n_tokens);
    if top_n_tokens > max_top_n_tokens {
        return Err(ValidationError::TopNTokens(max_top_n_tokens, top_n_tokens));
    }
    let presence_penalty = extras.presence_penalty.unwrap_or(0.0);
    if !rules::PRESENCE_PENALTY.allows(presence_penalty) {
        return Err(ValidationError::PresencePenalty);
    }
    let min_p = extras.min_p.unwrap_or(0.0);
    if !rules::MIN_P.allows(min_p) {
        return Err(ValidationError::MinP);
    }
    let logit_bias = check_logit_bias(&extras.logit_bias, limits.vocab_size)?;
    check_stop_token_ids(&extras.stop_token_ids, limits.vocab_size)?;
    if streaming && p.decoder_input_details {
        return Err(ValidationError::PrefillDetailsStream);
    }
    if let Some(truncate) = p.truncate {
        if truncate == 0 || truncate > limits.max_input_tokens as usize {
            return Err(ValidationError::Truncate(limits.max_input_tokens, truncate));
        }
    }
    let sampling = pb::SamplingParameters {
        do_sample,
        // proto3 `optional`: unset is the neutral 1.0, never a value the shard refuses.
        temperature: p.temperature,
        top_k,
        top_p: p.top_p,
        typical_p: p.typical_p,
        repetition_penalty: p.repetition_penalty,
        frequency_penalty,
        presence_penalty,
        seed: p.seed.unwrap_or(0),
        logit_bias,
        watermark: p.watermark,
        watermark_gamma: if p.watermark {
            limits.watermark.gamma
        } else {
            0.0
        },
        watermark_delta: if p.watermark {
            limits.watermark.delta
        } else {
            0.0
        },
        min_new_tokens: extras.stop_floor.as_ref().map_or(0, |f| f.min_new_tokens),
        stop_token_ids: extras
            .stop_floor
            .as_ref()
            .map_or_else(Vec::new, |f| f.stop_token_ids.clone()),
        min_p,
    };
    Ok(CheckedParameters {
        sampling,
        seed: p.seed,
        best_of,
        max_new_tokens: p.max_new_tokens,
        stop: p.stop.clone(),
        truncate: p.truncate,
        details: p.details,
        decoder_input_details: p.decoder_input_details,
        top_n_tokens,
        return_full_text: p.return_full_text.unwrap_or(false),
        grammar: None,
        stop_token_ids: extras.stop_token_ids.clone(),
        skip_special_tokens: !extras.keep_special_tokens,
        include_stop_str_in_output: extras.include_stop_str_in_output,
    })
}

/// TGI fields textgen does not implement are refused unless left at their neutral value.
fn reject_unsupported(p: &GenerateParameters) -> Result<(), ValidationError> {
    if p.adapter_id.as_ref().is_some_and(|id| !id.is_empty()) {
        return Err(ValidationError::Unsupported("adapter_id"));
    }
    Ok(())
}

fn check_logit_bias(
    biases: &[(u32, f32)],
    vocab_size: u32,
) -> Result<Vec<pb::LogitBias>, ValidationError> {
    biases
        .iter()
        .map(|&(token_id, bias)| {
            if token_id >= vocab_size {
                return Err(ValidationError::LogitBiasToken(token_id, vocab_size));
            }
            if !(-100.0..=100.0).contains(&bias) {
                return Err(ValidationError::LogitBiasValue);
            }
            Ok(pb::LogitBias { token_id, bias })
        })
        .collect()
}

fn check_stop_token_ids(ids: &[u32], vocab_size: u32) -> Result<(), ValidationError> {
    if ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ValidationError::StopTokenIds(MAX_STOP_TOKEN_IDS, ids.len()));
    }
    match ids.iter().find(|&&id| id >= vocab_size) {
        Some(&id) => Err(ValidationError::StopTokenId(id, vocab_size)),
        None => Ok(()),
    }
}

fn check_best_of(
    p: &GenerateParameters,
    do_sample: bool,
    streaming: bool,
    limits: &ValidationLimits,
) -> Result<usize, ValidationError> {
    let best_of = p.best_of.unwrap_or(1);
    if best_of == 0 || best_of > limits.max_best_of {
        return Err(ValidationError::BestOf(limits.max_best_of, best_of));
    }
    if best_of > 1 {
        if !do_sample {
            return Err(ValidationError::BestOfSampling);
        }
        if p.seed.is_some() {
            return Err(ValidationError::BestOfSeed);
        }
        if streaming {
            return Err(ValidationError::BestOfStream);
        }
    }
    Ok(best_of)
}

/// Applies `truncate` (keeps the last tokens) and the length limits; returns the
/// effective `max_new_tokens`.
pub fn check_lengths(
    input_ids: &mut Vec<u32>,
    params: &CheckedParameters,
    limits: &ValidationLimits,
) -> Result<u32, ValidationError> {
    if let Some(truncate) = params.truncate {
        if input_ids.len() > truncate {
            input_ids.drain(..input_ids.len() - truncate);
        }
    }
    let input_length = u32::try_from(input_ids.len()).unwrap_or(u32::MAX);
    if input_length > limits.max_input_tokens {
        return Err(ValidationError::InputLength(
            limits.max_input_tokens,
            input_length,
        ));
    }
    let max_new_tokens = params
        .max_new_tokens
        .unwrap_or_else(|| limits.max_total_tokens.saturating_sub(input_length));
    if u64::from(input_length) + u64::from(max_new_tokens) > u64::from(limits.max_total_tokens) {
        return Err(ValidationError::MaxTotalTokens(
            limits.max_total_tokens,
            input_length,
            max_new_tokens,
        ));
    }
    Ok(max_new_tokens)
}

/// The request's output constraint: TGI's `parameters.grammar` or what the OpenAI routes
/// parsed, never both.
fn requested_grammar(
    p: &GenerateParameters,
    extras: &SamplingExtras,
) -> Result<Option<GrammarRequest>, ValidationError> {
    let native = crate::grammar::from_tgi(p.grammar.as_ref())?;
    match (native, &extras.grammar) {
        (Some(_), Some(other)) => Err(ValidationError::TwoConstraints(other.kind())),
        (Some(native), None) => Ok(Some(native)),
        (None, other) => Ok(other.clone()),
    }
}

/// Validates requests; tokenization and grammar compiles run on blocking threads, at most
/// `workers` at once.
#[derive(Debug, Clone)]
pub struct Validation {
    tokenizer: Arc<TextTokenizer>,
    limits: ValidationLimits,
    workers: Arc<Semaphore>,
    /// None: grammars are refused (`--disable-grammar-support`).
    grammar: Option<Arc<GrammarCompiler>>,
}

impl Validation {
    pub fn new(tokenizer: Arc<TextTokenizer>, limits: ValidationLimits, workers: usize) -> Self {
        Self {
            tokenizer,
            limits,
            workers: Arc::new(Semaphore::new(workers.max(1))),
            grammar: None,
        }
    }

    /// Compiles requests' grammars with `compiler`; without one they are refused.
    pub fn with_grammar(mut self, compiler: Arc<GrammarCompiler>) -> Self {
        self.grammar = Some(compiler);
        self
    }

    pub fn limits(&self) -> &ValidationLimits {
        &self.limits
    }

    pub async fn validate(
        &self,
        request: impl Into<GenerationInput>,
        streaming: bool,
    ) -> Result<ValidRequest, ValidationError> {
        let input = request.into();
        let constraint = requested_grammar(&input.parameters, &input.extras)?;
        let mut params =
            check_parameters_with(&input.parameters, &input.extras, streaming, &self.limits)?;
        if let Some(constraint) = constraint {
            params.grammar = Some(self.compile_grammar(constraint).await?);
        }
        if params.seed.is_none() {
            params.sampling.seed = rand::random();
        }
        let (inputs, mut input_ids) = match input.prompt {
            Prompt::Text {
                text,
                add_special_tokens,
            } => {
                if text.is_empty() {
                    return Err(ValidationError::EmptyInput);
                }
                let ids = self.tokenize_with(&text, add_special_tokens).await?;
                (text, ids)
            }
            Prompt::Chat {
                chat,
                add_special_tokens,
            } => {
                if chat.text.is_empty() {
                    return Err(ValidationError::EmptyInput);
                }
                let ids = self.tokenize_chat(&chat, add_special_tokens).await?;
                (chat.text, ids)
            }
            Prompt::Tokens(ids) => {
                let vocab_size = self.limits.vocab_size;
                if let Some(&bad) = ids.iter().find(|&&id| id >= vocab_size) {
                    return Err(ValidationError::PromptToken(bad, vocab_size));
                }
                let text = self
                    .tokenizer
                    .decode(&ids, false)
                    .map_err(|err| ValidationError::Tokenizer(err.0))?;
                (text, ids)
            }
        };
        if input_ids.is_empty() {
            return Err(ValidationError::EmptyInput);
        }
        let max_new_tokens = check_lengths(&mut input_ids, &params, &self.limits)?;
        Ok(ValidRequest {
            inputs,
            input_ids,
            max_new_tokens,
            params,
        })
    }

    async fn compile_grammar(
        &self,
        request: GrammarRequest,
    ) -> Result<pb::Grammar, ValidationError> {
        let Some(compiler) = &self.grammar else {
            crate::metrics::record_refusal(request.kind(), &GrammarError::Disabled);
            return Err(GrammarError::Disabled.into());
        };
        let _permit = self
            .workers
            .acquire()
            .await
            .map_err(|_| ValidationError::Tokenizer("validation workers stopped".into()))?;
        Ok(compiler.compile(request).await?)
    }

    pub async fn tokenize(&self, text: &str) -> Result<Vec<u32>, ValidationError> {
        self.tokenize_with(text, true).await
    }

    async fn tokenize_with(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ValidationError> {
        let text = text.to_owned();
        self.on_worker(move |tokenizer| tokenizer.encode_with(&text, add_special_tokens))
            .await
    }

    /// Runs `encode` on a blocking thread, holding one of the `--validation-workers` permits.
    async fn on_worker(
        &self,
        encode: impl FnOnce(&TextTokenizer) -> Result<Vec<u32>, TokenizerError> + Send + 'static,
    ) -> Result<Vec<u32>, ValidationError> {
        let _permit = self
            .workers
            .acquire()
            .await
            .map_err(|_| ValidationError::Tokenizer("validation workers stopped".into()))?;
        let tokenizer = self.tokenizer.clone();
        tokio::task::spawn_blocking(move || encode(&tokenizer))
            .await
            .map_err(|err| ValidationError::Tokenizer(err.to_string()))?
            .map_err(|err| ValidationError::Tokenizer(err.0))
    }
}

impl Validation {
    async fn tokenize_chat(
        &self,
        chat: &crate::chat_template::RenderedChat,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ValidationError> {
        let chat = chat.clone();
        self.on_worker(move |tokenizer| {
            tokenizer.encode_chat(&chat.text, &chat.content, add_special_tokens)
        })
        .await
    }
}

#[cfg(test)]
#[path = "validation_tests.rs"]
mod tests;
