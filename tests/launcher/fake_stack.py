"""What the launcher tests that run the real launcher over fake children share."""
import socket
from pathlib import Path

# Runs the launcher with fake_shard.py and fake_router.py standing in for the real processes.
RUN_LAUNCHER = Path(__file__).parent / "fakes" / "run_launcher.py"
REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
