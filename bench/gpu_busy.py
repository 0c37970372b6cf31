"""What the server says about a measured window: the router's metrics, diffed around it.

The shards time each step on the device with CUDA events (`textgen_shard_device_duration_seconds`),
so the device's busy share of the window is that histogram's sum over the wall time, and the
rest is the share of wall time the GPU sat idle. The step histograms give how many steps ran,
their mean batch and duration, and how much of the window the shards were stepping.
"""

from __future__ import annotations

import re
import time

import httpx

_SERIES = re.compile(
    r"^(textgen_step_(?:duration_seconds|batch_size|tokens)_(?:sum|count)"
    r"|textgen_(?:time_to_first_token|queue_duration)_seconds_(?:sum|count)"
    r'|textgen_shard_(?:device|forward)_duration_seconds_(?:sum|count)(?=\{rank="0"\}))(?:\{[^}]*\})? (\S+)$'
)
# Mean milliseconds of each stage a request's first token passes, from the histograms above.
_STAGES = {
    "server_ttft_ms": "textgen_time_to_first_token_seconds",
    "queue_ms": "textgen_queue_duration_seconds",
    "router_step_ms": "textgen_step_duration_seconds",
    "shard_forward_ms": "textgen_shard_forward_duration_seconds",
    "shard_device_ms": "textgen_shard_device_duration_seconds",
}


def scrape(url: str) -> dict[str, float]:
    """The series above from /metrics (device time: rank 0's)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match:
            values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(2))
    return values


def timed_scrape(url: str) -> tuple[dict[str, float], float]:
    """The series and the moment they stand for: the middle of the request, since the router
    renders them somewhere inside it. Timing the window from the end of the first scrape to the
    start of the last counted the steps that ended during both requests without their time: a
    2 s steady decode on the H200 read 1-2 % more device time than wall time (run 13)."""
    sent = time.perf_counter()
    values = scrape(url)
    return values, (sent + time.perf_counter()) / 2


def window_summary(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    steps = delta.get("textgen_step_duration_seconds_count", 0.0)
    if not steps:
        return {"steps": 0, "wall_s": wall_s}
    summary = {
        "wall_s": wall_s,
        "steps": int(steps),
        "mean_batch": delta["textgen_step_batch_size_sum"] / delta["textgen_step_batch_size_count"],
        "mean_step_tokens": delta["textgen_step_tokens_sum"] / delta["textgen_step_tokens_count"],
        "mean_step_ms": 1e3 * delta["textgen_step_duration_seconds_sum"] / steps,
        "stepping_fraction": delta["textgen_step_duration_seconds_sum"] / wall_s,
    }
    summary["mean_stage_ms"] = {
        stage: 1e3 * delta[f"{series}_sum"] / delta[f"{series}_count"]
        for stage, series in _STAGES.items()
        if delta.get(f"{series}_count")
    }
    if delta.get("textgen_shard_device_duration_seconds_count"):
        busy = delta["textgen_shard_device_duration_seconds_sum"] / wall_s
        summary |= {"device_busy_fraction": busy, "device_idle_fraction": 1 - busy}
    return summary


class ServerWindow:
    """`with ServerWindow(url) as window:` ...; then `window.summary()`."""

    def __init__(self, url: str):
        self.url = url
        self._before: dict[str, float] = {}
        self._after: dict[str, float] = {}
        self._wall_s = 0.0

    def __enter__(self) -> ServerWindow:
        self._before, self._started = timed_scrape(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self._after, ended = timed_scrape(self.url)
        self._wall_s = ended - self._started

    def summary(self, wall_s: float | None = None) -> dict:
        """`wall_s` replaces the window's own length (when the load started later than it)."""
        return window_summary(self._before, self._after, self._wall_s if wall_s is None else wall_s)
