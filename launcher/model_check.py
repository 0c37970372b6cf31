"""Checks a resolved model directory before anything is spawned (issue 27: faults at startup).

A truncated or corrupt safetensors file, a missing or unreadable tokenizer.json or
config.json, or a safetensors index naming a file that is not there would otherwise be
found by a shard after importing torch (or by the router after the shards loaded every
weight), as a traceback. Here each is one line naming the file, found in milliseconds:
only the JSON files and the safetensors headers are read, never the tensor data.

What this cannot see: tensor bytes that were overwritten in place (safetensors carries no
checksum), and a model_type the shard does not implement (the shard says so, naming
config.json, before it reads any weight).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

INDEX_NAME = "model.safetensors.index.json"
# safetensors refuses headers over 100 MB; so does this check, before reading one.
MAX_HEADER_BYTES = 100_000_000
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}


class ModelFilesError(RuntimeError):
    """A model file is missing, truncated or corrupt; the message names it."""


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ModelFilesError(f"{path}: missing; {what}")
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelFilesError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise ModelFilesError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def check_safetensors_header(path: Path) -> None:
    """Reads the header only: its length field, its JSON, and that the tensors it describes
    fill the rest of the file exactly (the checks `safe_open` makes, with the file named)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ModelFilesError(
                    f"{path}: truncated: {size} bytes, shorter than a safetensors header")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES:
                raise ModelFilesError(
                    f"{path}: corrupt: its header length field says {header_len} bytes "
                    "(not a safetensors file, or its first bytes are damaged)")
            if 8 + header_len > size:
                raise ModelFilesError(
                    f"{path}: truncated: the file is {size} bytes, shorter than its "
                    f"{header_len}-byte header")
            raw = f.read(header_len)
    except OSError as exc:
        raise ModelFilesError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelFilesError(f"{path}: corrupt header: not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ModelFilesError(f"{path}: corrupt header: not a JSON object")
    data_bytes = size - 8 - header_len
    end_of_data = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise ModelFilesError(
                f"{path}: corrupt header: tensor {name!r} has no valid dtype, shape and "
                "data_offsets") from None
        count = 1
        for dim in shape:
            count *= dim
        if end < begin or (dtype in _DTYPE_BYTES and end - begin != count * _DTYPE_BYTES[dtype]):
            raise ModelFilesError(
                f"{path}: corrupt header: tensor {name!r} ({dtype} {shape}) has data_offsets "
                f"[{begin}, {end}]")
        end_of_data = max(end_of_data, end)
    if end_of_data > data_bytes:
        raise ModelFilesError(
            f"{path}: truncated: its header describes {end_of_data} bytes of tensor data, the "
            f"file holds {data_bytes} ({size} bytes in all; download it again)")
    if end_of_data < data_bytes:
        raise ModelFilesError(
            f"{path}: corrupt: {data_bytes - end_of_data} bytes after the last tensor its "
            "header describes")


def check_model_files(model_dir: Path) -> None:
    """Raises ModelFilesError, naming the file, for the first fault found in `model_dir`."""
    config = _read_json(model_dir / "config.json", "every model needs a config.json")
    if not isinstance(config, dict):
        raise ModelFilesError(f"{model_dir / 'config.json'}: not a JSON object")
    _read_json(model_dir / "tokenizer.json",
               "textgen's router tokenizes with the model's tokenizer.json")
    index_path = model_dir / INDEX_NAME
    if index_path.exists():
        index = _read_json(index_path, "")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise ModelFilesError(f"{index_path}: has no weight_map object")
        for name in sorted(set(map(str, weight_map.values()))):
            if not (model_dir / name).is_file():
                raise ModelFilesError(
                    f"{index_path}: names {name}, which is missing from {model_dir}")
    for path in sorted(model_dir.glob("*.safetensors")):
        check_safetensors_header(path)
