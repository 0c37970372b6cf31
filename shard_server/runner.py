"""Executes steps: one batched forward pass over prefill chunks and decodes, then sampling.

The runner owns the model, the KV pool and the sequence table. `step` takes a StepRequest
and returns a StepResponse (protobuf messages), validating everything before touching state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .attention.base import StepLayout
from .cuda_graphs import DecodeGraphs, DecodeOutputs
from .kv_cache import KVCache, KVSpec
from .pb import generate_pb2 as pb
from .requests import InvalidStepError, SequenceTable
from .sampling import SampledTokens, Sampler, SamplingRows
from .step_plan import PoolLimits, ScheduledWork, apply_plan, plan_step

PREFILL_LOGPROB_ROWS = 512  # logits rows materialised at once for prefill logprobs


class NotWarmedUpError(RuntimeError):
    pass


@dataclass
class StepInputs:
    input_ids: list[int]
    positions: list[int]
    layout: StepLayout
    query_starts: list[int]


class ModelRunner:
    def __init__(self, model, kv_spec: KVSpec, device: torch.device):
        self.model = model
        self.config = model.config
        self.kv_spec = kv_spec
        self.device = device
        self.backend = model.layers[0].self_attn.backend
        self.sampler = Sampler(self.config.vocab_size, device)
        self.table = SequenceTable()
        self.kv_cache: KVCache | None = None
        self.graphs: DecodeGraphs | None = None  # set by warmup when CUDA graphs are on

    @property
    def block_size(self) -> int:
        return self.kv_spec.block_size

    def allocate_kv_cache(self, num_blocks: int) -> None:
        if self.graphs is not None:
            self.graphs.release()  # they point into the old pool
        self.kv_cache = None  # free the old pool before allocating the new one
        self.kv_cache = KVCache(self.kv_spec, num_blocks, self.device)

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
    @torch.inference_mode()
    def step(self, request) -> pb.StepResponse:
        if self.kv_cache is None:
            raise NotWarmedUpError("Warmup must run before the first Step")
        plan = plan_step(request, self.table, self.limits())
        apply_plan(plan, self.table)
        response = pb.StepResponse(step_id=request.step_id)
        if not plan.work:
            return response
        started = time.perf_counter_ns()
        tensors = self._prepare(plan.work)
        needs_hidden = any(self._wants_prefill_logprobs(item) for item in plan.work)
        hidden, decoded = self._forward(tensors, needs_hidden)
        samplers = [i for i, item in enumerate(plan.work) if item.sample]
        if decoded is not None and len(samplers) < len(plan.work):
            index = torch.tensor(samplers, dtype=torch.long, device=self.device)
            decoded = decoded.select(index) if samplers else None
        if samplers and decoded is None:
            rows = torch.tensor(
                [tensors.query_starts[i] + plan.work[i].num_tokens - 1 for i in samplers], device=self.device
            )
            decoded = DecodeOutputs(self.model.compute_logits(hidden.index_select(0, rows)), None, None)
        prefill = {
            i: self._prefill_logprobs(hidden, tensors.query_starts[i], item)
            for i, item in enumerate(plan.work)
            if self._wants_prefill_logprobs(item)
        }
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        sampled_at = time.perf_counter_ns()
        tokens = self._sample(decoded, [plan.work[i] for i in samplers]) if samplers else None
        response.forward_ns = sampled_at - started
        self._finish(plan.work, samplers, tokens, prefill, response)
        response.sample_ns = time.perf_counter_ns() - sampled_at
        return response

    def _forward(
        self, inputs: StepInputs, needs_hidden: bool
    ) -> tuple[torch.Tensor | None, DecodeOutputs | None]:
        """(hidden states of the step's tokens, None) run eagerly, or (None, the outputs of every
        sequence) from a CUDA graph when one fits the step and no hidden state is needed."""
        graphs = self.graphs if not needs_hidden else None
        size = graphs.size_for(inputs.layout) if graphs is not None else None
        if size is not None:
            return None, self.graphs.run(size, inputs.input_ids, inputs.positions, inputs.layout)
        metadata = self.backend.build_metadata(inputs.layout, self.device)
        input_ids = torch.tensor(inputs.input_ids, dtype=torch.long).to(self.device, non_blocking=True)
        positions = torch.tensor(inputs.positions, dtype=torch.long).to(self.device, non_blocking=True)
        return self.model(input_ids, positions, self.kv_cache, metadata), None

    def _prepare(self, work: list[ScheduledWork]) -> StepInputs:
        ids: list[int] = []
        positions: list[int] = []
        starts: list[int] = []
        for item in work:
            starts.append(len(ids))
            ids.extend(item.state.token_ids[item.start : item.end])
            positions.extend(range(item.start, item.end))
        layout = StepLayout(
            query_lens=[item.num_tokens for item in work],
            context_lens=[item.end for item in work],
            block_tables=[item.state.block_table for item in work],
            block_size=self.block_size,
        )
        return StepInputs(
            input_ids=ids,
            positions=positions,
            layout=layout,
            query_starts=starts,
        )

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
            targets = torch.tensor(item.state.token_ids[pos + 1 : stop + 1], device=self.device)
            out.extend(logprobs.gather(1, targets.unsqueeze(1)).squeeze(1).tolist())
        return out

    def _sample(self, decoded: DecodeOutputs, work: list[ScheduledWork]) -> SampledTokens:
        states = [item.state for item in work]
        params = [s.sampling for s in states]
        if decoded.greedy_ids is not None and all(s.plain_argmax for s in states):
            return SampledTokens(decoded.greedy_ids, decoded.greedy_logprobs, None, None)
        rows = SamplingRows(
            params=params,
            positions=[len(s.token_ids) for s in states],
            all_tokens=[s.token_ids for s in states] if any(p.needs_all_tokens for p in params) else [],
            generated_tokens=[s.generated_ids for s in states]
            if any(p.needs_generated_counts for p in params)
            else [],
            top_n=[s.top_n_tokens for s in states],
            previous_tokens=[s.token_ids[-1] for s in states],
        )
        return self.sampler(decoded.logits, rows)

    def _finish(self, work, samplers, tokens: SampledTokens | None, prefill, response) -> None:
        """Advances each sequence and writes its output straight into the response."""
        row_of = {i: row for row, i in enumerate(samplers)}
        ids = logprobs = top_ids = top_lps = None
        if tokens is not None:
            ids, logprobs = tokens.ids.tolist(), tokens.logprobs.tolist()
            if tokens.top_ids is not None:
                top_ids, top_lps = tokens.top_ids.tolist(), tokens.top_logprobs.tolist()
        for i, item in enumerate(work):
            state = item.state
            state.computed_len = item.end
            row = row_of.get(i)
            if row is None and i not in prefill:
                continue
            output = response.outputs.add(id=state.id)
            if row is not None:
                state.token_ids.append(ids[row])
                token = output.token
                token.id, token.logprob = ids[row], logprobs[row]
                n = state.top_n_tokens
                if n and top_ids is not None:
                    token.top_ids.extend(top_ids[row][:n])
                    token.top_logprobs.extend(top_lps[row][:n])
            if i in prefill:
                output.prefill_logprobs.extend(prefill[i])


__all__ = ["ModelRunner", "NotWarmedUpError", "InvalidStepError"]
