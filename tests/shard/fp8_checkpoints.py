"""Writes fp8 checkpoints the way quantization tools publish them, from an unquantized one."""

import json

import torch

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


def _block_quantize(w, block, gen):
    """Stacked w [E, out, in] in e4m3 per [bn, bk] block, as a block-wise fp8 checkpoint stores
    each expert weight: (q, scales [E, ceil(out/bn), ceil(in/bk)], the float32 dequantized w).
    Each block is first multiplied by its own 2^U(-3, 3), so the scales differ up to 64x between
    blocks and a scale taken from a wrong block is far off."""
    (bn, bk), (experts, out, inputs) = block, w.shape
    row_blocks, col_blocks = -(-out // bn), -(-inputs // bk)

    def expand(per_block):
        return per_block.repeat_interleave(bn, 1)[:, :out].repeat_interleave(bk, 2)[:, :, :inputs]

    factor = 2 ** (torch.rand(experts, row_blocks, col_blocks, generator=gen) * 6 - 3)
    w = w.float() * expand(factor.to(w.device))
    padded = torch.nn.functional.pad(w.abs(), (0, col_blocks * bk - inputs, 0, row_blocks * bn - out))
    scales = padded.view(experts, row_blocks, bn, col_blocks, bk).amax(dim=(2, 4)).clamp(min=1e-6) / FP8_MAX
    q = (w / expand(scales)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scales, q.float() * expand(scales)


def block_fp8_experts(w13, w2, block, first=0, inter=None, seed=0):
    """A rank's slice of block-wise fp8 experts: w13 [E, 2F, H] (gate rows, then up) and w2
    [E, H, F] are quantized as a checkpoint stores them (gate, up and down each a weight with its
    own blocks), then intermediate rows [first, first + inter) are kept with the scale blocks they
    touch. Returns (q13, q2, ExpertScales, dense13, dense2), dense: the slice dequantized element
    by element from the whole weights (the oracle)."""
    gen = torch.Generator().manual_seed(seed)
    (bn, bk), full = block, w2.shape[2]
    inter = full - first if inter is None else inter
    (q_gate, s_gate, d_gate), (q_up, s_up, d_up) = (_block_quantize(h, block, gen) for h in w13.chunk(2, dim=1))
    q2, s2, d2 = _block_quantize(w2, block, gen)
    rows, scale_rows = slice(first, first + inter), slice(first // bn, -(-(first + inter) // bn))
    cols, scale_cols = slice(first, first + inter), slice(first // bk, -(-(first + inter) // bk))
    device = w13.device
    scales = ExpertScales(torch.cat([s_gate[:, scale_rows], s_up[:, scale_rows]], 1).to(device),
                          s2[:, :, scale_cols].contiguous().to(device), block, first)  # fmt: skip
    q13 = torch.cat([q_gate[:, rows], q_up[:, rows]], 1).to(device)
    dense13 = torch.cat([d_gate[:, rows], d_up[:, rows]], 1).to(device)
    return q13, q2[:, :, cols].contiguous().to(device), scales, dense13, d2[:, :, cols].contiguous().to(device)
