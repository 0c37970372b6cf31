"""Reads model weights from a directory of safetensors files, lazily and by slice.

Tensors are opened with `safe_open`, so a tensor-parallel rank can read just its rows or
columns (`get_slice`) without materialising the full tensor. The store counts the bytes it
materialises, so a rank can report (and tests can bound) how much of the model it read.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

INDEX_NAME = "model.safetensors.index.json"
_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U8": 1, "BOOL": 1,
}


class WeightsError(RuntimeError):
    pass


def _open(path: Path):
    try:
        return safe_open(str(path), "pt")
    except Exception as exc:  # SafetensorError, OSError: a truncated or corrupt file, named
        raise WeightsError(f"{path}: cannot be read as safetensors ({exc})") from None


class WeightStore:
    """Maps tensor names to the safetensors file that holds them."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise WeightsError(f"no *.safetensors files in {self.model_dir}")
        self._stack = ExitStack()
        self._handles = [self._stack.enter_context(_open(f)) for f in files]
        self._where: dict[str, int] = {}
        self.bytes_read = 0  # total bytes materialised by get/get_rows/get_cols
        self.largest_read = 0  # the biggest single tensor (slice) materialised
        for index, handle in enumerate(self._handles):
            for name in handle.keys():
                self._where[name] = index

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def _handle(self, name: str):
        try:
            return self._handles[self._where[name]]
        except KeyError:
            raise WeightsError(f"tensor {name!r} not found in {self.model_dir}") from None

    def _count(self, tensor: torch.Tensor) -> torch.Tensor:
        size = tensor.numel() * tensor.element_size()
        self.bytes_read += size
        self.largest_read = max(self.largest_read, size)
        return tensor

    def get(self, name: str) -> torch.Tensor:
        return self._count(self._handle(name).get_tensor(name))

    def get_rows(self, name: str, start: int, end: int) -> torch.Tensor:
        """Slice [start, end) of dimension 0."""
        return self._count(self._handle(name).get_slice(name)[start:end])

    def get_cols(self, name: str, start: int, end: int) -> torch.Tensor:
        """Slice [start, end) of dimension 1."""
        return self._count(self._handle(name).get_slice(name)[:, start:end])

    def header(self, name: str) -> tuple[str, tuple[int, ...]]:
        """A tensor's safetensors dtype ("I32", "F16", ...) and shape, read from the header only."""
        piece = self._handle(name).get_slice(name)
        return piece.get_dtype(), tuple(piece.get_shape())

    def total_bytes(self) -> int:
        """Size of every tensor in the store, read from the headers only."""
        total = 0
        for name, index in self._where.items():
            piece = self._handles[index].get_slice(name)
            count = 1
            for dim in piece.get_shape():
                count *= dim
            total += count * _DTYPE_BYTES[piece.get_dtype()]
        return total


# Older GPTQ and AWQ checkpoints declare their quantization in a file of its own (TGI reads them too).
_QUANT_FILES = (("quantize_config.json", "gptq"), ("quant_config.json", "awq"))


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise WeightsError(f"missing {path}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise WeightsError(f"{path}: not valid JSON ({exc})") from None
    for name, method in _QUANT_FILES:
        if not config.get("quantization_config") and (Path(model_dir) / name).is_file():
            config["quantization_config"] = {"quant_method": method, **json.loads((Path(model_dir) / name).read_text())}
    return config
