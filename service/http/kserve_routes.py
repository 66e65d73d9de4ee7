"""KServe v2 / Open Inference Protocol over REST, matching the gRPC service in `service/kserve/` (same
tensors, parameters and messages), so `tritonclient.http` works.

    GET  /v2                                 server metadata
    GET  /v2/health/live, /v2/health/ready   200, or 503 when not ready (answered while draining)
    GET  /v2/models/{name}[/versions/{v}]    model metadata
    GET  /v2/models/{name}[/versions/{v}]/ready
    POST /v2/models/{name}[/versions/{v}]/infer

Infer takes one BYTES input "text" of shape [n] or [n, 1] (JSON strings in "data", or the binary tensor
data extension: `parameters.binary_data_size` and the bytes after the JSON header, whose length the
`Inference-Header-Content-Length` header gives). Outputs as on gRPC: "embedding" FP32 [n, dimension];
"labels" BYTES + "label_scores" FP32 [n, k]; "mask_tokens"/"mask_sequences" BYTES + "mask_scores" FP32
[n, k] (fill-mask: exactly one mask per input; only when named). Request parameters: normalize, truncate
(bool), top_k (int), raw_scores (bool), binary_data_output (bool). An output is sent binary when its
request entry has `parameters.binary_data` true, or `binary_data_output` is true.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np

from bertserve import __version__
from bertserve.service.core import DEFAULT_FILL_MASK_TOP_K
from bertserve.service.errors import InvalidInput, ModelNotFound
from bertserve.service.http.app import Call, HttpFront, Route
from bertserve.service.http.schema import check_content_type, kind_of, parse_json
from bertserve.service.http.status import HttpError, kserve_error
from bertserve.service.http.transport import Response, json_response
from bertserve.service.kserve.servicer import DEFAULT_TASKS, EXTENSIONS, PLATFORM, SERVER_NAME, model_outputs
from bertserve.service.kserve.tensors import TEXT_INPUT, decode_bytes_elements, encode_bytes_elements
from bertserve.service.served_model import ServedModel
from bertserve.service.tasks import Task

HEADER_LENGTH = "inference-header-content-length"
INFER_MEDIA_TYPES = ("application/json", "application/octet-stream")
PARAMETER_KINDS = {
    "normalize": bool,
    "truncate": bool,
    "raw_scores": bool,
    "top_k": int,
    "binary_data_output": bool,
}


def _model(front: HttpFront, call: Call) -> ServedModel:
    name, version = call.params["name"], call.params.get("version", "")
    model = front.core.registry.resolve(name, None)
    if version and version != str(model.version):
        raise ModelNotFound(
            f"model {model.name}: version {version[:32]!r} is not loaded ({model.version} is)"
        )
    return model


def _tensor_metadata(model: ServedModel) -> list[dict]:
    tasks = model.manifest.tasks
    outputs = []
    if tasks.embed:
        outputs.append({"name": "embedding", "datatype": "FP32", "shape": [-1, tasks.embed.dimension]})
    if tasks.classify:
        outputs += [
            {"name": "labels", "datatype": "BYTES", "shape": [-1, -1]},
            {"name": "label_scores", "datatype": "FP32", "shape": [-1, -1]},
        ]
    if tasks.fill_mask:
        outputs += [
            {"name": name, "datatype": kind, "shape": [-1, -1]}
            for name, kind in (("mask_tokens", "BYTES"), ("mask_scores", "FP32"), ("mask_sequences", "BYTES"))
        ]
    return outputs


async def live(front: HttpFront, call: Call) -> Response:
    return json_response(200, {"live": True})


async def ready(front: HttpFront, call: Call) -> Response:
    is_ready = front.ready()
    return json_response(200 if is_ready else 503, {"ready": is_ready})


async def model_ready(front: HttpFront, call: Call) -> Response:
    model = _model(front, call)  # unknown: 404
    is_ready = front.ready()
    return json_response(200 if is_ready else 503, {"name": model.name, "ready": is_ready})


async def server_metadata(front: HttpFront, call: Call) -> Response:
    return json_response(200, {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})


async def model_metadata(front: HttpFront, call: Call) -> Response:
    model = _model(front, call)
    body = {
        "name": model.name,
        "versions": [str(model.version)],
        "platform": PLATFORM,
        "inputs": [{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1]}],
        "outputs": _tensor_metadata(model),
    }
    return json_response(200, body)


# --- infer ---------------------------------------------------------------------------------------------


def _split_body(call: Call) -> tuple[dict, bytes]:
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


def _parameters(value: object, field: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{field}: must be an object (got {kind_of(value)})")
    return value


def _parameter(parameters: dict, name: str, default):
    if name not in parameters:
        return default
    value, kind = parameters[name], PARAMETER_KINDS[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = "true or false" if kind is bool else "an integer"
        raise InvalidInput(f"parameters[{name!r}]: must be {expected} (got {kind_of(value)})")
    return value


def _flatten(data: object, field: str) -> list:
    if not isinstance(data, list):
        raise InvalidInput(f"{field}.data: must be an array (got {kind_of(data)})")
    if data and all(isinstance(row, list) for row in data):
        data = [item for row in data for item in row]
    return data


def _texts(body: dict, binary: bytes, max_inputs: int) -> list[str]:
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
    size = _parameters(tensor.get("parameters"), f"{field}.parameters").get("binary_data_size")
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
        elements = _flatten(tensor.get("data"), field)
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


def _requested(model: ServedModel, body: dict) -> list[tuple[str, bool | None]]:
    """The outputs asked for, each with its own binary_data flag (None: not said)."""
    available = model_outputs(model)
    outputs = body.get("outputs")
    if outputs is None:
        return [(name, None) for name, task in available.items() if task in DEFAULT_TASKS]
    if not isinstance(outputs, list):
        raise InvalidInput(f"outputs: must be an array (got {kind_of(outputs)})")
    requested = []
    for i, output in enumerate(outputs):
        name = output.get("name") if isinstance(output, dict) else None
        if name not in available:
            raise InvalidInput(
                f"outputs[{i}].name: model {model.name} has no output {str(name)[:64]!r} "
                f"(outputs: {', '.join(available) or 'none'})"
            )
        parameters = _parameters(output.get("parameters"), f"outputs[{i}].parameters")
        if "classification" in parameters:
            raise InvalidInput(
                f"outputs[{i}].parameters['classification']: the classification extension is not "
                "supported; request the labels and label_scores outputs (parameter top_k) instead"
            )
        requested.append((name, parameters.get("binary_data")))
    names = [name for name, _ in requested]
    if len(set(names)) != len(names):
        raise InvalidInput(f"outputs: an output is requested twice ({names})")
    return requested


async def _run_task(front: HttpFront, model: ServedModel, task: Task, texts, parameters, sequences, call):
    truncate = _parameter(parameters, "truncate", False)
    core = front.core
    if task is Task.EMBED:
        result = await core.embed(
            model.name,
            texts,
            truncate=truncate,
            normalize=_parameter(parameters, "normalize", None),
            deadline=call.deadline,
        )
        return {"embedding": ("FP32", result.vectors)}
    if task is Task.CLASSIFY:
        result = await core.classify(
            model.name,
            texts,
            truncate=truncate,
            top_k=_parameter(parameters, "top_k", 0) or None,
            raw_scores=_parameter(parameters, "raw_scores", False),
            deadline=call.deadline,
        )
        labels = [[s.label.encode() for s in row] for row in result.labels]
        scores = np.asarray([[s.score for s in row] for row in result.labels], dtype=np.float32)
        return {"labels": ("BYTES", labels), "label_scores": ("FP32", scores)}
    top_k = _parameter(parameters, "top_k", DEFAULT_FILL_MASK_TOP_K)
    result = await core.fill_mask(
        model.name, texts, truncate=truncate, top_k=top_k, sequences=sequences, deadline=call.deadline
    )
    for i, masks in enumerate(result.masks):
        if len(masks) != 1:
            raise InvalidInput(
                f"inputs[{TEXT_INPUT!r}][{i}]: {len(masks)} {model.manifest.tasks.fill_mask.mask_token} "
                "tokens; this protocol takes exactly one per input (bertserve.v1 FillMask takes more)"
            )
    tops = [masks[0] for masks in result.masks]
    tensors = {
        "mask_tokens": ("BYTES", [[t.encode() for t in top.tokens] for top in tops]),
        "mask_scores": ("FP32", np.asarray([top.scores for top in tops], dtype=np.float32)),
    }
    if sequences:
        tensors["mask_sequences"] = ("BYTES", [[s.encode() for s in top.sequences] for top in tops])
    return tensors


def _output(name: str, datatype: str, values, binary: bool) -> tuple[dict, bytes]:
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


async def infer(front: HttpFront, call: Call) -> Response:
    model = _model(front, call)
    body, binary = _split_body(call)
    parameters = _parameters(body.get("parameters"), "parameters")
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput(f"id: must be a string (got {kind_of(request_id)})")
    texts = _texts(body, binary, front.settings.max_inputs_per_request)
    requested = _requested(model, body)
    binary_default = _parameter(parameters, "binary_data_output", False)
    available = model_outputs(model)
    names = [name for name, _ in requested]
    tasks = list(dict.fromkeys(available[name] for name in names))
    # Every task's inputs are submitted at once, so they can share a batch (one encoder run).
    outcomes = await asyncio.gather(
        *(_run_task(front, model, t, texts, parameters, "mask_sequences" in names, call) for t in tasks),
        return_exceptions=True,
    )
    tensors: dict = {}
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        tensors.update(outcome)
    outputs, chunks = [], []
    for name, flag in requested:
        tensor, raw = _output(name, *tensors[name], binary=binary_default if flag is None else bool(flag))
        outputs.append(tensor)
        chunks.append(raw)
    answer = {"model_name": model.name, "model_version": str(model.version), "outputs": outputs}
    if request_id:
        answer["id"] = request_id
    header = json.dumps(answer, separators=(",", ":")).encode()
    if not any(chunks):
        return Response(200, header)
    return Response(
        200, header + b"".join(chunks), "application/octet-stream", [(HEADER_LENGTH, str(len(header)))]
    )


def _both(method: str, suffix: str, handler, summary: str, admitted: bool = True) -> list[Route]:
    """The route with and without /versions/{version}."""
    return [
        Route(method, f"/v2/models/{{name}}{suffix}", handler, kserve_error, admitted, summary),
        Route(
            method,
            f"/v2/models/{{name}}/versions/{{version}}{suffix}",
            handler,
            kserve_error,
            admitted,
            summary,
        ),
    ]


ROUTES = [
    Route("GET", "/v2", server_metadata, kserve_error, summary="KServe v2 server metadata"),
    Route("GET", "/v2/health/live", live, kserve_error, admitted=False, summary="KServe v2 liveness"),
    Route("GET", "/v2/health/ready", ready, kserve_error, admitted=False, summary="KServe v2 readiness"),
    *_both("GET", "", model_metadata, "KServe v2 model metadata"),
    *_both("GET", "/ready", model_ready, "KServe v2 model readiness", admitted=False),
    *_both("POST", "/infer", infer, "KServe v2 inference (JSON or binary tensor data)"),
]
