"""The addresses a host name resolves to: what the webhook checks (at creation,
``services.webhooks``, and before each delivery, ``loops.notifier``) compare
against the private ranges. Beside ``settings``: the ground every layer stands on."""

from __future__ import annotations

import ipaddress
import socket


def resolve(host: str, port: int | None) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address ``host`` resolves to (OSError when it does not)."""
    return {ipaddress.ip_address(info[4][0].split("%", 1)[0])
            for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
