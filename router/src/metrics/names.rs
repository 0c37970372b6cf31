//! Every metric's name, in one place: the code records under these constants, and the
//! catalog describes them.
pub const REQUESTS_TOTAL: &str = "textgen_requests_total";
pub const TIME_TO_FIRST_TOKEN: &str = "textgen_time_to_first_token_seconds";
pub const INTER_TOKEN_LATENCY: &str = "textgen_inter_token_latency_seconds";
pub const REQUEST_DURATION: &str = "textgen_request_duration_seconds";
pub const QUEUE_DURATION: &str = "textgen_queue_duration_seconds";
pub const PROMPT_TOKENS_TOTAL: &str = "textgen_prompt_tokens_total";
pub const GENERATED_TOKENS_TOTAL: &str = "textgen_generated_tokens_total";
pub const STEP_BATCH_SIZE: &str = "textgen_step_batch_size";
pub const STEP_TOKENS: &str = "textgen_step_tokens";
pub const STEP_DURATION: &str = "textgen_step_duration_seconds";
pub const WAITING_REQUESTS: &str = "textgen_waiting_requests";
pub const RUNNING_REQUESTS: &str = "textgen_running_requests";
pub const KV_BLOCKS_USED: &str = "textgen_kv_blocks_used";
pub const KV_BLOCKS_CAPACITY: &str = "textgen_kv_blocks_capacity";
pub const PREFIX_CACHE_BLOCKS: &str = "textgen_prefix_cache_blocks";
pub const PREEMPTIONS_TOTAL: &str = "textgen_preemptions_total";
pub const OUT_OF_MEMORY_STEPS_TOTAL: &str = "textgen_out_of_memory_steps_total";
pub const PREFILL_TOKEN_CAP: &str = "textgen_prefill_token_cap";
pub const PREFILL_PACED_STEPS_TOTAL: &str = "textgen_prefill_paced_steps_total";
pub const SPECULATIVE_DRAFT_TOKENS_TOTAL: &str = "textgen_speculative_draft_tokens_total";
pub const SPECULATIVE_ACCEPTED_TOKENS_TOTAL: &str = "textgen_speculative_accepted_tokens_total";
pub const SPECULATIVE_ACCEPTED_LENGTH: &str = "textgen_speculative_accepted_length";
pub const PREFIX_CACHE_QUERIES_TOKENS_TOTAL: &str = "textgen_prefix_cache_queries_tokens_total";
pub const PREFIX_CACHE_HITS_TOKENS_TOTAL: &str = "textgen_prefix_cache_hits_tokens_total";
pub const PREFIX_CACHE_HITS_GENERATED_TOKENS_TOTAL: &str =
    "textgen_prefix_cache_hits_generated_tokens_total";
pub const PREFIX_CACHE_EVICTED_BLOCKS_TOTAL: &str = "textgen_prefix_cache_evicted_blocks_total";
pub const SHARD_FORWARD_DURATION: &str = "textgen_shard_forward_duration_seconds";
pub const SHARD_SAMPLING_DURATION: &str = "textgen_shard_sampling_duration_seconds";
pub const SHARD_DEVICE_DURATION: &str = "textgen_shard_device_duration_seconds";
pub const SHARD_GRAMMAR_MASK_DURATION: &str = "textgen_shard_grammar_mask_duration_seconds";
pub const SHARD_DRAFT_DURATION: &str = "textgen_shard_draft_duration_seconds";
pub const GRAMMAR_COMPILE_DURATION: &str = "textgen_grammar_compile_duration_seconds";
pub const CONSTRAINED_REQUESTS_TOTAL: &str = "textgen_constrained_requests_total";
pub const GRAMMAR_REFUSALS_TOTAL: &str = "textgen_grammar_refusals_total";
pub const BUILD_INFO: &str = "textgen_build_info";
