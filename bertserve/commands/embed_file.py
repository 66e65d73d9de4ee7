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
import sys
import threading
from pathlib import Path
from typing import BinaryIO

from bertserve.client_stream import DEFAULT_BATCH_SIZE
from bertserve.commands.embed_file_job import FORMATS, Job, JobError
from bertserve.commands.embed_file_stream import POLICIES, BadLine, embed


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


def _run_job(args: argparse.Namespace, client, job: Job) -> None:
    source = None
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
    finally:
        job.close()
        if source is not None and source is not sys.stdin.buffer:
            source.close()


def _failure(exc: Exception, args: argparse.Namespace, address: str) -> str:
    """One line for a job that could not go on (the exception again when it is not one of ours)."""
    import grpc

    from bertserve.commands.common import one_line, rpc_failure

    if isinstance(exc, BadLine):
        name = "standard input" if args.input == "-" else args.input
        return (
            f"{name} line {exc.line.number}: {one_line(exc.line.problem)}; fix or remove it, or pass "
            "--on-bad-line skip"
        )
    if isinstance(exc, (JobError, OSError, json.JSONDecodeError)):
        return str(exc)
    if isinstance(exc, grpc.RpcError):
        return rpc_failure(exc, address)
    raise exc


def run(args: argparse.Namespace) -> int:
    from bertserve.client import Client
    from bertserve.commands.common import interrupt_closes

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
    code, interrupted = 1, threading.Event()
    with Client(args.address, timeout=args.timeout) as client:
        try:
            with interrupt_closes(client) as interrupted:
                _run_job(args, client, job)
            skipped = f"; {job.skipped} lines skipped, listed in {job.skipped_path}" if job.skipped else ""
            print(
                f"embed-file: wrote {job.rows} x {job.dimension} float32 to {out}{skipped}", file=sys.stderr
            )
            return 0
        except KeyboardInterrupt:
            message, code = "interrupted", 130
        except Exception as exc:
            if interrupted.is_set():  # the calls ended because Ctrl-C closed the channel
                message, code = "interrupted", 130
            else:
                message = _failure(exc, args, client.address)
    kept = ""
    if job.state_path.exists():
        kept = f"; {job.rows} rows kept in {job.data_path}, run the same command to resume"
    print(f"bertserve embed-file: {message}{kept}", file=sys.stderr)
    return code


def register(subparsers) -> None:
    from bertserve.command_table import describe
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
