"""Constrained decoding: one llguidance matcher per constrained sequence, and its token masks.

The router compiled and checked each grammar; the shard builds a matcher from it, replays the
tokens already generated (after a preemption), fills the sequence's row of a shared bitmask
(one bit per vocabulary id, 32 per int32 word) for each token it samples, and consumes the
sampled token once it is on the host.

Stop tokens (the router's EOS ids) are never consumed: the router ends the sequence when it
sees one. They are allowed once the grammar accepts, forced once it can go no further, and
masked out otherwise. llguidance does the same when its tokenizer's EOS set is the stop set
(its tokenizers are cached per stop set for that reason); `_apply_stop_rule` states the rule
again so that it does not depend on that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .requests import SequenceRefused

MAX_ERROR_CHARS = 500  # llguidance's messages can carry a whole parser dump


def _short(message: str) -> str:
    """llguidance's first line (the parser state follows), bounded."""
    first = message.strip().split("\n<state>", 1)[0].strip()
    return first if len(first) <= MAX_ERROR_CHARS else first[:MAX_ERROR_CHARS] + "..."


@dataclass
class MaskTiming:
    """Host time spent filling masks, for the steps that had constrained rows. Each step's
    share goes to the router in StepResponse.mask_ns; the totals stay here."""

    steps: int = 0
    rows: int = 0
    total_ns: int = 0
    last_ns: int = 0
    max_ns: int = 0

    def record(self, rows: int, elapsed_ns: int) -> None:
        self.steps += 1
        self.rows += rows
        self.total_ns += elapsed_ns
        self.last_ns = elapsed_ns
        self.max_ns = max(self.max_ns, elapsed_ns)


class GrammarEngine:
    """Builds the matchers of constrained sequences. The llguidance tokenizer is made from the
    model's tokenizer.json on the first constrained sequence (about a second for a large
    vocabulary, so never at startup) and cached per set of stop tokens."""

    def __init__(self, tokenizer_json: Path | None, vocab_size: int):
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.timing = MaskTiming()
        self._tokenizers: dict[tuple[int, ...], object] = {}
        self._text: str | None = None
        self._executor = None

    @classmethod
    def for_model_dir(cls, model_path: Path, vocab_size: int) -> GrammarEngine:
        return cls(Path(model_path) / "tokenizer.json", vocab_size)

    def tokenizer(self, stop_ids: tuple[int, ...]):
        cached = self._tokenizers.get(stop_ids)
        if cached is None:
            import llguidance

            cached = llguidance.LLTokenizer(self._tokenizer_text(), n_vocab=self.vocab_size, eos_token=list(stop_ids))
            self._tokenizers[stop_ids] = cached
        return cached

    def _tokenizer_text(self) -> str:
        if self._text is None:
            path = self.tokenizer_json
            if path is None or not path.is_file():
                raise SequenceRefused("grammar: constrained decoding needs the model's tokenizer.json, which this shard does not have")
            self._text = path.read_text(encoding="utf-8")
        return self._text

    def compile(self, grammar_msg, replay: list[int]) -> SequenceGrammar:
        """The matcher of a new sequence, having consumed `replay` (tokens generated before a
        preemption). Raises SequenceRefused for a grammar or replay it cannot use."""
        stop_ids = tuple(dict.fromkeys(int(t) for t in grammar_msg.stop_token_ids))
        if not stop_ids:
            raise SequenceRefused("grammar: stop_token_ids is empty; a constrained sequence needs a token to end it")
        if max(stop_ids) >= self.vocab_size:
            raise SequenceRefused(f"grammar: stop token {max(stop_ids)} is outside the vocabulary ({self.vocab_size})")
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer(stop_ids), grammar_msg.llguidance, log_level=0)
        if matcher.is_error():
            raise SequenceRefused(f"grammar: {_short(matcher.get_error())}")
        grammar = SequenceGrammar(matcher, stop_ids)
        grammar.replay(replay)
        return grammar

    def fill(self, grammars: list[SequenceGrammar], bitmask: torch.Tensor) -> dict[int, str]:
        """Fills row i of `bitmask` (CPU int32 [n, words]) for grammars[i]; returns the rows at a
        dead end with their reason (those rows allow every token: the sample is discarded)."""
        started = time.perf_counter_ns()
        _fill_rows([(g.matcher, i) for i, g in enumerate(grammars) if not g.matcher.is_error()], bitmask, self)
        dead = {}
        for i, grammar in enumerate(grammars):
            reason = grammar.finish_row(bitmask[i].numpy().view(np.uint32))
            if reason is not None:
                dead[i] = reason
                bitmask[i] = -1
        self.timing.record(len(grammars), time.perf_counter_ns() - started)
        return dead

    def executor(self):
        """llguidance's thread pool for filling several rows at once, made on first use."""
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        return self._executor

    def allocate(self, rows: int, pinned: bool) -> torch.Tensor:
        """A CPU bitmask for `rows` rows; pinned when it is to be copied to a GPU."""
        return torch.empty((rows, (self.vocab_size + 31) // 32), dtype=torch.int32, pin_memory=pinned)


def _fill_rows(rows: list[tuple[object, int]], bitmask: torch.Tensor, engine: GrammarEngine) -> None:
    """Writes each (matcher, row)'s mask into its row of the bitmask. Through llguidance's
    pointer API, as llguidance.torch does: importing that module costs seconds (torch.compile)."""
    assert bitmask.dtype == torch.int32 and bitmask.is_cpu and bitmask.is_contiguous()
    row_bytes = bitmask.shape[1] * 4
    if len(rows) > 1:
        engine.executor().unsafe_compute_mask_ptr(rows, bitmask.data_ptr(), row_bytes, bitmask.shape[0])
    elif rows:
        matcher, row = rows[0]
        matcher.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), row_bytes)


