"""The clients users drive structured output and tool calling with, against the real stack
(issue 22): TGI's own Python client (`text-generation`: `generate`/`generate_stream` with a
`Grammar`, and `chat()`, which sends TGI's chat extension fields, several as null), LangChain's
`ChatOpenAI` (`with_structured_output(..., method="json_schema")` and `bind_tools`), and the
`openai` SDK carrying vLLM's extension fields through `extra_body`."""
from __future__ import annotations

import json
import re
from typing import Literal

import openai
import pytest
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from text_generation import Client
from text_generation.types import Grammar, GrammarType, Message, Tool

from grammar_cases import assert_valid, curated, json_prompt

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SCHEMAS = curated(4, "textgen-it-grammar-clients")
STOPPED = ("eos_token", "stop_sequence")
WEATHER_PARAMETERS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                            "parameters": WEATHER_PARAMETERS}}


@pytest.fixture(scope="module")
def tgi(server):
    return Client(server.url, timeout=600)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def test_tgi_client_generate_with_json_grammar(tgi):
    stopped = 0
    for name, schema in SCHEMAS:
        out = tgi.generate(json_prompt(schema), max_new_tokens=128,
                           grammar=Grammar(type=GrammarType.Json, value=schema))
        if out.details.finish_reason.value in STOPPED:
            stopped += 1
            assert_valid(out.generated_text, schema, name)
        else:
            assert out.details.generated_tokens == 128
    assert stopped >= 1  # the demo model loops in arrays on some schemas within 128 tokens


def test_tgi_client_stream_and_regex_grammar(tgi):
    pattern = r"[A-Z][a-z]{2,10}"
    grammar = Grammar(type=GrammarType.Regex, value=pattern)
    out = tgi.generate("The capital of France is", max_new_tokens=16, grammar=grammar)
    assert out.details.finish_reason.value in STOPPED
    assert re.fullmatch(pattern, out.generated_text), out.generated_text
    events = list(tgi.generate_stream("The capital of France is", max_new_tokens=16, grammar=grammar))
    text = "".join(e.token.text for e in events if not e.token.special)
    assert text == events[-1].generated_text == out.generated_text


def test_tgi_client_chat_with_its_extension_fields(tgi, client):
    messages = [Message(role="user", content="Name a color.")]
    # chat() sends every field of its request, unset ones as null (repetition_penalty,
    # logit_bias, top_logprobs, n, tools, tool_choice, ...): none of them may be refused.
    out = tgi.chat(messages=messages, max_tokens=8, temperature=0)
    expected = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name a color."}],
                                              max_tokens=8, temperature=0)
    assert out.choices[0].message.content == expected.choices[0].message.content
    assert out.choices[0].finish_reason == expected.choices[0].finish_reason
    # Streamed, its pydantic types need `role` and the `tool_calls` key in every delta. Its
    # parser then fails on the closing `data: [DONE]`, which TGI and OpenAI send too.
    chunks = []
    with pytest.raises(json.JSONDecodeError) as done:
        for chunk in tgi.chat(messages=messages, max_tokens=8, temperature=0, stream=True):
            chunks.append(chunk)
    assert done.value.doc.strip() == "[DONE]"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == out.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == out.choices[0].finish_reason
    # And with values in them.
    out = tgi.chat(messages=messages, max_tokens=8, temperature=0.7, seed=3, top_p=0.9,
                   repetition_penalty=1.1, frequency_penalty=0.1, presence_penalty=0.1, n=1)
    assert out.choices[0].message.content


# Room for two calls: `required` allows parallel calls, and the demo model makes a second.
TOOL_TOKENS = 160


def test_tgi_client_chat_with_tools(tgi):
    out = tgi.chat(messages=[Message(role="user", content="What is the weather in Paris?")], max_tokens=TOOL_TOKENS,
                   temperature=0, tools=[Tool(type="function", function=WEATHER["function"])], tool_choice="required")
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and calls[0]["type"] == "function" and calls[0]["function"]["name"] == "get_weather"
    assert_valid(calls[0]["function"]["arguments"], WEATHER_PARAMETERS, "get_weather")


def test_tgi_client_chat_with_tgis_bare_function_name_tool_choice(tgi):
    """TGI takes a function's name as a plain string for `tool_choice` (what its client's
    `tool_choice: str` sends); OpenAI's object form is checked in test_tool_calling.py."""
    out = tgi.chat(messages=[Message(role="user", content="What is the weather in Paris?")], max_tokens=64,
                   temperature=0, tools=[Tool(type="function", function=WEATHER["function"])], tool_choice="get_weather")
    calls = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0]["function"]["name"] == "get_weather"
    assert_valid(calls[0]["function"]["arguments"], WEATHER_PARAMETERS, "get_weather")


