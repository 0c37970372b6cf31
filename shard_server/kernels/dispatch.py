"""Whether an op takes its fused Triton path.

On by default for CUDA tensors. `fused_kernels(False)` switches them off for a block of code,
so a benchmark can time the plain-torch path in the same process; tests force them on for
CPU tensors under Triton's interpreter with `fused_kernels(True, on_cpu=True)`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class _Switch:
    enabled: bool = True
    on_cpu: bool = False


_SWITCH = _Switch()


def use_fused(x: torch.Tensor) -> bool:
    if not _SWITCH.enabled:
        return False
    return x.is_cuda or _SWITCH.on_cpu


@contextmanager
def fused_kernels(enabled: bool, on_cpu: bool = False):
    saved = (_SWITCH.enabled, _SWITCH.on_cpu)
    _SWITCH.enabled, _SWITCH.on_cpu = enabled, on_cpu
    try:
        yield
    finally:
        _SWITCH.enabled, _SWITCH.on_cpu = saved


def next_power_of_two(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())
