"""Reference model of the QSC's receive rules, for tests: what a frame must do, from the specs.

# Ref: IEEE 802.3-2018 3.2 (Ethernet II); RFC 826 (ARP request); RFC 791 3.1 (IPv4 header),
# RFC 1071 (one's-complement checksum), RFC 1624 3 (both zero forms of a sum); RFC 768 (UDP),
# RFC 1122 4.1.3.4 (a non-zero UDP checksum is verified, zero means none); RFC 792 (ICMP echo);
# IBTA Vol 1 Release 1.4 9.2 (BTH, UC opcodes), 9.3.2 (RETH), 9.3.4 (ImmDt), 9.4.3 (RDMA WRITE),
# 9.7.6 and 9.8.3 (UC receive: PSN, FIRST/MIDDLE/LAST sequences), C9-88 (a zero-length RDMA WRITE
# checks no VA or R_Key), 10.9.3 (P_Key), 7.8.1 (ICRC); IBTA Annex A17 (RoCEv2) A17.2.3 (UDP port
# 4791), A17.4.4 (ICRC over the IPv4/UDP/BTH headers with their variant fields masked);
# rdma-core rxe ``check_psn`` (UC) and ``check_rkey``; cuda-quantum realtime's udp bridge
# (bridge_impl.cpp, udp_transceiver.cpp: one datagram a ring slot); :mod:`openqlink.memory_map`
# (regions, COUNTERS, the QP registers, QP_COUNTERS); the receive order that
# :mod:`openqlink.gateware.net.rx` documents.

The model is written from those documents, not from the receiver's logic. Given the
configuration a host applied (:class:`RxConfig`: the QSC's addresses, P_Key, RX_ENABLE and, for
each of the build's ``num_qps`` QPs, its peer's addresses, the PPU it reaches, its region
R_Keys and their valid bits, QSC_QPN, RESPONSE_BYTES and PMTU) and the state of each QP (the
expected PSN and the open message: :class:`Message`), it decides a frame
(:meth:`RxModel.judge`): the first failing check of the documented order names the drop
counter, or the frame is taken (a RoCEv2 packet, a control request, an ARP or echo request, a
UDP-mode response).

UDP mode (a PPU's own QP ``q`` whose TRANSPORT register is 1, CUDA-Q realtime's udp bridge): a
UDP datagram to port UDP_CALL_PORT_BASE + q is the QP's response; after the UDP checks (its
checksum verified unless 0) it must come from the QP's peer MAC and IP and from its
PEER_UDP_PORT (else DROP_PEER) and carry 24 (an RPCResponse) to RESPONSE_BYTES bytes (else
DROP_LENGTH); taken (:data:`UDP_RESPONSE`), its first MAILBOX_BYTES land in the PPU's mailbox
with a MAILBOX_COMMIT, and it counts RX_RPC_RESPONSES, never RX_ROCE_ACCEPTED. It counts in the
QP's RX_PACKETS or RX_DROPS and leaves the QP's expected PSN and open message. A datagram to that
port while the QP is in RoCE mode (TRANSPORT 0), or to the port of a QP beyond the PPUs, is no
QP's: DROP_UDP.

QPs and PPUs: a RoCEv2 packet belongs to the lowest QP ``q`` whose QSC_QPN is its DestQP. QP
``q < num_ppus`` is PPU ``q``'s own; every other QP reaches the PPU its PPU register names (0
from reset). The QP decides the peer check (its PEER_MAC, PEER_IP), the PSN and open message,
the R_Keys and their valid bits (the QP's map: the regions its host opened), the PMTU and
RESPONSE_BYTES; the PPU it reaches decides where the bytes may land: the VA window and regions,
the mailbox of a SEND, the TAIL of an ImmDt. :attr:`Verdict.qp` and :attr:`Verdict.ppu` name
both. The model also counts what each QP's counters count (:attr:`RxModel.qp_counters`,
:data:`openqlink.memory_map.QP_COUNTERS`): RX_PACKETS (packets of the QP taken), RX_DROPS
(packets of the QP, DestQP its QSC_QPN, dropped for any later reason, DROP_PEER and
DROP_OVERFLOW included) and RX_DROPS_PSN (of those, the DROP_PSN ones); TX_PACKETS counts what a
QP sends, never a packet received.

Every UC opcode (IBTA Vol 1 9.2, 0x20-0x2B) is handled: SEND and RDMA WRITE, FIRST, MIDDLE,
LAST and ONLY, with and without immediate. For a RoCEv2 packet taken the verdict gives the bytes
to write and where (a WRITE's ONLY or FIRST at its VA, a MIDDLE or LAST where the message got
to), the TAIL write of a WRITE ``*_WITH_IMMEDIATE`` ending a message into the instruction ring,
the mailbox bytes of a SEND ONLY or FIRST and the MAILBOX_COMMIT of a SEND ONLY or LAST, whether
it counts RX_RPC_RESPONSES (a SEND ending a message), and the QP's open message after it.
:meth:`RxModel.apply` moves the state: an accepted packet sets the expected PSN to its PSN + 1
and opens, advances or closes the message; any other packet of the QP (one that passed the
checks up to PEER) closes the message and leaves the expected PSN. A MIDDLE or LAST with no
open message, of the other kind (SEND, WRITE), or whose PSN is not the expected one is dropped
(DROP_PSN, rxe's ``check_psn`` for UC); a FIRST or ONLY is taken whatever its PSN (a jump counts
PSN_GAP) and abandons an open message. A zero-length RDMA WRITE (DMALen 0) is taken without its
VA and R_Key checked (IBTA C9-88, as rxe): nothing is written, and no TAIL.

Where the documents leave room, :attr:`Verdict.also` lists the other outcomes allowed: an echo
request whose frame is longer than the echo buffer while its IP packet is not (or the reverse:
"a frame longer than ECHO_MAX_FRAME_BYTES" may count Ethernet padding or not), and a control
request longer than the whole receive buffer.

Outside the model: the occupancy of the receive buffer and of the queues (DROP_OVERFLOW of a
frame that fits the buffer depends on how fast the bus and the control plane take; a caller that
lets them stall accepts OVERFLOW in place of any packet or request the model takes, and tells
the model with :meth:`RxModel.apply_dropped`, which closes the QP's message as the receiver
does; only a frame longer than the whole buffer is known not to fit), timing, the responder's
replies, DROP_BUS, and the control plane's handling of a request once taken.
"""

