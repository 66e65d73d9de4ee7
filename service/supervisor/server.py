"""Server wiring: load the models, start gRPC (inference, health, reflection) and /metrics, warm up,
report SERVING; on drain, NOT_SERVING at once, refuse new calls, finish accepted ones, stop."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from bertserve.kserve import open_inference_pb2
from bertserve.service.core.core import InferenceCore
from bertserve.service.core.lifecycle import Lifecycle
from bertserve.service.core.remote_engine import EngineLink
from bertserve.service.engine import model_registry
from bertserve.service.engine.encoders import EncoderGroup
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.errors import StartupError
from bertserve.service.grpc.admission import Admission
from bertserve.service.grpc.admission import server_options as admission_options
from bertserve.service.grpc.health_watch import WatchStreams
from bertserve.service.grpc.native.front import NativeFront
from bertserve.service.grpc.native.transport import NativeUnavailable
from bertserve.service.grpc.native.unary_calls import HandlerTable
from bertserve.service.grpc.request_reads import RequestReads
from bertserve.service.grpc.rpc_status import parsing
from bertserve.service.grpc.servicer import InferenceServicer
from bertserve.service.grpc.servicer import add_to_server as add_inference_servicer
from bertserve.service.http.app import HttpFront
from bertserve.service.kserve import http_routes as kserve_http
from bertserve.service.kserve import servicer as kserve
from bertserve.service.metrics import Metrics
from bertserve.service.settings import Settings
from bertserve.service.supervisor import memory_bounds
from bertserve.service.supervisor.scratch import ScratchDir
from bertserve.service.thread_names import naming
from bertserve.v1 import inference_pb2

log = logging.getLogger("bertserve.server")

# After the grace period: how long the streams still open get to send their UNAVAILABLE status.
STREAMS_END_S = 1.0
SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name  # bertserve.v1.Inference
# The services whose unary methods the native port serves too (service/grpc/native/).
NATIVE_SERVICES = (
    inference_pb2.DESCRIPTOR.services_by_name["Inference"],
    open_inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
)


def _warm_up(encoder: EncoderGroup) -> None:
    """Blocking: one batch through every graph of the encoder's models, so the first real call pays no
    first-run cost."""
    encoder.warm_up()


def add_health_servicer(health: HealthServicer, server: grpc.aio.Server, watches: WatchStreams) -> None:
    """grpc.health.v1 with requests parsed by `rpc_status.parsing`: junk bytes get INVALID_ARGUMENT (the
    generated registration would answer UNKNOWN). Watch streams end at the drain (`watches`)."""
    service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    reply = health_pb2.HealthCheckResponse.SerializeToString
    handlers = {}
    for method in service.methods:
        register = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        method_of = watches.watch if method.name == "Watch" else getattr(health, method.name)
        behaviour = parsing(getattr(health_pb2, method.input_type.name), method_of)
        handlers[method.name] = register(behaviour, response_serializer=reply)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


def _answer_dimension(model: ServedModel) -> int:
    """Floats per input in an embedding answer (streams answer embeddings)."""
    embed = model.manifest.tasks.embed
    return embed.dimension if embed else model.manifest.dimensions.hidden_size


@dataclass(frozen=True)
class FrontRole:
    """This server is front `index` of several: it shares its ports with the others (the supervisor holds
    them) and the engine process at `engine` batches and computes."""

    engine: str
    index: int


class InferenceServer:
    def __init__(self, settings: Settings, front: FrontRole | None = None):
        self.settings = settings
        self.front = front
        self.engine: EngineLink | None = None
        self.metrics = Metrics(multiprocess=front is not None)  # the supervisor serves one scrape
        self.metrics.export_limits(settings)
        self.lifecycle = Lifecycle()
        self.health = HealthServicer()
        self.watches = WatchStreams(self.health)
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.http: HttpFront | None = None  # HTTP beside gRPC (service/http/), through the same core
        self.http_port: int | None = None
        # the native transport (service/grpc/native/): on native_port, or on port (grpc_transport native)
        self.native: NativeFront | None = None
        self.native_port: int | None = None
        self._relay_dir: ScratchDir | None = None  # the native port's relay socket to the gRPC server
        self.serving = False  # warmed up (HTTP readiness = serving and not draining)
        self.models: list[ServedModel] = []
        self.core: InferenceCore | None = None  # the protocol-free inference core every front calls
        self._server: grpc.aio.Server | None = None
        self._cpu = ThreadPoolExecutor(2, "bertserve-cpu", naming("bs-cpu"))

    async def _set_health(self, status: int) -> None:
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    def _credentials(self) -> grpc.ServerCredentials | None:
        s = self.settings
        if s.tls_cert is None:
            return None
        ca = s.tls_client_ca.read_bytes() if s.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(s.tls_key.read_bytes(), s.tls_cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )

    async def start(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        front = self.front is not None
        registry = await loop.run_in_executor(self._cpu, model_registry.load, s, front)
        self.models = registry.ordered
        if front:
            self.engine = EngineLink(self.front.engine, on_lost=self._engine_lost)
        self.core = InferenceCore(registry, s, self.metrics, self._cpu, self.engine)

        size_options = [
            ("grpc.max_receive_message_length", s.max_message_bytes),
            ("grpc.max_send_message_length", s.max_message_bytes),
            # gRPC sets SO_REUSEPORT by default: a second server on a taken port would silently share it.
            # Fronts of one server share theirs (the supervisor checked it was free, and holds it).
            ("grpc.so_reuseport", int(front)),
        ]
        reads = RequestReads(
            s.max_request_bytes_in_flight, s.max_message_bytes, s.http_read_timeout_s, self.metrics
        )
        self.admission = Admission(
            s.concurrent_rpcs_limit(),
            self.metrics,
            reads,
            s.max_concurrent_streams,
            s.max_request_bytes_in_flight,
        )
        self._server = grpc.aio.server(
            options=size_options + admission_options(self.admission.limit), interceptors=[self.admission]
        )
        table = HandlerTable(self._server)  # the unary handlers, for the native port too
        add_inference_servicer(InferenceServicer(self.core, self.lifecycle), table)
        # the KServe v2 protocol, on the same port and core
        kserve_service = kserve.add_to_server(self.core, self.health, self.lifecycle, table)
        add_health_servicer(self.health, table, self.watches)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                kserve_service,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self._server,
        )
        native_main = s.grpc_transport == "native"  # then the native transport serves `port`
        if not native_main:
            self._listen(s)
        relay = ""
        if s.native_port >= 0 or native_main:  # the native transport relays streams here, through a socket
            # only this user opens
            self._relay_dir = ScratchDir("relay")
            relay = f"unix:{self._relay_dir.path}/grpc.sock"
            if self._server.add_insecure_port(relay) == 0:
                raise StartupError(f"cannot listen on {relay} for the native transport's streams")
        await self._server.start()
        await self.core.start()
        if s.metrics_port >= 0:
            try:
                self.metrics_port = self.metrics.serve_http(s.host, s.metrics_port)
            except OSError as exc:
                raise StartupError(
                    f"setting metrics_port: cannot listen on {s.host}:{s.metrics_port}: {exc}"
                ) from None
        if s.http_port >= 0:
            self.http = HttpFront(
                self.core, s, self.metrics, self.lifecycle, self._ready, extra_routes=kserve_http.ROUTES
            )
            try:
                self.http_port = await self.http.start(s.host, s.http_port, reuse_port=front)
            except OSError as exc:
                raise StartupError(
                    f"setting http_port: cannot listen on {s.host}:{s.http_port}: {exc}"
                ) from None
            log.info("serving HTTP on %s://%s:%d/", self.http.scheme, s.host, self.http_port)
        if s.native_port >= 0 or native_main:
            setting = "port" if native_main else "native_port"
            bound = await self._start_native(s, table.unary(NATIVE_SERVICES), relay, setting)
            if native_main:
                self.port = bound
            else:
                self.native_port = bound
        if front:
            await self._connect_engine()
        else:
            for encoder in self.core.encoders:
                await loop.run_in_executor(encoder.executor, _warm_up, encoder)
        self._describe_models()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self.serving = True
        log.info("ready in %.1fs", time.perf_counter() - started)
        dimension = max((_answer_dimension(m) for m in self.models), default=0)
        worst = memory_bounds.bounds(s, dimension, tls=s.tls_cert is not None)
        log.info(
            "clients can make the server hold at most %s beyond its models", memory_bounds.describe(worst)
        )

    def _listen(self, s: Settings) -> None:
        """The gRPC server on `port` (grpc_transport python)."""
        address = f"{s.host}:{s.port}"
        credentials = self._credentials()
        try:
            if credentials is None:
                self.port = self._server.add_insecure_port(address)
            else:
                self.port = self._server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            raise StartupError(f"setting port: cannot listen on {address}: {exc}") from None
        if self.port == 0:
            raise StartupError(f"setting port: cannot listen on {address}")

    async def _start_native(
        self, s: Settings, handlers: dict[str, grpc.RpcMethodHandler], relay: str, setting: str
    ) -> int:
        """The native transport on the port of `setting`, relaying streams to `relay`; returns the port."""
        self.native = NativeFront(self.core, s, self.lifecycle, handlers)
        tls = None
        if s.tls_cert is not None:
            ca = s.tls_client_ca.read_bytes() if s.tls_client_ca else b""
            tls = (s.tls_cert.read_bytes(), s.tls_key.read_bytes(), ca)
        try:
            port = await self.native.start(s.host, getattr(s, setting), tls, self.front is not None, relay)
        except (OSError, NativeUnavailable) as exc:
            raise StartupError(f"setting {setting}: {exc}") from None
        what = "the main port" if setting == "port" else "the native port"
        log.info(
            "serving %s with the native transport on %s:%d (%d unary methods; streams relayed)",
            what, s.host, port, len(handlers),
        )  # fmt: skip
        return port

    async def _connect_engine(self) -> None:
        """Waits for the engine (warm once it answers) and takes its providers as the models'."""
        encoders = await self.engine.connect({m.name: m.version for m in self.models})
        for group in self.core.encoders:
            provider, device = encoders[group.name]
            for session in group.sessions:
                session.provider, session.device = provider, device
        for model in self.models:
            for head in (model.mlm_head, model.classifier_head):
                if head is not None:
                    head.provider, head.device = encoders[model.encoder.name]
        self.core.refresh_infos()

    def _engine_lost(self) -> None:
        """The engine process is gone: its calls failed with UNAVAILABLE; health says NOT_SERVING."""
        self.serving = False
        asyncio.ensure_future(self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING))

    def _describe_models(self) -> None:
        for model in self.models:
            tasks = ",".join(t.value for t in model.tasks)
            labels = (model.name, str(model.version), model.precision, model.provider, tasks)
            self.metrics.model_info.labels(*labels).set(1)
            log.info(
                "model %s v%s: tasks %s, %s on %s, encoder %s",
                *labels[:2],
                tasks,
                model.precision,
                model.provider,
                model.encoder.name,
            )

    def _ready(self) -> bool:
        return self.serving and self.lifecycle.accepting

    async def drain(self) -> bool:
        """NOT_SERVING at once, new calls refused, accepted calls finished within the grace period.
        Returns True when every accepted call finished in time."""
        self.lifecycle.accepting = False
        if self.native is not None:
            self.native.drain()
        if self.http is not None:
            self.http.drain()  # readiness false; answers close their connections; idle ones closed now
        await self.health.enter_graceful_shutdown()
        self.watches.end_all()
        grace = self.settings.grace_period_s
        log.info("draining: %d calls in flight, grace period %.1fs", self.lifecycle.in_flight, grace)
        finished = await self.lifecycle.wait_idle(grace)
        if not finished:
            log.warning("grace period over with %d calls still in flight", self.lifecycle.in_flight)
            self.lifecycle.close()  # open streams end with UNAVAILABLE before the server stops
            await self.lifecycle.wait_idle(STREAMS_END_S)
        await self.stop(finish_queued=finished)
        return finished

    async def stop(self, finish_queued: bool = True) -> None:
        self.lifecycle.accepting = False
        self.watches.end_all()
        if self.native is not None:  # its held calls answered first, within what is left of the grace period
            await self.native.stop(self.settings.grace_period_s if finish_queued else 0.0)
        if self.core is not None:
            await self.core.close(finish_queued)
        if self._server is not None:
            await self._server.stop(grace=1.0)
        if self._relay_dir is not None:
            self._relay_dir.remove()
        if self.http is not None:
            await self.http.stop()
        self.metrics.stop_http()
        if self.core is not None:
            self.core.shutdown_threads()
        if self.engine is not None:
            self.engine.close()
        self._cpu.shutdown(wait=False, cancel_futures=True)
