"""`bertserve serve --workers N` (N > 1): a supervisor, `engines` engine processes (1 by default) and N front
processes.

The supervisor claims the ports (service/supervisor/ports.py), starts the engines (the sessions and
batchers: service/engine/process.py) and the fronts (each a full gRPC + HTTP server whose core sends its
tokenized inputs to engine i % engines, i the front's index), then watches them:
- a front that dies after it was ready is started again; its callers saw their connections close
  (UNAVAILABLE), the other fronts' callers see nothing;
- an engine dying ends its fronts' calls in flight with UNAVAILABLE at once (the fronts notice the
  socket closing) and the supervisor stops every process and exits 1: the pod restarts;
- SIGTERM, SIGINT or SIGHUP: every front drains as one server does; then the engines stop; exit 0.
Children are spawned (no forked copies of the supervisor's state) and die with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from bertserve.service import metrics_multiprocess
from bertserve.service.engine import repository
from bertserve.service.engine.checked_files import CHECKED, Checked
from bertserve.service.errors import StartupError
from bertserve.service.settings import Settings
from bertserve.service.supervisor.ports import PortClaim
from bertserve.service.supervisor.scratch import ScratchDir
from bertserve.service.supervisor.serving import DRAIN_SIGNALS, configure_process, run_until_signalled
from bertserve.service.thread_names import name_this_thread

log = logging.getLogger("bertserve.supervisor")
RESTARTS_PER_MINUTE = 5  # a front failing faster than this is not restarted: the server exits 1
ENGINE_STOP_S = 10.0  # after the fronts drained: each engine finishes what is queued, then exits
FRONT_STOP_AFTER_GRACE_S = 5.0  # beyond the grace period: a front still running is killed


def _become_child(settings: Settings, parent: int, checked: Checked) -> None:
    """What the engine and every front do first; `checked`: the repository files the supervisor hashed,
    taken as checked while they stay as they were (service/engine/checked_files.py). Linux: the process
    gets SIGTERM when the supervisor (`parent`) dies, even by SIGKILL; if it died before this could be set,
    the process stops at once. Only the supervisor's SIGTERM stops a child: a terminal's SIGINT or SIGHUP
    reaches the whole process group, and the supervisor turns it into SIGTERMs in order (fronts first; the
    engine, which they need to finish their calls, last)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        raise SystemExit(1)
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    configure_process(settings, several=True)
    CHECKED.trust(checked)


def _engine_main(settings: Settings, address: str, parent: int, checked: Checked, all_warm) -> None:
    from bertserve.service.engine import process

    _become_child(settings, parent, checked)
    raise SystemExit(process.main(settings, address, all_warm))


def _front_main(
    settings: Settings, address: str, index: int, ready: Connection, parent: int, checked: Checked
) -> None:
    from bertserve.service.supervisor.server import FrontRole

    _become_child(settings, parent, checked)
    name_this_thread(f"bs-front-{index}")  # its loop: the protocols, tokenization, replies
    role = FrontRole(address, index)
    main = run_until_signalled(settings, role, lambda: ready.send(index), (signal.SIGTERM,))
    raise SystemExit(asyncio.run(main))


def pinned_models(settings: Settings) -> Settings:
    """`settings` with `models` as NAME:VERSION, each version resolved here once (the newest complete, as a
    process would), so every engine and every front, one started again included, loads the same versions
    however the repository changes while the server runs."""
    found = repository.discover(settings.model_repo, settings.model_specs(), settings.precision)
    return settings.model_copy(update={"models": [f"{files.name}:{files.version}" for files in found]})


