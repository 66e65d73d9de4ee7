"""The native port (setting `native_port`, service/grpc/native/): plain Embed calls through gRPC's C++ server,
checked, batched and answered in groups as the main port answers them (its other calls:
tests/test_native_unary.py)."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import grpc
import numpy as np
import pytest

from bertserve.client import Client
from bertserve.service import memory
from bertserve.service.errors import StartupError
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.h2_client import H2Connection, grpc_message_head
from tests.helpers.server import GatedBatches, ServerProcess, ServerThread, metric, scrape, wait_for
from tests.test_server_tls import pki  # noqa: F401 (the certificates fixture)

MODEL = "tiny-embed"
EMBED = "/bertserve.v1.Inference/Embed"
TEXTS = ["the cat sat", "a longer sentence about dogs and cats and birds", "x", "hello world " * 5]


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(
        model_repo=tiny_repo, models=[MODEL], native_port=0, max_queue_delay_ms=5, max_inputs_per_request=8,
        max_input_chars=500, max_queue_inputs=24,
    ) as running:  # fmt: skip
        yield running


def _embed(port: int, request: pb.EmbedRequest | bytes, timeout: float = 30) -> pb.EmbedResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            EMBED,
            request_serializer=lambda r: r if isinstance(r, bytes) else r.SerializeToString(),
            response_deserializer=pb.EmbedResponse.FromString,
        )
        return call(request, timeout=timeout)


def _code(port: int, request, timeout: float = 30) -> tuple[grpc.StatusCode, str]:
    try:
        _embed(port, request, timeout)
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def _held_at_the_gate(pool, gate: GatedBatches, port: int) -> concurrent.futures.Future:
    """A call whose batch waits at `gate` (its future, answered once the gate opens)."""
    call = pool.submit(_embed, port, pb.EmbedRequest(inputs=["held at the gate"]))
    assert gate.computing.wait(30)
    return call


def _ports(server) -> tuple[int, int]:
    return server.server.port, server.server.native_port


def test_answers_equal_the_main_ports(server):
    main, native = _ports(server)
    requests = [
        pb.EmbedRequest(inputs=TEXTS),
        pb.EmbedRequest(inputs=TEXTS[:2], normalize=True, model=MODEL),
        pb.EmbedRequest(inputs=TEXTS[2:], normalize=False),
        pb.EmbedRequest(inputs=["w " * 240], truncate=True),
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # several native calls in one group
        natives = list(pool.map(lambda r: _embed(native, r), requests * 2))
    for request, got in zip(requests * 2, natives, strict=True):
        expected = _embed(main, request)
        assert got.dimension == expected.dimension > 0
        want = np.array([e.values for e in expected.embeddings])
        assert np.abs(np.array([e.values for e in got.embeddings]) - want).max() <= 1e-5
        for field in ("model", "model_version", "total_tokens", "input_tokens", "truncated"):
            assert getattr(got.metadata, field) == getattr(expected.metadata, field), field
        assert got.metadata.batches >= 1 and got.metadata.inference_time_ms > 0


@pytest.mark.parametrize(
    "request_",
    [
        pb.EmbedRequest(inputs=["a"] * 9),  # max_inputs_per_request 8
        pb.EmbedRequest(inputs=["a" * 501]),  # max_input_chars 500
        pb.EmbedRequest(inputs=["w " * 240]),  # beyond max_length without truncate
        pb.EmbedRequest(inputs=["a"], model="no-such-model"),
        pb.EmbedRequest(inputs=[]),
        b"\xff\xff\xff",  # not a protobuf message
    ],
    ids=["count", "chars", "tokens", "model", "empty", "bytes"],
)
def test_refusals_equal_the_main_ports(server, request_):
    main, native = _ports(server)
    code, details = _code(native, request_)
    assert code != grpc.StatusCode.OK
    assert (code, details) == _code(main, request_)
    assert len(_embed(native, pb.EmbedRequest(inputs=["still serving"])).embeddings) == 1


def test_the_clients_empty_options_are_plain(server):
    """bertserve.client sends an EmbedOptions message even when every option is its default: served."""
    main, native = _ports(server)
    with Client(f"127.0.0.1:{native}", timeout=30) as client:
        got = client.embed(TEXTS[:2], model=MODEL)
    with Client(f"127.0.0.1:{main}", timeout=30) as client:
        want = client.embed(TEXTS[:2], model=MODEL)
    assert np.abs(got.vectors - want.vectors).max() <= 1e-5


def test_native_calls_share_batches_with_the_main_ports(server):
    """While a batch computes and another waits for the instance (cut ahead), a main-port call and a native
    call queue: the batch after holds both."""
    main, native = _ports(server)
    model = server.server.core.registry.by_name[MODEL]
    sizes: list[int] = []
    with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(4) as pool:
        compute = gate._compute
        gate._compute = lambda batch: (sizes.append(len(batch)), compute(batch))[1]
        first = _held_at_the_gate(pool, gate, main)
        ahead = pool.submit(_embed, main, pb.EmbedRequest(inputs=["cut ahead"]))
        wait_for(lambda: len(model.batcher._running) == 2)
        later = [pool.submit(_embed, port, pb.EmbedRequest(inputs=["queued"])) for port in (main, native)]
        wait_for(lambda: model.batcher.depth >= 2)
        gate.release()
        answers = [f.result(30) for f in (first, ahead, *later)]
    assert sizes[:3] == [1, 1, 2]
    assert all(len(a.embeddings) == 1 for a in answers)


def test_the_queue_bound_is_the_main_ports(server):
    """max_queue_inputs (24) holds for both ports together: with the queue full of native inputs, a call on
    either port is refused at once with the main port's message, before its texts are tokenized."""
    main, native = _ports(server)
    model = server.server.core.registry.by_name[MODEL]
    with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(5) as pool:
        first = _held_at_the_gate(pool, gate, main)
        fill = [pool.submit(_embed, native, pb.EmbedRequest(inputs=["q"] * 8))]
        wait_for(lambda: len(model.batcher._running) == 2)  # that call's batch is cut ahead
        fill += [pool.submit(_embed, native, pb.EmbedRequest(inputs=["q"] * 8)) for _ in range(3)]
        wait_for(lambda: model.batcher.depth >= 24)
        tokenized = metric(scrape(server.metrics_url), "bertserve_tokenized_inputs_total", model=MODEL)
        refused = [_code(port, pb.EmbedRequest(inputs=["a"])) for port in (main, native)]
        # refused before their texts were tokenized
        assert (
            metric(scrape(server.metrics_url), "bertserve_tokenized_inputs_total", model=MODEL) == tokenized
        )
        gate.release()
        for f in (first, *fill):
            f.result(30)
    for code, details in refused:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_queue_inputs 24" in details


