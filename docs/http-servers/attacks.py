"""Hostile-client harness for HTTP servers (issue 30): each attack starts a fresh server from servers.py as
a subprocess on 127.0.0.1, attacks it over loopback (bounded in count and time), and records what
happened: statuses, RSS of the server process, /health latency meanwhile, open descriptors, log bytes.

    python docs/http-servers/attacks.py --server uvicorn-h11,bertserve --attack all --out results.json
    python docs/http-servers/attacks.py --report results.json   # the markdown table

With several servers the runs are interleaved: each attack runs against every server before the next.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))
import floods  # noqa: E402
import probes  # noqa: E402
import protocol  # noqa: E402
from probes import health  # noqa: E402

HERE = Path(__file__).parent
SERVERS = ["uvicorn-h11", "uvicorn-httptools", "hypercorn", "granian-embed", "aiohttp", "bertserve"]
MiB = 1024 * 1024


class Server:
    """One server subprocess: `port`, `tls` (the client context when HTTPS), `proc`, its log file."""

    def __init__(
        self,
        name: str,
        tls_files: tuple[str, str] | None = None,
        nofile: tuple[int, int | None] | None = None,
    ):
        self.name, self.port = name, free_port()
        log_fd, self.log = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        args = [sys.executable, str(HERE / "servers.py"), name, str(self.port), *(tls_files or ())]

        def limit():  # nofile: (soft, hard) descriptor limits of the server; hard None keeps ours
            if nofile:
                hard = nofile[1] or resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile[0], hard))

        self.proc = subprocess.Popen(args, stdout=log_fd, stderr=subprocess.STDOUT, preexec_fn=limit)
        os.close(log_fd)
        self.ps = psutil.Process(self.proc.pid)
        self.tls = None
        if tls_files:
            self.tls = ssl.create_default_context(cafile=tls_files[0])
            self.tls.check_hostname = False

    async def ready(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {Path(self.log).read_text()[-2000:]}")
            if (await health(self.port, self.tls, timeout=1))[0] is not None:
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start")

    def rss_mb(self) -> float:
        return round(self.ps.memory_info().rss / MiB, 1)

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def log_bytes(self) -> int:
        return Path(self.log).stat().st_size

    def log_text(self) -> str:
        return Path(self.log).read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self.log)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cert(folder: str) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = Path(folder, "cert.pem"), Path(folder, "key.pem")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


# Each attack: (needs TLS, the server's (soft, hard) fd limits or None, coroutine(server) -> dict).
ATTACKS = {
    "endless_header": (False, None, probes.endless_header),
    "short_bodies": (False, None, probes.short_bodies),
    "client_close": (False, None, probes.client_close),
    "tls_flood": (True, (1024, None), floods.tls_flood),
    "tls_flood_hard1024": (True, (1024, 1024), floods.tls_flood),
    "absolute_form": (False, None, protocol.absolute_form),
    "burst": (False, None, floods.burst),
    "slowloris": (False, None, floods.slowloris),
    "protocol": (False, None, protocol.protocol),
    "plain_to_tls": (True, None, protocol.plain_to_tls),
    "cpu": (False, None, protocol.cpu),
}


async def run_one(name: str, attack: str, tls_files: tuple[str, str]) -> dict:
    needs_tls, nofile, probe = ATTACKS[attack]
    server = Server(name, tls_files if needs_tls else None, nofile)
    try:
        await server.ready()
        started = time.monotonic()
        result = await probe(server)
        result["seconds"] = round(time.monotonic() - started, 1)
        log = server.log_text()
        result["tracebacks"] = log.count("Traceback")
        if result["tracebacks"]:
            lines = log[log.index("Traceback") :].splitlines()
            result["first_traceback_error"] = next((x for x in lines[1:] if not x.startswith(" ")), "")[:200]
        return result
    except Exception as exc:  # the attack or the server broke: that is a result too
        return {"error": repr(exc)[:300], "alive": server.proc.poll() is None}
    finally:
        server.stop()


async def main_async(args) -> None:
    names = SERVERS if args.server == "all" else args.server.split(",")
    attacks = list(ATTACKS) if args.attack == "all" else args.attack.split(",")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    results.setdefault("machine", {})["runs"] = results.get("machine", {}).get("runs", [])
    with tempfile.TemporaryDirectory() as folder:
        tls_files = make_cert(folder)
        for attack in attacks:
            for name in names:
                load = os.getloadavg()
                print(f"{time.strftime('%H:%M:%S')} {attack} x {name} (load {load[0]:.2f})", flush=True)
                result = await run_one(name, attack, tls_files)
                result["load_before"] = round(load[0], 2)
                print("   ", json.dumps(result)[:600], flush=True)
                results.setdefault(name, {})[attack] = result
                Path(args.out).write_text(json.dumps(results, indent=1))
    results["machine"]["runs"].append(
        {
            "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "versions": versions(),
        }
    )
    Path(args.out).write_text(json.dumps(results, indent=1))


def versions() -> dict:
    from importlib.metadata import version

    out = {}
    for package in ["uvicorn", "h11", "httptools", "hypercorn", "granian", "aiohttp"]:
        try:
            out[package] = version(package)
        except Exception:
            out[package] = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", default="all", help=f"comma-separated, or all: {', '.join(SERVERS)}")
    parser.add_argument("--attack", default="all", help=f"comma-separated, or all: {', '.join(ATTACKS)}")
    parser.add_argument("--out", default="http-attacks.json", help="results (JSON, merged into if it exists)")
    parser.add_argument("--report", help="print the markdown table of a results file and exit")
    args = parser.parse_args()
    if args.report:
        import report

        print(report.table(json.loads(Path(args.report).read_text())))
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
