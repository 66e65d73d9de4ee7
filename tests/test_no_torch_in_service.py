"""The serving side never imports torch or transformers (checked in a fresh interpreter)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import bertserve.service as service

ROOT = Path(__file__).resolve().parent.parent


def test_service_modules_import_without_torch_or_transformers():
    modules = sorted(
        m.name
        for m in pkgutil.walk_packages(service.__path__, prefix="bertserve.service.")
        if "_pb2" not in m.name
    )
    assert "bertserve.service.supervisor.server" in modules and "bertserve.service.engine.batcher" in modules
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "import bertserve.cli, bertserve.manifest, bertserve.v1.inference_pb2_grpc\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'onnx', 'onnxscript') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"service imports {result.stdout.strip()}"
