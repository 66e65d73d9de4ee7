"""The markdown table (attack x server) of a results file written by attacks.py."""

from __future__ import annotations


def _health(r: dict) -> str:
    failed = ", ".join(f"{k} x{v}" for k, v in r.get("health_failed", {}).items())
    ok = (
        f"/health p50 {r['health_p50_ms']} max {r['health_max_ms']} ms"
        if r.get("health_ok")
        else "/health never 200"
    )
    return ok + (f" (failed: {failed})" if failed else "")


def _logs(r: dict) -> str:
    if not r.get("tracebacks"):
        return ""
    return f"; {r['tracebacks']} tracebacks ({r.get('first_traceback_error', '')})"


def endless_header(r: dict) -> str:
    answers = ", ".join(f"{k} x{v}" for k, v in r["answers"].items())
    first = (
        f"first answer at {r['first_answer_s']} s" if r["first_answer_s"] is not None else "no answer in 12 s"
    )
    return (
        f"{answers}; {first}; RSS {r['rss_start_mb']} -> peak {r['rss_peak_mb']} MB, "
        f"{r['rss_3s_after_close_mb']} MB 3 s after close; {_health(r)}"
    )


def short_bodies(r: dict) -> str:
    rounds = " / ".join(str(x) for x in r["rss_after_each_round_mb"])
    errors = f"; send errors {r['send_errors']}" if r["send_errors"] else ""
    return f"RSS {r['rss_start_mb']} -> {rounds} MB after rounds, {r['rss_4s_after_last_mb']} MB 4 s later{errors}"


def client_close(r: dict) -> str:
    return (
        f"app told (http.disconnect) {r['slow_told']}, cancelled {r['slow_cancelled']}, "
        f"worked to the end {r['slow_completed']} (of {r['requests']})"
    )


def tls_flood(r: dict) -> str:
    probes = ", ".join(f"{k} x{v}" for k, v in r["https_probes"].items())
    first = (
        f"first HTTPS 200 at {r['first_https_ok_s']} s"
        if r["first_https_ok_s"] is not None
        else "no HTTPS 200"
    )
    return (
        f"HTTPS probes: {probes}; {first}; silent ones closed by server {r['silent_closed_by_server']}"
        f"/{r['silent_connected']}; fds peak {r['fds_peak']}; log {r['log_bytes'] / 1e6:.1f} MB"
        f"{_logs(r)}; after they close: {r['https_after_close']}"
    )


def absolute_form(r: dict) -> str:
    keys = ["CONNECT 127.0.0.1:22", "GET http://[::1", "GET http://127.0.0.1/health"]
    return "; ".join(f"{k}: {r[k]}" for k in keys) + _logs(r)


def burst(r: dict) -> str:
    outcomes = ", ".join(f"{k} x{v}" for k, v in sorted(r["outcomes"].items()))
    return (
        f"{outcomes} in {r['burst_s']} s; app finished {r['app_completed']}; "
        f"fds peak {r['fds_peak']}; RSS peak {r['rss_peak_mb']} MB"
    )


def slowloris(r: dict) -> str:
    answers = ", ".join(f"{k} x{v}" for k, v in r["slow_answers"].items())
    closed = f"closed by server {r['slow_closed_by_server']}/{r['slow_connected']}"
    if r["slow_close_median_s"] is not None:
        closed += f" (median {r['slow_close_median_s']} s: {answers})"
    return f"{closed}; {_health(r)}"


def cpu(r: dict) -> str:
    return (
        f"{r['server_cpu_ms_per_request']} ms CPU/request ({r['requests']} at {r['achieved_rps']}/s, "
        f"p50 {r['latency_p50_ms']} ms, idle {r['idle_cpu_ms_per_s']} ms/s)"
    )


def plain_to_tls(r: dict) -> str:
    return r["answer"] + (" (a TLS alert)" if r["first bytes"].startswith("\x15") else "")


ROWS = [
    ("1. endless header value, 8 conns, 12 s", "endless_header", endless_header),
    ("2. 3 x 80 bodies of 8 MiB one byte short, then close", "short_bodies", short_bodies),
    ("5. 4 clients leave 0.3 s into a 3 s request", "client_close", client_close),
    ("7. 2,100 silent TCP conns to the TLS port, fd limit 1024, 24 s", "tls_flood", tls_flood),
    ("7b. the same with the hard fd limit 1024 too", "tls_flood_hard1024", tls_flood),
    ("9. absolute-form URLs", "absolute_form", absolute_form),
    ("10. 5,000 conns at once, each GET /slow?s=1", "burst", burst),
    ("slowloris: 1,100 conns, a header byte a second, 20 s", "slowloris", slowloris),
]
PROTOCOL = [
    "header 40 KiB",
    "header 1 MiB",
    "200 headers",
    "URL 64 KiB",
    "CL+TE",
    "CL+CL differing",
    "TE with space before colon + CL",
    "TE: chunked, identity",
    "smuggled requests reached the app",
    "pipelined 5",
    "Expect: 200-ok",
    "Expect: 100-continue",
    "HEAD body bytes sent",
]


def cell(results: dict, server: str, attack: str, render) -> str:
    r = results.get(server, {}).get(attack)
    if r is None:
        return "not run"
    if "error" in r:
        return f"harness error: {r['error']}"
    return render(r).replace("|", "/")


def table(results: dict) -> str:
    servers = [s for s in results if s != "machine"]
    lines = ["| attack | " + " | ".join(servers) + " |", "|---" * (len(servers) + 1) + "|"]
    for title, attack, render in ROWS:
        lines.append(f"| {title} | " + " | ".join(cell(results, s, attack, render) for s in servers) + " |")
    for key in PROTOCOL:
        row = [str(results.get(s, {}).get("protocol", {}).get(key, "not run")) for s in servers]
        lines.append(f"| {key} | " + " | ".join(row) + " |")
    lines.append(
        "| plain HTTP to the TLS port | "
        + " | ".join(cell(results, s, "plain_to_tls", plain_to_tls) for s in servers)
        + " |"
    )
    lines.append(
        "| CPU, 200 req/s for 10 s | " + " | ".join(cell(results, s, "cpu", cpu) for s in servers) + " |"
    )
    loads = [str(r.get("load_before")) for s in servers for r in results[s].values() if isinstance(r, dict)]
    lines.append("")
    lines.append(
        f"Load average (1 min) before each attack: {min(loads, key=float)} to {max(loads, key=float)}."
    )
    return "\n".join(lines)
