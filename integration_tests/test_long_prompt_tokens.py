"""A long prompt's ids as the router tokenizes it (in parallel chunks past 8 KiB) equal the
Hugging Face tokenizer's one pass over the same text; its prefill, however slow the device,
is not taken for a hung shard."""
import random
import time

import httpx
import pytest
from tokenizers import Tokenizer

from server import Server

PIECES = ["the", "server", "batch", "naïve", "日本語", "Straße", "it's", "x86", "v2.1", "2048", "—", "🙂",
          "(", ")", ",", ".", ":", "def", "=>"]  # fmt: skip
GAPS = [" ", " ", " ", "  ", "   ", "\n", "\n\n", " \n", "\t", ""]


def long_text(seed: int, size: int) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    while sum(len(p.encode()) for p in parts) < size:
        parts += [rng.choice(PIECES), rng.choice(GAPS)]
    return "".join(parts)


@pytest.fixture(scope="module")
def chunking_server():
    """Prefill in steps of 512 tokens: the 5,547-token prompt goes through eleven chunks, each
    continuing the last (the ids are the subject here, not speed)."""
    srv = Server("--max-batch-prefill-tokens", "512")
    yield srv
    srv.stop()


def test_a_long_prompt_tokenizes_like_hugging_face(chunking_server, demo_model_dir):
    text = long_text(0, 10_000)
    want = Tokenizer.from_file(str(demo_model_dir / "tokenizer.json")).encode(text).ids
    response = httpx.post(
        chunking_server.url + "/generate",
        json={"inputs": text, "parameters": {"max_new_tokens": 1, "details": True, "decoder_input_details": True}},
        timeout=600,
    )
    assert response.status_code == 200, response.text
    got = [token["id"] for token in response.json()["details"]["prefill"]]
    assert len(text.encode()) > 8 * 1024 and len(want) > 2000
    assert got == want


def test_a_prefill_step_far_past_the_step_timeout_is_work_not_a_hang(demo_model_dir):
    """On CPU a 1,000-token step takes seconds; the router allows the step timeout plus four
    times its tokens at warmup's rate (the ids are checked above; here the server must not
    fail the step, latch /health to 503 and take itself down)."""
    srv = Server("--step-timeout", "1")
    try:
        text = long_text(1, 2_500)
        tokens = len(Tokenizer.from_file(str(demo_model_dir / "tokenizer.json")).encode(text).ids)
        started = time.monotonic()
        response = httpx.post(srv.url + "/generate", timeout=600,
                              json={"inputs": text, "parameters": {"max_new_tokens": 2}})
        took = time.monotonic() - started
        assert response.status_code == 200, response.text
        assert tokens > 1000 and took > 1, (tokens, took)  # the step outlasted the plain timeout
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
        assert "step deadline" in srv.log()
    finally:
        assert srv.stop() == 0
