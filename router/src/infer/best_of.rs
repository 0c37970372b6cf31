//! `best_of`: several sampled sequences for one request; the answer is the one with the
//! highest mean token logprob, the others go to `details.best_of_sequences`.
use crate::schema::{BestOfSequence, FinishReason};
use crate::validation::ValidRequest;

use super::{FinishedSequence, SequenceDecoder};

/// A finished sequence with the seed it was sampled with.
pub struct Candidate {
    pub decoder: SequenceDecoder,
    pub finish: FinishReason,
    pub seed: u64,
}

/// One seed per sequence: the request's own first, fresh random ones for the rest
/// (validation forbids a user seed with best_of > 1).
pub fn seeds(valid: &ValidRequest) -> Vec<u64> {
    let mut seeds = vec![valid.params.sampling.seed];
    seeds.extend((1..valid.params.best_of).map(|_| rand::random::<u64>()));
    seeds
}

fn mean_logprob(candidate: &Candidate) -> f32 {
    let tokens = &candidate.decoder.record().tokens;
    if tokens.is_empty() {
        return f32::NEG_INFINITY;
    }
    tokens.iter().map(|t| t.logprob).sum::<f32>() / tokens.len() as f32
}

/// Splits the candidates into the best one and the rest (in submission order).
pub fn pick(finished: Vec<FinishedSequence>, seeds: &[u64]) -> (Candidate, Vec<Candidate>) {
    let mut candidates: Vec<Candidate> = finished
        .into_iter()
        .zip(seeds)
        .map(|(f, &seed)| Candidate {
            decoder: f.decoder,
            finish: f.finish,
            seed,
        })
        .collect();
    let best = candidates
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| mean_logprob(a).total_cmp(&mean_logprob(b)))
        .map(|(index, _)| index)
        .expect("at least one sequence");
    let best = candidates.remove(best);
    (best, candidates)
}

pub fn to_best_of_sequence(candidate: Candidate) -> BestOfSequence {
    let generated_text = candidate.decoder.generated_text();
    let record = candidate.decoder.into_record();
    BestOfSequence {
        generated_text,
        finish_reason: candidate.finish,
        generated_tokens: record.tokens.len() as u32,
        seed: Some(candidate.seed),
        prefill: record.prefill,
        tokens: record.tokens,
        top_tokens: record.top_tokens,
    }
}
