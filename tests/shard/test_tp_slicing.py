"""Slicing of every tensor-parallel layer, one rank at a time, without collectives.

`LocalRank` replaces the collectives with identities, so each rank's partial output can be
checked against the matching piece of the unsplit computation: column-parallel outputs
concatenate, row-parallel and embedding partials sum, LM-head logits concatenate.
"""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from shard_server.distributed import ParallelContext
from shard_server.layers.embedding import LMHead, VocabParallelEmbedding
from shard_server.layers.linear import ColumnParallelLinear, RowParallelLinear
from shard_server.models.config import ModelConfig
from shard_server.models.sharding import ShardingError, check_shardable, even_rows, shard_heads
from shard_server.weights import WeightStore

CPU = torch.device("cpu")
F32 = torch.float32


@dataclass(frozen=True)
class LocalRank(ParallelContext):
    """A rank whose collectives return its own partial result."""

    def all_reduce(self, tensor):
        return tensor

    def all_gather_last_dim(self, tensor):
        return tensor


def config(heads=8, kv_heads=2, head_dim=4, intermediate=24, vocab=10) -> ModelConfig:
    return ModelConfig.from_dict(
        dict(
            model_type="llama",
            vocab_size=vocab,
            hidden_size=heads * head_dim,
            intermediate_size=intermediate,
            num_hidden_layers=1,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
        )
    )


