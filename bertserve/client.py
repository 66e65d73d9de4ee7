"""The Python client of the bertserve gRPC API: a thin layer over the generated stubs that returns typed
results (bertserve/client_results.py: dataclasses, numpy arrays).

    from bertserve.client import Client
    with Client("127.0.0.1:50051") as client:
        client.wait_until_serving()
        result = client.embed(["hello world", "goodbye"])
        result.vectors  # float32 array [2, dimension]

Failures raise `grpc.RpcError` with the server's status code and message. `client.stub` is the raw
`bertserve.v1.Inference` stub (protobuf replies, futures) for what the typed methods do not cover.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve import client_results as results
from bertserve import client_stream
from bertserve.address import with_port
from bertserve.client_results import (
    AttentionMap,
    AttentionMaps,
    Classification,
    Classifications,
    Embeddings,
    FilledMasks,
    FillMaskResult,
    LabelScore,
    Limits,
    MaskCandidate,
    MaskPrediction,
    Metadata,
    ModelInfo,
    PairScore,
    PairScores,
    RankedDocument,
    Reranking,
    ServerInfo,
    SparseEmbedding,
    Token,
    Tokenization,
    TokenizedInput,
)
from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc

SERVICE_NAME = "bertserve.v1.Inference"


@dataclass(frozen=True)
class Chunking:
    """`Client.embed(chunking=...)`: inputs longer than a window are cut into windows of `length` tokens
    (special tokens included; 0: the model's max_length) overlapping by `overlap`, each embedded, and
    pooled into one vector ("mean", weighted by each window's tokens, or "max")."""

    length: int = 0
    overlap: int = 0
    pooling: str = "mean"


# gRPC's reconnect backoff grows to 120 s by default: capped so that a client waiting for a server to
# come up sees it within a couple of seconds of its start.
MAX_RECONNECT_BACKOFF_MS = 2000

__all__ = [
    "SERVICE_NAME",
    "AttentionMap",
    "AttentionMaps",
    "Chunking",
    "Classification",
    "Classifications",
    "Client",
    "Embeddings",
    "FillMaskResult",
    "FilledMasks",
    "LabelScore",
    "Limits",
    "MaskCandidate",
    "MaskPrediction",
    "Metadata",
    "ModelInfo",
    "PairScore",
    "PairScores",
    "RankedDocument",
    "Reranking",
    "ServerInfo",
    "SparseEmbedding",
    "Token",
    "TokenizedInput",
    "Tokenization",
]


class Client:
    def __init__(
        self,
        address: str,
        *,
        timeout: float | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 8 * 1024 * 1024,
    ):
        self.address = with_port(address)  # a host without a port means 50051, not gRPC's 443
        address = self.address
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
        ]
        if credentials is None:
            self.channel = grpc.insecure_channel(address, options=options)
        else:
            self.channel = grpc.secure_channel(address, credentials, options=options)
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.timeout = timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def embed(
        self,
        inputs: Sequence[str] = (),
        *,
        model: str = "",
        normalize: bool | None = None,
        truncate: bool = False,
        timeout: float | None = None,
        dimensions: int | None = None,
        prompt_name: str = "",
        truncation_direction: str = "",
        encodings: Sequence[str] = (),
        dense: bool = False,
        tokens: bool = False,
        sparse: bool = False,
        sparse_threshold: float = 0.0,
        chunking: Chunking | None = None,
        token_ids: Sequence[Sequence[int]] | None = None,
    ) -> Embeddings:
        """One vector per input; `normalize` None: the model's default (ModelInfo.normalize_default).

        Options (EmbedOptions in the protocol; `info()` says what each model offers): `dimensions`, a
        Matryoshka size to cut the vectors to; `prompt_name`, the model's prompt to prepend ("": its
        default); `truncation_direction` "right" or "left" (with `truncate`); `encodings` of the vectors
        ("float", "float16", "int8", "uint8", "binary", "ubinary": `.vectors` holds "float", `.encodings`
        the others); `tokens` (`.tokens`, one [tokens, hidden] array per input) and `sparse` (`.sparse`,
        SPLADE weights above `sparse_threshold`), with `dense` for the vectors as well; `chunking`, long
        inputs embedded window by window and pooled. `token_ids`: the model's own ids instead of `inputs`."""
        request = pb.EmbedRequest(inputs=list(inputs), model=model, truncate=truncate)
        if normalize is not None:
            request.normalize = normalize
        for ids in token_ids or ():
            request.token_ids.add(ids=list(ids))
        options = request.options
        if dimensions is not None:
            options.dimensions = dimensions
        options.prompt_name, options.truncation_direction = prompt_name, truncation_direction
        options.encodings.extend(encodings)
        options.dense, options.tokens, options.sparse = dense, tokens, sparse
        options.sparse_threshold = sparse_threshold
        if chunking is not None:
            options.chunking.CopyFrom(
                pb.Chunking(length=chunking.length, overlap=chunking.overlap, pooling=chunking.pooling)
            )
        reply = self.stub.Embed(request, timeout=self._timeout(timeout))
        with_vectors = dense or not (tokens or sparse)
        asked = tuple(encodings) or ("float",)
        return results.embeddings(
            reply,
            floats=with_vectors and "float" in asked,
            encodings=asked if with_vectors else (),
            tokens=tokens,
            sparse=sparse,
            chunked=chunking is not None,
        )

    def embed_stream(
        self,
        texts: Iterable[str],
        *,
        batch_size: int = client_stream.DEFAULT_BATCH_SIZE,
        model: str = "",
        normalize: bool | None = None,
        truncate: bool = False,
        timeout: float | None = None,
        max_requests_in_flight: int = client_stream.DEFAULT_REQUESTS_IN_FLIGHT,
        dimensions: int | None = None,
        prompt_name: str = "",
        truncation_direction: str = "",
    ) -> Iterator[np.ndarray]:
        """Bulk embedding over one EmbedStream call: one float32 vector per text, in input order, for an
        iterable of any length (consumed lazily, `batch_size` texts per request). A failed request
        raises client_stream.StreamRequestError (a grpc.RpcError) naming its first input. `dimensions`,
        `prompt_name`, `truncation_direction`: as `embed`'s."""
        return client_stream.embed_stream(
            self.stub,
            texts,
            batch_size=batch_size,
            model=model,
            normalize=normalize,
            truncate=truncate,
            timeout=self._timeout(timeout),
            max_requests_in_flight=max_requests_in_flight,
            dimensions=dimensions,
            prompt_name=prompt_name,
            truncation_direction=truncation_direction,
        )

    def embed_stream_batches(self, texts: Iterable[str], **options) -> Iterator[np.ndarray]:
        """As `embed_stream`, one float32 array [n, dimension] per `batch_size` texts (fewer copies)."""
        options.setdefault("timeout", self.timeout)
        return client_stream.embed_stream_batches(self.stub, texts, **options)

    def fill_mask(
        self,
        inputs: Sequence[str],
        *,
        model: str = "",
        top_k: int | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> FilledMasks:
        """Per input, per mask, the top_k candidates (None: the server's default, 5)."""
        request = pb.FillMaskRequest(inputs=list(inputs), model=model, truncate=truncate)
        if top_k is not None:
            request.top_k = top_k
        return results.filled_masks(self.stub.FillMask(request, timeout=self._timeout(timeout)))

    def classify(
        self,
        inputs: Sequence[str],
        *,
        pairs: Sequence[str] = (),
        model: str = "",
        top_k: int | None = None,
        raw_scores: bool = False,
        truncate: bool = False,
        truncation_strategy: str = "",
        timeout: float | None = None,
    ) -> Classifications:
        """Per input, labels best first (top_k None: all of them). `pairs`: sentence pairs, the second
        text of each input; `truncation_strategy` (with truncate): "longest_first" (the server's default),
        "only_first" or "only_second"."""
        request = pb.ClassifyRequest(
            inputs=list(inputs),
            pairs=list(pairs),
            model=model,
            raw_scores=raw_scores,
            truncate=truncate,
            truncation_strategy=truncation_strategy,
        )
        if top_k is not None:
            request.top_k = top_k
        return results.classifications(self.stub.Classify(request, timeout=self._timeout(timeout)))

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        return_documents: bool = False,
        model: str = "",
        *,
        raw_scores: bool = False,
        truncate: bool | None = None,
        timeout: float | None = None,
    ) -> Reranking:
        """The documents by relevance to the query, best first, each with its index in `documents` (top_n
        None: all). `model` "": the server's default reranker (a cross-encoder, else the embedding model's
        cosine); `truncate` None: the server cuts long documents to fit."""
        request = pb.RerankRequest(
            query=query,
            documents=list(documents),
            model=model,
            return_documents=return_documents,
            raw_scores=raw_scores,
        )
        if top_n is not None:
            request.top_n = top_n
        if truncate is not None:
            request.truncate = truncate
        return results.reranking(self.stub.Rerank(request, timeout=self._timeout(timeout)))

    def score(
        self,
        texts_1: Sequence[str],
        texts_2: Sequence[str],
        *,
        model: str = "",
        raw_scores: bool = False,
        truncate: bool = False,
        truncation_strategy: str = "",
        timeout: float | None = None,
    ) -> PairScores:
        """One score per pair: one text of texts_1 against every texts_2, or texts_1[i] with texts_2[i]."""
        request = pb.ScoreRequest(
            texts_1=list(texts_1),
            texts_2=list(texts_2),
            model=model,
            raw_scores=raw_scores,
            truncate=truncate,
            truncation_strategy=truncation_strategy,
        )
        return results.pair_scores(self.stub.Score(request, timeout=self._timeout(timeout)))

    def tokenize(
        self, inputs: Sequence[str], *, model: str = "", truncate: bool = False, timeout: float | None = None
    ) -> Tokenization:
        request = pb.TokenizeRequest(inputs=list(inputs), model=model, truncate=truncate)
        return results.tokenization(self.stub.Tokenize(request, timeout=self._timeout(timeout)))

    def attention(
        self,
        text: str,
        *,
        model: str = "",
        layers: Sequence[int] = (),
        heads: Sequence[int] = (),
        truncate: bool = False,
        timeout: float | None = None,
    ) -> AttentionMaps:
        """Attention probabilities of one input; empty `layers`/`heads`: all of them. Each map is a
        [sequence_length, sequence_length] array (row = query token); `.matrix(layer, head)` picks one."""
        request = pb.AttentionRequest(
            input=text, model=model, layers=list(layers), heads=list(heads), truncate=truncate
        )
        return results.attention_maps(self.stub.Attention(request, timeout=self._timeout(timeout)))

    def info(self, *, timeout: float | None = None) -> ServerInfo:
        return results.server_info(self.stub.Info(pb.InfoRequest(), timeout=self._timeout(timeout)))

    def health(self, service: str = "", *, timeout: float | None = 5.0) -> str:
        """ "SERVING", "NOT_SERVING", ... for the server ("") or a service name."""
        response = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_until_serving(self, timeout: float = 60.0, service: str = "") -> None:
        """Blocks until health says SERVING, waiting for a server that is not up yet (gRPC wait-for-ready)
        or not ready yet; raises TimeoutError after `timeout` seconds. Uses health's Watch stream."""
        deadline = time.monotonic() + timeout
        request = health_pb2.HealthCheckRequest(service=service)
        last = "no answer"
        while (left := deadline - time.monotonic()) > 0:
            try:
                stream = self.health_stub.Watch(request, timeout=left, wait_for_ready=True)
                for response in stream:
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
                    if response.status == health_pb2.HealthCheckResponse.SERVING:
                        stream.cancel()
                        return
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise
                last = f"{code.name}: {exc.details()}"  # the server went away: wait for it again
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        raise TimeoutError(f"{self.address} not SERVING within {timeout:g}s (last: {last})")
