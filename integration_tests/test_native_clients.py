"""TGI's native parameter set and the clients that speak it: `huggingface_hub`'s
InferenceClient (text_generation with details and streaming, chat_completion streaming),
green-list watermarking found by the detector, and the native extras (best_of,
top_n_tokens, decoder_input_details, truncate, return_full_text, typical_p)."""
import json

import httpx
import pytest
from huggingface_hub import InferenceClient

from shard_server.watermark import z_score

STORY = "Write a short story about a dragon."


@pytest.fixture(scope="module")
def hf(server):
    return InferenceClient(base_url=server.url, timeout=300)


def generate(url, inputs, **parameters):
    response = httpx.post(url + "/generate", json={"inputs": inputs, "parameters": parameters}, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_text_generation_with_details_and_streaming(hf, reference):
    prompt = "The capital of France is"
    expected = reference(prompt, 12)
    out = hf.text_generation(prompt, max_new_tokens=12, details=True, decoder_input_details=True, top_n_tokens=3)
    assert [t.id for t in out.details.tokens] == expected
    assert out.details.finish_reason == "length"
    assert out.details.prefill[0].logprob is None and out.details.prefill[1].logprob < 0
    assert all(len(top) == 3 for top in out.details.top_tokens)
    streamed = list(hf.text_generation(prompt, max_new_tokens=12, stream=True, details=True))
    assert [e.token.id for e in streamed] == expected
    assert streamed[-1].generated_text == out.generated_text
    assert streamed[-1].details.finish_reason == "length"


def test_chat_completion_streaming(hf, reference):
    messages = [{"role": "user", "content": "Name a color."}]
    whole = hf.chat_completion(messages, max_tokens=10, temperature=0)
    chunks = list(hf.chat_completion(messages, max_tokens=10, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]


def _z(url, demo_model_dir, watermark, seed):
    body = generate(
        url, STORY, max_new_tokens=100, do_sample=True, seed=seed, watermark=watermark,
        details=True, decoder_input_details=True,
    )
    vocab = json.loads((demo_model_dir / "config.json").read_text())["vocab_size"]
    ids = [body["details"]["prefill"][-1]["id"]] + [t["id"] for t in body["details"]["tokens"]]
    return z_score(ids, vocab, 0.5)


def test_watermark_is_found_in_watermarked_text_only(server, demo_model_dir):
    for seed in (1, 2):
        assert _z(server.url, demo_model_dir, True, seed) > 4
        assert abs(_z(server.url, demo_model_dir, False, seed)) < 3


def test_native_extras(server, reference):
    prompt = "def fibonacci(n):"
    best = generate(server.url, prompt, max_new_tokens=6, best_of=2, do_sample=True, details=True)
    assert len(best["details"]["best_of_sequences"]) == 1
    full = generate(server.url, prompt, max_new_tokens=6, return_full_text=True)
    assert full["generated_text"].startswith(prompt)
    truncated = generate(server.url, "one two three " * 20 + prompt, max_new_tokens=6, truncate=6, details=True,
                         decoder_input_details=True)
    assert len(truncated["details"]["prefill"]) == 6
    typical = generate(server.url, prompt, max_new_tokens=6, typical_p=0.5, seed=3, details=True)
    assert typical["details"]["seed"] == 3 and typical["details"]["generated_tokens"] == 6


def test_chat_tokenize_and_invocations(server, reference):
    messages = [{"role": "user", "content": "Hi"}]
    out = httpx.post(server.url + "/chat_tokenize", json={"messages": messages}, timeout=60).json()
    expected = reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert out["templated_text"] == expected
    assert [t["id"] for t in out["tokenize_response"]] == reference.tokenizer(expected, add_special_tokens=False).input_ids
    chat = httpx.post(server.url + "/invocations", json={"messages": messages, "max_tokens": 2}, timeout=60)
    assert chat.json()["object"] == "chat.completion"
    native = httpx.post(server.url + "/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, timeout=60)
    assert native.status_code == 200 and "generated_text" in native.json()[0]


def test_openapi_document_and_offline_swagger_ui(server):
    doc = httpx.get(server.url + "/api-doc/openapi.json", timeout=10).json()
    assert {"/generate", "/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(doc["paths"])
    page = httpx.get(server.url + "/docs/", timeout=10)
    assert page.status_code == 200 and "swagger-ui" in page.text
    bundle = httpx.get(server.url + "/docs/swagger-ui-bundle.js", timeout=10)
    assert bundle.status_code == 200 and len(bundle.content) > 100_000, "assets are served locally"
