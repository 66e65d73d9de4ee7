"""`bertserve serve --workers 2 --engines 2`: two engine processes, front i fed by engine i % 2.

Each engine batches and computes its own fronts' calls (one stopped holds only its fronts' callers); the
server reports serving only once every engine is warm; an engine killed stops the server with exit 1;
SIGTERM drains every process and exits 0; engines beyond the fronts are refused at start, and fronts that
are not a multiple of the engines are warned of.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.service.supervisor.processes import ENGINE_STOP_S
from tests.helpers.server import ServerProcess, scrape, wait_for
from tests.test_workers import (
    MODELS,
    _alive,
    _calls,
    _connections,
    _sent,
    _stop,
    _until_sent,
    answers,
    assert_same,
)

PIDS = re.compile(r"started (engine-\d+|front-\d+), pid (\d+)")
GRPC_PORT = re.compile(r"supervising \d+ fronts on gRPC port (\d+)")
CALLS = 16  # each on a connection of its own: both fronts get some (all on one: 2 in 65,536)


def pids(server: ServerProcess) -> dict[str, int]:
    return {name: int(pid) for name, pid in PIDS.findall(server.output)}


def engines(tiny_repo, *args: str) -> ServerProcess:
    return ServerProcess(
        "--model-repo", str(tiny_repo), *MODELS, "--workers", "2", "--engines", "2", *args
    ).start(timeout=120)


def test_each_engine_serves_its_own_fronts_and_sigterm_drains_all(tiny_repo):
    server = engines(tiny_repo)
    resume = lambda: None  # noqa: E731
    try:
        children = pids(server)
        assert set(children) == {"engine-0", "engine-1", "front-0", "front-1"}
        for name in ("engine-0", "engine-1"):
            threads = {
                (t / "comm").read_text().strip() for t in Path(f"/proc/{children[name]}/task").iterdir()
            }
            assert {"bs-engine", "bs-compute"} <= threads
        samples = scrape(server.metrics_url)
        processes = {
            dict(labels).get("process") for name, labels in samples if name == "process_cpu_seconds_total"
        }
        assert processes == {"supervisor", "engine-0", "engine-1", "front-0", "front-1"}
        assert samples[("bertserve_limit", (("name", "engines"),))] == 2

        # engine-1 stopped: front-1's callers wait, front-0's are answered by engine-0
        before = _sent(server)
        resume = _stop(children["engine-1"])
        pool, futures = _calls(server.address, CALLS)
        _until_sent(server, before, CALLS)
        waiting = lambda: _connections(children["front-1"], server.port)  # noqa: E731
        # front-0's calls answered while every one of front-1's waits on its connection
        wait_for(lambda: sum(f.done() for f in futures) + waiting() == CALLS, timeout=60)
        assert waiting() > 0, "every call was answered with engine-1 stopped: front-1 did not use engine-1"
        assert {f.result()[0] for f in futures if f.done()} == {"OK"}
        server.process.send_signal(signal.SIGTERM)  # both fronts drain their calls in flight
        wait_for(lambda: server.output.count("draining: ") == 2, timeout=30)
        resume()
        results = [f.result(timeout=60) for f in futures]
        pool.shutdown()
        assert {code for code, _ in results} == {"OK"}
        assert server.process.wait(60) == 0
        for pid in children.values():
            assert not _alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            resume()  # a stopped engine would outlive the test (SIGTERM waits while it is stopped)
        server.kill()


def test_two_engines_answer_as_one_does(tiny_repo):
    one = ServerProcess("--model-repo", str(tiny_repo), *MODELS, "--workers", "2").start(timeout=120)
    two = engines(tiny_repo)
    try:
        assert_same(answers(two.address, two.http_url), answers(one.address, one.http_url))
    finally:
        one.kill()
        two.kill()


def _started_with_engine_1_stopped(tiny_repo) -> tuple[ServerProcess, callable, int]:
    """A server whose engine-1 is stopped as soon as it starts: (server, resume it, gRPC port)."""
    server = ServerProcess("--model-repo", str(tiny_repo), *MODELS, "--workers", "2", "--engines", "2")
    server.process = server._spawn()
    resume, port = None, None
    for line in server.process.stderr:
        server.lines.append(line)
        if (match := PIDS.search(line)) and match[1] == "engine-1":
            resume = _stop(int(match[2]))
        if match := GRPC_PORT.search(line):
            port = int(match[1])
            break
    threading.Thread(target=lambda: server.lines.extend(server.process.stderr), daemon=True).start()
    if resume is None or port is None:
        server.kill()
        raise RuntimeError("the server did not start its engines:\n" + server.output)
    return server, resume, port


def _health(port: int) -> list[int]:
    """The health status each of CALLS fresh connections (spread over the fronts) reports."""
    statuses = []
    for _ in range(CALLS):
        options = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            statuses.append(check(health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True).status)
    return statuses


def test_no_front_serves_until_every_engine_is_warm(tiny_repo):
    server, resume, port = _started_with_engine_1_stopped(tiny_repo)
    try:
        # engine-0 warm (it waits for engine-1), or, without the barrier, serving its front
        wait_for(
            lambda: re.search(r"engine-0 bertserve.engine: engine (warm|ready)", server.output), timeout=60
        )
        assert "engine-0 bertserve.engine: engine ready" not in server.output  # it does not listen yet
        assert set(_health(port)) == {health_pb2.HealthCheckResponse.NOT_SERVING}
        resume()
        wait_for(lambda: set(_health(port)) == {health_pb2.HealthCheckResponse.SERVING}, timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            resume()
        server.kill()


def test_an_engine_killed_stops_the_server_with_exit_1(tiny_repo):
    server = engines(tiny_repo)
    try:
        children = pids(server)
        os.kill(children["engine-1"], signal.SIGKILL)
        assert server.process.wait(60) == 1
        assert "the engine-1 process exited" in server.output
        for pid in children.values():
            wait_for(lambda pid=pid: not _alive(pid), timeout=30)
    finally:
        server.kill()


def test_an_engine_that_fails_to_start_frees_the_other_at_once(tiny_repo):
    """engine-1 killed while engine-0 waits for it to be warm: the supervisor's stop frees engine-0 from the
    wait at once (no kill after ENGINE_STOP_S)."""
    server, resume, _ = _started_with_engine_1_stopped(tiny_repo)
    try:
        wait_for(lambda: "engine-0 bertserve.engine: engine warm" in server.output, timeout=60)
        started = time.monotonic()
        os.kill(pids(server)["engine-1"], signal.SIGKILL)
        assert server.process.wait(60) == 1
        assert time.monotonic() - started < ENGINE_STOP_S  # engine-0 was not left to be killed
        assert "did not stop in time" not in server.output
        assert "Traceback" not in server.output
    finally:
        server.kill()


def test_fronts_not_a_multiple_of_engines_are_warned_of(tiny_repo):
    uneven = ServerProcess("--model-repo", str(tiny_repo), *MODELS, "--workers", "3", "--engines", "2")
    even = engines(tiny_repo)
    try:
        uneven.start(timeout=120)
        assert "3 fronts over 2 engines: engine-0 is fed by more fronts than the last" in uneven.output
        assert "fronts over" not in even.output
    finally:
        uneven.kill()
        even.kill()


def test_more_engines_than_fronts_is_refused_at_start(tiny_repo):
    server = ServerProcess("--model-repo", str(tiny_repo), *MODELS, "--workers", "2", "--engines", "3")
    assert server.run_to_exit() == 2  # a settings error, as every other
    assert "setting engines (BERTSERVE_ENGINES)" in server.output
    assert "must be at most the front processes: workers is 2 (2 fronts)" in server.output
    assert "Traceback" not in server.output
