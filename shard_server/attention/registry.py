"""Chooses an attention backend by name."""

from __future__ import annotations

import torch

from .base import AttentionBackend, AttentionShape
from .reference import ReferenceAttention


def _reference_backend(shape: AttentionShape, dtype: torch.dtype) -> AttentionBackend:
    return ReferenceAttention(shape)


def _triton_backend(shape: AttentionShape, dtype: torch.dtype) -> AttentionBackend:
    # Imported on demand: Triton is only needed when this backend is asked for.
    from .dense_prefill import DENSE_PREFILL_MIN_TOKENS
    from .triton_paged import TritonPagedAttention

    # Dense SDPA has fast kernels for half precision only; in float32 it would fall back to
    # materialising every score (heads x n x n floats).
    half = dtype in (torch.float16, torch.bfloat16)
    return TritonPagedAttention(shape, DENSE_PREFILL_MIN_TOKENS if half else None)


BACKENDS = {"reference": _reference_backend, "triton": _triton_backend}


def create_backend(name: str, shape: AttentionShape, dtype: torch.dtype) -> AttentionBackend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})") from None
    return factory(shape, dtype)
