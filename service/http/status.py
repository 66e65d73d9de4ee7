"""The one place where errors become HTTP answers: domain errors (`service/errors.py`) and errors of the
HTTP layer itself (bad JSON, wrong content type, unknown route) -> status code, the gRPC status name the
metrics carry, and the error body.

    INVALID_ARGUMENT 400   NOT_FOUND 404   FAILED_PRECONDITION 422   RESOURCE_EXHAUSTED 429 (Retry-After)
    DEADLINE_EXCEEDED 504  UNAVAILABLE 503 (draining; Retry-After)   INTERNAL 500

Error bodies: OpenAI's shape `{"error": {"message", "type", "param", "code"}}` on every route but the
KServe v2 ones (`code` is the gRPC status name, `param` the field the message names); the KServe v2 REST
routes answer `{"error": "message"}` as that protocol specifies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bertserve.service import errors
from bertserve.service.http.transport import Response, json_response

RETRY_AFTER_S = "1"  # for 429 (queue full) and 503 (draining, too many connections)

STATUS_OF_ERROR: dict[type[errors.ServiceError], tuple[int, str]] = {
    errors.InvalidInput: (400, "INVALID_ARGUMENT"),
    errors.ModelNotFound: (404, "NOT_FOUND"),
    errors.TaskUnavailable: (422, "FAILED_PRECONDITION"),
    errors.Overloaded: (429, "RESOURCE_EXHAUSTED"),
    errors.DeadlineTooShort: (504, "DEADLINE_EXCEEDED"),
    errors.ShuttingDown: (503, "UNAVAILABLE"),
    errors.InferenceFailed: (500, "INTERNAL"),
}
CODE_OF_STATUS = {status: code for status, code in STATUS_OF_ERROR.values()} | {
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",  # the request was not received in time
    413: "RESOURCE_EXHAUSTED",  # gRPC's answer to a message over max_message_bytes
    415: "INVALID_ARGUMENT",
    431: "RESOURCE_EXHAUSTED",
}
OPENAI_TYPE = {429: "rate_limit_error", 503: "server_error", 504: "timeout_error"}
MAX_MESSAGE_CHARS = 1024  # an error message never grows with what the client sent
FIELD = re.compile(r"^([A-Za-z_][\w.]*(?:\[[^\]]*\])*(?:\.[\w]+)*): ")


class HttpError(Exception):
    """An error of the HTTP layer (not of the domain): bad JSON, content type, route, method."""

    def __init__(self, status: int, message: str, headers: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or []


@dataclass
class Failure:
    status: int
    code: str  # the gRPC status name, for metrics and the body
    message: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def param(self) -> str | None:
        """The request field the message names ("inputs[2]: ..." -> "inputs[2]"), if any."""
        match = FIELD.match(self.message)
        return match[1] if match else None


def capped(message: str) -> str:
    """`message` cut to MAX_MESSAGE_CHARS: the last guard for a message that quotes client data whole."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return f"{message[: MAX_MESSAGE_CHARS - 48]}... (message cut from {len(message)} characters)"


def failure_of(exc: BaseException) -> Failure:
    """The HTTP answer to `exc`: a domain error, an HttpError, or anything else (500, not described)."""
    if isinstance(exc, HttpError):
        return Failure(
            exc.status, CODE_OF_STATUS.get(exc.status, "INVALID_ARGUMENT"), capped(exc.message), exc.headers
        )
    if isinstance(exc, errors.ServiceError):
        for kind in type(exc).__mro__:
            if kind in STATUS_OF_ERROR:
                status, code = STATUS_OF_ERROR[kind]
                retry = [("retry-after", RETRY_AFTER_S)] if status in (429, 503) else []
                return Failure(status, code, capped(str(exc)), retry)
    return Failure(500, "INTERNAL", f"internal error: {type(exc).__name__}")


def failure_of_status(status: int, message: str) -> Failure:
    """A request refused by the transport before routing (413, 431, 408, 400, 503)."""
    retry = [("retry-after", RETRY_AFTER_S)] if status in (429, 503) else []
    return Failure(status, CODE_OF_STATUS.get(status, "INVALID_ARGUMENT"), message, retry)


def openai_error(failure: Failure) -> Response:
    kind = OPENAI_TYPE.get(
        failure.status, "server_error" if failure.status >= 500 else "invalid_request_error"
    )
    body = {"error": {"message": failure.message, "type": kind, "param": failure.param, "code": failure.code}}
    return json_response(failure.status, body, list(failure.headers))


def kserve_error(failure: Failure) -> Response:
    return json_response(failure.status, {"error": failure.message}, list(failure.headers))
