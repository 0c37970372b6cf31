"""Gemma 2, Gemma 3 (text-only checkpoints, and the multimodal ones' language model) and Phi-3
against transformers on the same safetensors weights, and
the rope scaling types against transformers' rope init functions.

Tolerance: fp32 on CPU, the same maths in a different op order (fused projections, paged
attention, (1 + w) folded into the norm weight at load): logits within 1e-4 (atol and rtol).
Measured on the 37-token prefill: gemma3 (both layouts) 0.0, phi3_partial 3.6e-6, logits up to ~5.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from shard_server.attention.base import StepLayout
from shard_server.layers.rotary import RotaryEmbedding, inverse_frequencies, long_inverse_frequencies
from shard_server.models.config import ModelConfig, UnsupportedModelError

from shard_server.pb import generate_pb2 as pb

from .helpers import StepDriver, load_model, load_runner
from .tiny_models import COMMON, DENSE_FAMILIES, make_tiny_dense_model

LOGITS_ATOL = 1e-4
PROMPTS = 5
NEW_TOKENS = 32
# Triton's interpreter (no GPU) is slow: the triton-backend tests check the first tokens there,
# still past the tiny Gemma-2's sliding window (8) with the longest prompt.
INTERPRETED_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def dense_dirs(tmp_path_factory):
    """{family: (directory, the transformers model)}."""
    built = {}
    for family in DENSE_FAMILIES:
        directory = tmp_path_factory.mktemp(family)
        built[family] = (directory, make_tiny_dense_model(family, directory))
    return built


def _prompts(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(11)
    lengths = [5, 9, 14, 23, 31]
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


@pytest.mark.parametrize("family", sorted(DENSE_FAMILIES))
def test_prefill_logits_match_transformers(family, dense_dirs):
    directory, reference = dense_dirs[family]
    model = load_model(directory)
    n = 37  # beyond every sliding window
    ids = torch.randint(0, reference.config.get_text_config().vocab_size, (n,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    runner = load_runner(directory, block_size=4, num_blocks=32)
    table = torch.randperm(32, generator=torch.Generator().manual_seed(2))[:10].tolist()
    metadata = runner.backend.build_metadata(StepLayout([n], [n], [table], 4), torch.device("cpu"))
    with torch.inference_mode():
        logits = model.compute_logits(model(ids, torch.arange(n), runner.kv_cache, metadata))
    assert expected.abs().max() > 1.0, "reference logits are too flat to compare"
    torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=1e-4)


def generate_together(driver: StepDriver, prompts: list[list[int]], new_tokens: int, chunk: int) -> list[list[int]]:
    """Greedy tokens of every prompt, all in flight at once: chunked prefills beside the
    decodes of the sequences whose prompts are done (mixed steps, then batched decodes)."""
    fed, out = [0] * len(prompts), [[] for _ in prompts]
    new = [pb.NewSequence(id=i, input_ids=p, prompt_len=len(p)) for i, p in enumerate(prompts)]
    while any(len(tokens) < new_tokens for tokens in out):
        scheduled, released = [], []
        for i, prompt in enumerate(prompts):
            if len(out[i]) == new_tokens:
                continue
            if fed[i] < len(prompt):
                n = min(chunk, len(prompt) - fed[i])
                fed[i] += n
                blocks = driver.blocks_for(i, fed[i])
                scheduled.append(pb.ScheduledSequence(id=i, num_tokens=n, new_block_ids=blocks, sample=fed[i] == len(prompt)))
            else:
                blocks = driver.blocks_for(i, len(prompt) + len(out[i]))
                scheduled.append(pb.ScheduledSequence(id=i, num_tokens=1, new_block_ids=blocks, sample=True))
        response = driver.step(new=new, scheduled=scheduled)
        new = []
        for output in response.outputs:
            out[output.id].append(output.token.id)
            if len(out[output.id]) == new_tokens:
                released.append(output.id)
        if released:
            driver.step(released=released)
    return out


def _transformers_greedy(reference, prompts: list[list[int]]) -> list[list[int]]:
    """The oracle: transformers' NEW_TOKENS greedy tokens after each prompt, one at a time."""
    wanted = []
    for prompt in prompts:
        with torch.no_grad():
            wanted.append(reference.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None,
            )[0, len(prompt) :].tolist())  # fmt: skip
    return wanted


