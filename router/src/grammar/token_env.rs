//! The router's tokenizer as llguidance sees it: every id's bytes in a token trie, special
//! tokens marked so a grammar never matches them as text, and the vocabulary padded to the
//! model's size (the model may have more logits than the tokenizer has tokens).
use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::TextTokenizer;

struct RouterTokenEnv {
    tokenizer: Arc<TextTokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for RouterTokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(bytes, |text| {
            self.tokenizer.encode_with(text, false).unwrap_or_default()
        })
    }
}

/// Bytes of one id for the trie: special tokens and ids past the tokenizer get the marker
/// byte llguidance reserves for them.
fn trie_bytes(tokenizer: &TextTokenizer, known: u32, id: u32) -> Vec<u8> {
    if id >= known {
        return special(format!("<[{id}]>").as_bytes());
    }
    let bytes = tokenizer.token_bytes(id);
    if tokenizer.is_special(id) || bytes.is_empty() {
        let name = if bytes.is_empty() {
            format!("<[{id}]>").into_bytes()
        } else {
            bytes
        };
        return special(&name);
    }
    bytes
}

fn special(name: &[u8]) -> Vec<u8> {
    let mut marked = Vec::with_capacity(name.len() + 1);
    marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
    marked.extend_from_slice(name);
    marked
}

/// The environment for `vocab_size` logits whose generation ends at `stop_token_ids`.
pub fn token_env(
    tokenizer: Arc<TextTokenizer>,
    vocab_size: u32,
    stop_token_ids: &[u32],
) -> anyhow::Result<TokEnv> {
    let known = tokenizer.vocab_len(); // once: the tokenizer counts by building its vocabulary
    let vocab_size = vocab_size.max(known);
    let stops: Vec<u32> = stop_token_ids
        .iter()
        .copied()
        .filter(|&id| id < vocab_size)
        .collect();
    let Some(&first_stop) = stops.first() else {
        anyhow::bail!("constrained decoding needs a stop token inside the vocabulary");
    };
    let words: Vec<Vec<u8>> = (0..vocab_size)
        .map(|id| trie_bytes(&tokenizer, known, id))
        .collect();
    let info = TokRxInfo::new(vocab_size, first_stop);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&stops);
    Ok(Arc::new(RouterTokenEnv { tokenizer, trie }))
}
