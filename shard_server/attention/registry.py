"""Chooses an attention backend by name."""

from __future__ import annotations

from .base import AttentionBackend, AttentionShape
from .reference import ReferenceAttention


def _triton_backend(shape: AttentionShape) -> AttentionBackend:
    # Imported on demand: Triton is only needed when this backend is asked for.
    from .triton_paged import TritonPagedAttention

    return TritonPagedAttention(shape)


BACKENDS = {"reference": ReferenceAttention, "triton": _triton_backend}


def create_backend(name: str, shape: AttentionShape) -> AttentionBackend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})") from None
    return factory(shape)
