"""Tensor-parallel slicing: two gloo ranks on CPU give the logits of one unsplit model."""

import multiprocessing
import socket

import pytest
import torch

from shard_server.attention.base import StepLayout
from shard_server.distributed import ParallelContext, init_parallel
from shard_server.kv_cache import KVCache, KVSpec
from shard_server.models.config import ModelConfig
from shard_server.models.registry import build_model
from shard_server.weights import WeightStore, read_config

CPU = torch.device("cpu")
TOKENS = 21


def prefill_logits(directory, parallel) -> torch.Tensor:
    config = ModelConfig.from_dict(read_config(directory))
    with WeightStore(directory) as store:
        model = build_model(config, store, parallel, "reference", torch.float32, CPU)
    kv_heads = config.num_key_value_heads // parallel.world_size
    cache = KVCache(KVSpec(config.num_hidden_layers, kv_heads, config.head_dim, 4, torch.float32), 8, CPU)
    layout = StepLayout([TOKENS], [TOKENS], [[5, 2, 7, 0, 3, 1]], 4)
    metadata = model.layers[0].self_attn.backend.build_metadata(layout, CPU)
    ids = torch.arange(TOKENS) * 7 % config.vocab_size
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(TOKENS), cache, metadata))


def _rank_main(rank: int, world: int, directory, port: int, results) -> None:
    torch.set_num_threads(1)
    parallel = init_parallel(rank, world, "127.0.0.1", port, CPU)
    try:
        results.put((rank, prefill_logits(directory, parallel)))
    finally:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_two_ranks_match_one(family, tiny_model_dirs):
    directory = tiny_model_dirs[family]
    expected = prefill_logits(directory, ParallelContext())
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank_main, args=(r, 2, directory, port, results)) for r in range(2)]
    for process in ranks:
        process.start()
    outputs = dict(results.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(timeout=30)
        assert process.exitcode == 0
    for rank in range(2):
        torch.testing.assert_close(outputs[rank], expected, atol=1e-4, rtol=1e-4)
