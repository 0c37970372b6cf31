"""The OpenAI routes against the real stack, through the real `openai` SDK (sync and
async): answers equal transformers' (chat template + greedy generate), logprobs equal its
log-softmax, seeded `n` is reproducible, and refused input surfaces as the SDK's typed
exceptions while the server keeps serving."""
import asyncio

import openai
import pytest
import torch

CONVERSATION = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(reference):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(reference.tokenizer.name_or_path, dtype=torch.float32).eval()


def chat_reference_ids(reference, model, messages, max_new_tokens):
    tokenizer = reference.tokenizer
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return ids[0].tolist(), out[0, ids.shape[1]:].tolist()


def test_multi_turn_chat_equals_transformers(client, reference, model):
    prompt_ids, expected = chat_reference_ids(reference, model, CONVERSATION, 20)
    answer = client.chat.completions.create(
        model="anything", messages=CONVERSATION, temperature=0, max_completion_tokens=20
    )
    choice = answer.choices[0]
    text = reference.tokenizer.decode(expected, skip_special_tokens=True)
    assert choice.message.content == text
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens == len(prompt_ids)
    assert answer.usage.completion_tokens == len(expected)
    assert answer.model == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_logprobs_equal_transformers_log_softmax(client, reference, model):
    prompt_ids, _ = chat_reference_ids(reference, model, CONVERSATION[:1], 1)
    answer = client.chat.completions.create(
        model="m", messages=CONVERSATION[:1], temperature=0, max_tokens=8, logprobs=True, top_logprobs=5
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == 8
    generated = [reference.tokenizer.convert_tokens_to_ids(reference.tokenizer.tokenize(c.token))[0] for c in content]
    ids = torch.tensor([prompt_ids + generated])
    with torch.inference_mode():
        logprobs = model(ids).logits[0, len(prompt_ids) - 1 : -1].float().log_softmax(dim=-1)
    for position, entry in enumerate(content):
        row = logprobs[position]
        assert abs(entry.logprob - row.max().item()) < 1e-3
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
        top = torch.topk(row, 5)
        assert len(entry.top_logprobs) == 5
        for alternative, expected in zip(entry.top_logprobs, top.values.tolist()):
            assert abs(alternative.logprob - expected) < 1e-3


def test_seeded_n_is_reproducible(client):
    def run():
        answer = client.chat.completions.create(
            model="m", messages=CONVERSATION[:1], n=3, seed=1234, max_tokens=12, temperature=1.0
        )
        assert [c.index for c in answer.choices] == [0, 1, 2]
        return [c.message.content for c in answer.choices]

    first = run()
    assert first == run()
    assert len(set(first)) > 1, "each choice samples with its own seed"


def test_stream_has_role_first_one_finish_usage_and_stop(client):
    stream = client.chat.completions.create(
        model="m",
        messages=CONVERSATION[:1],
        temperature=0,
        max_completion_tokens=30,
        stop=["Paris", "\n\n"],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" not in text
    whole = client.chat.completions.create(
        model="m", messages=CONVERSATION[:1], temperature=0, max_completion_tokens=30, stop=["Paris", "\n\n"]
    )
    assert whole.choices[0].message.content == text


def test_completions_string_tokens_echo_and_stream(client, reference):
    prompt = "The capital of France is"
    answer = client.completions.create(model="m", prompt=prompt, max_tokens=5, temperature=0, echo=True, logprobs=2)
    choice = answer.choices[0]
    assert choice.text.startswith(prompt)
    assert choice.logprobs.token_logprobs[0] is None
    ids = reference.tokenizer(prompt).input_ids
    by_tokens = client.completions.create(model="m", prompt=[ids, ids], max_tokens=5, temperature=0)
    assert [c.text for c in by_tokens.choices] == [choice.text[len(prompt):]] * 2
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="m", prompt=prompt, max_tokens=5, temperature=0, stream=True)
        if c.choices
    )
    assert streamed == choice.text[len(prompt):]
    assert by_tokens.choices[0].finish_reason == "length"


def test_models_list_and_retrieve(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert models[0].owned_by == "HuggingFaceTB" and models[0].created > 1_600_000_000
    assert client.models.retrieve("HuggingFaceTB/SmolLM2-135M-Instruct").id == models[0].id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-5")


@pytest.mark.parametrize(
    "extra",
    [
        {"n": -1},
        {"n": 10_000},
        {"logprobs": True, "top_logprobs": 21},
        {"logit_bias": {"49152": 5}},
        {"logit_bias": {"5": 101}},
        {"stop": [1, 2]},
        {"stop": "x" * 10_000},
        {"temperature": "hot"},
        {"response_format": {"type": "xml"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
        {"tools": [{"type": "function"}]},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "g"},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {"max_completion_tokens": 10_000_000},
    ],
)
def test_hostile_input_is_a_typed_400_and_the_server_keeps_serving(client, extra):
    request = {"model": "m", "messages": CONVERSATION[:1], "max_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**request)
    assert raised.value.status_code == 400
    assert raised.value.body["message"]
    ok = client.chat.completions.create(model="m", messages=CONVERSATION[:1], max_tokens=1)
    assert ok.choices[0].finish_reason == "length"


def test_logit_bias_steers_greedy_output(client, reference):
    token = reference.tokenizer.convert_tokens_to_ids("Ġbanana")
    answer = client.chat.completions.create(
        model="m", messages=CONVERSATION[:1], temperature=0, max_tokens=3, logit_bias={str(token): 100}
    )
    assert answer.choices[0].message.content == " banana" * 3


def test_async_client_chat_and_stream(server):
    async def main():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        whole, stream = await asyncio.gather(
            client.chat.completions.create(model="m", messages=CONVERSATION, temperature=0, max_tokens=10),
            client.chat.completions.create(
                model="m", messages=CONVERSATION, temperature=0, max_tokens=10, stream=True
            ),
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model="m", prompt="x", suffix="y")
        await client.close()
        return whole.choices[0].message.content, text

    whole, streamed = asyncio.run(main())
    assert whole == streamed and whole
