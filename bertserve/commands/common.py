"""What every client command shares: the connection flags, one-line failure messages and JSON output."""

from __future__ import annotations

import argparse
import json

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
