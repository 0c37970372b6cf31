"""fp8 linear weights (`--quantize fp8`): the quantizer, both product paths, the layers, the CLI.

Error bounds: e4m3 keeps 3 mantissa bits, so a normal value rounds by at most 2^-4 of itself
and a subnormal one (below 2^-6 of the row's scale unit) by at most 2^-10 units. A w8a8 product
over K terms then moves by ~2^-3/sqrt(12) * sqrt(2) = 5 % (rms) of a typical output: bounded
here at 8 % relative L2; the weight-only path (activations exact) at 5 %.

Triton's interpreter rounds float32 to fp8 wrongly when rounding carries into the next power of
two, so on the CPU the quantize kernel gets rows fp8 holds exactly; the GPU cases round arbitrary
values. The interpreter's bf16 dots are unreliable, so CPU skinny cases are fp16.
"""

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from shard_server.distributed import ParallelContext  # noqa: E402
from shard_server.kernels.dispatch import fused_kernels  # noqa: E402
from shard_server.kernels.fp8_matmul import (  # noqa: E402
    FP8,
    FP8_MAX,
    ROWS_GEMM_DEEP,
    ROWS_GEMM_MAX_ROWS,
    ROWS_GEMM_NARROW,
    ROWS_GEMM_SQUARE,
    ROWS_GEMM_WIDE,
    ROWS_GEMM_WIDEST,
    Fp8Rows,
    fp8_linear,
    fp8_rows_product,
    quantize_rows,
    quantize_rows_reference,
    quantizes_rows,
    rows_gemm_config,
)
from shard_server.kernels.skinny_matmul import MAX_ROWS  # noqa: E402
from shard_server.models.config import ModelConfig, UnsupportedModelError  # noqa: E402
from shard_server.models.registry import build_model  # noqa: E402
from shard_server.weights import WeightsError, WeightStore, read_config  # noqa: E402

from .fp8_checkpoints import COMPRESSED_TENSORS, write_fp8_checkpoint  # noqa: E402
from .test_triton_runner import make_runner  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"  # the kernel cases: compiled on a GPU, interpreted on CPU
needs_cuda = pytest.mark.skipif(not CUDA, reason="cuBLASLt's fp8 product and arbitrary-value rounding need a GPU")


