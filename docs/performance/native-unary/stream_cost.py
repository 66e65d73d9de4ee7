"""One EmbedStream of the mixed corpus on the main port and, relayed, on the native port, of one
simulated-device server: inputs/s and the server's CPU per input, three rounds in turn.

Run from the repository root: `python docs/performance/native-unary/stream_cost.py INPUTS`."""

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bertserve.bench import gpu
from bertserve.bench.process_tree import tree_cpu_seconds
from bertserve.bench.processes import bertserve_process, child_pythonpath, free_port
from bertserve.client_stream import embed_stream
from bertserve.v1 import inference_pb2_grpc as pb_grpc

MODEL = "all-minilm-l6-v2"
ROUNDS = 3


def stream(port: int, texts: list[str]) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return sum(1 for _ in embed_stream(pb_grpc.InferenceStub(channel), texts, model=MODEL, truncate=True))


async def main(inputs: int) -> None:
    corpus = [
        line.strip() for line in Path("bench/corpus/mixed.txt").read_text().splitlines() if line.strip()
    ]
    texts = (corpus * (inputs // len(corpus) + 1))[:inputs]
    native_port = free_port()
    settings = gpu.SERVER_SETTINGS | {
        "provider": "cpu",
        "simulated_device_ms": "1",
        "native_port": str(native_port),
    }
    server = bertserve_process(
        "stream-cost", Path("model_repository"), MODEL, 1, Path(tempfile.mkdtemp()), settings
    )
    server.env.update(child_pythonpath())
    await server.start(180)
    try:
        stream(server.port, texts[:256])  # warm up
        for _ in range(ROUNDS):
            for name, port in (("main", server.port), ("native", native_port)):
                before, started = tree_cpu_seconds(server.process.pid), time.perf_counter()
                done = await asyncio.to_thread(stream, port, texts)
                seconds = time.perf_counter() - started
                cpu_ms = 1000 * (tree_cpu_seconds(server.process.pid) - before) / done
                print(name, round(done / seconds), round(cpu_ms, 3), flush=True)
    finally:
        await server.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
