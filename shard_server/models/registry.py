"""Builds and loads the model for a config.json."""

from __future__ import annotations

import torch

from ..attention.base import AttentionShape
from ..attention.per_layer import layer_backends
from ..attention.registry import create_backend
from ..distributed import ParallelContext
from ..layers.linear import packed_linears
from ..weights import WeightStore
from .causal_lm import CausalLM, check_causal_lm
from .config import ModelConfig
from .gemma import GemmaForCausalLM
from .llama import LlamaForCausalLM
from .moe import MoeForCausalLM
from .olmoe import OlmoeForCausalLM
from .phi3 import Phi3ForCausalLM
from .sharding import check_shardable, shard_heads

# model_type -> the family's model class, built as cls(cfg, ctx, backend, dtype, device) where
# `backend` is one AttentionBackend, or a list of per-layer views when the config has
# `layer_windows`; the instance must be a CausalLM.
FAMILIES = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
    "gemma2": GemmaForCausalLM,
    "gemma3_text": GemmaForCausalLM,
    "gemma3": GemmaForCausalLM,  # the multimodal checkpoint's language model (text only)
    "phi3": Phi3ForCausalLM,
    "mixtral": MoeForCausalLM,
    "qwen2_moe": MoeForCausalLM,
    "qwen3_moe": MoeForCausalLM,
    "olmoe": OlmoeForCausalLM,
}


def attention_shape(cfg: ModelConfig, ctx: ParallelContext) -> AttentionShape:
    heads = shard_heads(cfg, ctx)
    return AttentionShape(
        num_heads=heads.num_heads,
        num_kv_heads=heads.num_kv_heads,
        head_dim=cfg.head_dim,
        scale=cfg.head_dim**-0.5 if cfg.attention_scale is None else cfg.attention_scale,
        sliding_window=cfg.sliding_window,
        logit_softcap=cfg.attn_logit_softcap,
    )


def build_model(
    cfg: ModelConfig,
    store: WeightStore,
    ctx: ParallelContext,
    attention: str,
    dtype: torch.dtype,
    device: torch.device,
) -> CausalLM:
    check_shardable(cfg, ctx.world_size)
    if cfg.layer_windows is None:
        backend = create_backend(attention, attention_shape(cfg, ctx), dtype)
    else:  # a list: one backend view per layer (Gemma)
        backend = layer_backends(attention, attention_shape(cfg, ctx), cfg.layer_windows, dtype)
    with packed_linears(cfg.packed):  # GPTQ/AWQ: the decoder's linears keep their weights packed
        model = check_causal_lm(FAMILIES[cfg.model_type](cfg, ctx, backend, dtype, device))
    with torch.no_grad():
        model.load(store)
    return model.eval()
