"""textgen against vLLM on one H200 (issue 23): the same random 8B (bf16; `--shape qwen3-30b-a3b` /
`mixtral-8x7b`: issue 24's 61 GB Qwen3-MoE and 93.4 GB Mixtral; `--shape gemma2-9b` / `phi3-medium`: issue 24's
model families, 18.5 / 27.9 GB; `tiny`, `tiny-moe`, `tiny-mixtral`, `tiny-gemma2`, `tiny-phi3`: harness checks; `--checkpoint gptq|awq|fp8-block`: a Llama or MoE
shape as a random quantized checkpoint, experts packed and routers bf16, issue 25), both engines at their shipped defaults, one client (bench/peer_load.py)
driving both over `/v1/completions` with token-id prompts, in one run. Reports each engine's figures and
textgen / vLLM ratios.

    PYTHONPATH=. python3 bench/gpu_vs_vllm.py --tokenizer-dir DIR --router-binary BIN \
        --peer-env .peer/tools/env.sh --out OUT

Workloads (fixed seeds; each engine gets the same requests, warm-up first):
  batch1       three runs of one 128-token prompt, 256 new tokens (a fresh prompt each run)
  long_prompt  three 6,000-token prompts at idle, 1 new token (TTFT; fresh prompts)
  burst        512 ShareGPT-like requests (peer_load.sharegpt_like) sent at once
  poisson_8    Poisson arrivals at 8 req/s for 15 s, ShareGPT-like lengths
  poisson_32   the same at 32 req/s
  prefix       256 requests sharing a 2,000-token prefix (+16 own tokens), 128 new, at once
  mix          the issue-3 mix: 179 x 128/128 + 77 x 1024/512, at once
  long_answer  (only when named) three runs of one 128-token prompt, 1,024 new tokens
Prompt ids are drawn below the model's vocabulary where it is smaller than the demo tokenizer's
(Phi-3: 32,064), and a workload that needs more positions than the model has (Phi-3-medium-4k:
long_prompt's 6,000) is skipped, named under "skipped" in the results.
Only flag either engine gets beyond its defaults: the model path, port, textgen's `--num-shard 1`
(it shards over every visible GPU otherwise) and vLLM's `--served-model-name m --dtype bfloat16`.
An engine's admission limit is honoured by the client (textgen: /info max_concurrent_requests;
vLLM has none): excess requests wait in the client and the wait counts in their TTFT.
Writes OUT/gpu_vs_vllm.json after every workload, and a markdown table at the end. A model too
big for both engines in one 10-minute device call runs them in two calls on the same warm machine:
`--engines textgen`, then `--engines vllm --resume FIRST/gpu_vs_vllm.json`.

A model bigger than the disk (Mixtral's 93.4 GB on the one-GPU machine's 64 GiB) is written in
part elsewhere: `--spill-dir /dev/shm/spill --disk-budget-gb 40` keeps 40 GB of shards in the
model directory and writes the rest to the tmpfs, linked back (check `df -h /dev/shm` first).

`--fp8` runs both engines' fp8 paths instead (weights and KV cache in e4m3): textgen
`--quantize fp8 --kv-cache-dtype fp8_e4m3fn`, vLLM `--quantization fp8 --kv-cache-dtype fp8`.

Choosing a default: `--textgen-variant NAME="--flag value ..."` (repeatable) also runs textgen
with those flags, as engine `textgen[NAME]`, so a candidate default is measured beside the
shipped one and the peer in the same run; the variants' rows are reported apart from the
defaults' comparison. `--workloads burst,mix` runs a subset.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peer_load, step_log  # noqa: E402
from bench.gpu_http_load import clients_for  # noqa: E402
from bench.gpu_vs_transformers import MIX, TEXT_VOCAB, cpu_split, start_server  # noqa: E402

ENGINES = ("textgen", "vllm")
# Each engine's flags for its fp8 path (weights quantized at load, KV cache in e4m3).
FP8_FLAGS = {"textgen": ["--quantize", "fp8", "--kv-cache-dtype", "fp8_e4m3fn"],
             "vllm": ["--quantization", "fp8", "--kv-cache-dtype", "fp8"]}
POISSON_S = 15.0
SHAPE_CHOICES = ("8b", "70b", "qwen3-30b-a3b", "mixtral-8x7b", "gemma2-9b", "phi3-medium", "tiny", "tiny-moe", "tiny-mixtral",
                 "tiny-gemma2", "tiny-phi3")  # fmt: skip
REPEATS = 3  # runs of the one-request workloads
OPTIONAL_WORKLOADS = ("long_answer",)  # run only when named in --workloads


def workloads(quick: bool, vocab: int = TEXT_VOCAB) -> dict[str, list[list[peer_load.Request]]]:
    """name -> its runs' requests, prompt ids below `vocab`; `quick` shrinks every one (a smoke test
    of the harness). The single-request workloads run three times with fresh prompts (a repeated
    prompt would be a prefix-cache hit) and report the median run."""
    scale = 8 if quick else 1
    v = vocab
    return {
        "batch1": [peer_load.fixed([(128, 256 // scale)], v, seed=10 + r) for r in range(REPEATS)],
        "long_prompt": [peer_load.fixed([(6000 // scale, 1)], v, seed=20 + r) for r in range(REPEATS)],
        "burst": [peer_load.sharegpt_like(512 // scale, v, seed=3)],
        "poisson_8": [_poisson(8, quick, 4, v)],
        "poisson_32": [_poisson(32, quick, 5, v)],
        "prefix": [peer_load.shared_prefix(256 // scale, 2000 // scale, 16, 128 // scale, v, seed=6)],
        "mix": [peer_load.fixed(MIX[::scale], v, seed=7)],
        # Speculative decoding's batch-1 case: a long greedy answer, which random weights
        # tend to make repetitive (prompt lookup drafts from it); not in the default set.
        "long_answer": [peer_load.fixed([(128, 1024 // scale)], v, seed=30 + r) for r in range(REPEATS)],
    }


def _poisson(rate: float, quick: bool, seed: int, vocab: int) -> list[peer_load.Request]:
    schedule = peer_load.poisson_schedule(rate, POISSON_S / (8 if quick else 1), seed)
    return peer_load.sharegpt_like(len(schedule), vocab, seed, schedule)


def prompt_vocab(shape: dict) -> int:
    """Prompt ids stay below the model's vocabulary too: both engines refuse (or mis-index) an id past it."""
    return min(TEXT_VOCAB, shape["vocab_size"])


