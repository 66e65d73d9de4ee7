"""CPU time of a process and all its descendants, read from /proc/<pid>/stat (Linux).

A server of several processes (a supervisor, an engine, fronts) spends its CPU in all of them: each live
process's utime + stime, plus cutime + cstime, the CPU of its children that ended and were waited for
(a front that was restarted still counts, in its parent's figure).
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _fields(stat: Path) -> list[str]:
    """A /proc stat file's fields after its name (state, ppid, ... utime stime cutime cstime ...): the name
    may hold spaces and parentheses. OSError when its process or thread is gone."""
    text = stat.read_text()
    return text[text.rindex(")") + 2 :].split()


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of it and its waited-for children), or None for a process that is gone."""
    try:
        fields = _fields(PROC / str(pid) / "stat")
    except OSError:
        return None
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return int(fields[1]), ticks / TICKS_PER_S


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    parents = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = stat[0]
    return parents


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, and so on (live ones)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    return [pid, *descendants(pid)]


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of `pid` and every descendant so far (None when `pid` is gone)."""
    root = _stat(pid)
    if root is None:
        return None
    return root[1] + sum(stat[1] for child in descendants(pid) if (stat := _stat(child)) is not None)


def thread_cpu_seconds(pid: int) -> dict[tuple[int, int], tuple[str, str, float]]:
    """(pid, tid) -> (the process's name, the thread's name, its user + system CPU seconds so far), for every
    thread of `pid` and its descendants (the server names its threads: service/thread_names.py)."""
    threads = {}
    for process in tree(pid):
        try:
            name = (PROC / str(process) / "comm").read_text().strip()
            tasks = list((PROC / str(process) / "task").iterdir())
        except OSError:
            continue  # gone
        for task in tasks:
            try:
                thread = (task / "comm").read_text().strip()
                fields = _fields(task / "stat")
            except OSError:
                continue
            seconds = (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime
            threads[(process, int(task.name))] = (name, thread, seconds)
    return threads


def busiest_threads(before: dict, after: dict, seconds: float, top: int = 5) -> list[dict]:
    """The CPU between two `thread_cpu_seconds` reads, by (process name, thread name), in cores kept busy,
    busiest first: which threads a phase's server CPU went to (a thread that ended meanwhile is left out)."""
    cores: dict[tuple[str, str], list] = {}
    for key, (process, thread, now) in after.items():
        spent = now - before.get(key, (process, thread, 0.0))[2]
        group = cores.setdefault((process, thread), [0.0, 0])
        group[0] += spent / seconds
        group[1] += 1
    ranked = sorted(cores.items(), key=lambda item: -item[1][0])[:top]
    return [
        {"process": process, "thread": thread, "threads": count, "cores": busy}
        for (process, thread), (busy, count) in ranked
    ]