def test_calls_held_by_the_transport_are_bounded(server):
    """Beyond max_queue_inputs calls held by the C++ server (queued or computing), a call is refused before
    its request is queued, and counted in bertserve_requests_total like the main port's refusals."""
    native = server.server.native_port
    model = server.server.core.registry.by_name[MODEL]
    transport = server.server.native.transport
    exhausted = _counted(server, "RESOURCE_EXHAUSTED")
    with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(28) as pool:
        held = [pool.submit(_code, native, pb.EmbedRequest(inputs=["held"])) for _ in range(24)]
        wait_for(lambda: transport.held >= 24)
        code, details = _code(native, pb.EmbedRequest(inputs=["one more"]))
        gate.release()
        assert all(f.result(30)[0] == grpc.StatusCode.OK for f in held)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "calls are held" in details
    wait_for(lambda: _counted(server, "RESOURCE_EXHAUSTED") == exhausted + 1)  # added every second


def test_request_bytes_held_are_bounded(tiny_repo):
    """Beyond max_request_bytes_in_flight of requests held (a lone call is always admitted), a call is
    refused once its request is read."""
    with ServerThread(
        model_repo=tiny_repo, models=[MODEL], native_port=0, max_request_bytes_in_flight=4096,
        max_input_chars=5000, max_message_bytes=8192, http_max_body_bytes_in_flight=8192,
    ) as server:  # fmt: skip
        native = server.server.native_port
        model = server.server.core.registry.by_name[MODEL]
        big = pb.EmbedRequest(inputs=["w " * 1500], truncate=True)  # about 3 KB
        with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(_embed, native, big)
            assert gate.computing.wait(30)
            code, details = _code(native, big)
            gate.release()
            assert len(first.result(30).embeddings) == 1
        assert len(_embed(native, big).embeddings) == 1  # the bytes were given back
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_bytes_in_flight 4096" in details


