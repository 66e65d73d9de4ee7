"""Memory per request is bounded by what the model reads (max_length tokens), not by the request's text:
the largest requests the limits allow (256 inputs of max_input_chars 20,000 characters) are sent to a
`bertserve serve` process whose RSS is sampled with psutil every 10 ms. Each raises the peak by at most
PEAK_GROWTH_LIMIT and RSS comes back within 10% of where it was.

Before the bound, `Embed(inputs=["!" * 20000] * 256, truncate=true)` tokenized every whole text (20,000
tokens each, with offsets and token strings) before cutting it: +1.6 GB and 17 s for one call on MiniLM.
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from bertserve.v1 import inference_pb2 as pb
from bertserve.v1 import inference_pb2_grpc
from tests.helpers.load import RssSampler
from tests.helpers.server import ServerProcess

MAX_INPUTS = 256  # the server's default max_inputs_per_request
MAX_CHARS = 20_000  # the server's default max_input_chars
MAX_MESSAGE_BYTES = 15 * 1024 * 1024  # 256 x 20,000 CJK characters is 15.4 MB of UTF-8
PEAK_GROWTH_LIMIT = 300 * 1024 * 1024
IDLE_RETURN = 1.10
SETTLE_S = 3.0
MIB = 1024 * 1024
ORDINARY_TEXT = "the cat sat on the mat and looked at the bird " * 10  # cut to max_length tokens
CASES = {  # name: (text of each input, calls at once, RPC)
    "punctuation, one call": ("!" * MAX_CHARS, 1, "Embed"),
    "punctuation, four calls at once": ("!" * MAX_CHARS, 4, "Embed"),
    "CJK, one call": ("中" * MAX_CHARS, 1, "Embed"),
    "words, tokenize": ("word " * (MAX_CHARS // 5), 1, "Tokenize"),
}


@pytest.fixture(scope="module")
def server(tiny_repo):
    running = ServerProcess(
        "--model-repo", str(tiny_repo), "--model", "tiny-embed", "--max-message-bytes", str(MAX_MESSAGE_BYTES)
    ).start()
    # Steady state first: the largest batches of ordinary texts, four calls at once, so caches that any
    # heavy traffic fills once (ONNX Runtime's arena at the largest batch, gRPC's buffers) are in the
    # baseline and the test measures what the long texts themselves cost.
    for rpc in ("Embed", "Tokenize"):
        asyncio.run(_calls(running.address, ORDINARY_TEXT, 4, rpc))
    yield running
    assert running.terminate() == 0


async def _calls(address: str, text: str, count: int, rpc: str) -> list[pb.ResponseMetadata]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = {"Embed": pb.EmbedRequest, "Tokenize": pb.TokenizeRequest}[rpc]
        replies = await asyncio.gather(
            *(
                getattr(stub, rpc)(request(inputs=[text] * MAX_INPUTS, truncate=True), timeout=120)
                for _ in range(count)
            )
        )
        return [r.metadata for r in replies]


def _settled(rss: RssSampler, before: int) -> int:
    """RSS once the server has handed freed memory back (it does when idle for about half a second):
    the first sample within IDLE_RETURN of `before`, else the last one after SETTLE_S."""
    deadline = time.perf_counter() + SETTLE_S
    while time.perf_counter() < deadline:
        time.sleep(0.05)  # measurement: RSS is sampled, there is no event to wait for
        latest = rss.samples[-1][1]
        if latest <= before * IDLE_RETURN:
            return latest
    return rss.samples[-1][1]


@pytest.mark.parametrize("case", CASES)
def test_largest_requests_hold_memory_bounded(server, case):
    text, count, rpc = CASES[case]
    with RssSampler(server.process.pid, interval_s=0.01) as rss:
        time.sleep(0.1)
        before = max(rss.samples[-3:])[1]
        started = time.perf_counter()
        metadata = asyncio.run(_calls(server.address, text, count, rpc))
        seconds = time.perf_counter() - started
        after = _settled(rss, before)
    peak = max(rss.between(started))
    print(
        "\nhardening figures memory "
        + json.dumps(
            {
                "case": case,
                "seconds": round(seconds, 2),
                "rss_before_mib": before // MIB,
                "rss_peak_mib": peak // MIB,
                "rss_after_mib": after // MIB,
            }
        )
    )
    assert all(list(m.truncated) == [True] * MAX_INPUTS for m in metadata)
    assert peak - before <= PEAK_GROWTH_LIMIT, f"peak RSS grew by {(peak - before) // MIB} MiB"
    assert after <= before * IDLE_RETURN, f"RSS held at idle: {before // MIB} -> {after // MIB} MiB"
