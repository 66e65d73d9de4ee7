"""`bertserve embed-file INPUT --out OUTPUT`: embed a corpus through EmbedStream, resumably.

INPUT holds one text per line, or JSON Lines with the text in `--field NAME`; `-` reads standard input.
OUTPUT.npy gets float32 [n, dimension] (numpy's format), OUTPUT.jsonl one `{"index": i, "embedding":
[...]}` per line (9 significant digits: float32 exactly); row i is the text on line i + 1.

Resuming: rows are appended to OUTPUT.part as they arrive (in input order), and after every batch a
small state file OUTPUT.part.json records how many rows and bytes are complete, the options and a
SHA-256 of the texts embedded so far. A job cut short (SIGKILL included) resumes when run again with the
same options: the data file is cut back to the recorded bytes, the first rows of INPUT are read (not
sent) and checked against the hash, and the stream starts at the next text. When done, the .npy header
gets its final shape and OUTPUT.part becomes OUTPUT.

Progress: a tqdm bar (inputs/s, ETA when the size is known) on a terminal; otherwise one line every
`--progress-every` seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np

from bertserve.client_stream import DEFAULT_BATCH_SIZE

STATE_VERSION = 1
INPUT_INDEX = re.compile(r"inputs\[(\d+)\]")  # how the server names an input of a request
NPY_HEADER_BYTES = 128  # fixed, so the final shape can be written over the placeholder in place
FORMATS = {".npy": "npy", ".jsonl": "jsonl"}


class JobError(Exception):
    """A one-line reason the job cannot go on (the progress made so far is kept)."""


# --- input -------------------------------------------------------------------------------------------


def read_texts(lines: Iterable[str], field: str | None) -> Iterator[str]:
    """One text per line: the line itself (without its line break), or the string `field` of a JSON object."""
    for number, line in enumerate(lines, 1):
        line = line.removesuffix("\n").removesuffix("\r")
        if field is None:
            yield line
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JobError(f"line {number}: not JSON ({exc.msg})") from None
        text = record.get(field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise JobError(f"line {number}: no string field {field!r}")
        yield text


def count_lines(path: Path) -> int:
    lines, last = 0, b"\n"
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


class TextHash:
    """SHA-256 of a sequence of texts (each length-prefixed, so the boundaries count)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def update(self, text: str) -> None:
        data = text.encode("utf-8", "surrogatepass")
        self._hash.update(len(data).to_bytes(8, "little") + data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


# --- output ------------------------------------------------------------------------------------------


def npy_header(rows: int, dimension: int) -> bytes:
    """numpy format 1.0 header for C-order little-endian float32 [rows, dimension], NPY_HEADER_BYTES long."""
    text = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dimension}), }}"
    size = NPY_HEADER_BYTES - 10
    return b"\x93NUMPY\x01\x00" + size.to_bytes(2, "little") + text.ljust(size - 1).encode() + b"\n"


def encode_rows(vectors: np.ndarray, first_index: int, fmt: str) -> bytes:
    if fmt == "npy":
        return np.ascontiguousarray(vectors, dtype="<f4").tobytes()
    lines = []
    for offset, row in enumerate(vectors.tolist()):
        values = ",".join(f"{v:.9g}" for v in row)
        lines.append(f'{{"index": {first_index + offset}, "embedding": [{values}]}}\n')
    return "".join(lines).encode()


class Job:
    """OUTPUT.part (the rows so far) and OUTPUT.part.json (what is complete, and with which options)."""

    def __init__(self, out: Path, options: dict):
        self.out, self.options = out, options
        self.fmt = FORMATS[out.suffix]
        self.data_path = out.with_name(out.name + ".part")
        self.state_path = out.with_name(out.name + ".part.json")
        self.rows, self.bytes, self.dimension, self.digest = 0, 0, None, TextHash().hexdigest()
        self.resumed_rows = 0  # rows complete when this run started
        self._file: BinaryIO | None = None

    def open(self, restart: bool) -> None:
        """Starts the job, or picks up a cut-short one (its data cut back to the last complete batch)."""
        if self.out.exists():
            raise JobError(f"{self.out} exists (a finished job); remove it first")
        if self.state_path.exists() and not restart:
            state = json.loads(self.state_path.read_text())
            if state.get("version") != STATE_VERSION or state.get("options") != self.options:
                raise JobError(
                    f"{self.state_path}: the cut-short job ran with {state.get('options')}; run it with the "
                    "same options, or pass --restart to start over"
                )
            self.rows, self.bytes, self.dimension = state["rows"], state["bytes"], state["dimension"]
            self.digest = state["inputs_sha256"]
            self._file = self.data_path.open("r+b")
            self._file.truncate(self.bytes)
            self._file.seek(self.bytes)
            self.resumed_rows = self.rows
            return
        self._file = self.data_path.open("wb")
        if self.fmt == "npy":
            self._file.write(npy_header(0, 0))
        self.bytes = self._file.tell()
        self._save_state()

    def append(self, vectors: np.ndarray, digest: str) -> None:
        """Appends a batch of rows (in input order), then records them as complete."""
        if self.dimension is None:
            self.dimension = int(vectors.shape[1])
        elif vectors.shape[1] != self.dimension:
            raise JobError(f"the server answered dimension {vectors.shape[1]}, the job has {self.dimension}")
        self._file.write(encode_rows(vectors, self.rows, self.fmt))
        self._file.flush()  # in the kernel before the state says so: a killed process loses nothing
        self.rows += len(vectors)
        self.bytes = self._file.tell()
        self.digest = digest
        self._save_state()

    def _save_state(self) -> None:
        state = {
            "version": STATE_VERSION,
            "options": self.options,
            "rows": self.rows,
            "bytes": self.bytes,
            "dimension": self.dimension,
            "inputs_sha256": self.digest,
        }
        temporary = self.state_path.with_name(self.state_path.name + ".tmp")
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self.state_path)

    def finish(self) -> None:
        if self.fmt == "npy":
            self._file.seek(0)
            self._file.write(npy_header(self.rows, self.dimension or 0))
        self._file.close()
        os.replace(self.data_path, self.out)
        self.state_path.unlink()

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()


