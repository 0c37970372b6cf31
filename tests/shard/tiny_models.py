"""Tiny random Llama-family checkpoints written with transformers (the test reference)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

COMMON = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(rope_theta=500000.0)),
    "llama3_scaled": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            )
        ),
    ),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(sliding_window=None)),
    "mistral_window": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(sliding_window=8)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=24)),
    # Tensor-parallel shape: 8 heads over 2 KV heads (replicated at 4 ranks) and a vocabulary
    # that 4 ranks cannot split evenly (padded vocab blocks).
    "llama_8h_2kv": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(num_attention_heads=8, num_key_value_heads=2, vocab_size=162, rope_theta=10000.0),
    ),
}


def make_tiny_model(family: str, directory: Path, seed: int = 0):
    """Writes a random checkpoint of `family` into directory and returns the HF model."""
    config_cls, model_cls, extra = FAMILIES[family]
    config = config_cls(**{**COMMON, **extra})
    torch.manual_seed(seed)
    model = model_cls(config)
    # Default init leaves logits nearly flat; wider weights make comparisons meaningful.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif param.dim() == 1:
                param.normal_(0, 0.2)
            else:
                param.normal_(0, 0.15)
    model.eval()
    model.save_pretrained(directory)
    return model


# Mixture-of-Experts families, kept apart from FAMILIES (whose session fixture every shard test
# builds). save_pretrained writes the Hub's per-expert layout (experts.{i}.w1/w2/w3 for Mixtral,
# experts.{i}.gate_proj/up_proj/down_proj for the others).
MOE_FAMILIES = {
    "mixtral": (
        transformers.MixtralConfig,
        transformers.MixtralForCausalLM,
        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, rope_theta=1e6),
    ),
    "qwen2_moe": (  # shared expert with its sigmoid gate; top-k weights not renormalised
        transformers.Qwen2MoeConfig,
        transformers.Qwen2MoeForCausalLM,
        dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, norm_topk_prob=False),
    ),  # fmt: skip
    "qwen3_moe": (  # per-head q/k norms, explicit head_dim, renormalised top-k
        transformers.Qwen3MoeConfig,
        transformers.Qwen3MoeForCausalLM,
        dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, head_dim=24, norm_topk_prob=True),
    ),
    "olmoe": (  # q/k norms over all features, clip_qkv, biased attention projections
        transformers.OlmoeConfig,
        transformers.OlmoeForCausalLM,
        dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32, clip_qkv=1.5, attention_bias=True,
             pad_token_id=None, eos_token_id=None),
    ),  # fmt: skip
}


def make_tiny_moe_model(family: str, directory: Path, seed: int = 0, **config_fields):
    """Writes a random checkpoint of MoE `family` into directory and returns the HF model. The
    config.json names the expert count `num_experts` where the Hub's Qwen3-MoE files do.
    `config_fields` override the family's (a real tokenizer's `vocab_size`, say)."""
    import json

    config_cls, model_cls, extra = MOE_FAMILIES[family]
    config = config_cls(**{**COMMON, **extra, **config_fields})
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif param.dim() == 1:
                param.normal_(0, 0.2)
            else:
                param.normal_(0, 0.15)
    model.eval()
    model.save_pretrained(directory)
    path = Path(directory) / "config.json"
    raw = json.loads(path.read_text())
    if family == "qwen3_moe" and "num_local_experts" in raw:
        raw["num_experts"] = raw.pop("num_local_experts")
        path.write_text(json.dumps(raw, indent=2))
    return model


# Dense families beyond Llama (tests/shard/test_dense_families.py), kept apart from FAMILIES
# like MOE_FAMILIES. Each exercises its family's differences at sizes where they show: windows
# shorter than the prompts, soft-caps near the scores' and logits' range, query_pre_attn_scalar
# other than head_dim, Gemma 3's local/global rope bases with linear scaling on the global layers,
# and Phi-3's LongRoPE (short factors up to 64 positions, long ones beyond).
def _longrope_factors(count: int, top: float, seed: int) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    return (1.0 + torch.rand(count, generator=generator) * (top - 1.0)).tolist()


def _gemma3_multimodal_config(**text) -> transformers.Gemma3Config:
    """gemma-3-4b/12b/27b-it's shape: Gemma3ForConditionalGeneration, the text model in
    `text_config`, beside a (tiny) SigLIP vision tower and its projector."""
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)  # fmt: skip
    return transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)


_GEMMA3_TEXT = dict(
    num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    pad_token_id=0, eos_token_id=None, bos_token_id=None,
)  # fmt: skip

DENSE_FAMILIES = {
    "gemma2": (
        transformers.Gemma2Config,
        transformers.Gemma2ForCausalLM,
        dict(num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
             attn_logit_softcapping=4.0, final_logit_softcapping=6.0, rope_theta=10000.0,
             pad_token_id=0, eos_token_id=None, bos_token_id=None),
    ),  # fmt: skip
    "gemma3_text": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, _GEMMA3_TEXT),
    # The multimodal checkpoint as save_pretrained writes it (and the Hub holds it):
    # language_model.model.*, vision_tower.*, multi_modal_projector.*; tied LM head.
    "gemma3": (_gemma3_multimodal_config, transformers.Gemma3ForConditionalGeneration, _GEMMA3_TEXT),
    # The same under transformers' module names: model.language_model.*, model.vision_tower.*, ...
    "gemma3_module_names": (_gemma3_multimodal_config, transformers.Gemma3ForConditionalGeneration, _GEMMA3_TEXT),
    "phi3": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(original_max_position_embeddings=64,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                              "short_factor": _longrope_factors(8, 1.5, 1),
                              "long_factor": _longrope_factors(8, 6.0, 2)},
             pad_token_id=0, eos_token_id=None, bos_token_id=None),
    ),  # fmt: skip
    "phi3_partial": (  # Phi-4-mini's rope: partial_rotary_factor 0.75 (12 of 16 dims rotate), LongRoPE
        transformers.Phi3Config,  # factors over the rotary dims
        transformers.Phi3ForCausalLM,
        dict(partial_rotary_factor=0.75, original_max_position_embeddings=64,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                              "short_factor": _longrope_factors(6, 1.5, 3),
                              "long_factor": _longrope_factors(6, 6.0, 4)},
             pad_token_id=0, eos_token_id=None, bos_token_id=None),
    ),  # fmt: skip
    "phi3_window": (  # Phi-3-mini-4k's shape: a sliding window, no rope scaling, 8 heads / 2 KV
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(sliding_window=10, num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0,
             pad_token_id=0, eos_token_id=None, bos_token_id=None),
    ),  # fmt: skip
}


def make_tiny_dense_model(family: str, directory: Path, seed: int = 0, **config_fields):
    """Writes a random checkpoint of dense `family` (DENSE_FAMILIES) into directory and returns
    the HF model. Gemma's norms hold w of (1 + w): drawn around 0, so 1 + w spans 0.5 .. 1.5.
    `config_fields` override the family's text fields (a real tokenizer's `vocab_size`, say)."""
    config_cls, model_cls, extra = DENSE_FAMILIES[family]
    config = config_cls(**{**COMMON, **extra, **config_fields})
    torch.manual_seed(seed)
    model = model_cls(config)
    gemma = family.startswith("gemma")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(-0.5, 0.5) if gemma else param.uniform_(0.5, 1.5)
            elif param.dim() == 1:
                param.normal_(0, 0.2)
            else:
                param.normal_(0, 0.15)
    model.eval()
    model.save_pretrained(directory)
    if family == "gemma3_module_names":
        _rename_to_module_names(Path(directory))
    return model


def _rename_to_module_names(directory: Path) -> None:
    """Rewrites a saved Gemma3ForConditionalGeneration's tensors under transformers' module
    names (model.language_model.*, model.vision_tower.*, model.multi_modal_projector.*)."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)

    def name(old: str) -> str:
        if old.startswith("language_model.model."):
            return "model.language_model." + old.removeprefix("language_model.model.")
        if old.startswith("language_model.lm_head."):
            return old.removeprefix("language_model.")
        return "model." + old

    save_file({name(k): v for k, v in tensors.items()}, path, metadata={"format": "pt"})
