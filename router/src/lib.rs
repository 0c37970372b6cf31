//! textgen's router: HTTP front end, validation, scheduling, KV accounting, streaming.
//! Layered top-down: `server` → `infer` → `validation`/`tokenizer` → `scheduler` → `kv`.
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