class Supervisor:
    def __init__(self, settings: Settings, workers: int):
        self.settings = settings = pinned_models(settings)
        self.workers = workers
        self._context = multiprocessing.get_context("spawn")
        self._claims: list[PortClaim] = []
        self._scratch = ScratchDir("run")  # 0700: only this user reaches the engine
        self._run_dir = self._scratch.path
        # "engine" alone, else engine-0, engine-1, ...: the processes' names and their Unix sockets' files
        count = settings.engines
        self.engine_names = ["engine"] if count == 1 else [f"engine-{k}" for k in range(count)]
        self.addresses = [f"{self._run_dir}/{name}" for name in self.engine_names]
        # several engines listen only once all are warm (an engine stopped before then breaks it)
        self._all_warm = self._context.Barrier(count) if count > 1 else None
        self._metrics_dir = f"{self._run_dir}/metrics"  # every child's metric files (one scrape)
        self._metrics_server = None
        self.engines: dict[str, BaseProcess] = {}
        self.fronts: dict[int, BaseProcess] = {}
        self._restarts: list[float] = []
        self._ready: set[int] = set()  # fronts that served once
        self._ready_receiver, self._ready_sender = self._context.Pipe(duplex=False)
        self.metrics_port: int | None = None
        self._draining = False
        self._failed = asyncio.Event()

    def claim_ports(self) -> Settings:
        """The fronts' settings: the claimed ports' real numbers; no metrics port of their own."""
        s = self.settings
        ports = {"port": s.port, "http_port": s.http_port, "native_port": s.native_port}
        update = {"metrics_port": -1, "workers": 1}
        for setting, port in ports.items():
            if port >= 0:
                claim = PortClaim(setting, s.host, port)
                self._claims.append(claim)
                update[setting] = claim.port
        return s.model_copy(update=update)

    def _serve_metrics(self) -> None:
        """/metrics of every process, on metrics_port; children write to the directory from their start."""
        os.mkdir(self._metrics_dir, 0o700)
        os.environ[metrics_multiprocess.ENV] = self._metrics_dir  # inherited by every child it spawns
        s = self.settings
        if s.metrics_port < 0:
            return
        try:
            self._metrics_server = metrics_multiprocess.serve_aggregated(
                self._metrics_dir, s.host, s.metrics_port, self._children
            )
        except OSError as exc:
            raise StartupError(
                f"setting metrics_port: cannot listen on {s.host}:{s.metrics_port}: {exc}"
            ) from None
        self.metrics_port = self._metrics_server.port

    def _children(self) -> dict[str, int]:
        live = {**self.engines, **{f"front-{i}": p for i, p in self.fronts.items()}}
        return {name: p.pid for name, p in live.items() if p is not None and p.is_alive()}

    def _start(self, name: str, target, *args) -> BaseProcess:
        process = self._context.Process(target=target, args=args, name=name, daemon=False)
        process.start()
        asyncio.get_running_loop().add_reader(process.sentinel, self._exited, process)
        log.info("started %s, pid %d", name, process.pid)
        return process

    def _start_front(self, settings: Settings, index: int) -> None:
        self.fronts[index] = self._start(
            f"front-{index}", _front_main, settings, self.addresses[index % len(self.addresses)], index,
            self._ready_sender, os.getpid(), CHECKED.export(),
        )  # fmt: skip

    def _front_ready(self) -> None:
        index = self._ready_receiver.recv()
        if index in self._ready:
            return  # started again after it died
        self._ready.add(index)
        if len(self._ready) == self.workers:
            s = self._front_settings
            metrics = f"http://{s.host}:{self.metrics_port}/metrics" if self.metrics_port else "(off)"
            log.info("serving bertserve.v1.Inference on %s:%d, metrics on %s", s.host, s.port, metrics)

    def _exited(self, process: BaseProcess) -> None:
        asyncio.get_running_loop().remove_reader(process.sentinel)
        process.join()
        metrics_multiprocess.mark_dead(process.pid, self._metrics_dir)
        if self._draining:
            return
        if process in self.engines.values():
            log.error("the %s process exited (code %s): stopping the server", process.name, process.exitcode)
            self._failed.set()
            return
        index = next(i for i, p in self.fronts.items() if p is process)
        if index not in self._ready:
            log.error("front %d exited (code %s) before it served: stopping", index, process.exitcode)
            self._failed.set()
            return
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < 60] + [now]
        if len(self._restarts) > RESTARTS_PER_MINUTE:
            log.error("front %d exited (code %s), too often: stopping the server", index, process.exitcode)
            self._failed.set()
            return
        log.warning("front %d exited (code %s): starting it again", index, process.exitcode)
        self._start_front(self._front_settings, index)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in DRAIN_SIGNALS:
            loop.add_signal_handler(signum, stop.set)
        self._front_settings = self.claim_ports()
        self._serve_metrics()
        loop.add_reader(self._ready_receiver.fileno(), self._front_ready)
        if self.workers % len(self.addresses):
            log.warning(
                "%d fronts over %d engines: engine-0 is fed by more fronts than the last (the kernel spreads "
                "connections over fronts, not engines); make workers a multiple of engines",
                self.workers, len(self.addresses),
            )  # fmt: skip
        for name, address in zip(self.engine_names, self.addresses, strict=True):
            self.engines[name] = self._start(
                name, _engine_main, self.settings, address, os.getpid(), CHECKED.export(), self._all_warm
            )
        for index in range(self.workers):
            self._start_front(self._front_settings, index)
        s = self._front_settings
        log.info(
            "supervising %d fronts on gRPC port %s, HTTP port %s, native port %s; %s at %s",
            self.workers, s.port, s.http_port, s.native_port, ", ".join(self.engine_names), self._run_dir,
        )  # fmt: skip
        waits = [asyncio.ensure_future(e.wait()) for e in (stop, self._failed)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        failed = self._failed.is_set()
        clean = await self._stop(drain=not failed)
        return 0 if clean and not failed else 1

    async def _stop(self, drain: bool) -> bool:
        """Fronts first (each drains within the grace period), then the engines. True when every one of
        them stopped by itself, with exit code 0."""
        self._draining = True
        fronts = [p for p in self.fronts.values() if p.is_alive()]
        for process in fronts:
            process.terminate()  # SIGTERM: the front drains
        limit = self.settings.grace_period_s + FRONT_STOP_AFTER_GRACE_S if drain else FRONT_STOP_AFTER_GRACE_S
        clean = await _wait_for(fronts, limit)
        engines = [p for p in self.engines.values() if p.is_alive()]
        for process in engines:
            process.terminate()
        clean = await _wait_for(engines, ENGINE_STOP_S) and clean
        for claim in self._claims:
            claim.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        self._scratch.remove()
        return clean


async def _wait_for(processes: list[BaseProcess], seconds: float) -> bool:
    """Waits until every process exited; kills those left after `seconds`. True when none had to be
    killed and each exited with code 0."""
    deadline = time.monotonic() + seconds
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    clean = True
    for process in processes:
        if process.is_alive():
            log.error("%s did not stop in time: killed", process.name)
            process.kill()
        process.join()
        if process.exitcode != 0:
            log.error("%s exited with code %s", process.name, process.exitcode)
            clean = False
    return clean


def supervise(settings: Settings, workers: int) -> int:
    """Runs the server as `workers` fronts and `engines` engines until a drain signal; the exit code."""

    async def main() -> int:
        try:
            supervisor = Supervisor(settings, workers)
            return await supervisor.run()
        except StartupError as exc:
            log.error("cannot start: %s", exc)
            return 1

    return asyncio.run(main())
