"""OLMoE: MoE decoder layers whose attention normalises q and k over all their features.

Unlike Qwen3's per-head norms, OLMoE's `q_norm` is one RMSNorm over the whole q projection
(num_heads * head_dim features) and `k_norm` over the whole k projection; `clip_qkv` then clamps
q, k and v. Under tensor parallelism a rank holds only its heads' features, so the sum of squares
is all-reduced before normalising (a KV head replicated over r ranks is counted r times, and
divided by r again). On one rank each norm is one launch of the fused row norm.
"""

from __future__ import annotations

import torch

from ..distributed import ParallelContext
from ..kernels.dispatch import use_fused
from ..kernels.norm import fused_rmsnorm
from ..layers.linear import RowParallelLinear
from ..weights import WeightStore
from .config import ModelConfig
from .llama import LlamaAttention, _fp8
from .moe import MoeDecoderLayer, MoeForCausalLM
from .sharding import shard_heads


class OlmoeAttention(LlamaAttention):
    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backend, dtype, device):
        super().__init__(cfg, ctx, backend, dtype, device)
        d = cfg.head_dim
        heads = shard_heads(cfg, ctx)
        self.ctx = ctx
        self.eps = cfg.rms_norm_eps
        self.clip = cfg.moe.clip_qkv
        self.q_rows, self.kv_rows = heads.q_rows(d), heads.kv_rows(d)
        kv_heads = cfg.num_key_value_heads
        replicas = ctx.world_size // kv_heads if kv_heads < ctx.world_size else 1
        self.q_features = cfg.num_attention_heads * d
        self.k_features = kv_heads * d * replicas  # what the all-reduced sum of squares covers
        self.q_norm_weight = torch.nn.Parameter(torch.empty(self.q_rows.size, dtype=dtype, device=device), False)
        self.k_norm_weight = torch.nn.Parameter(torch.empty(self.kv_rows.size, dtype=dtype, device=device), False)
        if cfg.attention_bias:  # OLMoE's attention_bias also gives o_proj a bias
            self.o_proj = RowParallelLinear(cfg.num_attention_heads * d, cfg.hidden_size, True, ctx, dtype, device, _fp8(cfg))

    def load(self, store: WeightStore, prefix: str) -> None:
        super().load(store, prefix)
        self.q_norm_weight.copy_(store.get_rows(f"{prefix}.q_norm.weight", self.q_rows.start, self.q_rows.end))
        self.k_norm_weight.copy_(store.get_rows(f"{prefix}.k_norm.weight", self.kv_rows.start, self.kv_rows.end))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, features: int) -> torch.Tensor:
        if self.ctx.world_size == 1 and use_fused(x) and x.stride(1) == 1:  # its torch path is ~7 launches
            return fused_rmsnorm(x, weight, self.eps)[0]
        x32 = x.float()
        squares = self.ctx.all_reduce(x32.pow(2).sum(-1, keepdim=True))
        return weight * (x32 * torch.rsqrt(squares / features + self.eps)).to(x.dtype)

    def forward(self, hidden, rotary, k_cache, v_cache, metadata) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.split_sizes, dim=-1)
        q = self._norm(q, self.q_norm_weight, self.q_features)
        k = self._norm(k, self.k_norm_weight, self.k_features)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, k_cache, v_cache, metadata, rotary)
        return self.o_proj(out.reshape(tokens, -1))


class OlmoeDecoderLayer(MoeDecoderLayer):
    attention_class = OlmoeAttention


class OlmoeForCausalLM(MoeForCausalLM):
    decoder_layer = OlmoeDecoderLayer
