"""Programmatic dependent launch (Hopper's griddepcontrol) for the decoder's Triton kernels.

A decode step is ~325 kernels of a few microseconds each; launched this way, a kernel's
programs are placed on the GPU while the kernel before it finishes, instead of after. Each
such kernel starts with `wait_for_previous_kernel`, which blocks until the previous kernel has
completed and its writes are visible, so no input is read early; then it lets the next kernel
be placed the same way.

Off by default: `programmatic_launch(True)` switches it on for a block of code (CUDA graphs
record it when captured inside), so a benchmark can compare the same steps both ways.
Kernels take it through `launch_args(x)`: their PDL constexpr, and Triton's `launch_pdl`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_ENABLED = [False]


@contextmanager
def programmatic_launch(enabled: bool):
    saved = _ENABLED[0]
    _ENABLED[0] = enabled
    try:
        yield
    finally:
        _ENABLED[0] = saved


def launch_args(x: torch.Tensor) -> dict:
    """Keyword arguments of a launch over CUDA tensor x: PDL (and `launch_pdl` when on)."""
    if _ENABLED[0] and x.is_cuda:
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """First in a kernel: with PDL, waits for the previous kernel, then lets the next one start."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
