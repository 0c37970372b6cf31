"""Reads model weights from a directory of safetensors files, lazily and by slice.

Tensors are opened with `safe_open`, so a tensor-parallel rank can read just its rows or
columns (`get_slice`) without materialising the full tensor.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

INDEX_NAME = "model.safetensors.index.json"


class WeightsError(RuntimeError):
    pass


class WeightStore:
    """Maps tensor names to the safetensors file that holds them."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise WeightsError(f"no *.safetensors files in {self.model_dir}")
        self._stack = ExitStack()
        self._handles = [self._stack.enter_context(safe_open(str(f), "pt")) for f in files]
        self._where: dict[str, int] = {}
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

    def get(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def get_rows(self, name: str, start: int, end: int) -> torch.Tensor:
        """Slice [start, end) of dimension 0."""
        return self._handle(name).get_slice(name)[start:end]

    def get_cols(self, name: str, start: int, end: int) -> torch.Tensor:
        """Slice [start, end) of dimension 1."""
        return self._handle(name).get_slice(name)[:, start:end]


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise WeightsError(f"missing {path}") from None
