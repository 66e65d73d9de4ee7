"""Server wiring: load the models, start gRPC (inference, health, reflection) and /metrics, warm up,
report SERVING; on drain, NOT_SERVING at once, refuse new calls, finish accepted ones, stop."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from bertserve.service.batcher import Batcher, BatchLimits, WorkItem
from bertserve.service.errors import StartupError
from bertserve.service.kserve import servicer as kserve
from bertserve.service.metrics import Metrics
from bertserve.service.model_registry import ModelRegistry
from bertserve.service.repository import discover
from bertserve.service.rpc_status import Lifecycle, parsing
from bertserve.service.runtime import GraphSession
from bertserve.service.served_model import ServedModel
from bertserve.service.servicer import InferenceServicer
from bertserve.service.servicer import add_to_server as add_inference_servicer
from bertserve.service.settings import Settings
from bertserve.service.tasks import Task, TaskOptions
from bertserve.service.tasks.fill_mask import mask_positions
from bertserve.v1 import inference_pb2

log = logging.getLogger("bertserve.server")

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name  # bertserve.v1.Inference
WARM_UP_TEXT = "The server warms up before it reports serving."


def load_models(settings: Settings) -> list[ServedModel]:
    """Blocking: checks the repository and creates every ONNX Runtime session."""

    def session(path: str) -> GraphSession:
        return GraphSession(path, settings.provider, settings.intra_op_threads, settings.inter_op_threads)

    files = discover(settings.model_repo, settings.model_specs(), settings.precision)
    models = [ServedModel(f, session) for f in files]
    for model in models:
        longest = model.manifest.max_length
        if settings.max_batch_tokens < longest:
            raise StartupError(
                f"setting max_batch_tokens ({settings.max_batch_tokens}) is less than model "
                f"{model.name}'s max_length {longest}"
            )
    return models


def _warm_up(model: ServedModel) -> None:
    """Blocking: one batch through every task's graphs, so the first real call pays no first-run cost."""
    encoded = model.tokenizer.encode([WARM_UP_TEXT], truncate=True)[0]
    items = []
    for task in model.tasks:
        positions = None
        ids = encoded.ids
        if task is Task.FILL_MASK:
            ids = ids.copy()
            ids[1] = model.manifest.tasks.fill_mask.mask_token_id
            positions = mask_positions(ids, model.manifest.tasks.fill_mask.mask_token_id)
        items.append(
            WorkItem(ids, encoded.type_ids, TaskOptions(task), future=None, mask_positions=positions)
        )
    model.compute(items)
    if model.attention is not None:
        model.attention.run(encoded.ids, encoded.type_ids, [0], [0])


def add_health_servicer(health: HealthServicer, server: grpc.aio.Server) -> None:
    """grpc.health.v1 with requests parsed by `rpc_status.parsing`: junk bytes get INVALID_ARGUMENT (the
    generated registration would answer UNKNOWN)."""
    service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    reply = health_pb2.HealthCheckResponse.SerializeToString
    handlers = {}
    for method in service.methods:
        register = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        behaviour = parsing(getattr(health_pb2, method.input_type.name), getattr(health, method.name))
        handlers[method.name] = register(behaviour, response_serializer=reply)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


class InferenceServer:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = Metrics()
        self.metrics.export_limits(settings)
        self.lifecycle = Lifecycle()
        self.health = HealthServicer()
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.models: list[ServedModel] = []
        self._server: grpc.aio.Server | None = None
        self._cpu = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bertserve-cpu")
        self._model_threads: list[ThreadPoolExecutor] = []

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
        self.models = await loop.run_in_executor(self._cpu, load_models, s)
        registry = ModelRegistry(self.models)
        limits = BatchLimits(
            s.max_batch_size,
            s.max_batch_tokens,
            s.max_queue_delay_ms / 1000,
            s.max_queue_inputs,
            s.max_padding_ratio,
        )
        for model in self.models:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"bertserve-{model.name}")
            self._model_threads.append(executor)
            observer = self.metrics.observer(model.name, model.files.encoder_key)
            model.batcher = Batcher(model.name, model.compute, limits, executor, observer)
            model.executor = executor
            self.metrics.model_info.labels(
                model.name,
                str(model.version),
                model.precision,
                model.provider,
                ",".join(t.value for t in model.tasks),
            ).set(1)
            log.info(
                "model %s v%s: tasks %s, %s on %s",
                model.name,
                model.version,
                ",".join(t.value for t in model.tasks),
                model.precision,
                model.provider,
            )

        size_options = [
            ("grpc.max_receive_message_length", s.max_message_bytes),
            ("grpc.max_send_message_length", s.max_message_bytes),
        ]
        self._server = grpc.aio.server(options=size_options)
        servicer = InferenceServicer(registry, s, self.metrics, self.lifecycle, self._cpu)
        add_inference_servicer(servicer, self._server)
        kserve_service = kserve.add_to_server(servicer, self.health, self._server)  # KServe v2 protocol
        add_health_servicer(self.health, self._server)
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
        await self._server.start()
        for model in self.models:
            model.batcher.start()
        if s.metrics_port >= 0:
            try:
                self.metrics_port = self.metrics.serve_http(s.host, s.metrics_port)
            except OSError as exc:
                raise StartupError(
                    f"setting metrics_port: cannot listen on {s.host}:{s.metrics_port}: {exc}"
                ) from None
        for model, executor in zip(self.models, self._model_threads, strict=True):
            await loop.run_in_executor(executor, _warm_up, model)
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("ready in %.1fs", time.perf_counter() - started)

    async def drain(self) -> bool:
        """NOT_SERVING at once, new calls refused, accepted calls finished within the grace period.
        Returns True when every accepted call finished in time."""
        self.lifecycle.accepting = False
        await self.health.enter_graceful_shutdown()
        grace = self.settings.grace_period_s
        log.info("draining: %d calls in flight, grace period %.1fs", self.lifecycle.in_flight, grace)
        finished = await self.lifecycle.wait_idle(grace)
        if not finished:
            log.warning("grace period over with %d calls still in flight", self.lifecycle.in_flight)
        await self.stop(finish_queued=finished)
        return finished

    async def stop(self, finish_queued: bool = True) -> None:
        self.lifecycle.accepting = False
        for model in self.models:
            if model.batcher is not None and model.batcher.running:
                await (model.batcher.close() if finish_queued else model.batcher.abort())
        if self._server is not None:
            await self._server.stop(grace=1.0)
        self.metrics.stop_http()
        for executor in (*self._model_threads, self._cpu):
            executor.shutdown(wait=False, cancel_futures=True)