@dataclass
class SequenceGrammar:
    """One sequence's matcher, in step with the sequence's generated tokens."""

    matcher: object
    stop_ids: tuple[int, ...]
    _stop_words: np.ndarray = field(init=False)
    _stop_bits: np.ndarray = field(init=False)

    def __post_init__(self):
        ids = np.array(self.stop_ids, dtype=np.uint32)
        self._stop_words = (ids >> 5).astype(np.intp)
        self._stop_bits = np.left_shift(np.uint32(1), ids & 31).astype(np.uint32)

    def replay(self, tokens: list[int]) -> None:
        for position, token in enumerate(tokens):
            if token in self.stop_ids:
                raise SequenceRefused(f"grammar: replayed token {position} is a stop token")
            if not self.matcher.consume_token(token):
                raise SequenceRefused(f"grammar: replayed tokens do not match it: {_short(self.matcher.get_error())}")

    def consume(self, token: int) -> str | None:
        """Advances past a sampled token; the reason when it breaks the grammar."""
        if token in self.stop_ids:  # the router ends the sequence; the matcher never sees it
            return None
        if self.matcher.consume_token(token):
            return None
        return f"grammar dead end: {_short(self.matcher.get_error())}"

    def finish_row(self, row: np.ndarray) -> str | None:
        """Applies the stop-token rule to this sequence's filled mask row (uint32 view);
        returns the reason when no token is allowed."""
        if self.matcher.is_error():
            return f"grammar dead end: {_short(self.matcher.get_error())}"
        self._apply_stop_rule(row)
        if not row.any():
            return "grammar dead end: no token can continue it"
        return None

    def _apply_stop_rule(self, row: np.ndarray) -> None:
        if self.matcher.is_stopped():  # complete: only a stop token may follow
            row[:] = 0
            np.bitwise_or.at(row, self._stop_words, self._stop_bits)
        elif self.matcher.is_accepting():
            np.bitwise_or.at(row, self._stop_words, self._stop_bits)
        else:
            np.bitwise_and.at(row, self._stop_words, ~self._stop_bits)

