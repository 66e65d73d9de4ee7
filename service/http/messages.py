"""What the HTTP transport and the routes exchange: limits, requests, responses and their bytes."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import numpy as np
import orjson


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int
    max_header_bytes: int = 32 * 1024  # request line and header fields together
    max_connections: int = 1024
    max_body_bytes_in_flight: int = 64 * 1024 * 1024  # request bodies held, all connections together
    max_reply_bytes_in_flight: int = 64 * 1024 * 1024  # replies their clients have not taken, all together
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
    return Response(status, json_bytes(value), "application/json", headers or [])


def json_bytes(value: object) -> bytes:
    """`value` as compact UTF-8 JSON; numpy arrays as lists (float32: each float's shortest form that reads
    back as the same float32, as TEI writes them). orjson writes floats far faster than the json module
    (docs/http.md); what it refuses (a lone surrogate in a string, an integer beyond 64 bits, a key that
    is not a string) goes through the json module, escaped. NaN and infinities have no JSON: ValueError,
    as the json module raises (orjson would write null)."""
    try:
        body = orjson.dumps(value, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        return json.dumps(value, default=_plain, separators=(",", ":"), allow_nan=False).encode()
    if b"null" in body and not _finite(value):
        raise ValueError("a reply holds NaN or an infinity, which JSON cannot carry")
    return body


def _finite(value: object) -> bool:
    """No NaN or infinity anywhere in `value` (dicts, lists, numpy arrays and scalars, floats)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, np.ndarray | np.floating):
            if np.issubdtype(item.dtype, np.floating) and not np.isfinite(item).all():
                return False
        elif isinstance(item, float) and not math.isfinite(item):
            return False
    return True


def _plain(value: object) -> object:
    """What orjson hands back: a numpy array it does not write itself (not C-contiguous) or a numpy
    scalar, as Python values."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


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
