"""IPv4 header without options (RFC 791) and its header checksum (RFC 1071).

# Ref: RFC 791 3.1; RFC 1071 (one's-complement checksum); RFC 1624 (both zero forms).
"""

from __future__ import annotations

import ipaddress
import struct
import sys

from amaranth.lib import enum

from .header import Header

__all__ = ["IPV4", "IpProtocol", "ipv4_checksum", "ip_to_int", "int_to_ip"]

#: IPv4 header without options: 20 bytes, IHL = 5. ``tos`` is the whole DSCP/ECN byte, which the
#: RoCEv2 ICRC masks as one byte.
IPV4 = Header("IPv4", [
    ("version", 4), ("ihl", 4), ("tos", 8), ("total_length", 16),
    ("identification", 16), ("flags", 3), ("fragment_offset", 13),
    ("ttl", 8), ("protocol", 8), ("checksum", 16),
    ("src", 32), ("dst", 32),
], ref="RFC 791 3.1", defaults={"version": 4, "ihl": 5, "ttl": 64, "flags": 0b010})


class IpProtocol(enum.IntEnum, shape=8):
    ICMP = 1
    UDP = 17


def ones_complement_sum(data: bytes | bytearray | memoryview) -> int:
    """The RFC 1071 one's-complement sum of ``data`` as 16-bit big-endian words (an odd byte
    padded with a zero byte), folded to 16 bits with end-around carry.

    Summed in the machine's byte order and swapped back (RFC 1071 2.(B): the sum does not depend
    on byte order), in C: about 1 us for a 1500-byte datagram.
    """
    if len(data) % 2:
        data = bytes(data) + b"\0"
    total = sum(memoryview(data).cast("B").cast("H"))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    if sys.byteorder == "little":
        total = ((total & 0xFF) << 8) | (total >> 8)
    return total


_HEADER_WORDS = struct.Struct("!10H")


def ipv4_header_ok(buf: bytes | bytearray | memoryview, offset: int = 0) -> bool:
    """Whether the 20-byte IPv4 header (no options) at ``buf[offset:]`` has a checksum that
    verifies: its ten words sum to a one's-complement zero (0xFFFF, or 0x0000; RFC 1624 3)."""
    total = sum(_HEADER_WORDS.unpack_from(buf, offset))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return total in (0, 0xFFFF)


def ipv4_checksum(header: bytes | bytearray | memoryview) -> int:
    """RFC 1071 one's-complement sum of the 16-bit words of ``header``, complemented.

    Computing it over a header whose checksum field holds the right value gives 0 (or 0xFFFF:
    both one's-complement zeros are accepted, RFC 1624 section 3).
    """
    return ~ones_complement_sum(header) & 0xFFFF


def ip_to_int(ip: str | int) -> int:
    """``"192.168.0.2"`` (or an int) as a 32-bit integer."""
    if isinstance(ip, int):
        if not 0 <= ip < 1 << 32:
            raise ValueError(f"IPv4 address {ip:#x} does not fit in 32 bits")
        return ip
    return int(ipaddress.IPv4Address(ip))


def int_to_ip(value: int) -> str:
    return str(ipaddress.IPv4Address(value))
