//! Long prompts tokenized in parallel chunks, giving exactly the ids of one pass.
//!
//! Outside the GPU, tokenizing is the longest part of a long prompt's time to first token:
//! HF tokenizers' byte-level BPE runs at ~3 MB/s on one core, ~5 ms for 2,048 tokens.
//! Some pre-tokenizers never put a non-whitespace character and a space right after it into
//! one piece (byte-level BPE with GPT-2's pattern, Llama 3's and Qwen 2's split patterns,
//! digit splitting). For those, cutting the text just before such a space changes no
//! piece, and BPE never merges across pieces: the chunks are encoded concurrently, their
//! ids concatenated, and the special tokens (BOS) added once, after. Any other tokenizer, a
//! text holding an added token's string, or a short text takes the single pass.
use tokenizers::pre_tokenizers::split::SplitPattern;
use tokenizers::{
    Encoding, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

/// Texts shorter than this take one pass: below it the threads cost more than they save.
pub const MIN_PARALLEL_BYTES: usize = 4 * 1024;
/// Each chunk is at least this long.
const MIN_CHUNK_BYTES: usize = 1024;

/// Split patterns known to keep a non-whitespace character and the space after it apart.
const SAFE_SPLIT_PATTERNS: &[&str] = &[
    // Llama 3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    // Qwen 2
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Whether (and how) a tokenizer's texts may be cut into chunks.
#[derive(Debug, Clone)]
pub struct ChunkedEncoder {
    /// The added tokens' strings; None: this tokenizer never takes the chunked path.
    added: Option<Vec<String>>,
    threads: usize,
}

impl ChunkedEncoder {
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Self {
        let cuttable = tokenizer.get_truncation().is_none()
            && tokenizer.get_padding().is_none()
            && tokenizer
                .get_normalizer()
                .is_none_or(|n| matches!(n, NormalizerWrapper::NFC(_)))
            && tokenizer
                .get_pre_tokenizer()
                .is_some_and(keeps_space_boundaries);
        let added = cuttable.then(|| {
            let mut added: Vec<String> = tokenizer
                .get_added_tokens_decoder()
                .into_values()
                .map(|token| token.content)
                .filter(|content| !content.is_empty())
                .collect();
            added.sort_unstable();
            added
        });
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        Self { added, threads }
    }

    pub fn applies(&self) -> bool {
        self.added.is_some()
    }

    /// The text's ids from chunks encoded concurrently; None when it takes the single pass.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        add_special_tokens: bool,
    ) -> Option<tokenizers::Result<Vec<u32>>> {
        let added = self.added.as_ref()?;
        if text.len() < MIN_PARALLEL_BYTES
            || added.iter().any(|token| text.contains(token.as_str()))
        {
            return None;
        }
        let pieces = self.threads.min(text.len() / MIN_CHUNK_BYTES);
        let cuts = cut_points(text, pieces);
        if cuts.is_empty() {
            return None;
        }
        let mut chunks = Vec::with_capacity(cuts.len() + 1);
        let mut start = 0;
        for &cut in &cuts {
            chunks.push(&text[start..cut]);
            start = cut;
        }
        chunks.push(&text[start..]);
        Some(encode_chunks(tokenizer, chunks, add_special_tokens))
    }
}

fn encode_chunks(
    tokenizer: &Tokenizer,
    chunks: Vec<&str>,
    add_special_tokens: bool,
) -> tokenizers::Result<Vec<u32>> {
    let encodings = tokenizer.encode_batch_fast(chunks, false)?;
    let merged =
        tokenizer.post_process(Encoding::merge(encodings, true), None, add_special_tokens)?;
    Ok(merged.get_ids().to_vec())
}

fn keeps_space_boundaries(pre_tokenizer: &PreTokenizerWrapper) -> bool {
    match pre_tokenizer {
        // With or without GPT-2's pattern: the pattern keeps them apart, the byte mapping is per byte.
        PreTokenizerWrapper::ByteLevel(_) | PreTokenizerWrapper::Digits(_) => true,
        PreTokenizerWrapper::Split(split) => {
            matches!(&split.pattern, SplitPattern::Regex(p) if SAFE_SPLIT_PATTERNS.contains(&p.as_str()))
                && split.behavior == SplitDelimiterBehavior::Isolated
                && !split.invert
        }
        PreTokenizerWrapper::Sequence(sequence) => {
            sequence.as_ref().iter().all(keeps_space_boundaries)
        }
        _ => false,
    }
}

/// Byte offsets near `pieces - 1` even cuts of `text`, each just before an ASCII space that
/// follows and precedes a non-whitespace character. A stretch without one gets no cut.
pub fn cut_points(text: &str, pieces: usize) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut cuts: Vec<usize> = Vec::new();
    for k in 1..pieces {
        let target = text.len() * k / pieces;
        let floor = cuts.last().map_or(0, |&c| c + 1).max(target);
        let limit = (text.len() * (k + 1) / pieces).min(text.len());
        if let Some(cut) = (floor.max(1)..limit).find(|&i| bytes[i] == b' ' && safe_cut(text, i)) {
            cuts.push(cut);
        }
    }
    cuts
}

fn safe_cut(text: &str, at: usize) -> bool {
    let before = text[..at].chars().next_back();
    let after = text[at + 1..].chars().next();
    before.is_some_and(|c| !c.is_whitespace()) && after.is_some_and(|c| !c.is_whitespace())
}

#[cfg(test)]
#[path = "chunked_encoding_tests.rs"]
mod tests;
