"""Calls made with Triton's own client (`tritonclient.grpc`), run in a child process only.

tritonclient's generated code and bertserve's `bertserve.kserve` both define the protobuf package
`inference`; one process cannot import both (protobuf refuses the duplicate symbols). Tests therefore
run these functions in a spawned worker (`child()`) and get plain values back: numpy arrays, dicts, and
errors as ("STATUS_NAME", message). tritonclient is imported inside the functions, never here.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def child() -> ProcessPoolExecutor:
    """One spawned worker that runs this module's functions."""
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def _client(address: str):
    import tritonclient.grpc as triton

    return triton.InferenceServerClient(address)


def _error(exc) -> tuple[str, str]:
    return str(exc.status()).removeprefix("StatusCode."), exc.message()


def protocol_descriptor() -> bytes:
    """tritonclient's serialized FileDescriptorProto of grpc_service.proto."""
    from tritonclient.grpc import service_pb2

    return service_pb2.DESCRIPTOR.serialized_pb


def probes(address: str, models: list[str]) -> dict:
    client = _client(address)
    return {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "models": {name: client.is_model_ready(name) for name in models},
    }


def metadata(address: str, model: str | None = None):
    """Server metadata, or a model's metadata (as JSON dicts); an error as (status, message)."""
    import tritonclient.grpc as triton

    client = _client(address)
    try:
        if model is None:
            return client.get_server_metadata(as_json=True)
        return client.get_model_metadata(model, as_json=True)
    except triton.InferenceServerException as exc:
        return _error(exc)


def repository_index(address: str) -> dict:
    return _client(address).get_model_repository_index(as_json=True)


def infer(
    address: str,
    model: str,
    values: np.ndarray,
    datatype: str = "BYTES",
    input_name: str = "text",
    outputs: list[str] | None = None,
    parameters: dict | None = None,
    request_id: str = "",
    class_count: int = 0,
):
    """{"outputs": {name: array}, "model_version", "id"} or (status, message)."""
    import tritonclient.grpc as triton

    tensor = triton.InferInput(input_name, list(values.shape), datatype)
    tensor.set_data_from_numpy(values)
    requested = (
        [triton.InferRequestedOutput(name, class_count=class_count) for name in outputs] if outputs else None
    )
    try:
        result = _client(address).infer(
            model, [tensor], outputs=requested, parameters=parameters, request_id=request_id
        )
    except triton.InferenceServerException as exc:
        return _error(exc)
    response = result.get_response()
    return {
        "outputs": {o.name: result.as_numpy(o.name) for o in response.outputs},
        "model_version": response.model_version,
        "id": response.id,
    }
