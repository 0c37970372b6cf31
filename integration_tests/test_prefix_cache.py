"""The radix prefix cache on the real stack: hits are counted, answers do not change."""
import httpx
import pytest

from server import Server, metric, scrape_metrics

SYSTEM = ("You are a careful assistant. Answer in one short sentence, and never invent facts. "
          "The library opens at nine and closes at five; the museum opens at ten. ") * 4


def generate(url: str, prompt: str, **parameters) -> dict:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 12, "details": True, **parameters}}
    response = httpx.post(url + "/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def tokens(answer: dict) -> list[int]:
    return [token["id"] for token in answer["details"]["tokens"]]


def hits(url: str) -> tuple[float, float]:
    samples = scrape_metrics(url)
    return (metric(samples, "textgen_prefix_cache_hits_tokens_total"),
            metric(samples, "textgen_prefix_cache_hits_generated_tokens_total"))


def test_a_repeated_prefix_hits_and_greedy_and_seeded_answers_do_not_change(server):
    first = generate(server.url, SYSTEM + "When does the library open?", do_sample=False)
    before, _ = hits(server.url)
    again = generate(server.url, SYSTEM + "When does the library open?", do_sample=False)
    after, _ = hits(server.url)
    assert after - before >= 64, "the shared system prompt came from the cache"
    assert tokens(again) == tokens(first)

    seeded = dict(do_sample=True, temperature=0.9, seed=1234)
    cold = generate(server.url, "Tell me about the museum. " + SYSTEM, **seeded)
    warm = generate(server.url, "Tell me about the museum. " + SYSTEM, **seeded)
    assert tokens(warm) == tokens(cold), "the same seed gives the same tokens cached or not"


def test_the_next_turn_hits_the_previous_answer(server):
    history = SYSTEM + "User: Name three colours.\nAssistant:"
    answer = generate(server.url, history, do_sample=False, max_new_tokens=24)
    _, generated_before = hits(server.url)
    history += answer["generated_text"] + "\nUser: And three animals?\nAssistant:"
    generate(server.url, history, do_sample=False)
    _, generated_after = hits(server.url)
    assert generated_after > generated_before, "tokens of the previous answer were reused"


def test_prompt_logprobs_are_the_same_with_a_cached_prefix(server):
    prompt = SYSTEM + "Which opens first?"
    generate(server.url, prompt, do_sample=False)
    details = generate(server.url, prompt, do_sample=False, decoder_input_details=True)
    prefill = details["details"]["prefill"]
    assert len(prefill) > 64 and all(entry["logprob"] is not None for entry in prefill[1:])


@pytest.fixture(scope="module")
def uncached_server():
    srv = Server("--prefix-caching", "false", "--scheduling-policy", "fifo")
    yield srv
    srv.stop()


def test_greedy_answers_match_a_server_without_the_cache(server, uncached_server):
    prompts = [SYSTEM + question for question in
               ("When does the museum open?", "When does the library close?", "Is it open?")]
    for prompt in prompts:  # the second and third reuse the first's prefix
        cached = generate(server.url, prompt, do_sample=False)
        plain = generate(uncached_server.url, prompt, do_sample=False)
        assert tokens(cached) == tokens(plain), prompt
    assert hits(uncached_server.url) == (0.0, 0.0)
