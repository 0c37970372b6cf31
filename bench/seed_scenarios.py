"""The seed benchmark's four scenarios, run over HTTP against a started textgen.

Sizes are those of the published framework comparisons at scale 1; `--scale` multiplies every
count and length (with floors that keep each scenario meaningful) so the CPU can run them.
Each scenario returns its measurements and the workload it sent, from which the report
computes the roofline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.gpu_http_load import StreamResult, clients_for, percentile, streams
from bench.open_loop import arrival_times, open_loop


@dataclass(frozen=True)
class Sizes:
    single_prompt: int = 128
    single_new: int = 256
    single_repeats: int = 3
    batch_streams: int = 128
    batch_prompt: int = 128
    batch_new: int = 256
    mix_requests: int = 200  # 7:3 short:long
    short: tuple[int, int] = (128, 128)
    long: tuple[int, int] = (2048, 512)
    ttft_requests: int = 100
    ttft_prompt: int = 2048
    ttft_new: int = 32

    @classmethod
    def scaled(cls, scale: float) -> Sizes:
        if not 0 < scale <= 1:
            raise ValueError(f"--scale must be in (0, 1], got {scale}")
        full = cls()

        def n(value: int, floor: int) -> int:
            return max(floor, round(value * scale))

        return cls(
            single_prompt=n(full.single_prompt, 4), single_new=n(full.single_new, 16),  # gaps to average
            single_repeats=n(full.single_repeats, 3), batch_streams=n(full.batch_streams, 2),
            batch_prompt=n(full.batch_prompt, 4), batch_new=n(full.batch_new, 4),
            mix_requests=n(full.mix_requests, 10), short=(n(full.short[0], 4), n(full.short[1], 4)),
            long=(n(full.long[0], 16), n(full.long[1], 8)), ttft_requests=n(full.ttft_requests, 3),
            ttft_prompt=n(full.ttft_prompt, 16), ttft_new=n(full.ttft_new, 2),
        )  # fmt: skip


def mix_workload(sizes: Sizes, seed: int = 0) -> list[tuple[int, int]]:
    """70 % short, 30 % long, in a seeded shuffled order."""
    shorts = round(sizes.mix_requests * 0.7)
    work = [sizes.short] * shorts + [sizes.long] * (sizes.mix_requests - shorts)
    random.Random(seed).shuffle(work)
    return work


def _errors(results: list[StreamResult]) -> dict:
    errors = [r.error for r in results if r.error]
    return {"error_count": len(errors), "errors": errors[:5]}


def _latencies(values: list[float]) -> dict:
    return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)} if values else {}


def single_decode(url: str, prompts, sizes: Sizes) -> dict:
    """One stream at a time; tok/s is 1 / the mean gap between its tokens (prefill excluded)."""
    rates, results = [], []
    for _ in range(sizes.single_repeats):
        res, _ = streams(url, [(prompts.text(sizes.single_prompt), sizes.single_new)])
        results += res
        if res[0].tpot:
            rates.append(1 / res[0].tpot)
    return {"workload": {"prompt": sizes.single_prompt, "new_tokens": sizes.single_new},
            "decode_tok_s": sorted(rates)[len(rates) // 2] if rates else None, "all_tok_s": rates,
            "tokens": [len(r.token_times) for r in results], **_errors(results)}  # fmt: skip


def _closed_batch(url: str, prompts, work: list[tuple[int, int]]) -> tuple[list[StreamResult], dict]:
    results, wall = streams(url, [(prompts.text(p), n) for p, n in work], processes=clients_for(len(work)))
    tokens = sum(len(r.token_times) for r in results)
    return results, {"requests": len(work), "output_tokens": tokens, "expected_tokens": sum(n for _, n in work),
                     "wall_s": wall, "output_tok_s": tokens / wall, **_errors(results)}  # fmt: skip


def concurrent_streams(url: str, prompts, sizes: Sizes) -> dict:
    work = [(sizes.batch_prompt, sizes.batch_new)] * sizes.batch_streams
    results, summary = _closed_batch(url, prompts, work)
    summary["tpot_s"] = _latencies([r.tpot for r in results if r.tpot])
    summary["workload"] = {"streams": sizes.batch_streams, "prompt": sizes.batch_prompt, "new_tokens": sizes.batch_new}
    return summary


def mixed_load(url: str, prompts, sizes: Sizes) -> dict:
    work = mix_workload(sizes)
    results, summary = _closed_batch(url, prompts, work)
    for name, shape in (("short", sizes.short), ("long", sizes.long)):
        mine = [r for r, w in zip(results, work) if w == shape and not r.error and r.token_times]
        summary[name] = {"requests": sum(1 for w in work if w == shape), "prompt": shape[0], "new_tokens": shape[1],
                         "ttft_s": _latencies([r.ttft for r in mine]),
                         "tpot_s": _latencies([r.tpot for r in mine if r.tpot])}  # fmt: skip
    summary["workload"] = {"requests": work}
    return summary


def ttft_at_rate(url: str, prompts, sizes: Sizes, rate_per_s: float, poisson: bool) -> dict:
    schedule = arrival_times(sizes.ttft_requests, rate_per_s, poisson)
    requests = [(prompts.text(sizes.ttft_prompt), sizes.ttft_new) for _ in schedule]
    results = open_loop(url, requests, schedule)
    done = [r for r in results if not r.stream.error and r.stream.token_times]
    return {"workload": {"requests": len(requests), "prompt": sizes.ttft_prompt, "new_tokens": sizes.ttft_new,
                         "rate_per_s": rate_per_s, "arrivals": "poisson" if poisson else "uniform"},
            "ttft_s": _latencies([r.ttft for r in done]), "completed": len(done),
            "max_send_lateness_s": max((r.lateness for r in results), default=0.0),
            **_errors([r.stream for r in results])}  # fmt: skip
