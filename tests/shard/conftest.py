import logging
import os
from pathlib import Path

import pytest
import torch

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
    # Two at most, and no more than this process's CPUs (a pytest-xdist worker has its own).
    torch.set_num_threads(min(2, len(os.sched_getaffinity(0))))
