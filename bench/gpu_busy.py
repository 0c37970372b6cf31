"""How busy the GPU and the server were during a measured window.

`GpuBusySampler` polls NVML's utilization (through `nvidia-smi`): the share of each sample
period in which at least one kernel ran, so `1 - mean` is the fraction of wall time the GPU
sat idle. `StepStats` diffs the router's step histograms around a window: how many steps
ran, their mean batch and duration, and the share of the window the shards were stepping.
"""

from __future__ import annotations

import re
import subprocess
import threading

import httpx


class GpuBusySampler:
    """Samples utilization.gpu of one GPU every `period_ms` while in a `with` block."""

    def __init__(self, gpu: int = 0, period_ms: int = 20):
        self.command = ["nvidia-smi", "-i", str(gpu), "--query-gpu=utilization.gpu",
                        "--format=csv,noheader,nounits", "-lms", str(period_ms)]  # fmt: skip
        self.samples: list[float] = []
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> GpuBusySampler:
        try:
            self._process = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        except OSError:
            return self  # no nvidia-smi: no samples
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            line = line.strip()
            if line.replace(".", "", 1).isdigit():
                self.samples.append(float(line))

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._reader.join(timeout=10)

    def summary(self) -> dict:
        if not self.samples:
            return {"samples": 0}
        # The first and last samples straddle the window's edges.
        inner = self.samples[1:-1] or self.samples
        busy = sum(inner) / len(inner) / 100
        return {"samples": len(inner), "busy_fraction": busy, "idle_fraction": 1 - busy}


_SERIES = re.compile(r"^(textgen_step_(?:duration_seconds|batch_size|tokens)_(?:sum|count))(?:\{[^}]*\})? (\S+)$")


def scrape_steps(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match:
            values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(2))
    return values


def step_stats(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    """What the router's step histograms say about the window between two scrapes."""
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    steps = delta.get("textgen_step_duration_seconds_count", 0.0)
    if not steps:
        return {"steps": 0}
    stepping = delta["textgen_step_duration_seconds_sum"]
    return {
        "steps": int(steps),
        "mean_batch": delta["textgen_step_batch_size_sum"] / delta["textgen_step_batch_size_count"],
        "mean_step_tokens": delta["textgen_step_tokens_sum"] / delta["textgen_step_tokens_count"],
        "mean_step_ms": 1e3 * stepping / steps,
        "stepping_fraction": stepping / wall_s,
    }
