"""GPTQ and AWQ packed integer weights: reading a rank's slice, unpacking, the reference product.

Hub layouts (int32 words, value i of a word in bits [i*bits, (i+1)*bits), low bits first):
- GPTQ: `qweight` [in/pack, out] packs `pack = 32/bits` consecutive input rows per word;
  `qzeros` [groups, ceil(out/pack)] packs consecutive output columns; `scales` [groups, out];
  `g_idx` [in] the group of each input row (act-order: out of order). The v1 format
  (AutoGPTQ, `checkpoint_format: gptq`) stores each zero point minus one; v2 stores it as is.
- AWQ (GEMM): `qweight` [in, out/8] and `qzeros` [groups, out/8] pack 8 output columns per word
  in the interleaved order AWQ_ORDER (value i of a word is column AWQ_ORDER[i] of its eight);
  `scales` [groups, out]; row k is in group k // group_size.
In both, weight[k, n] = (q[k, n] - zero[g(k), n]) * scale[g(k), n] for x @ weight.

Whatever the checkpoint, a layer keeps one layout (`PackedWeight`): `qweight` int32
[in/pack, out] packing input rows as GPTQ does, the values of 4-bit words in pair order
(`kernels/pair_order.py`), `zeros` int16 [groups, out] holding true zero points (the v1 offset
already added), `scales` [groups, out] as the checkpoint stores them, and `g_idx` int32 [in]
into this rank's groups. `PackedWeight.linear` is the one product: on CUDA the W4A16 Triton
kernel (`kernels/w4a16.py`: unpacks in registers, 4 or 8 bits, any group order), else (CPU,
`fused_kernels(False)`, `w4a16_kernel(False)`) the reference, which dequantizes and multiplies.
Both build the same weight, (q - zero) * scale with the scale in the product's dtype, rounded
once to that dtype (as vLLM's Marlin kernels take scales in the activations' dtype); they differ
only in summation order. `group_rows`
tells the kernel when the groups are contiguous from row 0 (no act-order, no mid-group slice).

Tensor parallelism: column-parallel parts read their output columns of qweight and scales, and
the words of qzeros (AWQ: of qweight too) that cover them, unpacked and cut to the columns.
GPTQ's qweight words are kept as read (a 70B checkpoint's 35 GB are never unpacked on the
host); AWQ's and pack-quantized ones are unpacked and repacked in GPTQ's order. 4-bit words are
then put in pair order on the layer's device.
Row-parallel slices read their input rows of qweight (GPTQ: whole words, so a rank's rows start
at a multiple of `pack`), their entries of g_idx, and the rows of scales and qzeros for the
groups those rows fall in (with act-order: every group from the lowest to the highest index any
of its rows uses), with g_idx re-based to the first group read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.pair_order import to_gptq_order, to_pair_order
from ..kernels.w4a16 import w4a16_applies, w4a16_linear
from ..models.quantization import PackedScheme
from ..weights import WeightsError, WeightStore

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _shifts(bits: int, device) -> torch.Tensor:
    return torch.arange(0, 32, bits, dtype=torch.int32, device=device)


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] int32 words of `32/bits` rows each -> [R*pack, C] int32 values (row r*pack + i in bits i)."""
    mask = (1 << bits) - 1
    values = (packed.unsqueeze(1) >> _shifts(bits, packed.device).view(1, -1, 1)) & mask
    return values.reshape(-1, packed.shape[1])