@pytest.mark.parametrize("family", sorted(DENSE_FAMILIES))
def test_greedy_tokens_match_transformers(family, dense_dirs):
    """5 prompts x 32 tokens through the runner, all in flight together (chunked prefill, mixed
    steps, batched decodes), within Phi-3's short-factor range: transformers' generate re-prefills
    a sequence that crosses it, see test_longrope_past_the_boundary_matches_a_cached_transformers_step."""
    directory, reference = dense_dirs[family]
    prompts = _prompts(reference.config.get_text_config().vocab_size)
    expected = _transformers_greedy(reference, prompts)
    got = generate_together(StepDriver(load_runner(directory)), prompts, NEW_TOKENS, chunk=6)
    for i in range(PROMPTS):
        assert got[i] == expected[i], f"prompt {i}"


@pytest.mark.parametrize("family", ["phi3", "phi3_partial"])
def test_a_prompt_past_the_longrope_boundary_matches_transformers(family, dense_dirs):
    """A 70-token prompt (past original_max_position_embeddings, 64) beside a 40-token one whose
    answer stays below it: transformers rotates the long prompt's every position with the long
    factors, the short one with the short factors, and so does the runner, through chunked
    prefills and batched decodes."""
    directory, reference = dense_dirs[family]
    generator = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, 160, (n,), generator=generator).tolist() for n in (70, 40)]
    wanted = [_transformers_greedy(reference, [prompt])[0][:16] for prompt in prompts]
    got = generate_together(StepDriver(load_runner(directory)), prompts, 16, chunk=24)
    assert got == wanted


def test_longrope_tells_the_router_which_prompts_it_rotates_apart(dense_dirs):
    from shard_server.layers.rotary import long_rope_prompt_tokens, rotary_row_offset

    scaling = load_model(dense_dirs["phi3"][0]).config.rope_scaling
    assert long_rope_prompt_tokens(scaling) == 64
    assert [rotary_row_offset(scaling, 512, n) for n in (1, 64, 65)] == [0, 0, 512]
    gemma = load_model(dense_dirs["gemma2"][0]).config.rope_scaling
    assert long_rope_prompt_tokens(gemma) == 0 and rotary_row_offset(gemma, 512, 500) == 0


