"""GPTQ and AWQ checkpoints of the dense families beyond Llama: Gemma 2, Gemma 3 (the multimodal
checkpoint, text only) and Phi-3, whose fused qkv_proj and gate_up_proj are packed as one tensor
each (as GPTQModel and AutoAWQ write them).

Each quantized checkpoint is compared with its oracle, the same model with the dequantized
weights stored dense (int4_checkpoints.py): the same float32 weights on both sides, so greedy
tokens are equal and logits differ only by summation order (1e-5 relative). TP=2 against TP=1:
the existing TP tests' 1e-4.
"""

from __future__ import annotations

import pytest
import torch

from shard_server.distributed import ParallelContext
from shard_server.layers.int4 import PackedWeight

from .int4_checkpoints import awq_config, damaged_copy, gptq_config
from .quantized_checkpoints import write_family_checkpoints
from .test_int4_checkpoints import assert_generates_the_oracles_tokens, assert_two_ranks_give_one_ranks_logits, rel
from .test_tensor_parallel import load_rank_model
from .tiny_models import make_tiny_dense_model

FAMILIES = ("gemma2", "gemma3", "phi3")
FORMATS = {
    "gptq4-g32-asym-v2": gptq_config(4, 32, sym=False, checkpoint_format="gptq_v2"),
    "gptq4-g32-actorder-sym-v1": gptq_config(4, 32, desc_act=True, sym=True),
    "awq-g32": awq_config(32),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(family, format): (quantized dir, oracle dir)}."""
    return write_family_checkpoints(tmp_path_factory, FAMILIES, make_tiny_dense_model, FORMATS)


CASES = [(family, name) for family in FAMILIES for name in FORMATS]


@pytest.mark.parametrize(("family", "name"), CASES)
def test_every_decoder_linear_stays_packed_and_holds_the_oracles_weights(checkpoints, family, name):
    packed_dir, oracle_dir = checkpoints[family, name]
    model, oracle = load_rank_model(packed_dir, ParallelContext()), load_rank_model(oracle_dir, ParallelContext())
    assert model.config.quantize == FORMATS[name]["quant_method"]
    for layer, dense_layer in zip(model.layers, oracle.layers):
        for module, dense_module, labels in ((layer.self_attn, dense_layer.self_attn, ("qkv_proj", "o_proj")),
                                             (layer.mlp, dense_layer.mlp, ("gate_up_proj", "down_proj"))):  # fmt: skip
            for label in labels:
                linear, dense = getattr(module, label), getattr(dense_module, label)
                assert linear.weight is None and isinstance(linear.packed, PackedWeight), label
                assert torch.equal(linear.packed.dequantize(), dense.weight), (family, name, label)


@pytest.mark.parametrize(("family", "name"), CASES)
def test_a_packed_model_generates_its_oracles_greedy_tokens(checkpoints, family, name):
    assert_generates_the_oracles_tokens(*checkpoints[family, name])


def test_two_ranks_match_one(checkpoints):
    """Phi-3's fused qkv_proj: each rank reads its q, k and v columns of the one packed tensor
    (column slices that cut qzeros words, and AWQ's qweight words); rows of o_proj and
    down_proj split over the groups (act-order: the groups each rank's rows use)."""
    cases = [("phi3", "gptq4-g32-asym-v2"), ("phi3", "awq-g32"), ("phi3", "gptq4-g32-actorder-sym-v1"),
             ("gemma2", "awq-g32"), ("gemma3", "gptq4-g32-asym-v2")]  # fmt: skip
    assert_two_ranks_give_one_ranks_logits({case: checkpoints[case][0] for case in cases})


QKV = "model.layers.1.self_attn.qkv_proj"


@pytest.mark.parametrize("name,edit,message", [
    ("gptq4-g32-asym-v2", lambda t: t.pop(f"{QKV}.scales"), f"{QKV}.scales is missing \\(gptq 4-bit"),
    ("awq-g32", lambda t: t.update({f"{QKV}.qweight": t[f"{QKV}.qweight"][:, :8].contiguous()}),
     f"{QKV}.qweight has shape \\[64, 8\\]"),
    # A fused tensor narrower than q + k + v: the v columns are not there.
    ("gptq4-g32-asym-v2", lambda t: t.update({f"{QKV}.{key}": t[f"{QKV}.{key}"][:, :columns].contiguous()
                                              for key, columns in (("qweight", 96), ("scales", 96), ("qzeros", 12))}),
     f"{QKV}.scales has 96 output columns; this rank needs \\[96, 128\\)"),
])  # fmt: skip
def test_a_bad_fused_phi3_tensor_is_refused_naming_it(checkpoints, tmp_path, name, edit, message):
    from shard_server.weights import WeightsError

    directory = damaged_copy(checkpoints["phi3", name][0], tmp_path / name, edit)
    with pytest.raises(WeightsError, match=message):
        load_rank_model(directory, ParallelContext())
