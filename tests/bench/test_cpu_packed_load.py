"""bench/cpu_packed_load.py on a tiny shape: it writes each packed checkpoint once and times real loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_times_a_load_of_each_checkpoint_and_reuses_the_written_models(tmp_path):
    from launcher.demo_model import ensure_demo_model

    out, work = tmp_path / "load.json", tmp_path / "work"
    command = [sys.executable, str(REPO / "bench/cpu_packed_load.py"), str(out), "--shape", "tiny",
               "--checkpoints", "gptq,awq", "--repeats", "2", "--work", str(work),
               "--tokenizer-dir", str(ensure_demo_model())]  # fmt: skip
    subprocess.run(command, check=True, cwd=REPO, timeout=300)
    results = json.loads(out.read_text())
    assert set(results["load_s"]) == {"gptq", "awq"}
    for timing in results["load_s"].values():
        assert len(timing["all"]) == 2 and 0 < timing["min"] == min(timing["all"])
    written = {p: p.stat().st_mtime_ns for p in work.rglob("*.safetensors")}
    subprocess.run(command, check=True, cwd=REPO, timeout=300)
    assert written and {p: p.stat().st_mtime_ns for p in work.rglob("*.safetensors")} == written  # not rewritten
