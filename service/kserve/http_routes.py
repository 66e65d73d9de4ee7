"""KServe v2 / Open Inference Protocol over REST, matching the gRPC service in `service/kserve/` (same
tensors, parameters and messages), so `tritonclient.http` works.

    GET  /v2                                 server metadata
    GET  /v2/health/live, /v2/health/ready   200, or 503 when not ready (answered while draining)
    POST /v2/repository/index                every loaded model, state READY (UNAVAILABLE while not ready)
    GET  /v2/models/{name}[/versions/{v}]    model metadata
    GET  /v2/models/{name}[/versions/{v}]/ready
    POST /v2/models/{name}[/versions/{v}]/infer

Infer takes one BYTES input "text" of shape [n] or [n, 1] (JSON strings in "data", or the binary tensor
data extension: `parameters.binary_data_size` and the bytes after the JSON header, whose length the
`Inference-Header-Content-Length` header gives), and for the classify outputs only an optional second
BYTES input "text_pair" of the same shape (sentence pairs). Outputs as on gRPC: "embedding" FP32
[n, dimension] (and the embedding options' outputs and parameters, service/kserve/embed_tensors.py); "labels" BYTES + "label_scores" FP32 [n, k]; "mask_tokens"/"mask_sequences" BYTES +
"mask_scores" FP32 [n, k] (fill-mask: exactly one mask per input; only when named). Request parameters:
normalize, truncate (bool), top_k (int), raw_scores (bool), truncation_strategy (string), binary_data_output
(bool). An output is sent binary when its request entry has `parameters.binary_data` true, or
`binary_data_output` is true.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from bertserve import __version__
from bertserve.service.core.core import DEFAULT_FILL_MASK_TOP_K
from bertserve.service.core.results import ModelInfo
from bertserve.service.core.task_calls import ClassifyCall, FillMaskCall, TaskCall
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.engine.tasks import Task
from bertserve.service.errors import InvalidInput, ModelNotFound, quote
from bertserve.service.http.json_body import JSON_FLOAT_BYTES, off_loop_above
from bertserve.service.http.routing import Call, Route
from bertserve.service.http.schema import Fields, json_object, kind_of
from bertserve.service.http.status import kserve_error
from bertserve.service.http.transport import Response, json_bytes, json_response
from bertserve.service.kserve import embed_tensors
from bertserve.service.kserve.http_json import (
    HEADER_LENGTH,
    decode_request,
    output_tensor,
    parameter,
    parameters_of,
)
from bertserve.service.kserve.servicer import (
    EXTENSIONS,
    PLATFORM,
    SERVER_NAME,
    default_outputs,
    model_outputs,
)
from bertserve.service.kserve.tensors import (
    OutputTensor,
    input_names,
    pair_tasks,
    task_tensors,
)

if TYPE_CHECKING:
    from bertserve.service.http.app import HttpFront


def _model(front: HttpFront, call: Call) -> ServedModel:
    name, version = call.params["name"], call.params.get("version", "")
    model = front.core.registry.resolve(name, None)
    if version and version != str(model.version):
        raise ModelNotFound(
            f"model {model.name}: version {version[:32]!r} is not loaded ({model.version} is)"
        )
    return model


def _tensor_metadata(front: HttpFront, model: ServedModel) -> list[dict]:
    tasks = model.manifest.tasks
    outputs = []
    if tasks.embed:
        info = front.core.model_info(model.name)
        outputs += [
            {"name": name, "datatype": datatype, "shape": shape}
            for name, datatype, shape in embed_tensors.output_metadata(info)
        ]
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


async def repository_index(front: HttpFront, call: Call) -> Response:
    """The model repository extension's index (as gRPC RepositoryIndex): body {"ready": bool}, optional."""
    only_ready = False
    if call.request.body:
        body = await json_object(front, call.request)
        only_ready = bool(Fields(body, ("ready",)).boolean("ready"))
    is_ready = front.ready()
    state = "READY" if is_ready else "UNAVAILABLE"
    models = [
        {"name": m.name, "version": str(m.version), "state": state}
        for m in front.core.registry.ordered
        if is_ready or not only_ready
    ]
    return json_response(200, models)


