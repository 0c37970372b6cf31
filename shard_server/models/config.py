"""Typed view of a Llama-family config.json, with per-family differences as flags."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .errors import UnsupportedModelError
from .moe_config import MOE_FAMILY, MoeConfig, moe_config
from .quantization import PackedScheme, checkpoint_quantization, packed_scheme, served_quantization

__all__ = ["LLAMA_FAMILY", "ModelConfig", "RopeScaling", "UnsupportedModelError"]

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
DENSE_FAMILIES = ("gemma2", "gemma3_text", "gemma3", "phi3")  # their own model files (gemma.py, phi3.py)
GEMMA_FAMILY = ("gemma2", "gemma3_text")

# What transformers' Gemma3TextConfig fills in for a field a config leaves out: the Hub's
# gemma-3-4b/12b/27b-it files name only a few fields of their `text_config` (no vocab_size, no
# heads for the 4b, no head_dim, no query_pre_attn_scalar, ...). Rope bases and the window
# pattern have their defaults where they are read (_gemma_fields).
GEMMA3_TEXT_DEFAULTS = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131_072, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
    query_pre_attn_scalar=256, sliding_window=4096, final_logit_softcapping=None, attn_logit_softcapping=None,
)  # fmt: skip


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "default"  # one of ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    attention_factor: float = 1.0  # multiplies cos and sin (yarn, longrope)
    beta_fast: float = 32.0  # yarn's correction range
    beta_slow: float = 1.0
    truncate: bool = True
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors below / from
    long_factor: tuple[float, ...] = ()  # original_max_position_embeddings


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
    quantize: str | None = None  # "fp8" (an fp8 checkpoint, or --quantize fp8), "gptq" or "awq" (the checkpoint's)
    packed: PackedScheme | None = None  # GPTQ/AWQ: how the checkpoint packs its int4/int8 linear weights
    # Dense families beyond Llama (defaults: Llama's maths).
    hidden_act: str = "silu"  # "gelu_pytorch_tanh": Gemma's GeGLU
    layer_windows: tuple[int | None, ...] | None = None  # per-layer sliding window; None: `sliding_window` everywhere
    attention_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    attn_logit_softcap: float | None = None  # tanh soft-capping of attention scores (Gemma 2)
    final_logit_softcap: float | None = None  # of the LM head's logits (Gemma 2)
    local_rope_theta: float | None = None  # Gemma 3's sliding layers rotate with their own base
    local_rope_scaling: RopeScaling | None = None
    moe: MoeConfig | None = None  # Mixture-of-Experts families (moe_config.py); None: dense
    rotary_dim: int | None = None  # partial rotary (Phi-4-mini): each head's first dims that rotate; None: head_dim

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        model_type = raw.get("model_type", "")
        if model_type not in LLAMA_FAMILY + DENSE_FAMILIES + MOE_FAMILY:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported (supported: {', '.join(LLAMA_FAMILY + DENSE_FAMILIES + MOE_FAMILY)})"
            )
        if model_type == "gemma3":  # the multimodal checkpoint: its language model, served as text
            return replace(cls.from_dict(_gemma3_text_config(raw)), model_type="gemma3")
        if model_type == "gemma3_text":
            raw = {**GEMMA3_TEXT_DEFAULTS, **raw}
        if model_type not in GEMMA_FAMILY and raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {raw['hidden_act']!r} is not supported")
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        head_dim = raw.get("head_dim") or hidden // heads
        config = cls(
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
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            sliding_window=_sliding_window(raw),
            rope_scaling=_rope_scaling(raw),
            quantize=checkpoint_quantization(raw),
            packed=packed_scheme(raw),
        )
        return replace(config, moe=moe_config(raw), rotary_dim=_rotary_dim(raw, config.head_dim), **_gemma_fields(raw))

    def with_quantize(self, flag: str | None) -> ModelConfig:
        """The config served under `--quantize flag`: fp8 quantizes an unquantized checkpoint; a
        quantized checkpoint is served as it declares, and a flag that disagrees is refused."""
        return replace(self, quantize=served_quantization(self.quantize, flag))


def _gemma3_text_config(raw: dict) -> dict:
    """A `gemma3` (Gemma3ForConditionalGeneration) config.json's language model as a `gemma3_text`
    config: its `text_config`, with the outer file's tying and quantization."""
    text = dict(raw.get("text_config") or {})
    if text.get("model_type", "gemma3_text") != "gemma3_text":
        raise UnsupportedModelError(f"gemma3 text_config model_type {text['model_type']!r} is not supported (gemma3_text)")
    # transformers ties the LM head by the outer config's flag (Gemma3Config: True by default).
    text.update(model_type="gemma3_text", tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)))
    if raw.get("quantization_config") and not text.get("quantization_config"):
        text["quantization_config"] = raw["quantization_config"]
    return text


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
    if raw["model_type"] == "qwen2_moe":
        return bool(raw.get("qkv_bias", True))
    return bool(raw.get("attention_bias", False))


def _sliding_window(raw: dict) -> int | None:
    window = raw.get("sliding_window")
    if not window:
        return None
    if raw["model_type"] in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not raw.get("use_sliding_window", False):
        return None
    return int(window)


# Families whose attention rotates only the first rotary_dim dims of a head under
# partial_rotary_factor < 1 (transformers' Phi-3 apply_rotary_pos_emb); others refuse it.
PARTIAL_ROTARY_FAMILIES = ("phi3",)


def _partial_rotary_factor(raw: dict, scaling: dict) -> float:
    # The rope dict's value wins over the top-level field, as transformers reads them.
    value = scaling.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    return 1.0 if value is None else float(value)


