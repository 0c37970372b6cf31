"""vLLM's output extensions through the `openai` SDK's `extra_body`, against the real stack and
the demo model (issue 22): `min_p`, `stop_token_ids`, `skip_special_tokens` and
`include_stop_str_in_output` each change the answer the way vLLM's do, streamed and not, and
hostile values are 400s naming the field."""
from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

PROMPT = "The three primary colors are"
IM_START = 1  # <|im_start|>: a special token the demo model never ends on
VOCAB = 49152


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(demo_model_dir) / "tokenizer.json"))


def complete(client, stream=False, **fields):
    """The text and finish reason of one greedy completion of PROMPT (streamed: the deltas
    joined)."""
    extra = fields.pop("extra_body", {})
    args = dict(model="m", prompt=fields.pop("prompt", PROMPT), max_tokens=fields.pop("max_tokens", 24),
                temperature=fields.pop("temperature", 0), extra_body=extra, **fields)
    if not stream:
        out = client.completions.create(**args)
        return out.choices[0].text, out.choices[0].finish_reason, out.usage.completion_tokens
    text, finish = "", None
    for chunk in client.completions.create(stream=True, **args):
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    return text, finish, None


def greedy_ids(server, max_new_tokens=24) -> list[int]:
    """The demo model's greedy token ids for PROMPT (TGI's /generate reports them)."""
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": max_new_tokens, "details": True}}
    out = httpx.post(server.url + "/generate", json=body, timeout=600).json()
    return [t["id"] for t in out["details"]["tokens"]]


def test_stop_token_ids_end_the_answer_before_the_token(client, server, tokenizer):
    ids = greedy_ids(server)
    plain, finish, _ = complete(client)
    assert plain == tokenizer.decode(ids) and finish == "length"
    # A token the answer holds, first seen a few tokens in, and not an EOS id.
    at = first_new(ids, 3)
    stop = ids[at]
    cut, finish, used = complete(client, extra_body={"stop_token_ids": [stop]})
    assert finish == "stop" and used == at + 1, (cut, finish, used)
    assert cut == tokenizer.decode(ids[:at]) and plain.startswith(cut)
    streamed, finish, _ = complete(client, stream=True, extra_body={"stop_token_ids": [stop]})
    assert (streamed, finish) == (cut, "stop")
    # With include_stop_str_in_output the stop token's text stays (vLLM).
    kept, finish, _ = complete(client, extra_body={"stop_token_ids": [stop], "include_stop_str_in_output": True})
    assert kept == tokenizer.decode(ids[: at + 1]) and finish == "stop"
    # Chat takes the field too: a token of the greedy answer (from its logprobs) ends it there.
    args = dict(model="m", messages=SKY, max_tokens=16, temperature=0)
    answer = client.chat.completions.create(logprobs=True, **args)
    texts = [t.token for t in answer.choices[0].logprobs.content]
    index, token_id = next((i, one_id(tokenizer, texts[i])) for i in range(2, len(texts))
                           if texts[i] not in texts[:i] and one_id(tokenizer, texts[i]) is not None)
    stopped = client.chat.completions.create(extra_body={"stop_token_ids": [token_id]}, **args)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == "".join(texts[:index])


def first_new(ids: list[int], start: int) -> int:
    return next(i for i in range(start, len(ids)) if ids[i] not in ids[:i] and ids[i] != 2)