def test_calls_whose_request_never_comes_hold_no_room_and_time_out(tiny_repo):
    """Calls that open and never send their request (more than max_queue_inputs of them) leave room for
    others and end with DEADLINE_EXCEEDED after http_read_timeout_s."""
    with ServerThread(
        model_repo=tiny_repo, models=[MODEL], native_port=0, max_queue_inputs=4, http_read_timeout_s=1.0
    ) as server:  # fmt: skip
        native, never = server.server.native_port, threading.Event()

        def silent():
            never.wait(60)
            yield from ()

        with grpc.insecure_channel(f"127.0.0.1:{native}") as channel:
            open_only = channel.stream_unary(EMBED)
            stalled = [open_only.future(silent(), timeout=30) for _ in range(8)]
            try:
                assert len(_embed(native, pb.EmbedRequest(inputs=["served beside them"])).embeddings) == 1
                codes = [(f.exception(20).code(), f.exception().details()) for f in stalled]
            finally:
                never.set()
    assert (
        codes
        == [(grpc.StatusCode.DEADLINE_EXCEEDED, "the request did not arrive within the read timeout")] * 8
    )


def test_an_expired_call_gets_deadline_exceeded_and_the_server_goes_on(server):
    main, native = _ports(server)
    model = server.server.core.registry.by_name[MODEL]
    with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = _held_at_the_gate(pool, gate, main)
        code, _ = _code(native, pb.EmbedRequest(inputs=["too late"]), timeout=0.3)
        gate.release()
        first.result(30)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(lambda: server.server.native.transport.held == 0)
    assert len(_embed(native, pb.EmbedRequest(inputs=["next"])).embeddings) == 1


def _counted(server, code: str) -> float:
    return metric(scrape(server.metrics_url), "bertserve_requests_total", rpc="Embed", code=code)


