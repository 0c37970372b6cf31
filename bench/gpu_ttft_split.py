"""Where a lone request's TTFT goes (issue 23's long-prompt bar): from the client's send to the
router's launch of the request's first prefill step, the prefill steps themselves, and from the
last prefill step's answer to the first streamed token.

textgen serves the model with the router's per-step debug records on (`step_log.LOG_FILTER`);
one request at a time is sent from a freshly spawned process, cold (its first httpx request) and
warm (after one `GET /health`), and its send, first-chunk and last-chunk wall-clock times are
matched with the step records' timestamps (the router logs in UTC, on the same clock).

    PYTHONPATH=. python3 bench/gpu_ttft_split.py MODEL_DIR ROUTER OUT_DIR [--tokenizer-dir T] [--long 6000]

MODEL_DIR is written first (the random 8B) when it holds no config.json; OUT_DIR gets
`ttft_split.json` and the server's `textgen.log`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import random
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_http_load import sse_data  # noqa: E402

SHAPES = ((128, 32), (6000, 4))  # (prompt tokens, new tokens): batch 1's and the long prompt's
RUNS = 3  # requests of each shape, cold and warm each


async def _one(url: str, prompt: list[int], max_tokens: int, warm: bool) -> tuple[float, float | None, float]:
    async with httpx.AsyncClient(timeout=600) as client:
        if warm:
            await client.get(f"{url}/health")
        body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        sent, first = time.time(), None
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for data in sse_data(response):
                if first is None and '"choices":[{' in data:
                    first = time.time()
        return sent, first, time.time()  # first: None when no token came


def _send(job) -> tuple[float, float | None, float]:
    return asyncio.run(_one(*job))


def step_records(log: str) -> list[tuple[float, dict[str, int]]]:
    """(UTC seconds the step was answered, its fields) of every step record in a router log."""
    records = []
    for line in log.splitlines():
        if " step step=" not in line:
            continue
        at = datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
        records.append((at.timestamp(), {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}))
    return records


def split(sent: float, first: float, last: float, records: list[tuple[float, dict[str, int]]]) -> dict | None:
    """A request's TTFT in three parts, from the steps launched after its send and answered by
    its last chunk (one request at a time: they are its own); None without a prefill step."""
    mine = [(at, f) for at, f in records if at - f["ran_us"] / 1e6 >= sent - 0.002 and at <= last + 0.05]
    prefill = [(at, f) for at, f in mine if f["decodes"] == 0]
    if not prefill:
        return None
    launched = prefill[0][0] - prefill[0][1]["ran_us"] / 1e6
    answered = prefill[-1][0]
    return {"ttft_ms": round((first - sent) * 1e3, 2), "before_first_step_ms": round((launched - sent) * 1e3, 2),
            "prefill_steps": len(prefill), "prefill_ran_ms": round(sum(f["ran_us"] for _, f in prefill) / 1e3, 2),
            "prefill_device_ms": round(sum(f["device_us"] for _, f in prefill) / 1e3, 2),
            "after_last_prefill_ms": round((first - answered) * 1e3, 2)}  # fmt: skip


def _row(times: tuple[float, float | None, float], records: list[tuple[float, dict[str, int]]]) -> dict:
    sent, first, last = times
    if first is None:
        return {"error": "no token streamed"}
    return split(sent, first, last, records) or {"error": "no prefill step found"}


def main() -> None:
    from bench.gpu_vs_transformers import TEXT_VOCAB, start_server
    from bench.gpu_vs_vllm import stop

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("router", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer-dir", type=Path, default=Path(".gpurun/tokenizer"))
    parser.add_argument("--long", type=int, default=SHAPES[1][0], help="the long prompt's tokens")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.model_dir / "config.json").exists():
        from bench.gpu_model import write_random_llama

        write_random_llama(args.model_dir, args.tokenizer_dir, TEXT_VOCAB)
    server = SimpleNamespace(work=args.out / "work", router_binary=args.router, out=args.out,
                             model_dir=args.model_dir, server_flag=["--num-shard", "1"], client_cpus=4)  # fmt: skip
    process, _ = start_server(server, 3411, timeout_s=600, base_flags=[])
    url, rng, sent = "http://127.0.0.1:3411", random.Random(5), []
    shapes = (SHAPES[0], (args.long, SHAPES[1][1]))
    try:
        context = multiprocessing.get_context("spawn")
        for prompt_tokens, new_tokens in shapes:
            for warm in (False, True):
                for _ in range(RUNS):
                    prompt = [rng.randrange(256, TEXT_VOCAB) for _ in range(prompt_tokens)]
                    with context.Pool(1) as pool:  # a fresh client process, as the benchmarks spawn
                        pool.apply(time.sleep, (0.3,))
                        times = pool.apply(_send, ((url, prompt, new_tokens, warm),))
                    sent.append(({"prompt_tokens": prompt_tokens, "warm": warm}, times))
    finally:
        stop(process)
    records = step_records((args.out / "textgen.log").read_text())
    rows = [dict(shape, **_row(times, records)) for shape, times in sent]
    for row in rows:
        print(json.dumps(row), flush=True)
    (args.out / "ttft_split.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
