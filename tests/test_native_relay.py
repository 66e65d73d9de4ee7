"""The native port's streams (service/grpc/native/relay.h): EmbedStream, health Watch and reflection relayed to
the front's own grpc.aio server, answered as on the main port, with the client's metadata, deadline and
cancel passed on, and the client messages relays hold within a byte budget."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers.h2_client import H2Connection, grpc_message_head
from tests.helpers.server import GatedBatches, ServerProcess, ServerThread, wait_for

MODEL = "tiny-embed"
TEXTS = ["the cat sat", "a longer sentence about dogs and cats and birds", "x"]


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, max_queue_delay_ms=5) as running:
        yield running


def _stream(port: int, requests, timeout: float = 30, metadata=()) -> list[pb.EmbedStreamResponse]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return list(
            pb_grpc.InferenceStub(channel).EmbedStream(iter(requests), timeout=timeout, metadata=metadata)
        )


def _idle(server) -> bool:
    return server.server.lifecycle.in_flight == 0 and server.server.native.transport.relays[0] == 0


def test_embed_stream_answers_equal_the_main_ports(server):
    requests = [pb.EmbedStreamRequest(id=i, inputs=[text], model=MODEL) for i, text in enumerate(TEXTS)]
    requests.append(pb.EmbedStreamRequest(id=9, inputs=["a"], model="no-such-model"))
    main, native = (_stream(port, requests) for port in (server.server.port, server.server.native_port))
    by_id = [{r.id: r for r in answers} for answers in (main, native)]
    assert by_id[0].keys() == by_id[1].keys() == {0, 1, 2, 9}
    for i in range(len(TEXTS)):
        want, got = (np.array(b[i].result.embeddings[0].values) for b in by_id)
        assert want.shape == got.shape and np.abs(want - got).max() <= 1e-5
    assert (
        by_id[0][9].error == by_id[1][9].error
        and by_id[1][9].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    )
    wait_for(lambda: _idle(server))


def test_the_clients_metadata_reaches_the_stream(server):
    """x-request-timeout is read by the EmbedStream handler: a bad value is refused, naming it."""
    request = [pb.EmbedStreamRequest(id=0, inputs=["a"], model=MODEL)]
    failures = []
    for port in (server.server.port, server.server.native_port):
        with pytest.raises(grpc.RpcError) as failure:
            _stream(port, request, metadata=[("x-request-timeout", "soon")])
        failures.append((failure.value.code(), failure.value.details()))
    assert failures[0] == failures[1] and failures[0][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-request-timeout" in failures[0][1]


def test_health_watch_and_reflection(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.server.native_port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "bertserve.v1.Inference" in services and "inference.GRPCInferenceService" in services
    wait_for(lambda: _idle(server))


def test_a_streams_deadline_and_a_clients_cancel_reach_the_server(server):
    """The stream's deadline is the client's (DEADLINE_EXCEEDED while its batch computes); a client that
    cancels ends the relayed stream too: nothing is left open on either side."""
    model = server.server.core.registry.by_name[MODEL]
    native = server.server.native_port
    with GatedBatches(model) as gate, grpc.insecure_channel(f"127.0.0.1:{native}") as channel:
        stub = pb_grpc.InferenceStub(channel)
        late = stub.EmbedStream(
            iter([pb.EmbedStreamRequest(id=0, inputs=["held"], model=MODEL)]), timeout=1.0
        )
        assert gate.computing.wait(30)
        with pytest.raises(grpc.RpcError) as expired:
            list(late)
        never = threading.Event()

        def requests():
            yield pb.EmbedStreamRequest(id=1, inputs=["held too"], model=MODEL)
            never.wait(30)

        cancelled = stub.EmbedStream(requests(), timeout=60)
        wait_for(lambda: server.server.native.transport.relays[0] == 1)
        cancelled.cancel()
        never.set()
        gate.release()
    assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(lambda: _idle(server), timeout=30)


def _big_request(size: int) -> bytes:
    """An EmbedStreamRequest of `size` bytes or more (an unknown field pads it; the parser keeps it)."""
    head = pb.EmbedStreamRequest(id=0, inputs=["a"], model=MODEL).SerializeToString()
    return head + _VarintBytes((1000 << 3) | 2) + _VarintBytes(size) + b"x" * size


def test_client_messages_held_by_relays_are_bounded(tiny_repo):
    """While the event loop is busy the gRPC server reads a stream's first 64 KiB and no more: a relay then
    holds the rest of a 200 KiB message. Another stream's 200 KiB message would pass the budget of 256 KiB:
    RESOURCE_EXHAUSTED at once, naming it; the first is answered once the loop runs."""
    kib = 1024
    with ServerThread(
        model_repo=tiny_repo, models=[MODEL], native_port=0, max_request_bytes_in_flight=256 * kib
    ) as server:
        transport = server.server.native.transport
        with grpc.insecure_channel(f"127.0.0.1:{server.server.native_port}") as channel:
            stream = channel.stream_stream("/bertserve.v1.Inference/EmbedStream")
            busy = threading.Event()
            server.loop.call_soon_threadsafe(lambda: busy.wait(30))
            try:
                first = stream(iter([_big_request(200 * kib)]), timeout=60)
                wait_for(lambda: transport.relays[1] >= 200 * kib)
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as refused:
                    list(stream(iter([_big_request(200 * kib)]), timeout=60))
                waited = time.monotonic() - started
            finally:
                busy.set()
            answers = [pb.EmbedStreamResponse.FromString(reply) for reply in first]
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and waited < 10
    assert "max_request_bytes_in_flight" in refused.value.details()
    assert len(answers) == 1 and answers[0].result.embeddings


@pytest.mark.parametrize(
    "header",
    [("x-upper", "tab\there"), ("x-control", "a\x01b"), ("X-Upper", "value"), ("x-utf8", "caf\u00e9")],
)
def test_metadata_grpc_cannot_send_on_is_refused_and_the_server_stays_up(tiny_repo, header):
    """gRPC's server side takes these headers; its client side aborts the process on them: the relay refuses
    the call (INVALID_ARGUMENT) before it starts one upstream."""
    server = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", MODEL, "--native-port", "0", "--http-port", "-1"
    ).start()  # fmt: skip
    try:
        connection = H2Connection(server.native_port)
        stream = connection.open("/grpc.health.v1.Health/Watch", extra=[header])
        connection.send(stream, grpc_message_head(0), wait_s=5)
        ended = connection.wait_ended(stream, 30)
        connection.close()
        with grpc.insecure_channel(f"127.0.0.1:{server.native_port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
        assert ended and server.process.poll() is None
    finally:
        server.kill()


# A stand-in for the front's gRPC server (a Unix socket) and a client of the relay, in a process of their
# own: each of `streams` streams sends one 8 MiB message, gets a reply, then idles (its side still open).
PEER = """
import sys, threading
from concurrent import futures
import grpc
socket, streams = sys.argv[1], int(sys.argv[2])
idle = threading.Event()
def watch(requests, context):
    next(requests)
    yield b"SERVING"
    idle.wait(60)
