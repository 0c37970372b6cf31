"""Writes GPTQ and AWQ checkpoints the way AutoGPTQ / GPTQModel and AutoAWQ publish them, from an
unquantized one, together with the oracle: the same model with the dequantized weights dense.

Each decoder linear weight W [out, in] is quantized round-to-nearest per (group, output column)
with float16 scales, then packed into int32 words with explicit per-value shifts (independent of
the loader's vectorised unpacking):
- GPTQ: `qweight` int32 [in/pack, out] (pack = 32/bits consecutive input rows, low bits
  first), `qzeros` int32 [groups, out/pack] (consecutive output columns), `scales` fp16
  [groups, out], `g_idx` int32 [in] (always written, as AutoGPTQ does). With `desc_act`, rows
  are grouped along a random permutation (act-order): g_idx[perm[j]] = j // group_size.
  `checkpoint_format` "gptq" (v1) stores each zero point minus one, "gptq_v2" as is. Symmetric
  quantization uses the zero point 2^(bits-1) (so v1 4-bit qzeros read 0x77777777). v1 cannot
  store a zero point of 0 (AutoGPTQ's -1 spills into the neighbouring values), so asymmetric
  v1 zero points are kept >= 1.
- AWQ (GEMM): `qweight` int32 [in, out/8] and `qzeros` int32 [groups, out/8], each word
  holding 8 output columns in the order AWQ_ORDER; `scales` fp16 [groups, out].
Biases are stored in fp16 in both checkpoints, so the oracle has exactly the quantized model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from shard_server.weights import read_config

# Llama's decoder linears (an MoE expert's too), Phi-3's fused qkv_proj and gate_up_proj, and
# Mixtral's experts' w1 (gate), w3 (up) and w2 (down). MoE routers (`gate`) stay unquantized.
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj",
           "w1", "w2", "w3")  # fmt: skip
_INPUTS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up",
           "w1": "w13", "w3": "w13"}  # fmt: skip
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # written down here again, not imported: the writer is the check


def _words(columns: list[np.ndarray], bits: int) -> torch.Tensor:
    """Packs value arrays (value i of each word first in the list) into int32 words, low bits first."""
    word = np.zeros(columns[0].shape, dtype=np.uint64)
    for i, values in enumerate(columns):
        assert values.min() >= 0 and values.max() < 2**bits
        word |= values.astype(np.uint64) << np.uint64(i * bits)
    return torch.from_numpy(word.astype(np.uint32).view(np.int32).copy())


def pack_gptq_rows(values: np.ndarray, bits: int) -> torch.Tensor:
    """[in, out] -> [in/pack, out]: word r holds input rows r*pack .. r*pack + pack - 1."""
    pack = 32 // bits
    return _words([values[i::pack] for i in range(pack)], bits)


def pack_gptq_cols(values: np.ndarray, bits: int) -> torch.Tensor:
    """[groups, out] -> [groups, ceil(out/pack)]: word c holds output columns c*pack .. c*pack + pack - 1."""
    pack = 32 // bits
    padded = np.zeros((values.shape[0], -(-values.shape[1] // pack) * pack), dtype=values.dtype)
    padded[:, : values.shape[1]] = values
    return _words([padded[:, i::pack] for i in range(pack)], bits)


def pack_awq_cols(values: np.ndarray) -> torch.Tensor:
    """[rows, out] -> [rows, out/8]: value i of word c is column c*8 + AWQ_ORDER[i]."""
    return _words([values[:, AWQ_ORDER[i]::8] for i in range(8)], 4)


def quantize(weight: torch.Tensor, bits: int, group_size: int, sym: bool, g_idx: np.ndarray, min_zero: int = 0):
    """RTN per (group, column) of weight [in, out]: ints [in, out], zeros and fp16 scales [groups, out]."""
    maxq = 2**bits - 1
    groups = int(g_idx.max()) + 1
    w = weight.double().numpy()
    ints = np.zeros(w.shape, dtype=np.int64)
    zeros = np.zeros((groups, w.shape[1]), dtype=np.int64)
    scales = np.zeros((groups, w.shape[1]), dtype=np.float16)
    for g in range(groups):
        rows = np.nonzero(g_idx == g)[0]
        block = w[rows]
        if sym:
            scale = np.maximum(np.abs(block).max(0), 1e-6) / (2 ** (bits - 1) - 1)
            zero = np.full(w.shape[1], 2 ** (bits - 1))
        else:
            low, high = np.minimum(block.min(0), 0), np.maximum(block.max(0), 0)
            scale = np.maximum(high - low, 1e-6) / maxq
            zero = np.clip(np.round(-low / scale), min_zero, maxq)
        scales[g] = scale.astype(np.float16)
        scale16 = scales[g].astype(np.float64)
        ints[rows] = np.clip(np.round(block / scale16) + zero, 0, maxq)
        zeros[g] = zero
    dense = (ints - zeros[g_idx]) * scales[g_idx].astype(np.float32)  # the oracle, [in, out]
    return ints, zeros, scales, torch.from_numpy(dense.astype(np.float32))


def gptq_config(bits=4, group_size=128, desc_act=False, sym=True, checkpoint_format="gptq") -> dict:
    return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym,
            "damp_percent": 0.01, "true_sequential": True, "static_groups": False, "lm_head": False,
            "model_name_or_path": None, "model_file_base_name": "model", "checkpoint_format": checkpoint_format}  # fmt: skip


def awq_config(group_size=128) -> dict:
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": None}  # fmt: skip


def write_packed_checkpoint(
    source: Path, target: Path, quantization: dict, seed: int = 0, oracle: bool = True
) -> tuple[Path, Path | None]:
    """Writes `target` (quantized as `quantization` declares) and, with `oracle`, `target`-oracle
    (dense, dequantized); returns both directories (None for an oracle not written)."""
    method, bits, group_size = quantization["quant_method"], quantization["bits"], quantization["group_size"]
    sym = quantization.get("sym", False) if method == "gptq" else False
    v1 = method == "gptq" and quantization.get("checkpoint_format", "gptq") == "gptq"
    rng = np.random.default_rng(seed)
    packed, dense, orders = {}, {}, {}
    for name, tensor in load_file(str(Path(source) / "model.safetensors")).items():
        parts = name.split(".")
        if parts[-1] == "bias" and parts[-2] in LINEARS:
            packed[name] = dense[name] = tensor.half()
            continue
        if not (parts[-1] == "weight" and parts[-2] in LINEARS):
            packed[name] = dense[name] = tensor
            continue
        prefix, (out_features, in_features) = name[: -len(".weight")], tensor.shape
        rows = np.arange(in_features)
        if quantization.get("desc_act"):
            # One act order per input: GPTQ orders by the Hessian of the layer's input, which
            # q/k/v (and gate/up) share, so their g_idx are equal.
            shared = prefix.rsplit(".", 1)[0] + "." + _INPUTS.get(parts[-2], parts[-2])
            if shared not in orders:
                orders[shared] = np.argsort(rng.permutation(in_features))  # [k]: position of input k
            rows = orders[shared]
        g_idx = np.zeros(in_features, dtype=np.int64) if group_size == -1 else rows // group_size
        ints, zeros, scales, weight = quantize(tensor.t(), bits, group_size, sym, g_idx, min_zero=1 if v1 else 0)
        dense[name] = weight.t().contiguous()
        packed[f"{prefix}.scales"] = torch.from_numpy(scales)
        if method == "gptq":
            packed[f"{prefix}.qweight"] = pack_gptq_rows(ints, bits)
            packed[f"{prefix}.qzeros"] = pack_gptq_cols(zeros - (1 if v1 else 0), bits)
            packed[f"{prefix}.g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
        else:
            packed[f"{prefix}.qweight"] = pack_awq_cols(ints)
            packed[f"{prefix}.qzeros"] = pack_awq_cols(zeros)
    config = read_config(source)
    oracle_dir = Path(f"{target}-oracle") if oracle else None
    for directory, tensors, extra in ((target, packed, {"quantization_config": quantization}), (oracle_dir, dense, {})):
        if directory is None:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(directory / "model.safetensors"))
        (directory / "config.json").write_text(json.dumps({**config, **extra}))
    return target, oracle_dir


def edit_checkpoint(directory: Path, edit=None, config_edit=None) -> None:
    """Rewrites a checkpoint in place: `edit(tensors)` and `config_edit(quantization_config)` mutate."""
    if edit is not None:
        tensors = load_file(str(directory / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(directory / "model.safetensors"))
    if config_edit is not None:
        config = read_config(directory)
        config_edit(config["quantization_config"])
        (directory / "config.json").write_text(json.dumps(config))


def damaged_copy(source: Path, target: Path, edit=None, config_edit=None) -> Path:
    """A copy of checkpoint `source` at `target`, rewritten by `edit_checkpoint(target, edit, config_edit)`."""
    import shutil

    shutil.copytree(source, target)
    edit_checkpoint(target, edit, config_edit)
    return target
