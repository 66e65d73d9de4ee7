"""The KServe v2 / Open Inference Protocol servicer (`inference.GRPCInferenceService`), served on the same
port as bertserve.v1.Inference.

ModelInfer takes the texts of a BYTES tensor "text" and runs them through the bertserve.v1 servicer's own
inference path (validation, tokenization, the model's batcher, the tasks), so both protocols share
batches, limits, metrics and error mapping. Outputs by task:

    embed     "embedding"       FP32  [n, dimension]  (request parameter "normalize": bool)
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
import numpy as np
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from bertserve import __version__
from bertserve.kserve import open_inference_pb2 as pb
from bertserve.kserve import open_inference_pb2_grpc
from bertserve.service.errors import InvalidInput, ModelNotFound
from bertserve.service.kserve.tensors import TEXT_INPUT, OutputTensor, parameter, read_texts, write_outputs
from bertserve.service.rpc_status import parse_request, rpc
from bertserve.service.served_model import ServedModel
from bertserve.service.servicer import DEFAULT_FILL_MASK_TOP_K, CallOutcome, InferenceServicer
from bertserve.service.tasks import Task, TaskOptions
from bertserve.service.tasks.classify import ranked
from bertserve.service.validation import check_top_k

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
            await context.abort(code, message)

        return handler

    return wrap


def tensor_metadata(model: ServedModel) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    meta = pb.ModelMetadataResponse.TensorMetadata
    outputs = []
    if spec := model.manifest.tasks.embed:
        outputs.append(meta(name="embedding", datatype="FP32", shape=[-1, spec.dimension]))
    if model.manifest.tasks.classify:
        outputs.append(meta(name="labels", datatype="BYTES", shape=[-1, -1]))
        outputs.append(meta(name="label_scores", datatype="FP32", shape=[-1, -1]))
    if model.manifest.tasks.fill_mask:
        outputs.append(meta(name="mask_tokens", datatype="BYTES", shape=[-1, -1]))
        outputs.append(meta(name="mask_scores", datatype="FP32", shape=[-1, -1]))
        outputs.append(meta(name="mask_sequences", datatype="BYTES", shape=[-1, -1]))
    return outputs


def model_outputs(model: ServedModel) -> dict[str, Task]:
    return {name: task for task in model.tasks if task in OUTPUTS_OF_TASK for name in OUTPUTS_OF_TASK[task]}


class OpenInferenceServicer(open_inference_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, inference: InferenceServicer, health: HealthServicer):
        self.inference = inference
        self.registry = inference.registry
        self.settings = inference.settings
        self.metrics = inference.metrics
        self.lifecycle = inference.lifecycle
        self.health = health

    async def _server_ready(self, context) -> bool:
        answer = await self.health.Check(health_pb2.HealthCheckRequest(service=""), context)
        return answer.status == health_pb2.HealthCheckResponse.SERVING

    def _model(self, name: str, version: str) -> ServedModel:
        if not name:
            raise InvalidInput(f"model_name: required (loaded: {', '.join(self.registry.by_name)})")
        model = self.registry.resolve(name, None)
        if version and version != str(model.version):
            raise ModelNotFound(
                f"model {model.name}: version {version[:32]!r} is not loaded ({model.version} is)"
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
        model = self.registry.by_name.get(request.name)
        known = model is not None and request.version in ("", str(model.version))
        return pb.ModelReadyResponse(ready=known and await self._server_ready(context))

    @rpc("ServerMetadata", pb.ServerMetadataRequest)
    async def ServerMetadata(self, request, context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    @rpc("ModelMetadata", pb.ModelMetadataRequest)
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context) -> pb.ModelMetadataResponse:
        model = self._model(request.name, request.version)
        manifest = model.manifest
        properties = {
            "tasks": ",".join(t.value for t in model.tasks),
            "max_length": str(manifest.max_length),
            "precision": model.precision,
            "provider": model.provider,
        }
        if manifest.tasks.embed:
            properties["normalize_default"] = str(manifest.tasks.embed.normalize).lower()
            properties["pooling"] = manifest.tasks.embed.pooling
        if classify := manifest.tasks.classify:
            properties["labels"] = ",".join(classify.id2label[i] for i in sorted(classify.id2label))
        if fill_mask := manifest.tasks.fill_mask:
            properties["mask_token"] = fill_mask.mask_token
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=[str(model.version)],
            platform=PLATFORM,
            inputs=[pb.ModelMetadataResponse.TensorMetadata(name=TEXT_INPUT, datatype="BYTES", shape=[-1])],
            outputs=tensor_metadata(model),
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
            for m in self.registry.ordered
            if ready or not request.ready
        ]
        return pb.RepositoryIndexResponse(models=models)

    def _requested(self, model: ServedModel, request: pb.ModelInferRequest) -> list[str]:
        available = model_outputs(model)
        if not request.outputs:
            return [name for name, task in available.items() if task in DEFAULT_TASKS]
        names = [output.name for output in request.outputs]
        for i, name in enumerate(names):
            if name not in available:
                raise InvalidInput(
                    f"outputs[{i}].name: model {model.name} has no output {name[:64]!r} "
                    f"(outputs: {', '.join(available) or 'none'})"
                )
        if len(set(names)) != len(names):
            raise InvalidInput(f"outputs: an output is requested twice ({names})")
        for i, output in enumerate(request.outputs):
            if "classification" in output.parameters:  # what tritonclient sends for class_count
                raise InvalidInput(
                    f"outputs[{i}].parameters['classification']: the classification extension is not "
                    "supported; request the labels and label_scores outputs (parameter top_k) instead"
                )
        return names

    def _options(self, model: ServedModel, task: Task, request: pb.ModelInferRequest) -> TaskOptions:
        if task is Task.EMBED:
            normalize = parameter(request, "normalize", bool, model.manifest.tasks.embed.normalize)
            return TaskOptions(Task.EMBED, normalize=normalize)
        if task is Task.FILL_MASK:
            top_k = parameter(request, "top_k", int, DEFAULT_FILL_MASK_TOP_K)
            check_top_k(top_k, model.tokenizer.vocab_size, "parameters['top_k']", "vocabulary size")
            return TaskOptions(Task.FILL_MASK, top_k=top_k)
        labels = len(model.manifest.tasks.classify.id2label)
        top_k = parameter(request, "top_k", int, 0)
        if top_k:
            check_top_k(top_k, labels, "parameters['top_k']", "number of labels")
        return TaskOptions(
            Task.CLASSIFY, top_k=top_k, raw_scores=parameter(request, "raw_scores", bool, False)
        )

    @rpc("ModelInfer", pb.ModelInferRequest)
    async def ModelInfer(self, request: pb.ModelInferRequest, context) -> pb.ModelInferResponse:
        model = self._model(request.model_name, request.model_version)
        texts = read_texts(request, self.settings.max_inputs_per_request)
        truncate = parameter(request, "truncate", bool, False)
        names = self._requested(model, request)
        available = model_outputs(model)
        tasks = list(dict.fromkeys(available[name] for name in names))
        options = [self._options(model, task, request) for task in tasks]
        # Every task's inputs are submitted at once, so they can share a batch (one encoder run).
        outcomes = await asyncio.gather(
            *(self.inference.infer(model, texts, truncate, option, context) for option in options),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        tensors: dict[str, OutputTensor] = {}
        for task, option, outcome in zip(tasks, options, outcomes, strict=True):
            if task is Task.EMBED:
                tensors["embedding"] = OutputTensor("embedding", "FP32", _stack(outcome.values))
            elif task is Task.CLASSIFY:
                tensors.update(_classify_tensors(model, option, outcome))
            else:
                tensors.update(await self._fill_mask_tensors(model, outcome, "mask_sequences" in names))
        response = pb.ModelInferResponse(
            model_name=model.name, model_version=str(model.version), id=request.id
        )
        write_outputs(response, [tensors[name] for name in names], raw=bool(request.raw_input_contents))
        return response

    async def _fill_mask_tensors(self, model: ServedModel, outcome: CallOutcome, sequences: bool) -> dict:
        for i, masks in enumerate(outcome.values):
            if len(masks) != 1:
                raise InvalidInput(
                    f"inputs[{TEXT_INPUT!r}][{i}]: {len(masks)} {model.manifest.tasks.fill_mask.mask_token} "
                    "tokens; this protocol takes exactly one per input (bertserve.v1 FillMask takes more)"
                )
        tops = [masks[0] for masks in outcome.values]
        tokens = [[model.tokenizer.id_to_token(int(i)).encode() for i in top.token_ids] for top in tops]
        tensors = {
            "mask_tokens": OutputTensor("mask_tokens", "BYTES", _object_array(tokens)),
            "mask_scores": OutputTensor("mask_scores", "FP32", _stack([top.scores for top in tops])),
        }
        if sequences:
            filled = await self.inference.off_loop(
                model.filled_sequences, [e.ids for e in outcome.encoded], outcome.values
            )
            texts = [[text.encode() for text in per_input[0]] for per_input in filled]
            tensors["mask_sequences"] = OutputTensor("mask_sequences", "BYTES", _object_array(texts))
        return tensors


def _classify_tensors(model: ServedModel, option: TaskOptions, outcome: CallOutcome) -> dict:
    spec = model.manifest.tasks.classify
    best = [ranked(scores, option.top_k) for scores in outcome.values]
    labels = [[spec.id2label.get(i, str(i)).encode() for i, _ in row] for row in best]
    scores = [[score for _, score in row] for row in best]
    return {
        "labels": OutputTensor("labels", "BYTES", _object_array(labels)),
        "label_scores": OutputTensor("label_scores", "FP32", _stack(scores)),
    }


def _stack(rows) -> np.ndarray:
    return np.asarray(rows, dtype=np.float32)  # (n, width)


def _object_array(rows: list[list[bytes]]) -> np.ndarray:
    out = np.empty((len(rows), len(rows[0]) if rows else 0), dtype=object)  # (n, k)
    for i, row in enumerate(rows):
        out[i, :] = row
    return out


def add_to_server(inference: InferenceServicer, health: HealthServicer, server: grpc.aio.Server) -> str:
    """Registers the servicer next to `inference` on `server`; returns the service's full name.

    Requests are passed on as bytes and parsed by `probe`/`rpc`, so that an undecodable request gets
    INVALID_ARGUMENT (the generated registration would answer UNKNOWN)."""
    servicer = OpenInferenceServicer(inference, health)
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=None,
            response_serializer=getattr(pb, method.output_type.name).SerializeToString,
        )
        for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    return SERVICE_NAME
