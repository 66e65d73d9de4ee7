"""How `bertserve embed-file` streams INPUT's lines (bertserve/commands/embed_file.py): good lines go to
the server over EmbedStream, every line's row is written in line order (a skipped line's as NaN), and a
line the server refuses either stops the job (--on-bad-line fail) or ends that stream, to be skipped
while a new stream resends the lines after the last row written (skip).
"""

from __future__ import annotations

import argparse
import re
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bertserve.commands.embed_file_input import Line, count_lines, read_lines
from bertserve.commands.embed_file_job import Job, JobError, LinesHash, Progress

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
                if refused is None:  # the request as a whole: name where it started
                    first = next((p.number for p in pending if p.problem is None), None)
                    where = f" (the request from line {first})" if first else ""
                    raise JobError(f"{exc.code().name}: {' '.join(exc.details().split())}{where}") from None
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
