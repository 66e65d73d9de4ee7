"""The files of a `bertserve embed-file` job: OUTPUT.part (the rows so far), OUTPUT.part.json (what is
complete, with which options), OUTPUT.part.skipped.jsonl (the lines skipped so far); and its progress.

Row i is line i + 1 of INPUT, always: a skipped line's row is NaN in .npy and `"embedding": null` with
`"skipped": REASON` in .jsonl, and the line is listed (`{"line": N, "reason": ...}`) in
OUTPUT.skipped.jsonl, which is left only when a line was skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np

STATE_VERSION = 2  # 2: the hash covers the lines' bytes, skipped lines are recorded
NPY_HEADER_BYTES = 128  # fixed, so the final shape can be written over the placeholder in place
FORMATS = {".npy": "npy", ".jsonl": "jsonl"}


class JobError(Exception):
    """A one-line reason the job cannot go on (the progress made so far is kept)."""


class LinesHash:
    """SHA-256 over the digests of a sequence of lines (embed_file_input.Line.digest)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def update(self, digest: bytes) -> None:
        self._hash.update(digest)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def npy_header(rows: int, dimension: int) -> bytes:
    """numpy format 1.0 header for C-order little-endian float32 [rows, dimension], NPY_HEADER_BYTES long."""
    text = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dimension}), }}"
    size = NPY_HEADER_BYTES - 10
    return b"\x93NUMPY\x01\x00" + size.to_bytes(2, "little") + text.ljust(size - 1).encode() + b"\n"


def encode_rows(vectors: np.ndarray, first_index: int, fmt: str, skipped: dict[int, str]) -> bytes:
    """The rows' bytes; `skipped`: row within `vectors` -> why its line was skipped (its row is NaN)."""
    if fmt == "npy":
        return np.ascontiguousarray(vectors, dtype="<f4").tobytes()
    lines = []
    for offset, row in enumerate(vectors.tolist()):
        if offset in skipped:
            reason = json.dumps(skipped[offset])
            lines.append(f'{{"index": {first_index + offset}, "embedding": null, "skipped": {reason}}}\n')
            continue
        values = ",".join(f"{v:.9g}" for v in row)
        lines.append(f'{{"index": {first_index + offset}, "embedding": [{values}]}}\n')
    return "".join(lines).encode()


