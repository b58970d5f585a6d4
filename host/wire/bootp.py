"""BOOTP announcements: how a QSC makes itself known on a LAN, as Holoscan Sensor Bridge boards do.

A QSC broadcasts a BOOTP request (RFC 951) every ``BOOTP_INTERVAL_MS`` milliseconds (global
register; 1000 from reset, 0 stops it) from its MAC and IP, to UDP port
:data:`BOOTP_REQUEST_PORT` (12267), where the Holoscan Sensor Bridge host library's enumerator
listens, with the sensor bridge's vendor area (tag 0xE0, vendor id "NVDA", enumeration version
2). The enumerator takes the board's IP from the datagram's source address, its MAC from
``chaddr``, and its UUID, serial number and IP version from the vendor area. The QSC takes no
BOOTP reply (its address is set through the control plane's QSC_IP register).

The frame, 342 bytes (Ethernet, IPv4, UDP, BOOTP):

* Ethernet: to ff:ff:ff:ff:ff:ff from the QSC's MAC, EtherType IPv4.
* IPv4: from the QSC's IP to 255.255.255.255, TTL 64, DF, identification 0, protocol UDP.
* UDP: from port :data:`BOOTP_REPLY_PORT` (12268, where an HSB board takes replies) to 12267,
  checksum 0 (not computed, RFC 768).
* BOOTP: op 1 (BOOTREQUEST), htype 1, hlen 6, hops 0, ``xid`` and ``secs`` 0, flags 0,
  ``ciaddr`` the QSC's IP, ``yiaddr``/``siaddr``/``giaddr`` 0, ``chaddr`` the QSC's MAC (then
  10 zero bytes), ``sname`` and ``file`` zero, and the 64-byte vendor area :data:`HSB_VENDOR`:
  tag 0xE0, length 56, vendor id 0x4E564441 ("NVDA", big-endian), data plane 0, enumeration
  version 2, 2 reserved bytes, the FPGA UUID (16 bytes, :data:`OPENQLINK_FPGA_UUID`), 4
  reserved bytes, the board serial number (7 bytes: the MAC's 6 bytes, then 0), the HSB IP
  version (16 bits little-endian: 0, the QSC claims no sensor-bridge IP version), the FPGA CRC
  (16 bits little-endian: 0), a PTP timestamp (10 bytes: 0, not synchronised), the
  announcement's sequence number (16 bits big-endian, counting from 0 at reset), a status byte
  (bit 0: PTP synchronised; 0), 4 reserved bytes, the end tag 0xFF and 5 bytes of padding.

The Holoscan Sensor Bridge host's sensor classes need an HSB IP version of at least 0x2501; a
QSC announcing 0 is found by the enumerator (and answers its control-plane requests) but is not
mistaken for a sensor bridge.

# Ref: RFC 951 (BOOTP message, ports 67/68 in the original; the sensor bridge uses 12267/12268);
# RFC 1542 (broadcast requests); Holoscan Sensor Bridge 2.7 enumerator (vendor area, enumeration
# version 2: the fields in the order above).
"""

from __future__ import annotations

import uuid

from .ethernet import ETHERNET, EtherType
from .header import Header
from .ipv4 import IPV4, IpProtocol, ipv4_checksum
from .udp import UDP

__all__ = ["BOOTP", "HSB_VENDOR", "BOOTP_REQUEST_PORT", "BOOTP_REPLY_PORT",
           "OPENQLINK_FPGA_UUID", "ANNOUNCE_FRAME_BYTES", "announcement_fields",
           "build_announcement", "parse_announcement", "parse_bootp_request"]

#: UDP port the enumerator listens on (the board's requests go here).
BOOTP_REQUEST_PORT = 12267
#: UDP port a sensor bridge takes replies on (the source port of its requests).
BOOTP_REPLY_PORT = 12268

#: The BOOTP message without its vendor area (RFC 951: 236 bytes).
BOOTP = Header("BOOTP", [
    ("op", 8), ("htype", 8), ("hlen", 8), ("hops", 8), ("xid", 32), ("secs", 16),
    ("flags", 16), ("ciaddr", 32), ("yiaddr", 32), ("siaddr", 32), ("giaddr", 32),
    ("chaddr", 128), ("sname", 512), ("file", 1024),
], ref="RFC 951", defaults={"op": 1, "htype": 1, "hlen": 6})

#: The 64-byte vendor area of a sensor bridge's BOOTP request (enumeration version 2).
HSB_VENDOR = Header("HSBVendor", [
    ("tag", 8), ("length", 8), ("vendor_id", 32), ("data_plane", 8), ("enum_version", 8),
    ("reserved_1", 16), ("fpga_uuid", 128), ("reserved_2", 32), ("serial_number", 56),
    ("hsb_ip_version_le", 16), ("fpga_crc_le", 16), ("ptp_timestamp", 80), ("sequence", 16),
    ("status", 8), ("reserved_3", 32), ("end", 8), ("pad", 40),
], ref="Holoscan Sensor Bridge enumeration version 2", defaults={
    "tag": 0xE0, "length": 56, "vendor_id": 0x4E564441, "enum_version": 2, "end": 0xFF})

#: The FPGA UUID an openqlink QSC announces (the enumerator's key for a board type).
OPENQLINK_FPGA_UUID = uuid.UUID("577fd696-560f-49f6-ae0a-c294e7ae3b23")

_BROADCAST_MAC = (1 << 48) - 1
_BROADCAST_IP = 0xFFFF_FFFF
_UDP_BYTES = UDP.length_bytes + BOOTP.length_bytes + HSB_VENDOR.length_bytes
#: Bytes of the announcement frame (no FCS).
ANNOUNCE_FRAME_BYTES = ETHERNET.length_bytes + IPV4.length_bytes + _UDP_BYTES


