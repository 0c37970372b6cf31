"""How long the shard takes to load a packed 4-bit checkpoint (GPTQ, AWQ), on the CPU.

A random checkpoint of a bench/gpu_model.py shape is written once into --work (Hub layout,
bench/gpu_model.py's `write_random_llama` on the CPU), then `build_model` loads it onto the CPU
(the triton backend's layers, bf16), timed, --repeats times. The load reads every tensor and
puts each linear in PackedWeight's layout (shard_server/layers/int4.py), so its time is the host
work a GPU start pays too, before the weights are copied over.

    python3 bench/cpu_packed_load.py OUT_JSON [--shape 1b] [--checkpoints gptq,awq] [--tokenizer-dir T]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_model import SHAPES, write_random_llama  # noqa: E402
from bench.gpu_vs_transformers import TEXT_VOCAB  # noqa: E402
from shard_server.distributed import ParallelContext  # noqa: E402
from shard_server.models.config import ModelConfig  # noqa: E402
from shard_server.models.registry import build_model  # noqa: E402
from shard_server.weights import WeightStore, read_config  # noqa: E402


def load_seconds(directory: Path) -> float:
    config = ModelConfig.from_dict(read_config(directory))
    started = time.perf_counter()
    with WeightStore(directory) as store:
        build_model(config, store, ParallelContext(), "triton", torch.bfloat16, torch.device("cpu"))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    parser.add_argument("--checkpoints", default="gptq,awq")
    parser.add_argument("--tokenizer-dir", type=Path, default=Path(".gpurun/tokenizer"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/packed-load"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {"shape": args.shape, "threads": torch.get_num_threads(), "load_s": {}}
    for checkpoint in args.checkpoints.split(","):
        directory = args.work / f"{args.shape}-{checkpoint}"
        if not (directory / "config.json").exists():
            write_random_llama(directory, args.tokenizer_dir, TEXT_VOCAB, shape=SHAPES[args.shape], device="cpu",
                               checkpoint=checkpoint)  # fmt: skip
        times = [load_seconds(directory) for _ in range(args.repeats)]
        results["load_s"][checkpoint] = {"min": min(times), "all": times}
        print(f"{checkpoint}: load {min(times):.2f} s (best of {args.repeats})", flush=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