class Pet(BaseModel):
    name: str = Field(max_length=20, description="The pet's name")
    species: Literal["cat", "dog", "bird"]
    age: int = Field(ge=0, le=30)


@pytest.fixture(scope="module")
def langchain(server):
    return ChatOpenAI(base_url=server.url + "/v1", api_key="x", model=MODEL, temperature=0, max_tokens=TOOL_TOKENS,
                      max_retries=0, timeout=600)


def test_langchain_with_structured_output_json_schema(langchain):
    structured = langchain.with_structured_output(Pet, method="json_schema")
    pet = structured.invoke("Invent a pet and describe it.")
    assert isinstance(pet, Pet)
    raw = langchain.with_structured_output(Pet, method="json_schema", include_raw=True).invoke(
        "Invent a pet and describe it.")
    assert raw["parsing_error"] is None and raw["parsed"] == pet
    assert_valid(raw["raw"].content, Pet.model_json_schema(), "Pet")


def test_langchain_json_mode(langchain):
    out = langchain.with_structured_output(method="json_mode").invoke(
        "Return a JSON object with a key `color` naming a color.")
    assert isinstance(out, dict)


@langchain_tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
    """Current weather of a city."""
    return f"21 degrees {unit} in {city}"


def test_langchain_bind_tools(langchain):
    for tool_choice in ("get_weather", "required", "any"):
        message = langchain.bind_tools([get_weather], tool_choice=tool_choice).invoke("What is the weather in Paris?")
        assert message.tool_calls, message
        for call in message.tool_calls:
            assert call["name"] == "get_weather" and call["id"]
            assert_valid(json.dumps(call["args"]), get_weather.tool_call_schema.model_json_schema(), "get_weather")
        assert message.response_metadata["finish_reason"] == "tool_calls"
    auto = langchain.bind_tools([get_weather]).invoke("Hello!")
    assert auto.tool_calls or auto.content


# vLLM's sampling extensions at values that leave a greedy answer unchanged (docs/openai.md).
VLLM_FIELDS = {"top_k": 20, "min_p": 0, "repetition_penalty": 1.0, "length_penalty": 1.0,
               "skip_special_tokens": True, "include_stop_str_in_output": False, "ignore_eos": False,
               "min_tokens": 0, "stop_token_ids": []}


def test_vllm_extension_fields_keep_the_greedy_answer(client):
    messages = [{"role": "user", "content": "Name three fruits."}]
    plain = client.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=0)
    extended = client.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=0,
                                              extra_body=VLLM_FIELDS)
    assert extended.choices[0].message.content == plain.choices[0].message.content
    nulls = client.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=0,
                                           extra_body={k: None for k in VLLM_FIELDS})
    assert nulls.choices[0].message.content == plain.choices[0].message.content


def test_vllm_min_tokens_and_ignore_eos_hold_eos_back(client):
    messages = [{"role": "user", "content": "Say hi."}]
    plain = client.chat.completions.create(model="m", messages=messages, max_tokens=64, temperature=0)
    assert plain.choices[0].finish_reason == "stop", plain
    floor_tokens = plain.usage.completion_tokens + 8  # past where the model said EOS
    floor = client.chat.completions.create(model="m", messages=messages, max_tokens=floor_tokens + 32,
                                           temperature=0, extra_body={"min_tokens": floor_tokens})
    assert floor.usage.completion_tokens >= floor_tokens
    # The same greedy answer up to where EOS came: the floor only removes the stop tokens.
    assert floor.choices[0].message.content.startswith(plain.choices[0].message.content)
    endless = client.completions.create(model="m", prompt="Hi", max_tokens=40, temperature=0,
                                        extra_body={"ignore_eos": True})
    assert endless.usage.completion_tokens == 40 and endless.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.completions.create(model="m", prompt="Hi", max_tokens=4, extra_body={"min_tokens": 5})


def test_vllm_extension_fields_with_a_constraint(client):
    name, schema = SCHEMAS[0]
    for route in ("chat", "completions"):
        if route == "chat":
            out = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": json_prompt(schema)}], max_tokens=128,
                temperature=0, extra_body={**VLLM_FIELDS, "guided_json": schema})
            text, finish = out.choices[0].message.content, out.choices[0].finish_reason
        else:
            out = client.completions.create(
                model="m", prompt=json_prompt(schema), max_tokens=128, temperature=0,
                extra_body={**VLLM_FIELDS, "structured_outputs": {"json": schema}})
            text, finish = out.choices[0].text, out.choices[0].finish_reason
        assert finish in ("stop", "length")
        if finish == "stop":
            assert_valid(text, schema, name)
