"""Generate Python protobuf/gRPC modules and typed stubs from proto/koi/v1/*.proto.

Runs grpcio-tools' protoc with mypy-protobuf's plugins, so ``libs/koi/v1/`` gets
``*_pb2.py``, ``*_pb2_grpc.py`` and ``.pyi`` stubs importable as ``koi.v1.<name>_pb2``,
plus an ``__init__.py``. The output is generated at set-up (``make proto``) and never
committed. This script holds no schema and no conversion logic (see ``koi.wire``).

Usage: ``python scripts/gen_protos.py`` (from anywhere; paths are relative to the repo).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
PROTO_DIR = PROTO_ROOT / "koi" / "v1"
OUT_ROOT = REPO / "libs"
OUT_DIR = OUT_ROOT / "koi" / "v1"
INIT_TEXT = '"""Generated from proto/koi/v1 by scripts/gen_protos.py; do not edit or commit."""\n'


def plugin(name: str) -> Path:
    """A protoc plugin installed next to the running interpreter (the venv's bin)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        sys.exit(f"gen_protos: {path} not found; install mypy-protobuf into this venv")
    return path


def main() -> int:
    from grpc_tools import protoc  # dev dependency; imported here so --help stays cheap

    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        print(f"gen_protos: no .proto files in {PROTO_DIR}", file=sys.stderr)
        return 1
    # Start clean so a deleted .proto leaves no stale module behind.
    shutil.rmtree(OUT_DIR, ignore_errors=True)
    OUT_DIR.mkdir(parents=True)
    well_known = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={OUT_ROOT}",
        f"--grpc_python_out={OUT_ROOT}",
        f"--mypy_out={OUT_ROOT}",
        f"--mypy_grpc_out={OUT_ROOT}",
        *(str(p.relative_to(PROTO_ROOT)) for p in protos),
    ]
    # protoc prints its own diagnostics (file:line: message) to stderr.
    rc = protoc.main(args)
    if rc != 0:
        shutil.rmtree(OUT_DIR, ignore_errors=True)
        print(f"gen_protos: protoc failed (exit {rc}); see the messages above",
              file=sys.stderr)
        return rc
    (OUT_DIR / "__init__.py").write_text(INIT_TEXT)
    print(f"gen_protos: {len(protos)} protos -> {OUT_DIR.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
