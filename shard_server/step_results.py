"""What a settled step's sampled rows give: tokens into their sequences, then the response.

`take_tokens` runs when the step is settled (runner.py): each sampled token reaches its
sequence on the host, a verification's kept drafts with it, so that the next step can be
planned. `write_outputs` writes the StepResponse from what that left, possibly later: a step
that settled the one before it answers that one once its own work is queued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .requests import SequenceState
from .speculation import kept_tokens

if TYPE_CHECKING:
    from .runner import LaunchedStep


@dataclass
class HostRows:
    """A settled step's sampled rows on the host: ids, logprobs[, top ids, top logprobs]."""

    ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


@dataclass
class Outcome:
    """What settling one work item gave: its first sampled row and the tokens it kept (a
    plain decode's one, or a verification's), or the reason it failed; no row: only prefill
    logprobs to answer."""

    row: int | None = None
    kept: list[int] = field(default_factory=list)
    error: str | None = None


def take_tokens(launched: LaunchedStep, fail: Callable[[SequenceState], None]) -> None:
    """Moves each sampled token to its sequence on the host (a verification's kept ones);
    `fail` drops a sequence whose grammar refused its token."""
    if launched.host:
        launched.host_rows = HostRows(*(t.tolist() for t in launched.host))
    ids = launched.host_rows.ids if launched.host else []
    row_of: dict[int, int] = {}  # each sampling item's first row
    for row, i in enumerate(launched.row_items):
        row_of.setdefault(i, row)
    for i, item in enumerate(launched.work):
        state = item.state
        row = row_of.get(i)
        if row is None:
            if i in launched.prefill:
                launched.outcomes[i] = Outcome()
            continue
        if state.pending and state.pending[0] is launched.sampled[row]:
            state.pending.pop(0)
        error = launched.dead_ends.get(i) or _consume(state, ids[row])
        if error is not None:
            launched.outcomes[i] = Outcome(row, error=error)
            fail(state)
            continue
        kept = kept_tokens(ids[row : row + 1 + len(item.drafts)], item.drafts)
        state.token_ids.extend(kept)
        if item.drafts:  # the KV of kept drafts is the sequence's; the rest is overwritten later
            state.computed_len += len(kept) - 1
            state.verifying = False
        launched.outcomes[i] = Outcome(row, kept)


def write_outputs(launched: LaunchedStep) -> None:
    """Writes each settled item's output: its tokens, or why it failed, and prefill logprobs."""
    response, work, rows = launched.response, launched.work, launched.host_rows
    for i, outcome in launched.outcomes.items():
        item = work[i]
        output = response.outputs.add(id=item.state.id)
        if outcome.error is not None:
            output.error = outcome.error
            continue
        if outcome.row is not None:
            if item.drafts:
                output.drafted = len(item.drafts)
            for k in range(len(outcome.kept)):
                token = output.token if k == 0 else output.next_tokens.add()
                _write_token(token, item.state, outcome.row + k, rows)
        if i in launched.prefill:
            output.prefill_logprobs.extend(launched.prefill[i])


def _write_token(token, state: SequenceState, row: int, rows: HostRows) -> None:
    """Fills one output Token from sampled row `row`, with its top-n alternatives."""
    token.id, token.logprob = rows.ids[row], rows.logprobs[row]
    n = state.top_n_tokens
    if n and rows.top_ids is not None:
        alternatives = list(zip(rows.top_ids[row][:n], rows.top_logprobs[row][:n]))
        if state.grammar is not None:  # fewer allowed tokens than n: no forbidden filler
            alternatives = [(t, lp) for t, lp in alternatives if lp != float("-inf")]
        token.top_ids.extend(t for t, _ in alternatives)
        token.top_logprobs.extend(lp for _, lp in alternatives)


def _consume(state: SequenceState, token: int) -> str | None:
    """Advances a constrained sequence's grammar past its sampled token; the reason it fails."""
    return None if state.grammar is None else state.grammar.consume(token)
