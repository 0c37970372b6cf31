"""Build tokenizer.json, tokenizer_config.json and generation_config.json from GGUF metadata.

The tokenizer is written directly as `tokenizers` JSON (no transformers needed). It restores
the `Digits(individual_digits=true)` pre-tokenizer step that GGUF files do not record but the
original Hub tokenizer has: without it, whitespace before a digit tokenizes differently.
"""

from __future__ import annotations

from typing import Any

from .gguf_weights import GGUFConversionError, field_value

# llama.cpp token types (gguf.TokenType): which ones become added tokens.
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4


def _token_list(reader: Any) -> list[str]:
    if field_value(reader, "tokenizer.ggml.model") != "gpt2":
        raise GGUFConversionError("only byte-level BPE ('gpt2') GGUF tokenizers are supported")
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFConversionError("GGUF metadata has no tokenizer.ggml.tokens")
    return tokens


def _added_tokens(reader: Any, tokens: list[str]) -> list[dict[str, Any]]:
    types = field_value(reader, "tokenizer.ggml.token_type") or []
    added = []
    for token_id, token_type in enumerate(types):
        if token_type not in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED):
            continue
        special = token_type == _TOKEN_TYPE_CONTROL
        added.append({
            "id": token_id,
            "content": tokens[token_id],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": not special,
            "special": special,
        })
    return added


def build_tokenizer_json(reader: Any) -> dict[str, Any]:
    tokens = _token_list(reader)
    merges = field_value(reader, "tokenizer.ggml.merges") or []
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(reader, tokens),
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", **byte_level},
            ],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {token: token_id for token_id, token in enumerate(tokens)},
            "merges": list(merges),
        },
    }


def _token_at(tokens: list[str], reader: Any, key: str) -> str | None:
    token_id = field_value(reader, key)
    if token_id is None:
        return None
    if not 0 <= token_id < len(tokens):
        raise GGUFConversionError(f"{key}={token_id} is outside the vocabulary")
    return tokens[token_id]


def build_tokenizer_config(reader: Any, added_tokens: list[dict[str, Any]]) -> dict[str, Any]:
    """tokenizer_config.json with the chat template and special tokens written explicitly."""
    tokens = _token_list(reader)
    bos = _token_at(tokens, reader, "tokenizer.ggml.bos_token_id")
    eos = _token_at(tokens, reader, "tokenizer.ggml.eos_token_id")
    config: dict[str, Any] = {
        "add_bos_token": bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(field_value(reader, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": bool(field_value(reader, "tokenizer.ggml.add_space_prefix", False)),
        "added_tokens_decoder": {
            str(token["id"]): {k: v for k, v in token.items() if k != "id"}
            for token in added_tokens
        },
        "additional_special_tokens": [t for t in dict.fromkeys([bos, eos]) if t is not None],
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": _token_at(tokens, reader, "tokenizer.ggml.padding_token_id"),
        "unk_token": _token_at(tokens, reader, "tokenizer.ggml.unknown_token_id"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(field_value(reader, "llama.context_length")),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    template = field_value(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config


def build_generation_config(reader: Any) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name, key in (("bos_token_id", "tokenizer.ggml.bos_token_id"),
                      ("eos_token_id", "tokenizer.ggml.eos_token_id"),
                      ("pad_token_id", "tokenizer.ggml.padding_token_id")):
        value = field_value(reader, key)
        if value is not None:
            config[name] = int(value)
    return config
