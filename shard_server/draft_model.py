"""Draft-model speculation: a small model that shares the target's tokenizer proposes drafts.

The draft model runs in the shard beside the target and proposes greedily, one token a
forward, with its own KV pool. That pool has the target pool's blocks, so a sequence's block
table addresses both: the router's allocator, prefix cache and preemption cover the draft's
KV with nothing more, and the pool's sizing counts both (`bytes_per_block`).

A draft is only a proposal that the target verifies (speculation.py): the text never depends
on the draft's KV. So that KV is kept lazily. Each sequence's `DraftCursor` says which tokens
the draft pool holds at which positions. When a decode drafts, the draft model first catches
up from the first position whose token is not the sequence's (the whole prompt at a
sequence's first draft; after a verification, the drafts it kept and the target's token
after them), then proposes one token a forward. The proposals stay on the device, each
forward's feeding the next, and reach the host once, after the last. A prefix that the prefix cache shares between
sequences has the same tokens at the same positions, so catching up over it writes what is
there already.

On a GPU, the draft's forwards replay CUDA graphs (captured at warmup, in a memory pool of
their own, so that a replay never overwrites the model's graph outputs that the next step
still reads): a decode graph per drafting batch size, and mixed graphs of up to 64 tokens for
the short catch-ups after a verification. A sequence's first catch-up (its prompt) runs
eagerly unless it fits one of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .attention.base import StepLayout
from .cuda_graphs import DecodeGraphs
from .device_copy import to_device
from .kv_cache import KVCache, KVSpec
from .mixed_graphs import MixedGraphs, capture_all, graphs_memory_bytes
from .models.causal_lm import CausalLM
from .models.config import UnsupportedModelError
from .step_plan import ScheduledWork

# Most tokens one catch-up forward carries: a long prompt is caught up in chunks, so the
# draft's activations stay within what the target's own prefill chunks need.
CATCH_UP_TOKENS = 2048
# Drafting decodes a step the draft's decode graphs cover: the router drafts for at most 8
# decodes a step (MAX_DRAFTING_DECODES, router/src/scheduler/speculation.rs); more run eagerly.
DRAFT_GRAPH_SIZES = (1, 2, 4, 8)
# Token rows of the draft's mixed graphs: a catch-up after a verification is the kept drafts
# and the token after them (k + 1 tokens a sequence, up to 8 sequences); up to 16 rows they stay
# on the skinny matmuls, as the target's small buckets do (mixed_graphs.MIXED_TOKEN_BUCKETS).
CATCH_UP_GRAPH_TOKENS = (8, 16, 32, 64)


@dataclass
class DraftCursor:
    """Where a sequence's draft KV stands: positions [0, confirmed) hold its tokens, and the
    positions after them hold `proposed` (drafts, right or wrong)."""

    confirmed: int = 0
    proposed: list[int] = field(default_factory=list)

    def valid_len(self, tokens: list[int]) -> int:
        """Leading positions whose draft KV is that of `tokens`."""
        kept = 0
        for written, token in zip(self.proposed, tokens[self.confirmed :]):
            if written != token:
                break
            kept += 1
        return self.confirmed + kept


@dataclass
class _Run:
    """Tokens fed to the draft model at positions [start, start + len(tokens)) of a sequence."""

    block_table: list[int]
    tokens: list[int]
    start: int


class DraftModel:
    """The drafter of `--speculative-model` (speculation.Drafter)."""

    def __init__(self, model: CausalLM, kv_spec: KVSpec, device: torch.device, target_vocab_size: int):
        self.model = model
        self.kv_spec = kv_spec
        self.device = device
        # Tokens the draft may propose: both vocabularies share their first ids (the check
        # below); the rest of a padded vocabulary is never proposed.
        self.vocab_size = min(target_vocab_size, model.config.vocab_size)
        self.kv_cache: KVCache | None = None
        self.graphs: DecodeGraphs | None = None  # set by `capture_graphs`
        self.mixed_graphs: MixedGraphs | None = None

    @property
    def bytes_per_block(self) -> int:
        return self.kv_spec.bytes_per_block

    def allocate(self, num_blocks: int) -> None:
        self.graphs = self.mixed_graphs = None  # they point into the old pool
        self.kv_cache = None  # free the old pool before allocating the new one
        self.kv_cache = KVCache(self.kv_spec, num_blocks, self.device)

    def _graph_holders(self) -> tuple[DecodeGraphs, MixedGraphs]:
        backend, positions = self.model.attention_backend, self.model.config.max_position_embeddings
        decode = DecodeGraphs(self.model, backend, self.kv_spec.block_size, positions, self.device)
        mixed = MixedGraphs(self.model, backend, self.kv_spec.block_size, positions, self.device,
                            max_seqs=max(DRAFT_GRAPH_SIZES))  # fmt: skip
        return decode, mixed

    def graphs_memory_bytes(self) -> int:
        """Device memory the draft's graphs take (a trial capture against the current pool)."""
        decode, mixed = self._graph_holders()
        return graphs_memory_bytes(decode, mixed, max(DRAFT_GRAPH_SIZES), CATCH_UP_GRAPH_TOKENS, self.kv_cache)

    def capture_graphs(self) -> None:
        """Captures the draft's graphs against its current pool (after its last `allocate`)."""
        decode, mixed = self._graph_holders()
        capture_all(decode, mixed, DRAFT_GRAPH_SIZES, CATCH_UP_GRAPH_TOKENS, self.kv_cache)
        self.graphs, self.mixed_graphs = decode, mixed

    @torch.inference_mode()
    def draft(self, items: list[ScheduledWork]) -> None:
        # Positions past the draft model's own (a draft with a shorter context) get no drafts.
        limit = self.model.config.max_position_embeddings
        items = [item for item in items if len(item.state.token_ids) + item.draft_budget - 1 <= limit]
        if not items:
            return
        cursors = [_cursor(item.state) for item in items]
        token_lists = [item.state.token_ids for item in items]
        starts = [min(c.valid_len(t), len(t) - 1) for c, t in zip(cursors, token_lists)]
        # Each forward's proposals feed the next on the device: the host reads them once, at
        # the end, instead of waiting on every forward before it can queue the next.
        width = max(item.draft_budget for item in items)
        proposals = torch.zeros((len(items), width), dtype=torch.long, device=self.device)
        proposals[:, 0] = self._catch_up(items, starts)
        for j in range(1, width):
            active = [i for i, item in enumerate(items) if item.draft_budget > j]
            # One token each, at the position after the last fed; its id is the device's.
            runs = [_Run(items[i].state.block_table, [0], len(token_lists[i]) + j - 1) for i in active]
            rows = None if len(active) == len(items) else to_device(active, torch.long, self.device)
            fed = proposals[:, j - 1] if rows is None else proposals[rows, j - 1]
            proposed = self._propose(runs, fed)
            if rows is None:
                proposals[:, j] = proposed
            else:
                proposals[rows, j] = proposed
        for item, cursor, tokens, row in zip(items, cursors, token_lists, proposals.tolist()):
            item.drafts = row[: item.draft_budget]
            # The last draft was proposed, never fed: its KV is not in the pool.
            cursor.confirmed, cursor.proposed = len(tokens), item.drafts[:-1]

    def _catch_up(self, items: list[ScheduledWork], starts: list[int]) -> torch.Tensor:
        """Feeds each sequence's tokens from its start to its last (the decode's input), at
        most CATCH_UP_TOKENS a forward; returns each one's first draft (on the device)."""
        fed = list(starts)
        first = torch.zeros(len(items), dtype=torch.long, device=self.device)
        while True:
            room, runs, fed_now = CATCH_UP_TOKENS, [], []
            for i, item in enumerate(items):
                tokens = item.state.token_ids
                take = min(len(tokens) - fed[i], room)
                if take > 0:
                    runs.append(_Run(item.state.block_table, tokens[fed[i] : fed[i] + take], fed[i]))
                    fed_now.append(i)
                    fed[i] += take
                    room -= take
            if not runs:
                return first
            # A sequence's last chunk proposes its first draft (later chunks overwrite earlier).
            first.index_copy_(0, to_device(fed_now, torch.long, self.device), self._propose(runs))

    def _propose(self, runs: list[_Run], fed: torch.Tensor | None = None) -> torch.Tensor:
        """One forward over the runs; each run's greedy next token, on the device. `fed`: the
        input ids of one-token runs, on the device (the runs' own tokens are then ignored)."""
        ids = [min(token, self.model.config.vocab_size - 1) for run in runs for token in run.tokens]
        positions = [p for run in runs for p in range(run.start, run.start + len(run.tokens))]
        layout = StepLayout(
            query_lens=[len(run.tokens) for run in runs],
            context_lens=[run.start + len(run.tokens) for run in runs],
            block_tables=[run.block_table for run in runs],
            block_size=self.kv_spec.block_size,
        )
        fill = None if fed is None else (lambda buffer: buffer[: len(fed)].copy_(fed))
        logits = self._replay(ids, positions, layout, fill)
        if logits is None:
            metadata = self.model.attention_backend.build_metadata(layout, self.device)
            input_ids = fed.contiguous() if fed is not None else to_device(ids, torch.long, self.device)
            input_positions = to_device(positions, torch.long, self.device)
            hidden = self.model(input_ids, input_positions, self.kv_cache, metadata)
            last = [start + n - 1 for start, n in zip(layout.query_starts, layout.query_lens)]
            logits = self.model.compute_logits(hidden.index_select(0, to_device(last, torch.long, self.device)))
        return logits[:, : self.vocab_size].argmax(dim=-1)

    def _replay(self, ids: list[int], positions: list[int], layout: StepLayout, fill) -> torch.Tensor | None:
        """Each run's last logits from the graph that holds the forward, or None: run it eagerly.
        `fill` writes input ids that are on the device into the graph's input buffer."""
        if self.graphs is not None and (size := self.graphs.size_for(layout)) is not None:
            return self.graphs.run(size, ids, positions, layout, fill).logits
        if self.mixed_graphs is not None and (tokens := self.mixed_graphs.bucket_for(layout)) is not None:
            return self.mixed_graphs.run(tokens, ids, positions, layout, fill).logits
        return None


