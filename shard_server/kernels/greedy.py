"""The greedy token of each logits row and its log-probability, in two small launches.

torch spends a reduction kernel per statistic (argmax, max, sum of exponentials) plus the
elementwise kernels between them, each reading the whole row; one of them runs a single
block per row, ~27 µs for a 128k vocabulary at batch 1. Here the row is cut into chunks
that many programs read once, in the model dtype: each chunk's max, its first argmax and
its sum of exp(x - max), then one program per row merges the chunks. The logprob of the
argmax is max - logsumexp = -log(sum of exp(x - max)).

With a grammar's token mask the chunk pass reads each row's allowed-token bits too and
treats forbidden tokens as -inf: the masked greedy choice and its masked logprob cost no
more than the plain one, where the torch path upcasts, unpacks and masks the whole row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096


@triton.jit
def _chunk_stats_kernel(logits_ptr, row_stride, vocab, max_ptr, arg_ptr, sum_ptr, bits_ptr, bits_stride,
                        slot_ptr, CHUNK: tl.constexpr, CHUNKS_P: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * row_stride + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    if MASKED:
        slot = tl.load(slot_ptr + row).to(tl.int64)  # the row's mask, or -1: unconstrained
        if slot >= 0:
            words = tl.load(bits_ptr + slot * bits_stride + cols // 32, mask=cols < vocab, other=0)
            x = tl.where(((words >> (cols % 32)) & 1) != 0, x, float("-inf"))
    best = tl.max(x, axis=0)
    first = tl.argmax(x, axis=0, tie_break_left=True)
    # A chunk with nothing allowed adds nothing (exp(-inf - -inf) would be NaN).
    total = tl.where(best == float("-inf"), 0.0, tl.sum(tl.exp(x - best), axis=0))
    out = row * CHUNKS_P + chunk
    tl.store(max_ptr + out, best)
    tl.store(arg_ptr + out, chunk * CHUNK + first)
    tl.store(sum_ptr + out, total)


@triton.jit
def _merge_kernel(max_ptr, arg_ptr, sum_ptr, ids_ptr, logprobs_ptr, CHUNKS: tl.constexpr, CHUNKS_P: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, CHUNKS_P)
    ok = chunks < CHUNKS
    best = tl.load(max_ptr + row * CHUNKS_P + chunks, mask=ok, other=float("-inf"))
    total = tl.load(sum_ptr + row * CHUNKS_P + chunks, mask=ok, other=0.0)
    top = tl.max(best, axis=0)
    winner = tl.argmax(best, axis=0, tie_break_left=True)  # the earliest chunk holding the max
    token = tl.load(arg_ptr + row * CHUNKS_P + winner)
    tl.store(ids_ptr + row, token.to(tl.int64))
    tl.store(logprobs_ptr + row, -tl.log(tl.sum(total * tl.exp(best - top), axis=0)))


def fused_greedy(
    logits: torch.Tensor, bits: torch.Tensor | None = None, slots: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax ids [B] int64, log-softmax at the argmax [B] float32) of logits [B, V].

    With a mask: `bits` [n, ceil(V / 32)] int32 (bit j of word w allows id 32 w + j) and
    `slots` [B] int32, the row of `bits` that constrains each logits row or -1. A row must
    allow at least one token (the grammar engine fails a dead end before sampling)."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("fused_greedy needs rows with contiguous columns")
    masked = bits is not None
    if masked and (slots is None or slots.shape != (rows,) or bits.stride(1) != 1):
        raise ValueError("a masked fused_greedy needs contiguous bits and one slot per row")
    chunks = triton.cdiv(vocab, CHUNK)
    chunks_p = triton.next_power_of_2(chunks)
    device = logits.device
    best = torch.empty((rows, chunks_p), dtype=torch.float32, device=device)
    sums = torch.empty_like(best)
    args = torch.empty((rows, chunks_p), dtype=torch.int32, device=device)
    ids = torch.empty(rows, dtype=torch.int64, device=device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=device)
    if rows:
        bits_arg, slots_arg = (bits, slots) if masked else (args, args)  # unread when unmasked
        _chunk_stats_kernel[(rows, chunks)](logits, logits.stride(0), vocab, best, args, sums, bits_arg,
                                            bits_arg.stride(0), slots_arg, CHUNK=CHUNK, CHUNKS_P=chunks_p,
                                            MASKED=masked, num_warps=8)  # fmt: skip
        _merge_kernel[(rows,)](best, args, sums, ids, logprobs, CHUNKS=chunks, CHUNKS_P=chunks_p, num_warps=1)
    return ids, logprobs
