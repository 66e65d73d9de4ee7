"""`bertserve serve --workers 2`: a supervisor, one engine process and two fronts sharing the ports.

Every task answers as one process answers (the same graphs: equal within float noise of other batch
company); SIGTERM drains every process and exits 0; a front killed with SIGKILL is started again and only
its own callers notice; the engine killed ends every call in flight with UNAVAILABLE at once and the server
exits 1; a second server on the taken ports fails at start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertserve.client import Client
from bertserve.v1 import inference_pb2 as v1
from bertserve.v1 import inference_pb2_grpc as v1_grpc
from tests.helpers.server import ServerProcess, ServerThread, metric, scrape, wait_for
from tests.test_repository_loading import _copy_version

MODELS = ("--model", "tiny-embed", "--model", "tiny-classifier", "--model", "tiny-mlm")
TEXTS = ["the cat sat on the mat", "a b c", "workers share one engine"]
PIDS = re.compile(r"started (engine|front-\d+), pid (\d+)")
HTTP_SERVING = re.compile(r"serving HTTP on http://[\d.]+:(\d+)/")
GRPC_PORT = re.compile(r"supervising \d+ fronts on gRPC port (\d+)")


def pids(server: ServerProcess) -> dict[str, int]:
    """The latest pid of each child the supervisor started, from its log."""
    return {name: int(pid) for name, pid in PIDS.findall(server.output)}


def workers(tiny_repo, *args: str) -> ServerProcess:
    return ServerProcess("--model-repo", str(tiny_repo), *MODELS, "--workers", "2", *args).start(timeout=120)


@pytest.fixture(scope="module")
def two_fronts(tiny_repo):
    server = workers(tiny_repo)
    yield server
    server.kill()


def answers(address: str, http_url: str) -> dict:
    """What every task answers for TEXTS (one call each), in plain Python values."""
    with Client(address, timeout=30) as client:
        out = {
            "embed": client.embed(TEXTS, model="tiny-embed").vectors,
            "classify": [
                [(s.label, s.score) for s in r.labels]
                for r in client.classify(TEXTS, model="tiny-classifier").results
            ],
            "fill_mask": [
                [(c.token, c.score) for m in r.masks for c in m.candidates]
                for r in client.fill_mask(["the [MASK] sat"], model="tiny-mlm").results
            ],
            "tokenize": [[t.id for t in r.tokens] for r in client.tokenize(TEXTS).results],
            "attention": [m.probabilities for m in client.attention("the cat", model="tiny-embed").maps],
            "stream": np.stack(list(client.embed_stream(TEXTS * 20, batch_size=7, model="tiny-embed"))),
        }
    body = json.dumps({"input": TEXTS, "model": "tiny-embed"}).encode()
    request = urllib.request.Request(f"{http_url}/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        out["openai"] = np.array([d["embedding"] for d in json.load(response)["data"]])
    kserve = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]}
    request = urllib.request.Request(
        f"{http_url}/v2/models/tiny-embed/infer",
        json.dumps(kserve).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        out["kserve"] = np.array(json.load(response)["outputs"][0]["data"]).reshape(len(TEXTS), -1)
    return out


def assert_same(ours, theirs) -> None:
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert_same(ours[key], theirs[key])
    elif isinstance(ours, (list, tuple)):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert_same(a, b)
    elif isinstance(ours, (np.ndarray, float)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    else:
        assert ours == theirs


def test_each_process_and_its_busy_threads_are_named(two_fronts):
    """`top -H` and the bench tell the engine's loop and inference threads from the fronts' loops."""

    def names(pid: int) -> set[str]:
        return {(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()}

    children = pids(two_fronts)
    assert not Path(f"/proc/{two_fronts.process.pid}/comm").read_text().startswith("bs-")  # as started
    assert {"bs-engine", "bs-compute"} <= names(children["engine"])
    for index in (0, 1):
        assert {f"bs-front-{index}", "bs-cpu"} <= names(children[f"front-{index}"])


def test_every_task_answers_as_one_process_does(two_fronts, tiny_repo):
    models = [m for m in MODELS if m != "--model"]
    with ServerThread(model_repo=tiny_repo, models=models, metrics_port=-1) as one:
        expected = answers(one.address, one.http_url)
    assert_same(answers(two_fronts.address, two_fronts.http_url), expected)
    with Client(two_fronts.address) as client:
        info = client.info()
    assert {m.name for m in info.models} == set(models)
    assert {m.provider for m in info.models} == {"CPUExecutionProvider"}  # the engine's, not "engine"


CONNECTIONS = 40  # held open at once; each front must hold a share of them


def _connections(pid: int, port: int) -> int:
    """Established TCP connections on local `port` whose socket `pid` holds (it accepted them)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in rows.readlines()[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                count += state == "01" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes
    return count


def assert_each_front_answers_a_share(server: ServerProcess, address: str) -> None:
    """The kernel shares connections to `address` out between the fronts (SO_REUSEPORT): with CONNECTIONS
    held open at once, each having answered a call, each front holds at least 15% of them (fewer than 6 of
    40 on a fair coin, for either front: about 1 in 700,000). Counted from /proc, so a loaded machine passes
    as a quiet one."""
    fronts = {name: pid for name, pid in pids(server).items() if name.startswith("front")}
    port = int(address.rsplit(":", 1)[1])
    channels = [
        grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CONNECTIONS)
    ]  # a connection each: new source ports, spread by SO_REUSEPORT's hash
    try:
        for channel in channels:
            embed = v1_grpc.InferenceStub(channel).Embed
            assert len(embed(v1.EmbedRequest(inputs=TEXTS, model="tiny-embed"), timeout=30).embeddings) == 3
        held = {name: _connections(pid, port) for name, pid in fronts.items()}
    finally:
        for channel in channels:
            channel.close()
    assert sum(held.values()) == CONNECTIONS, held
    for name in fronts:
        assert held[name] >= 0.15 * CONNECTIONS, (name, held)


