"""bench/cpu_host_step.py runs the shard's host path of a graph-replayed step against the
current runner (it stubs the model and the graphs, so a changed runner can break it)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*args: str) -> dict:
    done = subprocess.run([sys.executable, "bench/cpu_host_step.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_host_step_bench_runs_and_reports_a_time():
    report = run_bench("--batch", "3", "--context", "40", "--width", "8", "--steps", "4")
    assert report["batch"] == 3 and report["host_ms_per_step"] > 0
    assert report["idle_ms_per_step"] == 0  # plain decodes: each launched before the one before settles
    assert report["tokens_per_step"] == 3


def test_with_drafts_every_draft_is_kept_and_the_wait_before_each_replay_is_reported():
    report = run_bench("--batch", "2", "--context", "80", "--width", "32", "--steps", "6", "--speculate", "3")
    assert report["tokens_per_step"] == 2 * 4  # the stub model continues the prompts' cycle
    assert report["idle_ms_per_step"] > 0  # settling, drafting and planning come before the replay
