//! OpenAI requests → textgen's generation inputs. Every OpenAI-only rule is checked here
//! (ranges OpenAI documents, fields refused until implemented), vLLM's extensions in
//! `extensions`, output constraints in `structured`; everything else goes through the
//! native validation, so both API surfaces enforce the same limits.
mod chat_prompt;
mod extensions;
mod structured;
mod tools;

use crate::generation_defaults::GenerationDefaults;
use crate::schema::GenerateParameters;
use crate::validation::{GenerationInput, Prompt, SamplingExtras, StopFloor};

use super::errors::{FieldNames, OpenAiError};
use super::types::{
    ChatCompletionRequest, CompletionRequest, ExtensionFields, LogitBiasField, PromptField,
    SamplingFields, StructuredFields,
};
pub use chat_prompt::{chat_prompt, render_chat, render_chat_segments, with_message_ranges};
use extensions::Extensions;
pub use extensions::EMPTY_ONLY_FIELDS;
pub use tools::{tool_request, ToolPlan};

/// What the served model contributes to every OpenAI request.
#[derive(Debug, Clone, Default)]
pub struct ModelDefaults {
    /// generation_config.json's sampling values (empty with
    /// `--generation-config-defaults false`).
    pub generation: GenerationDefaults,
    /// The model's EOS ids: they end generation (a request's `stop_token_ids` add to them).
    pub stop_token_ids: Vec<u32>,
    /// How the model writes tool calls (`tools::model_tool_syntax`).
    pub tool_syntax: crate::tools::ToolSyntax,
}

/// Most choices (`n`, `best_of`) one request may ask for.
pub const MAX_CHOICES: u32 = 16;
/// Most sequences one `/v1/completions` request may run (prompts × best_of).
pub const MAX_SEQUENCES: u32 = 32;
/// OpenAI's caps on alternatives per token.
pub const MAX_TOP_LOGPROBS: u32 = 20;
pub const MAX_COMPLETION_LOGPROBS: u32 = 5;
/// OpenAI's default `max_tokens` on `/v1/completions`.
pub const DEFAULT_COMPLETION_TOKENS: u32 = 16;

/// What a handler runs: one input per prompt, `runs` sequences each, `n` answered.
#[derive(Debug, Clone)]
pub struct Plan {
    pub inputs: Vec<GenerationInput>,
    pub n: u32,
    /// Sequences per prompt (`best_of`, at least `n`); the `n` best by mean logprob win.
    pub runs: u32,
    pub seed: Option<u64>,
    pub stream: bool,
    pub include_usage: bool,
    /// Alternatives per token, when logprobs were asked for.
    pub logprobs: Option<u32>,
    pub echo: bool,
    /// Set when the answer may hold tool calls (chat with `tools`, `tool_choice` not
    /// `none`): each choice is parsed into content and calls.
    pub tools: Option<ToolPlan>,
    /// How this request names the fields validation speaks of, for its errors.
    pub fields: FieldNames,
}

impl Plan {
    /// Seed of run `i`: the request's seed + i, so a seeded request is reproducible.
    pub fn seed_of(&self, drawn: u64, run: u32) -> u64 {
        let base = self.seed.unwrap_or(drawn);
        if run == 0 {
            return base;
        }
        match self.seed {
            Some(seed) => seed.wrapping_add(u64::from(run)),
            None => rand::random(),
        }
    }
}

fn is_set(value: &Option<serde_json::Value>) -> bool {
    value.as_ref().is_some_and(|v| !v.is_null())
}

