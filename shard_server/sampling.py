"""Token selection, vectorised over the batch.

Order: a grammar's token mask first (constrained rows: forbidden tokens get -inf, so every
later step and the reported logprobs see the masked distribution), then, as in HF/TGI,
repetition penalty (over every token so far), frequency and presence penalties (OpenAI
semantics, over generated tokens), logit bias, the green-list watermark — these apply in
greedy mode too — then, for sampled rows only, temperature, min-p (vLLM's order: before
top-k and top-p), top-k, top-p and typical-p. A
sampled row draws with the Gumbel-max trick from counter-based hash noise keyed by (seed,
position, vocab index), so a seeded draw never depends on the batch it runs in nor on
preemption.

The logprob reported for a token, and its top-n alternatives, come from the processed
distribution it was drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .device_copy import to_device
from .requests import SamplingParams
from .watermark import apply_watermark

_MASK32 = 0xFFFFFFFF
_HASH_MULTIPLIER = 0x45D9F3B  # < 2**27, so products stay inside int64


# -- logits processors (each returns a new tensor; rows with neutral params are unchanged) --
@dataclass(frozen=True)
class TokenMask:
    """Allowed tokens of the constrained rows: `bits` [n, ceil(V / 32)] int32 on the device
    (bit j of word w allows id 32 w + j) for logits rows `rows` [n] (None: every row, in order).
    `slots` [N] int32 is the same map the other way, for the fused greedy kernel: each logits
    row's row of `bits`, -1 when unconstrained."""

    bits: torch.Tensor
    rows: torch.Tensor | None
    slots: torch.Tensor | None = None


def apply_token_mask(logits: torch.Tensor, mask: TokenMask) -> torch.Tensor:
    """Sets to -inf the logits a grammar forbids. Plain torch ops (llguidance's own kernel
    needs torch.compile): the same code on the CPU and on CUDA."""
    bitmask, rows = mask.bits, mask.rows
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(2) >> shifts) & 1).flatten(1)[:, :vocab].bool()
    if rows is None:
        return logits.masked_fill(~allowed, float("-inf"))
    masked = logits.index_select(0, rows).masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, rows, masked)


def apply_repetition_penalty(
    logits: torch.Tensor, token_ids: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """HF/CTRL: divide positive, multiply negative logits of tokens seen so far.

    token_ids: [N, L] padded by repeating a real id of the row (duplicates are harmless).
    """
    seen = logits.gather(1, token_ids)
    penalty = penalty.unsqueeze(1)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits.scatter(1, token_ids, seen)


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, V] occurrence counts; token_ids is [N, L] padded with `vocab_size`."""
    counts = torch.zeros((token_ids.shape[0], vocab_size + 1), dtype=torch.float32, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_frequency_presence(
    logits: torch.Tensor, counts: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor
) -> torch.Tensor:
    return logits - frequency.unsqueeze(1) * counts - presence.unsqueeze(1) * (counts > 0).float()


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Adds each row's biases at once: one scatter over [N, max biases] padded to a spare column."""
    vocab = logits.shape[1]
    width = max(len(p.logit_bias) for p in params)
    ids = [[t for t, _ in p.logit_bias] + [vocab] * (width - len(p.logit_bias)) for p in params]
    values = [[b for _, b in p.logit_bias] + [0.0] * (width - len(p.logit_bias)) for p in params]
    bias = torch.zeros((logits.shape[0], vocab + 1), dtype=logits.dtype, device=logits.device)
    bias.scatter_add_(1, to_device(ids, torch.int64, logits.device), to_device(values, logits.dtype, logits.device))
    return logits + bias[:, :vocab]


