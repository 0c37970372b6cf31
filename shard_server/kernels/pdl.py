"""Programmatic dependent launch (Hopper's griddepcontrol) for the decoder's Triton kernels.

A decode step is ~325 kernels of a few microseconds each; launched this way, a kernel's
programs are placed on the GPU while the kernel before it finishes, instead of after. Each
such kernel starts with `wait_for_previous_kernel`, which blocks until the previous kernel has
completed and its writes are visible, so no input is read early; then it lets the next kernel
be placed the same way.

Off by default: `programmatic_launch(True)` switches it on for a block of code (CUDA graphs
record it when captured inside), so a benchmark can compare the same steps both ways. The
decode graphs of a few sequences over fp8 weights are captured so (`cuda_graphs.pdl_up_to`:
where it measured faster).
Kernels take it through `launch_args(x)`: their PDL constexpr, and Triton's `launch_pdl`.

A kernel placed early can also start on what does not depend on the previous kernel: with
`prefetch_weights`, the skinny matmul asks L2 for its weight slice (`prefetch_rows_to_l2`)
before it waits, while the previous kernel's last programs leave memory bandwidth unused.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_ENABLED = {"launch": False, "prefetch_weights": False}


@contextmanager
def programmatic_launch(enabled: bool, prefetch_weights: bool = False):
    saved = dict(_ENABLED)
    _ENABLED.update(launch=enabled, prefetch_weights=enabled and prefetch_weights)
    try:
        yield
    finally:
        _ENABLED.update(saved)


def launch_args(x: torch.Tensor) -> dict:
    """Keyword arguments of a launch over CUDA tensor x: PDL (and `launch_pdl` when on)."""
    if _ENABLED["launch"] and x.is_cuda:
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


def prefetches_weights(x: torch.Tensor) -> bool:
    """Whether a matmul launched over x prefetches its weights before it waits (only ever on
    with the launch itself: `programmatic_launch` sets both)."""
    return _ENABLED["prefetch_weights"] and x.is_cuda


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL: waits for the previous kernel, then lets the next one be placed. A kernel calls it
    before it touches anything the kernels before it write or read (weight prefetches may come
    first). The next kernel is placed only once every program of this one has started, so its
    waiting programs never hold back this one's."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_rows_to_l2(ptr, rows, row_ok, row_stride, lo, hi, LINE: tl.constexpr, LINES: tl.constexpr):
    """Asks L2 for columns [lo, hi) of `rows` (those row_ok) of ptr: one `prefetch.global.L2`
    per LINE-element (128-byte) line, LINES lines of each row at a time. Reads nothing."""
    base = ptr + rows[:, None].to(tl.int64) * row_stride
    for start in range(lo, hi, LINE * LINES):
        cols = start + tl.arange(0, LINES) * LINE
        at = tl.where(row_ok[:, None] & (cols < hi)[None, :], base + cols[None, :], ptr)  # masked: the first line
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [at.to(tl.int64, bitcast=True)],
                                  dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
