"""Speculative decoding (`--speculate`) on the real stack: prompt-lookup drafts, and a draft
model's (`--speculative-model`), verified in the decode's forward pass change no token, greedy
or seeded, under concurrency, preemption and the prefix cache; drafts are counted and kept
where the text repeats itself, all of them when the draft model is the model itself."""
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server import Server, metric, scrape_metrics

PASSAGE = ("The river rises in the hills above the town, runs past the old mill and the market, "
           "and reaches the sea after forty miles. Fishing boats use its mouth in the summer.")
TOPICS = ["the river", "the mill", "the market", "the sea", "the hills", "the boats", "the town",
          "summer"]
# Copy-heavy prompts (rewrite a passage, repeat a phrase) and open ones, 32 in all; the first
# eight share the passage, so the prefix cache has something to find.
PROMPTS = (
    [f"{PASSAGE}\nRewrite the text above word for word, then say one thing about {t}.\n" for t in TOPICS]
    + [f"Repeat after me three times: {t} is near the {u}." for t in TOPICS for u in ("bank", "bridge")]
    + [f"Write a short story about {t}." for t in TOPICS]
)
# 32 tokens: past the copied passage's first sentence, so drafts are kept and refused; the
# suite runs on 2 CPU cores, where each token of the 32 prompts costs.
NEW_TOKENS = 32
# The 16-stream runs on tiny pools (preemption, prefix cache) go the 64 tokens.
TINY_POOL_TOKENS = 64


