"""Hostile input, overload, disconnects and shutdown against the real stack."""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server import SESSION_MAX_CONCURRENT as MAX_CONCURRENT
from server import Server, metric, scrape_metrics

LONG = {"max_new_tokens": 200}

# (name, raw body or JSON-able object, extra headers)
MALFORMED = [
    ("invalid json", b'{"inputs": "hi", ', None),
    ("not utf-8", b'{"inputs": "\xff\xfe"}', None),
    ("json array body", [1, 2, 3], None),
    ("missing inputs", {"parameters": {"max_new_tokens": 5}}, None),
    ("inputs is a number", {"inputs": 42}, None),
    ("empty inputs", {"inputs": ""}, None),
    ("parameters is a list", {"inputs": "hi", "parameters": [1]}, None),
    ("temperature zero", {"inputs": "hi", "parameters": {"temperature": 0}}, None),
    ("temperature negative", {"inputs": "hi", "parameters": {"temperature": -1.0}}, None),
    ("temperature is a string", {"inputs": "hi", "parameters": {"temperature": "hot"}}, None),
    ("top_p one", {"inputs": "hi", "parameters": {"top_p": 1.0}}, None),
    ("top_p zero", {"inputs": "hi", "parameters": {"top_p": 0.0}}, None),
    ("top_k zero", {"inputs": "hi", "parameters": {"top_k": 0}}, None),
    ("typical_p above one", {"inputs": "hi", "parameters": {"typical_p": 1.5}}, None),
    ("repetition_penalty zero", {"inputs": "hi", "parameters": {"repetition_penalty": 0}}, None),
    ("frequency_penalty out of range", {"inputs": "hi", "parameters": {"frequency_penalty": 3}}, None),
    ("max_new_tokens zero", {"inputs": "hi", "parameters": {"max_new_tokens": 0}}, None),
    ("max_new_tokens negative", {"inputs": "hi", "parameters": {"max_new_tokens": -5}}, None),
    ("max_new_tokens beyond total", {"inputs": "hi", "parameters": {"max_new_tokens": 10**9}}, None),
    ("too many stop sequences", {"inputs": "hi", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}, None),
    ("truncate zero", {"inputs": "hi", "parameters": {"truncate": 0}}, None),
    ("top_n_tokens over limit", {"inputs": "hi", "parameters": {"top_n_tokens": 100}}, None),
    ("best_of over limit", {"inputs": "hi", "parameters": {"best_of": 9, "do_sample": True}}, None),
    ("best_of with seed", {"inputs": "hi", "parameters": {"best_of": 2, "do_sample": True, "seed": 1}}, None),
    ("seed negative", {"inputs": "hi", "parameters": {"seed": -1}}, None),
    ("prompt too long", {"inputs": "hello " * 50000}, None),
    ("wrong content type", b'inputs=hi', {"content-type": "application/x-www-form-urlencoded"}),
]


