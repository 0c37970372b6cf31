"""Writes compressed-tensors integer and block-wise fp8 checkpoints the way llm-compressor and
DeepSeek / Qwen publish them, from an unquantized one, together with the oracle: the same model
with the dequantized weights stored dense in float32.

Each decoder linear weight W [out, in] (y = x @ W^T) becomes, by round-to-nearest:
- compressed-tensors `pack-quantized` (W4A16 / W8A16, llm-compressor's `PackedQuantizationCompressor`):
  signed ints q in [-2^(bits-1), 2^(bits-1)) per (output row, group of input columns) with
  scales in bfloat16 (the model dtype llm-compressor keeps), symmetric (zero point 0, scale
  absmax / 2^(bits-1) as its minmax observer) or not (a signed zero point per group);
  `weight_packed` int32 [out, ceil(in/pack)]: q + 2^(bits-1), `pack` consecutive input columns
  per word, low bits first (compressed-tensors' `pack_to_int32`); `weight_zero_point` (asymmetric
  only) the zero points + 2^(bits-1) packed the same way along the output rows, int32
  [ceil(out/pack), groups]; `weight_scale` bf16 [out, groups]; `weight_shape` int64 [out, in];
  with `actorder: group`, `weight_g_idx` int32 [in]: the group of each input column, along a
  random permutation shared by the projections of one input.
- compressed-tensors `int-quantized` (W8A8): `weight` int8 [out, in], `weight_scale` bf16
  [out, 1] = absmax / 127, `weight_zero_point` int8 [out, 1] of zeros (as the compressor saves it).
- block-wise fp8 (`quant_method: fp8`, DeepSeek-V3 / Qwen3-FP8): `weight` e4m3 [out, in],
  `weight_scale_inv` float32 [ceil(out/bn), ceil(in/bk)] = block absmax / 448.
Packing uses explicit per-value shifts (int4_checkpoints._words), independent of the loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from shard_server.weights import read_config

from .int4_checkpoints import _INPUTS, LINEARS, _words, write_packed_checkpoint

FP8_MAX = 448.0


def pack_ct_cols(values: np.ndarray, bits: int) -> torch.Tensor:
    """[rows, cols] unsigned values -> [rows, ceil(cols/pack)] int32: word c holds columns c*pack .. c*pack + pack - 1."""
    pack = 32 // bits
    padded = np.zeros((values.shape[0], -(-values.shape[1] // pack) * pack), dtype=np.int64)
    padded[:, : values.shape[1]] = values
    return _words([padded[:, i::pack] for i in range(pack)], bits)


def pack_ct_rows(values: np.ndarray, bits: int) -> torch.Tensor:
    """[rows, cols] -> [ceil(rows/pack), cols] int32 (compressed-tensors' packed_dim=0, for zero points)."""
    return pack_ct_cols(values.T, bits).t().contiguous()


def pack_quantized_config(bits=4, group_size=128, symmetric=True, actorder=None) -> dict:
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": "group" if group_size else "channel",
               "group_size": group_size, "block_structure": None, "dynamic": False, "actorder": actorder,
               "observer": "minmax", "observer_kwargs": {}}  # fmt: skip
    return _ct_config("pack-quantized", {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                         "output_activations": None})  # fmt: skip


def int8_config(activations=True) -> dict:
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "group_size": None,
               "block_structure": None, "dynamic": False, "actorder": None, "observer": "minmax", "observer_kwargs": {}}  # fmt: skip
    inputs = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True, "group_size": None,
              "block_structure": None, "actorder": None, "observer": None, "observer_kwargs": {}}  # fmt: skip
    return _ct_config("int-quantized", {"targets": ["Linear"], "weights": weights,
                                        "input_activations": inputs if activations else None,
                                        "output_activations": None})  # fmt: skip


def _ct_config(fmt: str, group: dict) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "quantization_status": "compressed",
            "global_compression_ratio": None, "sparsity_config": {}, "version": "0.9.4"}  # fmt: skip


def block_fp8_config(block=(128, 128)) -> dict:
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}


def quantize_groups(weight: torch.Tensor, bits: int, group_size: int | None, symmetric: bool, g_idx=None):
    """RTN of W [out, in] per (row, input group): signed q [out, in], signed zp and bf16 scales
    [out, groups], and the float32 dequantized weight. Column k is in group g_idx[k] (default k // group_size)."""
    w = weight.double().numpy()
    out, inputs = w.shape
    size = group_size or inputs
    columns = np.arange(inputs) // size if g_idx is None else g_idx
    groups = -(-inputs // size)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    q = np.zeros(w.shape, dtype=np.int64)
    zp = np.zeros((out, groups), dtype=np.int64)
    scales = torch.zeros((out, groups), dtype=torch.bfloat16)
    for g in range(groups):
        members = np.nonzero(columns == g)[0]
        block = w[:, members]
        if symmetric:
            scale, zero = np.maximum(np.abs(block).max(1), 1e-6) / ((qmax - qmin) / 2), np.zeros(out)
        else:
            low, high = np.minimum(block.min(1), 0), np.maximum(block.max(1), 0)
            scale = np.maximum(high - low, 1e-6) / (qmax - qmin)
            zero = np.clip(np.round(qmin - low / scale), qmin, qmax)
        scales[:, g] = torch.from_numpy(scale).to(torch.bfloat16)
        scale16 = scales[:, g].double().numpy()
        q[:, members] = np.clip(np.round(block / scale16[:, None]) + zero[:, None], qmin, qmax)
        zp[:, g] = zero
    dense = (q - zp[:, columns]) * scales.double().numpy()[:, columns]
    return q, zp, scales, torch.from_numpy(dense.astype(np.float32))


def _pack_quantized(prefix, tensor, weights: dict, packed: dict, orders: dict, rng) -> torch.Tensor:
    bits, symmetric = weights["num_bits"], weights["symmetric"]
    group_size = weights["group_size"] if weights["strategy"] == "group" else None
    g_idx = None
    if weights.get("actorder") == "group":
        # GPTQ's activation order: columns are grouped along a permutation of the layer's input,
        # which q/k/v (and gate/up) share, so their weight_g_idx are equal.
        shared = prefix.rsplit(".", 1)[0] + "." + _INPUTS.get(prefix.rsplit(".", 1)[1], prefix)
        if shared not in orders:
            orders[shared] = np.argsort(rng.permutation(tensor.shape[1])) // group_size
        g_idx = orders[shared]
        packed[f"{prefix}.weight_g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
    q, zp, scales, dense = quantize_groups(tensor, bits, group_size, symmetric, g_idx)
    offset = 2 ** (bits - 1)
    packed[f"{prefix}.weight_packed"] = pack_ct_cols(q + offset, bits)
    packed[f"{prefix}.weight_scale"] = scales
    packed[f"{prefix}.weight_shape"] = torch.tensor(list(tensor.shape), dtype=torch.int64)
    if not symmetric:
        packed[f"{prefix}.weight_zero_point"] = pack_ct_rows(zp + offset, bits)
    return dense


def _int8(prefix, tensor, packed: dict) -> torch.Tensor:
    w = tensor.double()
    scale = (w.abs().amax(dim=1, keepdim=True).clamp(min=1e-6) / 127).to(torch.bfloat16)
    q = torch.round(w / scale.double()).clamp(-128, 127).to(torch.int8)
    packed[f"{prefix}.weight"] = q
    packed[f"{prefix}.weight_scale"] = scale
    packed[f"{prefix}.weight_zero_point"] = torch.zeros_like(q[:, :1])
    return (q.double() * scale.double()).float()


def _block_fp8(prefix, tensor, block, packed: dict, scale_name="weight_scale_inv") -> torch.Tensor:
    bn, bk = block
    out, inputs = tensor.shape
    scales = torch.zeros((-(-out // bn), -(-inputs // bk)), dtype=torch.float32)
    quantized = torch.zeros(tensor.shape, dtype=torch.float8_e4m3fn)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            piece = tensor[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].float()
            scales[i, j] = piece.abs().max().clamp(min=1e-6) / FP8_MAX
            quantized[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (piece / scales[i, j]).clamp(-FP8_MAX, FP8_MAX).to(
                torch.float8_e4m3fn
            )
    packed[f"{prefix}.weight"], packed[f"{prefix}.{scale_name}"] = quantized, scales
    rows, cols = torch.arange(out) // bn, torch.arange(inputs) // bk
    return (quantized.float() * scales[rows][:, cols]).float()


def write_quantized_checkpoint(
    source: Path, target: Path, quantization: dict, seed: int = 0, oracle: bool = True,
    linears: tuple[str, ...] = LINEARS,
) -> tuple[Path, Path | None]:  # fmt: skip
    """Writes `target` (the weights of `linears` quantized as `quantization` declares) and, with
    `oracle`, `target`-oracle (dense, dequantized); returns both directories (None for an oracle
    not written)."""
    packed, dense, orders, rng = {}, {}, {}, np.random.default_rng(seed)
    fmt = quantization.get("format")
    group = next(iter((quantization.get("config_groups") or {"": {}}).values()))
    for name, tensor in load_file(str(Path(source) / "model.safetensors")).items():
        parts = name.split(".")
        if not (parts[-1] == "weight" and parts[-2] in linears):
            packed[name] = dense[name] = tensor
            continue
        prefix = name[: -len(".weight")]
        if quantization["quant_method"] == "fp8":
            weight = _block_fp8(prefix, tensor, quantization["weight_block_size"], packed)
        elif fmt == "pack-quantized":
            weight = _pack_quantized(prefix, tensor, group["weights"], packed, orders, rng)
        elif fmt == "int-quantized":
            weight = _int8(prefix, tensor, packed)
        elif fmt == "float-quantized":  # compressed-tensors' block strategy
            weight = _block_fp8(prefix, tensor, group["weights"]["block_structure"], packed, "weight_scale")
        else:
            raise ValueError(f"no writer for {quantization}")
        dense[name] = weight.contiguous()
    config = read_config(source)
    oracle_dir = Path(f"{target}-oracle") if oracle else None
    for directory, tensors, extra in ((target, packed, {"quantization_config": quantization}), (oracle_dir, dense, {})):
        if directory is None:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(directory / "model.safetensors"))
        (directory / "config.json").write_text(json.dumps({**config, **extra}))
    return target, oracle_dir


def block_fp8_ct_config(block=(128, 128)) -> dict:
    """compressed-tensors' block-wise fp8 (llm-compressor FP8_BLOCK): `weight_scale` in the block layout."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block", "block_structure": list(block),
               "dynamic": False, "group_size": None, "actorder": None, "observer": "minmax", "observer_kwargs": {}}  # fmt: skip
    inputs = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "group_size": 128,
              "dynamic": True, "observer": None}  # fmt: skip
    return _ct_config("float-quantized", {"targets": ["Linear"], "weights": weights, "input_activations": inputs,
                                          "output_activations": None})  # fmt: skip


def write_family_checkpoints(tmp_path_factory, families, make_model, formats: dict) -> dict:
    """{(family, format name): (quantized dir, oracle dir)}: each family's tiny model
    (`make_model(family, directory)`) written in each of `formats` (GPTQ / AWQ, or compressed-tensors)."""
    written = {}
    for family in families:
        source = tmp_path_factory.mktemp(family)
        make_model(family, source)
        for index, (name, quantization) in enumerate(formats.items()):
            compressed = quantization["quant_method"] == "compressed-tensors"
            write = write_quantized_checkpoint if compressed else write_packed_checkpoint
            written[family, name] = write(source, tmp_path_factory.mktemp("packed") / f"{family}-{name}", quantization,
                                          seed=index)  # fmt: skip
    return written
