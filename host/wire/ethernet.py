"""Ethernet II framing (IEEE 802.3 clause 3.2, Ethernet II EtherType field).

# Ref: IEEE 802.3-2018 3.2; EtherType values from the IEEE registry (RFC 7042 appendix B).
"""

from __future__ import annotations

from amaranth.lib import enum

from .header import Header

__all__ = ["ETHERNET", "EtherType", "MIN_FRAME_BYTES", "mac_to_int", "int_to_mac"]

#: Ethernet II header: 14 bytes. ``dst``/``src`` are 48-bit MAC addresses, first octet on the wire
#: in the most significant byte.
ETHERNET = Header("Ethernet", [("dst", 48), ("src", 48), ("ethertype", 16)],
                  ref="IEEE 802.3-2018 3.2.3-3.2.6")

#: Shortest frame without its 4-byte FCS; shorter frames are padded with zeros before the FCS.
MIN_FRAME_BYTES = 60


class EtherType(enum.IntEnum, shape=16):
    """EtherType values the QSC handles."""

    IPV4 = 0x0800
    ARP = 0x0806


def mac_to_int(mac: str | bytes | int) -> int:
    """Turn ``"02:00:00:00:00:01"``, 6 bytes or an int into the 48-bit integer form."""
    if isinstance(mac, int):
        if not 0 <= mac < 1 << 48:
            raise ValueError(f"MAC address {mac:#x} does not fit in 48 bits")
        return mac
    if isinstance(mac, bytes | bytearray):
        if len(mac) != 6:
            raise ValueError(f"MAC address must be 6 bytes, got {len(mac)}")
        return int.from_bytes(mac, "big")
    parts = mac.replace("-", ":").split(":")
    if len(parts) != 6 or not all(len(p) in (1, 2) for p in parts):
        raise ValueError(f"not a MAC address: {mac!r}")
    return int.from_bytes(bytes(int(p, 16) for p in parts), "big")


def int_to_mac(value: int) -> str:
    """The colon-separated form of a 48-bit MAC address."""
    return ":".join(f"{b:02x}" for b in value.to_bytes(6, "big"))
