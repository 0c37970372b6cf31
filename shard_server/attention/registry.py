"""Chooses an attention backend by name."""

from __future__ import annotations

from .base import AttentionBackend, AttentionShape
from .reference import ReferenceAttention

BACKENDS = {"reference": ReferenceAttention}


def create_backend(name: str, shape: AttentionShape) -> AttentionBackend:
    try:
        return BACKENDS[name](shape)
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})") from None
