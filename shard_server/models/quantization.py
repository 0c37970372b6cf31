"""Which quantized checkpoints textgen loads, from config.json's `quantization_config`.

Loaded: fp8 (e4m3) weights with one scale per tensor or per output channel and dynamic
activations, the layout `--quantize fp8` produces at load, as written by
- compressed-tensors (`float-quantized` / `naive-quantized`, weights `strategy` tensor or channel),
- fbgemm_fp8 (per-channel scales),
- `quant_method: fp8` without `weight_block_size`.
Their `weight_scale` tensors fill the per-row scales exactly; static `input_scale`s are not read
(activations are quantized per token at run time). Every other method is refused by name.
"""

from __future__ import annotations

from .errors import UnsupportedModelError

_FLOAT_FORMATS = ("float-quantized", "naive-quantized")


def checkpoint_quantization(raw: dict) -> str | None:
    """"fp8" for a loadable fp8 checkpoint, None for an unquantized one; raises for the rest."""
    config = raw.get("quantization_config")
    if not config:
        return None
    method = config.get("quant_method", "unknown")
    if method == "fbgemm_fp8":
        return "fp8"
    if method == "fp8":
        if config.get("weight_block_size"):
            raise _refused(method, "block-wise fp8 scales (weight_block_size) are not loaded")
        return "fp8"
    if method == "compressed-tensors":
        _check_compressed_tensors(config)
        return "fp8"
    raise _refused(method, "only fp8 checkpoints load")


def _check_compressed_tensors(config: dict) -> None:
    if config.get("format") not in _FLOAT_FORMATS:
        raise _refused("compressed-tensors", f"format {config.get('format')!r} is not fp8")
    for name, group in (config.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        kind = (weights.get("type"), weights.get("num_bits"), weights.get("strategy"))
        if kind[:2] != ("float", 8) or kind[2] not in ("tensor", "channel"):
            raise _refused("compressed-tensors", f"group {name!r} has weights {kind}; fp8 per tensor or channel loads")
        activations = group.get("input_activations") or {}
        if activations and activations.get("type", "float") != "float":
            raise _refused("compressed-tensors", f"group {name!r} quantizes activations to {activations.get('type')}")


def _refused(method: str, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"the checkpoint is pre-quantized ({method!r}): {why}; serve a bf16/fp16 checkpoint, with "
        "--quantize fp8 for fp8 weights"
    )
