"""Rank and world size of this shard, and the collectives tensor parallelism needs.

With world_size 1 every collective is a no-op, so layers call them unconditionally.
Multi-rank runs initialise torch.distributed (NCCL on CUDA, gloo on CPU) explicitly from the
command line's master address and port; nothing is read from the environment. NCCL's NVLink
multicast (NVLS) stays off unless the caller's environment already decided: it reserves a large
share of GPU memory and has hung collectives on some drivers.

A rank that runs out of device memory mid-step must not leave its peers waiting in a collective
it will never join (the step would hang until it timed out, taking the shards down). So during
a step the ranks' hosts vote before each collective and once at the step's end (`StepAgreement`,
over a gloo group: host memory, never a wait on the device): a rank whose allocation failed
votes no at the point its peers wait in, and every rank leaves the step with an out-of-memory
error, which the runner answers as such (the router recomputes the step's sequences). The
votes cost each rank's host a round trip per collective made from Python; CUDA graph replays
make none.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


class PeerOutOfMemory(torch.cuda.OutOfMemoryError):
    """Another rank ran out of device memory in this step: this rank leaves it too."""


class StepAgreement:
    """The ranks' votes during a step that every rank is still in it (see the module doc)."""

    def __init__(self, group) -> None:
        self.group = group  # gloo
        self.active = False

    @contextmanager
    def step(self):
        """Votes at each collective inside (`check`) and once at the end. A rank whose own
        allocation failed votes no where it is, so that its peers leave the step with
        `PeerOutOfMemory`; the error goes on to the caller on every rank."""
        self.active = True
        try:
            yield
        except PeerOutOfMemory:
            raise  # every rank knows already
        except torch.cuda.OutOfMemoryError:
            self._vote(False)  # at the collective the peers wait in, or at the end
            raise
        else:
            self._vote(True)  # a rank that failed after its last collective says so here
        finally:
            self.active = False

    def check(self) -> None:
        """Before a collective: all ranks are still in the step, or PeerOutOfMemory."""
        if self.active:
            self._vote(True)

    def _vote(self, ok: bool) -> None:
        ballot = torch.tensor([int(ok)], dtype=torch.int32)
        dist.all_reduce(ballot, op=dist.ReduceOp.MIN, group=self.group)
        if ok and not ballot.item():
            self.active = False  # no more votes in this step: the peers have left it
            raise PeerOutOfMemory("another rank ran out of device memory in this step")


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
    # The ranks' votes during steps (multi-rank runs from `init_parallel`); None: none taken.
    agreement: StepAgreement | None = field(default=None, compare=False, repr=False)

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
            self._agree()
            dist.all_reduce(tensor)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.is_parallel:
            return tensor
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._agree()
        dist.all_gather(parts, tensor)
        return torch.cat(parts, dim=-1)

    def _agree(self) -> None:
        """The vote before a collective. Called right before it: a rank whose allocation fails
        between its vote and the collective would leave its peers waiting in that collective."""
        if self.agreement is not None:
            self.agreement.check()

    @contextmanager
    def step(self):
        """One step's span of votes (a no-op without an agreement: one rank)."""
        if self.agreement is None:
            yield
        else:
            with self.agreement.step():
                yield


def init_parallel(
    rank: int, world_size: int, master_addr: str, master_port: int, device: torch.device
) -> ParallelContext:
    ctx = ParallelContext(rank=rank, world_size=world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not ctx.is_parallel:
        return ctx
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NCCL reads it at communicator init
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
        )
    return ParallelContext(rank, world_size, StepAgreement(dist.new_group(backend="gloo")))
