"""Writes the results: bench.json (everything measured), bench.md (the tables) and the PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bertserve.bench.analysis import SERVER, closed_at, padding_ratio
from bertserve.bench.limits import PEAK_KEYS
from bertserve.bench.transport_floor import HANDLER_ESTIMATE


def fmt_num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _phase_row(name: str, label: str, phase: dict) -> list[str]:
    server = phase.get("server") or {}
    return [
        name, label, fmt_num(phase["inputs_per_s"]), fmt_num(phase["tokens_per_s"], 0), fmt_num(phase["p50_ms"]),
        fmt_num(phase["p90_ms"]), fmt_num(phase["p99_ms"]), fmt_num(server.get("batch_size_mean")),
        fmt_num(padding_ratio(phase) if server else None, 2), fmt_num(server.get("queue_ms_mean")),
        " / ".join(fmt_num(server.get(k)) for k in ("inference_ms_mean", "encoder_run_ms_mean", "batch_cycle_ms")),
        f"{fmt_num(phase.get('server_cpu_cores'), 2)} / {fmt_num(phase.get('client_cpu_cores'), 2)}",
        str(sum(phase["errors"].values())),
    ]  # fmt: skip


def _load_generator(result: dict) -> str:
    chosen = result["settings"].get("load_generator") or {"kind": "python"}
    connections = {
        "per-caller": "; the sweep's callers on a gRPC connection each",
        "one": "; the sweep's callers on one gRPC connection",
    }
    spread = connections.get(chosen.get("grpc_connections"), "")
    if chosen.get("front") == "native":
        spread += "; Embed calls to the native port (gRPC's C++ server)"
    if chosen["kind"] == "native":
        clients = "bench/native/loadgen.cc for gRPC, http_loadgen.cc for HTTP"
        return f"Load generator: the native clients ({clients}){spread}."
    why = f" ({chosen['native_unavailable']})" if "native_unavailable" in chosen else ""
    return f"Load generator: the Python client (grpc.aio) in the bench's process{why}{spread}."


def markdown(result: dict) -> str:
    m, model, corpus = result["machine"], result["model"], result["corpus"]
    lines = [
        f"# bertserve bench: {model['name']}:{model['version']} ({'quick' if result['quick'] else 'full'} run)",
        "",
        f"{m['cpu']}, {m['logical_cores']} logical cores, {m['memory_gib']:.0f} GiB; {result['settings']['threads']} "
        f"threads for every target. onnxruntime {m['versions'].get('onnxruntime')}, torch {m['versions'].get('torch')}, "
        f"transformers {m['versions'].get('transformers')}. {result['created_at']}.",
        "",
        f"Mixed corpus: {corpus['mixed']['texts']} texts, {corpus['mixed']['mean_tokens']} tokens on average "
        f"(median {corpus['mixed']['median_tokens']}, max {corpus['mixed']['max_tokens']}); fixed: "
        f"{corpus['fixed']['texts']} texts of {corpus['fixed']['max_tokens']} tokens. "
        f"{result['settings']['inputs_per_request']} input(s) per request. {_load_generator(result)}",
        "",
        "## Closed loop, mixed corpus",
        "",
    ]
    header = ["target", "phase", "inputs/s", "tokens/s", "p50 ms", "p90 ms", "p99 ms", "mean batch", "padding",
              "queue ms", "batch ms: infer / run / cycle", "CPU server / client", "errors"]  # fmt: skip
    rows = [
        _phase_row(n, f"c={p['concurrency']}", p) for n, t in result["targets"].items() for p in t["closed"]
    ]
    lines += md_table(header, rows) + [
        "",
        "## Fixed length (at each target's best concurrency) and open loop",
        "",
    ]
    rows = []
    for name, target in result["targets"].items():
        rows.append(
            _phase_row(
                name,
                f"fixed{corpus['fixed']['max_tokens']} c={target['fixed']['concurrency']}",
                target["fixed"],
            )
        )
        rows.append(_phase_row(name, f"open {target['open']['offered_rate_rps']:.0f} req/s", target["open"]))
    lines += md_table(header, rows) + ["", "## Servers", ""]
    # each target against ONNX Runtime's best kernel of its own precision (an int8 target against the fp32
    # GEMM peak would read above 100%)
    of_kernel = {
        n: f["of_kernel"] for n, f in result["ratios"].get("limits", {}).get("fractions", {}).items()
    }
    rows = [
        [n, fmt_num(t["saturation"]["inputs_per_s"]), str(t["saturation"]["concurrency"]),
         f"{fmt_num(t['saturation']['gflops_per_s'])} ({fmt_num(of_kernel.get(n) and 100 * of_kernel[n], 0)}% of ORT's kernel)",
         fmt_num(t["startup_s"], 2), fmt_num(t["rss_mb_after_load"], 0), fmt_num(t.get("gpu_memory_mib"), 0),
         _cost_line(t.get("batch_cost"))]
        for n, t in result["targets"].items()
    ]  # fmt: skip
    lines += md_table(
        ["target", "saturation inputs/s", "at concurrency", "GOP/s", "ready after s", "RSS MB", "GPU MiB",
         "batch cost"],
        rows,
    )  # fmt: skip
    lines += _threads_text(result["targets"])
    lines += _simulated_text(result.get("simulated_device"))
    lines += ["", "## Ceilings (in-process ONNX Runtime, ideal batches, no gRPC) and the GEMM peak", ""]
    rows = []
    for precision, by_corpus in result["inprocess"].items():
        for corpus_name in ("mixed", "fixed"):
            c = by_corpus.get(corpus_name)
            if c:
                rows.append([f"{precision} {corpus_name}", fmt_num(c["inputs_per_s"]), fmt_num(c["tokens_per_s"], 0),
                             str(c["best_batch_size"]), fmt_num(c["padding_ratio"], 2), fmt_num(c["gflops_per_s"])])  # fmt: skip
    lines += md_table(["in-process", "inputs/s", "tokens/s", "batch size", "padding", "GFLOP/s"], rows)
    single = result["inprocess"].get("fp32", {}).get("single")
    if single:
        lines += [
            "",
            f"One input at a time in-process (tokenization included): p50 {single['p50_ms']:.2f} ms.",
        ]
        at_one = closed_at(result["targets"], SERVER, 1)
        checks = at_one and at_one.get("single_p50_checks")
        if checks:
            lines[-1] += (
                f" Measured again right before and after server-fp32's c=1 phase, which p50_c1_minus_inprocess_ms "
                f"is held against: {', '.join(f'{c:.2f}' for c in checks)} ms."
            )
    gemm = result["gemm"]
    for precision, p in result.get("profile", {}).items():
        top = ", ".join(f"{op} {share:.0%}" for op, share in list(p["share_by_op"].items())[:6])
        outside = p["outside_operators_share"]
        lines += [
            "",
            f"Profile, {precision} at batch {p['batch_size']}: {top}; outside operators {fmt_num(outside and 100 * outside)}% ({p['trace']}).",
        ]
    per_call = result.get("per_call_profile")
    if per_call:
        lines += ["", "Per-call profile (server-fp32, the single_vs_bulk phases):", ""]
        keys = list(per_call["single"])
        rows = [[kind, *(fmt_num(per_call[kind][k], 3) for k in keys)] for kind in ("single", "bulk")]
        lines += md_table(["requests", *(k.replace("_", " ") for k in keys)], rows)
    lines += ["", f"fp32 GEMM peak: {fmt_num(gemm.get('peak_gflops'))} GFLOP/s ({gemm.get('peak_library')}, {gemm.get('peak_shape')}).",
              "", "## Ratios and goals", ""]  # fmt: skip
    yes_no = {True: "yes", False: "no", None: "–"}
    rows = [
        [g["metric"], g["goal"], fmt_num(g["measured"], 3), yes_no[g["met"]],
         fmt_num(g.get("estimate_at_transport_floor"), 3)]
        for g in result["goals"]
    ]  # fmt: skip
    lines += md_table(["metric", "goal", "measured", "met", "estimate at the transport's floor"], rows)
    floor = result.get("transport_floor")
    from_handler = bool(floor) and floor.get("p50_estimate_source") == HANDLER_ESTIMATE
    lines += _floor_text(floor, result["settings"]["threads"], from_handler)
    lines += _handler_floor_text(result.get("handler_floor"), from_handler)
    limits = result["ratios"].get("limits")
    if limits:
        lines += ["", "## Physical limits", "", limits_text(limits["theoretical"], limits["kernel"]), ""]
        rows = [
            [
                name,
                f["precision"],
                fmt_num(f["gops"]),
                fmt_num(f["of_theoretical"] and 100 * f["of_theoretical"], 1),
                fmt_num(f["of_kernel"] and 100 * f["of_kernel"], 1),
            ]
            for name, f in limits["fractions"].items()
        ]
        lines += md_table(["target", "precision", "GOP/s", "% of theoretical", "% of ORT kernel"], rows)
    other = {
        k: v
        for k, v in result["ratios"].items()
        if k not in {g["metric"] for g in result["goals"]} and not isinstance(v, dict)
    }
    lines += ["", *(f"- {k}: {fmt_num(v, 3)}" for k, v in other.items())]
    if result["notes"]:
        lines += ["", "## Notes", "", *(f"- {n}" for n in result["notes"])]
    return "\n".join(lines) + "\n"


def _cost_line(line: dict | None) -> str:
    """The line a server cut batches by (`batch_cut` cost), '–' where it cut by padding."""
    return "–" if not line else f"{line['fixed_ms']:.3f} ms + {line['token_us']:.3f} us/token"


def _threads_text(targets: dict) -> list[str]:
    """Where each target's server CPU went in its highest-concurrency closed phase, by thread name."""
    rows = []
    for name, target in targets.items():
        phase = max(target["closed"], key=lambda p: p["concurrency"], default={})
        for t in phase.get("busiest_threads") or []:
            rows.append([name, f"c={phase['concurrency']}", t["process"], f"{t['thread']} ({t['threads']})",
                         fmt_num(t["cores"], 2)])  # fmt: skip
    if not rows:
        return []
    return [
        "",
        "## Busiest threads (each target's highest concurrency)",
        "",
        "CPU cores kept busy, by process and thread name (how many threads share it): `bs-engine` is the engine "
        "process's loop, `bs-compute` its inference threads, `bs-onnxruntime` ONNX Runtime's own, `bs-front-N` "
        "a front's loop, `bs-tokenize` the tokenizing threads, `bs-cpu` a front's CPU pool; a thread started by "
        "one of these takes its name unless it names itself (gRPC's do).",
        "",
        *md_table(["target", "phase", "process", "thread (count)", "cores"], rows),
    ]


