"""KServe v2 REST request and response bodies <-> Python values: the JSON header and the binary tensor data
extension (bytes after the JSON header, whose length `Inference-Header-Content-Length` gives; BYTES elements
4-byte length-prefixed as Triton encodes them), parameters, the text input and the output tensors. A bad
body raises `InvalidInput` (or `HttpError`) naming the field, as the gRPC service's `kserve/tensors.py` does."""

from __future__ import annotations

import re

import numpy as np

from bertserve.service.errors import InvalidInput, quote
from bertserve.service.http.json_body import parse_json
from bertserve.service.http.schema import check_content_type, kind_of
from bertserve.service.http.status import HttpError
from bertserve.service.http.transport import Request
from bertserve.service.kserve.tensors import (
    NUMERIC,
    PAIR_INPUT,
    TEXT_INPUT,
    decode_bytes_elements,
    encode_bytes_elements,
    input_names_error,
)

HEADER_LENGTH = "inference-header-content-length"
INFER_MEDIA_TYPES = ("application/json", "application/octet-stream")
PARAMETER_KINDS = {
    "normalize": bool,
    "truncate": bool,
    "raw_scores": bool,
    "top_k": int,
    "binary_data_output": bool,
    "truncation_strategy": str,
    "dimensions": int,
    "prompt_name": str,
    "truncation_direction": str,
    "sparse_threshold": float,
}
INT64 = range(-(1 << 63), 1 << 63)
ASCII_DIGITS = re.compile(r"[0-9]{1,15}")  # str.isdigit() and int() also take other scripts' digits


def header_length(request: Request) -> int | None:
    """The JSON header's byte count (`Inference-Header-Content-Length`), None when absent."""
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    length = int(value) if ASCII_DIGITS.fullmatch(value) else None
    if length is None or length > len(request.body):
        raise HttpError(
            400,
            f"{HEADER_LENGTH}: must be the JSON header's byte count in ASCII digits, at most the body's "
            f"{len(request.body)} (got {quote(value, 32)})",
        )
    return length


def decode_request(request: Request, max_inputs: int) -> tuple[dict, list[str], list[str] | None]:
    """An infer request's JSON header, texts and pairs' second texts (None without "text_pair"); blocking:
    a large body is decoded off the event loop."""
    check_content_type(request, INFER_MEDIA_TYPES)
    length = header_length(request)
    if length is None:
        header, binary = request.body, b""
    else:
        header, binary = request.body[:length], request.body[length:]
    what = "body" if length is None else "body (JSON header)"
    body = parse_json(header, max_inputs, what, texts_per_input=2)  # "text" and "text_pair"
    if not isinstance(body, dict):
        raise HttpError(400, f"body: must be a JSON object (got {kind_of(body)})")
    return (body, *read_texts(body, binary, max_inputs))


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
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value not in INT64)):
        expected = {bool: "true or false", int: "a 64-bit integer", str: "a string", float: "a number"}[kind]
        raise InvalidInput(f"parameters[{name!r}]: must be {expected} (got {quote(value, 32)})")
    return value


def flatten(data: object, field: str, count: int) -> list:
    """The `count` elements of `data`: flat, or rows of elements; its length is checked before any
    element is looked at."""
    if not isinstance(data, list):
        raise InvalidInput(f"{field}.data: must be an array (got {kind_of(data)})")
    if len(data) > count:
        raise InvalidInput(f"{field}.data: {len(data)} items is more than the {count} elements of its shape")
    if data and all(isinstance(row, list) for row in data):
        total = sum(len(row) for row in data)
        if total != count:
            raise InvalidInput(f"{field}.data: {total} elements, but its shape has {count}")
        data = [item for row in data for item in row]
    return data


def _count(tensor: dict, field: str, max_inputs: int) -> int:
    """The element count the tensor's shape declares ([n] or [n, 1]), checked against `max_inputs`."""
    shape = tensor.get("shape")
    if not (
        isinstance(shape, list)
        and len(shape) in (1, 2)
        and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        and (len(shape) == 1 or shape[1] == 1)
    ):
        raise InvalidInput(f"{field}.shape: must be [n] or [n, 1] (got {quote(shape)})")
    count = shape[0]
    if count < 1:
        raise InvalidInput(f"{field}.shape: needs at least one element (got {quote(shape)})")
    if count > max_inputs:
        raise InvalidInput(
            f"{field}.shape: {quote(count, 32)} inputs is more than max_inputs_per_request {max_inputs}"
        )
    return count


