"""The GPU benchmark's parity harness, on a tiny float32 model: triton against reference, and
reference against itself with the batch split (the noise floor), agree exactly there."""

import pytest
import torch

pytest.importorskip("triton")

from bench.gpu_parity import agreement, compare_backends  # noqa: E402
from shard_server.distributed import ParallelContext  # noqa: E402
from shard_server.models.config import ModelConfig  # noqa: E402
from shard_server.models.registry import attention_shape  # noqa: E402
from shard_server.weights import read_config  # noqa: E402

from .test_triton_runner import make_runner  # noqa: E402


def test_agreement_counts_positions_prefixes_and_logit_gaps():
    logits = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    result = agreement([[1, 2, 3], [4, 5, 6]], logits + 0.5, [[1, 9, 3], [4, 5, 6]], logits)
    assert result["positionwise_token_agreement"] == pytest.approx(5 / 6)
    assert result["tokens_before_first_divergence"] == [1, 3]
    assert result["first_step_logits_max_abs_diff"] == pytest.approx(0.5)
    assert result["first_step_logits_rel_l2"] == pytest.approx(1.0 / torch.tensor(30.0).sqrt().item())


def test_compare_backends_on_a_tiny_float32_model(tiny_model_dirs):
    directory = tiny_model_dirs["llama"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # interpreted kernels on CPU
    runner = make_runner(directory, "triton", device, num_blocks=512)
    shape = attention_shape(ModelConfig.from_dict(read_config(directory)), ParallelContext())
    result = compare_backends(runner, shape, text_vocab=150, prompts=2, new_tokens=3)
    for measured in (result, result["reference_noise_floor"]):
        assert measured["positionwise_token_agreement"] == 1.0
        assert measured["tokens_before_first_divergence"] == [3, 3]
        assert measured["first_step_logits_rel_l2"] < 1e-3
    # The runner got its own backend back.
    assert all(layer.self_attn.backend.name == "triton" for layer in runner.model.layers)