from __future__ import annotations

import copy
import dataclasses
import struct
import zlib
from dataclasses import dataclass, field

from ..memory_map import (
    MAILBOX_BYTES,
    MAILBOX_OFFSET,
    QP_COUNTERS,
    QSCParams,
    ppu_base,
    ppu_reg,
    regions,
)
from ..wire.roce import PATH_MTU_BYTES

__all__ = [
    "ACCEPTED", "UDP_RESPONSE", "CONTROL", "ARP_REQUEST", "ECHO_REQUEST", "DROP_REASONS",
    "OUTCOMES",
    "PMTU_RESET", "RxConfig", "Write", "Message", "Verdict", "RxModel",
    "ones_complement_sum", "ipv4_header_ok", "udp_checksum_ok", "roce_icrc", "parse_mac",
    "parse_ip", "pmtu_bytes",
]

#: Outcome of a RoCEv2 packet taken (counted RX_ROCE_ACCEPTED).
ACCEPTED = "RX_ROCE_ACCEPTED"
#: Outcome of a UDP-mode response taken (no counter of its own: RX_RPC_RESPONSES alone).
UDP_RESPONSE = "UDP_RESPONSE"
#: Outcome of a control request taken (no counter of the receiver's; the control plane's).
CONTROL = "CONTROL"
#: Outcome of an ARP request for the QSC's IP (counted RX_ARP_REQUESTS).
ARP_REQUEST = "RX_ARP_REQUESTS"
#: Outcome of an ICMP echo request taken (counted RX_ECHO_REQUESTS).
ECHO_REQUEST = "RX_ECHO_REQUESTS"
#: The drop counters a frame can be counted under (openqlink.memory_map.COUNTERS).
DROP_REASONS = ("DROP_MAC", "DROP_ETH", "DROP_ARP", "DROP_IP", "DROP_ICMP", "DROP_UDP",
                "DROP_ICRC", "DROP_OPCODE", "DROP_PKEY", "DROP_QPN", "DROP_PEER", "DROP_PSN",
                "DROP_LENGTH", "DROP_VA", "DROP_RKEY", "DROP_IMMDT", "DROP_OVERFLOW")
#: Every outcome of a frame: exactly one per frame.
OUTCOMES = (ACCEPTED, UDP_RESPONSE, CONTROL, ARP_REQUEST, ECHO_REQUEST) + DROP_REASONS

# Wire constants, from the specs named.
_ETH = 14                       # IEEE 802.3 3.2: dst, src, EtherType
_IPV4 = 20                      # RFC 791 3.1, IHL 5 (no options)
_UDP = 8                        # RFC 768
_BTH = 12                       # IBTA Vol 1 9.2
_RETH = 16                      # IBTA Vol 1 9.3.2
_IMMDT = 4                      # IBTA Vol 1 9.3.4
_ICRC = 4                       # IBTA Vol 1 7.8.1
_ARP = 28                       # RFC 826, Ethernet/IPv4
_ICMP_ECHO = 8                  # RFC 792: type, code, checksum, identifier, sequence
_BROADCAST = (1 << 48) - 1
_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_ARP = 0x0806
_PROTO_ICMP = 1
_PROTO_UDP = 17
_ROCEV2_PORT = 4791             # IBTA Annex A17.2.3
_CONTROL_PORT = 8192            # the control plane (Holoscan Sensor Bridge control bus)
_UDP_CALL_PORT_BASE = 12288     # UDP mode: QP q's port (Holoscan Sensor Bridge data port)
_RPC_RESPONSE = 24              # CUDA-Q realtime RPCResponse header
_CONTROL_REQUEST = 14           # cmd, flags, seq, reserved, addr, data
_RD_DWORD_SHORT = 10            # a RD_DWORD without its data word
_RD_DWORD = 0x14
_BLOCK_COMMANDS = (0x09, 0x19)  # WR_BLOCK, RD_BLOCK: a 6-byte header, then (addr, value) pairs
_BLOCK_HEADER = 6
_BLOCK_MAX_PAIRS = 183          # the Holoscan Sensor Bridge host's 1472-byte control packet
_BLOCK_MAX_BODY = _BLOCK_HEADER + 8 * _BLOCK_MAX_PAIRS
_ICMP_ECHO_REQUEST = 8
# UC opcodes (IBTA Vol 1 9.2.1 table 38, transport UC = 0b001): opcode -> (kind, position,
# RETH, ImmDt). Position: where the packet sits in its message.
_FIRST, _MIDDLE, _LAST, _ONLY = "first", "middle", "last", "only"
_UC_OPCODES = {
    0x20: ("send", _FIRST, False, False),       # SEND_FIRST
    0x21: ("send", _MIDDLE, False, False),      # SEND_MIDDLE
    0x22: ("send", _LAST, False, False),        # SEND_LAST
    0x23: ("send", _LAST, False, True),         # SEND_LAST_WITH_IMMEDIATE
    0x24: ("send", _ONLY, False, False),        # SEND_ONLY
    0x25: ("send", _ONLY, False, True),         # SEND_ONLY_WITH_IMMEDIATE
    0x26: ("write", _FIRST, True, False),       # RDMA_WRITE_FIRST
    0x27: ("write", _MIDDLE, False, False),     # RDMA_WRITE_MIDDLE
    0x28: ("write", _LAST, False, False),       # RDMA_WRITE_LAST
    0x29: ("write", _LAST, False, True),        # RDMA_WRITE_LAST_WITH_IMMEDIATE
    0x2A: ("write", _ONLY, True, False),        # RDMA_WRITE_ONLY
    0x2B: ("write", _ONLY, True, True),         # RDMA_WRITE_ONLY_WITH_IMMEDIATE
}
#: The PMTU register's reset value (3: 1024 bytes).
PMTU_RESET = 3
#: Longest frame (FCS stripped) whose echo request is taken: the receiver's documented echo
#: buffer, a standard 1500-byte MTU's frame.
_ECHO_MAX_FRAME_BYTES = 1514
_PSN_MASK = (1 << 24) - 1
_COUNTER_MASK = (1 << 32) - 1


