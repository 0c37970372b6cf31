"""Replays hostile_corpus.CORPUS against the real stack (issue 27): every case gets exactly
its status and error JSON, and after every CHUNK cases (each test below is one chunk) a
normal greedy /generate and a normal streamed /v1/chat/completions still give the answers
they gave before the first case, and the KV gauges are back at idle."""
from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest

from hostile_corpus import CORPUS, Answer, Case
from server import metric, scrape_metrics

CHUNK = 40
IDLE_WITHIN = 60.0  # seconds for the KV gauges to settle once the last answer is in


def wire(case: Case, route: str) -> bytes:
    if case.wire is not None:
        return case.wire
    method, target = route.split(" ", 1)
    body = case.body if isinstance(case.body, bytes) else b"" if case.body is None else json.dumps(case.body).encode()
    head = f"{method} {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in case.headers)
    if method != "GET":
        head += f"content-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def exchange(port: int, request: bytes, timeout: float = 300.0) -> Answer:
    """Sends `request` on a fresh connection and reads until the server closes it (every
    request says `connection: close`, and hyper closes after its own refusals)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was all sent (431); the answer is still there to read
        data = b""
        while True:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, f"no HTTP answer: {data[:300]!r}"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body, rest = dechunk(rest)
    else:
        length = int(headers.get("content-length", len(rest)))
        body, rest = rest[:length], rest[length:]
    responses = 1 + len(re.findall(rb"HTTP/1\.[01] \d{3}", rest))
    return Answer(int(status_line.split()[1]), headers, body, responses)


def dechunk(data: bytes) -> tuple[bytes, bytes]:
    body = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return body, data.partition(b"\r\n")[2]
        body, data = body + data[:size], data[size + 2:]


def replay(port: int, case: Case, route: str) -> str | None:
    """None when the answer is exactly the expected one, else what was wrong."""
    try:
        answer = exchange(port, wire(case, route))
    except (OSError, AssertionError) as exc:
        return f"no answer: {exc!r}"
    if answer.status != case.status:
        return f"status {answer.status}, expected {case.status}: {answer.body[:400]!r}"
    if answer.responses != 1:
        return f"{answer.responses} responses on one connection: a smuggled request was answered"
    try:
        case.check(answer)
    except (AssertionError, ValueError, KeyError, TypeError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:600]}"
    return None


# --- Serving normally --------------------------------------------------------------------

GREEDY = {"inputs": "The capital of France is", "parameters": {"max_new_tokens": 6}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 6,
        "temperature": 0, "stream": True}


def greedy_text(url: str) -> str:
    response = httpx.post(url + "/generate", json=GREEDY, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["generated_text"]


def streamed_chat(url: str) -> str:
    deltas, done = [], False
    with httpx.stream("POST", url + "/v1/chat/completions", json=CHAT, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            event = json.loads(data)
            assert "error" not in event, event
            deltas.extend(c["delta"].get("content") or "" for c in event["choices"])
    assert done, "the stream ended without [DONE]"
    return "".join(deltas)


def kv_idle(url: str) -> dict[str, float]:
    """The gauges once idle, or their last reading after IDLE_WITHIN."""
    names = ("textgen_kv_blocks_used", "textgen_running_requests", "textgen_waiting_requests")
    deadline = time.monotonic() + IDLE_WITHIN
    while True:
        samples = scrape_metrics(url)
        gauges = {name: metric(samples, name) for name in names}
        if not any(gauges.values()) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.25)


@pytest.fixture(scope="module")
def baseline(server):
    """The normal answers before any hostile case, on an idle server."""
    assert not any(kv_idle(server.url).values())
    return greedy_text(server.url), streamed_chat(server.url)


def assert_serving_normally(url: str, baseline: tuple[str, str]) -> None:
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert greedy_text(url) == baseline[0]
    assert streamed_chat(url) == baseline[1]
    gauges = kv_idle(url)
    assert not any(gauges.values()), f"not idle {IDLE_WITHIN:.0f} s after the answers: {gauges}"


# --- The tests ---------------------------------------------------------------------------


def test_the_corpus_has_at_least_60_kinds_with_unique_names():
    names = [case.name for case in CORPUS]
    assert len(names) >= 60, len(names)
    assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})
    assert all(case.routes for case in CORPUS)


CHUNKS = [CORPUS[i:i + CHUNK] for i in range(0, len(CORPUS), CHUNK)]


@pytest.mark.parametrize("chunk", CHUNKS, ids=[f"{c[0].name} .. {c[-1].name}" for c in CHUNKS])
def test_each_hostile_case_gets_its_exact_answer_and_the_server_serves_on(server, baseline, chunk):
    wrong = []
    for case in chunk:
        for route in case.routes:
            problem = replay(server.port, case, route)
            if problem:
                wrong.append(f"{case.name} [{route}]: {problem}")
    assert_serving_normally(server.url, baseline)
    assert not wrong, "\n".join(wrong)
