"""Every attention backend implements the whole AttentionBackend interface (attention/base.py).

The runner, warmup and the CUDA-graph code call backends only through it, so a backend that
lacks a method, or takes other parameters than the interface declares, must fail here (or at
class creation), not mid-serving.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from shard_server.attention.base import AttentionBackend, AttentionShape, StepLayout
from shard_server.attention.per_layer import LayerAttention, RefillableLayerAttention, layer_backends
from shard_server.attention.reference import ReferenceAttention
from shard_server.attention.registry import BACKENDS, create_backend

SHAPE = AttentionShape(num_heads=4, num_kv_heads=2, head_dim=16, scale=0.25, sliding_window=6)
CPU = torch.device("cpu")
DECLARED = ("build_metadata", "refill", "forward", "prepare_prefill")


def _backend_classes() -> list[type]:
    from shard_server.attention.triton_paged import TritonPagedAttention

    return [ReferenceAttention, TritonPagedAttention, LayerAttention, RefillableLayerAttention]


def test_the_interface_declares_what_the_runner_and_graphs_call():
    assert AttentionBackend.__abstractmethods__ == {"build_metadata", "forward"}
    for name in DECLARED:
        assert callable(getattr(AttentionBackend, name)), name
    assert AttentionBackend.cuda_graphs is False


@pytest.mark.parametrize("cls", _backend_classes(), ids=lambda cls: cls.__name__)
def test_each_backend_implements_the_interface(cls):
    assert issubclass(cls, AttentionBackend) and not inspect.isabstract(cls)
    for name in DECLARED:
        declared = inspect.signature(getattr(AttentionBackend, name)).parameters
        implemented = inspect.signature(getattr(cls, name)).parameters
        missing = [p for p in declared if p not in implemented]
        assert not missing, f"{cls.__name__}.{name} does not take {missing}"
    # A backend that says it runs from CUDA graphs refills metadata itself.
    assert (cls.refill is not AttentionBackend.refill) == cls.cuda_graphs


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_the_registry_builds_backends_of_the_interface(name):
    backend = create_backend(name, SHAPE, torch.float32)
    assert isinstance(backend, AttentionBackend)
    assert backend.name == name and backend.shape == SHAPE and backend.sliding_window == 6


def test_a_backend_missing_a_method_cannot_be_built():
    class NoForward(AttentionBackend):
        name = "incomplete"

        def build_metadata(self, layout, device, pad_to=None, width=None, tokens=None):
            return None

    with pytest.raises(TypeError, match="forward"):
        NoForward(SHAPE)


def test_a_graph_backend_without_refill_is_refused_at_class_creation():
    with pytest.raises(TypeError, match="cuda_graphs but does not define refill"):

        class NoRefill(ReferenceAttention):
            cuda_graphs = True


def test_a_backend_without_graphs_refuses_padded_metadata_and_refill():
    backend = ReferenceAttention(SHAPE)
    layout = StepLayout([1], [3], [[0]], 4)
    with pytest.raises(ValueError, match="no padded"):
        backend.build_metadata(layout, CPU, pad_to=4, width=8)
    with pytest.raises(NotImplementedError, match="cannot run from CUDA graphs"):
        backend.refill(backend.build_metadata(layout, CPU), layout)


@pytest.mark.parametrize("name, view", [("reference", LayerAttention), ("triton", RefillableLayerAttention)])
def test_per_layer_views_carry_each_layers_window(name, view):
    windows = (8, None, 8, None)
    views = layer_backends(name, SHAPE, windows, torch.float32)
    assert [type(v) for v in views] == [view] * 4
    assert tuple(v.sliding_window for v in views) == windows
    assert views[0].cuda_graphs == (name == "triton")
    # Any layer's view builds the metadata of every distinct shape the layers use.
    metadata = views[0].build_metadata(StepLayout([3], [3], [[0]], 4), CPU)
    assert sorted(metadata, key=str) == sorted({v.shape for v in views}, key=str)
