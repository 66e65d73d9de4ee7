"""`bertserve embed-file INPUT --out OUTPUT`: embed a corpus through EmbedStream, resumably.

INPUT holds one text per line, or JSON Lines with the text in `--field NAME`; `-` reads standard input.
A line ends at \\n (the \\r of a \\r\\n goes with it; any other \\r is text). OUTPUT.npy gets float32
[lines, dimension] (numpy's format), OUTPUT.jsonl one `{"index": i, "embedding": [...]}` per line
(9 significant digits: float32 exactly); row i is line i + 1 of INPUT.

A bad line (not UTF-8, empty or whitespace-only, over the server's max_input_chars without --truncate,
a JSON Lines record without the field, or refused by the server) stops the job with one line naming
the file, the line and why (--on-bad-line fail, the default): fix the line, or pass --on-bad-line
skip, and run the command again to resume there. With --on-bad-line skip its row is NaN (null in
.jsonl) and the line is listed with its reason in OUTPUT.skipped.jsonl. With --truncate, texts over
max_input_chars (asked from the server) are cut to it, and texts over max_length tokens by the server.

Resuming: rows are appended to OUTPUT.part as they arrive (in input order), and after every batch a
small state file OUTPUT.part.json records how many rows and bytes are complete, the options and a
SHA-256 of the lines done so far. A job cut short (SIGKILL or Ctrl-C included) resumes when run again
with the same options: the data file is cut back to the recorded bytes, the first lines of INPUT are
read (not sent) and checked against the hash, and the stream starts at the next line. When done, the
.npy header gets its final shape and OUTPUT.part becomes OUTPUT.

Progress: a tqdm bar (inputs/s, ETA when the size is known) on a terminal; otherwise one line every
`--progress-every` seconds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bertserve.client_stream import DEFAULT_BATCH_SIZE
from bertserve.commands.embed_file_input import Line, count_lines, read_lines
from bertserve.commands.embed_file_job import FORMATS, Job, JobError, LinesHash, Progress

INPUT_INDEX = re.compile(r"inputs\[(\d+)\]: ?")  # how the server names an input of a request
POLICIES = ("fail", "skip")


class BadLine(Exception):
    """A line the job cannot embed, with --on-bad-line fail."""

    def __init__(self, line: Line):
        super().__init__(line.problem)
        self.line = line


class Lines:
    """INPUT's lines, after the lines of a stream that ended on a refused line (`replay`)."""

    def __init__(self, source: Iterator[Line]):
        self.source = source
        self.replay: deque[Line] = deque()

    def __iter__(self) -> Lines:
        return self

    def __next__(self) -> Line:
        return self.replay.popleft() if self.replay else next(self.source)


class Feed:
    """The lines handed to one stream: their texts go to the server, and every line (a skipped one too)
    waits in `pending`, in order, until its row is written. `close()` stops the feed between two lines,
    so that a stream ended early can be started again from its pending lines."""

    def __init__(self, lines: Iterator[Line], policy: str):
        self.lines, self.policy = lines, policy
        self.pending: deque[Line] = deque()
        self.bad: Line | None = None  # with --on-bad-line fail: the line that ended the input
        self._lock = threading.Lock()
        self._closed = False

    def texts(self) -> Iterator[str]:  # consumed by gRPC's request thread
        while True:
            with self._lock:
                line = None if self._closed else next(self.lines, None)
                if line is None:
                    return
                if line.problem is not None and self.policy == "fail":
                    self.bad = line
                    return
                self.pending.append(line)
            if line.problem is None:
                yield line.text

    def close(self) -> list[Line]:
        """Stops the feed; the lines read and not yet written."""
        with self._lock:
            self._closed = True
            return list(self.pending)


def _skip_done(lines: Iterator[Line], job: Job) -> LinesHash:
    """Reads the lines the job has already done and checks them against its hash."""
    hashed = LinesHash()
    for _ in range(job.rows):
        line = next(lines, None)
        if line is None:
            raise JobError(f"INPUT has fewer lines than the {job.rows} already done; pass --restart")
        hashed.update(line.digest)
    if hashed.hexdigest() != job.digest:
        raise JobError(f"INPUT's first {job.rows} lines differ from those already done; pass --restart")
    return hashed


def _write(job: Job, feed: Feed, hashed: LinesHash, vectors: np.ndarray | None) -> int:
    """Writes the rows of `vectors` (None: the end of the input), with the skipped lines before each and
    (at the end) after the last; returns how many rows."""
    count = 0 if vectors is None else len(vectors)
    rows: list[np.ndarray | None] = []
    skipped: dict[int, tuple[int, str]] = {}
    for index in range(count + 1):
        while feed.pending and feed.pending[0].problem is not None:
            line = feed.pending.popleft()
            skipped[len(rows)] = (line.number, line.problem)
            rows.append(None)
            hashed.update(line.digest)
        if index < count:
            hashed.update(feed.pending.popleft().digest)
            rows.append(vectors[index])
    if not rows:
        return 0
    if vectors is not None:
        job.set_dimension(int(vectors.shape[1]))
    block = np.full((len(rows), job.dimension), np.nan, dtype=np.float32)
    for index, row in enumerate(rows):
        if row is not None:
            block[index] = row
    job.append(block, skipped, hashed.hexdigest())
    return len(rows)