def suppress_stops(logits: torch.Tensor, params: list[SamplingParams], generated: list[int]) -> torch.Tensor:
    """-inf at the stop tokens of each row that has not yet generated its min_new_tokens."""
    rows = [i for i, p in enumerate(params) if p.suppresses_stops(generated[i])]
    if not rows:
        return logits
    width = max(len(params[i].stop_token_ids) for i in rows)
    cols = [list(params[i].stop_token_ids) + [params[i].stop_token_ids[0]] * (width - len(params[i].stop_token_ids))
            for i in rows]  # fmt: skip
    index = (to_device([[i] * width for i in rows], torch.int64, logits.device), to_device(cols, torch.int64, logits.device))
    return logits.index_put(index, torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))


MIN_TEMPERATURE = 1e-5  # below this, scaled logits could overflow; it is greedy anyway


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    return logits / temperature.clamp(min=MIN_TEMPERATURE).unsqueeze(1)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """vLLM's min-p: drops tokens less likely than min_p x the top token; min_p 0 keeps all
    (every probability is >= 0), so rows that left it off are unchanged."""
    probs = logits.softmax(dim=1)
    threshold = probs.amax(dim=1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_k: int | None = None) -> torch.Tensor:
    """Keeps tokens scoring at least the k-th best (ties kept); k == 0 disables.

    `max_k`, the largest effective k, comes from the host when the caller knows it: reading
    it off the device would make the host wait for the GPU."""
    vocab = logits.shape[1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    if max_k is None:
        max_k = int(k.max())
    largest = torch.topk(logits, max_k, dim=1).values
    kth = largest.gather(1, (k - 1).unsqueeze(1))
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus: drops the least likely tokens whose total mass is <= 1 - top_p; keeps >= 1."""
    ascending, order = torch.sort(logits, dim=1)
    cumulative = ascending.softmax(dim=1).cumsum(dim=1)
    drop = cumulative <= (1 - top_p).unsqueeze(1)
    drop[:, -1] = False
    drop &= (top_p < 1).unsqueeze(1)
    return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))


def apply_typical_p(logits: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling: keep tokens whose surprise is closest to the entropy."""
    logp = logits.log_softmax(dim=1)
    entropy = -(logp * logp.exp()).nansum(dim=1, keepdim=True)
    distance = (-logp - entropy).abs()
    sorted_distance, order = torch.sort(distance, dim=1)
    cumulative = logits.gather(1, order).softmax(dim=1).cumsum(dim=1)
    last = (cumulative < mass.unsqueeze(1)).sum(dim=1).clamp(max=logits.shape[1] - 1)
    drop = sorted_distance > sorted_distance.gather(1, last.unsqueeze(1))
    drop[:, 0] = False
    drop &= (mass < 1).unsqueeze(1)
    return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))


def argmax_suffices(params: SamplingParams) -> bool:
    """True when the token is the plain argmax of the raw logits: greedy, no processor.

    Compared against the neutral parameters (warpers and the seed do not act on greedy rows),
    so any parameter added later disables this fast path until it is known to be neutral.
    """
    greedy = replace(params, temperature=1.0, top_k=0, top_p=1.0, typical_p=1.0, min_p=0.0, seed=0)
    return greedy == SamplingParams()


# -- seeded noise ----------------------------------------------------------------------
def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _HASH_MULTIPLIER) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _HASH_MULTIPLIER) & _MASK32
    return x ^ (x >> 16)


def row_keys(seeds: list[int], positions: list[int], device: torch.device) -> torch.Tensor:
    """One 32-bit key per row from (64-bit seed, position)."""
    lo, hi, pos = to_device(
        [[s & _MASK32 for s in seeds], [(s >> 32) & _MASK32 for s in seeds], [p & _MASK32 for p in positions]],
        torch.int64,
        device,
    )
    return _mix32(lo ^ _mix32(hi ^ _mix32(pos ^ 0x9E3779B9)))


def gumbel_noise(keys: torch.Tensor, vocab_hashes: torch.Tensor) -> torch.Tensor:
    """[N, V] standard Gumbel noise, a pure function of (row key, vocab index)."""
    bits = _mix32(_mix32(keys.unsqueeze(1) ^ vocab_hashes.unsqueeze(0)))
    return -torch.log(-torch.log(uniform_from_bits(bits)))


_BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Floats in (0, 1) from 32-bit values. The top value, (2**24 - 0.5) / 2**24, rounds to 1.0
    in float32; its noise would be +inf, and +inf on a masked (-inf) token is NaN, which
    argmax picks: a token top-k, top-p or a grammar had ruled out. Clamped below 1."""
    return (((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))).clamp(max=_BELOW_ONE)


# -- the sampler -----------------------------------------------------------------------
# Logits entries (rows x vocab) that one pass of the processors works on. Their temporaries
# (sorts with int64 indices, the int64 hash noise) grow with it: unchunked, warmup's worst case
# (2,048 sampling rows of Qwen's 151,936 tokens) peaked at ~17.7 GiB on an H100, against 5.3
# chunked, and a 61 GB MoE did not start on the 80 GB card (the peak is taken from the KV pool).
# 2**25 entries is 220 rows of that vocabulary, 1,024 of a 32k one.
SAMPLE_CHUNK_ENTRIES = 1 << 25


@dataclass
class SamplingRows:
    """What the sampler needs per row; token lists only when a penalty asks for them."""

    params: list[SamplingParams]
    positions: list[int]  # index in the sequence of the token being drawn
    all_tokens: list[list[int]]
    generated_tokens: list[list[int]]
    top_n: list[int]
    previous_tokens: list[int]  # last token of each row (seeds the watermark's green list)
    token_mask: TokenMask | None = None  # constrained rows' allowed tokens
    generated_counts: list[int] = field(default_factory=list)  # tokens generated before this one

    def slice(self, start: int, stop: int) -> SamplingRows:
        """Rows [start, stop), for logits whose grammar mask is already applied. A list left
        empty (no row needs it) stays empty."""
        lists = ("params", "positions", "all_tokens", "generated_tokens", "top_n", "previous_tokens",
                 "generated_counts")  # fmt: skip
        return replace(self, token_mask=None, **{name: getattr(self, name)[start:stop] for name in lists})


@dataclass
class SampledTokens:
    ids: torch.Tensor  # [N]
    logprobs: torch.Tensor  # [N]
    top_ids: torch.Tensor | None  # [N, max top_n]
    top_logprobs: torch.Tensor | None

    @staticmethod
    def concat(parts: list[SampledTokens]) -> SampledTokens:
        """The chunks' results, in row order (every chunk has the same top-n width)."""
        tops = parts[0].top_ids is not None
        return SampledTokens(
            torch.cat([p.ids for p in parts]),
            torch.cat([p.logprobs for p in parts]),
            torch.cat([p.top_ids for p in parts]) if tops else None,
            torch.cat([p.top_logprobs for p in parts]) if tops else None,
        )


