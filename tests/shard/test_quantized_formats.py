"""compressed-tensors `pack-quantized` (W4A16/W8A16) and `int-quantized` (W8A8) checkpoints and
block-wise fp8 (DeepSeek / Qwen3-FP8, and compressed-tensors' block strategy) on the `reference` path.

The writer (quantized_checkpoints.py) packs with explicit per-value shifts; the loader
(layers/quantized.py, converting pack-quantized to layers/int4.py's layout) unpacks with
vectorised ones. Each checkpoint comes with its oracle, the same model with the dequantized
weights stored dense in float32. Tolerances:
- dequantized weights: both sides compute (int) * scale (or fp8 * scale) exactly in float32, so
  they are compared for equality;
- weight-only formats (pack-quantized, block fp8, int8 W8A16): products and logits differ from
  the oracle only by summation order, within 1e-5 relative; greedy tokens are equal;
- W8A8: the reference quantizes each activation row to int8 (amax / 127), as the checkpoint
  declares and the int8 kernel will: the layer equals that formula (computed here on its own)
  within 1e-5 and the dense product within 2 %; the model's logits are within 5 % of the
  oracle's and its greedy tokens are the oracle's for this model and prompt;
- TP=2 against TP=1: all-reduced partial sums, the existing TP tests' 1e-4;
- block fp8 past 16 rows on the fused path (each row quantized to e4m3): the same arithmetic in
  torch within float32's summation order, and the dense product within 5 % relative L2.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from shard_server.distributed import ParallelContext
from shard_server.layers.int4 import PackedWeight, unpack_cols
from shard_server.layers.quantized import BlockFp8Weight, Int8Weight, quantize_rows_int8
from shard_server.models.config import ModelConfig, UnsupportedModelError
from shard_server.models.quantization import BlockFp8Scheme, Int8Scheme
from shard_server.weights import WeightsError, read_config

from .int4_checkpoints import edit_checkpoint
from .quantized_checkpoints import (
    block_fp8_config,
    block_fp8_ct_config,
    int8_config,
    pack_ct_cols,
    pack_ct_rows,
    pack_quantized_config,
    write_quantized_checkpoint,
)
from .test_int4_checkpoints import LINEAR_NAMES, _greedy, _tiny, rel
from .test_tensor_parallel import load_rank_model, prefill_logits, run_ranks

FORMATS = {
    "w4a16-g128-sym": pack_quantized_config(4, 128, symmetric=True),
    "w4a16-g32-asym": pack_quantized_config(4, 32, symmetric=False),
    "w4a16-channel-asym": pack_quantized_config(4, None, symmetric=False),
    "w4a16-g64-actorder-asym": pack_quantized_config(4, 64, symmetric=False, actorder="group"),
    "w8a16-g128-sym": pack_quantized_config(8, 128, symmetric=True),
    "w8a16-channel-asym": pack_quantized_config(8, None, symmetric=False),
    "w8a8-int8": int8_config(activations=True),
    "w8a16-int8": int8_config(activations=False),
    "fp8-block128": block_fp8_config((128, 128)),
    "fp8-block-ct": block_fp8_ct_config((128, 128)),
}
# The kernel cases: compiled on a GPU host (where Triton's interpreter is off), interpreted on CPU.
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WEIGHT_ONLY = [name for name in FORMATS if name != "w8a8-int8"]
QUANTIZE = {"pack-quantized": "compressed-tensors", "int-quantized": "compressed-tensors", "float-quantized": "fp8",
            None: "fp8"}  # fmt: skip
KIND = {"pack-quantized": PackedWeight, "int-quantized": Int8Weight, "float-quantized": BlockFp8Weight,
        None: BlockFp8Weight}  # fmt: skip
QWEN2 = ("w4a16-g32-asym", "w4a16-g64-actorder-asym", "w8a8-int8", "fp8-block128")  # biases and tied embeddings


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return {family: _tiny(tmp_path_factory.mktemp(family), family) for family in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def checkpoints(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    return {name: write_quantized_checkpoint(sources["qwen2" if name in QWEN2 else "llama"], root / name, config)
            for name, config in FORMATS.items()}  # fmt: skip


def _linears(model):
    for layer in model.layers:
        for module in (layer.self_attn, layer.mlp):
            for name in LINEAR_NAMES:
                if hasattr(module, name):
                    yield name, getattr(module, name)


# Packing conventions: compressed-tensors' pack_to_int32, written down independently.


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_quantized_words_are_compressed_tensors_pack_to_int32(bits):
    """Signed values + 2^(bits-1), `32/bits` consecutive columns per word, low bits first; zero
    points packed the same way along dimension 0."""
    signed = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (6, 20), generator=torch.Generator().manual_seed(bits))
    stored = (signed + 2 ** (bits - 1)).numpy()
    words = pack_ct_cols(stored, bits)
    pack = 32 // bits
    assert words.dtype == torch.int32 and words.shape == (6, -(-20 // pack))
    first = int(words[0, 0]) & 0xFFFFFFFF
    assert [(first >> (bits * i)) & ((1 << bits) - 1) for i in range(pack)] == list(stored[0, :pack])
    assert torch.equal(unpack_cols(words, bits)[:, :20], torch.from_numpy(stored).int())
    rows = pack_ct_rows(stored, bits)
    assert rows.shape == (-(-6 // pack), 20)
    assert (int(rows[0, 3]) & ((1 << bits) - 1)) == stored[0, 3]


def test_symmetric_w4a16_stores_no_zero_point_and_loads_zero_eight(checkpoints):
    from safetensors.torch import load_file

    directory = checkpoints["w4a16-g128-sym"][0]
    tensors = load_file(str(directory / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    assert f"{name}.weight_zero_point" not in tensors and tensors[f"{name}.weight_scale"].dtype == torch.bfloat16
    assert tensors[f"{name}.weight_packed"].shape == (256, 384 // 8)
    assert tensors[f"{name}.weight_shape"].tolist() == [256, 384]
    packed = load_rank_model(directory, ParallelContext()).layers[0].mlp.down_proj.packed
    assert (packed.zeros == 8).all() and packed.qweight.shape == (384 // 8, 256)


def test_unpacked_int8_zero_points_of_older_compressed_tensors_load_the_same(checkpoints, tmp_path):
    """compressed-tensors before 0.10 saved asymmetric zero points unpacked: int8 [out, groups], signed."""
    source = checkpoints["w4a16-g32-asym"][0]
    directory = tmp_path / "unpacked-zp"
    shutil.copytree(source, directory)

    def unpack(tensors):
        for name in [n for n in tensors if n.endswith(".weight_zero_point")]:
            out = tensors[name.replace("zero_point", "scale")].shape[0]
            tensors[name] = (unpack_cols(tensors[name].t().contiguous(), 4).t()[:out] - 8).to(torch.int8).contiguous()

    edit_checkpoint(directory, unpack)
    want = prefill_logits(load_rank_model(source, ParallelContext()), ParallelContext())
    assert torch.equal(prefill_logits(load_rank_model(directory, ParallelContext()), ParallelContext()), want)


# Every format against its oracle.


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_layer_holds_the_dequantized_weights_and_multiplies_like_them(checkpoints, name):
    quantized_dir, oracle_dir = checkpoints[name]
    model, oracle = load_rank_model(quantized_dir, ParallelContext()), load_rank_model(oracle_dir, ParallelContext())
    fmt = FORMATS[name].get("format")
    assert model.config.quantize == QUANTIZE[fmt] and oracle.config.quantize is None
    x = torch.randn(7, 384, generator=torch.Generator().manual_seed(1))
    for (label, linear), (_, dense) in zip(_linears(model), _linears(oracle)):
        assert linear.weight is None and isinstance(linear.packed, KIND[fmt])
        assert torch.equal(linear.packed.dequantize(), dense.weight), label
        inputs = x[:, : dense.weight.shape[1]]
        if name == "w8a8-int8":
            xq, scale = quantize_rows_int8(inputs)
            assert (xq.float() * scale - inputs).abs().max() <= scale.max() / 2 + 1e-6
            want = (xq.double() @ linear.packed.weight.double().t()) * scale.double() * linear.packed.scale.double().t()
            if dense.bias is not None:
                want = want + dense.bias.double()
            assert rel(linear(inputs), want) < 1e-5, label
            assert rel(linear(inputs), dense(inputs)) < 0.02, label
        else:
            assert rel(linear(inputs), dense(inputs)) < 1e-5, label


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_tiny_model_in_each_format_generates_the_oracles_greedy_tokens(checkpoints, name):
    quantized_dir, oracle_dir = checkpoints[name]
    got, want = _greedy(quantized_dir), _greedy(oracle_dir)
    assert want["logits"].std(dim=-1).min() > 0.5, "logits too flat to compare"
    assert rel(got["logits"], want["logits"]) < (0.05 if name == "w8a8-int8" else 1e-5)
    assert got["greedy"] == want["greedy"] and len(set(got["greedy"])) > 1


def test_quantized_logits_stay_near_the_unquantized_models(sources, checkpoints):
    """The writers quantize for real: 4-bit groups move the logits by tens of percent, 8 bits by ~1 %."""
    plain = prefill_logits(load_rank_model(sources["llama"], ParallelContext()), ParallelContext())
    for name, bound in (("w4a16-g128-sym", 0.6), ("w8a16-g128-sym", 0.05), ("w8a16-int8", 0.05),
                        ("fp8-block-ct", 0.2)):  # fmt: skip
        logits = prefill_logits(load_rank_model(checkpoints[name][0], ParallelContext()), ParallelContext())
        assert 0 < rel(logits, plain) < bound, name


def test_two_ranks_match_one(checkpoints):
    """At TP=2 a rank's k/v rows (64 of 128) start mid-block for fp8 and its down_proj inputs
    (192 of 384) start mid-group (128) and mid zero-point word rows for pack-quantized.

    W8A8 is the exception: a row-parallel rank (o, down) quantizes its half of each activation
    row with that half's own scale, as vLLM's int8 path does, so TP=2 is not TP=1 bit for bit;
    both are within the activation rounding (5 %) of the oracle and of each other, and 90 % of
    the positions' argmax agree with the oracle's (here one of 21 flips, a near-tie)."""
    names = ["w4a16-g128-sym", "w4a16-g32-asym", "w4a16-g64-actorder-asym", "w8a16-channel-asym", "w8a16-int8", "fp8-block128", "fp8-block-ct",
             "w8a8-int8"]  # fmt: skip
    directories = [checkpoints[name][0] for name in names]
    outputs = run_ranks(2, directories, "logits")
    for index, directory in enumerate(directories):
        one = prefill_logits(load_rank_model(directory, ParallelContext()), ParallelContext())
        for rank in range(2):
            got = outputs[rank][index]["logits"]
            if names[index] == "w8a8-int8":
                oracle = prefill_logits(load_rank_model(checkpoints["w8a8-int8"][1], ParallelContext()), ParallelContext())
                assert 0 < rel(got, one) < 0.05 and rel(got, oracle) < 0.05
                assert (got.argmax(-1) == oracle.argmax(-1)).float().mean() >= 0.9  # near-ties may flip
                continue
            torch.testing.assert_close(got, one, atol=1e-4, rtol=1e-4, msg=f"{names[index]} rank {rank}")


@pytest.mark.parametrize("name", ["w4a16-g32-asym", "w4a16-g64-actorder-asym", "w8a8-int8", "fp8-block128"])
def test_each_rank_holds_its_slice_of_the_dequantized_weights_and_reads_about_half(checkpoints, name):
    from shard_server.models.registry import build_model
    from shard_server.weights import WeightStore

    directory = checkpoints[name][0]
    cfg = ModelConfig.from_dict(read_config(directory))

    def load(ctx):
        with WeightStore(directory) as store:
            return build_model(cfg, store, ctx, "reference", torch.float32, torch.device("cpu")), store.bytes_read

    whole, read_one = load(ParallelContext())
    for rank in range(2):
        ctx = ParallelContext(rank, 2)
        part, read = load(ctx)
        assert read < 0.65 * read_one, (rank, read, read_one)
        for layer, full in zip(part.layers, whole.layers):
            start, end = ctx.split(cfg.intermediate_size)
            assert torch.equal(layer.mlp.down_proj.packed.dequantize(), full.mlp.down_proj.packed.dequantize()[:, start:end])
            size = cfg.intermediate_size
            rows = torch.cat([torch.arange(start, end), size + torch.arange(start, end)])
            assert torch.equal(layer.mlp.gate_up_proj.packed.dequantize(), full.mlp.gate_up_proj.packed.dequantize()[rows])
            start, end = ctx.split(cfg.num_attention_heads * cfg.head_dim)
            assert torch.equal(layer.self_attn.o_proj.packed.dequantize(), full.self_attn.o_proj.packed.dequantize()[:, start:end])


def test_block_scales_are_kept_not_expanded_per_row(checkpoints):
    """A row's blocks have different scales, so one scale per row could not be exact."""
    linear = load_rank_model(checkpoints["fp8-block128"][0], ParallelContext()).layers[0].mlp.down_proj.packed
    assert linear.weight.dtype == torch.float8_e4m3fn and linear.scale.shape == (2, 3)
    assert (linear.scale[:, 0] != linear.scale[:, 1]).any()


