//! TGI's and vLLM's extension fields and the output-constraint shapes, field by field:
//! `null` is unset, the meaning is applied, unimplemented values are refused by name.
use serde_json::json;

use super::*;
use crate::grammar::GrammarRequest;

fn model() -> ModelDefaults {
    ModelDefaults {
        generation: GenerationDefaults::default(),
        stop_token_ids: vec![2, 7],
        ..ModelDefaults::default()
    }
}

/// A chat request of `extra` merged onto one user message.
fn chat_with(extra: serde_json::Value, model: &ModelDefaults) -> Result<Plan, OpenAiError> {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let request: ChatCompletionRequest = serde_json::from_value(body).expect("parses");
    chat_plan(&request, "prompt".into(), model)
}

fn chat(extra: serde_json::Value) -> Result<Plan, OpenAiError> {
    chat_with(extra, &model())
}

fn completion(extra: serde_json::Value) -> Result<Plan, OpenAiError> {
    let mut body = json!({"prompt": "hi"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let request: CompletionRequest = serde_json::from_value(body).expect("parses");
    completion_plan(&request, &model())
}

fn params(plan: Result<Plan, OpenAiError>) -> GenerateParameters {
    plan.unwrap().inputs[0].parameters.clone()
}

fn grammar(plan: Result<Plan, OpenAiError>) -> Option<GrammarRequest> {
    plan.unwrap().inputs[0].extras.grammar.clone()
}

/// The `param` of the refusal, and whether it is "unsupported" (vs out of range).
fn refused(plan: Result<Plan, OpenAiError>) -> (String, bool) {
    let err = plan.expect_err("refused");
    assert_eq!(err.status, 400);
    (
        err.param.unwrap(),
        err.code == Some("unsupported_parameter"),
    )
}

#[test]
fn tgi_python_client_body_is_accepted_with_its_nulls() {
    // What text_generation's Client.chat() sends (request.dict()).
    let body = json!({"model": "tgi", "messages": [{"role": "user", "content": "hi",
        "name": null, "tool_calls": null}], "repetition_penalty": 1.3,
        "frequency_penalty": null, "logit_bias": null, "logprobs": null, "top_logprobs": null,
        "max_tokens": 4, "n": null, "presence_penalty": null, "stream": false, "seed": null,
        "temperature": null, "top_p": null, "tools": null, "tool_prompt": null,
        "tool_choice": null, "stop": null});
    let request: ChatCompletionRequest = serde_json::from_value(body).unwrap();
    let plan = chat_plan(&request, "p".into(), &model()).unwrap();
    let p = &plan.inputs[0].parameters;
    assert_eq!(p.repetition_penalty, Some(1.3));
    assert_eq!(p.max_new_tokens, Some(4));
    assert!(p.do_sample);
    assert_eq!(
        refused(chat(json!({"logit_bias": [0.5]}))),
        ("logit_bias".into(), true)
    );
    assert!(chat(json!({"logit_bias": []})).unwrap().inputs[0]
        .extras
        .logit_bias
        .is_empty());
}

#[test]
fn every_extension_sent_as_null_is_unset() {
    let fields = [
        "top_k",
        "min_p",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "use_beam_search",
        "length_penalty",
        "early_stopping",
        "truncate_prompt_tokens",
        "truncation_side",
        "prompt_logprobs",
        "add_special_tokens",
        "watermarking",
        "priority",
        "request_id",
        "session_id",
        "logits_processors",
        "bad_words",
        "allowed_token_ids",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "cache_salt",
        "vllm_xargs",
        "kv_transfer_params",
        "logprob_token_ids",
        "repetition_detection",
        "thinking_token_budget",
        "stream_interval",
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "tool_prompt",
        "best_of",
        "add_generation_prompt",
        "continue_final_message",
        "echo",
        "documents",
        "chat_template",
        "chat_template_kwargs",
        "include_reasoning",
    ];
    let nulls = serde_json::Value::Object(
        fields
            .iter()
            .map(|f| (f.to_string(), serde_json::Value::Null))
            .collect(),
    );
    let plan = chat(nulls.clone()).unwrap();
    let bare = chat(json!({})).unwrap();
    assert_eq!(format!("{:?}", plan.inputs), format!("{:?}", bare.inputs));
    let mut completion_nulls = nulls.as_object().unwrap().clone();
    for chat_only in [
        "tool_prompt",
        "add_generation_prompt",
        "continue_final_message",
        "documents",
        "chat_template",
        "chat_template_kwargs",
        "include_reasoning",
    ] {
        completion_nulls.remove(chat_only);
    }
    completion(serde_json::Value::Object(completion_nulls)).unwrap();
}

#[test]
fn neutral_values_are_accepted() {
    let neutral = json!({"top_k": -1, "min_p": 0, "repetition_penalty": 1, "min_tokens": 0,
        "ignore_eos": false, "stop_token_ids": [2, 7], "skip_special_tokens": true,
        "spaces_between_special_tokens": false, "include_stop_str_in_output": false,
        "use_beam_search": false, "length_penalty": 0.5, "early_stopping": true,
        "truncation_side": "left", "priority": 0, "request_id": "r-1", "session_id": "s",
        "logits_processors": [], "bad_words": [], "allowed_token_ids": [],
        "return_tokens_as_token_ids": false, "return_token_ids": false, "vllm_xargs": {},
        "thinking_token_budget": -1, "stream_interval": 4, "guided_decoding_backend": "xgrammar",
        "tool_prompt": "use tools", "add_generation_prompt": true, "echo": false,
        "documents": [], "chat_template_kwargs": {}, "include_reasoning": true,
        "response_format": {"type": "text"}});
    let p = params(chat(neutral));
    assert_eq!((p.top_k, p.repetition_penalty), (None, None));
}

#[test]
fn sampling_extensions_map_onto_tgi_parameters() {
    let p = params(chat(json!({"top_k": 40, "repetition_penalty": 1.2,
        "truncate_prompt_tokens": 100, "watermarking": true})));
    assert_eq!(p.top_k, Some(40));
    assert_eq!(p.repetition_penalty, Some(1.2));
    assert_eq!(p.truncate, Some(100));
    assert!(p.watermark && p.do_sample);
    // Greedy ignores the warpers: none reaches the native parameters.
    let greedy = params(chat(json!({"temperature": 0, "top_k": 5, "top_p": 0.5})));
    assert!(!greedy.do_sample && greedy.top_k.is_none() && greedy.top_p.is_none());
    let c = params(completion(json!({"top_k": 3, "repetition_penalty": 0.9})));
    assert_eq!((c.top_k, c.repetition_penalty), (Some(3), Some(0.9)));
}

#[test]
fn add_special_tokens_and_best_of_apply_to_chat() {
    let plan = chat(json!({"add_special_tokens": true, "n": 2, "best_of": 3})).unwrap();
    assert_eq!(
        plan.inputs[0].prompt,
        Prompt::Text {
            text: "prompt".into(),
            add_special_tokens: true
        }
    );
    assert_eq!((plan.n, plan.runs), (2, 3));
    assert_eq!(refused(chat(json!({"n": 2, "best_of": 1}))).0, "best_of");
    assert_eq!(
        refused(chat(json!({"best_of": 2, "stream": true}))).0,
        "best_of"
    );
    let raw = completion(json!({"add_special_tokens": false})).unwrap();
    assert_eq!(
        raw.inputs[0].prompt,
        Prompt::Text {
            text: "hi".into(),
            add_special_tokens: false
        }
    );
}

#[test]
fn ranges_are_checked_in_f32() {
    // Finite in f64, infinite in f32.
    for field in [
        "temperature",
        "top_p",
        "repetition_penalty",
        "min_p",
        "length_penalty",
        "frequency_penalty",
        "presence_penalty",
    ] {
        let err = chat(json!({field: 1e39}));
        assert!(err.is_err(), "{field}");
    }
    for (body, field) in [
        (json!({"top_k": -2}), "top_k"),
        (json!({"top_k": 1_i64 << 40}), "top_k"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"repetition_penalty": -1}), "repetition_penalty"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"min_p": -0.01}), "min_p"),
        (
            json!({"truncate_prompt_tokens": 0}),
            "truncate_prompt_tokens",
        ),
        (
            json!({"truncate_prompt_tokens": -5}),
            "truncate_prompt_tokens",
        ),
        (json!({"truncation_side": "middle"}), "truncation_side"),
        (json!({"prompt_logprobs": -3}), "prompt_logprobs"),
    ] {
        assert_eq!(
            refused(chat(body.clone())),
            (field.to_owned(), false),
            "{body}"
        );
    }
}

