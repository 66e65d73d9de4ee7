"""Running a bertserve server for tests: in this process (a thread with its own event loop) or as a
`bertserve serve` subprocess. Both bind 127.0.0.1 with port 0 (and a picked metrics port)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bertserve.service.settings import load_settings
from bertserve.service.supervisor.server import InferenceServer

ROOT = Path(__file__).resolve().parents[2]
READY_LINE = re.compile(
    r"serving bertserve\.v1\.Inference on [\d.]+:(\d+), metrics on (?:http://[\d.]+:(\d+)/|\(off\))"
)
HTTP_LINE = re.compile(r"serving HTTP on https?://[\d.]+:(\d+)/")  # logged just before READY_LINE
NATIVE_LINE = re.compile(
    r"serving the native port with the native transport on [\d.]+:(\d+)"
)  # so is this one


class ServerThread:
    """An InferenceServer on an event loop in a background thread.

    `call(coro_fn)` runs a coroutine function on the server's loop (e.g. `server.drain`) and returns its
    result; `start()` returns once the server reports SERVING (or raises its startup error).
    """

    def __init__(self, **settings):
        settings.setdefault("host", "127.0.0.1")
        settings.setdefault("port", 0)
        settings.setdefault("metrics_port", 0)
        settings.setdefault("http_port", 0)
        self.settings = load_settings(**settings)
        self.server = InferenceServer(self.settings)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"

    def call(self, coroutine_function, *args, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coroutine_function(*args), self.loop).result(timeout)

    def start(self) -> ServerThread:
        self._thread.start()
        try:
            self.call(self.server.start)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.loop.is_running():
            try:
                self.call(self.server.stop, timeout=30)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(30)
        self.loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class GatedBatches:
    """Holds `model`'s batches at a gate until `release()`: `computing` is set once a batch waits there. On
    exit the gate opens and the model computes as before."""

    def __init__(self, model):
        self.model = model
        self.computing, self._open = threading.Event(), threading.Event()
        self._compute = model.batcher.runs.compute

    def _gated(self, batch):
        self.computing.set()
        assert self._open.wait(30)
        return self._compute(batch)

    def release(self) -> None:
        self._open.set()

    def __enter__(self) -> GatedBatches:
        self.model.batcher.runs.compute = self._gated
        return self

    def __exit__(self, *exc) -> None:
        self._open.set()
        self.model.batcher.runs.compute = self._compute


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed with prometheus_client's parser: {(name, sorted labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples: dict, name: str, **labels) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(
        value
        for (sample_name, sample_labels), value in samples.items()
        if sample_name == name and set(labels.items()) <= set(sample_labels)
    )


def wait_for(condition, timeout: float = 10) -> None:
    """Until the server shows the state the next step needs (the calls travel asynchronously)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.01)


# Resets SIGINT to its default, then execs the command (same pid): exec keeps an ignored signal ignored.
_SIGINT_EXEC = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"


def taking_sigint(command: list[str]) -> list[str]:
    """`command`, run so that it takes Ctrl-C (SIGINT) as a terminal user's command does, even when the test
    run itself was started with SIGINT ignored (a background job of a shell without job control). Not a
    Popen preexec_fn: that runs Python in the forked child of a process with gRPC threads, and can deadlock
    before exec."""
    return [sys.executable, "-c", _SIGINT_EXEC, *command]


def bertserve_command() -> list[str]:
    """The `bertserve` console script next to this interpreter (what `make serve` runs), else
    `python -m bertserve.cli` (the same entry point) when the package is not installed."""
    script = Path(sys.executable).parent / "bertserve"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "bertserve.cli"]


class ServerProcess:
    """`bertserve serve ARGS` as a subprocess."""

    def __init__(self, *args: str, env: dict | None = None):
        self.args = [
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--http-port",
            "0",
            *args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.http_port: int | None = None
        self.native_port: int | None = None  # with --native-port
        self.lines: list[str] = []
        self._ready = threading.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)
            if match := HTTP_LINE.search(line):
                self.http_port = int(match[1])
            if match := NATIVE_LINE.search(line):
                self.native_port = int(match[1])
            if match := READY_LINE.search(line):
                self.port, self.metrics_port = int(match[1]), match[2] and int(match[2])
                self._ready.set()
        self._ready.set()  # the process ended

    def _spawn(self) -> subprocess.Popen:
        return subprocess.Popen(
            [*bertserve_command(), *self.args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def start(self, timeout: float = 90) -> ServerProcess:
        self.process = self._spawn()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(timeout) or self.port is None:
            self.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.lines))
        return self

    def run_to_exit(self, timeout: float = 90) -> int:
        """For servers expected to refuse to start: waits for the exit code."""
        self.process = self._spawn()
        _, err = self.process.communicate(timeout=timeout)
        self.lines = err.splitlines(keepends=True)
        return self.process.returncode

    def terminate(self, timeout: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    @property
    def output(self) -> str:
        return "".join(self.lines)
