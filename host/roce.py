"""Software RoCEv2 Unreliable Connection endpoint: the host side of the raw-Ethernet bridge.

One :class:`UCQueuePair` builds the UC packets the host sends (RDMA WRITE, SEND) and receives the
QSC's RPC requests: UC RDMA WRITEs, the last packet WITH_IMMEDIATE, into a registered ring of
slots (the dispatcher's ``SlotRing``). It keeps the UC rules of rdma-core's rxe ``check_psn``: no
ACKs, a FIRST/ONLY packet is accepted whatever its PSN and resynchronises the expected PSN (a jump
is counted in ``PSN_GAP``), a MIDDLE/LAST whose PSN is not the expected one, or that arrives with
no message open, is dropped and abandons the open message until the next FIRST/ONLY.

Receive checks, in order, each dropping the packet and counting one reason in ``counters``
(names as the QSC's counters in :data:`openqlink.memory_map.COUNTERS`): Ethernet destination
and EtherType (``DROP_ETH``); IPv4 version 4 without options, checksum, lengths, no fragment,
destination, protocol UDP (``DROP_IP``); UDP length, destination port 4791, and a non-zero
checksum that must verify (RFC 768 / RFC 1122 4.1.3.4; ``DROP_UDP``); room for the BTH and
ICRC (``DROP_LENGTH``); ICRC (``DROP_ICRC``); opcode: RDMA WRITE FIRST/MIDDLE/LAST
[_WITH_IMMEDIATE]/ONLY[_WITH_IMMEDIATE] only, BTH TVer 0 (``DROP_OPCODE``); P_Key
(``DROP_PKEY``); DestQP (``DROP_QPN``); source MAC and IP are the peer's, as rxe checks a
connected QP's addresses (``DROP_PEER``); room for the RETH/ImmDt and pad bytes
(``DROP_LENGTH``); PSN (``DROP_PSN``); R_Key (``DROP_RKEY``); VA range and slot (``DROP_VA``);
payload length against PMTU and DMALen, and a zero-length message WITH_IMMEDIATE, which carries
no request (``DROP_LENGTH``); a slot the message would write that still holds a request the
dispatcher has not taken (``DROP_OVERFLOW``). Bad packets never raise: the host must keep
serving whatever arrives.

Commit rule: nothing is written to the ring before the message is complete and every packet of it
has passed its checks, its slots free included. A multi-packet message is gathered in a private
buffer and written, in one copy, when its LAST packet is accepted; an abandoned message writes
nothing.

Per-packet cost: the headers are read with one precompiled :class:`struct.Struct`
(:data:`~openqlink.wire.packet.ROCE_HEADERS`), the ICRC with ``zlib.crc32``; the packets sent are
built from a header template made once per QP. No Amaranth object runs per packet.

# Ref: IBTA Vol 1 Release 1.4 9.2-9.3 (BTH, RETH, ImmDt), 9.4.3 (RDMA WRITE), 9.7.1-9.7.2
# (PSN), 9.8.3 (UC responder: FIRST/ONLY resynchronise), 10.9.1.2 (P_Key matching); Annex A17;
# rdma-core / Linux rxe ``rxe_resp.c`` ``check_psn`` for IB_QPT_UC.
"""

from __future__ import annotations

import logging
import struct
import threading
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .errors import DispatchError, FieldRangeError, WireFormatError
from .wire.ethernet import MIN_FRAME_BYTES, EtherType, mac_to_int
from .wire.ipv4 import IpProtocol, ip_to_int, ipv4_header_ok, ones_complement_sum
from .wire.packet import (
    DEFAULT_ROCE_SRC_PORT,
    IMMDT_CODEC,
    RETH_CODEC,
    ROCE_HEADERS,
    ROCE_HEADERS_BYTES,
    build_roce_frame,
    parse_frame,
)
from .wire.roce import DEFAULT_P_KEY, ICRC_BYTES, PATH_MTU_BYTES, Opcode, icrc
from .wire.udp import ROCEV2_PORT, udp_checksum_ok

log = logging.getLogger(__name__)

