"""The Attention RPC against transformers' output_attentions (eager attention), its errors and default
model, and `bertserve attention` drawing a PNG."""

from __future__ import annotations

import shutil
import struct
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch
import transformers

from bertserve.cli import main
from bertserve.client import Client
from bertserve.manifest import ENCODER_ATTENTIONS, Manifest
from bertserve.service.engine.attention import check_response_size
from tests.helpers.checkpoints import load_reference
from tests.helpers.server import ServerThread

TEXT = "paris is the capital of a dog, and the cat sat on the mat."
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def attention_repo(tiny_repo, tmp_path_factory):
    """tiny-embed (with encoder_attentions) and plain-embed, the same model without that graph. plain-embed
    sorts first, so it is the default for Embed while tiny-embed must still be the default for Attention."""
    repo = tmp_path_factory.mktemp("attention-repo")
    shutil.copytree(tiny_repo / "tiny-embed", repo / "tiny-embed")
    plain = repo / "plain-embed" / "1"
    shutil.copytree(tiny_repo / "tiny-embed" / "1", plain)
    manifest = Manifest.read(plain)
    (plain / manifest.graphs[ENCODER_ATTENTIONS].file).unlink()
    graphs = {k: v for k, v in manifest.graphs.items() if k != ENCODER_ATTENTIONS}
    manifest.model_copy(update={"name": "plain-embed", "graphs": graphs}).write(plain)
    return repo


@pytest.fixture(scope="module")
def server(attention_repo):
    with ServerThread(model_repo=attention_repo) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address, timeout=30) as c:
        yield c


def reference_attentions(checkpoint, text: str) -> tuple[np.ndarray, list[str]]:
    """transformers' own attentions (eager), (layers, heads, T, T), and its tokens."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = load_reference(checkpoint)
    assert model.config._attn_implementation == "eager"
    batch = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    return torch.stack(out.attentions)[:, 0].numpy(), tokens


def as_array(response) -> np.ndarray:
    n = response.sequence_length
    return np.array([np.asarray(m.probabilities).reshape(n, n) for m in response.maps])


def test_attention_equals_transformers_output_attentions(client, make_tiny_checkpoint):
    expected, tokens = reference_attentions(make_tiny_checkpoint("BertModel"), TEXT)  # (L, H, T, T)
    response = client.attention(TEXT, model="tiny-embed")
    layers, heads, length = expected.shape[:3]
    assert (response.num_layers, response.num_heads, response.sequence_length) == (layers, heads, length)
    assert [t.text for t in response.tokens] == tokens
    assert [(m.layer, m.head) for m in response.maps] == [(i, j) for i in range(layers) for j in range(heads)]
    got = as_array(response).reshape(layers, heads, length, length)
    assert np.abs(got - expected).max() <= 1e-4
    assert np.abs(got.sum(-1) - 1).max() <= 1e-5  # every row is a distribution over the key tokens
    assert got.min() >= 0
    meta = response.metadata
    assert meta.model == "tiny-embed" and meta.model_version == 1 and meta.batches == 1
    assert list(meta.input_tokens) == [length] and list(meta.truncated) == [False]
    assert meta.inference_time_ms > 0


def test_selected_layers_and_heads_in_request_order(client):
    full = client.attention(TEXT, model="tiny-embed")
    some = client.attention(TEXT, model="tiny-embed", layers=[1, 0], heads=[2])
    assert [(m.layer, m.head) for m in some.maps] == [(1, 2), (0, 2)]
    for layer, head in ((1, 2), (0, 2)):
        assert np.array_equal(some.matrix(layer, head), full.matrix(layer, head))


def test_default_model_and_info(client):
    info = {m.name: m for m in client.info().models}
    assert "attention" in info["tiny-embed"].tasks and "Attention" in info["tiny-embed"].default_for
    assert "attention" not in info["plain-embed"].tasks and "Attention" not in info["plain-embed"].default_for
    assert "Embed" in info["plain-embed"].default_for  # first by name; Attention skips it
    assert client.attention("the cat").metadata.model == "tiny-embed"


@pytest.mark.parametrize(
    ("kwargs", "code", "needles"),
    [
        (
            {"model": "plain-embed"},
            grpc.StatusCode.FAILED_PRECONDITION,
            ["plain-embed", "encoder_attentions"],
        ),
        ({"model": "no-such-model"}, grpc.StatusCode.NOT_FOUND, ["no-such-model"]),
        ({"layers": [2]}, grpc.StatusCode.INVALID_ARGUMENT, ["layers[0]", "2 layers", "0 to 1"]),
        ({"heads": [0, 3]}, grpc.StatusCode.INVALID_ARGUMENT, ["heads[1]", "3 heads", "0 to 2"]),
        ({"layers": [1, 1]}, grpc.StatusCode.INVALID_ARGUMENT, ["layers[1]", "twice"]),
    ],
)
def test_errors_name_the_field_and_limit(client, kwargs, code, needles):
    with pytest.raises(grpc.RpcError) as failure:
        client.attention("the cat", **kwargs)
    assert failure.value.code() is code, failure.value.details()
    for needle in needles:
        assert needle in failure.value.details()


def test_bad_input_and_length(client):
    cases = [("  ", "input: empty"), (" ".join(["cat"] * 100), "max_length")]
    for text, needle in cases:
        with pytest.raises(grpc.RpcError) as failure:
            client.attention(text)
        assert failure.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert needle in failure.value.details()
    cut = client.attention(" ".join(["cat"] * 100), truncate=True, layers=[0], heads=[0])
    assert list(cut.metadata.truncated) == [True] and cut.sequence_length == 72


def test_response_size_is_checked_before_compute():
    check_response_size(maps=1, length=256, max_message_bytes=8 << 20)
    with pytest.raises(Exception, match="max_message_bytes 8388608"):
        check_response_size(maps=72, length=256, max_message_bytes=8 << 20)  # MiniLM, all maps, 256 tokens


def test_attention_alongside_batched_calls(client):
    """Attention runs on the model's worker thread next to its batches: both kinds of call succeed."""
    with ThreadPoolExecutor(8) as pool:
        embeds = [pool.submit(client.embed, [TEXT] * 4, model="tiny-embed") for _ in range(8)]
        maps = [pool.submit(client.attention, TEXT, model="tiny-embed", layers=[1]) for _ in range(8)]
        first = as_array(maps[0].result())
        for future in maps:
            assert np.array_equal(as_array(future.result()), first)
        assert all(len(f.result().vectors) == 4 for f in embeds)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_cli_draws_a_png(server, tmp_path, capsys):
    out = tmp_path / "map.png"
    args = ["attention", TEXT, "--address", server.address, "--layer", "1", "--head", "2", "--out", str(out)]
    assert main(args) == 0
    width, height = png_size(out)
    assert width > 300 and height > 300
    import matplotlib.image

    pixels = matplotlib.image.imread(out)
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0  # an image, not a blank canvas
    printed = capsys.readouterr().out
    assert "tiny-embed v1: layer 1, head 2" in printed and "[CLS] ->" in printed


