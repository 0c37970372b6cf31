"""The routed experts of a GPTQ, AWQ or compressed-tensors pack-quantized MoE checkpoint, packed.

Each expert's projections are read as `layers/int4.py` reads a dense model's linears, with the
same checks, repacking and error messages: gate and up as one column-parallel product (this
rank's output columns of each, gate then up, as the dense w13 stacks their rows), down as a
row-parallel one (this rank's input rows). The experts are then stacked, one `PackedExperts`
for gate_up and one for down, in the layout of `PackedWeight` with a leading expert axis:
- `qweight` int32 [E, in/pack, out] (4-bit words in pair order), `zeros` int16 [E, groups, out],
  `scales` [E, groups, out], `g_idx` int32 [E, in];
- a row-parallel act-order slice reads only the groups its rows use, so experts may need
  different group counts: every expert's zeros and scales are padded to the most (rows no g_idx
  entry points at);
- `group_rows`: rows per group where every expert's groups are contiguous from row 0 (no
  act-order, no slice starting mid-group), else None, and the kernel gathers each row's group.

The fused kernel (`kernels/fused_moe_packed.py`) unpacks these in registers; `dequantize` is the
reference (`models/moe.py`'s loop over the hit experts), the same weight rounded the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..distributed import RowRange
from ..models.moe_config import MoeConfig
from ..models.quantization import PackedScheme
from ..weights import WeightStore
from .int4 import PackedWeight, dequantize_packed_reference
from .quantized import quantized_weight


@dataclass
class PackedExperts:
    bits: int
    qweight: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor
    group_rows: int | None

    @property
    def experts(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.g_idx.shape[1]

    @property
    def out_features(self) -> int:
        return self.qweight.shape[2]

    @classmethod
    def stack(cls, weights: list[PackedWeight]) -> PackedExperts:
        groups = max(weight.zeros.shape[0] for weight in weights)

        def padded(tensor: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(tensor, (0, 0, 0, groups - tensor.shape[0]))

        rows = {weight.group_rows for weight in weights}
        return cls(
            bits=weights[0].scheme.bits,
            qweight=torch.stack([weight.qweight for weight in weights]),
            zeros=torch.stack([padded(weight.zeros) for weight in weights]),
            scales=torch.stack([padded(weight.scales) for weight in weights]),
            g_idx=torch.stack([weight.g_idx for weight in weights]),
            group_rows=rows.pop() if len(rows) == 1 else None,
        )

    def dequantize(self, dtype: torch.dtype, expert: int | None = None) -> torch.Tensor:
        """Expert `expert`'s [out, in] weight in `dtype` (all of them, [E, out, in], for None)."""
        if expert is None:
            return torch.stack([self.dequantize(dtype, e) for e in range(self.experts)])
        return dequantize_packed_reference(self.qweight[expert], self.zeros[expert], self.scales[expert],
                                           self.g_idx[expert], self.bits, dtype)  # fmt: skip


def load_packed_experts(store: WeightStore, scheme: PackedScheme, prefix: str, moe: MoeConfig, hidden: int,
                        rows: tuple[int, int], dtype: torch.dtype, device) -> tuple[PackedExperts, PackedExperts]:
    """(gate_up, down) of `prefix`.experts.{e}, for this rank's intermediate rows [rows[0], rows[1])."""
    gate_name, up_name, down_name = moe.weight_names
    start, end = rows
    gate_up, down = [], []
    for e in range(moe.num_experts):
        expert = f"{prefix}.experts.{e}"
        weight = quantized_weight(scheme, (2 * (end - start), hidden), dtype, device)
        weight.load_columns(store, [f"{expert}.{gate_name}", f"{expert}.{up_name}"], [RowRange(start, end)] * 2)
        gate_up.append(weight)
        weight = quantized_weight(scheme, (hidden, end - start), dtype, device)
        weight.load_rows(store, f"{expert}.{down_name}", start, end, moe.expert_intermediate_size)
        down.append(weight)
    return PackedExperts.stack(gate_up), PackedExperts.stack(down)
