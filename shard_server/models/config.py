"""Typed view of a Llama-family config.json, with per-family differences as flags."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .errors import UnsupportedModelError
from .quantization import checkpoint_quantization

__all__ = ["LLAMA_FAMILY", "ModelConfig", "RopeScaling", "UnsupportedModelError"]

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "default"  # "default" | "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3)
    sliding_window: int | None
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    quantize: str | None = None  # "fp8": fp8 linear weights (an fp8 checkpoint, or --quantize fp8)

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        model_type = raw.get("model_type", "")
        if model_type not in LLAMA_FAMILY:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported (supported: {', '.join(LLAMA_FAMILY)})"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {raw['hidden_act']!r} is not supported")
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        head_dim = raw.get("head_dim") or hidden // heads
        return cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_param(raw, "rope_theta", 10000.0)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=_attention_bias(raw),
            qk_norm=model_type == "qwen3",
            sliding_window=_sliding_window(raw),
            rope_scaling=_rope_scaling(raw),
            quantize=checkpoint_quantization(raw),
        )

    def with_quantize(self, flag: str | None) -> ModelConfig:
        """The config served under `--quantize flag`: the flag quantizes an unquantized
        checkpoint; an fp8 checkpoint is fp8 with or without it."""
        return replace(self, quantize=flag or self.quantize)


def _rope_param(raw: dict, key: str, default):
    # transformers 5 moves rope settings into `rope_parameters`; older files keep them flat.
    params = raw.get("rope_parameters") or {}
    if key in params and params[key] is not None:
        return params[key]
    value = raw.get(key)
    return default if value is None else value


def _attention_bias(raw: dict) -> bool:
    if raw["model_type"] == "qwen2":
        return True
    return bool(raw.get("attention_bias", False))


def _sliding_window(raw: dict) -> int | None:
    window = raw.get("sliding_window")
    if not window:
        return None
    if raw["model_type"] in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        return None
    return int(window)


def _rope_scaling(raw: dict) -> RopeScaling:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling(kind="linear", factor=float(scaling["factor"]))
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    raise UnsupportedModelError(f"rope scaling {kind!r} is not supported")
