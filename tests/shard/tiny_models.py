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
