"""Ratios between the targets measured in one run, and the issue's goals checked against them.

Every ratio is None when a side of it was not measured (e.g. no checkpoint for the naive server);
nothing is filled in.
"""

from __future__ import annotations

SERVER, SERVER_BS1, SERVER_INT8, NAIVE = "server-fp32", "server-fp32-bs1", "server-int8", "naive-fp32"
SERVER_HTTP = "server-fp32-http"  # server-fp32 called over HTTP (opt-in: --targets)
SERVER_FP16 = "server-fp16"  # the fp16 graph (--provider cuda, where it takes server-int8's place)
SIMULATED_DEVICE = "simulated-device"  # single-input callers against a simulated device, per workers value
# in measuring order
TARGETS = (SERVER, SERVER_HTTP, SERVER_BS1, SERVER_INT8, SERVER_FP16, NAIVE, SIMULATED_DEVICE)


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _saturation(targets: dict, name: str) -> float | None:
    target = targets.get(name)
    return target["saturation"]["inputs_per_s"] if target else None


def closed_at(targets: dict, name: str, concurrency: int) -> dict | None:
    target = targets.get(name)
    for phase in target["closed"] if target else []:
        if phase["concurrency"] == concurrency:
            return phase
    return None


def _saturation_phase(targets: dict, name: str) -> dict | None:
    target = targets.get(name)
    return closed_at(targets, name, target["saturation"]["concurrency"]) if target else None


def padding_ratio(phase: dict | None) -> float | None:
    """Padded tokens the server computed / real tokens it was sent, over one phase."""
    if phase is None:
        return None
    return _div(phase["server"].get("batch_tokens_padded"), phase["tokens"])


def adjacent(phase: dict, first: float | None, key: str = "ceiling_checks") -> float | None:
    """The in-process figure to hold a phase against: the mean of the checks (`key`: the ceiling's
    inputs/s, or `single_p50_checks`: one input at a time, p50 ms) measured right before and after it (the
    figure at the phase's time on a machine whose speed drifts, where the first one may be minutes old),
    else the first one."""
    checks = phase.get(key) or []
    return sum(checks) / len(checks) if checks else first


def _stream_ratios(stream: dict | None, ceiling_inputs_per_s: float | None) -> dict:
    """One EmbedStream's rate / the in-process ceiling; a lone unary caller's p99 during a stream / alone."""
    if not stream:
        return {
            "stream_vs_inprocess": None,
            "stream_vs_inprocess_first_ceiling": None,
            "unary_p99_during_stream_vs_alone": None,
        }
    rate = stream["alone"]["inputs_per_s"]
    return {
        "stream_vs_inprocess": _div(rate, adjacent(stream["alone"], ceiling_inputs_per_s)),
        "stream_vs_inprocess_first_ceiling": _div(rate, ceiling_inputs_per_s),
        "unary_p99_during_stream_vs_alone": _div(
            stream["unary_during_stream"]["p99_ms"], stream["unary_alone"]["p99_ms"]
        ),
    }


def _single_vs_bulk(per_call: dict | None) -> float | None:
    """Single-input calls at c=32 / requests of 32 inputs, inputs/s on the same server (the per-call tax)."""
    if not per_call:
        return None
    return _div(per_call["single"]["inputs_per_s"], per_call["bulk"]["inputs_per_s"])


PER_CALL_PROFILE_KEYS = {  # where a single-input call's cost goes, against requests of many inputs
    "inputs_per_s": lambda phase: phase["inputs_per_s"],
    "server_cpu_ms_per_input": lambda phase: phase.get("server_cpu_ms_per_input"),
    "loop_cpu_ms_per_input": lambda phase: phase.get("server_loop_cpu_ms_per_input"),
    "inference_us_per_padded_token": lambda phase: phase["server"].get("inference_us_per_padded_token"),
    "inference_busy_fraction": lambda phase: phase["server"].get("inference_busy_fraction"),
    "batch_size_mean": lambda phase: phase["server"].get("batch_size_mean"),
}


def per_call_profile(targets: dict) -> dict | None:
    """The single_vs_bulk phases side by side: the server's CPU per input (all threads, and its event
    loop's thread alone) and the encoder's compute time per padded token, which grows when the loop's
    per-call work takes the cores ONNX Runtime's threads run on."""
    per_call = targets.get(SERVER, {}).get("per_call")
    if not per_call:
        return None
    return {
        kind: {key: read(per_call[kind]) for key, read in PER_CALL_PROFILE_KEYS.items()}
        for kind in ("single", "bulk")
    }


