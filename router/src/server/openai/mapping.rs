//! OpenAI requests → textgen's generation inputs. Every OpenAI-only rule is checked here
//! (ranges OpenAI documents, fields refused until implemented); everything else goes
//! through the native validation, so both API surfaces enforce the same limits.
use crate::chat_template::{ChatTemplate, ChatTemplateError, TemplateMessage};
use crate::schema::GenerateParameters;
use crate::validation::{GenerationInput, Prompt, SamplingExtras};

use super::errors::OpenAiError;
use super::types::{
    ChatCompletionRequest, ChatMessage, CompletionRequest, MessageContent, PromptField,
    SamplingFields,
};

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

/// The request's fields that map onto TGI's parameters and the OpenAI extras.
fn sampling(
    fields: &SamplingFields,
    max_new_tokens: Option<u32>,
    top_n: u32,
) -> Result<(GenerateParameters, SamplingExtras), OpenAiError> {
    let temperature = fields.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(OpenAiError::invalid(
            "temperature",
            "`temperature` must be >= 0 and <= 2",
        ));
    }
    let top_p = fields.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(OpenAiError::invalid(
            "top_p",
            "`top_p` must be > 0 and <= 1",
        ));
    }
    let frequency_penalty = fields.frequency_penalty.unwrap_or(0.0);
    let greedy = temperature == 0.0;
    let parameters = GenerateParameters {
        // OpenAI samples unless temperature is 0.
        do_sample: !greedy,
        temperature: (!greedy && temperature != 1.0).then_some(temperature),
        top_p: (top_p < 1.0).then_some(top_p),
        frequency_penalty: (frequency_penalty != 0.0).then_some(frequency_penalty),
        max_new_tokens,
        stop: fields
            .stop
            .clone()
            .map(|s| s.into_vec())
            .unwrap_or_default(),
        top_n_tokens: (top_n > 0).then_some(top_n),
        ..GenerateParameters::default()
    };
    let logit_bias = fields
        .logit_bias
        .iter()
        .flatten()
        .map(|(token, &bias)| match token.parse::<u32>() {
            Ok(id) => Ok((id, bias)),
            Err(_) => Err(OpenAiError::invalid(
                "logit_bias",
                format!("`logit_bias` keys must be token ids, got {token:?}"),
            )),
        })
        .collect::<Result<_, _>>()?;
    let extras = SamplingExtras {
        presence_penalty: fields.presence_penalty,
        logit_bias,
        max_top_n_tokens: Some(MAX_TOP_LOGPROBS),
        grammar: None,
    };
    Ok((parameters, extras))
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

/// The template's view of one message; content parts must all be text.
fn template_message(index: usize, message: &ChatMessage) -> Result<TemplateMessage, OpenAiError> {
    let param = format!("messages[{index}]");
    let role = match message.role.as_str() {
        "system" | "developer" => "system",
        "user" | "assistant" | "tool" => message.role.as_str(),
        other => {
            return Err(OpenAiError::invalid(
                &param,
                format!(
                    "unknown role {other:?}: expected system, developer, user, assistant or tool"
                ),
            ))
        }
    };
    let content = match &message.content {
        None => None,
        Some(MessageContent::Text(text)) => Some(text.clone()),
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(piece)) if part.other.is_empty() => text.push_str(piece),
                    ("text", _) => {
                        return Err(OpenAiError::invalid(
                            &param,
                            "a text part needs exactly `type` and `text`",
                        ))
                    }
                    (kind, _) => {
                        return Err(OpenAiError::unsupported(
                            &param,
                            &format!("content parts of type {kind:?} (the model reads text only)"),
                        ))
                    }
                }
            }
            Some(text)
        }
    };
    if content.is_none() && !(role == "assistant" && is_set(&message.tool_calls)) {
        return Err(OpenAiError::invalid(&param, "`content` is required"));
    }
    Ok(TemplateMessage {
        role: role.to_owned(),
        content,
        name: message.name.clone(),
        tool_calls: message.tool_calls.clone(),
        tool_call_id: message.tool_call_id.clone(),
    })
}

