"""The shard's per-sequence state table.

The router describes a sequence once (NewSequence); afterwards the shard tracks where it is:
all token ids so far (prompt, then generated), how many have KV computed, its block table
and its sampling parameters. The shard appends its own sampled tokens, so a decode step only
says "compute 1 token".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .sampling_rules import RULES, field_value


class InvalidStepError(ValueError):
    """A step asked for something impossible; reported to the router as INVALID_ARGUMENT."""


class SequenceRefused(InvalidStepError):
    """One sequence's own parameters are unusable. Only that sequence fails (its output
    carries the reason); the rest of the step runs. The reason names only that sequence's
    offending field, never another request's values."""


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling parameters.

    Each sampling field obeys its one rule (`sampling_rules.py`, the router's too); the
    multiplicative ones are proto3 `optional`, so unset (1.0) and a refused 0 differ.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    watermark: bool = False
    watermark_gamma: float = 0.0
    watermark_delta: float = 0.0
    min_new_tokens: int = 0  # stop_token_ids are suppressed until this many tokens exist
    stop_token_ids: tuple[int, ...] = ()
    min_p: float = 0.0  # 0: off (proto3's unset)

    @classmethod
    def from_proto(cls, msg) -> SamplingParams:
        ruled = {}
        for name in RULES:
            value, refusal = field_value(msg, name)
            if refusal is not None:
                raise SequenceRefused(refusal)
            ruled[name] = int(value) if name == "top_k" else float(value)
        params = cls(
            do_sample=bool(msg.do_sample),
            **ruled,
            seed=int(msg.seed),
            logit_bias=tuple((int(b.token_id), float(b.bias)) for b in msg.logit_bias),
            watermark=bool(msg.watermark),
            watermark_gamma=float(msg.watermark_gamma),
            watermark_delta=float(msg.watermark_delta),
            min_new_tokens=int(msg.min_new_tokens),
            stop_token_ids=tuple(int(t) for t in msg.stop_token_ids) if msg.min_new_tokens else (),
        )
        params.validate()
        return params

    def validate(self) -> None:
        """What the per-field rules (`sampling_rules.py`) leave: fields that go together."""
        checks = [
            (all(math.isfinite(bias) for _, bias in self.logit_bias), "logit_bias values must be finite", None),
            (not self.min_new_tokens or self.stop_token_ids, "min_new_tokens needs stop_token_ids", None),
            (
                not self.watermark or (0 < self.watermark_gamma < 1 and math.isfinite(self.watermark_delta)),
                "watermark needs 0 < watermark_gamma < 1 and a finite watermark_delta",
                None,
            ),
        ]
        for ok, message, value in checks:
            if not ok:
                raise SequenceRefused(message if value is None else f"{message}, got {value}")

    @property
    def needs_all_tokens(self) -> bool:
        return self.repetition_penalty != 1.0

    @property
    def needs_generated_counts(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def needs_history(self) -> bool:
        """Choosing the next token reads earlier tokens on the host (penalties, watermark)."""
        return self.needs_all_tokens or self.needs_generated_counts or self.watermark

    def suppresses_stops(self, generated: int) -> bool:
        """Whether the stop tokens are banned for the token drawn after `generated` tokens."""
        return generated < self.min_new_tokens

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids in logit_bias and stop_token_ids must index the model's vocabulary."""
        for token_id, _ in self.logit_bias:
            if token_id >= vocab_size:
                raise SequenceRefused(f"logit_bias token {token_id} is outside the vocabulary ({vocab_size})")
        for token_id in self.stop_token_ids:
            if token_id >= vocab_size:
                raise SequenceRefused(f"stop token {token_id} is outside the vocabulary ({vocab_size})")


@dataclass
class SequenceState:
    id: int
    token_ids: list[int]
    prompt_len: int
    computed_len: int  # leading tokens whose KV is in the cache
    block_table: list[int]
    sampling: SamplingParams
    prefill_logprobs: bool = False
    top_n_tokens: int = 0
    # The next token is the plain argmax of the raw logits, after the grammar's mask if there
    # is one (greedy, no processor, no top-n): unconstrained, the CUDA graph's argmax can be
    # used as is. Fixed for the sequence's life, so decided once.
    plain_argmax: bool = False
    # Tokens sampled by launched steps whose results have not reached the host yet, oldest
    # first (see runner.PendingToken). The newest is the next decode's input.
    pending: list = field(default_factory=list)
    # Constrained decoding: the sequence's matcher (grammar.SequenceGrammar), None for free text.
    grammar: object | None = None
    # Speculative decoding: what the drafter keeps for this sequence (an n-gram index, or
    # where the draft model's KV stands), made at its first draft.
    draft_state: object | None = None
    # A launched step verifies drafts for it: until that step completes, its kept tokens
    # (and so its position) are not on the host.
    verifying: bool = False

    @property
    def known_len(self) -> int:
        """Tokens so far, counting those still on the device."""
        return len(self.token_ids) + len(self.pending)

    @property
    def generated_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def needs_host_tokens(self) -> bool:
        """Choosing the next token reads the previous ones on the host (penalties, watermark,
        or the grammar's mask, which needs every token consumed first)."""
        return self.sampling.needs_history or self.grammar is not None


@dataclass
class SequenceTable:
    sequences: dict[int, SequenceState] = field(default_factory=dict)
    # Sequences that failed on their own (refused parameters, a grammar dead end): steps the
    # router planned before it heard may still name them, and are skipped for them until
    # the router releases them.
    failed: set[int] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.sequences)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.sequences

    def get(self, seq_id: int) -> SequenceState:
        try:
            return self.sequences[seq_id]
        except KeyError:
            raise InvalidStepError(f"sequence {seq_id} is not known to the shard") from None

    def add(self, state: SequenceState) -> None:
        if state.id in self.sequences:
            raise InvalidStepError(f"sequence {state.id} is already registered")
        self.sequences[state.id] = state

    def release(self, seq_id: int) -> None:
        # Releasing an unknown id is harmless (e.g. cancelled before it was sent).
        self.sequences.pop(seq_id, None)
        self.failed.discard(seq_id)

    def fail(self, seq_id: int) -> None:
        """Drops a sequence that failed on its own; later steps skip it until its release."""
        self.sequences.pop(seq_id, None)
        self.failed.add(seq_id)

    def clear(self) -> None:
        self.sequences.clear()
        self.failed.clear()
