"""Linear layers that know which slice of a weight their rank holds.

`ColumnParallelLinear` splits output features across ranks and can fuse several HF
projections into one matmul (q/k/v, gate/up): each projection is sliced on its own,
so the fused matrix holds this rank's q rows, then its k rows, then its v rows.
`RowParallelLinear` splits input features and all-reduces the partial sums. The matmul itself is
`project`: the skinny Triton kernel at decode batch sizes, cuBLAS otherwise.

With `fp8=True` (`--quantize fp8`, or an fp8 checkpoint) a layer keeps its weight in fp8 with
one float32 scale per output feature; `fp8_linear` does the product, of rows its producer may
have quantized already (`takes_fp8_rows`, `Fp8Rows`). A checkpoint's fp8 slice
is copied with its `weight_scale` (per tensor or per channel: both are per-row scales); any
other slice is quantized on the device as it loads, so the bf16 model is never resident.

Built inside `packed_linears(scheme)` (a GPTQ or AWQ checkpoint: `build_model` opens it), a
layer allocates no dense weight: it holds a `PackedWeight` (layers/int4.py), loads its rank's
slice of qweight/qzeros/scales/g_idx, and `PackedWeight.linear` does the product. The same holds
for compressed-tensors integer and block-wise fp8 checkpoints (`layers/quantized.py`:
`quantized_weight` picks the module for the scheme; each has `load_columns`, `load_rows`,
`linear` and `dequantize`).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from ..distributed import ParallelContext, RowRange
from ..kernels.fp8_matmul import FP8, Fp8Rows, fp8_linear, quantize_rows_reference, quantizes_rows
from ..kernels.skinny_matmul import project
from ..models.quantization import QuantizedScheme
from ..weights import WeightsError, WeightStore
from .quantized import quantized_weight

_PACKED: ContextVar[QuantizedScheme | None] = ContextVar("packed_linears", default=None)


@contextmanager
def packed_linears(scheme: QuantizedScheme | None):
    """Linear layers built inside hold `scheme`'s packed weights instead of dense ones (None: dense)."""
    token = _PACKED.set(scheme)
    try:
        yield
    finally:
        _PACKED.reset(token)


def _empty(shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class _Weight(nn.Module):
    """A [out, in] weight, in the model dtype or in fp8 with per-row scales, and its product."""

    def _init_weight(self, shape, fp8: bool, dtype, device) -> None:
        scheme = _PACKED.get()
        self.packed = None if scheme is None else quantized_weight(scheme, shape, dtype, device)
        if self.packed is not None:
            self.weight = self.weight_scale = None
            return
        self.weight = _empty(shape, FP8 if fp8 else dtype, device)
        self.weight_scale = _empty((shape[0], 1), torch.float32, device) if fp8 else None

    def _set_rows(self, rows: slice, value: torch.Tensor, store: WeightStore, prefix: str, start: int) -> None:
        """Fills `rows` of the weight with `value`, the checkpoint's rows [start, ...) of `prefix`."""
        weight, scale = weight_rows(value, store, prefix, start, self.weight.device, fp8=self.weight_scale is not None)
        self.weight[rows].copy_(weight)
        if scale is not None:
            self.weight_scale[rows].copy_(scale)

    def takes_fp8_rows(self, x: torch.Tensor) -> bool:
        """Whether this product would quantize rows like `x` itself: their producer may instead."""
        return self.weight_scale is not None and quantizes_rows(x)

    def _product(self, x: torch.Tensor | Fp8Rows, bias: torch.Tensor | None) -> torch.Tensor:
        if self.packed is not None:
            return self.packed.linear(x, bias)
        if self.weight_scale is not None:
            return fp8_linear(x, self.weight, self.weight_scale, bias)
        return project(x, self.weight, bias)


def weight_rows(value: torch.Tensor, store: WeightStore, prefix: str, start: int, device, fp8: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Checkpoint rows [start, ...) of `prefix`'s weight as served: as they are, or (`fp8`) in fp8
    with [rows, 1] float32 scales, an fp8 checkpoint's own or quantized here row by row."""
    if value.dtype == FP8:
        if not fp8:
            raise WeightsError(f"{prefix}.weight is fp8 but config.json declares no fp8 quantization")
        return value, _checkpoint_scale(store, prefix, start, value.shape[0])
    if value.dtype.itemsize == 1:
        raise WeightsError(f"{prefix}.weight is {value.dtype}; of 8-bit weights only fp8 e4m3 loads")
    return quantize_rows_reference(value.to(device)) if fp8 else (value, None)


def _checkpoint_scale(store: WeightStore, prefix: str, start: int, rows: int) -> torch.Tensor:
    """[rows, 1] float32 scales of checkpoint rows [start, start + rows) of `prefix`'s fp8 weight."""
    name = f"{prefix}.weight_scale"
    if name not in store:
        raise WeightsError(f"{prefix}.weight is fp8 but the checkpoint has no {name}")
    scale = store.get(name).float().reshape(-1, 1)
    if not (torch.isfinite(scale).all() and (scale >= 0).all()):
        raise WeightsError(f"{name} holds scales that are negative, inf or nan")
    if scale.shape[0] == 1:  # one scale for the whole tensor
        return scale.expand(rows, 1)
    if scale.shape[0] < start + rows:
        raise WeightsError(f"{name} has {scale.shape[0]} scales; rows up to {start + rows} need one each")
    return scale[start : start + rows]


class ColumnParallelLinear(_Weight):
    """Output features split across ranks. `parts` are this rank's rows of each fused weight
    (e.g. its q, k and v rows), stacked in order into one matrix."""

    def __init__(
        self,
        in_features: int,
        parts: list[RowRange],
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
        fp8: bool = False,
    ):
        super().__init__()
        self.parts = list(parts)
        total = sum(part.size for part in self.parts)
        self._init_weight((total, in_features), fp8, dtype, device)
        self.bias = _empty((total,), dtype, device) if bias else None

    def load(self, store: WeightStore, prefixes: list[str]) -> None:
        if len(prefixes) != len(self.parts):
            raise ValueError(f"expected {len(self.parts)} weight prefixes, got {prefixes}")
        offset = 0
        for prefix, part in zip(prefixes, self.parts):
            rows = slice(offset, offset + part.size)
            if self.packed is None:
                weight = store.get_rows(f"{prefix}.weight", part.start, part.end)
                self._set_rows(rows, weight, store, prefix, part.start)
            if self.bias is not None:
                self.bias[rows].copy_(store.get_rows(f"{prefix}.bias", part.start, part.end))
            offset += part.size
        if self.packed is not None:
            self.packed.load_columns(store, prefixes, self.parts)

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        return self._product(x, self.bias)


class RowParallelLinear(_Weight):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        ctx: ParallelContext,
        dtype: torch.dtype,
        device: torch.device,
        fp8: bool = False,
    ):
        super().__init__()
        self.ctx = ctx
        self.in_features = in_features
        start, end = ctx.split(in_features, "input features")
        self._init_weight((out_features, end - start), fp8, dtype, device)
        self.bias = _empty((out_features,), dtype, device) if bias else None

    def load(self, store: WeightStore, prefix: str) -> None:
        start, end = self.ctx.split(self.in_features)
        if self.packed is not None:
            self.packed.load_rows(store, prefix, start, end, self.in_features)
        else:
            self._set_rows(slice(None), store.get_cols(f"{prefix}.weight", start, end), store, prefix, 0)
        if self.bias is not None:
            self.bias.copy_(store.get(f"{prefix}.bias"))

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        out = self.ctx.all_reduce(self._product(x, None))
        return out if self.bias is None else out + self.bias
