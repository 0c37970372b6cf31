"""Quantizes the demo model (SmolLM2-135M-Instruct, fp32) into a servable checkpoint directory in
one of the Hub formats the shard loads, by round-to-nearest (RTN: no calibration data, no GPTQ
error correction, no AWQ scale search), with the writers of int4_checkpoints.py and
quantized_checkpoints.py. The directory is what `--model-id` takes: config.json with its
`quantization_config`, model.safetensors, and the demo model's tokenizer files.

    python -m tests.shard.quantize_demo_model OUT_DIR --method gptq
    textgen-launcher --model-id OUT_DIR

Methods (METHODS): gptq (4-bit, group 128, symmetric, v1 zero points, as AutoGPTQ's default),
awq (4-bit GEMM, group 128, zero points), w4a16 and w8a16 (compressed-tensors pack-quantized,
group 128, symmetric), w8a8 (compressed-tensors int-quantized: per-channel int8 weights, dynamic
per-token int8 activations), fp8-block (128x128 `weight_scale_inv`, DeepSeek / Qwen3-FP8 style).
Writing one takes 3-7 s on two cores.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from .int4_checkpoints import awq_config, gptq_config, write_packed_checkpoint
from .quantized_checkpoints import (
    block_fp8_config,
    int8_config,
    pack_quantized_config,
    write_quantized_checkpoint,
)

METHODS = {
    "gptq": (write_packed_checkpoint, gptq_config(4, 128, sym=True)),
    "awq": (write_packed_checkpoint, awq_config(128)),
    "w4a16": (write_quantized_checkpoint, pack_quantized_config(4, 128, symmetric=True)),
    "w8a16": (write_quantized_checkpoint, pack_quantized_config(8, 128, symmetric=True)),
    "w8a8": (write_quantized_checkpoint, int8_config(activations=True)),
    "fp8-block": (write_quantized_checkpoint, block_fp8_config((128, 128))),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")


def quantize_demo_model(target: Path, method: str, source: Path | None = None) -> Path:
    """Writes the demo model (or `source`, an unquantized single-file checkpoint) quantized by `method`."""
    if source is None:
        from launcher.demo_model import ensure_demo_model

        source = ensure_demo_model()
    writer, quantization = METHODS[method]
    target = Path(target)
    writer(Path(source), target, quantization, oracle=False)
    for name in TOKENIZER_FILES:
        if (Path(source) / name).exists():
            shutil.copy(Path(source) / name, target / name)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--method", choices=sorted(METHODS), required=True)
    parser.add_argument("--source", type=Path, default=None, help="an unquantized model directory (default: the demo model)")
    args = parser.parse_args(argv)
    print(quantize_demo_model(args.out_dir, args.method, args.source))


if __name__ == "__main__":
    main()
