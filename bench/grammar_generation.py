"""Generation validity: JSON Schemas of the shared corpus sent through a running textgen with
`response_format: json_schema`, and every answer checked with `jsonschema` (issue 22).

For each schema (at least 2,000 of the JSONSchemaBench/MaskBench corpus, picked in the order
of a salted SHA-256 of their file names, so the sample is the same every run and spread over
the sub-collections) one greedy /v1/chat/completions request asks for a JSON document under
that schema, with `max_tokens` 512. Reported:

- the share of answers that end with `stop` (bar: >= 99 %),
- the share of those that validate (the schema's own draft, format checks on; bar: 100 %),
- schemas the server refuses up front (400: what llguidance cannot enforce), request errors,
  and answers the validator itself cannot judge (a schema Python's `jsonschema` rejects).

Start a server with the launcher, then run this against it:

    .venv/bin/textgen-launcher --port 3000 --max-concurrent-requests 64 &
    .venv/bin/python bench/grammar_generation.py --url http://127.0.0.1:3000 \
        --corpus ../shared/data/jsonschemabench.tar.xz --count 2000 --concurrency 16

It writes bench/results/grammar_generation_<name>.json (summary), .md (tables) and .jsonl
(one row per schema, written as answers come, so a stopped run keeps what it did).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grammar_conformance import (SHARED_CORPUS, collection_of, corpus_files,  # noqa: E402
                                       cpu_name, percentile)

RESULTS = Path(__file__).resolve().parent / "results"
# Schemas longer than this are not repeated in the prompt (the constraint does the work;
# the prompt must fit the context).
MAX_PROMPT_SCHEMA_CHARS = 6000
SYSTEM = "You write JSON documents. Answer with the JSON document only."
# An answer cut by max_tokens "loops" when its last LOOP_WINDOW characters repeat with a period
# of at most LOOP_LONGEST: the model is cycling, and no longer budget would finish it.
LOOP_WINDOW, LOOP_LONGEST = 240, 120


def pick(files: list[str], count: int, salt: str) -> list[str]:
    order = sorted(files, key=lambda f: hashlib.sha256(f"{salt}|{Path(f).name}".encode()).hexdigest())
    return order[:count]


def messages_for(schema: Any) -> list[dict]:
    text = json.dumps(schema)
    if len(text) <= MAX_PROMPT_SCHEMA_CHARS:
        user = f"Write a JSON document valid under this JSON Schema:\n{text}"
    else:
        user = "Write a JSON document valid under the JSON Schema you are given."
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def loop_period(text: str, window: int = LOOP_WINDOW, longest: int = LOOP_LONGEST) -> int | None:
    """The shortest period p <= `longest` with which the last `window` characters repeat
    (text[i] == text[i + p] throughout), or None: whether an unfinished answer is stuck in a loop."""
    tail = text[-window:]
    if len(tail) < window:
        return None
    return next((p for p in range(1, longest + 1) if tail[p:] == tail[:-p]), None)


def check(text: str, schema: Any) -> tuple[str, str | None]:
    """'valid', 'invalid' (with the first error) or 'unjudged' (the validator cannot
    handle the schema itself)."""
    from bench.json_validity import validator

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return "invalid", f"not JSON: {exc}"
    try:
        error = next(iter(validator(schema).iter_errors(value)), None)
    except Exception as exc:  # SchemaError, unresolvable $ref, bad pattern for Python's re, ...
        return "unjudged", f"{type(exc).__name__}: {exc}"[:300]
    return ("valid", None) if error is None else ("invalid", error.message[:300])


async def run_one(client: httpx.AsyncClient, path: str, args) -> dict:
    name = Path(path).name
    row: dict[str, Any] = {"file": name, "collection": collection_of(name)}
    try:
        schema = json.loads(Path(path).read_text())["schema"]
    except (OSError, ValueError, KeyError) as exc:
        return {**row, "outcome": "unreadable", "detail": str(exc)}
    body = {"model": args.model, "messages": messages_for(schema), "max_tokens": args.max_tokens,
            "temperature": args.temperature, "response_format": {"type": "json_schema", "json_schema": {
                "name": "answer", "schema": schema, "strict": True}}}
    started = time.monotonic()
    try:
        response = await client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        return {**row, "outcome": "request_error", "detail": f"{type(exc).__name__}: {exc}"[:300],
                "seconds": time.monotonic() - started}
    row["seconds"] = round(time.monotonic() - started, 3)
    if response.status_code == 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        return {**row, "outcome": "refused", "detail": message[:300]}
    if response.status_code != 200:
        return {**row, "outcome": "http_error", "status": response.status_code, "detail": response.text[:300]}
    answer = response.json()
    choice = answer["choices"][0]
    row["finish_reason"] = choice["finish_reason"]
    row["completion_tokens"] = answer["usage"]["completion_tokens"]
    if choice["finish_reason"] != "stop":
        text = choice["message"]["content"] or ""
        return {**row, "outcome": choice["finish_reason"], "loop_period": loop_period(text), "tail": text[-200:]}
    verdict, detail = check(choice["message"]["content"] or "", schema)
    row.update(outcome=f"stop_{verdict}", detail=detail)
    if verdict == "invalid":
        row["text"] = (choice["message"]["content"] or "")[:2000]
    return row


async def run_all(files: list[str], args, sink) -> list[dict]:
    gate = asyncio.Semaphore(args.concurrency)
    rows: list[dict] = []
    done = 0
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout) as client:
        async def guarded(path: str) -> None:
            nonlocal done
            async with gate:
                row = await run_one(client, path, args)
            rows.append(row)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            done += 1
            if done % 50 == 0 or done == len(files):
                counts = Counter(r["outcome"] for r in rows)
                print(f"{done}/{len(files)} {dict(counts)}", file=sys.stderr, flush=True)

        await asyncio.gather(*(guarded(path) for path in files))
    return rows


def share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def summarise(rows: list[dict], args, model: str, seconds: float) -> dict:
    counts = Counter(r["outcome"] for r in rows)
    answered = sum(counts[k] for k in counts if k.startswith("stop_") or k in ("length", "tool_calls",
                                                                                "content_filter"))
    stopped = sum(counts[k] for k in counts if k.startswith("stop_"))
    judged = counts["stop_valid"] + counts["stop_invalid"]
    by_collection: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        by_collection[r["collection"]][r["outcome"]] += 1
    tokens = [r["completion_tokens"] for r in rows if "completion_tokens" in r]
    latency = [r["seconds"] for r in rows if "completion_tokens" in r]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    return {
        "benchmark": "grammar_generation", "url": args.url, "model": model, "commit": commit,
        "corpus": str(args.corpus), "schemas": len(rows), "salt": args.salt,
        "max_tokens": args.max_tokens, "concurrency": args.concurrency,
        "decoding": "greedy" if args.temperature == 0 else f"sampled, temperature {args.temperature}",
        "route": "/v1/chat/completions response_format json_schema strict",
        "client_machine": {"cpu": cpu_name(), "python": platform.python_version()},
        "wall_seconds": round(seconds, 1),
        "outcomes": dict(sorted(counts.items())),
        "answered": answered, "ended_with_stop": stopped,
        "share_ended_with_stop": share(stopped, answered),
        "share_stop_valid": share(counts["stop_valid"], judged),
        "stop_invalid": counts["stop_invalid"], "stop_unjudged": counts["stop_unjudged"],
        "refused_up_front": counts["refused"],
        "length_looping": sum(r.get("loop_period") is not None for r in rows if r["outcome"] == "length"),
        "completion_tokens": {"p50": percentile(tokens, 50), "p99": percentile(tokens, 99),
                              "max": max(tokens, default=None), "total": sum(tokens)},
        "latency_seconds": {"p50": percentile(latency, 50), "p99": percentile(latency, 99)},
        "by_collection": {k: dict(sorted(v.items())) for k, v in sorted(by_collection.items())},
    }


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f} %"


def markdown(summary: dict) -> str:
    o = summary["outcomes"]
    lines = [
        f"# Generation validity: {summary['schemas']} corpus schemas, {summary['model']}",
        "",
        f"{summary['decoding'].capitalize()}, `response_format: json_schema` (strict), "
        f"max_tokens {summary['max_tokens']}, "
        f"{summary['concurrency']} requests at a time, against {summary['url']} (commit "
        f"{summary['commit'] or '?'}), {summary['wall_seconds']} s. Client CPU: "
        f"{summary['client_machine']['cpu']}.",
        *([f"Re-judged afterwards (`--rejudge`): {summary['rejudged']} answer(s) first judged invalid.", ""]
          if summary.get("rejudged") else []),
        "",
        "| measure | value | bar |",
        "|:--|--:|:--|",
        f"| answers ending with `stop` | {summary['ended_with_stop']} / {summary['answered']} "
        f"({pct(summary['share_ended_with_stop'])}) | >= 99 % |",
        f"| `stop` answers that validate | {o.get('stop_valid', 0)} / "
        f"{o.get('stop_valid', 0) + o.get('stop_invalid', 0)} ({pct(summary['share_stop_valid'])}) | 100 % |",
        f"| `stop` answers the validator cannot judge | {summary['stop_unjudged']} | |",
        f"| refused up front (400) | {summary['refused_up_front']} | |",
        f"| ended by `length` | {o.get('length', 0)} | |",
        f"| of which looping (last {LOOP_WINDOW} characters repeat, period <= {LOOP_LONGEST}) | "
        f"{summary.get('length_looping', 'n/a')} | |",
        f"| HTTP / request errors | {o.get('http_error', 0) + o.get('request_error', 0)} | 0 |",
        f"| completion tokens p50 / p99 / max | {summary['completion_tokens']['p50']} / "
        f"{summary['completion_tokens']['p99']} / {summary['completion_tokens']['max']} | |",
        "",
        "| sub-collection | " + " | ".join(["schemas", "stop_valid", "stop_invalid", "length", "refused",
                                              "other"]) + " |",
        "|:--|" + "--:|" * 6,
    ]
    for name, counts in summary["by_collection"].items():
        total = sum(counts.values())
        named = sum(counts.get(k, 0) for k in ("stop_valid", "stop_invalid", "length", "refused"))
        lines.append(f"| {name} | {total} | {counts.get('stop_valid', 0)} | {counts.get('stop_invalid', 0)} | "
                     f"{counts.get('length', 0)} | {counts.get('refused', 0)} | {total - named} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000", help="a running textgen")
    parser.add_argument("--corpus", type=Path, default=SHARED_CORPUS if SHARED_CORPUS.exists() else None,
                        help="folder of corpus .json files, or the .tar.xz (default: "
                             "../shared/data/jsonschemabench.tar.xz when present)")
    parser.add_argument("--count", type=int, default=2000, help="schemas to send")
    parser.add_argument("--salt", default="textgen-grammar-generation-1", help="sample order")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    parser.add_argument("--model", default=None, help="default: the server's first /v1/models id")
    parser.add_argument("--name", default="cpu_demo", help="results file suffix")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--rejudge", action="store_true",
                        help="re-check the invalid answers of the finished run <name> (they keep their text) "
                             "with the current validator and rewrite its summary; sends nothing")
    args = parser.parse_args()
    if args.corpus is None:
        parser.error("--corpus is required (../shared/data is not here)")
    stem = args.out_dir / f"grammar_generation_{args.name}"
    if args.rejudge:
        rejudge(args, stem)
        return

    models = httpx.get(args.url + "/v1/models", timeout=30).json()["data"]
    served = models[0]["id"]
    args.model = args.model or served
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        files = pick(corpus_files(args.corpus, tmp), args.count, args.salt)
        if len(files) < args.count:
            print(f"warning: the corpus has {len(files)} schemas, fewer than --count", file=sys.stderr)
        started = time.monotonic()
        with open(stem.with_suffix(".jsonl"), "w") as sink:
            rows = asyncio.run(run_all(files, args, sink))
        seconds = time.monotonic() - started
    write(stem, summarise(rows, args, served, seconds))


def write(stem: Path, summary: dict) -> None:
    stem.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(summary))
    print(markdown(summary))


def rejudge(args, stem: Path) -> None:
    """Only answers judged invalid kept their text, so only they are judged again (a fix to
    the validator, such as exact multipleOf, can only turn them valid or keep them invalid)."""
    old = json.loads(stem.with_suffix(".json").read_text())
    rows = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        paths = {Path(f).name: f for f in corpus_files(args.corpus, tmp)}
        for row in rows:
            if row["outcome"] == "stop_invalid":
                schema = json.loads(Path(paths[row["file"]]).read_text())["schema"]
                verdict, detail = check(row["text"], schema)
                row.update(outcome=f"stop_{verdict}", detail=detail, rejudged=True)
    stem.with_suffix(".jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    args.url, args.concurrency, args.salt, args.max_tokens = old["url"], old["concurrency"], old["salt"], old["max_tokens"]
    summary = summarise(rows, args, old["model"], old["wall_seconds"])
    summary["commit"], summary["client_machine"] = old["commit"], old["client_machine"]
    summary["rejudged"] = sum(1 for row in rows if row.get("rejudged"))
    write(stem, summary)


if __name__ == "__main__":
    main()
