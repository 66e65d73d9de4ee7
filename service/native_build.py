"""Builds a C++ source, against the libraries pkg-config names (gRPC's C++ library by default), into a cache
keyed by the source's hash: the native gRPC transport, the plain-text WordPiece, the bench's native load
generators. Needs a C++ compiler, and for gRPC pkg-config and its C++ library (Debian: g++ pkg-config
libgrpc++-dev; scripts/system-packages.sh installs them)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


class NativeUnavailable(RuntimeError):
    """The native code cannot be built here (the message says what is missing)."""


def cache_dir() -> Path:
    """Where built binaries live: $BERTSERVE_CACHE_DIR, else $XDG_CACHE_HOME/bertserve or ~/.cache/bertserve."""
    explicit = os.environ.get("BERTSERVE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertserve"


def cached(source: Path, name: str, suffix: str = "") -> Path:
    """Where `name` built from `source` is cached (keyed by the hash of the source and the headers beside it,
    which it may include)."""
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):
        digest.update(header.read_bytes())
    return cache_dir() / f"{name}-{digest.hexdigest()[:16]}{suffix}"


def built(
    source: Path,
    target: Path,
    works: Callable[[Path], bool],
    shared: bool = False,
    packages: Sequence[str] = ("grpc++",),
) -> Path:
    """`target` compiled from `source` unless a cached one `works` (one built against a gRPC library since
    removed or upgraded is built again); `shared`: a shared library, not a program; `packages`: what
    pkg-config gives the flags of."""
    if works(target):
        return target
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise NativeUnavailable("no C++ compiler (Debian: g++)")
    libraries = []
    if packages:
        if not shutil.which("pkg-config"):
            raise NativeUnavailable("no pkg-config (Debian: pkg-config libgrpc++-dev)")
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", *packages], capture_output=True, text=True, check=False
        )
        if flags.returncode != 0:
            raise NativeUnavailable("gRPC's C++ library is not installed (Debian: libgrpc++-dev)")
        libraries = flags.stdout.split()
    kind = ["-shared", "-fPIC"] if shared else []
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            made = Path(scratch) / target.name
            command = [
                compiler,
                "-O2",
                "-std=c++17",
                *kind,
                str(source),
                "-o",
                str(made),
                *libraries,
            ]
            compiled = subprocess.run(command, capture_output=True, text=True, check=False)
            if compiled.returncode != 0:
                raise NativeUnavailable(f"compiling {source.name} failed: {compiled.stderr.strip()[-2000:]}")
            os.replace(made, target)  # atomic: a concurrent build leaves one complete file
    except OSError as error:  # an unwritable cache, a compiler that cannot start
        raise NativeUnavailable(f"cannot build in {target.parent}: {error}") from None
    if not works(target):
        raise NativeUnavailable(f"{target.name} was built but does not load (its libraries?)")
    return target