def generate(url: str, prompt: str, **parameters) -> dict:
    body = {"inputs": prompt,
            "parameters": {"max_new_tokens": NEW_TOKENS, "details": True, **parameters}}
    response = httpx.post(url + "/generate", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def answers(url: str, concurrency: int, prompts=PROMPTS, **parameters) -> list[tuple[list[int], str, str]]:
    def one(prompt):
        out = generate(url, prompt, **parameters)
        return ([t["id"] for t in out["details"]["tokens"]], out["generated_text"],
                out["details"]["finish_reason"])
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


@pytest.fixture(scope="module")
def plain_greedy_16(server):
    """The server without speculation, greedy, 16 streams at once: the text to match."""
    return answers(server.url, 16, do_sample=False, max_new_tokens=TINY_POOL_TOKENS)


@pytest.fixture(scope="module")
def speculating():
    srv = Server("--speculate", "4")
    yield srv
    srv.stop()


# 448 KV tokens preempt whether or not a step of 16 decodes drafts (which step times decide):
# the first 16 prompts at 64 new tokens need ~1,300, more with a draft model's KV beside them.
TINY_POOL = ("--kv-cache-tokens", "448", "--max-batch-prefill-tokens", "256", "--max-batch-size", "16")


@pytest.fixture(scope="module")
def speculating_tiny_pool():
    """A pool of 448 KV tokens for 16 streams of up to ~160 tokens: preemptions."""
    srv = Server("--num-speculative-tokens", "4", *TINY_POOL)
    yield srv
    srv.stop()


@pytest.mark.parametrize("concurrency", [4, 16])
def test_greedy_text_is_the_same_with_drafts(server, speculating, concurrency):
    before = scrape_metrics(speculating.url)
    plain = answers(server.url, concurrency, do_sample=False)
    drafted = answers(speculating.url, concurrency, do_sample=False)
    for prompt, a, b in zip(PROMPTS, plain, drafted):
        assert a == b, prompt
    after = scrape_metrics(speculating.url)
    drafts = metric(after, "textgen_speculative_draft_tokens_total") - metric(
        before, "textgen_speculative_draft_tokens_total")
    kept = metric(after, "textgen_speculative_accepted_tokens_total") - metric(
        before, "textgen_speculative_accepted_tokens_total")
    assert drafts > 0 and kept > 0, (drafts, kept)


def test_preempted_and_cached_streams_keep_their_text(plain_greedy_16, speculating_tiny_pool):
    drafted = answers(speculating_tiny_pool.url, 16, do_sample=False, max_new_tokens=TINY_POOL_TOKENS)
    assert drafted == plain_greedy_16
    samples = scrape_metrics(speculating_tiny_pool.url)
    assert metric(samples, "textgen_preemptions_total") > 0, "the tiny pool preempted"
    assert metric(samples, "textgen_prefix_cache_hits_tokens_total") > 0
    assert metric(samples, "textgen_speculative_accepted_tokens_total") > 0


def test_seeded_sampling_draws_the_same_tokens_with_drafts(server, speculating):
    seeded = dict(do_sample=True, temperature=0.8, top_p=0.95, seed=7)
    prompts = PROMPTS[::4]  # copy-heavy and open ones; sampled answers rarely stop early
    assert answers(speculating.url, 4, prompts, **seeded) == answers(server.url, 4, prompts, **seeded)


def test_stops_inside_a_verified_run_end_exactly_where_they_would(server, speculating):
    prompt = PROMPTS[0]
    full = generate(server.url, prompt, do_sample=False)["generated_text"]
    words = full.split()
    assert len(words) > 8
    stop = " " + words[6]  # some word in the middle of the copied passage
    for parameters in ({"stop": [stop]}, {"max_new_tokens": 9}, {"max_new_tokens": 1}):
        a = generate(server.url, prompt, do_sample=False, **parameters)
        b = generate(speculating.url, prompt, do_sample=False, **parameters)
        assert b["generated_text"] == a["generated_text"], parameters
        assert b["details"]["finish_reason"] == a["details"]["finish_reason"]
        assert b["details"]["generated_tokens"] == a["details"]["generated_tokens"]


def test_info_says_how_many_drafts(server, speculating):
    assert httpx.get(speculating.url + "/info", timeout=10).json()["speculate"] == 4
    assert httpx.get(server.url + "/info", timeout=10).json()["speculate"] == 0


def test_streamed_tokens_equal_the_answer(speculating):
    prompt = PROMPTS[1]
    whole = generate(speculating.url, prompt, do_sample=False)
    body = {"inputs": prompt, "parameters": {"max_new_tokens": NEW_TOKENS, "do_sample": False}}
    ids = []
    with httpx.stream("POST", speculating.url + "/generate_stream", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                ids.append(json.loads(line[5:])["token"]["id"])
    assert ids == [t["id"] for t in whole["details"]["tokens"]]


# -- a draft model ---------------------------------------------------------------------------


def acceptance(srv: Server, before: dict[str, float]) -> tuple[float, float]:
    """(drafts verified, drafts kept) since `before`."""
    after = scrape_metrics(srv.url)
    return tuple(metric(after, name) - metric(before, name)
                 for name in ("textgen_speculative_draft_tokens_total",
                              "textgen_speculative_accepted_tokens_total"))


@pytest.fixture(scope="module")
def self_drafting(demo_model_dir):
    """The demo model drafts for itself, on a pool of 448 KV tokens (the draft's KV shares
    it): preemptions, prefix-cache hits, and every draft kept."""
    srv = Server("--speculate", "4", "--speculative-model", str(demo_model_dir), *TINY_POOL)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def random_draft_dir(demo_model_dir, tmp_path_factory):
    """A two-layer random Llama with the demo model's tokenizer: its drafts are mostly wrong."""
    import shutil

    import torch
    import transformers

    directory = tmp_path_factory.mktemp("random-draft")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_dir / name, directory / name)
    vocab = json.loads((demo_model_dir / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=8192)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def test_a_draft_model_equal_to_the_model_keeps_every_draft_and_the_text(plain_greedy_16, self_drafting):
    before = scrape_metrics(self_drafting.url)
    drafted = answers(self_drafting.url, 16, do_sample=False, max_new_tokens=TINY_POOL_TOKENS)
    for prompt, a, b in zip(PROMPTS, plain_greedy_16, drafted):
        assert a == b, prompt
    drafts, kept = acceptance(self_drafting, before)
    assert drafts > 0 and kept == drafts, (drafts, kept)
    samples = scrape_metrics(self_drafting.url)
    assert metric(samples, "textgen_preemptions_total") > 0, "the tiny pool preempted"
    assert metric(samples, "textgen_prefix_cache_hits_tokens_total") > 0
    assert metric(samples, "textgen_shard_draft_duration_seconds_count") > 0


def test_a_draft_model_stops_exactly_where_the_model_would(server, self_drafting):
    prompt = PROMPTS[0]
    words = generate(server.url, prompt, do_sample=False)["generated_text"].split()
    seeded = dict(do_sample=True, temperature=0.8, top_p=0.95, seed=7)
    for parameters in ({"stop": [" " + words[6]]}, {"max_new_tokens": 9}, {"max_new_tokens": 1}, seeded):
        a = generate(server.url, prompt, **{"do_sample": False, **parameters})
        b = generate(self_drafting.url, prompt, **{"do_sample": False, **parameters})
        assert b["generated_text"] == a["generated_text"], parameters
        assert b["details"]["finish_reason"] == a["details"]["finish_reason"]
        assert b["details"]["generated_tokens"] == a["details"]["generated_tokens"]


def test_a_random_draft_model_keeps_little_and_the_text(server, random_draft_dir):
    srv = Server("--speculate", "4", "--speculative-model", str(random_draft_dir))
    try:
        before = scrape_metrics(srv.url)
        prompts = PROMPTS[::4]  # copy-heavy and open ones
        assert answers(srv.url, 4, prompts, do_sample=False) == answers(server.url, 4, prompts, do_sample=False)
        drafts, kept = acceptance(srv, before)
        assert drafts > 0 and kept < drafts / 4, (drafts, kept)
    finally:
        srv.stop()
