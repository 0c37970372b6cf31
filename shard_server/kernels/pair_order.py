"""The order of a packed word's values, as `layers/int4.py`'s `PackedWeight` keeps them.

A GPTQ checkpoint packs 32/bits consecutive input rows into each int32 word, row i in bits
[i*bits, (i+1)*bits). 8-bit words stay so. 4-bit words are reordered at load into pair order:
rows 2j and 2j+1 of a word's eight in bits 4j and 16+4j. One shift and one logic op then lay
two rows side by side in the two 16-bit halves of a register, which is what the W4A16 kernels'
half2 arithmetic takes (`w4a16.py`). Every reader of the words (the kernels, the reference
dequantization) finds row r in value `slot_of_row(r, bits)` of its word.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def slot_of_row(row: int, bits: int) -> int:
    """Which value of its word (bits [slot*bits, (slot+1)*bits)) holds row `row` of the word's rows:
    4-bit words in pair order, 8-bit ones in GPTQ's."""
    return (row % 2) * 4 + row // 2 if bits == 4 else row


@triton.jit
def _slot_of_row(row, BITS: tl.constexpr):
    """`slot_of_row` in a kernel (row: int32 scalar or tensor of rows within a word)."""
    if BITS == 4:
        return (row % 2) * 4 + row // 2
    return row


def _reorder(words: torch.Tensor, bits: int, slot_from, slot_to) -> torch.Tensor:
    """Each word's values moved from value slot_from(row) to slot_to(row), in int64 (no shift
    into the sign bit), back to int32."""
    mask, out = (1 << bits) - 1, torch.zeros(words.shape, dtype=torch.int64, device=words.device)
    wide = words.to(torch.int64) & 0xFFFFFFFF
    for row in range(32 // bits):
        out |= ((wide >> (slot_from(row) * bits)) & mask) << (slot_to(row) * bits)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def to_pair_order(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Words in GPTQ's order (row i in value i) -> the order `PackedWeight` keeps (`slot_of_row`)."""
    return words if bits != 4 else _reorder(words, bits, lambda row: row, lambda row: slot_of_row(row, bits))


def to_gptq_order(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of `to_pair_order`."""
    return words if bits != 4 else _reorder(words, bits, lambda row: slot_of_row(row, bits), lambda row: row)


@triton.jit
def _row_of_slot(slot, BITS: tl.constexpr):
    """Which of its word's rows value `slot` holds: the inverse of `_slot_of_row`."""
    if BITS == 4:
        return (slot % 4) * 2 + slot // 4
    return slot
