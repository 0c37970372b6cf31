"""The seed benchmark: the published framework comparisons' four scenarios on textgen.

Writes a Llama-shaped model with seeded random weights (bench/gpu_model.py), measures the
device's copy bandwidth and matmul rate, starts the full stack (launcher → router → one shard
per device) and drives it over HTTP:
  1. single-sequence decode tokens/s;
  2. 128 concurrent streams, output tokens/s;
  3. the 7:3 mix of short (128 in / 128 out) and long (2048 in / 512 out) requests;
  4. TTFT p50/p99 of 2,048-token prompts arriving open-loop at a fixed rate.
Each figure is set beside its roofline (bench/seed_roofline.py) and the published figures
(Llama-3-70B, TP=4, H100, FP8) in OUT/NAME.{json,md} (NAME: --name, default seed_benchmark).

CPU harness validation (about 25 s; not a performance result), as committed in bench/results:

    python bench/seed_benchmark.py --shape tiny --device cpu --dtype float32 --scale 0.05 \\
        --num-shard 2 --ttft-rate 4 --max-shard-gb 0.005 --out bench/results --name seed_benchmark_cpu_tiny

On 4×H200 (TP=4), the issue's setup. The 70B bf16 weights are 141 GB (8 files of <= 20 GB;
the writer holds one file, about twice over while safetensors serializes it, in host memory):
write them once to a disk with room (the 4-GPU machine has 235 GiB) in one device call, then
run in a second call, which reuses the complete model directory (a call is limited to 10 min):

    python bench/seed_benchmark.py --shape 70b --model-dir /tmp/llama70b-random --prepare-only --out OUT
    python bench/seed_benchmark.py --shape 70b --num-shard 4 --model-dir /tmp/llama70b-random \\
        --out OUT --name seed_benchmark_h200x4_tp4

On 2×H200 (TP=2, small KV pool): each GPU holds 70.5 GB of weights, leaving about 50 GB of
its 141 GB for the KV pool after activations and CUDA graphs. The 70B's KV is 320 KiB per token
in bf16 (160 KiB per GPU at TP=2), so the pool holds roughly 300k tokens; the mix at scale 1
needs about 190k at once (check the shard log's KV pool line; the scheduler preempts rather
than fails when it runs out). That machine's disk is 128 GiB, smaller than the 131 GiB of
weights, but its /dev/shm is a 256 GB tmpfs (checked with `df -h /dev/shm` on 2026-11-30):
write the whole model there (154 s), then run on the same machine before tmpfs is lost
(results: bench/results/seed_benchmark_h200x2_tp2.md):

    python bench/seed_benchmark.py --shape 70b --model-dir /dev/shm/llama70b-random --prepare-only --out OUT
    python bench/seed_benchmark.py --shape 70b --num-shard 2 --model-dir /dev/shm/llama70b-random \\
        --out OUT --name seed_benchmark_h200x2_tp2

Where tmpfs is smaller, `--spill-dir DIR --disk-budget-gb N` writes the shards past N GB to
DIR and symlinks them into the model directory.

Add `--scale 0.25` for a first, shorter pass. On the GPU machine without an installed
textgen, pass --router-binary (a router built on the build machine) and run from the
repository root with PYTHONPATH=. ; the launcher and shard then run from the source tree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration_tests"))

from bench import gpu_model, seed_report, seed_scenarios  # noqa: E402
from bench.gpu_http_load import streams  # noqa: E402
from bench.gpu_vs_transformers import SERVER_FLAGS, TEXT_VOCAB, Prompts, start_server  # noqa: E402
from bench.seed_roofline import Ceilings, ModelCost  # noqa: E402

DTYPES = ("bfloat16", "float16", "float32")
SCENARIOS = ("single_decode", "concurrent_streams", "mixed_load", "ttft_at_rate")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(gpu_model.SHAPES), default="70b")
    parser.add_argument("--num-shard", type=int, default=1, help="tensor-parallel degree, passed to the launcher")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every count and length (0, 1]")
    parser.add_argument("--ttft-rate", type=float, default=2.0, help="requests/s of the TTFT scenario")
    parser.add_argument("--poisson", action="store_true", help="exponential TTFT arrival gaps, same mean rate")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT/NAME.{json,md}")
    parser.add_argument("--name", default="seed_benchmark", help="file name stem of the report")
    parser.add_argument("--model-dir", type=Path, help="default: /tmp/textgen-seed-SHAPE-DTYPE")
    parser.add_argument("--max-shard-gb", type=float, default=gpu_model.DEFAULT_MAX_SHARD_BYTES / 1e9,
                        help="largest weight file written (the 8B stays one file at the default)")
    gpu_model.add_spill_options(parser)
    parser.add_argument("--tokenizer-dir", type=Path, help="default: the demo model's snapshot")
    parser.add_argument("--router-binary", type=Path, default=_installed_router())
    parser.add_argument("--server-flag", action="append", default=[], help="extra launcher flag (repeatable)")
    parser.add_argument("--startup-timeout", type=float, default=1800.0)
    parser.add_argument("--prepare-only", action="store_true",
                        help="write the model and exit (one device call for the 141 GB write, one for the run)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="a comma-separated subset")
    args = parser.parse_args(argv)
    if args.num_shard < 1:
        parser.error("--num-shard must be >= 1")
    args.spill = gpu_model.spill_from(args, parser)
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown --scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    if not args.ttft_rate > 0:
        parser.error("--ttft-rate must be positive")
    try:
        args.sizes = seed_scenarios.Sizes.scaled(args.scale)
    except ValueError as exc:
        parser.error(str(exc))
    args.model_dir = args.model_dir or Path(tempfile.gettempdir()) / f"textgen-seed-{args.shape}-{args.dtype}"
    return args


def _installed_router() -> Path:
    beside = Path(sys.executable).parent / "textgen-router"
    return beside if beside.exists() else Path("router/target/release/textgen-router")


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def in_child(fn, *args, isolate: bool):
    """Runs fn in a fresh process when `isolate` (on the GPU: its cached allocations and CUDA
    context are then gone before the shards measure free memory), else inline."""
    if not isolate:
        return fn(*args)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def measure_ceilings(device: str, dtype: str, num_shard: int) -> dict:
    cpu = device == "cpu"  # smaller problems: the CPU is shared and slow, the figures still hold
    copy = gpu_model.copy_bandwidth_bytes_per_s(256 << 20 if cpu else 4 << 30, device=device)
    matmul = gpu_model.bf16_matmul_flops_per_s(1024 if cpu else 8192, device=device, dtype=_torch_dtype(dtype))
    return {"copy_bytes_per_s": copy, "matmul_flops_per_s": matmul, "device": device, "dtype": dtype,
            "device_name": device_name(device, num_shard)}  # fmt: skip


def prepare_model(device: str, args) -> dict:
    """Reuses a complete model of the same shape and dtype, else writes one."""
    expected = dict(gpu_model.SHAPES[args.shape], torch_dtype=args.dtype)
    config = args.model_dir / "config.json"
    started = time.perf_counter()
    reused = config.exists() and json.loads(config.read_text()) == expected
    if reused:
        params = sum(spec.numel for spec in gpu_model.tensor_specs(expected))
    else:
        params = gpu_model.write_random_llama(args.model_dir, args.tokenizer_dir, TEXT_VOCAB, shape=expected,
                                              device=args.device, dtype=_torch_dtype(args.dtype), spill=args.spill,
                                              max_shard_bytes=int(args.max_shard_gb * 1e9))  # fmt: skip
    files = list(args.model_dir.glob("*.safetensors"))
    return {"dir": str(args.model_dir), "parameters": params, "bytes": gpu_model.weights_bytes(args.model_dir),
            "files": len(files), "reused": reused, "prepare_s": time.perf_counter() - started}  # fmt: skip


def scaled_limits(scale: float) -> list[str]:
    """The router's limits shrunk with the workload: warmup runs a worst-case step of
    --max-batch-prefill-tokens sequences that all sample, which alone takes ~50 s on the CPU
    at the full 8192. They still cover the longest scaled request (2560 * scale tokens)."""
    max_input = max(64, round(4096 * scale))
    max_total = max(max_input + 16, round(4608 * scale))
    prefill = max(max_total, round(8192 * scale))
    return ["--max-input-tokens", str(max_input), "--max-total-tokens", str(max_total),
            "--max-batch-prefill-tokens", str(prefill)]  # fmt: skip


def server_flags(args, work: Path) -> list[str]:
    from server import free_port

    limits = scaled_limits(args.scale) if args.scale < 1 else []  # later flags win
    flags = [*SERVER_FLAGS, *limits, "--num-shard", str(args.num_shard), "--device", args.device, "--dtype", args.dtype,
             "--shard-uds-path", str(work / "shard"), "--hostname", "127.0.0.1",
             "--startup-timeout", str(int(args.startup_timeout))]  # fmt: skip
    if args.num_shard > 1:  # a private rendezvous port: other servers may be running
        flags += ["--master-port", str(free_port())]
    return flags + args.server_flag


def run_scenarios(args, url: str) -> dict:
    prompts = Prompts(args.tokenizer_dir)
    streams(url, [(prompts.text(8), 4)] * 2)  # warm the HTTP path and the first step shapes
    runners = {
        "single_decode": lambda: seed_scenarios.single_decode(url, prompts, args.sizes),
        "concurrent_streams": lambda: seed_scenarios.concurrent_streams(url, prompts, args.sizes),
        "mixed_load": lambda: seed_scenarios.mixed_load(url, prompts, args.sizes),
        "ttft_at_rate": lambda: seed_scenarios.ttft_at_rate(url, prompts, args.sizes, args.ttft_rate, args.poisson),
    }
    results = {}
    for name in args.scenarios.split(","):
        started = time.perf_counter()
        try:
            results[name] = runners[name]()
        except Exception as exc:  # record and go on: the other scenarios still tell something
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        results[name]["scenario_s"] = time.perf_counter() - started
        print(f"[{name}] {json.dumps(results[name])[:600]}", flush=True)
    return results


def serve_and_run(args) -> tuple[dict, float]:
    from server import free_port

    with tempfile.TemporaryDirectory(prefix="textgen-seed-") as tmp:
        work = Path(tmp)
        port = free_port()
        launch = SimpleNamespace(out=work, work=work, router_binary=args.router_binary, model_dir=args.model_dir,
                                 server_flag=server_flags(args, work), client_cpus=0)  # fmt: skip
        try:
            process, startup_s = start_server(launch, port, args.startup_timeout)
        except RuntimeError as exc:  # the log lives in the temporary folder: show its end
            tail = (work / "textgen.log").read_text(errors="replace")[-4000:]
            raise RuntimeError(f"{exc}\n--- textgen.log (end) ---\n{tail}") from None
        try:
            return run_scenarios(args, f"http://127.0.0.1:{port}"), startup_s
        finally:
            process.terminate()
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()


def device_name(device: str, num_shard: int) -> str:
    if device == "cpu":
        import platform

        return f"CPU ({platform.processor() or platform.machine()})"
    import torch

    return f"{num_shard}× {torch.cuda.get_device_name(0)}"


def assemble(args, model: dict, ceilings: dict, scenarios: dict, startup_s: float) -> dict:
    """The report: what ran, its rooflines, the summary against them, the published figures."""
    cost = ModelCost.of(gpu_model.SHAPES[args.shape], _torch_dtype(args.dtype).itemsize)
    ceil = Ceilings(ceilings["copy_bytes_per_s"], ceilings["matmul_flops_per_s"])
    # CPU shards share one memory bus and the same cores: TP adds no bandwidth or FLOPs there.
    roof_devices = 1 if args.device == "cpu" else args.num_shard
    bounds = seed_report.rooflines(cost, ceil, roof_devices, scenarios)
    config = {"shape": args.shape, "num_shard": args.num_shard, "device": args.device, "dtype": args.dtype,
              "device_name": ceilings["device_name"], "scale": args.scale,
              "label": seed_report.label(args.device, args.shape, args.scale), "sizes": asdict(args.sizes),
              "startup_s": startup_s, "roofline_devices": roof_devices}  # fmt: skip
    return {"config": config, "summary": seed_report.summarize(scenarios, bounds), "rooflines": bounds,
            "ceilings": ceilings, "model": model, "scenarios": scenarios, "published": seed_report.PUBLISHED}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tokenizer_dir is None:
        from launcher.demo_model import ensure_demo_model

        args.tokenizer_dir = ensure_demo_model()
    isolate = args.device == "cuda"
    model = in_child(prepare_model, args.device, args, isolate=isolate)
    print(f"[model] {model}", flush=True)
    if args.prepare_only:
        return {"model": model}
    ceilings = in_child(measure_ceilings, args.device, args.dtype, args.num_shard, isolate=isolate)
    print(f"[ceilings] {ceilings}", flush=True)
    scenarios, startup_s = serve_and_run(args)
    report = assemble(args, model, ceilings, scenarios, startup_s)
    report["command"] = "python bench/seed_benchmark.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    text = seed_report.markdown(report)
    (args.out / f"{args.name}.md").write_text(text)
    print(text, flush=True)
    return report


if __name__ == "__main__":
    main()
