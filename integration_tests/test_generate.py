"""Greedy correctness, batching invariance and streaming over real HTTP."""
import json
from concurrent.futures import ThreadPoolExecutor

import httpx

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "The three primary colors are",
]


def generate(url, inputs, **parameters):
    response = httpx.post(
        url + "/generate", json={"inputs": inputs, "parameters": parameters}, timeout=300
    )
    assert response.status_code == 200, response.text
    return response.json()


def stream_events(url, inputs, **parameters):
    events = []
    with httpx.stream(
        "POST", url + "/generate_stream",
        json={"inputs": inputs, "parameters": parameters}, timeout=300,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:"):]))
    return events


def test_greedy_matches_transformers(server, reference):
    for prompt in PROMPTS:
        expected = reference(prompt, 24)
        body = generate(server.url, prompt, max_new_tokens=24, details=True)
        ids = [t["id"] for t in body["details"]["tokens"]]
        assert ids == expected, prompt
        text = reference.tokenizer.decode(expected, skip_special_tokens=True)
        assert body["generated_text"] == text


def test_concurrent_requests_match_sequential(server):
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(16)]
    sequential = [generate(server.url, p, max_new_tokens=20)["generated_text"] for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(
            lambda p: generate(server.url, p, max_new_tokens=20)["generated_text"], prompts
        ))
    assert concurrent == sequential


def test_stream_concatenation_equals_generate(server):
    prompt = "Write a haiku about the sea:"
    full = generate(server.url, prompt, max_new_tokens=32, details=True)
    events = stream_events(server.url, prompt, max_new_tokens=32)
    assert len(events) == full["details"]["generated_tokens"]
    for event in events[:-1]:
        assert event["generated_text"] is None
        assert "\ufffd" not in event["token"]["text"]
    final = events[-1]
    assert final["generated_text"] == full["generated_text"]
    assert final["details"]["finish_reason"] == full["details"]["finish_reason"]
    streamed = "".join(e["token"]["text"] for e in events if not e["token"]["special"])
    assert streamed == full["generated_text"]


def test_stop_sequence(server):
    prompt = "1, 2, 3, 4, 5,"
    free = generate(server.url, prompt, max_new_tokens=30)["generated_text"]
    assert " 8," in free, free  # the model counts on; the stop sequence below must cut it
    body = generate(server.url, prompt, max_new_tokens=30, stop=[" 8,"], details=True)
    assert body["details"]["finish_reason"] == "stop_sequence"
    assert body["generated_text"].endswith(" 8,")
    assert body["generated_text"] == free[: free.index(" 8,") + len(" 8,")]


def test_seeded_sampling_is_reproducible(server):
    params = dict(max_new_tokens=16, do_sample=True, temperature=0.9, top_p=0.9, seed=42, details=True)
    a = generate(server.url, "Tell me a story.", **params)
    b = generate(server.url, "Tell me a story.", **params)
    assert a["generated_text"] == b["generated_text"]
    assert a["details"]["seed"] == 42


def test_compat_route_and_tokenize(server):
    response = httpx.post(
        server.url + "/", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}}, timeout=60
    )
    assert response.status_code == 200
    assert isinstance(response.json(), list) and "generated_text" in response.json()[0]

    response = httpx.post(server.url + "/tokenize", json={"inputs": "Hello world"}, timeout=60)
    assert response.status_code == 200
    tokens = response.json()
    assert "".join(t["text"] for t in tokens) == "Hello world"
    assert all({"id", "text", "start", "stop"} <= t.keys() for t in tokens)


def test_info_and_health(server):
    assert httpx.get(server.url + "/health").status_code == 200
    info = httpx.get(server.url + "/info").json()
    assert info["model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert info["max_total_tokens"] > info["max_input_tokens"] > 0
