"""schemathesis in negative mode against the real stack, at benchmark size (issue 27).

CI runs a seeded 15-example pass (integration_tests/test_openapi_fuzz.py); this runs the same
checks over every route of the served OpenAPI document with enough examples for at least
10,000 cases: invalid bodies, parameters and headers, where every answer must be a documented
4xx (or a 2xx the document allows), never a 5xx, a crash or a body that breaks the document.
The server then still answers /health and a real generation.

    PYTHONPATH=. .venv/bin/python bench/openapi_fuzz.py --out bench/results/openapi_fuzz_cpu.json

Reports the cases generated, passed and failed (schemathesis' own summary), every response's
status code by route (from its NDJSON events), and whether the stack served afterwards.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "integration_tests"))

from server import Server  # noqa: E402

# negative_data_rejection: a request the document calls invalid must get a 4xx, never a 2xx.
CHECKS = ("not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance,"
          "negative_data_rejection")
# The integration test's limits: fuzzed generations stay short on a CPU.
SERVER_FLAGS = ("--max-total-tokens", "48", "--max-input-tokens", "40", "--max-batch-prefill-tokens", "256")


def run_schemathesis(url: str, examples: int, seed: int, events: Path) -> tuple[int, str, float]:
    command = [str(Path(sys.executable).parent / "schemathesis"), "run", url + "/api-doc/openapi.json",
               "--mode", "negative", "--phases", "coverage,fuzzing", "--checks", CHECKS,
               "--max-examples", str(examples), "--seed", str(seed), "--request-timeout", "120",
               "--suppress-health-check", "all", "--report-ndjson-path", str(events)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - started


def summary_counts(output: str) -> dict:
    """schemathesis' 'Test cases:' line: 'N generated, N passed' (or '..., N found M unique failures')."""
    counts = {}
    for number, word in re.findall(r"(\d+) (generated|passed|failed|skipped|unique failures)", output):
        counts[word.replace(" ", "_")] = int(number)
    return counts


def statuses_by_route(events: Path) -> dict[str, dict[str, int]]:
    """Every recorded response's status code, by 'METHOD path', from the NDJSON events."""
    by_route: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in events.read_text().splitlines():
        event = json.loads(line)
        finished = event.get("ScenarioFinished")
        if not finished:
            continue
        label = finished["recorder"].get("label", "?")
        for interaction in finished["recorder"].get("interactions", {}).values():
            response = interaction.get("response") or {}
            by_route[label][str(response.get("status_code", "no response"))] += 1
    return {route: dict(sorted(counts.items())) for route, counts in sorted(by_route.items())}


def serves_afterwards(url: str) -> dict:
    health = httpx.get(url + "/health", timeout=30).status_code
    answer = httpx.post(url + "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}}, timeout=120)
    text = answer.json().get("generated_text") if answer.status_code == 200 else None
    return {"health": health, "generate": answer.status_code, "generated_text": text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--examples", type=int, default=1500, help="schemathesis --max-examples per operation")
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    server = Server(*SERVER_FLAGS)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            events = Path(tmp) / "events.ndjson"
            code, output, wall_s = run_schemathesis(server.url, args.examples, args.seed, events)
            statuses = statuses_by_route(events)
        after = serves_afterwards(server.url)
        alive = server.process.poll() is None
    finally:
        server.stop()
    five_xx = sum(n for counts in statuses.values() for status, n in counts.items() if status.startswith("5"))
    version = subprocess.run([str(Path(sys.executable).parent / "schemathesis"), "--version"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    result = {
        "schemathesis": version, "mode": "negative", "phases": "coverage,fuzzing", "checks": CHECKS,
        "max_examples": args.examples, "seed": args.seed, "server_flags": list(SERVER_FLAGS),
        "exit_code": code, "wall_s": round(wall_s, 1), "cases": summary_counts(output),
        "responses": sum(sum(c.values()) for c in statuses.values()), "responses_5xx": five_xx,
        "statuses_by_route": statuses, "after": after, "launcher_alive": alive,
        "summary": output[output.rfind("SUMMARY") - 40:][-3000:] if "SUMMARY" in output else output[-3000:],
        "failures": output[output.find("FAILURES"):output.rfind("SUMMARY")][:20000] if "FAILURES" in output else "",
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("exit_code", "wall_s", "cases", "responses", "responses_5xx", "after")}))


if __name__ == "__main__":
    main()
