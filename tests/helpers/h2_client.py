"""A raw HTTP/2 client for hostile-client tests: opens gRPC streams and sends DATA frames as slowly or as
incompletely as a test wants, within the server's flow-control windows (no HPACK indexing or Huffman)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

DATA, HEADERS, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE = 0, 1, 3, 4, 6, 8
END_STREAM, END_HEADERS, ACK = 1, 4, 1
INITIAL_WINDOW = 65535
FRAME_BYTES = 16384


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _length(value: int) -> bytes:  # an HPACK string length, 7-bit prefix, no Huffman
    if value < 127:
        return bytes([value])
    out, value = [127], value - 127
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    return bytes([*out, value])


def headers_block(headers: list[tuple[str, str]]) -> bytes:
    """Literal header fields without indexing."""
    return b"".join(b"\x00" + _length(len(k)) + k.encode() + _length(len(v)) + v.encode() for k, v in headers)


def grpc_message_head(length: int) -> bytes:
    """The 5-byte gRPC message prefix announcing `length` bytes (uncompressed)."""
    return b"\x00" + struct.pack(">I", length)


class H2Connection:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS, 0, 0))
        self._next = 1
        self._windows: dict[int, int] = {0: INITIAL_WINDOW}
        self._initial = INITIAL_WINDOW
        self._changed = threading.Condition()
        self.closed = False
        self.ended: set[int] = set()  # streams the server ended (END_STREAM or RST_STREAM)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        try:
            while chunk := self.sock.recv(1 << 20):
                buffer += chunk
                while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                    size = int.from_bytes(buffer[:3], "big")
                    kind, flags = buffer[3], buffer[4]
                    stream = struct.unpack(">I", buffer[5:9])[0] & 0x7FFFFFFF
                    payload, buffer = buffer[9 : 9 + size], buffer[9 + size :]
                    self._handle(kind, flags, stream, payload)
        except OSError:
            pass
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def _handle(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == RST_STREAM or (kind in (DATA, HEADERS) and flags & END_STREAM):
            with self._changed:
                self.ended.add(stream)
                self._changed.notify_all()
        if kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload), 6):
                ident, value = struct.unpack(">HI", payload[i : i + 6])
                if ident == 4:  # SETTINGS_INITIAL_WINDOW_SIZE
                    with self._changed:
                        for sid in self._windows:
                            if sid:
                                self._windows[sid] += value - self._initial
                        self._initial = value
            self._send(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self._send(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            with self._changed:
                grant = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                self._windows[stream] = self._windows.get(stream, self._initial) + grant
                self._changed.notify_all()

    def _send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # the server closed the connection: the test reads that
            self.sock.sendall(data)

    def open(self, path: str, extra: list[tuple[str, str]] = ()) -> int:
        """A new gRPC call's stream (headers only, `extra` after gRPC's own)."""
        stream, self._next = self._next, self._next + 2
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
                  ("content-type", "application/grpc"), ("te", "trailers"), *extra]  # fmt: skip
        with self._changed:
            self._windows[stream] = self._initial
        self._send(frame(HEADERS, END_HEADERS, stream, headers_block(fields)))
        return stream

    def send(self, stream: int, data: bytes, wait_s: float) -> int:
        """Sends `data` on `stream` as the windows allow, waiting at most `wait_s` for room; the bytes sent."""
        sent, until = 0, time.monotonic() + wait_s
        while sent < len(data):
            with self._changed:
                room = 0
                while not self.closed and time.monotonic() < until:
                    room = min(self._windows[0], self._windows[stream], FRAME_BYTES, len(data) - sent)
                    if room > 0:
                        break
                    self._changed.wait(0.05)
                if room <= 0:
                    return sent
                self._windows[0] -= room
                self._windows[stream] -= room
            self._send(frame(DATA, 0, stream, data[sent : sent + room]))
            sent += room
        return sent

    def wait_ended(self, stream: int, timeout_s: float) -> bool:
        """Whether the server ended `stream` within `timeout_s`."""
        with self._changed:
            return self._changed.wait_for(lambda: stream in self.ended or self.closed, timeout_s) and (
                stream in self.ended
            )

    def close(self) -> None:
        self.sock.close()
