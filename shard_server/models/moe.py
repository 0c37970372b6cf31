"""The Mixture-of-Experts block: router, top-k routing, routed experts and a shared expert.

Maths (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, as in transformers):
    probs = softmax(float32(x @ router.T)); weights, ids = topk(probs, k)
    weights /= weights.sum()                        # when renormalising (norm_topk_prob; Mixtral always)
    y = sum_j weights[j] * down_e(silu(gate_e(x)) * up_e(x)) for e = ids[j]
    y += sigmoid(x @ shared_gate.T) * shared(x)     # Qwen2-MoE's shared expert

Tensor parallelism slices every expert (and the shared expert) by its intermediate size: a rank
holds rows [start, end) of each expert's gate and up weights and the same columns of its down
weight, reading only that slice from the checkpoint. The router is replicated, so every rank
routes alike; each rank's output is a partial sum, and the block does one all-reduce at the end.

The routed experts' weights are stacked the way a grouped-GEMM kernel wants them:
`w13` [experts, 2 * local intermediate, hidden] (gate rows, then up rows) and `w2`
[experts, hidden, local intermediate]. `experts_forward` runs them on the fused Triton paths
(CUDA-graph capturable) where `use_fused` says so and they take the weights (float, or fp8 with
their scales): `kernels/moe_pairs.py` pair by pair for a decode batch with few (token, expert)
pairs, else `kernels/fused_moe.py` (pairs sorted by expert, two grouped GEMMs). Else
`reference_experts`, the plain-torch oracle (an eager loop over the experts that were hit, with
data-dependent shapes), or under CUDA-graph capture `dense_experts`, its static-shape twin
(correct but experts/top_k times the work).

GPTQ, AWQ and compressed-tensors pack-quantized experts stay packed (`layers/packed_experts.py`,
one stack for gate_up and one for down) and run on their own kernels, pair by pair for a decode
batch of 2+ tokens with few pairs (`kernels/moe_pairs_packed.py`), else grouped
(`kernels/fused_moe_packed.py`); the reference dequantizes each hit expert.

fp8 experts carry float32 scales (`kernels/expert_scales.py`): one a row (`--quantize fp8` on a
bf16/fp16 checkpoint, or a per-channel fp8 checkpoint's), or a block-wise fp8 checkpoint's
[bn, bk] block scales as stored (Qwen3-30B-A3B-FP8: 128x128). A rank reads only its slice of
each expert's fp8 weight and the scale blocks that slice touches; the slice need not fall on a
block boundary (Qwen3-30B-A3B's 768 intermediate rows over 4 ranks are 192 a rank, one and a
half blocks): the scales keep where the slice starts inside its first block, and both the kernel
and the reference index blocks from there, so every rank's weights are the checkpoint's exactly.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import ParallelContext
from ..kernels.dispatch import use_fused
from ..kernels.fp8_matmul import FP8
from ..kernels.expert_scales import dequantize_experts, scale_shapes
from ..kernels.fused_moe import ExpertScales, fused_experts, fused_moe_applies
from ..kernels.fused_moe_packed import fused_packed_experts, packed_moe_applies
from ..kernels.moe_pairs import pair_experts, pairs_apply
from ..kernels.moe_pairs_packed import packed_pair_experts, packed_pairs_apply
from ..kernels.moe_routing import fused_route, routes_in_one_launch
from ..layers.linear import weight_rows
from ..layers.quantized import block_fp8_part, block_fp8_slice
from ..layers.norm import RMSNorm
from ..layers.packed_experts import PackedExperts, load_packed_experts
from ..weights import WeightStore
from .config import ModelConfig
from .errors import UnsupportedModelError
from .llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from .moe_config import MoeConfig
from .quantization import BlockFp8Scheme, PackedScheme
from .sharding import ShardingError


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts in float32, then the top k: (weights float32 [T, k], ids int64 [T, k]).
    One Triton launch where fused kernels apply (`kernels/moe_routing.py`), else `reference_route`."""
    if use_fused(router_logits) and routes_in_one_launch(router_logits, top_k):
        return fused_route(router_logits, top_k, renormalize)
    return reference_route(router_logits, top_k, renormalize)