def _pad(rows: list[list[int]], pad_of_row, device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    padded = [r + [pad_of_row(r)] * (width - len(r)) for r in rows]
    return to_device(padded, torch.int64, device)


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self.vocab_hashes = _mix32(torch.arange(vocab_size, dtype=torch.int64, device=device) + 0x632BE5AB)

    def penalize(self, logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
        params, dev = rows.params, self.device
        if any(p.needs_all_tokens for p in params):
            ids = _pad(rows.all_tokens, lambda r: r[0], dev)
            penalty = to_device([p.repetition_penalty for p in params], torch.float32, dev)
            logits = apply_repetition_penalty(logits, ids, penalty)
        if any(p.needs_generated_counts for p in params):
            counts = token_counts(
                _pad(rows.generated_tokens, lambda r: self.vocab_size, dev), self.vocab_size
            )
            frequency = to_device([p.frequency_penalty for p in params], torch.float32, dev)
            presence = to_device([p.presence_penalty for p in params], torch.float32, dev)
            logits = apply_frequency_presence(logits, counts, frequency, presence)
        if any(p.logit_bias for p in params):
            logits = apply_logit_bias(logits, params)
        if any(p.min_new_tokens for p in params):
            logits = suppress_stops(logits, params, rows.generated_counts)
        if any(p.watermark for p in params):
            logits = apply_watermark(
                logits,
                to_device(rows.previous_tokens, torch.int64, dev),
                to_device([p.watermark_gamma if p.watermark else 0.5 for p in params], torch.float32, dev),
                to_device([p.watermark_delta if p.watermark else 0.0 for p in params], torch.float32, dev),
            )
        return logits

    def warp(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        dev = self.device
        logits = apply_temperature(logits, to_device([p.temperature for p in params], torch.float32, dev))
        if any(p.min_p > 0 for p in params):
            logits = apply_min_p(logits, to_device([p.min_p for p in params], torch.float32, dev))
        if any(p.top_k > 0 for p in params):
            vocab = logits.shape[1]
            max_k = max(min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params)
            logits = apply_top_k(logits, to_device([p.top_k for p in params], torch.int64, dev), max_k)
        if any(p.top_p < 1 for p in params):
            logits = apply_top_p(logits, to_device([p.top_p for p in params], torch.float32, dev))
        if any(p.typical_p < 1 for p in params):
            logits = apply_typical_p(logits, to_device([p.typical_p for p in params], torch.float32, dev))
        return logits

    def __call__(self, logits: torch.Tensor, rows: SamplingRows) -> SampledTokens:
        """logits: [N, V], one row per sequence that samples this step; float32 from here on.
        Rows go through the processors a chunk at a time (`SAMPLE_CHUNK_ENTRIES`)."""
        if rows.token_mask is not None:
            logits = apply_token_mask(logits, rows.token_mask)
        top_n = min(max(rows.top_n, default=0), logits.shape[1])
        chunk = max(1, SAMPLE_CHUNK_ENTRIES // max(1, logits.shape[1]))
        if logits.shape[0] <= chunk:
            return self._sample(logits.float(), rows, top_n)
        parts = [self._sample(logits[start : start + chunk].float(), rows.slice(start, start + chunk), top_n)
                 for start in range(0, logits.shape[0], chunk)]  # fmt: skip
        return SampledTokens.concat(parts)

    def _sample(self, logits: torch.Tensor, rows: SamplingRows, top_n: int) -> SampledTokens:
        logits = self.penalize(logits, rows)
        sample_rows = [i for i, p in enumerate(rows.params) if p.do_sample]
        if not sample_rows:
            logprobs = logits.log_softmax(dim=1)
            ids = logits.argmax(dim=1)
        else:
            logprobs, ids = self._draw(logits, rows, sample_rows)
        chosen = logprobs.gather(1, ids.unsqueeze(1)).squeeze(1)
        top_ids = top_logprobs = None
        if top_n > 0:
            top_logprobs, top_ids = torch.topk(logprobs, top_n, dim=1)
        return SampledTokens(ids, chosen, top_ids, top_logprobs)

    def _draw(self, logits, rows: SamplingRows, sample_rows: list[int]):
        everyone = len(sample_rows) == len(rows.params)
        index = None if everyone else to_device(sample_rows, torch.long, self.device)
        subset = logits if everyone else logits.index_select(0, index)
        params = [rows.params[i] for i in sample_rows]
        warped_logprobs = self.warp(subset, params).log_softmax(dim=1)
        keys = row_keys([p.seed for p in params], [rows.positions[i] for i in sample_rows], self.device)
        drawn = (warped_logprobs + gumbel_noise(keys, self.vocab_hashes[: logits.shape[1]])).argmax(dim=1)
        if everyone:
            return warped_logprobs, drawn
        logprobs = logits.log_softmax(dim=1).index_copy(0, index, warped_logprobs)
        ids = logits.argmax(dim=1).index_copy(0, index, drawn)
        return logprobs, ids