def fitting_plan(plan: dict[str, list[list[peer_load.Request]]], positions: int) -> tuple[dict, dict]:
    """(the workloads whose every request fits the model's positions, {skipped name: why})."""
    kept, skipped = {}, {}
    for name, runs in plan.items():
        longest = max(len(r.prompt) + r.max_tokens for run in runs for r in run)
        if longest <= positions:
            kept[name] = runs
        else:
            skipped[name] = f"a request needs {longest} positions, the model has {positions}"
    return kept, skipped




# -- engines ----------------------------------------------------------------------------------------
def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"not healthy in {timeout_s:.0f} s")


def start_vllm(args, port: int) -> tuple[subprocess.Popen, float]:
    command = (f"source {args.peer_env} && exec python3 -m vllm.entrypoints.openai.api_server "
               f"--model {args.model_dir} --served-model-name m --dtype bfloat16 --host 127.0.0.1 "
               f"--port {port} --disable-uvicorn-access-log {shlex.join(args.precision_flags['vllm'])}")  # fmt: skip
    server_cpus, _ = cpu_split(args.client_cpus)
    log = open(args.out / "vllm.log", "w")
    process = subprocess.Popen(["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=(lambda: os.sched_setaffinity(0, server_cpus)) if server_cpus else None)  # fmt: skip
    return process, wait_healthy(process, f"http://127.0.0.1:{port}", 900)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the engine's whole process group, then SIGKILL; then wait for the GPU to
    be free, so the next engine sees all of its memory."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if shutil.which("nvidia-smi") is None:
        return  # no GPU to wait for (a CPU run of a harness)
    for _ in range(60):
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout.split()  # fmt: skip
        if used and int(used[0]) < 2000:
            return
        time.sleep(1)


def admission_limit(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/info", timeout=5).json().get("max_concurrent_requests")
    except (httpx.HTTPError, ValueError):
        return None  # vLLM has no /info


# -- measuring --------------------------------------------------------------------------------------
def measure(url: str, runs_requests: list[list[peer_load.Request]], limit: int | None) -> dict:
    in_flight = limit or len(runs_requests[0])
    runs = []
    for requests in runs_requests:
        outcomes, wall = peer_load.run(url, requests, clients_for(len(requests)), in_flight)
        runs.append(peer_load.summary(outcomes, wall))
    runs.sort(key=lambda r: r["ttft_ms"].get("p50", 0.0))
    picked = dict(runs[len(runs) // 2])  # the median run by TTFT
    picked["in_flight_cap"] = in_flight
    return picked


def run_engine(args, engine: str, plan: dict[str, list[peer_load.Request]], results: dict) -> None:
    port = 8400 if engine == "vllm" else 3400
    url = f"http://127.0.0.1:{port}"
    if engine.startswith("textgen"):
        args.server_flag = [*args.precision_flags["textgen"], *args.variants.get(engine, [])]
        process, ready_s = start_server(args, port, timeout_s=900, base_flags=[])
    else:
        process, ready_s = start_vllm(args, port)
    mine = results.setdefault(engine, {})
    mine["ready_s"] = ready_s
    if engine in args.variants:
        mine["flags"] = args.variants[engine]
    try:
        limit = admission_limit(url)
        warm = [peer_load.Request(r.prompt, 8) for r in peer_load.fixed(MIX[::16], args.prompt_vocab, seed=99)]
        peer_load.run(url, warm, 2, limit or len(warm))
        for name, requests in plan.items():
            log_start = _log_size(args, engine)
            mine[name] = measure(url, requests, limit)
            if log_start is not None:  # textgen's per-step records of this workload (all its runs)
                mine[name]["steps"] = step_log.summary(step_log.read(args.out / "textgen.log", log_start))
            print(f"[{engine}] {name}: {json.dumps(brief(mine[name]))}", flush=True)
            save(args, results)
    except Exception as exc:  # keep what was measured
        mine["error"] = f"{type(exc).__name__}: {exc}"
        print(f"[{engine}] failed: {mine['error']}", flush=True)
    finally:
        stop(process)
    save(args, results)


def _log_size(args, engine: str) -> int | None:
    """Where textgen's log (the router's step records) stands now; None for the peer."""
    log = args.out / "textgen.log"
    return log.stat().st_size if engine.startswith("textgen") and log.exists() else None


def brief(r: dict) -> dict:
    return {"tok_s": round(r["output_tok_s"]), "errors": r["errors"], "ttft_p50": r["ttft_ms"].get("p50"),
            "tpot_p50": r["tpot_ms"].get("p50"), "tpot_p99": r["tpot_ms"].get("p99")}  # fmt: skip


def save(args, results: dict) -> None:
    (args.out / "gpu_vs_vllm.json").write_text(json.dumps(results, indent=1))


# -- report -----------------------------------------------------------------------------------------
# (label, path into a workload's summary, higher is better)
MEASURES = [("output tok/s", ("output_tok_s",), True), ("TTFT p50 ms", ("ttft_ms", "p50"), False),
            ("TTFT p99 ms", ("ttft_ms", "p99"), False), ("TPOT p50 ms", ("tpot_ms", "p50"), False),
            ("TPOT p99 ms", ("tpot_ms", "p99"), False), ("ITL p99 ms", ("itl_ms", "p99"), False),
            ("e2e p50 ms", ("e2e_ms", "p50"), False)]  # fmt: skip


def value(summary: dict, path: tuple[str, ...]) -> float | None:
    for key in path:
        summary = summary.get(key) if isinstance(summary, dict) else None
    return summary if isinstance(summary, (int, float)) else None


def report(results: dict) -> str:
    lines = []
    if shares := batch1_roofline_shares(results):
        model = results["model"]
        lines += [f"Model: {model.get('shape')} {model.get('checkpoint', '')}, {model['active_bytes_per_token'] / 1e9:.2f} "
                  "GB read a decoded token; "
                  f"copy bandwidth {model['copy_bytes_per_s'] / 1e12:.2f} TB/s. Batch-1 decode as a share of that "
                  "roofline: " + ", ".join(f"{e} {v:.2f}" for e, v in shares.items()), ""]  # fmt: skip
    if skipped := results.get("skipped"):
        lines += [*(f"Skipped {name}: {why}." for name, why in skipped.items()), ""]
    lines += ["| workload | measure | textgen | vLLM | textgen / vLLM |", "|:--|:--|--:|--:|--:|"]
    names = [n for n in results.get("textgen", {}) if isinstance(results["textgen"][n], dict)]
    for name in names:
        for label, path, _ in MEASURES:
            ours = value(results["textgen"].get(name, {}), path)
            peer = value(results.get("vllm", {}).get(name, {}), path)
            if ours is None and peer is None:
                continue
            ratio = f"{ours / peer:.3f}" if ours is not None and peer else "-"
            lines.append(f"| {name} | {label} | {_fmt(ours)} | {_fmt(peer)} | {ratio} |")
    for engine in (e for e in results if e.startswith("textgen[")):
        lines += ["", f"Variant `{engine}` ({' '.join(results[engine].get('flags', []))}), not the defaults:", "",
                  "| workload | measure | variant | textgen | vLLM | variant / textgen | variant / vLLM |",
                  "|:--|:--|--:|--:|--:|--:|--:|"]  # fmt: skip
        for name in (n for n in results[engine] if isinstance(results[engine][n], dict)):
            for label, path, _ in MEASURES:
                mine = value(results[engine][name], path)
                ours = value(results.get("textgen", {}).get(name, {}), path)
                peer = value(results.get("vllm", {}).get(name, {}), path)
                if mine is None:
                    continue
                to_ours = f"{mine / ours:.3f}" if ours else "-"
                to_peer = f"{mine / peer:.3f}" if peer else "-"
                lines.append(f"| {name} | {label} | {_fmt(mine)} | {_fmt(ours)} | {_fmt(peer)} | {to_ours} | {to_peer} |")
    return "\n".join(lines) + "\n"


def phase_model(args) -> dict:
    """Writes the random model of `--shape` into --model-dir, or finds it there (its config.json,
    written last, names the same shape); with the bytes a decoded token reads and the device's
    copy bandwidth, for the batch-1 roofline."""
    from bench.gpu_model import QUANTIZATION_CONFIGS, SHAPES, copy_bandwidth_bytes_per_s, decode_bytes_per_token
    from bench.gpu_model import tensor_specs, weights_bytes, write_random_llama

    shape, checkpoint = SHAPES[args.shape], args.checkpoint
    out = {"shape": args.shape, "checkpoint": checkpoint or "bf16",
           "parameters": sum(spec.numel for spec in tensor_specs(shape)),
           "active_bytes_per_token": decode_bytes_per_token(shape, checkpoint)}  # fmt: skip
    config = args.model_dir / "config.json"
    same = ("model_type", "hidden_size", "num_hidden_layers")
    found = json.loads(config.read_text()) if config.exists() else {}
    if all(found.get(k) == shape[k] for k in same) and found.get("quantization_config") == QUANTIZATION_CONFIGS.get(checkpoint):
        out["reused"] = True
    else:
        started = time.perf_counter()
        write_random_llama(args.model_dir, args.tokenizer_dir, TEXT_VOCAB, shape=shape, checkpoint=checkpoint,
                           spill=args.spill)  # fmt: skip
        out["write_s"] = time.perf_counter() - started
    out["bytes"] = weights_bytes(args.model_dir)
    out["copy_bytes_per_s"] = copy_bandwidth_bytes_per_s()
    return out


def batch1_roofline_shares(results: dict) -> dict:
    """Each engine's batch-1 decode as a share of the copy roofline of the bytes a token reads."""
    model, shares = results.get("model", {}), {}
    if not model.get("active_bytes_per_token") or not model.get("copy_bytes_per_s"):
        return shares
    ceiling = model["copy_bytes_per_s"] / model["active_bytes_per_token"]  # tokens/s
    for engine, runs in results.items():
        if isinstance(runs, dict) and isinstance(runs.get("batch1"), dict) and runs["batch1"].get("output_tok_s"):
            shares[engine] = runs["batch1"]["output_tok_s"] / ceiling
    return shares


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def main() -> None:
    from bench import gpu_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, default=Path("router/target/release/textgen-router"))
    parser.add_argument("--peer-env", type=Path, default=Path(".peer/tools/env.sh"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-bench"))
    parser.add_argument("--shape", default="8b", choices=SHAPE_CHOICES,
                        help="the random model's shape (bench/gpu_model.py SHAPES)")
    parser.add_argument("--checkpoint", choices=["gptq", "awq", "fp8-block"], default=None,
                        help="a random checkpoint of that method instead of bf16 (issue 25)")
    parser.add_argument("--model-dir", type=Path, default=None, help="default: /tmp/llama8b-random for 8b, else "
                        "/tmp/SHAPE[-CHECKPOINT]-random")  # fmt: skip
    gpu_model.add_spill_options(parser)
    parser.add_argument("--client-cpus", type=int, default=6, help="cores kept for the HTTP clients (0: shared)")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--quick", action="store_true", help="every workload shrunk (harness smoke test)")
    parser.add_argument("--workloads", default=None, help="comma-separated subset (default: all)")
    parser.add_argument("--textgen-variant", action="append", default=[], metavar='NAME="FLAGS"',
                        help="also run textgen with these flags, as engine textgen[NAME] (choosing a default)")
    parser.add_argument("--fp8", action="store_true", help="both engines' fp8 paths (FP8_FLAGS)")
    parser.add_argument("--resume", type=Path, default=None, metavar="JSON",
                        help="an earlier call's gpu_vs_vllm.json on the same warm machine and model: its engines' "
                        "figures are kept and the report covers them (device calls are capped at 10 minutes)")  # fmt: skip
    parser.add_argument("--write-model", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.shape == "70b" and args.checkpoint in (None, "fp8-block"):
        parser.error("the 70B fits one GPU only in 4 bits: --checkpoint gptq or awq (about 38 GB)")
    args.spill = gpu_model.spill_from(args, parser)
    if args.model_dir is None:
        plain = args.shape == "8b" and args.checkpoint is None
        suffix = f"-{args.checkpoint}" if args.checkpoint else ""
        args.model_dir = Path("/tmp/llama8b-random" if plain else f"/tmp/{args.shape}{suffix}-random")
    args.model_shape = gpu_model.SHAPES[args.shape]
    args.prompt_vocab = prompt_vocab(args.model_shape)
    args.precision_flags = FP8_FLAGS if args.fp8 else {"textgen": [], "vllm": []}
    args.server_flag = []  # start_server's extra flags: none, the defaults are measured
    args.variants = {}
    for variant in args.textgen_variant:
        name, _, flags = variant.partition("=")
        args.variants[f"textgen[{name}]"] = shlex.split(flags)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.write_model:  # in a child, so this process never holds GPU memory the engines need
        (args.work / "model.json").write_text(json.dumps(phase_model(args)))
        return
    subprocess.run([sys.executable, __file__, "--write-model", *sys.argv[1:]], check=True)
    results: dict = json.loads(args.resume.read_text()) if args.resume else {}
    results.update({"model": json.loads((args.work / "model.json").read_text()), "quick": args.quick,
                    "precision": "fp8" if args.fp8 else "bf16", "flags": args.precision_flags})
    plan = workloads(args.quick, args.prompt_vocab)
    plan = ({name: plan[name] for name in args.workloads.split(",")} if args.workloads
            else {name: runs for name, runs in plan.items() if name not in OPTIONAL_WORKLOADS})
    plan, results["skipped"] = fitting_plan(plan, args.model_shape["max_position_embeddings"])
    for name, why in results["skipped"].items():
        print(f"skipped {name}: {why}", flush=True)
    results["workloads"] = {n: {"runs": len(runs), "requests": len(runs[0]),
                                "prompt_tokens": sum(len(x.prompt) for x in runs[0]),
                                "max_tokens": sum(x.max_tokens for x in runs[0])} for n, runs in plan.items()}  # fmt: skip
    for engine in [*(e for e in args.engines.split(",") if e), *args.variants]:
        run_engine(args, engine, plan, results)
    text = report(results)
    (args.out / "gpu_vs_vllm.md").write_text(text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
