"""An MoE block's top-k routing in one launch: softmax over the experts in float32, the k most
probable, renormalised to sum to 1 where the family says so (`models/moe.route` is the torch
oracle). As torch ops it is four or five launches a layer (softmax, topk, sum, divide), which at
decode cost more than the arithmetic: a Qwen3-30B-A3B token crosses 48 MoE layers.

One program a token: the row of router logits (at most 1,024 experts) sits in registers, and the
k winners are taken one at a time (max, then masked out), the earliest expert winning a tie.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import next_power_of_two

MAX_EXPERTS = 1024  # a row in one program's registers


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, EXPERTS, logits_stride, TOP_K: tl.constexpr,
                  EXPERTS_POW2: tl.constexpr, K_POW2: tl.constexpr, RENORMALIZE: tl.constexpr):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, EXPERTS_POW2)
    logits = tl.load(logits_ptr + token * logits_stride + experts, mask=experts < EXPERTS, other=float("-inf"))
    logits = logits.to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    probs = tl.where(experts < EXPERTS, probs, -1.0)  # padding never wins
    slots = tl.arange(0, K_POW2)
    weights = tl.zeros((K_POW2,), tl.float32)
    ids = tl.zeros((K_POW2,), tl.int64)
    for j in tl.static_range(TOP_K):
        best = tl.max(probs, axis=0)
        winner = tl.argmax(probs, axis=0, tie_break_left=True)
        weights = tl.where(slots == j, best, weights)
        ids = tl.where(slots == j, winner.to(tl.int64), ids)
        probs = tl.where(experts == winner, -1.0, probs)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)
    tl.store(weights_ptr + token * TOP_K + slots, weights, mask=slots < TOP_K)
    tl.store(ids_ptr + token * TOP_K + slots, ids, mask=slots < TOP_K)


def routes_in_one_launch(router_logits: torch.Tensor, top_k: int) -> bool:
    return router_logits.dim() == 2 and router_logits.shape[1] <= MAX_EXPERTS and 0 < top_k <= router_logits.shape[1]


def fused_route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`route`'s (weights float32 [T, k], ids int64 [T, k]) from router logits [T, experts]."""
    tokens, experts = router_logits.shape
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int64, device=router_logits.device)
    if tokens:
        _route_kernel[(tokens,)](router_logits, weights, ids, experts, router_logits.stride(0), TOP_K=top_k,
                                 EXPERTS_POW2=next_power_of_two(experts), K_POW2=next_power_of_two(top_k),
                                 RENORMALIZE=renormalize, num_warps=4)  # fmt: skip
    return weights, ids
