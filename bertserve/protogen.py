"""Regenerates the protobuf and gRPC Python code in `bertserve/v1/` and `bertserve/kserve/` from `protos/`.

    python -m bertserve.protogen            # rewrite bertserve/v1/ and bertserve/kserve/ *_pb2*.py(i)
    python -m bertserve.protogen --check    # exit 1 when the committed files differ from a fresh build

Needs grpcio-tools (the `dev` extra); the server itself only needs the generated files.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = Path("bertserve") / "v1"
KSERVE_PACKAGE_DIR = Path("bertserve") / "kserve"  # inference.GRPCInferenceService (Open Inference Protocol)
PACKAGE_DIRS = (PACKAGE_DIR, KSERVE_PACKAGE_DIR)  # protos/<dir>/*.proto -> <dir>/*_pb2*.py(i)
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    return sorted((PROTO_ROOT / package_dir).glob("*.proto"))


def generate(out_root: Path, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Runs protoc into `out_root` (which mirrors the repository root); returns the files written."""
    from grpc_tools import protoc  # imported here: only needed when regenerating

    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    protos = [str(p.relative_to(PROTO_ROOT)) for p in proto_files(package_dir)]
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / package_dir}")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in (out_root / package_dir).iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def differences(committed_root: Path = ROOT, package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Names of generated files that differ between `committed_root` and a fresh build (or are missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp), package_dir)}
        committed = {
            p.name: p for p in (committed_root / package_dir).iterdir() if p.name.endswith(GENERATED_SUFFIXES)
        }
        names = sorted(set(fresh) | set(committed))
        return [
            n
            for n in names
            if n not in fresh or n not in committed or not filecmp.cmp(fresh[n], committed[n], shallow=False)
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bertserve.protogen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        stale = [
            package_dir / name for package_dir in PACKAGE_DIRS for name in differences(ROOT, package_dir)
        ]
        for path in stale:
            print(f"stale generated file: {path}", file=sys.stderr)
        return 1 if stale else 0
    for package_dir in PACKAGE_DIRS:
        for path in generate(ROOT, package_dir):
            print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