def test_longrope_past_the_boundary_matches_a_cached_transformers_step(dense_dirs):
    """Positions from original_max_position_embeddings (64) on rotate with the long factors, the
    earlier ones keep what they were cached with: transformers' forward with a cache computes the
    same. (Its generate() instead drops the cache when a sequence first crosses the boundary and
    re-prefills every position with the long factors; the shard never recomputes a cache.)"""
    directory, reference = dense_dirs["phi3"]
    ids = torch.randint(0, 160, (67,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        first = reference(ids[None, :64], use_cache=True)
        later = reference(ids[None, 64:], cache=first.past_key_values, use_cache=True)
    expected = later.logits[0]
    runner = load_runner(directory, block_size=4, num_blocks=32)
    model, cpu, table = runner.model, torch.device("cpu"), list(range(17))
    with torch.inference_mode():
        model(ids[:64], torch.arange(64), runner.kv_cache, runner.backend.build_metadata(StepLayout([64], [64], [table], 4), cpu))
        metadata = runner.backend.build_metadata(StepLayout([3], [67], [table], 4), cpu)
        logits = model.compute_logits(model(ids[64:], torch.arange(64, 67), runner.kv_cache, metadata))
    torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=1e-4)


def test_two_ranks_match_one(dense_dirs):
    """gloo, 2 ranks: fused qkv / gate_up split per rank, Gemma's per-layer windows and caps."""
    from shard_server.distributed import ParallelContext

    from .test_tensor_parallel import generations, run_ranks

    families = sorted(DENSE_FAMILIES)
    directories = [dense_dirs[f][0] for f in families]
    ranks = run_ranks(2, directories, "generate")
    for index, family in enumerate(families):
        single = generations(load_model(directories[index]), ParallelContext())
        for rank in (0, 1):
            result = ranks[rank][index]
            assert result["greedy"] == single["greedy"], (family, rank)
            torch.testing.assert_close(result["logits"], single["logits"], atol=LOGITS_ATOL, rtol=1e-4)


# -- configs -----------------------------------------------------------------------------


def test_gemma_config_fields(dense_dirs):
    from shard_server.weights import read_config

    gemma2 = ModelConfig.from_dict(read_config(dense_dirs["gemma2"][0]))
    assert gemma2.layer_windows == (8, None, 8)
    assert gemma2.attention_scale == pytest.approx(24**-0.5)
    assert (gemma2.attn_logit_softcap, gemma2.final_logit_softcap) == (4.0, 6.0)
    assert gemma2.tie_word_embeddings and gemma2.sliding_window is None
    gemma3 = ModelConfig.from_dict(read_config(dense_dirs["gemma3_text"][0]))
    assert (gemma3.rope_theta, gemma3.local_rope_theta) == (1_000_000.0, 10_000.0)
    assert gemma3.rope_scaling.kind == "linear" and gemma3.local_rope_scaling.kind == "default"
    assert gemma3.qk_norm and gemma3.attn_logit_softcap is None


def test_gemma3_hub_style_config():
    """Hub files written before transformers 5: flat rope_theta, rope_local_base_freq,
    rope_scaling for the global layers and sliding_window_pattern."""
    raw = dict(COMMON, model_type="gemma3_text", head_dim=16, rope_theta=1e6, rope_local_base_freq=1e4,
               rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=512,
               sliding_window_pattern=6, num_hidden_layers=12, query_pre_attn_scalar=256)  # fmt: skip
    cfg = ModelConfig.from_dict(raw)
    assert cfg.layer_windows == tuple(None if (i + 1) % 6 == 0 else 512 for i in range(12))
    assert cfg.rope_scaling.kind == "linear" and cfg.rope_scaling.factor == 8.0
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)


def test_gemma3_text_defaults_are_transformers():
    """What a gemma3 text_config (or a gemma3_text config.json) leaves out is what transformers fills in."""
    from shard_server.models.config import GEMMA3_TEXT_DEFAULTS

    defaults = transformers.Gemma3TextConfig()
    assert {key: getattr(defaults, key) for key in GEMMA3_TEXT_DEFAULTS} == GEMMA3_TEXT_DEFAULTS


def test_gemma3_hub_config_reads_like_transformers():
    """google/gemma-3-4b-it's and -27b-it's config.json (vision_config cut short): their sparse
    text_config, the rest left to the defaults, read as transformers reads it."""
    hub_4b = dict(hidden_size=2560, intermediate_size=10240, model_type="gemma3_text", num_hidden_layers=34,
                  rope_scaling={"factor": 8.0, "rope_type": "linear"}, sliding_window=1024)  # fmt: skip
    hub_27b = dict(head_dim=128, hidden_size=5376, intermediate_size=21504, model_type="gemma3_text",
                   num_attention_heads=32, num_hidden_layers=62, num_key_value_heads=16, query_pre_attn_scalar=168,
                   rope_scaling={"factor": 8.0, "rope_type": "linear"}, sliding_window=1024)  # fmt: skip
    for text in (hub_4b, hub_27b):
        raw = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
               "vision_config": {"model_type": "siglip_vision_model"}, "eos_token_id": [1, 106]}  # fmt: skip
        cfg = ModelConfig.from_dict(raw)
        hf = transformers.Gemma3Config(text_config=dict(text), vision_config=raw["vision_config"]).text_config
        assert cfg.model_type == "gemma3" and cfg.qk_norm and cfg.tie_word_embeddings
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings"):  # fmt: skip
            assert getattr(cfg, key) == getattr(hf, key), key
        assert cfg.layer_windows == tuple(1024 if t == "sliding_attention" else None for t in hf.layer_types)
        assert cfg.attention_scale == pytest.approx(hf.query_pre_attn_scalar**-0.5)
        assert cfg.rope_theta == hf.rope_parameters["full_attention"]["rope_theta"] == 1e6
        assert cfg.local_rope_theta == hf.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
        assert (cfg.rope_scaling.kind, cfg.rope_scaling.factor) == ("linear", 8.0)
        assert cfg.local_rope_scaling.kind == "default"
        assert cfg.attn_logit_softcap is None and cfg.final_logit_softcap is None


