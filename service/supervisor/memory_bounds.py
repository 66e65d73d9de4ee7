"""The most memory clients can make the server hold beyond its models, term by term, at given settings:
whatever they send, read or leave unread, each term is bounded before the work it limits is done. The
README's Reliability section lists these terms; `bertserve serve` logs their sum at start, and
tests/test_deploy_memory.py holds the Deployment's memory limit to the models plus this sum.

Not counted: replies that gRPC has taken and a client does not read (HTTP/2 flow control holds them in
gRPC's send buffer, at most one reply of `max_message_bytes` per call that has ended), and what the kernel's
send buffers take of any reply (net.ipv4.tcp_wmem: 4 MiB a socket by default; kernel memory, not RSS).
"""

from __future__ import annotations

from bertserve.service.grpc.stream_memory import streams_bound
from bertserve.service.http.messages import HttpLimits
from bertserve.service.http.transport import READ_BYTES, REPLY_CHUNK, WRITE_BUFFER_HIGH
from bertserve.service.settings import Settings

MIB = 1024 * 1024
CONNECTION_OBJECTS = 8 * 1024  # a connection's protocol, parser and buffers' own objects
TLS_READ_BUFFER = 256 * 1024  # asyncio's read buffer of each TLS connection
# what a TLS connection's socket transport takes of a reply before it pauses the TLS layer (asyncio's default
# high-water mark); the TLS layer then pauses the connection at WRITE_BUFFER_HIGH
TLS_SOCKET_WRITE_HIGH = 64 * 1024
JSON_PARSERS = 2  # large JSON bodies are parsed on the CPU pool's two threads (service/supervisor/server.py)
JSON_PARSE_COPIES = 4  # the body, its decoded text, the pre-count's copy and the parsed values
NATIVE_QUOTA_MIN = 16 * MIB  # transport.cc's kMinQuotaBytes


def bounds(settings: Settings, dimension: int, tls: bool) -> dict[str, int]:
    """Bytes per term: HTTP connections (request heads, pipelined bytes, unsent bytes), HTTP bodies held,
    HTTP replies their clients have not taken, JSON bodies being parsed, gRPC request messages of unary calls
    (arriving and held), EmbedStreams, and the native port's requests."""
    header_bytes = HttpLimits(max_body_bytes=settings.max_message_bytes).max_header_bytes
    per_connection = (
        2 * header_bytes
        + 2 * READ_BYTES
        + WRITE_BUFFER_HIGH
        + REPLY_CHUNK
        + CONNECTION_OBJECTS
        + (TLS_READ_BUFFER + TLS_SOCKET_WRITE_HIGH if tls else 0)
    )
    message = settings.max_message_bytes
    terms = {
        "http_connections": settings.http_max_connections * per_connection,
        "http_bodies": settings.http_max_body_bytes_in_flight + message,
        # replies not taken: the budget, and the one that waits beyond it while older ones are aborted
        "http_replies": settings.http_max_reply_bytes_in_flight + message,
        "http_json_parsing": JSON_PARSERS * JSON_PARSE_COPIES * message,
        # the main port's request messages: still arriving (in gRPC's buffers, service/grpc/request_reads.py),
        # then held as received and as parsed
        "grpc_requests": settings.max_request_bytes_in_flight
        + 2 * (settings.max_request_bytes_in_flight + message),
        "streams": streams_bound(settings, dimension),
        # the native port (service/grpc/native/): gRPC's buffers (its resource quota, NATIVE_QUOTA_MIN at
        # least), then its own budget of requests held, as received and as parsed
        "native_requests": max(settings.max_request_bytes_in_flight + message, NATIVE_QUOTA_MIN)
        + 2 * (settings.max_request_bytes_in_flight + message),
        # its streams, relayed to this process's gRPC server (relay.h): the client messages held (a budget
        # of max_request_bytes_in_flight, in gRPC's buffers: a share of the quota of their own), and one
        # reply per stream the client has not read yet
        "native_relays": settings.max_request_bytes_in_flight
        + message
        + settings.max_concurrent_streams * message,
    }
    if settings.grpc_transport == "native":  # grpc.aio serves only the relayed streams: no unary request
        del terms["grpc_requests"]
    elif settings.native_port < 0:
        del terms["native_requests"], terms["native_relays"]
    if settings.http_port < 0:
        terms = {name: size for name, size in terms.items() if not name.startswith("http_")}
    return terms


def describe(terms: dict[str, int]) -> str:
    parts = ", ".join(f"{name} {size / MIB:.0f}" for name, size in terms.items())
    return f"{sum(terms.values()) / MIB:.0f} MiB ({parts})"
