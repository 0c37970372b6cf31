use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::{Lowercase, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, ModelWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use super::*;

const WORDS: &[&str] = &[
    "the",
    "model",
    "token",
    "server",
    "batch",
    "prefix",
    "cache",
    "déjà",
    "naïve",
    "日本語",
    "données",
    "Straße",
    "stream",
    "it's",
    "we'll",
    "HTTP",
    "x86",
    "v2.1",
    "42",
    "2048",
    "—",
    "🙂",
    "(",
    ")",
    ",",
    ".",
    ":",
    "\"",
    "'",
    "#",
    "fn",
    "let",
    "=>",
];
const GAPS: &[&str] = &[
    " ", " ", " ", " ", "  ", "   ", "\n", "\n\n", " \n", "\t", " \t ", "\r\n", "",
];

fn random_text(rng: &mut StdRng, bytes: usize) -> String {
    let mut text = String::new();
    while text.len() < bytes {
        text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        text.push_str(GAPS[rng.random_range(0..GAPS.len())]);
    }
    text
}

/// A byte-level BPE trained on random text, with `pre_tokenizer` and a BOS template.
fn trained(pre_tokenizer: PreTokenizerWrapper) -> Tokenizer {
    let mut rng = StdRng::seed_from_u64(7);
    let corpus: Vec<String> = (0..200).map(|_| random_text(&mut rng, 400)).collect();
    let mut tokenizer = Tokenizer::new(ModelWrapper::BPE(BPE::default()));
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    let mut trainer = TrainerWrapper::BpeTrainer(
        BpeTrainerBuilder::new()
            .vocab_size(600)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .special_tokens(vec![AddedToken::from("<s>", true)])
            .build(),
    );
    tokenizer
        .train(&mut trainer, corpus.iter())
        .expect("training");
    let bos = tokenizer.token_to_id("<s>").expect("bos");
    let template = TemplateProcessing::builder()
        .try_single("<s> $A")
        .unwrap()
        .special_tokens(vec![("<s>", bos)])
        .build()
        .unwrap();
    tokenizer.with_post_processor(Some(template));
    tokenizer
}

fn llama3_split() -> PreTokenizerWrapper {
    Split::new(
        SplitPattern::Regex(SAFE_SPLIT_PATTERNS[0].into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap()
    .into()
}

fn variants() -> Vec<(&'static str, Tokenizer)> {
    vec![
        (
            "gpt2 byte level",
            trained(ByteLevel::new(false, true, true).into()),
        ),
        (
            "digits then byte level (SmolLM2)",
            trained(
                Sequence::new(vec![
                    Digits::new(true).into(),
                    ByteLevel::new(false, true, true).into(),
                ])
                .into(),
            ),
        ),
        (
            "split then byte level (Llama 3)",
            trained(
                Sequence::new(vec![
                    llama3_split(),
                    ByteLevel::new(false, true, false).into(),
                ])
                .into(),
            ),
        ),
    ]
}

#[test]
fn chunked_ids_equal_one_pass_on_random_texts() {
    let mut rng = StdRng::seed_from_u64(11);
    for (name, tokenizer) in variants() {
        let chunked = ChunkedEncoder {
            threads: 8,
            ..ChunkedEncoder::for_tokenizer(&tokenizer)
        };
        assert!(chunked.applies(), "{name}");
        for round in 0..25 {
            let bytes = MIN_PARALLEL_BYTES + rng.random_range(0..40_000);
            let text = random_text(&mut rng, bytes);
            for special in [true, false] {
                let want = tokenizer
                    .encode(text.as_str(), special)
                    .unwrap()
                    .get_ids()
                    .to_vec();
                let got = chunked
                    .encode(&tokenizer, &text, special)
                    .expect("long enough to chunk")
                    .unwrap();
                assert_eq!(got, want, "{name}, round {round}, special tokens {special}");
            }
        }
        let bos = tokenizer.token_to_id("<s>").unwrap();
        let text = random_text(&mut rng, 3 * MIN_PARALLEL_BYTES);
        let ids = chunked.encode(&tokenizer, &text, true).unwrap().unwrap();
        assert_eq!(
            ids.iter().filter(|&&id| id == bos).count(),
            1,
            "BOS once, not per chunk"
        );
    }
}

#[test]
fn cuts_fall_before_a_space_between_two_visible_characters() {
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..50 {
        let text = random_text(&mut rng, 20_000);
        let cuts = cut_points(&text, 8);
        assert!(cuts.len() <= 7 && cuts.len() >= 4, "{} cuts", cuts.len());
        assert!(cuts.windows(2).all(|w| w[0] < w[1]));
        for &cut in &cuts {
            assert_eq!(text.as_bytes()[cut], b' ');
            assert!(!text[..cut].chars().next_back().unwrap().is_whitespace());
            assert!(!text[cut + 1..].chars().next().unwrap().is_whitespace());
        }
    }
    assert!(cut_points(&"x".repeat(20_000), 8).is_empty());
    assert!(cut_points(&"ab  ".repeat(5_000), 8).is_empty()); // only double spaces
}

#[test]
fn other_pipelines_texts_with_added_tokens_and_short_texts_take_one_pass() {
    let byte_level = variants().remove(0).1;
    let encoder = ChunkedEncoder::for_tokenizer(&byte_level);
    let mut rng = StdRng::seed_from_u64(5);
    let long = random_text(&mut rng, 2 * MIN_PARALLEL_BYTES);
    assert!(encoder
        .encode(&byte_level, &long[..MIN_PARALLEL_BYTES / 2], true)
        .is_none());
    assert!(encoder
        .encode(&byte_level, &format!("{long} <s> {long}"), true)
        .is_none());

    let mut lowercase = byte_level.clone();
    lowercase.with_normalizer(Some(Lowercase));
    assert!(!ChunkedEncoder::for_tokenizer(&lowercase).applies());
    let mut nfc = byte_level.clone();
    nfc.with_normalizer(Some(NFC));
    assert!(ChunkedEncoder::for_tokenizer(&nfc).applies());

    let mut metaspace = byte_level.clone();
    metaspace.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::First, true)));
    assert!(!ChunkedEncoder::for_tokenizer(&metaspace).applies());
    let custom = Split::new(
        SplitPattern::Regex(r"\w+ \w+|\s+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap();
    let mut joined = byte_level.clone();
    joined.with_pre_tokenizer(Some(custom));
    assert!(
        !ChunkedEncoder::for_tokenizer(&joined).applies(),
        "a pattern that may join across a space"
    );
}
