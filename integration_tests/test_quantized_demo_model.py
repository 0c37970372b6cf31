"""A GPTQ checkpoint served as a user serves one: the demo model quantized to GPTQ 4-bit (group
128, symmetric, v1 zero points; round-to-nearest, tests/shard/quantize_demo_model.py), started
with `--model-id <its directory>` and no --quantize flag.

"Coherent" here means, against the unquantized fp32 model (transformers, the `reference` fixture):
- /generate greedy: the first 4 tokens of the answers to two prompts are the unquantized model's;
- /v1/chat/completions at temperature 0, "What is the capital of France?": the answer starts with
  the unquantized model's first 6 tokens ("The capital of France is Paris"), names Paris and
  stops by itself (finish_reason "stop").
RTN 4-bit moves the logits of this 135M model by ~48 % (tests/shard/test_quantized_demo_model.py
measures each format), so longer answers fork from the unquantized ones (in this run the raw
completion of "The capital of France is" does from its first token); a wrongly unpacked
checkpoint gives none of the above. Answers are kept short: on CPU the reference path rebuilds
every packed weight per step (~0.65 s a decode step on one core, ~10x the fp32 model's).
"""
import sys
from pathlib import Path

import httpx
import pytest

from server import Server
from test_kv_cache_dtype import greedy_tokens

PROMPTS = ["def fibonacci(n):", "Water boils at"]
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def gptq_server(demo_model_dir, tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.shard.quantize_demo_model import quantize_demo_model

    target = quantize_demo_model(tmp_path_factory.mktemp("demo") / "gptq", "gptq", demo_model_dir)
    # Short limits keep the CPU warmup (one prefill of --max-batch-prefill-tokens) small.
    srv = Server("--model-id", str(target), "--max-input-tokens", "256", "--max-total-tokens", "512",
                 "--max-batch-prefill-tokens", "256")
    yield srv
    srv.stop()


def test_the_shard_loads_the_gptq_weights_from_the_config(gptq_server):
    assert "with gptq weights" in gptq_server.log()
    assert httpx.get(gptq_server.url + "/health", timeout=10).status_code == 200


def test_greedy_answers_start_as_the_unquantized_models(gptq_server, reference):
    for prompt in PROMPTS:
        got, want = greedy_tokens(gptq_server.url, prompt, new_tokens=4), reference(prompt, 4)
        assert got == want, (prompt, reference.tokenizer.decode(got), reference.tokenizer.decode(want))


def test_a_chat_answer_is_the_unquantized_models_answer(gptq_server, reference):
    tokenizer = reference.tokenizer
    messages = [{"role": "user", "content": QUESTION}]
    body = {"model": "tgi", "messages": messages, "max_tokens": 16, "temperature": 0}
    response = httpx.post(gptq_server.url + "/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    choice, usage = response.json()["choices"][0], response.json()["usage"]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert usage["prompt_tokens"] == len(tokenizer(rendered).input_ids), "the router renders the same prompt"
    want = tokenizer.decode(reference(rendered, 6))
    assert want == "The capital of France is Paris"
    content = choice["message"]["content"]
    assert content.startswith(want) and choice["finish_reason"] == "stop", choice