# Bad checkpoints stop the load, naming the tensor and the format.

DOWN = "model.layers.1.mlp.down_proj"


@pytest.mark.parametrize("name,edit,config_edit,message", [
    ("w4a16-g128-sym", lambda t: t.pop(f"{DOWN}.weight_scale"), None,
     f"{DOWN}.weight_scale is missing \\(compressed-tensors pack-quantized W4A16"),
    ("w4a16-g32-asym", lambda t: t.pop(f"{DOWN}.weight_zero_point"), None,
     f"{DOWN}.weight_zero_point is missing \\(compressed-tensors pack-quantized W4A16, group size 32, asymmetric"),
    ("w4a16-g128-sym", None, lambda q: q["config_groups"]["group_0"]["weights"].update(group_size=64),
     "weight_scale has shape \\[.*, 2\\]; 256 inputs in compressed-tensors pack-quantized W4A16, group size 64.* need"),
    ("w4a16-g128-sym", None, lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=8),
     "weight_packed has shape .*W8A16.*fit 4-bit packing, not the declared 8 bits"),
    ("w4a16-g128-sym", None, lambda q: q["config_groups"]["group_0"]["weights"].update(symmetric=False),
     "weight_zero_point is missing .*asymmetric"),
    ("w4a16-g32-asym", None, lambda q: q["config_groups"]["group_0"]["weights"].update(symmetric=True),
     "weight_zero_point is stored but the config declares symmetric weights"),
    ("w4a16-g128-sym", lambda t: t.update({f"{DOWN}.weight_shape": torch.tensor([256, 380])}), None,
     f"{DOWN}.weight_shape is \\[256, 380\\]"),
    ("w4a16-g128-sym", lambda t: t.update({f"{DOWN}.weight_packed": t[f"{DOWN}.weight_packed"].float()}), None,
     f"{DOWN}.weight_packed is F32; compressed-tensors pack-quantized W4A16.* stores it as int32"),
    ("w4a16-g64-actorder-asym", lambda t: t.pop(f"{DOWN}.weight_g_idx"), None,
     f"{DOWN}.weight_g_idx is missing \\(compressed-tensors pack-quantized W4A16, group size 64, actorder group"),
    ("w4a16-g64-actorder-asym", lambda t: t[f"{DOWN}.weight_g_idx"].__setitem__(3, 9), None,
     f"{DOWN}.weight_g_idx holds groups outside \\[0, 6\\)"),
    ("w4a16-g64-actorder-asym", lambda t: t.update({"model.layers.0.self_attn.k_proj.weight_g_idx":
                                                    t["model.layers.0.self_attn.k_proj.weight_g_idx"].flip(0)}), None,
     "k_proj.weight_g_idx differs from model.layers.0.self_attn.q_proj.weight_g_idx"),
    ("w8a8-int8", lambda t: t.pop(f"{DOWN}.weight_scale"), None,
     f"{DOWN}.weight_scale is missing \\(compressed-tensors int-quantized W8A8"),
    ("w8a8-int8", lambda t: t.update({f"{DOWN}.weight_scale": t[f"{DOWN}.weight_scale"][:100].contiguous()}), None,
     f"{DOWN}.weight_scale is BF16 \\[100, 1\\]; compressed-tensors int-quantized W8A8 needs float \\[256, 1\\]"),
    ("w8a8-int8", lambda t: t.update({f"{DOWN}.weight": t[f"{DOWN}.weight"].float()}), None,
     f"{DOWN}.weight is F32; compressed-tensors int-quantized W8A8 stores int8 weights"),
    ("w8a8-int8", lambda t: t.update({f"{DOWN}.weight_zero_point": torch.ones(256, 1, dtype=torch.int8)}), None,
     f"{DOWN}.weight_zero_point holds non-zero zero points"),
    ("fp8-block128", lambda t: t.pop(f"{DOWN}.weight_scale_inv"), None,
     f"{DOWN}.weight_scale_inv is missing \\(block-wise fp8 \\(128x128 blocks"),
    ("fp8-block128", lambda t: t.update({f"{DOWN}.weight_scale_inv": t[f"{DOWN}.weight_scale_inv"][:, :2].contiguous()}),
     None, f"{DOWN}.weight_scale_inv is F32 \\[2, 2\\]; a \\[256, 384\\] weight in block-wise fp8 .* = \\[2, 3\\]"),
    ("fp8-block128", None, lambda q: q.update(weight_block_size=[64, 64]),
     "weight_scale_inv is F32 \\[.*\\]; .* block-wise fp8 \\(64x64 blocks.*needs"),
    ("fp8-block128", lambda t: t.update({f"{DOWN}.weight": t[f"{DOWN}.weight"].float()}), None,
     f"{DOWN}.weight is F32; block-wise fp8 .* stores e4m3 weights"),
    ("fp8-block128", lambda t: t[f"{DOWN}.weight_scale_inv"].__setitem__((0, 0), float("nan")), None,
     f"{DOWN}.weight_scale_inv holds scales that are negative, inf or nan \\(block-wise fp8"),
])  # fmt: skip
def test_bad_checkpoints_are_refused_naming_the_tensor_and_format(checkpoints, tmp_path, name, edit, config_edit, message):
    directory = tmp_path / name
    shutil.copytree(checkpoints[name][0], directory)
    edit_checkpoint(directory, edit, config_edit)
    with pytest.raises(WeightsError, match=message):
        load_rank_model(directory, ParallelContext())


