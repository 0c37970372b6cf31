"""What the launcher tests that run the real launcher over fake children share."""
import socket
from pathlib import Path

# Runs the launcher with fake_shard.py and fake_router.py standing in for the real processes.
RUN_LAUNCHER = Path(__file__).parent / "fakes" / "run_launcher.py"
REPO_ROOT = Path(__file__).resolve().parents[2]


# The smallest valid safetensors file (no tensors): the launcher reads every header at startup.
EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"


def write_fake_model(path: Path) -> Path:
    """A model directory the launcher's startup checks accept (fake children never read it)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    (path / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
