"""A loopback TCP proxy that holds each connection's first bytes from its client for a while: the server
then reads a call's headers late, as a loaded server does, while the client's clock already runs."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class SlowProxy:
    """Forwards 127.0.0.1:`port` to `target`; each connection's first read from its client waits `delay_s`."""

    def __init__(self, target: int, delay_s: float):
        self.target, self.delay_s = target, delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target))
                self._sockets += [client, server]
                threading.Thread(target=self._pipe, args=(client, server, self.delay_s), daemon=True).start()
                threading.Thread(target=self._pipe, args=(server, client, 0.0), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, delay_s: float) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                time.sleep(delay_s)
                delay_s = 0.0
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for one in self._sockets:
            with contextlib.suppress(OSError):
                one.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept() or recv()
            with contextlib.suppress(OSError):
                one.close()

    def __enter__(self) -> SlowProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