def _group(**weights):
    config = pack_quantized_config(4, 128)
    config["config_groups"]["group_0"]["weights"].update(weights)
    return config


@pytest.mark.parametrize("quantization,message", [
    (_group(num_bits=2), "pack-quantized group 'group_0': 2-bit weights are not loaded"),
    (_group(strategy="tensor"), "strategy 'tensor' is not loaded \\(group and channel are\\)"),
    (_group(group_size=0), "group_size 0 is not a positive integer"),
    (_group(actorder="dynamic"), "actorder 'dynamic' is not loaded"),
    (_group(type="float"), "has 'float' weights; pack-quantized stores int weights"),
    ({**pack_quantized_config(), "config_groups": {**pack_quantized_config()["config_groups"],
                                                   "group_1": pack_quantized_config(8)["config_groups"]["group_0"]}},
     "2 config_groups \\(group_0, group_1\\)"),
    ({**pack_quantized_config(), "ignore": ["lm_head", "model.layers.0.mlp.down_proj"]}, "ignore .*down_proj"),
    ({**pack_quantized_config(), "format": "marlin-24"}, "format 'marlin-24' is not loaded"),
    ({**pack_quantized_config(), "sparsity_config": {"format": "sparse-24-bitmask"}}, "sparsity_config format"),
    ({**int8_config(), "config_groups": {"g": {**int8_config()["config_groups"]["group_0"],
                                               "input_activations": {"type": "int", "num_bits": 8, "strategy": "tensor",
                                                                     "dynamic": False}}}},
     "int-quantized group 'g' quantizes activations as \\('int', 8, 'tensor'\\) \\(dynamic: False\\)"),
    ({**int8_config(), "config_groups": {"g": {"weights": {"type": "int", "num_bits": 8, "strategy": "channel",
                                                           "symmetric": False}}}},
     "asymmetric int8 weights are not loaded"),
    ({**int8_config(), "config_groups": {"g": {"weights": {"type": "int", "num_bits": 4, "strategy": "group"}}}},
     "int-quantized group 'g' has 4-bit 'group' weights"),
    ({**pack_quantized_config(), "config_groups": {"g": {**pack_quantized_config()["config_groups"]["group_0"],
                                                         "input_activations": {"type": "int", "num_bits": 8}}}},
     "quantizes activations \\(int 8-bit\\): pack-quantized W4A16 loads"),
    (block_fp8_config((128,)), "weight_block_size \\[128\\] is not two positive integers"),
    ({**block_fp8_config(), "activation_scheme": "static"}, "activation_scheme 'static'"),
    ({**block_fp8_config(), "fmt": "e5m2"}, "fmt 'e5m2' is not loaded"),
    ({**block_fp8_config(), "modules_to_not_convert": ["model.layers.0.mlp"]}, "modules_to_not_convert"),
    ({"quant_method": "bitsandbytes"}, "\\('bitsandbytes'\\): fp8, gptq, awq and compressed-tensors checkpoints load"),
])  # fmt: skip
def test_unloadable_quantization_configs_are_refused_by_name(sources, quantization, message):
    with pytest.raises(UnsupportedModelError, match=f"pre-quantized.*{message}"):
        ModelConfig.from_dict({**read_config(sources["llama"]), "quantization_config": quantization})