#[test]
fn the_empty_only_fields_take_empty_values_and_refuse_the_rest_by_name() {
    // The list the OpenAPI document is written from (docs.rs) is the list enforced here.
    for field in EMPTY_ONLY_FIELDS {
        for empty in [json!(null), json!([]), json!({})] {
            assert!(chat(json!({ field: empty })).is_ok(), "{field}: {empty}");
        }
        for filled in [json!([1]), json!({"a": 1}), json!("x"), json!(3)] {
            assert_eq!(
                refused(chat(json!({ field: filled }))),
                (field.to_owned(), true)
            );
        }
    }
    assert!(chat(json!({"thinking_token_budget": -1})).is_ok());
}

#[test]
fn unimplemented_values_are_refused_by_name() {
    for (body, field) in [
        (json!({"use_beam_search": true}), "use_beam_search"),
        (
            json!({"truncate_prompt_tokens": -1}),
            "truncate_prompt_tokens",
        ),
        (json!({"truncation_side": "right"}), "truncation_side"),
        (json!({"prompt_logprobs": 1}), "prompt_logprobs"),
        (json!({"priority": 5}), "priority"),
        (json!({"logits_processors": ["x"]}), "logits_processors"),
        (json!({"bad_words": ["bad"]}), "bad_words"),
        (json!({"allowed_token_ids": [1]}), "allowed_token_ids"),
        (
            json!({"return_tokens_as_token_ids": true}),
            "return_tokens_as_token_ids",
        ),
        (json!({"return_token_ids": true}), "return_token_ids"),
        (json!({"cache_salt": "salt"}), "cache_salt"),
        (json!({"vllm_xargs": {"a": 1}}), "vllm_xargs"),
        (
            json!({"kv_transfer_params": {"a": 1}}),
            "kv_transfer_params",
        ),
        (
            json!({"thinking_token_budget": 10}),
            "thinking_token_budget",
        ),
        (json!({"echo": true}), "echo"),
        (
            json!({"guided_whitespace_pattern": " "}),
            "guided_whitespace_pattern",
        ),
    ] {
        assert_eq!(
            refused(chat(body.clone())),
            (field.to_owned(), true),
            "{body}"
        );
    }
}

