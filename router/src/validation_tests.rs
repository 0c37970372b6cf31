use super::*;
use crate::schema::GenerateRequest;
use crate::test_support::byte_level_tokenizer;

const LIMITS: ValidationLimits = ValidationLimits {
    max_best_of: 2,
    max_stop_sequences: 4,
    max_top_n_tokens: 5,
    max_input_tokens: 10,
    max_total_tokens: 16,
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
    assert_eq!(p.sampling.temperature, 1.0);
    assert_eq!(p.sampling.top_p, 1.0);
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
        check(r#"{"watermark":true}"#).unwrap_err(),
        Unsupported("watermark")
    );
    assert_eq!(
        check(r#"{"adapter_id":"lora"}"#).unwrap_err(),
        Unsupported("adapter_id")
    );
    assert_eq!(
        check(r#"{"grammar":{"type":"regex","value":"a+"}}"#).unwrap_err(),
        Unsupported("grammar")
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
