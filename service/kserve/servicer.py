"""The KServe v2 / Open Inference Protocol servicer (`inference.GRPCInferenceService`), served on the same
port as bertserve.v1.Inference.

ModelInfer takes the texts of a BYTES tensor "text" (and, for the classify outputs only, an optional second
BYTES tensor "text_pair" of the same shape: sentence pairs; request parameter "truncation_strategy": string)
and makes one inference-core call for the tasks it needs (service/core/core.py: validation, tokenization,
the encoder's shared batches, the tasks), so every protocol shares batches, limits and metrics; domain errors are mapped by `rpc_status`. Outputs by task:

    embed     "embedding"       FP32  [n, dimension]  (request parameter "normalize": bool); the other
              encodings, token-level and sparse outputs and their parameters: embed_tensors.py
    classify  "labels"          BYTES [n, k]          best first (request parameters "top_k": int64,
              "label_scores"    FP32  [n, k]          default all labels; "raw_scores": bool)
    fill_mask "mask_tokens"     BYTES [n, k]          best first, exactly one mask token per input
              "mask_scores"     FP32  [n, k]          (request parameter "top_k", default 5)
              "mask_sequences"  BYTES [n, k]          the input with the mask filled by each candidate

Every task takes the request parameter "truncate" (bool). A request that names no outputs gets all of
its model's embed and classify outputs (fill_mask outputs only when named: they need a mask token in
every input). Outputs come back in raw_output_contents when the request used raw_input_contents, else
in typed contents.

The probes (ServerLive, ServerReady, ModelReady) always answer, draining included (ready is false then);
the other RPCs go through `rpc_status.rpc`, which refuses them while draining and maps domain errors.
"""

from __future__ import annotations

import asyncio
import functools
import time

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from bertserve import __version__
from bertserve.kserve import open_inference_pb2 as pb
from bertserve.service.core.core import DEFAULT_FILL_MASK_TOP_K, InferenceCore
from bertserve.service.core.lifecycle import Lifecycle
from bertserve.service.core.results import ModelInfo
from bertserve.service.core.task_calls import ClassifyCall, FillMaskCall, TaskCall
from bertserve.service.core.validation import check_top_k
from bertserve.service.engine.tasks import Task
from bertserve.service.errors import InvalidInput, ModelNotFound, quote
from bertserve.service.grpc.rpc_status import (
    deadline_of,
    parse_request,
    rpc,
    serialized,
    status_message,
)
from bertserve.service.kserve import embed_tensors
from bertserve.service.kserve.tensors import (
    OutputTensor,
    input_names,
    pair_tasks,
    parameter,
    read_texts,
    task_tensors,
    tensor_metadata,
    write_outputs,
)

# inference.GRPCInferenceService
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
SERVER_NAME = "bertserve"
PLATFORM = "onnxruntime_onnx"
EXTENSIONS = ["model_repository", "parameters"]  # model_repository: the index only (no load/unload)
OUTPUTS_OF_TASK = {
    Task.EMBED: ("embedding",),
    Task.CLASSIFY: ("labels", "label_scores"),
    Task.FILL_MASK: ("mask_tokens", "mask_scores", "mask_sequences"),
}
DEFAULT_TASKS = (Task.EMBED, Task.CLASSIFY)  # a request that names no outputs gets these tasks' outputs
# RPCs that go through `rpc_status.rpc`: their handlers return serialized bytes.
BYTES_REPLIES = ("ServerMetadata", "ModelMetadata", "RepositoryIndex", "ModelInfer")


def probe(name: str, request_type: type):
    """Counts and times a probe RPC like `rpc` does, without refusing it while draining. The request
    arrives as bytes (see `add_to_server`): an undecodable one is INVALID_ARGUMENT, not UNKNOWN."""

    def wrap(method):
        @functools.wraps(method)
        async def handler(self, request, context):
            started, code, message = time.perf_counter(), grpc.StatusCode.OK, ""
            try:
                if isinstance(request, bytes):
                    request = parse_request(request_type, request)
                return await method(self, request, context)
            except InvalidInput as exc:
                code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception:
                code = grpc.StatusCode.INTERNAL
                raise
            finally:
                self.metrics.requests.labels(name, code.name).inc()
                self.metrics.request_duration.labels(name).observe(time.perf_counter() - started)
            await context.abort(code, status_message(message))

        return handler

    return wrap


