"""Constrained decoding through the real stack (issue 22): TGI's `parameters.grammar` on
/generate and /generate_stream, OpenAI's `response_format` and vLLM's `structured_outputs` /
`guided_*` on /v1/chat/completions and /v1/completions, regex, choice and Lark grammars.

Every answer that ends by itself (TGI `eos_token`/`stop_sequence`, OpenAI `stop`) must parse
and validate with `jsonschema` (the schema's draft, format checks on), or fullmatch its regex;
most answers must end by themselves within the token budget. Bad grammars are refused
before admission (422 native, 400 OpenAI) with a message naming the problem, slow or
hostile ones within a time bound, and the server keeps serving. 64 concurrent requests,
half constrained, leave the unconstrained greedy answers unchanged."""
from __future__ import annotations

import json
import math
import re
import time

import httpx
import openai
import pytest

from grammar_cases import (NATIVE_STOPPED, assert_valid, curated, error_message, json_prompt,
                           post_all, stream_generate)
from server import Server

SCHEMAS = curated(12, "textgen-it-structured-output")  # 2 CPU cores run the suite
MAX_NEW_TOKENS = 128  # the curated schemas' shortest valid instances are <= 160 characters


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def grammar_form(index: int, schema: dict) -> dict:
    """TGI's three ways to send a schema, spread over the schemas."""
    return [
        {"type": "json", "value": schema},
        {"type": "json", "value": json.dumps(schema)},
        {"type": "json_schema", "value": {"name": "answer", "schema": schema}},
    ][index % 3]


def native_body(index: int, schema: dict, **parameters) -> dict:
    return {"inputs": json_prompt(schema), "parameters": {
        "max_new_tokens": MAX_NEW_TOKENS, "details": True, "grammar": grammar_form(index, schema),
        **parameters}}


@pytest.fixture(scope="module")
def native_greedy(server):
    responses = post_all(server.url, [("/generate", native_body(i, s)) for i, (_, s) in enumerate(SCHEMAS)])
    for (name, _), response in zip(SCHEMAS, responses):
        assert response.status_code == 200, f"{name}: {response.text}"
    return [r.json() for r in responses]


def check_native(answers: list[dict]) -> None:
    stopped = 0
    for (name, schema), answer in zip(SCHEMAS, answers):
        if answer["details"]["finish_reason"] in NATIVE_STOPPED:
            stopped += 1
            assert_valid(answer["generated_text"], schema, name)
        else:
            assert answer["details"]["finish_reason"] == "length", name
            assert answer["details"]["generated_tokens"] == MAX_NEW_TOKENS, name
    # The 135M demo model loops in long arrays and numbers within 128 tokens on some schemas;
    # the >= 99 % bar at 512 tokens is bench/grammar_generation.py's. Here: not vacuous.
    assert stopped >= len(SCHEMAS) // 4, f"only {stopped}/{len(SCHEMAS)} answers ended by themselves"


def test_native_grammar_greedy_answers_validate(native_greedy):
    check_native(native_greedy)


def test_native_grammar_sampled_answers_validate(server):
    bodies = [("/generate", native_body(i, s, do_sample=True, temperature=1.0, top_p=0.95, seed=1000 + i))
              for i, (_, s) in enumerate(SCHEMAS)]
    responses = post_all(server.url, bodies)
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    answers = [r.json() for r in responses]
    check_native(answers)
    assert all(a["details"]["seed"] == 1000 + i for i, a in enumerate(answers))


def test_native_stream_concatenation_equals_text_and_greedy_answer(server, native_greedy):
    for index in range(3):
        name, schema = SCHEMAS[index]
        text, events = stream_generate(server.url, native_body(index, schema))
        final = events[-1]
        assert final["generated_text"] == text, name
        assert text == native_greedy[index]["generated_text"], name
        assert final["details"]["finish_reason"] == native_greedy[index]["details"]["finish_reason"]
        if final["details"]["finish_reason"] in NATIVE_STOPPED:
            assert_valid(text, schema, name)


