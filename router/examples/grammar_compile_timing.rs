//! Times the router's own grammar compile (`GrammarCompiler::compile_blocking`: llguidance's
//! parser for the schema plus its first mask, the gate before admission) over a directory of
//! JSONSchemaBench files, one at a time on this thread, with the router's allocator.
//! `bench/grammar_conformance.py` times llguidance's Python wheel, which builds the parser
//! but computes no mask; this is what a request waits for.
//!
//!     cargo run --release --example grammar_compile_timing -- TOKENIZER_JSON VOCAB_SIZE EOS_ID DIR [OUT_JSON]
//!
//! Prints the count compiled and refused and the compile time's p50 / p99 / max in ms of
//! thread CPU time over the schemas that compiled (a refused schema is answered 400 instead);
//! each refused file and why on stderr.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use textgen_router::grammar::{token_env, GrammarCompiler, GrammarLimits, GrammarRequest};
use textgen_router::tokenizer::TextTokenizer;

/// CPU time this thread has used: a busy neighbour on a shared core does not count.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

fn schema_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)
            .expect("readable directory")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((q / 100.0) * (sorted.len() - 1) as f64).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let tokenizer = Arc::new(TextTokenizer::from_file(Path::new(&args[1]))?);
    let vocab_size: u32 = args[2].parse()?;
    let eos: u32 = args[3].parse()?;
    let env = token_env(tokenizer, vocab_size, &[eos])?;
    let limits = GrammarLimits {
        max_bytes: usize::MAX,
        compile_timeout: Duration::from_secs(60),
    };
    let compiler = GrammarCompiler::new(env, vec![eos], limits)?;
    let (mut times, mut refused) = (Vec::new(), 0usize);
    for path in schema_files(Path::new(&args[4])) {
        let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let Some(schema) = file.get("schema").cloned() else {
            continue;
        };
        let request = GrammarRequest::JsonSchema(schema);
        let started = thread_cpu();
        let compiled = compiler.compile_blocking(&request);
        let took = (thread_cpu() - started).as_secs_f64() * 1e3;
        match compiled {
            Ok(_) => times.push(took),
            Err(error) => {
                refused += 1;
                eprintln!("refused {}: {error}", path.display());
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let summary = serde_json::json!({
        "compiled": times.len(),
        "refused": refused,
        "compile_cpu_ms": {
            "p50": percentile(&times, 50.0),
            "p99": percentile(&times, 99.0),
            "max": times.last(),
        },
    });
    println!("{summary}");
    if let Some(out) = args.get(5) {
        std::fs::write(out, serde_json::to_string_pretty(&summary)?)?;
    }
    Ok(())
}
