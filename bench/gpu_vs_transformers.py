"""textgen vs transformers on an H200, one run: an 8B-shaped random bf16 model, the device's
copy bandwidth and bf16 matmul rate, the full stack over HTTP, transformers on the same weights.

    python3 bench/gpu_vs_transformers.py --tokenizer-dir DIR --out OUT [--phases ...]

Phases run as child processes (each frees its GPU memory on exit) and write WORK/<phase>.json;
`report` merges them into OUT/gpu_vs_transformers.{json,md}. Reports (issue 3):
(a) batch-1 decode tok/s vs the bandwidth roofline and transformers `generate`;
(b) output tok/s on 256 mixed requests vs transformers `generate_batch` (paged|sdpa);
(c) TTFT of a 2048-token prompt vs the compute roofline; (d) TPOT p50/p99 at 32 streams.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import gpu_report, step_log  # noqa: E402
from bench.gpu_busy import ServerWindow  # noqa: E402
from bench.gpu_http_load import clients_for, percentile, streams, timeline  # noqa: E402

PHASES = ("ceilings", "model", "parity", "textgen", "transformers", "report")
TEXT_VOCAB = 49152  # the demo tokenizer's vocabulary
TTFT_SAMPLES = 9  # (c) is their median: one sample's client-side share varies by ~2 ms
MIX = [(128, 128)] * 179 + [(1024, 512)] * 77  # 256 requests: 70 % short, 30 % long
# Steps of up to 16,384 tokens (the launcher's default is TGI's 4,096, kinder to the streams
# decoding beside a prefill): the mix's prefill takes 8 steps instead of 14, 0.06-0.08 s less
# (H200, three A/B pairs against 8,192 in run12_series: -0.3 %, +2.5 %, +0.6 % output tok/s).
SERVER_FLAGS = ["--max-concurrent-requests", "1024", "--max-input-tokens", "4096", "--max-total-tokens", "4608",
                "--max-batch-prefill-tokens", "16384"]  # fmt: skip


class Prompts:
    """Texts of an exact token length, from words the tokenizer keeps as single tokens."""

    def __init__(self, tokenizer_dir: Path, seed: int = 0):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        vocab = self.tokenizer.get_vocab()
        words = [t[1:] for t in vocab if t.startswith("Ġ") and t[1:].isalpha() and t[1:].isascii()]
        self.words = [w for w in sorted(words) if len(self.tokenizer.encode(" " + w).ids) == 1]
        self.rng = random.Random(seed)

    def text(self, tokens: int) -> str:
        text = "".join(" " + self.rng.choice(self.words) for _ in range(tokens))
        assert len(self.ids(text)) == tokens
        return text

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def phase_ceilings(args) -> dict:
    from bench.gpu_model import bf16_matmul_flops_per_s, copy_bandwidth_bytes_per_s

    return {"copy_bytes_per_s": copy_bandwidth_bytes_per_s(), "bf16_matmul_flops_per_s": bf16_matmul_flops_per_s()}


def phase_model(args) -> dict:
    from bench.gpu_model import write_random_llama

    weights = args.model_dir / "model.safetensors"
    if weights.exists() and (args.model_dir / "config.json").exists():
        from safetensors import safe_open

        with safe_open(str(weights), "pt") as f:
            params = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
        return {"parameters": params, "bytes": weights.stat().st_size, "reused": True}
    started = time.perf_counter()
    params = write_random_llama(args.model_dir, args.tokenizer_dir, TEXT_VOCAB)
    size = (args.model_dir / "model.safetensors").stat().st_size
    return {"parameters": params, "bytes": size, "write_s": time.perf_counter() - started}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def phase_parity(args) -> dict:
    """bf16 (the served dtype; its noise floor is reported beside it), then float32."""
    import torch

    from bench.gpu_parity import compare_backends, parity_runner

    runner, shape = parity_runner(args.model_dir)
    result = compare_backends(runner, shape, TEXT_VOCAB)
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    runner, shape = parity_runner(args.model_dir, dtype=torch.float32)
    result["float32"] = compare_backends(runner, shape, TEXT_VOCAB)
    return result


# -- textgen over HTTP ------------------------------------------------------------------------
def start_server(args, port: int, timeout_s: float = 400.0, base_flags: list[str] = SERVER_FLAGS
                 ) -> tuple[subprocess.Popen, float]:  # fmt: skip
    bindir = args.work / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    shard = bindir / "textgen-shard"
    repo = Path(__file__).resolve().parent.parent
    shard.write_text(f'#!/bin/sh\nPYTHONPATH={repo} exec {sys.executable} -m shard_server "$@"\n')
    shard.chmod(0o755)
    router = bindir / "textgen-router"
    router.unlink(missing_ok=True)
    router.symlink_to(args.router_binary.resolve())
    # The router's per-step debug records go to textgen.log: the mix's step summary reads them.
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", PYTHONPATH=str(repo), LOG_LEVEL=step_log.LOG_FILTER)
    flags = [*base_flags, *args.server_flag]
    if "--num-shard" not in flags:
        # The launcher, like TGI, shards over every visible GPU by default; the bars are for one.
        flags += ["--num-shard", "1"]
    command = [sys.executable, "-m", "launcher.cli", "--model-id", str(args.model_dir), "--port", str(port),
               *flags]  # fmt: skip
    log = open(args.out / "textgen.log", "w")
    started = time.perf_counter()
    server_cpus, _ = cpu_split(args.client_cpus)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=repo,
                               preexec_fn=(lambda: os.sched_setaffinity(0, server_cpus)) if server_cpus else None)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    while time.perf_counter() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"launcher exited with {process.returncode}; see textgen.log")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"textgen did not become healthy in {timeout_s:.0f} s")


def cpu_split(client_cpus: int) -> tuple[set[int], set[int]]:
    """(server cores, client cores): the last `client_cpus` cores run the load generator, so
    its processes never preempt the server's latency-critical threads; (set(), set()): no pinning."""
    cores = sorted(os.sched_getaffinity(0))
    if client_cpus <= 0 or client_cpus >= len(cores):
        return set(), set()
    return set(cores[:-client_cpus]), set(cores[-client_cpus:])


