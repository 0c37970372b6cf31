"""Green-list watermarking (Kirchenbauer et al., 2023) and its detector.

The previous token splits the vocabulary: a token is "green" when a 32-bit hash of
(previous token, token) falls below `gamma` of the hash range. Generation adds `delta` to
green logits, so watermarked text holds more green tokens than the `gamma` share chance
gives; the detector counts them and reports a z-score. The split is a pure function of the
two token ids (no RNG state), so it is vectorised over the batch and the vocabulary and
the detector needs nothing but the token ids.
"""

from __future__ import annotations

import math

import torch

_MASK32 = 0xFFFFFFFF
_HASH_MULTIPLIER = 0x45D9F3B  # < 2**27, so products stay inside int64
_PREVIOUS_SALT = 0x5BD1E995
_VOCAB_SALT = 0x27D4EB2F


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * _HASH_MULTIPLIER) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _HASH_MULTIPLIER) & _MASK32
    return x ^ (x >> 16)


def green_mask(previous: torch.Tensor, vocab_size: int, gamma: torch.Tensor) -> torch.Tensor:
    """[N, V] bool: which tokens are green after each row's previous token.

    previous: [N] int64 token ids; gamma: [N] float in (0, 1).
    """
    device = previous.device
    vocab = _mix32(torch.arange(vocab_size, dtype=torch.int64, device=device) ^ _VOCAB_SALT)
    keys = _mix32((previous & _MASK32) ^ _PREVIOUS_SALT)
    bits = _mix32(keys.unsqueeze(1) ^ vocab.unsqueeze(0))
    threshold = (gamma.to(torch.float64) * float(1 << 32)).unsqueeze(1)
    return bits.to(torch.float64) < threshold


def apply_watermark(
    logits: torch.Tensor, previous: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor
) -> torch.Tensor:
    """Adds `delta` to each row's green logits; rows with delta 0 are unchanged."""
    green = green_mask(previous, logits.shape[1], gamma)
    return logits + green.to(logits.dtype) * delta.unsqueeze(1).to(logits.dtype)


def z_score(token_ids: list[int], vocab_size: int, gamma: float) -> float:
    """How far the green count of `token_ids[1:]` lies above chance, in standard deviations.

    `token_ids[0]` only seeds the first split (pass the last prompt token in front of the
    generated ones). Around 4 or more means watermarked.
    """
    if len(token_ids) < 2:
        raise ValueError("need at least one token after the seeding token")
    previous = torch.tensor(token_ids[:-1], dtype=torch.int64)
    scored = torch.tensor(token_ids[1:], dtype=torch.int64)
    green = green_mask(previous, vocab_size, torch.full((len(scored),), gamma))
    hits = int(green.gather(1, scored.unsqueeze(1)).sum())
    count = len(scored)
    return (hits - gamma * count) / math.sqrt(count * gamma * (1 - gamma))
