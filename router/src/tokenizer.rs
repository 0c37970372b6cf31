//! The model's tokenizer (tokenizer.json) and the incremental detokenizer that turns
//! generated ids into text pieces without ever emitting half a UTF-8 character.
use std::collections::HashSet;
use std::path::Path;

use tokenizers::Tokenizer;

use crate::chunked_encoding::ChunkedEncoder;
use crate::schema::SimpleToken;

#[derive(Debug, Clone, thiserror::Error)]
#[error("tokenizer error: {0}")]
pub struct TokenizerError(pub String);

fn tokenizer_error(err: impl std::fmt::Display) -> TokenizerError {
    TokenizerError(err.to_string())
}

/// How many prompt tokens seed the detokenizer, so the first generated token decodes
/// in context (leading spaces of SentencePiece-style tokens come out right).
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// A loaded tokenizer plus the ids it marks special.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    special_ids: HashSet<u32>,
    chunks: ChunkedEncoder,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("special_ids", &self.special_ids)
            .finish()
    }
}

impl TextTokenizer {
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner = Tokenizer::from_file(path)
            .map_err(|err| TokenizerError(format!("cannot load {}: {err}", path.display())))?;
        Ok(Self::new(inner))
    }

    pub fn new(inner: Tokenizer) -> Self {
        let special_ids = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        let chunks = ChunkedEncoder::for_tokenizer(&inner);
        Self {
            inner,
            special_ids,
            chunks,
        }
    }

    /// Prompt ids, with the tokenizer's own special tokens (e.g. BOS) added, like TGI.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, true)
    }

    /// Chat prompts pass `false`: their template already wrote the special tokens.
    pub fn encode_with(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if let Some(ids) = self.chunks.encode(&self.inner, text, add_special_tokens) {
            return ids.map_err(tokenizer_error); // a long text, in parallel chunks
        }
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tokenizer_error)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// `/tokenize`'s answer: ids with the text they cover and character offsets.
    pub fn tokenize(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<SimpleToken>, TokenizerError> {
        let encoding = self
            .inner
            .encode_char_offsets(text, add_special_tokens)
            .map_err(tokenizer_error)?;
        let tokens = encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .map(|(&id, &(start, stop))| SimpleToken {
                id,
                text: text
                    .chars()
                    .skip(start)
                    .take(stop.saturating_sub(start))
                    .collect(),
                start,
                stop,
            })
            .collect();
        Ok(tokens)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(tokenizer_error)
    }

    /// Text of one token on its own (used for prefill and top-n alternatives).
    pub fn token_text(&self, id: u32) -> String {
        self.inner.decode(&[id], false).unwrap_or_default()
    }

    /// The raw bytes of one token (OpenAI's logprob `bytes`): a byte-level BPE token may
    /// hold part of a UTF-8 character, which its decoded text cannot show.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.inner.id_to_token(id) else {
            return Vec::new();
        };
        if let Some(byte) = byte_fallback_token(&piece) {
            return vec![byte];
        }
        let byte_level = matches!(
            self.inner.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        if byte_level && !self.is_special(id) {
            if let Some(bytes) = byte_level_bytes(&piece) {
                return bytes;
            }
        }
        self.token_text(id).into_bytes()
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Id of a token given by its string form (e.g. `"</s>"`), if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn decoder_for(&self, prompt_ids: &[u32]) -> IncrementalDecoder {
        let start = prompt_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS);
        IncrementalDecoder::new(&prompt_ids[start..])
    }
}

/// SentencePiece byte-fallback tokens are spelled `<0xAB>`.
fn byte_fallback_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

/// Inverts GPT-2's byte-to-character table: printable Latin-1 bytes stand for
/// themselves, the other bytes were moved to U+0100 onwards in byte order.
fn byte_level_bytes(piece: &str) -> Option<Vec<u8>> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let moved: Vec<u8> = (0..=255u8).filter(|&b| !printable(b)).collect();
    piece
        .chars()
        .map(|c| {
            let code = c as u32;
            if code < 256 && printable(code as u8) {
                Some(code as u8)
            } else {
                code.checked_sub(256)
                    .and_then(|i| moved.get(i as usize).copied())
            }
        })
        .collect()
}

