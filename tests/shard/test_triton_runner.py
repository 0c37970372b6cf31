"""The triton backend inside the model, and decode steps replayed from CUDA graphs.

On CPU the tiny models run the triton kernels through Triton's interpreter and must give
the reference backend's greedy tokens. Graph capture needs CUDA: those cases compare graph
replay against eager steps on the same GPU.
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from shard_server.cuda_graphs import DEFAULT_SIZES, parse_sizes  # noqa: E402
from shard_server.distributed import ParallelContext  # noqa: E402
from shard_server.kv_cache import KVSpec  # noqa: E402
from shard_server.models.config import ModelConfig  # noqa: E402
from shard_server.models.registry import build_model  # noqa: E402
from shard_server.runner import ModelRunner  # noqa: E402
from shard_server.warmup import PoolSizing, warmup  # noqa: E402
from shard_server.weights import WeightStore, read_config  # noqa: E402

from .helpers import StepDriver, generate_greedy  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")


def make_runner(directory, attention, device, dtype=torch.float32, num_blocks=256, block_size=4, kv_dtype=None,
                quantize=None):  # fmt: skip
    config = replace(ModelConfig.from_dict(read_config(directory)), quantize=quantize)
    with WeightStore(directory) as store:
        model = build_model(config, store, ParallelContext(), attention, dtype, device)
    spec = KVSpec(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, block_size, kv_dtype or dtype)
    runner = ModelRunner(model, spec, device)
    runner.allocate_kv_cache(num_blocks)
    return runner


def test_parse_cuda_graph_sizes():
    assert parse_sizes("4,1,2,2") == (1, 2, 4)
    assert parse_sizes("0") == ()
    assert parse_sizes(",".join(map(str, DEFAULT_SIZES))) == DEFAULT_SIZES
    for bad in ("", "a,b", "0,4", "-1"):
        with pytest.raises(ValueError):
            parse_sizes(bad)


def test_the_launcher_and_readme_name_the_shards_graph_sizes():
    """The shard owns the default; the launcher's --help and the README describe it."""
    from launcher.options import OPTIONS_BY_DEST

    described = OPTIONS_BY_DEST["cuda_graphs"].child_default
    assert parse_sizes(described) == DEFAULT_SIZES
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"| `--cuda-graphs` | 1,2,4,...,{DEFAULT_SIZES[-1]} |" in readme


def test_the_launcher_and_readme_name_the_shards_mixed_graph_tokens():
    from launcher.options import OPTIONS_BY_DEST
    from shard_server.cli import parse_config
    from shard_server.mixed_graphs import MIXED_TOKEN_BUCKETS

    assert parse_sizes(OPTIONS_BY_DEST["cuda_graph_tokens"].child_default) == MIXED_TOKEN_BUCKETS
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"| `--cuda-graph-tokens` | 8,16,32,64,128,...,{MIXED_TOKEN_BUCKETS[-1]} |" in readme
    base = ["serve", "--model-path", ".", "--uds-path", "/tmp/x"]
    assert parse_sizes(parse_config(base).cuda_graph_tokens) == MIXED_TOKEN_BUCKETS
    assert parse_sizes(parse_config([*base, "--cuda-graph-tokens", "0"]).cuda_graph_tokens) == ()
    with pytest.raises(SystemExit):
        parse_config([*base, "--cuda-graph-tokens", "64,x"])


@pytest.mark.parametrize("family", ["llama", "mistral_window", "qwen3"])
def test_triton_model_gives_the_reference_greedy_tokens(tiny_model_dirs, family):
    device = torch.device("cuda" if CUDA else "cpu")  # interpreted kernels on CPU
    prompt = [(7 * i + 3) % 150 for i in range(21)]
    tokens = {}
    for attention in ("reference", "triton"):
        driver = StepDriver(make_runner(tiny_model_dirs[family], attention, device))
        tokens[attention] = generate_greedy(driver, 1, prompt, new_tokens=6, chunk=8)
    assert tokens["triton"] == tokens["reference"]


def _decode_batch(runner, prompts, new_tokens):
    """Prefills every prompt in one step, then decodes them together; returns their tokens."""
    from shard_server.pb import generate_pb2 as pb

    driver = StepDriver(runner)
    new = [pb.NewSequence(id=i, input_ids=p, prompt_len=len(p)) for i, p in enumerate(prompts)]
    sched = [
        pb.ScheduledSequence(id=i, num_tokens=len(p), new_block_ids=driver.blocks_for(i, len(p)), sample=True)
        for i, p in enumerate(prompts)
    ]
    outputs = {i: [] for i in range(len(prompts))}
    response = driver.step(new=new, scheduled=sched)
    for _ in range(new_tokens):
        for out in response.outputs:
            outputs[out.id].append(out.token.id)
        sched = [
            pb.ScheduledSequence(
                id=i, num_tokens=1, new_block_ids=driver.blocks_for(i, len(p) + len(outputs[i])), sample=True
            )
            for i, p in enumerate(prompts)
        ]
        response = driver.step(scheduled=sched)
    return outputs