@pytest.mark.parametrize("family", ["gemma3", "gemma3_module_names"])
def test_gemma3_reads_only_its_language_model(family, dense_dirs):
    """Both layouts: the vision tower and the projector are in the checkpoint and never read."""
    from shard_server.distributed import ParallelContext
    from shard_server.models.registry import build_model
    from shard_server.weights import WeightStore, read_config

    directory, _ = dense_dirs[family]
    prefix = "language_model.model." if family == "gemma3" else "model.language_model."
    with WeightStore(directory) as store:
        names = store.names()
        assert any("vision_tower" in n for n in names) and any("multi_modal_projector" in n for n in names)
        text = [n for n in names if n.startswith(prefix)]
        assert len(text) == 3 * 13 + 2  # 13 tensors a layer, the embeddings and the final norm; no lm_head
        text_bytes = 0
        for name in text:
            dtype, shape = store.header(name)
            assert dtype == "F32"
            text_bytes += 4 * math.prod(shape)
        build_model(ModelConfig.from_dict(read_config(directory)), store, ParallelContext(), "reference",
                    torch.float32, torch.device("cpu"))  # fmt: skip
        assert store.bytes_read == text_bytes


@pytest.mark.parametrize(
    "raw, message",
    [
        (dict(model_type="paligemma"), "model_type 'paligemma' is not supported (supported: llama"),
        (dict(model_type="gemma3", text_config={"model_type": "gemma2"}), "text_config model_type 'gemma2'"),
        (dict(model_type="phi3", rope_scaling={"type": "ntk-by-parts", "factor": 2.0}),
         "rope scaling 'ntk-by-parts' is not supported (supported: default, linear, llama3, dynamic, yarn, longrope)"),
        (dict(model_type="llama", rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                                "extrapolation": 2}), "unsupported keys: extrapolation"),
        (dict(model_type="llama", partial_rotary_factor=0.75), "partial_rotary_factor 0.75 is not supported for llama"),
        (dict(model_type="phi3", partial_rotary_factor=0.1), "partial_rotary_factor 0.1 is not supported: head_dim 16"),
        (dict(model_type="gemma2", hidden_activation="gelu"), "hidden_activation 'gelu'"),
        (dict(model_type="gemma2", use_bidirectional_attention=True), "use_bidirectional_attention"),
        (dict(model_type="gemma2", layer_types=["sliding_attention", "chunked_attention"]), "layer_types"),
    ],
)  # fmt: skip
def test_unsupported_configs_are_refused_by_name(raw, message):
    with pytest.raises(UnsupportedModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig.from_dict({**COMMON, **raw})


# Families whose attention takes a triton path of its own, each checked there with the fused
# kernels on (compiled on a GPU, Triton's interpreter on CPU): Gemma 2's soft-capped scores and
# fused GeGLU; Gemma 3's per-head q/k norms inside the rotary + KV store launch; Phi-4-mini's
# partial rotary (12 of 16 dims: the in-place rotary kernel, then the plain KV store).
TRITON_PATHS = {
    "gemma2": lambda model: model.attention_backend.shape.logit_softcap == 4.0,
    "gemma3_text": lambda model: all(layer.self_attn.q_norm is not None for layer in model.layers),
    "phi3_partial": lambda model: model.config.rotary_dim == 12 and model.rotary.dim == 12,
}


@pytest.mark.parametrize("family", sorted(TRITON_PATHS))
def test_through_the_triton_backend_matches_transformers(dense_dirs, family):
    """The prefill logits and the greedy tokens of the runner (5 x 32, 12 interpreted), all
    prompts in flight together."""
    from shard_server.kernels.dispatch import fused_kernels

    directory, reference = dense_dirs[family]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runner = load_runner(directory, block_size=4, num_blocks=256, attention="triton", device=device)
    assert {layer.self_attn.backend.name for layer in runner.model.layers} == {"triton"}
    assert TRITON_PATHS[family](runner.model)
    vocab = reference.config.get_text_config().vocab_size
    n = 37  # beyond Gemma 2's sliding window
    ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    metadata = runner.backend.build_metadata(StepLayout([n], [n], [list(range(40, 50))], 4), device)
    with fused_kernels(True, on_cpu=True), torch.inference_mode():
        logits = runner.model.compute_logits(runner.model(ids.to(device), torch.arange(n, device=device),
                                                          runner.kv_cache, metadata))  # fmt: skip
    torch.testing.assert_close(logits.cpu(), expected, atol=LOGITS_ATOL, rtol=1e-4)
    prompts = _prompts(vocab)
    wanted = _transformers_greedy(reference, prompts)
    runner.clear()
    new_tokens = NEW_TOKENS if device.type == "cuda" else INTERPRETED_NEW_TOKENS
    with fused_kernels(True, on_cpu=True):
        got = generate_together(StepDriver(runner), prompts, new_tokens, chunk=6)
    for i in range(PROMPTS):
        assert got[i] == wanted[i][:new_tokens], f"prompt {i}"


# -- rope scaling types against transformers ---------------------------------------------

ROPE_CASES = {
    "linear": dict(rope_type="linear", factor=4.0),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64),
    "dynamic": dict(rope_type="dynamic", factor=4.0),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128),
    "yarn_betas": dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=64, beta_fast=16,
                       beta_slow=2, truncate=False),
    "yarn_mscale": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128, mscale=0.707,
                        mscale_all_dim=1.0),
    "yarn_attention_factor": dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=256,
                                  attention_factor=1.3),
    "longrope": dict(rope_type="longrope", original_max_position_embeddings=64,
                     short_factor=[1.0 + i / 10 for i in range(16)], long_factor=[2.0 + i for i in range(16)]),
    "longrope_factor": dict(rope_type="longrope", factor=4.0, original_max_position_embeddings=128,
                            short_factor=[1.0] * 16, long_factor=[1.0 + i / 4 for i in range(16)]),
}  # fmt: skip