def unpack_cols(packed: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """[R, C] int32 words of `32/bits` columns each -> [R, C*pack]; `order[i]` is the column value i holds."""
    mask = (1 << bits) - 1
    values = (packed.unsqueeze(2) >> _shifts(bits, packed.device).view(1, 1, -1)) & mask  # [R, C, pack]
    if order is not None:
        values = values[..., [order.index(column) for column in range(len(order))]]
    return values.reshape(packed.shape[0], -1)


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of unpack_rows: [R, C] values in [0, 2^bits) -> [R/pack, C] int32 words."""
    pack = 32 // bits
    rows = values.reshape(-1, pack, values.shape[1])
    words = rows[:, 0].to(torch.int64, copy=True)  # never the caller's int64 values, OR-ed in place
    for i in range(1, pack):  # one word-sized pass a value: no [R, C] int64 temporaries
        words |= rows[:, i].to(torch.int64) << (i * bits)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def dequantize_packed_reference(qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                                bits: int, dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """`PackedWeight`'s layout as the [out, in] weight in `dtype`: (q - zero) * scale, the scale in
    `dtype`, the product computed in float32 (exact for half scales) and rounded once."""
    groups = g_idx.long()
    values = unpack_rows(to_gptq_order(qweight, bits), bits)
    weight = (values - zeros[groups].int()).float() * scales[groups].to(dtype).float()
    return weight.t().to(dtype)


@dataclass
class _Slice:
    """A rank's part of one checkpoint linear: qweight int32 words [in/pack, out] in GPTQ's order
    (GPTQ's own words, as read: nothing is unpacked), zeros/scales [groups, out], g_idx [in]."""

    qweight: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor


class PackedWeight(nn.Module):
    """A rank's [out, in] linear weight, packed as GPTQ packs it (see the module docstring)."""

    def __init__(self, scheme: PackedScheme, shape: tuple[int, int], dtype: torch.dtype, device):
        super().__init__()
        self.scheme, self.out_features, self.in_features = scheme, shape[0], shape[1]
        self.dtype, self.device = dtype, torch.device(device)
        for name in ("qweight", "zeros", "scales", "g_idx"):
            self.register_buffer(name, None)
        self.group_rows: int | None = None  # rows per group where g_idx[k] == k // group_rows

    @classmethod
    def from_values(cls, scheme: PackedScheme, values: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                    g_idx: torch.Tensor, device="cpu") -> PackedWeight:  # fmt: skip
        """A weight from unpacked values [in, out], zero points and scales [groups, out], g_idx [in]."""
        weight = cls(scheme, (values.shape[1], values.shape[0]), scales.dtype, device)
        weight._set(_Slice(pack_rows(values, scheme.bits), zeros, scales, g_idx), "weight")
        return weight

    # The product.
    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if w4a16_applies(x, self.scheme.bits):
            return w4a16_linear(x, self.qweight, self.zeros, self.scales, self.g_idx, self.scheme.bits,
                                self.group_rows, bias)  # fmt: skip
        return F.linear(x, self.dequantize(x.dtype), bias)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The [out, in] weight in `dtype` (`dequantize_packed_reference`)."""
        return dequantize_packed_reference(self.qweight, self.zeros, self.scales, self.g_idx, self.scheme.bits, dtype)

    # Loading.
    def load_columns(self, store: WeightStore, prefixes: list[str], parts) -> None:
        """Column-parallel: output columns [part.start, part.end) of each prefix, stacked."""
        slices = [_read_columns(store, prefix, self.scheme, self.in_features, part.start, part.end, self.device)
                  for prefix, part in zip(prefixes, parts)]  # fmt: skip
        for prefix, piece in zip(prefixes[1:], slices[1:]):
            if not torch.equal(piece.g_idx, slices[0].g_idx):
                raise WeightsError(
                    f"{prefix}.g_idx differs from {prefixes[0]}.g_idx ({self.scheme.describe()}): projections "
                    "fused into one product need the same act-order groups"
                )
        cat = lambda field: torch.cat([getattr(piece, field) for piece in slices], dim=1)  # noqa: E731
        self._set(_Slice(cat("qweight"), cat("zeros"), cat("scales"), slices[0].g_idx), prefixes[0])

    def load_rows(self, store: WeightStore, prefix: str, start: int, end: int, in_features: int) -> None:
        """Row-parallel: input rows [start, end) of all output columns."""
        self._set(_read_rows(store, prefix, self.scheme, in_features, start, end, self.device), prefix)

    def _set(self, piece: _Slice, prefix: str) -> None:
        pack = self.scheme.pack
        want = (self.in_features // pack, self.out_features)
        if self.in_features % pack or tuple(piece.qweight.shape) != want:
            raise WeightsError(f"{prefix}.qweight holds {list(piece.qweight.shape)} words, expected [in/{pack}, out] = "
                               f"{list(want)} for {self.in_features} inputs")  # fmt: skip
        # 4-bit zero points are 4-bit fields (+1 in GPTQ's v1): the half2 dequantization needs
        # them below its magic constant (128).
        most = 2**self.scheme.bits if self.scheme.bits == 4 else 2**15 - 1
        if piece.zeros.numel() and (int(piece.zeros.min()) < 0 or int(piece.zeros.max()) > most):
            raise WeightsError(f"{prefix}: zero points outside [0, {most}] ({self.scheme.describe()})")
        device = self.device
        # Contiguous: slices read by columns are strided views, and the kernel reads rows of N.
        self.qweight = to_pair_order(piece.qweight.to(device), self.scheme.bits).contiguous()
        self.zeros = piece.zeros.to(torch.int16).to(device).contiguous()
        self.scales = piece.scales.to(device).contiguous()
        self.g_idx = piece.g_idx.to(torch.int32).to(device).contiguous()
        self.group_rows = contiguous_group_rows(piece.g_idx, self.scheme.group_size)


def contiguous_group_rows(g_idx: torch.Tensor, group_size: int) -> int | None:
    """Rows per group when row k is in group k // rows (one group: all the rows), else None
    (act-order, or a row-parallel slice that starts inside a group)."""
    rows = g_idx.numel()
    if rows and bool((g_idx == 0).all()):
        return rows
    if group_size > 0 and torch.equal(g_idx.long().cpu(), torch.arange(rows) // group_size):
        return group_size
    return None


def _check(store: WeightStore, prefix: str, scheme: PackedScheme, in_features: int) -> int:
    """Validates one linear's tensors against the scheme; returns its output features."""
    fmt = scheme.describe()
    names = {key: f"{prefix}.{key}" for key in ("qweight", "qzeros", "scales", "g_idx")}
    for key in ("qweight", "qzeros", "scales"):
        if names[key] not in store:
            raise WeightsError(f"{names[key]} is missing ({fmt} checkpoint)")
    if scheme.desc_act and names["g_idx"] not in store:
        raise WeightsError(f"{names['g_idx']} is missing ({fmt} checkpoint with desc_act)")
    headers = {key: store.header(name) for key, name in names.items() if name in store}
    for key, want in (("qweight", "I32"), ("qzeros", "I32")):
        if headers[key][0] != want:
            raise WeightsError(f"{names[key]} is {headers[key][0]}; {fmt} stores it as int32")
    if headers["scales"][0] not in ("F16", "BF16", "F32"):
        raise WeightsError(f"{names['scales']} is {headers['scales'][0]}; {fmt} scales are float16")
    if "g_idx" in headers and headers["g_idx"][0] not in ("I32", "I64"):
        raise WeightsError(f"{names['g_idx']} is {headers['g_idx'][0]}; {fmt} stores it as int32")
    qshape, sshape = headers["qweight"][1], headers["scales"][1]
    if len(qshape) != 2 or len(sshape) != 2:
        raise WeightsError(f"{names['qweight']} {list(qshape)} and {names['scales']} {list(sshape)} must be 2-D ({fmt})")
    out, pack, groups = sshape[1], scheme.pack, scheme.groups(in_features)
    if scheme.method == "gptq":
        want = (in_features // pack, out)
        layout = f"[in/{pack}, out] (gptq packs {pack} {scheme.bits}-bit input rows per int32)"
    else:
        want = (in_features, -(-out // pack))
        layout = f"[in, out/{pack}] (awq packs {pack} {scheme.bits}-bit output columns per int32)"
    if qshape != want or in_features % pack:
        hint = ""
        if scheme.method == "gptq" and qshape[0] and in_features % qshape[0] == 0 and 32 % (in_features // qshape[0]) == 0:
            hint = f"; its rows fit {32 // (in_features // qshape[0])}-bit packing, not the declared {scheme.bits} bits"
        raise WeightsError(f"{names['qweight']} has shape {list(qshape)}; a {in_features}-input linear in {fmt} needs "
                           f"{layout} = {list(want)}{hint}")  # fmt: skip
    if sshape[0] != groups:
        raise WeightsError(f"{names['scales']} has {sshape[0]} groups (shape {list(sshape)}); {in_features} inputs in "
                           f"{fmt} make {groups}")  # fmt: skip
    zshape, zwant = headers["qzeros"][1], (groups, -(-out // pack))
    if zshape != zwant:
        raise WeightsError(f"{names['qzeros']} has shape {list(zshape)}; {fmt} needs [groups, out/{pack}] = {list(zwant)}")
    if "g_idx" in headers and headers["g_idx"][1] != (in_features,):
        raise WeightsError(f"{names['g_idx']} has shape {list(headers['g_idx'][1])}; {fmt} needs one group per input "
                           f"row [{in_features}]")  # fmt: skip
    return out


def _g_idx(store: WeightStore, prefix: str, scheme: PackedScheme, in_features: int, start: int, end: int) -> torch.Tensor:
    name = f"{prefix}.g_idx"
    if scheme.method == "gptq" and name in store:
        g_idx = store.get_rows(name, start, end).long()
        groups = scheme.groups(in_features)
        if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= groups):
            raise WeightsError(f"{name} holds groups outside [0, {groups}) ({scheme.describe()})")
        return g_idx
    rows = torch.arange(start, end)
    return torch.zeros_like(rows) if scheme.group_size == -1 else rows // scheme.group_size


def _packed_columns(store, name, bits, start, end, order=None, device="cpu") -> torch.Tensor:
    """Columns [start, end) of a tensor packed along its columns, unpacked on `device`."""
    pack = 32 // bits
    first = start // pack
    words = store.get_cols(name, first, -(-end // pack)).to(device)
    return unpack_cols(words, bits, order)[:, start - first * pack : end - first * pack]


def _read_columns(store, prefix, scheme: PackedScheme, in_features, start, end, device="cpu") -> _Slice:
    """Output columns [start, end); repacking (AWQ) runs on `device`, where the layer will live."""
    out = _check(store, prefix, scheme, in_features)
    if end > out:
        raise WeightsError(f"{prefix}.scales has {out} output columns; this rank needs [{start}, {end})")
    bits, order = scheme.bits, AWQ_ORDER if scheme.method == "awq" else None
    if scheme.method == "gptq":
        qweight = store.get_cols(f"{prefix}.qweight", start, end)
    else:  # AWQ packs columns: its values are repacked by rows
        qweight = pack_rows(_packed_columns(store, f"{prefix}.qweight", bits, start, end, order, device), bits)
    zeros = _packed_columns(store, f"{prefix}.qzeros", bits, start, end, order) + scheme.zero_offset
    scales = store.get_cols(f"{prefix}.scales", start, end)
    return _Slice(qweight, zeros, scales, _g_idx(store, prefix, scheme, in_features, 0, in_features))


def _read_rows(store, prefix, scheme: PackedScheme, in_features, start, end, device="cpu") -> _Slice:
    """Input rows [start, end); repacking (AWQ) runs on `device`, where the layer will live."""
    out = _check(store, prefix, scheme, in_features)
    bits, pack = scheme.bits, scheme.pack
    if scheme.method == "gptq":
        if start % pack or end % pack:
            raise WeightsError(f"{prefix}.qweight packs {pack} input rows per int32; this rank's rows [{start}, {end}) "
                               "split a word: use a --num-shard that splits the inputs in multiples of "
                               f"{pack}")  # fmt: skip
        qweight = store.get_rows(f"{prefix}.qweight", start // pack, end // pack)
    else:
        values = unpack_cols(store.get_rows(f"{prefix}.qweight", start, end).to(device), bits, AWQ_ORDER)[:, :out]
        qweight = pack_rows(values, bits)
    g_idx = _g_idx(store, prefix, scheme, in_features, start, end)
    low, high = int(g_idx.min()), int(g_idx.max()) + 1
    order = AWQ_ORDER if scheme.method == "awq" else None
    zeros = unpack_cols(store.get_rows(f"{prefix}.qzeros", low, high), bits, order)[:, :out] + scheme.zero_offset
    scales = store.get_rows(f"{prefix}.scales", low, high)
    return _Slice(qweight, zeros, scales, g_idx - low)
