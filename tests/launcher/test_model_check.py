"""The launcher's startup checks of a model directory (issue 27: faults at startup)."""

import json
import struct

import pytest
from fake_stack import write_fake_model

from launcher.model_check import ModelFilesError, check_model_files, check_safetensors_header


def _safetensors(path, tensors=(("w", "F32", [2, 3]),), pad=0, header=None):
    entries, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        size = 4 * shape[0] * shape[1]
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = header if header is not None else json.dumps(entries).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (offset + pad))
    return path


def test_a_valid_directory_passes(tmp_path):
    model = write_fake_model(tmp_path / "m")
    _safetensors(model / "model.safetensors", tensors=(("a", "F32", [2, 3]), ("b", "F32", [4, 1])))
    check_model_files(model)


def test_a_real_safetensors_file_passes(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 5, dtype=torch.bfloat16), "b": torch.ones(7)}, str(tmp_path / "x.safetensors"))
    check_safetensors_header(tmp_path / "x.safetensors")


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(p.read_bytes()[:-5]), "truncated: its header describes 24 bytes of tensor data, the file holds 19"),
    (lambda p: p.write_bytes(p.read_bytes()[:30]), "truncated: the file is 30 bytes, shorter than its"),
    (lambda p: p.write_bytes(b"\1\2\3"), "truncated: 3 bytes, shorter than a safetensors header"),
    (lambda p: p.write_bytes(b""), "truncated: 0 bytes"),
    (lambda p: p.write_bytes(b"\xff" * 64), "corrupt: its header length field says"),
    (lambda p: _safetensors(p, header=b'{"w": {"dtype": "F32", "sha'), "corrupt header: not valid JSON"),
    (lambda p: _safetensors(p, header=b"[1, 2]"), "corrupt header: not a JSON object"),
    (lambda p: _safetensors(p, header=b'{"w": {"dtype": "F32"}}'), "tensor 'w' has no valid dtype, shape and data_offsets"),
    (lambda p: _safetensors(p, header=b'{"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 8]}}'),
     "tensor 'w' (F32 [2, 3]) has data_offsets [0, 8]"),
    (lambda p: _safetensors(p, pad=3), "corrupt: 3 bytes after the last tensor"),
])
def test_damaged_safetensors_are_named(tmp_path, damage, message):
    model = write_fake_model(tmp_path / "m")
    weights = _safetensors(model / "model.safetensors")
    damage(weights)
    with pytest.raises(ModelFilesError) as raised:
        check_model_files(model)
    assert str(raised.value).startswith(f"{weights}: "), raised.value
    assert message in str(raised.value)


def test_missing_tokenizer_is_named(tmp_path):
    model = write_fake_model(tmp_path / "m")
    (model / "tokenizer.json").unlink()
    with pytest.raises(ModelFilesError, match="tokenizer.json: missing"):
        check_model_files(model)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_json_files_that_do_not_parse_are_named(tmp_path, name):
    model = write_fake_model(tmp_path / "m")
    (model / name).write_bytes(b'{"model_type": "lla')
    with pytest.raises(ModelFilesError, match=f"{name}: not valid JSON"):
        check_model_files(model)


def test_an_index_naming_a_missing_file_is_named(tmp_path):
    model = write_fake_model(tmp_path / "m")
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ModelFilesError, match="index.json: names model-00002-of-00002.safetensors, which is missing"):
        check_model_files(model)