def test_connections_reach_both_fronts(two_fronts):
    assert_each_front_answers_a_share(two_fronts, two_fronts.address)


def test_a_second_server_on_the_taken_ports_fails_at_start(two_fronts, tiny_repo):
    one = ServerProcess("--model-repo", str(tiny_repo), "--port", str(two_fronts.port), "--workers", "1")
    assert one.run_to_exit() == 1
    assert f"cannot listen on 127.0.0.1:{two_fronts.port}" in one.output
    several = ServerProcess("--model-repo", str(tiny_repo), "--port", str(two_fronts.port), "--workers", "2")
    assert several.run_to_exit() == 1
    assert f"setting port: cannot listen on 127.0.0.1:{two_fronts.port}" in several.output
    assert "Traceback" not in several.output


def _stop(pid: int):
    os.kill(pid, signal.SIGSTOP)
    return lambda: os.kill(pid, signal.SIGCONT)


def _calls(address: str, count: int, timeout: float = 60):
    """`count` Embed calls started at once, each on a TCP connection of its own (gRPC would otherwise share
    one connection between the channels of a process), so the kernel spreads them over the fronts. Each
    future gives (status code name, time.monotonic() at its end)."""
    pool = ThreadPoolExecutor(count)

    def one(i: int):
        options = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(address, options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            try:
                v1_grpc.InferenceStub(channel).Embed(v1.EmbedRequest(inputs=[f"call {i}"]), timeout=timeout)
                return "OK", time.monotonic()
            except grpc.RpcError as exc:
                return exc.code().name, time.monotonic()

    return pool, [pool.submit(one, i) for i in range(count)]


def _sent(server: ServerProcess) -> float:
    """Inputs the fronts have sent to the engine (counted once queued there or on their way)."""
    return metric(scrape(server.metrics_url), "bertserve_inputs_total")


def _until_sent(server: ServerProcess, before: float, count: int) -> None:
    """Waits until `count` more single-input calls have reached the engine's side of the fronts."""
    wait_for(lambda: _sent(server) - before >= count, timeout=60)


PORTS = ("main", "native")  # the gRPC port, and the native port (service/grpc/native/) of every front


def _workers_on(tiny_repo, port: str) -> tuple[ServerProcess, str]:
    """A server of two fronts, and the address of its `port` (one of PORTS)."""
    if port == "main":
        return (server := workers(tiny_repo)), server.address
    server = workers(tiny_repo, "--native-port", "0")
    return server, f"127.0.0.1:{server.native_port}"


@pytest.mark.parametrize("port", PORTS)
def test_the_engine_killed_ends_calls_in_flight_with_unavailable_and_the_server_exits_1(tiny_repo, port):
    server, address = _workers_on(tiny_repo, port)
    try:
        before = _sent(server)
        resume = _stop(pids(server)["engine"])
        pool, futures = _calls(address, 6)
        _until_sent(server, before, 6)  # every call waits in a front for the stopped engine
        assert not any(f.done() for f in futures)
        supervisor = _stop(server.process.pid)  # so only the fronts themselves can end the calls
        killed_at = time.monotonic()
        os.kill(pids(server)["engine"], signal.SIGKILL)
        resume()  # harmless on a killed process
        results = [f.result(timeout=30) for f in futures]
        supervisor()
        pool.shutdown()
        assert {code for code, _ in results} == {"UNAVAILABLE"}
        # the fronts see the engine's socket close (a few ms unloaded; room here for a loaded machine)
        slowest = max(ended for _, ended in results) - killed_at
        print(f"calls in flight ended {slowest * 1000:.0f} ms after the engine was killed")
        assert slowest < 2
        assert server.process.wait(30) == 1
        assert "the engine process exited" in server.output
    finally:
        server.kill()


@pytest.mark.parametrize("port", PORTS)
def test_a_front_killed_is_started_again_and_only_its_callers_notice(tiny_repo, port):
    server, address = _workers_on(tiny_repo, port)
    try:
        first = pids(server)
        before = _sent(server)
        resume = _stop(first["engine"])
        pool, futures = _calls(address, 16)
        _until_sent(server, before, 16)  # every call waits in one of the two fronts for the stopped engine
        os.kill(first["front-0"], signal.SIGKILL)
        wait_for(lambda: pids(server)["front-0"] != first["front-0"], timeout=30)
        gone = [f.result(timeout=30) for f in futures if f.done()]
        resume()
        results = gone + [f.result(timeout=60) for f in futures if f not in gone]
        pool.shutdown()
        # the killed front's callers saw their connection close; the other front's were answered
        assert sorted({code for code, _ in results}) == ["OK", "UNAVAILABLE"]
        wait_for(lambda: "front 0 exited" in server.output, timeout=10)
        with Client(server.address, timeout=30) as client:
            client.wait_until_serving(60)
        for _ in range(10):  # served again by both fronts (a connection each time)
            with Client(address, timeout=30) as client:
                assert client.embed(TEXTS, model="tiny-embed").vectors.shape == (3, 48)
    finally:
        server.kill()


def test_engine_lost_turns_health_not_serving(tiny_repo):
    server = workers(tiny_repo)
    try:
        with grpc.insecure_channel(server.address) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            assert (
                check(health_pb2.HealthCheckRequest(), timeout=30).status
                == health_pb2.HealthCheckResponse.SERVING
            )
            supervisor = _stop(server.process.pid)  # the fronts run on; only they can change their health
            os.kill(pids(server)["engine"], signal.SIGKILL)
            wait_for(
                lambda: (
                    check(health_pb2.HealthCheckRequest(), timeout=30).status
                    == health_pb2.HealthCheckResponse.NOT_SERVING
                ),
                timeout=30,
            )
            supervisor()
        assert server.process.wait(30) == 1
    finally:
        server.kill()


@pytest.mark.parametrize("port", PORTS)
def test_sigterm_drains_every_process_and_exits_0(tiny_repo, port):
    server, address = _workers_on(tiny_repo, port)
    children = pids(server)
    before = _sent(server)
    resume = _stop(children["engine"])
    pool, futures = _calls(address, 6)
    _until_sent(server, before, 6)  # every call admitted, waiting for the stopped engine
    server.process.send_signal(signal.SIGTERM)
    wait_for(lambda: server.output.count("draining: ") == 2, timeout=30)  # both fronts drain, calls in flight
    resume()
    results = [f.result(timeout=60) for f in futures]
    pool.shutdown()
    assert {code for code, _ in results} == {"OK"}
    assert server.process.wait(60) == 0
    for pid in children.values():  # every child exited (a zombie at most, until the test run reaps it)
        assert not _alive(pid)


def test_one_scrape_counts_every_process(two_fronts):
    """The supervisor's /metrics adds up the engine's and both fronts' metrics: counts equal the calls."""
    before = scrape(two_fronts.metrics_url)
    calls = 30
    for i in range(calls):  # a connection each: both fronts answer some
        with Client(two_fronts.address, timeout=30) as client:
            client.embed([f"count {i}", "and two"], model="tiny-embed")
    after = scrape(two_fronts.metrics_url)

    def grew(name: str, **labels) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("bertserve_requests_total", rpc="Embed", code="OK") == calls  # counted by the fronts
    assert grew("bertserve_inputs_total", model="tiny-embed", task="embed") == 2 * calls
    assert grew("bertserve_batch_size_sum", model="tiny-embed") == 2 * calls  # batched by the engine
    processes = {
        dict(labels).get("process") for (name, labels) in after if name == "process_resident_memory_bytes"
    }
    assert processes == {"supervisor", "engine", "front-0", "front-1"}
    assert after[("bertserve_limit", (("name", "workers"),))] == 2


def test_one_encoder_batch_holds_every_task_from_both_fronts(shared_repo):
    """Heads on one encoder (embed, classify, fill-mask): calls queued in both fronts while the engine is
    stopped land in shared batches, mixed over tasks and fronts (bertserve_batch_fronts)."""
    server = ServerProcess(
        "--model-repo", str(shared_repo), "--workers", "2", "--max-padding-ratio", "1000"
    ).start(timeout=120)
    try:
        before = _sent(server)
        resume = _stop(pids(server)["engine"])
        calls = [
            ("tiny-encoder", "Embed", v1.EmbedRequest(inputs=["a mixed batch"], model="tiny-encoder")),
            (
                "tiny-shared-classifier",
                "Classify",
                v1.ClassifyRequest(inputs=["a"], model="tiny-shared-classifier"),
            ),
            ("tiny-shared-mlm", "FillMask", v1.FillMaskRequest(inputs=["a [MASK]"], model="tiny-shared-mlm")),
        ] * 6
        pool = ThreadPoolExecutor(len(calls))

        def one(call):
            options = [("grpc.use_local_subchannel_pool", 1)]  # a connection each, spread over the fronts
            with grpc.insecure_channel(server.address, options=options) as channel:
                return getattr(v1_grpc.InferenceStub(channel), call[1])(call[2], timeout=60)

        futures = [pool.submit(one, call) for call in calls]
        _until_sent(server, before, len(calls))  # every call waits for the stopped engine
        resume()
        answers = [f.result(timeout=60) for f in futures]
        pool.shutdown()
        assert len(answers) == len(calls)
        samples = scrape(server.metrics_url)
        batches = metric(samples, "bertserve_batch_fronts_count", model="tiny-encoder")
        single = metric(samples, "bertserve_batch_fronts_bucket", model="tiny-encoder", le="1.0")
        assert batches - single >= 1  # a batch held inputs of both fronts
        assert metric(samples, "bertserve_batch_size_sum", model="tiny-encoder") == len(calls)
    finally:
        server.kill()


def _with_engine_stopped(tiny_repo):
    """A workers-2 server whose engine is stopped as soon as it is started (so it never finishes loading)
    and whose fronts are listening: (server, resume the engine, its pid, gRPC port, HTTP port)."""
    server = ServerProcess("--model-repo", str(tiny_repo), *MODELS, "--workers", "2")
    server.process = server._spawn()
    engine = resume = None
    for line in server.process.stderr:
        server.lines.append(line)
        if (match := PIDS.search(line)) and match[1] == "engine":
            engine = int(match[2])
            resume = _stop(engine)
        if engine and (match := HTTP_SERVING.search(line)):
            http_port = int(match[1])
            break
    threading.Thread(target=lambda: server.lines.extend(server.process.stderr), daemon=True).start()
    return server, resume, engine, int(GRPC_PORT.search(server.output)[1]), http_port


def test_health_is_not_serving_while_the_engine_loads(tiny_repo):
    """The fronts open the ports at once and answer NOT_SERVING (HTTP /ready 503) until the engine is up."""
    server, resume, _, grpc_port, http_port = _with_engine_stopped(tiny_repo)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            status = check(health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(urllib.error.HTTPError) as ready:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/ready", timeout=30)
            assert ready.value.code == 503
            resume()
            wait_for(
                lambda: (
                    check(health_pb2.HealthCheckRequest(), timeout=30).status
                    == health_pb2.HealthCheckResponse.SERVING
                ),
                timeout=60,
            )
    finally:
        server.kill()


def test_children_die_with_the_supervisor_even_while_waiting_for_the_engine(tiny_repo):
    server, resume, engine, _, _ = _with_engine_stopped(tiny_repo)
    fronts = [pid for name, pid in pids(server).items() if name.startswith("front")]
    try:
        server.kill()  # SIGKILL: no drain; the children get SIGTERM from the kernel (PR_SET_PDEATHSIG)
        resume()
        wait_for(lambda: not any(_alive(pid) for pid in [*fronts, engine]), timeout=30)
    finally:
        for pid in [*fronts, engine]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_calls_in_flight_are_bounded_per_front(tiny_repo):
    """max_concurrent_rpcs holds per front: with the engine stopped, each front admits at most 2 calls and
    refuses the rest at once, so at most 2 x workers wait (bertserve_limit{name="workers"} says how many)."""
    server = workers(tiny_repo, "--max-concurrent-rpcs", "2")
    try:
        before = _sent(server)
        resume = _stop(pids(server)["engine"])
        pool, futures = _calls(server.address, 12)

        def settled() -> bool:  # every call refused, or admitted and waiting for the engine
            refused = sum(f.done() and f.result()[0] == "RESOURCE_EXHAUSTED" for f in futures)
            return refused + _sent(server) - before == len(futures)

        wait_for(settled, timeout=60)
        resumed_at = time.monotonic()
        resume()
        results = [f.result(timeout=60) for f in futures]
        pool.shutdown()
        codes = [code for code, _ in results]
        assert set(codes) == {"OK", "RESOURCE_EXHAUSTED"}
        assert 2 <= codes.count("OK") <= 4  # 2 per front that got a connection
        assert all(ended < resumed_at for code, ended in results if code == "RESOURCE_EXHAUSTED")  # at once
    finally:
        server.kill()


def test_a_cancelled_call_holds_its_room_until_the_engine_lets_go(tiny_repo):
    """Callers that give up (deadline, cancel) cannot pile inputs up towards a busy engine: a front frees a
    call's room only when the engine has dropped it, so with the engine stopped, max_queue_inputs
    cancelled calls fill the front and the next is refused at once."""
    server = workers(tiny_repo, "--max-queue-inputs", "4")
    try:
        resume = _stop(pids(server)["engine"])
        codes = []
        with Client(server.address) as client:  # one connection: one front
            for i in range(6):
                try:  # a deadline long enough that a loaded front admits or refuses the call before it
                    client.embed([f"gives up {i}"], model="tiny-embed", timeout=2.0)
                    codes.append("OK")
                except grpc.RpcError as exc:
                    codes.append(exc.code().name)
            assert codes == ["DEADLINE_EXCEEDED"] * 4 + ["RESOURCE_EXHAUSTED"] * 2
            resume()  # the engine drops the cancelled calls and says so: the room comes back

            def answered() -> bool:
                try:
                    return client.embed(["again"], model="tiny-embed", timeout=5).vectors.shape == (1, 48)
                except grpc.RpcError:
                    return False

            wait_for(answered, timeout=60)
    finally:
        server.kill()


def test_a_front_started_again_loads_the_versions_the_server_started_with(tiny_repo, tmp_path):
    """A version exported while the server runs is not what a front started again loads: the supervisor
    resolved every model's version once (else that front's models differ from its engine's, it exits at
    start, and after RESTARTS_PER_MINUTE tries the server stops)."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo / "tiny-embed", repo / "tiny-embed")
    server = ServerProcess("--model-repo", str(repo), "--model", "tiny-embed", "--workers", "2").start(
        timeout=120
    )
    try:
        first = pids(server)
        serving = re.compile(r"front 0 serving on")  # logged once its engine answered with the same models
        assert len(serving.findall(server.output)) == 1
        _copy_version(repo, "tiny-embed", repo / "tiny-embed" / "1", 2)  # a new version, complete
        os.kill(first["front-0"], signal.SIGKILL)
        wait_for(lambda: len(serving.findall(server.output)) == 2, timeout=60)
        assert pids(server)["engine"] == first["engine"] and server.process.poll() is None
        assert "the repository changed" not in server.output
        for _ in range(10):  # every connection, whichever front takes it, is served version 1
            with Client(server.address, timeout=30) as client:
                assert client.embed(TEXTS, model="tiny-embed").metadata.model_version == 1
    finally:
        server.kill()
