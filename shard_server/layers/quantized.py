"""compressed-tensors integer weights and block-wise fp8: reading a rank's slice, the reference product.

Hub layouts (llm-compressor / compressed-tensors, DeepSeek-V3 / Qwen3-FP8), for W [out, in] with
y = x @ W^T:
- `pack-quantized` (W4A16 / W8A16): `weight_packed` int32 [out, ceil(in/pack)] packs `pack =
  32/bits` consecutive input columns per word, low bits first, each value stored as the signed
  integer plus 2^(bits-1); `weight_scale` [out, groups] (the model dtype); `weight_zero_point`
  (asymmetric only) int32 [ceil(out/pack), groups], packed the same way along the *output*
  dimension (compressed-tensors before 0.10 stored it unpacked: int8 [out, groups], signed;
  both load); `weight_shape` int [2] = [out, in]. Column k is in group k // group_size
  (strategy `channel`: one group), or with `actorder: group` in group `weight_g_idx[k]` (int32
  [in]; a row-parallel rank reads the groups from the lowest to the highest its columns use). W = (q - zp) * scale. `PackedCompressedWeight` converts
  this at load to the one layout of `layers/int4.py` (`PackedWeight`: qweight int32
  [in/pack, out], unsigned zero points, scales [groups, out], g_idx): the stored unsigned
  values are exactly GPTQ's, and a symmetric checkpoint's zero point is 2^(bits-1).
- `int-quantized` (W8A8 / W8A16): `weight` int8 [out, in], `weight_scale` [out, 1] (or one
  per tensor), an optional all-zero `weight_zero_point`. `Int8Weight`: W8A8 quantizes each
  activation row to int8 (scale amax/127, round to nearest) and multiplies the integers exactly
  in int32 (`int8_product`: cuBLASLt's int8 GEMM on CUDA), then applies both scales; W8A16
  streams the int8 weight through the skinny kernel up to 16 rows (as fp8 weights) and
  multiplies the weight dequantized in one pass (`kernels/dequantize.py`) above.
- block-wise fp8: `weight` e4m3 [out, in] and `weight_scale_inv` (compressed-tensors `block`
  strategy: `weight_scale`) float [ceil(out/bn), ceil(in/bk)]; W[i, j] = w[i, j] * scale[i // bn,
  j // bk]. `BlockFp8Weight` keeps the fp8 weight and the scale blocks its rows and columns touch,
  with each row's and column's block index. Half-precision products are
  `kernels/block_fp8_matmul.py`'s: up to 16 rows stream the fp8 weight (activations unrounded);
  more quantize each activation row to e4m3 with its own scale (as `--quantize fp8` does) and
  multiply fp8 by fp8, the weight kept in fp8. float32 rows multiply the weight dequantized in
  one pass (`kernels/dequantize.py`), unrounded. Expanding to one scale per row would be exact
  only when every block of a row shares a scale, so the blocks are kept.

Tensor parallelism: column-parallel parts read their output rows (and the zero-point words and
scale block rows that cover them); row-parallel slices read their input columns (the words,
groups and scale block columns they touch). Nothing needs a rank's split to fall on a word,
group or block boundary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.block_fp8_cublas import CUBLAS_FROM_ROWS, block_fp8_cublas, cublas_takes_blocks, cublas_weight_scale
from ..kernels.block_fp8_matmul import block_fp8_gemm, block_fp8_rows, column_block_starts, column_blocks
from ..kernels.dequantize import dequantize_8bit
from ..kernels.dispatch import use_fused
from ..kernels.fp8_matmul import FP8
from ..kernels.skinny_matmul import config_for, skinny_matmul, skinny_rows
from ..models.quantization import BlockFp8Scheme, Int8Scheme, PackedScheme
from ..weights import WeightsError, WeightStore
from .int4 import PackedWeight, _Slice, pack_rows, unpack_cols, unpack_rows

_FLOATS = ("F16", "BF16", "F32")
INT8_TINY = 1e-10  # the smallest activation-row scale (an all-zero row)


def _need(store: WeightStore, name: str, fmt: str) -> tuple[str, tuple[int, ...]]:
    if name not in store:
        raise WeightsError(f"{name} is missing ({fmt} checkpoint)")
    return store.header(name)


def _read(store: WeightStore, name: str, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
    """Rows x columns of a 2-D tensor, reading only the rows (or only the columns) a whole range spans."""
    shape = store.header(name)[1]
    if cols == (0, shape[1]):
        return store.get_rows(name, *rows)
    if rows == (0, shape[0]):
        return store.get_cols(name, *cols)
    return store.get_rows(name, *rows)[:, cols[0] : cols[1]]


def _scale_values(scale: torch.Tensor, name: str, fmt: str) -> torch.Tensor:
    scale = scale.float()
    if not (torch.isfinite(scale).all() and (scale >= 0).all()):
        raise WeightsError(f"{name} holds scales that are negative, inf or nan ({fmt} checkpoint)")
    return scale


# compressed-tensors pack-quantized -> PackedWeight.


class PackedCompressedWeight(PackedWeight):
    """A pack-quantized linear, held in `PackedWeight`'s layout (see the module docstring)."""

    def load_columns(self, store: WeightStore, prefixes: list[str], parts) -> None:
        slices = [self._read(store, prefix, part.start, part.end, 0, self.in_features, self.in_features)
                  for prefix, part in zip(prefixes, parts)]  # fmt: skip
        for prefix, piece in zip(prefixes[1:], slices[1:]):
            if not torch.equal(piece.g_idx, slices[0].g_idx):
                raise WeightsError(
                    f"{prefix}.weight_g_idx differs from {prefixes[0]}.weight_g_idx ({self.scheme.describe()}): "
                    "projections fused into one product need the same act-order groups"
                )
        cat = lambda field: torch.cat([getattr(piece, field) for piece in slices], dim=1)  # noqa: E731
        self._set(_Slice(cat("qweight"), cat("zeros"), cat("scales"), slices[0].g_idx), prefixes[0])

    def load_rows(self, store: WeightStore, prefix: str, start: int, end: int, in_features: int) -> None:
        out = self._check(store, prefix, in_features)
        self._set(self._read(store, prefix, 0, out, start, end, in_features), prefix)

    def _check(self, store: WeightStore, prefix: str, in_features: int) -> int:
        """Validates one linear's tensors against the scheme; returns its output features."""
        scheme, fmt = self.scheme, self.scheme.describe()
        pack, groups = scheme.pack, scheme.groups(in_features)
        packed_name, scale_name = f"{prefix}.weight_packed", f"{prefix}.weight_scale"
        dtype, shape = _need(store, packed_name, fmt)
        if dtype != "I32":
            raise WeightsError(f"{packed_name} is {dtype}; {fmt} stores it as int32")
        sdtype, sshape = _need(store, scale_name, fmt)
        if sdtype not in _FLOATS:
            raise WeightsError(f"{scale_name} is {sdtype}; {fmt} scales are float")
        if len(shape) != 2 or len(sshape) != 2:
            raise WeightsError(f"{packed_name} {list(shape)} and {scale_name} {list(sshape)} must be 2-D ({fmt})")
        out = shape[0]
        want = (out, -(-in_features // pack))
        if shape != want:
            hint = ""
            if shape[1] and in_features % shape[1] == 0 and 32 % (in_features // shape[1]) == 0:
                fits = 32 // (in_features // shape[1])
                hint = f"; its columns fit {fits}-bit packing, not the declared {scheme.bits} bits"
            raise WeightsError(f"{packed_name} has shape {list(shape)}; a {in_features}-input linear in {fmt} needs "
                               f"[out, in/{pack}] = {list(want)}{hint}")  # fmt: skip
        if sshape != (out, groups):
            raise WeightsError(f"{scale_name} has shape {list(sshape)}; {in_features} inputs in {fmt} need "
                               f"[out, groups] = {[out, groups]}")  # fmt: skip
        shape_name = f"{prefix}.weight_shape"
        if shape_name in store:
            declared = [int(v) for v in store.get(shape_name).reshape(-1).tolist()]
            if declared != [out, in_features]:
                raise WeightsError(
                    f"{shape_name} is {declared}; {packed_name} and the config make [{out}, {in_features}] ({fmt})"
                )
        g_name = f"{prefix}.weight_g_idx"
        if scheme.desc_act:
            gdtype, gshape = _need(store, g_name, fmt)
            if gdtype not in ("I32", "I64") or gshape != (in_features,):
                raise WeightsError(f"{g_name} is {gdtype} {list(gshape)}; {fmt} needs int32 "
                                   f"[{in_features}], one group per input column")  # fmt: skip
        zero_name = f"{prefix}.weight_zero_point"
        if scheme.zero_points:
            zdtype, zshape = _need(store, zero_name, fmt)
            zwant = (-(-out // pack), groups)
            if (zdtype, zshape) != ("I32", zwant) and (zdtype, zshape) != ("I8", (out, groups)):
                raise WeightsError(f"{zero_name} is {zdtype} {list(zshape)}; {fmt} packs zero points along the outputs: "
                                   f"int32 [out/{pack}, groups] = {list(zwant)} (or, as older compressed-tensors "
                                   f"wrote them, int8 [out, groups] = {[out, groups]})")  # fmt: skip
        elif zero_name in store:
            raise WeightsError(f"{zero_name} is stored but the config declares symmetric weights ({fmt})")
        return out

    def _read(self, store, prefix, row_start, row_end, col_start, col_end, in_features) -> _Slice:
        """Output rows [row_start, row_end) and input columns [col_start, col_end), as [in, out]."""
        scheme = self.scheme
        out = self._check(store, prefix, in_features)
        if row_end > out:
            raise WeightsError(
                f"{prefix}.weight_packed has {out} output rows; this rank needs [{row_start}, {row_end})"
            )
        bits, pack = scheme.bits, scheme.pack
        first = col_start // pack
        words = _read(store, f"{prefix}.weight_packed", (row_start, row_end), (first, -(-col_end // pack)))
        words = words.to(self.device)  # unpacked and repacked where the layer will live (a GPU: fast)
        values = unpack_cols(words, bits)[:, col_start - first * pack : col_end - first * pack]  # [rows, cols]
        rows = torch.arange(col_start, col_end)
        if scheme.desc_act:
            g_idx = store.get_rows(f"{prefix}.weight_g_idx", col_start, col_end).long()
            groups = scheme.groups(in_features)
            if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= groups):
                raise WeightsError(f"{prefix}.weight_g_idx holds groups outside [0, {groups}) ({scheme.describe()})")
        else:
            g_idx = torch.zeros_like(rows) if scheme.group_size == -1 else rows // scheme.group_size
        low, high = int(g_idx.min()), int(g_idx.max()) + 1
        scales = _read(store, f"{prefix}.weight_scale", (row_start, row_end), (low, high))
        _scale_values(scales, f"{prefix}.weight_scale", scheme.describe())
        if scheme.zero_points and store.header(f"{prefix}.weight_zero_point")[0] == "I8":  # unpacked, signed
            zeros = _read(store, f"{prefix}.weight_zero_point", (row_start, row_end), (low, high)).int()
            zeros = zeros + (1 << (bits - 1))
        elif scheme.zero_points:
            zfirst = row_start // pack
            zwords = _read(store, f"{prefix}.weight_zero_point", (zfirst, -(-row_end // pack)), (low, high))
            zeros = unpack_rows(zwords, bits)[row_start - zfirst * pack : row_end - zfirst * pack]
        else:
            zeros = torch.full(scales.shape, 1 << (bits - 1), dtype=torch.int32)
        return _Slice(pack_rows(values.t(), bits), zeros.t(), scales.t().contiguous(), g_idx - low)


# compressed-tensors int-quantized.


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (int8 values [M, K], float32 scales [M, 1]), x ~= values * scale, row by row (symmetric)."""
    wide = x.float()
    scale = (wide.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=INT8_TINY)
    return torch.round(wide / scale).clamp(-128, 127).to(torch.int8), scale


def _shaped(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A product of x's rows flattened, plus the bias, back in x's leading shape."""
    out = out if bias is None else out + bias
    return out.view(*x.shape[:-1], out.shape[-1])


# cuBLASLt's int8 GEMM (torch._int_mm) on CUDA takes more than 16 rows and both widths in
# multiples of 8: fewer rows are padded to this many.
INT_MM_MIN_ROWS = 17
INT_MM_ALIGN = 8


def int8_product(xq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """xq [M, K] int8 @ weight [N, K]^T int8: the exact int32 sums [M, N], through the int8 GEMM
    (torch._int_mm: cuBLASLt on CUDA) where its shapes allow, else in float64 (exact to 2^53;
    float32 would round sums past 2^24, which 127 * 127 * K reaches from K = 1,041)."""
    rows, (features, depth) = xq.shape[0], weight.shape
    if features % INT_MM_ALIGN or depth % INT_MM_ALIGN:
        return (xq.double() @ weight.double().t()).to(torch.int32)
    padded = xq
    if xq.is_cuda and rows < INT_MM_MIN_ROWS:
        padded = F.pad(xq, (0, 0, 0, INT_MM_MIN_ROWS - rows))
    return torch._int_mm(padded, weight.t())[:rows]


class Int8Weight(nn.Module):
    """A rank's int8 [out, in] weight with float32 per-row scales [out, 1]."""

    def __init__(self, scheme: Int8Scheme, shape: tuple[int, int], dtype: torch.dtype, device):
        super().__init__()
        self.scheme, self.out_features, self.in_features = scheme, shape[0], shape[1]
        self.register_buffer("weight", torch.empty(shape, dtype=torch.int8, device=device))
        self.register_buffer("scale", torch.empty((shape[0], 1), dtype=torch.float32, device=device))

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if not self.scheme.activations:
            if not use_fused(flat):
                return F.linear(x, self.dequantize(x.dtype), bias)
            if not skinny_rows(flat):  # many rows: the weight widened in one pass, cuBLAS multiplies
                return F.linear(x, dequantize_8bit(self.weight, self.scale, x.dtype), bias)
            # W8A16 decodes: the int8 weight streamed and widened in the kernel, as fp8 weights are.
            config = config_for(flat.shape[0], self.out_features, self.in_features, weights_fp8=True)
            return _shaped(skinny_matmul(flat, self.weight, config, self.scale.view(-1), fp16_dot=True), x, bias)
        xq, x_scale = quantize_rows_int8(flat)
        out = (int8_product(xq, self.weight).float() * x_scale * self.scale.view(1, -1)).to(x.dtype)
        return _shaped(out, x, bias)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight.float() * self.scale).to(dtype)

    def load_columns(self, store: WeightStore, prefixes: list[str], parts) -> None:
        offset = 0
        for prefix, part in zip(prefixes, parts):
            out = self._check(store, prefix, self.in_features)
            if part.end > out:
                raise WeightsError(f"{prefix}.weight has {out} output rows; this rank needs [{part.start}, {part.end})")
            rows = slice(offset, offset + part.size)
            self.weight[rows].copy_(store.get_rows(f"{prefix}.weight", part.start, part.end))
            self.scale[rows].copy_(self._scales(store, prefix, out)[part.start : part.end])
            offset += part.size

    def load_rows(self, store: WeightStore, prefix: str, start: int, end: int, in_features: int) -> None:
        out = self._check(store, prefix, in_features)
        if out != self.out_features:
            raise WeightsError(f"{prefix}.weight has {out} output rows; the model needs {self.out_features}")
        self.weight.copy_(store.get_cols(f"{prefix}.weight", start, end))
        self.scale.copy_(self._scales(store, prefix, out))

    def _check(self, store: WeightStore, prefix: str, in_features: int) -> int:
        fmt, name = self.scheme.describe(), f"{prefix}.weight"
        dtype, shape = _need(store, name, fmt)
        if dtype != "I8":
            raise WeightsError(f"{name} is {dtype}; {fmt} stores int8 weights")
        if len(shape) != 2 or shape[1] != in_features:
            raise WeightsError(f"{name} has shape {list(shape)}; {fmt} needs [out, {in_features}]")
        sdtype, sshape = _need(store, f"{name}_scale", fmt)
        count = 1
        for dim in sshape:
            count *= dim
        if sdtype not in _FLOATS or count not in (1, shape[0]) or (count == shape[0] != 1 and sshape[0] != shape[0]):
            raise WeightsError(f"{name}_scale is {sdtype} {list(sshape)}; {fmt} needs float [{shape[0]}, 1] (one scale "
                               "per output channel) or one per tensor")  # fmt: skip
        return shape[0]

    def _scales(self, store: WeightStore, prefix: str, out: int) -> torch.Tensor:
        fmt, name = self.scheme.describe(), f"{prefix}.weight_scale"
        scale = _scale_values(store.get(name), name, fmt).reshape(-1, 1)
        zero_name = f"{prefix}.weight_zero_point"
        if zero_name in store and store.get(zero_name).any():
            raise WeightsError(f"{zero_name} holds non-zero zero points; {fmt} loads symmetric int8 weights")
        return scale.expand(out, 1) if scale.shape[0] == 1 else scale


# Block-wise fp8.


class BlockFp8Weight(nn.Module):
    """A rank's e4m3 [out, in] weight with its [bn, bk] block scales (see the module docstring)."""

    def __init__(self, scheme: BlockFp8Scheme, shape: tuple[int, int], dtype: torch.dtype, device):
        super().__init__()
        self.scheme, self.out_features, self.in_features = scheme, shape[0], shape[1]
        self.device = torch.device(device)
        self.register_buffer("weight", torch.empty(shape, dtype=FP8, device=device))
        for name in ("scale", "row_block", "col_block"):
            self.register_buffer(name, None)
        self.col_blocks = None  # where `col_block`'s blocks start, as the kernels take them (plain integers)
        self.cublas_scale = None  # the scales as cuBLASLt takes them, where it can (`cublas_weight_scale`)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Few half-precision rows (decodes) stream the fp8 weight through `block_fp8_rows`; more
        are quantized and multiplied fp8 by fp8: by cuBLASLt from CUBLAS_FROM_ROWS where it takes
        the rank's blocks (`block_fp8_cublas`), else `block_fp8_gemm`. Without fused kernels (CPU):
        the reference, x times the weight dequantized in float32."""
        flat = x.reshape(-1, x.shape[-1])
        if not use_fused(flat):
            return F.linear(x, self.dequantize(x.dtype), bias)
        if flat.dtype == torch.float32:  # e4m3 rows (or tf32 dots) would drop the precision asked for
            return F.linear(x, dequantize_8bit(self.weight, self.scale, x.dtype, self.row_block, self.col_block), bias)
        if skinny_rows(flat):
            return _shaped(block_fp8_rows(flat, self.weight, self.scale, self.row_block, self.col_blocks), x, bias)
        if self.cublas_scale is not None and flat.shape[0] >= CUBLAS_FROM_ROWS:
            return _shaped(block_fp8_cublas(flat, self.weight, self.cublas_scale), x, bias)
        return _shaped(block_fp8_gemm(flat, self.weight, self.scale, self.row_block, self.col_blocks), x, bias)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        scales = self.scale[self.row_block.long()][:, self.col_block.long()]
        return (self.weight.float() * scales).to(dtype)

    def load_columns(self, store: WeightStore, prefixes: list[str], parts) -> None:
        bn, bk = self.scheme.block
        offset, scales, row_blocks = 0, [], []
        for prefix, part in zip(prefixes, parts):
            out = self._check(store, prefix, self.in_features)
            if part.end > out:
                raise WeightsError(f"{prefix}.weight has {out} output rows; this rank needs [{part.start}, {part.end})")
            self.weight[offset : offset + part.size].copy_(store.get_rows(f"{prefix}.weight", part.start, part.end))
            low, high = part.start // bn, -(-part.end // bn)
            base = sum(piece.shape[0] for piece in scales)
            scales.append(self._scales(store, prefix, low, high, 0, -(-self.in_features // bk)))
            row_blocks.append(torch.arange(part.start, part.end) // bn - low + base)
            offset += part.size
        self._set(torch.cat(scales), torch.cat(row_blocks), torch.arange(self.in_features) // bk)

    def load_rows(self, store: WeightStore, prefix: str, start: int, end: int, in_features: int) -> None:
        bn, bk = self.scheme.block
        out = self._check(store, prefix, in_features)
        if out != self.out_features:
            raise WeightsError(f"{prefix}.weight has {out} output rows; the model needs {self.out_features}")
        self.weight.copy_(store.get_cols(f"{prefix}.weight", start, end))
        low, high = start // bk, -(-end // bk)
        scales = self._scales(store, prefix, 0, -(-out // bn), low, high)
        self._set(scales, torch.arange(out) // bn, torch.arange(start, end) // bk - low)

    def _set(self, scales: torch.Tensor, row_block: torch.Tensor, col_block: torch.Tensor) -> None:
        self.scale = scales.to(self.device, torch.float32).contiguous()
        self.row_block = row_block.to(torch.int32).to(self.device)
        self.col_block = col_block.to(torch.int32).to(self.device)
        self.col_blocks = column_blocks(column_block_starts(col_block.cpu(), self.scale.shape[1]))
        if cublas_takes_blocks(self.device):
            shape = tuple(self.weight.shape)
            self.cublas_scale = cublas_weight_scale(self.scale, self.row_block, self.col_blocks, shape)

    def _check(self, store: WeightStore, prefix: str, in_features: int) -> int:
        return _check_block_fp8(store, self.scheme, prefix, in_features)

    def _scales(self, store, prefix, row_low, row_high, col_low, col_high) -> torch.Tensor:
        return _block_scales(store, self.scheme, prefix, (row_low, row_high), (col_low, col_high))


def _check_block_fp8(store: WeightStore, scheme: BlockFp8Scheme, prefix: str, in_features: int) -> int:
    """The output rows of `prefix`'s block-wise fp8 weight, after checking it and its scales."""
    fmt, name = scheme.describe(), f"{prefix}.weight"
    scale_name = f"{prefix}.{scheme.scale_name}"
    dtype, shape = _need(store, name, fmt)
    if dtype != "F8_E4M3":
        raise WeightsError(f"{name} is {dtype}; {fmt} stores e4m3 weights")
    if len(shape) != 2 or shape[1] != in_features:
        raise WeightsError(f"{name} has shape {list(shape)}; {fmt} needs [out, {in_features}]")
    sdtype, sshape = _need(store, scale_name, fmt)
    (bn, bk), out = scheme.block, shape[0]
    want = (-(-out // bn), -(-in_features // bk))
    if sdtype not in _FLOATS or sshape != want:
        raise WeightsError(f"{scale_name} is {sdtype} {list(sshape)}; a [{out}, {in_features}] weight in {fmt} "
                           f"needs float [ceil(out/{bn}), ceil(in/{bk})] = {list(want)}")  # fmt: skip
    return out


def _block_scales(store: WeightStore, scheme: BlockFp8Scheme, prefix: str, rows, cols) -> torch.Tensor:
    name = f"{prefix}.{scheme.scale_name}"
    return _scale_values(_read(store, name, rows, cols), name, scheme.describe())


def block_fp8_part(store: WeightStore, scheme: BlockFp8Scheme, prefix: str, in_features: int,
                   rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Checkpoint rows, or columns, [start, end) of a block-wise fp8 weight as stored (e4m3), with
    the float32 scale blocks they touch: block rows [r0 // bn, ceil(r1 / bn)) and columns
    [c0 // bk, ceil(c1 / bk)) (a slice may start or end mid-block); the whole weight when neither
    is given."""
    (bn, bk), name = scheme.block, f"{prefix}.weight"
    out = _check_block_fp8(store, scheme, prefix, in_features)
    (r0, r1), (c0, c1) = rows or (0, out), cols or (0, in_features)
    if r1 > out or c1 > in_features:
        raise WeightsError(f"{name} is [{out}, {in_features}]; this rank needs rows [{r0}, {r1}), columns [{c0}, {c1})")
    weight = _read(store, name, (r0, r1), (c0, c1))
    return weight, _block_scales(store, scheme, prefix, (r0 // bn, -(-r1 // bn)), (c0 // bk, -(-c1 // bk)))


def block_fp8_slice(store: WeightStore, scheme: BlockFp8Scheme, prefix: str, in_features: int,
                    rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None) -> torch.Tensor:  # fmt: skip
    """`block_fp8_part`'s slice dequantized to float32."""
    bn, bk = scheme.block
    weight, scales = block_fp8_part(store, scheme, prefix, in_features, rows, cols)
    r0, c0 = (rows or (0, 0))[0], (cols or (0, 0))[0]
    row_block = torch.arange(r0, r0 + weight.shape[0]) // bn - r0 // bn
    col_block = torch.arange(c0, c0 + weight.shape[1]) // bk - c0 // bk
    return weight.float() * scales[row_block][:, col_block]


def quantized_weight(scheme, shape: tuple[int, int], dtype: torch.dtype, device) -> nn.Module:
    """The weight module a linear built under `scheme` holds (`_Weight.packed`)."""
    if isinstance(scheme, PackedScheme):
        kind = PackedCompressedWeight if scheme.method == "compressed-tensors" else PackedWeight
        return kind(scheme, shape, dtype, device)
    if isinstance(scheme, Int8Scheme):
        return Int8Weight(scheme, shape, dtype, device)
    if isinstance(scheme, BlockFp8Scheme):
        return BlockFp8Weight(scheme, shape, dtype, device)
    raise TypeError(f"no weight layout for {scheme!r}")