def _binary_size(tensor: dict, field: str) -> int | None:
    size = parameters_of(tensor.get("parameters"), f"{field}.parameters").get("binary_data_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise InvalidInput(
            f"{field}.parameters.binary_data_size: must be a byte count (got {quote(size, 32)})"
        )
    return size


def _read_tensor(tensor: dict, binary: memoryview | None, max_inputs: int, count: int | None) -> list[str]:
    """The texts of one BYTES input tensor: JSON strings in `data`, or `binary` (its binary tensor data;
    None: it has none). `count`: the element count its shape must declare. The count comes from the shape
    and is checked before any element is decoded."""
    field = f"inputs[{tensor['name']!r}]"
    if tensor.get("datatype") != "BYTES":
        raise InvalidInput(
            f"{field}.datatype: must be BYTES (UTF-8 text), got {quote(tensor.get('datatype'))}"
        )
    declared = _count(tensor, field, max_inputs)
    if count is not None and declared != count:
        raise InvalidInput(
            f"{field}.shape: {quote(tensor['shape'])} must match the {count} elements of {TEXT_INPUT!r}"
        )
    if binary is not None:
        if "data" in tensor:
            raise InvalidInput(f"{field}.data: must be absent when parameters.binary_data_size is given")
        elements = decode_bytes_elements(binary, f"{field} binary data", declared)
    else:
        elements = flatten(tensor.get("data"), field, declared)
        for i, element in enumerate(elements):
            if not isinstance(element, str):
                raise InvalidInput(f"{field}.data[{i}]: must be a string (got {kind_of(element)})")
    if len(elements) != declared:
        raise InvalidInput(
            f"{field}: shape {quote(tensor['shape'])} needs {declared} elements, got {len(elements)}"
        )
    texts = []
    for i, element in enumerate(elements):
        if isinstance(element, bytes):
            try:
                element = element.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidInput(f"{field}[{i}]: not valid UTF-8 at byte {exc.start}") from None
        texts.append(element)
    return texts


def read_texts(body: dict, binary: bytes, max_inputs: int) -> tuple[list[str], list[str] | None]:
    """The texts of the BYTES input "text", and of the optional "text_pair" (the second text of each pair;
    None without it). Binary tensor data holds the inputs' in their order, as tritonclient sends it."""
    inputs = body.get("inputs")
    if not isinstance(inputs, list):
        raise InvalidInput(
            f"inputs: must be an array holding one tensor {TEXT_INPUT!r} (got {kind_of(inputs)})"
        )
    names = [t.get("name") if isinstance(t, dict) else None for t in inputs[:8]]
    if len(inputs) > 2 or sorted(map(str, names)) not in ([TEXT_INPUT], sorted([TEXT_INPUT, PAIR_INPUT])):
        raise input_names_error(names if len(inputs) <= 8 else [f"{len(inputs)} tensors"])
    sizes = [_binary_size(t, f"inputs[{t['name']!r}]") for t in inputs]
    total = sum(size or 0 for size in sizes)
    if total != len(binary):
        if all(size is None for size in sizes):
            raise InvalidInput(
                f"body: {len(binary)} binary bytes after the JSON header, but no input has binary_data_size"
            )
        raise InvalidInput(
            f"inputs: binary_data_size adds up to {total}, which does not match the {len(binary)} binary "
            "bytes after the JSON header"
        )
    chunks, start, view = {}, 0, memoryview(binary)
    for tensor, size in zip(inputs, sizes, strict=True):
        chunks[tensor["name"]] = None if size is None else view[start : start + size]
        start += size or 0
    by_name = {t["name"]: t for t in inputs}
    texts = _read_tensor(by_name[TEXT_INPUT], chunks[TEXT_INPUT], max_inputs, None)
    if PAIR_INPUT not in by_name:
        return texts, None
    return texts, _read_tensor(by_name[PAIR_INPUT], chunks[PAIR_INPUT], max_inputs, len(texts))


def output_tensor(name: str, datatype: str, values, binary: bool) -> tuple[dict, bytes]:
    if datatype in NUMERIC:
        array = np.ascontiguousarray(values, dtype=NUMERIC[datatype][0])
        shape = list(array.shape)
        raw = array.tobytes() if binary else b""
        data = None if binary else array.ravel()
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
