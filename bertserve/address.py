"""Server addresses as users write them: a host without a port means bertserve's gRPC port, not gRPC's
default of 443."""

from __future__ import annotations

DEFAULT_PORT = 50051
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
# gRPC target schemes that name no TCP port (or carry their own syntax): passed through as they are.
OTHER_SCHEMES = ("unix:", "unix-abstract:", "vsock:", "ipv4:", "ipv6:")


def with_port(address: str, port: int | None = None) -> str:
    """`address` with `:port` added when it has none: `localhost`, `10.0.0.1`, `[::1]`, `::1`,
    `dns:///host`; `host:123`, `[::1]:123` and the unix:/vsock:/ipv4:/ipv6: targets are unchanged."""
    if address.startswith(OTHER_SCHEMES):
        return address
    port = DEFAULT_PORT if port is None else port
    prefix, host = "", address
    if address.startswith("dns:"):
        # dns:[//authority/]host[:port]
        cut = address.rfind("/") + 1 or len("dns:")
        prefix, host = address[:cut], address[cut:]
    if host.startswith("["):  # [v6] or [v6]:port
        return address if "]:" in host else f"{prefix}{host}:{port}"
    if host.count(":") > 1:  # a bare IPv6 address
        return f"{prefix}[{host}]:{port}"
    if ":" in host:
        return address
    return f"{prefix}{host}:{port}"