DENSE = "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, gemma3, phi3"


def test_int8_weights_load_for_the_dense_families_only(sources):
    """(Block-wise fp8 and pack-quantized weights load for every family, the MoE ones too:
    test_moe_models.py, test_packed_moe.py.)"""
    raw = {**read_config(sources["llama"]), "model_type": "olmoe", "quantization_config": int8_config()}
    with pytest.raises(UnsupportedModelError, match=f"weights load for {DENSE}, not 'olmoe'"):
        ModelConfig.from_dict(raw)


def test_the_config_json_needs_no_flag_and_the_flag_must_agree(sources):
    raw = read_config(sources["llama"])
    w4 = ModelConfig.from_dict({**raw, "quantization_config": pack_quantized_config(4, 128)})
    assert w4.with_quantize(None).quantize == "compressed-tensors" and w4.packed.bits == 4
    block = ModelConfig.from_dict({**raw, "quantization_config": block_fp8_config()})
    assert block.with_quantize("fp8").quantize == "fp8" and block.packed.block == (128, 128)
    for cfg, flag in ((w4, "fp8"), (w4, "gptq"), (w4, "marlin"), (block, "awq")):
        with pytest.raises(UnsupportedModelError, match=f"--quantize {flag} needs"):
            cfg.with_quantize(flag)


