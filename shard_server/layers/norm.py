"""RMSNorm with the Hugging Face numerics (normalise in float32, scale in the model dtype)."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.dispatch import use_fused
from ..kernels.fp8_matmul import Fp8Rows
from ..kernels.norm import fused_heads_rmsnorm, fused_rmsnorm, heads_fusable
from ..weights import WeightStore


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device), requires_grad=False)

    def load(self, store: WeightStore, name: str) -> None:
        self.weight.copy_(store.get(name))

    def forward(self, x: torch.Tensor, quantize: bool = False) -> torch.Tensor | Fp8Rows:
        """`quantize`: the next product takes `Fp8Rows`, which the fused kernel then returns."""
        if _fusable(x):
            return fused_rmsnorm(x, self.weight, self.eps, quantize=quantize)[0]
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor, quantize: bool = False, before: RMSNorm | None = None
    ) -> tuple[torch.Tensor | Fp8Rows, torch.Tensor]:
        """Returns (norm(x + residual), x + residual): the pre-norm residual stream step.
        `before`: a norm of the sublayer's output (Gemma's post-attention and post-feedforward
        norms), applied to x first, in the same launch."""
        if _fusable(x) and _fusable(residual):
            pre = (before.weight, before.eps) if before is not None else None
            return fused_rmsnorm(x, self.weight, self.eps, residual, quantize, pre)
        if before is not None:
            x = before(x)
        residual = x + residual
        return self.forward(residual), residual


def norm_heads(q: torch.Tensor, k: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, d] and k [T, KV, d] each normed per head (Qwen3's and Gemma 3's q_norm / k_norm):
    in place, in one launch, where the fused kernels apply (a norm's torch path is ~7 launches)."""
    if use_fused(q) and heads_fusable(q) and heads_fusable(k) and q.shape[2] == k.shape[2]:
        fused_heads_rmsnorm(q, k, q_norm.weight, k_norm.weight, q_norm.eps, k_norm.eps)
        return q, k
    return q_norm(q), k_norm(k)


def _fusable(x: torch.Tensor) -> bool:
    return use_fused(x) and x.dim() == 2 and x.stride(1) == 1
