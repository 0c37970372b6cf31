//! textgen's router: HTTP front end, validation, scheduling, KV accounting, streaming.
//! Layered top-down: `server` → `infer` → `validation`/`tokenizer` → `scheduler` → `kv`.
// The allocator of the server and of every example and test that links this crate. Tokenizing a
// long prompt allocates per piece, which glibc malloc made 25 % slower. jemalloc rather than
// mimalloc: under the soak's traffic in bursts mimalloc held 64-73 MiB of anonymous memory,
// moving by up to 9.5 MiB between idle samples, where jemalloc holds 38-42 MiB (issue 27's RSS bar);
// tokenizing 12 KB costs 2.64 ms against 2.41, and grammar compiles are alike (p99 13.0-14.0 ms
// against 12.8-14.0 over JSONSchemaBench). bench/results/router_allocator_cpu.md has the runs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub mod pb {
    tonic::include_proto!("textgen.shard.v1");
}

pub mod chat_template;
pub mod chunked_encoding;
pub mod config;
pub mod errors;
pub mod finish;
pub mod generation_defaults;
pub mod grammar;
pub mod infer;
pub mod kv;
pub mod metrics;
pub mod model_files;
pub mod sampling_rules;
pub mod scheduler;
pub mod schema;
pub mod server;
pub mod shards;
pub mod startup;
pub mod stop_sequences;
pub mod telemetry;
pub mod tokenizer;
pub mod tools;
pub mod validation;

#[cfg(test)]
mod test_support;
