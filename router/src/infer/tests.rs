use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::*;
use crate::metrics::Route;
use crate::schema::FinishReason;
use crate::test_support::{byte_level_tokenizer, fake_scheduler, FakeStats, Script};
use crate::validation::ValidationLimits;

const LIMITS: ValidationLimits = ValidationLimits {
    max_best_of: 2,
    max_stop_sequences: 4,
    max_top_n_tokens: 5,
    max_input_tokens: 100,
    max_total_tokens: 200,
    vocab_size: 300,
    watermark: crate::validation::WatermarkSettings {
        gamma: 0.5,
        delta: 2.0,
    },
};

fn infer_with<F>(max_concurrent: usize, script: F) -> (Infer, Arc<FakeStats>)
where
    F: Fn(&crate::scheduler::SequenceRequest) -> Script + Send + Sync + 'static,
{
    let tokenizer = Arc::new(byte_level_tokenizer());
    let eos = tokenizer.token_to_id("<eos>").unwrap();
    let (scheduler, stats) = fake_scheduler(script);
    let validation = Validation::new(tokenizer.clone(), LIMITS, 1);
    (
        Infer::new(scheduler, validation, tokenizer, max_concurrent, vec![eos]),
        stats,
    )
}

/// Answers every request with `text` followed by EOS.
fn says(text: &'static str) -> impl Fn(&crate::scheduler::SequenceRequest) -> Script + Send + Sync {
    let tokenizer = byte_level_tokenizer();
    let mut ids = tokenizer.encode(text).unwrap();
    ids.push(tokenizer.token_to_id("<eos>").unwrap());
    move |_| Script::Tokens(ids.clone())
}

fn request(json: &str) -> GenerateRequest {
    serde_json::from_str(json).unwrap()
}

async fn generate(infer: &Infer, json: &str) -> Result<GenerateOutput, InferError> {
    infer
        .generate(request(json), &mut RequestMeter::start(Route::Generate))
        .await
}

#[tokio::test]
async fn generate_returns_text_and_details() {
    let (infer, _) = infer_with(4, says(" wörld 日本"));
    let out = generate(
        &infer,
        r#"{"inputs":"hello","parameters":{"details":true,"seed":9,"do_sample":true}}"#,
    )
    .await
    .unwrap();
    assert_eq!(out.response.generated_text, " wörld 日本");
    let details = out.response.details.unwrap();
    assert_eq!(details.finish_reason, FinishReason::EosToken);
    assert_eq!(details.seed, Some(9));
    assert_eq!(details.generated_tokens as usize, details.tokens.len());
    let streamed: String = details.tokens.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(streamed, " wörld 日本<eos>");
    assert!(details.tokens.last().unwrap().special);
    assert!(details.best_of_sequences.is_none());
    assert_eq!(out.input_length, 1);
}

#[tokio::test]
async fn max_new_tokens_ends_with_length() {
    let (infer, _) = infer_with(4, says("abcdef"));
    let out = generate(
        &infer,
        r#"{"inputs":"x","parameters":{"max_new_tokens":3,"details":true}}"#,
    )
    .await
    .unwrap();
    assert_eq!(out.response.generated_text, "abc");
    let details = out.response.details.unwrap();
    assert_eq!(details.finish_reason, FinishReason::Length);
    assert_eq!(details.seed, None, "greedy requests report no seed");
}

#[tokio::test]
async fn stop_sequence_cuts_text_and_cancels_the_sequence() {
    let (infer, stats) = infer_with(4, says(" hello world and more"));
    let out = generate(
        &infer,
        r#"{"inputs":"x","parameters":{"stop":["o wo"],"details":true}}"#,
    )
    .await
    .unwrap();
    assert_eq!(out.response.generated_text, " hello wo");
    assert_eq!(
        out.response.details.unwrap().finish_reason,
        FinishReason::StopSequence
    );
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(
        stats.cancelled(),
        1,
        "dropping the stream must cancel the sequence"
    );
}