def _call(port: int, request: pb.EmbedRequest, timeout: float | None = None):
    """An Embed call in flight on its own channel: (its future, the channel to close)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = channel.unary_unary(EMBED, pb.EmbedRequest.SerializeToString, pb.EmbedResponse.FromString)
    return stub.future(request, timeout=timeout), channel


def test_a_call_cancelled_while_queued_has_its_inputs_dropped(server):
    """The client cancels a native call whose input waits in the queue: the transport tells the front, the
    input is dropped before compute (bertserve_dropped_total{reason="cancelled"}), the call counts as
    CANCELLED."""
    main, native = _ports(server)
    model = server.server.core.registry.by_name[MODEL]
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    before = scrape(server.metrics_url)

    def moved(name: str, **labels) -> float:
        return metric(scrape(server.metrics_url), name, **labels) - metric(before, name, **labels)

    with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = _held_at_the_gate(pool, gate, main)
        call, channel = _call(native, pb.EmbedRequest(inputs=["left behind"]))
        wait_for(lambda: moved("bertserve_inputs_total", model=MODEL, task="embed") == 2)  # queued
        call.cancel()
        wait_for(lambda: moved("bertserve_requests_total", rpc="Embed", code="CANCELLED") == 1)
        gate.release()
        first.result(30)
        channel.close()
    wait_for(lambda: moved("bertserve_dropped_total", model=MODEL, reason="cancelled") == 1)
    assert moved("bertserve_batch_size_sum", model=MODEL) == 1  # only the first call's input was computed


def test_more_calls_ending_at_once_than_a_turn_takes_never_stall_the_port(tiny_repo):
    """Six queued calls end while the event loop is busy, with groups of 2 (max_batch_size): every drop is
    handled in the next turn, and the port goes on answering (a drop left behind would leave the eventfd
    unarmed, and no later call would be taken)."""
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, max_batch_size=2) as running:
        main, native = _ports(running)
        model = running.server.core.registry.by_name[MODEL]
        before = scrape(running.metrics_url)

        def queued() -> float:
            name = "bertserve_inputs_total"
            return metric(scrape(running.metrics_url), name, model=MODEL) - metric(before, name, model=MODEL)

        with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = _held_at_the_gate(pool, gate, main)
            calls = [_call(native, pb.EmbedRequest(inputs=[f"call {i}"])) for i in range(6)]
            wait_for(lambda: queued() == 7)
            running.loop.call_soon_threadsafe(time.sleep, 2.0)  # the loop busy while all six end
            for call, _ in calls:
                call.cancel()
            gate.release()
            first.result(30)
            for _, channel in calls:
                channel.close()
        assert len(_embed(native, pb.EmbedRequest(inputs=["after"]), timeout=20).embeddings) == 1
        wait_for(lambda: running.server.lifecycle.in_flight == 0)


def test_a_call_past_its_deadline_while_computing_counts_as_deadline_exceeded(server):
    """A native call whose deadline passes while its batch computes: answered at once, counted as the client
    saw it (DEADLINE_EXCEEDED, not CANCELLED)."""
    native = server.server.native_port
    model = server.server.core.registry.by_name[MODEL]
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    expired = _counted(server, "DEADLINE_EXCEEDED")
    with GatedBatches(model) as gate:
        call, channel = _call(native, pb.EmbedRequest(inputs=["slow batch"]), timeout=0.5)
        assert gate.computing.wait(30)
        assert call.exception(30).code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: _counted(server, "DEADLINE_EXCEEDED") == expired + 1)  # while the batch computes
        gate.release()
        channel.close()
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    assert _counted(server, "DEADLINE_EXCEEDED") == expired + 1


def test_native_calls_are_counted_with_the_main_ports(server):
    native = server.server.native_port

    def counted(code: str) -> float:
        return _counted(server, code)

    # a call is counted just after its reply leaves: earlier tests' last counts land before in_flight is 0
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    ok, invalid = counted("OK"), counted("INVALID_ARGUMENT")
    _embed(native, pb.EmbedRequest(inputs=["one"]))
    _code(native, pb.EmbedRequest(inputs=[]))
    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    assert counted("OK") == ok + 1 and counted("INVALID_ARGUMENT") == invalid + 1


def test_drain_answers_held_calls_and_refuses_new_ones(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, grace_period_s=30) as server:
        native = server.server.native_port
        model = server.server.core.registry.by_name[MODEL]
        with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(2) as pool:
            held = _held_at_the_gate(pool, gate, native)
            drained = pool.submit(server.call, server.server.drain)
            wait_for(lambda: not server.server.lifecycle.accepting)
            code, _ = _code(native, pb.EmbedRequest(inputs=["new"]))
            gate.release()
            assert len(held.result(30).embeddings) == 1
            assert drained.result(60) is True
    assert code == grpc.StatusCode.UNAVAILABLE


def test_drain_waits_for_a_call_whose_request_is_still_arriving(tiny_repo):
    """A call open when the drain starts, its request not yet sent, is answered once it comes (within the
    grace period), not ended with UNAVAILABLE."""
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, grace_period_s=30) as server:
        native, go = server.server.native_port, threading.Event()

        def late():
            go.wait(30)
            yield pb.EmbedRequest(inputs=["late"]).SerializeToString()

        with (
            grpc.insecure_channel(f"127.0.0.1:{native}") as channel,
            concurrent.futures.ThreadPoolExecutor(1) as pool,
        ):
            stub = channel.stream_unary(EMBED, response_deserializer=pb.EmbedResponse.FromString)
            call = stub.future(late(), timeout=60)
            wait_for(lambda: server.server.native.transport.open_calls == 1)
            drained = pool.submit(server.call, server.server.drain)
            wait_for(lambda: not server.server.lifecycle.accepting)
            time.sleep(0.5)  # the stop's wait has begun: without it, the call would be ended by now
            assert not call.done()
            go.set()
            assert len(call.result(30).embeddings) == 1
            assert drained.result(60) is True


def test_a_taken_port_fails_at_start(tiny_repo, server):
    taken = ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=server.server.native_port)
    with pytest.raises(StartupError, match="setting native_port: cannot listen on"):
        taken.start()


def test_many_concurrent_callers_each_get_their_own_answer(server):
    """64 callers at once, each text distinct: every answer is its own text's (the groups never mix calls up)."""
    main, native = _ports(server)
    texts = [f"caller number {i} says {'word ' * (i % 7)}" for i in range(64)]
    want = {t: np.array(_embed(main, pb.EmbedRequest(inputs=[t])).embeddings[0].values) for t in texts[:8]}
    barrier = threading.Barrier(16)

    def one(text: str) -> tuple[str, np.ndarray]:
        if text in want:
            barrier.wait(30)
        return text, np.array(_embed(native, pb.EmbedRequest(inputs=[text])).embeddings[0].values)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = dict(pool.map(one, texts[:8] * 2 + texts[8:]))
    for text, vector in want.items():
        assert np.abs(got[text] - vector).max() <= 1e-5
    assert len(got) == 64


