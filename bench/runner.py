"""The whole run: corpus, GEMM peak, in-process ceilings, the four servers, ratios, report.

Order matters on a small machine: nothing else of ours runs while one target is measured (the GEMM
peak and the ceilings first, then one server at a time), and every target gets the same texts.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

from bertserve.bench import (
    analysis,
    checks,
    gemm,
    gpu,
    handler_floor,
    inprocess,
    limits,
    native_loadgen,
    profile,
    report,
    simulated_device,
    transport_floor,
)
from bertserve.bench.config import BenchConfig
from bertserve.bench.corpus import Corpus, fixed_length_corpus, load_tokenizer, mixed_corpus
from bertserve.bench.flops import corpus_flops, encoder_flops
from bertserve.bench.loadgen import make_requests
from bertserve.bench.machine import describe_machine
from bertserve.bench.model_setup import ModelUnderTest, resolve_model
from bertserve.bench.processes import bertserve_process, child_pythonpath, free_port, naive_process
from bertserve.bench.targets import PER_CALL_CONCURRENCY, TargetRun, Workload
from bertserve.manifest import ENCODER, ENCODER_FP16, ENCODER_INT8

PROFILE_TEXTS = 200  # texts in the profiled pass


def _portable(path: Path) -> str:
    """A path as bench.json records it: relative to the working directory (or from `site-packages/` on for
    an installed package), so results committed to a repository name no machine's directories."""
    path = path.resolve()
    if "site-packages" in path.parts:
        return str(Path(*path.parts[path.parts.index("site-packages") :]))
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return path.name


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def layout_name(ceiling: dict) -> str:
    """`1x2`, `2x1`, `2x2 shared` (two concurrent runs of one session of 2 threads)."""
    name = f"{ceiling['instances']}x{ceiling['threads_per_instance']}"
    return f"{name} shared" if ceiling["shared_session"] else name


def _ceilings(config: BenchConfig, model: ModelUnderTest, tokenizer, mixed: Corpus, fixed: Corpus) -> dict:
    dims = model.manifest.dimensions
    graphs = _graphs(config, model)
    results: dict[str, dict] = {}
    for precision, graph in graphs.items():
        results[precision] = {}
        for key, corpus in (("mixed", mixed), ("fixed", fixed)):
            # the best of one session with every thread and the servers' instance layout
            tried = [
                inprocess.measure_ceiling(
                    graph,
                    tokenizer,
                    corpus,
                    config.threads,
                    config.ceiling_batch_sizes,
                    config.ceiling_passes,
                    instances,
                    config.provider,
                    shared,
                    per_instance,
                    config.ceiling_min_s,
                )
                for instances, per_instance, shared in config.ceiling_layouts
            ]
            c = max(tried, key=lambda r: r["inputs_per_s"])
            c["layouts_tried"] = {layout_name(r): r["inputs_per_s"] for r in tried}
            c["gflops_per_s"] = corpus_flops(dims, corpus.tokens) / c["seconds_per_pass"] / 1e9
            results[precision][key] = c
            log(
                f"  in-process {precision} {corpus.name}: {c['inputs_per_s']:.1f} inputs/s at batch "
                f"{c['best_batch_size']}, {c['instances']} session(s) (tried {c['layouts_tried']})"
            )
    single = checks.single_latency_args(config, model, tokenizer, mixed)  # as its checks beside c=1 phases
    results["fp32"]["single"] = inprocess.measure_single_latency(*single)
    log(f"  in-process fp32 one input at a time: p50 {results['fp32']['single']['p50_ms']:.2f} ms")
    return results


def _graphs(config: BenchConfig, model: ModelUnderTest) -> dict[str, Path]:
    """Precision -> encoder graph measured in process: fp32, and int8 on CPU or fp16 on CUDA when there."""
    graphs = {"fp32": model.graph(ENCODER)}
    if config.provider == "cuda" and ENCODER_FP16 in model.manifest.graphs:
        graphs["fp16"] = model.graph(ENCODER_FP16)
    elif config.provider == "cpu" and model.int8_repo is not None:
        graphs["int8"] = model.graph(ENCODER_INT8)
    return graphs


