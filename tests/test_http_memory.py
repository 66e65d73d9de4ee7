"""The HTTP transport's memory under hostile clients (issue 30), measured as the RSS of a `bertserve serve`
process (psutil), which runs no garbage collection on our behalf:
- endless header values: each connection holds at most max_header_bytes (431 beyond);
- bodies one byte short of their Content-Length, then closed: freed with their connection;
- many large bodies at once: at most http_max_body_bytes_in_flight held (503 beyond);
- large replies their clients never read: at most http_max_reply_bytes_in_flight held (beyond it the
  waiting connection whose client takes its reply slowest is aborted).
After the clients leave, RSS comes back near where it was."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time

import psutil
import pytest

from tests.helpers.server import ServerProcess, metric, scrape, wait_for
from tests.test_server_tls import pki  # noqa: F401  (the certificates fixture)

MiB = 1024 * 1024
BODY = 8 * MiB  # max_message_bytes' default
BUDGET = 64 * MiB  # http_max_body_bytes_in_flight's default
HEAD = (
    b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)


@pytest.fixture(scope="module")
def server(tiny_repo):
    process = ServerProcess("--model-repo", str(tiny_repo), "--model", "tiny-embed").start()
    try:
        yield process
    finally:
        process.kill()


class PeakRss:
    """The process's largest RSS while the block runs, sampled every 10 ms."""

    def __init__(self, pid: int):
        self.process, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()

    def rss(self) -> int:
        return self.process.memory_info().rss

    def __enter__(self) -> PeakRss:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.01)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.http_port), timeout=20)


def health(server) -> float:
    started = time.monotonic()
    with reply_client(server, 1 << 16) if getattr(server, "tls", False) else connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    return time.monotonic() - started


def settled(server, rss: PeakRss) -> int:
    """RSS once the server is quiet (a health call answered and a moment passed)."""
    health(server)
    time.sleep(1.5)
    return rss.rss()