__all__ = [
    "UCQueuePair",
    "RxResult",
    "SlotRingLike",
    "RX_COUNTER_NAMES",
    "PMTU_VALUES",
    "PSN_MODULUS",
    "pkey_matches",
]

#: Path MTU values of IBTA Vol 1 (payload bytes per packet).
PMTU_VALUES = tuple(PATH_MTU_BYTES.values())
#: PSNs are 24 bits and wrap.
PSN_MODULUS = 1 << 24

#: Keys of :attr:`UCQueuePair.counters`, all present from the start.
RX_COUNTER_NAMES = (
    "RX_FRAMES", "RX_ROCE_ACCEPTED", "RX_PUBLISHED", "TX_FRAMES",
    "DROP_ETH", "DROP_IP", "DROP_UDP", "DROP_ICRC", "DROP_OPCODE", "DROP_PKEY", "DROP_QPN",
    "DROP_RKEY", "DROP_VA", "DROP_LENGTH", "DROP_PSN", "PSN_GAP", "DROP_PEER", "DROP_OVERFLOW",
)

_WRITES = frozenset(op for op in Opcode if not op.is_send)
_START = frozenset(op for op in _WRITES if op.starts_message)
_ENDS = frozenset(op for op in _WRITES if op.ends_message)
#: Accepted opcode value -> (Opcode, RETH bytes, ImmDt bytes)
_WRITE_OPS = {int(op): (op, RETH_CODEC.size if op.has_reth else 0,
                        IMMDT_CODEC.size if op.has_immdt else 0) for op in _WRITES}
_ETH, _IP, _UDP = 14, 20, 8       # header bytes
_BTH_AT = _ETH + _IP + _UDP       # 42


@runtime_checkable
class SlotRingLike(Protocol):
    """What :meth:`UCQueuePair.register_ring` needs of a ring (the dispatcher's ``SlotRing``).

    ``memory`` is a writable buffer of ``num_slots * slot_size`` bytes; ``publish(slot, length)``
    hands a complete request in ``slot`` (``length`` bytes from the slot's start, 1 or more) to
    the consumer; ``ready(slot)`` is true while the consumer has not taken it (the QP writes no
    byte into such a slot).
    """

    num_slots: int
    slot_size: int
    memory: Any

    def publish(self, slot: int, length: int) -> None: ...

    def ready(self, slot: int) -> bool: ...


@dataclass(frozen=True)
class RxResult:
    """What :meth:`UCQueuePair.handle_frame` did with one frame.

    Attributes
    ----------
    accepted : bool
        The packet passed every check.
    reason : str
        ``"RX_ROCE_ACCEPTED"`` or the ``DROP_*`` counter it was counted in.
    opcode, psn : int | None
        From the BTH, when the frame got that far.
    slot, length_bytes : int | None
        The slot published and the request length in bytes, when this packet completed a
        message WITH_IMMEDIATE.
    psn_gap : bool
        An accepted FIRST/ONLY whose PSN was not the expected one.
    """

    accepted: bool
    reason: str
    opcode: int | None = None
    psn: int | None = None
    slot: int | None = None
    length_bytes: int | None = None
    psn_gap: bool = False


def pkey_matches(a: int, b: int) -> bool:
    """IBTA P_Key match: equal low 15 bits, and at least one of the two a full member (bit 15)."""
    return (a & 0x7FFF) == (b & 0x7FFF) and bool((a | b) & 0x8000)


@dataclass
class _Message:
    va: int
    dma_len: int
    data: bytearray


class _Drop(Exception):
    def __init__(self, reason: str):
        self.reason = reason