def _simulated_text(simulated: dict | None) -> list[str]:
    """bench/simulated_device.py's runs, one row per workers value (a skipped one: its reason)."""
    if not simulated:
        return []
    header = ["workers", "processes", "inputs/s", "p50 ms", "p99 ms", "mean batch", "CPU server / client",
              "CPU ms per call", "errors"]  # fmt: skip
    rows = [
        [w, str(r["processes"]), fmt_num(r["inputs_per_s"]), fmt_num(r["p50_ms"]), fmt_num(r["p99_ms"]),
         fmt_num(r["batch_size_mean"]), f"{fmt_num(r['server_cpu_cores'], 2)} / {fmt_num(r['client_cpu_cores'], 2)}",
         fmt_num(r["cpu_ms_per_call"], 3), str(sum(r["errors"].values()))]
        if "skipped" not in r else [w, "–", f"skipped: {r['skipped']}", *["–"] * 6]
        for w, r in simulated["workers"].items()
    ]  # fmt: skip
    return [
        "",
        f"## Simulated device ({simulated['device_ms_per_batch']:g} ms per batch, no CPU; single-input callers at "
        f"c={simulated['concurrency']})",
        "",
        "Each caller on a connection of its own; every server started first, then measured in interleaved "
        "rounds. The server's CPU is its whole process tree's. front_cpu_ms_per_call is the run with the most "
        f"processes (workers {simulated['front_cpu_workers']}); workers native (one process) and native-2 (2 "
        "fronts) take their load on the native port (Embed calls through gRPC's C++ server); workers http (one "
        "process) POSTs each call to /bertserve/v1/embed.",
        "",
        *md_table(header, rows),
    ]


