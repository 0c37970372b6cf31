"""Rank and world size of this shard, and the collectives tensor parallelism needs.

With world_size 1 every collective is a no-op, so layers call them unconditionally.
Multi-rank runs initialise torch.distributed (NCCL on CUDA, gloo on CPU) explicitly from the
command line's master address and port; nothing is read from the environment. NCCL's NVLink
multicast (NVLS) stays off unless the caller's environment already decided: it reserves a large
share of GPU memory and has hung collectives on some drivers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RowRange:
    """Rows [start, end) of one (unfused) weight that this rank holds."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ParallelContext:
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"invalid rank {self.rank} for world size {self.world_size}")

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def split(self, size: int, what: str = "dimension") -> tuple[int, int]:
        """[start, end) of this rank's even share of `size`."""
        if size % self.world_size:
            raise ValueError(f"{what} {size} is not divisible by world size {self.world_size}")
        part = size // self.world_size
        return self.rank * part, (self.rank + 1) * part

    def padded_split(self, size: int) -> tuple[int, int, int]:
        """(start, end, block): this rank's share of `size` split in blocks of
        ceil(size / world_size); the last ranks' blocks may hold fewer than `block` real rows,
        so a vocabulary of any size can be split and gathered in equal parts."""
        block = -(-size // self.world_size)
        start = min(self.rank * block, size)
        return start, min(start + block, size), block

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.is_parallel:
            dist.all_reduce(tensor)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.is_parallel:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=-1)


def init_parallel(
    rank: int, world_size: int, master_addr: str, master_port: int, device: torch.device
) -> ParallelContext:
    ctx = ParallelContext(rank=rank, world_size=world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if ctx.is_parallel and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NCCL reads it at communicator init
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
        )
    return ctx