def ratios(targets: dict, inprocess: dict, gemm_peak_gflops: float | None) -> dict:
    server = _saturation(targets, SERVER)
    naive = _saturation(targets, NAIVE)
    ceiling = inprocess.get("fp32", {}).get("mixed", {})
    ceiling_fixed = inprocess.get("fp32", {}).get("fixed", {})
    single = inprocess.get("fp32", {}).get("single", {})
    server_fixed = targets.get(SERVER, {}).get("fixed")
    at_one = closed_at(targets, SERVER, 1)
    saturated = _saturation_phase(targets, SERVER)
    busiest = (
        targets[SERVER]["closed"][-1] if SERVER in targets else None
    )  # highest concurrency: biggest batches
    saturation = targets[SERVER]["saturation"] if SERVER in targets else {}
    return {
        "server_vs_inprocess": _div(server, adjacent(saturation, ceiling.get("inputs_per_s"))),
        "server_vs_inprocess_first_ceiling": _div(server, ceiling.get("inputs_per_s")),
        "server_vs_inprocess_fixed": _div(
            server_fixed and server_fixed["inputs_per_s"], ceiling_fixed.get("inputs_per_s")
        ),
        "server_vs_naive_fp32": _div(server, naive),
        "int8_vs_naive": _div(_saturation(targets, SERVER_INT8), naive),
        "int8_vs_server_fp32": _div(_saturation(targets, SERVER_INT8), server),
        # the int8 graph's own gain, in process at each graph's best batch size: what int8_vs_server_fp32
        # could reach if both servers lost the same share to serving
        "int8_vs_fp32_inprocess": _div(
            inprocess.get("int8", {}).get("mixed", {}).get("inputs_per_s"), ceiling.get("inputs_per_s")
        ),
        "fp16_vs_server_fp32": _div(_saturation(targets, SERVER_FP16), server),
        "batching_gain": _div(server, _saturation(targets, SERVER_BS1)),
        **_stream_ratios(targets.get(SERVER, {}).get("stream"), ceiling.get("inputs_per_s")),
        "single_vs_bulk": _single_vs_bulk(targets.get(SERVER, {}).get("per_call")),
        "http_vs_grpc": _div(_saturation(targets, SERVER_HTTP), server),
        "p50_c1_minus_inprocess_ms": (
            at_one["p50_ms"] - adjacent(at_one, single["p50_ms"], "single_p50_checks")
            if at_one and single
            else None
        ),
        "p50_c1_minus_inprocess_ms_first": (at_one["p50_ms"] - single["p50_ms"])
        if at_one and single
        else None,
        "gemm_peak_fraction": _div(saturated and saturated["gflops_per_s"], gemm_peak_gflops),
        "gemm_peak_fraction_inprocess": _div(ceiling.get("gflops_per_s"), gemm_peak_gflops),
        "padding_ratio": padding_ratio(busiest),
    }


def rates(targets: dict, inprocess: dict) -> dict[str, tuple[float | None, str]]:
    """GOP/s of every target at saturation and of every in-process ceiling, with its precision."""
    precision_of = {
        SERVER: "fp32",
        SERVER_HTTP: "fp32",
        SERVER_BS1: "fp32",
        SERVER_INT8: "int8",
        SERVER_FP16: "fp16",
        NAIVE: "fp32",
    }
    out: dict[str, tuple[float | None, str]] = {
        name: (phase and phase["gflops_per_s"], precision_of[name])
        for name in TARGETS
        if name in targets
        for phase in [_saturation_phase(targets, name)]
    }
    for precision, corpora in inprocess.items():
        for corpus in ("mixed", "fixed"):
            if corpus in corpora:
                out[f"inprocess-{precision}-{corpus}"] = (corpora[corpus].get("gflops_per_s"), precision)
    return out


# (key, the goal in words, test): from the issues "Make it fast" and "Performance round 2".
GOALS = [
    ("server_vs_inprocess", ">= 0.95", lambda v: v >= 0.95),
    ("single_vs_bulk", ">= 0.95", lambda v: v >= 0.95),
    ("int8_vs_server_fp32", ">= 2.0", lambda v: v >= 2.0),
    ("server_vs_naive_fp32", ">= 1.3", lambda v: v >= 1.3),
    ("int8_vs_naive", ">= 2.5", lambda v: v >= 2.5),
    ("int8_cosine_to_fp32", ">= 0.99", lambda v: v >= 0.99),
    ("padding_ratio", "<= 1.10", lambda v: v <= 1.10),
    ("p50_c1_minus_inprocess_ms", "<= 0.5 ms", lambda v: v <= 0.5),
    ("gemm_peak_fraction", ">= 0.75", lambda v: v >= 0.75),
    ("server_startup_s", "<= 2 s", lambda v: v <= 2.0),
    ("server_rss_mb", "<= 400 MB", lambda v: v <= 400),
    # issue 26, against the simulated device (bench/simulated_device.py)
    ("simulated_two_vs_one_worker", ">= 1.3", lambda v: v >= 1.3),
    ("front_cpu_ms_per_call", "<= 0.35 ms", lambda v: v <= 0.35),
    # the same against the native port (Embed calls through gRPC's C++ server): one process, 2 fronts
    ("native_cpu_ms_per_call", "<= 0.35 ms", lambda v: v <= 0.35),
    ("native_two_vs_one_worker", ">= 1.3", lambda v: v >= 1.3),
    ("native_two_cpu_ms_per_call", "<= 0.35 ms", lambda v: v <= 0.35),
    # HTTP against gRPC (the native port), one process each: on a GPU machine the goal is >= 0.8
    ("simulated_http_vs_native", ">= 0.8", lambda v: v >= 0.8),
]


def goals(measured: dict, estimates: dict | None = None) -> list[dict]:
    """One row per goal: the measured value (None if not measured) and whether it is met; for the goals
    in `estimates` (bench/transport_floor.py), what the goal's metric would read if the server cost no
    more than the transport's own floor."""
    rows = []
    for key, goal, test in GOALS:
        value = measured.get(key)
        row = {
            "metric": key,
            "goal": goal,
            "measured": value,
            "met": None if value is None else bool(test(value)),
        }
        if estimates and key in estimates:
            row["estimate_at_transport_floor"] = estimates[key]
        rows.append(row)
    return rows
