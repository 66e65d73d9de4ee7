"""Names the operating system shows for this process's threads (Linux: `top -H`, `ps -L`, /proc's `comm`),
so an operator, or the bench, can tell where the CPU goes: the engine's compute threads from a front's loop,
the tokenizers from gRPC's own threads. Python 3.11 names its threads for itself only."""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

_PR_SET_NAME = 15  # prctl(2): the calling thread's name, at most 15 bytes
_MAX_BYTES = 15


@functools.cache
def _prctl() -> Callable[..., int] | None:
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl  # the C library this process already has
    return None


def name_this_thread(name: str) -> None:
    """The calling thread's name (cut to 15 bytes); nothing where prctl is missing (not Linux)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_NAME, name.encode()[:_MAX_BYTES], 0, 0, 0)


@contextlib.contextmanager
def thread_named(name: str) -> Iterator[None]:
    """The calling thread named `name` for the block, then as before: threads started within (by a library)
    inherit `name`. Nothing where the thread's name cannot be read back (it could not be restored)."""
    try:
        before = Path("/proc/thread-self/comm").read_text().strip()
    except OSError:
        yield
        return
    name_this_thread(name)
    try:
        yield
    finally:
        name_this_thread(before)


def naming(name: str) -> Callable[[], None]:
    """An `initializer` for a ThreadPoolExecutor whose threads get `name`."""
    return functools.partial(name_this_thread, name)
