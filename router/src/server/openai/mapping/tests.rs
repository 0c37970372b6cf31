//! The mapping of OpenAI requests, field by field.
use super::*;
use crate::chat_template::{ChatTemplate, ChatTemplateError};
use crate::server::openai::types::ChatMessage;

fn chat(json: &str) -> Result<Plan, OpenAiError> {
    let request: ChatCompletionRequest = serde_json::from_str(json).expect("parses");
    chat_plan(&request, "prompt".into(), &ModelDefaults::default())
}

fn completion(json: &str) -> Result<Plan, OpenAiError> {
    let request: CompletionRequest = serde_json::from_str(json).expect("parses");
    completion_plan(&request, &ModelDefaults::default())
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
        completion(r#"{"prompt":[[1,2],[3]],"echo":true,"logprobs":0,"best_of":3,"n":2}"#).unwrap();
    assert_eq!(echo.inputs.len(), 2);
    assert_eq!(echo.inputs[1].prompt, Prompt::Tokens(vec![3]));
    assert!(echo.inputs[0].parameters.decoder_input_details);
    assert!(
        echo.inputs[0].parameters.best_of.is_none(),
        "best_of is handled here, not natively"
    );
    assert_eq!((echo.n, echo.runs), (2, 3));
    let streamed = completion(r#"{"prompt":"hi","echo":true,"logprobs":1,"stream":true}"#).unwrap();
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
        "tools[0].type"
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
            {"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},
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