#[test]
fn min_tokens_and_ignore_eos_hold_the_models_stop_tokens_back() {
    let floor = |plan: Result<Plan, OpenAiError>| plan.unwrap().inputs[0].extras.stop_floor.clone();
    let held = |min| {
        Some(StopFloor {
            min_new_tokens: min,
            stop_token_ids: vec![2, 7],
        })
    };
    assert_eq!(
        floor(chat(json!({"min_tokens": 3, "max_tokens": 8}))),
        held(3)
    );
    assert_eq!(floor(completion(json!({"min_tokens": 1}))), held(1));
    assert_eq!(floor(chat(json!({"ignore_eos": true}))), held(u32::MAX));
    assert_eq!(
        floor(chat(json!({"min_tokens": 0, "ignore_eos": false}))),
        None
    );
    // More than max_tokens, or beside a grammar that must end at EOS: a 400 naming the field.
    let too_many = json!({"min_tokens": 9, "max_tokens": 8});
    assert_eq!(refused(chat(too_many)), ("min_tokens".into(), false));
    let json_mode = json!({"ignore_eos": true, "response_format": {"type": "json_object"}});
    assert_eq!(refused(chat(json_mode)), ("ignore_eos".into(), false));
    let guided = json!({"min_tokens": 2, "guided_regex": "a+"});
    assert_eq!(refused(completion(guided)), ("min_tokens".into(), false));
}

