"""Host-to-device copies that never make the host wait for the GPU.

`torch.tensor(values, device="cuda")` copies from pageable memory and then synchronises the
stream, so the host waits for every kernel queued before it: one such call while step N runs
stalls the launch of step N+1 until N is done, and the GPU idles for the rest of N+1's host
work. Staged through pinned memory the copy is queued like a kernel; PyTorch's pinned
allocator keeps each staging buffer until the copy that reads it has run.
"""

from __future__ import annotations

import torch


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` (a list, nested lists or a numpy array) as a tensor on `device`, queued."""
    return host_to_device(torch.as_tensor(values, dtype=dtype), device)


def host_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on `device` (itself on the CPU), copied without a stream sync."""
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def copy_into(target: torch.Tensor, host: torch.Tensor) -> None:
    """Writes a CPU tensor into a device tensor (a CUDA graph's static input), queued."""
    if target.device.type != "cuda":
        target.copy_(host)
        return
    target.copy_(host.pin_memory(), non_blocking=True)
