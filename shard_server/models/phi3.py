"""Phi-3, Phi-3.5 and Phi-4 (`model_type: phi3`): Llama's maths, with fused checkpoints.

The Hub's checkpoints hold one `qkv_proj` (q rows, then k, then v) and one `gate_up_proj`
(gate rows, then up) per layer. They are split as they load: each rank reads its own rows of
q, k and v (and of gate and up) from the fused tensor, exactly the rows it would read from
separate q/k/v (gate/up) tensors, so tensor parallelism slices them as it does Llama's.
A quantized checkpoint (GPTQ, AWQ, compressed-tensors, block-wise fp8) fuses them alike: each
rank reads its q, k and v output columns of the one packed tensor.
LongRoPE (`su` / `longrope` with short and long factors) lives in layers/rotary.py.
"""

from __future__ import annotations

from ..distributed import RowRange
from ..layers.linear import ColumnParallelLinear
from ..weights import WeightStore
from .llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP


def load_fused_rows(linear: ColumnParallelLinear, store: WeightStore, prefix: str, offsets: list[int]) -> None:
    """Fills `linear`'s parts from one checkpoint tensor: part i's rows start at offsets[i] in it."""
    if len(offsets) != len(linear.parts):
        raise ValueError(f"expected {len(linear.parts)} offsets into {prefix}, got {offsets}")
    row = 0
    for part, base in zip(linear.parts, offsets):
        rows = slice(row, row + part.size)
        start, end = base + part.start, base + part.end
        if linear.packed is None:
            linear._set_rows(rows, store.get_rows(f"{prefix}.weight", start, end), store, prefix, start)
        if linear.bias is not None:
            linear.bias[rows].copy_(store.get_rows(f"{prefix}.bias", start, end))
        row += part.size
    if linear.packed is not None:  # a quantized checkpoint: each part's output columns of the one tensor
        parts = [RowRange(base + part.start, base + part.end) for part, base in zip(linear.parts, offsets)]
        linear.packed.load_columns(store, [prefix] * len(parts), parts)


class Phi3Attention(LlamaAttention):
    def __init__(self, cfg, ctx, backend, dtype, device):
        super().__init__(cfg, ctx, backend, dtype, device)
        q_total = cfg.num_attention_heads * cfg.head_dim
        kv_total = cfg.num_key_value_heads * cfg.head_dim
        self.fused_offsets = [0, q_total, q_total + kv_total]

    def load(self, store: WeightStore, prefix: str) -> None:
        load_fused_rows(self.qkv_proj, store, f"{prefix}.qkv_proj", self.fused_offsets)
        self.o_proj.load(store, f"{prefix}.o_proj")


class Phi3MLP(LlamaMLP):
    def __init__(self, cfg, ctx, dtype, device):
        super().__init__(cfg, ctx, dtype, device)
        self.fused_offsets = [0, cfg.intermediate_size]

    def load(self, store: WeightStore, prefix: str) -> None:
        load_fused_rows(self.gate_up_proj, store, f"{prefix}.gate_up_proj", self.fused_offsets)
        self.down_proj.load(store, f"{prefix}.down_proj")


class Phi3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Phi3Attention
    mlp_cls = Phi3MLP


class Phi3ForCausalLM(LlamaForCausalLM):
    decoder_layer = Phi3DecoderLayer
