"""ICMP echo (RFC 792), the message of ``ping``, which a QSC answers.

# Ref: RFC 792 (Echo and Echo Reply); RFC 1122 3.2.2.6 (the reply carries the request's data and
# comes from the address the request was sent to); RFC 1071 and RFC 1624 (checksum and its
# incremental update).
"""

from __future__ import annotations

from amaranth.lib import enum

from .header import Header

__all__ = ["ICMP_ECHO", "IcmpType"]

#: The ICMP echo header (8 bytes; the data follows). The checksum covers the whole ICMP message.
ICMP_ECHO = Header("IcmpEcho", [
    ("type", 8), ("code", 8), ("checksum", 16), ("identifier", 16), ("sequence", 16),
], ref="RFC 792")


class IcmpType(enum.IntEnum, shape=8):
    ECHO_REPLY = 0
    ECHO_REQUEST = 8