def one_id(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return ids[0] if len(ids) == 1 else None


def test_min_tokens_holds_the_requests_stop_tokens_back(client, server, tokenizer):
    ids = greedy_ids(server, 32)
    at = first_new(ids, 3)
    floor = at + 4
    text, finish, used = complete(client, max_tokens=32, extra_body={"stop_token_ids": [ids[at]], "min_tokens": floor})
    assert used >= floor, (text, finish, used)
    # The stop token was banned at position `at`, so the answer leaves the greedy path there.
    assert text.startswith(tokenizer.decode(ids[:at]))
    assert not text.startswith(tokenizer.decode(ids[: at + 1]))


SKY = [{"role": "user", "content": "Describe the sky in one sentence."}]
HI = [{"role": "user", "content": "Say hi."}]


def chat_both(client, messages=SKY, max_tokens=24, **fields):
    """The non-streamed answer and finish reason, then the streamed ones."""
    args = dict(model="m", messages=messages, max_tokens=max_tokens, temperature=0, **fields)
    out = client.chat.completions.create(**args)
    streamed, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            streamed += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return out.choices[0].message.content, out.choices[0].finish_reason, streamed, finish


def test_include_stop_str_in_output_keeps_the_stop_string(client):
    for route in ("completions", "chat"):
        plain = complete(client)[0] if route == "completions" else chat_both(client)[0]
        words = plain.split()
        stop = " " + words[len(words) // 2]
        at = plain.index(stop)
        for include, expected in ((False, plain[:at]), (True, plain[: at + len(stop)])):
            extra = {"include_stop_str_in_output": include}
            if route == "completions":
                whole, finish, _ = complete(client, stop=[stop], extra_body=extra)
                streamed, stream_finish, _ = complete(client, stream=True, stop=[stop], extra_body=extra)
            else:
                whole, finish, streamed, stream_finish = chat_both(client, stop=[stop], extra_body=extra)
            assert (whole, finish) == (expected, "stop"), (route, include, whole)
            assert (streamed, stream_finish) == (whole, finish), (route, include, streamed)


def test_skip_special_tokens_false_keeps_special_token_text(client):
    # logit_bias makes the model write <|im_start|>, a special token that ends nothing.
    forced = {"logit_bias": {str(IM_START): 100}}
    skipped, finish, used = complete(client, max_tokens=3, **forced)
    assert (skipped, finish, used) == ("", "length", 3)
    kept, _, _ = complete(client, max_tokens=3, extra_body={"skip_special_tokens": False}, **forced)
    assert kept == "<|im_start|>" * 3
    streamed, _, _ = complete(client, stream=True, max_tokens=3, extra_body={"skip_special_tokens": False}, **forced)
    assert streamed == kept
    # The EOS that ends a chat answer stays out of it either way (vLLM).
    plain = chat_both(client, HI, 64)
    kept = chat_both(client, HI, 64, extra_body={"skip_special_tokens": False})
    assert plain[1] == "stop" and kept == plain and "<|im_end|>" not in kept[0]


def test_min_p_one_samples_the_greedy_answer(client):
    greedy, _, _ = complete(client)
    for seed in (0, 1, 2):
        sampled, _, _ = complete(client, temperature=1.0, seed=seed, extra_body={"min_p": 1.0})
        assert sampled == greedy, seed
    # Without min_p the same seeds leave the greedy path: the check above has teeth.
    free = {complete(client, temperature=1.0, seed=seed)[0] for seed in (0, 1, 2)}
    assert free != {greedy}
    # A moderate min_p still samples (the seed matters).
    some = {complete(client, temperature=1.5, seed=seed, extra_body={"min_p": 0.1})[0] for seed in range(4)}
    assert len(some) > 1


@pytest.mark.parametrize("field,value", [
    ("min_p", 1.5), ("min_p", -0.1), ("min_p", 1e39), ("min_p", "high"), ("min_p", [0.5]),
    ("stop_token_ids", [-1]), ("stop_token_ids", [VOCAB]), ("stop_token_ids", [2**32]),
    ("stop_token_ids", [1] * 257), ("stop_token_ids", "2"), ("stop_token_ids", [1.5]),
    ("skip_special_tokens", "no"), ("skip_special_tokens", 0),
    ("include_stop_str_in_output", "yes"), ("include_stop_str_in_output", [True]),
])
def test_hostile_values_are_400s_naming_the_field(server, field, value):
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        response = httpx.post(server.url + path, json={**body, "max_tokens": 2, field: value}, timeout=60)
        assert response.status_code == 400, (path, response.text)
        error = response.json()["error"]
        assert field in error["message"] or error["param"] == field, (path, error)


def test_nan_and_infinity_literals_are_400s(server):
    for literal in ("NaN", "Infinity", "-Infinity"):
        body = '{"prompt": "hi", "max_tokens": 2, "min_p": %s}' % literal
        response = httpx.post(server.url + "/v1/completions", content=body, timeout=60,
                              headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