#[test]
fn min_p_reaches_the_sampler_only_when_sampling() {
    let min_p = |plan: Result<Plan, OpenAiError>| plan.unwrap().inputs[0].extras.min_p;
    assert_eq!(min_p(chat(json!({"min_p": 0.1}))), Some(0.1));
    assert_eq!(min_p(completion(json!({"min_p": 1}))), Some(1.0));
    assert_eq!(min_p(chat(json!({"min_p": 0}))), None);
    assert_eq!(min_p(chat(json!({}))), None);
    // Greedy ignores it, as it ignores top_k and top_p.
    assert_eq!(min_p(chat(json!({"min_p": 0.5, "temperature": 0}))), None);
    // generation_config.json's min_p is a default, like vLLM's; the request's own wins.
    let model = ModelDefaults {
        generation: GenerationDefaults {
            min_p: Some(0.05),
            ..GenerationDefaults::default()
        },
        ..model()
    };
    assert_eq!(min_p(chat_with(json!({}), &model)), Some(0.05));
    assert_eq!(min_p(chat_with(json!({"min_p": 0.3}), &model)), Some(0.3));
}

#[test]
fn output_extensions_reach_the_request() {
    let extras = |plan: Result<Plan, OpenAiError>| plan.unwrap().inputs[0].extras.clone();
    let plain = extras(chat(json!({})));
    assert!(plain.stop_token_ids.is_empty());
    assert!(!plain.keep_special_tokens && !plain.include_stop_str_in_output);
    let set = extras(completion(json!({"stop_token_ids": [5, 2, 9],
        "skip_special_tokens": false, "include_stop_str_in_output": true})));
    assert_eq!(set.stop_token_ids, vec![5, 2, 9]);
    assert!(set.keep_special_tokens && set.include_stop_str_in_output);
    // Neutral values stay neutral.
    let neutral = extras(chat(
        json!({"stop_token_ids": [], "skip_special_tokens": true,
        "include_stop_str_in_output": false}),
    ));
    assert_eq!(neutral, plain);
}

#[test]
fn wrong_types_fail_to_parse_naming_the_field() {
    let user = json!([{"role": "user", "content": "hi"}]);
    for (field, value) in [
        ("min_p", json!("high")),
        ("min_p", json!([0.1])),
        ("stop_token_ids", json!([1, -2])),
        ("stop_token_ids", json!(7)),
        ("stop_token_ids", json!(["a"])),
        ("stop_token_ids", json!([1.5])),
        ("skip_special_tokens", json!("no")),
        ("include_stop_str_in_output", json!(1)),
    ] {
        let body = json!({"messages": user, field: value});
        let err = serde_json::from_value::<ChatCompletionRequest>(body).unwrap_err();
        assert!(
            err.to_string().contains(&format!("`{field}`")),
            "{field}: {err}"
        );
        let body = json!({"prompt": "hi", field: value});
        assert!(
            serde_json::from_value::<CompletionRequest>(body).is_err(),
            "{field}"
        );
    }
}

#[test]
fn min_tokens_holds_the_requests_stop_tokens_back_and_ignore_eos_does_not() {
    let floor = |plan: Result<Plan, OpenAiError>| plan.unwrap().inputs[0].extras.stop_floor.clone();
    let held = |min, ids: &[u32]| {
        Some(StopFloor {
            min_new_tokens: min,
            stop_token_ids: ids.to_vec(),
        })
    };
    let min_tokens = json!({"min_tokens": 3, "stop_token_ids": [9, 7, 9, 11]});
    assert_eq!(floor(chat(min_tokens)), held(3, &[2, 7, 9, 11]));
    // vLLM's ignore_eos lets EOS through but still stops on the request's own stop tokens,
    // an EOS id among them included.
    let ignore = json!({"ignore_eos": true, "stop_token_ids": [7, 9]});
    assert_eq!(floor(completion(ignore)), held(u32::MAX, &[2]));
    assert_eq!(
        floor(chat(json!({"ignore_eos": true, "stop_token_ids": [2, 7]}))),
        None
    );
    assert_eq!(floor(chat(json!({"stop_token_ids": [9]}))), None);
}

