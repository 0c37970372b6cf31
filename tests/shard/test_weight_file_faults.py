"""The shard names the file when a checkpoint cannot be read (issue 27), behind the launcher's own check."""

import pytest
import torch
from safetensors.torch import save_file

from shard_server.weights import WeightsError, WeightStore, read_config


def test_a_truncated_safetensors_file_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(64, 64)}, str(path))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(WeightsError, match=f"^{path}: cannot be read as safetensors"):
        WeightStore(tmp_path)


def test_a_config_that_is_not_json_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": ')
    with pytest.raises(WeightsError, match=f"^{tmp_path / 'config.json'}: not valid JSON"):
        read_config(tmp_path)