class UCQueuePair:
    """A software RoCEv2 UC queue pair.

    Parameters
    ----------
    local_mac, local_ip : str | int
        This host's addresses (source of what we send; destination we accept).
    qpn : int
        Our 24-bit QP number (the DestQP we accept).
    remote_mac, remote_ip, remote_qpn
        The peer (the QSC) and its QP (the DestQP of what we send).
    udp_src_port : int
        UDP source port of our packets.
    p_key : int
        16-bit partition key sent and matched (default 0xFFFF).
    pmtu_bytes : int
        Path MTU: largest payload per packet, one of :data:`PMTU_VALUES` (default 1024).
    tx_psn, rx_epsn : int
        First PSN sent, PSN expected first (both 0, as CUDA-Q's and HSB's QPs).

    Attributes
    ----------
    counters : dict[str, int]
        Receive and send counts by :data:`RX_COUNTER_NAMES`.
    tx_psn : int
        The PSN of the next packet sent (increments per packet, mod 2**24).
    rx_epsn : int
        The PSN expected next.

    The addresses, QPNs, P_Key and UDP source port are fixed at construction: the packet
    template made then holds them (make another QP to change them).

    Sending is thread safe: a message takes its whole run of PSNs at once, under a lock, so
    messages sent from several threads never interleave their PSNs. :meth:`handle_frame` must
    be called from one thread at a time.

    While another sender holds the QP's PSNs (:meth:`lend_psns`, as the GPU RoCE endpoint does
    while it runs), every send raises :class:`~openqlink.errors.DispatchError` naming it: a
    packet sent meanwhile would take a PSN the other sender also uses.
    """

    def __init__(self, local_mac: str | bytes | int, local_ip: str | int, qpn: int,
                 remote_mac: str | bytes | int, remote_ip: str | int, remote_qpn: int, *,
                 udp_src_port: int = DEFAULT_ROCE_SRC_PORT, p_key: int = DEFAULT_P_KEY,
                 pmtu_bytes: int = 1024, tx_psn: int = 0, rx_epsn: int = 0):
        for name, value, bits in (("qpn", qpn, 24), ("remote_qpn", remote_qpn, 24),
                                  ("p_key", p_key, 16), ("udp_src_port", udp_src_port, 16),
                                  ("tx_psn", tx_psn, 24), ("rx_epsn", rx_epsn, 24)):
            if not 0 <= value < 1 << bits:
                raise FieldRangeError("UCQueuePair", name, value,
                                      f"{value:#x} does not fit in {bits} bits")
        if pmtu_bytes not in PMTU_VALUES:
            raise ValueError(f"pmtu_bytes must be one of {PMTU_VALUES}, not {pmtu_bytes}")
        self.local_mac = mac_to_int(local_mac)
        self.local_ip = ip_to_int(local_ip)
        self.qpn = qpn
        self.remote_mac = mac_to_int(remote_mac)
        self.remote_ip = ip_to_int(remote_ip)
        self.remote_qpn = remote_qpn
        self.udp_src_port = udp_src_port
        self.p_key = p_key
        self.pmtu_bytes = pmtu_bytes
        self.tx_psn = tx_psn
        self.rx_epsn = rx_epsn
        self.counters: dict[str, int] = dict.fromkeys(RX_COUNTER_NAMES, 0)
        self._tx_lock = threading.Lock()
        self._psns_held_by: str | None = None
        self._ring: SlotRingLike | None = None
        self._ring_rkey = 0
        self._ring_va = 0
        self._ring_bytes = 0
        self._msg: _Message | None = None
        self._local_mac_bytes = self.local_mac.to_bytes(6, "big")
        self._peer_mac_bytes = self.remote_mac.to_bytes(6, "big")
        # Ethernet, IPv4, UDP and BTH of our packets, with the fields that never change; each
        # packet fills in lengths, checksum, opcode, pad count and PSN (see _frame).
        template = build_roce_frame(dst_mac=self.remote_mac, src_mac=self.local_mac,
                                    src_ip=self.local_ip, dst_ip=self.remote_ip,
                                    src_port=udp_src_port, opcode=Opcode.SEND_ONLY,
                                    dest_qp=remote_qpn, psn=0, p_key=p_key, payload=b"")
        self._template = bytes(template[:ROCE_HEADERS_BYTES])
        # The IPv4 header's one's-complement sum without its total length and checksum: a
        # packet's checksum is this plus its total length, folded and complemented.
        head = bytearray(self._template[_ETH:_ETH + _IP])
        head[2:4] = head[10:12] = b"\0\0"
        self._ip_sum = ones_complement_sum(head)

    # --- send ---------------------------------------------------------------------------------

    def lend_psns(self, holder: str) -> tuple[int, int]:
        """Hand this QP's PSNs to ``holder`` (a name for errors, e.g. ``"the GPU RoCE
        endpoint"``), which sends and receives on the QP until :meth:`take_back_psns`. Returns
        ``(tx_psn, rx_epsn)`` to continue from; until they come back, every send raises
        :class:`~openqlink.errors.DispatchError` naming ``holder``. Raises that error, too,
        when another holder has them. Receiving is not guarded: hand the QP's frames to the
        holder meanwhile (as ``qlink sim --gpu-frames`` does), since what :meth:`handle_frame`
        records in between is replaced by :meth:`take_back_psns`."""
        with self._tx_lock:
            if self._psns_held_by is not None:
                raise DispatchError(f"QP {self.qpn:#x}: its PSNs are held by "
                                    f"{self._psns_held_by}")
            self._psns_held_by = holder
            return self.tx_psn, self.rx_epsn

    def take_back_psns(self, tx_psn: int, rx_epsn: int) -> None:
        """End a :meth:`lend_psns`: the QP continues from the holder's last ``tx_psn`` and
        ``rx_epsn`` (24 bits each)."""
        with self._tx_lock:
            self.tx_psn, self.rx_epsn = tx_psn % PSN_MODULUS, rx_epsn % PSN_MODULUS
            self._psns_held_by = None

    @property
    def psns_held_by(self) -> str | None:
        """Who holds this QP's PSNs (:meth:`lend_psns`), or None when the QP has them."""
        return self._psns_held_by

    def _take_psns(self, count: int) -> int:
        """The first of ``count`` consecutive PSNs, taken at once (thread safe). Raises
        :class:`~openqlink.errors.DispatchError` while :meth:`lend_psns` has lent them."""
        with self._tx_lock:
            if self._psns_held_by is not None:
                raise DispatchError(f"QP {self.qpn:#x} cannot send: its PSNs are held by "
                                    f"{self._psns_held_by} (a packet sent now would reuse one "
                                    "of its PSNs); send before it starts or after it stops")
            psn = self.tx_psn
            self.tx_psn = (psn + count) % PSN_MODULUS
            self.counters["TX_FRAMES"] += count
        return psn

    def _frame(self, opcode: Opcode, psn: int, payload: bytes | memoryview,
               ext: bytes = b"") -> bytes:
        """One packet from the template: ``ext`` (RETH and/or ImmDt) and ``payload`` after the
        BTH, pad bytes to a multiple of 4, the ICRC; the frame padded to 60 bytes."""
        pad = -len(payload) % 4
        udp_len = _UDP + 12 + len(ext) + len(payload) + pad + ICRC_BYTES
        if _IP + udp_len > 0xFFFF:
            raise FieldRangeError("IPv4", "total_length", _IP + udp_len,
                                  "the packet does not fit the 16-bit total length")
        head = bytearray(self._template)
        _U16.pack_into(head, 16, _IP + udp_len)          # IPv4 total length
        _U16.pack_into(head, 38, udp_len)                # UDP length
        csum = self._ip_sum + _IP + udp_len
        csum = (csum & 0xFFFF) + (csum >> 16)
        _U16.pack_into(head, 24, ~csum & 0xFFFF)
        head[42] = opcode
        head[43] = (head[43] & 0xCF) | (pad << 4)        # BTH SE M PadCnt TVer
        _U32.pack_into(head, 50, psn)                    # BTH A=0, resv7, PSN
        body = ext + bytes(payload) + bytes(pad)
        frame = head + body
        frame += icrc(memoryview(frame)[_ETH:])
        if len(frame) < MIN_FRAME_BYTES:
            frame += bytes(MIN_FRAME_BYTES - len(frame))
        return bytes(frame)

    def _check_fits(self, what: str, data: bytes) -> None:
        if len(data) > self.pmtu_bytes:
            raise FieldRangeError(what, "dma_len" if what == "RETH" else "payload", len(data),
                                  f"{len(data)} bytes exceed the PMTU of {self.pmtu_bytes} "
                                  "(one packet per message)")

    @staticmethod
    def _reth(va: int, r_key: int, dma_len: int) -> bytes:
        for name, value, bits in (("va", va, 64), ("r_key", r_key, 32), ("dma_len", dma_len, 32)):
            if not 0 <= value < 1 << bits:
                raise FieldRangeError("RETH", name, value,
                                      f"value {value:#x} does not fit in {bits} bits")
        return RETH_CODEC.pack(va, r_key, dma_len)

    @staticmethod
    def _immdt(imm: int | None) -> bytes:
        if imm is None:
            return b""
        if not 0 <= imm < 1 << 32:
            raise FieldRangeError("ImmDt", "imm", imm, f"value {imm:#x} does not fit in 32 bits")
        return IMMDT_CODEC.pack(imm)

    def write_frame(self, va: int, r_key: int, data: bytes, imm: int | None = None) -> bytes:
        """One UC RDMA_WRITE_ONLY (or _WITH_IMMEDIATE when ``imm`` is given) of ``data`` to
        ``va`` (64-bit) under ``r_key`` (32-bit); takes the next PSN.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``RETH.dma_len`` when ``data``
        exceeds the PMTU (use :meth:`write_frames`), or the field a value does not fit.
        """
        data = bytes(data)
        self._check_fits("RETH", data)
        op = Opcode.RDMA_WRITE_ONLY if imm is None else Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE
        ext = self._reth(va, r_key, len(data)) + self._immdt(imm)
        return self._frame(op, self._take_psns(1), data, ext)

    def write_frames(self, va: int, r_key: int, data: bytes,
                     imm: int | None = None) -> list[bytes]:
        """The UC RDMA WRITE message of ``data``: one ONLY packet when it fits the PMTU, else
        FIRST (with the RETH), MIDDLE..., LAST (_WITH_IMMEDIATE when ``imm`` is given), each
        carrying PMTU bytes but the last. Takes one PSN per packet, all at once."""
        data = bytes(data)
        return self._message_frames("RDMA_WRITE", data, imm, self._reth(va, r_key, len(data)))

    def send_frame(self, payload: bytes) -> bytes:
        """One UC SEND_ONLY carrying ``payload``; takes the next PSN.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``BTH.payload`` when the payload
        exceeds the PMTU.
        """
        self._check_fits("BTH", payload)
        return self._frame(Opcode.SEND_ONLY, self._take_psns(1), payload)

    def send_frames(self, payload: bytes, imm: int | None = None) -> list[bytes]:
        """The UC SEND message of ``payload``: one SEND_ONLY when it fits the PMTU, else FIRST,
        MIDDLE..., LAST, each carrying PMTU bytes but the last; with ``imm`` (32 bits) the
        packet that ends it is _WITH_IMMEDIATE. Takes one PSN per packet, all at once (IBTA
        Vol 1 9.8.3). A QSC takes a SEND message of up to the QP's RESPONSE_BYTES into its
        mailbox (the first 64 bytes: a response as CUDA-Q's GPU bridge sends it, longer than
        its result).
        """
        return self._message_frames("SEND", bytes(payload), imm, b"")

    def _message_frames(self, kind: str, data: bytes, imm: int | None,
                        reth: bytes) -> list[bytes]:
        """The UC message of ``data`` for ``kind`` (``"SEND"`` or ``"RDMA_WRITE"``): an ONLY
        packet when it fits the PMTU, else FIRST, MIDDLE..., LAST, each carrying PMTU bytes but
        the last; ``reth`` goes into the packet that begins it, ``imm`` into the one that ends
        it (then _WITH_IMMEDIATE). Its PSNs are consecutive, taken at once."""
        with_imm = "" if imm is None else "_WITH_IMMEDIATE"
        immdt = self._immdt(imm)
        mtu = self.pmtu_bytes
        if len(data) <= mtu:
            return [self._frame(Opcode[f"{kind}_ONLY{with_imm}"], self._take_psns(1), data,
                                reth + immdt)]
        chunks = [data[i:i + mtu] for i in range(0, len(data), mtu)]
        psn = self._take_psns(len(chunks))
        frames = [self._frame(Opcode[f"{kind}_FIRST"], psn, chunks[0], reth)]
        frames += [self._frame(Opcode[f"{kind}_MIDDLE"], (psn + i) % PSN_MODULUS, c)
                   for i, c in enumerate(chunks[1:-1], 1)]
        frames.append(self._frame(Opcode[f"{kind}_LAST{with_imm}"],
                                  (psn + len(chunks) - 1) % PSN_MODULUS, chunks[-1], immdt))
        return frames

    # --- receive ------------------------------------------------------------------------------

    def register_ring(self, ring: SlotRingLike, r_key: int, va: int = 0) -> None:
        """Make ``ring`` the remotely writable region of this QP: ``num_slots * slot_size``
        bytes at ``va`` (default 0: registered with iova 0, as CUDA-Q's bridges), writable with
        ``r_key``. Replaces a ring registered before and abandons an open message.

        Raises :class:`ValueError` when ``ring.memory`` is not ``num_slots * slot_size`` bytes,
        ``num_slots`` is not 1..4096 (the slot must fit ImmDt[11:0]) or a key does not fit.
        """
        if not 1 <= ring.num_slots <= 4096:
            raise ValueError(f"ring.num_slots must be 1..4096, not {ring.num_slots}")
        if ring.slot_size <= 0:
            raise ValueError(f"ring.slot_size must be positive, not {ring.slot_size}")
        size = ring.num_slots * ring.slot_size
        view = memoryview(ring.memory)
        if view.readonly or view.nbytes != size:
            raise ValueError(f"ring.memory must be a writable buffer of {size} bytes "
                             f"(num_slots * slot_size), got {view.nbytes} bytes"
                             f"{' read-only' if view.readonly else ''}")
        if not 0 <= r_key < 1 << 32:
            raise FieldRangeError("RETH", "r_key", r_key, f"{r_key:#x} does not fit in 32 bits")
        if not 0 <= va < 1 << 64 or va + size > 1 << 64:
            raise FieldRangeError("RETH", "va", va, f"{va:#x} + {size} leaves the 64-bit space")
        self._ring = ring
        self._ring_rkey = r_key
        self._ring_va = va
        self._ring_bytes = size
        self._msg = None

    def _drop(self, reason: str, opcode: int | None = None, psn: int | None = None) -> RxResult:
        self.counters[reason] += 1
        return RxResult(False, reason, opcode, psn)

    def handle_frame(self, frame: bytes | bytearray | memoryview) -> RxResult:
        """Check one received frame (FCS stripped, padding allowed) and, if good, commit it (see
        the module docstring for the checks and their order).

        A completed RDMA WRITE message WITH_IMMEDIATE is written into the ring memory and
        ``ring.publish(slot, dma_len)`` is called with ``slot = ImmDt[11:0]``; its VA must be the
        slot's start (``ring va + slot * slot_size``) and it must fit in the slot. Never raises
        for bad input: the reason is counted and returned.
        """
        self.counters["RX_FRAMES"] += 1
        n = len(frame)
        if n < ROCE_HEADERS_BYTES:
            return self._drop(_short_frame_reason(frame))
        (dst, src, ethertype, ver_ihl, _tos, total, _ident, flags_frag, _ttl, protocol, _csum,
         src_ip, dst_ip, _sport, dport, udp_len, udp_csum, opcode, bth1, p_key, bth_qp,
         bth_psn) = ROCE_HEADERS.unpack_from(frame)
        if dst != self._local_mac_bytes or ethertype != EtherType.IPV4:
            return self._drop("DROP_ETH")
        if (ver_ihl != 0x45 or total < _IP or _ETH + total > n or flags_frag & 0x3FFF
                or dst_ip != self.local_ip or protocol != IpProtocol.UDP
                or not ipv4_header_ok(frame, _ETH)):
            return self._drop("DROP_IP")
        udp_end = _ETH + _IP + udp_len
        if (udp_len < _UDP or _IP + udp_len > total or dport != ROCEV2_PORT
                or (udp_csum and not udp_checksum_ok(src_ip, dst_ip,
                                                     memoryview(frame)[_ETH + _IP:udp_end]))):
            return self._drop("DROP_UDP")
        icrc_at = udp_end - ICRC_BYTES
        if icrc_at < ROCE_HEADERS_BYTES:
            return self._drop("DROP_LENGTH")
        psn = bth_psn & 0xFFFFFF
        if icrc(memoryview(frame)[_ETH:icrc_at]) != frame[icrc_at:udp_end]:
            return self._drop("DROP_ICRC", opcode, psn)
        info = _WRITE_OPS.get(opcode)
        if info is None or bth1 & 0xF:
            return self._drop("DROP_OPCODE", opcode, psn)
        if not pkey_matches(p_key, self.p_key):
            return self._drop("DROP_PKEY", opcode, psn)
        if bth_qp & 0xFFFFFF != self.qpn:
            return self._drop("DROP_QPN", opcode, psn)
        if src != self._peer_mac_bytes or src_ip != self.remote_ip:
            return self._drop("DROP_PEER", opcode, psn)
        op, reth_bytes, imm_bytes = info
        at = ROCE_HEADERS_BYTES
        reth = imm = None
        if at + reth_bytes + imm_bytes > icrc_at:
            return self._drop("DROP_LENGTH", opcode, psn)
        if reth_bytes:
            reth = RETH_CODEC.unpack_from(frame, at)
            at += reth_bytes
        if imm_bytes:
            imm = IMMDT_CODEC.unpack_from(frame, at)[0]
            at += imm_bytes
        pad = (bth1 >> 4) & 3
        if pad > icrc_at - at:
            return self._drop("DROP_LENGTH", opcode, psn)
        try:
            return self._receive_write(op, psn, reth, imm, frame[at:icrc_at - pad])
        except _Drop as d:
            self._msg = None   # any drop past the QP checks abandons the open message
            return self._drop(d.reason, opcode, psn)

    def _receive_write(self, op: Opcode, psn: int, reth: tuple[int, int, int] | None,
                       imm: int | None, payload: bytes) -> RxResult:
        if op is Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE and reth is not None:
            return self._receive_request(psn, reth, imm, payload)
        mtu = self.pmtu_bytes
        if reth is not None:
            va, r_key, dma_len = reth
            if self._ring is None or r_key != self._ring_rkey:
                raise _Drop("DROP_RKEY")
            if va < self._ring_va or va + dma_len > self._ring_va + self._ring_bytes:
                raise _Drop("DROP_VA")
            if op is Opcode.RDMA_WRITE_FIRST:
                if len(payload) != mtu or dma_len <= mtu:
                    raise _Drop("DROP_LENGTH")
            elif len(payload) != dma_len or len(payload) > mtu:
                raise _Drop("DROP_LENGTH")
            msg = _Message(va, dma_len, bytearray(payload))
        else:
            msg = self._msg
            if msg is None or psn != self.rx_epsn:
                raise _Drop("DROP_PSN")
            total = len(msg.data) + len(payload)
            if op is Opcode.RDMA_WRITE_MIDDLE:
                if len(payload) != mtu or total >= msg.dma_len:
                    raise _Drop("DROP_LENGTH")
            elif not 0 < len(payload) <= mtu or total != msg.dma_len:
                raise _Drop("DROP_LENGTH")
        ring = self._ring
        assert ring is not None   # an open message or a RETH with the ring's key needs one
        size = ring.slot_size
        slot = None
        if imm is not None:
            slot = imm & 0xFFF
            if slot >= ring.num_slots or msg.va != self._ring_va + slot * size \
                    or msg.dma_len > size:
                raise _Drop("DROP_VA")
            if msg.dma_len == 0:
                raise _Drop("DROP_LENGTH")   # no request to publish
        ends = op in _ENDS
        offset = msg.va - self._ring_va
        if ends and msg.dma_len:
            # Write no byte into a slot that still holds a request the dispatcher has not taken.
            for s in range(offset // size, (offset + msg.dma_len - 1) // size + 1):
                if ring.ready(s):
                    raise _Drop("DROP_OVERFLOW")
        # Every check passed: update the PSN state, then commit.
        gap = op in _START and psn != self.rx_epsn
        if gap:
            self.counters["PSN_GAP"] += 1
        self.rx_epsn = (psn + 1) % PSN_MODULUS
        if op in _START:
            self._msg = msg
        else:
            msg.data += payload
        self.counters["RX_ROCE_ACCEPTED"] += 1
        if not ends:
            return RxResult(True, "RX_ROCE_ACCEPTED", int(op), psn, psn_gap=gap)
        self._msg = None
        memoryview(ring.memory).cast("B")[offset:offset + len(msg.data)] = msg.data
        if slot is None:
            return RxResult(True, "RX_ROCE_ACCEPTED", int(op), psn, psn_gap=gap)
        try:
            ring.publish(slot, msg.dma_len)
        except Exception:
            # A ring of the application's own that refuses: the request is lost, the host
            # goes on serving.
            log.exception("ring.publish(%d, %d) raised; the request is dropped", slot,
                          msg.dma_len)
            self.counters["DROP_OVERFLOW"] += 1
            return RxResult(False, "DROP_OVERFLOW", int(op), psn)
        self.counters["RX_PUBLISHED"] += 1
        return RxResult(True, "RX_ROCE_ACCEPTED", int(op), psn, slot, msg.dma_len, gap)


    def _receive_request(self, psn: int, reth: tuple[int, int, int], imm: int | None,
                         payload: bytes) -> RxResult:
        """RDMA_WRITE_ONLY_WITH_IMMEDIATE, the one packet of an RPC request: the checks of
        :meth:`_receive_write` for it, without gathering a message."""
        va, r_key, dma_len = reth
        ring = self._ring
        if ring is None or r_key != self._ring_rkey:
            raise _Drop("DROP_RKEY")
        offset = va - self._ring_va
        size = ring.slot_size
        if offset < 0 or offset + dma_len > self._ring_bytes:
            raise _Drop("DROP_VA")
        n = len(payload)
        if n != dma_len or n > self.pmtu_bytes:
            raise _Drop("DROP_LENGTH")
        assert imm is not None  # the opcode carries an ImmDt
        slot = imm & 0xFFF
        if slot >= ring.num_slots or offset != slot * size or n > size:
            raise _Drop("DROP_VA")
        if n == 0:
            raise _Drop("DROP_LENGTH")   # no request to publish
        if ring.ready(slot):
            raise _Drop("DROP_OVERFLOW")
        counters = self.counters
        gap = psn != self.rx_epsn
        if gap:
            counters["PSN_GAP"] += 1
        self.rx_epsn = (psn + 1) % PSN_MODULUS
        self._msg = None                  # an ONLY packet ends any open message
        counters["RX_ROCE_ACCEPTED"] += 1
        memoryview(ring.memory).cast("B")[offset:offset + n] = payload
        op = int(Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
        try:
            ring.publish(slot, n)
        except Exception:
            log.exception("ring.publish(%d, %d) raised; the request is dropped", slot, n)
            counters["DROP_OVERFLOW"] += 1
            return RxResult(False, "DROP_OVERFLOW", op, psn)
        counters["RX_PUBLISHED"] += 1
        return RxResult(True, "RX_ROCE_ACCEPTED", op, psn, slot, n, gap)


_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


def _short_frame_reason(frame: bytes | bytearray | memoryview) -> str:
    """The drop counter of a frame too short for the RoCEv2 headers: the layer where it stops
    being one (read with the general parser; not the per-packet path)."""
    try:
        f = parse_frame(frame)
    except WireFormatError as e:
        return {"Ethernet": "DROP_ETH", "IPv4": "DROP_IP", "UDP": "DROP_UDP"}.get(
            e.header, "DROP_LENGTH")
    if f.ip is None:
        return "DROP_ETH"
    if f.udp is None:
        return "DROP_IP"
    return "DROP_UDP" if f.bth is None else "DROP_LENGTH"
