"""fp8 experts' scales, as the fused MoE kernel (`kernels/fused_moe.py`) and the torch reference
(`models/moe.py`) read them. W = fp8 * scale, with one of two kinds of scale:

- "row": one float32 scale per weight row, w13 [E, 2I] and w2 [E, H] (`--quantize fp8` on a
  bf16 checkpoint, and per-tensor / per-channel fp8 checkpoints). The kernel scales each output
  feature's float32 sum once, after the K loop.
- "block": a block-wise fp8 checkpoint's scales as stored (DeepSeek-V3 / Qwen3-FP8
  `weight_scale_inv`), one per [bn, bk] block of each expert's [out, in] weight. Tensor
  parallelism slices experts by intermediate size; a rank holds intermediate rows
  [first, first + I), and the slice may start and end mid-block, so it keeps every scale block
  its rows touch: w13 [E, 2R, ceil(H / bk)] (the gate's R = ceil((first % bn + I) / bn) scale
  rows, then the up's R) and w2 [E, ceil(H / bn), C] with C = ceil((first % bk + I) / bk). Local
  gate (or up) row r is in scale row (first % bn + r) // bn (up: R + that); local w2 column c
  in scale column (first % bk + c) // bk. The kernel dequantizes each weight tile in float32
  and rounds it once to the activations' dtype before the dot (W8A16: activations are not
  quantized), which is exactly the weight the reference dequantizes. A K tile must sit inside
  one scale block, so the kernel's BLOCK_K is cut to a power of two dividing bk (`block_k`):
  bk must be a multiple of MIN_BLOCK_K (128, as every Hub checkpoint has, is), else the experts
  take the reference path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_BLOCK_K = 16  # the smallest K a tensor-core dot takes


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scale_shapes(block: tuple[int, int] | None, first: int, experts: int, inter: int, hidden: int
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """The scale shapes (w13's, w2's) that experts w13 [E, 2I, H] and w2 [E, H, I] need: one a
    row (`block` None), or the [bn, bk] blocks a slice from intermediate row `first` touches."""
    if block is None:
        return (experts, 2 * inter), (experts, hidden)
    bn, bk = block
    rows, cols = _cdiv(first % bn + inter, bn), _cdiv(first % bk + inter, bk)
    return (experts, 2 * rows, _cdiv(hidden, bk)), (experts, _cdiv(hidden, bn), cols)


@dataclass(frozen=True)
class GemmScales:
    """One grouped GEMM's scale arguments for `_moe_gemm_kernel` (see the module docstring)."""

    tensor: torch.Tensor
    kind: str | None  # "row", "block", or None (unscaled)
    block: tuple[int, int] = (1, 1)  # (bn rows, bk columns) a scale
    n_offset: int = 0  # where local row 0 sits inside its scale block (gate_up: first % bn)
    up_row: int = 0  # gate_up: the up rows' first scale row (R)
    k_offset: int = 0  # where local column 0 sits inside its scale block (down: first % bk)


@dataclass(frozen=True)
class ExpertScales:
    """fp8 experts' float32 scales: per row (`block` None), or per [bn, bk] block of a rank's
    slice that starts at checkpoint intermediate row `first` (see the module docstring)."""

    w13: torch.Tensor
    w2: torch.Tensor
    block: tuple[int, int] | None = None
    first: int = 0

    @property
    def kind(self) -> str:
        return "row" if self.block is None else "block"

    def check(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        """ValueError unless these scales fit experts w13 [E, 2I, H] and w2 [E, H, I]."""
        experts, inter, hidden = w13.shape[0], w13.shape[1] // 2, w13.shape[2]
        if self.block is not None and not (len(self.block) == 2 and min(self.block) > 0 and self.first >= 0):
            raise ValueError(f"block scales need a positive [bn, bk] block and first >= 0: {self.block}, {self.first}")
        want13, want2 = scale_shapes(self.block, self.first, experts, inter, hidden)
        layout = "one a row" if self.block is None else f"{self.block[0]}x{self.block[1]} blocks from row {self.first}"
        for name, scale, want in (("w13", self.w13, want13), ("w2", self.w2, want2)):
            if tuple(scale.shape) != want or scale.dtype != torch.float32:
                raise ValueError(f"{self.kind} scales of {name}: {scale.dtype} {list(scale.shape)}; experts w13 "
                                 f"{list(w13.shape)}, w2 {list(w2.shape)} need float32 {list(want)} ({layout})")

    def block_k(self, tile_block_k: int) -> int:
        """The K tile for these scales: tile_block_k, or for block scales the largest power of
        two that divides bk and is no larger (a K tile within one scale block)."""
        if self.block is None:
            return tile_block_k
        bk = self.block[1]
        return min(tile_block_k, bk & -bk)

    def kernel_fits(self) -> bool:
        """Whether the fused kernel takes these scales: row scales, or blocks of bk a multiple of MIN_BLOCK_K."""
        return self.block is None or self.block[1] % MIN_BLOCK_K == 0

    def gate_up(self) -> GemmScales:
        if self.block is None:
            return GemmScales(self.w13, "row")
        bn, bk = self.block
        return GemmScales(self.w13, "block", self.block, n_offset=self.first % bn, up_row=self.w13.shape[1] // 2)

    def down(self) -> GemmScales:
        if self.block is None:
            return GemmScales(self.w2, "row")
        return GemmScales(self.w2, "block", self.block, k_offset=self.first % self.block[1])

    def factors(self, inter: int, hidden: int, expert: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each weight element's scale, broadcastable against w13 [(E,) 2I, H] and w2 [(E,) H, I]:
        all experts', or `expert`'s."""
        w13, w2 = (self.w13, self.w2) if expert is None else (self.w13[expert], self.w2[expert])
        if self.block is None:
            return w13[..., None], w2[..., None]
        (bn, bk), device = self.block, w13.device
        local = torch.arange(inter, device=device)
        gate_rows = (self.first % bn + local) // bn
        rows13 = torch.cat([gate_rows, gate_rows + w13.shape[-2] // 2])
        cols13 = torch.arange(hidden, device=device) // bk
        rows2, cols2 = torch.arange(hidden, device=device) // bn, (self.first % bk + local) // bk
        return w13[..., rows13[:, None], cols13[None, :]], w2[..., rows2[:, None], cols2[None, :]]


def dequantize_experts(
    w13: torch.Tensor, w2: torch.Tensor, scales: ExpertScales | None, dtype: torch.dtype, expert: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Experts w13 [E, 2I, H] and w2 [E, H, I] (or `expert`'s [2I, H] and [H, I]) in `dtype`:
    fp8 ones times their scales in float32, rounded once (the fused kernel's weights exactly);
    float ones as they are."""
    if expert is not None:
        w13, w2 = w13[expert], w2[expert]
    if scales is None:
        return w13, w2
    f13, f2 = scales.factors(w2.shape[-1], w2.shape[-2], expert)
    return (w13.float() * f13).to(dtype), (w2.float() * f2).to(dtype)
