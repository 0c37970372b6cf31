"""OpenAI tool calling on /v1/chat/completions through the real stack and the `openai` SDK
(issue 22). The demo model's template ignores `tools`, so the router writes the tools into
the prompt and uses its fallback call format; only what the API promises is checked:
`message.tool_calls` with `id`, `type: "function"`, a tool's name, `arguments` as a JSON
string that validates against that tool's parameters, `finish_reason: "tool_calls"`, for
every `tool_choice` mode; `parallel_tool_calls: false` makes at most one call; streamed
deltas add up to the non-streamed answer; a conversation with calls and tool results renders
and answers; malformed tools are a 400 and the server keeps serving."""
from __future__ import annotations

import json

import openai
import pytest

from grammar_cases import assert_valid

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in a time zone.",
    "parameters": {"type": "object", "properties": {
        "timezone": {"type": "string", "enum": ["UTC", "Europe/Paris", "Asia/Tokyo"]}},
        "required": ["timezone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it in Tokyo?"}]
MAX_TOKENS = 128  # two calls fit: every argument is an enum or at most 24 characters


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def ask(client, **extra):
    request = {"model": "m", "messages": ASK, "tools": TOOLS, "max_tokens": MAX_TOKENS, "temperature": 0}
    return client.chat.completions.create(**{**request, **extra})


def check_calls(choice, names=tuple(PARAMETERS)) -> list[tuple[str, dict]]:
    """The choice's calls, each well-formed and valid for its tool; (name, arguments) pairs."""
    calls = choice.message.tool_calls
    assert calls, f"no tool call: {choice.message}"
    assert choice.finish_reason == "tool_calls"
    ids = [call.id for call in calls]
    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids), ids
    out = []
    for call in calls:
        assert call.type == "function"
        assert call.function.name in names, call.function.name
        assert isinstance(call.function.arguments, str)
        out.append((call.function.name, assert_valid(call.function.arguments, PARAMETERS[call.function.name],
                                                     call.function.name)))
    return out


def test_required_makes_valid_calls(client):
    answer = ask(client, tool_choice="required")
    check_calls(answer.choices[0])
    assert answer.choices[0].message.role == "assistant"
    assert not answer.choices[0].message.content


def test_required_sampled_makes_valid_calls(client):
    for seed in (1, 2, 3):
        check_calls(ask(client, tool_choice="required", temperature=1.0, seed=seed).choices[0])


def test_named_function_is_called_once(client):
    for name in PARAMETERS:
        answer = ask(client, tool_choice={"type": "function", "function": {"name": name}})
        calls = check_calls(answer.choices[0], names=(name,))
        assert len(calls) == 1


def test_parallel_tool_calls_false_makes_at_most_one_call(client):
    for extra in ({"tool_choice": "required"}, {"tool_choice": "auto"}, {"tool_choice": "required", "temperature": 1.0, "seed": 5}):
        choice = ask(client, parallel_tool_calls=False, **extra).choices[0]
        if extra["tool_choice"] == "required" or choice.message.tool_calls:
            assert len(check_calls(choice)) == 1


def test_auto_answers_in_text_or_with_valid_calls(client):
    for messages in (ASK, [{"role": "user", "content": "Say hello to me in French."}]):
        choice = ask(client, messages=messages, tool_choice="auto").choices[0]
        if choice.message.tool_calls:
            check_calls(choice)
        else:
            assert isinstance(choice.message.content, str) and choice.message.content
            assert choice.finish_reason in ("stop", "length")
    # The default with tools is auto.
    default = ask(client).choices[0]
    assert default.message.tool_calls or default.message.content


def test_none_makes_no_call(client):
    choice = ask(client, tool_choice="none", max_tokens=32).choices[0]
    assert not choice.message.tool_calls
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")


def collect_stream(chunks) -> dict:
    """OpenAI deltas folded into one answer: content, calls by index, finish reason."""
    content, calls, finishes, roles = "", {}, [], set()
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.role:
            roles.add(delta.role)
        content += delta.content or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"ids": [], "types": [], "name": "", "arguments": ""})
            if part.id:
                call["ids"].append(part.id)
            if part.type:
                call["types"].append(part.type)
            if part.function and part.function.name:
                call["name"] += part.function.name
            if part.function and part.function.arguments:
                call["arguments"] += part.function.arguments
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
    assert roles <= {"assistant"}
    return {"content": content, "calls": [calls[i] for i in sorted(calls)], "finishes": finishes}