def warm_up(url: str, prompts: Prompts) -> None:
    """A few requests of every shape measured later, so no measurement pays a first use
    (kernel compilation, allocator growth) that a long-running server pays once."""
    streams(url, [(prompts.text(16), 8)] * 4)
    streams(url, [(prompts.text(n_in), 8) for n_in, _ in MIX[::16]])


@contextlib.contextmanager
def collector_paused():
    """Like timeit: no garbage collection in this (client) process while a sample runs; in
    runs 8 and 9 the 7th TTFT sample took 13 ms longer, at the same place in both."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def steady_decode(url: str, prompts: Prompts, settle_s: float = 1.0, window_s: float = 2.0) -> dict:
    """The server's view of a window inside one long single-stream decode: past its prefill and
    first tokens, before its end. Its device idle share is the GPU's idle time between steps."""
    stream = threading.Thread(target=streams, args=(url, [(prompts.text(128), 1025)]))
    stream.start()
    time.sleep(settle_s)
    with ServerWindow(url) as window:
        time.sleep(window_s)
    stream.join()
    return window.summary()


def phase_textgen(args) -> dict:
    prompts = Prompts(args.tokenizer_dir)
    port = 18080
    process, startup_s = start_server(args, port)
    url = f"http://127.0.0.1:{port}"
    result = {"startup_s": startup_s}
    _, client_cpus = cpu_split(args.client_cpus)
    if client_cpus:  # this process and the client processes it starts
        os.sched_setaffinity(0, client_cpus)
        result["client_cpus"] = sorted(client_cpus)
    try:
        warm_up(url, prompts)
        # Median of three single streams: one stream's mean gap varies by ~10 % run to run.
        rates = []
        for _ in range(3):
            single, _ = streams(url, [(prompts.text(128), 257)])
            rates.append(1 / single[0].tpot)
        result["a_batch1_decode_tok_s"] = sorted(rates)[1]
        result["a_batch1_runs_tok_s"] = rates
        result["a_steady_decode"] = steady_decode(url, prompts)
        ttfts = []
        with ServerWindow(url) as window:
            for _ in range(TTFT_SAMPLES):
                text = prompts.text(2048)
                with collector_paused():
                    res, _ = streams(url, [(text, 1)])
                ttfts.append(res[0].ttft)
        result["c_server"] = window.summary()
        result["c_ttft_2048_s"] = sorted(ttfts)[TTFT_SAMPLES // 2]
        result["c_ttft_all_s"] = ttfts
        res, _ = streams(url, [(prompts.text(128), 128) for _ in range(32)], processes=clients_for(32))
        gaps = [g for r in res for g in r.gaps]
        tpots = [r.tpot for r in res if r.tpot]
        result["d_tpot_p50_s"], result["d_tpot_p99_s"] = percentile(tpots, 0.5), percentile(tpots, 0.99)
        result["d_itl_p50_s"], result["d_itl_p99_s"] = percentile(gaps, 0.5), percentile(gaps, 0.99)
        requests = [(prompts.text(n_in), n_out) for n_in, n_out in MIX]
        log_start = (args.out / "textgen.log").stat().st_size
        with ServerWindow(url) as window:
            res, wall = streams(url, requests, processes=clients_for(len(requests)))
        time.sleep(0.5)  # the last steps' records reach the log
        result["b_steps"] = step_log.summary(step_log.read(args.out / "textgen.log", log_start))
        result["b_client_processes"] = clients_for(len(requests))
        result["b_server"] = window.summary(wall_s=wall)  # the clients start a few seconds in
        result["b_timeline"] = timeline(res, wall)
        errors = [r.error for r in res if r.error]
        tokens = sum(len(r.token_times) for r in res)
        result["b_mixed"] = {"requests": len(requests), "output_tokens": tokens, "wall_s": wall,
                             "tokens_per_s": tokens / wall, "errors": errors[:5], "error_count": len(errors)}  # fmt: skip
        result["metrics_excerpt"] = [
            line for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
            if line.startswith(("textgen_kv", "textgen_step"))
        ][:60]  # fmt: skip
    finally:
        process.terminate()
        process.wait(timeout=60)
    return result


def phase_transformers(args) -> dict:
    import torch

    from bench import gpu_hf_baseline as hf

    prompts = Prompts(args.tokenizer_dir)
    result = {}
    model = hf.load(args.model_dir, "sdpa")
    result["a_generate_batch1_tok_s"] = hf.generate_batch1_tokens_per_s(model, prompts.ids(prompts.text(128)), 65)
    result["c_forward_2048_ms"] = hf.forward_ms(model, 2048)
    del model
    torch.cuda.empty_cache()
    model = hf.load(args.model_dir, "paged|sdpa")
    requests = [(prompts.ids(prompts.text(n_in)), n_out) for n_in, n_out in MIX]
    result["b_generate_batch"] = hf.generate_batch_tokens_per_s(model, requests)
    return result


def run_phase(args, phase: str) -> None:
    handler = globals()[f"phase_{phase}"]
    started = time.perf_counter()
    try:
        data = handler(args)
        data["ok"] = True
    except Exception as exc:  # record and go on: later phases may still run
        import traceback

        data = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    data["phase_s"] = time.perf_counter() - started
    (args.work / f"{phase}.json").write_text(json.dumps(data, indent=1))
    print(f"[{phase}] {json.dumps(data)[:1500]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, default=Path("router/target/release/textgen-router"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-bench"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama8b-random"))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--phase", help=argparse.SUPPRESS)  # internal: run one phase in this process
    # Sharing cores, the 8 client processes preempted the shard's threads: steps came up to
    # 5 ms late, ~0.4 s of the mix's 7.7 s (runs 11-12 vs 13, bench/results/mix_steps_h200.json).
    # A server's clients are elsewhere.
    parser.add_argument("--client-cpus", type=int, default=6, help="cores kept for the HTTP clients (0: shared)")
    parser.add_argument("--server-flag", action="append", default=[], help="extra launcher flag (repeatable)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.phase:
        return run_phase(args, args.phase)
    for phase in args.phases.split(","):
        if phase == "report":
            gpu_report.write(args.work, args.out)
            continue
        child = [sys.executable, __file__, "--phase", phase, *sys.argv[1:]]
        subprocess.run(child, check=False)


if __name__ == "__main__":
    main()