def _profiles(config: BenchConfig, model: ModelUnderTest, tokenizer, mixed: Corpus, ceilings: dict) -> dict:
    """ORT's per-operator profile of each graph at its best ceiling batch size, on the mixed corpus."""
    sample = Corpus(mixed.name, mixed.texts[:PROFILE_TEXTS], mixed.tokens[:PROFILE_TEXTS])
    results = {}
    for precision, graph in _graphs(config, model).items():
        batch_size = ceilings[precision]["mixed"]["best_batch_size"]
        results[precision] = profile.op_profile(
            graph, tokenizer, sample, config.threads, batch_size, config.out / "profiles", config.provider
        )
        top = ", ".join(
            f"{op} {share:.0%}" for op, share in list(results[precision]["share_by_op"].items())[:4]
        )
        log(f"  profile {precision} at batch {batch_size}: {top}")
    return results


def _servers(config: BenchConfig, model: ModelUnderTest, logs: Path) -> dict:
    """Target name -> the server process to measure, in measuring order (server-fp32 first)."""
    servers = {}
    # the provider is never left "auto": a CPU bench on a GPU machine measures the CPU too
    settings = config.server_settings | {"provider": config.provider}
    targets = config.measured_targets
    fp16_repo = model.repo if ENCODER_FP16 in model.manifest.graphs else None
    # the bertserve targets, in measuring order: (repository, settings beyond the common ones, protocol);
    # a target whose repository is None (no such graph) is skipped
    variants = {
        analysis.SERVER: (model.repo, {}, "grpc"),
        analysis.SERVER_HTTP: (model.repo, {}, "http"),
        analysis.SERVER_BS1: (model.repo, {"max_batch_size": "1"}, "grpc"),
        analysis.SERVER_INT8: (model.int8_repo, {"precision": "int8"}, "grpc"),
        analysis.SERVER_FP16: (fp16_repo, {"precision": "fp16"}, "grpc"),
    }
    for name, (repo, extra, protocol) in variants.items():
        if name in targets and repo is not None:
            native = config.front == "native" and protocol == "grpc"
            port = free_port() if native else None
            if native:
                extra = extra | {"native_port": str(port)}
            servers[name] = bertserve_process(
                name, repo, model.spec, config.threads, logs, settings | extra, protocol=protocol
            )
            servers[name].embed_port = port
    if analysis.NAIVE in targets and model.checkpoint is not None:
        embed = model.manifest.tasks.embed
        servers[analysis.NAIVE] = naive_process(
            model.checkpoint, config.threads, embed.pooling, embed.normalize, model.manifest.max_length, logs
        )
    for server in servers.values():
        server.env.update(child_pythonpath())
    return servers


