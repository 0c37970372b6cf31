"""Our Llama-family models against transformers on the same safetensors weights."""

import pytest
import torch

from shard_server.attention.base import StepLayout

from .helpers import StepDriver, generate_greedy, load_model, load_runner
from .tiny_models import FAMILIES, make_tiny_model

# fp32 on CPU: the same math in a different op order (fused projections, paged attention).
LOGITS_ATOL = 1e-4


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prefill_logits_match_transformers(family, tmp_path):
    reference = make_tiny_model(family, tmp_path)
    model = load_model(tmp_path)
    ids = torch.randint(0, reference.config.vocab_size, (37,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    runner = load_runner(tmp_path, block_size=4, num_blocks=32)
    table = torch.randperm(32, generator=torch.Generator().manual_seed(2))[:10].tolist()
    layout = StepLayout([37], [37], [table], 4)
    metadata = runner.backend.build_metadata(layout, torch.device("cpu"))
    with torch.inference_mode():
        logits = model.compute_logits(model(ids, torch.arange(37), runner.kv_cache, metadata))
    assert expected.abs().max() > 1.0, "reference logits are too flat to compare"
    torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_tokens_match_transformers(family, tiny_model_dirs):
    directory = tiny_model_dirs[family]
    reference = make_tiny_model(family, directory.parent / f"{family}-again")
    runner = load_runner(directory)
    driver = StepDriver(runner)
    prompt = torch.randint(0, 160, (23,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        expected = reference.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )[0, len(prompt) :].tolist()
    assert generate_greedy(driver, 7, prompt, 20, chunk=6) == expected
