"""Every registered model family builds a CausalLM (models/causal_lm.py): what the runner,
warmup and the CUDA-graph code use of a model, and nothing else.

Each model_type of the registry is built from a tiny checkpoint of tests/shard/tiny_models.py;
a model_type with no tiny checkpoint fails `test_every_registered_family_is_covered`.
"""

from __future__ import annotations

import typing

import pytest
import torch
from torch import nn

from shard_server.attention.base import AttentionBackend
from shard_server.models import registry
from shard_server.models.causal_lm import MEMBERS, CausalLM, check_causal_lm, missing_members
from shard_server.models.llama import LlamaForCausalLM

from .helpers import load_model, load_runner
from .tiny_models import DENSE_FAMILIES, FAMILIES, MOE_FAMILIES, make_tiny_dense_model, make_tiny_model, make_tiny_moe_model

# One tiny checkpoint per registered model_type.
CHECKPOINTS = {
    "llama": (make_tiny_model, "llama"),
    "mistral": (make_tiny_model, "mistral_window"),
    "qwen2": (make_tiny_model, "qwen2"),
    "qwen3": (make_tiny_model, "qwen3"),
    "gemma2": (make_tiny_dense_model, "gemma2"),
    "gemma3_text": (make_tiny_dense_model, "gemma3_text"),
    "gemma3": (make_tiny_dense_model, "gemma3"),
    "phi3": (make_tiny_dense_model, "phi3_window"),
    **{family: (make_tiny_moe_model, family) for family in MOE_FAMILIES},
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {}
    for model_type, (make, family) in CHECKPOINTS.items():
        dirs[model_type] = tmp_path_factory.mktemp(model_type)
        make(family, dirs[model_type])
    return dirs


def test_every_registered_family_is_covered():
    assert set(CHECKPOINTS) == set(registry.FAMILIES)
    assert all(family in {**FAMILIES, **DENSE_FAMILIES, **MOE_FAMILIES} for _, family in CHECKPOINTS.values())


def test_members_lists_what_the_protocol_declares():
    assert set(MEMBERS) == set(typing._get_protocol_attrs(CausalLM))


@pytest.mark.parametrize("model_type", sorted(CHECKPOINTS))
def test_each_family_builds_a_causal_lm(model_type, model_dirs):
    model = load_model(model_dirs[model_type])
    cfg = model.config
    assert cfg.model_type == model_type
    assert isinstance(model, CausalLM) and missing_members(model) == []
    assert type(model).forward is not nn.Module.forward  # the family's own forward
    assert isinstance(model.attention_backend, AttentionBackend)
    assert model.compute_dtype == torch.float32
    # The windows the model declares are those its layers' attention computes with.
    assert len(model.layer_windows) == cfg.num_hidden_layers
    assert model.layer_windows == tuple(layer.self_attn.backend.sliding_window for layer in model.layers)
    expected = cfg.layer_windows or (cfg.sliding_window,) * cfg.num_hidden_layers
    assert model.layer_windows == expected


def test_windowed_families_declare_their_windows(model_dirs):
    assert load_model(model_dirs["mistral"]).layer_windows == (8, 8)
    assert load_model(model_dirs["gemma2"]).layer_windows == (8, None, 8)
    assert load_model(model_dirs["llama"]).layer_windows == (None, None)


def test_the_runner_takes_the_backend_and_dtype_from_the_interface(model_dirs):
    runner = load_runner(model_dirs["gemma2"])
    assert runner.backend is runner.model.attention_backend
    assert runner.dtype == torch.float32


def test_a_family_missing_a_member_is_refused_at_build(model_dirs, monkeypatch):
    class NoWindows(LlamaForCausalLM):
        def __init__(self, *args):
            super().__init__(*args)
            del self.layer_windows

    monkeypatch.setitem(registry.FAMILIES, "llama", NoWindows)
    with pytest.raises(TypeError, match="NoWindows is not a CausalLM: it lacks layer_windows"):
        load_model(model_dirs["llama"])


def test_check_causal_lm_names_every_missing_member():
    with pytest.raises(TypeError, match="lacks config, attention_backend, layer_windows, compute_dtype, load"):
        check_causal_lm(nn.Linear(2, 2))
