"""The triton step packer against a token-by-token reading of what each section means."""

import random
from types import SimpleNamespace

import pytest

from shard_server.attention.base import StepLayout
from shard_server.attention.triton_packing import TilePlan, aligned, pack_step

SMALL, LARGE = SimpleNamespace(block_q=4), SimpleNamespace(block_q=32)
PLAN = TilePlan(SMALL, LARGE, small_max_tokens=8)


def sections_of(packed):
    """{name or config: the section's values}, the two tile sections of a config as a pair."""
    offset, out, values = 0, {}, packed.host.tolist()
    for name, size in packed.sections:
        if name in ("slots", "starts", "q_lens", "ctx_lens", "tables"):
            out[name] = values[offset : offset + size]
        else:
            firsts_at = offset + aligned(size)
            out[id(name)] = (values[offset : offset + size], values[firsts_at : firsts_at + size])
            offset = firsts_at
        offset += aligned(size)
    assert offset == len(values)
    return out


def random_layout(rng: random.Random, block: int) -> StepLayout:
    q_lens = [rng.choice([1, 1, 5, 8, 9, 40, 100]) for _ in range(rng.randint(1, 7))]
    ctx_lens = [q + rng.choice([0, 1, 15, 16, 300]) for q in q_lens]
    tables = [rng.sample(range(10_000), -(-c // block) + rng.randint(0, 2)) for c in ctx_lens]
    return StepLayout(q_lens, ctx_lens, tables, block)


@pytest.mark.parametrize("seed", range(4))
def test_every_section_says_what_each_token_and_sequence_needs(seed):
    rng = random.Random(seed)
    for _ in range(50):
        block = rng.choice([1, 16])
        layout = random_layout(rng, block)
        real, step_tokens = len(layout.query_lens), layout.num_tokens
        pad_to = real + rng.randint(1, 3)
        tokens = step_tokens + rng.randint(0, 9)
        packed = pack_step(layout, PLAN, pad_to, width=512, only_used_columns=True, tokens=tokens,
                           fixed_tiles=(step_tokens + pad_to, step_tokens + pad_to))  # fmt: skip
        got = sections_of(packed)
        want_slots = []
        for q, ctx, table in zip(layout.query_lens, layout.context_lens, layout.block_tables):
            want_slots += [table[p // block] * block + p % block for p in range(ctx - q, ctx)]
        assert got["slots"] == want_slots + [-1] * (tokens - step_tokens)
        assert got["starts"][:real] == layout.query_starts
        assert got["q_lens"] == layout.query_lens + [0] * (pad_to - real)
        assert got["ctx_lens"] == layout.context_lens + [0] * (pad_to - real)
        columns = max(-(-c // block) for c in layout.context_lens)
        for row in range(pad_to):
            want = layout.block_tables[row][: -(-layout.context_lens[row] // block)] if row < real else []
            assert got["tables"][row * columns : (row + 1) * columns] == want + [0] * (columns - len(want))
        # Each real query row is in exactly one tile, on the config its sequence's length picks.
        covered = []
        for config in (SMALL, LARGE):
            seqs, firsts = got[id(config)]
            assert len(seqs) == step_tokens + pad_to  # the fixed count, padded
            for seq, first in zip(seqs, firsts):
                if seq == pad_to - 1 and seq >= real:
                    assert first == 0  # padding tile on the zero-length row
                    continue
                q = layout.query_lens[seq]
                assert (q <= PLAN.small_max_tokens) == (config is SMALL)
                covered += [(seq, r) for r in range(first, min(q, first + config.block_q))]
        assert sorted(covered) == [(s, r) for s, q in enumerate(layout.query_lens) for r in range(q)]


def test_dense_prompts_leave_the_tiles_and_are_named_with_their_rows():
    layout = StepLayout([3, 200, 1], [3, 200, 50], [[7], list(range(13)), [1, 2, 3, 4]], 16)
    packed = pack_step(layout, PLAN, dense=lambda q, c: [a == b and a >= 100 for a, b in zip(q, c)])
    assert packed.dense_rows == ((3, 200),)
    tiled = [seq for config in (SMALL, LARGE) for seq in sections_of(packed).get(id(config), ([], []))[0]]
    assert sorted(set(tiled)) == [0, 2]


@pytest.mark.parametrize(
    "pad_to, tokens, width, message",
    [
        (2, None, None, "cannot pad 3 sequences to 2"),
        (3, 16, None, "holds at most 2, not 3"),
        (4, 4, None, "does not fit the 4-token bucket"),
        (None, None, 2, "a block table of 4 blocks exceeds the width 2"),
    ],
)
def test_layouts_that_do_not_fit_are_refused(pad_to, tokens, width, message):
    layout = StepLayout([1, 1, 3], [10, 64, 3], [[1], [2, 3, 4, 5], [6]], 16)
    with pytest.raises(ValueError, match=message):
        pack_step(layout, PLAN, pad_to, width, tokens=tokens, fixed_tiles=None if tokens is None else (9, 9))
