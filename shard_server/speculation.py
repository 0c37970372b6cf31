"""Speculative decoding on the shard: n-gram drafts, and which of them a verification keeps.

A verification runs a decode's input token and k drafts through one forward, causally, and
chooses a token at every position exactly as a plain decode would there (same processing,
same (seed, position) draw: sampling.py). A draft is kept while it equals the token chosen
before it; the first token that differs ends the run and is kept too. With a deterministic
draft this is rejection sampling for a one-point proposal (accept with probability p(d),
else draw from p without d), and it also makes the text with speculation on the same text,
seeded draw for seeded draw, as with it off.

Drafts come from a drafter: prompt lookup here (the longest recent n-gram equal to the
sequence's last n tokens, NGRAM_MAX down to NGRAM_MIN, predicts that what followed it then
follows now), or a draft model (draft_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .step_plan import ScheduledWork

NGRAM_MAX = 4
NGRAM_MIN = 2  # NgramIndex._extend writes the 4-, 3- and 2-grams ending at a position
# From this many new tokens on (a prompt), the index is extended by zipping shifted slices:
# 3x faster on a 1,000-token prompt than a tuple slice at a time, which cost ~1.1 ms a prompt
# (in a burst of 256, the steps that carried prompt chunks spent 10 ms each drafting, mostly
# indexing the prompts of streams starting to decode: bench/results/speculation_h200_stop50.md,
# "From the step records"); slower than it for a step's few tokens.
BULK_TOKENS = 16


@dataclass
class NgramIndex:
    """The latest position where each n-gram (NGRAM_MIN <= n <= NGRAM_MAX) ended, over a
    sequence's tokens, in one dict: n-grams of different lengths are different keys.

    Extended lazily as the sequence grows, so each token is indexed once. An n-gram is indexed
    only once a token follows it, so a lookup never matches the suffix with itself.
    """

    indexed: int = 0  # tokens[:indexed] have had their following token seen
    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)

    def _extend(self, tokens: list[int]) -> None:
        stop = len(tokens) - 1  # n-grams ending before the last token
        last_end = self.last_end
        if stop - self.indexed < BULK_TOKENS:  # a step's few new tokens
            # The longest n-gram ending at each position, the shorter ones its suffixes.
            for end in range(self.indexed, stop):
                gram = tuple(tokens[max(0, end - NGRAM_MAX + 1) : end + 1])
                if len(gram) == NGRAM_MAX:
                    last_end[gram] = last_end[gram[1:]] = last_end[gram[2:]] = end
                else:  # the first positions
                    last_end.update((gram[cut:], end) for cut in range(len(gram) - NGRAM_MIN + 1))
        else:  # a prompt: the n-grams as tuples zipped from n shifted slices, in C loops
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                first = max(self.indexed, n - 1)
                columns = [tokens[first - n + 1 + i : stop - n + 1 + i] for i in range(n)]
                last_end.update(zip(zip(*columns), range(first, stop)))
        self.indexed = max(self.indexed, stop)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest earlier match of the sequence's suffix."""
        if k <= 0 or len(tokens) < NGRAM_MIN + 1:
            return []
        self._extend(tokens)
        longest = min(NGRAM_MAX, len(tokens) - 1)
        suffix = tuple(tokens[-longest:])
        for cut in range(longest - NGRAM_MIN + 1):
            end = self.last_end.get(suffix[cut:])
            if end is not None:
                return tokens[end + 1 : end + 1 + k]
        return []


class Drafter(Protocol):
    """What the runner asks of a drafter."""

    # KV bytes the drafter keeps per block of the target's pool (0: none). Its own pool, if
    # any, has the same blocks, so a sequence's block table addresses both.
    bytes_per_block: int

    def allocate(self, num_blocks: int) -> None:
        """(Re)allocates the drafter's pool beside a target pool of `num_blocks` blocks."""

    def draft(self, items: list[ScheduledWork]) -> None:
        """Proposes each item's drafts (at most `item.draft_budget`) into `item.drafts`. Items
        are decodes whose tokens are all on the host; the step is checked, its blocks added."""


class PromptLookup:
    """The n-gram drafter: no model and no memory beyond each sequence's index."""

    bytes_per_block = 0  # no KV of its own

    def allocate(self, num_blocks: int) -> None:
        pass

    def draft(self, items: list[ScheduledWork]) -> None:
        for item in items:
            state = item.state
            if state.draft_state is None:
                state.draft_state = NgramIndex()
            item.drafts = state.draft_state.propose(state.token_ids, item.draft_budget)


def kept_tokens(chosen: list[int], drafts: list[int]) -> list[int]:
    """The tokens a verification produces: `chosen[j]` is the token chosen after the input
    and the first j drafts. Each draft equal to the token chosen before it is kept, and the
    first chosen token that differs from its draft (or the one after every draft) ends it."""
    assert len(chosen) == len(drafts) + 1, "one chosen token per verified position"
    kept = 0
    while kept < len(drafts) and chosen[kept] == drafts[kept]:
        kept += 1
    return chosen[: kept + 1]
