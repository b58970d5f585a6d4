"""Whole-frame codecs: Ethernet II / IPv4 / UDP frames, RoCEv2 UC packets, and their parser.

Built on the shared headers (:mod:`openqlink.wire.ethernet`, :mod:`~openqlink.wire.ipv4`,
:mod:`~openqlink.wire.udp`, :mod:`~openqlink.wire.roce`, :mod:`~openqlink.wire.control`); byte
order is handled only by :meth:`openqlink.wire.header.Header.pack` / ``unpack``.

Frames run from the destination MAC address through the Ethernet padding; the 4-byte FCS is not
part of them (the MAC or the kernel adds and strips it). Built frames are padded with zeros to
:data:`~openqlink.wire.ethernet.MIN_FRAME_BYTES` (60 bytes).

A RoCEv2 packet is BTH, then RETH (RDMA_WRITE_FIRST/ONLY[_WITH_IMMEDIATE]), then ImmDt
(*_WITH_IMMEDIATE), then the payload, ``PadCnt`` zero bytes to a multiple of 4, and the ICRC.

# Ref: IEEE 802.3-2018 3.2; RFC 791 3.1; RFC 1071; RFC 768; IBTA Vol 1 Release 1.4 9.2, 9.3.2,
# 9.3.4, 7.8.1; IBTA Annex A17 (RoCEv2) A17.4.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..errors import TruncatedError, WireFormatError
from .control import CONTROL_REQUEST, RESPONSE_BIT, Command, unpack_block_request, unpack_response
from .ethernet import ETHERNET, MIN_FRAME_BYTES, EtherType, mac_to_int
from .ipv4 import IPV4, IpProtocol, ip_to_int, ipv4_checksum
from .roce import BTH, DEFAULT_P_KEY, ICRC_BYTES, IMMDT, RETH, Opcode, icrc
from .udp import CONTROL_PORT, ROCEV2_PORT, UDP

__all__ = [
    "Frame",
    "build_udp_frame",
    "build_roce_frame",
    "parse_frame",
    "roce_overhead_bytes",
    "DEFAULT_ROCE_SRC_PORT",
    "ROCE_HEADERS",
    "ROCE_HEADER_FIELDS",
    "ROCE_HEADERS_BYTES",
    "RETH_CODEC",
    "IMMDT_CODEC",
    "UDP_FRAME_HEADERS",
]

#: UDP source port of the RoCEv2 packets we build unless told otherwise (the QSC's reset value of
#: ``UDP_SRC_PORT``; RoCEv2 leaves the source port to the sender, Annex A17.2.3).
DEFAULT_ROCE_SRC_PORT = 0xC000

_IPV4_BYTES = IPV4.length_bytes      # 20
_UDP_BYTES = UDP.length_bytes        # 8
_ETH_BYTES = ETHERNET.length_bytes   # 14

#: The Ethernet II, IPv4 (no options), UDP and BTH headers of a RoCEv2 frame as one
#: :class:`struct.Struct`, for the host's per-packet path: 54 bytes, 22 items. Which item holds
#: which field of the :class:`~openqlink.wire.header.Header` definitions (the single definition;
#: a test checks this table against them) is :data:`ROCE_HEADER_FIELDS`.
ROCE_HEADERS = struct.Struct("!6s6sH" "BBHHHBBHII" "HHHH" "BBHII")
#: The Ethernet II, IPv4 (no options) and UDP headers of any UDP frame (42 bytes): the first 17
#: items of :data:`ROCE_HEADERS`, as :data:`ROCE_HEADER_FIELDS` names them.
UDP_FRAME_HEADERS = struct.Struct(ROCE_HEADERS.format[:-len("BBHII")])
ROCE_HEADERS_BYTES = ROCE_HEADERS.size
#: ``(header name, field) -> (item of ROCE_HEADERS.unpack, right shift, width in bits)``;
#: 48-bit MAC addresses are items of 6 bytes, in wire order.
ROCE_HEADER_FIELDS: dict[tuple[str, str], tuple[int, int, int]] = {
    ("Ethernet", "dst"): (0, 0, 48), ("Ethernet", "src"): (1, 0, 48),
    ("Ethernet", "ethertype"): (2, 0, 16),
    ("IPv4", "version"): (3, 4, 4), ("IPv4", "ihl"): (3, 0, 4), ("IPv4", "tos"): (4, 0, 8),
    ("IPv4", "total_length"): (5, 0, 16), ("IPv4", "identification"): (6, 0, 16),
    ("IPv4", "flags"): (7, 13, 3), ("IPv4", "fragment_offset"): (7, 0, 13),
    ("IPv4", "ttl"): (8, 0, 8), ("IPv4", "protocol"): (9, 0, 8),
    ("IPv4", "checksum"): (10, 0, 16), ("IPv4", "src"): (11, 0, 32),
    ("IPv4", "dst"): (12, 0, 32),
    ("UDP", "src_port"): (13, 0, 16), ("UDP", "dst_port"): (14, 0, 16),
    ("UDP", "length"): (15, 0, 16), ("UDP", "checksum"): (16, 0, 16),
    ("BTH", "opcode"): (17, 0, 8), ("BTH", "se"): (18, 7, 1), ("BTH", "m"): (18, 6, 1),
    ("BTH", "pad_cnt"): (18, 4, 2), ("BTH", "tver"): (18, 0, 4), ("BTH", "p_key"): (19, 0, 16),
    ("BTH", "fecn"): (20, 31, 1), ("BTH", "becn"): (20, 30, 1), ("BTH", "resv6"): (20, 24, 6),
    ("BTH", "dest_qp"): (20, 0, 24), ("BTH", "a"): (21, 31, 1), ("BTH", "resv7"): (21, 24, 7),
    ("BTH", "psn"): (21, 0, 24),
}
#: RETH (va, r_key, dma_len) and ImmDt (imm), big-endian as every IBTA header.
RETH_CODEC = struct.Struct("!QII")
IMMDT_CODEC = struct.Struct("!I")


@dataclass
class Frame:
    """A decoded frame.

    Header dicts map the field names of the shared :class:`~openqlink.wire.header.Header`
    definitions to ints. A field is ``None`` when the frame does not hold that header.

    Attributes
    ----------
    eth : dict
        Ethernet II header (``dst``, ``src``, ``ethertype``).
    ip : dict | None
        IPv4 header, when ``ethertype`` is IPv4.
    udp : dict | None
        UDP header, when the IPv4 protocol is UDP.
    bth, reth, immdt : dict | None
        RoCEv2 headers, for UDP destination port 4791. ``reth``/``immdt`` only for the opcodes
        that carry them (UC opcodes; for other opcodes everything after the BTH is payload).
    payload : bytes
        RoCEv2: the payload without pad bytes and ICRC. UDP: the datagram payload (as bounded by
        the UDP length). IPv4 without UDP: the IP payload. Other EtherTypes: everything after the
        Ethernet header, padding included.
    icrc : bytes | None
        The 4 ICRC bytes as received (RoCEv2 only).
    icrc_ok : bool | None
        Whether the received ICRC matches the one computed over the packet (RoCEv2 only).
    ip_checksum_ok : bool | None
        Whether the IPv4 header checksum verifies (either one's-complement zero form).
    control : dict | None
        For UDP port 8192 (either direction): a DWORD request (14 bytes,
        :data:`~openqlink.wire.control.CONTROL_REQUEST`), a block request (its header's fields
        and ``pairs``, :func:`~openqlink.wire.control.unpack_block_request`) or a response
        (``cmd`` has bit 7 set; :func:`~openqlink.wire.control.unpack_response`: the header,
        ``pairs``, the first pair's ``addr``/``value``, ``latched_seq``).
    """

    eth: dict[str, int]
    ip: dict[str, int] | None = None
    udp: dict[str, int] | None = None
    bth: dict[str, int] | None = None
    reth: dict[str, int] | None = None
    immdt: dict[str, int] | None = None
    payload: bytes = b""
    icrc: bytes | None = None
    icrc_ok: bool | None = None
    ip_checksum_ok: bool | None = None
    control: dict[str, int] | None = field(default=None)

    @property
    def is_roce(self) -> bool:
        """True for a RoCEv2 packet (UDP destination port 4791)."""
        return self.bth is not None

    @property
    def is_control(self) -> bool:
        """True for a control-plane request or response (UDP port 8192)."""
        return self.control is not None

    @property
    def is_control_response(self) -> bool:
        return self.control is not None and bool(self.control["cmd"] & RESPONSE_BIT)


def _uc_opcode(value: int) -> Opcode | None:
    """``value`` as a UC :class:`Opcode`, or ``None`` when it is not one."""
    try:
        return Opcode(value)
    except ValueError:
        return None


def _pad_frame(frame: bytes) -> bytes:
    if len(frame) < MIN_FRAME_BYTES:
        frame += bytes(MIN_FRAME_BYTES - len(frame))
    return frame


def _ip_udp_headers(*, src_ip: str | int, dst_ip: str | int, src_port: int, dst_port: int,
                    udp_payload_bytes: int, ttl: int, tos: int, identification: int,
                    udp_checksum: int) -> bytes:
    udp_len = _UDP_BYTES + udp_payload_bytes
    total = _IPV4_BYTES + udp_len
    if total > 0xFFFF:
        raise WireFormatError("IPv4", "total_length", total,
                              f"{total} bytes do not fit the 16-bit total length")
    ip_fields = dict(tos=tos, total_length=total, identification=identification, ttl=ttl,
                     protocol=IpProtocol.UDP, src=ip_to_int(src_ip), dst=ip_to_int(dst_ip))
    hdr = IPV4.pack(**ip_fields)
    hdr = IPV4.pack(**ip_fields, checksum=ipv4_checksum(hdr))
    return hdr + UDP.pack(src_port=src_port, dst_port=dst_port, length=udp_len,
                          checksum=udp_checksum)


def build_udp_frame(*, dst_mac: str | bytes | int, src_mac: str | bytes | int,
                    src_ip: str | int, dst_ip: str | int, src_port: int, dst_port: int,
                    payload: bytes = b"", ttl: int = 64, tos: int = 0, identification: int = 0,
                    udp_checksum: int = 0) -> bytes:
    """An Ethernet II + IPv4 + UDP frame carrying ``payload``.

    The IPv4 header has no options, DF set, and its RFC 1071 checksum; the UDP checksum is sent
    as ``udp_checksum`` (default 0: not computed, RFC 768). Frames shorter than 60 bytes are padded
    with zeros. MACs are ``"aa:bb:.."`` strings, 6 bytes or 48-bit ints; IPs dotted strings or
    32-bit ints.

    Raises :class:`~openqlink.errors.FieldRangeError` naming the header field a value does not
    fit, :class:`ValueError` for a malformed address.
    """
    eth = ETHERNET.pack(dst=mac_to_int(dst_mac), src=mac_to_int(src_mac),
                        ethertype=EtherType.IPV4)
    headers = _ip_udp_headers(src_ip=src_ip, dst_ip=dst_ip, src_port=src_port,
                              dst_port=dst_port, udp_payload_bytes=len(payload), ttl=ttl, tos=tos,
                              identification=identification, udp_checksum=udp_checksum)
    return _pad_frame(eth + headers + bytes(payload))


def roce_overhead_bytes(opcode: Opcode) -> int:
    """Bytes a UC packet of ``opcode`` adds around its payload, from the Ethernet header
    through the ICRC (pad bytes excluded): 58 + 16 with a RETH + 4 with an ImmDt."""
    return (_ETH_BYTES + _IPV4_BYTES + _UDP_BYTES + BTH.length_bytes + ICRC_BYTES
            + (RETH.length_bytes if opcode.has_reth else 0)
            + (IMMDT.length_bytes if opcode.has_immdt else 0))


def build_roce_frame(*, dst_mac: str | bytes | int, src_mac: str | bytes | int,
                     src_ip: str | int, dst_ip: str | int, opcode: Opcode | int, dest_qp: int,
                     psn: int, p_key: int = DEFAULT_P_KEY, src_port: int = DEFAULT_ROCE_SRC_PORT,
                     dst_port: int = ROCEV2_PORT, va: int | None = None,
                     r_key: int | None = None, dma_len: int | None = None,
                     imm: int | None = None, payload: bytes = b"", se: int = 0, ack_req: int = 0,
                     m: int = 0, tver: int = 0, fecn: int = 0, becn: int = 0, ttl: int = 64,
                     tos: int = 0, identification: int = 0) -> bytes:
    """A RoCEv2 packet in an Ethernet II frame, with PadCnt, lengths, IPv4 checksum and ICRC.

    Parameters
    ----------
    opcode : Opcode | int
        BTH opcode. For a UC :class:`~openqlink.wire.roce.Opcode`, the RETH must be given (``va``
        and ``r_key``) exactly when the opcode carries one, and ``imm`` exactly when it carries an
        ImmDt. Other opcode values (8 bits) are built with whatever extension headers are given.
    dest_qp, psn : int
        24-bit destination QP number and packet sequence number.
    va, r_key, dma_len : int | None
        RETH fields (64, 32, 32 bits); ``dma_len`` defaults to ``len(payload)``.
    imm : int | None
        32-bit immediate data (ImmDt), big-endian on the wire like every IBTA header.
    payload : bytes
        Packet payload; ``(-len(payload)) % 4`` zero pad bytes follow it (BTH PadCnt).

    The UDP checksum is 0 (RoCEv2 senders may leave it out). The frame is padded to 60 bytes.

    Raises
    ------
    WireFormatError
        Naming ``RETH.va``/``ImmDt.imm`` when a header the opcode needs is missing or one it does
        not have is given.
    FieldRangeError
        Naming the header field whose value does not fit.
    """
    has_reth = va is not None or r_key is not None or dma_len is not None
    op = _uc_opcode(int(opcode))
    if op is not None:
        if op.has_reth and (va is None or r_key is None):
            raise WireFormatError("RETH", "va" if va is None else "r_key", None,
                                  f"{op.name} needs a RETH: give va and r_key")
        if not op.has_reth and has_reth:
            raise WireFormatError("RETH", "va", va, f"{op.name} carries no RETH")
        if op.has_immdt and imm is None:
            raise WireFormatError("ImmDt", "imm", None, f"{op.name} needs an immediate")
        if not op.has_immdt and imm is not None:
            raise WireFormatError("ImmDt", "imm", imm, f"{op.name} carries no immediate")
    elif has_reth and (va is None or r_key is None):
        raise WireFormatError("RETH", "va" if va is None else "r_key", None,
                              "a RETH needs both va and r_key")
    payload = bytes(payload)
    pad = (-len(payload)) % 4
    transport = BTH.pack(opcode=int(opcode), se=se, m=m, pad_cnt=pad, tver=tver, p_key=p_key,
                         fecn=fecn, becn=becn, dest_qp=dest_qp, a=ack_req, psn=psn)
    if has_reth:
        transport += RETH.pack(va=va, r_key=r_key,
                               dma_len=len(payload) if dma_len is None else dma_len)
    if imm is not None:
        transport += IMMDT.pack(imm=imm)
    transport += payload + bytes(pad)
    headers = _ip_udp_headers(src_ip=src_ip, dst_ip=dst_ip, src_port=src_port,
                              dst_port=dst_port, udp_payload_bytes=len(transport) + ICRC_BYTES,
                              ttl=ttl, tos=tos, identification=identification, udp_checksum=0)
    packet = headers + transport
    eth = ETHERNET.pack(dst=mac_to_int(dst_mac), src=mac_to_int(src_mac),
                        ethertype=EtherType.IPV4)
    return _pad_frame(eth + packet + icrc(packet))


def _parse_roce(f: Frame, ip_packet: bytes, udp_payload: bytes) -> None:
    bth = BTH.unpack(udp_payload)
    f.bth = bth
    pos = BTH.length_bytes
    if len(udp_payload) < pos + ICRC_BYTES:
        raise TruncatedError("ICRC", "icrc", None,
                             f"the UDP payload ({len(udp_payload)} bytes) ends before the ICRC")
    end = len(udp_payload) - ICRC_BYTES
    op = _uc_opcode(bth["opcode"])
    if op is not None and op.has_reth:
        if end < pos + RETH.length_bytes:
            raise TruncatedError("RETH", "va", None,
                                 f"{op.name} needs a RETH; the packet ends before it")
        f.reth = RETH.unpack(udp_payload, pos)
        pos += RETH.length_bytes
    if op is not None and op.has_immdt:
        if end < pos + IMMDT.length_bytes:
            raise TruncatedError("ImmDt", "imm", None,
                                 f"{op.name} needs an ImmDt; the packet ends before it")
        f.immdt = IMMDT.unpack(udp_payload, pos)
        pos += IMMDT.length_bytes
    body = udp_payload[pos:end]
    pad = bth["pad_cnt"]
    if pad > len(body):
        raise WireFormatError("BTH", "pad_cnt", pad,
                              f"pad count {pad} exceeds the {len(body)} bytes after the headers")
    f.payload = body[:len(body) - pad]
    f.icrc = udp_payload[end:]
    covered = ip_packet[:_IPV4_BYTES + _UDP_BYTES + end]
    f.icrc_ok = icrc(covered) == f.icrc


def parse_frame(frame: bytes | bytearray | memoryview) -> Frame:
    """Decode a frame (FCS stripped, padding allowed) into a :class:`Frame`.

    Bad checksums are reported in ``ip_checksum_ok``/``icrc_ok``, not raised: the frame's
    structure is still readable.

    Raises
    ------
    TruncatedError
        A header, or the IPv4/UDP length, runs past the end of the frame (names the header and
        field).
    WireFormatError
        IPv4 ``version`` not 4, ``ihl`` not 5 (options are not supported), a fragment
        (``flags``/``fragment_offset``), ``total_length`` or UDP ``length`` shorter than its
        header, or a BTH ``pad_cnt`` longer than the payload.
    """
    frame = bytes(frame)
    f = Frame(eth=ETHERNET.unpack(frame))
    rest = frame[_ETH_BYTES:]
    if f.eth["ethertype"] != EtherType.IPV4:
        f.payload = rest
        return f
    ip = IPV4.unpack(rest)
    f.ip = ip
    if ip["version"] != 4:
        raise WireFormatError("IPv4", "version", ip["version"], "not 4")
    if ip["ihl"] != 5:
        raise WireFormatError("IPv4", "ihl", ip["ihl"], "IPv4 options are not supported")
    total = ip["total_length"]
    if total < _IPV4_BYTES:
        raise WireFormatError("IPv4", "total_length", total, "shorter than the IPv4 header")
    if total > len(rest):
        raise TruncatedError("IPv4", "total_length", total,
                             f"total length {total} runs past the {len(rest)} bytes after the "
                             "Ethernet header")
    f.ip_checksum_ok = ipv4_checksum(rest[:_IPV4_BYTES]) in (0, 0xFFFF)
    ip_packet = rest[:total]
    if ip["protocol"] != IpProtocol.UDP:
        f.payload = ip_packet[_IPV4_BYTES:]
        return f
    if ip["fragment_offset"] or ip["flags"] & 0b001:
        raise WireFormatError("IPv4", "fragment_offset" if ip["fragment_offset"] else "flags",
                              ip["fragment_offset"] or ip["flags"],
                              "fragmented datagrams are not supported")
    udp = UDP.unpack(ip_packet, _IPV4_BYTES)
    f.udp = udp
    if udp["length"] < _UDP_BYTES:
        raise WireFormatError("UDP", "length", udp["length"], "shorter than the UDP header")
    if _IPV4_BYTES + udp["length"] > total:
        raise TruncatedError("UDP", "length", udp["length"],
                             f"UDP length {udp['length']} runs past the IPv4 total length "
                             f"{total}")
    udp_payload = ip_packet[_IPV4_BYTES + _UDP_BYTES:_IPV4_BYTES + udp["length"]]
    if udp["dst_port"] == ROCEV2_PORT:
        _parse_roce(f, ip_packet, udp_payload)
        return f
    f.payload = udp_payload
    if CONTROL_PORT in (udp["src_port"], udp["dst_port"]) and udp_payload:
        if udp_payload[0] & RESPONSE_BIT:
            f.control = unpack_response(udp_payload)
        elif udp_payload[0] in (Command.WR_BLOCK, Command.RD_BLOCK):
            head, pairs = unpack_block_request(udp_payload)
            f.control = {**head, "pairs": pairs}
        else:
            f.control = CONTROL_REQUEST.unpack(udp_payload)
    return f