def _floor_text(floor: dict | None, threads: int, from_handler: bool) -> list[str]:
    """`from_handler`: the goals table's p50 estimate is the handler's floor (thread mode)."""
    if not floor:
        return []
    return [
        "",
        f"The transport's floor (bench/transport_floor.py): a call that does no work (grpc.health.v1 Check on "
        f"server-fp32) takes p50 {fmt_num(floor['p50_ms_alone'], 3)} ms alone and, paced at "
        f"{fmt_num(floor['rate_rps'], 0)} calls/s, {fmt_num(floor['server_cpu_ms_per_call'], 3)} ms of the "
        f"server's CPU and {fmt_num(floor['client_cpu_ms_per_call'], 3)} ms of the load generator's per call. "
        f"The last column is what each goal's metric would read on {threads} cores if the server cost only "
        "that beside the in-process ceilings (an estimate: a server's length-grouped batches can compute a "
        "little faster than the ceiling's). The p50 one is "
        + (
            "the handler's floor below (the graph in a worker thread)."
            if from_handler
            else "the no-work call's p50: a lone Embed call's round trip includes a no-work call's."
        ),
    ]


def _handler_floor_text(handler: dict | None, from_handler: bool) -> list[str]:
    """`from_handler`: the goals table's p50 estimate is the thread mode's figure."""
    if not handler:
        return []

    def mode_text(mode: dict, where: str) -> str:
        failed = sum(mode["errors"].values())
        if failed:
            return f"{where}: no figure ({failed} calls failed, {mode['requests_ok']} answered)"
        over = fmt_num(mode["p50_minus_inprocess_ms"], 3)
        return f"{fmt_num(mode['p50_ms'], 3)} ms {where} ({over} ms over in-process)"

    estimate = "; the p50 goal's estimate above" if from_handler else ""
    return [
        "",
        "The handler's floor (bench/handler_floor.py): server-fp32's c=1 calls against a grpc.aio handler "
        "that tokenizes and runs the same graph with nothing of bertserve's path, each phase held against "
        "the in-process p50 measured right before and after it (as server-fp32's c=1 phase is), read p50 "
        f"{mode_text(handler['inline'], 'with the graph run on the event loop')} and "
        f"{mode_text(handler['thread'], 'in a worker thread')}{estimate}.",
    ]


