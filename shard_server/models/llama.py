"""Llama-family decoder: Llama 2/3, Mistral, Qwen2 (qkv bias), Qwen3 (q/k RMSNorm,
explicit head_dim) and SmolLM2 (tied embeddings), sharing one implementation with flags.

Tensors are flattened over the step's tokens: hidden states are [T, hidden].
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import AttentionBackend
from ..distributed import ParallelContext
from ..kernels.activation import TORCH_ACTIVATIONS, fused_act_mul
from ..kernels.dispatch import use_fused
from ..kv_cache import KVCache
from ..layers.embedding import LMHead, VocabParallelEmbedding
from ..layers.linear import ColumnParallelLinear, RowParallelLinear
from ..layers.norm import RMSNorm
from ..layers.rotary import HeadNormedRotation, RotaryEmbedding, RotaryStep
from ..weights import WeightStore
from .config import ModelConfig
from .sharding import even_rows, shard_heads


def _fp8(cfg: ModelConfig) -> bool:
    """Whether the decoder's linear weights are fp8 (the embeddings and the LM head never are)."""
    return cfg.quantize == "fp8"


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backend: AttentionBackend, dtype, device):
        super().__init__()
        d = cfg.head_dim
        heads = shard_heads(cfg, ctx)
        self.num_heads = heads.num_heads
        self.num_kv_heads = heads.num_kv_heads
        self.head_dim = d
        self.backend = backend
        q_rows, kv_rows = heads.q_rows(d), heads.kv_rows(d)
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, [q_rows, kv_rows, kv_rows], cfg.attention_bias, dtype, device, _fp8(cfg)
        )
        self.o_proj = RowParallelLinear(
            cfg.num_attention_heads * d, cfg.hidden_size, False, ctx, dtype, device, _fp8(cfg)
        )
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, dtype, device)
        self.split_sizes = [self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d]

    def load(self, store: WeightStore, prefix: str) -> None:
        self.qkv_proj.load(store, [f"{prefix}.q_proj", f"{prefix}.k_proj", f"{prefix}.v_proj"])
        self.o_proj.load(store, f"{prefix}.o_proj")
        if self.q_norm is not None:
            self.q_norm.load(store, f"{prefix}.q_norm.weight")
            self.k_norm.load(store, f"{prefix}.k_norm.weight")

    def forward(self, hidden, rotary: RotaryStep, k_cache, v_cache, metadata) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.split_sizes, dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # normed on the way, in the backend's rotary launch where it fuses
            rotary = HeadNormedRotation(rotary, (self.q_norm, self.k_norm))
        out = self.backend.forward(q, k, v, k_cache, v_cache, metadata, rotary)
        return self.o_proj(out.reshape(tokens, -1))


class LlamaMLP(nn.Module):
    activation = "silu"  # a family with another gated activation (Gemma's GeGLU) names it

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, dtype, device):
        super().__init__()
        size = cfg.intermediate_size
        rows = even_rows(size, ctx)
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [rows, rows], False, dtype, device, _fp8(cfg))
        self.down_proj = RowParallelLinear(size, cfg.hidden_size, False, ctx, dtype, device, _fp8(cfg))

    def load(self, store: WeightStore, prefix: str) -> None:
        self.gate_up_proj.load(store, [f"{prefix}.gate_proj", f"{prefix}.up_proj"])
        self.down_proj.load(store, f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if use_fused(gate_up) and gate_up.dim() == 2:
            quantize = self.down_proj.takes_fp8_rows(gate_up)
            return self.down_proj(fused_act_mul(gate_up, self.activation, quantize=quantize))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(TORCH_ACTIVATIONS[self.activation](gate) * up)


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention  # a family with another checkpoint layout (Phi-3) replaces these
    mlp_cls = LlamaMLP

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backend: AttentionBackend, dtype, device):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = self.attention_cls(cfg, ctx, backend, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = self.mlp_cls(cfg, ctx, dtype, device)

    def load(self, store: WeightStore, prefix: str) -> None:
        self.input_layernorm.load(store, f"{prefix}.input_layernorm.weight")
        self.self_attn.load(store, f"{prefix}.self_attn")
        self.post_attention_layernorm.load(store, f"{prefix}.post_attention_layernorm.weight")
        self.mlp.load(store, f"{prefix}.mlp")

    def forward(self, hidden, residual, rotary: RotaryStep, k_cache, v_cache, metadata):
        # With fp8 weights the norms hand qkv and gate_up their rows quantized (`Fp8Rows`).
        quantize = self.self_attn.qkv_proj.takes_fp8_rows(hidden)
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden, quantize)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual, quantize)
        hidden = self.self_attn(hidden, rotary, k_cache, v_cache, metadata)
        quantize = self.mlp.gate_up_proj.takes_fp8_rows(hidden)
        hidden, residual = self.post_attention_layernorm.add_and_norm(hidden, residual, quantize)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    decoder_layer = LlamaDecoderLayer  # a family's layer class (e.g. MoE layers) may replace it

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backend: AttentionBackend, dtype, device):
        super().__init__()
        self.config = cfg
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, ctx, dtype, device)
        self.layers = nn.ModuleList(
            self.decoder_layer(cfg, ctx, backend, dtype, device) for _ in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        tied = self.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size, ctx, dtype, device, tied_to=tied)
        self.rotary = RotaryEmbedding(  # partial rotary (phi3): the first rotary_dim dims of each head
            cfg.rotary_dim or cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, dtype, device
        )
        # The CausalLM interface (causal_lm.py): every layer shares the one backend and window.
        self.attention_backend = backend
        self.layer_windows = (cfg.sliding_window,) * cfg.num_hidden_layers

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def load(self, store: WeightStore) -> None:
        self.embed_tokens.load(store, "model.embed_tokens.weight")
        for i, layer in enumerate(self.layers):
            layer.load(store, f"model.layers.{i}")
        self.norm.load(store, "model.norm.weight")
        if not self.config.tie_word_embeddings:
            self.lm_head.load(store, "lm_head.weight")

    def forward(self, input_ids, positions, kv_cache: KVCache, metadata) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] of every token of the step."""
        rotary = self.rotary.for_step(positions)
        hidden, residual = self.embed_tokens(input_ids), None
        for index, layer in enumerate(self.layers):
            k_cache, v_cache = kv_cache.layer(index)
            hidden, residual = layer(hidden, residual, rotary, k_cache, v_cache, metadata)
        hidden, _ = self.norm.add_and_norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        return self.lm_head(hidden, float32)
