"""Programmatic dependent launch of the decoder's kernels (`shard_server/kernels/pdl.py`).

That every such kernel waits first is checked on its sm_90 PTX in test_kernels_compile.py;
here: when launches ask for it, and (on a GPU) that a model gives the same tokens with it.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from shard_server.kernels.pdl import launch_args, programmatic_launch  # noqa: E402

from .test_triton_runner import CUDA, _decode_batch, make_runner, needs_cuda  # noqa: E402

ON_CUDA = SimpleNamespace(is_cuda=True)


def test_launches_ask_for_it_only_when_switched_on_and_on_cuda():
    assert launch_args(ON_CUDA) == {"PDL": False}
    with programmatic_launch(True):
        assert launch_args(ON_CUDA) == {"PDL": True, "launch_pdl": True}
        assert launch_args(torch.zeros(1)) == {"PDL": False}  # the interpreter has no grids to overlap
        with programmatic_launch(False):
            assert launch_args(ON_CUDA) == {"PDL": False}
        assert launch_args(ON_CUDA)["PDL"]
    assert launch_args(ON_CUDA) == {"PDL": False}


def test_small_fp8_decode_graphs_are_captured_with_it_and_the_rest_without(monkeypatch):
    from shard_server import cuda_graphs

    assert cuda_graphs.pdl_up_to("fp8") == cuda_graphs.PDL_UP_TO_BATCH > 0
    assert cuda_graphs.pdl_up_to(None) == 0  # bf16 measured slower with it
    backend = SimpleNamespace(cuda_graphs=True, build_metadata=lambda *args, **kwargs: None)
    graphs = cuda_graphs.DecodeGraphs(None, backend, 16, 64, torch.device("cpu"), pdl_up_to=8)
    captured = {}

    def record(run, pool, device):
        captured[len(captured)] = launch_args(ON_CUDA)["PDL"]
        return None, None

    monkeypatch.setattr(cuda_graphs, "record_graph", record)
    for size in (1, 8, 16):
        graphs.capture_size(size, kv_cache=None)
    assert captured == {0: True, 1: True, 2: False}
    assert launch_args(ON_CUDA) == {"PDL": False}  # switched off again after the capture


def test_weights_prefetch_only_under_programmatic_launch():
    from shard_server.kernels.pdl import prefetches_weights

    with programmatic_launch(False, prefetch_weights=True):
        assert not prefetches_weights(ON_CUDA)
    with programmatic_launch(True, prefetch_weights=True):
        assert prefetches_weights(ON_CUDA) and not prefetches_weights(torch.zeros(1))
    with programmatic_launch(True):
        assert not prefetches_weights(ON_CUDA)


def test_the_switch_is_restored_after_an_error():
    with pytest.raises(RuntimeError), programmatic_launch(True):
        raise RuntimeError("step failed")
    assert launch_args(ON_CUDA) == {"PDL": False}


@needs_cuda
@pytest.mark.parametrize("quantize,kv_dtype", [(None, None), ("fp8", torch.float8_e4m3fn)])
@pytest.mark.parametrize("prefetch", [False, True])
def test_gpu_model_gives_the_same_tokens_with_programmatic_launch(tiny_model_dirs, quantize, kv_dtype, prefetch):
    """Eager steps and graph replays (graphs captured with it on) against the same model without."""
    from shard_server.warmup import PoolSizing, warmup

    assert CUDA
    prompts = [[(7 * i + 3 * b) % 150 for i in range(5 + b % 7)] for b in range(20)]
    results = {}
    for pdl in (False, True):
        for graphs in ((), (4, 32)):
            with programmatic_launch(pdl, prefetch_weights=prefetch):
                runner = make_runner(tiny_model_dirs["llama"], "triton", torch.device("cuda"), dtype=torch.bfloat16,
                                     quantize=quantize, kv_dtype=kv_dtype)  # fmt: skip
                warmup(runner, 256, 32, PoolSizing(1024, 0.05, graphs))
                results[pdl, graphs] = _decode_batch(runner, prompts, new_tokens=6)
    assert results[True, ()] == results[False, ()]
    assert results[True, (4, 32)] == results[False, (4, 32)]
