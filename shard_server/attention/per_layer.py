"""Attention whose shape differs between layers (Gemma's alternating sliding-window and global
layers): one backend per distinct shape, and one view of them per layer.

The runner builds a step's metadata once from any layer's backend; here that builds every
shape's metadata (a dict keyed by shape), and each layer's view reads its own. A backend whose
metadata can be refilled in place (CUDA graphs) gives views that can too.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .base import AttentionBackend, AttentionShape, StepLayout
from .registry import create_backend


class LayerAttention(AttentionBackend):
    """Layer `key`'s view of the shared per-shape backends."""

    def __init__(self, backends: dict[AttentionShape, AttentionBackend], key: AttentionShape):
        super().__init__(key)
        self.backends = backends
        self.key = key
        self.inner = backends[key]
        self.name = self.inner.name

    def build_metadata(self, layout: StepLayout, device: torch.device, pad_to=None, width=None, tokens=None) -> dict:
        return {
            key: backend.build_metadata(layout, device, pad_to=pad_to, width=width, tokens=tokens)
            for key, backend in self.backends.items()
        }

    def forward(self, q, k, v, k_cache, v_cache, metadata: dict, rotary=None) -> torch.Tensor:
        return self.inner.forward(q, k, v, k_cache, v_cache, metadata[self.key], rotary)

    def prepare_prefill(self, max_tokens: int, dtype: torch.dtype, device: torch.device) -> int:
        return sum(backend.prepare_prefill(max_tokens, dtype, device) for backend in self.backends.values())


class RefillableLayerAttention(LayerAttention):
    cuda_graphs = True

    def refill(self, metadata: dict, layout: StepLayout) -> None:
        for key, backend in self.backends.items():
            backend.refill(metadata[key], layout)


def layer_backends(
    name: str, shape: AttentionShape, windows: tuple[int | None, ...], dtype: torch.dtype
) -> list[AttentionBackend]:
    """One backend view per layer: `shape` with layer i's sliding window `windows[i]`."""
    shapes = [replace(shape, sliding_window=window) for window in windows]
    backends = {key: create_backend(name, key, dtype) for key in dict.fromkeys(shapes)}
    view = RefillableLayerAttention if all(b.cuda_graphs for b in backends.values()) else LayerAttention
    return [view(backends, key) for key in shapes]
