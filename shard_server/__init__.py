"""textgen-shard: the Python/torch process that computes what the router schedules.

One shard runs per GPU (rank r of N). It serves the `TextGenerationShard` gRPC service of
`proto/generate.proto` on the unix socket `{uds_path}-{rank}` and holds:

* the model weights (`weights.py`, `models/`, `layers/`), loaded from safetensors; each rank
  reads only its slice (`distributed.py`);
* the paged KV pool (`kv_cache.py`), addressed through block tables owned by the router;
* the per-sequence state table (`requests.py`): tokens so far, computed length, block table,
  sampling parameters;
* the step executor (`runner.py`): turns a StepRequest into one batched forward pass over
  prefill chunks and decodes, then samples (`sampling.py`) and reports the tokens.

Attention kernels sit behind one interface (`attention/base.py`); `reference` is plain torch
and runs on any device. The process is started by `textgen-shard serve ...` (`cli.py`).
"""
