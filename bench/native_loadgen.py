"""The native load generators (bench/native/loadgen.cc for gRPC, http_loadgen.cc for HTTP/1.1): built once
per source, one child process per phase.

The Python client (grpc.aio, bench/loadgen.py) spends about 0.35-0.55 ms of CPU per call; on a machine
whose cores the server under test shares, that is taken from the server. The C++ client (gRPC's generic
stub on one completion queue) spends about 0.17 ms. It sends the phase's requests pre-serialized, so
every target still gets the same requests, and writes every reply for this module to parse into the same
`PhaseResult` the Python client fills (latencies, replies' metadata, failures by status code).

A phase is two steps, so the bench can read the server's counters around the measured part alone:
`warm_up()` starts the child, connects, sends the warm-up requests and waits for its "ready";
`measure()` starts the measured requests and parses the results. The child's CPU over the measured part
comes back as `PhaseResult.client_cpu_s`.

It is built with the system's C++ compiler against gRPC's C++ library (Debian: g++, pkg-config,
libgrpc++-dev; scripts/system-packages.sh installs them) into a cache keyed by the source's hash.
Without them, `find_binary` says why and the bench falls back to the Python client (bench.json says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from bertserve.bench.loadgen import PhaseResult, Request, poisson_offsets, record_reply
from bertserve.service.native_build import NativeUnavailable, built, cached

SOURCE = Path(__file__).parent / "native" / "loadgen.cc"
HTTP_SOURCE = Path(__file__).parent / "native" / "http_loadgen.cc"  # the same protocol with this module
_REQUEST_HEAD = struct.Struct("<dI")  # scheduled offset (s; < 0: closed loop), payload length
_REPLY_HEAD = struct.Struct("<IidI")  # request index, status code, latency (s), reply length
_STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
READY_TIMEOUT_S = 300.0  # connecting and the warm-up (as long as one request may take); then the phase fails
# Beyond a phase's time limit and its last request's timeout, the child has this long to write its results.
EXIT_GRACE_S = 60.0
USAGE_EXIT = 2  # loadgen.cc's exit code for a wrong command line


def cached_binary(source: Path = SOURCE) -> Path:
    """Where the load generator built from `source` is cached (keyed by the source's hash)."""
    return cached(source, "bertserve-http-loadgen" if source == HTTP_SOURCE else "bertserve-loadgen")


def find_binary(source: Path = SOURCE) -> Path:
    """The load generator built from `source`, compiling it on first use (a few seconds)."""
    return built(source, cached_binary(source), _starts)


def _starts(binary: Path) -> bool:
    """Whether `binary` runs here: without arguments it prints its usage and exits 2 (a missing shared
    library makes the loader exit 127 instead)."""
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    try:
        ran = subprocess.run([str(binary)], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ran.returncode == USAGE_EXIT


def choose(choice: str) -> tuple[Path | None, dict]:
    """The load generator for `choice` ("native" or "python"): (the native gRPC binary, or None for the
    Python client, which "native" falls back to when it cannot be built; what bench.json records of the
    choice, with "native_unavailable" saying why it fell back, "http_unavailable" why HTTP targets did)."""
    if choice == "python":
        return None, {"kind": "python", "asked": choice}
    try:
        binary = find_binary()
    except NativeUnavailable as why:
        fallback = f"the native load generator is unavailable ({why}): the Python client sent every phase"
        return None, {"kind": "python", "asked": choice, "native_unavailable": fallback}
    chosen = {"kind": "native", "asked": choice, "source": "bench/native/loadgen.cc, http_loadgen.cc"}
    if http_binary() is None:  # built now, so an HTTP target finds it
        chosen["http_unavailable"] = f"the native HTTP load generator is unavailable ({_http_unavailable[0]})"
    return binary, chosen


_http_unavailable: list[str] = []  # why the HTTP load generator could not be built, once tried


def http_binary() -> Path | None:
    """The HTTP load generator (None when it cannot be built here: HTTP targets then use the Python client)."""
    if _http_unavailable:
        return None
    try:
        return find_binary(HTTP_SOURCE)
    except NativeUnavailable as why:
        _http_unavailable.append(str(why))
        return None


@dataclass(frozen=True)
class NativeMethod:
    """One unary gRPC method or HTTP route as the native client calls it: its path, how a bench `Request`
    becomes the request's bytes, how reply bytes become the reply message (its metadata is recorded) and,
    for HTTP, the name of a failure from its status and body (gRPC: the status code's name)."""

    path: str  # e.g. /bertserve.v1.Inference/Embed
    payload: Callable[[Request], bytes]
    parse: Callable[[bytes], object]
    failure: Callable[[int, bytes], str] | None = None


class NativePhase:
    """One closed-loop (`rate` None) or open-loop phase of the native client against `address`."""

    own_process = True

    def __init__(
        self,
        binary: Path,
        address: str,
        method: NativeMethod,
        requests: Sequence[Request],
        concurrency: int = 1,
        warmup: Sequence[Request] = (),
        rate: float | None = None,
        time_limit_s: float | None = None,
        timeout_s: float = 300.0,
        seed: int = 0,
        connections: int = 1,
        threads: int = 1,
    ):
        self.binary, self.address, self.method = binary, address, method
        self.requests, self.warmup = list(requests), list(warmup)
        self.concurrency, self.rate, self.seed = concurrency, rate, seed
        self.time_limit_s, self.timeout_s = time_limit_s, timeout_s
        self.connections = connections  # TCP connections the calls are spread over (loadgen.cc)
        self.threads = threads  # a closed loop's threads, each serving some of the connections (loadgen.cc)
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._process: asyncio.subprocess.Process | None = None

    def _write_requests(self, path: Path) -> None:
        offsets = (
            poisson_offsets(len(self.requests), self.rate, self.seed)
            if self.rate
            else [-1.0] * len(self.requests)
        )
        with path.open("wb") as out:
            for request, offset in zip(
                [*self.warmup, *self.requests], [-1.0] * len(self.warmup) + offsets, strict=True
            ):
                payload = self.method.payload(request)
                out.write(_REQUEST_HEAD.pack(offset, len(payload)) + payload)

    async def warm_up(self) -> None:
        """Starts the child: it connects, sends the warm-up requests and waits for `measure`."""
        self._scratch = tempfile.TemporaryDirectory(prefix="bertserve-loadgen-")
        scratch = Path(self._scratch.name)
        self._write_requests(scratch / "requests.bin")
        self._process = await asyncio.create_subprocess_exec(
            str(self.binary),
            self.address,
            self.method.path,
            str(scratch / "requests.bin"),
            str(scratch / "replies.bin"),
            str(self.concurrency),
            str(len(self.warmup)),
            str(self.time_limit_s or 0),
            str(self.timeout_s),
            str(self.connections),
            str(self.threads),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            line = await asyncio.wait_for(self._process.stdout.readline(), READY_TIMEOUT_S)
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
            line = b""
        except BaseException:  # cancelled or interrupted: the child never outlives its phase
            await self.close()
            raise
        if line.strip() != b"ready":
            await self._fail("did not get ready")

    async def measure(self) -> PhaseResult:
        """Runs the measured requests and parses what the child recorded."""
        process = self._process
        assert process is not None and process.stdin is not None, "warm_up first"
        # a closed loop without a time limit ends when its requests do, however long they take
        limit = self.time_limit_s + self.timeout_s + EXIT_GRACE_S if self.time_limit_s else None
        try:
            process.stdin.write(b"go\n")
            await process.stdin.drain()
            out, err = await asyncio.wait_for(process.communicate(), limit)
        except (TimeoutError, asyncio.TimeoutError):
            await self._fail(f"did not finish within {limit:.0f} s")
        except BaseException:  # cancelled or interrupted: the child never outlives its phase
            await self.close()
            raise
        if process.returncode != 0:
            await self._fail(f"exited {process.returncode}", err)
        stats = json.loads(out.decode().strip().splitlines()[-1])
        result = PhaseResult(
            "open" if self.rate else "closed",
            concurrency=None if self.rate else self.concurrency,
            offered_rate=self.rate,
            requests_planned=len(self.requests),
            stopped_early=bool(stats["stopped_early"]),
            seconds=stats["seconds"],
            client_cpu_s=stats["cpu_s"],
            client_threads=stats.get("threads", 1),
        )
        assert self._scratch is not None
        replies = Path(self._scratch.name) / "replies.bin"
        for index, code, latency, reply in _read_replies(replies.read_bytes()):
            request = self.requests[index - len(self.warmup)]
            if code:
                known = _STATUS_NAMES.get(code)  # the HTTP client's timeouts and failed connections too
                failure = self.method.failure
                result.errors[known or (failure(code, reply) if failure else str(code))] += 1
            else:
                record_reply(result, request, latency, self.method.parse(reply))
        self._cleanup()
        return result

    def _kill(self) -> asyncio.subprocess.Process | None:
        """Kills the child if it still runs; the child when it did (to be reaped), else None."""
        process = self._process
        if process is None or process.returncode is not None:
            return None
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        return process

    async def _fail(self, what: str, stderr: bytes = b"") -> None:
        killed = self._kill()
        if killed is not None:
            _, stderr = await killed.communicate()
        self._cleanup()
        raise RuntimeError(f"native load generator {what}: {stderr.decode(errors='replace').strip()}")

    async def close(self) -> None:
        """Kills the child if it still runs and removes its files; a finished phase has nothing left."""
        try:
            killed = self._kill()
            if killed is not None:
                await asyncio.shield(killed.wait())  # reaped even when the caller is cancelled again
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def _read_replies(data: bytes):
    """(index, status code, latency s, reply bytes) per answered request, from the child's reply file."""
    at = 0
    while at < len(data):
        index, code, latency, length = _REPLY_HEAD.unpack_from(data, at)
        at += _REPLY_HEAD.size
        yield index, code, latency, data[at : at + length]
        at += length
