"""Linear layers that know which slice of a weight their rank holds.

`ColumnParallelLinear` splits output features across ranks and can fuse several HF
projections into one matmul (q/k/v, gate/up): each projection is sliced on its own,
so the fused matrix holds this rank's q rows, then its k rows, then its v rows.
`RowParallelLinear` splits input features and all-reduces the partial sums. The matmul itself is
`project`: the skinny Triton kernel at decode batch sizes, cuBLAS otherwise.
"""

from __future__ import annotations

import torch
from torch import nn

from ..distributed import ParallelContext, RowRange
from ..kernels.skinny_matmul import project
from ..weights import WeightStore


def _empty(shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """Output features split across ranks. `parts` are this rank's rows of each fused weight
    (e.g. its q, k and v rows), stacked in order into one matrix."""

    def __init__(
        self,
        in_features: int,
        parts: list[RowRange],
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ):
        super().__init__()
        self.parts = list(parts)
        total = sum(part.size for part in self.parts)
        self.weight = _empty((total, in_features), dtype, device)
        self.bias = _empty((total,), dtype, device) if bias else None

    def load(self, store: WeightStore, prefixes: list[str]) -> None:
        if len(prefixes) != len(self.parts):
            raise ValueError(f"expected {len(self.parts)} weight prefixes, got {prefixes}")
        offset = 0
        for prefix, part in zip(prefixes, self.parts):
            rows = slice(offset, offset + part.size)
            self.weight[rows].copy_(store.get_rows(f"{prefix}.weight", part.start, part.end))
            if self.bias is not None:
                self.bias[rows].copy_(store.get_rows(f"{prefix}.bias", part.start, part.end))
            offset += part.size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        ctx: ParallelContext,
        dtype: torch.dtype,
        device: torch.device,
    ):
        super().__init__()
        self.ctx = ctx
        self.in_features = in_features
        start, end = ctx.split(in_features, "input features")
        self.weight = _empty((out_features, end - start), dtype, device)
        self.bias = _empty((out_features,), dtype, device) if bias else None

    def load(self, store: WeightStore, prefix: str) -> None:
        start, end = self.ctx.split(self.in_features)
        self.weight.copy_(store.get_cols(f"{prefix}.weight", start, end))
        if self.bias is not None:
            self.bias.copy_(store.get(f"{prefix}.bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.ctx.all_reduce(project(x, self.weight))
        return out if self.bias is None else out + self.bias
