"""Builds shard objects from a model directory and drives them with plain step messages."""

from __future__ import annotations

from pathlib import Path

import torch

from shard_server.distributed import ParallelContext
from shard_server.kv_cache import KVSpec
from shard_server.models.config import ModelConfig
from shard_server.models.registry import build_model
from shard_server.pb import generate_pb2 as pb
from shard_server.runner import ModelRunner
from shard_server.weights import WeightStore, read_config

CPU = torch.device("cpu")


def load_model(directory: Path, dtype=torch.float32, device=CPU, attention="reference"):
    config = ModelConfig.from_dict(read_config(directory))
    with WeightStore(directory) as store:
        return build_model(config, store, ParallelContext(), attention, dtype, device)


def load_runner(
    directory: Path, block_size: int = 4, num_blocks: int = 256, dtype=torch.float32, device=CPU,
    attention="reference",
) -> ModelRunner:  # fmt: skip
    model = load_model(directory, dtype, device, attention)
    cfg = model.config
    spec = KVSpec(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, block_size, dtype)
    runner = ModelRunner(model, spec, device)
    runner.allocate_kv_cache(num_blocks)
    return runner


class BlockPool:
    """Hands out distinct block ids in a scrambled order, like a router after some churn."""

    def __init__(self, num_blocks: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_blocks, generator=generator).tolist()

    def take(self, count: int) -> list[int]:
        taken, self.free = self.free[:count], self.free[count:]
        assert len(taken) == count, "test pool exhausted"
        return taken


class StepDriver:
    """A minimal router: tracks lengths and blocks per sequence and builds StepRequests."""

    def __init__(self, runner: ModelRunner, seed: int = 0):
        self.runner = runner
        self.pool = BlockPool(runner.kv_cache.num_blocks, seed)
        self.blocks: dict[int, int] = {}
        self.step_id = 0

    def blocks_for(self, seq_id: int, total_tokens: int) -> list[int]:
        bs = self.runner.block_size
        needed = -(-total_tokens // bs) - self.blocks.get(seq_id, 0)
        self.blocks[seq_id] = self.blocks.get(seq_id, 0) + max(0, needed)
        return self.pool.take(max(0, needed))

    def step(self, new=(), scheduled=(), released=()) -> pb.StepResponse:
        self.step_id += 1
        request = pb.StepRequest(step_id=self.step_id, released_ids=list(released))
        request.new_sequences.extend(new)
        request.sequences.extend(scheduled)
        return self.runner.step(request)


def generate_greedy(
    driver: StepDriver, seq_id: int, prompt: list[int], new_tokens: int, chunk: int, sampling=None
) -> list[int]:
    """Chunked prefill, then decodes, through the runner; returns the generated ids."""
    kwargs = {"sampling": sampling} if sampling is not None else {}
    new = [pb.NewSequence(id=seq_id, input_ids=prompt, prompt_len=len(prompt), **kwargs)]
    done, out = 0, []
    while done < len(prompt):
        n = min(chunk, len(prompt) - done)
        last = done + n == len(prompt)
        sched = pb.ScheduledSequence(
            id=seq_id, num_tokens=n, new_block_ids=driver.blocks_for(seq_id, done + n), sample=last
        )
        response = driver.step(new=new, scheduled=[sched])
        new, done = [], done + n
    out.append(response.outputs[0].token.id)
    for _ in range(new_tokens - 1):
        length = len(prompt) + len(out)
        sched = pb.ScheduledSequence(
            id=seq_id, num_tokens=1, new_block_ids=driver.blocks_for(seq_id, length), sample=True
        )
        out.append(driver.step(scheduled=[sched]).outputs[0].token.id)
    driver.step(released=[seq_id])
    return out
