"""The main port reads each unary call's request itself (service/grpc/request_reads.py): messages still arriving
after a short grace hold room for a whole message in `max_request_bytes_in_flight` (beyond it: RESOURCE_EXHAUSTED,
which stops their bytes), must be whole within `http_read_timeout_s` (DEADLINE_EXCEEDED), and a call without
a message is INVALID_ARGUMENT; small calls are answered all the while. Each ending is counted."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import grpc

from bertserve.client import Client
from bertserve.service.grpc.request_reads import RECEIVE_GRACE_S, UNCOUNTED_READS, RequestReads
from bertserve.service.metrics import Metrics
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.h2_client import DATA, END_STREAM, H2Connection, frame, grpc_message_head
from tests.helpers.server import ServerProcess, ServerThread, metric, scrape, wait_for
from tests.test_native_front import _rss

MODEL = "tiny-embed"
EMBED = "/bertserve.v1.Inference/Embed"
MIB = 1 << 20


def _ended(running: ServerThread, code: str) -> float:
    """Embed calls counted with `code` by the running server."""
    return metric(scrape(running.metrics_url), "bertserve_requests_total", rpc="Embed", code=code)


def test_requests_still_arriving_hold_at_most_the_budget(tiny_repo):
    """64 calls whose 4 MiB request lacks its last byte (256 MiB sent on one connection): two hold the 8 MiB
    budget, the others are refused once their grace is over, so RSS grows by far less than what was sent
    (without the budget: by all of it; with it, what the heap keeps of freed requests too: 62 MiB measured
    for 128 MiB sent); a small call is answered meanwhile."""
    server = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", MODEL, "--http-port", "-1",
        "--max-request-bytes-in-flight", str(8 * MIB), "--max-message-bytes", str(4 * MIB),
    ).start()  # fmt: skip
    try:
        metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        before = _rss(server.process.pid)
        connection = H2Connection(server.port)
        body = grpc_message_head(4 * MIB) + b"\x00" * (4 * MIB - 1)
        sent = sum(connection.send(connection.open(EMBED), body, wait_s=0.3) for _ in range(64))
        refused = lambda: metric(  # noqa: E731
            scrape(metrics_url), "bertserve_requests_total", rpc="Embed", code="RESOURCE_EXHAUSTED"
        )
        wait_for(lambda: refused() == 62, timeout=30)  # all but the two holding the budget
        grown = _rss(server.process.pid) - before
        with Client(f"127.0.0.1:{server.port}") as client:
            answer = client.stub.Embed(pb.EmbedRequest(inputs=["still serving"]), timeout=30)
        connection.close()
    finally:
        server.terminate()
    assert sent > 128 * MIB
    assert grown < 128 * MIB, f"RSS grew {grown / MIB:.0f} MiB ({sent / MIB:.0f} MiB sent)"
    assert len(answer.embeddings) == 1


def test_a_request_never_whole_ends_at_the_read_timeout_and_gives_its_room_back(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=[MODEL], http_read_timeout_s=1.0) as running:
        reads = running.server.admission.reads
        connection = H2Connection(running.server.port)
        started = time.monotonic()
        connection.send(connection.open(EMBED), grpc_message_head(200_000) + b"x" * 100_000, wait_s=1)
        wait_for(lambda: reads.used > 0)  # past its grace, holding room for a whole message
        wait_for(lambda: _ended(running, "DEADLINE_EXCEEDED") == 1)
        waited = time.monotonic() - started
        assert reads.used == 0 and 0.9 < waited < 10
        connection.close()
        with Client(running.address) as client:
            assert len(client.stub.Embed(pb.EmbedRequest(inputs=["next"]), timeout=30).embeddings) == 1


def test_a_call_without_a_request_message_is_invalid(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=[MODEL]) as running:
        connection = H2Connection(running.server.port)
        connection._send(frame(DATA, END_STREAM, connection.open(EMBED)))
        wait_for(lambda: _ended(running, "INVALID_ARGUMENT") == 1)
        connection.close()


class _Context:
    """What `RequestReads.read` uses of a call's context: its message comes when `message` is set."""

    def __init__(self):
        self.message = asyncio.get_running_loop().create_future()
        self.aborted: tuple | None = None

    async def read(self):
        return await self.message

    def done(self) -> bool:
        return self.aborted is not None

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


def test_a_message_that_came_while_the_loop_was_busy_is_read_not_refused():
    """The room is full and the loop is held past the grace; the message comes in the same turn as the
    grace ends (its I/O callback runs before the timer, the reader's wake-up after it): the message is
    read, the call is not refused."""

    async def scenario():
        loop = asyncio.get_running_loop()
        reads = RequestReads(1000, 1000, 5.0, Metrics())
        reads.used = 1000  # another message, still arriving, holds all the room
        context = _Context()
        reader, writer = socket.socketpair()
        loop.add_reader(reader, lambda: (reader.recv(1), context.message.set_result(b"request")))
        read = asyncio.ensure_future(reads.read(context, "Embed"))
        await asyncio.sleep(0)  # the grace runs from here
        writer.send(b"x")
        time.sleep(2 * RECEIVE_GRACE_S)  # the loop busy past the grace, the message waiting in the socket
        try:
            return await read, context.aborted
        finally:
            loop.remove_reader(reader)
            reader.close()
            writer.close()

    assert asyncio.run(scenario()) == (b"request", None)


def test_a_message_that_came_as_its_read_timed_out_is_read_not_ended():
    """The loop is held past the read timeout and the message comes in that same turn: the handler's
    wake-up runs before the task that would end the call, which then ends nothing."""

    async def scenario():
        loop = asyncio.get_running_loop()
        reads = RequestReads(1000, 1000, 2 * RECEIVE_GRACE_S, Metrics())
        context = _Context()
        reader, writer = socket.socketpair()
        loop.add_reader(reader, lambda: (reader.recv(1), context.message.set_result(b"request")))
        read = asyncio.ensure_future(reads.read(context, "Embed"))
        await asyncio.sleep(1.5 * RECEIVE_GRACE_S)  # past the grace: the message holds room
        held = reads.used
        writer.send(b"x")
        time.sleep(2 * RECEIVE_GRACE_S)  # the loop busy past the read timeout
        try:
            request = await read
            await asyncio.sleep(0.01)  # the ending task, had it run, would have aborted by now
            return request, context.aborted, held, reads.used
        finally:
            loop.remove_reader(reader)
            reader.close()
            writer.close()

    assert asyncio.run(scenario()) == (b"request", None, 1000, 0)


def test_reads_of_calls_never_counted_in_flight_are_bounded():
    """health Check is never counted in flight: at most UNCOUNTED_READS of its reads at once, the next
    call refused before its message is read."""

    async def scenario():
        reads = RequestReads(1000, 1000, 5.0, Metrics())
        handler = reads.streamed(
            grpc.unary_unary_rpc_method_handler(lambda request, context: request), "Check"
        )
        reads.uncounted = UNCOUNTED_READS
        context = _Context()
        with contextlib.suppress(grpc.aio.AbortError, asyncio.TimeoutError):
            await asyncio.wait_for(handler.stream_unary(None, context), 1.0)  # read: it would wait
        return context.aborted, context.message.done()

    (code, details), read = asyncio.run(scenario())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "being read" in details and not read
