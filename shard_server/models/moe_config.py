"""The Mixture-of-Experts part of a config.json: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE.

Every field that changes the maths is read here or refused by name. Training-only fields
(`router_aux_loss_coef`, `output_router_logits`, `router_jitter_noise`) change nothing at
inference and are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnsupportedModelError

MOE_FAMILY = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int  # experts per token
    expert_intermediate_size: int  # of each routed expert
    norm_topk_prob: bool  # renormalise the top-k softmax probabilities to sum to 1
    weight_names: tuple[str, str, str]  # per-expert (gate, up, down) names in the checkpoint
    block_name: str  # the MoE block's name under each layer: "mlp" or "block_sparse_moe"
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: a dense expert with a sigmoid gate
    full_qk_norm: bool = False  # OLMoE: RMSNorm over all q (k) features, not per head
    clip_qkv: float | None = None  # OLMoE: q, k and v are clamped to [-clip, clip]


def moe_config(raw: dict) -> MoeConfig | None:
    """The MoE settings of an MoE family's config.json (None for a dense family); raises
    UnsupportedModelError naming any value that would change the maths and is not implemented."""
    model_type = raw.get("model_type", "")
    if model_type not in MOE_FAMILY:
        return None
    num_experts = raw.get("num_local_experts") if model_type == "mixtral" else None
    num_experts = num_experts or raw.get("num_experts") or raw.get("num_local_experts")
    if not num_experts or int(num_experts) < 1:
        raise _refused(model_type, "num_experts", num_experts, "an MoE model needs at least one expert")
    num_experts = int(num_experts)
    top_k = int(raw.get("num_experts_per_tok", 2))
    if not 1 <= top_k <= num_experts:
        raise _refused(model_type, "num_experts_per_tok", top_k, f"it must be in 1..{num_experts}")
    if model_type == "mixtral":
        return MoeConfig(
            num_experts, top_k, _size(raw, "intermediate_size"), True, ("w1", "w3", "w2"), "block_sparse_moe"
        )
    if model_type in ("qwen2_moe", "qwen3_moe"):
        _check_all_layers_sparse(raw)
        shared = int(raw.get("shared_expert_intermediate_size") or 0) if model_type == "qwen2_moe" else 0
        return MoeConfig(
            num_experts,
            top_k,
            _size(raw, "moe_intermediate_size"),
            bool(raw.get("norm_topk_prob", False)),
            ("gate_proj", "up_proj", "down_proj"),
            "mlp",
            shared_expert_intermediate_size=shared,
        )
    clip = raw.get("clip_qkv")
    return MoeConfig(  # olmoe
        num_experts,
        top_k,
        _size(raw, "intermediate_size"),
        bool(raw.get("norm_topk_prob", False)),
        ("gate_proj", "up_proj", "down_proj"),
        "mlp",
        full_qk_norm=True,
        clip_qkv=None if clip is None else float(clip),
    )


def _check_all_layers_sparse(raw: dict) -> None:
    """Qwen MoE configs can make some layers dense or sliding-window; only the all-sparse,
    full-attention layout (every released checkpoint's) is implemented."""
    model_type = raw["model_type"]
    if raw.get("mlp_only_layers"):
        raise _refused(model_type, "mlp_only_layers", raw["mlp_only_layers"], "dense layers among MoE layers")
    step = raw.get("decoder_sparse_step", 1)
    if step is not None and int(step) != 1:
        raise _refused(model_type, "decoder_sparse_step", step, "dense layers among MoE layers (only 1 loads)")
    if raw.get("use_sliding_window"):
        raise _refused(model_type, "use_sliding_window", True, "per-layer sliding windows (max_window_layers)")
    kinds = set(raw.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise _refused(model_type, "layer_types", sorted(kinds), "only full_attention layers load")


def _size(raw: dict, key: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or value < 1:
        raise _refused(raw["model_type"], key, value, "the experts' intermediate size must be a positive integer")
    return value


def _refused(model_type: str, name: str, value, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{model_type} config field {name}={value!r} is not supported: {why}")
