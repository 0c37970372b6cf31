"""The GPU running out of memory mid-serving, through the real stack (issue 27's fault).

The launcher serves a random 1B-shaped model on the GPU at the shipped defaults. While four
streams decode (CUDA graph replays, which allocate nothing), this process takes all but
HEADROOM_MIB of the device's free memory. A 3,000-token prompt then needs an eager prefill
step (longer than the largest mixed-step graph) whose activations cannot be allocated: the
shard answers the step `out_of_memory`, the router recomputes its sequences and backs off to
smaller steps (docs/reliability.md). The memory is then given back and the same prompt is
sent again.

Reported (OUT/gpu_out_of_memory.json): the long prompt's answer while the memory is held
(served in smaller chunks, or 424 naming the out-of-memory) and after; every stream's answer
(each must end with all its tokens); `textgen_out_of_memory_steps_total`; `/health` during
and after; whether the launcher is still running; the router's out-of-memory log lines.

    PYTHONPATH=. python3 bench/gpu_out_of_memory.py --tokenizer-dir T --router-binary R --out OUT
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

import httpx
import torch

from bench import peer_load
from bench.gpu_model import SHAPES, write_random_llama
from bench.gpu_vs_transformers import TEXT_VOCAB, start_server
from bench.gpu_vs_vllm import stop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration_tests"))
from server import metric, scrape_metrics  # noqa: E402

HEADROOM_MIB = 64  # left free: less than a 3,000-token eager prefill of the 1B needs
LONG_PROMPT = 3000
STREAMS = 4
STREAM_TOKENS = 3000  # long enough to decode through the whole out-of-memory phase
PORT = 8093


def completion(url: str, prompt: list[int], max_tokens: int) -> dict:
    """One non-streamed /v1/completions: its status, seconds, tokens and error text."""
    started = time.perf_counter()
    response = httpx.post(f"{url}/v1/completions", timeout=300,
                          json={"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})  # fmt: skip
    answer = {"status": response.status_code, "seconds": round(time.perf_counter() - started, 3)}
    body = response.json()
    if response.status_code == 200:
        answer["completion_tokens"] = body["usage"]["completion_tokens"]
    else:
        answer["error"] = body
    return answer


def out_of_memory_steps(url: str) -> float:
    return metric(scrape_metrics(url), "textgen_out_of_memory_steps_total")


def wait_for_running(url: str, count: int, timeout_s: float = 300.0) -> None:
    """Until the router runs `count` sequences (the client's processes start in seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metric(scrape_metrics(url), "textgen_running_requests") >= count:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{count} streams were not running after {timeout_s:.0f} s")


def health(url: str) -> int:
    try:
        return httpx.get(f"{url}/health", timeout=10).status_code
    except httpx.HTTPError:
        return 0


def hold_free_memory(headroom_bytes: int) -> torch.Tensor:
    """One allocation of all the device's free memory but `headroom_bytes`."""
    free, _ = torch.cuda.mem_get_info()
    return torch.empty(max(0, free - headroom_bytes), dtype=torch.uint8, device="cuda")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-oom"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama1b-random"))
    parser.add_argument("--client-cpus", type=int, default=4)
    parser.add_argument("--server-flag", action="append", default=[], help="added to the launcher's flags")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.model_dir / "config.json").exists():
        write_random_llama(args.model_dir, args.tokenizer_dir, TEXT_VOCAB, shape=SHAPES["1b"])
    torch.cuda.empty_cache()
    process, ready_s = start_server(args, PORT, base_flags=[])
    url = f"http://127.0.0.1:{PORT}"
    rng = random.Random(27)
    long_prompt = peer_load.random_ids(rng, LONG_PROMPT, TEXT_VOCAB)
    streams = [peer_load.Request(peer_load.random_ids(rng, 64, TEXT_VOCAB), STREAM_TOKENS) for _ in range(STREAMS)]
    result: dict = {"model": "1b", "ready_s": round(ready_s, 1), "headroom_mib": HEADROOM_MIB}
    try:
        stream_outcomes: list = []
        runner = threading.Thread(target=lambda: stream_outcomes.extend(peer_load.run(url, streams, 1, STREAMS)[0]))
        runner.start()
        wait_for_running(url, STREAMS)
        time.sleep(2.0)  # the streams are decoding
        before = out_of_memory_steps(url)
        held = hold_free_memory(HEADROOM_MIB << 20)
        result["held_gib"] = round(held.numel() / 2**30, 2)
        result["while_held"] = completion(url, long_prompt, 8)
        result["health_while_held"] = health(url)
        result["out_of_memory_steps"] = out_of_memory_steps(url) - before
        del held
        torch.cuda.empty_cache()
        result["after_release"] = completion(url, long_prompt, 8)
        runner.join(timeout=600)
        result["streams"] = [{"completion_tokens": o.completion_tokens, "error": o.error} for o in stream_outcomes]
        result["streams_complete"] = len(stream_outcomes) == STREAMS and all(
            o.error is None and o.completion_tokens == STREAM_TOKENS for o in stream_outcomes)  # fmt: skip
        result["health_after"] = health(url)
        result["launcher_running"] = process.poll() is None
    finally:
        stop(process)
    log = (args.out / "textgen.log").read_text(errors="replace").splitlines()
    result["log_lines"] = [line[-300:] for line in log if "out of memory" in line or "out of device memory" in line][:20]
    (args.out / "gpu_out_of_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "log_lines"}, indent=1))


if __name__ == "__main__":
    main()
