"""What a route is: the table entry (`Route`) and the call it handles (`Call`), and the request deadline
header. The route modules and the KServe routes build on these; `app.py` holds the table and routes."""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bertserve.service import errors
from bertserve.service.http.status import Failure, openai_error
from bertserve.service.http.transport import Request, Response

if TYPE_CHECKING:
    from bertserve.service.http.app import HttpFront

TIMEOUT_HEADER = "x-request-timeout"  # seconds, decimal (e.g. "2.5"): the call's deadline
MAX_TIMEOUT_S = 24 * 3600.0


@dataclass
class Call:
    """One routed request: the request, the path's parameters and the deadline (monotonic seconds)."""

    request: Request
    params: dict[str, str]
    deadline: float | None


RouteHandler = Callable[["HttpFront", Call], Awaitable[Response]]


@dataclass
class Route:
    method: str
    template: str  # "/v2/models/{name}/infer": {name} matches one path segment
    handler: RouteHandler
    error_body: Callable[[Failure], Response] = openai_error
    admitted: bool = True  # False: answered while draining (probes, metadata)
    summary: str = ""  # for the OpenAPI document
    pattern: re.Pattern = field(init=False)

    def __post_init__(self) -> None:
        self.pattern = re.compile(
            "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.template)) + "$"
        )

    @property
    def metric_name(self) -> str:
        return f"http:{self.template}"


def request_timeout(request: Request) -> float | None:
    value = request.headers.get(TIMEOUT_HEADER)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise errors.InvalidInput(
            f"{TIMEOUT_HEADER}: must be seconds, more than 0 and at most {MAX_TIMEOUT_S:.0f} (got {value[:32]!r})"
        )
    return seconds
