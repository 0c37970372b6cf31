"""The seed benchmark's harness on the CPU: the sharded random-model writer, the open-loop
arrival schedule, the rooflines, and one end-to-end run through the real launcher."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import gpu_model, seed_roofline  # noqa: E402
from bench.open_loop import arrival_times  # noqa: E402
from bench.seed_scenarios import Sizes, mix_workload  # noqa: E402
from shard_server.distributed import ParallelContext  # noqa: E402
from shard_server.models.config import ModelConfig  # noqa: E402
from shard_server.models.registry import build_model  # noqa: E402
from shard_server.weights import WeightStore, read_config  # noqa: E402

TEXT_VOCAB = 49152


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    from launcher.demo_model import ensure_demo_model

    return ensure_demo_model()


def write_tiny(directory: Path, tokenizer_dir: Path, **kwargs) -> int:
    return gpu_model.write_random_llama(directory, tokenizer_dir, TEXT_VOCAB, shape=gpu_model.TINY, device="cpu",
                                        dtype=torch.float32, **kwargs)  # fmt: skip


def load_state(directory: Path) -> dict[str, torch.Tensor]:
    config = ModelConfig.from_dict(read_config(directory))
    with WeightStore(directory) as store:
        model = build_model(config, store, ParallelContext(), "reference", torch.float32, torch.device("cpu"))
    return model.state_dict()


# -- the sharded writer -----------------------------------------------------------------------
def test_sharded_writer_index_maps_every_tensor_to_a_file_holding_it(tmp_path, tokenizer_dir):
    params = write_tiny(tmp_path, tokenizer_dir, max_shard_bytes=3_000_000)
    index = json.loads((tmp_path / gpu_model.INDEX_NAME).read_text())
    specs = {spec.name: spec for spec in gpu_model.tensor_specs(gpu_model.TINY)}
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) > 2
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    assert set(index["weight_map"]) == set(specs)
    assert set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == 4 * params
    for name, file_name in index["weight_map"].items():
        with safe_open(str(tmp_path / file_name), "pt") as f:
            assert tuple(f.get_slice(name).get_shape()) == specs[name].shape
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float32"


def test_shard_loader_loads_the_sharded_model_with_the_same_weights_as_one_file(tmp_path, tokenizer_dir):
    write_tiny(tmp_path / "one", tokenizer_dir)
    write_tiny(tmp_path / "sharded", tokenizer_dir, max_shard_bytes=3_000_000)
    assert [p.name for p in (tmp_path / "one").glob("*.safetensors")] == ["model.safetensors"]
    assert not (tmp_path / "one" / gpu_model.INDEX_NAME).exists()
    one, sharded = load_state(tmp_path / "one"), load_state(tmp_path / "sharded")
    assert one.keys() == sharded.keys()
    assert all(torch.equal(one[k], sharded[k]) for k in one)
    head = one["lm_head.weight"]  # special ids can never win the argmax
    assert not head[list(gpu_model.SPECIAL_IDS)].any() and head[17:].abs().sum() > 0


def test_spill_options_go_together():
    import argparse

    parser = argparse.ArgumentParser()
    gpu_model.add_spill_options(parser)
    assert gpu_model.spill_from(parser.parse_args([]), parser) is None
    both = parser.parse_args(["--spill-dir", "/dev/shm/x", "--disk-budget-gb", "1.5"])
    assert gpu_model.spill_from(both, parser) == gpu_model.Spill(Path("/dev/shm/x"), 1_500_000_000)
    for one in (["--spill-dir", "/dev/shm/x"], ["--disk-budget-gb", "2"]):
        with pytest.raises(SystemExit):
            gpu_model.spill_from(parser.parse_args(one), parser)


def test_spilled_shards_are_linked_back_and_load(tmp_path, tokenizer_dir):
    spill = gpu_model.Spill(tmp_path / "spill", budget_bytes=6_000_000)
    write_tiny(tmp_path / "model", tokenizer_dir, max_shard_bytes=3_000_000, spill=spill)
    links = [p for p in (tmp_path / "model").glob("*.safetensors") if p.is_symlink()]
    kept = [p for p in (tmp_path / "model").glob("*.safetensors") if not p.is_symlink()]
    assert links and kept
    assert sum(p.stat().st_size for p in kept) <= 6_000_000 + 4096 * len(kept)  # headers
    assert {p.resolve().parent for p in links} == {(tmp_path / "spill").resolve()}
    write_tiny(tmp_path / "plain", tokenizer_dir)
    spilled, plain = load_state(tmp_path / "model"), load_state(tmp_path / "plain")
    assert all(torch.equal(spilled[k], plain[k]) for k in plain)


def test_shard_plans_keep_8b_in_one_file_and_split_70b_under_the_cap():
    assert len(gpu_model.plan_shards(gpu_model.tensor_specs(gpu_model.LLAMA3_8B), 2, gpu_model.DEFAULT_MAX_SHARD_BYTES)) == 1
    specs = gpu_model.tensor_specs(gpu_model.LLAMA3_70B)
    shards = gpu_model.plan_shards(specs, 2, gpu_model.DEFAULT_MAX_SHARD_BYTES)
    sizes = [sum(s.numel for s in shard) * 2 for shard in shards]
    assert len(shards) == 8 and max(sizes) <= gpu_model.DEFAULT_MAX_SHARD_BYTES
    assert 140e9 < sum(sizes) < 142e9  # the "about 141 GB"
    assert [s.name for shard in shards for s in shard] == [s.name for s in specs]  # draw order kept


# -- arrivals and workloads -------------------------------------------------------------------
def test_uniform_arrivals_are_evenly_spaced_at_the_rate():
    assert arrival_times(5, 4.0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert arrival_times(0, 1.0) == []


def test_poisson_arrivals_are_seeded_with_the_requested_mean_rate():
    times = arrival_times(4000, 10.0, poisson=True, seed=3)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(0.1, rel=0.1)  # exponential: sd = mean
    assert times == arrival_times(4000, 10.0, poisson=True, seed=3)
    assert times != arrival_times(4000, 10.0, poisson=True, seed=4)


@pytest.mark.parametrize("count, rate", [(-1, 1.0), (3, 0.0), (3, -2.0)])
def test_bad_schedules_are_refused(count, rate):
    with pytest.raises(ValueError):
        arrival_times(count, rate)


def test_scaled_mix_keeps_seven_to_three():
    for scale in (1.0, 0.3, 0.01):
        work = mix_workload(Sizes.scaled(scale))
        sizes = Sizes.scaled(scale)
        assert work.count(sizes.short) == round(0.7 * len(work)) and work.count(sizes.long) == len(work) - work.count(sizes.short)
    assert Sizes.scaled(1.0) == Sizes()
    with pytest.raises(ValueError):
        Sizes.scaled(0)


# -- rooflines --------------------------------------------------------------------------------
# The H200's top measured ceilings (bench/results/gpu_vs_transformers_h200.md: 4.18-4.23 TB/s copy
# in its runs, bf16 matmuls 746-789 TFLOP/s over the machines).
H200 = seed_roofline.Ceilings(copy_bytes_per_s=4.28e12, matmul_flops_per_s=788e12)


def test_decode_roofline_is_the_weight_read_split_over_tp():
    cost = seed_roofline.ModelCost.of(gpu_model.LLAMA3_70B, 2)
    assert 139e9 < cost.weight_bytes_per_step < 140e9  # 141 GB less the 2.1 GB embedding table
    one = seed_roofline.single_decode_tok_s(cost, H200, 1, 128, 256)
    assert one == pytest.approx(4.28e12 / cost.weight_bytes_per_step, rel=0.01)  # KV of ~300 tokens is small
    assert seed_roofline.single_decode_tok_s(cost, H200, 4, 128, 256) == pytest.approx(4 * one, rel=1e-9)


def test_prefill_roofline_is_compute_bound_and_batching_beats_single_decode():
    cost = seed_roofline.ModelCost.of(gpu_model.LLAMA3_8B, 2)
    ttft = seed_roofline.ttft_s(cost, H200, 1, 2048)
    assert 0.035 < ttft < 0.042  # 2 x params x 2048 / 788e12 = 41.8 ms counts the embedding and every lm_head row
    single = seed_roofline.single_decode_tok_s(cost, H200, 1, 128, 256)
    batch = seed_roofline.workload_output_tok_s(cost, H200, 1, [(128, 256)] * 128)
    assert 50 * single < batch < 128 * single


# -- end to end through the launcher ----------------------------------------------------------
def test_harness_end_to_end_on_the_cpu(tmp_path, tokenizer_dir):
    from bench import seed_benchmark

    out = tmp_path / "out"
    report = seed_benchmark.main(["--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--scale", "0.02",
                                  "--ttft-rate", "8", "--model-dir", str(tmp_path / "model"),
                                  "--tokenizer-dir", str(tokenizer_dir), "--out", str(out)])  # fmt: skip
    saved = json.loads((out / "seed_benchmark.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(report["summary"]))
    scen, sizes = saved["scenarios"], Sizes.scaled(0.02)
    for name in ("single_decode", "concurrent_streams", "mixed_load", "ttft_at_rate"):
        assert "error" not in scen[name] and scen[name]["error_count"] == 0, scen[name]
    assert scen["single_decode"]["tokens"] == [sizes.single_new] * sizes.single_repeats
    for name in ("concurrent_streams", "mixed_load"):
        assert scen[name]["output_tokens"] == scen[name]["expected_tokens"] > 0
        assert scen[name]["output_tok_s"] == pytest.approx(scen[name]["output_tokens"] / scen[name]["wall_s"])
    assert scen["mixed_load"]["short"]["requests"] == 7 and scen["mixed_load"]["long"]["requests"] == 3
    ttft = scen["ttft_at_rate"]
    assert ttft["completed"] == sizes.ttft_requests and 0 < ttft["ttft_s"]["p50"] <= ttft["ttft_s"]["p99"]
    for key, row in saved["summary"].items():
        assert row["measured"] > 0 and row["roofline"] > 0 and row["share_of_roofline"] > 0, key
    assert saved["model"]["parameters"] == sum(s.numel for s in gpu_model.tensor_specs(gpu_model.TINY))
    text = (out / "seed_benchmark.md").read_text()
    for published in ("52", "64", "78", "4,500", "5,800", "6,200", "220", "1,100", "H100", "FP8"):
        assert f" {published} " in text or f" {published}," in text or f" {published}." in text, published
    assert "not a performance result" in text


BAD_FLAGS = [["--scale", "0"], ["--scale", "1.5"], ["--num-shard", "0"], ["--ttft-rate", "0"], ["--spill-dir", "/tmp/x"],
             ["--shape", "405b"], ["--scenarios", "single_decode,nope"]]  # fmt: skip


@pytest.mark.parametrize("flags", BAD_FLAGS)
def test_bad_flags_are_usage_errors(flags, capsys):
    from bench import seed_benchmark

    with pytest.raises(SystemExit) as exit_info:
        seed_benchmark.parse_args(["--out", "/tmp/unused", *flags])
    assert exit_info.value.code == 2 and "error:" in capsys.readouterr().err


def test_ceilings_measured_in_a_child_process_come_back():
    """The GPU path runs the ceilings and the writer in a fresh process; the CPU can check the plumbing."""
    from bench import seed_benchmark

    ceilings = seed_benchmark.in_child(seed_benchmark.measure_ceilings, "cpu", "float32", 1, isolate=True)
    assert ceilings["copy_bytes_per_s"] > 1e8 and ceilings["matmul_flops_per_s"] > 1e8
    assert ceilings["device_name"].startswith("CPU")


def test_the_moe_writer_gives_a_checkpoint_transformers_and_the_shard_agree_on(tmp_path, tokenizer_dir):
    """The Qwen3-MoE shape of the MoE benchmark, tiny: its names and config load in both, and
    the shard's prefill logits equal transformers' (so the 61 GB one is the model it says)."""
    transformers = pytest.importorskip("transformers")
    from shard_server.attention.base import StepLayout
    from tests.shard.helpers import load_runner

    params = gpu_model.write_random_llama(tmp_path, tokenizer_dir, TEXT_VOCAB, shape=gpu_model.TINY_MOE, device="cpu",
                                          dtype=torch.float32)  # fmt: skip
    assert params == sum(spec.numel for spec in gpu_model.tensor_specs(gpu_model.TINY_MOE))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    prompt = [5, 300, 4096, 77, 1200, 9, 31000]
    with torch.no_grad():
        want = reference(torch.tensor([prompt])).logits[0]
    runner = load_runner(tmp_path, block_size=4, num_blocks=8)
    metadata = runner.backend.build_metadata(StepLayout([7], [7], [[0, 1]], 4), torch.device("cpu"))
    with torch.inference_mode():
        ids = torch.tensor(prompt)
        got = runner.model.compute_logits(runner.model(ids, torch.arange(7), runner.kv_cache, metadata))
    assert got.shape == want.shape and want.abs().max() > 0
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


@pytest.mark.parametrize("checkpoint", ["gptq", "awq"])
def test_the_4bit_writer_gives_checkpoints_the_shard_loads_as_declared(tmp_path, tokenizer_dir, checkpoint):
    """Random GPTQ / AWQ checkpoints for issue 25's benchmarks: the shard reads them from their
    quantization_config, every weight is an integer from -8 to 7 times its group's scale, and
    the model runs."""
    from shard_server.attention.base import StepLayout
    from tests.shard.helpers import load_runner

    shape = dict(gpu_model.TINY, hidden_size=128, intermediate_size=256, head_dim=32)
    params = gpu_model.write_random_llama(tmp_path, tokenizer_dir, TEXT_VOCAB, shape=shape, device="cpu",
                                          dtype=torch.float16, checkpoint=checkpoint)  # fmt: skip
    assert params == sum(spec.numel for spec in gpu_model.tensor_specs(shape))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"] == gpu_model.QUANTIZATION_CONFIGS[checkpoint]
    runner = load_runner(tmp_path, dtype=torch.float16, block_size=4, num_blocks=8)
    assert runner.model.config.quantize == checkpoint
    layer = runner.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.mlp.down_proj):
        packed = linear.packed
        weight = packed.dequantize()  # [out, in]
        scales = packed.scales[packed.g_idx.long()].float().t()  # each weight's group scale
        steps = weight / scales
        assert torch.equal(steps, steps.round()) and steps.min() == -8 and steps.max() == 7
    metadata = runner.backend.build_metadata(StepLayout([5], [5], [[0, 1]], 4), torch.device("cpu"))
    with torch.inference_mode():
        logits = runner.model.compute_logits(runner.model(torch.arange(5) + 300, torch.arange(5), runner.kv_cache, metadata))
    assert torch.isfinite(logits).all() and logits.abs().max() > 0


@pytest.mark.parametrize("checkpoint", ["gptq", "awq"])
def test_the_4bit_writer_packs_an_moe_models_experts_and_the_shard_runs_them(tmp_path, tokenizer_dir, checkpoint):
    """The Qwen3-MoE layout (issue 25 on issue 24's models): experts stacked packed, routers dense."""
    from shard_server.attention.base import StepLayout
    from shard_server.layers.packed_experts import PackedExperts
    from tests.shard.helpers import load_runner

    shape = dict(gpu_model.TINY_MOE, hidden_size=128, moe_intermediate_size=128)
    gpu_model.write_random_llama(tmp_path, tokenizer_dir, TEXT_VOCAB, shape=shape, device="cpu", dtype=torch.float16,
                                 checkpoint=checkpoint)  # fmt: skip
    runner = load_runner(tmp_path, dtype=torch.float16, block_size=4, num_blocks=8)
    block = runner.model.layers[0].mlp
    assert isinstance(block.w13, PackedExperts) and block.router.dtype == torch.float16
    weight = block.w2.dequantize(torch.float32, 3)
    steps = weight / block.w2.scales[3][block.w2.g_idx[3].long()].float().t()
    assert torch.equal(steps, steps.round()) and steps.min() == -8 and steps.max() == 7
    metadata = runner.backend.build_metadata(StepLayout([5], [5], [[0, 1]], 4), torch.device("cpu"))
    with torch.inference_mode():
        logits = runner.model.compute_logits(runner.model(torch.arange(5) + 300, torch.arange(5), runner.kv_cache, metadata))
    assert torch.isfinite(logits).all() and logits.abs().max() > 0


def test_the_block_fp8_writer_gives_a_checkpoint_the_shard_loads_as_declared(tmp_path, tokenizer_dir):
    from shard_server.layers.quantized import BlockFp8Weight

    shape = dict(gpu_model.TINY, hidden_size=128, intermediate_size=256, head_dim=32)
    gpu_model.write_random_llama(tmp_path, tokenizer_dir, TEXT_VOCAB, shape=shape, device="cpu", dtype=torch.bfloat16,
                                 checkpoint="fp8-block")  # fmt: skip
    from tests.shard.helpers import load_model

    model = load_model(tmp_path, dtype=torch.float32)
    down = model.layers[0].mlp.down_proj.packed
    assert isinstance(down, BlockFp8Weight) and down.scale.shape == (1, 2)  # [128, 256] in 128 x 128 blocks
    weight = down.dequantize()
    assert 0.005 < weight.std() < 0.05 and torch.isfinite(weight).all()