def returns_to(rss: PeakRss, bound: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while rss.rss() > bound:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def send_quietly(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the server may refuse and close before reading it all
        sock.sendall(data)


def reply_status(sock: socket.socket) -> int | None:
    with contextlib.suppress(OSError):
        data = sock.recv(65536)
        if data.startswith(b"HTTP/1.1 "):
            return int(data.split(b" ", 2)[1])
    return None


def test_endless_header_values_hold_at_most_the_header_limit(server):
    rss = PeakRss(server.process.pid)
    baseline = settled(server, rss)
    statuses = []

    def attacker():
        with connect(server) as sock:
            send_quietly(sock, b"GET /health HTTP/1.1\r\nHost: t\r\nX-Endless: ")
            for _ in range(256):  # up to 4 MiB of one header value, while the server reads
                try:
                    sock.sendall(b"a" * 16384)
                except OSError:
                    break
            statuses.append(reply_status(sock))

    with rss:
        threads = [threading.Thread(target=attacker) for _ in range(32)]
        for thread in threads:
            thread.start()
        latency = health(server)
        for thread in threads:
            thread.join(60)
    assert statuses == [431] * 32
    assert latency < 2
    assert rss.peak - baseline < 48 * MiB, (rss.peak - baseline) / MiB
    assert returns_to(rss, baseline + 16 * MiB)


def test_bodies_cut_short_are_freed_with_their_connection(server):
    rss = PeakRss(server.process.pid)
    baseline = settled(server, rss)
    with rss:
        for _ in range(5):  # rounds of 7 bodies (within the budget) one byte short, then closed
            socks = [connect(server) for _ in range(7)]
            for sock in socks:
                send_quietly(sock, HEAD % BODY + b"a" * (BODY - 1))
            time.sleep(0.5)  # the server reads the last bytes
            for sock in socks:
                sock.close()
    health(server)
    assert rss.peak - baseline < BUDGET + 48 * MiB, (rss.peak - baseline) / MiB
    assert returns_to(rss, baseline + 24 * MiB), (rss.rss() - baseline) / MiB


def test_bodies_in_flight_are_bounded_by_their_budget(server):
    rss = PeakRss(server.process.pid)
    baseline = settled(server, rss)
    socks = [connect(server) for _ in range(40)]  # 320 MiB of bodies, all held open at once
    try:
        with rss:
            for sock in socks:
                send_quietly(sock, HEAD % BODY + b"a" * (BODY - 1))
            time.sleep(0.5)
        refused = sum(reply_status(sock) == 503 for sock in socks if _readable(sock))
    finally:
        for sock in socks:
            sock.close()
    # the budget, one body copied while a request is made of it, and the interpreter's own overhead
    assert rss.peak - baseline < BUDGET + 48 * MiB, (rss.peak - baseline) / MiB
    assert refused >= 40 - BUDGET // BODY - 1
    assert returns_to(rss, baseline + 24 * MiB), (rss.rss() - baseline) / MiB
    assert health(server) < 2


def _readable(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except OSError:
        return False
    finally:
        sock.setblocking(True)


# A reply larger than the kernel's send buffer takes on loopback (about 3 MiB here), so most of it waits in
# the server's transport while its client reads nothing.
REPLY_LIMIT = 16 * MiB  # the reply server's max_message_bytes and its http_max_reply_bytes_in_flight
READERS_GONE = 12  # connections that ask for a large reply and never read it
INFER = "http:/v2/models/{name}/infer"


@pytest.fixture(scope="module", params=["plain", "tls"])
def reply_server(request, tiny_repo, pki):  # noqa: F811  (pki: the imported fixture)
    args = ["--model-repo", str(tiny_repo), "--model", "tiny-embed", "--max-message-bytes", str(REPLY_LIMIT)]
    args += ["--http-max-reply-bytes-in-flight", str(REPLY_LIMIT)]
    if request.param == "tls":  # its transport would take a whole reply at once: written in pieces
        args += ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server-key.pem")]
    process = ServerProcess(*args).start()
    process.tls = request.param == "tls"
    try:
        yield process
    finally:
        process.kill()


def reply_client(server, receive_buffer: int = 4096) -> socket.socket:
    """A connection to the reply server whose receive buffer takes almost nothing, over TLS when it serves it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", server.http_port))
    if server.tls:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        sock = context.wrap_socket(sock)
    return sock


def token_states_request() -> bytes:
    """A KServe infer call whose JSON reply (every token's state of 256 inputs) takes about 7 MiB."""
    texts = ["a cat sat on the mat " * 8] * 256
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}],
        "outputs": [{"name": "token_embeddings"}],
    }
    data = json.dumps(body).encode()
    head = "POST /v2/models/tiny-embed/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data


def read_reply(sock: socket.socket, size: int = 1 << 20, pause_s: float = 0.0) -> bytes:
    """The whole reply (head and body, by Content-Length), or what came before the server reset it; read
    `size` bytes at a time, `pause_s` after each."""
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data or len(data) < _reply_size(data):
            chunk = sock.recv(size)
            if not chunk:
                break
            data += chunk
            time.sleep(pause_s)
    return data


def _reply_size(data: bytes) -> int:
    head = data.partition(b"\r\n\r\n")[0]
    fields = (line.partition(b":") for line in head.split(b"\r\n"))
    return len(head) + 4 + next(int(value) for name, _, value in fields if name.lower() == b"content-length")


def answered(server) -> float:
    return metric(scrape(server.metrics_url), "bertserve_requests_total", rpc=INFER, code="OK")


def answered_after(server, send) -> None:
    """`send()`, then wait until the server has answered one more infer call."""
    done = answered(server)
    send()
    wait_for(lambda: answered(server) > done, timeout=60)


def test_replies_not_read_are_bounded_by_their_budget(reply_server):
    """Readers gone: each newer reply closes the slowest waiter once the budget is full. A client that reads,
    slowly, alongside them gets its whole reply."""
    request = token_states_request()
    with reply_client(reply_server, 1 << 20) as reader:  # a client that reads: the reply's size
        reader.sendall(request)
        size = len(read_reply(reader))
    assert 4 * MiB < size <= REPLY_LIMIT, size
    held = REPLY_LIMIT // size  # replies within the budget
    rss = PeakRss(reply_server.process.pid)
    baseline = settled(reply_server, rss)
    socks, slow = [], {}

    def slow_reader():
        with reply_client(reply_server) as sock:
            sock.sendall(request)
            slow["got"] = len(read_reply(sock, 65536, 0.05))  # about 1 MB/s

    reading = threading.Thread(target=slow_reader)
    try:
        with rss:
            for sent in range(READERS_GONE):  # one at a time: the queue takes one call of 256 inputs at once
                if sent == held:  # the budget is full from here on: the reader joins
                    answered_after(reply_server, reading.start)
                socks.append(reply_client(reply_server))
                answered_after(reply_server, lambda: socks[-1].sendall(request))
            unread = metric(
                scrape(reply_server.metrics_url), "bertserve_http_connections_total", outcome="unread"
            )
            reading.join(120)
        whole = sum(len(read_reply(sock)) == size for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    assert slow.get("got") == size, (slow, size)
    assert unread >= READERS_GONE - held - 1 and whole <= held + 1, (unread, whole, held)
    assert rss.peak - baseline < REPLY_LIMIT + 24 * MiB, (rss.peak - baseline) / MiB
    assert health(reply_server) < 2


def test_a_client_that_leaves_mid_reply_stops_its_writing(reply_server):
    """The rest of a reply whose client closed is not written piece by piece to a closed transport (asyncio
    logs each such write from the fifth on), and the next client is answered."""
    request = token_states_request()
    for _ in range(3):
        with reply_client(reply_server) as sock:
            sock.sendall(request)
            sock.recv(4096)  # the reply has begun
    assert health(reply_server) < 2
    time.sleep(1)  # the server's log lines reach this process
    lost = ("socket.send() raised", "SSL connection is closed")
    assert not [line for line in reply_server.lines if any(text in line for text in lost)]
