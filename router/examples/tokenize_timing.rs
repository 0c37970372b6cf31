//! Times one-pass against chunked tokenization of a long text, the router's way (its allocator
//! included), on texts that differ every round so the BPE cache stays as cold as in serving.
//!
//!     cargo run --release --example tokenize_timing -- TOKENIZER_JSON TEXT_FILE [ROUNDS]
use std::time::Instant;

use textgen_router::chunked_encoding::ChunkedEncoder;

fn median_ms(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tokenizer = tokenizers::Tokenizer::from_file(&args[1]).expect("tokenizer.json");
    let text = std::fs::read_to_string(&args[2]).expect("text file");
    let rounds: usize = args.get(3).map_or(40, |r| r.parse().expect("rounds"));
    let encoder = ChunkedEncoder::for_tokenizer(&tokenizer);
    assert!(
        encoder.applies(),
        "this tokenizer never takes the chunked path"
    );
    let words: Vec<&str> = text.split(' ').collect();
    let (mut single, mut chunked) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let at = (round * 37) % words.len(); // the words rotated: another text, the same length
        let rotated = [&words[at..], &words[..at]].concat().join(" ");
        let started = Instant::now();
        let one_pass = tokenizer.encode(rotated.as_str(), true).expect("encode");
        single.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        let ids = encoder
            .encode(&tokenizer, &rotated, true)
            .expect("long enough")
            .expect("encode");
        chunked.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(ids, one_pass.get_ids(), "chunked ids differ from one pass");
    }
    println!(
        "{{\"bytes\": {}, \"threads\": {}, \"one_pass_ms\": {:.3}, \"chunked_ms\": {:.3}}}",
        text.len(),
        std::thread::available_parallelism().map_or(1, usize::from),
        median_ms(single),
        median_ms(chunked)
    );
}
