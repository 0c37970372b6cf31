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
    let mut vocab: Vec<(String, u32)> =
        alphabet.iter().enumerate().map(|(id, c)| (c.to_string(), id as u32)).collect();
    let merges: Vec<(String, String)> = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("a", "Ã")]
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