# --- progress ----------------------------------------------------------------------------------------


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

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(self.line(time.monotonic()), file=sys.stderr, flush=True)


# --- the command ---------------------------------------------------------------------------------------


def _open_input(name: str) -> TextIO:
    if name == "-":
        return sys.stdin
    return open(name, encoding="utf-8", newline="")  # noqa: SIM115 (closed by run)


def _skip_done(texts: Iterator[str], job: Job) -> TextHash:
    """Reads the texts the job has already embedded and checks them against its hash."""
    hashed = TextHash()
    for _ in range(job.rows):
        text = next(texts, None)
        if text is None:
            raise JobError(f"INPUT has fewer texts than the {job.rows} already embedded; pass --restart")
        hashed.update(text)
    if hashed.hexdigest() != job.digest:
        raise JobError(f"INPUT's first {job.rows} texts differ from those already embedded; pass --restart")
    return hashed


def embed(args: argparse.Namespace, source: TextIO, job: Job) -> None:
    from bertserve.client import Client

    texts = read_texts(source, args.field)
    hashed = _skip_done(texts, job)
    total = count_lines(Path(args.input)) if args.input != "-" and Path(args.input).is_file() else None
    sent: deque[str] = deque()  # texts handed to the stream and not yet written, in order

    def feed() -> Iterator[str]:
        for text in texts:
            sent.append(text)
            yield text

    progress = Progress(total, job.rows, args.progress_every)
    try:
        with Client(args.address, timeout=args.timeout) as client:
            batches = client.embed_stream_batches(
                feed(),
                batch_size=args.batch_size,
                model=args.model,
                normalize=args.normalize,
                truncate=args.truncate,
            )
            for vectors in batches:
                for _ in range(len(vectors)):
                    hashed.update(sent.popleft())
                job.append(vectors, hashed.hexdigest())
                progress.update(len(vectors))
    finally:
        progress.close()


def run(args: argparse.Namespace) -> int:
    import grpc

    from bertserve.client_stream import StreamRequestError

    out = Path(args.out)
    if out.suffix not in FORMATS:
        print(f"bertserve embed-file: --out must end in {' or '.join(FORMATS)}", file=sys.stderr)
        return 2
    options = {
        "model": args.model,
        "normalize": args.normalize,
        "truncate": args.truncate,
        "field": args.field,
        "format": FORMATS[out.suffix],
    }
    job = Job(out, options)
    source = None
    try:
        job.open(args.restart)
        if job.rows:
            print(f"embed-file: resuming after {job.rows} rows already in {job.data_path}", file=sys.stderr)
        source = _open_input(args.input)
        embed(args, source, job)
        job.finish()
        print(f"embed-file: wrote {job.rows} x {job.dimension} float32 to {out}", file=sys.stderr)
        return 0
    except (JobError, OSError, json.JSONDecodeError) as exc:
        message = str(exc)
    except StreamRequestError as exc:
        message = f"{exc.code().name}: {_locate(exc.details(), job.resumed_rows + exc.first_input)}"
    except grpc.RpcError as exc:
        message = f"{exc.code().name}: {exc.details()}"
    finally:
        job.close()
        if source is not None and source is not sys.stdin:
            source.close()
    print(f"bertserve embed-file: {message}", file=sys.stderr)
    if job.state_path.exists():
        print(f"  {job.rows} rows kept in {job.data_path}; run the same command to resume", file=sys.stderr)
    return 1


def _locate(details: str, first_row: int) -> str:
    """A failed request's message with its `inputs[k]` named as the line of INPUT it came from."""
    found = INPUT_INDEX.match(details)
    if found is None:
        return f"the request from input line {first_row + 1}: {details}"
    return f"input line {first_row + int(found[1]) + 1}{details[found.end() :]}"


def register(subparsers) -> None:
    from bertserve.cli import describe

    parser = subparsers.add_parser(
        "embed-file",
        help=describe("embed-file"),
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument(
        "input", metavar="INPUT", help="text file, one text per line (JSON Lines with --field); - for stdin"
    )
    parser.add_argument(
        "--out", required=True, metavar="OUTPUT", help="OUTPUT.npy (float32 [n, dimension]) or OUTPUT.jsonl"
    )
    parser.add_argument("--field", help="INPUT is JSON Lines: the field holding each text")
    parser.add_argument(
        "--address",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="server address (default: 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--model", default="", help="model name (default: the server's default embedding model)"
    )
    parser.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="L2-normalize (default: the model's default)",
    )
    parser.add_argument(
        "--truncate", action="store_true", help="cut texts longer than max_length instead of failing"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"texts per stream request (default {DEFAULT_BATCH_SIZE}; at most half the server's "
        "max_stream_inputs_in_flight, 128 by default, so that two or more requests are in flight)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds for the whole job (default: none)"
    )
    parser.add_argument(
        "--restart", action="store_true", help="discard a cut-short job's progress and start over"
    )
    parser.add_argument("--progress-every", type=float, default=10.0, metavar="SECONDS", help="without a terminal: a progress line this often (default 10)")  # fmt: skip
    parser.set_defaults(run=run)
