"""How a thread that waits for the GPU waits (setting `cuda_sync`): the flags of the device's primary CUDA
context, which ONNX Runtime's CUDA provider uses, set through the CUDA driver before any session exists.

CUDA's default ("auto") spins while the GPU computes when the machine has more cores than GPUs: each
instance's inference thread then keeps a core busy for the whole of every batch. "blocking" makes it sleep
until the GPU is done (a wake-up's latency per batch); "yield" spins but yields its core; "spin" always
spins. Nothing is set for "auto" or where no CUDA driver is present (a CPU machine).
"""

from __future__ import annotations

import ctypes
import logging

from bertserve.service.engine.runtime import CPU, providers_for

log = logging.getLogger(__name__)

DRIVER = "libcuda.so.1"
FLAGS = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}  # CU_CTX_SCHED_*


def apply(mode: str, device: int = 0, driver: str = DRIVER) -> str | None:
    """Sets `device`'s primary context to `mode` (before the context is made: call it before the first CUDA
    session). Returns why it was not set (no driver, a driver error), None when set or nothing to set."""
    if FLAGS[mode] == 0:
        return None
    try:
        cuda = ctypes.CDLL(driver)
    except OSError:
        return f"no CUDA driver ({driver})"
    handle = ctypes.c_int()
    names = ("cuDevicePrimaryCtxSetFlags_v2", "cuDevicePrimaryCtxSetFlags")
    set_flags = next((getattr(cuda, n) for n in names if hasattr(cuda, n)), None)
    if set_flags is None:
        return f"{driver} has no cuDevicePrimaryCtxSetFlags"
    for step, call in (
        ("cuInit", lambda: cuda.cuInit(0)),
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(handle), device)),
        ("cuDevicePrimaryCtxSetFlags", lambda: set_flags(handle, FLAGS[mode])),
    ):
        if (code := call()) != 0:
            return f"{step} failed (CUresult {code})"
    log.info("CUDA device %d: its threads wait for the GPU by %s (cuda_sync)", device, mode)
    return None


def configure(mode: str, provider: str) -> None:
    """`apply(mode)` where this ONNX Runtime would make CUDA sessions under `provider`, with a warning when
    it could not be set for `provider` cuda (auto: a machine may have no driver, which is no news)."""
    if providers_for(provider) == [CPU]:  # no CUDA session will be made
        return
    if (why := apply(mode)) is not None:
        level = logging.WARNING if provider == "cuda" else logging.DEBUG
        log.log(level, "cuda_sync %s not set: %s", mode, why)
