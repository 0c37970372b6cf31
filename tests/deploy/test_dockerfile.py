"""The Dockerfile: hadolint-clean, multi-stage with cached Rust and Python dependencies, a
CUDA runtime base with a non-root user, TGI's conventions, and the README's install command
as its install step. Docker itself cannot run here, so this is what can be checked."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib

import pytest

import dockerfile_reader as dockerfile
from deploy_tools import REPO_ROOT, check_tool, run_tool

DOCKERFILE = REPO_ROOT / "Dockerfile"
README = REPO_ROOT / "README.md"
DEPLOY_DOC = REPO_ROOT / "docs" / "deploy.md"
DOCUMENTED_RUN = "docker run --gpus all --shm-size 1g -p 8080:80 -v $PWD/data:/data"


@pytest.fixture(scope="module")
def stages() -> list[dockerfile.Stage]:
    return dockerfile.read(DOCKERFILE)


@pytest.fixture(scope="module")
def builder(stages) -> dockerfile.Stage:
    return next(stage for stage in stages if stage.name == "builder")


def _make_calls(stage: dockerfile.Stage) -> list[list[str]]:
    return [words for words in dockerfile.run_commands(stage) if words[0] == "make"]


def _make_dry_run(*args: str) -> list[str]:
    """The commands `make` would run, for a virtual environment that does not exist yet."""
    result = subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True)
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def _make_target(line: str) -> str:
    return line.split("#")[0].split()[1]


def test_hadolint_passes():
    check_tool("hadolint", str(DOCKERFILE))


def test_hadolint_does_fail_on_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")
    result = run_tool("hadolint", str(bad))
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # untagged base image


def test_runtime_is_a_cuda_runtime_image_running_as_non_root(stages):
    runtime = stages[-1]
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-(cudnn-)?runtime-ubuntu[\d.]+", runtime.base), \
        runtime.base
    (user,) = runtime.all("USER")
    uid = user.arguments.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid"
    (entrypoint,) = runtime.all("ENTRYPOINT")
    assert dockerfile.exec_form(entrypoint) == ["textgen-launcher"]
    env = dockerfile.env(runtime)
    assert env["PORT"] == "80" and env["HF_HOME"] == "/data"
    assert "/opt/textgen/bin" in env["PATH"].split(":")
    assert [item.arguments for item in runtime.all("EXPOSE")] == ["80"]
    assert [item.arguments for item in runtime.all("VOLUME")] == ["/data"]


def test_builder_and_runtime_share_the_ubuntu_release(stages, builder):
    """The virtual environment is copied across stages: its python3 must be the same."""
    runtime_release = re.search(r"ubuntu([\d.]+)$", stages[-1].base).group(1)
    assert builder.base == f"ubuntu:{runtime_release}"
    copies = [item.arguments for item in stages[-1].all("COPY")]
    assert "--from=builder /opt/textgen /opt/textgen" in copies


def test_dependencies_are_built_before_the_sources_are_copied(builder):
    """Editing textgen's sources must not rebuild the Rust crates or reinstall torch."""
    items = builder.instructions
    copy_all = next(i for i, item in enumerate(items)
                    if item.keyword == "COPY" and item.arguments == ". .")
    cargo_build = next(i for i, item in enumerate(items)
                       if item.keyword == "RUN" and "cargo build" in item.arguments)
    python_deps = next(i for i, item in enumerate(items)
                       if item.keyword == "RUN" and "list-dependencies.py" in item.arguments)
    assert cargo_build < copy_all and python_deps < copy_all
    early_sources = {word for item in items[:copy_all] if item.keyword == "COPY"
                     and not item.arguments.startswith("--from")
                     for word in item.arguments.split()[:-1]}
    assert "router/Cargo.lock" in early_sources and "pyproject.toml" in early_sources
    assert not any(word.startswith(("router/src", "launcher", "shard_server"))
                   for word in early_sources)
    assert "--locked" in items[cargo_build].arguments


def test_image_install_steps_are_the_readmes_install_command(builder):
    readme_commands = [line.strip() for line in README.read_text().splitlines()
                       if re.match(r"\s*make install(\s|$)", line)]
    assert readme_commands, "README documents no `make install` command"
    readme_targets = {_make_target(line) for line in readme_commands}
    assert readme_targets == {"install"}

    calls = _make_calls(builder)
    assert [call[1] for call in calls] == ["venv", "install"], calls
    venv = {word for call in calls for word in call[2:] if word.startswith("VENV=")}
    assert len(venv) == 1, "every make call must use the same virtual environment"
    (venv_arg,) = venv
    image_steps = [step for call in calls for step in _make_dry_run(*call[1:])]
    readme_steps = _make_dry_run("install", venv_arg)
    assert sorted(set(image_steps)) == sorted(set(readme_steps))
    assert any(step.endswith("pip install .") for step in readme_steps)
    # Nothing installs textgen behind the Makefile's back.
    for words in dockerfile.run_commands(builder):
        joined = " ".join(words)
        assert "maturin" not in joined and not re.search(r"pip install [^-]*\.$", joined), joined


def test_python_dependency_layer_installs_pyprojects_dependencies():
    script = REPO_ROOT / "scripts" / "list-dependencies.py"
    listed = subprocess.run([sys.executable, str(script), str(REPO_ROOT / "pyproject.toml")],
                            capture_output=True, text=True, check=True).stdout.split()
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        declared = tomllib.load(handle)["project"]["dependencies"]
    assert listed == declared and "torch" in " ".join(listed)


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!")
        plain = pattern.removeprefix("**/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        candidates = prefixes + ([part for part in parts] if pattern.startswith("**/") else [])
        if any(fnmatch.fnmatch(candidate, plain) for candidate in candidates):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_build_copies_and_drops_build_outputs(builder):
    patterns = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for output in (".venv", "router/target", ".tools", ".git"):
        assert _ignored(output, patterns), f"{output} is sent to the docker daemon"
    for item in builder.all("COPY"):
        if item.arguments.startswith("--from") or item.arguments == ". .":
            continue
        for source in item.arguments.split()[:-1]:
            assert (REPO_ROOT / source).exists(), f"COPY {source}: no such file"
            assert not _ignored(source, patterns), f"COPY {source} is excluded by .dockerignore"
    for needed in ("pyproject.toml", "README.md", "Makefile", "router/src/main.rs",
                   "launcher/cli.py", "shard_server", "packaging/data"):
        assert not _ignored(needed, patterns), needed


@pytest.mark.parametrize("document", [README, DEPLOY_DOC], ids=["README", "docs/deploy.md"])
def test_documented_usage_is_tgis_docker_run(document):
    text = document.read_text()
    assert DOCUMENTED_RUN in text and "--model-id" in text.split(DOCUMENTED_RUN, 1)[1][:200]
