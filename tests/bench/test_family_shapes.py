"""The random-model writer's Gemma 2 and Phi-3 shapes (issue 24's model families) and Llama
3.2 1B (issue 26's draft model, tied embeddings): the Hub's tensor names and shapes at full
size, tiny checkpoints the shard and transformers agree on, the rows that keep the random model
from ending a request, and the decode roofline's byte count.

Tolerance of the shard against transformers: fp32 on CPU, the same maths in another op order
(fused projections, paged attention, (1 + w) folded into Gemma's norm weights at load): logits
within 1e-4 of the largest, as tests/shard/test_dense_families.py and the MoE writer test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import gpu_model  # noqa: E402

TEXT_VOCAB = 49152
TINY = {"tiny-gemma2": gpu_model.TINY_GEMMA2, "tiny-phi3": gpu_model.TINY_PHI3, "tiny-1b": gpu_model.TINY_1B,
        "tiny-mixtral": gpu_model.TINY_MIXTRAL}  # fmt: skip
FULL = {"gemma2-9b": gpu_model.GEMMA2_9B, "phi3-medium": gpu_model.PHI3_MEDIUM, "1b": gpu_model.LLAMA32_1B}
PROMPT = [300, 4096, 77, 1200, 9000, 31000, 512, 20000, 4242, 1717, 30000, 256, 999, 12345, 27000, 640, 3333, 31999]


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    from launcher.demo_model import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    dirs = {}
    for name, shape in TINY.items():
        dirs[name] = tmp_path_factory.mktemp(name)
        gpu_model.write_random_llama(dirs[name], tokenizer_dir, TEXT_VOCAB, shape=shape, device="cpu",
                                     dtype=torch.float32)  # fmt: skip
    return dirs


def shard_logits(directory: Path, prompt: list[int]) -> torch.Tensor:
    from shard_server.attention.base import StepLayout
    from tests.shard.helpers import load_runner

    n = len(prompt)
    runner = load_runner(directory, block_size=4, num_blocks=16)
    metadata = runner.backend.build_metadata(StepLayout([n], [n], [list(range(-(-n // 4)))], 4), torch.device("cpu"))
    with torch.inference_mode():
        hidden = runner.model(torch.tensor(prompt), torch.arange(n), runner.kv_cache, metadata)
        return runner.model.compute_logits(hidden)


# -- full size: names, shapes, counts ---------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FULL))
def test_full_shapes_hold_the_tensors_transformers_builds_for_the_hub_config(name, tmp_path):
    """transformers' module tree for the config, built on the meta device (no memory): the same
    names and shapes as the writer's specs (a tied lm_head is the embedding table, not stored)."""
    transformers = pytest.importorskip("transformers")
    shape = FULL[name]
    (tmp_path / "config.json").write_text(json.dumps(shape))
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if shape["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight
        del want["lm_head.weight"]
    assert {spec.name: spec.shape for spec in gpu_model.tensor_specs(shape)} == want


def expected_counts(cfg: dict) -> tuple[int, int]:
    """(parameters, parameters a decoded token reads), from the config alone."""
    h, i, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    norms = 4 if cfg["model_type"] == "gemma2" else 2
    layer = h * (q + 2 * kv) + q * h + 3 * h * i + norms * h
    tables = 1 if cfg["tie_word_embeddings"] else 2
    total = layers * layer + tables * vocab * h + h
    read = layers * layer + vocab * h + 2 * h  # the LM head once, the final norm, one embedding row
    return total, read


# The Hub's figures: google/gemma-2-9b 9.24B, Phi-3-medium 13.96B (its two vocabulary tables 0.33B),
# meta-llama/Llama-3.2-1B 1.24B (1,235,814,400: one tied table of 0.26B).
@pytest.mark.parametrize("name, billions, active_billions", [("gemma2-9b", 9.2417, 9.2417),
                                                            ("phi3-medium", 13.9602, 13.7961),
                                                            ("1b", 1.2358, 1.2358)])
def test_parameter_and_decode_byte_counts_of_the_full_shapes(name, billions, active_billions):
    shape = FULL[name]
    total, read = expected_counts(shape)
    assert sum(spec.numel for spec in gpu_model.tensor_specs(shape)) == total
    assert gpu_model.active_params_per_token(shape) == read
    assert gpu_model.decode_bytes_per_token(shape) == 2 * read
    assert round(total / 1e5) == round(billions * 1e4) and round(read / 1e5) == round(active_billions * 1e4)


def test_mixtral_counts_are_the_hubs():
    """mistralai/Mixtral-8x7B-v0.1: 46,702,792,704 parameters; a token reads the attention, the
    router and 2 of the 8 experts of every layer, the LM head, the final norm and one embedding row."""
    shape = gpu_model.MIXTRAL_8X7B
    assert sum(spec.numel for spec in gpu_model.tensor_specs(shape)) == 46_702_792_704
    h, layers = 4096, 32
    attention, expert = h * (4096 + 2 * 1024) + 4096 * h, 3 * h * 14336
    read = layers * (attention + 2 * expert + 8 * h + 2 * h) + 32000 * h + 2 * h
    assert gpu_model.active_params_per_token(shape) == read == 12_748_857_344
    assert gpu_model.experts(shape) == (8, 2, 14336) and gpu_model.experts(gpu_model.QWEN3_30B_A3B) == (128, 8, 768)
    assert gpu_model.experts(gpu_model.LLAMA3_8B) is None
    names = {spec.name for spec in gpu_model.tensor_specs(shape)}
    assert {"model.layers.31.block_sparse_moe.gate.weight", "model.layers.0.block_sparse_moe.experts.7.w3.weight"} <= names
    assert not any(".mlp." in name for name in names)


def test_full_shapes_shard_under_the_cap():
    """Gemma 2 9B (18.5 GB) and Llama 3.2 1B (2.47 GB) stay one file; Phi-3-medium (27.9 GB) takes
    two, Mixtral (93.4 GB) five."""
    for shape, files in ((gpu_model.GEMMA2_9B, 1), (gpu_model.PHI3_MEDIUM, 2), (gpu_model.LLAMA32_1B, 1),
                         (gpu_model.MIXTRAL_8X7B, 5)):  # fmt: skip
        specs = gpu_model.tensor_specs(shape)
        assert len(gpu_model.plan_shards(specs, 2, gpu_model.DEFAULT_MAX_SHARD_BYTES)) == files


def test_quantized_checkpoints_are_refused_outside_the_llama_and_moe_layouts():
    for shape in (gpu_model.TINY_GEMMA2, gpu_model.TINY_PHI3):
        with pytest.raises(ValueError, match="written for llama, qwen3_moe, mixtral only"):
            gpu_model.tensor_specs(shape, "gptq")


def test_a_quantized_moe_checkpoint_packs_the_experts_and_counts_the_routed_share():
    """Qwen3-30B-A3B in GPTQ: the routers stay bf16; a token reads 8 of 128 experts' packed bytes."""
    shape = gpu_model.QWEN3_30B_A3B
    specs = {spec.name: spec for spec in gpu_model.tensor_specs(shape, "gptq")}
    assert specs["model.layers.0.mlp.gate.weight"].kind == "normal"
    assert specs["model.layers.0.mlp.experts.5.down_proj.qweight"].shape == (768 // 8, 2048)
    assert not any(name.startswith("model.layers.0.mlp.experts.") and name.endswith(".weight") for name in specs)
    bf16, gptq = gpu_model.decode_bytes_per_token(shape), gpu_model.decode_bytes_per_token(shape, "gptq")
    stored = sum(spec.nbytes(2) for spec in specs.values())
    # 6.08 GB a token in bf16; in GPTQ the linears shrink ~3.6x and the bf16 LM head (0.62 GB)
    # stays: 2.07 GB, where counting every expert's bytes would give most of the 16.9 GB stored.
    assert 0.3 < gptq / bf16 < 0.4 and gptq < 0.15 * stored


# -- tiny: written, loaded, compared ---------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_checkpoint_holds_the_specs_and_the_hub_config(name, tiny_dirs):
    directory, shape = tiny_dirs[name], TINY[name]
    specs = {spec.name: spec.shape for spec in gpu_model.tensor_specs(shape)}
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        assert {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()} == specs
    config = json.loads((directory / "config.json").read_text())
    assert config == dict(shape, torch_dtype="float32")
    assert ("lm_head.weight" in specs) != shape["tie_word_embeddings"]
    assert ("self_attn.qkv_proj.weight" in str(specs)) == (shape["model_type"] == "phi3")


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_shard_and_transformers_agree_on_the_tiny_checkpoint(name, tiny_dirs):
    """Prompt of 18 tokens, past the tiny windows (8): sliding and global layers both differ."""
    transformers = pytest.importorskip("transformers")
    directory = tiny_dirs[name]
    prompt = [t % TINY[name]["vocab_size"] for t in PROMPT]
    reference, info = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                                        output_loading_info=True)  # fmt: skip
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    with torch.no_grad():
        want = reference.eval()(torch.tensor([prompt])).logits[0]
    got = shard_logits(directory, prompt)
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert want.std() > 0.1, "reference logits too flat to compare"
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


@pytest.mark.parametrize("name", sorted(TINY))
def test_special_and_undecodable_ids_never_win(name, tiny_dirs):
    """Their logits are 0 (the zeroed head rows; for Gemma and the 1B the tied embedding rows,
    for Gemma through the soft-cap), and every position's maximum is above 0."""
    shape = TINY[name]
    logits = shard_logits(tiny_dirs[name], [t % shape["vocab_size"] for t in PROMPT])
    zeroed = [*gpu_model.SPECIAL_IDS, *range(TEXT_VOCAB, shape["vocab_size"])]
    # Gemma's and the 1B's zero rows past it; Phi-3's and Mixtral's vocabularies end before it
    assert shape["vocab_size"] > TEXT_VOCAB or name in ("tiny-phi3", "tiny-mixtral")
    assert torch.equal(logits[:, zeroed], torch.zeros(len(PROMPT), len(zeroed)))
    assert (logits.max(dim=-1).values > 0).all()
    assert (logits[:, 17:TEXT_VOCAB] != 0).float().mean() > 0.99


@pytest.mark.parametrize("name", sorted(n for n in TINY if TINY[n]["tie_word_embeddings"]))
def test_a_tied_table_is_written_with_the_heads_zeroed_rows(name, tiny_dirs):
    """With tied embeddings the stored embedding table is the head: no lm_head, and the rows of
    special ids and of ids past the demo tokenizer's vocabulary are zero, the others random."""
    with safe_open(str(tiny_dirs[name] / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
        table = f.get_tensor("model.embed_tokens.weight")
    zeroed = [*gpu_model.SPECIAL_IDS, *range(TEXT_VOCAB, TINY[name]["vocab_size"])]
    assert len(zeroed) > len(gpu_model.SPECIAL_IDS) and not table[zeroed].any()
    assert table[len(gpu_model.SPECIAL_IDS) : TEXT_VOCAB].abs().sum(dim=-1).min() > 0


# -- gpu_vs_vllm ----------------------------------------------------------------------------
def test_bench_prompts_stay_inside_phi3s_vocabulary_and_long_prompt_is_skipped_at_4k():
    """Both engines refuse a prompt id past the model's vocabulary (textgen's router: 400), and
    Phi-3-medium-4k has 4,096 positions: the 6,000-token long_prompt cannot run there."""
    from bench.gpu_vs_vllm import SHAPE_CHOICES, fitting_plan, prompt_vocab, workloads

    assert set(SHAPE_CHOICES) <= set(gpu_model.SHAPES)
    assert prompt_vocab(gpu_model.PHI3_MEDIUM) == 32064 and prompt_vocab(gpu_model.GEMMA2_9B) == TEXT_VOCAB
    phi3 = workloads(False, prompt_vocab(gpu_model.PHI3_MEDIUM))
    ids = [t for runs in phi3.values() for run in runs for r in run for t in r.prompt]
    assert 256 <= min(ids) and max(ids) < 32064 and max(ids) > 31000
    assert [r.prompt for r in workloads(False)["burst"][0]] != [r.prompt for r in phi3["burst"][0]]
    kept, skipped = fitting_plan(phi3, gpu_model.PHI3_MEDIUM["max_position_embeddings"])
    assert list(skipped) == ["long_prompt"] and "6001" in skipped["long_prompt"]
    assert set(kept) == set(phi3) - {"long_prompt"}
    assert fitting_plan(phi3, gpu_model.GEMMA2_9B["max_position_embeddings"])[1] == {}


@pytest.mark.parametrize("checkpoint", [[], ["--checkpoint", "fp8-block"]], ids=["bf16", "fp8-block"])
def test_the_70b_is_refused_unless_it_is_4_bit(checkpoint, monkeypatch, capsys):
    """The 70B fits one GPU only as a 4-bit checkpoint: anything else stops before a model is written."""
    from bench import gpu_vs_vllm

    argv = ["gpu_vs_vllm.py", "--tokenizer-dir", "T", "--out", "O", "--shape", "70b", *checkpoint]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stop:
        gpu_vs_vllm.main()
    assert stop.value.code == 2 and "fits one GPU only in 4 bits" in capsys.readouterr().err
