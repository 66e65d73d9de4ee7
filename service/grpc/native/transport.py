"""The native gRPC transport (transport.cc, built on first use and loaded with ctypes): a C++ gRPC server
whose calls Python takes in groups and answers one by one with bytes or a status.

An event loop watches `wakeup_fd` and takes what waits without blocking; gRPC's own threads run beside
the interpreter (ctypes releases Python's lock for each foreign call)."""

from __future__ import annotations

import ctypes
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from bertserve.service.native_build import NativeUnavailable, built, cached

SOURCE = Path(__file__).with_name("transport.cc")
_HEAD = struct.Struct("<QdiI")  # call id, seconds to its deadline (-1: none), method index, request size
_ERROR_BYTES = 512
STATUS_CODES = 17  # gRPC status codes, 0 (OK) to 16 (UNAUTHENTICATED)

__all__ = ["NativeTransport", "NativeUnavailable", "TakenCall", "library"]


@dataclass(frozen=True, slots=True)
class TakenCall:
    id: int
    deadline: float | None  # time.monotonic() seconds, from the time left when it was taken; None: none
    method: int  # index into the transport's methods
    request: bytes


def _loads(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        ctypes.CDLL(str(path))
    except OSError:  # a gRPC library since removed or upgraded
        return False
    return True


_LIBRARY: ctypes.CDLL | None = None


def library_file() -> Path:
    """Where the transport's library is cached (`library` builds it there)."""
    return cached(SOURCE, "bertserve-native", ".so")


def library() -> ctypes.CDLL:
    """The transport's library, built on first use (a few seconds; NativeUnavailable says what is missing)."""
    global _LIBRARY
    if _LIBRARY is None:
        lib = ctypes.CDLL(str(built(SOURCE, library_file(), _loads, shared=True)))
        c = ctypes
        signatures = {
            "bsn_start": (
                c.c_void_p,
                [c.c_char_p, c.c_char_p]
                + [c.c_int] * 3
                + [c.c_int64, c.c_int, c.c_int, c.c_double, c.c_int]
                + [c.c_char_p] * 4
                + [c.c_char_p, c.c_int],
            ),
            "bsn_port": (c.c_int, [c.c_void_p]),
            "bsn_wakeup_fd": (c.c_int, [c.c_void_p]),
            "bsn_next": (
                c.c_int,
                [c.c_void_p, c.c_int, c.POINTER(c.c_void_p), c.POINTER(c.c_int64)],
            ),
            "bsn_reply": (c.c_int, [c.c_void_p, c.c_uint64, c.c_char_p, c.c_int64]),
            "bsn_fail": (c.c_int, [c.c_void_p, c.c_uint64, c.c_int, c.c_char_p]),
            "bsn_held": (c.c_int, [c.c_void_p]),
            "bsn_open": (c.c_int, [c.c_void_p]),
            "bsn_relays": (None, [c.c_void_p, c.POINTER(c.c_int64)]),
            "bsn_dropped": (c.c_int, [c.c_void_p, c.POINTER(c.c_int64), c.c_int]),
            "bsn_counts": (None, [c.c_void_p, c.POINTER(c.c_int64)]),
            "bsn_drain": (None, [c.c_void_p]),
            "bsn_stop": (None, [c.c_void_p, c.c_double]),
            "bsn_free": (None, [c.c_void_p]),
        }
        for name, (result, arguments) in signatures.items():
            function = getattr(lib, name)
            function.restype, function.argtypes = result, arguments
        _LIBRARY = lib
    return _LIBRARY


class NativeTransport:
    """One listening port. `methods`: the full method names served ("/pkg.Service/Method"; any other is
    relayed, or gets UNIMPLEMENTED without a relay); `max_open`: calls open at once (beyond:
    RESOURCE_EXHAUSTED); once a call's request is read, at most `max_calls` calls and `max_request_bytes`
    of their requests are held (beyond: RESOURCE_EXHAUSTED; a lone call always fits); a request not read
    within `read_timeout_s` of its call's start: DEADLINE_EXCEEDED. One thread at a time takes calls; any
    thread answers them."""

    def __init__(
        self,
        address: str,
        methods: list[str],
        max_calls: int,
        max_request_bytes: int,
        max_message_bytes: int,
        max_open: int,
        read_timeout_s: float,
        tls: tuple[bytes, bytes, bytes] | None = None,
        reuse_port: bool = False,
        relay: str = "",
        probes: int = 0,
    ):
        """`tls`: (certificate chain, private key, client CA or b"") in PEM; `reuse_port`: share the port
        with the server's other fronts (SO_REUSEPORT; the supervisor holds it); `relay`: the gRPC address
        that calls of any other method are relayed to (relay.h; "": they get UNIMPLEMENTED); `probes`: how
        many of `methods`, at their end, are health checks (never refused by the limits or the drain, at most
        64 open). Raises OSError when the port cannot be had, NativeUnavailable when the library cannot be
        built."""
        self._lib = library()
        self._methods = len(methods)
        names = b"".join(m.encode() + b"\0" for m in methods)
        cert, key, ca = tls or (b"", b"", b"")
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        self._handle = self._lib.bsn_start(
            address.encode(), names, len(names), probes, max_calls, max_request_bytes, max_message_bytes, max_open,
            read_timeout_s, int(reuse_port),
            cert, key, ca, relay.encode(), error, _ERROR_BYTES,
        )  # fmt: skip
        if not self._handle:
            raise OSError(error.value.decode(errors="replace"))
        self.port = self._lib.bsn_port(self._handle)
        self.wakeup_fd = self._lib.bsn_wakeup_fd(self._handle)  # readable: calls wait to be taken
        self._data, self._size = ctypes.c_void_p(), ctypes.c_int64()

    def take(self, max_calls: int) -> list[TakenCall] | None:
        """Up to `max_calls` waiting calls, without blocking ([] if none waits); None once stopped. A take
        (or `dropped`) that leaves nothing waiting re-arms `wakeup_fd` for the next call or drop."""
        taken = self._lib.bsn_next(self._handle, max_calls, self._data, self._size)
        if taken < 0:
            return None
        if taken == 0:
            return []
        data = ctypes.string_at(self._data, self._size.value)
        calls, offset, now = [], 0, time.monotonic()
        for _ in range(taken):
            call, timeout_s, method, size = _HEAD.unpack_from(data, offset)
            offset += _HEAD.size
            calls.append(
                TakenCall(
                    call, None if timeout_s < 0 else now + timeout_s, method, data[offset : offset + size]
                )
            )
            offset += size
        return calls

    def reply(self, call: int, data: bytes) -> bool:
        """Answers `call`; False when it had ended (cancelled by its client, or the server stopped)."""
        return bool(self._lib.bsn_reply(self._handle, call, data, len(data)))

    def fail(self, call: int, code: int, message: str) -> bool:
        """Ends `call` with status `code` (grpc.StatusCode's number) and `message`."""
        return bool(self._lib.bsn_fail(self._handle, call, code, message.encode(errors="replace")))

    def dropped(self, max_calls: int) -> list[tuple[int, int]]:
        """Up to `max_calls` taken calls that ended without an answer (their client cancelled them, or
        their deadline passed), as (id, gRPC status code); each once. Asked after each `take`."""
        out = (ctypes.c_int64 * (2 * max_calls))()
        n = self._lib.bsn_dropped(self._handle, out, max_calls)
        return [(out[2 * i], out[2 * i + 1]) for i in range(n)]

    @property
    def held(self) -> int:
        """Calls whose request was read, not yet ended."""
        return self._lib.bsn_held(self._handle)

    @property
    def relays(self) -> tuple[int, int]:
        """Relayed calls not yet done, and the bytes of client messages they hold."""
        out = (ctypes.c_int64 * 2)()
        self._lib.bsn_relays(self._handle, out)
        return out[0], out[1]

    @property
    def open_calls(self) -> int:
        """Calls not yet ended (held, or their request still arriving), health checks aside."""
        return self._lib.bsn_open(self._handle)

    def counts(self) -> list[list[int]]:
        """Calls the transport ended itself before they were taken (refusals, read timeouts, clients that
        left), per method (in `methods`' order) by gRPC status code (index = the code's number), since the
        start."""
        out = (ctypes.c_int64 * (STATUS_CODES * self._methods))()
        self._lib.bsn_counts(self._handle, out)
        return [list(out[i : i + STATUS_CODES]) for i in range(0, len(out), STATUS_CODES)]

    def drain(self) -> None:
        """New calls get UNAVAILABLE; those held are still answered."""
        self._lib.bsn_drain(self._handle)

    def stop(self, grace_s: float) -> None:
        """Blocking: ends what is held with UNAVAILABLE and stops the server; `take` returns None after."""
        self._lib.bsn_stop(self._handle, grace_s)

    def free(self) -> None:
        """After `stop`, once no thread is in `take`."""
        if self._handle:
            self._lib.bsn_free(self._handle)
            self._handle = None
