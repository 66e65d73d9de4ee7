"""The native port's calls beyond plain Embed (service/grpc/native/unary_calls.py): every unary method of
bertserve.v1, KServe v2 and grpc.health.v1 answered by the main port's own handler, with the main port's
answers, statuses and counts (streams: tests/test_native_relay.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import grpc
import numpy as np
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc as pb_grpc
from tests.helpers import triton_client as triton
from tests.helpers.server import GatedBatches, ServerThread, wait_for
from tests.helpers.slow_proxy import SlowProxy

MODEL = "tiny-embed"
EMBED = "/bertserve.v1.Inference/Embed"
CHECK = "/grpc.health.v1.Health/Check"
TEXTS = ["the cat sat", "a longer sentence about dogs and cats and birds"]


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(
        model_repo=tiny_repo, native_port=0, max_queue_delay_ms=5, max_inputs_per_request=8, max_input_chars=500,
    ) as running:  # fmt: skip
        yield running


def _both(server, method: str, request, timeout: float = 30) -> list:
    """The answer (or (status, details)) of `method` on the main port, then on the native port."""
    out = []
    for port in (server.server.port, server.server.native_port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                out.append(getattr(pb_grpc.InferenceStub(channel), method)(request, timeout=timeout))
            except grpc.RpcError as error:
                out.append((error.code(), error.details()))
    return out


def _timeless(answer):
    """The answer without its metadata's timings (they differ from call to call)."""
    for name in ("meta", "metadata"):
        if name in answer.DESCRIPTOR.fields_by_name:
            for field in ("queue_time_ms", "inference_time_ms", "tokenize_time_ms"):
                getattr(answer, name).ClearField(field)
    return answer


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Info", pb.InfoRequest()),
        ("Tokenize", pb.TokenizeRequest(model=MODEL, inputs=TEXTS)),
        (
            "Embed",
            pb.EmbedRequest(model=MODEL, inputs=TEXTS, options=pb.EmbedOptions(tokens=True, dense=True)),
        ),
        ("Embed", pb.EmbedRequest(model=MODEL, token_ids=[pb.TokenIds(ids=[2, 40, 41, 3])])),
        (
            "Embed",
            pb.EmbedRequest(model=MODEL, inputs=TEXTS, options=pb.EmbedOptions(truncation_direction="left")),
        ),
    ],
)
def test_answers_equal_the_main_ports(server, method, request_):
    main, native = _both(server, method, request_)
    if method == "Embed":
        for one, other in zip(main.embeddings, native.embeddings, strict=True):
            for want, got in ((one.values, other.values), (one.tokens.values, other.tokens.values)):
                want, got = np.array(want), np.array(got)
                assert want.shape == got.shape and np.abs(want - got).max(initial=0) <= 1e-5
            assert one.tokens.count == other.tokens.count
        assert len(main.embeddings) == len(native.embeddings) > 0
    else:
        assert _timeless(main) == _timeless(native)


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Embed", pb.EmbedRequest(model=MODEL, inputs=["a"], options=pb.EmbedOptions(dimensions=0))),
        ("Embed", pb.EmbedRequest(model=MODEL, inputs=["a"], token_ids=[pb.TokenIds(ids=[1, 2])])),
        ("Tokenize", pb.TokenizeRequest(model="no-such-model", inputs=["a"])),
        ("Classify", pb.ClassifyRequest(model=MODEL, inputs=["a"])),
        ("Rerank", pb.RerankRequest(model="no-such-model", query="q", documents=["d"])),
    ],
)
def test_refusals_equal_the_main_ports(server, method, request_):
    main, native = _both(server, method, request_)
    assert isinstance(main, tuple) and main[0] != grpc.StatusCode.OK
    assert main == native


def test_kserve_with_tritons_client(server):
    """tritonclient's probes, metadata and an inference, on the native port as on the main port."""
    main, native = (f"127.0.0.1:{port}" for port in (server.server.port, server.server.native_port))
    texts = np.array([t.encode() for t in TEXTS], dtype=object)
    with triton.child() as child:
        probes = [child.submit(triton.probes, address, [MODEL]).result(60) for address in (main, native)]
        metadata = [child.submit(triton.metadata, address, MODEL).result(60) for address in (main, native)]
        answers = [child.submit(triton.infer, address, MODEL, texts).result(60) for address in (main, native)]
        missing = [
            child.submit(triton.metadata, address, "no-such-model").result(60) for address in (main, native)
        ]
    assert probes[0] == probes[1] == {"live": True, "ready": True, "models": {MODEL: True}}
    assert metadata[0] == metadata[1]
    assert missing[0] == missing[1] and missing[0][0] == "NOT_FOUND"
    got, want = (answer["outputs"]["embedding"] for answer in answers[::-1])
    assert got.shape == want.shape == (len(TEXTS), want.shape[1]) and np.abs(got - want).max() <= 1e-5


