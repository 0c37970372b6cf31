"""The model families beyond Llama, served as a user serves them: a tiny random checkpoint in the
Hub's layout (tests/shard/tiny_models.py) beside the demo model's tokenizer, the launcher started
with `--model-id <its directory>` and nothing else, and real HTTP requests.

The shard's parity tests compare each family's forward with transformers in-process; these check
the rest of the path a user takes: the launcher and router reading the family's config (Gemma 3's
multimodal `text_config`, Phi-3's LongRoPE, the MoE fields), the router's tokenizer and chat
template over it, and the step loop. For each family:
- /generate greedy equals transformers' fp32 greedy token for token, for a short prompt and for
  one past Phi-3's `original_max_position_embeddings` (64), where LongRoPE's long factors apply;
- a long prompt that starts from another long prompt's cached KV (under LongRoPE, KV rotated
  with the long factors) still equals transformers;
- /v1/chat/completions renders the template as transformers does and answers;
- /info names the checkpoint, and the router learned LongRoPE's prompt limit where there is one.
"""

import shutil
import sys
from pathlib import Path

import httpx
import pytest
import torch

from server import Server, metric, scrape_metrics
from test_kv_cache_dtype import greedy_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.shard.tiny_models import make_tiny_dense_model, make_tiny_moe_model  # noqa: E402

# (family, writer): Gemma 2 and Phi-3 as text checkpoints, Gemma 3 as the multimodal one the Hub
# holds for 4B and up, and two MoE layouts (Qwen3-MoE's experts.N.gate_proj and Mixtral's
# block_sparse_moe.experts.N.w1).
FAMILIES = [("gemma2", make_tiny_dense_model), ("gemma3", make_tiny_dense_model),
            ("phi3", make_tiny_dense_model), ("qwen3_moe", make_tiny_moe_model),
            ("mixtral", make_tiny_moe_model)]  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
NEW_TOKENS = 8
SHORT_PROMPT = "The quick brown fox"
LONG_PROMPT = " ".join(f"item {i}," for i in range(40))  # ~120 tokens: past 64 positions


@pytest.fixture(scope="module", params=FAMILIES, ids=[name for name, _ in FAMILIES])
def family(request, tmp_path_factory, demo_model_dir):
    """(server, transformers model, tokenizer, checkpoint directory) of one family's tiny checkpoint."""
    from transformers import AutoTokenizer

    name, write = request.param
    directory = tmp_path_factory.mktemp(name)
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    model = write(name, directory, vocab_size=len(tokenizer))
    for file in TOKENIZER_FILES:
        shutil.copy(Path(demo_model_dir) / file, directory / file)
    server = Server("--model-id", str(directory))
    yield server, model, tokenizer, directory
    server.stop()


def reference_greedy(model, tokenizer, prompt: str, new_tokens: int) -> list[int]:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("prompt", [SHORT_PROMPT, LONG_PROMPT], ids=["short", "past_64_positions"])
def test_greedy_generate_equals_transformers(family, prompt):
    server, model, tokenizer, _ = family
    got = greedy_tokens(server.url, prompt, new_tokens=NEW_TOKENS)
    want = reference_greedy(model, tokenizer, prompt, NEW_TOKENS)
    # The router stops at the tokenizer's end-of-sequence token, which a random model may pick;
    # transformers here never stops early. Up to that point the tokens must agree.
    assert got == want[: len(got)], (got, want)
    assert len(got) == NEW_TOKENS or got[-1] == tokenizer.eos_token_id, got


def test_a_long_prompt_from_a_cached_prefix_equals_transformers(family):
    server, model, tokenizer, _ = family
    greedy_tokens(server.url, LONG_PROMPT + " and first", new_tokens=1)
    hits = metric(scrape_metrics(server.url), "textgen_prefix_cache_hits_tokens_total")
    prompt = LONG_PROMPT + " and second"
    got = greedy_tokens(server.url, prompt, new_tokens=NEW_TOKENS)
    shared = metric(scrape_metrics(server.url), "textgen_prefix_cache_hits_tokens_total") - hits
    assert shared >= 64, "the shared long prefix came from the cache"
    want = reference_greedy(model, tokenizer, prompt, NEW_TOKENS)
    assert got == want[: len(got)], (got, want)


def test_chat_renders_the_template_and_answers(family):
    server, _, tokenizer, _ = family
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    body = {"model": "tgi", "messages": messages, "max_tokens": 4, "temperature": 0}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert answer["usage"]["prompt_tokens"] == len(tokenizer(rendered).input_ids)
    assert answer["usage"]["completion_tokens"] >= 1
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")


def test_info_and_health_describe_the_served_checkpoint(family):
    server, _, _, directory = family
    info = httpx.get(server.url + "/info", timeout=10).json()
    assert info["model_id"] == str(directory), info
    assert info["max_total_tokens"] <= 512, info  # the checkpoint's max_position_embeddings
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    # LongRoPE rotates a prompt past 64 tokens apart from shorter ones: the router's prefix cache
    # keys it apart (tests/shard/test_dense_families.py checks the rotation itself).
    limit = "Some(64)" if directory.name.startswith("phi3") else "None"
    assert f"long_rope_prompt_tokens={limit}" in server.log()