async def model_metadata(front: HttpFront, call: Call) -> Response:
    model = _model(front, call)
    body = {
        "name": model.name,
        "versions": [str(model.version)],
        "platform": PLATFORM,
        "inputs": [
            {"name": name, "datatype": "BYTES", "shape": [-1]}
            for name in input_names(model.manifest.tasks.classify is not None)
        ],
        "outputs": _tensor_metadata(front, model),
    }
    return json_response(200, body)


# --- infer ---------------------------------------------------------------------------------------------


def _requested(model: ModelInfo, body: dict, pairs: bool) -> list[tuple[str, bool | None]]:
    """The outputs asked for, each with its own binary_data flag (None: not said); with `pairs`, only
    the classify outputs."""
    available = model_outputs(model)
    outputs = body.get("outputs")
    if outputs is None:
        if pairs:
            return [(name, None) for name in pair_tasks(model.name, available, None)]
        return [(name, None) for name in default_outputs(available)]
    if not isinstance(outputs, list):
        raise InvalidInput(f"outputs: must be an array (got {kind_of(outputs)})")
    if len(outputs) > len(available):
        raise InvalidInput(
            f"outputs: {len(outputs)} outputs requested; model {model.name} has {len(available)} "
            f"({', '.join(available) or 'none'})"
        )
    requested = []
    for i, output in enumerate(outputs):
        name = output.get("name") if isinstance(output, dict) else None
        if not isinstance(name, str) or name not in available:
            raise InvalidInput(
                f"outputs[{i}].name: model {model.name} has no output {quote(name)} "
                f"(outputs: {', '.join(available) or 'none'})"
            )
        parameters = parameters_of(output.get("parameters"), f"outputs[{i}].parameters")
        if "classification" in parameters:
            raise InvalidInput(
                f"outputs[{i}].parameters['classification']: the classification extension is not "
                "supported; request the labels and label_scores outputs (parameter top_k) instead"
            )
        flag = parameters.get("binary_data")
        if flag is not None and not isinstance(flag, bool):
            raise InvalidInput(
                f"outputs[{i}].parameters['binary_data']: must be true or false (got {kind_of(flag)})"
            )
        requested.append((name, flag))
    names = [name for name, _ in requested]
    if len(set(names)) != len(names):
        raise InvalidInput(f"outputs: an output is requested twice ({names})")
    if pairs:
        pair_tasks(model.name, available, names)
    return requested


def _task_call(task: Task, parameters: dict, names: list[str]) -> TaskCall:
    """The core's call for `task`, with the request parameters' types checked (the core checks ranges)."""
    if task is Task.EMBED:
        return embed_tensors.embed_call(
            names, lambda name, kind, default: parameter(parameters, name, default)
        )
    if task is Task.CLASSIFY:
        top_k = parameter(parameters, "top_k", 0) or None
        return ClassifyCall(top_k=top_k, raw_scores=parameter(parameters, "raw_scores", False))
    top_k = parameter(parameters, "top_k", DEFAULT_FILL_MASK_TOP_K)
    return FillMaskCall(top_k=top_k, sequences="mask_sequences" in names)


def _answer(
    model: ServedModel,
    requested: list[tuple[str, bool | None]],
    tensors: dict[str, OutputTensor],
    binary_default: bool,
    request_id: str,
) -> Response:
    """The infer reply: JSON, or a JSON header and binary tensor data."""
    outputs, chunks = [], []
    for name, flag in requested:
        t = tensors[name]
        values = t.values.tolist() if t.datatype == "BYTES" else t.values  # BYTES: lists of rows
        tensor, raw = output_tensor(name, t.datatype, values, binary=binary_default if flag is None else flag)
        outputs.append(tensor)
        chunks.append(raw)
    answer = {"model_name": model.name, "model_version": str(model.version), "outputs": outputs}
    if request_id:
        answer["id"] = request_id
    header = json_bytes(answer)
    if not any(chunks):
        return Response(200, header)
    return Response(
        200, header + b"".join(chunks), "application/octet-stream", [(HEADER_LENGTH, str(len(header)))]
    )


