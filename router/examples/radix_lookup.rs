//! Lookup cost of the radix prefix cache: 4k-token prompts against a tree of 100k
//! blocks. Run from the repository root:
//! `cargo run --release --manifest-path router/Cargo.toml --example radix_lookup`
//! It prints JSON and writes it to bench/results/radix_lookup.json.
use std::path::Path;

use textgen_router::kv::radix_bench;

fn main() -> anyhow::Result<()> {
    let report = radix_bench::measure(100_000, 4096, 16);
    let json = serde_json::to_string_pretty(&serde_json::json!({
        "benchmark": "radix prefix cache lookup",
        "bar_us": 10.0,
        "machine": std::env::args().nth(1).unwrap_or_else(|| "unnamed".into()),
        "report": report,
    }))?;
    println!("{json}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/results/radix_lookup.json");
    std::fs::create_dir_all(out.parent().expect("has a parent"))?;
    std::fs::write(&out, json + "\n")?;
    Ok(())
}