def test_cli_reports_server_errors(server, tmp_path, capsys):
    out = tmp_path / "map.png"
    args = [
        "attention",
        "a cat",
        "--address",
        server.address,
        "--layer",
        "9",
        "--head",
        "0",
        "--out",
        str(out),
    ]
    assert main(args) == 1
    assert "INVALID_ARGUMENT: layers[0]" in capsys.readouterr().err
    assert not out.exists()


def test_cli_prints_the_table_without_matplotlib_or_out(server, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    args = ["attention", TEXT, "--address", server.address, "--layer", "1", "--head", "2"]
    assert main(args) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "tiny-embed v1: layer 1, head 2" in printed and "[CLS] ->" in printed and "wrote" not in printed


def test_cli_without_matplotlib_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    out = tmp_path / "map.png"
    args = [
        "attention",
        "a cat",
        "--address",
        "127.0.0.1:1",
        "--layer",
        "0",
        "--head",
        "0",
        "--out",
        str(out),
    ]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "--out needs matplotlib" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_attention_calls_are_admitted_by_the_encoder_queue(attention_repo):
    """Attention waits in its encoder's queue (counted in queue_depth), at most max_queue_attention calls;
    beyond that RESOURCE_EXHAUSTED at once. The worker is held by a gated batch meanwhile."""
    import threading
    import time

    from bertserve.v1 import inference_pb2 as pb
    from tests.helpers.server import metric, scrape

    with ServerThread(model_repo=attention_repo, max_queue_attention=2) as server:
        (encoder,) = server.server.core.encoders  # tiny-embed and plain-embed hold byte-identical encoders
        batcher = encoder.batcher
        real, computing, release = batcher.runs.compute, threading.Event(), threading.Event()

        def gated(batch):
            computing.set()
            assert release.wait(30)
            return real(batch)

        batcher.runs.compute = gated
        with Client(server.address, timeout=30) as client:
            held = client.stub.Embed.future(pb.EmbedRequest(inputs=["hold"], model="tiny-embed"), timeout=30)
            assert computing.wait(30)
            request = pb.AttentionRequest(input="the cat sat", model="tiny-embed")
            queued = [client.stub.Attention.future(request, timeout=30) for _ in range(2)]
            deadline = time.monotonic() + 30
            while metric(scrape(server.metrics_url), "bertserve_queue_depth", model=encoder.name) < 2:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with pytest.raises(grpc.RpcError) as full:
                client.stub.Attention(request, timeout=30)
            assert full.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_queue_attention 2" in full.value.details()
            release.set()
            held.result()
            assert all(len(call.result().maps) == 2 * 3 for call in queued)  # 2 layers x 3 heads
        assert metric(scrape(server.metrics_url), "bertserve_queue_depth", model=encoder.name) == 0
