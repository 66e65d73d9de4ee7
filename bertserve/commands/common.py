"""What every client command shares: the connection flags, one-line failure messages and JSON output."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator

from bertserve.address import DEFAULT_ADDRESS, DEFAULT_PORT

# Fragments of gRPC's own text when no connection could be made (nothing came from a server).
CONNECTION_FAILURES = (
    "failed to connect",
    "dns resolution failed",
    "connection refused",
    "connections to all backends failing",
    "socket closed",
    "connection reset",
)


def add_connection_flags(parser: argparse.ArgumentParser, timeout: float | None = 30.0) -> None:
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        metavar="HOST[:PORT]",
        help=f"server address; without a port, {DEFAULT_PORT} (default: {DEFAULT_ADDRESS})",
    )
    shown = "none" if timeout is None else f"{timeout:g}"
    parser.add_argument(
        "--timeout", type=float, default=timeout, metavar="SECONDS", help=f"deadline (default: {shown})"
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


def rpc_failure(exc, address: str) -> str:
    """A failed call as one line: where no connection was made, which address and what to do about it."""
    code, details = exc.code(), one_line(exc.details() or "")
    if code.name == "UNAVAILABLE" and any(part in details.lower() for part in CONNECTION_FAILURES):
        reason = details.rsplit(": ", 1)[-1]
        return (
            f"cannot connect to a bertserve server at {address} ({reason}); is one running there? "
            "start one with `bertserve serve`"
        )
    return f"{code.name}: {details}"


def print_json(value, pretty: bool) -> None:
    """One line of JSON, or indented with `pretty`."""
    if pretty:
        print(json.dumps(value, indent=2))
    else:
        print(json.dumps(value, separators=(",", ":")))


@contextlib.contextmanager
def interrupt_closes(client) -> Iterator[threading.Event]:
    """Within: Ctrl-C closes the client's channel from another thread, which ends its calls (CANCELLED),
    and sets the event the caller checks; a KeyboardInterrupt raised inside gRPC's own code could leave
    one of its locks held and the command hung. Outside the main thread, nothing changes."""
    interrupted = threading.Event()

    def close_on_interrupt(_signum, _frame) -> None:
        if not interrupted.is_set():
            interrupted.set()
            threading.Thread(target=client.close, name="interrupt", daemon=True).start()

    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, close_on_interrupt)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def call_or_report(command: str, client, interrupted, call):
    """`call()`'s result, or None after one line on standard error naming the failure and the address.
    Ctrl-C (the channel closed by `interrupt_closes`) raises KeyboardInterrupt: bertserve/cli.py says so."""
    import grpc

    try:
        return call()
    except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel was closed by Ctrl-C
        if interrupted.is_set():
            raise KeyboardInterrupt from None
        if not isinstance(exc, grpc.RpcError):
            raise
        print(f"bertserve {command}: {rpc_failure(exc, client.address)}", file=sys.stderr)
        return None