def test_health_check(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.server.native_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service="bertserve.v1.Inference"), timeout=10)
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def _sample(server, rpc: str, code: str) -> float:
    """bertserve_requests_total read in process (the server may have stopped serving /metrics)."""
    value = server.server.metrics.registry.get_sample_value(
        "bertserve_requests_total", {"rpc": rpc, "code": code}
    )
    return value or 0.0


def test_calls_are_counted_once_by_method(server):
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    before = {code: _sample(server, "Tokenize", code) for code in ("OK", "NOT_FOUND")}
    with grpc.insecure_channel(f"127.0.0.1:{server.server.native_port}") as channel:
        stub = pb_grpc.InferenceStub(channel)
        for _ in range(3):
            stub.Tokenize(pb.TokenizeRequest(model=MODEL, inputs=["a"]), timeout=10)
        with pytest.raises(grpc.RpcError):
            stub.Tokenize(pb.TokenizeRequest(model="no-such-model", inputs=["a"]), timeout=10)
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    assert _sample(server, "Tokenize", "OK") == before["OK"] + 3
    assert _sample(server, "Tokenize", "NOT_FOUND") == before["NOT_FOUND"] + 1


def _embed_with_options(port: int, timeout: float | None = None):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    request = pb.EmbedRequest(model=MODEL, inputs=["held"], options=pb.EmbedOptions(tokens=True))
    return pb_grpc.InferenceStub(channel).Embed.future(request, timeout=timeout), channel


def _expired_while_held(server, port: int, timeout: float = 1.0, options: bool = True) -> grpc.StatusCode:
    """An Embed (with options: answered by the main port's handler; without: the native port's own path)
    with a deadline of `timeout` to `port`, its batch held until the server has counted one more
    DEADLINE_EXCEEDED (an answer ready before the server hears of its client's end would race that end on
    the wire); returns the code its client saw."""
    model = server.server.core.registry.by_name[MODEL]
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    expired = _sample(server, "Embed", "DEADLINE_EXCEEDED")
    with GatedBatches(model) as gate:
        if options:
            call, channel = _embed_with_options(port, timeout=timeout)
        else:
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            plain = pb.EmbedRequest(model=MODEL, inputs=["held"])
            call = pb_grpc.InferenceStub(channel).Embed.future(plain, timeout=timeout)
        assert gate.computing.wait(30)
        with pytest.raises(grpc.RpcError) as failure:
            call.result(30)
        wait_for(lambda: _sample(server, "Embed", "DEADLINE_EXCEEDED") == expired + 1, timeout=10)
        gate.release()
        channel.close()
    wait_for(lambda: server.server.lifecycle.in_flight == 0, timeout=30)
    return failure.value.code()


def test_a_call_past_its_deadline_ends_and_the_server_goes_on(server):
    """A call that its handler computes when its deadline passes: DEADLINE_EXCEEDED, counted so; its
    inputs are dropped and the next call is answered."""
    assert _expired_while_held(server, server.server.native_port) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _both(server, "Tokenize", pb.TokenizeRequest(model=MODEL, inputs=["a"]))[1].results


@pytest.mark.parametrize(("port", "options"), [("main", True), ("native", True), ("native", False)])
def test_a_call_whose_headers_the_server_read_late_counts_its_clients_deadline(server, port, options):
    """The client's clock starts before the server reads the call's headers: its cancel at its deadline
    comes before the server's own deadline by that delay (100 ms here, as under load). It is counted
    DEADLINE_EXCEEDED, as the client saw (with a slack of 50 ms it was counted CANCELLED): by the handler's
    slack, or for a plain Embed on the native port by the transport's own."""
    target = server.server.port if port == "main" else server.server.native_port
    cancelled = _sample(server, "Embed", "CANCELLED")
    with SlowProxy(target, delay_s=0.1) as proxy:
        code = _expired_while_held(server, proxy.port, timeout=2.0, options=options)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _sample(server, "Embed", "CANCELLED") == cancelled


def test_a_call_the_transport_ends_for_its_deadline_counts_so_whatever_the_handlers_clock_says(server):
    """The handler's deadline is the transport's as read when the call was taken, later under load: a call
    the transport ended for its deadline counts DEADLINE_EXCEEDED even while the handler's clock has time
    left (it was once counted CANCELLED, the test above then failing)."""
    front = server.server.native
    model = server.server.core.registry.by_name[MODEL]
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    expired = _sample(server, "Embed", "DEADLINE_EXCEEDED")
    cancelled = _sample(server, "Embed", "CANCELLED")
    with GatedBatches(model) as gate:
        call, channel = _embed_with_options(server.server.native_port, timeout=60)
        assert gate.computing.wait(30)
        (held,) = list(front._live)

        async def deadline_passed_in_the_transport() -> None:
            front._drop([(held, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])])

        server.call(deadline_passed_in_the_transport)
        wait_for(lambda: _sample(server, "Embed", "DEADLINE_EXCEEDED") == expired + 1, timeout=30)
        call.cancel()  # the transport would have ended it; here its client does
        gate.release()
        channel.close()
    wait_for(lambda: server.server.lifecycle.in_flight == 0, timeout=30)
    assert _sample(server, "Embed", "CANCELLED") == cancelled  # counted once, as its deadline


