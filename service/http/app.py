"""The HTTP front: routes, and the one wrapper every routed request goes through (refusal while draining,
the request timeout, error mapping via `status.py`, metrics, call tracking for the drain).

Each route only translates JSON <-> one call of the inference core (`service/core/core.py`), so HTTP and gRPC
calls share batches, limits and error messages. Route tables live in `openai_routes.py`, `rerank_routes.py`
(rerank and score in Jina's, Cohere's, TEI's and vLLM's shapes), `tei_routes.py` and `cohere_routes.py`
(embeddings in TEI's and Cohere's shapes), `embed_routes.py` and `bertserve_routes.py` and `probes.py` (the
KServe v2 routes, `service/kserve/http_routes.py`, are passed in by the supervisor); `routing.py` defines a
route; `openapi.py` describes them.

Metrics: `bertserve_requests_total{rpc="http:<path template>", code=<gRPC status name>}` and
`bertserve_request_duration_seconds{rpc="http:<path template>"}`, e.g. rpc="http:/v1/embeddings"; requests
refused before routing count as rpc="http:(unread)" (413, 431, 408, 400 malformed) or
rpc="http:(unrouted)" (404, 405). The transport's own counts (connections by outcome, open connections,
refusals by status) are bertserve_http_connections_total, bertserve_http_connections_open and
bertserve_http_rejected_total (`_TransportMetrics`).

HEAD is answered on every GET route, as GET without the body.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from urllib.parse import unquote

from bertserve.service import errors
from bertserve.service.core.core import InferenceCore, deadline_after
from bertserve.service.core.lifecycle import Lifecycle
from bertserve.service.http import (
    bertserve_routes,
    cohere_routes,
    embed_routes,
    openai_routes,
    probes,
    rerank_routes,
    tei_routes,
)
from bertserve.service.http.accept import raise_fd_limit
from bertserve.service.http.connections import HttpEvents, HttpServer
from bertserve.service.http.routing import TIMEOUT_HEADER, Call, Route, request_timeout
from bertserve.service.http.status import Failure, HttpError, failure_of, failure_of_status, openai_error
from bertserve.service.http.transport import HttpLimits, Request, Response
from bertserve.service.metrics import Metrics
from bertserve.service.settings import Settings

log = logging.getLogger("bertserve.http")

UNREAD, UNROUTED = "http:(unread)", "http:(unrouted)"
FD_RESERVE = 1024  # open files kept for gRPC, models, logs and metrics beside HTTP connections


class _TransportMetrics(HttpEvents):
    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self._outcomes: dict[str, object] = {}

    def connection(self, outcome: str) -> None:
        series = self._outcomes.get(outcome)
        if series is None:
            series = self._outcomes[outcome] = self.metrics.http_connections.labels(outcome)
        series.inc()

    def open_connections(self, count: int) -> None:
        self.metrics.http_connections_open.set(count)

    def rejected(self, status: int) -> None:
        self.metrics.http_rejected.labels(str(status)).inc()


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """HTTPS with the gRPC port's certificate when TLS is configured (and client certificates required
    with `tls_client_ca`), so HTTP is never the plaintext side door of a TLS server."""
    if settings.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    if settings.tls_client_ca is not None:
        context.load_verify_locations(settings.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class HttpFront:
    """Routes HTTP requests to the inference core. `ready()` says whether the server is ready (warmed up
    and not draining); `lifecycle` is shared with the gRPC servicers, so the drain waits for both."""

    def __init__(
        self,
        core: InferenceCore,
        settings: Settings,
        metrics: Metrics,
        lifecycle: Lifecycle,
        ready: Callable[[], bool],
        extra_routes: Sequence[Route] = (),
    ):
        self.core, self.settings, self.metrics, self.lifecycle, self.ready = (
            core,
            settings,
            metrics,
            lifecycle,
            ready,
        )
        self.started_at = int(time.time())
        self.routes: list[Route] = [
            *probes.ROUTES,
            *openai_routes.ROUTES,
            *rerank_routes.ROUTES,
            *tei_routes.ROUTES,
            *cohere_routes.ROUTES,
            *embed_routes.ROUTES,
            *bertserve_routes.ROUTES,
            *extra_routes,  # the KServe v2 REST routes: the supervisor passes them (service/kserve/)
        ]
        self._static = {(r.method, r.template): r for r in self.routes if "{" not in r.template}
        self._templated = [r for r in self.routes if "{" in r.template]
        self.limits = HttpLimits(
            max_body_bytes=settings.max_message_bytes,
            max_connections=settings.http_max_connections,
            max_body_bytes_in_flight=settings.http_max_body_bytes_in_flight,
            max_reply_bytes_in_flight=settings.http_max_reply_bytes_in_flight,
            header_timeout_s=settings.http_read_timeout_s,
            body_timeout_s=settings.http_read_timeout_s,
            keep_alive_s=settings.http_keep_alive_s,
        )
        self.server = HttpServer(self.handle, self.limits, self._refused, _TransportMetrics(metrics))

    def _refused(self, status: int, message: str) -> Response:
        failure = failure_of_status(status, message)
        self.metrics.requests.labels(UNREAD, failure.code).inc()
        return openai_error(failure)

    def match(self, request: Request) -> tuple[Route, dict[str, str]]:
        method = "GET" if request.method == "HEAD" else request.method  # the transport drops the body
        route = self._static.get((method, request.path))
        if route is not None:
            return route, {}
        allowed = []
        for candidate in (*self._static.values(), *self._templated):
            found = candidate.pattern.match(request.path)
            if found is None:
                continue
            if candidate.method == method:
                return candidate, {k: unquote(v) for k, v in found.groupdict().items()}
            allowed.extend(("GET", "HEAD") if candidate.method == "GET" else (candidate.method,))
        if allowed:
            raise HttpError(
                405,
                f"method {request.method[:16]} is not allowed on {request.path[:128]}",
                [("allow", ", ".join(allowed))],
            )
        raise HttpError(404, f"path: no route {request.path[:128]!r} (see /openapi.json)")

    async def handle(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            route, params = self.match(request)
        except HttpError as exc:
            failure = failure_of(exc)
            self.metrics.requests.labels(UNROUTED, failure.code).inc()
            return openai_error(failure)
        name, code = route.metric_name, "OK"
        if route.admitted and not self.lifecycle.accepting:
            failure = failure_of(errors.ShuttingDown("the server is shutting down; retry elsewhere"))
            self.metrics.requests.labels(name, failure.code).inc()
            return route.error_body(failure)
        self.lifecycle.enter()
        scope = None
        try:
            timeout = request_timeout(request)
            call = Call(request, params, deadline_after(timeout))
            async with asyncio.timeout(timeout) as scope:
                response = await route.handler(self, call)
            if len(response.body) > self.settings.max_message_bytes:
                raise errors.InvalidInput(
                    f"response: {len(response.body)} bytes is more than max_message_bytes "
                    f"{self.settings.max_message_bytes}; ask for less in one call (fewer or shorter inputs, "
                    "a smaller top_k, fewer attention layers or heads; encoding_format base64 on /v1/embeddings)"
                )
            return response
        except asyncio.CancelledError:  # the client disconnected
            code = "CANCELLED"
            raise
        except Exception as exc:
            if isinstance(exc, TimeoutError) and scope is not None and scope.expired():
                failure = Failure(
                    504, "DEADLINE_EXCEEDED", f"{TIMEOUT_HEADER}: the request's deadline passed"
                )
            else:
                failure = failure_of(exc)
                if not isinstance(exc, errors.ServiceError | HttpError):
                    log.exception("%s failed", name)
            code = failure.code
            return route.error_body(failure)
        finally:
            self.lifecycle.leave()
            self.metrics.requests.labels(name, code).inc()
            self.metrics.request_duration.labels(name).observe(time.perf_counter() - started)

    # --- lifecycle -----------------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.settings.tls_cert is not None else "http"

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        files = raise_fd_limit()
        needed = 2 * self.limits.max_connections + FD_RESERVE  # connections, and refusals being closed
        if files < needed:
            raise errors.StartupError(
                f"setting http_max_connections: {self.limits.max_connections} connections need {needed} "
                f"open files (twice, for refusals being closed, and {FD_RESERVE} more); this process may open "
                f"{files} (ulimit -n)"
            )
        return await self.server.start(host, port, tls_context(self.settings), reuse_port)

    def drain(self) -> None:
        self.server.drain()

    async def stop(self) -> None:
        await self.server.stop()
