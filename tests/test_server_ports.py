"""A port that is already taken stops the second server at start with one line, for gRPC as for HTTP
(gRPC's default SO_REUSEPORT would let two servers split one port's calls silently)."""

from __future__ import annotations

import pytest

from bertserve.service.errors import StartupError
from tests.helpers.server import ServerThread


def test_a_second_server_on_a_taken_grpc_port_fails_at_start(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], http_port=-1, metrics_port=-1) as first:
        port = first.server.port
        second = ServerThread(model_repo=tiny_repo, models=["tiny-embed"], port=port, http_port=-1)
        with pytest.raises(StartupError, match=f"setting port: cannot listen on 127.0.0.1:{port}"):
            second.start()