def _refused_line(exc, pending: list[Line]) -> tuple[Line, str] | None:
    """The line a failed stream request names (`inputs[k]: why`), found among the pending lines."""
    from bertserve.client_stream import StreamRequestError

    found = INPUT_INDEX.match(exc.details()) if isinstance(exc, StreamRequestError) else None
    if found is None or exc.code().name != "INVALID_ARGUMENT":
        return None
    texts = [line for line in pending if line.problem is None]  # from the failed request's first text
    k = int(found[1])
    return (texts[k], exc.details()[found.end() :]) if k < len(texts) else None


def embed(args: argparse.Namespace, client, source: BinaryIO, job: Job, max_chars: int) -> None:
    from bertserve.client_stream import StreamRequestError

    lines = Lines(read_lines(source, field=args.field, max_chars=max_chars, truncate=args.truncate))
    hashed = _skip_done(lines, job)
    total = count_lines(Path(args.input)) if args.input != "-" and Path(args.input).is_file() else None
    progress = Progress(total, job.rows, args.progress_every)
    finished = False
    try:
        while True:
            feed = Feed(lines, args.on_bad_line)
            batches = client.embed_stream_batches(
                feed.texts(),
                batch_size=args.batch_size,
                model=args.model,
                normalize=args.normalize,
                truncate=args.truncate,
            )
            try:
                for vectors in batches:
                    progress.update(_write(job, feed, hashed, vectors))
            except StreamRequestError as exc:
                pending = feed.close()
                refused = _refused_line(exc, pending)
                if refused is None:
                    raise
                line, reason = refused
                if args.on_bad_line == "fail":
                    raise BadLine(
                        Line(line.number, line.digest, None, f"the server refused it: {reason}")
                    ) from None
                # skip: the refused line becomes a skipped one, and a new stream takes the rest
                marked = [Line(p.number, p.digest, None, reason) if p is line else p for p in pending]
                lines.replay.extendleft(reversed(marked))
                continue
            progress.update(_write(job, feed, hashed, None))
            if feed.bad is not None:
                raise BadLine(feed.bad)
            finished = True
            return
    finally:
        progress.close(finished)


def _open_input(name: str) -> BinaryIO:
    if name == "-":
        return sys.stdin.buffer
    return open(name, "rb")  # noqa: SIM115 (closed by run)


def _served_model(info, name: str):
    """The model that will answer (ModelInfo), from the server's Info."""
    if name:
        for model in info.models:
            if model.name == name:
                return model
        raise JobError(
            f"no model named {name!r} is served (served: {', '.join(m.name for m in info.models)})"
        )
    for model in info.models:
        if "Embed" in model.default_for:
            return model
    raise JobError("the server has no default embedding model; pass --model")


def run(args: argparse.Namespace) -> int:
    import grpc

    from bertserve.client import Client
    from bertserve.commands.common import one_line, rpc_failure

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
    client = Client(args.address, timeout=args.timeout)
    name = "standard input" if args.input == "-" else args.input
    source = None
    code = 1
    try:
        info = client.info(timeout=args.timeout or 30.0)
        model = _served_model(info, args.model)
        job.open(args.restart)
        job.set_dimension(model.dimension)
        if job.rows:
            print(f"embed-file: resuming after {job.rows} rows already in {job.data_path}", file=sys.stderr)
        source = _open_input(args.input)
        embed(args, client, source, job, info.limits.max_input_chars)
        job.finish()
        skipped = f"; {job.skipped} lines skipped, listed in {job.skipped_path}" if job.skipped else ""
        print(f"embed-file: wrote {job.rows} x {job.dimension} float32 to {out}{skipped}", file=sys.stderr)
        return 0
    except BadLine as exc:
        message = (
            f"{name} line {exc.line.number}: {one_line(exc.line.problem)}; fix or remove it, or pass "
            "--on-bad-line skip"
        )
    except (JobError, OSError, json.JSONDecodeError) as exc:
        message = str(exc)
    except grpc.RpcError as exc:
        message = rpc_failure(exc, client.address)
    except KeyboardInterrupt:
        message, code = "interrupted", 130
    finally:
        job.close()
        client.close()
        if source is not None and source is not sys.stdin.buffer:
            source.close()
    kept = ""
    if job.state_path.exists():
        kept = f"; {job.rows} rows kept in {job.data_path}, run the same command to resume"
    print(f"bertserve embed-file: {message}{kept}", file=sys.stderr)
    return code


def register(subparsers) -> None:
    from bertserve.cli import describe
    from bertserve.commands.common import add_connection_flags

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
    add_connection_flags(parser, timeout=None)
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
        "--truncate",
        action="store_true",
        help="cut texts over the server's max_input_chars (here) and max_length tokens (the server) "
        "instead of failing on them",
    )
    parser.add_argument(
        "--on-bad-line",
        choices=POLICIES,
        default="fail",
        help="a line that cannot be embedded: stop there, naming it (fail, the default), or write a NaN "
        "row for it and list it in OUTPUT.skipped.jsonl (skip)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"texts per stream request (default {DEFAULT_BATCH_SIZE}; at most half the server's "
        "max_stream_inputs_in_flight, 128 by default, so that two or more requests are in flight)",
    )
    parser.add_argument(
        "--restart", action="store_true", help="discard a cut-short job's progress and start over"
    )
    parser.add_argument("--progress-every", type=float, default=10.0, metavar="SECONDS", help="without a terminal: a progress line this often (default 10)")  # fmt: skip
    parser.set_defaults(run=run)
