"""Regenerate the gRPC stubs of `proto/generate.proto` into this package.

Usage: ``python -m shard_server.pb.regen [--out DIR]`` (default: this folder).

Generated code is never edited by hand; the two fixes it needs are applied here:

* protoc writes ``import generate_pb2`` in the grpc module; inside a package the import
  must be relative.
* grpcio-tools stamps its own version as the minimum grpcio the stubs accept. The GPU
  machine runs grpcio 1.84.0, so the stamp is pinned to ``GRPCIO_FLOOR`` (the stub API does
  not change between patch releases).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

GRPCIO_FLOOR = "1.84.0"
PROTO_NAME = "generate.proto"
STUB_NAMES = ("generate_pb2.py", "generate_pb2_grpc.py")


def default_proto_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "proto"


def _run_protoc(proto_dir: Path, out_dir: Path) -> None:
    from grpc_tools import protoc  # dev-only dependency

    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(proto_dir / PROTO_NAME),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {proto_dir / PROTO_NAME}")


def _fix_grpc_module(text: str) -> str:
    text = text.replace("import generate_pb2 as generate__pb2", "from . import generate_pb2 as generate__pb2")
    return re.sub(
        r"GRPC_GENERATED_VERSION = '[^']*'",
        f"GRPC_GENERATED_VERSION = '{GRPCIO_FLOOR}'",
        text,
    )


def generate_stubs(out_dir: Path, proto_dir: Path | None = None) -> list[Path]:
    """Writes the stubs into `out_dir` and returns their paths."""
    proto_dir = proto_dir or default_proto_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as raw:
        raw_dir = Path(raw)
        _run_protoc(proto_dir, raw_dir)
        written = []
        for name in STUB_NAMES:
            text = (raw_dir / name).read_text()
            if name.endswith("_grpc.py"):
                text = _fix_grpc_module(text)
            target = out_dir / name
            target.write_text(text)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--proto-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    for path in generate_stubs(args.out, args.proto_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