# GPU: the same reference product on the device.

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@needs_cuda
@pytest.mark.parametrize("name", ["w4a16-g32-asym", "w8a16-int8", "fp8-block128"])
def test_gpu_reference_product_gives_the_oracles_tokens(checkpoints, name):
    from .test_triton_runner import _decode_batch, make_runner

    prompts = [[(5 * i + 11 * b) % 150 for i in range(9 + 4 * b)] for b in range(3)]
    tokens = [_decode_batch(make_runner(directory, "reference", torch.device("cuda")), prompts, new_tokens=8)
              for directory in checkpoints[name]]  # fmt: skip
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="cuBLASLt's int8 GEMM"))])  # fmt: skip
@pytest.mark.parametrize("rows", [1, 16, 17, 40])
def test_the_int8_product_is_exact_where_float32_is_not(device, rows):
    """Sums past 2^24 (127 * 127 * 16384 ~ 2.6e8), where float32 rounds: the int32 sums are
    exact; fewer than 17 rows are padded on CUDA, and widths off the 8 alignment take float64."""
    from shard_server.layers.quantized import int8_product

    gen = torch.Generator().manual_seed(rows)
    xq = torch.randint(100, 128, (rows, 16384), generator=gen, dtype=torch.int8)
    weight = torch.randint(100, 128, (24, 16384), generator=gen, dtype=torch.int8)
    want = xq.long() @ weight.long().t()
    got = int8_product(xq.to(device), weight.to(device)).cpu()
    assert got.dtype == torch.int32 and torch.equal(got.long(), want)
    assert not torch.equal((xq.float() @ weight.float().t()).long(), want)  # float32 rounds these
    odd = weight[:20, :1000]  # 20 features, 1000 deep: not the GEMM's shapes
    assert torch.equal(int8_product(xq[:, :1000].to(device), odd.to(device)).cpu().long(),
                       xq[:, :1000].long() @ odd.long().t())


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize(("row_start", "col_start"), [(0, 0), (40, 70)])  # a rank's slice off the blocks
def test_the_block_fp8_kernel_equals_the_dequantized_product(rows, row_start, col_start):
    """Few rows through `block_fp8_rows` (compiled on a GPU host, interpreted on CPU) against
    x @ dequantize().T, for a slice whose rows and columns start mid-block: per K tile, partial
    sums times each feature's block scale."""
    pytest.importorskip("triton")
    from shard_server.kernels.block_fp8_matmul import ColumnBlocks, block_fp8_rows
    from shard_server.kernels.dispatch import fused_kernels

    weight = _block_fp8_weight(72, 300, row_start, col_start, seed=rows + row_start)
    x = torch.randn(rows, 300, generator=torch.Generator().manual_seed(rows)).half().to(KERNEL_DEVICE)
    want = x.float() @ weight.dequantize().t()
    with fused_kernels(True, on_cpu=True):
        got = weight.linear(x, None)
    direct = block_fp8_rows(x, weight.weight, weight.scale, weight.row_block, weight.col_blocks)
    assert torch.equal(got, direct) and got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, atol=2e-2 * want.abs().max().item(), rtol=2e-3)
    first = 128 - col_start % 128
    assert weight.col_blocks == ColumnBlocks(first=first, width=128)
    assert weight.col_blocks.spans(300) == [(0, first), (first, first + 128), (first + 128, 300)]


# (rows, out, depth, row_start, col_start, block, tile): ragged rows, features and depth; slices
# off the blocks (columns 70: a first block of 58, not 16-aligned; 16: 112); K tiles narrower
# than a block (several a block) and wider (masked to it); the K loop split into ranges that
# end mid-block, or one past the tiles (an empty range); None: ROWS_TILES' tile.
ROWS_CASES = [
    (1, 72, 300, 0, 0, (32, 128), None),
    (7, 72, 300, 40, 70, (32, 128), None),
    (16, 150, 300, 40, 16, (32, 128), None),
    (3, 72, 300, 40, 70, (32, 128), (16, 32, 64, 4, 2)),
    (5, 90, 200, 8, 24, (16, 64), (16, 32, 128, 4, 3)),
    (11, 72, 300, 0, 70, (32, 128), (16, 64, 32, 4, 4, 3)),
    (2, 150, 700, 40, 16, (32, 128), (16, 32, 128, 4, 4, 4)),
    (1, 72, 300, 40, 70, (32, 128), (16, 128, 64, 4, 3, 4)),
    (4, 40, 50, 0, 0, (128, 128), (16, 32, 32, 4, 2, 3)),  # one column block, split into 2 + 2 tiles
    (16, 40, 50, 0, 0, (128, 128), (16, 32, 128, 4, 2, 2)),  # one tile: the second range is empty
]


