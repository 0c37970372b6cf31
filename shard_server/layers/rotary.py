"""Rotary position embedding (non-interleaved halves, as in Hugging Face Llama).

cos/sin are tabulated once for every position up to max_position_embeddings; a step looks
its positions up once and every layer reuses them.

Scaling types, as transformers computes them (modeling_rope_utils): `linear`, `llama3`, `yarn`
(blended frequencies, cos/sin times the attention factor), `dynamic` (NTK: transformers keeps the
base frequencies up to max_position_embeddings, and no position here goes beyond it) and
`longrope` (Phi-3's `su`, cos/sin times the attention factor). transformers (and Phi-3's own
code) picks longrope's factors once per forward by its longest position: a prompt longer than
original_max_position_embeddings is rotated with the long factors at every position, a shorter one
with the short factors, and each later token with the factors of its own position. A sequence's
choice here is fixed by its prompt's length (`rotary_row_offset`) so that its cached KV never
changes: the table holds `max_positions` rows of short factors below the boundary and long ones
from it, then `max_positions` rows of long factors everywhere, which a long prompt's positions
index (position + max_positions). The router keeps such prompts out of the prefix cache, since
their KV is not that of a shorter prompt with the same tokens (InfoResponse.long_rope_prompt_tokens).
transformers' generate() differs only where a short prompt's answer crosses the boundary: it
then recomputes every earlier position with the long factors; no server recomputes a cache.

Partial rotary (`rotary_dim` < head_dim, Phi-4-mini's partial_rotary_factor 0.75): the tables
are rotary_dim wide, built with rotary_dim as the rotation's dimension (as transformers does);
only each head's first rotary_dim dims rotate, in halves of rotary_dim / 2 (transformers' Phi-3
rotate_half over q[..., :rotary_dim]), the rest pass through. On a GPU the in-place rotary kernel
rotates them, then the triton backend stores k/v with its plain store kernel: its fused
rotary + store kernel takes only full rotary.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..kernels.dispatch import use_fused
from ..kernels.rotary import fused_rotary_
from ..models.config import RopeScaling
from .norm import RMSNorm, norm_heads


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        return _llama3_frequencies(inv_freq, scaling)
    if scaling.kind == "yarn":
        return _yarn_frequencies(head_dim, theta, scaling)
    if scaling.kind == "longrope":
        return inv_freq / _longrope_factors(scaling.short_factor, head_dim)
    return inv_freq  # "default", and "dynamic" within max_position_embeddings


def long_rope_prompt_tokens(scaling: RopeScaling) -> int:
    """The prompt length past which LongRoPE rotates every position with its long factors; 0 for
    any other scaling."""
    return scaling.original_max_position_embeddings if scaling.kind == "longrope" else 0


def rotary_row_offset(scaling: RopeScaling, max_positions: int, prompt_len: int) -> int:
    """What a sequence adds to its positions to find its rows of `RotaryEmbedding`'s table:
    max_positions for a prompt longer than `long_rope_prompt_tokens`, else 0."""
    limit = long_rope_prompt_tokens(scaling)
    return max_positions if limit and prompt_len > limit else 0


def long_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """longrope's frequencies from original_max_position_embeddings on."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (_longrope_factors(scaling.long_factor, head_dim) * theta**exponents)


def _longrope_factors(factors: tuple[float, ...], head_dim: int) -> torch.Tensor:
    if len(factors) != head_dim // 2:
        raise ValueError(f"longrope needs {head_dim // 2} factors (head_dim / 2), got {len(factors)}")
    return torch.tensor(factors, dtype=torch.float32)


def _yarn_frequencies(dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    # Interpolate (divide by `factor`) the low frequencies, keep the high ones, ramp between.
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def _llama3_frequencies(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding:
    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: RopeScaling,
        dtype: torch.dtype,
        device: torch.device,
    ):
        """head_dim: the rotation's dimension, the tables' width (rotary_dim under partial rotary)."""
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        if scaling.kind == "longrope":  # [short below the boundary, long from it; long everywhere]
            long_freqs = torch.outer(positions, long_inverse_frequencies(head_dim, theta, scaling))
            is_long = (positions >= scaling.original_max_position_embeddings).unsqueeze(1)
            freqs = torch.cat((torch.where(is_long, long_freqs, freqs), long_freqs))
        table = torch.cat((freqs, freqs), dim=-1)
        cos, sin = table.cos(), table.sin()
        if scaling.attention_factor != 1.0:
            cos, sin = cos * scaling.attention_factor, sin * scaling.attention_factor
        self.cos = cos.to(dtype=dtype, device=device)
        self.sin = sin.to(dtype=dtype, device=device)
        self.max_positions = max_positions
        self.dim = head_dim

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [T, 1, head_dim], broadcastable over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def for_step(self, positions: torch.Tensor) -> RotaryStep:
        return RotaryStep(self, positions)


@dataclass
class RotaryStep:
    """One step's rotation, shared by every layer: in place by the fused kernel, or with
    cos/sin gathered once (on first use) for the torch path."""

    rotary: RotaryEmbedding
    positions: torch.Tensor
    _gathered: tuple[torch.Tensor, torch.Tensor] | None = None
    head_norms: ClassVar[None] = None  # no per-head norms first (`HeadNormedRotation` has them)

    def fusable(self, q: torch.Tensor) -> bool:
        """Whether the triton backend's fused rotary + KV store kernel may rotate this step
        (q: [T, heads, head_dim], as k): full rotary over a power-of-two head_dim."""
        dim = q.shape[-1]
        return use_fused(q) and dim & (dim - 1) == 0 and self.rotary.dim == dim

    def _rotates_in_place(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether the in-place rotary kernel takes q and k: any even rotary width."""
        return use_fused(q) and self.rotary.dim % 2 == 0 and q.stride(2) == 1 and k.stride(2) == 1

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, heads, head_dim], k: [T, kv_heads, head_dim]; may rotate them in place."""
        if self._rotates_in_place(q, k):
            fused_rotary_(q, k, self.positions, self.rotary.cos, self.rotary.sin)
            return q, k
        if self._gathered is None:
            self._gathered = self.rotary.lookup(self.positions)
        cos, sin = self._gathered
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


@dataclass(frozen=True)
class HeadNormedRotation:
    """A layer's per-head q_norm / k_norm (Qwen3, Gemma 3), then the step's rotation. The triton
    backend does both in its rotary + KV store launch (reading `head_norms`); any other path
    through `apply`, one after the other."""

    step: RotaryStep
    head_norms: tuple[RMSNorm, RMSNorm]  # (q_norm, k_norm)

    @property
    def rotary(self) -> RotaryEmbedding:
        return self.step.rotary

    @property
    def positions(self) -> torch.Tensor:
        return self.step.positions

    def fusable(self, q: torch.Tensor) -> bool:
        return self.step.fusable(q)  # the backend packs each row's heads before its fused launch

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.step.apply(*norm_heads(q, k, *self.head_norms))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin [T, 1, width]: the first `width` dims rotate, the rest pass."""
    width = cos.shape[-1]
    if width == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    head = x[..., :width]
    return torch.cat((head * cos + _rotate_half(head) * sin, x[..., width:]), dim=-1)