def _rotary_dim(raw: dict, head_dim: int) -> int | None:
    """None for full rotary; under partial_rotary_factor, int(head_dim * factor) as transformers."""
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    factor = _partial_rotary_factor(raw, scaling)
    if factor == 1.0:
        return None
    dim = int(head_dim * factor)
    if not 0 < dim <= head_dim or dim % 2:
        raise UnsupportedModelError(
            f"partial_rotary_factor {factor} is not supported: head_dim {head_dim} x {factor} = {dim} rotary dims "
            "(an even number, at least 2, is needed)"
        )
    return None if dim == head_dim else dim


ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")

# The keys each rope type may carry; any other key would change the maths and is refused.
_ROPE_KEYS = {
    "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"},  # fmt: skip
    "longrope": {"factor", "original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"},
}
_ROPE_COMMON_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def _rope_scaling(raw: dict, scaling: dict | None = None) -> RopeScaling:
    """`scaling`: the rope dict to read (Gemma 3 keeps one per layer type); else the config's."""
    if scaling is None:
        scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if raw.get("model_type") == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"  # as transformers reads Phi-3's configs
    partial = _partial_rotary_factor(raw, scaling)
    if partial != 1.0 and raw.get("model_type") not in PARTIAL_ROTARY_FAMILIES:
        raise UnsupportedModelError(
            f"partial_rotary_factor {partial} is not supported for {raw.get('model_type')} "
            f"(partial rotary: {', '.join(PARTIAL_ROTARY_FAMILIES)}; elsewhere only 1.0, full rotary)"
        )
    if kind in _ROPE_KEYS:
        unknown = set(scaling) - _ROPE_KEYS[kind] - _ROPE_COMMON_KEYS
        if unknown:
            raise UnsupportedModelError(f"rope scaling {kind!r} has unsupported keys: {', '.join(sorted(unknown))}")
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
    if kind == "dynamic":
        return RopeScaling(kind="dynamic", factor=float(scaling["factor"]))
    if kind in ("yarn", "longrope"):
        return _long_context_scaling(raw, scaling, kind)
    raise UnsupportedModelError(
        f"rope scaling {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
    )


def _long_context_scaling(raw: dict, scaling: dict, kind: str) -> RopeScaling:
    """yarn and longrope, with transformers' defaults for the factor and the attention factor."""
    max_positions = int(raw.get("max_position_embeddings", 2048))
    # Phi-3 keeps the pretraining length outside the rope dict, and that copy wins.
    original = raw.get("original_max_position_embeddings") if kind == "longrope" else None
    original = int(original or scaling.get("original_max_position_embeddings") or max_positions)
    factor = scaling.get("factor")
    factor = float(factor) if factor is not None else max_positions / original
    attention = scaling.get("attention_factor")
    if kind == "yarn":
        if attention is None:
            mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            if mscale and mscale_all:
                attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
            else:
                attention = _yarn_mscale(factor)
        return RopeScaling(
            kind="yarn",
            factor=factor,
            original_max_position_embeddings=original,
            attention_factor=float(attention),
            beta_fast=float(scaling.get("beta_fast") or 32),
            beta_slow=float(scaling.get("beta_slow") or 1),
            truncate=bool(scaling.get("truncate", True)),
        )
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling(
        kind="longrope",
        factor=factor,
        original_max_position_embeddings=original,
        attention_factor=float(attention),
        short_factor=tuple(float(x) for x in scaling["short_factor"]),
        long_factor=tuple(float(x) for x in scaling["long_factor"]),
    )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _gemma_fields(raw: dict) -> dict:
    """Gemma 2 / Gemma 3 (text): the fields that differ from Llama's maths; {} for other families."""
    model_type = raw["model_type"]
    if model_type not in GEMMA_FAMILY:
        return {}
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise UnsupportedModelError(f"{model_type} hidden_activation {act!r} is not supported (gelu_pytorch_tanh)")
    for flag in ("use_bidirectional_attention", "attention_bias"):
        if raw.get(flag):
            raise UnsupportedModelError(f"{model_type} with {flag}=true is not supported")
    layers = int(raw["num_hidden_layers"])
    pattern = 2 if model_type == "gemma2" else int(raw.get("sliding_window_pattern") or 6)
    types = raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    ]
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown or len(types) != layers:
        raise UnsupportedModelError(f"{model_type} layer_types {types} are not supported")
    window = raw.get("sliding_window")
    windows = tuple(int(window) if t == "sliding_attention" and window else None for t in types)
    fields = dict(
        hidden_act=act,
        sliding_window=None,  # per layer instead
        layer_windows=windows,
        attention_scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_logit_softcap=_optional_float(raw, "attn_logit_softcapping", 50.0 if model_type == "gemma2" else None),
        final_logit_softcap=_optional_float(raw, "final_logit_softcapping", 30.0 if model_type == "gemma2" else None),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        qk_norm=model_type == "gemma3_text",
    )
    if model_type == "gemma3_text":
        params = raw.get("rope_parameters") or {}
        full = params.get("full_attention") or {**(raw.get("rope_scaling") or {})}
        local = params.get("sliding_attention") or {}
        fields.update(
            rope_theta=float(full.get("rope_theta") or raw.get("rope_theta") or 1_000_000.0),
            rope_scaling=_rope_scaling(raw, full),
            local_rope_theta=float(local.get("rope_theta") or raw.get("rope_local_base_freq") or 10_000.0),
            local_rope_scaling=_rope_scaling(raw, local),
        )
    return fields


def _optional_float(raw: dict, key: str, default: float | None) -> float | None:
    value = raw.get(key, default)
    return None if value is None else float(value)