def test_warmup_prepares_the_dense_prefill_shapes_for_the_step_budget(tiny_model_dirs, monkeypatch):
    device = torch.device("cuda" if CUDA else "cpu")
    runner = make_runner(tiny_model_dirs["llama"], "triton", device)
    calls = []
    monkeypatch.setattr(runner.backend, "prepare_prefill", lambda *args: calls.append(args) or 0)
    warmup(runner, 64, 8, PoolSizing(1024, 0.05, ()))
    assert calls == [(64, torch.float32, device)]


def test_an_fp8_pool_prepares_the_dense_shapes_in_the_model_dtype(tiny_model_dirs, monkeypatch):
    """The dense path runs on the queries' dtype; the pool's fp8 has no SDPA (run 14 failed so)."""
    device = torch.device("cuda" if CUDA else "cpu")
    runner = make_runner(tiny_model_dirs["llama"], "triton", device, kv_dtype=torch.float8_e4m3fn)
    calls = []
    monkeypatch.setattr(runner.backend, "prepare_prefill", lambda *args: calls.append(args) or 0)
    warmup(runner, 64, 8, PoolSizing(1024, 0.05, ()))
    assert calls == [(64, torch.float32, device)] and runner.dtype == torch.float32


@needs_cuda
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_graph_replay_equals_eager_decode(tiny_model_dirs, batch):
    device = torch.device("cuda")
    prompts = [[(5 * i + 11 * b) % 150 for i in range(9 + 4 * b)] for b in range(batch)]
    results = {}
    for graphs in ((), (1, 2, 4, 8)):
        runner = make_runner(tiny_model_dirs["llama"], "triton", device)
        warmup(runner, 64, 8, PoolSizing(1024, 0.05, graphs))
        assert (runner.graphs is not None) == bool(graphs)
        results[graphs] = _decode_batch(runner, prompts, new_tokens=12)
    assert results[(1, 2, 4, 8)] == results[()]


def test_warmup_freezes_the_objects_alive_after_it(tiny_model_dirs):
    import gc

    runner = make_runner(tiny_model_dirs["llama"], "reference", torch.device("cpu"))
    gc.unfreeze()
    try:
        warmup(runner, 64, 8, PoolSizing(1024, 0.05, ()))
        assert gc.get_freeze_count() > 1000  # the model's modules and parameters among them
    finally:
        gc.unfreeze()


def test_a_process_that_warmed_up_exits_without_binding_leak_reports(tiny_model_dirs):
    """Frozen objects escape the interpreter's last collection unless unfrozen at exit; then
    Triton's nanobind bindings print leak reports, which break the JSON log lines."""
    import subprocess
    import sys

    script = f"""
import torch
from shard_server.attention import triton_kernels  # noqa: F401
from shard_server.warmup import PoolSizing, warmup
from tests.shard.test_triton_runner import make_runner
runner = make_runner({str(tiny_model_dirs["llama"])!r}, "reference", torch.device("cpu"))
warmup(runner, 64, 8, PoolSizing(1024, 0.05, ()))
print("warmed up")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warmed up" in done.stdout
    assert "leaked" not in done.stderr, done.stderr[-2000:]


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@needs_cuda
@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
def test_on_an_fp8_pool_triton_gives_the_reference_greedy_tokens_eager_and_from_graphs(tiny_model_dirs, kv_dtype):
    device = torch.device("cuda")
    prompts = [[(5 * i + 11 * b) % 150 for i in range(9 + 4 * b)] for b in range(3)]
    results = {}
    for attention, graphs in (("reference", ()), ("triton", ()), ("triton", (1, 2, 4))):
        runner = make_runner(tiny_model_dirs["llama"], attention, device, kv_dtype=kv_dtype)
        warmup(runner, 64, 4, PoolSizing(1024, 0.05, graphs))
        assert runner.kv_cache.data.dtype == kv_dtype
        results[attention, graphs] = _decode_batch(runner, prompts, new_tokens=10)
    assert results["triton", ()] == results["reference", ()]
    assert results["triton", (1, 2, 4)] == results["triton", ()]


@needs_cuda
def test_warmup_fits_twice_the_blocks_in_fp8_as_in_bf16(tiny_model_dirs):
    device = torch.device("cuda")
    blocks = {}
    for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        runner = make_runner(tiny_model_dirs["llama"], "triton", device, dtype=torch.bfloat16, kv_dtype=kv_dtype)
        warmup(runner, 64, 4, PoolSizing(1024, 0.05, ()))
        blocks[kv_dtype] = runner.kv_cache.num_blocks
        del runner
        torch.cuda.empty_cache()
    assert 1.9 <= blocks[torch.float8_e4m3fn] / blocks[torch.bfloat16] <= 2.1
