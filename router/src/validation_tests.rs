use super::*;
use crate::schema::GenerateRequest;
use crate::test_support::byte_level_tokenizer;

const LIMITS: ValidationLimits = ValidationLimits {
    max_best_of: 2,
    max_stop_sequences: 4,
    max_top_n_tokens: 5,
    max_input_tokens: 10,
    max_total_tokens: 16,
    vocab_size: 300,
    watermark: crate::validation::WatermarkSettings {
        gamma: 0.5,
        delta: 2.0,
    },
};

fn params(json: &str) -> GenerateParameters {
    serde_json::from_str(json).expect("parameters parse")
}

fn check(json: &str) -> Result<CheckedParameters, ValidationError> {
    check_parameters(&params(json), false, &LIMITS)
}

fn check_streaming(json: &str) -> Result<CheckedParameters, ValidationError> {
    check_parameters(&params(json), true, &LIMITS)
}

#[test]
fn defaults_are_greedy_and_neutral() {
    let p = check("{}").unwrap();
    assert!(!p.sampling.do_sample);
    // Unset on the wire (proto3 `optional`): the shard takes 1.0 and checks nothing.
    assert_eq!(p.sampling.temperature, None);
    assert_eq!(p.sampling.top_p, None);
    assert_eq!(p.sampling.top_k, 0);
    assert_eq!(p.best_of, 1);
    assert!(!p.return_full_text);
}