/// Renders the conversation with the model's chat template.
pub fn render_chat(
    template: Result<&ChatTemplate, &ChatTemplateError>,
    messages: &[ChatMessage],
) -> Result<String, OpenAiError> {
    if messages.is_empty() {
        return Err(OpenAiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let template = template.map_err(|err| OpenAiError::invalid("messages", err.to_string()))?;
    template
        .render(&messages, true)
        .map_err(|err| OpenAiError::invalid("messages", format!("chat template error: {err}")))
}

fn refuse_unsupported_chat_fields(request: &ChatCompletionRequest) -> Result<(), OpenAiError> {
    let neutral_format = request
        .response_format
        .as_ref()
        .is_some_and(|f| f.get("type").and_then(|t| t.as_str()) == Some("text"));
    if is_set(&request.response_format) && !neutral_format {
        return Err(OpenAiError::unsupported(
            "response_format",
            "structured output is not implemented yet",
        ));
    }
    let no_tools = request
        .tools
        .as_ref()
        .is_none_or(|t| t.is_null() || t.as_array().is_some_and(Vec::is_empty));
    if !no_tools {
        return Err(OpenAiError::unsupported(
            "tools",
            "tool calling is not implemented yet",
        ));
    }
    let choice_none = request
        .tool_choice
        .as_ref()
        .is_none_or(|c| c.is_null() || c.as_str() == Some("none"));
    if !choice_none {
        return Err(OpenAiError::unsupported(
            "tool_choice",
            "tool calling is not implemented yet",
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
        ("functions", &request.functions),
        ("function_call", &request.function_call),
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

pub fn chat_plan(request: &ChatCompletionRequest, prompt: String) -> Result<Plan, OpenAiError> {
    refuse_unsupported_chat_fields(request)?;
    let fields = request.sampling_fields();
    let n = choices(&fields)?;
    let (stream, include_usage) = streaming(&fields)?;
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
    let (parameters, extras) = sampling(&fields, max_tokens, top)?;
    Ok(Plan {
        inputs: vec![GenerationInput {
            prompt: Prompt::Text {
                text: prompt,
                add_special_tokens: false,
            },
            parameters,
            extras,
        }],
        n,
        runs: n,
        seed: fields.seed.map(|s| s as u64),
        stream,
        include_usage,
        logprobs: logprobs.then_some(top),
        echo: false,
    })
}

fn prompts(field: &PromptField) -> Result<Vec<Prompt>, OpenAiError> {
    let text = |text: &String| Prompt::Text {
        text: text.clone(),
        add_special_tokens: true,
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

pub fn completion_plan(request: &CompletionRequest) -> Result<Plan, OpenAiError> {
    if request.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(OpenAiError::unsupported(
            "suffix",
            "fill-in-the-middle is not implemented",
        ));
    }
    let fields = request.sampling_fields();
    let n = choices(&fields)?;
    let (stream, include_usage) = streaming(&fields)?;
    let runs = request.best_of.unwrap_or(n);
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
    let (mut parameters, extras) = sampling(&fields, Some(max_tokens), top)?;
    // Echoed prompts come with their own logprobs (not while streaming).
    parameters.decoder_input_details = echo && logprobs.is_some() && !stream;
    let prompts = prompts(&request.prompt)?;
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(json: &str) -> Result<Plan, OpenAiError> {
        let request: ChatCompletionRequest = serde_json::from_str(json).expect("parses");
        chat_plan(&request, "prompt".into())
    }

    fn completion(json: &str) -> Result<Plan, OpenAiError> {
        let request: CompletionRequest = serde_json::from_str(json).expect("parses");
        completion_plan(&request)
    }

    const USER: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

    #[test]
    fn openai_defaults_sample_and_temperature_zero_is_greedy() {
        let default = chat(&format!("{{{USER}}}")).unwrap();
        let p = &default.inputs[0].parameters;
        assert!(p.do_sample && p.temperature.is_none() && p.top_p.is_none());
        assert_eq!(p.max_new_tokens, None);
        let greedy = chat(&format!(r#"{{{USER},"temperature":0,"top_p":1}}"#)).unwrap();
        let p = &greedy.inputs[0].parameters;
        assert!(!p.do_sample && p.temperature.is_none() && p.top_p.is_none());
        let warm = chat(&format!(r#"{{{USER},"temperature":0.7,"top_p":0.9}}"#)).unwrap();
        let p = &warm.inputs[0].parameters;
        assert_eq!((p.temperature, p.top_p), (Some(0.7), Some(0.9)));
    }

    #[test]
    fn chat_fields_map_onto_native_parameters_and_extras() {
        let plan = chat(&format!(
            r#"{{{USER},"max_tokens":5,"max_completion_tokens":7,"stop":"x","presence_penalty":0.5,
                "frequency_penalty":-0.5,"logit_bias":{{"3":-100,"9":2.5}},"logprobs":true,
                "top_logprobs":20,"n":2,"seed":-1}}"#
        ))
        .unwrap();
        let input = &plan.inputs[0];
        assert_eq!(
            input.parameters.max_new_tokens,
            Some(7),
            "max_completion_tokens wins"
        );
        assert_eq!(input.parameters.stop, vec!["x"]);
        assert_eq!(input.parameters.frequency_penalty, Some(-0.5));
        assert_eq!(input.parameters.top_n_tokens, Some(20));
        assert_eq!(input.extras.presence_penalty, Some(0.5));
        assert_eq!(input.extras.logit_bias, vec![(3, -100.0), (9, 2.5)]);
        assert_eq!(input.extras.max_top_n_tokens, Some(MAX_TOP_LOGPROBS));
        assert_eq!(
            input.prompt,
            Prompt::Text {
                text: "prompt".into(),
                add_special_tokens: false
            }
        );
        assert_eq!((plan.n, plan.runs, plan.logprobs), (2, 2, Some(20)));
        assert_eq!(plan.seed, Some(u64::MAX));
        assert_eq!(plan.seed_of(7, 0), u64::MAX);
        assert_eq!(plan.seed_of(7, 1), 0, "seeds wrap around");
    }

    #[test]
    fn unseeded_choices_get_the_drawn_seed_then_fresh_ones() {
        let plan = chat(&format!(r#"{{{USER},"n":3}}"#)).unwrap();
        assert_eq!(plan.seed_of(42, 0), 42);
        assert_ne!(plan.seed_of(42, 1), plan.seed_of(42, 2));
    }

    #[test]
    fn completion_defaults_and_echo_logprobs() {
        let plan = completion(r#"{"prompt":"hi"}"#).unwrap();
        let p = &plan.inputs[0].parameters;
        assert_eq!(p.max_new_tokens, Some(DEFAULT_COMPLETION_TOKENS));
        assert!(!p.decoder_input_details);
        let echo =
            completion(r#"{"prompt":[[1,2],[3]],"echo":true,"logprobs":0,"best_of":3,"n":2}"#)
                .unwrap();
        assert_eq!(echo.inputs.len(), 2);
        assert_eq!(echo.inputs[1].prompt, Prompt::Tokens(vec![3]));
        assert!(echo.inputs[0].parameters.decoder_input_details);
        assert!(
            echo.inputs[0].parameters.best_of.is_none(),
            "best_of is handled here, not natively"
        );
        assert_eq!((echo.n, echo.runs), (2, 3));
        let streamed =
            completion(r#"{"prompt":"hi","echo":true,"logprobs":1,"stream":true}"#).unwrap();
        assert!(!streamed.inputs[0].parameters.decoder_input_details);
    }

    #[test]
    fn rule_violations_name_their_field() {
        let param = |result: Result<Plan, OpenAiError>| result.unwrap_err().param.unwrap();
        assert_eq!(param(chat(&format!(r#"{{{USER},"n":17}}"#))), "n");
        assert_eq!(
            param(chat(&format!(r#"{{{USER},"temperature":2.5}}"#))),
            "temperature"
        );
        assert_eq!(
            param(chat(&format!(r#"{{{USER},"logit_bias":{{"x":1}}}}"#))),
            "logit_bias"
        );
        assert_eq!(
            param(chat(&format!(r#"{{{USER},"tools":[{{}}]}}"#))),
            "tools"
        );
        assert_eq!(param(chat(&format!(r#"{{{USER},"audio":{{}}}}"#))), "audio");
        assert_eq!(
            param(completion(r#"{"prompt":"hi","best_of":17}"#)),
            "best_of"
        );
        assert_eq!(
            param(completion(r#"{"prompt":"hi","suffix":"s"}"#)),
            "suffix"
        );
        assert_eq!(param(completion(r#"{"prompt":[]}"#)), "prompt");
    }

    #[test]
    fn messages_map_roles_and_join_text_parts() {
        let template = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}".into(),
            None,
            None,
        )
        .unwrap();
        let messages: Vec<ChatMessage> = serde_json::from_str(
            r#"[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},
                {"role":"tool","content":"42","tool_call_id":"1"}]"#,
        )
        .unwrap();
        assert_eq!(
            render_chat(Ok(&template), &messages).unwrap(),
            // Python's rendering of None, as transformers would produce.
            "system:be brief;user:ab;assistant:None;tool:42;"
        );
        let missing = render_chat(Err(&ChatTemplateError::Missing), &messages).unwrap_err();
        assert!(
            missing.message.contains("no chat template"),
            "{}",
            missing.message
        );
    }
}
