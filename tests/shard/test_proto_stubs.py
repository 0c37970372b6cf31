"""The committed gRPC stubs are exactly what `python -m shard_server.pb.regen` produces."""

from pathlib import Path

import shard_server.pb as pb_package
from shard_server.pb.regen import GRPCIO_FLOOR, STUB_NAMES, generate_stubs

COMMITTED = Path(pb_package.__file__).parent


def test_committed_stubs_match_a_fresh_regeneration(tmp_path):
    generate_stubs(tmp_path)
    for name in STUB_NAMES:
        fresh = (tmp_path / name).read_text()
        assert fresh == (COMMITTED / name).read_text(), (
            f"{name} drifted from proto/generate.proto; run `python -m shard_server.pb.regen`"
        )


def test_regen_fixes_import_and_version_floor(tmp_path):
    generate_stubs(tmp_path)
    grpc_module = (tmp_path / "generate_pb2_grpc.py").read_text()
    assert "from . import generate_pb2 as generate__pb2" in grpc_module
    assert f"GRPC_GENERATED_VERSION = '{GRPCIO_FLOOR}'" in grpc_module
