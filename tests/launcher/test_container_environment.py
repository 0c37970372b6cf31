"""The Docker image's conventions, end to end through the real launcher process.

The image sets no flags: `docker run -e MODEL_ID=/repository -e PORT=80 ...` (Inference
Endpoints mount the model at /repository) must configure the launcher through env twins alone,
and `--model-id` after the image name must still beat MODEL_ID. Fake shard and router
processes stand in for the real ones.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fake_stack import REPO_ROOT, RUN_LAUNCHER, free_port, write_fake_model


def _model_dir(path: Path) -> Path:
    return write_fake_model(path)


def _serve_from_environment(tmp_path: Path, env: dict[str, str], *argv: str):
    """Start the launcher with `env` on top of a clean environment."""
    (tmp_path / "argv").mkdir()
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PORT", "HOSTNAME", "MODEL_ID", "SHARD_UDS_PATH")}
    environ.update({"PYTHONPATH": str(REPO_ROOT), "FAKE_ARGV_DIR": str(tmp_path / "argv"),
                    "HF_HUB_OFFLINE": "1", **env})
    process = subprocess.Popen([sys.executable, str(RUN_LAUNCHER), *argv], env=environ,
                               stderr=subprocess.PIPE, text=True)
    return process


def _wait_healthy(process: subprocess.Popen, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"launcher exited {process.returncode}: {process.stderr.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered /health on port {port}")


def _stop(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
    return process.returncode


def test_model_id_and_port_come_from_the_environment(tmp_path):
    repository = _model_dir(tmp_path / "repository")
    port = free_port()
    process = _serve_from_environment(tmp_path, {
        "MODEL_ID": str(repository), "PORT": str(port), "HOSTNAME": "127.0.0.1",
        "SHARD_UDS_PATH": str(tmp_path / "shard"), "MAX_BATCH_SIZE": "8"})
    try:
        _wait_healthy(process, port)
    finally:
        assert _stop(process) == 0
    shard_argv = json.loads((tmp_path / "argv" / "shard-0.json").read_text())
    router_argv = json.loads((tmp_path / "argv" / "router.json").read_text())
    assert shard_argv[shard_argv.index("--model-path") + 1] == str(repository.resolve())
    assert router_argv[router_argv.index("--port") + 1] == str(port)
    assert router_argv[router_argv.index("--max-batch-size") + 1] == "8"


def test_model_id_flag_after_the_image_name_beats_the_environment(tmp_path):
    from_env = _model_dir(tmp_path / "from-env")
    from_flag = _model_dir(tmp_path / "from-flag")
    port = free_port()
    process = _serve_from_environment(
        tmp_path, {"MODEL_ID": str(from_env), "PORT": str(port), "HOSTNAME": "127.0.0.1",
                   "SHARD_UDS_PATH": str(tmp_path / "shard")},
        "--model-id", str(from_flag))
    try:
        _wait_healthy(process, port)
    finally:
        assert _stop(process) == 0
    shard_argv = json.loads((tmp_path / "argv" / "shard-0.json").read_text())
    assert shard_argv[shard_argv.index("--model-path") + 1] == str(from_flag.resolve())