def reference_route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def reference_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    scales: ExpertScales | None = None,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]), accumulated in float32: [T, hidden]
    in x's dtype. With tensor parallelism this is the rank's partial sum. fp8 experts (`scales`,
    per row or per block) and packed ones (`PackedExperts`) are dequantized one at a time to x's
    dtype (`_dequantized`)."""
    tokens, hidden = x.shape
    if scales is not None:
        scales.check(w13, w2)
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    experts = w13.experts if isinstance(w13, PackedExperts) else w13.shape[0]
    counts = torch.bincount(flat_ids, minlength=experts).tolist()
    token_of = order // topk_ids.shape[1]
    weight_of = topk_weights.reshape(-1)[order]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = token_of[start : start + count]
        gate_up, down = _dequantized(w13, w2, scales, x.dtype, expert)
        gate, up = F.linear(x[rows], gate_up).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down)
        out[rows] += y.float() * weight_of[start : start + count, None]  # a token picks an expert once
        start += count
    return out.to(x.dtype)


def _dequantized(w13, w2, scales: ExpertScales | None, dtype: torch.dtype, expert: int | None = None):
    """The experts' (or `expert`'s) gate_up and down weights in `dtype`, as the kernels use them."""
    if isinstance(w13, PackedExperts):
        return w13.dequantize(dtype, expert), w2.dequantize(dtype, expert)
    return dequantize_experts(w13, w2, scales, dtype, expert)


def dense_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    scales: ExpertScales | None = None,
) -> torch.Tensor:
    """The same sum with static shapes (every expert on every token, weighted by a dense [T, experts]
    combine matrix that is zero off the top k): what a CUDA graph can capture where the fused
    kernel is switched off. experts/top_k times the reference's work."""
    w13, w2 = _dequantized(w13, w2, scales, x.dtype)
    combine = torch.zeros(x.shape[0], w13.shape[0], dtype=torch.float32, device=x.device)
    combine.scatter_(1, topk_ids, topk_weights.float())
    gate, up = torch.einsum("th,eih->eti", x, w13).chunk(2, dim=-1)
    y = torch.einsum("eti,ehi->eth", F.silu(gate) * up, w2)
    return torch.einsum("eth,te->th", y.float(), combine).to(x.dtype)


def experts_forward(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    scales: ExpertScales | None = None,
) -> torch.Tensor:
    """The routed experts' output [T, hidden]: pair by pair for a decode batch with few pairs an
    expert (`pairs_apply`), else the grouped kernel, where they apply; else the reference loop, or
    its static-shape twin under CUDA-graph capture (the loop syncs with the host). Packed
    (GPTQ / AWQ) experts take their own kernels alike: pair by pair (`moe_pairs_packed.py`) or
    grouped (`fused_moe_packed.py`)."""
    if isinstance(w13, PackedExperts):
        if use_fused(x) and packed_pairs_apply(x, w13, w2, topk_ids):
            return packed_pair_experts(x, w13, w2, topk_weights, topk_ids)
        if use_fused(x) and packed_moe_applies(x, w13, w2):
            return fused_packed_experts(x, w13, w2, topk_weights, topk_ids)
    elif use_fused(x) and pairs_apply(x, w13, w2, topk_ids, scales):
        return pair_experts(x, w13, w2, topk_weights, topk_ids, scales)
    elif use_fused(x) and fused_moe_applies(x, w13, w2, scales):
        return fused_experts(x, w13, w2, topk_weights, topk_ids, scales=scales)
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return dense_experts(x, w13, w2, topk_weights, topk_ids, scales)
    return reference_experts(x, w13, w2, topk_weights, topk_ids, scales)