handler = grpc.method_handlers_generic_handler("x.Y", {"Watch": grpc.stream_stream_rpc_method_handler(watch)})
server = grpc.server(futures.ThreadPoolExecutor(2 * streams), handlers=[handler],
                     options=[("grpc.max_receive_message_length", 16 << 20)])
server.add_insecure_port("unix:" + socket)
server.start()
print("listening", flush=True)
target = sys.stdin.readline().strip()
channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 16 << 20)])
def requests():
    yield bytes(8 << 20)
    idle.wait(60)
calls = [channel.stream_stream("/x.Y/Watch")(requests(), timeout=60) for _ in range(streams)]
for call in calls:
    next(call)
print("idle", flush=True)
sys.stdin.readline()
"""


# The relay's side, in a process of its own too (its RSS is the measure): the native transport relaying to
# `socket`; prints its port, then, when told, the MiB its RSS grew once 6 relays are open and hold nothing.
HOST = """
import ctypes, os, sys, time
from bertserve.service.grpc.native.transport import NativeTransport
def rss():
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
mib = 1 << 20
transport = NativeTransport("127.0.0.1:0", ["/x.Y/Unary"], 100, 64 * mib, 16 * mib, 100, 5.0, relay="unix:" + sys.argv[1])
before = rss()
print(transport.port, flush=True)
sys.stdin.readline()
until = time.monotonic() + 30
while transport.relays != (6, 0) and time.monotonic() < until:
    time.sleep(0.05)
time.sleep(0.5)  # what gRPC frees after the messages were written upstream
print(transport.relays, rss() - before, flush=True)
os._exit(0)
"""


def test_a_relay_keeps_no_message_once_sent_on(tmp_path):
    """Six relayed streams that each sent one 8 MiB message and now idle: the relays hold none of it (each
    kept its last message until the next came: +48 MiB)."""
    socket = tmp_path / "inner.sock"
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(socket), "6"], **pipes)
    host = None
    try:
        assert peer.stdout.readline().strip() == "listening"
        host = subprocess.Popen([sys.executable, "-c", HOST, str(socket)], **pipes)
        port = int(host.stdout.readline())
        peer.stdin.write(f"127.0.0.1:{port}\n")
        peer.stdin.flush()
        assert peer.stdout.readline().strip() == "idle"
        host.stdin.write("measure\n")
        host.stdin.flush()
        relays, grown = host.stdout.readline().rsplit(" ", 1)
    finally:
        for process in (peer, host):
            if process is not None:
                process.kill()
                process.wait()
    assert relays == "(6, 0)" and float(grown) < 24, (relays, grown)
