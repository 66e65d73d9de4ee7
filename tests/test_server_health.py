"""Health (overall and per service) through warm-up and drain; reflection lists the services."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

import bertserve.service.supervisor.server as service_server
from bertserve.client import SERVICE_NAME, Client
from bertserve.v1 import inference_pb2 as pb
from tests.helpers.server import ServerThread


def test_reflection_lists_the_services(tiny_server):
    with grpc.insecure_channel(tiny_server.address) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert SERVICE_NAME in services and "grpc.health.v1.Health" in services


def test_health_through_warm_up_and_drain(tiny_repo, monkeypatch):
    warming, release_warm_up = threading.Event(), threading.Event()
    real_warm_up = service_server._warm_up

    def gated_warm_up(model):
        warming.set()
        assert release_warm_up.wait(30)
        real_warm_up(model)

    monkeypatch.setattr(service_server, "_warm_up", gated_warm_up)
    server = ServerThread(model_repo=tiny_repo, models=["tiny-embed"], grace_period_s=20)
    starter = threading.Thread(target=server.start)
    starter.start()
    try:
        assert warming.wait(60)
        client = Client(server.address, timeout=30)
        assert client.health() == "NOT_SERVING"
        assert client.health(SERVICE_NAME) == "NOT_SERVING"
        release_warm_up.set()
        starter.join(60)
        assert client.health() == "SERVING" and client.health(SERVICE_NAME) == "SERVING"
        with pytest.raises(grpc.RpcError) as unknown:
            client.health("no.such.Service")
        assert unknown.value.code() is grpc.StatusCode.NOT_FOUND

        # Hold the model inside a batch, so a call is in flight when the drain starts.
        model = server.server.models[0]
        computing, release_model = threading.Event(), threading.Event()
        real_compute = model.batcher.runs.compute

        def gated_compute(batch):
            computing.set()
            assert release_model.wait(30)
            return real_compute(batch)

        model.batcher.runs.compute = gated_compute
        in_flight = client.stub.Embed.future(pb.EmbedRequest(inputs=["a cat"]), timeout=30)
        assert computing.wait(30)
        drained = asyncio.run_coroutine_threadsafe(server.server.drain(), server.loop)
        watch = client.health_stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        for response in watch:  # health turns NOT_SERVING while the call is still in flight
            if response.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                watch.cancel()
                break
        else:
            pytest.fail("health never said NOT_SERVING")
        with pytest.raises(grpc.RpcError) as refused:
            client.embed(["another"])
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert not in_flight.done()
        release_model.set()
        assert len(in_flight.result(30).embeddings) == 1
        assert drained.result(30) is True
        client.close()
    finally:
        release_warm_up.set()
        starter.join(60)
        server.stop()


def test_a_watch_cancelled_while_writing_finishes_that_write_before_the_last():
    """At the drain, the health service's NOT_SERVING wakes each Watch to write while `end_all` ends it:
    gRPC refuses a second write while one is in flight on a call (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), so
    the write the Watch started runs to its end before the stream's last one starts."""
    from grpc_health.v1._async import HealthServicer

    from bertserve.service.grpc.health_watch import WatchStreams

    class Context:  # a call's writes as gRPC takes them: one at a time, each taking a moment
        def __init__(self):
            self.writes, self.in_flight, self.ended = [], 0, None

        async def write(self, message):
            if self.in_flight:
                raise RuntimeError("GRPC_CALL_ERROR_TOO_MANY_OPERATIONS")
            self.in_flight += 1
            try:
                await asyncio.sleep(0.05)
            finally:
                self.in_flight -= 1
            self.writes.append(message.status)

        async def abort(self, code, details):
            self.ended = code
            raise asyncio.CancelledError  # as grpc.aio's abort ends the handler

    async def main():
        health = HealthServicer()
        streams, context = WatchStreams(health), Context()
        watch = asyncio.ensure_future(streams.watch(health_pb2.HealthCheckRequest(), context))
        await asyncio.sleep(0.1)  # SERVING written; the Watch waits for a change
        await health.enter_graceful_shutdown()  # wakes it to write NOT_SERVING ...
        await asyncio.sleep(0.01)  # ... which it starts
        streams.end_all()  # the drain ends it meanwhile
        await asyncio.gather(watch, return_exceptions=True)
        return context

    context = asyncio.run(main())
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert (
        context.writes == [serving, not_serving, not_serving] and context.ended == grpc.StatusCode.UNAVAILABLE
    )
