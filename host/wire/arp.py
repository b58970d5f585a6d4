"""ARP for IPv4 over Ethernet (RFC 826), the packet a QSC answers so that hosts can reach it.

# Ref: RFC 826 (packet format, the reply); RFC 5227 2.1 (requests with a zero sender address);
# IANA ARP parameters (hardware type 1 Ethernet, operation 1 request, 2 reply).
"""

from __future__ import annotations

from amaranth.lib import enum

from .header import Header

__all__ = ["ARP", "ArpOperation", "ARP_HTYPE_ETHERNET"]

#: The ARP packet for IPv4 over Ethernet: 28 bytes after the Ethernet header (EtherType 0x0806).
ARP = Header("ARP", [
    ("htype", 16), ("ptype", 16), ("hlen", 8), ("plen", 8), ("oper", 16),
    ("sha", 48), ("spa", 32), ("tha", 48), ("tpa", 32),
], ref="RFC 826", defaults={"htype": 1, "ptype": 0x0800, "hlen": 6, "plen": 4})

#: Hardware type of Ethernet.
ARP_HTYPE_ETHERNET = 1


class ArpOperation(enum.IntEnum, shape=16):
    REQUEST = 1
    REPLY = 2