#[test]
fn omitted_parameters_object_samples_but_empty_one_does_not() {
    let omitted: GenerateRequest = serde_json::from_str(r#"{"inputs":"x"}"#).unwrap();
    assert!(omitted.parameters.do_sample);
    let empty: GenerateRequest = serde_json::from_str(r#"{"inputs":"x","parameters":{}}"#).unwrap();
    assert!(!empty.parameters.do_sample);
}

#[test]
fn any_warper_turns_sampling_on() {
    for json in [
        r#"{"temperature":0.5}"#,
        r#"{"top_k":3}"#,
        r#"{"top_p":0.9}"#,
        r#"{"typical_p":0.9}"#,
        r#"{"do_sample":true}"#,
    ] {
        assert!(check(json).unwrap().sampling.do_sample, "{json}");
    }
    assert!(
        !check(r#"{"repetition_penalty":1.2}"#)
            .unwrap()
            .sampling
            .do_sample
    );
}

#[test]
fn range_rules() {
    use ValidationError::*;
    let cases: &[(&str, ValidationError)] = &[
        (r#"{"temperature":0}"#, Temperature),
        (r#"{"temperature":-1}"#, Temperature),
        // Finite in f64, infinite in f32 (the shard's precision): defect 1 of issue 27.
        (r#"{"temperature":1e308}"#, Temperature),
        (r#"{"temperature":3.5e38}"#, Temperature),
        (r#"{"repetition_penalty":1e39}"#, RepetitionPenalty),
        (r#"{"repetition_penalty":0}"#, RepetitionPenalty),
        (r#"{"frequency_penalty":2.5}"#, FrequencyPenalty),
        (r#"{"frequency_penalty":-2.01}"#, FrequencyPenalty),
        (r#"{"top_k":0}"#, TopK),
        (r#"{"top_k":-3}"#, TopK),
        (r#"{"top_p":1.0}"#, TopP),
        (r#"{"top_p":0}"#, TopP),
        (r#"{"typical_p":1.0}"#, TypicalP),
        (r#"{"typical_p":0}"#, TypicalP),
        (r#"{"max_new_tokens":0}"#, MaxNewTokens),
        (r#"{"top_n_tokens":6}"#, TopNTokens(5, 6)),
        (r#"{"truncate":0}"#, Truncate(10, 0)),
        (r#"{"truncate":11}"#, Truncate(10, 11)),
        (r#"{"stop":["a","b","c","d","e"]}"#, StopSequence(4, 5)),
        (r#"{"stop":[""]}"#, EmptyStopSequence),
    ];
    for (json, expected) in cases {
        assert_eq!(check(json).unwrap_err(), *expected, "{json}");
    }
    assert!(check(r#"{"frequency_penalty":-2.0,"top_n_tokens":5,"truncate":10}"#).is_ok());
}

#[test]
fn best_of_rules() {
    use ValidationError::*;
    assert_eq!(check(r#"{"best_of":0}"#).unwrap_err(), BestOf(2, 0));
    assert_eq!(
        check(r#"{"best_of":3,"do_sample":true}"#).unwrap_err(),
        BestOf(2, 3)
    );
    assert_eq!(check(r#"{"best_of":2}"#).unwrap_err(), BestOfSampling);
    assert_eq!(
        check(r#"{"best_of":2,"do_sample":true,"seed":1}"#).unwrap_err(),
        BestOfSeed
    );
    assert_eq!(
        check_streaming(r#"{"best_of":2,"do_sample":true}"#).unwrap_err(),
        BestOfStream
    );
    assert_eq!(check(r#"{"best_of":2,"top_k":5}"#).unwrap().best_of, 2);
}

#[test]
fn streaming_rejects_decoder_input_details() {
    assert_eq!(
        check_streaming(r#"{"decoder_input_details":true}"#).unwrap_err(),
        ValidationError::PrefillDetailsStream
    );
    assert!(check(r#"{"decoder_input_details":true}"#).is_ok());
}

#[test]
fn unsupported_fields_are_refused_unless_neutral() {
    use ValidationError::Unsupported;
    assert_eq!(
        check(r#"{"adapter_id":"lora"}"#).unwrap_err(),
        Unsupported("adapter_id")
    );
    assert!(check(r#"{"watermark":false,"grammar":null,"adapter_id":null}"#).is_ok());
}

#[test]
fn unknown_and_mistyped_fields_fail_to_parse() {
    assert!(serde_json::from_str::<GenerateParameters>(r#"{"temprature":0.5}"#).is_err());
    assert!(serde_json::from_str::<GenerateParameters>(r#"{"top_k":"five"}"#).is_err());
    assert!(serde_json::from_str::<GenerateParameters>(r#"{"max_new_tokens":-1}"#).is_err());
    assert!(serde_json::from_str::<GenerateRequest>(r#"{"parameters":{}}"#).is_err());
}

#[test]
fn lengths_default_max_new_tokens_to_remaining_room() {
    let p = check("{}").unwrap();
    let mut ids = vec![1, 2, 3, 4];
    assert_eq!(check_lengths(&mut ids, &p, &LIMITS).unwrap(), 12);
}

#[test]
fn lengths_reject_long_inputs_and_totals() {
    let p = check("{}").unwrap();
    let mut ids: Vec<u32> = (0..11).collect();
    assert_eq!(
        check_lengths(&mut ids, &p, &LIMITS).unwrap_err(),
        ValidationError::InputLength(10, 11)
    );
    let p = check(r#"{"max_new_tokens":7}"#).unwrap();
    let mut ids: Vec<u32> = (0..10).collect();
    let err = check_lengths(&mut ids, &p, &LIMITS).unwrap_err();
    assert_eq!(err, ValidationError::MaxTotalTokens(16, 10, 7));
    assert_eq!(
        err.to_string(),
        "`inputs` tokens + `max_new_tokens` must be <= 16. Given: 10 `inputs` tokens and 7 `max_new_tokens`"
    );
}

#[test]
fn truncate_keeps_the_last_tokens() {
    let p = check(r#"{"truncate":3}"#).unwrap();
    let mut ids: Vec<u32> = (0..20).collect();
    check_lengths(&mut ids, &p, &LIMITS).unwrap();
    assert_eq!(ids, vec![17, 18, 19]);
}

fn validation() -> Validation {
    Validation::new(Arc::new(byte_level_tokenizer()), LIMITS, 1)
}

#[tokio::test]
async fn validate_tokenizes_and_draws_a_seed() {
    let request: GenerateRequest =
        serde_json::from_str(r#"{"inputs":"hello","parameters":{"do_sample":true}}"#).unwrap();
    let valid = validation().validate(request, false).await.unwrap();
    assert_eq!(valid.input_ids.len(), 1, "\"hello\" is one merged token");
    assert_eq!(valid.max_new_tokens, 15);
    assert!(valid.params.seed.is_none());
    let seeded: GenerateRequest =
        serde_json::from_str(r#"{"inputs":"hello","parameters":{"seed":42}}"#).unwrap();
    let valid = validation().validate(seeded, false).await.unwrap();
    assert_eq!(valid.params.sampling.seed, 42);
}

#[tokio::test]
async fn validate_rejects_empty_and_long_inputs() {
    let empty: GenerateRequest = serde_json::from_str(r#"{"inputs":""}"#).unwrap();
    assert_eq!(
        validation().validate(empty, false).await.unwrap_err(),
        ValidationError::EmptyInput
    );
    let long: GenerateRequest = serde_json::from_str(r#"{"inputs":"abcdefghijkl"}"#).unwrap();
    assert_eq!(
        validation().validate(long, false).await.unwrap_err(),
        ValidationError::InputLength(10, 12)
    );
}

#[test]
fn watermark_carries_the_configured_split() {
    let p = check(r#"{"watermark":true}"#).unwrap();
    assert!(p.sampling.watermark);
    assert_eq!(
        (p.sampling.watermark_gamma, p.sampling.watermark_delta),
        (0.5, 2.0)
    );
    let off = check(r#"{}"#).unwrap();
    assert!(!off.sampling.watermark && off.sampling.watermark_delta == 0.0);
}

fn check_extras(extras: SamplingExtras) -> Result<CheckedParameters, ValidationError> {
    check_parameters_with(&params("{}"), &extras, false, &LIMITS)
}

#[test]
fn extras_are_range_checked() {
    let biased = check_extras(SamplingExtras {
        presence_penalty: Some(1.5),
        logit_bias: vec![(7, -100.0), (299, 100.0)],
        max_top_n_tokens: None,
        grammar: None,
        stop_floor: None,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(biased.sampling.presence_penalty, 1.5);
    assert_eq!(biased.sampling.min_new_tokens, 0);
    assert!(biased.sampling.stop_token_ids.is_empty());
    let floored = check_extras(SamplingExtras {
        stop_floor: Some(StopFloor {
            min_new_tokens: 5,
            stop_token_ids: vec![2, 7],
        }),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(floored.sampling.min_new_tokens, 5);
    assert_eq!(floored.sampling.stop_token_ids, vec![2, 7]);
    assert_eq!(biased.sampling.logit_bias.len(), 2);
    assert_eq!(biased.sampling.logit_bias[1].token_id, 299);
    let out_of_vocab = SamplingExtras {
        logit_bias: vec![(300, 1.0)],
        ..Default::default()
    };
    assert_eq!(
        check_extras(out_of_vocab).unwrap_err(),
        ValidationError::LogitBiasToken(300, 300)
    );
    for bias in [100.5, f32::NAN, f32::INFINITY] {
        let extras = SamplingExtras {
            logit_bias: vec![(1, bias)],
            ..Default::default()
        };
        assert_eq!(
            check_extras(extras).unwrap_err(),
            ValidationError::LogitBiasValue
        );
    }
    let presence = SamplingExtras {
        presence_penalty: Some(-2.5),
        ..Default::default()
    };
    assert_eq!(
        check_extras(presence).unwrap_err(),
        ValidationError::PresencePenalty
    );
}

#[test]
fn extras_can_raise_the_top_n_cap() {
    let p = params(r#"{"top_n_tokens":20}"#);
    assert!(check_parameters(&p, false, &LIMITS).is_err());
    let extras = SamplingExtras {
        max_top_n_tokens: Some(20),
        ..Default::default()
    };
    assert_eq!(
        check_parameters_with(&p, &extras, false, &LIMITS)
            .unwrap()
            .top_n_tokens,
        20
    );
}

#[tokio::test]
async fn token_prompts_skip_tokenization_but_are_bounded() {
    let input = GenerationInput {
        prompt: Prompt::Tokens(vec![72, 101]),
        parameters: params("{}"),
        extras: SamplingExtras::default(),
    };
    let valid = validation().validate(input.clone(), false).await.unwrap();
    assert_eq!(valid.input_ids, vec![72, 101]);
    assert!(!valid.inputs.is_empty());
    let bad = GenerationInput {
        prompt: Prompt::Tokens(vec![1, 300]),
        ..input.clone()
    };
    assert_eq!(
        validation().validate(bad, false).await.unwrap_err(),
        ValidationError::PromptToken(300, 300)
    );
    let empty = GenerationInput {
        prompt: Prompt::Tokens(vec![]),
        ..input
    };
    assert_eq!(
        validation().validate(empty, false).await.unwrap_err(),
        ValidationError::EmptyInput
    );
}

#[test]
fn overlong_stop_sequences_are_refused() {
    let long = "x".repeat(MAX_STOP_SEQUENCE_CHARS + 1);
    assert_eq!(
        check(&format!(r#"{{"stop":["{long}"]}}"#)).unwrap_err(),
        ValidationError::LongStopSequence(MAX_STOP_SEQUENCE_CHARS)
    );
    let fits = "é".repeat(MAX_STOP_SEQUENCE_CHARS);
    assert!(check(&format!(r#"{{"stop":["{fits}"]}}"#)).is_ok());
}

fn constrained_validation() -> Validation {
    use crate::grammar::{token_env, GrammarCompiler, GrammarLimits};
    let tokenizer = Arc::new(byte_level_tokenizer());
    let env = token_env(tokenizer, LIMITS.vocab_size, &[261]).unwrap();
    let limits = GrammarLimits {
        max_bytes: 10_000,
        compile_timeout: std::time::Duration::from_secs(30),
    };
    let compiler = GrammarCompiler::new(env, vec![261], limits).unwrap();
    validation().with_grammar(Arc::new(compiler))
}

fn native(parameters: &str) -> GenerateRequest {
    serde_json::from_str(&format!(
        r#"{{"inputs":"hello","parameters":{parameters}}}"#
    ))
    .unwrap()
}

fn openai(grammar: crate::grammar::GrammarRequest) -> GenerationInput {
    GenerationInput {
        extras: SamplingExtras {
            grammar: Some(grammar),
            ..SamplingExtras::default()
        },
        ..native("{}").into()
    }
}

#[tokio::test]
async fn grammars_from_either_surface_are_compiled_into_the_request() {
    let v = constrained_validation();
    let valid = v
        .validate(
            native(r#"{"grammar":{"type":"regex","value":"a+"}}"#),
            false,
        )
        .await
        .unwrap();
    let grammar = valid.params.grammar.expect("compiled");
    assert_eq!(grammar.stop_token_ids, vec![261]);
    assert!(grammar.llguidance.contains("a+"), "{}", grammar.llguidance);
    let valid = v
        .validate(openai(crate::grammar::GrammarRequest::JsonObject), true)
        .await
        .unwrap();
    assert!(valid.params.grammar.is_some());
    let free = v
        .validate(native(r#"{"grammar":null}"#), false)
        .await
        .unwrap();
    assert!(free.params.grammar.is_none());
}

#[tokio::test]
async fn bad_and_doubled_grammars_are_refused_by_validation() {
    let v = constrained_validation();
    let err = v
        .validate(native(r#"{"grammar":{"type":"regex","value":"("}}"#), false)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ValidationError::Grammar(crate::grammar::GrammarError::Invalid { kind: "regex", .. })
        ),
        "{err:?}"
    );
    let mut both = openai(crate::grammar::GrammarRequest::JsonObject);
    both.parameters.grammar = Some(serde_json::json!({"type": "regex", "value": "a"}));
    assert_eq!(
        v.validate(both, false).await.unwrap_err(),
        ValidationError::TwoConstraints("json_object")
    );
}

#[tokio::test]
async fn without_a_compiler_grammars_are_refused_as_disabled() {
    let err = validation()
        .validate(
            native(r#"{"grammar":{"type":"regex","value":"a+"}}"#),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ValidationError::Grammar(crate::grammar::GrammarError::Disabled)
    );
}

#[test]
fn min_p_is_checked_in_f32_and_reaches_the_shard() {
    let with = |p: f32| {
        check_extras(SamplingExtras {
            min_p: Some(p),
            ..Default::default()
        })
    };
    assert_eq!(with(0.25).unwrap().sampling.min_p, 0.25);
    assert_eq!(with(1.0).unwrap().sampling.min_p, 1.0);
    assert_eq!(
        check_extras(SamplingExtras::default())
            .unwrap()
            .sampling
            .min_p,
        0.0
    );
    // 1e39 is finite in f64 but infinite in f32, the shard's precision.
    for bad in [-0.1, 1.0001, f32::NAN, 1e39_f64 as f32, f32::NEG_INFINITY] {
        assert_eq!(with(bad).unwrap_err(), ValidationError::MinP, "{bad}");
    }
    assert!(ValidationError::MinP.to_string().contains("`min_p`"));
}

#[test]
fn stop_token_ids_are_bounded_by_count_and_vocabulary() {
    let with = |ids: Vec<u32>| {
        check_extras(SamplingExtras {
            stop_token_ids: ids,
            ..Default::default()
        })
    };
    let checked = with(vec![5, 299]).unwrap();
    assert_eq!(checked.stop_token_ids, vec![5, 299]);
    // The request's stop tokens end the sequence in the router; the shard sees them only
    // through a stop floor.
    assert!(checked.sampling.stop_token_ids.is_empty());
    assert_eq!(
        with(vec![5, 300]).unwrap_err(),
        ValidationError::StopTokenId(300, 300)
    );
    assert_eq!(
        with(vec![u32::MAX]).unwrap_err(),
        ValidationError::StopTokenId(u32::MAX, 300)
    );
    assert!(with(vec![1; MAX_STOP_TOKEN_IDS]).is_ok());
    let err = with(vec![1; MAX_STOP_TOKEN_IDS + 1]).unwrap_err();
    assert_eq!(
        err,
        ValidationError::StopTokenIds(MAX_STOP_TOKEN_IDS, MAX_STOP_TOKEN_IDS + 1)
    );
    assert!(err.to_string().contains("`stop_token_ids`"));
}

#[test]
fn output_flags_default_to_tgi_and_vllm_defaults() {
    let native = check("{}").unwrap();
    assert!(native.skip_special_tokens && !native.include_stop_str_in_output);
    assert!(native.stop_token_ids.is_empty());
    let flagged = check_extras(SamplingExtras {
        keep_special_tokens: true,
        include_stop_str_in_output: true,
        ..Default::default()
    })
    .unwrap();
    assert!(!flagged.skip_special_tokens && flagged.include_stop_str_in_output);
}