ZERO_JSON_BYTES = 4  # a padding zero in JSON data: "0.0,"


def _json_float_bytes(values: np.ndarray) -> int:
    """About the JSON of float32 values: JSON_FLOAT_BYTES each, a padding zero "0.0," 4 bytes."""
    nonzero = int(np.count_nonzero(values))
    return JSON_FLOAT_BYTES * nonzero + ZERO_JSON_BYTES * (values.size - nonzero)


def _check_json_floats(
    front: HttpFront, requested: list[tuple[str, bool | None]], tensors: dict, binary_default: bool
) -> None:
    """Refuses, before the reply is built, FP32 outputs whose JSON would pass max_message_bytes: the core
    bounds token-level outputs in binary, 4 bytes a value, and JSON takes about five times that."""
    floats = [
        (name, _json_float_bytes(tensors[name].values))
        for name, flag in requested
        if tensors[name].datatype == "FP32" and not (binary_default if flag is None else flag)
    ]
    size, limit = sum(n for _, n in floats), front.settings.max_message_bytes
    if size > limit:
        name = max(floats, key=lambda f: f[1])[0]
        raise InvalidInput(
            f"outputs[{name!r}]: about {size} bytes of JSON, more than max_message_bytes {limit}; ask for "
            "binary_data, or send fewer or shorter inputs"
        )


async def infer(front: HttpFront, call: Call) -> Response:
    model = _model(front, call)
    limit = front.settings.max_inputs_per_request
    size = len(call.request.body)
    body, texts, pairs = await off_loop_above(front, size, decode_request, call.request, limit)
    parameters = parameters_of(body.get("parameters"), "parameters")
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput(f"id: must be a string (got {kind_of(request_id)})")
    info = front.core.model_info(model.name)
    requested = _requested(info, body, pairs is not None)
    binary_default = parameter(parameters, "binary_data_output", False)
    available = model_outputs(info)
    names = [name for name, _ in requested]
    tasks = list(dict.fromkeys(available[name] for name in names))
    calls = [_task_call(task, parameters, names) for task in tasks]
    truncate = parameter(parameters, "truncate", False)
    strategy = parameter(parameters, "truncation_strategy", "longest_first")
    # one core call for every task: tokenized once, batched together (one encoder run); with "text_pair",
    # classify only (`_requested`)
    with embed_tensors.fields_named():
        outcomes = await front.core.infer(
            model.name,
            texts,
            calls,
            pairs=pairs,
            truncate=truncate,
            truncation_strategy=strategy,
            deadline=call.deadline,
            prompt_name=parameter(parameters, "prompt_name", "") or None,
            truncation_direction=parameter(parameters, "truncation_direction", "right"),
        )
    mask_token = model.manifest.tasks.fill_mask.mask_token if model.manifest.tasks.fill_mask else ""
    tensors: dict = {}
    for task, outcome in zip(tasks, outcomes, strict=True):
        if task is Task.EMBED:
            tensors.update(embed_tensors.embed_tensors(outcome, names, front.settings.max_message_bytes))
        else:
            tensors.update(task_tensors(task, outcome, mask_token, "mask_sequences" in names))
    size = JSON_FLOAT_BYTES * sum(tensors[name].values.size for name in names)
    _check_json_floats(front, requested, tensors, binary_default)
    return await off_loop_above(front, size, _answer, model, requested, tensors, binary_default, request_id)


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
    Route(
        "POST", "/v2/repository/index", repository_index, kserve_error, summary="KServe v2 repository index"
    ),
    *_both("GET", "", model_metadata, "KServe v2 model metadata"),
    *_both("GET", "/ready", model_ready, "KServe v2 model readiness", admitted=False),
    *_both("POST", "/infer", infer, "KServe v2 inference (JSON or binary tensor data)"),
]
