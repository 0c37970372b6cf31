"""schemathesis against the served OpenAPI document: no route answers 5xx, and every
answer (status, content type, body, SSE event) matches what the document says."""
import json
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest

from server import Server


# Tiny limits keep fuzzed generations short: the fuzz's time is the CPU decoding what it asks
# for. At 40 input / 48 total tokens its coverage phase decoded 2,121 tokens (4.2 of its 4.4
# minutes; the whole run 393 s); at these, the whole run takes 162 s on one core.
MAX_INPUT_TOKENS = 16
MAX_TOTAL_TOKENS = 20


@pytest.fixture(scope="module")
def small_server():
    srv = Server("--max-total-tokens", str(MAX_TOTAL_TOKENS), "--max-input-tokens", str(MAX_INPUT_TOKENS),
                 "--max-batch-prefill-tokens", "256")
    yield srv
    srv.stop()


def test_fuzzing_the_openapi_document_finds_no_5xx_and_no_schema_violation(small_server):
    schemathesis = Path(sys.executable).parent / "schemathesis"
    checks = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"
    result = subprocess.run(
        [str(schemathesis), "run", small_server.url + "/api-doc/openapi.json", "--checks", checks,
         "--max-examples", "8", "--request-timeout", "120", "--phases", "coverage,fuzzing",
         "--suppress-health-check", "all", "--seed", "1"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert httpx.get(small_server.url + "/health", timeout=10).status_code == 200


# Each finding of issue 27 (defect 8), as a request the document calls valid or invalid: a
# schema-valid request must be served (2xx), a schema-invalid one refused (4xx). Bodies
# are checked against the served document itself, so the test also fails when the
# document stops stating a rule the server enforces.
FINDINGS = [
    # (method, path, body, schema-valid?)
    *[("POST", path, {"inputs": ""}, False) for path in ("/generate", "/generate_stream", "/", "/tokenize")],
    *[("POST", path, {"inputs": "a", "parameters": {"top_k": 0}}, False)
      for path in ("/generate", "/generate_stream", "/", "/tokenize")],
    ("POST", "/v1/chat/completions", {"messages": [{"role": "", "content": "hi"}], "max_tokens": 2}, False),
    ("POST", "/chat_tokenize", {"messages": [{"role": "", "content": "hi"}]}, False),
    # Over --max-top-n-tokens (5 by default): /tokenize validates /generate's body.
    ("POST", "/tokenize", {"inputs": "a", "parameters": {"top_n_tokens": 6}}, False),
    ("POST", "/generate", {"inputs": "a", "parameters": {"top_n_tokens": 6, "max_new_tokens": 2}}, False),
    ("POST", "/tokenize", {"inputs": "a", "parameters": {"truncate": MAX_INPUT_TOKENS + 1}}, False),
    ("POST", "/generate", {"inputs": "a", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}, False),
    ("POST", "/generate", {"inputs": "a", "parameters": {"top_p": 1.0}}, False),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_k": -2}, False),
    # Their valid neighbours are served.
    *[("POST", path, {"inputs": "a", "parameters": {"top_k": 1, "max_new_tokens": 2}}, True)
      for path in ("/generate", "/generate_stream", "/")],
    ("POST", "/tokenize", {"inputs": "a", "parameters": {"top_n_tokens": 5, "truncate": MAX_INPUT_TOKENS}}, True),
    ("POST", "/generate", {"inputs": "a", "parameters": {"top_n_tokens": 5, "max_new_tokens": 2,
                                                         "stop": ["a", "b", "c", "d"]}}, True),
    # An empty system message: the template's default one alone is past MAX_INPUT_TOKENS.
    ("POST", "/v1/chat/completions", {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}],
                                      "max_tokens": 2, "top_k": -1}, True),
    ("POST", "/chat_tokenize", {"messages": [{"role": "developer", "content": "hi"}]}, True),
]


def request_schema(doc, method, path):
    body = doc["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]["schema"]
    # The component refs resolve against the document's root.
    return {**body, "components": doc["components"]}


@pytest.mark.parametrize("method,path,body,valid", FINDINGS,
                         ids=[f"{m} {p} {json.dumps(b)[:60]}" for m, p, b, _ in FINDINGS])
def test_a_request_is_served_exactly_when_the_document_calls_it_valid(small_server, method, path, body, valid):
    doc = httpx.get(small_server.url + "/api-doc/openapi.json", timeout=10).json()
    errors = list(jsonschema.Draft202012Validator(request_schema(doc, method, path)).iter_errors(body))
    assert (not errors) == valid, f"the document calls {body} {'invalid' if errors else 'valid'}: {errors[:1]}"
    answer = httpx.request(method, small_server.url + path, json=body, timeout=120)
    if valid:
        assert 200 <= answer.status_code < 300, answer.text
    else:
        assert 400 <= answer.status_code < 500, answer.text


def test_the_document_carries_the_running_limits(small_server):
    doc = httpx.get(small_server.url + "/api-doc/openapi.json", timeout=10).json()
    p = doc["components"]["schemas"]["GenerateParameters"]["properties"]
    assert (p["truncate"]["maximum"], p["max_new_tokens"]["maximum"]) == (MAX_INPUT_TOKENS, MAX_TOTAL_TOKENS - 1)
    assert (p["top_n_tokens"]["maximum"], p["stop"]["maxItems"], p["best_of"]["maximum"]) == (5, 4, 2)


def test_options_names_the_methods_the_document_lists(small_server):
    """A plain OPTIONS (not a CORS preflight) answers 405 with `Allow` holding exactly the
    path's documented methods (`OPTIONS /` used to advertise an undocumented GET)."""
    doc = httpx.get(small_server.url + "/api-doc/openapi.json", timeout=10).json()
    for path, item in doc["paths"].items():
        if "{" in path:
            continue
        answer = httpx.options(small_server.url + path, timeout=10)
        assert answer.status_code == 405, (path, answer.status_code)
        allow = {m.strip().lower() for m in answer.headers["allow"].split(",")} - {"head", "options"}
        assert allow == set(item), (path, answer.headers["allow"])
    # CORS is off unless origins are named: a preflight gets the same 405 and no CORS header.
    preflight = httpx.options(small_server.url + "/generate", timeout=10, headers={
        "origin": "https://example.com", "access-control-request-method": "POST"})
    assert preflight.status_code == 405
    assert not [h for h in preflight.headers if h.lower().startswith("access-control-")]