def test_native_regex_fullmatches_and_root_route(server):
    pattern = r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
    for route in ("/generate", "/"):
        response = httpx.post(server.url + route, json={
            "inputs": "The date of the first Moon landing, as YYYY-MM-DD:",
            "parameters": {"max_new_tokens": 16, "details": True, "return_full_text": False,
                           "grammar": {"type": "regex", "value": pattern}}}, timeout=300)
        assert response.status_code == 200, response.text
        answer = response.json()
        answer = answer[0] if isinstance(answer, list) else answer
        assert answer["details"]["finish_reason"] in NATIVE_STOPPED
        assert re.fullmatch(pattern, answer["generated_text"]), answer["generated_text"]


def test_native_json_object_alias_is_any_json_object(server):
    response = httpx.post(server.url + "/generate", json={
        "inputs": "A JSON object describing a cat: ",
        "parameters": {"max_new_tokens": 48, "details": True,
                       "grammar": {"type": "json_object", "value": {"type": "object",
                                   "properties": {"name": {"type": "string", "maxLength": 20}},
                                   "required": ["name"]}}}}, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    if answer["details"]["finish_reason"] in NATIVE_STOPPED:
        assert isinstance(json.loads(answer["generated_text"])["name"], str)
    else:
        assert answer["generated_text"].lstrip().startswith("{")


# --- OpenAI routes -----------------------------------------------------------------------

def chat(client, schema, **extra):
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": json_prompt(schema)}],
        max_tokens=MAX_NEW_TOKENS, **extra)


def for_completions(extra: dict) -> dict:
    """The SDK's completions.create has no `response_format` argument: it travels in extra_body."""
    extra = dict(extra)
    if "response_format" in extra:
        extra["extra_body"] = {**extra.get("extra_body", {}), "response_format": extra.pop("response_format")}
    return extra


def strict_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}], ids=["greedy", "sampled"])
def test_chat_response_format_json_schema_validates(server, sampling):
    subset = SCHEMAS[:8]
    bodies = [("/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": json_prompt(s)}],
        "max_tokens": MAX_NEW_TOKENS, "response_format": strict_format(s), **sampling}) for _, s in subset]
    responses = post_all(server.url, bodies)
    stopped = 0
    for (name, schema), response in zip(subset, responses):
        assert response.status_code == 200, f"{name}: {response.text}"
        choice = response.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            stopped += 1
            assert_valid(choice["message"]["content"], schema, name)
        else:
            assert choice["finish_reason"] == "length", name
    assert stopped >= len(subset) // 4


def test_chat_stream_equals_whole_answer(client):
    name, schema = SCHEMAS[1]
    whole = chat(client, schema, temperature=0, response_format=strict_format(schema))
    chunks = list(chat(client, schema, temperature=0, response_format=strict_format(schema), stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    if finishes == ["stop"]:
        assert_valid(text, schema, name)


def test_chat_json_object_is_a_json_object(client):
    answer = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Describe a dog as a JSON object with a name."}],
        max_tokens=64, temperature=0, response_format={"type": "json_object"})
    choice = answer.choices[0]
    assert choice.message.content.lstrip().startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)


def test_completions_response_format_and_guided_json(client):
    for name, schema in SCHEMAS[2:5]:
        for extra in ({"response_format": strict_format(schema)}, {"extra_body": {"guided_json": schema}}):
            answer = client.completions.create(model="m", prompt=json_prompt(schema), max_tokens=MAX_NEW_TOKENS,
                                               temperature=0, **for_completions(extra))
            choice = answer.choices[0]
            assert choice.finish_reason in ("stop", "length")
            if choice.finish_reason == "stop":
                assert_valid(choice.text, schema, name)


LARK = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,3}/\n'
LARK_MATCH = r"The answer is [0-9]{1,3}\."
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
CHOICES = ["positive", "negative", "neutral"]


