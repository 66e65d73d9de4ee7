"""Handing freed heap memory back to the kernel.

glibc's malloc keeps memory that was freed (in every thread's arena) for later use, so after one large
request the process's RSS stays near its peak although nothing uses it. `malloc_trim(0)` returns those
free pages. Elsewhere than glibc (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Blocking (a few milliseconds per hundred MB of heap); ctypes releases the GIL during the call."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
