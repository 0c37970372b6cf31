"""bench/cpu_host_step.py runs the shard's host path of a graph-replayed step against the
current runner (it stubs the model and the graphs, so a changed runner can break it)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_host_step_bench_runs_and_reports_a_time():
    args = ["--batch", "3", "--context", "40", "--width", "8", "--steps", "4"]
    done = subprocess.run([sys.executable, "bench/cpu_host_step.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["batch"] == 3 and report["host_ms_per_step"] > 0