@pytest.mark.parametrize(("rows", "out", "depth", "row_start", "col_start", "block", "tile"), ROWS_CASES)
@pytest.mark.parametrize("fp16_dot", [False, True])
def test_block_fp8_rows_in_any_tile_equal_the_dequantized_product(rows, out, depth, row_start, col_start, block, tile,
                                                                  fp16_dot):  # fmt: skip
    """`block_fp8_rows`' one K loop (compiled on a GPU host, interpreted on CPU) against x @
    dequantize().T in float64: the weight's values widen exactly and the rows are unrounded, so
    only float32 sums (in any order, split or not) and the output's rounding differ. bf16 rows
    (a GPU's) stay bf16 or, with `fp16_dot`, become fp16 exactly (these are well inside its range)."""
    pytest.importorskip("triton")
    from shard_server.kernels.block_fp8_matmul import GemmTile, block_fp8_rows

    weight = _block_fp8_weight(out, depth, row_start, col_start, seed=rows + out + depth, block=block)
    x = torch.randn(rows, depth, generator=torch.Generator().manual_seed(rows)) * 3
    for dtype in [torch.float16] + ([torch.bfloat16] if KERNEL_DEVICE == "cuda" else []):
        xd = x.to(dtype)
        want = xd.double() @ weight.dequantize().cpu().double().t()
        got = block_fp8_rows(xd.to(KERNEL_DEVICE), weight.weight, weight.scale, weight.row_block, weight.col_blocks,
                             GemmTile(*tile) if tile else None, fp16_dot=fp16_dot).cpu()  # fmt: skip
        assert got.dtype == dtype and got.shape == (rows, out)
        ulp = 2**-8 if dtype == torch.bfloat16 else 2**-11
        torch.testing.assert_close(got.double(), want, atol=1e-5 * want.abs().max().item(), rtol=ulp)


def test_block_fp8_rows_widened_to_fp16_saturate_bf16_rows_past_its_range():
    """`fp16_dot`: a bf16 row past fp16's 65504 is clamped to it (as per-channel fp8's few-row
    product does); without it the row is unrounded."""
    pytest.importorskip("triton")
    from shard_server.kernels.block_fp8_matmul import block_fp8_rows

    if KERNEL_DEVICE != "cuda":
        pytest.skip("the interpreter truncates float32 to bf16")
    weight = _block_fp8_weight(40, 256, seed=3)
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    x[0, 5] = 2.0**20
    args = (weight.weight, weight.scale, weight.row_block, weight.col_blocks)
    column = weight.dequantize().cpu()[:, 5]
    wide = block_fp8_rows(x.to(KERNEL_DEVICE), *args, fp16_dot=False).cpu().float()[0]  # not the default
    clamped = block_fp8_rows(x.to(KERNEL_DEVICE), *args, fp16_dot=True).cpu().float()[0]
    # float32 products in another order, then rounded to bf16: within one of its steps
    torch.testing.assert_close(wide, (column * 2.0**20).bfloat16().float(), rtol=2**-7, atol=0)
    torch.testing.assert_close(clamped, (column * 65504.0).bfloat16().float(), rtol=2**-7, atol=0)


@pytest.mark.parametrize("rows", [1, 16])
def test_few_block_fp8_rows_take_the_rows_table_tile(rows, monkeypatch):
    """Up to 16 half-precision rows go to `block_fp8_rows` in ROWS_TILES' tile, meeting the weight
    in fp16 as ROWS_FP16_DOT says; no row is quantized and the weight is never widened in memory."""
    pytest.importorskip("triton")
    from shard_server.kernels import block_fp8_matmul
    from shard_server.kernels.dispatch import fused_kernels
    from shard_server.layers import quantized as quantized_module

    weight = _block_fp8_weight(72, 300, 40, 70)
    launches = recorded(monkeypatch, block_fp8_matmul, "_launch")
    monkeypatch.setattr(quantized_module, "block_fp8_gemm", None)
    monkeypatch.setattr(quantized_module, "dequantize_8bit", None)
    x = torch.randn(rows, 300, generator=torch.Generator().manual_seed(rows)).half().to(KERNEL_DEVICE)
    with fused_kernels(True, on_cpu=True):
        got = weight.linear(x, None)
    assert len(launches) == 1 and got.shape == (rows, 72)
    tile, fp8_rows, fp16_dot = launches[0][7:]
    assert tile == block_fp8_matmul.rows_tile(rows) and tile.block_m == 16 and not fp8_rows
    assert fp16_dot is block_fp8_matmul.ROWS_FP16_DOT is True


@pytest.mark.parametrize("rows", [1, 16])
def test_w8a16_decodes_stream_the_int8_weight_through_the_skinny_kernel(rows):
    """Up to 16 rows of a W8A16 layer (compiled on a GPU host, interpreted on CPU) equal
    x @ dequantize().T; the int8 values widen exactly, each output feature's scale applies once
    at the end."""
    pytest.importorskip("triton")
    from shard_server.kernels.dispatch import fused_kernels

    weight = _w8a16_weight(80, 300, seed=rows)
    x = torch.randn(rows, 300, generator=torch.Generator().manual_seed(rows)).half().to(KERNEL_DEVICE)
    want = x.float() @ weight.dequantize().t()
    with fused_kernels(True, on_cpu=True):
        got = weight.linear(x, None)
    assert got.dtype == torch.float16 and got.shape == (rows, 80)
    torch.testing.assert_close(got.float(), want, atol=2e-2 * want.abs().max().item(), rtol=2e-3)


