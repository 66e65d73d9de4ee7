"""The server's threads carry names the operating system shows (service/thread_names.py), and the bench
ranks a phase's CPU by them (bench/process_tree.py)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bertserve.bench import process_tree
from bertserve.service.thread_names import name_this_thread, naming, thread_named


def _comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


def test_a_thread_is_named_and_a_long_name_cut_to_the_kernels_15_bytes():
    seen = {}

    def run() -> None:
        name_this_thread("bs-a-rather-long-thread-name")
        seen["tid"] = threading.get_native_id()
        seen["comm"] = _comm(seen["tid"])

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen["comm"] == "bs-a-rather-lon"


def test_threads_started_in_a_named_block_inherit_its_name_and_the_caller_gets_its_own_back():
    def run() -> tuple[str, str, str]:
        name_this_thread("bs-caller")
        with thread_named("bs-onnxruntime"):
            child = {}
            started = threading.Thread(target=lambda: child.update(comm=_comm(threading.get_native_id())))
            started.start()
            started.join()
            inside = _comm(threading.get_native_id())
        return inside, child["comm"], _comm(threading.get_native_id())

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(run).result(10) == ("bs-onnxruntime", "bs-onnxruntime", "bs-caller")


def test_an_executors_threads_are_named():
    with ThreadPoolExecutor(2, "test", naming("bs-test-pool")) as pool:
        assert pool.submit(lambda: _comm(threading.get_native_id())).result(10) == "bs-test-pool"


def test_the_busiest_thread_of_a_phase_is_ranked_first_by_its_name():
    stop = threading.Event()

    def spin() -> None:
        name_this_thread("bs-spinner")
        while not stop.is_set():
            pass

    before = process_tree.thread_cpu_seconds(os.getpid())
    spinner = threading.Thread(target=spin)
    started = time.perf_counter()
    spinner.start()
    time.sleep(0.5)
    after = process_tree.thread_cpu_seconds(os.getpid())  # a thread that ended is gone from /proc
    ranked = process_tree.busiest_threads(before, after, time.perf_counter() - started)
    stop.set()
    spinner.join()
    assert ranked[0]["thread"] == "bs-spinner"  # it held the GIL most of the half second
    assert ranked[0]["threads"] == 1 and 0.1 < ranked[0]["cores"] <= 1.2


def test_busiest_threads_groups_by_name_and_counts_only_the_phase():
    before = {(1, 1): ("bs-front-0", "event_engine", 5.0), (1, 2): ("bs-front-0", "event_engine", 1.0)}
    after = {
        (1, 1): ("bs-front-0", "event_engine", 6.0),
        (1, 2): ("bs-front-0", "event_engine", 2.0),
        (1, 3): ("bs-front-0", "bs-front-0", 1.0),  # started during the phase
        (2, 4): ("bs-engine", "bs-compute", 0.5),
    }
    ranked = process_tree.busiest_threads(before, after, seconds=2.0, top=2)
    assert ranked == [
        {"process": "bs-front-0", "thread": "event_engine", "threads": 2, "cores": 1.0},
        {"process": "bs-front-0", "thread": "bs-front-0", "threads": 1, "cores": 0.5},
    ]
