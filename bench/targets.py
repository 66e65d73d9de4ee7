"""One server under test through its phases: start, closed-loop sweep, fixed-length, open loop, stop.

Every phase is preceded by a short warm-up at its concurrency (not recorded) and bracketed by scrapes
of the server's /metrics, so server-side figures cover exactly the phase's requests.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from bertserve.bench import gpu, http_client, native_loadgen, process_tree, streaming, transport_floor
from bertserve.bench.loadgen import (
    Call,
    Request,
    between_checks,
    closed_loop,
    open_loop,
    repeated,
)
from bertserve.bench.native_loadgen import NativeMethod, NativePhase
from bertserve.bench.phases import (
    CHANNEL_OPTIONS,
    REQUEST_TIMEOUT_S,
    Phase,
    PythonPhase,
    embed_call,
    native_embed,
    own_channel,
)
from bertserve.bench.processes import ServerProcess
from bertserve.bench.server_metrics import batch_cost, phase_delta, scrape
from bertserve.v1 import inference_pb2

WARMUP_MAX = 32  # warm-up requests before a phase: one round at its concurrency, at most this many
PER_CALL_CONCURRENCY = 32  # single-input callers, against requests of this many inputs (the per-call tax)
BULK_CALLERS = 2  # callers sending those requests: enough to keep the server busy


@dataclass(frozen=True)
class Workload:
    concurrencies: list[int]
    mixed: list[Request]
    fixed: list[Request]
    open_rate_fraction: float  # open-loop rate as a fraction of the target's saturation rate
    phase_time_limit_s: float | None = None  # no request is sent after this long into a phase
    startup_timeout_s: float = 180.0
    stream_target: str | None = None  # the target that also runs the EmbedStream phases (bench/streaming.py)
    stream_texts: tuple[str, ...] = ()  # what its streams carry (the mixed corpus)
    # On stream_target too: the mixed corpus as single-input requests and as requests of PER_CALL_CONCURRENCY
    single: tuple[Request, ...] = ()
    bulk: tuple[Request, ...] = ()
    # On checked_target, against the machine's drift, measured again while the server idles (bench/checks.py):
    # the in-process ceiling (inputs/s) right before and after the saturation sweep (and, when it is the
    # stream_target too, the lone stream), and the in-process p50 of one input at a time (ms) right before
    # and after the c=1 phase, which `p50_c1_minus_inprocess_ms` holds it against
    ceiling_check: Callable[[], Awaitable[float]] | None = None
    single_check: Callable[[], Awaitable[float]] | None = None
    checked_target: str | None = None
    # a closed phase sends at least this many requests per caller, an open one lasts at least
    # min_open_s at its rate (the corpus over again): phases long enough for a fast server (0: the corpus once)
    min_requests_per_caller: int = 0
    min_open_s: float = 0.0
    loadgen_threads: int = 1  # the native gRPC load generator's threads for a closed phase (loadgen.cc)


def _line(name: str, label: str, s: dict) -> str:
    errors = f", errors {s['errors']}" if s["errors"] else ""
    if s["stopped_early"]:
        errors += (
            f" (time limit: {s['requests_ok'] + sum(s['errors'].values())} of {s['requests_planned']} sent)"
        )
    return (
        f"  {name:<16} {label:<14} {s['inputs_per_s']:8.1f} inputs/s {s['tokens_per_s']:9.0f} tokens/s"
        f"  p50 {s['p50_ms']:7.1f} ms  p99 {s['p99_ms']:7.1f} ms{errors}"
    )


def _elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


class TargetRun:
    """One server's phases. `run` is the whole sweep of a Workload; without one (workload None), a caller
    starts the server itself and runs `closed_phases` inside `connected`. With `native` (the native gRPC load
    generator's binary, bench/native_loadgen.py) a gRPC target's phases are sent by it, an HTTP target's
    by its HTTP twin; otherwise by the in-process Python clients."""

    def __init__(
        self,
        server: ServerProcess,
        model: str,
        workload: Workload | None,
        log: Callable[[str], None],
        native: Path | None = None,
        per_caller: bool = False,
    ):
        """`per_caller`: gRPC callers each get a connection of their own (up to `connected`'s count), as
        independent clients would; else one connection carries every call."""
        self.server, self.model, self.workload, self.log = server, model, workload, log
        http = server.protocol == "http"
        self.native = native_loadgen.http_binary() if http and native is not None else native
        self.per_caller = per_caller
        self.connections = 1
        self.call: Call | None = None

    def _load(
        self,
        requests: list[Request],
        label: str,
        time_limit_s: float | None,
        concurrency: int = 1,
        rate: float | None = None,
        warmup: list[Request] | None = None,
        via: tuple[Call, NativeMethod] | None = None,
    ) -> Phase:
        """A closed-loop phase at `concurrency` (rate None) or an open-loop one at `rate` requests/s, of
        Embed calls or of `via`'s (Python call, native method), preceded by `warmup` at `concurrency`."""
        http = self.server.protocol == "http"
        call, method = via or (self.call, (http_client.native_embed if http else native_embed)(self.model))
        assert call is not None, "inside connected()"
        if self.workload is not None and via is None:
            w = self.workload
            least = concurrency * w.min_requests_per_caller if rate is None else int(rate * w.min_open_s)
            requests = repeated(requests, least)
        if self.native is not None:
            connections = self.connections if rate else min(concurrency, self.connections)
            threads = self.workload.loadgen_threads if self.workload is not None and not http else 1
            address = self.server.address if via else self.server.embed_address
            address = f"127.0.0.1:{self.server.http_port}" if http and via is None else address
            return NativePhase(
                self.native, address, method, requests, concurrency, warmup or [], rate, time_limit_s,
                REQUEST_TIMEOUT_S, connections=connections, threads=threads,
            )  # fmt: skip
        warm = (lambda: closed_loop(call, warmup, concurrency, label=f"{label} warm-up")) if warmup else None
        if rate is None:
            return PythonPhase(warm, lambda: closed_loop(call, requests, concurrency, label, time_limit_s))
        return PythonPhase(
            warm, lambda: open_loop(call, requests, rate, label=label, time_limit_s=time_limit_s)
        )

    async def _phase(self, label: str, phase: Phase) -> dict:
        """Warms up, then measures `phase` between two scrapes of /metrics."""
        try:
            await phase.warm_up()
            before = await scrape(self.server.metrics_url)
            # the threads are read inside the process's reads (process, threads, loop ... loop, threads,
            # process), so their share never exceeds the whole in a phase as short as a clock tick or two
            server_cpu, client_cpu = self.server.cpu_seconds(), time.process_time()
            threads = self.server.thread_cpu_seconds()
            loop_cpu = self.server.loop_cpu_seconds()
            result = await phase.measure()
            loop_cpu = _elapsed(loop_cpu, self.server.loop_cpu_seconds())
            threads_after = self.server.thread_cpu_seconds()
            server_cpu = _elapsed(server_cpu, self.server.cpu_seconds())
            # the native load generator's own CPU (this process only parsed its replies, after the phase),
            # else this process's
            client_cpu = result.client_cpu_s if phase.own_process else time.process_time() - client_cpu
            after = await scrape(self.server.metrics_url)
        finally:
            await phase.close()
        summary = result.summary()
        # CPU cores kept busy (2.0 = two cores) by the server and by this load generator, during the phase
        summary["server_cpu_cores"] = server_cpu / result.seconds if server_cpu is not None else None
        summary["client_cpu_cores"] = client_cpu / result.seconds
        # the server's CPU per input answered, all threads and its event loop's thread alone (the per-call tax)
        # (the kernel counts thread CPU in clock ticks, 10 ms: a short phase reads coarse figures)
        inputs = summary["inputs"]
        for key, seconds in (
            ("server_cpu_ms_per_input", server_cpu),
            ("server_loop_cpu_ms_per_input", loop_cpu),
        ):
            summary[key] = 1e3 * seconds / inputs if seconds is not None and inputs else None
        summary["server"] = phase_delta(before, after, result.seconds)
        summary["busiest_threads"] = process_tree.busiest_threads(threads, threads_after, result.seconds)
        self.log(_line(self.server.name, label, summary))
        return summary

    @contextlib.asynccontextmanager
    async def _client(self, connections: int) -> AsyncIterator[Call]:
        """The target's Embed call: over gRPC, or over HTTP (/bertserve/v1/embed) for protocol "http"."""
        if self.server.protocol == "http":
            self.connections = connections  # each carries one request at a time
            pool = http_client.HttpPool("127.0.0.1", self.server.http_port, connections)
            try:
                yield http_client.embed_call(pool, self.model, REQUEST_TIMEOUT_S)
            finally:
                await pool.close()
        else:
            self.connections = connections if self.per_caller else 1
            async with contextlib.AsyncExitStack() as stack:
                calls = [
                    embed_call(
                        await stack.enter_async_context(own_channel(self.server.embed_address)), self.model
                    )
                    for _ in range(self.connections)
                ]
                turns = itertools.cycle(calls)  # the Python client's calls go round-robin

                async def call(texts: list[str]) -> inference_pb2.EmbedResponse:
                    return await next(turns)(texts)

                yield call if len(calls) > 1 else calls[0]

    async def run(self, open_rate: float | None) -> dict:
        """All phases; `open_rate` None: a fraction of this target's own saturation rate."""
        w = self.workload
        began = time.perf_counter()
        startup_s = await self.server.start(w.startup_timeout_s)
        self.log(f"  {self.server.name} ready in {startup_s:.1f} s")
        try:
            async with self.connected(max(256, *w.concurrencies)):  # open loop: a connection per call
                closed = []
                limit = w.phase_time_limit_s
                checked = self.server.name == w.checked_target
                check = w.ceiling_check if checked else None
                single_check = w.single_check if checked else None

                async def sweep() -> None:
                    for c in w.concurrencies:
                        warmup = w.mixed[: min(c, WARMUP_MAX)]
                        phase = self._load(w.mixed, f"{self.server.name} c={c}", limit, c, warmup=warmup)
                        measured = self._phase(f"closed c={c}", phase)
                        summary, singles = await between_checks(single_check if c == 1 else None, measured)
                        if singles:
                            summary["single_p50_checks"] = singles
                            self.log(f"  in-process p50, one input at a time, before and after: {singles}")
                        closed.append(summary)

                _, ceilings = await between_checks(check, sweep())
                if check:
                    self.log(f"  in-process ceiling before and after the sweep: {ceilings}")
                best = max(closed, key=lambda s: s["inputs_per_s"])
                c_best = best["concurrency"]
                warmup = w.fixed[: min(c_best, WARMUP_MAX)]
                phase = self._load(w.fixed, f"{self.server.name} fixed", limit, c_best, warmup=warmup)
                fixed = await self._phase(f"fixed c={c_best}", phase)
                rate = open_rate or w.open_rate_fraction * best["requests_per_s"]
                phase = self._load(w.mixed, f"{self.server.name} open", limit, rate=rate)
                opened = await self._phase(f"open {rate:.0f} rps", phase)
                per_call = floor = None
                if self.server.name == w.stream_target:
                    per_call = await self._per_call()
                    if per_call:
                        floor = await self._transport_floor(per_call["single"]["requests_per_s"])
            streamed = None
            if self.server.name == w.stream_target:
                texts = list(w.stream_texts)
                streamed = await streaming.phases(
                    self.server.address, self.model, texts, w.mixed, limit, self.log, check
                )
            rss_mb = self.server.rss_mb()
            gpu_mib = gpu.processes_memory_mib(self.server.pids())
            cost_line = batch_cost(await scrape(self.server.metrics_url))
        finally:
            exit_code = await self.server.stop()
        return {
            "seconds": time.perf_counter() - began,  # this target's share of the run, start to exit
            "startup_s": startup_s,
            "rss_mb_after_load": rss_mb,
            "gpu_memory_mib": gpu_mib,  # its processes', after every phase (None without an NVIDIA GPU)
            "batch_cost": cost_line,  # the line it cut batches by at the end (None: cut by padding)
            "exit_code": exit_code,
            "closed": closed,
            "saturation": {
                k: best[k]
                for k in ("concurrency", "inputs_per_s", "tokens_per_s", "gflops_per_s", "p50_ms", "p99_ms")
            }
            | {"ceiling_checks": ceilings},  # in-process inputs/s right before and after the sweep
            "fixed": fixed,
            "open": opened,
            "stream": streamed,  # EmbedStream phases (bench/streaming.py), on stream_target only
            "per_call": per_call,  # single-input calls vs requests of many inputs, on stream_target only
            "transport_floor": floor,  # a no-work call alone and paced (bench/transport_floor.py), likewise
        }

    async def _transport_floor(self, rate: float) -> dict:
        """grpc.health.v1 Check on its own channel: ALONE_CALLS one at a time, then at `rate` calls/s (the
        single-input phase's) for PACED_SECONDS, each a `_phase` (server and load-generator CPU)."""
        paced_calls = int(rate * transport_floor.PACED_SECONDS)
        calls = [transport_floor.NO_WORK] * max(transport_floor.ALONE_CALLS, paced_calls)
        limit = 2 * transport_floor.PACED_SECONDS  # bounds the phases; the paced one ends by its count
        async with grpc.aio.insecure_channel(self.server.address, options=CHANNEL_OPTIONS) as channel:
            via = (transport_floor.health_check_call(channel), transport_floor.NATIVE_CHECK)
            alone = self._load(
                calls[: transport_floor.ALONE_CALLS],
                "no-work alone",
                limit,
                warmup=calls[:WARMUP_MAX],
                via=via,
            )
            alone_summary = await self._phase("no-work c=1", alone)
            paced = self._load(calls[:paced_calls], "no-work paced", limit, rate=rate, via=via)
            paced_summary = await self._phase(f"no-work {rate:.0f} rps", paced)
        return {"alone": alone_summary, "paced": paced_summary} | transport_floor.summarize(
            alone_summary, paced_summary
        )

    async def _per_call(self) -> dict | None:
        """The same texts as PER_CALL_CONCURRENCY single-input callers, then as requests of that many inputs
        from BULK_CALLERS callers: what a call costs beyond its inputs (ratio `single_vs_bulk`)."""
        w = self.workload
        if not (w.single and w.bulk):
            return None
        plan = [("single", list(w.single), PER_CALL_CONCURRENCY), ("bulk", list(w.bulk), BULK_CALLERS)]
        return await self.closed_phases(plan, w.phase_time_limit_s)

    async def closed_phases(
        self, plan: list[tuple[str, list[Request], int]], time_limit_s: float | None
    ) -> dict[str, dict]:
        """Each (key, requests, concurrency) of `plan` in order, as a warmed-up closed-loop phase of at most
        `time_limit_s` (see `_phase`); call it inside `connected`."""
        result = {}
        for key, requests, c in plan:
            label = f"{key} c={c}"
            warmup = requests[: min(c, WARMUP_MAX)]
            phase = self._load(requests, f"{self.server.name} {label}", time_limit_s, c, warmup=warmup)
            result[key] = await self._phase(label, phase)
        return result

    @contextlib.asynccontextmanager
    async def connected(self, connections: int) -> AsyncIterator[TargetRun]:
        """This target's client, for `closed_phases`, open for the block."""
        async with self._client(connections) as call:
            self.call = call
            try:
                yield self
            finally:
                self.call = None