#[tokio::test]
async fn return_full_text_prepends_the_prompt() {
    let (infer, _) = infer_with(4, says(" there"));
    let out = generate(
        &infer,
        r#"{"inputs":"hi","parameters":{"return_full_text":true}}"#,
    )
    .await
    .unwrap();
    assert_eq!(out.response.generated_text, "hi there");
}

#[tokio::test]
async fn best_of_runs_n_sequences_and_keeps_the_most_likely() {
    // Seed-dependent text, so the winner is identifiable.
    let tokenizer = byte_level_tokenizer();
    let (infer, stats) = infer_with(4, move |req| {
        let mut ids = tokenizer
            .encode(&format!("s{}", req.sampling.seed % 5))
            .unwrap();
        ids.push(tokenizer.token_to_id("<eos>").unwrap());
        Script::Tokens(ids)
    });
    let out = generate(
        &infer,
        r#"{"inputs":"x","parameters":{"best_of":2,"do_sample":true,"details":true}}"#,
    )
    .await
    .unwrap();
    assert_eq!(stats.submitted.load(Ordering::SeqCst), 2);
    let details = out.response.details.unwrap();
    let others = details.best_of_sequences.unwrap();
    assert_eq!(others.len(), 1);
    let best_seed = details.seed.unwrap();
    assert_ne!(best_seed, others[0].seed.unwrap());
    assert!(
        best_seed % 5 <= others[0].seed.unwrap() % 5,
        "lower seed%5 means higher logprob"
    );
    assert_eq!(out.response.generated_text, format!("s{}", best_seed % 5));
}

#[tokio::test]
async fn decoder_input_details_and_top_tokens() {
    let (infer, _) = infer_with(4, says("ab"));
    let out = generate(
        &infer,
        r#"{"inputs":"hello hello","parameters":{"details":true,"decoder_input_details":true,"top_n_tokens":2}}"#,
    )
    .await
    .unwrap();
    let details = out.response.details.unwrap();
    assert_eq!(details.prefill.len() as u32, out.input_length);
    assert_eq!(details.prefill[0].logprob, None);
    assert_eq!(details.prefill[1].logprob, Some(-1.0));
    assert_eq!(details.top_tokens.len(), details.tokens.len());
    assert_eq!(details.top_tokens[0].len(), 2);
}

