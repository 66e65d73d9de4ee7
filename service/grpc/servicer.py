"""The bertserve.v1.Inference servicer: protobuf <-> the inference core (service/core/core.py).

Each RPC parses its request's fields into one core call and turns the typed result into the response
(service/grpc/v1_messages.py). Errors are the core's domain errors, mapped to status codes by
`rpc_status.rpc`. A response that may be large is built and serialized on the CPU pool, never on the
event loop; small ones are serialized on the loop, which costs less than the hop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import grpc

from bertserve.service.core.core import InferenceCore
from bertserve.service.core.lifecycle import Lifecycle
from bertserve.service.grpc import streaming
from bertserve.service.grpc import v1_messages as messages
from bertserve.service.grpc.embed_options import answer_bytes, embed_arguments, options_named
from bertserve.service.grpc.rpc_status import deadline_of, rpc
from bertserve.v1 import inference_pb2 as pb

SERVICE_FULL_NAME = pb.DESCRIPTOR.services_by_name["Inference"].full_name  # bertserve.v1.Inference
DEFAULT_STRATEGY = "longest_first"  # a request's empty truncation_strategy
# Responses estimated above this many bytes are built and serialized off the event loop.
OFF_LOOP_BYTES = 64 * 1024


class InferenceServicer:
    def __init__(self, core: InferenceCore, lifecycle: Lifecycle):
        self.core = core
        self.settings = core.settings  # rpc_status.rpc reads settings, metrics, lifecycle
        self.metrics = core.metrics
        self.lifecycle = lifecycle

    async def _reply(self, build: Callable[[object], bytes], result: object, estimated_bytes: int) -> bytes:
        if estimated_bytes > OFF_LOOP_BYTES:
            return await self.core.off_loop(build, result)
        return build(result)

    @rpc("Embed", pb.EmbedRequest)
    async def Embed(self, request: pb.EmbedRequest, context) -> bytes:
        arguments = embed_arguments(request)
        with options_named():
            result = await self.core.embed(
                request.model,
                arguments.texts,
                truncate=request.truncate,
                deadline=deadline_of(context),
                **arguments.keywords(),
            )
        build = functools.partial(messages.embed, floats=arguments.floats)
        return await self._reply(build, result, answer_bytes(result))

    @rpc("FillMask", pb.FillMaskRequest)
    async def FillMask(self, request: pb.FillMaskRequest, context) -> bytes:
        top_k = request.top_k if request.HasField("top_k") else None
        result = await self.core.fill_mask(
            request.model,
            request.inputs,
            truncate=request.truncate,
            top_k=top_k,
            deadline=deadline_of(context),
        )
        candidates = sum(len(mask.tokens) for masks in result.masks for mask in masks)
        return await self._reply(messages.fill_mask, result, 64 * candidates)

    @rpc("Classify", pb.ClassifyRequest)
    async def Classify(self, request: pb.ClassifyRequest, context) -> bytes:
        top_k = request.top_k if request.HasField("top_k") else None
        result = await self.core.classify(
            request.model,
            request.inputs,
            pairs=request.pairs,
            truncate=request.truncate,
            truncation_strategy=request.truncation_strategy or DEFAULT_STRATEGY,
            top_k=top_k,
            raw_scores=request.raw_scores,
            deadline=deadline_of(context),
        )
        return await self._reply(messages.classify, result, 32 * sum(len(labels) for labels in result.labels))

    @rpc("Rerank", pb.RerankRequest)
    async def Rerank(self, request: pb.RerankRequest, context) -> bytes:
        result = await self.core.rerank(
            request.model,
            request.query,
            request.documents,
            top_n=request.top_n if request.HasField("top_n") else None,
            return_documents=request.return_documents,
            raw_scores=request.raw_scores,
            truncate=request.truncate if request.HasField("truncate") else True,
            deadline=deadline_of(context),
        )
        texts = sum(len(r.document or "") for r in result.results)
        return await self._reply(messages.rerank, result, 32 * len(result.results) + 4 * texts)

    @rpc("Score", pb.ScoreRequest)
    async def Score(self, request: pb.ScoreRequest, context) -> bytes:
        result = await self.core.score(
            request.model,
            request.texts_1,
            request.texts_2,
            raw_scores=request.raw_scores,
            truncate=request.truncate,
            truncation_strategy=request.truncation_strategy or DEFAULT_STRATEGY,
            deadline=deadline_of(context),
        )
        return await self._reply(messages.score, result, 32 * len(result.truncated))

    @rpc("Tokenize", pb.TokenizeRequest)
    async def Tokenize(self, request: pb.TokenizeRequest, context) -> bytes:
        result = await self.core.tokenize(request.model, request.inputs, truncate=request.truncate)
        return await self._reply(messages.tokenize, result, 32 * result.meta.total_tokens)

    @rpc("Attention", pb.AttentionRequest)
    async def Attention(self, request: pb.AttentionRequest, context) -> bytes:
        result = await self.core.attention(
            request.model,
            request.input,
            layers=request.layers,
            heads=request.heads,
            truncate=request.truncate,
            deadline=deadline_of(context),
        )
        return await self._reply(messages.attention, result, result.maps.nbytes)

    @rpc("Info", pb.InfoRequest)
    async def Info(self, request: pb.InfoRequest, context) -> bytes:
        return messages.info(self.core.info())


RESPONSE_TYPES = {
    "Embed": pb.EmbedResponse,
    "FillMask": pb.FillMaskResponse,
    "Classify": pb.ClassifyResponse,
    "Rerank": pb.RerankResponse,
    "Score": pb.ScoreResponse,
    "Tokenize": pb.TokenizeResponse,
    "Info": pb.InfoResponse,
    "Attention": pb.AttentionResponse,
}


def add_to_server(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Registers the servicer with requests and responses passed as bytes: `rpc` parses the request (an
    undecodable one gets INVALID_ARGUMENT; the generated registration would answer UNKNOWN) and the
    servicer serializes the response (large ones off the event loop)."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name), request_deserializer=None, response_serializer=None
        )
        for name in RESPONSE_TYPES
    }
    handlers[streaming.RPC_NAME] = streaming.method_handler(servicer.core, servicer.lifecycle)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_FULL_NAME, handlers),))
