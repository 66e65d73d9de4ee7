"""Ports that a server's front processes share, and no one else does.

The fronts bind with SO_REUSEPORT, so the kernel shares connections out between them. SO_REUSEPORT would
also let a second server of the same user share a port silently, so the supervisor first checks that
each port is free (a bind without SO_REUSEPORT fails on a port that any socket holds), then holds a
bound, never listening, SO_REUSEPORT socket on it for its whole life: the fronts can join it, and a
second `bertserve serve` fails its own check. A socket that does not listen is given no connections.
"""

from __future__ import annotations

import socket

from bertserve.service.errors import StartupError


def _socket(family: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    else:  # TIME_WAIT connections of an earlier server do not make the port taken
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return sock


class PortClaim:
    """Holds (host, port) for this server's fronts; `port` is the real number (0 picks a free one)."""

    def __init__(self, setting: str, host: str, port: int):
        self.sockets: list[socket.socket] = []
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            for family, _, _, _, address in dict.fromkeys(infos):
                if port == 0 and self.sockets:  # every address on the port the first one got
                    address = (address[0], self.sockets[0].getsockname()[1], *address[2:])
                if address[1] != 0:
                    with _socket(family, reuse_port=False) as probe:
                        probe.bind(address)  # fails when the port is taken
                holder = _socket(family, reuse_port=True)
                self.sockets.append(holder)
                holder.bind(address)
        except OSError as exc:
            self.close()
            raise StartupError(f"setting {setting}: cannot listen on {host}:{port}: {exc}") from None
        self.port = self.sockets[0].getsockname()[1]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets = []
