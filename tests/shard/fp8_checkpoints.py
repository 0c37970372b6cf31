"""Writes fp8 checkpoints the way quantization tools publish them, from an unquantized one."""

import json

from safetensors.torch import load_file, save_file

from shard_server.kernels.fp8_matmul import FP8, FP8_MAX, quantize_rows_reference
from shard_server.kernels.fused_moe import ExpertScales
from shard_server.weights import read_config

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")  # w*: Mixtral's experts
COMPRESSED_TENSORS = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                      "config_groups": {"group_0": {"targets": ["Linear"],
                                                    "weights": {"type": "float", "num_bits": 8, "strategy": "channel"},
                                                    "input_activations": {"type": "float", "num_bits": 8,
                                                                          "dynamic": True, "strategy": "token"}}}}  # fmt: skip


def write_fp8_checkpoint(source, target, per_tensor: bool = False, quantization=COMPRESSED_TENSORS):
    """The source checkpoint with every decoder linear weight stored in e4m3 and its `weight_scale`
    (one per output channel, or one per tensor)."""
    tensors = {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEARS:
            if per_tensor:
                scale = (tensor.float().abs().max() / FP8_MAX).reshape(1)
                quantized = (tensor.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            else:
                quantized, scale = quantize_rows_reference(tensor)
            tensors[name], tensors[name + "_scale"] = quantized, scale
        else:
            tensors[name] = tensor
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"))
    config = {**read_config(source), "quantization_config": quantization}
    (target / "config.json").write_text(json.dumps(config))
    return target


def fp8_experts(w13, w2):
    """Stacked experts in e4m3 with a scale per row, as --quantize fp8 stores them: (w13, w2, scales)."""
    (q13, s13), (q2, s2) = (quantize_rows_reference(w.reshape(-1, w.shape[-1])) for w in (w13, w2))
    experts = w13.shape[0]
    return q13.view(w13.shape), q2.view(w2.shape), ExpertScales(s13.view(experts, -1), s2.view(experts, -1))
