"""The committed generated code is exactly what `python -m bertserve.protogen` makes from protos/."""

from __future__ import annotations

import shutil

import pytest

from bertserve import protogen


def test_regenerating_gives_identical_files():
    assert protogen.differences() == []


def test_check_notices_a_stale_file(tmp_path):
    committed = tmp_path / protogen.PACKAGE_DIR
    shutil.copytree(protogen.ROOT / protogen.PACKAGE_DIR, committed)
    target = committed / "inference_pb2.py"
    target.write_text(target.read_text() + "\n# edited by hand\n")
    assert protogen.differences(tmp_path) == ["inference_pb2.py"]


@pytest.mark.parametrize("rpc", ["Embed", "FillMask", "Classify", "Tokenize", "Info"])
def test_service_has_rpc(rpc):
    from bertserve.v1 import inference_pb2

    service = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
    assert service.full_name == "bertserve.v1.Inference"
    assert rpc in service.methods_by_name
