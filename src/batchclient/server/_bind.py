"""Where the server listens: a host reachable from elsewhere needs keys."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (``127.0.0.0/8``, ``::1``,
    ``localhost``). A wildcard (``0.0.0.0``, ``::``), any other address, or a name that does
    not resolve is not."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(str(a).split("%", 1)[0]).is_loopback for a in addresses
    )
