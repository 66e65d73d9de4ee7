"""Bad input across every RPC (bertserve.v1 Embed, FillMask, Classify, Tokenize, Info; KServe v2 ModelInfer,
ModelMetadata): each case gets the right status and a message naming the field and the limit, never
INTERNAL or UNKNOWN, and the server stays SERVING.

Control characters: C0 controls other than tab, line feed and carriage return, and DEL, are refused with
INVALID_ARGUMENT naming the input and the code point (text-embeddings-inference accepts them; a control
character in an embedding request is far more often a client bug, e.g. a binary file sent as text, than
meaning). An over-size message gets RESOURCE_EXHAUSTED with both sizes: what gRPC itself answers, as its
status-code guide prescribes for a request larger than the server's limit (`max_message_bytes`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.message import Message

from bertserve.client import Client
from bertserve.kserve import open_inference_pb2 as kpb
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerThread, metric, scrape

MAX_INPUTS = 4
MAX_CHARS = 500
MAX_MASKS = 2
MAX_MESSAGE_BYTES = 64 * 1024
TINY_MAX_LENGTH = 72
TINY_VOCAB = 777
LONG_TEXT = "the cat sat on the mat " * 20  # 120 words: more than 72 tokens, fewer than 500 characters

V1 = "/bertserve.v1.Inference/"
KSERVE = "/inference.GRPCInferenceService/"
HEALTH = "/grpc.health.v1.Health/"
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@dataclass(frozen=True)
class Case:
    id: str
    method: str  # full method path
    request: Message | bytes
    code: grpc.StatusCode
    needles: tuple[str, ...]  # each must appear in the status message


def infer(
    texts: list[bytes] | None = None,
    *,
    model="tiny-embed",
    shape=None,
    datatype="BYTES",
    outputs=(),
    **params,
) -> kpb.ModelInferRequest:
    request = kpb.ModelInferRequest(model_name=model)
    if texts is not None:
        tensor = request.inputs.add(name="text", datatype=datatype, shape=shape or [len(texts)])
        tensor.contents.bytes_contents.extend(texts)
    for name in outputs:
        request.outputs.add(name=name)
    for name, value in params.items():
        if isinstance(value, bool):
            request.parameters[name].bool_param = value
        elif isinstance(value, int):
            request.parameters[name].int64_param = value
        else:
            request.parameters[name].string_param = value
    return request


def _cases() -> list[Case]:
    E, F, C, T = pb.EmbedRequest, pb.FillMaskRequest, pb.ClassifyRequest, pb.TokenizeRequest
    over_size = E(inputs=["a " * (MAX_MESSAGE_BYTES // 2 + 1000)])
    return [
        # --- Embed
        Case("embed/no inputs", V1 + "Embed", E(), INVALID, ("inputs", "at least one")),
        Case("embed/empty text", V1 + "Embed", E(inputs=[""]), INVALID, ("inputs[0]", "empty")),
        Case("embed/whitespace only", V1 + "Embed", E(inputs=["ok", " \t\n "]), INVALID, ("inputs[1]",)),
        Case(
            "embed/too many inputs",
            V1 + "Embed",
            E(inputs=["a"] * (MAX_INPUTS + 1)),
            INVALID,
            ("inputs", f"max_inputs_per_request {MAX_INPUTS}"),
        ),
        Case(
            "embed/too many characters",
            V1 + "Embed",
            E(inputs=["a" * (MAX_CHARS + 1)]),
            INVALID,
            ("inputs[0]", f"max_input_chars {MAX_CHARS}"),
        ),
        Case(
            "embed/too long, truncate off",
            V1 + "Embed",
            E(inputs=["a", LONG_TEXT]),
            INVALID,
            ("inputs[1]", f"max_length {TINY_MAX_LENGTH}", "truncate"),
        ),
        Case("embed/NUL", V1 + "Embed", E(inputs=["a\x00b"]), INVALID, ("inputs[0]", "U+0000")),
        Case("embed/escape", V1 + "Embed", E(inputs=["\x1b[31m red"]), INVALID, ("inputs[0]", "U+001B")),
        Case("embed/DEL", V1 + "Embed", E(inputs=["ok", "x\x7f"]), INVALID, ("inputs[1]", "U+007F")),
        Case(
            "embed/unknown model",
            V1 + "Embed",
            E(inputs=["a"], model="nope"),
            grpc.StatusCode.NOT_FOUND,
            ("model", "nope"),
        ),
        Case(
            "embed/model is a relative path",
            V1 + "Embed",
            E(inputs=["a"], model="../tiny-embed/1"),
            grpc.StatusCode.NOT_FOUND,
            ("model", "../tiny-embed/1"),
        ),
        Case(
            "embed/model is an absolute path",
            V1 + "Embed",
            E(inputs=["a"], model="/etc/passwd"),
            grpc.StatusCode.NOT_FOUND,
            ("model", "/etc/passwd"),
        ),
        Case(
            "embed/invalid UTF-8",
            V1 + "Embed",
            b"\x0a\x03a\xff\xfe",
            INVALID,
            ("request", "bertserve.v1.EmbedRequest", "UTF-8"),
        ),
        Case(
            "embed/not protobuf", V1 + "Embed", b"\xff\xff\xff\xff", INVALID, ("bertserve.v1.EmbedRequest",)
        ),
        Case(
            "embed/message over the size limit",
            V1 + "Embed",
            over_size,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            (f"vs. {MAX_MESSAGE_BYTES}", str(over_size.ByteSize())),
        ),
        # --- FillMask
        Case("fill_mask/no inputs", V1 + "FillMask", F(model="tiny-mlm"), INVALID, ("inputs",)),
        Case("fill_mask/no mask", V1 + "FillMask", F(inputs=["no mask"]), INVALID, ("inputs[0]", "[MASK]")),
        Case(
            "fill_mask/too many masks",
            V1 + "FillMask",
            F(inputs=["[MASK] " * (MAX_MASKS + 1)]),
            INVALID,
            ("inputs[0]", f"max_masks_per_input {MAX_MASKS}"),
        ),
        Case(
            "fill_mask/top_k 0",
            V1 + "FillMask",
            F(inputs=["a [MASK]"], top_k=0),
            INVALID,
            ("top_k", "at least 1"),
        ),
        Case(
            "fill_mask/top_k beyond the vocabulary",
            V1 + "FillMask",
            F(inputs=["a [MASK]"], top_k=TINY_VOCAB + 1),
            INVALID,
            ("top_k", f"{TINY_VOCAB + 1} is more than the vocabulary size"),
        ),
        Case(
            "fill_mask/top_k 2**32-1",
            V1 + "FillMask",
            F(inputs=["a [MASK]"], top_k=2**32 - 1),
            INVALID,
            ("top_k", "vocabulary size"),
        ),
        Case(
            "fill_mask/mask cut by truncation",
            V1 + "FillMask",
            F(inputs=[LONG_TEXT + " [MASK]"], truncate=True),
            INVALID,
            ("inputs[0]", "[MASK]", "after truncation"),
        ),
        Case(
            "fill_mask/response over the size limit",
            V1 + "FillMask",
            F(inputs=["the [MASK] sat on the [MASK]"] * MAX_INPUTS, top_k=TINY_VOCAB - 1),
            INVALID,
            ("top_k", f"max_message_bytes {MAX_MESSAGE_BYTES}"),
        ),
        Case(
            "fill_mask/model without the head",
            V1 + "FillMask",
            F(inputs=["a [MASK]"], model="tiny-embed"),
            grpc.StatusCode.FAILED_PRECONDITION,
            ("tiny-embed", "fill_mask"),
        ),
        # --- Classify
        Case("classify/top_k 0", V1 + "Classify", C(inputs=["a"], top_k=0), INVALID, ("top_k", "at least 1")),
        Case(
            "classify/top_k beyond the labels",
            V1 + "Classify",
            C(inputs=["a"], top_k=4),
            INVALID,
            ("top_k", "number of labels 3"),
        ),
        Case(
            "classify/model without the head",
            V1 + "Classify",
            C(inputs=["a"], model="tiny-mlm"),
            grpc.StatusCode.FAILED_PRECONDITION,
            ("tiny-mlm", "classify"),
        ),
        Case(
            "classify/too long, truncate off",
            V1 + "Classify",
            C(inputs=[LONG_TEXT]),
            INVALID,
            ("inputs[0]", f"max_length {TINY_MAX_LENGTH}"),
        ),
        Case("classify/backspace", V1 + "Classify", C(inputs=["a\bb"]), INVALID, ("inputs[0]", "U+0008")),
        # --- Tokenize
        Case("tokenize/no inputs", V1 + "Tokenize", T(), INVALID, ("inputs", "at least one")),
        Case(
            "tokenize/unknown model",
            V1 + "Tokenize",
            T(inputs=["a"], model="tiny-embed:1"),
            grpc.StatusCode.NOT_FOUND,
            ("model", "tiny-embed:1"),
        ),
        Case(
            "tokenize/too long, truncate off",
            V1 + "Tokenize",
            T(inputs=[LONG_TEXT]),
            INVALID,
            ("inputs[0]", f"max_length {TINY_MAX_LENGTH}"),
        ),
        Case(
            "tokenize/vertical tab", V1 + "Tokenize", T(inputs=["a\x0bb"]), INVALID, ("inputs[0]", "U+000B")
        ),
        # --- Info
        Case("info/not protobuf", V1 + "Info", b"\x0a\xff", INVALID, ("bertserve.v1.InfoRequest",)),
        # --- KServe v2 ModelInfer / ModelMetadata
        Case(
            "kserve/no model name",
            KSERVE + "ModelInfer",
            infer([b"a"], model=""),
            INVALID,
            ("model_name", "required"),
        ),
        Case(
            "kserve/unknown model",
            KSERVE + "ModelInfer",
            infer([b"a"], model="nope"),
            grpc.StatusCode.NOT_FOUND,
            ("model", "nope"),
        ),
        Case(
            "kserve/model is a path",
            KSERVE + "ModelInfer",
            infer([b"a"], model="../../../../etc/passwd"),
            grpc.StatusCode.NOT_FOUND,
            ("model", "etc/passwd"),
        ),
        Case("kserve/no input tensor", KSERVE + "ModelInfer", infer(None), INVALID, ("inputs", "'text'")),
        Case(
            "kserve/wrong datatype",
            KSERVE + "ModelInfer",
            infer([b"a"], datatype="INT64"),
            INVALID,
            ("inputs['text'].datatype", "BYTES"),
        ),
        Case(
            "kserve/too many inputs",
            KSERVE + "ModelInfer",
            infer([b"a"] * (MAX_INPUTS + 1)),
            INVALID,
            ("inputs['text'].shape", f"max_inputs_per_request {MAX_INPUTS}"),
        ),
        Case(
            "kserve/shape [0]",
            KSERVE + "ModelInfer",
            infer([], shape=[0]),
            INVALID,
            ("inputs['text'].shape", "at least one"),
        ),
        Case(
            "kserve/shape [-7]",
            KSERVE + "ModelInfer",
            infer([b"a"], shape=[-7]),
            INVALID,
            ("inputs['text'].shape", "at least one"),
        ),
        Case(
            "kserve/shape 2**62",
            KSERVE + "ModelInfer",
            infer([b"a"], shape=[2**62]),
            INVALID,
            ("inputs['text'].shape", "max_inputs_per_request"),
        ),
        Case(
            "kserve/shape and elements disagree",
            KSERVE + "ModelInfer",
            infer([b"a"], shape=[2]),
            INVALID,
            ("inputs['text']", "needs 2 elements"),
        ),
        Case(
            "kserve/invalid UTF-8",
            KSERVE + "ModelInfer",
            infer([b"ok", b"\xc3("]),
            INVALID,
            ("inputs['text'][1]", "UTF-8"),
        ),
        Case("kserve/empty text", KSERVE + "ModelInfer", infer([b""]), INVALID, ("inputs[0]", "empty")),
        Case("kserve/NUL", KSERVE + "ModelInfer", infer([b"a\x00"]), INVALID, ("inputs[0]", "U+0000")),
        Case(
            "kserve/too long, truncate off",
            KSERVE + "ModelInfer",
            infer([LONG_TEXT.encode()]),
            INVALID,
            ("inputs[0]", f"max_length {TINY_MAX_LENGTH}"),
        ),
        Case(
            "kserve/output the model lacks",
            KSERVE + "ModelInfer",
            infer([b"a"], outputs=["labels"]),
            INVALID,
            ("outputs[0].name", "labels"),
        ),
        Case(
            "kserve/parameter of the wrong type",
            KSERVE + "ModelInfer",
            infer([b"a"], truncate="yes"),
            INVALID,
            ("parameters['truncate']", "bool_param"),
        ),
        Case(
            "kserve/two masks in one input",
            KSERVE + "ModelInfer",
            infer([b"[MASK] and [MASK]"], model="tiny-mlm", outputs=["mask_tokens"]),
            INVALID,
            ("inputs['text'][0]", "exactly one"),
        ),
        Case(
            "kserve/top_k 0",
            KSERVE + "ModelInfer",
            infer([b"a [MASK]"], model="tiny-mlm", outputs=["mask_scores"], top_k=0),
            INVALID,
            ("parameters['top_k']", "at least 1"),
        ),
        Case(
            "kserve/fill-mask response over the size limit",
            KSERVE + "ModelInfer",
            infer(
                [b"a [MASK] cat"] * MAX_INPUTS,
                model="tiny-mlm",
                outputs=["mask_sequences"],
                top_k=TINY_VOCAB - 1,
            ),
            INVALID,
            ("top_k", f"max_message_bytes {MAX_MESSAGE_BYTES}"),
        ),
        Case(
            "kserve/not protobuf",
            KSERVE + "ModelInfer",
            b"\x12\xff\xff\xff",
            INVALID,
            ("inference.ModelInferRequest",),
        ),
        Case(
            "kserve/metadata of an unknown version",
            KSERVE + "ModelMetadata",
            kpb.ModelMetadataRequest(name="tiny-embed", version="../2"),
            grpc.StatusCode.NOT_FOUND,
            ("version", "'../2'"),
        ),
        Case(
            "kserve/probe not protobuf",
            KSERVE + "ServerLive",
            b"\xff",
            INVALID,
            ("inference.ServerLiveRequest",),
        ),
        # --- grpc.health.v1
        Case(
            "health/not protobuf",
            HEALTH + "Check",
            b"\x0a\xff",
            INVALID,
            ("grpc.health.v1.HealthCheckRequest",),
        ),
    ]


CASES = _cases()


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(
        model_repo=tiny_repo,
        max_inputs_per_request=MAX_INPUTS,
        max_input_chars=MAX_CHARS,
        max_masks_per_input=MAX_MASKS,
        max_message_bytes=MAX_MESSAGE_BYTES,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as opened:
        yield opened


def call(channel: grpc.Channel, method: str, request: Message | bytes) -> bytes:
    data = request if isinstance(request, bytes) else request.SerializeToString()
    return channel.unary_unary(method)(data, timeout=30)


def test_the_table_is_large_and_spans_every_rpc():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)
    methods = {c.method.rsplit("/", 1)[1] for c in CASES}
    assert {"Embed", "FillMask", "Classify", "Tokenize", "Info", "ModelInfer"} <= methods


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_with_the_field_and_the_limit(channel, case):
    with pytest.raises(grpc.RpcError) as failure:
        call(channel, case.method, case.request)
    code, details = failure.value.code(), failure.value.details()
    assert code is case.code, details
    for needle in case.needles:
        assert needle in details, (needle, details)


def test_health_watch_with_an_undecodable_request(channel):
    stream = channel.unary_stream(HEALTH + "Watch")(b"\x0a\xff", timeout=10)
    with pytest.raises(grpc.RpcError) as failure:
        next(stream)
    assert failure.value.code() is INVALID
    assert "grpc.health.v1.HealthCheckRequest" in failure.value.details()


def test_truncation_on_cuts_and_the_metadata_says_so(server):
    with Client(server.address, timeout=30) as client:
        for response in (
            client.embed(["a cat", LONG_TEXT], model="tiny-embed", truncate=True),
            client.classify(["a cat", LONG_TEXT], truncate=True),
            client.tokenize(["a cat", LONG_TEXT], truncate=True),
            client.fill_mask(["a [MASK]", "[MASK] " + LONG_TEXT], truncate=True),
        ):
            assert list(response.metadata.truncated) == [False, True]
            assert list(response.metadata.input_tokens)[1] == TINY_MAX_LENGTH


def test_limits_are_the_configured_ones(server):
    with Client(server.address, timeout=30) as client:
        limits = client.info().limits
    assert (limits.max_inputs_per_request, limits.max_input_chars, limits.max_message_bytes) == (
        MAX_INPUTS,
        MAX_CHARS,
        MAX_MESSAGE_BYTES,
    )


def test_a_path_as_model_name_reads_no_file(channel):
    """Model names are looked up among the loaded models only: naming a path opens nothing (Python's audit
    hook sees every open() by Python code in this process, the in-process server's included)."""
    opened: list[str] = []
    watching = [True]

    def hook(event: str, args: tuple) -> None:
        if watching[0] and event == "open" and isinstance(args[0], str):
            opened.append(args[0])

    sys.addaudithook(hook)  # cannot be removed; it goes quiet when `watching` is cleared
    try:
        for name in ("/etc/passwd", "../../etc/passwd", "tiny-embed/../../x", "~/.ssh/id_rsa"):
            for method, request in (
                (V1 + "Embed", pb.EmbedRequest(inputs=["a"], model=name)),
                (KSERVE + "ModelInfer", infer([b"a"], model=name)),
                (KSERVE + "ModelMetadata", kpb.ModelMetadataRequest(name=name)),
            ):
                with pytest.raises(grpc.RpcError) as failure:
                    call(channel, method, request)
                assert failure.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        watching[0] = False
    assert not [path for path in opened if "passwd" in path or "ssh" in path or ".." in path]


def test_after_every_bad_input_the_server_is_serving_and_never_said_internal(server):
    """Runs last in the module (pytest keeps file order): the whole table has been tried by now."""
    samples = scrape(server.metrics_url)
    for code in ("INTERNAL", "UNKNOWN"):
        assert metric(samples, "bertserve_requests_total", code=code) == 0
    assert metric(samples, "bertserve_requests_total", code="INVALID_ARGUMENT") >= 30
    with Client(server.address, timeout=30) as client:
        assert client.health() == "SERVING"
        assert len(client.embed(["still answering"]).vectors) == 1
