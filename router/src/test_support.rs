//! Fixtures shared by unit tests: a small byte-level BPE tokenizer built in code.
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::tokenizer::TextTokenizer;

/// Every byte is a token (so multi-byte characters span several tokens), plus merges for
/// "hello" and one merge ("a" + first byte of "é") that ends in the middle of a character.
pub fn byte_level_tokenizer() -> TextTokenizer {
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort_unstable();
    let mut vocab: Vec<(String, u32)> = alphabet
        .iter()
        .enumerate()
        .map(|(id, c)| (c.to_string(), id as u32))
        .collect();
    let merges: Vec<(String, String)> = [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        ("a", "Ã"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    for (a, b) in &merges {
        let id = vocab.len() as u32;
        vocab.push((format!("{a}{b}"), id));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
        .build()
        .expect("valid BPE");
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, true, true)));
    tokenizer.add_special_tokens(&[AddedToken::from("<eos>", true)]);
    TextTokenizer::new(tokenizer)
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::pb;
use crate::scheduler::{
    FailureKind, GenerationFailure, SchedulerHandle, SequenceEvent, SequenceRequest, Submission,
};

/// How the fake scheduler answers one submitted sequence.
#[derive(Debug, Clone)]
pub enum Script {
    /// These ids, one event each, then `Finished` like the real scheduler would.
    Tokens(Vec<u32>),
    /// These ids, then the event channel closes without `Finished`.
    Truncated(Vec<u32>),
    /// A shard failure after these ids.
    FailAfter(Vec<u32>, String),
}

/// What the fake saw: sequences submitted and sequences the client abandoned.
#[derive(Debug, Default)]
pub struct FakeStats {
    pub submitted: AtomicUsize,
    pub cancelled: AtomicUsize,
}

impl FakeStats {
    pub fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// A scheduler stand-in that plays `script(request)` for every submission. The token
/// logprob is `-(seed % 5) - 0.5`, so tests can predict which best_of sequence wins.
pub fn fake_scheduler<F>(script: F) -> (SchedulerHandle, Arc<FakeStats>)
where
    F: Fn(&SequenceRequest) -> Script + Send + Sync + 'static,
{
    let (submissions, mut receiver) = tokio::sync::mpsc::unbounded_channel::<Submission>();
    let stats = Arc::new(FakeStats::default());
    let script = Arc::new(script);
    let seen = stats.clone();
    tokio::spawn(async move {
        while let Some(Submission { request, events }) = receiver.recv().await {
            seen.submitted.fetch_add(1, Ordering::SeqCst);
            let plan = script(&request);
            let stats = seen.clone();
            tokio::spawn(async move { play(request, events, plan, stats).await });
        }
    });
    (SchedulerHandle::new(submissions), stats)
}

async fn play(
    request: SequenceRequest,
    events: crate::scheduler::EventSender,
    plan: Script,
    stats: Arc<FakeStats>,
) {
    events.send(SequenceEvent::Started {
        queue_time: Duration::from_millis(3),
    });
    if request.prefill_logprobs {
        let logprobs = vec![-1.0; request.input_ids.len().saturating_sub(1)];
        events.send(SequenceEvent::Prefill { logprobs });
    }
    let (ids, ending) = match plan {
        Script::Tokens(ids) => (ids, None),
        Script::Truncated(ids) => (ids, Some(None)),
        Script::FailAfter(ids, message) => (ids, Some(Some(message))),
    };
    let logprob = -((request.sampling.seed % 5) as f32) - 0.5;
    for (id, generated) in ids.into_iter().zip(1u32..) {
        tokio::time::sleep(Duration::from_millis(2)).await;
        if events.is_closed() {
            stats.cancelled.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let top_ids: Vec<u32> = (0..request.top_n_tokens).map(|i| id + i).collect();
        let top_logprobs = top_ids.iter().map(|_| logprob).collect();
        events.send(SequenceEvent::Token(pb::Token {
            id,
            logprob,
            top_ids,
            top_logprobs,
        }));
        let finish = crate::finish::finish_reason(crate::finish::AfterToken {
            generated_tokens: generated,
            max_new_tokens: request.max_new_tokens,
            is_stop_token: request.stop_token_ids.contains(&id),
            ends_stop_sequence: false,
        });
        if let (None, Some(reason)) = (&ending, finish) {
            events.send(SequenceEvent::Finished {
                reason,
                generated_tokens: generated,
            });
            return;
        }
    }
    match ending {
        Some(Some(message)) => {
            events.send(SequenceEvent::Error(GenerationFailure::new(
                Some(0),
                FailureKind::ShardReported,
                message,
            )));
        }
        Some(None) => {}
        None => {
            // Script ran out: wait for the client to go away, like a long generation.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if events.is_closed() {
                stats.cancelled.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}