#[tokio::test]
async fn validation_errors_surface_before_scheduling() {
    let (infer, stats) = infer_with(4, says("a"));
    let err = generate(&infer, r#"{"inputs":"x","parameters":{"temperature":0}}"#)
        .await
        .unwrap_err();
    assert!(matches!(err, InferError::Validation(_)));
    assert_eq!(stats.submitted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn shard_failure_is_a_generation_error() {
    let (infer, _) = infer_with(4, |_| {
        Script::FailAfter(vec![70], "shard 1: unavailable".into())
    });
    let err = generate(&infer, r#"{"inputs":"x"}"#).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Request failed during generation: shard 1: unavailable"
    );
}

#[tokio::test]
async fn a_stream_that_stops_early_is_incomplete() {
    let (infer, _) = infer_with(4, |_| Script::Truncated(vec![70, 71]));
    let err = generate(&infer, r#"{"inputs":"x"}"#).await.unwrap_err();
    assert!(matches!(err, InferError::IncompleteGeneration));
}

async fn collect_stream(infer: &Infer, json: &str) -> Vec<StreamItem> {
    let (_, stream) = infer
        .generate_stream(request(json), RequestMeter::start(Route::Generate))
        .await
        .unwrap();
    stream.collect().await
}

#[tokio::test]
async fn stream_emits_tokens_then_a_final_event() {
    let (infer, _) = infer_with(4, says("é日本 ok"));
    let items = collect_stream(
        &infer,
        r#"{"inputs":"x","parameters":{"seed":5,"top_k":3}}"#,
    )
    .await;
    let items: Vec<StreamResponse> = items.into_iter().map(Result::unwrap).collect();
    let (last, rest) = items.split_last().unwrap();
    assert!(rest
        .iter()
        .all(|i| i.generated_text.is_none() && i.details.is_none()));
    for item in &items {
        assert!(!item.token.text.contains(char::REPLACEMENT_CHARACTER));
    }
    assert_eq!(
        items.iter().map(|i| i.index).collect::<Vec<_>>(),
        (1..=items.len() as u32).collect::<Vec<_>>()
    );
    assert_eq!(last.generated_text.as_deref(), Some("é日本 ok"));
    let details = last.details.as_ref().unwrap();
    assert_eq!(details.finish_reason, FinishReason::EosToken);
    assert_eq!(details.seed, Some(5));
    assert_eq!(details.generated_tokens as usize, items.len());
}

#[tokio::test]
async fn stream_errors_arrive_as_items() {
    let (infer, _) = infer_with(4, |_| Script::FailAfter(vec![70], "boom".into()));
    let items = collect_stream(&infer, r#"{"inputs":"x"}"#).await;
    assert!(items[0].is_ok());
    assert!(
        matches!(items.last().unwrap(), Err(InferError::Generation(m)) if m.message == "boom" && m.rank == Some(0))
    );
}

#[tokio::test]
async fn dropping_a_stream_cancels_and_frees_its_slot() {
    let (infer, stats) = infer_with(1, says("a long answer that goes on"));
    let (_, stream) = infer
        .generate_stream(
            request(r#"{"inputs":"x"}"#),
            RequestMeter::start(Route::Generate),
        )
        .await
        .unwrap();
    let mut stream = Box::pin(stream);
    assert!(stream.next().await.unwrap().is_ok());
    // The only slot is taken: a second request is refused.
    let err = generate(&infer, r#"{"inputs":"x"}"#).await.unwrap_err();
    assert!(matches!(err, InferError::Overloaded));
    drop(stream);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(stats.cancelled(), 1);
    assert!(
        generate(&infer, r#"{"inputs":"x"}"#).await.is_ok(),
        "the slot is free again"
    );
}

#[tokio::test]
async fn streaming_refuses_best_of() {
    let (infer, _) = infer_with(4, says("a"));
    let result = infer
        .generate_stream(
            request(r#"{"inputs":"x","parameters":{"best_of":2,"do_sample":true}}"#),
            RequestMeter::start(Route::Generate),
        )
        .await;
    assert!(matches!(
        result,
        Err(InferError::Validation(
            crate::validation::ValidationError::BestOfStream
        ))
    ));
}

/// `/tokenize` is bounded by `--max-input-tokens` like `/generate`'s prompt (issue 27):
/// an input over it is a 422 validation error, not a quadratic walk over its offsets.
#[tokio::test]
async fn tokenize_refuses_inputs_over_max_input_tokens() {
    let (infer, _) = infer_with(4, says("x"));
    let within = "é hello ".repeat(10);
    let tokens = infer.tokenize(within.clone()).await.unwrap();
    assert_eq!(tokens.last().unwrap().stop, within.chars().count());
    let over = "é hello ".repeat(20_000);
    let err = infer.tokenize(over.clone()).await.unwrap_err();
    let count = byte_level_tokenizer().encode(&over).unwrap().len() as u32;
    assert!(
        matches!(
            err,
            InferError::Validation(crate::validation::ValidationError::InputLength(100, n)) if n == count
        ),
        "{err:?}"
    );
    let (full, _) = infer_with(0, says("x"));
    let refused = full.tokenize("hi".into()).await.unwrap_err();
    assert!(matches!(refused, InferError::Overloaded), "{refused:?}");
    let chat = infer
        .tokenize_chat(crate::chat_template::RenderedChat {
            text: over,
            content: Vec::new(),
        })
        .await
        .unwrap_err();
    assert!(matches!(chat, InferError::Validation(_)), "{chat:?}");
}
