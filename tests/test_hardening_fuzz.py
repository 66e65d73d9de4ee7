"""Fuzz: hypothesis-generated requests for every RPC of bertserve.v1.Inference and
inference.GRPCInferenceService (KServe v2), and grpc.health.v1 Check, against a live server. Three kinds:
messages built from each request type's descriptor (random unicode and control characters, names the
server knows mixed with random ones, integers at and beyond their limits, nested tensors and parameters)
with near-valid ones that reach the models, random bytes sent as the serialized request, and valid
requests with bytes flipped, cut or inserted. Every answer must be OK or a refusal the caller can act on:
never INTERNAL, UNKNOWN, or a timeout; the server stays SERVING.

The examples per RPC are bounded (`STRUCTURED_EXAMPLES`, `BYTES_EXAMPLES`): about 680 requests, under 20 s.
"""

from __future__ import annotations

from collections import Counter

import grpc
import pytest
from google.protobuf import descriptor, message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertserve.client import Client
from bertserve.kserve import open_inference_pb2 as kpb
from bertserve.service.grpc.servicer import RESPONSE_TYPES
from bertserve.service.kserve.tensors import encode_bytes_elements
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerThread, metric, scrape

STRUCTURED_EXAMPLES = 40
BYTES_EXAMPLES = 20
ACCEPTABLE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# Strings the server gives meaning to, so generated requests get past the first checks often.
KNOWN_STRINGS = [
    "",
    "tiny-embed",
    "tiny-mlm",
    "tiny-classifier",
    "1",
    "2",
    "text",
    "BYTES",
    "INT64",
    "FP32",
    "embedding",
    "labels",
    "label_scores",
    "mask_tokens",
    "mask_scores",
    "mask_sequences",
    "truncate",
    "top_k",
    "normalize",
    "raw_scores",
    "classification",
    "the cat sat on the [MASK]",
    "[MASK] [MASK] [MASK]",
    "a " * 120,
    "../tiny-embed",
    "/etc/passwd",
    "\x00",
    "\u200b",
    "\U0001f600" * 30,
]
TEXT = st.one_of(
    st.sampled_from(KNOWN_STRINGS),
    st.text(max_size=60),  # any unicode (no surrogates: protobuf strings are UTF-8), control characters too
    st.lists(st.sampled_from(["a", " ", "cat ", "[MASK]", "\t", "\x01", "é", "中"]), max_size=150).map(
        "".join
    ),
)
BYTES = st.one_of(
    st.binary(max_size=64),
    st.lists(TEXT.map(str.encode), max_size=5).map(encode_bytes_elements),  # KServe raw BYTES contents
)
INTEGER_RANGES = {
    descriptor.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    descriptor.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    descriptor.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    descriptor.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in (0, 1, 2, 3, 5, -1, low, high, 777, 778) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy:
    kind = field.type
    if kind == descriptor.FieldDescriptor.TYPE_STRING:
        return TEXT
    if kind == descriptor.FieldDescriptor.TYPE_BYTES:
        return BYTES
    if kind == descriptor.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in INTEGER_RANGES:
        return _integers(*INTEGER_RANGES[kind])
    if kind in (descriptor.FieldDescriptor.TYPE_FLOAT, descriptor.FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if kind == descriptor.FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    raise NotImplementedError(f"no strategy for field {field.full_name} of type {kind}")


def message_strategy(message_descriptor: descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy:
    """Messages of this type with any subset of fields set to generated values (nested up to depth 3)."""
    cls = message_factory.GetMessageClass(message_descriptor)
    if depth > 3:
        return st.just(cls())
    fields = {}
    for field in message_descriptor.fields:
        if field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                key, value = (
                    field.message_type.fields_by_name["key"],
                    field.message_type.fields_by_name["value"],
                )
                value_strategy = (
                    message_strategy(value.message_type, depth + 1)
                    if value.type == descriptor.FieldDescriptor.TYPE_MESSAGE
                    else _scalar(value)
                )
                fields[field.name] = st.dictionaries(_scalar(key), value_strategy, max_size=3)
                continue
            element = message_strategy(field.message_type, depth + 1)
        else:
            element = _scalar(field)
        repeated = field.is_repeated
        fields[field.name] = st.lists(element, max_size=6) if repeated else element
    chosen = st.fixed_dictionaries({}, optional=fields)

    def build(values: dict):
        message = cls()
        for name, value in values.items():
            field = message_descriptor.fields_by_name[name]
            target = getattr(message, name)
            if (
                field.type == descriptor.FieldDescriptor.TYPE_MESSAGE
                and field.message_type.GetOptions().map_entry
            ):
                for key, item in value.items():
                    if isinstance(item, Message):
                        target[key].CopyFrom(item)
                    else:
                        target[key] = item
            elif field.is_repeated:
                target.extend(value)
            elif field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return chosen.map(build)


WORDS = st.text(
    alphabet=st.characters(categories=["L", "N", "Zs"]), max_size=40
)  # no mask token, no controls
PLAUSIBLE_TEXT = st.one_of(
    st.sampled_from(["the cat sat on the [MASK]", "a [MASK] dog", "paris is the capital of [MASK]."]),
    st.tuples(WORDS, WORDS).map(lambda pair: f"x{pair[0]} [MASK] {pair[1]}"),
)


@st.composite
def plausible_v1(draw, request_type: descriptor.Descriptor):
    """A generated bertserve.v1 request with its text, model and top_k drawn close to valid values (one mask
    token per input, so FillMask can succeed too), so that the fuzz reaches tokenization and the models."""
    request = draw(message_strategy(request_type))
    fields = request_type.fields_by_name
    if "inputs" in fields:
        del request.inputs[:]
        request.inputs.extend(draw(st.lists(PLAUSIBLE_TEXT, min_size=1, max_size=4)))
    if "input" in fields:
        request.input = draw(PLAUSIBLE_TEXT)
    if "model" in fields:
        request.model = draw(st.sampled_from(["", "tiny-embed", "tiny-mlm", "tiny-classifier"]))
    if "top_k" in fields:
        if draw(st.booleans()):
            request.ClearField("top_k")
        else:
            request.top_k = draw(st.integers(1, 3))
    return request


def usually(valid: st.SearchStrategy, wild: st.SearchStrategy) -> st.SearchStrategy:
    """`valid` about seven times in eight, else `wild` (3 rather than an end of the range: hypothesis draws
    the ends of a range more often)."""
    return st.integers(0, 7).flatmap(lambda k: wild if k == 3 else valid)


@st.composite
def plausible_infer(draw) -> kpb.ModelInferRequest:
    """ModelInfer requests close to valid ones (descriptor-built ones rarely get past the tensor checks):
    each part is valid seven times in eight and random otherwise."""
    texts = draw(st.lists(usually(PLAUSIBLE_TEXT, TEXT), min_size=1, max_size=4))
    elements = [t.encode() for t in texts]
    valid_shape = st.sampled_from([[len(texts)], [len(texts), 1]])
    request = kpb.ModelInferRequest(
        model_name=draw(usually(st.sampled_from(["tiny-embed", "tiny-mlm", "tiny-classifier"]), TEXT)),
        model_version=draw(usually(st.sampled_from(["", "1"]), TEXT)),
    )
    tensor = request.inputs.add(
        name=draw(usually(st.just("text"), TEXT)),
        datatype=draw(usually(st.just("BYTES"), TEXT)),
        shape=draw(usually(valid_shape, st.lists(_integers(-9, 2**40), max_size=3))),
    )
    if draw(st.booleans()):
        request.raw_input_contents.append(encode_bytes_elements(elements))
    else:
        tensor.contents.bytes_contents.extend(elements)
    outputs = ["embedding", "labels", "label_scores", "mask_tokens", "mask_scores", "mask_sequences"]
    for name in draw(usually(st.just([]), st.lists(st.sampled_from(outputs) | TEXT, max_size=3))):
        request.outputs.add(name=name)
    for name in draw(st.lists(st.sampled_from(["truncate", "normalize", "raw_scores", "top_k"]), max_size=3)):
        value = request.parameters[name]
        kind = "int" if name == "top_k" else "bool"
        kind = draw(usually(st.just(kind), st.sampled_from(["bool", "int", "string"])))
        if kind == "bool":
            value.bool_param = draw(st.booleans())
        elif kind == "int":
            value.int64_param = draw(usually(st.integers(1, 3), _integers(-(2**63), 2**63 - 1)))
        else:
            value.string_param = draw(TEXT)
    return request


def _methods() -> list[tuple[str, descriptor.Descriptor]]:
    v1 = pb.DESCRIPTOR.services_by_name["Inference"]
    kserve = kpb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    served = [(f"/{v1.full_name}/{name}", v1.methods_by_name[name].input_type) for name in RESPONSE_TYPES]
    served += [(f"/{kserve.full_name}/{m.name}", m.input_type) for m in kserve.methods]
    health = health_pb2.DESCRIPTOR.services_by_name["Health"]  # Check only: Watch streams until cancelled
    served.append((f"/{health.full_name}/Check", health.methods_by_name["Check"].input_type))
    return served


METHODS = _methods()
PLAUSIBLE = {kpb.ModelInferRequest.DESCRIPTOR.full_name: plausible_infer()} | {
    request_type.full_name: plausible_v1(request_type)
    for _, request_type in METHODS
    if request_type.file is pb.DESCRIPTOR and {"inputs", "input"} & set(request_type.fields_by_name)
}
IDS = [path.rsplit("/", 1)[1] for path, _ in METHODS]
FUZZ_SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
answers: Counter = Counter()  # (rpc, status code name) -> count


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(model_repo=tiny_repo, max_inputs_per_request=8, max_input_chars=2000) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as opened:
        yield opened


def answer(channel: grpc.Channel, method: str, data: bytes) -> tuple[grpc.StatusCode, str]:
    try:
        channel.unary_unary(method)(data, timeout=10)
    except grpc.RpcError as error:
        code, details = error.code(), error.details()
    else:
        code, details = grpc.StatusCode.OK, ""
    answers[method.rsplit("/", 1)[1], code.name] += 1
    return code, details


@pytest.mark.parametrize(("method", "request_type"), METHODS, ids=IDS)
def test_generated_messages(channel, method, request_type):
    @settings(max_examples=STRUCTURED_EXAMPLES, **FUZZ_SETTINGS)
    @given(message_strategy(request_type) | PLAUSIBLE.get(request_type.full_name, st.nothing()))
    def check(request):
        code, details = answer(channel, method, request.SerializeToString())
        assert code in ACCEPTABLE, (code, details, request)

    check()


@pytest.mark.parametrize(("method", "request_type"), METHODS, ids=IDS)
def test_random_and_mutated_bytes(channel, method, request_type):
    @settings(max_examples=BYTES_EXAMPLES, **FUZZ_SETTINGS)
    @given(
        st.one_of(
            st.binary(max_size=300),
            st.tuples(
                message_strategy(request_type).map(lambda m: m.SerializeToString()),
                st.integers(0, 1000),
                st.binary(min_size=1, max_size=8),
                st.sampled_from(["flip", "cut", "insert"]),
            ).map(_mutate),
        )
    )
    def check(data):
        code, details = answer(channel, method, data)
        assert code in ACCEPTABLE, (code, details, data)

    check()


def _mutate(spec: tuple[bytes, int, bytes, str]) -> bytes:
    data, at, noise, how = spec
    at = at % (len(data) + 1)
    if how == "cut":
        return data[:at]
    if how == "insert":
        return data[:at] + noise + data[at:]
    return (
        data[:at]
        + bytes(b ^ n for b, n in zip(data[at : at + len(noise)], noise, strict=False))
        + data[at + len(noise) :]
    )


def test_after_the_fuzz_the_server_is_serving_and_never_said_internal(server):
    """Runs last in the module (file order)."""
    assert sum(answers.values()) >= len(METHODS) * BYTES_EXAMPLES
    # The generated requests reach the models, not only the first checks.
    for rpc in ("Embed", "FillMask", "Classify", "Tokenize", "ModelInfer"):
        assert answers[rpc, "OK"] > 0, rpc
    samples = scrape(server.metrics_url)
    for code in ("INTERNAL", "UNKNOWN"):
        assert metric(samples, "bertserve_requests_total", code=code) == 0
    with Client(server.address, timeout=30) as client:
        assert client.health() == "SERVING"
        assert len(client.embed(["still answering"]).vectors) == 1
    print(f"fuzz: {sum(answers.values())} requests over {len(METHODS)} RPCs: {sorted(answers.items())}")