class Job:
    """OUTPUT.part, OUTPUT.part.skipped.jsonl and OUTPUT.part.json (what is complete, with which options)."""

    def __init__(self, out: Path, options: dict):
        self.out, self.options = out, options
        self.fmt = FORMATS[out.suffix]
        self.data_path = out.with_name(out.name + ".part")
        self.state_path = out.with_name(out.name + ".part.json")
        self.skipped_part = out.with_name(out.name + ".part.skipped.jsonl")
        self.skipped_path = out.with_name(out.name + ".skipped.jsonl")
        self.rows, self.bytes, self.dimension, self.digest = 0, 0, None, LinesHash().hexdigest()
        self.skipped, self.skipped_bytes = 0, 0
        self.resumed_rows = 0  # rows complete when this run started
        self._file: BinaryIO | None = None
        self._skipped_file: BinaryIO | None = None

    def open(self, restart: bool) -> None:
        """Starts the job, or picks up a cut-short one (its files cut back to the last complete batch)."""
        if self.out.exists():
            raise JobError(f"{self.out} exists (a finished job); remove it first")
        if self.state_path.exists() and not restart:
            state = json.loads(self.state_path.read_text())
            if state.get("version") != STATE_VERSION:
                raise JobError(
                    f"{self.state_path}: written by another version of embed-file; pass --restart to start over"
                )
            if state.get("options") != self.options:
                raise JobError(
                    f"{self.state_path}: the cut-short job ran with {state.get('options')}; run it with the "
                    "same options, or pass --restart to start over"
                )
            self.rows, self.bytes, self.dimension = state["rows"], state["bytes"], state["dimension"]
            self.skipped, self.skipped_bytes = state["skipped"], state["skipped_bytes"]
            self.digest = state["inputs_sha256"]
            self._file = self.data_path.open("r+b")
            self._file.truncate(self.bytes)
            self._file.seek(self.bytes)
            self._skipped_file = self.skipped_part.open("r+b" if self.skipped_part.exists() else "w+b")
            self._skipped_file.truncate(self.skipped_bytes)
            self._skipped_file.seek(self.skipped_bytes)
            self.resumed_rows = self.rows
            return
        self._file = self.data_path.open("wb")
        self._skipped_file = self.skipped_part.open("wb")
        if self.fmt == "npy":
            self._file.write(npy_header(0, 0))
        self.bytes = self._file.tell()
        self._save_state()

    def set_dimension(self, dimension: int) -> None:
        if self.dimension is None:
            self.dimension = dimension
        elif dimension != self.dimension:
            raise JobError(f"the server answered dimension {dimension}, the job has {self.dimension}")

    def append(self, vectors: np.ndarray, skipped: dict[int, tuple[int, str]], digest: str) -> None:
        """Appends rows in line order (`skipped`: row within `vectors` -> (line number, reason) of a
        skipped line, whose row is NaN), then records them as complete."""
        self.set_dimension(int(vectors.shape[1]))
        reasons = {row: reason for row, (_, reason) in skipped.items()}
        self._file.write(encode_rows(vectors, self.rows, self.fmt, reasons))
        if skipped:
            listed = "".join(
                json.dumps({"line": line, "reason": reason}) + "\n" for line, reason in skipped.values()
            )
            self._skipped_file.write(listed.encode())
            self._skipped_file.flush()
        self._file.flush()  # in the kernel before the state says so: a killed process loses nothing
        self.rows += len(vectors)
        self.bytes = self._file.tell()
        self.skipped += len(skipped)
        self.skipped_bytes = self._skipped_file.tell()
        self.digest = digest
        self._save_state()

    def _save_state(self) -> None:
        state = {
            "version": STATE_VERSION,
            "options": self.options,
            "rows": self.rows,
            "bytes": self.bytes,
            "dimension": self.dimension,
            "skipped": self.skipped,
            "skipped_bytes": self.skipped_bytes,
            "inputs_sha256": self.digest,
        }
        temporary = self.state_path.with_name(self.state_path.name + ".tmp")
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self.state_path)

    def finish(self) -> None:
        if self.fmt == "npy":
            self._file.seek(0)
            self._file.write(npy_header(self.rows, self.dimension or 0))
        self.close()
        if self.skipped:
            os.replace(self.skipped_part, self.skipped_path)
        else:
            self.skipped_part.unlink(missing_ok=True)
        os.replace(self.data_path, self.out)
        self.state_path.unlink()

    def close(self) -> None:
        for file in (self._file, self._skipped_file):
            if file is not None and not file.closed:
                file.close()


class Progress:
    """A tqdm bar on a terminal; otherwise a line every `every` seconds (and at the end)."""

    def __init__(self, total: int | None, done: int, every: float):
        self.total, self.done, self.every = total, done, every
        self.started, self.start_done = time.monotonic(), done
        self.last_line = self.started
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit="inputs", unit_scale=True, smoothing=0.1)

    def update(self, count: int) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
            return
        now = time.monotonic()
        if now - self.last_line >= self.every:
            self.last_line = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        rate = (self.done - self.start_done) / max(now - self.started, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        eta = ""
        if self.total is not None and rate > 0:
            eta = f", ETA {max(self.total - self.done, 0) / rate:.0f} s"
        return f"embed-file: {self.done}{of} inputs, {rate:.0f} inputs/s{eta}"

    def close(self, finished: bool) -> None:
        """Ends the bar; without a terminal, a last progress line when the job `finished`."""
        if self.bar is not None:
            self.bar.close()
        elif finished:
            print(self.line(time.monotonic()), file=sys.stderr, flush=True)
