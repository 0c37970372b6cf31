"""Prefill pacing (`--prefill-pacing-slack`), as a user turns it on: a prompt that arrives while
streams decode is prefilled in paced chunks beside them, the metric counts the paced steps, and
every answer is still the greedy answer."""

import json
import threading

import httpx
import pytest
from server import Server

LONG_PROMPT = "word " * 700
SHORT_PROMPT = "Hello there, tell me a story"


@pytest.fixture(scope="module")
def paced_server():
    # Patience far past the test's length: pacing never yields, so every such step is paced.
    srv = Server("--prefill-pacing-slack", "0.25", "--prefill-pacing-patience-ms", "600000")
    yield srv
    srv.stop()


def _generated_ids(url: str, prompt: str, max_new_tokens: int) -> list[int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "details": True}}
    response = httpx.post(f"{url}/generate", json=body, timeout=600)
    response.raise_for_status()
    return [token["id"] for token in response.json()["details"]["tokens"]]


def _paced_steps(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("textgen_prefill_paced_steps_total"):
            return float(line.split()[-1])
    return 0.0


def test_a_prompt_beside_running_streams_is_paced_and_answers_as_unpaced(paced_server, reference):
    url = paced_server.url
    streaming = [threading.Event(), threading.Event()]
    streamed: list[list[int]] = [[], []]

    def stream(index: int) -> None:
        body = {"inputs": SHORT_PROMPT, "parameters": {"max_new_tokens": 48}}
        with httpx.stream("POST", f"{url}/generate_stream", json=body, timeout=600) as response:
            for line in response.iter_lines():
                if line.startswith("data:") and '"token"' in line:
                    streamed[index].append(json.loads(line[5:])["token"]["id"])
                    if len(streamed[index]) == 3:
                        streaming[index].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for event in streaming:
        assert event.wait(300), "the streams did not start"
    before = _paced_steps(url)
    answer = _generated_ids(url, LONG_PROMPT, 4)  # its chunks run beside the two decoding streams
    for thread in threads:
        thread.join(600)
    assert _paced_steps(url) > before
    assert answer == reference(LONG_PROMPT, 4)
    assert streamed[0] == streamed[1] == reference(SHORT_PROMPT, 48)