def pmtu_bytes(register: int) -> int:
    """The path MTU in payload bytes of a PMTU register value: the IBTA/ibverbs enum (1 = 256,
    2 = 512, 3 = 1024, 4 = 2048, 5 = 4096); any other value acts as 256."""
    return PATH_MTU_BYTES.get(register, 256)


def parse_mac(mac: str | int) -> int:
    """A MAC address (``"aa:bb:cc:dd:ee:ff"`` or an int) as its 48-bit integer, first octet in
    the most significant byte (IEEE 802.3 3.2.3)."""
    if isinstance(mac, int):
        return mac
    return int(mac.replace("-", ":").replace(":", ""), 16)


def parse_ip(ip: str | int) -> int:
    """An IPv4 address (dotted or an int) as its 32-bit integer (RFC 791 3.1)."""
    if isinstance(ip, int):
        return ip
    a, b, c, d = (int(x) for x in ip.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


def ones_complement_sum(data: bytes) -> int:
    """The RFC 1071 one's-complement sum of ``data`` as 16-bit big-endian words (an odd byte
    padded with a zero byte), folded to 16 bits with end-around carry."""
    if len(data) % 2:
        data = bytes(data) + b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def ipv4_header_ok(header: bytes) -> bool:
    """RFC 791 3.1 / RFC 1071: a header whose checksum verifies (the folded sum of its ten
    words is a one's-complement zero, 0xFFFF or 0x0000; RFC 1624 3)."""
    return ones_complement_sum(header[:_IPV4]) in (0x0000, 0xFFFF)


def udp_checksum_ok(src_ip: int, dst_ip: int, datagram: bytes) -> bool:
    """RFC 768: the sum over the pseudo-header (source and destination address, zero, protocol
    17, UDP length) and the datagram, checksum field included, is 0xFFFF."""
    pseudo = struct.pack(">IIBBH", src_ip, dst_ip, 0, _PROTO_UDP, len(datagram))
    return ones_complement_sum(pseudo + bytes(datagram)) == 0xFFFF


def roce_icrc(ip_packet: bytes) -> bytes:
    """The ICRC of a RoCEv2 packet over IPv4 without options (IBTA Annex A17.4.4, Vol 1 7.8.1).

    ``ip_packet`` runs from the first byte of the IPv4 header to the last byte before the ICRC.
    The CRC-32 of the Ethernet FCS is taken over 64 bits of ones (the masked LRH of InfiniBand)
    followed by the packet with, set to all ones: the IPv4 TOS, TTL and header checksum, the UDP
    checksum, and the BTH byte of FECN, BECN and the reserved bits. Its 4 bytes are returned in
    wire order, least significant byte first (as the FCS).
    """
    masked = bytearray(ip_packet)
    masked[1] = 0xFF                                    # TOS (DSCP, ECN)
    masked[8] = 0xFF                                    # TTL
    masked[10:12] = b"\xff\xff"                         # header checksum
    masked[_IPV4 + 6:_IPV4 + 8] = b"\xff\xff"           # UDP checksum
    masked[_IPV4 + _UDP + 4] = 0xFF                     # BTH: FECN, BECN, resv6
    return zlib.crc32(b"\xff" * 8 + bytes(masked)).to_bytes(4, "little")


@dataclass
class RxConfig:
    """What a host configured: the addresses, P_Key, RX_ENABLE and each QP's context.

    Every per-QP list has one entry per QP of the build (``params.num_qps``; a shorter list is
    filled with the defaults). ``rkeys[q]`` maps a region's R_Key register name
    (``"IMEM_RKEY"``, ``"ENV_RKEY"``, ``"REGS_RKEY"``: :func:`openqlink.memory_map.regions`) in
    QP ``q``'s context to ``(key, valid)``; ``valid`` is whether the register was written since
    reset or since the QP's HOST_QPN was (a region whose key is not valid takes no WRITE of the
    QP). A missing entry is not valid. The regions are those of the PPU the QP reaches
    (``qp_ppus[q]``): its keys are the QP's map of that PPU's regions.
    """

    params: QSCParams = field(default_factory=QSCParams)
    qsc_mac: int | None = None          #: default: ``params.mac``
    qsc_ip: int | None = None           #: default: ``params.ip``
    host_mac: int = 0                   #: the peer of every QP that ``peers`` leaves out
    host_ip: int = 0                    #: ... its IP
    p_key: int = 0xFFFF                 #: P_KEY (reset value: full member of the default)
    rx_enable: bool = False             #: RX_ENABLE bit 0 (off from reset)
    rkeys: list[dict[str, tuple[int, bool]]] = field(default_factory=list)
    #: Each QP's peer, ``(mac, ip)``: its PEER_MAC_HI/LO and PEER_IP (default
    #: ``(host_mac, host_ip)``); the QP takes packets from that source MAC and IP only.
    peers: list[tuple[int, int]] = field(default_factory=list)
    #: The PPU each QP reaches (its PPU register): ``q`` for a PPU's own QP (``q < num_ppus``),
    #: 0 by default for the others (the register's reset value). See :meth:`write_ppu`.
    qp_ppus: list[int] = field(default_factory=list)
    #: QSC_QPN of each QP (default ``qpn_base + q``): a packet goes to the lowest QP whose
    #: QPN is its DestQP.
    qsc_qpns: list[int] = field(default_factory=list)
    #: RESPONSE_BYTES of each QP (default 64): the largest SEND message taken.
    response_bytes: list[int] = field(default_factory=list)
    #: The path MTU of each QP in payload bytes (:func:`pmtu_bytes` of its PMTU register;
    #: default 1024, the register's reset value 3).
    pmtu: list[int] = field(default_factory=list)
    #: TRANSPORT of each QP (default 0, RoCE; 1: UDP mode, a PPU's own QP only).
    transports: list[int] = field(default_factory=list)
    #: PEER_UDP_PORT of each QP (default 0): a UDP-mode response's source port.
    peer_udp_ports: list[int] = field(default_factory=list)
    #: The receiver's buffer (``RoCEReceiver(buffer_bytes=...)``): a frame of more 64-bit words
    #: never fits (``None``: not modelled).
    buffer_bytes: int | None = 16384

    def __post_init__(self) -> None:
        p = self.params
        if self.qsc_mac is None:
            self.qsc_mac = parse_mac(p.mac)
        if self.qsc_ip is None:
            self.qsc_ip = parse_ip(p.ip)
        self.host_mac = parse_mac(self.host_mac)
        self.host_ip = parse_ip(self.host_ip)
        while len(self.rkeys) < p.num_qps:
            self.rkeys.append({})
        while len(self.peers) < p.num_qps:
            self.peers.append((self.host_mac, self.host_ip))
        self.peers = [(parse_mac(mac), parse_ip(ip)) for mac, ip in self.peers]
        while len(self.qp_ppus) < p.num_qps:
            q = len(self.qp_ppus)
            self.qp_ppus.append(q if q < p.num_ppus else 0)
        while len(self.qsc_qpns) < p.num_qps:
            self.qsc_qpns.append(p.qpn_base + len(self.qsc_qpns))
        while len(self.response_bytes) < p.num_qps:
            self.response_bytes.append(MAILBOX_BYTES)
        while len(self.pmtu) < p.num_qps:
            self.pmtu.append(pmtu_bytes(PMTU_RESET))
        while len(self.transports) < p.num_qps:
            self.transports.append(0)
        while len(self.peer_udp_ports) < p.num_qps:
            self.peer_udp_ports.append(0)
        for name in ("rkeys", "peers", "qp_ppus", "qsc_qpns", "response_bytes", "pmtu",
                     "transports", "peer_udp_ports"):
            if len(getattr(self, name)) != p.num_qps:
                raise ValueError(f"{name}: one entry per QP ({p.num_qps}), not "
                                 f"{len(getattr(self, name))}")
        for q, ppu in enumerate(self.qp_ppus):
            if (q < p.num_ppus and ppu != q) or not 0 <= ppu < p.num_ppus:
                raise ValueError(f"QP {q} cannot reach PPU {ppu}: a PPU's own QP reaches that "
                                 f"PPU, another QP one of the build's {p.num_ppus}")
        for q, transport in enumerate(self.transports):
            if transport not in (0, 1) or (transport and q >= p.num_ppus):
                raise ValueError(f"QP {q} cannot have TRANSPORT {transport}: 0 or 1, and 1 "
                                 f"only on a PPU's own QP (of {p.num_ppus})")

    def write_transport(self, qp: int, value: int) -> None:
        """A write of ``value`` to QP ``qp``'s TRANSPORT register: its bit 0, on a PPU's own QP;
        another QP ignores it."""
        if qp < self.params.num_ppus:
            self.transports[qp] = value & 1

    def write_ppu(self, qp: int, value: int) -> None:
        """A write of ``value`` to QP ``qp``'s PPU register: a PPU's own QP ignores it, and so
        does any QP for a PPU the build lacks (``value >= num_ppus``)."""
        if qp >= self.params.num_ppus and 0 <= value < self.params.num_ppus:
            self.qp_ppus[qp] = value


@dataclass(frozen=True)
class Write:
    """Bytes ``data`` to land at bus byte address ``addr`` and on."""

    addr: int
    data: bytes


@dataclass(frozen=True)
class Message:
    """A QP's open message: what its next MIDDLE or LAST continues.

    ``kind`` is ``"send"`` or ``"write"``; ``imem``: a WRITE's region is the instruction ring
    (IMEM); ``addr``: the bus byte address the WRITE's next payload byte lands at (0 for a
    SEND); ``left``: the bytes the message may still take (a WRITE: DMALen minus the bytes
    received so far, which the LAST must match; a SEND: RESPONSE_BYTES minus them).
    """

    kind: str
    imem: bool
    addr: int
    left: int


@dataclass(frozen=True)
class Verdict:
    """What the receiver must do with one frame.

    ``outcome`` is one of :data:`OUTCOMES`: the counter the frame counts under (besides
    RX_FRAMES), or :data:`CONTROL`. ``also`` holds other outcomes the documentation allows for
    this frame where it does not decide between them (empty for most frames). The rest
    describes a frame taken: ``kind`` (``"write"``, ``"send"``, ``"control"``, ``"arp"``,
    ``"icmp"`` or ``None``), ``qp`` (the QP the packet belongs to, once the QPN check passed:
    the lowest whose QSC_QPN is its DestQP; set for a packet dropped after that check too) and
    ``ppu`` (the PPU that QP reaches: whose regions, mailbox and TAIL the packet may write),
    ``writes`` (in order), ``tail`` (``(TAIL register address, ImmDt)``), ``mailbox_commit``
    (``(mailbox address, bytes committed)``), ``psn``, ``psn_gap`` (a FIRST or ONLY whose PSN
    was not the expected one; the packet is kept), ``rpc_response`` (a SEND that ends a
    message: counted RX_RPC_RESPONSES), ``message`` (the QP's open message once the packet is
    taken; ``None``: closed), ``request`` (a control request's fields; ``data`` is ``None`` for
    the 10-byte RD_DWORD; ``pairs``, 1 or a block's pair count, and ``more``, a block's pairs
    after the first as they came), ``icrc_ok`` (``None`` where the ICRC was not reached or not
    RoCEv2). ``opcode`` is the BTH opcode of a RoCEv2 packet whose ICRC checked good; ``of_qp``:
    the packet passed the checks up to PEER, so, unless it is taken, it closes QP ``qp``'s open
    message.
    """

    outcome: str
    also: frozenset[str] = frozenset()
    kind: str | None = None
    qp: int | None = None
    ppu: int | None = None
    writes: tuple[Write, ...] = ()
    tail: tuple[int, int] | None = None
    mailbox_commit: tuple[int, int] | None = None
    psn: int | None = None
    psn_gap: bool = False
    rpc_response: bool = False
    message: Message | None = None
    request: dict[str, int | None] | None = None
    icrc_ok: bool | None = None
    opcode: int | None = None
    of_qp: bool = False

    @property
    def allowed(self) -> frozenset[str]:
        """Every outcome the documentation allows: ``outcome`` and ``also``."""
        return self.also | {self.outcome}

    @property
    def taken(self) -> bool:
        """The frame is taken (not dropped)."""
        return not self.outcome.startswith("DROP_")


def _u(frame: bytes, at: int, nbytes: int) -> int:
    return int.from_bytes(frame[at:at + nbytes], "big")


class RxModel:
    """The receive rules with their state: each QP's expected PSN (:attr:`epsn`), open message
    (:attr:`messages`, ``None`` where none is open) and counters (:attr:`qp_counters`), one
    entry per QP of the build (``params.num_qps``).

    :meth:`judge` decides a frame without changing the state; :meth:`apply` records a verdict
    as the receiver carried it out; :meth:`receive` does both. A caller that saw a packet the
    model takes dropped for overflow calls :meth:`apply_dropped` instead of :meth:`apply`.
    """

    def __init__(self, config: RxConfig):
        self.config = copy.deepcopy(config)
        num_qps = config.params.num_qps
        self.epsn = [0] * num_qps
        self.messages: list[Message | None] = [None] * num_qps
        #: Each QP's counters by name (:data:`openqlink.memory_map.QP_COUNTERS`), 32 bits,
        #: wrapping, 0 from reset.
        self.qp_counters: list[dict[str, int]] = [{name: 0 for name, _ in QP_COUNTERS}
                                                  for _ in range(num_qps)]

    def restart_qp(self, qp: int) -> None:
        """A write of QP ``qp``'s HOST_QPN: its expected PSN returns to 0, its open message is
        closed and its region keys are no longer valid until written again (its peer, PPU and
        counters stay)."""
        self.epsn[qp] = 0
        self.messages[qp] = None
        self.config.rkeys[qp] = {name: (key, False)
                                 for name, (key, _) in self.config.rkeys[qp].items()}

    def _count(self, qp: int, name: str) -> None:
        counters = self.qp_counters[qp]
        counters[name] = (counters[name] + 1) & _COUNTER_MASK

    def receive(self, frame: bytes, *, mac_error: bool = False) -> Verdict:
        """:meth:`judge` then :meth:`apply`."""
        verdict = self.judge(frame, mac_error=mac_error)
        self.apply(verdict)
        return verdict

    def apply(self, verdict: Verdict) -> None:
        """Record ``verdict`` as carried out. An accepted UC packet sets its QP's expected PSN to
        PSN + 1 (IBTA Vol 1 9.8.3; 24 bits, wrapping) and its open message to
        :attr:`Verdict.message` (a FIRST opens one, a MIDDLE advances it, a LAST or ONLY closes
        it); any other packet of the QP (:attr:`Verdict.of_qp`) closes the message and leaves
        the expected PSN. A packet that passed the QPN check counts in its QP's RX_PACKETS
        (taken) or RX_DROPS (dropped; a DROP_PSN in RX_DROPS_PSN too). Frames of no QP change
        nothing."""
        if verdict.qp is not None:
            self._count(verdict.qp, "RX_PACKETS" if verdict.outcome in (ACCEPTED, UDP_RESPONSE)
                        else "RX_DROPS")
            if verdict.outcome == "DROP_PSN":
                self._count(verdict.qp, "RX_DROPS_PSN")
        if verdict.outcome == ACCEPTED:
            self.epsn[verdict.qp] = (verdict.psn + 1) & _PSN_MASK
            self.messages[verdict.qp] = verdict.message
        elif verdict.of_qp:
            self.messages[verdict.qp] = None

    def apply_dropped(self, verdict: Verdict) -> None:
        """Record that the receiver dropped the frame of ``verdict`` for overflow where the model
        takes it (the buffer or a queue was full): a packet of a QP counts in the QP's RX_DROPS,
        closes its open message and leaves its expected PSN, as any packet of the QP not
        accepted."""
        if verdict.qp is not None:
            self._count(verdict.qp, "RX_DROPS")
        if verdict.of_qp:
            self.messages[verdict.qp] = None

    # ---- the checks, in the documented order ------------------------------------------------

    def judge(self, frame: bytes, *, mac_error: bool = False) -> Verdict:
        """The verdict on ``frame`` (FCS stripped; ``mac_error``: the MAC flagged it bad).

        Order (the first failing check names the counter): MAC; Ethernet (IEEE 802.3: at least
        14 bytes, our MAC or broadcast, IPv4 or ARP), then ARP (RFC 826: a request for our IP);
        IPv4 (RFC 791: version 4, IHL 5, checksum, total length, no fragment, our address, UDP
        or ICMP), then ICMP (RFC 792: an echo request whose checksum verifies); UDP (RFC 768:
        length, port, sizes, RFC 1122 checksum); then for RoCEv2 (IBTA Annex A17) the ICRC,
        opcode and TVer, P_Key, DestQP, peer addresses, PSN (a MIDDLE or LAST continuing the
        QP's open message), header length, VA, R_Key and VA range (a RETH whose DMALen is not
        0), ImmDt as a TAIL, payload length (PMTU, DMALen, RESPONSE_BYTES, the message's bytes
        left); last, a packet that passed every check but is longer than the receive buffer is
        dropped for overflow (a control request that long may be either taken or dropped: the
        documentation does not say whether it must fit).
        """
        verdict = self._decide(frame, mac_error)
        words = -(-len(frame) // 8)
        if self.config.buffer_bytes is not None and words > self.config.buffer_bytes // 8:
            if verdict.outcome == ACCEPTED:
                return Verdict("DROP_OVERFLOW", qp=verdict.qp, ppu=verdict.ppu, psn=verdict.psn,
                               icrc_ok=True, opcode=verdict.opcode, of_qp=True)
            if verdict.outcome == UDP_RESPONSE:
                return Verdict("DROP_OVERFLOW", qp=verdict.qp, ppu=verdict.ppu)
            if verdict.outcome == CONTROL:
                return dataclasses.replace(verdict, also=frozenset({"DROP_OVERFLOW"}))
        return verdict

    def _decide(self, frame: bytes, mac_error: bool) -> Verdict:
        c = self.config
        n = len(frame)
        if mac_error:
            return Verdict("DROP_MAC")
        if n < _ETH:
            return Verdict("DROP_ETH")
        dst_mac, src_mac, ethertype = _u(frame, 0, 6), _u(frame, 6, 6), _u(frame, 12, 2)
        if dst_mac not in (c.qsc_mac, _BROADCAST) or ethertype not in (_ETHERTYPE_IPV4,
                                                                       _ETHERTYPE_ARP):
            return Verdict("DROP_ETH")
        if ethertype == _ETHERTYPE_ARP:
            return self._arp(frame)

        # IPv4 (RFC 791 3.1), no options
        if n < _ETH + _IPV4:
            return Verdict("DROP_IP")
        ip = frame[_ETH:_ETH + _IPV4]
        version, ihl = ip[0] >> 4, ip[0] & 0xF
        total_length = _u(ip, 2, 2)
        more_fragments = (ip[6] >> 5) & 1
        fragment_offset = _u(ip, 6, 2) & 0x1FFF
        protocol = ip[9]
        src_ip, dst_ip = _u(ip, 12, 4), _u(ip, 16, 4)
        if (version != 4 or ihl != 5 or not ipv4_header_ok(ip)
                or not _IPV4 <= total_length <= n - _ETH
                or more_fragments or fragment_offset
                or dst_ip != c.qsc_ip or protocol not in (_PROTO_UDP, _PROTO_ICMP)):
            return Verdict("DROP_IP")
        ip_end = _ETH + total_length                    # Ethernet padding follows
        if protocol == _PROTO_ICMP:
            return self._icmp(frame, ip_end)

        # UDP (RFC 768)
        at = _ETH + _IPV4
        if total_length < _IPV4 + _UDP:
            return Verdict("DROP_UDP")
        src_port, dst_port = _u(frame, at, 2), _u(frame, at + 2, 2)
        udp_length, udp_checksum = _u(frame, at + 4, 2), _u(frame, at + 6, 2)
        if udp_length != total_length - _IPV4:
            return Verdict("DROP_UDP")
        roce = dst_port == _ROCEV2_PORT and c.rx_enable
        control = dst_port == _CONTROL_PORT
        # UDP mode: the port of a PPU's own QP whose TRANSPORT is 1
        ucall = dst_port - _UDP_CALL_PORT_BASE
        if not (0 <= ucall < c.params.num_ppus and c.transports[ucall]):
            ucall = None
        if not (roce or control or ucall is not None):
            return Verdict("DROP_UDP")
        body = udp_length - _UDP
        if roce and (udp_length < _UDP + _BTH + _ICRC or udp_length % 4):
            return Verdict("DROP_UDP")
        if control and (body < _RD_DWORD_SHORT
                        or (body < _CONTROL_REQUEST and frame[at + _UDP] != _RD_DWORD)
                        or (frame[at + _UDP] in _BLOCK_COMMANDS and body > _BLOCK_MAX_BODY)):
            return Verdict("DROP_UDP")
        if udp_checksum != 0 and not udp_checksum_ok(src_ip, dst_ip, frame[at:ip_end]):
            return Verdict("DROP_UDP")
        if control:
            return self._control(frame, src_mac, src_ip, src_port, body)
        if ucall is not None:
            return self._udp_response(frame, ip_end, ucall, src_mac, src_ip, src_port)
        return self._roce(frame, ip_end, src_mac, src_ip, udp_length)

    def _udp_response(self, frame: bytes, ip_end: int, qp: int, src_mac: int, src_ip: int,
                      src_port: int) -> Verdict:
        # CUDA-Q realtime's udp bridge: one datagram, an RPCResponse and its result (a whole
        # ring slot, zero-padded), to QP ``qp``'s port from the peer's socket. The QP is a
        # PPU's own: it reaches that PPU.
        c = self.config
        if (src_mac, src_ip) != c.peers[qp] or src_port != c.peer_udp_ports[qp]:
            return Verdict("DROP_PEER", qp=qp, ppu=qp)
        payload = bytes(frame[_ETH + _IPV4 + _UDP:ip_end])
        if not _RPC_RESPONSE <= len(payload) <= c.response_bytes[qp]:
            return Verdict("DROP_LENGTH", qp=qp, ppu=qp)
        mailbox = ppu_base(qp) + MAILBOX_OFFSET
        kept = payload[:MAILBOX_BYTES]
        return Verdict(UDP_RESPONSE, kind="udp", qp=qp, ppu=qp, writes=(Write(mailbox, kept),),
                       mailbox_commit=(mailbox, len(kept)), rpc_response=True)

    def _arp(self, frame: bytes) -> Verdict:
        # RFC 826: hardware Ethernet (1), protocol IPv4, lengths 6 and 4, operation request (1),
        # target protocol address ours. Nothing is learnt from any ARP packet.
        if len(frame) < _ETH + _ARP:
            return Verdict("DROP_ARP")
        a = _ETH
        request = (_u(frame, a, 2) == 1 and _u(frame, a + 2, 2) == _ETHERTYPE_IPV4
                   and frame[a + 4] == 6 and frame[a + 5] == 4 and _u(frame, a + 6, 2) == 1)
        if request and _u(frame, a + 24, 4) == self.config.qsc_ip:
            return Verdict(ARP_REQUEST, kind="arp")
        return Verdict("DROP_ARP")

    def _icmp(self, frame: bytes, ip_end: int) -> Verdict:
        # RFC 792: an echo request (type 8, code 0) of at least its 8-byte header whose
        # checksum over the whole message verifies.
        message = frame[_ETH + _IPV4:ip_end]
        if (len(message) < _ICMP_ECHO or message[0] != _ICMP_ECHO_REQUEST or message[1] != 0
                or ones_complement_sum(message) != 0xFFFF):
            return Verdict("DROP_ICMP")
        # "A frame longer than ECHO_MAX_FRAME_BYTES": the frame as received, or the frame that
        # the IP packet makes (Ethernet padding left out). Where the two differ, either is
        # allowed.
        frame_long = len(frame) > _ECHO_MAX_FRAME_BYTES
        packet_long = ip_end > _ECHO_MAX_FRAME_BYTES
        if frame_long and packet_long:
            return Verdict("DROP_ICMP")
        if frame_long or packet_long:
            return Verdict(ECHO_REQUEST, also=frozenset({"DROP_ICMP"}), kind="icmp")
        return Verdict(ECHO_REQUEST, kind="icmp")

    def _control(self, frame: bytes, src_mac: int, src_ip: int, src_port: int,
                 body: int) -> Verdict:
        at = _ETH + _IPV4 + _UDP
        request = {
            "src_mac": src_mac, "src_ip": src_ip, "src_port": src_port,
            "cmd": frame[at], "flags": frame[at + 1], "seq": _u(frame, at + 2, 2),
            "addr": _u(frame, at + 6, 4),
            "data": _u(frame, at + 10, 4) if body >= _CONTROL_REQUEST else None,
            # a block's whole pairs (trailing bytes ignored); the ones after the first as they
            # came, 8 bytes each
            "pairs": 1, "more": b"",
        }
        if frame[at] in _BLOCK_COMMANDS:
            pairs = (body - _BLOCK_HEADER) // 8
            start = at + _BLOCK_HEADER + 8
            request.update(pairs=pairs, more=bytes(frame[start:start + 8 * (pairs - 1)]))
        return Verdict(CONTROL, kind="control", request=request)

    def _roce(self, frame: bytes, ip_end: int, src_mac: int, src_ip: int,
              udp_length: int) -> Verdict:
        c = self.config
        p = c.params
        # ICRC (IBTA Annex A17.4.4): the last 4 bytes of the IP packet
        if roce_icrc(frame[_ETH:ip_end - _ICRC]) != frame[ip_end - _ICRC:ip_end]:
            return Verdict("DROP_ICRC", icrc_ok=False)

        # BTH (IBTA Vol 1 9.2): opcode, SE M PadCnt TVer, P_Key, FECN BECN resv6, DestQP,
        # A resv7, PSN
        b = _ETH + _IPV4 + _UDP
        opcode = frame[b]
        pad_cnt = (frame[b + 1] >> 4) & 3
        tver = frame[b + 1] & 0xF
        p_key = _u(frame, b + 2, 2)
        dest_qp = _u(frame, b + 5, 3)
        psn = _u(frame, b + 9, 3)

        def drop(reason: str, **kw) -> Verdict:
            return Verdict(reason, icrc_ok=True, opcode=opcode, **kw)

        if opcode not in _UC_OPCODES or tver:
            return drop("DROP_OPCODE")
        kind, position, has_reth, has_imm = _UC_OPCODES[opcode]
        # IBTA Vol 1 10.9.3: the low 15 bits match, and at least one side is a full member
        if (p_key & 0x7FFF) != (c.p_key & 0x7FFF) or not ((p_key | c.p_key) & 0x8000):
            return drop("DROP_PKEY")
        # the lowest QP whose QSC_QPN is DestQP; it reaches one PPU (its own, or the one its
        # PPU register names)
        qp = next((q for q in range(p.num_qps) if c.qsc_qpns[q] == dest_qp), None)
        if qp is None:
            return drop("DROP_QPN")
        ppu = c.qp_ppus[qp]
        # A connected QP takes packets from its peer only (rxe checks the addresses).
        if (src_mac, src_ip) != c.peers[qp]:
            return drop("DROP_PEER", qp=qp, ppu=ppu)

        def qp_drop(reason: str) -> Verdict:
            # a packet of the QP, not taken: it closes the QP's open message
            return drop(reason, qp=qp, ppu=ppu, psn=psn, of_qp=True)

        # PSN (IBTA Vol 1 9.8.3, rxe check_psn for UC): a MIDDLE or LAST continues the open
        # message of its kind at the expected PSN; a FIRST or ONLY starts one whatever its PSN.
        msg = self.messages[qp]
        starts = position in (_FIRST, _ONLY)
        if not starts and (msg is None or msg.kind != kind or psn != self.epsn[qp]):
            return qp_drop("DROP_PSN")
        ext = (_RETH if has_reth else 0) + (_IMMDT if has_imm else 0)
        payload_len = udp_length - _UDP - _BTH - ext - pad_cnt - _ICRC
        if payload_len < 0:
            return qp_drop("DROP_LENGTH")
        at = b + _BTH + ext
        payload = bytes(frame[at:at + payload_len])
        pmtu = c.pmtu[qp]
        psn_gap = starts and psn != self.epsn[qp]
        mailbox = ppu_base(ppu) + MAILBOX_OFFSET             # the PPU's mailbox

        def accept(**kw) -> Verdict:
            return Verdict(ACCEPTED, kind=kind, qp=qp, ppu=ppu, psn=psn, psn_gap=psn_gap,
                           icrc_ok=True, opcode=opcode, of_qp=True, **kw)

        if kind == "send":
            limit = c.response_bytes[qp]
            if not {
                _ONLY: payload_len <= pmtu and payload_len <= limit,
                _FIRST: payload_len == pmtu and payload_len < limit,
                _MIDDLE: msg is not None and payload_len == pmtu and payload_len < msg.left,
                _LAST: msg is not None and 1 <= payload_len <= min(pmtu, msg.left),
            }[position]:
                return qp_drop("DROP_LENGTH")
            # The mailbox keeps a message's first MAILBOX_BYTES (a response in its first bytes,
            # as CUDA-Q's GPU bridge sends it); its ImmDt is not delivered.
            if position == _ONLY:
                kept = payload[:MAILBOX_BYTES]
                return accept(writes=(Write(mailbox, kept),) if kept else (),
                              mailbox_commit=(mailbox, len(kept)), rpc_response=True)
            if position == _FIRST:
                return accept(writes=(Write(mailbox, payload[:MAILBOX_BYTES]),),
                              message=Message("send", False, 0, limit - payload_len))
            assert msg is not None
            if position == _MIDDLE:
                return accept(message=dataclasses.replace(msg, left=msg.left - payload_len))
            return accept(mailbox_commit=(mailbox, MAILBOX_BYTES), rpc_response=True)

        # RDMA WRITE. RETH (IBTA Vol 1 9.3.2): VA, R_Key, DMALen; the VA is the bus address,
        # in a region of the PPU the QP reaches, opened by the QP's own key for it.
        # A zero-length WRITE's VA and R_Key are not checked (IBTA C9-88, as rxe).
        va = dma_len = 0
        region = None
        if has_reth:
            r = b + _BTH
            va, r_key, dma_len = _u(frame, r, 8), _u(frame, r + 8, 4), _u(frame, r + 12, 4)
            if dma_len:
                if va >> 32 == 0 and va % 4 == 0:
                    region = next((g for g in regions(p, ppu)
                                   if g.va <= va < g.va + g.length_bytes), None)
                if region is None:
                    return qp_drop("DROP_VA")
                key, valid = c.rkeys[qp].get(region.rkey_register, (0, False))
                if not valid or r_key != key:
                    return qp_drop("DROP_RKEY")
                if va + dma_len > region.va + region.length_bytes:
                    return qp_drop("DROP_VA")
        imem = (region is not None and region.name == "IMEM") if starts else bool(
            msg is not None and msg.imem)
        tail = None
        if has_imm and imem:
            imm = _u(frame, at - _IMMDT, 4)              # ImmDt (IBTA Vol 1 9.3.4)
            if imm >= p.imem_depth:
                return qp_drop("DROP_IMMDT")
            tail = (ppu_reg(ppu, "TAIL"), imm)
        if not {
            _ONLY: payload_len <= pmtu and dma_len == payload_len,
            _FIRST: payload_len == pmtu and dma_len > payload_len,
            _MIDDLE: msg is not None and payload_len == pmtu and payload_len < msg.left,
            _LAST: msg is not None and 1 <= payload_len <= pmtu and payload_len == msg.left,
        }[position]:
            return qp_drop("DROP_LENGTH")
        if starts:
            dest = va
            message = (Message("write", imem, va + payload_len, dma_len - payload_len)
                       if position == _FIRST else None)
        else:
            assert msg is not None
            dest = msg.addr
            message = (dataclasses.replace(msg, addr=msg.addr + payload_len,
                                           left=msg.left - payload_len)
                       if position == _MIDDLE else None)
        return accept(writes=(Write(dest, payload),) if payload else (), tail=tail,
                      message=message)