@pytest.mark.parametrize("extra_body, check", [
    ({"structured_outputs": {"regex": PHONE}}, lambda t: re.fullmatch(PHONE, t)),
    ({"guided_regex": PHONE}, lambda t: re.fullmatch(PHONE, t)),
    ({"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
    ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
    ({"structured_outputs": {"grammar": LARK}}, lambda t: re.fullmatch(LARK_MATCH, t)),
    ({"guided_grammar": LARK}, lambda t: re.fullmatch(LARK_MATCH, t)),
    ({"structured_outputs": {"json": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                      "required": ["ok"], "additionalProperties": False}}},
     lambda t: isinstance(json.loads(t)["ok"], bool)),
], ids=["so-regex", "guided-regex", "so-choice", "guided-choice", "so-lark", "guided-lark", "so-json"])
def test_vllm_structured_outputs_on_chat_and_completions(client, extra_body, check):
    prompt = "Answer briefly: how many legs does a spider have? Or give a phone number."
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}):
        chat_answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}], max_tokens=32,
            extra_body=extra_body, **sampling)
        completion = client.completions.create(model="m", prompt=prompt + "\n", max_tokens=32,
                                               extra_body=extra_body, **sampling)
        for text, finish in ((chat_answer.choices[0].message.content, chat_answer.choices[0].finish_reason),
                             (completion.choices[0].text, completion.choices[0].finish_reason)):
            assert finish == "stop", (text, finish)
            assert check(text), text


def test_n_seed_and_best_of_with_a_grammar(server, client):
    name, schema = SCHEMAS[3]

    def choices():
        answer = chat(client, schema, n=3, seed=21, temperature=1.0, response_format=strict_format(schema))
        for choice in answer.choices:
            if choice.finish_reason == "stop":
                assert_valid(choice.message.content, schema, name)
        return [c.message.content for c in answer.choices]

    assert choices() == choices()
    best = httpx.post(server.url + "/generate", json=native_body(0, SCHEMAS[0][1], best_of=2, do_sample=True),
                      timeout=600)
    assert best.status_code == 200, best.text
    answer = best.json()
    others = answer["details"]["best_of_sequences"]
    assert len(others) == 1
    for text, finish in [(answer["generated_text"], answer["details"]["finish_reason"])] + [
            (s["generated_text"], s["finish_reason"]) for s in others]:
        if finish in NATIVE_STOPPED:
            assert_valid(text, SCHEMAS[0][1], SCHEMAS[0][0])


def test_logprobs_are_those_of_the_masked_distribution(client):
    choices = ["yes", "no"]
    answer = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Is the sky blue?"}], max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=5, extra_body={"guided_choice": choices})
    choice = answer.choices[0]
    assert choice.message.content in choices and choice.finish_reason == "stop"
    first = choice.logprobs.content[0]
    assert first.token and any(c.startswith(first.token) for c in choices)
    allowed = [alt for alt in first.top_logprobs if alt.logprob > -50]
    assert allowed and all(any(c.startswith(alt.token) for c in choices) for alt in allowed), first.top_logprobs
    # Masked tokens hold no probability: what the grammar allows carries (nearly) all of it.
    assert sum(math.exp(alt.logprob) for alt in allowed) > 0.5


# --- Bad input ---------------------------------------------------------------------------

def nested_alternatives(groups: int, branches: int) -> dict:
    """allOf of anyOfs: the compiler expands branches**groups combinations."""
    return {"allOf": [{"anyOf": [{"type": "object", "properties": {f"a{g}_{b}": {"type": "integer"}},
                                  "required": [f"a{g}_{b}"]} for b in range(branches)]}
                      for g in range(groups)]}


def oversized_schema() -> dict:
    """About 1.5 MB of JSON: past the default --max-grammar-bytes (1 MB), under the 2 MB
    --payload-limit, so the grammar bound (not the body bound) must refuse it."""
    return {"type": "object", "properties": {f"p{i:06d}": {"type": "string", "description": "x" * 40}
                                             for i in range(21_000)}}