def announcement_fields(mac: int, ip: int, sequence: int) -> dict[str, dict[str, int]]:
    """The field values of each header of the announcement from ``mac`` (48-bit integer) and
    ``ip`` (32-bit integer) with sequence number ``sequence`` (16 bits), IPv4 checksum left 0:
    ``{"eth": ..., "ip": ..., "udp": ..., "bootp": ..., "vendor": ...}`` (the gateware
    builds the same headers from the same values)."""
    return {
        "eth": {"dst": _BROADCAST_MAC, "src": mac, "ethertype": EtherType.IPV4},
        "ip": {"total_length": IPV4.length_bytes + _UDP_BYTES, "identification": 0,
               "protocol": IpProtocol.UDP, "checksum": 0, "src": ip, "dst": _BROADCAST_IP},
        "udp": {"src_port": BOOTP_REPLY_PORT, "dst_port": BOOTP_REQUEST_PORT,
                "length": _UDP_BYTES, "checksum": 0},
        "bootp": {"ciaddr": ip, "chaddr": mac << 80},
        "vendor": {"fpga_uuid": OPENQLINK_FPGA_UUID.int, "serial_number": mac << 8,
                   "sequence": sequence},
    }


def build_announcement(mac: int, ip: int, sequence: int) -> bytes:
    """The announcement frame (:data:`ANNOUNCE_FRAME_BYTES` bytes, no FCS) as a QSC sends it."""
    f = announcement_fields(mac, ip, sequence)
    ip_header = IPV4.pack(**f["ip"])
    ip_header = IPV4.pack(**{**f["ip"], "checksum": ipv4_checksum(ip_header)})
    return (ETHERNET.pack(**f["eth"]) + ip_header + UDP.pack(**f["udp"])
            + BOOTP.pack(**f["bootp"]) + HSB_VENDOR.pack(**f["vendor"]))


def parse_announcement(frame: bytes) -> dict[str, object]:
    """Decode a sensor bridge's BOOTP request frame (Ethernet, IPv4, UDP) as an enumerator
    does: :func:`parse_bootp_request` of its UDP payload, ``ip`` its IPv4 source.

    Raises :class:`~openqlink.errors.WireFormatError` (``TruncatedError`` for a short frame)
    naming the field that is not a sensor bridge's: EtherType, protocol, UDP port, and those of
    :func:`parse_bootp_request`.
    """
    from ..errors import WireFormatError
    from .ipv4 import int_to_ip

    eth = ETHERNET.unpack(frame)
    if eth["ethertype"] != EtherType.IPV4:
        raise WireFormatError("Ethernet", "ethertype", eth["ethertype"], "not IPv4")
    at = ETHERNET.length_bytes
    ip = IPV4.unpack(frame, at)
    if ip["protocol"] != IpProtocol.UDP:
        raise WireFormatError("IPv4", "protocol", ip["protocol"], "not UDP")
    at += 4 * ip["ihl"]
    udp = UDP.unpack(frame, at)
    if udp["dst_port"] != BOOTP_REQUEST_PORT:
        raise WireFormatError("UDP", "dst_port", udp["dst_port"],
                              f"not the enumerator's port {BOOTP_REQUEST_PORT}")
    at += UDP.length_bytes
    return parse_bootp_request(frame[at:at + udp["length"] - UDP.length_bytes],
                               int_to_ip(ip["src"]))


def parse_bootp_request(payload: bytes, src_ip: str) -> dict[str, object]:
    """Decode the UDP payload of a sensor bridge's BOOTP request that came from ``src_ip``:
    ``mac``, ``ip`` (``src_ip``: the enumerator's address of the board), ``ciaddr``,
    ``data_plane``, ``enum_version``, ``fpga_uuid`` (UUID string), ``serial_number`` (hex of its
    7 bytes), ``hsb_ip_version``, ``sequence``.

    Raises :class:`~openqlink.errors.WireFormatError` (``TruncatedError`` for a short payload)
    naming the field that is not a sensor bridge's: BOOTP ``op`` or ``hlen``, vendor ``tag`` or
    ``vendor_id``.
    """
    from ..errors import WireFormatError
    from .ethernet import int_to_mac
    from .ipv4 import int_to_ip

    bootp = BOOTP.unpack(payload)
    if bootp["op"] != 1:
        raise WireFormatError("BOOTP", "op", bootp["op"], "not a BOOTREQUEST (1)")
    if bootp["hlen"] != 6:
        raise WireFormatError("BOOTP", "hlen", bootp["hlen"], "not an Ethernet address (6)")
    vendor = HSB_VENDOR.unpack(payload, BOOTP.length_bytes)
    if vendor["tag"] != 0xE0:
        raise WireFormatError("HSBVendor", "tag", vendor["tag"], "not 0xE0")
    if vendor["vendor_id"] != 0x4E564441:
        raise WireFormatError("HSBVendor", "vendor_id", vendor["vendor_id"], "not 'NVDA'")
    return {
        "mac": int_to_mac(bootp["chaddr"] >> 80), "ip": src_ip,
        "ciaddr": int_to_ip(bootp["ciaddr"]),
        "data_plane": vendor["data_plane"], "enum_version": vendor["enum_version"],
        "fpga_uuid": str(uuid.UUID(int=vendor["fpga_uuid"])),
        "serial_number": vendor["serial_number"].to_bytes(7, "big").hex(),
        "hsb_ip_version": int.from_bytes(vendor["hsb_ip_version_le"].to_bytes(2, "big"),
                                         "little"),
        "sequence": vendor["sequence"],
    }
