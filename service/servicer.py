"""The bertserve.v1.Inference servicer: proto -> domain -> batcher -> proto. Errors are raised as domain
errors and mapped to status codes by `rpc_status.rpc`."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass

import grpc
import numpy as np
import onnxruntime
import tokenizers
from google import protobuf

from bertserve import __version__
from bertserve.manifest import ENCODER_ATTENTIONS
from bertserve.service.attention import attention_response, check_response_size, select_indices
from bertserve.service.batcher import ItemResult, WorkItem
from bertserve.service.errors import InvalidInput
from bertserve.service.metrics import Metrics
from bertserve.service.model_registry import ModelRegistry
from bertserve.service.rpc_status import Lifecycle, rpc
from bertserve.service.served_model import ServedModel
from bertserve.service.settings import Settings
from bertserve.service.tasks import Task, TaskOptions
from bertserve.service.tasks.classify import ranked
from bertserve.service.tasks.fill_mask import mask_positions
from bertserve.service.tokenization import EncodedInput
from bertserve.service.validation import check_fill_mask_response_size, check_texts, check_top_k
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc  # the servicer base class

DEFAULT_FILL_MASK_TOP_K = 5
SERVICE_FULL_NAME = pb.DESCRIPTOR.services_by_name["Inference"].full_name  # bertserve.v1.Inference


@dataclass
class CallOutcome:
    values: list[object]
    encoded: list[EncodedInput]
    metadata: pb.ResponseMetadata


def _metadata(model: ServedModel, encoded: list[EncodedInput], tokenize_s: float, results: list[ItemResult]):
    lengths = [e.length for e in encoded]
    batches = {r.batch_id: r.inference_s for r in results}
    return pb.ResponseMetadata(
        model=model.name,
        model_version=model.version,
        total_tokens=sum(lengths),
        input_tokens=lengths,
        truncated=[e.truncated for e in encoded],
        queue_time_ms=1000 * max((r.queue_s for r in results), default=0.0),
        inference_time_ms=1000 * sum(batches.values()),
        tokenize_time_ms=1000 * tokenize_s,
        batches=len(batches),
    )


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        registry: ModelRegistry,
        settings: Settings,
        metrics: Metrics,
        lifecycle: Lifecycle,
        cpu_executor: Executor,
    ):
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self.lifecycle = lifecycle
        self._cpu = cpu_executor  # tokenization and decoding, off the event loop

    async def off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn, *args)

    async def _tokenize(self, model: ServedModel, inputs, truncate: bool) -> tuple[list[EncodedInput], float]:
        texts = check_texts(inputs, self.settings.max_inputs_per_request, self.settings.max_input_chars)
        started = time.perf_counter()
        encoded = await self.off_loop(model.tokenizer.encode, texts, truncate)
        return encoded, time.perf_counter() - started

    async def infer(
        self, model: ServedModel, inputs, truncate: bool, options: TaskOptions, context
    ) -> CallOutcome:
        encoded, tokenize_s = await self._tokenize(model, inputs, truncate)
        masks = (
            [self._masks(model, i, e) for i, e in enumerate(encoded)]
            if options.task is Task.FILL_MASK
            else None
        )
        if masks is not None:
            sizes = [len(m) for m in masks]
            check_fill_mask_response_size(inputs, sizes, options.top_k, self.settings.max_message_bytes)
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        loop = asyncio.get_running_loop()
        items = [
            WorkItem(
                ids=e.ids,
                type_ids=e.type_ids,
                options=options,
                future=loop.create_future(),
                deadline=deadline,
                mask_positions=None if masks is None else masks[i],
            )
            for i, e in enumerate(encoded)
        ]
        model.batcher.submit(items)
        self.metrics.inputs.labels(model.name, options.task.value).inc(len(items))
        futures = [item.future for item in items]
        try:
            results: list[ItemResult] = await asyncio.gather(*futures)
        finally:
            for future in futures:  # after a failure, the batcher skips what is still queued
                future.cancel()
        return CallOutcome(
            [r.value for r in results], encoded, _metadata(model, encoded, tokenize_s, results)
        )

    def _masks(self, model: ServedModel, index: int, encoded: EncodedInput) -> np.ndarray:
        spec = model.manifest.tasks.fill_mask
        positions = mask_positions(encoded.ids, spec.mask_token_id)
        if len(positions) == 0:
            cut = " after truncation" if encoded.truncated else ""
            raise InvalidInput(f"inputs[{index}]: no {spec.mask_token} token{cut}")
        if len(positions) > self.settings.max_masks_per_input:
            raise InvalidInput(
                f"inputs[{index}]: {len(positions)} {spec.mask_token} tokens is more than "
                f"max_masks_per_input {self.settings.max_masks_per_input}"
            )
        return positions

    @rpc("Embed", pb.EmbedRequest)
    async def Embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        model = self.registry.resolve(request.model, Task.EMBED)
        spec = model.manifest.tasks.embed
        normalize = request.normalize if request.HasField("normalize") else spec.normalize
        outcome = await self.infer(
            model, request.inputs, request.truncate, TaskOptions(Task.EMBED, normalize), context
        )
        return pb.EmbedResponse(
            embeddings=[pb.Embedding(values=v.tolist()) for v in outcome.values],
            dimension=spec.dimension,
            metadata=outcome.metadata,
        )

    @rpc("FillMask", pb.FillMaskRequest)
    async def FillMask(self, request: pb.FillMaskRequest, context) -> pb.FillMaskResponse:
        model = self.registry.resolve(request.model, Task.FILL_MASK)
        top_k = DEFAULT_FILL_MASK_TOP_K
        if request.HasField("top_k"):
            top_k = check_top_k(request.top_k, model.tokenizer.vocab_size, "top_k", "vocabulary size")
        options = TaskOptions(Task.FILL_MASK, top_k=top_k)
        outcome = await self.infer(model, request.inputs, request.truncate, options, context)
        sequences = await self.off_loop(
            model.filled_sequences, [e.ids for e in outcome.encoded], outcome.values
        )
        results = []
        for masks, filled in zip(outcome.values, sequences, strict=True):
            predictions = [
                pb.MaskPrediction(
                    position=mask.position,
                    candidates=[
                        pb.MaskCandidate(
                            token=model.tokenizer.id_to_token(int(token_id)),
                            token_id=int(token_id),
                            score=float(score),
                            sequence=text,
                        )
                        for token_id, score, text in zip(mask.token_ids, mask.scores, texts, strict=True)
                    ],
                )
                for mask, texts in zip(masks, filled, strict=True)
            ]
            results.append(pb.FillMaskResult(masks=predictions))
        return pb.FillMaskResponse(results=results, metadata=outcome.metadata)

    @rpc("Classify", pb.ClassifyRequest)
    async def Classify(self, request: pb.ClassifyRequest, context) -> pb.ClassifyResponse:
        model = self.registry.resolve(request.model, Task.CLASSIFY)
        spec = model.manifest.tasks.classify
        labels = len(spec.id2label)
        top_k = 0
        if request.HasField("top_k"):
            top_k = check_top_k(request.top_k, labels, "top_k", "number of labels")
        options = TaskOptions(Task.CLASSIFY, top_k=top_k, raw_scores=request.raw_scores)
        outcome = await self.infer(model, request.inputs, request.truncate, options, context)
        results = [
            pb.Classification(
                labels=[
                    pb.LabelScore(label=spec.id2label.get(i, str(i)), index=i, score=score)
                    for i, score in ranked(scores, top_k)
                ]
            )
            for scores in outcome.values
        ]
        return pb.ClassifyResponse(results=results, metadata=outcome.metadata)

    @rpc("Tokenize", pb.TokenizeRequest)
    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        model = self.registry.resolve(request.model, None)
        encoded, tokenize_s = await self._tokenize(model, request.inputs, request.truncate)
        results = [
            pb.TokenizedInput(
                tokens=[
                    pb.Token(text=text, id=int(token_id), start=start, end=end, special=special)
                    for text, token_id, (start, end), special in zip(
                        e.tokens, e.ids, e.offsets, e.special, strict=True
                    )
                ]
            )
            for e in encoded
        ]
        return pb.TokenizeResponse(results=results, metadata=_metadata(model, encoded, tokenize_s, []))

    @rpc("Attention", pb.AttentionRequest)
    async def Attention(self, request: pb.AttentionRequest, context) -> pb.AttentionResponse:
        model = self.registry.resolve_attention(request.model)
        dims = model.manifest.dimensions
        layers = select_indices(request.layers, dims.num_hidden_layers, "layers", model.name)
        heads = select_indices(request.heads, dims.num_attention_heads, "heads", model.name)
        try:
            encoded, tokenize_s = await self._tokenize(model, [request.input], request.truncate)
        except InvalidInput as exc:  # the checks speak of inputs[0]; this request has one `input`
            raise InvalidInput(str(exc).replace("inputs[0]", "input", 1)) from None
        (e,) = encoded
        check_response_size(len(layers) * len(heads), e.length, self.settings.max_message_bytes)
        self.metrics.inputs.labels(model.name, "attention").inc()
        loop = asyncio.get_running_loop()
        # On the model's worker thread, outside the batcher (see service/attention.py); a cancelled call
        # that has not started yet never runs.
        result = await loop.run_in_executor(
            model.executor, model.attention.compute, e.ids, e.type_ids, layers, heads, time.monotonic()
        )
        self.metrics.inference_duration.labels(model.name, ENCODER_ATTENTIONS).observe(result.inference_s)
        return attention_response(model, e, layers, heads, result, tokenize_s)

    @rpc("Info", pb.InfoRequest)
    async def Info(self, request: pb.InfoRequest, context) -> pb.InfoResponse:
        s = self.settings
        models = []
        for model in self.registry.ordered:
            manifest = model.manifest
            tasks = manifest.tasks
            models.append(
                pb.ModelInfo(
                    name=model.name,
                    version=model.version,
                    tasks=[t.value for t in model.tasks] + (["attention"] if model.attention else []),
                    default_for=self.registry.default_rpcs(model),
                    dimension=tasks.embed.dimension if tasks.embed else manifest.dimensions.hidden_size,
                    max_length=manifest.max_length,
                    vocab_size=manifest.dimensions.vocab_size,
                    num_layers=manifest.dimensions.num_hidden_layers,
                    precision=model.precision,
                    provider=model.provider,
                    pooling=tasks.embed.pooling if tasks.embed else "",
                    normalize_default=bool(tasks.embed and tasks.embed.normalize),
                    mask_token=tasks.fill_mask.mask_token if tasks.fill_mask else "",
                    labels=[tasks.classify.id2label[i] for i in sorted(tasks.classify.id2label)]
                    if tasks.classify
                    else [],
                    problem_type=tasks.classify.problem_type if tasks.classify else "",
                )
            )
        limits = pb.Limits(
            max_inputs_per_request=s.max_inputs_per_request,
            max_input_chars=s.max_input_chars,
            max_message_bytes=s.max_message_bytes,
            max_batch_size=s.max_batch_size,
            max_batch_tokens=s.max_batch_tokens,
            max_queue_inputs=s.max_queue_inputs,
            max_queue_delay_ms=s.max_queue_delay_ms,
            max_masks_per_input=s.max_masks_per_input,
            max_padding_ratio=s.max_padding_ratio,
        )
        versions = {
            "onnxruntime": onnxruntime.__version__,
            "tokenizers": tokenizers.__version__,
            "grpcio": grpc.__version__,
            "protobuf": protobuf.__version__,
        }
        return pb.InfoResponse(server_version=__version__, models=models, limits=limits, versions=versions)


RESPONSE_TYPES = {
    "Embed": pb.EmbedResponse,
    "FillMask": pb.FillMaskResponse,
    "Classify": pb.ClassifyResponse,
    "Tokenize": pb.TokenizeResponse,
    "Info": pb.InfoResponse,
    "Attention": pb.AttentionResponse,
}


def add_to_server(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Registers the servicer with requests passed as bytes: `rpc` parses them, so that an undecodable
    request gets INVALID_ARGUMENT (the generated registration would answer UNKNOWN)."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=None,
            response_serializer=response_type.SerializeToString,
        )
        for name, response_type in RESPONSE_TYPES.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_FULL_NAME, handlers),))
