"""Generate the gRPC stubs from proto/ (used by setup.py and tools/gen_proto.py)."""

from __future__ import annotations

import os
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"


def generate_stubs(out_dir: Path) -> None:
    """Run protoc (from grpcio-tools) on every .proto under proto/ into out_dir."""
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {protos}")