def _cursor(state) -> DraftCursor:
    if state.draft_state is None:
        state.draft_state = DraftCursor()
    return state.draft_state


def check_same_vocabulary(model_dir: Path, draft_dir: Path) -> None:
    """Refuses a draft model whose tokenizer gives a shared token another id than the target's
    does: its drafts would be other tokens. Only tokenizer.json is read (both must have one)."""
    model_vocab, draft_vocab = _vocabulary(Path(model_dir)), _vocabulary(Path(draft_dir))
    for piece, token_id in draft_vocab.items():
        other = model_vocab.get(piece)
        if other is not None and other != token_id:
            raise UnsupportedModelError(
                f"the speculative model's tokenizer differs from the model's: {piece!r} is token "
                f"{other} in {model_dir} and {token_id} in {draft_dir}"
            )
    if len(model_vocab.keys() & draft_vocab.keys()) < min(len(model_vocab), len(draft_vocab)):
        raise UnsupportedModelError(
            f"the speculative model's tokenizer differs from the model's: {draft_dir}/tokenizer.json "
            f"and {model_dir}/tokenizer.json share only some of their tokens"
        )


def _vocabulary(model_dir: Path) -> dict[str, int]:
    """piece -> id of a tokenizer.json's model vocabulary and added tokens."""
    path = model_dir / "tokenizer.json"
    try:
        spec = json.loads(path.read_bytes())
        vocab = spec["model"]["vocab"]
        pieces = dict(vocab) if isinstance(vocab, dict) else {entry[0]: i for i, entry in enumerate(vocab)}
        pieces.update({token["content"]: int(token["id"]) for token in spec.get("added_tokens") or []})
    except FileNotFoundError:
        raise UnsupportedModelError(f"{path}: missing; a speculative model must share the model's tokenizer") from None
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise UnsupportedModelError(f"{path}: not a tokenizer this shard can read ({exc})") from None
    return pieces
