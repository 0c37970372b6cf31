"""Faults in the model's files at startup (issue 27), against the real launcher, shard and router.

A truncated or corrupt safetensors file, a missing or broken tokenizer.json or config.json,
a safetensors index naming a file that is not there, an unknown architecture: the launcher
exits 1 before anything serves (/health never answers), in seconds, with one line that
names the file and what is wrong, and no traceback. Every fault but the architecture is
found by the launcher before it spawns anything; the architecture is the shard's to judge,
and it says so naming config.json before reading any weight.

Each case is a copy of the demo model (symlinks to the cached snapshot) with one file damaged.
"""
from __future__ import annotations

import json
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from server import free_port, launcher_command

CHUNK = 1 << 20


def _header_len(path: Path) -> int:
    with path.open("rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def _rewrite(model: Path, name: str, data: bytes) -> None:
    (model / name).unlink()
    (model / name).write_bytes(data)


def truncated(model: Path) -> None:  # a download cut short, 1 MiB into the tensor data
    source = (model / "model.safetensors").resolve()
    with source.open("rb") as f:
        head = f.read(8 + _header_len(source) + CHUNK)
    _rewrite(model, "model.safetensors", head)


def corrupt_header_json(model: Path) -> None:  # the header's first bytes overwritten
    source = (model / "model.safetensors").resolve()
    n = _header_len(source)
    with source.open("rb") as f:
        head = bytearray(f.read(8 + n + CHUNK))
    head[8:18] = b"\x00garbage!!"
    _rewrite(model, "model.safetensors", bytes(head))


def corrupt_header_length(model: Path) -> None:  # not a safetensors file at all
    _rewrite(model, "model.safetensors", b"\x89PNG\r\n\x1a\n" + b"\x00" * CHUNK)


def missing_tokenizer(model: Path) -> None:
    (model / "tokenizer.json").unlink()


def broken_tokenizer(model: Path) -> None:
    _rewrite(model, "tokenizer.json", (model / "tokenizer.json").read_bytes()[:4096])


def broken_config(model: Path) -> None:
    _rewrite(model, "config.json", b'{"model_type": "llama", "hidden_size": ')


def unknown_architecture(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "frobnicator"
    _rewrite(model, "config.json", json.dumps(config).encode())


def index_naming_a_missing_shard(model: Path) -> None:
    (model / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


# (damage, the file the message must name, what it must say, found before any spawn)
CASES: dict[str, tuple[Callable[[Path], None], str, str, bool]] = {
    "truncated_safetensors": (truncated, "model.safetensors", "truncated: its header describes", True),
    "corrupt_header_json": (corrupt_header_json, "model.safetensors", "corrupt header: not valid JSON", True),
    "corrupt_header_length": (corrupt_header_length, "model.safetensors", "its header length field says", True),
    "missing_tokenizer": (missing_tokenizer, "tokenizer.json", "missing", True),
    "broken_tokenizer": (broken_tokenizer, "tokenizer.json", "not valid JSON", True),
    "broken_config": (broken_config, "config.json", "not valid JSON", True),
    "unknown_architecture": (unknown_architecture, "config.json", "model_type 'frobnicator' is not supported", False),
    "index_naming_a_missing_shard": (index_naming_a_missing_shard, "model.safetensors.index.json",
                                     "names model-00001-of-00002.safetensors, which is missing", True),
}


def damaged_copy(snapshot: Path, into: Path, damage: Callable[[Path], None]) -> Path:
    into.mkdir()
    for source in snapshot.iterdir():
        (into / source.name).symlink_to(source.resolve())
    damage(into)
    return into


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_model_stops_the_launcher_before_serving_naming_the_file(case, demo_model_dir, tmp_path):
    damage, filename, reason, before_spawn = CASES[case]
    model = damaged_copy(Path(demo_model_dir), tmp_path / "model", damage)
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    started = time.monotonic()
    process = subprocess.Popen(
        launcher_command() + ["--model-id", str(model), "--port", str(port), "--hostname", "127.0.0.1",
                              "--shard-uds-path", str(tmp_path / "shard")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    answers: list[int] = []

    def watch_health() -> None:  # until the launcher exits: /health must never answer
        while process.poll() is None:
            try:
                answers.append(httpx.get(url, timeout=1).status_code)
            except httpx.HTTPError:
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_health)
    watcher.start()
    try:
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        watcher.join()
    took = time.monotonic() - started
    log = output.decode(errors="replace")
    print(f"{case}: exit {process.returncode} after {took:.2f} s\n{log}")
    assert process.returncode == 1
    assert answers == [], f"/health answered {answers} before the launcher stopped"
    named = f"{model / filename}: "
    lines = [line for line in log.splitlines() if named in line]
    assert lines and reason in lines[0], f"no line names {named!r} with {reason!r}"
    assert "Traceback" not in log
    if before_spawn:  # the launcher's own check: no child started, one line in all
        assert "starting shard" not in log and log.count("\n") == 1, log
        assert took < 10, f"{took:.1f} s"
    else:  # the shard's: before any weight is read, and the launcher repeats its one line
        assert "ERROR shard-0 shard_server: cannot load the model: " in log
        assert "starting router" not in log
        assert took < 30, f"{took:.1f} s"
