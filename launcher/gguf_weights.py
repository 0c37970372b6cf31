"""Turn a llama-architecture GGUF file into a Hugging Face config and float32 state dict.

Only `gguf` and numpy are used, so converting needs neither torch nor transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np


class GGUFConversionError(ValueError):
    """The GGUF file is not a llama model this converter understands."""


@dataclass(frozen=True)
class LlamaShape:
    """The architecture numbers a llama GGUF stores under `llama.*`."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def field_value(reader: Any, key: str, default: Any = None) -> Any:
    """A scalar, string or array metadata value, or `default` when the key is absent."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _required(reader: Any, key: str) -> Any:
    value = field_value(reader, key)
    if value is None:
        raise GGUFConversionError(f"GGUF metadata lacks {key!r}")
    return value


def _float32_as_decimal(value: float) -> float:
    # GGUF stores float32; 9.99999974e-06 should be written as the 1e-05 it was meant to be.
    return float(str(np.float32(value)))


def read_llama_shape(reader: Any) -> LlamaShape:
    arch = field_value(reader, "general.architecture")
    if arch != "llama":
        raise GGUFConversionError(f"expected a llama GGUF, got architecture {arch!r}")
    tokens = field_value(reader, "tokenizer.ggml.tokens") or []
    return LlamaShape(
        num_layers=int(_required(reader, "llama.block_count")),
        hidden_size=int(_required(reader, "llama.embedding_length")),
        intermediate_size=int(_required(reader, "llama.feed_forward_length")),
        num_heads=int(_required(reader, "llama.attention.head_count")),
        num_kv_heads=int(field_value(reader, "llama.attention.head_count_kv")
                         or _required(reader, "llama.attention.head_count")),
        vocab_size=int(field_value(reader, "llama.vocab_size") or len(tokens)),
        context_length=int(_required(reader, "llama.context_length")),
        rope_theta=_float32_as_decimal(field_value(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=_float32_as_decimal(
            _required(reader, "llama.attention.layer_norm_rms_epsilon")),
    )


def build_config(reader: Any, shape: LlamaShape) -> dict[str, Any]:
    """config.json for LlamaForCausalLM, with tied embeddings when the GGUF has no output."""
    tensor_names = {t.name for t in reader.tensors}
    bos = field_value(reader, "tokenizer.ggml.bos_token_id")
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    pad = field_value(reader, "tokenizer.ggml.padding_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.context_length,
        "mlp_bias": False,
        "num_attention_heads": shape.num_heads,
        "num_hidden_layers": shape.num_layers,
        "num_key_value_heads": shape.num_kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": shape.vocab_size,
    }


# GGUF tensor name suffix (after "blk.N.") -> Hugging Face name suffix (after "model.layers.N.").
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    prefix, _, rest = gguf_name.partition(".")
    layer, _, suffix = rest.partition(".")
    if prefix == "blk" and layer.isdigit() and suffix in _LAYER_TENSORS:
        return f"model.layers.{layer}.{_LAYER_TENSORS[suffix]}"
    raise GGUFConversionError(f"unexpected GGUF tensor {gguf_name!r}")


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation.

    llama.cpp stores each head's rows interleaved (pairs of rotary halves side by side);
    Hugging Face keeps the two halves as contiguous blocks. This restores the HF order.
    """
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return (weight.reshape(num_heads, head_dim // 2, 2, cols)
            .swapaxes(1, 2)
            .reshape(rows, cols))


def iter_hf_tensors(reader: Any, shape: LlamaShape) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF name, float32 array) for every tensor, dequantized and in HF layout."""
    from gguf import quants

    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        array = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        if name.endswith("self_attn.q_proj.weight"):
            array = unpermute_rotary(array, shape.num_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            array = unpermute_rotary(array, shape.num_kv_heads)
        yield name, np.ascontiguousarray(array)