fn logit_bias(field: &Option<LogitBiasField>) -> Result<Vec<(u32, f32)>, OpenAiError> {
    match field {
        None => Ok(vec![]),
        Some(LogitBiasField::List(list)) if list.is_empty() => Ok(vec![]),
        Some(LogitBiasField::List(_)) => Err(OpenAiError::unsupported(
            "logit_bias",
            "a list (TGI's unused shape); send a map of token id to bias",
        )),
        Some(LogitBiasField::Map(map)) => map
            .iter()
            .map(|(token, &bias)| match token.parse::<u32>() {
                Ok(id) => Ok((id, bias)),
                Err(_) => Err(OpenAiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` keys must be token ids, got {token:?}"),
                )),
            })
            .collect(),
    }
}

/// The request's sampling, with what the request left unset taken from the model's
/// generation_config.json (as vLLM does), then OpenAI's defaults.
struct Sampling<'a> {
    fields: &'a SamplingFields,
    extensions: Extensions,
    structured: &'a StructuredFields,
    defaults: &'a GenerationDefaults,
    /// The model's EOS ids: what `min_tokens` holds back.
    stop_token_ids: &'a [u32],
}

impl Sampling<'_> {
    fn map(
        self,
        max_new_tokens: Option<u32>,
        top_n: u32,
    ) -> Result<(GenerateParameters, SamplingExtras), OpenAiError> {
        let (fields, ext, defaults) = (self.fields, &self.extensions, self.defaults);
        let temperature = fields.temperature.or(defaults.temperature).unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(OpenAiError::invalid(
                "temperature",
                "`temperature` must be >= 0 and <= 2",
            ));
        }
        let top_p = fields.top_p.or(defaults.top_p).unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(OpenAiError::invalid(
                "top_p",
                "`top_p` must be > 0 and <= 1",
            ));
        }
        let frequency_penalty = fields.frequency_penalty.unwrap_or(0.0);
        // OpenAI's range for both penalties; it also refuses what is infinite in f32.
        for (name, value) in [
            ("frequency_penalty", frequency_penalty),
            ("presence_penalty", fields.presence_penalty.unwrap_or(0.0)),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return Err(OpenAiError::invalid(
                    name,
                    format!("`{name}` must be >= -2 and <= 2"),
                ));
            }
        }
        let repetition_penalty = ext.repetition_penalty.or(defaults.repetition_penalty);
        let top_k = ext.top_k.or(defaults.top_k).unwrap_or(0);
        let min_p = ext.min_p.or(defaults.min_p);
        let greedy = temperature == 0.0;
        let parameters = GenerateParameters {
            // OpenAI samples unless temperature is 0; greedy ignores the warpers, and
            // setting one would turn native sampling back on.
            do_sample: !greedy,
            temperature: (!greedy && temperature != 1.0).then_some(temperature),
            top_p: (!greedy && top_p < 1.0).then_some(top_p),
            top_k: (!greedy && top_k > 0).then_some(top_k as i32),
            repetition_penalty: repetition_penalty.filter(|&r| r != 1.0),
            frequency_penalty: (frequency_penalty != 0.0).then_some(frequency_penalty),
            max_new_tokens,
            stop: fields
                .stop
                .clone()
                .map(|s| s.into_vec())
                .unwrap_or_default(),
            top_n_tokens: (top_n > 0).then_some(top_n),
            truncate: ext.truncate,
            watermark: ext.watermark,
            ..GenerateParameters::default()
        };
        let grammar = structured::grammar(self.structured)?;
        let extras = SamplingExtras {
            presence_penalty: fields.presence_penalty,
            // A warper: greedy ignores it, like top_k and top_p.
            min_p: min_p.filter(|_| !greedy),
            logit_bias: logit_bias(&fields.logit_bias)?,
            max_top_n_tokens: Some(MAX_TOP_LOGPROBS),
            stop_floor: stop_floor(ext, max_new_tokens, &grammar, self.stop_token_ids)?,
            grammar,
            stop_token_ids: ext.stop_token_ids.clone(),
            keep_special_tokens: ext.keep_special_tokens,
            include_stop_str_in_output: ext.include_stop_str_in_output,
        };
        Ok((parameters, extras))
    }
}

/// `min_tokens` / `ignore_eos` as the shard applies them, as vLLM does: `min_tokens` bans
/// the model's EOS ids and the request's `stop_token_ids` until the floor; `ignore_eos`
/// bans only the EOS ids the request does not list as its own stop tokens. A finished
/// grammar must end with a stop token, so the two exclude each other.
fn stop_floor(
    ext: &Extensions,
    max_new_tokens: Option<u32>,
    grammar: &Option<crate::grammar::GrammarRequest>,
    eos_ids: &[u32],
) -> Result<Option<StopFloor>, OpenAiError> {
    let min_new_tokens = ext.min_new_tokens;
    if min_new_tokens == 0 {
        return Ok(None);
    }
    let field = if min_new_tokens == u32::MAX {
        "ignore_eos"
    } else {
        "min_tokens"
    };
    if grammar.is_some() {
        return Err(OpenAiError::invalid(
            field,
            format!("`{field}` cannot be combined with structured output or tools: a finished grammar ends at EOS"),
        ));
    }
    if let Some(max) =
        max_new_tokens.filter(|&max| min_new_tokens != u32::MAX && min_new_tokens > max)
    {
        return Err(OpenAiError::invalid(
            "min_tokens",
            format!("`min_tokens` must be <= `max_tokens` ({max}). Given: {min_new_tokens}"),
        ));
    }
    let own = &ext.stop_token_ids;
    let mut stop_token_ids: Vec<u32> = eos_ids.to_vec();
    if min_new_tokens == u32::MAX {
        stop_token_ids.retain(|id| !own.contains(id));
    } else {
        for &id in own {
            if !stop_token_ids.contains(&id) {
                stop_token_ids.push(id);
            }
        }
    }
    Ok((!stop_token_ids.is_empty()).then_some(StopFloor {
        min_new_tokens,
        stop_token_ids,
    }))
}

fn sampling<'a>(
    fields: &'a SamplingFields,
    extension_fields: &ExtensionFields,
    structured: &'a StructuredFields,
    model: &'a ModelDefaults,
) -> Result<Sampling<'a>, OpenAiError> {
    Ok(Sampling {
        fields,
        extensions: extensions::check(extension_fields)?,
        structured,
        defaults: &model.generation,
        stop_token_ids: &model.stop_token_ids,
    })
}

fn choices(fields: &SamplingFields) -> Result<u32, OpenAiError> {
    let n = fields.n.unwrap_or(1);
    if n == 0 || n > MAX_CHOICES {
        return Err(OpenAiError::invalid(
            "n",
            format!("`n` must be >= 1 and <= {MAX_CHOICES}. Given: {n}"),
        ));
    }
    Ok(n)
}

fn streaming(fields: &SamplingFields) -> Result<(bool, bool), OpenAiError> {
    let stream = fields.stream.unwrap_or(false);
    match &fields.stream_options {
        Some(_) if !stream => Err(OpenAiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        )),
        Some(options) => Ok((stream, options.include_usage)),
        None => Ok((stream, false)),
    }
}

fn refuse_unsupported_chat_fields(request: &ChatCompletionRequest) -> Result<(), OpenAiError> {
    if request.echo == Some(true) {
        return Err(OpenAiError::unsupported(
            "echo",
            "chat answers never repeat the last message",
        ));
    }
    let text_only = request.modalities.as_ref().is_none_or(|m| {
        m.is_null()
            || m.as_array()
                .is_some_and(|a| a.iter().all(|v| v.as_str() == Some("text")))
    });
    if !text_only {
        return Err(OpenAiError::unsupported(
            "modalities",
            "the model produces text only",
        ));
    }
    let refused = [
        ("audio", &request.audio),
        ("prediction", &request.prediction),
        ("reasoning_effort", &request.reasoning_effort),
        ("verbosity", &request.verbosity),
        ("web_search_options", &request.web_search_options),
    ];
    match refused.iter().find(|(_, value)| is_set(value)) {
        Some((name, _)) => Err(OpenAiError::unsupported(name, "not implemented")),
        None => Ok(()),
    }
}

/// Sequences per prompt: `best_of` (at least `n`), `n` when unset.
fn runs(best_of: Option<u32>, n: u32, stream: bool) -> Result<u32, OpenAiError> {
    let runs = best_of.unwrap_or(n);
    if runs < n || runs > MAX_CHOICES {
        return Err(OpenAiError::invalid(
            "best_of",
            format!("`best_of` must be >= `n` and <= {MAX_CHOICES}. Given: {runs}"),
        ));
    }
    if runs > n && stream {
        return Err(OpenAiError::invalid(
            "best_of",
            "`best_of` > `n` cannot be streamed",
        ));
    }
    Ok(runs)
}

/// `chat_plan_with` for a request whose tool fields are checked here.
pub fn chat_plan(
    request: &ChatCompletionRequest,
    prompt: String,
    model: &ModelDefaults,
) -> Result<Plan, OpenAiError> {
    chat_plan_with(request, prompt, model, &tool_request(request)?)
}

pub fn chat_plan_with(
    request: &ChatCompletionRequest,
    prompt: String,
    model: &ModelDefaults,
    tool_request: &crate::tools::ToolRequest,
) -> Result<Plan, OpenAiError> {
    refuse_unsupported_chat_fields(request)?;
    let fields = request.sampling_fields();
    let n = choices(&fields)?;
    let (stream, include_usage) = streaming(&fields)?;
    let runs = runs(request.best_of, n, stream)?;
    let logprobs = request.logprobs.unwrap_or(false);
    let top = request.top_logprobs.unwrap_or(0);
    if top > MAX_TOP_LOGPROBS {
        return Err(OpenAiError::invalid(
            "top_logprobs",
            format!("`top_logprobs` must be >= 0 and <= {MAX_TOP_LOGPROBS}. Given: {top}"),
        ));
    }
    if top > 0 && !logprobs {
        return Err(OpenAiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        ));
    }
    let max_tokens = request.max_completion_tokens.or(request.max_tokens);
    let (extension_fields, structured) = (request.extension_fields(), request.structured_fields());
    let (parameters, mut extras) =
        sampling(&fields, &extension_fields, &structured, model)?.map(max_tokens, top)?;
    let (grammar, tools) =
        tools::constrain(tool_request, &model.tool_syntax, extras.grammar.take())?;
    extras.grammar = grammar;
    Ok(Plan {
        inputs: vec![GenerationInput {
            prompt: Prompt::Text {
                text: prompt,
                // The template writes the special tokens; vLLM's default is false too.
                add_special_tokens: request.add_special_tokens.unwrap_or(false),
            },
            parameters,
            extras,
        }],
        n,
        runs,
        seed: fields.seed.map(|s| s as u64),
        stream,
        include_usage,
        logprobs: logprobs.then_some(top),
        echo: false,
        tools,
        fields: FieldNames::chat(request.max_completion_tokens.is_some()),
    })
}

fn prompts(field: &PromptField, add_special_tokens: bool) -> Result<Vec<Prompt>, OpenAiError> {
    let text = |text: &String| Prompt::Text {
        text: text.clone(),
        add_special_tokens,
    };
    let prompts: Vec<Prompt> = match field {
        PromptField::Text(one) => vec![text(one)],
        PromptField::Texts(many) => many.iter().map(text).collect(),
        // `[]` parses as an empty token list: as empty as `""` or a batch of none.
        PromptField::Tokens(ids) if ids.is_empty() => vec![],
        PromptField::Tokens(ids) => vec![Prompt::Tokens(ids.clone())],
        PromptField::TokenLists(lists) => lists.iter().cloned().map(Prompt::Tokens).collect(),
    };
    if prompts.is_empty() {
        return Err(OpenAiError::invalid("prompt", "`prompt` must not be empty"));
    }
    Ok(prompts)
}

pub fn completion_plan(
    request: &CompletionRequest,
    model: &ModelDefaults,
) -> Result<Plan, OpenAiError> {
    if request.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(OpenAiError::unsupported(
            "suffix",
            "fill-in-the-middle is not implemented",
        ));
    }
    let fields = request.sampling_fields();
    let n = choices(&fields)?;
    let (stream, include_usage) = streaming(&fields)?;
    let runs = runs(request.best_of, n, stream)?;
    let logprobs = request.logprobs;
    let top = logprobs.unwrap_or(0);
    if top > MAX_COMPLETION_LOGPROBS {
        return Err(OpenAiError::invalid(
            "logprobs",
            format!("`logprobs` must be >= 0 and <= {MAX_COMPLETION_LOGPROBS}. Given: {top}"),
        ));
    }
    let echo = request.echo.unwrap_or(false);
    let max_tokens = request.max_tokens.unwrap_or(DEFAULT_COMPLETION_TOKENS);
    let (extension_fields, structured) = (request.extension_fields(), request.structured_fields());
    let (mut parameters, extras) =
        sampling(&fields, &extension_fields, &structured, model)?.map(Some(max_tokens), top)?;
    // Echoed prompts come with their own logprobs (not while streaming).
    parameters.decoder_input_details = echo && logprobs.is_some() && !stream;
    let prompts = prompts(&request.prompt, request.add_special_tokens.unwrap_or(true))?;
    if prompts.len() as u32 * runs > MAX_SEQUENCES {
        return Err(OpenAiError::invalid(
            "prompt",
            format!("at most {MAX_SEQUENCES} sequences per request (prompts × best_of)"),
        ));
    }
    Ok(Plan {
        inputs: prompts
            .into_iter()
            .map(|prompt| GenerationInput {
                prompt,
                parameters: parameters.clone(),
                extras: extras.clone(),
            })
            .collect(),
        n,
        runs,
        seed: fields.seed.map(|s| s as u64),
        stream,
        include_usage,
        logprobs,
        echo,
        tools: None,
        fields: FieldNames::COMPLETIONS,
    })
}

#[cfg(test)]
mod extension_tests;
#[cfg(test)]
mod tests;
