"""The core-scaling run's figures (bench/scaling.py): a summary per core count, scaling.md and scaling.png."""

from __future__ import annotations

import json
from pathlib import Path

from bertserve.bench.report import fmt_num, json_safe, md_table


def _best(rates: dict[str, float]) -> tuple[str, float]:
    name = max(rates, key=rates.get)
    return name, rates[name]


def summary(levels: list[dict]) -> list[dict]:
    """Per core count: the best layout in process and in the server (bulk and single-input calls), the
    server over the in-process ceiling, and the scaling efficiency: inputs/s per core over the fewest
    cores' inputs/s per core (1.0 = linear)."""
    rows = []
    for level in levels:
        inprocess = {name: r["inputs_per_s"] for name, r in level["inprocess"].items()}
        bulk = {name: s["bulk"]["inputs_per_s"] for name, s in level["servers"].items()}
        single = {name: s["single"]["inputs_per_s"] for name, s in level["servers"].items()}
        rows.append(
            {
                "cores": level["cores"],
                "inprocess_best": _best(inprocess),
                "server_bulk_best": _best(bulk),
                "server_single_best": _best(single),
            }
        )
    if not rows:
        return rows
    base = rows[0]
    for row in rows:
        per_core = base["cores"] / row["cores"]
        row["server_vs_inprocess"] = row["server_bulk_best"][1] / row["inprocess_best"][1]
        row["single_vs_bulk"] = row["server_single_best"][1] / row["server_bulk_best"][1]
        for key in ("inprocess_best", "server_bulk_best", "server_single_best"):
            row[f"{key}_efficiency"] = row[key][1] * per_core / base[key][1]
    return rows


def markdown(result: dict) -> str:
    machine = result["machine"]
    lines = [
        "# bertserve core scaling",
        "",
        f"{result['created_at']}, {machine['cpu']}, {machine['logical_cores']} logical / "
        f"{machine['physical_cores']} physical cores, load average at start "
        f"{machine['load_average_at_start'][0]:.2f}. Model {result['model']['name']} "
        f"({result['model']['graph']}); phases of at most {result['settings']['phase_seconds']:g} s.",
        "",
        "Inputs/s. `1xk`: one ONNX Runtime session with k threads; `kx1`: k instances of one thread each, "
        + (
            "concurrent runs of one shared session. "
            if result["settings"].get("kx1_shared_session", False)
            else "a session each. "
        )
        + "bulk: 32-input requests; single: single-input calls at c=32. Efficiency: inputs/s per core over "
        "the fewest cores' inputs/s per core.",
        "",
    ]
    rows = []
    for level in result["levels"]:
        shared = " (shared)" if level["client_shares_cpus"] else ""
        for name, server in level["servers"].items():
            ceiling = level["inprocess"][name]["inputs_per_s"]
            bulk, single = server["bulk"]["inputs_per_s"], server["single"]["inputs_per_s"]
            rows.append(
                [str(level["cores"]), name, _cpus(level["cpus"]), _cpus(level["client_cpus"]) + shared,
                 fmt_num(ceiling), fmt_num(bulk), fmt_num(single), fmt_num(bulk / ceiling, 2),
                 fmt_num(single / bulk, 2)]
            )  # fmt: skip
    header = ["cores", "layout", "server CPUs", "load generator CPUs", "in-process", "server bulk",
              "server single", "bulk / in-process", "single / bulk"]  # fmt: skip
    lines += md_table(header, rows)
    lines += ["", "## Best layout per core count", ""]
    rows = [
        [
            str(r["cores"]),
            f"{fmt_num(r['inprocess_best'][1])} ({r['inprocess_best'][0]})",
            f"{fmt_num(r['server_bulk_best'][1])} ({r['server_bulk_best'][0]})",
            f"{fmt_num(r['server_single_best'][1])} ({r['server_single_best'][0]})",
            fmt_num(r["server_vs_inprocess"], 2),
            fmt_num(r["single_vs_bulk"], 2),
            fmt_num(r["server_bulk_best_efficiency"], 2),
        ]
        for r in result["summary"]
    ]
    header = ["cores", "in-process", "server bulk", "server single", "server / in-process",
              "single / bulk", "server efficiency"]  # fmt: skip
    return "\n".join(lines + md_table(header, rows)) + "\n"


def _cpus(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if len(cpus) <= 4 else f"{cpus[0]}..{cpus[-1]} ({len(cpus)})"


def plot(result: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["summary"]
    cores = [r["cores"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (
        ("inprocess_best", "in-process ceiling"),
        ("server_bulk_best", "server, 32-input requests"),
        ("server_single_best", "server, single-input calls"),
    ):
        ax.plot(cores, [r[key][1] for r in rows], marker="o", label=label)
    base = rows[0]
    ax.plot(
        cores,
        [base["inprocess_best"][1] * c / base["cores"] for c in cores],
        linestyle=":",
        color="gray",
        label="linear from the fewest cores (in-process)",
    )
    ax.set(xscale="log", yscale="log", xlabel="CPU cores", ylabel="inputs/s", title="Throughput vs cores")
    ax.set_xticks(cores, [str(c) for c in cores])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=120)
    plt.close(fig)
    return "scaling.png"


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(json_safe(result), indent=2, allow_nan=False) + "\n")
    (out / "scaling.md").write_text(markdown(result))
    return [out / "scaling.json", out / "scaling.md", out / plot(result, out)]
