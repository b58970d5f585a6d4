"""Find QSCs on the LAN by their BOOTP announcements (``qlink discover``).

A QSC broadcasts a BOOTP request every BOOTP_INTERVAL_MS (1 s from reset) to UDP port 12267, as
Holoscan Sensor Bridge boards do (:mod:`openqlink.wire.bootp`); this listens on that port for a
while and lists each board once, by MAC, with the IP it sent from. It needs no privileges (a
plain UDP socket; other programs, such as a sensor bridge enumerator, may listen on the port
at the same time: SO_REUSEPORT).
"""

from __future__ import annotations

import socket
import time

from .errors import WireFormatError
from .wire.bootp import BOOTP_REQUEST_PORT, parse_bootp_request

__all__ = ["discover"]


def discover(timeout_s: float = 3.0, *, interface: str | None = None,
             port: int = BOOTP_REQUEST_PORT) -> list[dict[str, object]]:
    """Listen ``timeout_s`` seconds for announcements on UDP ``port`` (of every interface, or
    of ``interface`` only: SO_BINDTODEVICE, which needs CAP_NET_RAW) and return one entry per
    board (by MAC, the latest announcement): the keys of
    :func:`~openqlink.wire.bootp.parse_bootp_request`. Datagrams that are not a sensor
    bridge's BOOTP request are ignored.

    Raises :class:`OSError` when the port cannot be bound or the interface is not there.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if interface:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        sock.bind(("", port))
        boards: dict[str, dict[str, object]] = {}
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                payload, (src_ip, _) = sock.recvfrom(2048)
            except TimeoutError:
                break
            try:
                board = parse_bootp_request(payload, src_ip)
            except WireFormatError:
                continue
            boards[str(board["mac"])] = board
        return list(boards.values())
    finally:
        sock.close()
