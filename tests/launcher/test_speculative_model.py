"""--speculative-model: the draft model is resolved and checked like --model-id, before any
spawn, and every shard gets its directory (docs/processes.md)."""

import signal
from pathlib import Path

import pytest
from fake_stack import write_fake_model
from test_supervisor import Launcher

from launcher import cli
from launcher.cli import main, resolve_speculative_model
from launcher.demo_model import DEMO_MODEL_ID
from launcher.hub import HubAccess, ModelResolutionError
from launcher.settings import parse_settings
from launcher.supervisor import StopSignal

OFFLINE = HubAccess(offline=True)


def settings(*argv, **env):
    return parse_settings(list(argv), env)


@pytest.fixture
def no_spawn(monkeypatch):
    def spawn(*args, **kwargs):
        raise AssertionError("the launcher built its children after a failed model check")

    monkeypatch.setattr(cli, "build_supervisor", spawn)


def test_without_the_flag_nothing_more_is_resolved(monkeypatch):
    monkeypatch.setattr(cli, "resolve_model", lambda *a: pytest.fail("resolved a draft model"))
    assert resolve_speculative_model(settings("--speculate", "4"), None, OFFLINE) is None


def test_the_draft_is_resolved_with_the_models_cache_and_access_at_the_default_revision(
        tmp_path, monkeypatch):
    calls, built = [], {}

    def resolve(model_id, revision, cache, access):
        calls.append((model_id, revision, cache, access))
        return tmp_path / model_id.replace("/", "--")

    class Ran:
        def run(self):
            return 0

    def build(settings, model_path, num_shard, executables, environ, stop, draft=None):
        built.update(model_path=model_path, draft=draft)
        return Ran()

    monkeypatch.setattr(cli, "resolve_model", resolve)
    monkeypatch.setattr(cli, "build_supervisor", build)
    monkeypatch.setattr(StopSignal, "install", lambda self: None)
    code = main(["--model-id", "org/target", "--revision", "v2", "--speculate", "3",
                 "--speculative-model", "org/draft", "--huggingface-hub-cache", str(tmp_path),
                 "--device", "cpu"], {"HF_TOKEN": "tok", "HF_HUB_OFFLINE": "1"})
    assert code == 0
    access = HubAccess(token="tok", offline=True)
    assert calls == [("org/target", "v2", tmp_path, access), ("org/draft", None, tmp_path, access)]
    assert built == {"model_path": tmp_path / "org--target", "draft": tmp_path / "org--draft"}


def test_the_demo_model_id_works_as_the_draft(demo_cache, demo_snapshot):
    s = settings("--speculate", "2", "--speculative-model", DEMO_MODEL_ID)
    assert resolve_speculative_model(s, demo_cache, OFFLINE) == demo_snapshot


def test_a_local_draft_directory_is_used_as_is(tmp_path):
    draft = write_fake_model(tmp_path / "draft")
    s = settings("--speculate", "2", "--speculative-model", str(draft))
    assert resolve_speculative_model(s, None, OFFLINE) == draft.resolve()


def _truncate_weights(draft: Path) -> str:
    weights = draft / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5])
    return f"{weights}: truncated: 5 bytes, shorter than a safetensors header"


def _drop_tokenizer(draft: Path) -> str:
    (draft / "tokenizer.json").unlink()
    return f"{draft / 'tokenizer.json'}: missing"


def _drop_weights(draft: Path) -> str:
    (draft / "model.safetensors").unlink()
    return "has no *.safetensors weights"


@pytest.mark.parametrize("damage", [_truncate_weights, _drop_tokenizer, _drop_weights])
def test_a_corrupt_draft_directory_fails_before_any_spawn_naming_it(tmp_path, capsys, no_spawn,
                                                                   damage):
    model = write_fake_model(tmp_path / "model")
    draft = write_fake_model(tmp_path / "draft")
    fault = damage(draft)
    code = main(["--model-id", str(model), "--speculate", "4", "--speculative-model", str(draft),
                 "--device", "cpu"], {})
    err = capsys.readouterr().err
    assert code == 1
    assert f"speculative model (--speculative-model {draft}): " in err
    assert fault in err


def test_a_missing_draft_directory_fails_naming_it(tmp_path, capsys, no_spawn):
    model = write_fake_model(tmp_path / "model")
    missing = tmp_path / "no-such-draft"
    assert main(["--model-id", str(model), "--speculate", "4", "--speculative-model", str(missing),
                 "--device", "cpu"], {}) == 1
    err = capsys.readouterr().err
    assert (f"speculative model (--speculative-model {missing}): model directory "
            f"'{missing}' does not exist") in err


def test_an_uncached_draft_offline_fails_naming_it(tmp_path, capsys, no_spawn):
    model = write_fake_model(tmp_path / "model")
    code = main(["--model-id", str(model), "--speculate", "4", "--speculative-model", "org/absent",
                 "--huggingface-hub-cache", str(tmp_path / "cache"), "--device", "cpu"],
                {"HF_HUB_OFFLINE": "1"})
    err = capsys.readouterr().err
    assert code == 1
    assert ("speculative model (--speculative-model org/absent): cannot resolve model "
            "'org/absent': offline mode is on and it is not in the Hugging Face cache") in err


def test_a_resolution_failure_is_a_model_resolution_error(tmp_path):
    s = settings("--speculate", "1", "--speculative-model", str(tmp_path / "gone"))
    with pytest.raises(ModelResolutionError, match="^speculative model "):
        resolve_speculative_model(s, None, OFFLINE)


def test_the_flag_without_speculate_exits_2(tmp_path, capsys, no_spawn):
    draft = write_fake_model(tmp_path / "draft")
    assert main(["--speculative-model", str(draft)], {}) == 2
    assert ("error: --speculative-model needs --num-speculative-tokens N (or --speculate N) >= 1"
            in capsys.readouterr().err)


def test_every_shard_gets_the_resolved_draft_and_the_router_does_not(tmp_path):
    model = write_fake_model(tmp_path / "model")
    draft = write_fake_model(tmp_path / "draft")
    launcher = Launcher(tmp_path, model, "--num-shard", "2", "--speculate", "3",
                        env={"SPECULATIVE_MODEL": str(draft)})
    launcher.wait_ready()
    launcher.process.send_signal(signal.SIGTERM)
    code, stderr = launcher.finish()
    assert code == 0, stderr
    for rank in range(2):
        argv = launcher.argv(f"shard-{rank}")
        assert argv[argv.index("--speculative-model") + 1] == str(draft.resolve())
        assert argv[argv.index("--model-path") + 1] == str(model.resolve())
    router = launcher.argv("router")
    assert "--speculative-model" not in router and str(draft.resolve()) not in router
    assert router[router.index("--speculate") + 1] == "3"


def test_a_corrupt_draft_stops_the_real_launcher_before_any_child(tmp_path):
    model = write_fake_model(tmp_path / "model")
    draft = write_fake_model(tmp_path / "draft")
    fault = _truncate_weights(draft)
    launcher = Launcher(tmp_path, model, "--speculate", "3", "--speculative-model", str(draft))
    code, stderr = launcher.finish()
    assert code == 1
    assert f"speculative model (--speculative-model {draft}): {fault}" in stderr
    assert not list(launcher.argv_dir.iterdir()), "a child was started"
