"""The handler's floor, its server: a minimal grpc.aio server that answers Embed with nothing of bertserve's
path (bench/handler_floor.py starts it and measures it).

The handler tokenizes the call's texts with the model's tokenizer and runs the fp32 graph (the session
options and threads of the in-process measurement it is held against), then replies: no validation,
admission, batcher, metrics or interceptors. `--mode inline` runs the session on the event loop itself (a
front that blocks its loop for the whole run: no health probe or other call is answered meanwhile, which
bertserve never does); `--mode thread` runs it in one worker thread that the handler awaits
(`run_in_executor`): the hop to another thread and back that any asyncio front keeping its loop free pays.

    python -m bertserve.bench.handler_floor_server --graph G --tokenizer T --max-length L --threads N --port P --mode inline
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np

from bertserve.bench.corpus import load_tokenizer
from bertserve.bench.inprocess import OUTPUT, feeds_for, make_session
from bertserve.v1 import inference_pb2, inference_pb2_grpc

MODES = ("inline", "thread")


class FloorEmbedder(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self, graph: Path, tokenizer: Path, max_length: int, threads: int, mode: str, provider: str
    ) -> None:
        self.session = make_session(graph, threads, provider)
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.tokenizer = load_tokenizer(tokenizer, max_length)
        self.executor = ThreadPoolExecutor(max_workers=1) if mode == "thread" else None

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, list[int], float]:
        """(embeddings (B, H), tokens per input, seconds of the session's run)."""
        sequences = [e.ids for e in self.tokenizer.encode_batch(texts)]
        started = time.perf_counter()
        (embeddings,) = self.session.run([OUTPUT], feeds_for(sequences, self.input_names))
        return embeddings, [len(s) for s in sequences], time.perf_counter() - started

    async def Embed(self, request, context):  # noqa: N802 (gRPC method name)
        texts = list(request.inputs)
        if self.executor is None:
            embeddings, tokens, seconds = self._embed(texts)
        else:
            loop = asyncio.get_running_loop()
            embeddings, tokens, seconds = await loop.run_in_executor(self.executor, self._embed, texts)
        return inference_pb2.EmbedResponse(
            embeddings=[inference_pb2.Embedding(values=row) for row in embeddings.tolist()],
            dimension=embeddings.shape[1],
            metadata=inference_pb2.ResponseMetadata(
                total_tokens=sum(tokens), input_tokens=tokens, inference_time_ms=1e3 * seconds, batches=1
            ),
        )


async def serve(args: argparse.Namespace) -> None:
    server = grpc.aio.server()
    embedder = FloorEmbedder(
        Path(args.graph), Path(args.tokenizer), args.max_length, args.threads, args.mode, args.provider
    )
    inference_pb2_grpc.add_InferenceServicer_to_server(embedder, server)
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    await server.start()  # after the session is loaded: accepting connections means ready
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await server.stop(grace=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
