"""Shared pieces of the structured-output, tool-calling and client tests: the curated schemas
they send, the validator every constrained answer must pass, and small HTTP helpers."""
from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx

from bench.json_validity import validator

SUBSET = Path(__file__).resolve().parent.parent / "tests" / "data" / "jsonschemabench"

# The TGI finish reasons that mean the model (or the grammar) ended the answer itself.
NATIVE_STOPPED = ("eos_token", "stop_sequence")
# The session server's --max-concurrent-requests is 24; stay below it.
CONCURRENCY = 16


def assert_valid(text: str, schema: Any, where: str = "") -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{where}: not JSON ({exc}): {text!r}") from None
    errors = [e.message for e in validator(schema).iter_errors(value)]
    assert not errors, f"{where}: {text!r} breaks its schema: {errors[:3]}"
    return value


def _shortest_valid(tests: list[dict]) -> int:
    return min(len(json.dumps(t["data"], separators=(", ", ": "))) for t in tests if t["valid"])


def curated(count: int, salt: str, max_schema_chars: int = 1500, max_instance_chars: int = 160
            ) -> list[tuple[str, dict]]:
    """`count` schemas of tests/data/jsonschemabench, the same every run: small schemas
    (a short prompt) with a short valid instance (an answer that fits a small token budget)
    whose valid instances pass `validator` (so the check is the schema's, not the
    validator's quirks), in the order of a salted SHA-256 of their file names."""
    eligible = []
    for path in sorted(SUBSET.glob("*.json")):
        data = json.loads(path.read_text())
        schema, tests = data["schema"], data["tests"]
        if not any(t["valid"] for t in tests) or len(json.dumps(schema)) > max_schema_chars:
            continue
        if _shortest_valid(tests) > max_instance_chars:
            continue
        check = validator(schema)
        if all(check.is_valid(t["data"]) for t in tests if t["valid"]):
            eligible.append((path.name, schema))
    eligible.sort(key=lambda item: hashlib.sha256(f"{salt}|{item[0]}".encode()).hexdigest())
    assert len(eligible) >= count, f"only {len(eligible)} eligible schemas in {SUBSET}"
    return eligible[:count]


def json_prompt(schema: Any) -> str:
    return ("Write one JSON document that follows this JSON Schema.\n"
            f"Schema: {json.dumps(schema)}\nJSON document: ")


def post_all(url: str, bodies: list[tuple[str, dict]], concurrency: int = CONCURRENCY,
             timeout: float = 600) -> list[httpx.Response]:
    """POSTs (path, body) pairs concurrently, at most `concurrency` at a time; answers in order."""
    async def main():
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
            async def one(path, body):
                async with gate:
                    return await client.post(path, json=body)
            return await asyncio.gather(*(one(path, body) for path, body in bodies))

    return asyncio.run(main())


def sse_events(response: httpx.Response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            payload = line[len("data:"):].strip()
            if payload and payload != "[DONE]":
                events.append(json.loads(payload))
    return events


def stream_generate(url: str, body: dict, timeout: float = 600) -> tuple[str, list[dict]]:
    """/generate_stream: (concatenated text of the non-special tokens, all events)."""
    with httpx.stream("POST", url + "/generate_stream", json=body, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        events = sse_events(response)
    text = "".join(e["token"]["text"] for e in events if not e["token"]["special"])
    return text, events


def error_message(response: httpx.Response) -> str:
    """The message of a native (`{"error": ...}`) or OpenAI (`{"error": {"message"}}`) error."""
    body = response.json()
    error = body.get("error", body)
    return error["message"] if isinstance(error, dict) else str(error)