BAD_GRAMMARS = [
    ("malformed-schema", {"type": "json", "value": {"type": 5}}, r"type|schema"),
    ("schema-not-json", {"type": "json", "value": "{not json"}, r"json"),
    ("unsupported-not", {"type": "json", "value": {"type": "object", "not": {"required": ["a"]}}}, r"not|unsupported"),
    ("bad-ref", {"type": "json", "value": {"$ref": "#/$defs/missing"}}, r"ref|missing|defs"),
    ("invalid-regex", {"type": "regex", "value": "("}, r"regex|parse|unclosed|\("),
    ("unknown-type", {"type": "xml", "value": "<a/>"}, r"xml|type"),
    ("compiler-limit", {"type": "json", "value": nested_alternatives(3, 20)}, r"."),
]


def assert_serving(url: str) -> None:
    ok = httpx.post(url + "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 1}}, timeout=300)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("grammar, names", [(g, n) for _, g, n in BAD_GRAMMARS], ids=[i for i, _, _ in BAD_GRAMMARS])
def test_bad_native_grammar_is_422_naming_it_and_the_server_keeps_serving(server, grammar, names):
    started = time.monotonic()
    response = httpx.post(server.url + "/generate", json={
        "inputs": "x", "parameters": {"max_new_tokens": 4, "grammar": grammar}}, timeout=300)
    assert response.status_code == 422, response.text
    assert time.monotonic() - started < 10
    assert response.json()["error_type"] == "validation"
    assert re.search(names, error_message(response), re.IGNORECASE), error_message(response)
    assert_serving(server.url)


BAD_OPENAI = [
    ("malformed-schema", {"response_format": strict_format({"type": 5})}, r"type|schema"),
    ("unsupported-not", {"response_format": strict_format({"not": {"type": "string"}})}, r"not|unsupported"),
    ("unknown-format-type", {"response_format": {"type": "yaml"}}, r"yaml|type|response_format"),
    ("invalid-regex", {"extra_body": {"structured_outputs": {"regex": "("}}}, r"regex|parse|unclosed|\("),
    ("malformed-lark", {"extra_body": {"structured_outputs": {"grammar": "start: ( \"a\" | \n"}}}, r"grammar|lark|parse|expected|unexpected"),
    ("lark-undefined-rule", {"extra_body": {"guided_grammar": "start: missing_rule\n"}}, r"missing_rule|undefined|unknown|grammar"),
    ("empty-choice", {"extra_body": {"guided_choice": []}}, r"choice"),
    ("two-constraints", {"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a+"}}, r"."),
    ("two-vllm-constraints", {"extra_body": {"guided_json": {"type": "object"}, "guided_choice": ["a", "b"]}}, r"."),
    ("so-two-kinds", {"extra_body": {"structured_outputs": {"regex": "a+", "choice": ["a"]}}}, r"."),
]


@pytest.mark.parametrize("extra, names", [(e, n) for _, e, n in BAD_OPENAI], ids=[i for i, _, _ in BAD_OPENAI])
def test_bad_openai_constraint_is_400_naming_it_and_the_server_keeps_serving(client, extra, names):
    for create in (
        lambda: client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4, **extra),
        lambda: client.completions.create(model="m", prompt="x", max_tokens=4, **for_completions(extra)),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            create()
        assert raised.value.status_code == 400
        message = raised.value.body["message"]
        assert re.search(names, message, re.IGNORECASE), message
    ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert ok.choices[0].finish_reason == "length"


def test_grammar_past_the_size_bound_is_refused(server, client):
    schema = oversized_schema()
    assert 1_000_000 < len(json.dumps(schema)) < 1_900_000
    response = httpx.post(server.url + "/generate", json={
        "inputs": "x", "parameters": {"max_new_tokens": 4, "grammar": {"type": "json", "value": schema}}}, timeout=300)
    assert response.status_code == 422, response.text[:500]
    assert re.search(r"byte|large|size|long", error_message(response), re.IGNORECASE), error_message(response)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       response_format=strict_format(schema))
    assert_serving(server.url)


