import logging
import os
from pathlib import Path

import pytest
import torch

# Without a GPU the triton attention kernels run through Triton's interpreter, which Triton
# switches on only if this is set before its first import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .tiny_models import FAMILIES, make_tiny_model

logging.getLogger("transformers").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    dirs = {}
    for family in FAMILIES:
        directory = tmp_path_factory.mktemp(family)
        make_tiny_model(family, directory)
        dirs[family] = directory
    return dirs


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(2)