/// TGI's prefix/read-offset scheme: decode a small window twice (with and without the
/// newest tokens) and emit the difference once it no longer ends in a replacement
/// character, i.e. once the pending bytes form whole characters.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// `context` are the last prompt ids; they are decoded for context, never emitted.
    pub fn new(context: &[u32]) -> Self {
        Self {
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
        }
    }

    /// Adds one generated id and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &TextTokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let prefix_text =
            tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], false)?;
        let new_text = tokenizer.decode(&self.ids[self.prefix_offset..], false)?;
        if new_text.len() <= prefix_text.len() || new_text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let piece = match new_text.strip_prefix(prefix_text.as_str()) {
            Some(rest) => rest.to_owned(),
            None => new_text.chars().skip(prefix_text.chars().count()).collect(),
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.forget_consumed();
        Ok(piece)
    }

    /// Keeps the window small: ids before `prefix_offset` are never decoded again.
    fn forget_consumed(&mut self) {
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::byte_level_tokenizer;

    fn stream(tokenizer: &TextTokenizer, prompt: &[u32], ids: &[u32]) -> Vec<String> {
        let mut decoder = tokenizer.decoder_for(prompt);
        ids.iter()
            .map(|&id| decoder.push(tokenizer, id).unwrap())
            .collect()
    }

    #[test]
    fn split_multibyte_characters_are_held_back() {
        let tokenizer = byte_level_tokenizer();
        let text = "hello é 日本 🙂!";
        let ids = tokenizer.encode(text).unwrap();
        assert!(
            ids.len() > text.chars().count(),
            "multi-byte chars must span tokens"
        );
        let pieces = stream(&tokenizer, &[], &ids);
        for piece in &pieces {
            assert!(
                !piece.contains(char::REPLACEMENT_CHARACTER),
                "broken piece {piece:?}"
            );
        }
        assert!(
            pieces.iter().any(String::is_empty),
            "some bytes must have been held back"
        );
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces.concat(), tokenizer.decode(&ids, false).unwrap());
    }

    #[test]
    fn prompt_context_is_not_emitted() {
        let tokenizer = byte_level_tokenizer();
        let prompt = tokenizer.encode("say hello").unwrap();
        let generated = tokenizer.encode(" wörld").unwrap();
        assert_eq!(stream(&tokenizer, &prompt, &generated).concat(), " wörld");
    }

    #[test]
    fn token_ending_mid_character_is_completed_by_the_next() {
        let tokenizer = byte_level_tokenizer();
        // "aé" encodes as the merged token "a"+first byte of "é", then the second byte.
        let ids = tokenizer.encode("aé").unwrap();
        assert_eq!(ids.len(), 2);
        assert_eq!(
            stream(&tokenizer, &[], &ids),
            vec![String::new(), "aé".to_owned()]
        );
    }

    #[test]
    fn special_tokens_are_flagged_and_kept_in_stream_text() {
        let tokenizer = byte_level_tokenizer();
        let eos = tokenizer.token_to_id("<eos>").unwrap();
        assert!(tokenizer.is_special(eos));
        assert!(!tokenizer.is_special(tokenizer.encode("h").unwrap()[0]));
        assert_eq!(stream(&tokenizer, &[], &[eos]), vec!["<eos>".to_owned()]);
        assert_eq!(tokenizer.decode(&[eos], true).unwrap(), "");
    }

    #[test]
    fn tokenize_reports_character_offsets() {
        let tokenizer = byte_level_tokenizer();
        let tokens = tokenizer.tokenize("é hello", true).unwrap();
        let covered: String = tokens
            .iter()
            .map(|t| t.text.as_str())
            .collect::<Vec<_>>()
            .join("");
        assert!(covered.contains("hello"));
        let last = tokens.last().unwrap();
        assert_eq!(last.stop, "é hello".chars().count());
        for token in &tokens {
            assert!(token.start <= token.stop);
        }
    }

    proptest::proptest! {
        /// Any text, any mix of 1- to 4-byte characters: no streamed piece is broken and
        /// the pieces add up to the full decode.
        #[test]
        fn streamed_pieces_are_whole_and_complete(
            text in "[a-z hé日本🙂\\n]{0,40}",
            context in "[a-zé]{0,6}",
        ) {
            let tokenizer = byte_level_tokenizer();
            let prompt = tokenizer.encode(&context).unwrap();
            let ids = tokenizer.encode(&text).unwrap();
            let pieces = stream(&tokenizer, &prompt, &ids);
            for piece in &pieces {
                proptest::prop_assert!(!piece.contains(char::REPLACEMENT_CHARACTER));
            }
            proptest::prop_assert_eq!(pieces.concat(), tokenizer.decode(&ids, false).unwrap());
            proptest::prop_assert_eq!(pieces.concat(), text);
        }
    }

    #[test]
    fn token_bytes_recover_partial_characters() {
        let tokenizer = byte_level_tokenizer();
        let text = "a é日";
        let ids = tokenizer.encode(text).unwrap();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tokenizer.token_bytes(id))
            .collect();
        assert_eq!(bytes, text.as_bytes());
        let eos = tokenizer.token_to_id("<eos>").unwrap();
        assert_eq!(tokenizer.token_bytes(eos), b"<eos>");
        assert!(tokenizer.token_bytes(1_000_000).is_empty());
        assert_eq!(byte_fallback_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_fallback_token("<0x0>"), None);
    }
}