def test_slow_to_compile_schema_is_refused_within_the_bound(server, client):
    # 17**3 = 4,913 combined alternatives. On a slow machine the compile runs past the
    # default --grammar-compile-timeout-ms (1,000); on a fast one it compiles, and the first
    # token's parser row (4,913 items) passes llguidance's bound of 2,000 in the shard: either
    # way the client's grammar is at fault, so the answer is 422 (400 on the OpenAI routes).
    schema = nested_alternatives(3, 17)
    for _ in range(2):  # a second time: no cache or leftover worker makes it slower or let through
        started = time.monotonic()
        response = httpx.post(server.url + "/generate", json={
            "inputs": "x", "parameters": {"max_new_tokens": 4, "grammar": {"type": "json", "value": schema}}},
            timeout=300)
        elapsed = time.monotonic() - started
        assert response.status_code == 422, response.text[:500]
        assert elapsed < 10, f"refused after {elapsed:.1f}s"
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       response_format=strict_format(schema))
    assert time.monotonic() - started < 10
    assert_serving(server.url)


def test_redos_regex_costs_nothing(server):
    """A pattern that makes a backtracking engine take exponential time is a plain automaton
    here: compiled and answered as fast as a trivial one."""
    def timed(grammar):
        started = time.monotonic()
        response = httpx.post(server.url + "/generate", json={
            "inputs": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!", "parameters": {
                "max_new_tokens": 8, "details": True, "grammar": grammar}}, timeout=300)
        assert response.status_code == 200, response.text
        return time.monotonic() - started, response.json()

    baseline, _ = timed({"type": "regex", "value": "a{1,8}"})
    for grammar in ({"type": "regex", "value": "(a+)+$"},
                    {"type": "regex", "value": "(a|aa)+b?(a|a?)+"},
                    {"type": "json", "value": {"type": "string", "pattern": "^(a+)+$"}}):
        elapsed, answer = timed(grammar)
        assert elapsed < baseline * 3 + 5, f"{grammar}: {elapsed:.1f}s against {baseline:.1f}s"
        if grammar["type"] == "regex" and answer["details"]["finish_reason"] in NATIVE_STOPPED:
            assert re.fullmatch(grammar["value"].rstrip("$"), answer["generated_text"])


# --- Mixed batch -------------------------------------------------------------------------

def test_64_concurrent_half_constrained():
    """32 unconstrained greedy requests alone, then the same 32 interleaved with 32 JSON
    Schema requests, all 64 at once: the unconstrained answers do not change, every
    constrained answer that ends validates. Own server: the session one admits 24 at once."""
    srv = Server("--max-concurrent-requests", "128")
    try:
        plain = [("/generate", {"inputs": f"Item {i}: a short note about the number {i}.",
                                "parameters": {"max_new_tokens": 16, "details": True}}) for i in range(32)]
        schemas = [SCHEMAS[i % len(SCHEMAS)] for i in range(32)]
        constrained = [("/generate", native_body(i, s)) for i, (_, s) in enumerate(schemas)]
        alone = post_all(srv.url, plain, concurrency=32)
        assert all(r.status_code == 200 for r in alone)
        mixed = post_all(srv.url, [b for pair in zip(plain, constrained) for b in pair], concurrency=64)
        assert all(r.status_code == 200 for r in mixed), [r.text for r in mixed if r.status_code != 200]
        assert [r.json()["generated_text"] for r in mixed[0::2]] == [r.json()["generated_text"] for r in alone]
        stopped = 0
        for (name, schema), response in zip(schemas, mixed[1::2]):
            answer = response.json()
            if answer["details"]["finish_reason"] in NATIVE_STOPPED:
                stopped += 1
                assert_valid(answer["generated_text"], schema, name)
        assert stopped >= 8
    finally:
        srv.stop()
