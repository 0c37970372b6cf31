"""GPTQ and AWQ checkpoints (int4/int8 weights packed in int32) on the `reference` path.

The writer (int4_checkpoints.py) packs with explicit per-value shifts; the loader
(layers/int4.py) unpacks with vectorised ones. Each checkpoint comes with its oracle, the same
model with the dequantized weights stored dense in fp32. Tolerances: the dequantized weights
are computed by the same float32 arithmetic ((q - zero) * fp16 scale) on both sides, so they are
compared for equality; products and logits differ only by summation order (fp32 matmul of a
dense weight vs the same weight rebuilt per call): within 1e-5 relative, and greedy tokens are
equal. TP=2 against TP=1: all-reduced partial sums, the existing TP tests' 1e-4.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from shard_server.distributed import ParallelContext
from shard_server.layers.int4 import AWQ_ORDER, PackedWeight, pack_rows, unpack_cols, unpack_rows
from shard_server.models.config import ModelConfig, UnsupportedModelError
from shard_server.weights import WeightsError, read_config

from .int4_checkpoints import (
    awq_config,
    edit_checkpoint,
    gptq_config,
    pack_awq_cols,
    pack_gptq_cols,
    pack_gptq_rows,
    write_packed_checkpoint,
)
from .helpers import StepDriver, generate_greedy
from .test_tensor_parallel import PROMPT, load_rank_model, prefill_logits, run_ranks

FORMATS = {
    "gptq4-g128-sym-v1": gptq_config(4, 128, sym=True),
    "gptq4-g32-asym-v2": gptq_config(4, 32, sym=False, checkpoint_format="gptq_v2"),
    "gptq4-g64-actorder-asym-v1": gptq_config(4, 64, desc_act=True, sym=False),
    "gptq4-g128-actorder-sym-v2": gptq_config(4, 128, desc_act=True, sym=True, checkpoint_format="gptq_v2"),
    "gptq4-channel-asym-v1": gptq_config(4, -1, sym=False),
    "gptq8-g128-asym-v1": gptq_config(8, 128, sym=False),
    "gptq8-g64-actorder-sym-v2": gptq_config(8, 64, desc_act=True, sym=True, checkpoint_format="gptq_v2"),
    "awq-g128": awq_config(128),
    "awq-g32": awq_config(32),
    "awq-channel": awq_config(-1),
}
LINEAR_NAMES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _tiny(directory, family="llama"):
    """A Llama (or Qwen2: q/k/v biases, tied embeddings) wide enough for 128-row groups: hidden 256,
    intermediate 384 (three groups of 128; at TP=2 a rank's down_proj rows start mid-group)."""
    common = dict(vocab_size=160, hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0)  # fmt: skip
    if family == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, tie_word_embeddings=True))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.uniform_(0.5, 1.5) if "norm" in name else param.normal_(0, 0.2 if param.dim() == 1 else 0.08)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return {family: _tiny(tmp_path_factory.mktemp(family), family) for family in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def checkpoints(sources, tmp_path_factory):
    """{format: (quantized dir, oracle dir)}; qwen2 for the AWQ and the act-order v1 case (biases)."""
    root = tmp_path_factory.mktemp("packed")
    written = {}
    for index, (name, quantization) in enumerate(FORMATS.items()):
        family = "qwen2" if name in ("awq-g128", "gptq4-g64-actorder-asym-v1") else "llama"
        written[name] = write_packed_checkpoint(sources[family], root / name, quantization, seed=index)
    return written


def rel(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


# Packing conventions.


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_words_unpack_as_the_writer_packed_them(bits):
    values = torch.randint(0, 2**bits, (64, 24), generator=torch.Generator().manual_seed(bits)).numpy()
    words = pack_gptq_rows(values, bits)
    assert words.dtype == torch.int32 and words.shape == (64 * bits // 32, 24)
    assert torch.equal(unpack_rows(words, bits), torch.from_numpy(values).int())
    assert torch.equal(pack_rows(torch.from_numpy(values), bits), words)  # the layer's repacking: same words
    zeros = pack_gptq_cols(values, bits)
    assert torch.equal(unpack_cols(zeros, bits), torch.from_numpy(values).int())
    first = int(words[0, 0]) & 0xFFFFFFFF  # low bits first: input row 0 in bits [0, bits)
    assert first & (2**bits - 1) == values[0, 0] and first >> (32 - bits) == values[32 // bits - 1, 0]


def test_awq_words_hold_columns_in_the_interleaved_order():
    values = torch.randint(0, 16, (5, 16), generator=torch.Generator().manual_seed(0)).numpy()
    words = pack_awq_cols(values)
    assert words.shape == (5, 2)
    assert torch.equal(unpack_cols(words, 4, AWQ_ORDER), torch.from_numpy(values).int())
    word = int(words[0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 15 for i in range(8)] == [values[0, c] for c in (0, 2, 4, 6, 1, 3, 5, 7)]
    # AutoAWQ's published inverse (AWQ_REVERSE_ORDER), which its dequantize_gemm applies after unpacking.
    assert [AWQ_ORDER.index(column) for column in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]


def test_symmetric_v1_zero_points_read_as_the_hubs_0x77777777(checkpoints):
    """AutoGPTQ's symmetric 4-bit checkpoints store every qzeros word as 0x77777777 (2004318071):
    zero point 8, minus one. The v2 format stores 8 itself (0x88888888)."""
    from safetensors.torch import load_file

    name = "model.layers.0.mlp.down_proj"
    v1 = load_file(str(checkpoints["gptq4-g128-sym-v1"][0] / "model.safetensors"))[f"{name}.qzeros"]
    v2 = load_file(str(checkpoints["gptq4-g128-actorder-sym-v2"][0] / "model.safetensors"))[f"{name}.qzeros"]
    assert (v1 == 2004318071).all() and (v2 == 0x88888888 - 2**32).all()
    for directory in (checkpoints["gptq4-g128-sym-v1"][0], checkpoints["gptq4-g128-actorder-sym-v2"][0]):
        zeros = load_rank_model(directory, ParallelContext()).layers[0].mlp.down_proj.packed.zeros
        assert (zeros == 8).all()


# Every format against its oracle.


def _linears(model):
    for layer in model.layers:
        for module in (layer.self_attn, layer.mlp):
            for name in LINEAR_NAMES:
                if hasattr(module, name):
                    yield f"{name}", getattr(module, name)


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_layer_holds_the_dequantized_weights_and_multiplies_like_them(checkpoints, name):
    packed_dir, oracle_dir = checkpoints[name]
    model, oracle = load_rank_model(packed_dir, ParallelContext()), load_rank_model(oracle_dir, ParallelContext())
    assert model.config.quantize == FORMATS[name]["quant_method"] and oracle.config.quantize is None
    x = torch.randn(7, 384, generator=torch.Generator().manual_seed(1))
    for (label, linear), (_, dense) in zip(_linears(model), _linears(oracle)):
        assert linear.weight is None and isinstance(linear.packed, PackedWeight)
        assert linear.packed.qweight.dtype == torch.int32
        assert linear.packed.qweight.shape == (dense.weight.shape[1] * FORMATS[name]["bits"] // 32, dense.weight.shape[0])
        assert torch.equal(linear.packed.dequantize(), dense.weight), label
        inputs = x[:, : dense.weight.shape[1]]
        assert rel(linear(inputs), dense(inputs)) < 1e-5, label


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_tiny_model_in_each_format_generates_the_oracles_greedy_tokens(checkpoints, name):
    packed_dir, oracle_dir = checkpoints[name]
    got, want = _greedy(packed_dir), _greedy(oracle_dir)
    assert want["logits"].std(dim=-1).min() > 0.5, "logits too flat to compare"
    assert rel(got["logits"], want["logits"]) < 1e-5
    assert got["greedy"] == want["greedy"] and len(set(got["greedy"])) > 1


def assert_generates_the_oracles_tokens(packed_dir, oracle_dir, flat: float = 0.1) -> None:
    """Prefill logits within 1e-5 of the oracle's (summation order only) and the same greedy tokens."""
    got, want = _greedy(packed_dir), _greedy(oracle_dir)
    assert want["logits"].std(dim=-1).min() > flat, "logits too flat to compare"
    assert rel(got["logits"], want["logits"]) < 1e-5
    assert got["greedy"] == want["greedy"]


def _greedy(directory) -> dict:
    """Prefill logits and 8 greedy tokens (chunked prefill, then decodes) through the runner."""
    from shard_server.kv_cache import KVSpec
    from shard_server.runner import ModelRunner

    model = load_rank_model(directory, ParallelContext())
    cfg = model.config
    runner = ModelRunner(model, KVSpec(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4, torch.float32),
                         torch.device("cpu"))  # fmt: skip
    runner.allocate_kv_cache(64)
    greedy = generate_greedy(StepDriver(runner), 1, PROMPT, 8, chunk=5)
    return {"logits": prefill_logits(model, ParallelContext()), "greedy": greedy}


def test_quantized_logits_stay_near_the_unquantized_models(sources, checkpoints):
    """The writer's quantization is real (RTN): 4-bit groups of 32 move each weight by ~8 % (rms),
    which a random two-layer model turns into ~33 % of the logits; 8 bits by ~0.6 %."""
    plain = prefill_logits(load_rank_model(sources["llama"], ParallelContext()), ParallelContext())
    for name, bound in (("gptq4-g32-asym-v2", 0.5), ("gptq8-g128-asym-v1", 0.05)):
        logits = prefill_logits(load_rank_model(checkpoints[name][0], ParallelContext()), ParallelContext())
        assert 0 < rel(logits, plain) < bound, name


def test_two_ranks_match_one(checkpoints):
    """Column slices cut qzeros (and AWQ's qweight) words; row slices of down_proj (384 inputs,
    groups of 128 or 64) start mid-group at rank 1; act-order ranks read the groups their rows use."""
    names = ["gptq4-g64-actorder-asym-v1", "gptq4-g128-sym-v1", "gptq8-g64-actorder-sym-v2", "awq-g128", "awq-channel"]
    assert_two_ranks_give_one_ranks_logits({name: checkpoints[name][0] for name in names})


def assert_two_ranks_give_one_ranks_logits(directories: dict) -> None:
    """Each checkpoint of {label: directory} at two gloo ranks gives its one-rank prefill logits (1e-4)."""
    outputs = run_ranks(2, list(directories.values()), "logits")
    for index, (label, directory) in enumerate(directories.items()):
        one = prefill_logits(load_rank_model(directory, ParallelContext()), ParallelContext())
        for rank in range(2):
            torch.testing.assert_close(outputs[rank][index]["logits"], one, atol=1e-4, rtol=1e-4,
                                       msg=f"{label} rank {rank}")  # fmt: skip


@pytest.mark.parametrize("name", ["gptq4-g64-actorder-asym-v1", "gptq8-g128-asym-v1", "awq-g128"])
def test_each_rank_holds_its_slice_of_the_dequantized_weights_and_reads_about_half(checkpoints, name):
    """Without collectives: rank r's column-parallel rows and row-parallel columns of the TP=1 weights."""
    from shard_server.models.registry import build_model
    from shard_server.weights import WeightStore

    directory = checkpoints[name][0]
    cfg = ModelConfig.from_dict(read_config(directory))

    def load(ctx):
        with WeightStore(directory) as store:
            return build_model(cfg, store, ctx, "reference", torch.float32, torch.device("cpu")), store.bytes_read

    (whole, read_one) = load(ParallelContext())
    for rank in range(2):
        ctx = ParallelContext(rank, 2)
        part, read = load(ctx)
        assert read < 0.65 * read_one, (rank, read, read_one)
        for layer, full in zip(part.layers, whole.layers):
            start, end = ctx.split(cfg.intermediate_size)
            got, want = layer.mlp.down_proj.packed.dequantize(), full.mlp.down_proj.packed.dequantize()
            assert torch.equal(got, want[:, start:end])
            size = cfg.intermediate_size
            rows = torch.cat([torch.arange(start, end), size + torch.arange(start, end)])
            assert torch.equal(layer.mlp.gate_up_proj.packed.dequantize(), full.mlp.gate_up_proj.packed.dequantize()[rows])
            start, end = ctx.split(cfg.num_attention_heads * cfg.head_dim)
            assert torch.equal(layer.self_attn.o_proj.packed.dequantize(), full.self_attn.o_proj.packed.dequantize()[:, start:end])


# Bad checkpoints stop the load, naming the tensor and the format.

DOWN = "model.layers.1.mlp.down_proj"


def _copy(checkpoints, name, tmp_path):
    import shutil

    target = tmp_path / name
    shutil.copytree(checkpoints[name][0], target)
    return target


@pytest.mark.parametrize("name,edit,config_edit,message", [
    ("gptq4-g128-sym-v1", lambda t: t.pop(f"{DOWN}.scales"), None, f"{DOWN}.scales is missing \\(gptq 4-bit"),
    ("awq-g128", lambda t: t.pop(f"{DOWN}.qzeros"), None, f"{DOWN}.qzeros is missing \\(awq 4-bit"),
    ("gptq4-g64-actorder-asym-v1", lambda t: t.pop(f"{DOWN}.g_idx"), None, f"{DOWN}.g_idx is missing .*desc_act"),
    ("gptq4-g128-sym-v1", None, lambda q: q.update(group_size=64),
     "q_proj.scales has 2 groups \\(shape \\[2, 256\\]\\); 256 inputs in gptq 4-bit, group size 64 make 4"),
    ("awq-g32", None, lambda q: q.update(group_size=128), "scales has .* groups .*awq 4-bit, group size 128"),
    ("gptq4-g128-sym-v1", None, lambda q: q.update(bits=8),
     "qweight has shape .*gptq 8-bit.*fit 4-bit packing, not the declared 8 bits"),
    ("gptq4-g128-sym-v1", lambda t: t.update({f"{DOWN}.qweight": t[f"{DOWN}.qweight"].float()}), None,
     f"{DOWN}.qweight is F32; gptq 4-bit, group size 128 stores it as int32"),
    ("gptq4-g128-sym-v1", lambda t: t.update({f"{DOWN}.qzeros": t[f"{DOWN}.qzeros"][:, :8].contiguous()}), None,
     f"{DOWN}.qzeros has shape \\[3, 8\\]"),
    ("gptq4-g128-sym-v1", lambda t: t[f"{DOWN}.g_idx"].__setitem__(5, 7), None,
     f"{DOWN}.g_idx holds groups outside \\[0, 3\\)"),
    ("gptq4-g64-actorder-asym-v1", lambda t: t.update({"model.layers.0.self_attn.k_proj.g_idx":
                                                       t["model.layers.0.self_attn.k_proj.g_idx"].flip(0)}), None,
     "k_proj.g_idx differs from model.layers.0.self_attn.q_proj.g_idx"),
])  # fmt: skip
def test_bad_checkpoints_are_refused_naming_the_tensor_and_format(checkpoints, tmp_path, name, edit, config_edit, message):
    directory = _copy(checkpoints, name, tmp_path)
    edit_checkpoint(directory, edit, config_edit)
    with pytest.raises(WeightsError, match=message):
        load_rank_model(directory, ParallelContext())


@pytest.mark.parametrize("quantization,message", [
    (gptq_config(3), "3-bit GPTQ is not loaded"),
    (gptq_config(checkpoint_format="marlin"), "checkpoint_format 'marlin' is not loaded"),
    ({**awq_config(), "version": "gemv"}, "AWQ version 'gemv' is not loaded"),
    ({**awq_config(), "zero_point": False}, "zero_point: false"),
    ({**gptq_config(), "lm_head": True}, "quantized lm_head"),
    ({**awq_config(), "modules_to_not_convert": ["mlp.down_proj"]}, "modules_to_not_convert"),
    (gptq_config(group_size=0), "group_size 0"),
    ({"quant_method": "bitsandbytes"}, "\\('bitsandbytes'\\): fp8, gptq, awq and compressed-tensors checkpoints load"),
    ({"quant_method": "marlin"}, "\\('marlin'\\)"),
])  # fmt: skip
def test_unloadable_quantization_configs_are_refused_by_name(sources, quantization, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_dict({**read_config(sources["llama"]), "quantization_config": quantization})


def test_quantize_flag_must_agree_with_the_checkpoint(sources):
    raw = read_config(sources["llama"])
    gptq = ModelConfig.from_dict({**raw, "quantization_config": gptq_config()})
    awq = ModelConfig.from_dict({**raw, "quantization_config": awq_config()})
    plain = ModelConfig.from_dict(raw)
    for cfg, flag, served in ((gptq, None, "gptq"), (gptq, "gptq", "gptq"), (gptq, "marlin", "gptq"),
                              (awq, "awq", "awq"), (awq, "marlin", "awq"), (plain, "fp8", "fp8"), (plain, None, None)):  # fmt: skip
        assert cfg.with_quantize(flag).quantize == served and cfg.with_quantize(flag).packed == cfg.packed
    for cfg, flag, message in ((gptq, "awq", "--quantize awq needs a awq checkpoint, and this is a gptq checkpoint"),
                               (gptq, "fp8", "--quantize fp8 needs an unquantized .*this is a gptq checkpoint"),
                               (awq, "gptq", "this is a awq checkpoint"),
                               (plain, "gptq", "--quantize gptq needs a gptq checkpoint, and this is an unquantized"),
                               (plain, "marlin", "--quantize marlin needs a gptq or awq checkpoint"),
                               (plain, "eetq", "--quantize eetq is not implemented")):  # fmt: skip
        with pytest.raises(UnsupportedModelError, match=message):
            cfg.with_quantize(flag)


def test_the_shard_cli_takes_tgis_quantize_values():
    from shard_server.cli import parse_config

    base = ["serve", "--model-path", "/m", "--uds-path", "/tmp/s"]
    for flag in ("fp8", "gptq", "awq", "marlin"):
        assert parse_config([*base, "--quantize", flag]).quantize == flag
    with pytest.raises(SystemExit):
        parse_config([*base, "--quantize", "bitsandbytes"])


def test_the_config_json_needs_no_flag(checkpoints):
    directory = checkpoints["awq-g128"][0]
    assert json.loads((directory / "config.json").read_text())["quantization_config"]["version"] == "gemm"
    cfg = ModelConfig.from_dict(read_config(directory)).with_quantize(None)
    assert cfg.quantize == "awq" and cfg.packed.bits == 4 and cfg.packed.group_size == 128


# GPU: the same reference product on the device, eager and from CUDA graphs.

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@needs_cuda
@pytest.mark.parametrize("name", ["gptq4-g64-actorder-asym-v1", "awq-g128", "gptq8-g128-asym-v1"])
def test_gpu_reference_product_gives_the_oracles_tokens(checkpoints, name):
    from .test_triton_runner import _decode_batch, make_runner

    prompts = [[(5 * i + 11 * b) % 150 for i in range(9 + 4 * b)] for b in range(3)]
    tokens = [_decode_batch(make_runner(directory, "reference", torch.device("cuda")), prompts, new_tokens=8)
              for directory in checkpoints[name]]  # fmt: skip  (float32: the same weights, the same tokens)
    assert tokens[0] == tokens[1]


@needs_cuda
def test_gpu_packed_model_gives_the_same_tokens_eager_and_from_graphs(checkpoints):
    from shard_server.warmup import PoolSizing, warmup

    from .test_triton_runner import _decode_batch, make_runner

    prompts = [[(5 * i + 11 * b) % 150 for i in range(9 + 4 * b)] for b in range(3)]
    results = {}
    for graphs in ((), (1, 2, 4)):
        runner = make_runner(checkpoints["gptq4-g128-actorder-sym-v2"][0], "triton", torch.device("cuda"),
                             dtype=torch.bfloat16)  # fmt: skip
        warmup(runner, 64, 4, PoolSizing(1024, 0.05, graphs))
        results[graphs] = _decode_batch(runner, prompts, new_tokens=10)
    assert results[(1, 2, 4)] == results[()]


@pytest.mark.parametrize("name,file,config", [
    ("gptq4-g128-sym-v1", "quantize_config.json",
     {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "damp_percent": 0.01}),
    ("awq-g128", "quant_config.json", {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}),
])  # fmt: skip
def test_a_separate_quantize_config_file_declares_the_quantization(checkpoints, tmp_path, name, file, config):
    """AutoGPTQ's quantize_config.json and AutoAWQ's quant_config.json, as older Hub repos ship them."""
    directory = _copy(checkpoints, name, tmp_path)
    raw = read_config(directory)
    del raw["quantization_config"]
    (directory / "config.json").write_text(json.dumps(raw))
    (directory / file).write_text(json.dumps(config))
    want = prefill_logits(load_rank_model(checkpoints[name][0], ParallelContext()), ParallelContext())
    assert torch.equal(prefill_logits(load_rank_model(directory, ParallelContext()), ParallelContext()), want)