#[test]
fn generation_config_fills_only_what_the_request_left_unset() {
    let model = ModelDefaults {
        generation: GenerationDefaults {
            temperature: Some(0.6),
            top_p: Some(0.9),
            top_k: Some(20),
            repetition_penalty: Some(1.1),
            min_p: None,
        },
        stop_token_ids: vec![2],
        ..ModelDefaults::default()
    };
    let p = params(chat_with(json!({}), &model));
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.repetition_penalty),
        (Some(0.6), Some(0.9), Some(20), Some(1.1))
    );
    let own = params(chat_with(
        json!({"temperature": 1.0, "top_p": 1.0, "top_k": -1,
        "repetition_penalty": 1.0}),
        &model,
    ));
    assert_eq!(
        (
            own.temperature,
            own.top_p,
            own.top_k,
            own.repetition_penalty
        ),
        (None, None, None, None),
        "the request's own neutral values win"
    );
    let greedy = params(chat_with(json!({"temperature": 0}), &model));
    assert!(!greedy.do_sample && greedy.top_k.is_none());
    assert_eq!(greedy.repetition_penalty, Some(1.1));
    let request: CompletionRequest = serde_json::from_value(json!({"prompt": "x"})).unwrap();
    let c = &completion_plan(&request, &model).unwrap().inputs[0].parameters;
    assert_eq!(c.temperature, Some(0.6));
}

#[test]
fn response_format_shapes() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
    assert_eq!(
        grammar(chat(json!({"response_format": {"type": "text"}}))),
        None
    );
    assert_eq!(
        grammar(chat(json!({"response_format": {"type": "json_object"}}))),
        Some(GrammarRequest::JsonObject)
    );
    let openai = json!({"response_format": {"type": "json_schema", "json_schema":
        {"name": "a", "schema": schema, "strict": true, "description": "d"}}});
    assert_eq!(
        grammar(chat(openai)),
        Some(GrammarRequest::JsonSchema(schema.clone()))
    );
    let no_schema =
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}});
    assert_eq!(grammar(chat(no_schema)), Some(GrammarRequest::JsonObject));
    // TGI's shapes, and huggingface_hub's `json_object` + `value` rewrite.
    for tgi in [
        json!({"type": "json", "value": schema}),
        json!({"type": "json_object", "value": schema}),
        json!({"type": "json_schema", "value": {"name": "n", "schema": schema}}),
        json!({"type": "json", "value": schema.to_string()}),
    ] {
        assert_eq!(
            grammar(completion(json!({"response_format": tgi}))),
            Some(GrammarRequest::JsonSchema(schema.clone()))
        );
    }
    assert_eq!(
        grammar(chat(
            json!({"response_format": {"type": "regex", "value": "[a-z]+"}})
        )),
        Some(GrammarRequest::Regex("[a-z]+".into()))
    );
}

#[test]
fn malformed_response_formats_name_the_field() {
    for (format, param) in [
        (json!("json"), "response_format"),
        (json!({"value": {}}), "response_format"),
        (json!({"type": "yaml"}), "response_format"),
        (json!({"type": "text", "extra": 1}), "response_format.extra"),
        (
            json!({"type": "json_schema"}),
            "response_format.json_schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            "response_format.json_schema.name",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": "{bad"}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}}),
            "response_format.json_schema.strict",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "a"}, "value": {}}),
            "response_format",
        ),
        (
            json!({"type": "json_schema", "value": {"name": "a"}}),
            "response_format.value.schema",
        ),
        (json!({"type": "json"}), "response_format.value"),
        (
            json!({"type": "regex", "value": 5}),
            "response_format.value",
        ),
    ] {
        assert_eq!(
            refused(chat(json!({"response_format": format.clone()}))).0,
            param,
            "{format}"
        );
    }
    let tag = json!({"response_format": {"type": "structural_tag"}});
    assert_eq!(refused(chat(tag)), ("response_format".into(), true));
}