def recorded(monkeypatch, module, name: str) -> list:
    """`module.name` still runs, each call's arguments appended to the list returned."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args: calls.append(args) or real(*args))
    return calls


def _block_fp8_weight(out, depth, row_start=0, col_start=0, seed=0, block=(32, 128)):
    """A block-wise fp8 layer's slice starting mid-block (rows and columns), on the kernel device."""
    gen = torch.Generator().manual_seed(seed)
    bn, bk = block
    weight = BlockFp8Weight(BlockFp8Scheme(block=(bn, bk)), (out, depth), torch.float16, KERNEL_DEVICE)
    weight.weight.copy_((torch.randn(out, depth, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn))
    row_ids, col_ids = torch.arange(row_start, row_start + out), torch.arange(col_start, col_start + depth)
    low_r, low_c = row_start // bn, col_start // bk
    blocks = (-(-(row_start + out) // bn) - low_r, -(-(col_start + depth) // bk) - low_c)
    weight._set(torch.rand(blocks, generator=gen) + 0.01, row_ids // bn - low_r, col_ids // bk - low_c)
    return weight


def _w8a16_weight(out, depth, seed=0):
    gen = torch.Generator().manual_seed(seed)
    weight = Int8Weight(Int8Scheme(activations=False), (out, depth), torch.float16, KERNEL_DEVICE)
    weight.weight.copy_(torch.randint(-128, 128, (out, depth), generator=gen, dtype=torch.int8))
    weight.scale.copy_(torch.rand(out, 1, generator=gen) / 100 + 1e-3)
    return weight


# bf16 only where a GPU rounds: the interpreter truncates float32 to bf16.
DEQUANTIZE_DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if KERNEL_DEVICE == "cuda" else [])


@pytest.mark.parametrize("dtype", DEQUANTIZE_DTYPES)
@pytest.mark.parametrize("kind", ["block-fp8", "block-fp8-mid-block", "w8a16"])
def test_the_one_pass_dequantize_builds_the_reference_weight(kind, dtype):
    pytest.importorskip("triton")
    from shard_server.kernels.dequantize import dequantize_8bit
    from shard_server.kernels.dispatch import fused_kernels

    if kind == "w8a16":
        weight = _w8a16_weight(150, 300)
        args = (weight.weight, weight.scale, dtype)
    else:
        weight = _block_fp8_weight(150, 300, *((40, 70) if kind.endswith("mid-block") else (0, 0)))
        args = (weight.weight, weight.scale, dtype, weight.row_block, weight.col_block)
    with fused_kernels(True, on_cpu=True):
        got = dequantize_8bit(*args)
    assert got.dtype == dtype and torch.equal(got, weight.dequantize(dtype))


def test_many_w8a16_rows_multiply_the_weight_dequantized_in_one_pass(monkeypatch):
    """Past the skinny kernel's 16 rows W8A16 multiplies the weight the one-pass kernel built,
    and matches the reference product."""
    pytest.importorskip("triton")
    from shard_server.kernels.dispatch import fused_kernels
    from shard_server.layers import quantized as quantized_module

    weight = _w8a16_weight(80, 300)
    passes = recorded(monkeypatch, quantized_module, "dequantize_8bit")
    x = torch.randn(17, 300, generator=torch.Generator().manual_seed(3)).half().to(KERNEL_DEVICE)
    want = x.float() @ weight.dequantize().t()
    with fused_kernels(True, on_cpu=True):
        got = weight.linear(x, None)
    assert len(passes) == 1 and got.dtype == torch.float16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, atol=2e-2 * want.abs().max().item(), rtol=2e-3)


# Block fp8 past 16 rows: the rows quantized to e4m3 one scale each, fp8 x fp8 per column block.


def _block_fp8_gemm_reference(x: torch.Tensor, weight: BlockFp8Weight) -> torch.Tensor:
    """The GEMM's arithmetic in torch: rows quantized as the kernel's are (on a GPU by the same
    kernel: its float32 division may round a value to the other e4m3 neighbour than torch's
    exact one, which moves that row's outputs past the tolerance), each column block's fp8
    products summed exactly (float64: each product has 8 significant bits), times each
    feature's block scale, summed, times each row's scale, rounded once."""
    from shard_server.kernels.fp8_matmul import _quantized_rows

    xq, x_scale = (part.cpu() for part in _quantized_rows(x))
    scales = weight.scale.cpu().double()[weight.row_block.cpu().long()]
    acc = torch.zeros(x.shape[0], weight.out_features, dtype=torch.float64)
    for block, (low, high) in enumerate(weight.col_blocks.spans(weight.in_features)):
        acc += (xq[:, low:high].double() @ weight.weight[:, low:high].cpu().double().t()) * scales[:, block]
    return (acc * x_scale.double()).float().to(x.dtype)


# As ROWS_CASES; the few-row cases as the bench times them (fp8 rows at decode batches, split).
GEMM_CASES = [
    (17, 72, 300, 0, 0, (32, 128), None),
    (37, 72, 300, 40, 70, (32, 128), None),
    (70, 150, 300, 40, 16, (32, 128), None),
    (130, 150, 260, 0, 0, (128, 128), None),
    (37, 72, 300, 40, 70, (32, 128), (16, 32, 64, 4, 2)),
    (33, 72, 300, 0, 70, (32, 128), (32, 64, 32, 4, 2)),
    (20, 90, 200, 8, 24, (16, 64), (16, 32, 128, 4, 2)),
    (20, 40, 50, 0, 0, (128, 128), (16, 32, 32, 4, 2)),  # one column block
    (2, 72, 300, 40, 70, (32, 128), (16, 128, 64, 4, 3, 4)),
    (16, 150, 700, 40, 16, (32, 128), (16, 32, 128, 4, 4, 4)),
    (5, 40, 50, 0, 0, (128, 128), (16, 32, 32, 4, 2, 3)),
]


@pytest.mark.parametrize(("rows", "out", "depth", "row_start", "col_start", "block", "tile"), GEMM_CASES)
def test_the_block_fp8_gemm_is_its_arithmetic_and_near_the_dequantized_product(rows, out, depth, row_start, col_start,
                                                                               block, tile):  # fmt: skip
    """`block_fp8_gemm` (compiled on a GPU host, interpreted on CPU) against the same arithmetic
    in torch, within float32's summation order (float32 rows on CPU) or one rounding; and against
    x @ dequantize().T within the rows' e4m3 rounding (the weight's values are exact): ~2.6 %
    relative L2 here, bounded at 5 %."""
    pytest.importorskip("triton")
    from shard_server.kernels.block_fp8_matmul import GemmTile, block_fp8_gemm

    weight = _block_fp8_weight(out, depth, row_start, col_start, seed=rows + out, block=block)
    runs = [torch.full((high - low,), b) for b, (low, high) in enumerate(weight.col_blocks.spans(depth))]
    assert torch.equal(weight.col_block.cpu(), torch.cat(runs).int())
    x = torch.randn(rows, depth, generator=torch.Generator().manual_seed(rows)) * 3
    x[rows // 2] = 0.0  # an all-zero row: the tiniest scale, and zeros out
    for dtype in (torch.float32, torch.float16):
        xd = x.to(dtype).to(KERNEL_DEVICE)
        got = block_fp8_gemm(xd, weight.weight, weight.scale, weight.row_block, weight.col_blocks,
                             GemmTile(*tile) if tile else None).cpu()  # fmt: skip
        want = _block_fp8_gemm_reference(xd, weight)
        assert got.dtype == dtype and got.shape == (rows, out) and not got[rows // 2].any()
        # float32 rows: the summation order, or on a GPU the fp8 tensor cores' narrower accumulation
        # within an instruction; fp16: also one rounding either way.
        close = 1e-5 if dtype == torch.float32 and KERNEL_DEVICE == "cpu" else 1e-3
        torch.testing.assert_close(got.float(), want.float(), atol=close * want.abs().max().item(), rtol=2 * close)
    dense = x @ weight.dequantize().cpu().t()
    assert rel(got.float(), dense) < 5e-2


def test_block_fp8_gemm_takes_no_rows():
    pytest.importorskip("triton")
    from shard_server.kernels.block_fp8_matmul import block_fp8_gemm

    weight = _block_fp8_weight(72, 300, 40, 70)
    got = block_fp8_gemm(torch.zeros(0, 300, device=KERNEL_DEVICE, dtype=torch.float16), weight.weight, weight.scale,
                         weight.row_block, weight.col_blocks)  # fmt: skip
    assert got.shape == (0, 72) and got.dtype == torch.float16


def test_column_blocks_read_a_grid_of_equal_blocks_and_refuse_others():
    pytest.importorskip("triton")
    from shard_server.kernels.block_fp8_matmul import ColumnBlocks, column_blocks

    starts = lambda *values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    assert column_blocks(starts(0, 128, 256, 300)) == ColumnBlocks(first=128, width=128)
    assert column_blocks(starts(0, 58, 186, 230)) == ColumnBlocks(first=58, width=128)  # a slice from mid-block
    assert column_blocks(starts(0, 58, 100)) == ColumnBlocks(first=58, width=58)
    assert column_blocks(starts(0, 50)) == ColumnBlocks(first=50, width=50)
    assert ColumnBlocks(first=58, width=128).spans(230) == [(0, 58), (58, 186), (186, 230)]
    assert ColumnBlocks(first=128, width=128).spans(256) == [(0, 128), (128, 256)]
    assert ColumnBlocks(first=50, width=50).spans(50) == [(0, 50)]
    for bad in (starts(0, 128, 192, 320), starts(0, 64, 64, 128)):
        with pytest.raises(ValueError, match="not one grid"):
            column_blocks(bad)


@pytest.mark.parametrize("rows", [17, 40, 0])
def test_block_fp8_rows_past_the_skinny_kernel_take_the_gemm(rows, monkeypatch):
    """Past 16 half-precision rows the layer quantizes its rows and multiplies fp8 by fp8; the
    weight is never widened."""
    pytest.importorskip("triton")
    from shard_server.kernels.dispatch import fused_kernels
    from shard_server.layers import quantized as quantized_module

    weight = _block_fp8_weight(72, 300, 40, 70)
    calls = recorded(monkeypatch, quantized_module, "block_fp8_gemm")
    monkeypatch.setattr(quantized_module, "dequantize_8bit", None)
    x = torch.randn(2, rows, 300, generator=torch.Generator().manual_seed(rows)).half().to(KERNEL_DEVICE)
    with fused_kernels(True, on_cpu=True):
        got = weight.linear(x, torch.ones(72, dtype=torch.float16, device=KERNEL_DEVICE))
    want = _block_fp8_gemm_reference(x.reshape(-1, 300), weight).view(2, rows, 72).float() + 1
    assert len(calls) == 1 and got.dtype == torch.float16 and got.shape == (2, rows, 72)
    torch.testing.assert_close(got.cpu().float(), want, atol=1e-3 * want.abs().amax().item() if rows else 0, rtol=1e-3)


@pytest.mark.parametrize("rows", [3, 40])
def test_float32_block_fp8_rows_multiply_the_weight_widened_unrounded(rows):
    """float32 rows keep their precision: the weight dequantized in one pass, no e4m3 rows."""
    pytest.importorskip("triton")
    from shard_server.kernels.dispatch import fused_kernels

    weight = _block_fp8_weight(72, 300, 40, 70)
    x = torch.randn(rows, 300, generator=torch.Generator().manual_seed(rows)).to(KERNEL_DEVICE)
    with fused_kernels(True, on_cpu=True):
        got = weight.linear(x, None)
    assert got.dtype == torch.float32 and rel(got.cpu(), x.cpu() @ weight.dequantize().cpu().t()) < 1e-5
