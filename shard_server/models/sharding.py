"""How a Llama-family model splits over tensor-parallel ranks, checked before any weight loads.

Query heads and MLP columns split evenly. KV heads split evenly when there are at least as
many as ranks; with fewer, each rank holds one KV head and consecutive ranks share it
(replication), which keeps every rank's query heads next to the KV head they attend with.
The vocabulary needs no check: it is split in padded blocks (ParallelContext.padded_split).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..distributed import ParallelContext, RowRange
from .config import ModelConfig


class ShardingError(ValueError):
    """The model cannot be split over this many ranks; the message names the numbers."""


@dataclass(frozen=True)
class HeadSharding:
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank
    first_head: int  # global index of this rank's first query head
    first_kv_head: int  # global index of this rank's first KV head

    def q_rows(self, head_dim: int) -> RowRange:
        return RowRange(self.first_head * head_dim, (self.first_head + self.num_heads) * head_dim)

    def kv_rows(self, head_dim: int) -> RowRange:
        start = self.first_kv_head * head_dim
        return RowRange(start, start + self.num_kv_heads * head_dim)


def check_shardable(cfg: ModelConfig, world_size: int) -> None:
    """Raises ShardingError listing every dimension that cannot split over `world_size`."""
    problems = []
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads % world_size:
        problems.append(f"{heads} attention heads are not divisible by {world_size}")
    if kv_heads >= world_size and kv_heads % world_size:
        problems.append(f"{kv_heads} KV heads are not divisible by {world_size}")
    if kv_heads < world_size and world_size % kv_heads:
        problems.append(
            f"{world_size} is not a multiple of the {kv_heads} KV heads (needed to replicate them)"
        )
    if cfg.intermediate_size % world_size:
        problems.append(f"intermediate size {cfg.intermediate_size} is not divisible by {world_size}")
    if problems:
        raise ShardingError(
            f"cannot split this {cfg.model_type} model over {world_size} shards: "
            + "; ".join(problems)
            + ". Choose a --num-shard that divides the attention heads."
        )


def shard_heads(cfg: ModelConfig, ctx: ParallelContext) -> HeadSharding:
    check_shardable(cfg, ctx.world_size)
    world, rank = ctx.world_size, ctx.rank
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    local_heads = heads // world
    if kv_heads >= world:
        local_kv = kv_heads // world
        first_kv = rank * local_kv
    else:
        local_kv = 1
        first_kv = rank // (world // kv_heads)  # world // kv_heads ranks share each KV head
    return HeadSharding(local_heads, local_kv, rank * local_heads, first_kv)


def even_rows(size: int, ctx: ParallelContext) -> RowRange:
    return RowRange(*ctx.split(size))
