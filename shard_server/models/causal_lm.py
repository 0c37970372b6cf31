"""The interface between a model family and the rest of the shard.

`registry.build_model` returns a `CausalLM`; the runner, warmup and the CUDA-graph code use
a model only through the members declared here. A new family is one file whose model class
has them, plus its line in the registry's FAMILIES.

A Protocol rather than an ABC: families are torch modules with their own hierarchies (Gemma's
shares no base class with Llama's), and the runner's tests drive it with stand-in models; a
Protocol states the contract without forcing a common base on either. `runtime_checkable`
lets the registry check a built model's members (`check_causal_lm`), so a family that lacks
one fails at load, naming it, not at its first step.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..attention.base import AttentionBackend
from ..kv_cache import KVCache
from ..weights import WeightStore
from .config import ModelConfig


@runtime_checkable
class CausalLM(Protocol):
    config: ModelConfig

    @property
    def attention_backend(self) -> AttentionBackend:
        """The backend whose `build_metadata` (and `refill`) makes a step's metadata for every
        layer; a model with per-layer views hands out one whose metadata covers all of them."""

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window in tokens (None: the layer attends to all positions)."""

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype activations are computed in (the KV pool and linear weights may be narrower)."""

    def load(self, store: WeightStore) -> None:
        """Reads this rank's weights from the checkpoint."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, metadata) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] of the step's T tokens; writes their KV."""

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, metadata) -> torch.Tensor:
        """What the runner calls: torch's Module.__call__, which runs `forward`."""

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """Logits [rows, vocab] of final-norm hidden rows (float32, or the model dtype: graphs)."""


# What isinstance(model, CausalLM) checks, listed for error messages.
MEMBERS = ("config", "attention_backend", "layer_windows", "compute_dtype", "load", "forward", "__call__",
           "compute_logits")


def missing_members(model: object) -> list[str]:
    return [name for name in MEMBERS if not hasattr(model, name)]


def check_causal_lm(model: object) -> CausalLM:
    """`model`, once it has every member of CausalLM; else a TypeError naming those it lacks."""
    if not isinstance(model, CausalLM):
        raise TypeError(f"{type(model).__name__} is not a CausalLM: it lacks {', '.join(missing_members(model))}")
    return model
