"""The simulated-device target's parts: the CPU of a server's whole process tree, and a workers value the
server refuses costing a note, not the run (the end-to-end run is in tests/test_bench.py)."""

from __future__ import annotations

import asyncio
import sys
import textwrap

from bertserve.bench import simulated_device
from bertserve.bench.loadgen import Request
from bertserve.bench.processes import ServerProcess

BURN_S = 0.3  # CPU each grandchild spends
TICK_S = 0.01  # the kernel's CPU figures come in clock ticks

# A child that, once told, starts two grandchildren that each burn BURN_S of CPU: one ends and is waited
# for by the child, the other stays alive. It prints the CPU they report, then waits for its stdin to close.
CHILD = textwrap.dedent(f"""
    import subprocess, sys
    burn = (
        "import sys, time\\n"
        "start = time.process_time()\\n"
        "while time.process_time() - start < {BURN_S}: pass\\n"
        "print(time.process_time(), flush=True)\\n"
        "sys.stdin.read()\\n"
    )
    sys.stdin.readline()
    ended = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    alive = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    spent = float(ended.stdout.readline()) + float(alive.stdout.readline())
    ended.wait()
    print(spent, flush=True)
    sys.stdin.read()
    alive.stdin.close()
    alive.wait()
""")


def test_server_cpu_counts_every_descendant_live_or_ended(tmp_path):
    async def measure() -> tuple[float, float, int]:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        server = ServerProcess("tree", [], 0, tmp_path / "log", process=child)
        try:
            before = server.cpu_seconds()
            child.stdin.write(b"go\n")
            await child.stdin.drain()
            spent = float(await asyncio.wait_for(child.stdout.readline(), 120))
            after, processes = server.cpu_seconds(), server.processes()
        finally:
            child.stdin.close()
            await asyncio.wait_for(child.wait(), 60)
        return after - before, spent, processes

    tree_cpu, spent, processes = asyncio.run(measure())
    assert processes == 2  # the child and its live grandchild (the other ended and was waited for)
    assert spent >= 2 * BURN_S
    # both grandchildren's CPU, the live one's and the ended one's (in its parent's waited-for figure)
    assert tree_cpu >= spent - 3 * TICK_S


def test_a_workers_value_the_server_refuses_is_skipped_with_a_note(tiny_repo, tmp_path):
    notes: list[str] = []
    result = asyncio.run(
        simulated_device.measure(
            tiny_repo,
            "tiny-embed",
            "tiny-embed",
            [Request(["a"], 3, 0.0)],
            {"max_batch_size": "0"},
            1.0,
            10,
            1,
            tmp_path / "logs",
            5.0,
            lambda _: None,
            None,
            notes,
            workers_values=("1",),
        )  # fmt: skip
    )
    (row,) = result["workers"].values()
    assert "max_batch_size" in row["skipped"] and notes == [f"simulated-device: {row['skipped']}"]
    assert result["front_cpu_ms_per_call"] is None and result["two_vs_one_worker"] is None
