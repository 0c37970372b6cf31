"""Builds and loads the model for a config.json."""

from __future__ import annotations

import torch

from ..attention.base import AttentionShape
from ..attention.registry import create_backend
from ..distributed import ParallelContext
from ..weights import WeightStore
from .config import ModelConfig
from .llama import LlamaForCausalLM
from .sharding import check_shardable, shard_heads

FAMILIES = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
}


def attention_shape(cfg: ModelConfig, ctx: ParallelContext) -> AttentionShape:
    heads = shard_heads(cfg, ctx)
    return AttentionShape(
        num_heads=heads.num_heads,
        num_kv_heads=heads.num_kv_heads,
        head_dim=cfg.head_dim,
        scale=cfg.head_dim**-0.5,
        sliding_window=cfg.sliding_window,
    )


def build_model(
    cfg: ModelConfig,
    store: WeightStore,
    ctx: ParallelContext,
    attention: str,
    dtype: torch.dtype,
    device: torch.device,
) -> LlamaForCausalLM:
    check_shardable(cfg, ctx.world_size)
    backend = create_backend(attention, attention_shape(cfg, ctx), dtype)
    model = FAMILIES[cfg.model_type](cfg, ctx, backend, dtype, device)
    with torch.no_grad():
        model.load(store)
    return model.eval()
