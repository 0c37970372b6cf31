"""Gemma 2 and Gemma 3 decoders: `gemma3_text` checkpoints, and the language model of the
multimodal `gemma3` ones (Gemma3ForConditionalGeneration: gemma-3-4b/12b/27b-it), served as text.

Differences from Llama, as transformers computes them:
- embeddings scaled by sqrt(hidden_size) (the factor rounded to the model dtype);
- RMSNorm scales by (1 + w): the checkpoint's w is stored as 1 + w at load, so the norms (and
  their fused kernels) are Llama's;
- four norms per layer: input, post-attention (on the attention output, before the residual
  add), pre-feedforward and post-feedforward (on the MLP output, before the residual add); a
  post-norm runs in the same launch as the add and the norm after it (two launches a layer);
- GeGLU MLP: gelu (tanh approximation) of gate, times up (one fused kernel, kernels/activation.py);
- queries scaled by query_pre_attn_scalar ** -0.5; attention scores soft-capped
  (cap * tanh(s / cap), Gemma 2) and final logits soft-capped;
- alternating sliding-window and global layers (`layer_types`): each layer gets its own backend
  view (attention/per_layer.py);
- Gemma 3: (1 + w) RMSNorm on q and k per head, and sliding layers rotate with their own base
  (rope_local_base_freq), global layers with rope_theta and the config's rope scaling;
- tied embeddings (an untied checkpoint loads lm_head.weight).

A `gemma3` checkpoint holds its language model under one of two prefixes (GEMMA3_LAYOUTS): the
Hub's google/gemma-3-*-it files and transformers' save_pretrained (5.x too) write
`language_model.model.*`; other files hold transformers' module names, `model.language_model.*`
(transformers reads both). Only those tensors are read:
the vision tower and the projector are never loaded.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import AttentionBackend
from ..distributed import ParallelContext
from ..kv_cache import KVCache
from ..layers.embedding import LMHead, VocabParallelEmbedding
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from ..weights import WeightsError, WeightStore
from .config import ModelConfig, RopeScaling
from .llama import LlamaAttention, LlamaMLP


# A `gemma3` checkpoint's language model: (decoder prefix, untied LM head name), per layout.
GEMMA3_LAYOUTS = (
    ("language_model.model", "language_model.lm_head.weight"),
    ("model.language_model", "lm_head.weight"),
)


def tensor_names(cfg: ModelConfig, store: WeightStore) -> tuple[str, str]:
    """Where this checkpoint keeps the decoder ("model", or a `gemma3` layout's prefix) and the LM head."""
    if cfg.model_type != "gemma3":
        return "model", "lm_head.weight"
    for prefix, head in GEMMA3_LAYOUTS:
        if f"{prefix}.embed_tokens.weight" in store:
            return prefix, head
    wanted = " or ".join(f"{prefix}.embed_tokens.weight" for prefix, _ in GEMMA3_LAYOUTS)
    raise WeightsError(f"gemma3 checkpoint has no language model: neither {wanted} is in it")


class GemmaRMSNorm(RMSNorm):
    """Scales by (1 + w); holds 1 + w, computed in float32 as transformers does."""

    def load(self, store: WeightStore, name: str) -> None:
        self.weight.copy_(store.get(name).float() + 1.0)


class GemmaAttention(LlamaAttention):
    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backend: AttentionBackend, dtype, device):
        super().__init__(cfg, ctx, backend, dtype, device)
        if cfg.qk_norm:  # Gemma 3
            self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
            self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)


class GemmaMLP(LlamaMLP):
    activation = "gelu_tanh"


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backend: AttentionBackend, dtype, device):
        super().__init__()

        def norm() -> GemmaRMSNorm:
            return GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)

        self.input_layernorm = norm()
        self.self_attn = GemmaAttention(cfg, ctx, backend, dtype, device)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = GemmaMLP(cfg, ctx, dtype, device)
        self.post_feedforward_layernorm = norm()

    def load(self, store: WeightStore, prefix: str) -> None:
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):  # fmt: skip
            getattr(self, name).load(store, f"{prefix}.{name}.weight")
        self.self_attn.load(store, f"{prefix}.self_attn")
        self.mlp.load(store, f"{prefix}.mlp")

    def forward(self, hidden, residual, incoming, rotary, k_cache, v_cache, metadata):
        """`hidden`: what the layer before adds to the residual stream, before `incoming` (that
        layer's post-feedforward norm) is applied; at the first layer the embeddings, with
        `residual` and `incoming` None. Returns (this layer's MLP output, before its own
        post-feedforward norm; the residual stream before it): each sublayer's output norm runs
        in the launch of the norm after it (`add_and_norm(before=...)`)."""
        quantize = self.self_attn.qkv_proj.takes_fp8_rows(hidden)
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden, quantize)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual, quantize, before=incoming)
        attended = self.self_attn(hidden, rotary, k_cache, v_cache, metadata)
        quantize = self.mlp.gate_up_proj.takes_fp8_rows(attended)
        hidden, residual = self.pre_feedforward_layernorm.add_and_norm(
            attended, residual, quantize, before=self.post_attention_layernorm
        )
        return self.mlp(hidden), residual


class GemmaForCausalLM(nn.Module):
    """`backends`: one attention backend view per layer (the layers' windows differ)."""

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, backends, dtype, device):
        super().__init__()
        if isinstance(backends, AttentionBackend):
            backends = [backends] * cfg.num_hidden_layers
        self.config = cfg
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, ctx, dtype, device)
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=dtype, device=device)
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, ctx, b, dtype, device) for b in backends)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        tied = self.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size, ctx, dtype, device, tied_to=tied)

        def rotary(theta: float, scaling: RopeScaling) -> RotaryEmbedding:
            return RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, theta, scaling, dtype, device)

        self.rotary = rotary(cfg.rope_theta, cfg.rope_scaling)
        self.local_rotary = None
        if cfg.local_rope_theta is not None:  # Gemma 3: sliding layers have their own base
            self.local_rotary = rotary(cfg.local_rope_theta, cfg.local_rope_scaling or RopeScaling())
        # The CausalLM interface (causal_lm.py): any layer's view builds every layer's metadata.
        self.attention_backend = backends[0]
        self.layer_windows = cfg.layer_windows or (cfg.sliding_window,) * cfg.num_hidden_layers
        self.layer_is_local = [window is not None for window in self.layer_windows]

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def load(self, store: WeightStore) -> None:
        prefix, head = tensor_names(self.config, store)
        self.embed_tokens.load(store, f"{prefix}.embed_tokens.weight")
        for i, layer in enumerate(self.layers):
            layer.load(store, f"{prefix}.layers.{i}")
        self.norm.load(store, f"{prefix}.norm.weight")
        if not self.config.tie_word_embeddings:
            self.lm_head.load(store, head)

    def forward(self, input_ids, positions, kv_cache: KVCache, metadata) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] of every token of the step."""
        rotary = self.rotary.for_step(positions)
        local = rotary if self.local_rotary is None else self.local_rotary.for_step(positions)
        hidden, residual, incoming = self.embed_tokens(input_ids) * self.embed_scale, None, None
        for index, layer in enumerate(self.layers):
            k_cache, v_cache = kv_cache.layer(index)
            step = local if self.layer_is_local[index] else rotary
            hidden, residual = layer(hidden, residual, incoming, step, k_cache, v_cache, metadata)
            incoming = layer.post_feedforward_layernorm
        hidden, _ = self.norm.add_and_norm(hidden, residual, before=incoming)
        return hidden

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        logits = self.lm_head(hidden, float32)
        cap = self.config.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
