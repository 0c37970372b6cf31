"""The exact command lines of the children (docs/processes.md).

Forwarded flags travel only when the user set them, so each child's own default applies.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .options import OPTIONS, ROUTER, SHARD
from .settings import Settings

ROUTER_EXECUTABLE = "textgen-router"
SHARD_EXECUTABLE = "textgen-shard"


class ExecutableNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class Executables:
    """The argv prefixes that start each child; tests substitute small scripts."""

    router: tuple[str, ...]
    shard: tuple[str, ...]


def find_executable(name: str) -> str:
    """Next to the running Python (the venv's scripts dir) first, then PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        raise ExecutableNotFound(
            f"cannot find {name!r} next to {sys.executable} or on PATH; is textgen installed?")
    return found


def default_executables() -> Executables:
    return Executables(router=(find_executable(ROUTER_EXECUTABLE),),
                       shard=(find_executable(SHARD_EXECUTABLE),))


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) >= 1 else str(value)
    return str(value)


def _forwarded_flags(settings: Settings, child: str) -> list[str]:
    args: list[str] = []
    for option in OPTIONS:
        if child not in option.forward:
            continue
        value = getattr(settings, option.dest)
        if value is None or (option.switch and value is False):
            continue
        if option.switch:
            args.append(option.long_flag)
        else:
            args += [option.long_flag, _format(value)]
    return args


def shard_command(executables: Executables, settings: Settings, model_path: Path,
                  rank: int, world_size: int,
                  speculative_model_path: Path | None = None) -> list[str]:
    """`speculative_model_path`: the draft model's directory, resolved from
    `--speculative-model` by the launcher like the model's (cli.serve)."""
    draft = [] if speculative_model_path is None else [
        "--speculative-model", str(speculative_model_path)]
    return [*executables.shard, "serve",
            "--model-path", str(model_path),
            "--uds-path", settings.shard_uds_path,
            "--rank", str(rank),
            "--world-size", str(world_size),
            *draft,
            *_forwarded_flags(settings, SHARD)]


def router_command(executables: Executables, settings: Settings, model_path: Path,
                   num_shard: int) -> list[str]:
    return [*executables.router,
            "--model-id", settings.model_id,
            "--model-path", str(model_path),
            "--shard-uds-path", settings.shard_uds_path,
            "--num-shard", str(num_shard),
            "--hostname", settings.hostname,
            "--port", str(settings.port),
            *_forwarded_flags(settings, ROUTER)]


def child_environment(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment minus its own flags' env twins.

    Children get configuration only from their command line; a stray `MAX_TOTAL_TOKENS` in
    the environment must not reach the router behind the launcher's back.
    """
    twins = {name for option in OPTIONS for name in option.envs}
    env = {name: value for name, value in environ.items() if name not in twins}
    if settings.otlp_service_name is not None:
        env["OTEL_SERVICE_NAME"] = settings.otlp_service_name
    return env


# NCCL's NVLink multicast reserves GPU memory per communicator and has hung collectives on
# some drivers; tensor parallelism does not need it.
SHARD_ENVIRONMENT = {"NCCL_NVLS_ENABLE": "0"}


def shard_environment(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """What a shard runs with: the children's environment plus NCCL's settings."""
    return {**child_environment(settings, environ), **SHARD_ENVIRONMENT}


SECRET_FLAGS = frozenset({"--api-key"})


def redact_secrets(argv: Sequence[str]) -> list[str]:
    """argv for logging: the value after a secret flag is masked."""
    shown = list(argv)
    for index, arg in enumerate(shown[:-1]):
        if arg in SECRET_FLAGS:
            shown[index + 1] = "***"
    return shown


def shard_socket(settings: Settings, rank: int) -> Path:
    return Path(f"{settings.shard_uds_path}-{rank}")
