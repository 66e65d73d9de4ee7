"""An importable Python client for the bertserve gRPC API.

    from bertserve.client import Client
    with Client("127.0.0.1:50051") as client:
        client.wait_until_serving()
        vectors = client.embed(["hello world"]).embeddings[0].values

Failures raise `grpc.RpcError` with the server's status code and message.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc

SERVICE_NAME = "bertserve.v1.Inference"


class Client:
    def __init__(
        self,
        address: str,
        *,
        timeout: float | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 8 * 1024 * 1024,
    ):
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
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
        inputs: Sequence[str],
        *,
        model: str = "",
        normalize: bool | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> pb.EmbedResponse:
        request = pb.EmbedRequest(inputs=list(inputs), model=model, truncate=truncate)
        if normalize is not None:
            request.normalize = normalize
        return self.stub.Embed(request, timeout=self._timeout(timeout))

    def fill_mask(
        self,
        inputs: Sequence[str],
        *,
        model: str = "",
        top_k: int | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> pb.FillMaskResponse:
        request = pb.FillMaskRequest(inputs=list(inputs), model=model, truncate=truncate)
        if top_k is not None:
            request.top_k = top_k
        return self.stub.FillMask(request, timeout=self._timeout(timeout))

    def classify(
        self,
        inputs: Sequence[str],
        *,
        model: str = "",
        top_k: int | None = None,
        raw_scores: bool = False,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> pb.ClassifyResponse:
        request = pb.ClassifyRequest(
            inputs=list(inputs), model=model, raw_scores=raw_scores, truncate=truncate
        )
        if top_k is not None:
            request.top_k = top_k
        return self.stub.Classify(request, timeout=self._timeout(timeout))

    def tokenize(
        self, inputs: Sequence[str], *, model: str = "", truncate: bool = False, timeout: float | None = None
    ) -> pb.TokenizeResponse:
        request = pb.TokenizeRequest(inputs=list(inputs), model=model, truncate=truncate)
        return self.stub.Tokenize(request, timeout=self._timeout(timeout))

    def attention(
        self,
        text: str,
        *,
        model: str = "",
        layers: Sequence[int] = (),
        heads: Sequence[int] = (),
        truncate: bool = False,
        timeout: float | None = None,
    ) -> pb.AttentionResponse:
        """Attention probabilities of one input; empty `layers`/`heads`: all of them. Each map's
        `probabilities` is row-major (sequence_length x sequence_length), see `attention_matrix`."""
        request = pb.AttentionRequest(
            input=text, model=model, layers=list(layers), heads=list(heads), truncate=truncate
        )
        return self.stub.Attention(request, timeout=self._timeout(timeout))

    def info(self, *, timeout: float | None = None) -> pb.InfoResponse:
        return self.stub.Info(pb.InfoRequest(), timeout=self._timeout(timeout))

    def health(self, service: str = "", *, timeout: float | None = 5.0) -> str:
        """ "SERVING", "NOT_SERVING", ... for the server ("") or a service name."""
        response = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_until_serving(self, timeout: float = 60.0, service: str = "") -> None:
        """Blocks until health says SERVING; raises TimeoutError otherwise. Uses health's Watch stream."""
        try:
            stream = self.health_stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
            for response in stream:
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    stream.cancel()
                    return
        except grpc.RpcError as exc:
            raise TimeoutError(f"not SERVING within {timeout}s: {exc.code().name}") from None
        raise TimeoutError(f"not SERVING within {timeout}s")


def attention_matrix(response: pb.AttentionResponse, layer: int, head: int) -> list[list[float]]:
    """One map of an Attention response as rows (query token) of columns (key token)."""
    n = response.sequence_length
    for item in response.maps:
        if item.layer == layer and item.head == head:
            values = list(item.probabilities)
            return [values[row * n : (row + 1) * n] for row in range(n)]
    raise KeyError(f"the response holds no map for layer {layer} head {head}")