async def run(config: BenchConfig) -> dict:
    started = time.perf_counter()
    config.out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    machine = describe_machine(config.threads)
    busy = machine["load_average_at_start"][0]
    if busy > 0.5 * machine["logical_cores"]:
        notes.append(
            f"the machine was busy before the bench started (1-minute load average {busy:.1f} on "
            f"{machine['logical_cores']} cores): other processes compete with every target, and multi-threaded "
            "PyTorch (the naive baseline) and the GEMM peak suffer most; figures of this run are not comparable"
        )
        log(f"warning: {notes[-1]}")
    if config.provider == "cuda":
        gpu.require_cuda()  # before anything slow: a clear error on a machine without a usable GPU
        machine["gpu"] = {k: v for k, v in gpu.describe_gpu().items() if k != "theoretical"}
        notes.append("provider cuda: no naive PyTorch baseline and no CPU GEMM peak; fp16 instead of int8")
    native, loadgen = native_loadgen.choose(config.loadgen)
    if "native_unavailable" in loadgen:
        notes.append(loadgen["native_unavailable"])
        log(f"warning: {notes[-1]}")
    with tempfile.TemporaryDirectory(prefix="bertserve-bench-") as scratch:
        log(f"[1/5] model and corpus (at {time.perf_counter() - started:.0f} s)")
        model = resolve_model(config.model_repo, config.model, config.checkpoint, Path(scratch), log)
        dims = model.manifest.dimensions
        tokenizer = load_tokenizer(model.tokenizer_path, model.manifest.max_length)
        mixed = mixed_corpus(tokenizer, limit=config.texts)
        fixed = fixed_length_corpus(
            tokenizer, min(config.fixed_length, model.manifest.max_length), config.fixed_texts
        )
        log(f"  {model.spec}; mixed {mixed.summary()}; {fixed.name} x {len(fixed.texts)}")
        if model.checkpoint is None:
            notes.append("no checkpoint: the naive baseline was not measured (pass --checkpoint)")
        if model.int8_repo is None and config.provider == "cpu":
            notes.append("no int8 encoder and no checkpoint to export one: int8 was not measured")

        log(f"[2/5] GEMM peak (at {time.perf_counter() - started:.0f} s)")
        gemm_peak = {}
        if config.provider == "cpu":
            gemm_peak = gemm.measure_in_subprocess(config.threads, dims, config.gemm_seconds_per_shape)
            log(
                f"  fp32 GEMM peak {gemm_peak['peak_gflops']:.1f} GFLOP/s ({gemm_peak['peak_library']}, {gemm_peak['peak_shape']})"
            )
        physical = limits.measure_in_subprocess(
            config.threads,
            machine["physical_cores"] or config.threads,
            dims,
            config.gemm_seconds_per_shape,
            config.provider,
        )
        log(f"  {report.limits_text(physical['theoretical'], physical['kernel'])}")
        notes.extend(physical.get("warnings", []))

        log(f"[3/5] in-process ceilings (at {time.perf_counter() - started:.0f} s)")
        ceilings = _ceilings(config, model, tokenizer, mixed, fixed)
        profiles = _profiles(config, model, tokenizer, mixed, ceilings)

        log(f"[4/5] servers (at {time.perf_counter() - started:.0f} s)")
        flops_of = lambda tokens: encoder_flops(dims, tokens)  # noqa: E731
        workload = Workload(
            config.concurrency,
            make_requests(mixed.texts, mixed.tokens, config.inputs_per_request, flops_of),
            make_requests(fixed.texts, fixed.tokens, config.inputs_per_request, flops_of),
            config.open_rate_fraction,
            config.phase_time_limit_s,
            stream_target=analysis.SERVER if config.stream else None,
            stream_texts=tuple(mixed.texts),
            single=tuple(make_requests(mixed.texts, mixed.tokens, 1, flops_of)),
            bulk=tuple(make_requests(mixed.texts, mixed.tokens, PER_CALL_CONCURRENCY, flops_of)),
            ceiling_check=checks.ceiling_check(config, model, tokenizer, mixed, ceilings["fp32"]["mixed"]),
            single_check=checks.single_check(config, model, tokenizer, mixed),
            checked_target=analysis.SERVER,
            min_requests_per_caller=config.min_requests_per_caller,
            min_open_s=config.min_open_s,
            loadgen_threads=config.loadgen_threads,
        )
        targets: dict[str, dict] = {}
        open_rate = config.open_rate
        for name, server in _servers(config, model, config.out / "logs").items():
            per_caller = config.connections == "per-caller"
            run = TargetRun(server, model.name, workload, log, native, per_caller)
            targets[name] = await run.run(open_rate)
            open_rate = (
                open_rate or targets[name]["open"]["offered_rate_rps"]
            )  # the same offered load for all
        handler = None
        if analysis.SERVER in targets and 1 in config.concurrency:
            try:
                handler = await handler_floor.measure(
                    model, workload, config.threads, config.provider, ceilings["fp32"]["single"], native,
                    config.out / "logs", log, config.phase_time_limit_s,
                )  # fmt: skip
            except Exception as error:  # a diagnostic after the targets: the run keeps what it measured
                notes.append(f"the handler's floor was not measured: {error}")
                log(f"warning: {notes[-1]}")
        simulated = None
        if analysis.SIMULATED_DEVICE in config.measured_targets:
            log(f"  simulated device: {config.simulated_device_ms:g} ms per batch")
            simulated = await simulated_device.measure(
                model.repo, model.spec, model.name, list(workload.single), config.server_settings,
                config.simulated_device_ms, config.simulated_device_calls, config.threads, config.out / "logs",
                config.phase_time_limit_s, log, native, notes,
            )  # fmt: skip

    for name, target in targets.items():
        cut = [p for p in [*target["closed"], target["fixed"], target["open"]] if p["stopped_early"]]
        if cut:
            notes.append(
                f"{name}: {len(cut)} phase(s) reached the {config.phase_time_limit_s:g} s time limit and sent only "
                "part of the corpus (a shuffled prefix, so the same mix of lengths)"
            )
    log(f"[5/5] report (at {time.perf_counter() - started:.0f} s)")
    ratios = analysis.ratios(targets, ceilings, gemm_peak.get("peak_gflops"))
    ratios["limits"] = physical | {"fractions": limits.fractions(analysis.rates(targets, ceilings), physical)}
    int8_graph = model.int8_manifest.graphs.get(ENCODER_INT8) if model.int8_manifest else None
    server = targets.get(analysis.SERVER, {})
    floor = transport_floor.of_target(
        server,
        ceilings,
        PER_CALL_CONCURRENCY,
        config.threads,
        machine["logical_cores"],
        handler and handler["thread"]["p50_minus_inprocess_ms"],
    )
    measured = ratios | {
        "int8_cosine_to_fp32": int8_graph.parity.cosine_to_fp32 if int8_graph and int8_graph.parity else None,
        "server_startup_s": server.get("startup_s"),
        "server_rss_mb": server.get("rss_mb_after_load"),
        "simulated_two_vs_one_worker": simulated and simulated["two_vs_one_worker"],
        "front_cpu_ms_per_call": simulated and simulated["front_cpu_ms_per_call"],
        "native_cpu_ms_per_call": simulated and simulated["native_cpu_ms_per_call"],
        "native_two_vs_one_worker": simulated and simulated["native_two_vs_one_worker"],
        "native_two_cpu_ms_per_call": simulated and simulated["native_two_cpu_ms_per_call"],
        "simulated_http_vs_native": simulated and simulated["http_vs_native"],
    }
    result = {
        "bench_version": 1,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": config.quick,
        "seconds": None,
        "machine": machine | {"load_average_at_end": os.getloadavg()},
        "model": {
            "name": model.name,
            "version": model.version,
            "source": model.manifest.export.source,
            "max_length": model.manifest.max_length,
            "dimensions": dims.model_dump(),
            "graphs": sorted(model.manifest.graphs),
            "checkpoint": _portable(model.checkpoint) if model.checkpoint else None,
            "int8_exported_by_bench": model.int8_repo is not None and model.int8_repo != model.repo,
        },  # fmt: skip
        "corpus": {"mixed": mixed.summary(), "fixed": fixed.summary()},
        "settings": {
            "threads": config.threads,
            "concurrency": config.concurrency,
            "texts": config.texts,
            "fixed_texts": config.fixed_texts,
            "fixed_length": config.fixed_length,
            "inputs_per_request": config.inputs_per_request,
            "min_requests_per_caller": config.min_requests_per_caller,
            "min_open_s": config.min_open_s,
            "ceiling_batch_sizes": config.ceiling_batch_sizes,
            "provider": config.provider,
            "server_settings": config.server_settings,
            "open_rate_rps": open_rate,
            "phase_time_limit_s": config.phase_time_limit_s,
            "load_generator": loadgen
            | {
                "grpc_connections": config.connections,
                "front": config.front,
                "threads": config.loadgen_threads,
            },
        },  # fmt: skip
        "flops": {
            "per_input_mean_gflop_mixed": corpus_flops(dims, mixed.tokens) / len(mixed.tokens) / 1e9,
            "per_input_gflop_fixed": encoder_flops(dims, fixed.tokens[0]) / 1e9,
        },  # fmt: skip
        "gemm": gemm_peak,
        "inprocess": ceilings,
        "profile": profiles,
        "per_call_profile": analysis.per_call_profile(targets),
        "targets": targets,
        "ratios": ratios,
        "padding_ratio": ratios["padding_ratio"],
        "gemm_peak_fraction": ratios["gemm_peak_fraction"],
        "transport_floor": floor,
        "handler_floor": handler,
        "simulated_device": simulated,  # bench/simulated_device.py
        "front_cpu_ms_per_call": measured["front_cpu_ms_per_call"],
        "goals": analysis.goals(measured, floor and floor["estimates"]),
        "notes": notes,
    }
    result["seconds"] = time.perf_counter() - started
    for path in report.write(result, config.out):
        log(f"  wrote {path}")
    log(f"done in {result['seconds']:.0f} s")
    return result
