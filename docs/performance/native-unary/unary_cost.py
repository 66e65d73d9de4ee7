"""CPU per call of the main port against the native port, per method, for one simulated-device server.

Run from the repository root: `python docs/performance/native-unary/unary_cost.py CALLS WORKERS`."""

import asyncio
import json
import struct
import sys
import tempfile
from pathlib import Path

from bertserve.bench import gpu
from bertserve.bench.loadgen import Request
from bertserve.bench.native_loadgen import NativeMethod, NativePhase, choose
from bertserve.bench.process_tree import tree_cpu_seconds
from bertserve.bench.processes import bertserve_process, child_pythonpath, free_port
from bertserve.kserve import open_inference_pb2 as kserve
from bertserve.v1 import inference_pb2 as pb

MODEL = "all-minilm-l6-v2"
ROUNDS, CALLERS = 3, 32


async def measured(phase: NativePhase, pid: int):
    """`phase` warmed up, measured and closed: its result, and the CPU seconds of process `pid` and its
    children meanwhile."""
    await phase.warm_up()
    before = tree_cpu_seconds(pid)
    result = await phase.measure()
    cpu_s = tree_cpu_seconds(pid) - before
    await phase.close()
    return result, cpu_s


def embed(options: pb.EmbedOptions | None = None) -> NativeMethod:
    def payload(request: Request) -> bytes:
        return pb.EmbedRequest(
            inputs=request.texts, model=MODEL, truncate=True, options=options
        ).SerializeToString()

    return NativeMethod("/bertserve.v1.Inference/Embed", payload, pb.EmbedResponse.FromString)


def model_infer() -> NativeMethod:
    def payload(request: Request) -> bytes:
        infer = kserve.ModelInferRequest(model_name=MODEL)
        infer.inputs.add(name="text", datatype="BYTES", shape=[1])
        text = request.texts[0].encode()
        infer.raw_input_contents.append(struct.pack("<I", len(text)) + text)
        return infer.SerializeToString()

    return NativeMethod(
        "/inference.GRPCInferenceService/ModelInfer", payload, kserve.ModelInferResponse.FromString
    )


METHODS = {
    "embed": embed(),
    "embed_options": embed(pb.EmbedOptions(encodings=["float"])),  # the same answer, through the handler
    "model_infer": model_infer(),
}


async def main(calls: int, workers: str) -> None:
    texts = [
        line.strip() for line in Path("bench/corpus/mixed.txt").read_text().splitlines() if line.strip()
    ][:500]
    single = [Request([text], 10, 1.0) for text in texts]
    requests = (single * (calls // len(single) + 1))[:calls]
    binary, _ = choose("native")
    native_port = free_port()
    settings = gpu.SERVER_SETTINGS | {
        "provider": "cpu", "simulated_device_ms": "1", "native_port": str(native_port), "workers": workers,
    }  # fmt: skip
    server = bertserve_process(
        "unary-cost", Path("model_repository"), MODEL, 1, Path(tempfile.mkdtemp()), settings
    )
    server.env.update(child_pythonpath())
    await server.start(180)
    rows: dict[str, list] = {}
    try:
        for _ in range(ROUNDS):
            for name, method in METHODS.items():
                for port_name, port in (("main", server.port), ("native", native_port)):
                    phase = NativePhase(
                        binary,
                        f"127.0.0.1:{port}",
                        method,
                        requests,
                        CALLERS,
                        single[:64],
                        connections=CALLERS,
                    )
                    result, cpu_s = await measured(phase, server.process.pid)
                    answered = len(result.latencies)
                    row = (
                        round(answered / result.seconds),
                        round(1000 * cpu_s / max(answered, 1), 3),
                        answered,
                    )
                    rows.setdefault(f"{name}/{port_name}", []).append(row)
                    print(name, port_name, row, flush=True)
    finally:
        await server.stop()
    print(json.dumps(rows))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
