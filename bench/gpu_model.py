"""A Llama-3-8B-shaped model with seeded random bf16 weights, and the GPU's two ceilings.

The weights are random, so greedy decoding could pick tokens the demo tokenizer cannot
decode (ids >= its vocabulary) or its special tokens (EOS would end a benchmark request
early): those rows of lm_head are zero, so their logit is 0 and never the maximum.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

LLAMA3_8B = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="bfloat16",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
SPECIAL_IDS = range(17)  # the demo tokenizer's special tokens


def _layer_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    return {
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "mlp.gate_proj.weight": (i, h),
        "mlp.up_proj.weight": (i, h),
        "mlp.down_proj.weight": (h, i),
    }


def write_random_llama(directory: Path, tokenizer_dir: Path, text_vocab: int, seed: int = 0) -> int:
    """Writes config, weights and tokenizer; returns the parameter count."""
    cfg = LLAMA3_8B
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator("cuda").manual_seed(seed)

    def normal(shape, std=0.02):
        return (torch.randn(shape, generator=gen, device="cuda") * std).to(torch.bfloat16)

    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    tensors = {"model.embed_tokens.weight": normal((vocab, h)), "model.norm.weight": torch.ones(h)}
    head = normal((vocab, h))
    head[text_vocab:] = 0
    head[list(SPECIAL_IDS)] = 0
    tensors["lm_head.weight"] = head
    for layer in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for name, shape in _layer_shapes(cfg).items():
            tensors[prefix + name] = normal(shape)
        tensors[prefix + "input_layernorm.weight"] = torch.ones(h)
        tensors[prefix + "post_attention_layernorm.weight"] = torch.ones(h)
    params = sum(t.numel() for t in tensors.values())
    cpu = {name: t.to(torch.bfloat16).cpu().contiguous() for name, t in tensors.items()}
    del tensors
    save_file(cpu, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, directory / name)
    return params


def _time_ms(fn, warmup: int = 3, repeat: int = 10) -> float:
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth_bytes_per_s(size_bytes: int = 4 << 30) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    src = torch.randn(size_bytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src))
    return 2 * size_bytes / (ms / 1e3)


def bf16_matmul_flops_per_s(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = _time_ms(lambda: a @ b)
    return 2 * n**3 / (ms / 1e3)
