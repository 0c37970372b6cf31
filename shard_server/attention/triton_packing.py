"""The host side of a triton step: its metadata packed into one int32 buffer.

Sections, each from a 16-byte boundary: the slot of every token row, each sequence's query
start, query length and context length, per tile config the sequence and first query offset
of each tile, and last the block tables. Every section but the tables is built from Python
lists: they hold a batch's sequences or tiles, and numpy's per-call cost (~1.5 us on the CPU
of a small machine, ~200 calls a step) made a batch-1 verification's refill 290 us of host
time that the GPU waits for (the step after a verification cannot be planned before it ends,
issue 26). Slots are written a block-run at a time, so a long prompt chunk costs a call per
block, not per token.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .base import StepLayout

# One section's name, or the tile config (any hashable) whose two sections (sequences, firsts)
# follow; with its length.
Section = tuple[object, int]


@dataclass(frozen=True)
class TilePlan:
    """A step's two tile configs (anything with a `block_q`: query rows per tile)."""

    small: object
    large: object
    small_max_tokens: int  # a sequence of up to this many query tokens runs on small tiles


@dataclass
class PackedStep:
    host: np.ndarray  # int32, every section
    sections: list[Section]
    width: int  # block-table columns the metadata's views take
    dense_rows: tuple[tuple[int, int], ...]  # (first row, length) of each dense-path prompt


def aligned(count: int) -> int:
    """`count` int32s rounded up to 16 bytes. Every section of the packed buffer starts 16-byte
    aligned: Triton specialises a kernel on each pointer's 16-byte alignment, so sections at
    offsets that follow the batch size would compile new variants mid-serving (~1 s each)."""
    return -(-count // 4) * 4


def pack_step(
    layout: StepLayout,
    tiles: TilePlan,
    pad_to: int | None = None,
    width: int | None = None,
    only_used_columns: bool = False,
    tokens: int | None = None,
    fixed_tiles: tuple[int, int] | None = None,
    dense: Callable[[list[int], list[int]], list[bool]] | None = None,
) -> PackedStep:
    """Packs a step's metadata. `pad_to`: sequences padded to this count (a graph's shape);
    `tokens`: a mixed graph's token bucket (rows padded to it, `fixed_tiles` tile counts);
    `width`: the table columns (default: as many as the step reads; only those are written
    with `only_used_columns`). `dense(query_lens, context_lens)`: which sequences of an
    unpadded step take the dense prefill path instead of a tile."""
    bs = layout.block_size
    q_lens, ctx_lens, block_tables = list(layout.query_lens), list(layout.context_lens), layout.block_tables
    real = len(q_lens)
    batch = real if pad_to is None else pad_to
    if batch < real:
        raise ValueError(f"cannot pad {real} sequences to {pad_to}")
    step_tokens = sum(q_lens)
    if tokens is not None:
        # The padding tiles need a zero-length sequence to point at.
        if real >= batch:
            raise ValueError(f"a mixed graph of {batch} sequence rows holds at most {batch - 1}, not {real}")
        if step_tokens > tokens:
            raise ValueError(f"a step of {step_tokens} tokens does not fit the {tokens}-token bucket")
    used = [-(-c // bs) for c in ctx_lens]
    needed = max(used, default=1)
    width = max(1, needed) if width is None else width
    if needed > width:
        raise ValueError(f"a block table of {needed} blocks exceeds the width {width}")
    extra = batch - real
    # Padding sequences: one query token each (decode graphs), or none (mixed: rows past the
    # real ones belong to no sequence); no context.
    pad_q = 1 if tokens is None else 0
    starts = list(itertools.accumulate(q_lens, initial=0))[:real]
    starts += range(step_tokens, step_tokens + extra) if tokens is None else [0] * extra
    rows = step_tokens + extra if tokens is None else tokens
    slots = _slots(q_lens, ctx_lens, block_tables, bs)
    slots += [-1] * (rows - step_tokens)
    q_padded = q_lens + [pad_q] * extra
    parts: list[Sequence[int]] = [slots, starts, q_padded, ctx_lens + [0] * extra]
    sections: list[Section] = [(n, len(p)) for n, p in zip(("slots", "starts", "q_lens", "ctx_lens"), parts)]
    is_dense = dense(q_lens, ctx_lens) if dense is not None and pad_to is None else [False] * real
    paged = [not d for d in is_dense] + [True] * extra
    for config, seqs, firsts in _tiles(q_padded, paged, tiles, fixed_tiles):
        sections.append((config, len(seqs)))
        parts += [seqs, firsts]
    columns = max(1, needed) if only_used_columns else width
    sections.append(("tables", batch * columns))
    head: list[int] = []
    for part in parts:
        head += part
        head += [0] * (-len(part) % 4)
    # The real sequences' rows, each zero-filled past its own blocks; the padding rows stay zero.
    filled: list[int] = []
    zeros = [0] * columns
    for table, count in zip(block_tables, used):
        filled += table[:count]
        filled += zeros[count:]
    host = np.zeros(len(head) + aligned(batch * columns), dtype=np.int32)
    host[: len(head)] = head
    host[len(head) : len(head) + len(filled)] = filled
    dense_rows = tuple((starts[i], q_lens[i]) for i in range(real) if is_dense[i])
    return PackedStep(host, sections, width, dense_rows)


def _slots(q_lens: list[int], ctx_lens: list[int], block_tables, bs: int) -> list[int]:
    """The KV slot of each real token row: its sequence's block for its position, written a
    run within one block at a time."""
    slots: list[int] = []
    for q, ctx, table in zip(q_lens, ctx_lens, block_tables):
        position = ctx - q
        while position < ctx:
            block, offset = divmod(position, bs)
            run = min(ctx - position, bs - offset)
            first = table[block] * bs + offset
            slots += range(first, first + run)
            position += run
    return slots


def _tiles(q_lens: list[int], paged: list[bool], plan: TilePlan, fixed: tuple[int, int] | None):
    """Per tile config: (config, sequence of each tile, first query offset of each tile) over
    the `paged` sequences. With `fixed` (small, large) counts, both launches come padded to
    exactly those, the padding tiles on the last (zero-length) sequence, so that a graph's
    grids never change; a fixed count of 0 is no launch."""
    launches = []
    for index, config in enumerate((plan.small, plan.large)):
        on_small, block_q = index == 0, config.block_q
        chosen = [s for s, (q, p) in enumerate(zip(q_lens, paged)) if p and (q <= plan.small_max_tokens) == on_small]
        if not chosen and fixed is None:
            continue
        seqs: list[int] = []
        firsts: list[int] = []
        for s in chosen:  # ceil(q / block_q) tiles; none for a zero-length sequence
            starts = range(0, q_lens[s], block_q)
            seqs += [s] * len(starts)
            firsts += starts
        if fixed is not None:
            if len(seqs) > fixed[index]:
                raise ValueError(f"{len(seqs)} tiles exceed the fixed {fixed[index]}")  # a bound's bug
            if not fixed[index]:  # no launch
                continue
            padding = fixed[index] - len(seqs)
            seqs += [len(q_lens) - 1] * padding
            firsts += [0] * padding
        launches.append((config, seqs, firsts))
    return launches