@pytest.fixture
def weights(tmp_path):
    """A safetensors file of random tensors; returns (store, tensors)."""
    generator = torch.Generator().manual_seed(0)

    def make(**shapes):
        tensors = {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
        save_file(tensors, tmp_path / "model.safetensors")
        return WeightStore(tmp_path), tensors

    return make


def qkv_layer(cfg, rank, world, store, bias=False):
    ctx = LocalRank(rank, world)
    heads = shard_heads(cfg, ctx)
    d = cfg.head_dim
    parts = [heads.q_rows(d), heads.kv_rows(d), heads.kv_rows(d)]
    layer = ColumnParallelLinear(cfg.hidden_size, parts, bias, F32, CPU)
    layer.load(store, ["q", "k", "v"])
    return layer, heads


@pytest.mark.parametrize("world, kv_per_rank", [(1, [[0, 1]]), (2, [[0], [1]]), (4, [[0], [0], [1], [1]])])
def test_fused_qkv_gives_each_rank_its_heads_and_their_kv_heads(weights, world, kv_per_rank):
    cfg = config(heads=8, kv_heads=2, head_dim=4)
    d, hidden = cfg.head_dim, cfg.hidden_size
    store, full = weights(
        **{"q.weight": (8 * d, hidden), "k.weight": (2 * d, hidden), "v.weight": (2 * d, hidden)},
        **{"q.bias": (8 * d,), "k.bias": (2 * d,), "v.bias": (2 * d,)},
    )
    x = torch.randn(3, hidden)
    q_full = F.linear(x, full["q.weight"], full["q.bias"]).view(3, 8, d)
    k_full = F.linear(x, full["k.weight"], full["k.bias"]).view(3, 2, d)
    v_full = F.linear(x, full["v.weight"], full["v.bias"]).view(3, 2, d)
    per_rank_q = []
    for rank in range(world):
        layer, heads = qkv_layer(cfg, rank, world, store, bias=True)
        q, k, v = layer(x).split([heads.num_heads * d, heads.num_kv_heads * d, heads.num_kv_heads * d], -1)
        per_rank_q.append(q)
        kv = kv_per_rank[rank]
        torch.testing.assert_close(k.view(3, -1, d), k_full[:, kv])
        torch.testing.assert_close(v.view(3, -1, d), v_full[:, kv])
        # Every query head of this rank belongs to the group of the KV head it holds.
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        first = heads.first_head
        assert {h // group for h in range(first, first + heads.num_heads)} == set(kv)
    torch.testing.assert_close(torch.cat(per_rank_q, -1).view(3, 8, d), q_full)


def test_fused_gate_up_splits_each_projection_on_its_own(weights):
    cfg = config(intermediate=24)
    store, full = weights(**{"gate.weight": (24, cfg.hidden_size), "up.weight": (24, cfg.hidden_size)})
    x = torch.randn(5, cfg.hidden_size)
    gates, ups = [], []
    for rank in range(3):
        rows = even_rows(24, LocalRank(rank, 3))
        layer = ColumnParallelLinear(cfg.hidden_size, [rows, rows], False, F32, CPU)
        layer.load(store, ["gate", "up"])
        gate, up = layer(x).chunk(2, dim=-1)
        gates.append(gate)
        ups.append(up)
    torch.testing.assert_close(torch.cat(gates, -1), F.linear(x, full["gate.weight"]))
    torch.testing.assert_close(torch.cat(ups, -1), F.linear(x, full["up.weight"]))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_row_parallel_partials_sum_to_the_full_product(weights, world):
    store, full = weights(**{"down.weight": (6, 16), "down.bias": (6,)})
    x = torch.randn(4, 16)
    total = torch.zeros(4, 6)
    for rank in range(world):
        ctx = LocalRank(rank, world)
        layer = RowParallelLinear(16, 6, True, ctx, F32, CPU)
        layer.load(store, "down")
        start, end = ctx.split(16)
        assert layer.weight.shape == (6, end - start)
        total += F.linear(x[:, start:end], layer.weight)  # the partial each rank all-reduces
    expected = F.linear(x, full["down.weight"], full["down.bias"])
    torch.testing.assert_close(total + full["down.bias"], expected)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_vocab_parallel_embedding_partials_sum_to_the_full_lookup(weights, world):
    store, full = weights(**{"embed": (10, 6)})  # 10 rows: uneven for 3 and 4 ranks
    ids = torch.tensor([0, 9, 3, 4, 7, 2, 9, 5])
    total = torch.zeros(len(ids), 6)
    for rank in range(world):
        layer = VocabParallelEmbedding(10, 6, LocalRank(rank, world), F32, CPU)
        layer.load(store, "embed")
        assert layer.weight.shape[0] == -(-10 // world)  # equal padded blocks
        total += layer(ids)
    torch.testing.assert_close(total, F.embedding(ids, full["embed"]))


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("world", [1, 3, 4])
def test_lm_head_blocks_concatenate_to_the_full_logits(weights, world, tied):
    store, full = weights(**{"embed": (10, 6), "head": (10, 6)})
    hidden = torch.randn(3, 6)
    blocks = []
    for rank in range(world):
        ctx = LocalRank(rank, world)
        embedding = VocabParallelEmbedding(10, 6, ctx, F32, CPU)
        embedding.load(store, "embed")
        head = LMHead(10, 6, ctx, F32, CPU, tied_to=embedding if tied else None)
        head.load(store, "head")
        blocks.append(F.linear(hidden, head.tied_to.weight if tied else head.weight))
    gathered = torch.cat(blocks, -1)  # what all_gather builds on every rank
    expected = F.linear(hidden, full["embed" if tied else "head"])
    torch.testing.assert_close(gathered[:, :10], expected)
    assert torch.all(gathered[:, 10:] == 0)  # padding rows contribute nothing


def test_ranks_read_only_their_slices(weights):
    """Summed over ranks, exactly one copy of every split tensor is read (plus replicas)."""
    cfg = config(heads=8, kv_heads=2, head_dim=4, intermediate=24)
    d, hidden = cfg.head_dim, cfg.hidden_size
    store, full = weights(
        **{"q.weight": (8 * d, hidden), "k.weight": (2 * d, hidden), "v.weight": (2 * d, hidden)},
        **{"o.weight": (hidden, 8 * d)},
    )
    full_bytes = store.total_bytes()
    assert full_bytes == sum(t.numel() * 4 for t in full.values())
    kv_bytes = 2 * full["k.weight"].numel() * 4
    for world, kv_copies in [(2, 1), (4, 2)]:
        read, largest = 0, 0
        for rank in range(world):
            with WeightStore(store.model_dir) as rank_store:
                layer, _ = qkv_layer(cfg, rank, world, rank_store)
                out = RowParallelLinear(8 * d, hidden, False, LocalRank(rank, world), F32, CPU)
                out.load(rank_store, "o")
                read += rank_store.bytes_read
                largest = max(largest, rank_store.largest_read)
        assert read == full_bytes + (kv_copies - 1) * kv_bytes
        assert largest == full["q.weight"].numel() * 4 // world  # never a whole tensor


@pytest.mark.parametrize(
    "heads, kv_heads, intermediate, world, named",
    [
        (9, 3, 24, 2, "9 attention heads are not divisible by 2"),
        (8, 4, 24, 8, None),
        (12, 4, 24, 6, "6 is not a multiple of the 4 KV heads"),
        (8, 8, 24, 4, None),
        (8, 2, 30, 4, "intermediate size 30 is not divisible by 4"),
        (9, 3, 24, 3, None),
    ],
)
def test_divisibility_errors_name_the_numbers(heads, kv_heads, intermediate, world, named):
    cfg = config(heads=heads, kv_heads=kv_heads, intermediate=intermediate)
    if named is None:
        check_shardable(cfg, world)
        return
    with pytest.raises(ShardingError, match=f"over {world} shards") as error:
        check_shardable(cfg, world)
    assert named in str(error.value)
