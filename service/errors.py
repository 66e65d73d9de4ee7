"""Domain errors, raised deep in the service and turned into gRPC status codes in one place
(`service/grpc/rpc_status.py`). Messages name the field and the limit, for the caller to read."""

from __future__ import annotations


class ServiceError(Exception):
    """Base of the errors a caller can be told about."""


class InvalidInput(ServiceError):
    """The request itself is wrong (INVALID_ARGUMENT)."""


class ModelNotFound(ServiceError):
    """The request names a model the server has not loaded (NOT_FOUND)."""


class TaskUnavailable(ServiceError):
    """The model exists but lacks the head the RPC needs (FAILED_PRECONDITION)."""


class Overloaded(ServiceError):
    """The model's queue is full; retry later (RESOURCE_EXHAUSTED)."""


class DeadlineTooShort(ServiceError):
    """The call's deadline passed, or cannot be met by the queue ahead of it (DEADLINE_EXCEEDED)."""


class ShuttingDown(ServiceError):
    """The server is draining and accepts no new calls (UNAVAILABLE)."""


class EngineUnavailable(ShuttingDown):
    """The engine process is down or not ready (UNAVAILABLE): with several workers, a front's calls fail
    with it when the engine is gone."""


class InferenceFailed(ServiceError):
    """ONNX Runtime failed on a batch holding this call's inputs (INTERNAL)."""


class StartupError(Exception):
    """The server cannot start: a bad model repository, settings or runtime. The message is one clear line."""


QUOTE_LIMIT = 64  # characters of client data a status message quotes


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """Client data shortened for a status message: repr() cut at `limit` characters (its size named), a
    long sequence cut to its first items. A message never grows with what the client sent."""
    if isinstance(value, list | tuple):
        if limit < 4:  # deep inside a quoted sequence: its items not shown, so the depth stays bounded
            return f"[... ({len(value)} items)]"
        shown = ", ".join(quote(v, limit // 4) for v in value[:8])
        more = f", ... ({len(value)} items)" if len(value) > 8 else ""
        return f"[{shown}{more}]"
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} {'characters' if isinstance(value, str) else 'bytes'})"
    text = repr(value)
    if len(text) > limit:
        return f"{text[:limit]}... ({len(text)} characters)"
    return text