#[test]
fn vllm_structured_outputs_and_guided_fields() {
    let schema = json!({"type": "object"});
    for (body, expected) in [
        (
            json!({"structured_outputs": {"json": schema}}),
            GrammarRequest::JsonSchema(schema.clone()),
        ),
        (
            json!({"structured_outputs": {"json": "{\"type\": \"object\"}"}}),
            GrammarRequest::JsonSchema(schema.clone()),
        ),
        (
            json!({"structured_outputs": {"regex": "a+"}}),
            GrammarRequest::Regex("a+".into()),
        ),
        (
            json!({"structured_outputs": {"choice": ["x", "y"]}}),
            GrammarRequest::Choice(vec!["x".into(), "y".into()]),
        ),
        (
            json!({"structured_outputs": {"grammar": "start: \"a\""}}),
            GrammarRequest::Lark("start: \"a\"".into()),
        ),
        (
            json!({"structured_outputs": {"json_object": true, "disable_any_whitespace": true}}),
            GrammarRequest::JsonObject,
        ),
        (
            json!({"guided_json": schema}),
            GrammarRequest::JsonSchema(schema.clone()),
        ),
        (
            json!({"guided_json": "{\"type\": \"object\"}"}),
            GrammarRequest::JsonSchema(schema.clone()),
        ),
        (
            json!({"guided_regex": "b"}),
            GrammarRequest::Regex("b".into()),
        ),
        (
            json!({"guided_choice": ["p", "n"]}),
            GrammarRequest::Choice(vec!["p".into(), "n".into()]),
        ),
        (
            json!({"guided_grammar": "g"}),
            GrammarRequest::Lark("g".into()),
        ),
    ] {
        assert_eq!(
            grammar(chat(body.clone())),
            Some(expected.clone()),
            "{body}"
        );
        assert_eq!(grammar(completion(body.clone())), Some(expected), "{body}");
    }
    assert_eq!(
        grammar(chat(json!({"structured_outputs": {"json_object": false}}))),
        None
    );
}

#[test]
fn bad_constraints_and_two_constraints_are_400s_naming_them() {
    for (body, param, unsupported) in [
        (json!({"guided_json": "{not json"}), "guided_json", false),
        (json!({"guided_json": [1]}), "guided_json", false),
        (json!({"guided_choice": []}), "guided_choice", false),
        (
            json!({"structured_outputs": "json"}),
            "structured_outputs",
            false,
        ),
        (
            json!({"structured_outputs": {"jsn": {}}}),
            "structured_outputs.jsn",
            false,
        ),
        (
            json!({"structured_outputs": {"choice": [1]}}),
            "structured_outputs.choice",
            false,
        ),
        (
            json!({"structured_outputs": {"regex": 1}}),
            "structured_outputs.regex",
            false,
        ),
        (
            json!({"structured_outputs": {"json": "{x"}}),
            "structured_outputs.json",
            false,
        ),
        (
            json!({"structured_outputs": {"json_object": 1}}),
            "structured_outputs.json_object",
            false,
        ),
        (
            json!({"structured_outputs": {"structural_tag": "t"}}),
            "structured_outputs.structural_tag",
            true,
        ),
        (
            json!({"structured_outputs": {"whitespace_pattern": " "}}),
            "structured_outputs.whitespace_pattern",
            true,
        ),
        (
            json!({"structured_outputs": {"disable_additional_properties": true}}),
            "structured_outputs.disable_additional_properties",
            true,
        ),
    ] {
        assert_eq!(
            refused(chat(body.clone())),
            (param.to_owned(), unsupported),
            "{body}"
        );
    }
    let two = chat(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}));
    let err = two.unwrap_err();
    assert_eq!(err.param.as_deref(), Some("guided_regex"));
    assert!(err.message.contains("`response_format`") && err.message.contains("`guided_regex`"));
    let inner = chat(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})).unwrap_err();
    assert!(
        inner.message.contains("structured_outputs.regex"),
        "{}",
        inner.message
    );
}
