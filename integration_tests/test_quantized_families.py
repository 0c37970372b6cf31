"""GPTQ and AWQ checkpoints of the families beyond Llama, served as a user serves them: a tiny
random model in the Hub's layout (tests/shard/tiny_models.py) quantized as GPTQModel / AutoAWQ
write it (tests/shard/int4_checkpoints.py), the demo model's tokenizer beside it, the launcher
started with `--model-id <its directory>` and no --quantize flag.

The oracle is the same model with the dequantized weights stored dense, read by transformers:
the quantized model multiplies exactly those weights, so /generate's greedy tokens equal
transformers' on the oracle token for token (up to an end-of-sequence the router stops at).
Cases: a Qwen3-MoE GPTQ checkpoint (experts stacked packed, the router as stored), a Mixtral AWQ
one (w1/w2/w3, AutoAWQ's modules_to_not_convert ["gate"]) and a Phi-3 GPTQ one with act-order
(fused qkv_proj / gate_up_proj packed as one tensor each).
"""

import shutil
import sys
from pathlib import Path

import pytest
import torch

from server import Server
from test_kv_cache_dtype import greedy_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.shard.int4_checkpoints import awq_config, gptq_config, write_packed_checkpoint  # noqa: E402
from tests.shard.tiny_models import make_tiny_dense_model, make_tiny_moe_model  # noqa: E402

CASES = {  # name: (family, writer, quantization)
    "qwen3_moe-gptq": ("qwen3_moe", make_tiny_moe_model, gptq_config(4, 32, sym=False, checkpoint_format="gptq_v2")),
    "mixtral-awq": ("mixtral", make_tiny_moe_model, {**awq_config(32), "modules_to_not_convert": ["gate"]}),
    "phi3-gptq-actorder": ("phi3", make_tiny_dense_model, gptq_config(4, 32, desc_act=True, sym=True)),
}
PROMPTS = ["The quick brown fox", "def fibonacci(n):"]
NEW_TOKENS = 8


@pytest.fixture(scope="module", params=list(CASES))
def served(request, tmp_path_factory, demo_model_dir):
    """(server, the oracle in transformers, tokenizer, the quantization's method)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    family, write, quantization = CASES[request.param]
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    source = tmp_path_factory.mktemp(family)
    write(family, source, vocab_size=len(tokenizer))
    target, oracle_dir = write_packed_checkpoint(source, tmp_path_factory.mktemp("packed") / request.param, quantization)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(demo_model_dir) / file, target / file)
    oracle = AutoModelForCausalLM.from_pretrained(oracle_dir, torch_dtype=torch.float32).eval()
    server = Server("--model-id", str(target))
    yield server, oracle, tokenizer, quantization["quant_method"]
    server.stop()


def test_the_shard_serves_the_checkpoints_quantization_without_a_flag(served):
    server, _, _, method = served
    assert f"with {method} weights" in server.log()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generate_equals_transformers_on_the_dequantized_weights(served, prompt):
    server, oracle, tokenizer, _ = served
    got = greedy_tokens(server.url, prompt, new_tokens=NEW_TOKENS)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = oracle.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    want = out[0, ids.shape[1] :].tolist()
    assert got == want[: len(got)], (got, want)
    assert len(got) == NEW_TOKENS or got[-1] == tokenizer.eos_token_id, got
