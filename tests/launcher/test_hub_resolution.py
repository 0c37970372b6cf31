"""--model-id resolution: local directories, the HF cache offline, clear errors."""

import json

import pytest
from fake_stack import EMPTY_SAFETENSORS

from launcher import hub
from launcher.cli import main
from launcher.demo_model import DEMO_MODEL_ID
from launcher.hub import HubAccess, ModelResolutionError, resolve_model

OFFLINE = HubAccess(offline=True)


def _model_dir(path, weights=True):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "tokenizer.json").write_text("{}")
    if weights:
        (path / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
    return path


def _cache_repo(cache, model_id, revision="a" * 40, weights=True):
    repo = cache / ("models--" + model_id.replace("/", "--"))
    _model_dir(repo / "snapshots" / revision, weights)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return repo / "snapshots" / revision


def test_local_directory_is_used_as_is(tmp_path):
    model = _model_dir(tmp_path / "repository")
    assert resolve_model(str(model), access=OFFLINE) == model.resolve()


def test_local_directory_without_safetensors_is_rejected(tmp_path):
    model = _model_dir(tmp_path / "pickled", weights=False)
    (model / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelResolutionError, match="no \\*.safetensors"):
        resolve_model(str(model), access=OFFLINE)


def test_missing_local_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelResolutionError, match="does not exist"):
        resolve_model(str(tmp_path / "nowhere"), access=OFFLINE)


def test_demo_model_resolves_offline_from_the_cache(demo_cache, demo_snapshot):
    assert resolve_model(DEMO_MODEL_ID, cache_dir=demo_cache) == demo_snapshot
    assert resolve_model(DEMO_MODEL_ID, cache_dir=demo_cache, access=OFFLINE) == demo_snapshot


def test_demo_model_seeds_the_cache_first(tmp_path, monkeypatch):
    seeded = []

    def fake_seed(cache_dir):
        seeded.append(cache_dir)
        return _cache_repo(tmp_path, DEMO_MODEL_ID)

    monkeypatch.setattr(hub, "ensure_demo_model", fake_seed)
    path = resolve_model(DEMO_MODEL_ID, cache_dir=tmp_path)
    assert seeded == [tmp_path]
    assert path == tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / (
        "a" * 40)


def test_other_cached_model_resolves_offline(tmp_path):
    snapshot = _cache_repo(tmp_path, "org/tiny-llama")
    assert resolve_model("org/tiny-llama", cache_dir=tmp_path, access=OFFLINE) == snapshot


def test_cached_model_without_safetensors_is_rejected(tmp_path):
    _cache_repo(tmp_path, "org/pickles", weights=False)
    with pytest.raises(ModelResolutionError, match="safetensors"):
        resolve_model("org/pickles", cache_dir=tmp_path, access=OFFLINE)


def test_uncached_model_offline_is_a_clear_error(tmp_path):
    with pytest.raises(ModelResolutionError, match="offline mode is on.*not in the Hugging Face"):
        resolve_model("org/absent", cache_dir=tmp_path, access=OFFLINE)


def test_invalid_model_id_is_a_clear_error(tmp_path):
    with pytest.raises(ModelResolutionError, match="neither an existing local directory"):
        resolve_model("bad id with spaces", cache_dir=tmp_path, access=OFFLINE)


def test_hub_access_from_environment():
    assert HubAccess.from_environment({}) == HubAccess(token=None, offline=False)
    assert HubAccess.from_environment({"HF_TOKEN": "a", "HF_HUB_OFFLINE": "1"}) == HubAccess(
        "a", True)
    assert HubAccess.from_environment({"HF_API_TOKEN": "b"}).token == "b"
    assert HubAccess.from_environment({"HF_HUB_OFFLINE": "yes"}).offline is True
    assert HubAccess.from_environment({"HF_HUB_OFFLINE": "0"}).offline is False


def test_launcher_exits_1_naming_a_missing_model(tmp_path, capsys):
    code = main(["--model-id", "org/absent", "--huggingface-hub-cache", str(tmp_path)],
                {"HF_HUB_OFFLINE": "1"})
    assert code == 1
    assert "org/absent" in capsys.readouterr().err


def test_launcher_exits_2_on_bad_flags(capsys):
    assert main(["--quantize", "eetq"], {}) == 2
    assert "invalid choice: 'eetq'" in capsys.readouterr().err


def test_download_demo_model_subcommand_prints_the_snapshot(demo_cache, demo_snapshot, capsys):
    assert main(["download-demo-model", "--huggingface-hub-cache", str(demo_cache)], {}) == 0
    assert capsys.readouterr().out.strip() == str(demo_snapshot)
