"""Plain HTTP probes and the OpenAPI document; answered while draining too.

GET /health   200 {"status": "live"} while the process serves HTTP at all (liveness)
GET /ready    200 {"ready": true} once warmed up; 503 {"ready": false} before that and while draining
GET /openapi.json  the OpenAPI 3.1 document of every route
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertserve.service.http.routing import Call, Route
from bertserve.service.http.transport import Response, json_response

if TYPE_CHECKING:
    from bertserve.service.http.app import HttpFront


async def health(front: HttpFront, call: Call) -> Response:
    return json_response(200, {"status": "live"})


async def ready(front: HttpFront, call: Call) -> Response:
    is_ready = front.ready()
    return json_response(200 if is_ready else 503, {"ready": is_ready})


async def openapi(front: HttpFront, call: Call) -> Response:
    from bertserve.service.http.openapi import document

    return json_response(200, document(front.routes))


ROUTES = [
    Route("GET", "/health", health, admitted=False, summary="Liveness: 200 while the process serves"),
    Route(
        "GET", "/ready", ready, admitted=False, summary="Readiness: 200 when ready, 503 before and draining"
    ),
    Route("GET", "/openapi.json", openapi, admitted=False, summary="This OpenAPI document"),
]
