"""The transport's floor: what a call that does no work costs, and what that leaves of each goal.

The no-work call is grpc.health.v1 Check on the server under test: the same gRPC server, interceptors,
event loop and load generator as an Embed call, and nothing of bertserve's path (no validation,
tokenization, batcher, thread hop or reply to build). `TargetRun` measures it on server-fp32 twice:
alone (c=1, its p50) and paced at the rate the single-input phase reached (the CPU per call of the
server's threads and of the load generator). `estimates` turns that into what each ratio goal would read
if the server cost nothing beyond the transport, from the same run's ceilings:

- the server computes at the in-process rate with the CPU the transport leaves it. On `threads`
  cores with no spare core (the load generator shares them), a ceiling of r inputs/s and t ms of CPU per
  call, one input per call: server / ceiling = 1 / (1 + t r / (1000 threads)). Spare cores (more
  than the targets' threads) take the transport's CPU first.
- single / bulk: the same, less the share that a bulk request's call already pays (t / inputs per
  request, per input).
- int8 / fp32: the in-process int8 / fp32 ratio with both servers at that estimate.
- p50 at c=1 over in-process: a lone Embed call's round trip is at least a lone no-work call's; where
  the run measured the handler's floor (bench/handler_floor.py: a grpc.aio handler that runs the graph in
  a worker thread, nothing of bertserve's path), that figure less the in-process p50 instead.

The throughput figures are estimates, not bounds: a server's batches (length-grouped, padding capped)
can compute a little faster per input than the ceiling's, and a call's CPU falls as calls come closer
together (one wakeup serves several), so a measured ratio may land a few percent above its estimate.
What they show is how much of a goal's gap the transport alone takes.
"""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.bench.loadgen import Call, Request
from bertserve.bench.native_loadgen import NativeMethod

# where the p50 goal's estimate comes from (`p50_estimate_source`)
HANDLER_ESTIMATE, NO_WORK_ESTIMATE = "handler's floor, thread", "no-work call"
NO_WORK = Request(texts=[""], tokens=0, flops=0.0)  # one "input" per call: the phase's counts are calls
ALONE_CALLS = 200  # sequential no-work calls for the p50 alone
PACED_SECONDS = 5.0  # the paced phase's length: CPU is read in 10 ms clock ticks, so several seconds


def health_check_call(channel) -> Call:
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest()

    async def call(texts: list[str]) -> object:
        return await stub.Check(request, timeout=30.0)

    return call


NATIVE_CHECK = NativeMethod(
    "/grpc.health.v1.Health/Check",
    lambda request: health_pb2.HealthCheckRequest().SerializeToString(),
    health_pb2.HealthCheckResponse.FromString,
)


def summarize(alone: dict, paced: dict) -> dict:
    """The floor from the two phases' summaries (TargetRun._phase): p50 alone, CPU per call when paced."""
    calls = paced["inputs"]
    server = paced.get("server_cpu_ms_per_input")
    client = 1e3 * paced["client_cpu_cores"] * paced["seconds"] / calls if calls else None
    return {
        "p50_ms_alone": alone["p50_ms"],
        "rate_rps": paced["requests_per_s"],
        "server_cpu_ms_per_call": server,
        "client_cpu_ms_per_call": client,
        "cpu_ms_per_call": None if server is None or client is None else server + client,
    }


def _share_left(cpu_ms_per_call: float, calls_per_s: float, threads: int, spare_cores: float) -> float:
    """Served rate / in-process rate when each call takes `cpu_ms_per_call` of the cores beyond the
    `spare_cores` that the in-process run left idle."""
    taken = max(0.0, cpu_ms_per_call * calls_per_s / 1e3 - spare_cores)
    return 1.0 / (1.0 + taken / threads)


def estimates(
    floor: dict,
    inprocess: dict,
    bulk_inputs_per_s: float | None,
    inputs_per_bulk_request: int,
    threads: int,
    logical_cores: int,
    handler_p50_over_inprocess_ms: float | None = None,
) -> dict:
    """Metric -> what it would read with the transport's floor as the server's only cost (None where a side
    is missing); `handler_p50_over_inprocess_ms`: the handler's floor, for the p50 goal."""
    t = floor.get("cpu_ms_per_call")
    fp32 = inprocess.get("fp32", {}).get("mixed", {}).get("inputs_per_s")
    int8 = inprocess.get("int8", {}).get("mixed", {}).get("inputs_per_s")
    spare = max(0, logical_cores - threads)
    out: dict[str, float | None] = dict.fromkeys(
        ("server_vs_inprocess", "single_vs_bulk", "int8_vs_server_fp32"), None
    )
    out["p50_c1_minus_inprocess_ms"] = (
        floor.get("p50_ms_alone") if handler_p50_over_inprocess_ms is None else handler_p50_over_inprocess_ms
    )
    if t is None or not fp32:
        return out
    out["server_vs_inprocess"] = _share_left(t, fp32, threads, spare)
    if bulk_inputs_per_s:
        per_input = t * (1 - 1 / inputs_per_bulk_request)  # the bulk request's call is paid in both
        out["single_vs_bulk"] = _share_left(per_input, bulk_inputs_per_s, threads, spare)
    if int8:
        int8_served = int8 * _share_left(t, int8, threads, spare)
        out["int8_vs_server_fp32"] = int8_served / (fp32 * out["server_vs_inprocess"])
    return out


def of_target(
    target: dict,
    inprocess: dict,
    inputs_per_bulk_request: int,
    threads: int,
    logical_cores: int,
    handler_p50_over_inprocess_ms: float | None = None,
) -> dict | None:
    """A target's floor (its phases left in the target's own record) and the goals' estimates beside it;
    None when the target did not measure one."""
    floor = target.get("transport_floor")
    if not floor:
        return None
    bulk = target["per_call"]["bulk"]["inputs_per_s"]
    guessed = estimates(
        floor, inprocess, bulk, inputs_per_bulk_request, threads, logical_cores, handler_p50_over_inprocess_ms
    )
    source = NO_WORK_ESTIMATE if handler_p50_over_inprocess_ms is None else HANDLER_ESTIMATE
    return {k: v for k, v in floor.items() if k not in ("alone", "paced")} | {
        "estimates": guessed,
        "p50_estimate_source": source,  # bench/handler_floor.py where measured
    }
