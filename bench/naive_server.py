"""Baseline (b): the server a user writes first — transformers, eager, one forward pass per request.

It speaks the same `bertserve.v1.Inference/Embed` as the real server (only Embed; the other RPCs answer
UNIMPLEMENTED), so the same load generator drives both. It has no batching across callers, no ONNX,
no queue of its own: gRPC's thread pool hands each request to `Embed`, which tokenizes with the
checkpoint's tokenizer (padding to the longest input of the request), runs the PyTorch model and pools.
One worker thread, with torch on the same number of threads as the server under test, so concurrent
forwards never oversubscribe the cores (the strongest form of this baseline, not a strawman).

    python -m bertserve.bench.naive_server --checkpoint DIR --port PORT --threads N --pooling mean --max-length 256
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from concurrent import futures

import grpc
import torch
import transformers

from bertserve.v1 import inference_pb2, inference_pb2_grpc


class NaiveEmbedder(inference_pb2_grpc.InferenceServicer):
    def __init__(self, checkpoint: str, pooling: str, normalize: bool, max_length: int) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
        self.model = transformers.AutoModel.from_pretrained(checkpoint).eval()
        self.pooling, self.normalize, self.max_length = pooling, normalize, max_length

    def Embed(self, request, context):  # noqa: N802 (gRPC method name)
        start = time.perf_counter()
        with torch.inference_mode():
            batch = self.tokenizer(
                list(request.inputs),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            hidden = self.model(**batch).last_hidden_state  # (B, T, H)
            if self.pooling == "cls":
                embeddings = hidden[:, 0]  # (B, H)
            else:
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
                embeddings = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, H)
            normalize = request.normalize if request.HasField("normalize") else self.normalize
            if normalize:
                embeddings = torch.nn.functional.normalize(embeddings, dim=-1)
        tokens = batch["attention_mask"].sum(1).tolist()
        elapsed_ms = 1e3 * (time.perf_counter() - start)
        return inference_pb2.EmbedResponse(
            embeddings=[inference_pb2.Embedding(values=row) for row in embeddings.tolist()],
            dimension=embeddings.shape[1],
            metadata=inference_pb2.ResponseMetadata(
                total_tokens=sum(tokens), input_tokens=tokens, inference_time_ms=elapsed_ms, batches=1
            ),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--pooling", choices=["mean", "cls"], default="mean")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    embedder = NaiveEmbedder(args.checkpoint, args.pooling, args.normalize, args.max_length)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    inference_pb2_grpc.add_InferenceServicer_to_server(embedder, server)
    server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()  # after the model is loaded: accepting connections means ready

    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
