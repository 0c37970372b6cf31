"""How many shards to start: TGI's `--sharded` / `--num-shard` rules."""

from __future__ import annotations

import shutil
import subprocess
from typing import Callable, Mapping

from .settings import Settings, UsageError


def _count_listed(value: str) -> int | None:
    """Count a CUDA_VISIBLE_DEVICES-style list; None when it does not list devices."""
    value = value.strip()
    if value in ("", "all", "void", "none", "NoDevFiles"):
        return None
    return len([item for item in value.split(",") if item.strip()])


def _count_with_nvidia_smi() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in result.stdout.splitlines() if line.strip()])


def visible_gpu_count(environ: Mapping[str, str],
                      query: Callable[[], int] = _count_with_nvidia_smi) -> int:
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        if name in environ:
            listed = _count_listed(environ[name])
            if listed is not None:
                return listed
            if environ[name].strip() in ("void", "none", ""):
                return 0
    return query()


def resolve_num_shard(settings: Settings, count_gpus: Callable[[], int]) -> int:
    """TGI's table: explicit --num-shard wins; --sharded true needs more than one GPU."""
    if settings.num_shard is not None:
        if settings.sharded is True and settings.num_shard < 2:
            raise UsageError("--sharded true needs --num-shard greater than 1")
        return settings.num_shard
    if settings.sharded is False or settings.device == "cpu":
        return 1
    gpus = count_gpus()
    if settings.sharded is True:
        if gpus < 2:
            raise UsageError(f"--sharded true needs more than one visible GPU, found {gpus}")
        return gpus
    return max(gpus, 1)
