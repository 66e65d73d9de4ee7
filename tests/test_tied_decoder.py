"""One word-embedding table for the encoder and a tied MLM head, one tokenizer per tokenizer file.

`shared_repo`'s `tiny-shared-mlm` takes tiny-encoder's embeddings and ties its decoder to them, so its head is
exported tied (export/tied_decoder.py): the head graph takes the table as the input `decoder_weight`, the table
is stored once as a .npy, and the server hands the encoder sessions that same array. Fill-mask answers equal
those of the self-contained (untied) export of the same checkpoint.
"""

from __future__ import annotations

import shutil

import grpc
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bertserve.export import tied_decoder
from bertserve.export.pipeline import export_model
from bertserve.repository import DECODER_WEIGHT, ENCODER, ENCODER_ATTENTIONS, Manifest
from bertserve.service.engine.repository import discover
from bertserve.service.errors import StartupError
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.conftest import SHARED_ENCODER, SHARED_HEADS
from tests.helpers.server import ServerThread

MLM, CLASSIFIER = "tiny-shared-mlm", "tiny-shared-classifier"
UNTIED = "tiny-untied-mlm"
TEXTS = ["the [MASK] sat on the mat", "a [MASK] bird [MASK] over the house", "[MASK]"]


def _table_sized(graph: onnx.ModelProto, shape: list[int]) -> list[str]:
    return [i.name for i in graph.graph.initializer if list(i.dims) == shape]


def test_the_tied_head_holds_no_table_and_names_the_encoder_initializers(shared_repo):
    head_dir, encoder_dir = shared_repo / MLM / "1", shared_repo / SHARED_ENCODER / "1"
    tied = Manifest.read(head_dir).tasks.fill_mask.tied_decoder
    assert tied is not None and tied.input == DECODER_WEIGHT
    # fp32 graphs hold the same table; int8 (quantized) and fp16 do not, so they are not named
    assert sorted(tied.encoder_initializers) == [ENCODER, ENCODER_ATTENTIONS]
    head = onnx.load(str(head_dir / "mlm_head.onnx"))
    assert _table_sized(head, tied.shape) == []
    assert DECODER_WEIGHT in [i.name for i in head.graph.input]
    table = np.load(head_dir / tied.file)
    for key, name in tied.encoder_initializers.items():
        encoder = onnx.load(str(encoder_dir / f"{key}.onnx"))
        (initializer,) = [i for i in encoder.graph.initializer if i.name == name]
        assert numpy_helper.to_array(initializer).tobytes() == table.tobytes()


def test_a_model_with_its_own_encoder_ties_its_head_to_that_encoder(tiny_repo):
    """tiny-mlm (no --encoder): the head takes the table its own fp32 encoder graphs hold."""
    directory = tiny_repo / "tiny-mlm" / "1"
    tied = Manifest.read(directory).tasks.fill_mask.tied_decoder
    assert tied is not None and sorted(tied.encoder_initializers) == [ENCODER, ENCODER_ATTENTIONS]
    assert _table_sized(onnx.load(str(directory / "mlm_head.onnx")), tied.shape) == []
    table = np.load(directory / tied.file)
    for key, name in tied.encoder_initializers.items():
        (initializer,) = [
            i for i in onnx.load(str(directory / f"{key}.onnx")).graph.initializer if i.name == name
        ]
        assert numpy_helper.to_array(initializer).tobytes() == table.tobytes()


@pytest.fixture(scope="module")
def tied_and_untied_repo(shared_repo, make_tiny_checkpoint, tmp_path_factory):
    """shared_repo's models, plus the MLM checkpoint exported again as a self-contained head."""
    repo = tmp_path_factory.mktemp("tied-untied") / "repo"
    for name in (SHARED_ENCODER, *SHARED_HEADS):
        shutil.copytree(shared_repo / name, repo / name)
    checkpoint = make_tiny_checkpoint(
        "BertForMaskedLM", seed=1, encoder_from=make_tiny_checkpoint("BertModel")
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tied_decoder, "plan", lambda checkpoint, shared: None)
        export_model(checkpoint, repo, name=UNTIED, version=1, encoder=SHARED_ENCODER, log=lambda _: None)
    assert Manifest.read(repo / UNTIED / "1").tasks.fill_mask.tied_decoder is None
    return repo


def test_fill_mask_equals_the_untied_head_and_the_process_holds_one_table(tied_and_untied_repo):
    with ServerThread(model_repo=tied_and_untied_repo, max_queue_delay_ms=0) as server:
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(server.address))
        answers = {
            name: stub.FillMask(pb.FillMaskRequest(inputs=TEXTS, model=name, top_k=10))
            for name in (MLM, UNTIED)
        }
        for tied, untied in zip(answers[MLM].results, answers[UNTIED].results, strict=True):
            for a, b in zip(tied.masks, untied.masks, strict=True):
                assert [c.token_id for c in a.candidates] == [c.token_id for c in b.candidates]
                scores = np.array([[c.score for c in a.candidates], [c.score for c in b.candidates]])
                assert np.abs(scores[0] - scores[1]).max() <= 1e-5

        registry = server.server.core.registry
        model = registry.by_name[MLM]
        table = model.mlm_head._constants[DECODER_WEIGHT]
        sessions = [model.encoder.session, model.attention.session]
        for graph in sessions:  # the encoder sessions read the head's table, not copies of their own
            (value,) = graph._initializers.values()
            assert value.data_ptr() == table.ctypes.data
        assert registry.by_name[UNTIED].mlm_head._constants == {}


def test_models_of_one_tokenizer_file_share_one_tokenizer(shared_repo):
    with ServerThread(model_repo=shared_repo) as server:
        by_name = server.server.core.registry.by_name
        assert by_name[MLM].tokenizer is by_name[SHARED_ENCODER].tokenizer is by_name[CLASSIFIER].tokenizer


def test_a_tampered_table_is_refused(shared_repo, tmp_path):
    repo = tmp_path / "repo"
    for name in (SHARED_ENCODER, MLM):
        shutil.copytree(shared_repo / name, repo / name)
    path = repo / MLM / "1" / "decoder_weight.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(StartupError, match="decoder_weight.npy: sha256"):
        discover(repo, [(MLM, 1)], "fp32")