def _hf_config(case: dict):
    config = transformers.LlamaConfig(
        hidden_size=128, num_attention_heads=4, max_position_embeddings=512,
        rope_parameters={"rope_theta": 50000.0, **case},
    )  # fmt: skip
    return config


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rope_scaling_matches_transformers(case):
    hf = _hf_config(ROPE_CASES[case])
    cfg = ModelConfig.from_dict(hf.to_dict())
    kind = ROPE_CASES[case]["rope_type"]
    assert cfg.rope_scaling.kind == kind
    expected, attention_factor = ROPE_INIT_FUNCTIONS[kind](hf, None)
    ours = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)
    assert cfg.rope_scaling.attention_factor == pytest.approx(attention_factor, rel=1e-9)
    table = RotaryEmbedding(cfg.head_dim, 512, cfg.rope_theta, cfg.rope_scaling, torch.float32, torch.device("cpu"))
    position = 100
    if kind == "longrope":
        original = ROPE_INIT_FUNCTIONS[kind](hf, None, seq_len=hf.rope_parameters["original_max_position_embeddings"] + 1)[0]
        torch.testing.assert_close(long_inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), original)
        position = 300  # past the boundary: the long factors
        expected = original
    freqs = position * expected
    emb = torch.cat((freqs, freqs))
    torch.testing.assert_close(table.cos[position], emb.cos() * attention_factor, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(table.sin[position], emb.sin() * attention_factor, atol=1e-5, rtol=1e-5)


def test_phi3_su_and_yarn_names_read_as_longrope():
    factors = dict(short_factor=[1.0] * 8, long_factor=[2.0] * 8)
    for name in ("su", "yarn"):
        raw = dict(COMMON, model_type="phi3", original_max_position_embeddings=64,
                   rope_scaling={"type": name, **factors})  # fmt: skip
        scaling = ModelConfig.from_dict(raw).rope_scaling
        assert scaling.kind == "longrope" and scaling.original_max_position_embeddings == 64
        assert scaling.attention_factor == pytest.approx(math.sqrt(1 + math.log(512 / 64) / math.log(64)))
