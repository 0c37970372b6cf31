"""Executes steps: one batched forward pass over prefill chunks and decodes, then sampling.

The runner owns the model, the KV pool and the sequence table. A step is launched, then
completed: `launch` validates the StepRequest before touching state, prepares the inputs and
queues the forward pass and sampling on the device; `complete` waits for the results
(`settle`: each sampled token into its sequence) and writes the StepResponse (`answer`; both
in step_results.py). Between the two, the next step can be launched (step_pipeline.py): a
decode whose input token is still on the device reads it there, so the GPU goes from one
step to the next without waiting for the host. A step that must settle the one before first (after a
verification) can be launched before that one is answered. `step` does it all at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .attention.base import StepLayout
from .cuda_graphs import DecodeGraphs, DecodeOutputs
from .device_copy import to_device
from .distributed import ParallelContext
from .grammar import GrammarEngine
from .kernels.dispatch import use_fused
from .kernels.greedy import fused_greedy
from .kv_cache import KVCache, KVSpec
from .layers.rotary import long_rope_prompt_tokens, rotary_row_offset
from .mixed_graphs import MixedGraphs
from .models.causal_lm import CausalLM
from .pb import generate_pb2 as pb
from .requests import InvalidStepError, SequenceTable
from .sampling import SampledTokens, Sampler, SamplingRows, TokenMask
from .speculation import Drafter, PromptLookup
from .step_plan import PoolLimits, ScheduledWork, apply_plan, plan_step
from .step_results import HostRows, Outcome, take_tokens, write_outputs

log = logging.getLogger(__name__)

PREFILL_LOGPROB_ROWS = 512  # logits rows materialised at once for prefill logprobs


class NotWarmedUpError(RuntimeError):
    pass


@dataclass(frozen=True, eq=False)
class PendingToken:
    """A token a launched step sampled that has not reached the host: `ids[row]` on the device."""

    ids: torch.Tensor
    row: int


@dataclass
class StepInputs:
    input_ids: list[int]
    positions: list[int]
    layout: StepLayout
    query_starts: list[int]
    # (input row, token) for inputs still on the device; `input_ids` holds 0 there.
    on_device: list[tuple[int, PendingToken]] = field(default_factory=list)


@dataclass
class LaunchedStep:
    """A step whose device work is queued; `ModelRunner.complete` turns it into its response."""

    response: pb.StepResponse
    work: list[ScheduledWork] = field(default_factory=list)
    # The work item (index into work) of each sampled row, in order: one row per sampling
    # item, or 1 + len(drafts) consecutive rows for a verification.
    row_items: list[int] = field(default_factory=list)
    prefill: dict[int, list[float]] = field(default_factory=dict)
    sampled: list[PendingToken] = field(default_factory=list)  # one per sampled row, in order
    host: list[torch.Tensor] = field(default_factory=list)  # ids, logprobs[, top ids, top logprobs]
    # Constrained rows: the mask of the sampler rows that have a grammar, and those of them
    # (indices into work) whose grammar reached a dead end, with the reason.
    token_mask: TokenMask | None = None
    dead_ends: dict[int, str] = field(default_factory=dict)
    mask_ns: int = 0  # host time spent filling the masks
    # Once settled: the sampled rows on the host, and each settled item's outcome.
    host_rows: HostRows | None = None
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    # On a GPU, timing events around the step's device work: `began` before its first queued
    # work (the device reaches it once the step before is done), `prepared` once the host has
    # prepared its inputs, `done` after its copies.
    began: torch.cuda.Event | None = None
    prepared: torch.cuda.Event | None = None
    done: torch.cuda.Event | None = None
    started_ns: int = 0


class ModelRunner:
    def __init__(
        self, model: CausalLM, kv_spec: KVSpec, device: torch.device, grammars: GrammarEngine | None = None,
        drafter: Drafter | None = None, parallel: ParallelContext | None = None,
    ):  # fmt: skip
        """`grammars` runs constrained decoding; without one (no tokenizer), a constrained
        sequence is refused. `drafter` proposes speculative drafts: prompt lookup by default.
        `parallel`: the ranks' context the model was built with; its steps are spans of votes
        (distributed.StepAgreement), so that a rank out of memory never hangs the others."""
        self.model = model
        self.parallel = parallel or ParallelContext()
        self.config = model.config
        self.kv_spec = kv_spec
        self.device = device
        self.backend = model.attention_backend
        self.sampler = Sampler(self.config.vocab_size, device)
        self.table = SequenceTable()
        self.kv_cache: KVCache | None = None
        self.graphs: DecodeGraphs | None = None  # set by warmup when CUDA graphs are on
        self.mixed_graphs: MixedGraphs | None = None  # likewise, for steps not decode-only
        self.grammars = grammars or GrammarEngine(None, self.config.vocab_size)
        self.drafter = drafter or PromptLookup()

    @property
    def block_size(self) -> int:
        return self.kv_spec.block_size

    @property
    def bytes_per_block(self) -> int:
        """KV bytes one block of the pool takes: the target's, and the draft model's if any."""
        return self.kv_spec.bytes_per_block + self.drafter.bytes_per_block

    @property
    def dtype(self) -> torch.dtype:
        """The model's compute dtype (the KV pool's and the linear weights' may be narrower: fp8)."""
        return self.model.compute_dtype

    def allocate_kv_cache(self, num_blocks: int) -> None:
        for graphs in (self.graphs, self.mixed_graphs):
            if graphs is not None:
                graphs.release()  # they point into the old pool
        self.kv_cache = None  # free the old pool before allocating the new one
        self.kv_cache = KVCache(self.kv_spec, num_blocks, self.device)
        self.drafter.allocate(num_blocks)

    def clear(self) -> None:
        self.table.clear()

    def limits(self) -> PoolLimits:
        return PoolLimits(
            num_blocks=self.kv_cache.num_blocks,
            block_size=self.block_size,
            vocab_size=self.config.vocab_size,
            max_positions=self.config.max_position_embeddings,
        )

    # -- one step ----------------------------------------------------------------------
    def step(self, request) -> pb.StepResponse:
        return self.complete(self.launch(request))

    @torch.inference_mode()
    def launch(self, request, settle: Callable[[], None] | None = None) -> LaunchedStep:
        """Validates and queues one step. `settle` completes the step launched before, if any:
        it is called before this step is planned when drafting it or knowing where a sequence
        stands needs that step's tokens on the host (`_reads_unsettled_tokens`), else after this
        step's forward is queued when choosing its tokens needs them."""
        if self.kv_cache is None:
            raise NotWarmedUpError("Warmup must run before the first Step")
        if settle is not None and self._reads_unsettled_tokens(request):
            settle()
        plan = plan_step(request, self.table, self.limits(), self.grammars)
        # Choosing some row's token reads the step before's tokens on the host (a grammar's
        # mask, penalties): that step is settled, but only once this one's forward is queued,
        # so the GPU runs the forward while the host waits, consumes and fills the masks.
        wait_for_host = settle is not None and any(_needs_host_tokens(item) for item in plan.work)
        apply_plan(plan, self.table)
        launched = LaunchedStep(pb.StepResponse(step_id=request.step_id), plan.work)
        for seq_id, reason in plan.refused.items():
            launched.response.outputs.add(id=seq_id, error=reason)
        if not plan.work:
            return launched
        try:
            with self.parallel.step():  # every rank leaves a step one rank ran out of memory in
                self._queue_work(launched, plan.work, settle if wait_for_host else None)
        except torch.cuda.OutOfMemoryError:
            self._out_of_memory(launched)
        return launched

    def _reads_unsettled_tokens(self, request) -> bool:
        """Whether the step needs, before it can even be planned, tokens that the step in
        flight has not returned to the host: drafts are proposed from a sequence's tokens, and
        after a verification only its answer says where the sequence stands. The router plans
        such a step before that answer; settling the step in flight here costs the device the
        host's work between the two, not a round trip through the router."""
        for scheduled in request.sequences:
            state = self.table.sequences.get(scheduled.id)
            if state is not None and (state.verifying or (scheduled.max_draft_tokens and state.pending)):
                return True
        return False

    def _queue_work(self, launched: LaunchedStep, work: list[ScheduledWork], settle: Callable[[], None] | None) -> None:
        """Queues the step's forward and sampling; `settle` (when the step's tokens need the
        step before's on the host) is called once the forward is queued."""
        launched.started_ns = time.perf_counter_ns()
        launched.began = self._device_event()
        self._draft(launched, work)
        tensors = self._prepare(work)
        launched.prepared = self._device_event()
        needs_hidden = any(self._wants_prefill_logprobs(item) for item in work)
        # A verification's every row is sampled; the graphs then gather those rows.
        verifies = any(item.drafts for item in work)
        output_rows = _output_rows(work, tensors.query_starts) if verifies else None
        hidden, decoded = self._forward(tensors, needs_hidden, output_rows)
        failed: set[int] = set()
        if settle is not None:
            settle()
            # The step before may have failed a sequence this one schedules (a grammar dead
            # end): its row ran in the forward, but it draws nothing and gets no output.
            failed = {i for i, item in enumerate(work) if item.state.id in self.table.failed}
        samplers = [i for i, item in enumerate(work) if item.sample and i not in failed]
        # Without verifications (the hot path) each item has one row and the lists stay short.
        row_items = _expand_rows(work, samplers) if verifies else samplers
        output_items = _expand_rows(work, range(len(work))) if verifies else range(len(work))
        if decoded is not None and len(row_items) < len(output_items):
            sampling = set(samplers)
            index = [row for row, i in enumerate(output_items) if i in sampling]
            decoded = decoded.select(to_device(index, torch.long, self.device)) if index else None
        if samplers and decoded is None:
            rows = to_device(_sampled_rows(work, samplers, tensors.query_starts), torch.long, self.device)
            decoded = DecodeOutputs(self.model.compute_logits(hidden.index_select(0, rows)), None, None)
        launched.prefill = {
            i: self._prefill_logprobs(hidden, tensors.query_starts[i], item)
            for i, item in enumerate(work)
            if self._wants_prefill_logprobs(item) and i not in failed
        }
        if samplers:
            # After the forward is queued, so that the host fills the masks while the GPU runs.
            self._mask_constrained(launched, work, row_items)
            tokens = self._sample(decoded, work, row_items, launched.token_mask)
            launched.row_items = row_items
            launched.sampled = [PendingToken(tokens.ids, row) for row in range(len(row_items))]
            for i, token in zip(row_items, launched.sampled):
                if not work[i].drafts:  # a verification's tokens are chosen on the host
                    work[i].state.pending.append(token)
            launched.host = self._to_host(tokens)
        for item in work:  # last: `item.end` is relative to computed_len
            # A verification's drafts count once kept (`take_tokens`); its input's KV is in now.
            item.state.computed_len = item.end - len(item.drafts)
        launched.done = self._device_event()

    def _draft(self, launched: LaunchedStep, work: list[ScheduledWork]) -> None:
        """Has the drafter propose the drafts the router left room for; each becomes an input."""
        drafting = [item for item in work if item.draft_budget]
        if not drafting:
            return
        self.drafter.draft(drafting)
        for item in drafting:
            item.num_tokens += len(item.drafts)
            item.state.verifying = bool(item.drafts)
        launched.response.draft_ns = time.perf_counter_ns() - launched.started_ns

    def _out_of_memory(self, launched: LaunchedStep) -> None:
        """The device ran out of memory queueing the step (on this rank, or on another that
        said so: distributed.PeerOutOfMemory): none of it is kept. Its sequences are failed
        here (later steps skip them until released) and the answer says so, so that the
        router recomputes them (preemption) instead of failing them or the shard."""
        log.warning("step %d ran out of device memory: its %d sequences go back to the router",
                    launched.response.step_id, len(launched.work))  # fmt: skip
        for item in launched.work:
            self._fail(item.state)
        launched.work = []  # `complete` then answers with the response alone
        launched.response.out_of_memory = True
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # what the failed allocation left cached goes back

    @staticmethod
    def finished(launched: LaunchedStep) -> bool:
        """Whether a launched step's device work is done (always, on the CPU), without waiting."""
        return launched.done is None or launched.done.query()

    def complete(self, launched: LaunchedStep) -> pb.StepResponse:
        """Waits for a launched step's results and writes its response."""
        return self.answer(self.settle(launched))

    def settle(self, launched: LaunchedStep) -> LaunchedStep:
        """Waits for a launched step's results and moves each sampled token to its sequence:
        all that planning the next step needs. `answer` writes the response."""
        response = launched.response
        if not launched.work:
            return launched
        if launched.done is not None:
            launched.done.synchronize()
            response.device_ns = int(launched.began.elapsed_time(launched.done) * 1e6)
            response.input_wait_ns = int(launched.began.elapsed_time(launched.prepared) * 1e6)
        results_at = time.perf_counter_ns()
        # On a GPU the sampling kernels run inside this span; sample_ns is the host's share.
        response.forward_ns = results_at - launched.started_ns
        take_tokens(launched, self._fail)
        response.sample_ns = max(1, time.perf_counter_ns() - results_at)
        return launched

    def answer(self, launched: LaunchedStep) -> pb.StepResponse:
        """The response of a settled step."""
        response = launched.response
        if launched.work:
            writing_at = time.perf_counter_ns()
            write_outputs(launched)
            response.sample_ns += time.perf_counter_ns() - writing_at
            response.mask_ns = launched.mask_ns
        return response

    def _device_event(self) -> torch.cuda.Event | None:
        """A timing event recorded on the current stream now; None on the CPU."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _to_host(self, tokens: SampledTokens) -> list[torch.Tensor]:
        """Starts copying the sampled tokens to the host (valid once the step's event is done)."""
        tensors = [tokens.ids, tokens.logprobs]
        if tokens.top_ids is not None:
            tensors += [tokens.top_ids, tokens.top_logprobs]
        if self.device.type != "cuda":
            return tensors
        return [t.to("cpu", non_blocking=True) for t in tensors]  # into pinned memory

    def _forward(
        self, inputs: StepInputs, needs_hidden: bool, output_rows: list[int] | None = None
    ) -> tuple[torch.Tensor | None, DecodeOutputs | None]:
        """(hidden states of the step's tokens, None) run eagerly, or (None, the outputs of every
        sequence) from a CUDA graph when one fits the step and no hidden state is needed: a
        decode graph for a decode-only step, else the smallest mixed graph that holds it.
        `output_rows` (a step verifying drafts) names the token rows to output instead."""
        fill = (lambda ids: _fill_on_device(ids, inputs.on_device)) if inputs.on_device else None
        graph = None if needs_hidden else self._graph_for(inputs.layout, output_rows)
        if graph is not None:
            graphs, key = graph
            rows = {} if output_rows is None else {"sample_rows": output_rows}
            return None, graphs.run(key, inputs.input_ids, inputs.positions, inputs.layout, fill, **rows)
        metadata = self.backend.build_metadata(inputs.layout, self.device)
        input_ids = to_device(inputs.input_ids, torch.long, self.device)
        positions = to_device(inputs.positions, torch.long, self.device)
        if fill is not None:
            fill(input_ids)
        return self.model(input_ids, positions, self.kv_cache, metadata), None

    def _graph_for(self, layout: StepLayout, output_rows: list[int] | None = None):
        """(graphs, key) of the graph that runs this step, or None: it runs eagerly."""
        if output_rows is None and self.graphs is not None and (size := self.graphs.size_for(layout)) is not None:
            return self.graphs, size
        rows = None if output_rows is None else len(output_rows)
        if self.mixed_graphs is not None and (tokens := self.mixed_graphs.bucket_for(layout, rows)) is not None:
            return self.mixed_graphs, tokens
        return None

    def _prepare(self, work: list[ScheduledWork]) -> StepInputs:
        ids: list[int] = []
        positions: list[int] = []
        starts: list[int] = []
        on_device: list[tuple[int, PendingToken]] = []
        # The model's positions index its rotary table: LongRoPE keeps a long prompt's rows apart.
        scaling, table_rows = self.config.rope_scaling, self.config.max_position_embeddings
        long_rope = long_rope_prompt_tokens(scaling) > 0
        for item in work:
            starts.append(len(ids))
            state = item.state
            known = state.token_ids[item.start : item.end] + item.drafts
            if len(known) < item.num_tokens:
                # A decode of the token the previous step sampled: it is still on the device.
                on_device.append((len(ids) + len(known), state.pending[item.end - 1 - len(state.token_ids)]))
                known = [*known, 0]
            ids.extend(known)
            offset = rotary_row_offset(scaling, table_rows, state.prompt_len) if long_rope else 0
            positions.extend(range(item.start + offset, item.end + offset))
        layout = StepLayout(
            query_lens=[item.num_tokens for item in work],
            context_lens=[item.end for item in work],
            block_tables=[item.state.block_table for item in work],
            block_size=self.block_size,
        )
        return StepInputs(ids, positions, layout, starts, on_device)

    @staticmethod
    def _wants_prefill_logprobs(item: ScheduledWork) -> bool:
        return item.state.prefill_logprobs and item.start + 1 < item.state.prompt_len

    def _prefill_logprobs(self, hidden: torch.Tensor, row_start: int, item: ScheduledWork) -> list[float]:
        """Logprob of input_ids[p + 1] for each chunk position p with p + 1 < prompt_len."""
        last = min(item.end, item.state.prompt_len - 1)  # positions [start, last) predict a prompt token
        out: list[float] = []
        for pos in range(item.start, last, PREFILL_LOGPROB_ROWS):
            stop = min(pos + PREFILL_LOGPROB_ROWS, last)
            rows = hidden[row_start + pos - item.start : row_start + stop - item.start]
            logprobs = self.model.compute_logits(rows).log_softmax(dim=-1)
            targets = to_device(item.state.token_ids[pos + 1 : stop + 1], torch.long, self.device)
            out.extend(logprobs.gather(1, targets.unsqueeze(1)).squeeze(1).tolist())
        return out

    def _mask_constrained(self, launched: LaunchedStep, work: list[ScheduledWork], row_items: list[int]) -> None:
        """Fills the masks of the sampled rows that have a grammar and queues them to the device
        (a constrained sequence is never drafted for: one row each)."""
        rows = [row for row, i in enumerate(row_items) if work[i].state.grammar is not None]
        if not rows:
            return
        on_gpu = self.device.type == "cuda"
        bits = self.grammars.allocate(len(rows), pinned=on_gpu)
        dead = self.grammars.fill([work[row_items[row]].state.grammar for row in rows], bits)
        launched.mask_ns = self.grammars.timing.last_ns
        launched.dead_ends = {row_items[rows[k]]: reason for k, reason in dead.items()}
        index = None if len(rows) == len(row_items) else to_device(rows, torch.long, self.device)
        slots = [-1] * len(row_items)
        for k, row in enumerate(rows):
            slots[row] = k
        launched.token_mask = TokenMask(
            bits.to(self.device, non_blocking=True) if on_gpu else bits, index, to_device(slots, torch.int32, self.device)
        )

    def _sample(
        self, decoded: DecodeOutputs, work: list[ScheduledWork], row_items: list[int], mask: TokenMask | None = None
    ) -> SampledTokens:
        """Chooses each sampled row's token. A verification's rows are its positions in order,
        each chosen as a plain decode there would be (its own position's draw and counts)."""
        states = [work[i].state for i in row_items]
        positions = _row_positions(work, row_items)
        if all(s.plain_argmax for s in states):
            if mask is None and decoded.greedy_ids is not None:
                return SampledTokens(decoded.greedy_ids, decoded.greedy_logprobs, None, None)
            if use_fused(decoded.logits):  # the argmax under the grammar's mask, in one pass
                bits, slots = (mask.bits, mask.slots) if mask is not None else (None, None)
                return SampledTokens(*fused_greedy(decoded.logits, bits, slots), None, None)
        params = [s.sampling for s in states]
        rows = SamplingRows(
            params=params,
            positions=positions,
            all_tokens=[s.token_ids for s in states] if any(p.needs_all_tokens for p in params) else [],
            generated_tokens=[s.generated_ids for s in states]
            if any(p.needs_generated_counts for p in params)
            else [],
            generated_counts=[position - s.prompt_len for position, s in zip(positions, states)],
            top_n=[s.top_n_tokens for s in states],
            previous_tokens=[s.token_ids[-1] for s in states] if any(p.watermark for p in params) else [],
            token_mask=mask,
        )
        return self.sampler(decoded.logits, rows)

    def _fail(self, state) -> None:
        """Drops a sequence whose grammar failed, unless the router released it meanwhile."""
        if self.table.sequences.get(state.id) is state:
            self.table.fail(state.id)


def _sampled_rows(work: list[ScheduledWork], samplers: list[int], query_starts: list[int]) -> list[int]:
    """Hidden-state rows to sample from: each sampler's last input, or every input of a
    verification (its decode's input, then each draft)."""
    rows: list[int] = []
    for i in samplers:
        last = query_starts[i] + work[i].num_tokens - 1
        rows.extend(range(last - len(work[i].drafts), last + 1))
    return rows


def _expand_rows(work: list[ScheduledWork], items) -> list[int]:
    """Each of `items` (indices into work) once per row it samples: 1 + len(drafts) times."""
    return [i for i in items for _ in range(1 + len(work[i].drafts))]


def _output_rows(work: list[ScheduledWork], query_starts: list[int]) -> list[int]:
    """A graph's output rows for a step with verifications: every item's sampled rows, in order,
    whether it samples or not (the rows of those that do not are dropped after the forward)."""
    return _sampled_rows(work, list(range(len(work))), query_starts)


def _row_positions(work: list[ScheduledWork], row_items: list[int]) -> list[int]:
    """Position of the token each sampled row chooses: a verification's rows choose the tokens
    at its positions end - len(drafts) .. end, the others the one at `end`."""
    positions: list[int] = []
    for row, i in enumerate(row_items):
        first = row == 0 or row_items[row - 1] != i
        positions.append(work[i].end - len(work[i].drafts) if first else positions[-1] + 1)
    return positions


def _needs_host_tokens(item: ScheduledWork) -> bool:
    """The step reads a token of this sequence that a launched step has not returned yet."""
    return bool(item.state.pending) and item.state.needs_host_tokens


def _fill_on_device(input_ids: torch.Tensor, on_device: list[tuple[int, PendingToken]]) -> None:
    """Copies the tokens the previous step sampled into their input rows, on the device. At most
    one launched step is outstanding, so they all come from that step's one tensor."""
    source = on_device[0][1].ids
    assert all(token.ids is source for _, token in on_device), "one step outstanding at a time"
    device = input_ids.device
    picked = source.index_select(0, to_device([token.row for _, token in on_device], torch.long, device))
    input_ids.index_copy_(0, to_device([row for row, _ in on_device], torch.long, device), picked.to(input_ids.dtype))


__all__ = ["ModelRunner", "NotWarmedUpError", "InvalidStepError"]