def limits_text(theory: dict, kernel: dict) -> str:
    """The theoretical peak with its formula's terms (a CPU's or a GPU's), then ONNX Runtime's kernels."""
    if "sms" in theory:
        text = (f"Theoretical ({theory['gpu']}, {theory['architecture']}): {theory['sms']} SMs x {theory['clock_ghz']} GHz "
                f"({theory['clock_source']}) x {theory['fp16_ops_per_clock_per_sm']} fp16 tensor-core / "
                f"{theory['fp32_ops_per_clock_per_sm']} fp32 operations per clock per SM = fp16 "
                f"{fmt_num(theory['fp16_gflops'])} GFLOP/s, fp32 {fmt_num(theory['fp32_gflops'])} GFLOP/s.")  # fmt: skip
    elif theory:
        text = (f"Theoretical: {theory['cores']} cores x {theory['clock_ghz']} GHz ({theory['clock_source']}) x "
                f"{theory['fp32_ops_per_cycle_per_core']} fp32 / {theory['int8_ops_per_cycle_per_core']} int8 operations "
                f"per cycle per core ({theory['unit']}) = fp32 {fmt_num(theory['fp32_gflops'])} GFLOP/s, int8 "
                f"{fmt_num(theory['int8_gops'])} GOP/s.")  # fmt: skip
    else:
        text = "Theoretical: not known for this device (see the notes)."
    measured = ", ".join(f"{p} {fmt_num(kernel[k])} GOP/s" for p, k in PEAK_KEYS.items() if k in kernel)
    return f"{text} ONNX Runtime's own kernels (best shape): {measured}."


def plots(result: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = result["targets"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, target in targets.items():
        cs = [p["concurrency"] for p in target["closed"]]
        ax.plot(cs, [p["inputs_per_s"] for p in target["closed"]], marker="o", label=name)
    for precision, style in (("fp32", "--"), ("int8", ":"), ("fp16", "-.")):
        ceiling = result["inprocess"].get(precision, {}).get("mixed")
        if ceiling:
            ax.axhline(
                ceiling["inputs_per_s"],
                linestyle=style,
                color="gray",
                label=f"in-process {precision} ceiling",
            )
    ax.set(
        xscale="log",
        xlabel="concurrency (closed loop)",
        ylabel="inputs/s",
        title="Throughput vs concurrency, mixed corpus",
    )
    ax.set_xticks(result["settings"]["concurrency"], [str(c) for c in result["settings"]["concurrency"]])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(12, 4), sharey=True)
    for ax, percentile in zip(axes, ("p50_ms", "p90_ms", "p99_ms"), strict=True):
        for name, target in targets.items():
            cs = [p["concurrency"] for p in target["closed"]]
            ax.plot(cs, [p[percentile] for p in target["closed"]], marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="concurrency", title=percentile.replace("_ms", " latency"))
        ax.set_xticks(result["settings"]["concurrency"], [str(c) for c in result["settings"]["concurrency"]])
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("ms")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=120)
    plt.close(fig)
    return ["throughput.png", "latency.png"]


def json_safe(value: object) -> object:
    """NaN (a figure that could not be measured) becomes null, so bench.json stays strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(
        json.dumps(json_safe(result), indent=2, default=str, allow_nan=False) + "\n"
    )
    (out / "bench.md").write_text(markdown(result))
    written = [out / "bench.json", out / "bench.md"]
    if result["targets"]:
        written += [out / name for name in plots(result, out)]
    return written