class MoeBlock(nn.Module):
    """Router + routed experts (+ Qwen2-MoE's gated shared expert), sliced for this rank."""

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, dtype, device):
        super().__init__()
        moe: MoeConfig = cfg.moe
        check_moe_shardable(cfg, ctx.world_size)
        self.ctx = ctx
        self.moe = moe
        hidden, size = cfg.hidden_size, moe.expert_intermediate_size
        self.rows = ctx.split(size, "expert intermediate size")
        local = self.rows[1] - self.rows[0]
        self.router = nn.Parameter(torch.empty(moe.num_experts, hidden, dtype=dtype, device=device), requires_grad=False)
        fp8 = cfg.quantize == "fp8"  # e4m3 experts with float32 scales (--quantize fp8, or the checkpoint's)
        # A block-wise fp8 checkpoint's experts keep their block scales (see the module docstring).
        self.block_fp8 = cfg.packed if isinstance(cfg.packed, BlockFp8Scheme) else None
        self.scale_block = None if self.block_fp8 is None else self.block_fp8.block  # None: a scale a row
        # A GPTQ / AWQ / pack-quantized checkpoint's experts stay packed: `load` stacks them.
        self.packed = cfg.packed if isinstance(cfg.packed, PackedScheme) else None
        self.w13 = self.w2 = self.w13_scale = self.w2_scale = None
        if self.packed is None:
            self.w13 = nn.Parameter(
                torch.empty(moe.num_experts, 2 * local, hidden, dtype=FP8 if fp8 else dtype, device=device),
                requires_grad=False,
            )
            self.w2 = nn.Parameter(
                torch.empty(moe.num_experts, hidden, local, dtype=FP8 if fp8 else dtype, device=device),
                requires_grad=False,
            )
        if fp8:
            # Per row, or the blocks this rank's slice (from intermediate row rows[0]) touches.
            shape13, shape2 = scale_shapes(self.scale_block, self.rows[0], moe.num_experts, local, hidden)
            self.w13_scale = nn.Parameter(torch.empty(shape13, device=device), requires_grad=False)
            self.w2_scale = nn.Parameter(torch.empty(shape2, device=device), requires_grad=False)
        self.shared_expert = self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:
            # A dense MLP sliced like the Llama MLP; its down projection is not all-reduced on its
            # own (`partial`): the block's one all-reduce sums it with the routed experts.
            shared_cfg = _with_intermediate(cfg, moe.shared_expert_intermediate_size)
            self.shared_expert = LlamaMLP(shared_cfg, _NoReduce(ctx.rank, ctx.world_size), dtype, device)
            self.shared_expert_gate = nn.Parameter(torch.empty(1, hidden, dtype=dtype, device=device), requires_grad=False)

    def load(self, store: WeightStore, prefix: str) -> None:
        hidden = self.router.shape[1]
        self.router.copy_(self._read(store, f"{prefix}.gate", hidden))
        if self.packed is not None:
            self.w13, self.w2 = load_packed_experts(store, self.packed, prefix, self.moe, hidden, self.rows,
                                                    self.router.dtype, self.router.device)  # fmt: skip
        else:
            self._load_experts(store, prefix)
        if self.shared_expert is not None:
            self.shared_expert.load(store, f"{prefix}.shared_expert")
            self.shared_expert_gate.copy_(store.get(f"{prefix}.shared_expert_gate.weight"))

    def _load_experts(self, store: WeightStore, prefix: str) -> None:
        """The routed experts of a float, fp8 or block-wise fp8 checkpoint, into w13 and w2."""
        start, end = self.rows
        local = end - start
        gate_name, up_name, down_name = self.moe.weight_names
        hidden, size = self.router.shape[1], self.moe.expert_intermediate_size
        for e in range(self.moe.num_experts):
            expert = f"{prefix}.experts.{e}"
            if self.block_fp8 is not None:
                self._load_block_fp8(store, expert, e)
                continue
            self._fill(self.w13, self.w13_scale, (e, slice(0, local)), store, f"{expert}.{gate_name}", start,
                       self._read(store, f"{expert}.{gate_name}", hidden, rows=(start, end)))  # fmt: skip
            self._fill(self.w13, self.w13_scale, (e, slice(local, 2 * local)), store, f"{expert}.{up_name}", start,
                       self._read(store, f"{expert}.{up_name}", hidden, rows=(start, end)))  # fmt: skip
            self._fill(self.w2, self.w2_scale, (e, slice(None)), store, f"{expert}.{down_name}", 0,
                       self._read(store, f"{expert}.{down_name}", size, cols=(start, end)))  # fmt: skip

    def _read(self, store: WeightStore, prefix: str, in_features: int, rows=None, cols=None) -> torch.Tensor:
        """Checkpoint rows or columns [start, end) of `prefix`'s weight (all of it without either): as
        stored, or a block-wise fp8 one (a router that is not left unquantized) dequantized to
        float32. An unquantized weight in a block-wise checkpoint (the router, usually) is read as is."""
        name = f"{prefix}.weight"
        if self.block_fp8 is not None and store.header(name)[0] == "F8_E4M3":
            return block_fp8_slice(store, self.block_fp8, prefix, in_features, rows, cols)
        if rows is not None:
            return store.get_rows(name, *rows)
        return store.get(name) if cols is None else store.get_cols(name, *cols)

    def _load_block_fp8(self, store: WeightStore, expert: str, e: int) -> None:
        """Expert e's slice of a block-wise fp8 checkpoint: its gate and up rows and its down
        columns as stored (e4m3), with every scale block they touch."""
        start, end = self.rows
        local, gate_scale_rows = end - start, self.w13_scale.shape[1] // 2
        hidden, size = self.w2.shape[1], self.moe.expert_intermediate_size
        gate_name, up_name, down_name = self.moe.weight_names
        for half, name in enumerate((gate_name, up_name)):
            weight, scales = block_fp8_part(store, self.block_fp8, f"{expert}.{name}", hidden, rows=(start, end))
            self.w13[e, half * local : (half + 1) * local].copy_(weight)
            self.w13_scale[e, half * gate_scale_rows : (half + 1) * gate_scale_rows].copy_(scales)
        weight, scales = block_fp8_part(store, self.block_fp8, f"{expert}.{down_name}", size, cols=(start, end))
        self.w2[e].copy_(weight)
        self.w2_scale[e].copy_(scales)

    @staticmethod
    def _fill(weight, scale, index, store: WeightStore, prefix: str, start: int, value: torch.Tensor) -> None:
        """weight[index] (and its scales) from checkpoint rows [start, ...) of `prefix`."""
        value, value_scale = weight_rows(value, store, prefix, start, weight.device, fp8=scale is not None)
        weight[index].copy_(value)
        if scale is not None:
            scale[index].copy_(value_scale.view(-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(F.linear(x, self.router), self.moe.top_k, self.moe.norm_topk_prob)
        scales = None
        if self.w13_scale is not None:
            scales = ExpertScales(self.w13_scale, self.w2_scale, self.scale_block, first=self.rows[0])
        out = experts_forward(x, self.w13, self.w2, weights, ids, scales)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(F.linear(x, self.shared_expert_gate)) * self.shared_expert(x)
        return self.ctx.all_reduce(out)


class MoeDecoderLayer(nn.Module):
    """A Llama decoder layer whose MLP is an MoeBlock (same norms, residuals and attention)."""

    attention_class = LlamaAttention

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backend, dtype, device):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = self.attention_class(cfg, ctx, backend, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = MoeBlock(cfg, ctx, dtype, device)
        self.block_name = cfg.moe.block_name

    def load(self, store: WeightStore, prefix: str) -> None:
        self.input_layernorm.load(store, f"{prefix}.input_layernorm.weight")
        self.self_attn.load(store, f"{prefix}.self_attn")
        self.post_attention_layernorm.load(store, f"{prefix}.post_attention_layernorm.weight")
        self.mlp.load(store, f"{prefix}.{self.block_name}")

    def forward(self, hidden, residual, rotary, k_cache, v_cache, metadata):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(hidden, rotary, k_cache, v_cache, metadata)
        hidden, residual = self.post_attention_layernorm.add_and_norm(hidden, residual)
        return self.mlp(hidden), residual


def check_moe_supported(cfg: ModelConfig) -> None:
    if cfg.moe is None:
        raise UnsupportedModelError(f"{cfg.model_type} is not a Mixture-of-Experts model")
    if cfg.quantize not in (None, "fp8") and not isinstance(cfg.packed, PackedScheme):
        raise UnsupportedModelError(
            f"{cfg.model_type}: {cfg.quantize} weights are not supported for Mixture-of-Experts models yet; "
            "serve the bf16/fp16 checkpoint, or it with --quantize fp8"
        )


def check_moe_shardable(cfg: ModelConfig, world_size: int) -> None:
    problems = []
    moe = cfg.moe
    if moe.expert_intermediate_size % world_size:
        problems.append(f"expert intermediate size {moe.expert_intermediate_size} is not divisible by {world_size}")
    if moe.shared_expert_intermediate_size % world_size:
        problems.append(
            f"shared expert intermediate size {moe.shared_expert_intermediate_size} is not divisible by {world_size}"
        )
    if problems:
        raise ShardingError(f"cannot split this {cfg.model_type} model over {world_size} shards: " + "; ".join(problems))


def _with_intermediate(cfg: ModelConfig, size: int) -> ModelConfig:
    return replace(cfg, intermediate_size=size)


class _NoReduce(ParallelContext):
    """The rank's context without its all-reduce: for a row-parallel partial summed later."""

    def all_reduce(self, tensor):
        return tensor


class MoeForCausalLM(LlamaForCausalLM):
    """Mixtral, Qwen2-MoE and Qwen3-MoE: the Llama model with MoE decoder layers (Qwen3-MoE's
    per-head q/k norms and Qwen2-MoE's qkv bias come from the shared attention's flags)."""

    decoder_layer = MoeDecoderLayer

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backend, dtype, device):
        check_moe_supported(cfg)
        super().__init__(cfg, ctx, backend, dtype, device)
