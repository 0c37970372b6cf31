"""Is the triton backend's disagreement with `reference` on the random 8B model a kernel bug
or bf16 noise? Compares, on the same random weights and prompts, first-step logits and greedy
tokens of: triton (bf16, CUDA graphs), reference (bf16), and reference in fp32 as the oracle.
If triton is as close to the fp32 oracle as bf16 reference is, the kernels are not the cause.

    PYTHONPATH=. python3 bench/gpu_precision_check.py --tokenizer-dir DIR --out OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import random
from pathlib import Path

import torch

from bench.gpu_model import write_random_llama
from bench.gpu_parity import _greedy_batch, parity_runner

TEXT_VOCAB = 49152


def fp32_reference_runner(model_dir: Path):
    from shard_server.distributed import ParallelContext
    from shard_server.kv_cache import KVSpec
    from shard_server.models.config import ModelConfig
    from shard_server.models.registry import build_model
    from shard_server.runner import ModelRunner
    from shard_server.warmup import PoolSizing, warmup
    from shard_server.weights import WeightStore, read_config

    cfg = ModelConfig.from_dict(read_config(model_dir))
    with WeightStore(model_dir) as store:
        model = build_model(cfg, store, ParallelContext(), "reference", torch.float32, torch.device("cuda"))
    spec = KVSpec(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 16, torch.float32)
    runner = ModelRunner(model, spec, torch.device("cuda"))
    warmup(runner, 4096, 8, PoolSizing(0, 0.9, ()))
    return runner


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def agreement(x: list[list[int]], y: list[list[int]]) -> dict:
    same = sum(p == q for s, t in zip(x, y) for p, q in zip(s, t))
    total = sum(len(s) for s in x)
    prefix = [next((k for k, (p, q) in enumerate(zip(s, t)) if p != q), len(s)) for s, t in zip(x, y)]
    return {"positionwise": same / total, "tokens_before_first_divergence": prefix}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    model_dir = Path("/tmp/textgen-random-8b")
    if not (model_dir / "model.safetensors").exists():
        write_random_llama(model_dir, args.tokenizer_dir, TEXT_VOCAB)
    rng = random.Random(0)
    prompts = [[rng.randrange(17, TEXT_VOCAB) for _ in range(rng.randint(16, 200))] for _ in range(8)]

    runner, shape = parity_runner(model_dir)
    triton_tokens, triton_logits = _greedy_batch(runner, prompts, args.new_tokens)
    from shard_server.attention.reference import ReferenceAttention

    reference = ReferenceAttention(shape)
    for layer in runner.model.layers:
        layer.self_attn.backend = reference
    runner.backend, runner.graphs = reference, None
    ref_tokens, ref_logits = _greedy_batch(runner, prompts, args.new_tokens)
    triton_logits, ref_logits = triton_logits.float().cpu(), ref_logits.float().cpu()
    del runner
    gc.collect()
    torch.cuda.empty_cache()

    oracle = fp32_reference_runner(model_dir)
    fp32_tokens, fp32_logits = _greedy_batch(oracle, prompts, args.new_tokens)
    fp32_logits = fp32_logits.float().cpu()
    top2 = fp32_logits.topk(2, dim=-1).values
    result = {
        "new_tokens": args.new_tokens,
        "first_step_rel_l2": {
            "triton_bf16_vs_fp32": rel_l2(triton_logits, fp32_logits),
            "reference_bf16_vs_fp32": rel_l2(ref_logits, fp32_logits),
            "triton_bf16_vs_reference_bf16": rel_l2(triton_logits, ref_logits),
        },
        "greedy_agreement": {
            "triton_bf16_vs_fp32": agreement(triton_tokens, fp32_tokens),
            "reference_bf16_vs_fp32": agreement(ref_tokens, fp32_tokens),
            "triton_bf16_vs_reference_bf16": agreement(triton_tokens, ref_tokens),
        },
        "fp32_first_step_top1_minus_top2_logit": [float(g) for g in (top2[:, 0] - top2[:, 1])],
        "fp32_first_step_logit_std": float(fp32_logits.std()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_precision_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