def _randn(*shape, seed, device="cpu"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def rel_l2(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def dequantized(weight, scale):
    return weight.float() * scale


def test_each_row_rounds_within_e4m3_precision_and_uses_the_whole_range():
    w = _randn(40, 96, seed=0) * torch.logspace(-3, 2, 40).unsqueeze(1)  # rows five decades apart
    q, scale = quantize_rows_reference(w)
    assert q.dtype == FP8 and scale.shape == (40, 1) and scale.dtype == torch.float32
    error = (dequantized(q, scale) - w).abs()
    bound = torch.maximum(w.abs() * 2**-4, scale * 2**-10)
    assert (error <= bound * (1 + 1e-6)).all()
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((40,), FP8_MAX))


def test_a_zero_row_stays_zero_without_nan():
    w = torch.zeros(3, 32)
    w[1] = 1.0
    q, scale = quantize_rows_reference(w)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert q[0].float().abs().sum() == 0 and q[2].float().abs().sum() == 0
    assert torch.equal(dequantized(q, scale)[1], w[1])


def _exact_rows(rows: int, k: int, seed: int) -> torch.Tensor:
    """Rows of fp8 values times a power of two, each holding +-448 x its power: quantizing them is exact."""
    values = quantize_rows_reference(_randn(rows, k, seed=seed))[0].float()
    values[:, 0] = FP8_MAX * torch.sign(torch.randn(rows, generator=torch.Generator().manual_seed(seed)))
    return values * 2.0 ** torch.arange(-(rows // 2), rows - rows // 2).unsqueeze(1)


@pytest.mark.parametrize("k", [64, 1500])  # 1500: two blocks and a masked tail
def test_the_quantize_kernel_equals_the_reference(k):
    x = _exact_rows(6, k, seed=1).half().to(DEVICE)
    with fused_kernels(True, on_cpu=True):
        q, scale = quantize_rows(x)
    want_q, want_scale = quantize_rows_reference(x)
    assert torch.equal(scale, want_scale)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


def test_the_cpu_product_is_w8a8_arithmetic():
    x, w = _randn(20, 64, seed=2), _randn(48, 64, seed=3)
    wq, ws = quantize_rows_reference(w)
    xq, xs = quantize_rows_reference(x)
    got = fp8_linear(x, wq, ws)
    torch.testing.assert_close(got, dequantized(xq, xs) @ dequantized(wq, ws).T, atol=1e-4, rtol=1e-4)
    assert rel_l2(got, x @ w.T) < 0.08


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("k", [256, 300])
def test_few_rows_stream_the_fp8_weight_and_keep_activations_exact(rows, k):
    x = _randn(rows, k, seed=4, device=DEVICE).half()
    wq, ws = quantize_rows_reference(_randn(80, k, seed=5, device=DEVICE))  # 80 outputs: a masked feature block
    with fused_kernels(True, on_cpu=True):
        got = fp8_linear(x, wq, ws)
    want = x.float() @ dequantized(wq, ws).T  # weight-only: no activation rounding
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-3)


TABLE_CONFIGS = [ROWS_GEMM_NARROW, ROWS_GEMM_SQUARE, ROWS_GEMM_WIDE, ROWS_GEMM_WIDEST, ROWS_GEMM_DEEP]
# Split over K (3 ranges of 256 over K = 300: the last one empty) and 2 (a full and a partial one).
SPLIT_CONFIGS = [replace(ROWS_GEMM_SQUARE, split_k=3), replace(ROWS_GEMM_NARROW, split_k=2)]


@pytest.mark.parametrize("rows", [17, 70])  # 70: a second, mostly masked row tile
@pytest.mark.parametrize("config", TABLE_CONFIGS + SPLIT_CONFIGS, ids=lambda c: f"n{c.block_n}k{c.block_k}s{c.split_k}")
def test_decode_batches_multiply_fp8_by_fp8_in_row_tiles(rows, config):
    k = 300  # a masked reduction tail; 200 outputs: a masked feature block for every config
    x = _exact_rows(5, k, seed=9).repeat(-(-rows // 5), 1)[:rows].half().to(DEVICE)  # exact in fp16 too
    wq, ws = quantize_rows_reference(_randn(200, k, seed=10, device=DEVICE))
    xq, xs = quantize_rows_reference(x)
    with fused_kernels(True, on_cpu=True):
        got = fp8_rows_product(x, wq, ws, config)
    want = (xq.float() @ wq.float().T) * xs * ws.view(1, -1)  # w8a8 exactly: the rows quantize exactly
    # fp16 output rounding; on the GPU also the fp8 tensor cores' narrower accumulation.
    torch.testing.assert_close(got.float(), want, atol=1e-3 * float(want.abs().max()), rtol=2e-3)


@pytest.mark.parametrize("rows", [70, 130])  # one tall tile, and a second mostly masked one
def test_row_tiles_of_128_over_two_warpgroups(rows):
    x = _exact_rows(5, 300, seed=20).repeat(-(-rows // 5), 1)[:rows].half().to(DEVICE)
    wq, ws = quantize_rows_reference(_randn(200, 300, seed=21, device=DEVICE))
    xq, xs = quantize_rows_reference(x)
    with fused_kernels(True, on_cpu=True):
        got = fp8_rows_product(x, wq, ws, replace(ROWS_GEMM_SQUARE, num_warps=8), tile=128)
    want = (xq.float() @ wq.float().T) * xs * ws.view(1, -1)
    torch.testing.assert_close(got.float(), want, atol=1e-3 * float(want.abs().max()), rtol=2e-3)


def test_fp8_linear_routes_decode_batches_by_the_measured_table():
    qkv, o, gate_up, down = (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)
    assert rows_gemm_config(17, *down) == ROWS_GEMM_NARROW and rows_gemm_config(64, *qkv) == ROWS_GEMM_NARROW
    assert rows_gemm_config(80, *o) == ROWS_GEMM_SQUARE and rows_gemm_config(192, *down) == ROWS_GEMM_SQUARE
    assert rows_gemm_config(65, *down) == ROWS_GEMM_DEEP == rows_gemm_config(128, *down) and ROWS_GEMM_DEEP.split_k == 2
    assert rows_gemm_config(128, *qkv) == ROWS_GEMM_SQUARE and rows_gemm_config(160, *qkv) == ROWS_GEMM_WIDE
    assert rows_gemm_config(64, *gate_up) == ROWS_GEMM_WIDEST and rows_gemm_config(192, *gate_up) == ROWS_GEMM_WIDEST
    assert rows_gemm_config(80, *gate_up) is None and rows_gemm_config(128, *gate_up) is None  # cuBLASLt's
    assert all(rows_gemm_config(ROWS_GEMM_MAX_ROWS + 1, *shape) is None for shape in (qkv, o, gate_up, down))


@pytest.mark.parametrize("rows", [17, 100])
def test_fp8_linear_of_a_decode_batch_is_w8a8(rows):
    x = _exact_rows(5, 256, seed=11).repeat(-(-rows // 5), 1)[:rows].half().to(DEVICE)
    wq, ws = quantize_rows_reference(_randn(96, 256, seed=12, device=DEVICE))
    xq, xs = quantize_rows_reference(x)
    with fused_kernels(True, on_cpu=True):
        got = fp8_linear(x, wq, ws)
    want = (xq.float() @ wq.float().T) * xs * ws.view(1, -1)
    torch.testing.assert_close(got.float(), want, atol=1e-3 * float(want.abs().max()), rtol=2e-3)


def _fp8_rows_equal(got: Fp8Rows, want: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert got.values.dtype == FP8 and got.scale.shape == (got.values.shape[0], 1)
    assert torch.equal(got.scale, want[1])
    assert torch.equal(got.values.view(torch.uint8), want[0].view(torch.uint8))


@pytest.mark.parametrize("with_residual", [False, True])
def test_the_norm_hands_an_fp8_product_its_rows_quantized_as_the_product_would(with_residual):
    from shard_server.kernels.norm import fused_rmsnorm

    x = _randn(20, 96, seed=13, device=DEVICE).half() * 4
    residual = _randn(20, 96, seed=14, device=DEVICE).half() if with_residual else None
    weight = _randn(96, seed=15, device=DEVICE).half()
    x[3] = 0  # an all-zero row (without the residual) keeps a finite scale
    with fused_kernels(True, on_cpu=True):
        plain, summed = fused_rmsnorm(x, weight, 1e-5, residual)
        handed, handed_summed = fused_rmsnorm(x, weight, 1e-5, residual, quantize=True)
        want = quantize_rows(plain)
    assert isinstance(handed, Fp8Rows) and handed.dtype == torch.float16
    _fp8_rows_equal(handed, want)
    assert torch.equal(handed_summed, summed)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("whole_row", [True, False])
def test_act_mul_hands_the_down_projection_its_rows_quantized(whole_row, activation, monkeypatch):
    from shard_server.kernels import activation as kernels

    if not whole_row:  # the two-pass loop for rows wider than the registers hold
        monkeypatch.setattr(kernels, "ROW_IN_REGISTERS", 1024)
    gate_up = _randn(18, 2 * 2500, seed=16, device=DEVICE).half() * 3  # 2500: three blocks, a masked tail
    with fused_kernels(True, on_cpu=True):
        handed = kernels.fused_act_mul(gate_up, activation, quantize=True)
        want = quantize_rows(kernels.fused_act_mul(gate_up, activation))
    assert isinstance(handed, Fp8Rows) and handed.shape == (18, 2500)
    _fp8_rows_equal(handed, want)


def test_an_fp8_product_of_handed_rows_equals_quantizing_them_itself():
    x = _exact_rows(5, 256, seed=17).repeat(4, 1).half().to(DEVICE)
    wq, ws = quantize_rows_reference(_randn(96, 256, seed=18, device=DEVICE))
    bias = _randn(96, seed=19, device=DEVICE).half()
    with fused_kernels(True, on_cpu=True):
        assert quantizes_rows(x) and not quantizes_rows(x[:MAX_ROWS])
        got = fp8_linear(Fp8Rows(*quantize_rows(x), torch.float16), wq, ws, bias)
        want = fp8_linear(x, wq, ws, bias)
    assert got.dtype == torch.float16 and torch.equal(got, want)
    # Outside the switch kernels are fused on GPUs only: on CPU the product quantizes with torch.
    assert quantizes_rows(x) is x.is_cuda


def test_bias_and_leading_dims_are_kept():
    x, w, bias = _randn(2, 5, 32, seed=6), _randn(16, 32, seed=7), _randn(16, seed=8)
    wq, ws = quantize_rows_reference(w)
    got = fp8_linear(x, wq, ws, bias)
    assert got.shape == (2, 5, 16)
    torch.testing.assert_close(got, fp8_linear(x.view(10, 32), wq, ws).view(2, 5, 16) + bias)


def _models(directory, device, dtype):
    config = ModelConfig.from_dict(read_config(directory))
    models = {}
    for quantize in (None, "fp8"):
        with WeightStore(directory) as store:
            cfg = replace(config, quantize=quantize)
            models[quantize] = build_model(cfg, store, ParallelContext(), "reference", dtype, device)
    return models


def test_a_model_with_fp8_weights_keeps_embeddings_and_biases_in_the_model_dtype(tiny_model_dirs):
    models = _models(tiny_model_dirs["qwen2"], torch.device("cpu"), torch.float32)  # qwen2: qkv bias, tied head
    plain, fp8 = models[None], models["fp8"]
    layer = fp8.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert linear.weight.dtype == FP8 and linear.weight_scale.shape == (linear.weight.shape[0], 1)
    assert fp8.embed_tokens.weight.dtype == torch.float32 and layer.self_attn.qkv_proj.bias.dtype == torch.float32
    wq, ws = layer.mlp.down_proj.weight, layer.mlp.down_proj.weight_scale
    want = plain.layers[0].mlp.down_proj.weight
    assert rel_l2(dequantized(wq, ws), want) < 0.05


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_fp8_logits_stay_near_the_unquantized_models(tiny_model_dirs, family):
    from shard_server.attention.base import StepLayout
    from shard_server.kv_cache import KVCache, KVSpec

    device = torch.device("cpu")
    logits = {}
    for quantize, model in _models(tiny_model_dirs[family], device, torch.float32).items():
        cfg = model.config
        cache = KVCache(KVSpec(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4, torch.float32), 8, device)
        ids = torch.tensor([(7 * i + 3) % 150 for i in range(13)])
        metadata = model.layers[0].self_attn.backend.build_metadata(StepLayout([13], [13], [[3, 0, 7, 5]], 4), device)
        with torch.inference_mode():
            logits[quantize] = model.compute_logits(model(ids, torch.arange(13), cache, metadata))
    assert logits[None].std(dim=-1).min() > 1.0, "logits too flat to compare"
    # Eight w8a8 products of ~5 % each, compounded through two layers: measured 12-15 %.
    assert rel_l2(logits["fp8"], logits[None]) < 0.2
    assert torch.equal(logits["fp8"].argmax(-1)[-1], logits[None].argmax(-1)[-1])


def _prefill_logits(directory, quantize=None):
    from shard_server.attention.base import StepLayout
    from shard_server.kv_cache import KVCache, KVSpec

    device = torch.device("cpu")
    cfg = ModelConfig.from_dict(read_config(directory)).with_quantize(quantize)
    with WeightStore(directory) as store:
        model = build_model(cfg, store, ParallelContext(), "reference", torch.float32, device)
    cache = KVCache(KVSpec(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4, torch.float32), 8, device)
    metadata = model.layers[0].self_attn.backend.build_metadata(StepLayout([13], [13], [[3, 0, 7, 5]], 4), device)
    ids = torch.tensor([(7 * i + 3) % 150 for i in range(13)])
    with torch.inference_mode():
        return model, model.compute_logits(model(ids, torch.arange(13), cache, metadata))


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: fused qkv with a bias
def test_an_fp8_checkpoint_loads_as_its_source_quantized_at_load(tiny_model_dirs, tmp_path, family):
    """Per-channel scales are exactly what --quantize fp8 computes: the same weights, the same logits."""
    fp8_dir = write_fp8_checkpoint(tiny_model_dirs[family], tmp_path / "fp8")
    model, logits = _prefill_logits(fp8_dir)  # no flag: the checkpoint declares its fp8
    assert model.config.quantize == "fp8" and model.layers[0].mlp.down_proj.weight.dtype == FP8
    _, want = _prefill_logits(tiny_model_dirs[family], quantize="fp8")
    assert torch.equal(logits, want)


def test_per_tensor_scales_fill_each_fused_parts_rows(tiny_model_dirs, tmp_path):
    source = tiny_model_dirs["llama"]
    fp8_dir = write_fp8_checkpoint(source, tmp_path / "fp8", per_tensor=True)
    model, logits = _prefill_logits(fp8_dir)
    with WeightStore(fp8_dir) as store:
        scales = [float(store.get(f"model.layers.0.self_attn.{p}.weight_scale")) for p in ("q_proj", "k_proj", "v_proj")]
        rows = [store.get(f"model.layers.0.self_attn.{p}.weight").shape[0] for p in ("q_proj", "k_proj", "v_proj")]
    got = model.layers[0].self_attn.qkv_proj.weight_scale.flatten().tolist()
    assert got == [s for s, n in zip(scales, rows) for _ in range(n)] and len(set(scales)) == 3
    _, plain = _prefill_logits(source)
    assert rel_l2(logits, plain) < 0.3  # one scale per tensor rounds coarser than one per row


def test_an_fp8_tensor_without_its_declaration_or_with_bad_scales_is_refused(tiny_model_dirs, tmp_path):
    import json

    fp8_dir = write_fp8_checkpoint(tiny_model_dirs["llama"], tmp_path / "fp8")
    config = read_config(fp8_dir)
    del config["quantization_config"]
    (fp8_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="fp8 but config.json declares no fp8 quantization"):
        _prefill_logits(fp8_dir)
    _prefill_logits(fp8_dir, quantize="fp8")  # declared by the flag instead: loads
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(fp8_dir / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight_scale"
    for hostile, message in ((float("nan"), "negative, inf or nan"), (-1.0, "negative, inf or nan"), (None, f"no {name}")):
        edited = dict(tensors)
        if hostile is None:
            del edited[name]
        else:
            edited[name] = edited[name].clone()
            edited[name][3] = hostile
        save_file(edited, str(fp8_dir / "model.safetensors"))
        with pytest.raises(WeightsError, match=message):
            _prefill_logits(fp8_dir, quantize="fp8")
    edited = dict(tensors, **{name: tensors[name][:5]})  # fewer scales than rows
    save_file(edited, str(fp8_dir / "model.safetensors"))
    with pytest.raises(WeightsError, match="has 5 scales"):
        _prefill_logits(fp8_dir, quantize="fp8")


def test_the_store_counts_fp8_tensors_as_one_byte(tiny_model_dirs, tmp_path):
    source, fp8_dir = tiny_model_dirs["llama"], write_fp8_checkpoint(tiny_model_dirs["llama"], tmp_path / "fp8")
    with WeightStore(source) as plain, WeightStore(fp8_dir) as fp8:
        name = "model.layers.0.mlp.down_proj.weight"
        shrink = plain.get(name).numel() * (plain.get(name).element_size() - 1)
        assert 0 < fp8.total_bytes() < plain.total_bytes() - shrink


@pytest.mark.parametrize("quantization,message", [
    ({"quant_method": "bitsandbytes"}, "\\('bitsandbytes'\\): fp8, gptq, awq and compressed-tensors checkpoints load"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size \\[128\\] is not two positive integers"),
    ({**COMPRESSED_TENSORS, "format": "pack-quantized"}, "pack-quantized group 'group_0' has 'float' weights"),
    ({**COMPRESSED_TENSORS, "config_groups": {"g": {"weights": {"type": "int", "num_bits": 4, "strategy": "group"}}}},
     "group 'g' has weights \\('int', 4, 'group'\\)"),
    ({**COMPRESSED_TENSORS, "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8, "strategy": "block"}}}},
     "block_structure None is not two positive integers"),
])  # fmt: skip
def test_other_pre_quantized_checkpoints_are_refused_naming_the_method(tiny_model_dirs, quantization, message):
    raw = read_config(tiny_model_dirs["llama"])
    with pytest.raises(UnsupportedModelError, match=f"pre-quantized.*{message}.*--quantize fp8"):
        ModelConfig.from_dict({**raw, "quantization_config": quantization})


@pytest.mark.parametrize("quantization", [COMPRESSED_TENSORS, {"quant_method": "fbgemm_fp8"},
                                          {"quant_method": "fp8", "activation_scheme": "dynamic"}])  # fmt: skip
def test_fp8_checkpoints_are_recognised(tiny_model_dirs, quantization):
    cfg = ModelConfig.from_dict({**read_config(tiny_model_dirs["llama"]), "quantization_config": quantization})
    assert cfg.quantize == "fp8" and cfg.with_quantize(None).quantize == "fp8" and cfg.with_quantize("fp8").quantize == "fp8"
    assert ModelConfig.from_dict(read_config(tiny_model_dirs["llama"])).with_quantize(None).quantize is None


def test_the_shard_cli_takes_quantize_fp8_only():
    from shard_server.cli import parse_config

    base = ["serve", "--model-path", "/m", "--uds-path", "/tmp/s"]
    assert parse_config(base).quantize is None
    assert parse_config([*base, "--quantize", "fp8"]).quantize == "fp8"
    for bad in ("int8", "bitsandbytes", ""):
        with pytest.raises(SystemExit):
            parse_config([*base, "--quantize", bad])


def test_gpus_without_fp8_tensor_cores_are_refused_by_name(monkeypatch):
    from shard_server.kernels.fp8_matmul import require_fp8_support

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(ValueError, match="8.9\\+.*A100 is 8.0"):
        require_fp8_support(torch.device("cuda", 0))
    require_fp8_support(torch.device("cpu"))  # emulated in float32
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    require_fp8_support(torch.device("cuda", 0))


@needs_cuda
@pytest.mark.parametrize("rows", [1, 8, 16, 17, 80, 128, 129, 300])
@pytest.mark.parametrize("features,depth", [(6144, 4096), (4096, 14336), (28672, 4096)])
def test_gpu_products_at_the_8b_shapes(rows, features, depth):
    x = _randn(rows, depth, seed=9, device="cuda").bfloat16()
    wq, ws = quantize_rows_reference(_randn(features, depth, seed=10, device="cuda") * 0.02)
    got = fp8_linear(x, wq, ws)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, features)
    want = x.float() @ dequantized(wq, ws).T
    assert rel_l2(got, want) < (0.01 if rows <= MAX_ROWS else 0.08)  # weight-only vs w8a8


@needs_cuda
def test_gpu_quantize_kernel_rounds_arbitrary_values_like_torch():
    x = (_randn(33, 4096, seed=11, device="cuda") * 3).bfloat16()
    q, scale = quantize_rows(x)
    want_q, want_scale = quantize_rows_reference(x)
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0)
    assert (q.float() - want_q.float()).abs().max() <= 0  # same rounding of the same quotients


@needs_cuda
def test_gpu_fp8_model_gives_the_same_tokens_eager_and_from_graphs(tiny_model_dirs):
    from shard_server.warmup import PoolSizing, warmup

    from .test_triton_runner import _decode_batch

    prompts = [[(5 * i + 11 * b) % 150 for i in range(9 + 4 * b)] for b in range(3)]
    results = {}
    for graphs in ((), (1, 2, 4)):
        runner = make_runner(tiny_model_dirs["llama"], "triton", torch.device("cuda"), dtype=torch.bfloat16,
                             quantize="fp8")  # fmt: skip
        warmup(runner, 64, 4, PoolSizing(1024, 0.05, graphs))
        results[graphs] = _decode_batch(runner, prompts, new_tokens=10)
    assert results[(1, 2, 4)] == results[()]


@needs_cuda
def test_gpu_fp8_model_gives_the_same_tokens_with_rows_handed_over_or_not(tiny_model_dirs, monkeypatch):
    import shard_server.layers.linear as linear
    from shard_server.warmup import PoolSizing, warmup

    from .test_triton_runner import _decode_batch

    prompts = [[(7 * i + 3 * b) % 150 for i in range(5 + b % 7)] for b in range(20)]  # decodes of 20 rows
    results = []
    for handed in (True, False):
        if not handed:
            monkeypatch.setattr(linear, "quantizes_rows", lambda x: False)
        runner = make_runner(tiny_model_dirs["llama"], "triton", torch.device("cuda"), dtype=torch.bfloat16,
                             quantize="fp8")  # fmt: skip
        warmup(runner, 256, 32, PoolSizing(1024, 0.05, (32,)))
        results.append(_decode_batch(runner, prompts, new_tokens=6))
    assert results[0] == results[1]