def test_tls_with_the_servers_certificate(tiny_repo, pki):  # noqa: F811
    settings = dict(tls_cert=pki / "server.pem", tls_key=pki / "server-key.pem")
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, **settings) as server:
        address = f"127.0.0.1:{server.server.native_port}"
        credentials = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
        with grpc.secure_channel(address, credentials) as channel:
            call = channel.unary_unary(EMBED, response_deserializer=pb.EmbedResponse.FromString)
            reply = call(pb.EmbedRequest(inputs=["over TLS"]).SerializeToString(), timeout=30)
        code, _ = _code(server.server.native_port, pb.EmbedRequest(inputs=["in plain text"]), timeout=5)
    assert len(reply.embeddings) == 1 and code == grpc.StatusCode.UNAVAILABLE


def test_calls_beyond_one_group_are_taken_on_the_next_turns(tiny_repo):
    """With groups of one call (max_batch_size 1), calls that arrive together are all answered: each turn
    of the loop takes one and leaves the rest for the next turns, with no new arrival to wake it."""
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, max_batch_size=1) as server:
        native = server.server.native_port
        model = server.server.core.registry.by_name[MODEL]
        with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(12) as pool:
            first = _held_at_the_gate(pool, gate, native)
            rest = [pool.submit(_embed, native, pb.EmbedRequest(inputs=[f"call {i}"])) for i in range(10)]
            wait_for(lambda: server.server.native.transport.held == 11)
            gate.release()
            answers = [f.result(30) for f in (first, *rest)]
    assert all(len(a.embeddings) == 1 for a in answers)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_partial_requests_are_held_within_grpcs_quota(tiny_repo):
    """Calls whose request lacks only its last byte (64 of 4 MiB on one connection; the call and bytes
    budgets count a request once it is whole) make the server hold about gRPC's resource quota for them
    (max_request_bytes_in_flight + max_message_bytes, 16 MiB at least; a soft bound, its reclaimer runs
    behind on a loaded machine: up to 65 MiB of RSS measured), not 256 MiB."""
    mib = 1 << 20
    server = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", MODEL, "--native-port", "0", "--http-port", "-1",
        "--max-request-bytes-in-flight", str(4 * mib), "--max-message-bytes", str(4 * mib),
    ).start()  # fmt: skip
    try:
        port = server.native_port
        before = _rss(server.process.pid)
        connection = H2Connection(port)
        body = grpc_message_head(4 * mib) + b"\x00" * (4 * mib - 1)
        sent = sum(connection.send(connection.open(EMBED), body, wait_s=0.2) for _ in range(64))
        time.sleep(0.5)
        grown = _rss(server.process.pid) - before
        connection.close()
        answer = _embed(port, pb.EmbedRequest(inputs=["still serving"]))
    finally:
        server.terminate()
    assert grown < 128 * mib, f"RSS grew {grown / mib:.0f} MiB ({sent / mib:.0f} MiB sent)"
    assert len(answer.embeddings) == 1


def test_a_call_that_comes_while_drops_are_read_is_still_taken(tiny_repo):
    """A call arrives between the loop's take and its read of the drops (a drop was pending at the take):
    the transport writes the eventfd again for what is left, so the call is taken (it was not, once, and
    the port stopped taking calls)."""
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0) as running:
        main, native = _ports(running)
        model = running.server.core.registry.by_name[MODEL]
        front = running.server.native
        transport = front.transport
        armed, reading, go_on, loop_free = (threading.Event() for _ in range(4))
        real_dropped = transport.dropped

        def dropped_slowly(max_calls: int) -> list[tuple[int, int]]:
            if armed.is_set() and not reading.is_set():  # the read after the cancel waits for `go_on`
                reading.set()
                assert go_on.wait(30)
            return real_dropped(max_calls)

        transport.dropped = dropped_slowly
        with GatedBatches(model) as gate, concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = _held_at_the_gate(pool, gate, main)
            left, channel = _call(native, pb.EmbedRequest(inputs=["leaves"]))
            wait_for(lambda: len(front._live) == 1)  # taken, its input queued behind the gate
            running.loop.call_soon_threadsafe(loop_free.wait, 30)  # the drop comes while the loop waits
            left.cancel()
            wait_for(lambda: transport.held == 0)
            armed.set()
            loop_free.set()
            assert reading.wait(30)
            late, late_channel = _call(native, pb.EmbedRequest(inputs=["comes late"]))
            wait_for(lambda: transport.held == 1)  # in the transport's queue; the loop was told nothing
            go_on.set()
            gate.release()
            first.result(30)
            assert len(late.result(20).embeddings) == 1
            channel.close()
            late_channel.close()