def test_drain_answers_held_calls_and_refuses_new_ones_counted_by_method(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, grace_period_s=30) as server:
        native = server.server.native_port
        model = server.server.core.registry.by_name[MODEL]
        with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(2) as pool:
            held, channel = _embed_with_options(native)
            assert gate.computing.wait(30)
            drained = pool.submit(server.call, server.server.drain)
            wait_for(lambda: not server.server.lifecycle.accepting)
            with (
                grpc.insecure_channel(f"127.0.0.1:{native}") as other,
                pytest.raises(grpc.RpcError) as refused,
            ):
                pb_grpc.InferenceStub(other).Tokenize(
                    pb.TokenizeRequest(model=MODEL, inputs=["a"]), timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            wait_for(lambda: _sample(server, "Tokenize", "UNAVAILABLE") == 1)  # the transport's, by method
            gate.release()
            assert held.result(30).embeddings[0].tokens.count > 0
            channel.close()
            assert drained.result(60) is True


def test_calls_the_transport_held_before_a_drain_are_answered(tiny_repo):
    """Calls read by the transport while the loop was busy, taken once the drain has begun: answered (the
    main port's handlers refuse only calls that come after the drain); a new call is refused, a health
    Check answered NOT_SERVING, as on the main port."""
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, grace_period_s=30) as server:
        native = server.server.native_port
        model = server.server.core.registry.by_name[MODEL]
        with grpc.insecure_channel(f"127.0.0.1:{native}") as channel, GatedBatches(model) as gate:
            stub = pb_grpc.InferenceStub(channel)
            stub.Tokenize(pb.TokenizeRequest(model=MODEL, inputs=["warm"]), timeout=30)
            busy = threading.Event()
            server.loop.call_soon_threadsafe(lambda: busy.wait(30))  # the loop takes nothing meanwhile
            tokenize = stub.Tokenize.future(pb.TokenizeRequest(model=MODEL, inputs=["a"]), timeout=30)
            options = pb.EmbedRequest(model=MODEL, inputs=["a"], options=pb.EmbedOptions(tokens=True))
            embed = stub.Embed.future(options, timeout=30)  # held at the gate: the drain waits for it
            wait_for(lambda: server.server.native.transport.held == 2)
            drained = asyncio.run_coroutine_threadsafe(server.server.drain(), server.loop)  # before the take
            busy.set()
            assert len(tokenize.result(30).results) == 1
            assert gate.computing.wait(30)
            new = pb_grpc.InferenceStub(channel).Tokenize.future(
                pb.TokenizeRequest(model=MODEL, inputs=["a"])
            )
            with pytest.raises(grpc.RpcError) as refused:
                new.result(10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # new calls are refused
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING  # as on the main port
            gate.release()
            assert embed.result(30).embeddings[0].tokens.count > 0
        assert drained.result(60) is True
    assert _sample(server, "Tokenize", "OK") == 2 and _sample(server, "Tokenize", "UNAVAILABLE") == 1


def test_health_checks_are_answered_beside_full_limits_and_bounded_alone(tiny_repo):
    """With max_concurrent_rpcs calls open (their requests never sent), another call is refused and a
    health Check answered; health checks themselves are at most 64 open (the 65th is refused). Each set on
    a connection of its own (one connection carries at most max_concurrent_rpcs streams)."""
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, max_concurrent_rpcs=64) as server:
        address, never = f"127.0.0.1:{server.server.native_port}", threading.Event()
        transport = server.server.native.transport

        def silent():
            never.wait(60)
            yield from ()

        own = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel
        with (
            grpc.insecure_channel(address, own) as calls,
            grpc.insecure_channel(address, own) as checks,
            grpc.insecure_channel(address, own) as channel,
        ):
            check = health_pb2_grpc.HealthStub(channel).Check
            try:
                stalled = [calls.stream_unary(EMBED).future(silent(), timeout=60) for _ in range(64)]
                wait_for(lambda: transport.open_calls == 64)
                with pytest.raises(grpc.RpcError) as full:
                    pb_grpc.InferenceStub(channel).Tokenize(pb.TokenizeRequest(inputs=["a"]), timeout=10)
                answer = check(health_pb2.HealthCheckRequest(), timeout=10)
                probes = [checks.stream_unary(CHECK).future(silent(), timeout=60) for _ in range(64)]
                refusals = []

                def refused() -> bool:  # true once the 64 open checks have reached the server
                    # a check of this poll may hold a place as the last probe comes: that probe is refused
                    refusals.extend(p.exception() for p in probes if p.done() and p.exception() is not None)
                    try:
                        check(health_pb2.HealthCheckRequest(), timeout=10)
                    except grpc.RpcError as error:
                        refusals.append(error)
                    return bool(refusals)

                wait_for(refused, timeout=30)
                assert transport.open_calls == 64  # health checks aside
            finally:
                never.set()
            for call in stalled + probes:
                call.cancel()
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert refusals[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "64 health checks are open" in refusals[0].details()


def test_a_large_call_parsed_off_the_loop_keeps_its_deadline(server):
    """An Embed with options over 64 KiB is parsed on the CPU pool; its deadline is the one it had when
    taken, so a call that runs out while it computes is counted DEADLINE_EXCEEDED, as its client saw."""
    core = server.server.core
    model = core.registry.by_name[MODEL]
    off_loop = core.off_loop

    async def late(work, *args):  # the pool is busy for a while
        await asyncio.sleep(0.4)
        return await off_loop(work, *args)

    request = pb.EmbedRequest(
        model=MODEL, inputs=["held"], options=pb.EmbedOptions(tokens=True)
    ).SerializeToString()
    padding = b"x" * (80 * 1024)  # an unknown field (number 1000), kept by the parser
    request += _VarintBytes((1000 << 3) | 2) + _VarintBytes(len(padding)) + padding
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    codes = ("OK", "CANCELLED", "DEADLINE_EXCEEDED", "UNAVAILABLE", "INTERNAL")
    before = {code: _sample(server, "Embed", code) for code in codes}
    expired = before["DEADLINE_EXCEEDED"]
    core.off_loop = late
    try:
        with (
            GatedBatches(model) as gate,
            grpc.insecure_channel(f"127.0.0.1:{server.server.native_port}") as channel,
        ):
            call = channel.unary_unary("/bertserve.v1.Inference/Embed").future(request, timeout=1.0)
            assert gate.computing.wait(30)
            with pytest.raises(grpc.RpcError) as failure:
                call.result(30)
            # counted when the server hears of the end, its batch still held (see the test above)
            wait_for(lambda: _sample(server, "Embed", "DEADLINE_EXCEEDED") == expired + 1, timeout=10)
            gate.release()
    finally:
        core.off_loop = off_loop
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(lambda: server.server.lifecycle.in_flight == 0, timeout=30)
    assert {code: _sample(server, "Embed", code) - before[code] for code in codes} == {
        code: int(code == "DEADLINE_EXCEEDED") for code in codes
    }


def test_a_handler_cut_at_the_end_of_the_grace_period_is_counted_as_its_client_saw_it(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, grace_period_s=0.5) as server:
        model = server.server.core.registry.by_name[MODEL]
        with GatedBatches(model) as gate:
            call, channel = _embed_with_options(server.server.native_port, timeout=60)
            assert gate.computing.wait(30)
            assert server.call(server.server.drain) is False
            with pytest.raises(grpc.RpcError) as failure:
                call.result(30)
            gate.release()
            channel.close()
        code = failure.value.code()
        assert code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert _sample(server, "Embed", code.name) == 1


def test_an_answer_ready_after_its_deadline_is_deadline_exceeded_not_ok():
    """Its client has given up by then: the handler counts and ends it as DEADLINE_EXCEEDED, whichever came
    first, the transport's notice or the answer."""
    from types import SimpleNamespace

    from bertserve.service.core.lifecycle import Lifecycle
    from bertserve.service.grpc.native.unary_calls import Aborted, NativeContext
    from bertserve.service.grpc.rpc_status import rpc
    from bertserve.service.metrics import Metrics

    @rpc("Tokenize")
    async def slow(servicer, request, context):
        await asyncio.sleep(0.05)  # past the deadline below
        return b"answer"

    metrics = Metrics()
    servicer = SimpleNamespace(
        metrics=metrics, lifecycle=Lifecycle(), settings=SimpleNamespace(max_message_bytes=1024)
    )
    with pytest.raises(Aborted) as ended:
        asyncio.run(slow(servicer, b"", NativeContext(time.monotonic() + 0.01)))
    assert ended.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert metrics.requests.labels("Tokenize", "DEADLINE_EXCEEDED")._value.get() == 1
    assert asyncio.run(slow(servicer, b"", NativeContext(time.monotonic() + 30))) == b"answer"
