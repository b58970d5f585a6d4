"""UDP header (RFC 768) and the well-known ports the QSC listens on.

# Ref: RFC 768; IBTA Vol 1 Annex A17.2.3 (RoCEv2 destination port 4791); Holoscan Sensor Bridge
# control port 8192 and data source port 12288 (UDP_CALL_PORT_BASE).
"""

from __future__ import annotations

import struct

from .header import Header
from .ipv4 import IpProtocol, ones_complement_sum

__all__ = ["UDP", "ROCEV2_PORT", "CONTROL_PORT", "UDP_CALL_PORT_BASE", "udp_checksum",
           "udp_checksum_ok"]

UDP = Header("UDP", [("src_port", 16), ("dst_port", 16), ("length", 16), ("checksum", 16)],
             ref="RFC 768")

#: IANA-assigned RoCEv2 destination port (IBTA Annex A17.2.3).
ROCEV2_PORT = 4791
#: Control plane port, as Holoscan Sensor Bridge's control bus.
CONTROL_PORT = 8192
#: First UDP port of the QSC's CALLs in UDP mode (a QP's TRANSPORT register 1), Holoscan Sensor
#: Bridge's data source port: QP ``q``'s own port is ``UDP_CALL_PORT_BASE + q``, the source port
#: of its requests and the destination port of their responses (CUDA-Q realtime's udp bridge
#: answers each request to the address and port it came from).
UDP_CALL_PORT_BASE = 12288


_PSEUDO = struct.Struct("!IIBBH")


def udp_checksum(src_ip: int, dst_ip: int, datagram: bytes | bytearray | memoryview) -> int:
    """RFC 768: the checksum to send in a datagram (header with a zero checksum field, and
    payload) from ``src_ip`` to ``dst_ip``: the complemented one's-complement sum over the IPv4
    pseudo-header and the datagram, 0xFFFF where that is 0 (0 means "none")."""
    pseudo = _PSEUDO.pack(src_ip, dst_ip, 0, IpProtocol.UDP, len(datagram))
    return (~ones_complement_sum(pseudo + bytes(datagram)) & 0xFFFF) or 0xFFFF


def udp_checksum_ok(src_ip: int, dst_ip: int, datagram: bytes | bytearray | memoryview) -> bool:
    """RFC 768: whether a datagram's checksum verifies: the one's-complement sum over the IPv4
    pseudo-header (source and destination address, zero, protocol 17, UDP length) and the
    datagram (header, checksum field included, and payload) is 0xFFFF.

    A checksum field of 0 means "not computed" (RFC 768; RFC 1122 4.1.3.4): callers accept such
    datagrams without calling this. ``datagram`` runs from the UDP header to the end of the UDP
    length.
    """
    pseudo = _PSEUDO.pack(src_ip, dst_ip, 0, IpProtocol.UDP, len(datagram))
    return ones_complement_sum(pseudo + bytes(datagram)) == 0xFFFF
