"""Greedy tokens and logits of the triton backend (with CUDA graphs) against `reference`,
on the same model in one process: 8 prompts x 128 new tokens, decoded as one batch; and the
`reference` backend against itself with the batch split in two (the model's noise floor).

In bf16 a random model's greedy tokens fork under any change of rounding (the noise floor is
far below 99 %), so the same comparison also runs in float32 (no TF32): there rounding moves
logits by ~1e-6, and a kernel that computes another function shows up as forked tokens."""

from __future__ import annotations

import random
from dataclasses import replace

import torch

from shard_server.attention.reference import ReferenceAttention
from shard_server.pb import generate_pb2 as pb
from shard_server.runner import ModelRunner
from shard_server.warmup import PoolSizing, warmup


def _greedy_batch(runner: ModelRunner, prompts: list[list[int]], new_tokens: int):
    """Returns (tokens per prompt, first-step logits of every prompt)."""
    bs = runner.block_size
    blocks, next_block = {}, 0

    def grow(i: int, total: int) -> list[int]:
        nonlocal next_block
        need = -(-total // bs) - blocks.get(i, 0)
        blocks[i] = blocks.get(i, 0) + need
        taken = list(range(next_block, next_block + need))
        next_block += need
        return taken

    request = pb.StepRequest(step_id=1)
    for i, p in enumerate(prompts):
        request.new_sequences.add(id=i, input_ids=p, prompt_len=len(p))
        request.sequences.add(id=i, num_tokens=len(p), new_block_ids=grow(i, len(p)), sample=True)
    captured = {}
    original = runner.model.compute_logits

    def recording(hidden, float32: bool = True):
        logits = original(hidden, float32)
        captured.setdefault("first", logits.float())
        return logits

    runner.model.compute_logits = recording
    try:
        response = runner.step(request)
    finally:
        runner.model.compute_logits = original
    out = {i: [] for i in range(len(prompts))}
    for step in range(new_tokens - 1):
        for o in response.outputs:
            out[o.id].append(o.token.id)
        request = pb.StepRequest(step_id=step + 2)
        for i, p in enumerate(prompts):
            request.sequences.add(id=i, num_tokens=1, new_block_ids=grow(i, len(p) + len(out[i])), sample=True)
        response = runner.step(request)
    for o in response.outputs:
        out[o.id].append(o.token.id)
    request = pb.StepRequest(step_id=10**6, released_ids=list(range(len(prompts))))
    runner.step(request)
    return [out[i] for i in range(len(prompts))], captured["first"]


def agreement(tokens_a, logits_a, tokens_b, logits_b) -> dict:
    """Positionwise greedy agreement, tokens before the first divergence, first-step logit gaps."""
    same = sum(a == b for t, r in zip(tokens_a, tokens_b) for a, b in zip(t, r))
    prefix = [next((k for k, (a, b) in enumerate(zip(t, r)) if a != b), len(t)) for t, r in zip(tokens_a, tokens_b)]
    diff = (logits_a - logits_b).abs()
    return {
        "positionwise_token_agreement": same / sum(len(t) for t in tokens_b),
        "tokens_before_first_divergence": prefix,
        "first_step_logits_max_abs_diff": float(diff.max()),
        "first_step_logits_max_abs": float(logits_b.abs().max()),
        "first_step_logits_rel_l2": float(diff.norm() / logits_b.norm()),
    }


def compare_backends(runner: ModelRunner, shape, text_vocab: int, prompts: int = 8, new_tokens: int = 128):
    """triton (with graphs) against `reference`, and `reference` against itself on the same
    prompts in two batches of half the size: the noise floor. Its kernels see other shapes and
    round differently; how far that alone moves the greedy tokens is how chaotic the model is."""
    rng = random.Random(0)
    batch = [[rng.randrange(17, text_vocab) for _ in range(rng.randint(16, 200))] for _ in range(prompts)]
    triton_tokens, triton_logits = _greedy_batch(runner, batch, new_tokens)
    graphs = runner.graphs
    runner.graphs = None
    reference = ReferenceAttention(shape)
    saved = [layer.self_attn.backend for layer in runner.model.layers]
    for layer in runner.model.layers:
        layer.self_attn.backend = reference
    runner.backend = reference
    try:
        ref_tokens, ref_logits = _greedy_batch(runner, batch, new_tokens)
        half = prompts // 2
        halves = [_greedy_batch(runner, part, new_tokens) for part in (batch[:half], batch[half:])]
    finally:
        for layer, backend in zip(runner.model.layers, saved):
            layer.self_attn.backend = backend
        runner.backend, runner.graphs = saved[0], graphs
    split_tokens = halves[0][0] + halves[1][0]
    split_logits = torch.cat([halves[0][1], halves[1][1]])
    return {
        "prompts": prompts,
        "new_tokens": new_tokens,
        **agreement(triton_tokens, triton_logits, ref_tokens, ref_logits),
        "reference_noise_floor": agreement(split_tokens, split_logits, ref_tokens, ref_logits),
    }


def parity_runner(model_dir, graph_sizes=(1, 2, 4, 8), memory_fraction: float = 0.4,
                  quantize: str | None = None, dtype: torch.dtype = torch.bfloat16,
                  kv_dtype: torch.dtype | None = None, mixed_buckets: tuple[int, ...] | None = None,
                  ) -> tuple[ModelRunner, object]:  # fmt: skip
    from shard_server.distributed import ParallelContext
    from shard_server.kv_cache import KVSpec
    from shard_server.models.config import ModelConfig
    from shard_server.models.registry import attention_shape, build_model
    from shard_server.weights import WeightStore, read_config

    cfg = replace(ModelConfig.from_dict(read_config(model_dir)), quantize=quantize)
    device = torch.device("cuda")
    ctx = ParallelContext()
    with WeightStore(model_dir) as store:
        model = build_model(cfg, store, ctx, "triton", dtype, device)
    spec = KVSpec(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 16, kv_dtype or dtype)
    runner = ModelRunner(model, spec, device)
    sizing = PoolSizing(0, memory_fraction, tuple(graph_sizes))
    if mixed_buckets is not None:
        sizing = replace(sizing, mixed_token_buckets=mixed_buckets)
    warmup(runner, 4096, max(graph_sizes), sizing)
    return runner, attention_shape(cfg, ctx)