def test_a_call_that_ends_while_tokenized_off_the_loop_is_never_queued(server):
    """The client leaves while its call's long text is tokenized on the CPU pool: the call is answered
    without queueing its inputs (nothing is computed for it) and counted as CANCELLED."""
    native = server.server.native_port
    front = server.server.native
    tokenizing, go_on = threading.Event(), threading.Event()
    real_prepared = front._prepared

    def prepared_slowly(admitted):
        tokenizing.set()
        assert go_on.wait(30)
        return real_prepared(admitted)

    wait_for(lambda: server.server.lifecycle.in_flight == 0)
    before = scrape(server.metrics_url)

    def moved(name: str, **labels) -> float:
        return metric(scrape(server.metrics_url), name, **labels) - metric(before, name, **labels)

    front._prepared = prepared_slowly
    try:
        call, channel = _call(  # more characters than a group tokenizes on the loop
            native, pb.EmbedRequest(inputs=["a long text to tokenize " * 20] * 8, truncate=True)
        )
        assert tokenizing.wait(30)  # on the CPU pool
        call.cancel()
        wait_for(lambda: call.cancelled() and front._ended)  # the front heard of it
        go_on.set()
        wait_for(lambda: moved("bertserve_requests_total", rpc="Embed", code="CANCELLED") == 1)
        channel.close()
    finally:
        front._prepared = real_prepared
        go_on.set()
    assert moved("bertserve_inputs_total", model=MODEL, task="embed") == 0  # never queued
    assert len(_embed(native, pb.EmbedRequest(inputs=["next"])).embeddings) == 1


def test_a_group_tokenizes_up_to_its_budget_on_the_loop_and_the_rest_on_the_pool(server):
    """Three calls of 960 characters taken in one turn: the first two (within INLINE_GROUP_CHARS) are
    tokenized on the event loop, the third in one hop to the CPU pool; each is answered."""
    from bertserve.service.grpc.native.front import INLINE_GROUP_CHARS

    front, transport = server.server.native, server.server.native.transport
    texts = ["a text of some length " * 20, "another text, as long " * 20]  # 480 characters each
    assert 2 * 960 <= INLINE_GROUP_CHARS < 3 * 960
    where: list[tuple[str, int]] = []
    real_prepared = front._prepared

    def prepared_where(admitted):
        where.append((threading.current_thread().name, len(admitted)))
        return real_prepared(admitted)

    wait_for(lambda: server.server.lifecycle.in_flight == 0 and transport.held == 0)
    loop_free = threading.Event()
    front._prepared = prepared_where
    try:
        server.loop.call_soon_threadsafe(loop_free.wait, 30)  # the three calls come while the loop waits
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            request = pb.EmbedRequest(inputs=texts, truncate=True)
            calls = [pool.submit(_embed, server.server.native_port, request) for _ in range(3)]
            wait_for(lambda: transport.held == 3)
            loop_free.set()
            assert all(len(call.result(30).embeddings) == 2 for call in calls)
    finally:
        front._prepared = real_prepared
        loop_free.set()
    assert where[0] == ("test-server", 2)  # the loop's thread
    assert where[1][0] != "test-server" and where[1][1] == 1


def test_the_heap_goes_back_once_no_native_call_is_in_flight(tiny_repo, monkeypatch):
    """As after grpc.aio's calls: once the last call ends and none begins for IDLE_RELEASE_S, the heap's
    free pages are handed back (what large requests freed would otherwise stay in the RSS)."""
    released = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: released.append(time.monotonic()))
    with ServerThread(model_repo=tiny_repo, models=[MODEL], native_port=0, http_port=-1) as server:
        before = len(released)
        for _ in range(3):
            _embed(server.server.native_port, pb.EmbedRequest(inputs=["x" * 400]))
        _code(server.server.native_port, pb.EmbedRequest(inputs=["a"], options=pb.EmbedOptions(tokens=True)))
        wait_for(lambda: len(released) > before)
