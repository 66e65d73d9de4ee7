"""What the HTTP transport and the routes exchange: limits, requests, responses and their bytes."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int
    max_header_bytes: int = 32 * 1024  # request line and header fields together
    max_connections: int = 1024
    max_body_bytes_in_flight: int = 64 * 1024 * 1024  # request bodies held, all connections together
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 30.0


@dataclass
class Request:
    method: str
    path: str  # percent-encoded, as sent
    query: str
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    body: bytes


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response]]


def json_response(status: int, value: object, headers: list[tuple[str, str]] | None = None) -> Response:
    body = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    return Response(status, body, "application/json", headers or [])


class Reject(Exception):
    """Raised inside a parser callback: answer `status` with `message` and close the connection."""

    def __init__(self, status: int, message: str, headers: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or []


def serialize(response: Response, close: bool, head: bool = False) -> bytes:
    """The response's bytes; `head`: without its body (an answer to HEAD), Content-Length as for GET."""
    reason = HTTPStatus(response.status).phrase if response.status in HTTPStatus._value2member_map_ else ""
    lines = [f"HTTP/1.1 {response.status} {reason}"]
    if response.content_type:
        lines.append(f"content-type: {response.content_type}")
    lines.append(f"content-length: {len(response.body)}")
    lines.extend(f"{name}: {value}" for name, value in response.headers)
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else response.body)