def model_outputs(model: ModelInfo) -> dict[str, Task]:
    """Every output of the model, by name, with the task that answers it."""
    return {
        name: task
        for task in Task
        if task.value in model.tasks and task in OUTPUTS_OF_TASK
        for name in (embed_tensors.output_names(model) if task is Task.EMBED else OUTPUTS_OF_TASK[task])
    }


def default_outputs(available: dict[str, Task]) -> list[str]:
    """A request that names no outputs: the pooled vector and the classify outputs."""
    return [
        name
        for name, task in available.items()
        if task in DEFAULT_TASKS and (task is not Task.EMBED or name == embed_tensors.DENSE)
    ]


def embed_metadata(model: ModelInfo) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    if Task.EMBED.value not in model.tasks:
        return []
    meta = pb.ModelMetadataResponse.TensorMetadata
    return [meta(name=n, datatype=t, shape=s) for n, t, s in embed_tensors.output_metadata(model)]


class OpenInferenceServicer:
    def __init__(self, core: InferenceCore, health: HealthServicer, lifecycle: Lifecycle):
        self.core = core
        self.settings = core.settings  # rpc_status.rpc reads settings, metrics, lifecycle
        self.metrics = core.metrics
        self.lifecycle = lifecycle
        self.health = health

    async def _server_ready(self, context) -> bool:
        answer = await self.health.Check(health_pb2.HealthCheckRequest(service=""), context)
        return answer.status == health_pb2.HealthCheckResponse.SERVING

    def _model(self, name: str, version: str) -> ModelInfo:
        if not name:
            loaded = ", ".join(m.name for m in self.core.info().models)
            raise InvalidInput(f"model_name: required (loaded: {loaded})")
        model = self.core.model_info(name)
        if version and version != str(model.version):
            raise ModelNotFound(
                f"model {model.name}: version {quote(version, 32)} is not loaded ({model.version} is)"
            )
        return model

    @probe("ServerLive", pb.ServerLiveRequest)
    async def ServerLive(self, request, context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @probe("ServerReady", pb.ServerReadyRequest)
    async def ServerReady(self, request, context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._server_ready(context))

    @probe("ModelReady", pb.ModelReadyRequest)
    async def ModelReady(self, request: pb.ModelReadyRequest, context) -> pb.ModelReadyResponse:
        model = next((m for m in self.core.info().models if m.name == request.name), None)
        known = model is not None and request.version in ("", str(model.version))
        return pb.ModelReadyResponse(ready=known and await self._server_ready(context))

    @rpc("ServerMetadata", pb.ServerMetadataRequest)
    async def ServerMetadata(self, request, context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    @rpc("ModelMetadata", pb.ModelMetadataRequest)
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context) -> pb.ModelMetadataResponse:
        model = self._model(request.name, request.version)
        properties = {
            "tasks": ",".join(t for t in model.tasks if t != "attention"),
            "max_length": str(model.max_length),
            "precision": model.precision,
            "provider": model.provider,
            "encoder": model.encoder,
        }
        if Task.EMBED.value in model.tasks:
            properties["normalize_default"] = str(model.normalize_default).lower()
            properties["pooling"] = model.pooling
        if Task.CLASSIFY.value in model.tasks:
            properties["labels"] = ",".join(model.labels)
        if Task.FILL_MASK.value in model.tasks:
            properties["mask_token"] = model.mask_token
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=[str(model.version)],
            platform=PLATFORM,
            inputs=[
                pb.ModelMetadataResponse.TensorMetadata(name=name, datatype="BYTES", shape=[-1])
                for name in input_names(Task.CLASSIFY.value in model.tasks)
            ],
            outputs=embed_metadata(model) + tensor_metadata(model),
            properties=properties,
        )

    @rpc("RepositoryIndex", pb.RepositoryIndexRequest)
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context
    ) -> pb.RepositoryIndexResponse:
        ready = await self._server_ready(context)
        state = "READY" if ready else "UNAVAILABLE"
        models = [
            pb.RepositoryIndexResponse.ModelIndex(name=m.name, version=str(m.version), state=state)
            for m in self.core.info().models
            if ready or not request.ready
        ]
        return pb.RepositoryIndexResponse(models=models)

    def _requested(self, model: ModelInfo, request: pb.ModelInferRequest, pairs: bool) -> list[str]:
        available = model_outputs(model)
        if not request.outputs:
            if pairs:
                return pair_tasks(model.name, available, None)
            return default_outputs(available)
        names = [output.name for output in request.outputs]
        for i, name in enumerate(names):
            if name not in available:
                raise InvalidInput(
                    f"outputs[{i}].name: model {model.name} has no output {quote(name)} "
                    f"(outputs: {', '.join(available) or 'none'})"
                )
        if len(set(names)) != len(names):
            raise InvalidInput(f"outputs: an output is requested twice ({quote(names)})")
        for i, output in enumerate(request.outputs):
            if "classification" in output.parameters:  # what tritonclient sends for class_count
                raise InvalidInput(
                    f"outputs[{i}].parameters['classification']: the classification extension is not "
                    "supported; request the labels and label_scores outputs (parameter top_k) instead"
                )
        return pair_tasks(model.name, available, names) if pairs else names

    def _task_call(self, model: ModelInfo, task: Task, request: pb.ModelInferRequest, names) -> TaskCall:
        """The core's call for `task`, with the request parameters checked (named as this protocol does)."""
        if task is Task.EMBED:
            return embed_tensors.embed_call(
                names, lambda name, kind, default: parameter(request, name, kind, default)
            )
        if task is Task.FILL_MASK:
            top_k = parameter(request, "top_k", int, DEFAULT_FILL_MASK_TOP_K)
            check_top_k(top_k, model.vocab_size, "parameters['top_k']", "vocabulary size")
            return FillMaskCall(top_k=top_k, sequences="mask_sequences" in names)
        top_k = parameter(request, "top_k", int, 0)
        if top_k:
            check_top_k(top_k, len(model.labels), "parameters['top_k']", "number of labels")
        return ClassifyCall(top_k=top_k or None, raw_scores=parameter(request, "raw_scores", bool, False))

    @rpc("ModelInfer", pb.ModelInferRequest)
    async def ModelInfer(self, request: pb.ModelInferRequest, context) -> bytes:
        model = self._model(request.model_name, request.model_version)
        texts, pairs = read_texts(request, self.settings.max_inputs_per_request)
        names = self._requested(model, request, pairs is not None)
        available = model_outputs(model)
        tasks = list(dict.fromkeys(available[name] for name in names))
        calls = [self._task_call(model, task, request, names) for task in tasks]
        truncate = parameter(request, "truncate", bool, False)
        strategy = parameter(request, "truncation_strategy", str, "longest_first")
        # one core call for every task: tokenized once, batched together (one encoder run); with
        # "text_pair", classify only (`_requested`)
        with embed_tensors.fields_named():
            outcomes = await self.core.infer(
                model.name,
                texts,
                calls,
                pairs=pairs,
                truncate=truncate,
                truncation_strategy=strategy,
                deadline=deadline_of(context),
                prompt_name=parameter(request, "prompt_name", str, "") or None,
                truncation_direction=parameter(request, "truncation_direction", str, "right"),
            )
        tensors: dict[str, OutputTensor] = {}
        for task, outcome in zip(tasks, outcomes, strict=True):
            if task is Task.EMBED:
                tensors.update(embed_tensors.embed_tensors(outcome, names, self.settings.max_message_bytes))
            else:
                tensors.update(task_tensors(task, outcome, model.mask_token, "mask_sequences" in names))
        outputs = [tensors[name] for name in names]
        # FP16 has no typed contents: a request asking for it gets raw contents
        raw = bool(request.raw_input_contents) or any(t.datatype == "FP16" for t in outputs)
        reply = functools.partial(_response, model, request.id, outputs, raw)
        if sum(t.values.size for t in outputs) * 4 > OFF_LOOP_BYTES:
            return await self.core.off_loop(reply)
        return reply()


OFF_LOOP_BYTES = 64 * 1024  # responses estimated above this are built and serialized off the event loop


def _response(model: ModelInfo, request_id: str, outputs: list[OutputTensor], raw: bool) -> bytes:
    response = pb.ModelInferResponse(model_name=model.name, model_version=str(model.version), id=request_id)
    write_outputs(response, outputs, raw=raw)
    return serialized(response)


def add_to_server(
    core: InferenceCore, health: HealthServicer, lifecycle: Lifecycle, server: grpc.aio.Server
) -> str:
    """Registers the servicer on `server`; returns the service's full name.

    Requests are passed on as bytes and parsed by `probe`/`rpc`, so that an undecodable request gets
    INVALID_ARGUMENT (the generated registration would answer UNKNOWN); ModelInfer returns its response
    serialized (large ones off the event loop), the others their message."""
    servicer = OpenInferenceServicer(core, health, lifecycle)
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        response_type = getattr(pb, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=None,
            response_serializer=None if method.name in BYTES_REPLIES else response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    return SERVICE_NAME
