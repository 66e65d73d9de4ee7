"""What the bench ran on, recorded with every result."""

from __future__ import annotations

import contextlib
import os
import platform
from importlib import metadata
from pathlib import Path

import psutil


def describe_machine(threads: int) -> dict:
    """CPU, cores, memory, library versions, and the load average before the bench starts anything."""
    cpu = platform.processor()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    versions = {}
    for package in (
        "onnxruntime",
        "onnxruntime-gpu",
        "torch",
        "transformers",
        "tokenizers",
        "grpcio",
        "numpy",
        "bertserve",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    import onnxruntime

    # the module this process imports: with both onnxruntime and onnxruntime-gpu installed (they conflict),
    # the distributions' metadata alone does not say which one runs
    versions["onnxruntime (imported)"] = onnxruntime.__version__
    return {
        "cpu": cpu, "logical_cores": psutil.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
        "memory_gib": psutil.virtual_memory().total / 2**30, "platform": platform.platform(),
        "python": platform.python_version(), "threads": threads, "versions": versions,
        "load_average_at_start": os.getloadavg(),  # 1, 5, 15 minutes, before the bench starts anything
    }  # fmt: skip
