"""Validates a StepRequest against the sequence table and turns it into a plan.

Nothing is mutated until the whole request has been checked, so a bad step leaves the
shard's state exactly as it was. Order of the protocol: releases, then new sequences, then
the scheduled batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .requests import InvalidStepError, SamplingParams, SequenceRefused, SequenceState, SequenceTable
from .sampling import argmax_suffices


@dataclass
class ScheduledWork:
    state: SequenceState
    new_block_ids: list[int]
    num_tokens: int
    sample: bool
    # Speculative decoding: how many drafts the router reserved room for, and the tokens the
    # drafter proposed after the decode's input, verified in this step (once drafted, they
    # are the last len(drafts) of its num_tokens inputs).
    draft_budget: int = 0
    drafts: list[int] = field(default_factory=list)

    @property
    def start(self) -> int:
        return self.state.computed_len

    @property
    def end(self) -> int:
        return self.state.computed_len + self.num_tokens


@dataclass
class StepPlan:
    released_ids: list[int]
    new_states: list[SequenceState]
    work: list[ScheduledWork]
    # New sequences refused for their own parameters: id -> reason, answered as errors.
    refused: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolLimits:
    num_blocks: int
    block_size: int
    vocab_size: int
    max_positions: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_blocks(block_ids, limits: PoolLimits, seq_id: int) -> None:
    for block in block_ids:
        if block >= limits.num_blocks:
            raise InvalidStepError(
                f"sequence {seq_id}: block id {block} outside the pool of {limits.num_blocks}"
            )


def new_sequence_state(msg, limits: PoolLimits, grammars=None) -> SequenceState:
    """`grammars` (grammar.GrammarEngine) compiles the sequence's grammar when it has one."""
    ids = list(msg.input_ids)
    if not ids:
        raise InvalidStepError(f"sequence {msg.id}: input_ids is empty")
    if not 1 <= msg.prompt_len <= len(ids):
        raise InvalidStepError(f"sequence {msg.id}: prompt_len {msg.prompt_len} not in [1, {len(ids)}]")
    if max(ids) >= limits.vocab_size:
        raise InvalidStepError(f"sequence {msg.id}: token id {max(ids)} >= vocab size {limits.vocab_size}")
    if len(ids) > limits.max_positions:
        raise InvalidStepError(
            f"sequence {msg.id}: {len(ids)} tokens exceed {limits.max_positions} positions"
        )
    if msg.cached_len > len(ids):
        raise InvalidStepError(f"sequence {msg.id}: cached_len {msg.cached_len} > {len(ids)} input ids")
    if len(msg.block_ids) < _ceil_div(msg.cached_len, limits.block_size):
        raise InvalidStepError(
            f"sequence {msg.id}: {len(msg.block_ids)} blocks cannot hold {msg.cached_len} cached tokens"
        )
    _check_blocks(msg.block_ids, limits, msg.id)
    sampling = SamplingParams.from_proto(msg.sampling) if msg.HasField("sampling") else SamplingParams()
    sampling.check_vocab(limits.vocab_size)
    grammar = _compile_grammar(msg, ids, grammars)
    return SequenceState(
        id=msg.id,
        token_ids=ids,
        prompt_len=msg.prompt_len,
        computed_len=msg.cached_len,
        block_table=list(msg.block_ids),
        sampling=sampling,
        prefill_logprobs=msg.prefill_logprobs,
        top_n_tokens=msg.top_n_tokens,
        plain_argmax=argmax_suffices(sampling) and not msg.top_n_tokens,
        grammar=grammar,
    )


def _compile_grammar(msg, ids: list[int], grammars):
    """The sequence's matcher, past the tokens it generated before a preemption; None for free text."""
    if not msg.HasField("grammar"):
        return None
    if grammars is None:
        raise SequenceRefused("grammar: this shard cannot run constrained decoding")
    return grammars.compile(msg.grammar, ids[msg.prompt_len :])


def plan_step(request, table: SequenceTable, limits: PoolLimits, grammars=None) -> StepPlan:
    released = set(request.released_ids)
    new_states: dict[int, SequenceState] = {}
    refused: dict[int, str] = {}
    for msg in request.new_sequences:
        if msg.id in new_states or msg.id in refused or (msg.id in table and msg.id not in released):
            raise InvalidStepError(f"sequence {msg.id} is already registered")
        try:
            new_states[msg.id] = new_sequence_state(msg, limits, grammars)
        except SequenceRefused as exc:
            refused[msg.id] = str(exc)
    # Failed earlier and not released yet: the router planned this step before it heard.
    skipped = refused.keys() | (table.failed - released)

    work: list[ScheduledWork] = []
    seen: set[int] = set()
    for msg in request.sequences:
        if msg.id in seen:
            raise InvalidStepError(f"sequence {msg.id} is scheduled twice")
        seen.add(msg.id)
        if msg.id in skipped:
            continue
        if msg.id in new_states:
            state = new_states[msg.id]
        elif msg.id in released:
            raise InvalidStepError(f"sequence {msg.id} is released and scheduled in the same step")
        else:
            state = table.get(msg.id)
        work.append(_scheduled(msg, state, limits))
    return StepPlan(list(request.released_ids), list(new_states.values()), work, refused)


def _scheduled(msg, state: SequenceState, limits: PoolLimits) -> ScheduledWork:
    item = ScheduledWork(state, list(msg.new_block_ids), msg.num_tokens, msg.sample)
    if item.num_tokens < 1:
        raise InvalidStepError(f"sequence {state.id}: num_tokens must be >= 1")
    if item.end > state.known_len:
        raise InvalidStepError(
            f"sequence {state.id}: computing up to position {item.end} but only "
            f"{state.known_len} tokens are known (computed {state.computed_len})"
        )
    if item.sample and item.end != state.known_len:
        raise InvalidStepError(f"sequence {state.id}: sample requested before the last known token")
    if item.end > limits.max_positions:
        raise InvalidStepError(
            f"sequence {state.id}: position {item.end - 1} exceeds the model's {limits.max_positions}"
        )
    _check_blocks(item.new_block_ids, limits, state.id)
    capacity = (len(state.block_table) + len(item.new_block_ids)) * limits.block_size
    if item.end > capacity:
        raise InvalidStepError(
            f"sequence {state.id}: {item.end} tokens need {_ceil_div(item.end, limits.block_size)} blocks, "
            f"it has {capacity // limits.block_size}"
        )
    if msg.max_draft_tokens:
        _add_drafts(item, msg.max_draft_tokens, capacity, limits)
    return item


def _add_drafts(item: ScheduledWork, k: int, capacity: int, limits: PoolLimits) -> None:
    """Allows up to k drafts after a decode's input, to verify in the same step (the runner's
    drafter proposes them once the step is checked). A sequence whose next token reads its
    history on the host (grammar, penalties, watermark) is not drafted for: its rows would
    depend on each other's tokens."""
    state = item.state
    if item.num_tokens != 1 or not item.sample or state.pending:
        raise InvalidStepError(
            f"sequence {state.id}: drafts need a decode whose input token is on the host"
        )
    if item.end + k > min(capacity, limits.max_positions):
        raise InvalidStepError(f"sequence {state.id}: no KV slot or position for {k} drafts")
    if not state.needs_host_tokens:
        item.draft_budget = k


def apply_plan(plan: StepPlan, table: SequenceTable) -> None:
    for seq_id in plan.released_ids:
        table.release(seq_id)
    for state in plan.new_states:
        table.add(state)
    for seq_id in plan.refused:
        table.fail(seq_id)
    for item in plan.work:
        item.state.block_table.extend(item.new_block_ids)
