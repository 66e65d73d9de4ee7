"""KServe v2 REST request and response bodies <-> Python values: the JSON header and the binary tensor data
extension (bytes after the JSON header, whose length `Inference-Header-Content-Length` gives; BYTES elements
4-byte length-prefixed as Triton encodes them), parameters, the text input and the output tensors. A bad
body raises `InvalidInput` (or `HttpError`) naming the field, as the gRPC service's `kserve/tensors.py` does."""

from __future__ import annotations

import numpy as np

from bertserve.service.errors import InvalidInput
from bertserve.service.http.app import Call
from bertserve.service.http.schema import check_content_type, kind_of, parse_json
from bertserve.service.http.status import HttpError
from bertserve.service.kserve.tensors import TEXT_INPUT, decode_bytes_elements, encode_bytes_elements

HEADER_LENGTH = "inference-header-content-length"
INFER_MEDIA_TYPES = ("application/json", "application/octet-stream")
PARAMETER_KINDS = {
    "normalize": bool,
    "truncate": bool,
    "raw_scores": bool,
    "top_k": int,
    "binary_data_output": bool,
}


def split_body(call: Call) -> tuple[dict, bytes]:
    """The JSON header and the binary data after it."""
    request = call.request
    check_content_type(request, INFER_MEDIA_TYPES)
    length = request.headers.get(HEADER_LENGTH)
    if length is None:
        header, binary = request.body, b""
    else:
        if not length.isdigit() or int(length) > len(request.body):
            raise HttpError(
                400,
                f"{HEADER_LENGTH}: must be the JSON header's byte count, at most the body's {len(request.body)}",
            )
        header, binary = request.body[: int(length)], request.body[int(length) :]
    value = parse_json(header, "body" if length is None else "body (JSON header)")
    if not isinstance(value, dict):
        raise HttpError(400, f"body: must be a JSON object (got {kind_of(value)})")
    return value, binary


def parameters_of(value: object, field: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{field}: must be an object (got {kind_of(value)})")
    return value


def parameter(parameters: dict, name: str, default):
    if name not in parameters:
        return default
    value, kind = parameters[name], PARAMETER_KINDS[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = "true or false" if kind is bool else "an integer"
        raise InvalidInput(f"parameters[{name!r}]: must be {expected} (got {kind_of(value)})")
    return value


def flatten(data: object, field: str) -> list:
    if not isinstance(data, list):
        raise InvalidInput(f"{field}.data: must be an array (got {kind_of(data)})")
    if data and all(isinstance(row, list) for row in data):
        data = [item for row in data for item in row]
    return data


def read_texts(body: dict, binary: bytes, max_inputs: int) -> list[str]:
    inputs = body.get("inputs")
    names = (
        [t.get("name") if isinstance(t, dict) else None for t in inputs] if isinstance(inputs, list) else None
    )
    if names != [TEXT_INPUT]:
        raise InvalidInput(f"inputs: expected exactly one input tensor {TEXT_INPUT!r} (BYTES), got {names}")
    tensor, field = inputs[0], f"inputs[{TEXT_INPUT!r}]"
    if tensor.get("datatype") != "BYTES":
        raise InvalidInput(
            f"{field}.datatype: must be BYTES (UTF-8 text), got {tensor.get('datatype')!r:.32}"
        )
    shape = tensor.get("shape")
    if not (
        isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        and (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1))
    ):
        raise InvalidInput(f"{field}.shape: must be [n] or [n, 1] (got {shape!r:.64})")
    count = shape[0]
    if count < 1:
        raise InvalidInput(f"{field}.shape: needs at least one element (got {shape})")
    if count > max_inputs:
        raise InvalidInput(f"{field}.shape: {count} inputs is more than max_inputs_per_request {max_inputs}")
    size = parameters_of(tensor.get("parameters"), f"{field}.parameters").get("binary_data_size")
    if size is not None:
        if "data" in tensor:
            raise InvalidInput(f"{field}.data: must be absent when parameters.binary_data_size is given")
        if not isinstance(size, int) or isinstance(size, bool) or size != len(binary):
            raise InvalidInput(
                f"{field}.parameters.binary_data_size: {size!r:.32} does not match the {len(binary)} binary bytes"
            )
        elements = decode_bytes_elements(binary, f"{field} binary data")
    else:
        if binary:
            raise InvalidInput(
                f"body: {len(binary)} binary bytes after the JSON header, but no input has binary_data_size"
            )
        elements = flatten(tensor.get("data"), field)
        for i, element in enumerate(elements):
            if not isinstance(element, str):
                raise InvalidInput(f"{field}.data[{i}]: must be a string (got {kind_of(element)})")
    if len(elements) != count:
        raise InvalidInput(f"{field}: shape {shape} needs {count} elements, got {len(elements)}")
    texts = []
    for i, element in enumerate(elements):
        if isinstance(element, bytes):
            try:
                element = element.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidInput(f"{field}[{i}]: not valid UTF-8 at byte {exc.start}") from None
        texts.append(element)
    return texts


def output_tensor(name: str, datatype: str, values, binary: bool) -> tuple[dict, bytes]:
    if datatype == "FP32":
        array = np.ascontiguousarray(values, dtype="<f4")
        shape = list(array.shape)
        raw = array.tobytes() if binary else b""
        data = None if binary else array.ravel().tolist()
    else:
        shape = [len(values), len(values[0]) if values else 0]
        flat = [item for row in values for item in row]
        raw = encode_bytes_elements(flat) if binary else b""
        data = None if binary else [item.decode("utf-8", "replace") for item in flat]
    tensor = {"name": name, "datatype": datatype, "shape": shape}
    if binary:
        tensor["parameters"] = {"binary_data_size": len(raw)}
    else:
        tensor["data"] = data
    return tensor, raw
