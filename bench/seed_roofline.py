"""Rooflines of the seed benchmark's scenarios, from the model's shape and measured ceilings.

Each bound is the larger of two times: the bytes that must cross device memory divided by
the measured copy bandwidth, and the matmul FLOPs divided by the measured matmul rate. With
tensor parallelism over `tp` devices both are split evenly (each device holds 1/tp of the
weights and KV heads, and does 1/tp of the FLOPs); the all-reduces are left out, so the
bound is optimistic for tp > 1. What must be read per decode step: every layer and lm_head
(the embedding table is only indexed), plus the KV of every position in the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.gpu_model import _layer_shapes, head_dim


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float  # one device, bytes read + written
    matmul_flops_per_s: float  # one device, in the served dtype


@dataclass(frozen=True)
class ModelCost:
    """Per-token costs of a Llama shape, whole model (divide by tp per device)."""

    layers: int
    hidden: int
    q_dim: int
    vocab: int
    layer_matmul_params: int
    kv_bytes_per_token: int
    element_bytes: int

    @classmethod
    def of(cls, cfg: dict, element_bytes: int) -> ModelCost:
        shapes = _layer_shapes(cfg)
        matmul = sum(rows * cols for rows, cols in shapes.values())
        kv_dim = cfg["num_key_value_heads"] * head_dim(cfg)
        layers = cfg["num_hidden_layers"]
        return cls(layers=layers, hidden=cfg["hidden_size"], q_dim=cfg["num_attention_heads"] * head_dim(cfg),
                   vocab=cfg["vocab_size"], layer_matmul_params=matmul,
                   kv_bytes_per_token=layers * 2 * kv_dim * element_bytes, element_bytes=element_bytes)  # fmt: skip

    @property
    def weight_bytes_per_step(self) -> int:
        layer = self.layer_matmul_params + 2 * self.hidden  # two norms
        return (self.layers * layer + self.vocab * self.hidden + self.hidden) * self.element_bytes

    def token_flops(self, context: int, sampled: bool) -> float:
        """FLOPs of one token at position `context` (attending to that many positions)."""
        linear = 2 * self.layers * self.layer_matmul_params
        attention = 2 * 2 * self.layers * self.q_dim * context  # QK^T and PV
        return linear + attention + (2 * self.vocab * self.hidden if sampled else 0)

    def prefill_flops(self, prompt: int) -> float:
        """A prompt's forward pass: every position, lm_head for the last one only."""
        linear = 2 * self.layers * self.layer_matmul_params * prompt
        attention = 2 * 2 * self.layers * self.q_dim * prompt * (prompt + 1) / 2
        return linear + attention + 2 * self.vocab * self.hidden

    def decode_kv_bytes(self, prompt: int, new_tokens: int) -> float:
        """KV bytes read while generating new_tokens after a prompt (the first comes from prefill)."""
        contexts = range(prompt + 1, prompt + new_tokens)
        return sum(contexts) * self.kv_bytes_per_token


def _bound(nbytes: float, flops: float, ceil: Ceilings, tp: int) -> float:
    return max(nbytes / (tp * ceil.copy_bytes_per_s), flops / (tp * ceil.matmul_flops_per_s))


def single_decode_tok_s(cost: ModelCost, ceil: Ceilings, tp: int, prompt: int, new_tokens: int) -> float:
    """Batch-1 decode: each token reads all weights and its context's KV."""
    times = [
        _bound(cost.weight_bytes_per_step + ctx * cost.kv_bytes_per_token, cost.token_flops(ctx, True), ceil, tp)
        for ctx in range(prompt + 1, prompt + new_tokens)
    ]  # fmt: skip
    return len(times) / sum(times)


def workload_output_tok_s(cost: ModelCost, ceil: Ceilings, tp: int, requests: list[tuple[int, int]]) -> float:
    """Every (prompt, new_tokens) request sent at once: the output rate if the server ran at
    the better of its two ceilings. At least max(new_tokens) forward passes each read the
    weights; every token's FLOPs and KV reads must happen somewhere."""
    steps = max(n for _, n in requests)
    nbytes = steps * cost.weight_bytes_per_step + sum(cost.decode_kv_bytes(p, n) for p, n in requests)
    flops = sum(
        cost.prefill_flops(p) + sum(cost.token_flops(ctx, True) for ctx in range(p + 1, p + n)) for p, n in requests
    )  # fmt: skip
    return sum(n for _, n in requests) / _bound(nbytes, flops, ceil, tp)


def ttft_s(cost: ModelCost, ceil: Ceilings, tp: int, prompt: int) -> float:
    """An unloaded prefill of one prompt: its FLOPs, or one read of the weights."""
    return _bound(cost.weight_bytes_per_step + prompt * cost.kv_bytes_per_token, cost.prefill_flops(prompt), ceil, tp)
