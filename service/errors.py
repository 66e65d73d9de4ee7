"""Domain errors, raised deep in the service and turned into gRPC status codes in one place
(`service/rpc_status.py`). Messages name the field and the limit, for the caller to read."""

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


class InferenceFailed(ServiceError):
    """ONNX Runtime failed on a batch holding this call's inputs (INTERNAL)."""


class StartupError(Exception):
    """The server cannot start: a bad model repository, settings or runtime. The message is one clear line."""