@pytest.mark.parametrize("extra", [
    {"tool_choice": "required"},
    {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"tool_choice": "auto"},
    {"tool_choice": "required", "temperature": 1.0, "seed": 11},
], ids=["required", "named", "auto", "required-seeded"])
def test_streamed_deltas_add_up_to_the_whole_answer(client, extra):
    whole = ask(client, **extra).choices[0]
    streamed = collect_stream(ask(client, stream=True, **extra))
    assert streamed["finishes"] == [whole.finish_reason]
    assert streamed["content"] == (whole.message.content or "")
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == expected
    for call in streamed["calls"]:
        assert len(call["ids"]) == 1 and call["ids"][0], "one id per call, in its first delta"
        assert call["types"] == ["function"]
        assert_valid(call["arguments"], PARAMETERS[call["name"]], call["name"])


def test_conversation_with_calls_and_results_renders_and_answers(client):
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_time", "arguments": json.dumps({"timezone": "Asia/Tokyo"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature": 21, "sky": "clear"})},
        {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
    ]
    final = ask(client, messages=messages, tool_choice="none", max_tokens=32).choices[0]
    assert isinstance(final.message.content, str) and final.message.content
    assert not final.message.tool_calls
    again = ask(client, messages=messages, tool_choice="auto", max_tokens=MAX_TOKENS).choices[0]
    if again.message.tool_calls:
        check_calls(again)
    else:
        assert again.message.content
    # Without `tools` on the follow-up, the history still renders.
    plain = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0)
    assert plain.choices[0].message.content


BAD_TOOLS = [
    ("parameters-not-object", {"tools": [{"type": "function", "function": {"name": "f", "parameters": "string"}}]}),
    ("parameters-array-schema", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}),
    ("parameters-bad-schema", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}]}),
    ("unknown-named-function", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch_rocket"}}}),
    ("required-without-tools", {"tool_choice": "required"}),
    ("bad-name", {"tools": [{"type": "function", "function": {"name": "has spaces", "parameters": {"type": "object"}}}]}),
    ("duplicate-names", {"tools": [WEATHER, WEATHER]}),
    ("not-a-function", {"tools": [{"type": "retrieval"}]}),
    ("unknown-tool-choice", {"tools": TOOLS, "tool_choice": "sometimes"}),
]


@pytest.mark.parametrize("extra", [e for _, e in BAD_TOOLS], ids=[i for i, _ in BAD_TOOLS])
def test_malformed_tools_are_400_and_the_server_keeps_serving(client, extra):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=4, **extra)
    assert raised.value.status_code == 400
    assert raised.value.body["message"]
    ok = client.chat.completions.create(model="m", messages=ASK, max_tokens=1)
    assert ok.choices[0].finish_reason == "length"


def test_deprecated_functions_answer_with_function_call(client):
    """OpenAI's deprecated `functions`/`function_call`, as older SDK code sends them: one
    call, as `message.function_call`, valid for its function; streamed, the pieces of
    `delta.function_call` add up to it."""
    functions = [WEATHER["function"]]
    request = {"model": "m", "messages": ASK, "functions": functions,
               "function_call": {"name": "get_weather"}, "max_tokens": MAX_TOKENS, "temperature": 0}
    choice = client.chat.completions.create(**request).choices[0]
    assert choice.finish_reason == "function_call"
    assert not choice.message.tool_calls
    call = choice.message.function_call
    assert call.name == "get_weather"
    assert_valid(call.arguments, PARAMETERS["get_weather"], "get_weather")
    name, arguments, finish = "", "", None
    for chunk in client.chat.completions.create(**request, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None and delta.function_call is not None:
            name += delta.function_call.name or ""
            arguments += delta.function_call.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert (name, arguments, finish) == (call.name, call.arguments, "function_call")
    # The answer fed back as legacy history renders and answers in text.
    history = ASK + [{"role": "assistant", "content": None,
                      "function_call": {"name": call.name, "arguments": call.arguments}},
                     {"role": "function", "name": call.name, "content": "sunny, 21 C"}]
    answer = client.chat.completions.create(**{**request, "messages": history, "function_call": "none"})
    assert answer.choices[0].message.content and answer.choices[0].message.function_call is None
