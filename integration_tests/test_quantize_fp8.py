"""`--quantize fp8` on the real stack: the shard holds fp8 weights, answers stay near the model's;
an fp8 checkpoint (compressed-tensors, per-channel scales) serves without the flag.

On the demo model (135M parameters, its activations rounded to fp8 on CPU too) greedy answers
fork from transformers' sooner than with bf16/fp32 weights: bench/cpu_fp8_quality.py measures
by how much. Here: the server serves, and answers share most of their tokens with the model's.
"""
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from server import Server
from test_kv_cache_dtype import PROMPTS, greedy_tokens


@pytest.fixture(scope="module")
def fp8_server():
    srv = Server("--quantize", "fp8")
    yield srv
    srv.stop()


def test_the_shard_loads_fp8_weights_and_info_names_the_activation_dtype(fp8_server):
    assert "with fp8 weights" in fp8_server.log()
    assert httpx.get(fp8_server.url + "/info", timeout=10).json()["model_dtype"] == "float32"


def test_greedy_answers_stay_near_transformers(fp8_server, reference):
    pairs = [(greedy_tokens(fp8_server.url, p), reference(p, 12)) for p in PROMPTS]
    assert any(got[:8] == want[:8] for got, want in pairs), pairs
    assert sum(a == b for got, want in pairs for a, b in zip(got, want)) >= 18, pairs


def test_streaming_and_a_bad_request_leave_it_serving(fp8_server):
    body = {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 8}}
    with httpx.stream("POST", fp8_server.url + "/generate_stream", json=body, timeout=120) as response:
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    assert response.status_code == 200 and len(events) == 8
    bad = httpx.post(fp8_server.url + "/generate", json={"inputs": "x", "parameters": {"max_new_tokens": -1}}, timeout=30)
    assert bad.status_code == 422
    assert greedy_tokens(fp8_server.url, PROMPTS[0], new_tokens=4)


@pytest.fixture(scope="module")
def fp8_checkpoint_server(demo_model_dir, tmp_path_factory):
    """The demo model written as an fp8 checkpoint, the way quantization tools publish one."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.shard.fp8_checkpoints import write_fp8_checkpoint

    target = tmp_path_factory.mktemp("demo-fp8")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(demo_model_dir / name, target / name)
    write_fp8_checkpoint(demo_model_dir, target)
    srv = Server("--model-id", str(target))
    yield srv
    srv.stop()


def test_an_fp8_checkpoint_answers_as_the_model_quantized_at_load(fp8_checkpoint_server, fp8_server):
    """Per-channel scales are what --quantize fp8 computes from the fp32 demo weights."""
    assert "with fp8 weights" in fp8_checkpoint_server.log()
    for prompt in PROMPTS:
        assert greedy_tokens(fp8_checkpoint_server.url, prompt) == greedy_tokens(fp8_server.url, prompt), prompt