def post(url, path, body, headers=None):
    if isinstance(body, bytes):
        headers = headers or {"content-type": "application/json"}
        return httpx.post(url + path, content=body, headers=headers, timeout=60)
    return httpx.post(url + path, json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("name,body,headers", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_input_gets_tgi_error(server, name, body, headers):
    for path in ("/generate", "/generate_stream"):
        response = post(server.url, path, body, headers)
        assert 400 <= response.status_code < 500, (name, path, response.status_code, response.text)
        error = response.json()
        assert isinstance(error["error"], str) and error["error"]
        assert isinstance(error["error_type"], str) and error["error_type"]
    # The server keeps serving.
    ok = post(server.url, "/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
    assert ok.status_code == 200


# Finite in f64, infinite in f32 (the shard's precision): each once took the whole server down
# and sent its parameters to another client's stream (issue 27, defect 1).
F32_OVERFLOW = [
    {"temperature": 1e308},
    {"temperature": 3.5e38},
    {"repetition_penalty": 1e39},
]


def test_f32_overflowing_parameters_fail_alone_and_others_stream_on(server):
    events: list[str] = []

    def other_client():
        body = {"model": "tgi", "prompt": "Count to one hundred:", "max_tokens": 40, "stream": True,
                "seed": 424242}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as response:
            assert response.status_code == 200
            events.extend(line for line in response.iter_lines() if line.startswith("data:"))

    with ThreadPoolExecutor(1) as pool:
        streaming = pool.submit(other_client)
        time.sleep(0.5)
        for parameters in F32_OVERFLOW:
            for path in ("/generate", "/generate_stream"):
                body = {"inputs": "Hi", "parameters": {**parameters, "max_new_tokens": 2}}
                response = post(server.url, path, body)
                assert response.status_code == 422, (parameters, path, response.text)
                assert "finite" in response.json()["error"]
        streaming.result()
    assert events[-1] == "data: [DONE]"
    assert not any("error" in json.loads(e[5:]) for e in events[:-1]), events[-2:]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_validation_errors_are_422(server):
    response = post(server.url, "/generate", {"inputs": "hi", "parameters": {"temperature": 0}})
    assert response.status_code == 422
    assert response.json()["error_type"] == "validation"


def test_payload_limit_is_413(server):
    response = post(server.url, "/generate", {"inputs": "x" * 3_000_000})
    assert response.status_code == 413
    assert response.json()["error_type"]


def test_overload_gets_429(server):
    statuses = []
    release = threading.Event()

    def hold_stream(_):
        try:
            with httpx.stream(
                "POST", server.url + "/generate_stream",
                json={"inputs": "Count to one thousand:", "parameters": LONG}, timeout=120,
            ) as response:
                statuses.append(response.status_code)
                if response.status_code == 200:
                    for _ in response.iter_lines():
                        if release.is_set():
                            break
                else:
                    body = json.loads(response.read())
                    assert body["error_type"] == "overloaded"
        except httpx.HTTPError:
            statuses.append("error")

    with ThreadPoolExecutor(MAX_CONCURRENT + 8) as pool:
        futures = [pool.submit(hold_stream, i) for i in range(MAX_CONCURRENT + 8)]
        deadline = time.monotonic() + 120
        while len(statuses) < MAX_CONCURRENT + 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        release.set()
        for f in futures:
            f.result()
    assert statuses.count(429) >= 8, statuses
    assert statuses.count(200) >= 1
    assert "error" not in statuses


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def blocks_held_by_requests(url) -> float:
    """KV blocks some sequence holds (blocks kept only by the prefix cache are not counted)."""
    return metric(scrape_metrics(url), "textgen_kv_blocks_used")


def test_disconnect_frees_kv_blocks(server):
    assert wait_for(lambda: blocks_held_by_requests(server.url) == 0)
    with httpx.stream(
        "POST", server.url + "/generate_stream",
        # A long greedy count: the stream must still be running when we look, even on a
        # loaded 2-core machine.
        json={"inputs": "1, 2, 3, 4, 5,", "parameters": {"max_new_tokens": 1500}}, timeout=60,
    ) as response:
        seen = 0
        # Held in a name: leaving the loop must not close the iterator (and with it the
        # connection) before we look.
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                seen += 1
                if seen == 3:
                    break
        assert seen == 3
        assert blocks_held_by_requests(server.url) > 0
    # Connection closed mid-stream: the request's blocks come back (to the pool or the cache).
    assert wait_for(lambda: blocks_held_by_requests(server.url) == 0)
    assert metric(scrape_metrics(server.url), "textgen_running_requests") == 0


def test_sigterm_drains_inflight_stream():
    server = Server()
    try:
        events = []
        with httpx.stream(
            "POST", server.url + "/generate_stream",
            json={"inputs": "List the planets of the solar system:",
                  "parameters": {"max_new_tokens": 40}},
            timeout=120,
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[len("data:"):]))
                    if len(events) == 1:
                        server.terminate()
        assert events[-1]["generated_text"] is not None
        assert events[-1]["details"]["generated_tokens"] == len(events)
        assert server.process.wait(120) == 0
        # New connections are refused once draining has finished.
        with pytest.raises(httpx.HTTPError):
            httpx.get(server.url + "/health", timeout=2)
    finally:
        server.stop()
