"""Software RoCEv2 Unreliable Connection endpoint: the host side of the raw-Ethernet bridge.

One :class:`UCQueuePair` builds the UC packets the host sends (RDMA WRITE, SEND) and receives the
QSC's RPC requests: UC RDMA WRITEs, the last packet WITH_IMMEDIATE, into a registered ring of
slots (the dispatcher's ``SlotRing``). It keeps the UC rules of rdma-core's rxe ``check_psn``: no
ACKs, a FIRST/ONLY packet is accepted whatever its PSN and resynchronises the expected PSN (a jump
is counted in ``PSN_GAP``), a MIDDLE/LAST whose PSN is not the expected one, or that arrives with
no message open, is dropped and abandons the open message until the next FIRST/ONLY.

Receive checks, in order, each dropping the packet and counting one reason in ``counters``
(names as the QSC's counters in :data:`openqlink.memory_map.COUNTERS`): structure and Ethernet
destination (``DROP_ETH``), IPv4 checksum/destination/protocol (``DROP_IP``), UDP port
(``DROP_UDP``), ICRC (``DROP_ICRC``), opcode: RDMA WRITE FIRST/MIDDLE/LAST[_WITH_IMMEDIATE]/
ONLY[_WITH_IMMEDIATE] only (``DROP_OPCODE``), P_Key (``DROP_PKEY``), DestQP (``DROP_QPN``), PSN
(``DROP_PSN``), R_Key (``DROP_RKEY``), VA range and slot (``DROP_VA``), payload length against
PMTU and DMALen (``DROP_LENGTH``). Bad packets never raise: the host must keep serving.

Commit rule: nothing is written to the ring before the message is complete and every packet of it
has passed its checks. A multi-packet message is gathered in a private buffer and written, in one
copy, when its LAST packet is accepted; an abandoned message writes nothing.

# Ref: IBTA Vol 1 Release 1.4 9.2-9.3 (BTH, RETH, ImmDt), 9.4.3 (RDMA WRITE), 9.7.1-9.7.2
# (PSN), 9.8.3 (UC responder: FIRST/ONLY resynchronise), 10.9.1.2 (P_Key matching); Annex A17;
# rdma-core / Linux rxe ``rxe_resp.c`` ``check_psn`` for IB_QPT_UC.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .errors import FieldRangeError, WireFormatError
from .wire.ethernet import mac_to_int
from .wire.ipv4 import IpProtocol, ip_to_int
from .wire.packet import DEFAULT_ROCE_SRC_PORT, Frame, build_roce_frame, parse_frame
from .wire.roce import DEFAULT_P_KEY, PATH_MTU_BYTES, Opcode
from .wire.udp import ROCEV2_PORT

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
    "DROP_RKEY", "DROP_VA", "DROP_LENGTH", "DROP_PSN", "PSN_GAP",
)

_WRITES = frozenset(op for op in Opcode if not op.is_send)
_START = frozenset(op for op in _WRITES if op.starts_message)
_ENDS = frozenset(op for op in _WRITES if op.ends_message)
# Header of a parse error -> the counter of the layer it belongs to.
_PARSE_DROP = {"Ethernet": "DROP_ETH", "IPv4": "DROP_IP", "UDP": "DROP_UDP"}


@runtime_checkable
class SlotRingLike(Protocol):
    """What :meth:`UCQueuePair.register_ring` needs of a ring (the dispatcher's ``SlotRing``).

    ``memory`` is a writable buffer of ``num_slots * slot_size`` bytes; ``publish(slot, length)``
    hands a complete request in ``slot`` (``length`` bytes from the slot's start) to the consumer.
    """

    num_slots: int
    slot_size: int
    memory: Any

    def publish(self, slot: int, length: int) -> None: ...


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

    Sending is thread safe (the PSN is taken under a lock); :meth:`handle_frame` must be called
    from one thread at a time.
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
        self._ring: SlotRingLike | None = None
        self._ring_rkey = 0
        self._ring_va = 0
        self._ring_bytes = 0
        self._msg: _Message | None = None

    # --- send ---------------------------------------------------------------------------------

    def _frame(self, opcode: Opcode, payload: bytes, **ext: int | None) -> bytes:
        with self._tx_lock:
            psn = self.tx_psn
            self.tx_psn = (psn + 1) % PSN_MODULUS
            self.counters["TX_FRAMES"] += 1
        return build_roce_frame(dst_mac=self.remote_mac, src_mac=self.local_mac,
                                src_ip=self.local_ip, dst_ip=self.remote_ip,
                                src_port=self.udp_src_port, opcode=opcode,
                                dest_qp=self.remote_qpn, psn=psn, p_key=self.p_key,
                                payload=payload, **ext)

    def _check_fits(self, what: str, data: bytes) -> None:
        if len(data) > self.pmtu_bytes:
            raise FieldRangeError(what, "dma_len" if what == "RETH" else "payload", len(data),
                                  f"{len(data)} bytes exceed the PMTU of {self.pmtu_bytes} "
                                  "(one packet per message)")

    def write_frame(self, va: int, r_key: int, data: bytes, imm: int | None = None) -> bytes:
        """One UC RDMA_WRITE_ONLY (or _WITH_IMMEDIATE when ``imm`` is given) of ``data`` to
        ``va`` (64-bit) under ``r_key`` (32-bit); takes the next PSN.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``RETH.dma_len`` when ``data``
        exceeds the PMTU (use :meth:`write_frames`), or the field a value does not fit.
        """
        data = bytes(data)
        self._check_fits("RETH", data)
        op = Opcode.RDMA_WRITE_ONLY if imm is None else Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE
        return self._frame(op, data, va=va, r_key=r_key, imm=imm)

    def write_frames(self, va: int, r_key: int, data: bytes,
                     imm: int | None = None) -> list[bytes]:
        """The UC RDMA WRITE message of ``data``: one ONLY packet when it fits the PMTU, else
        FIRST (with the RETH), MIDDLE..., LAST (_WITH_IMMEDIATE when ``imm`` is given), each
        carrying PMTU bytes but the last. Takes one PSN per packet."""
        return self._message_frames("RDMA_WRITE", bytes(data), imm, va=va, r_key=r_key,
                                    dma_len=len(data))

    def send_frame(self, payload: bytes) -> bytes:
        """One UC SEND_ONLY carrying ``payload``; takes the next PSN.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``BTH.payload`` when the payload
        exceeds the PMTU.
        """
        payload = bytes(payload)
        self._check_fits("BTH", payload)
        return self._frame(Opcode.SEND_ONLY, payload)

    def send_frames(self, payload: bytes, imm: int | None = None) -> list[bytes]:
        """The UC SEND message of ``payload``: one SEND_ONLY when it fits the PMTU, else FIRST,
        MIDDLE..., LAST, each carrying PMTU bytes but the last; with ``imm`` (32 bits) the
        packet that ends it is _WITH_IMMEDIATE. Takes one PSN per packet (IBTA Vol 1 9.8.3).
        A QSC takes a SEND message of up to the QP's RESPONSE_BYTES into its mailbox (the
        first 64 bytes: a response as CUDA-Q's GPU bridge sends it, longer than its result).
        """
        return self._message_frames("SEND", bytes(payload), imm)

    def _message_frames(self, kind: str, data: bytes, imm: int | None,
                        **reth: int) -> list[bytes]:
        """The UC message of ``data`` for ``kind`` (``"SEND"`` or ``"RDMA_WRITE"``): an ONLY
        packet when it fits the PMTU, else FIRST, MIDDLE..., LAST, each carrying PMTU bytes but
        the last; ``reth`` goes into the packet that begins it, ``imm`` into the one that ends
        it (then _WITH_IMMEDIATE). One PSN per packet."""
        with_imm = "" if imm is None else "_WITH_IMMEDIATE"
        mtu = self.pmtu_bytes
        if len(data) <= mtu:
            return [self._frame(Opcode[f"{kind}_ONLY{with_imm}"], data, imm=imm, **reth)]
        chunks = [data[i:i + mtu] for i in range(0, len(data), mtu)]
        frames = [self._frame(Opcode[f"{kind}_FIRST"], chunks[0], **reth)]
        frames += [self._frame(Opcode[f"{kind}_MIDDLE"], c) for c in chunks[1:-1]]
        frames.append(self._frame(Opcode[f"{kind}_LAST{with_imm}"], chunks[-1], imm=imm))
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

    def handle_frame(self, frame: bytes | bytearray | Frame) -> RxResult:
        """Check one received frame and, if good, commit it (see the module docstring).

        A completed RDMA WRITE message WITH_IMMEDIATE is written into the ring memory and
        ``ring.publish(slot, dma_len)`` is called with ``slot = ImmDt[11:0]``; its VA must be the
        slot's start (``ring va + slot * slot_size``) and it must fit in the slot. Never raises
        for bad input: the reason is counted and returned.
        """
        self.counters["RX_FRAMES"] += 1
        if isinstance(frame, Frame):
            f = frame
        else:
            try:
                f = parse_frame(frame)
            except WireFormatError as e:
                return self._drop(_PARSE_DROP.get(e.header, "DROP_LENGTH"))
        if f.eth["dst"] != self.local_mac or f.ip is None:
            return self._drop("DROP_ETH")
        if (not f.ip_checksum_ok or f.ip["dst"] != self.local_ip
                or f.ip["protocol"] != IpProtocol.UDP):
            return self._drop("DROP_IP")
        if f.udp is None or f.udp["dst_port"] != ROCEV2_PORT or f.bth is None:
            return self._drop("DROP_UDP")
        bth = f.bth
        opcode, psn = bth["opcode"], bth["psn"]
        if not f.icrc_ok:
            return self._drop("DROP_ICRC", opcode, psn)
        if opcode not in _WRITES:
            return self._drop("DROP_OPCODE", opcode, psn)
        if not pkey_matches(bth["p_key"], self.p_key):
            return self._drop("DROP_PKEY", opcode, psn)
        if bth["dest_qp"] != self.qpn:
            return self._drop("DROP_QPN", opcode, psn)
        try:
            return self._receive_write(Opcode(opcode), psn, f)
        except _Drop as d:
            self._msg = None   # any drop past the QP checks abandons the open message
            return self._drop(d.reason, opcode, psn)

    def _receive_write(self, op: Opcode, psn: int, f: Frame) -> RxResult:
        payload = f.payload
        mtu = self.pmtu_bytes
        if op in _START:
            assert f.reth is not None  # parse_frame gives every FIRST/ONLY its RETH
            va, r_key, dma_len = f.reth["va"], f.reth["r_key"], f.reth["dma_len"]
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
        slot = None
        if f.immdt is not None:
            assert self._ring is not None
            slot = f.immdt["imm"] & 0xFFF
            size = self._ring.slot_size
            if (slot >= self._ring.num_slots or msg.va != self._ring_va + slot * size
                    or msg.dma_len > size):
                raise _Drop("DROP_VA")
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
        if op not in _ENDS:
            return RxResult(True, "RX_ROCE_ACCEPTED", int(op), psn, psn_gap=gap)
        self._msg = None
        assert self._ring is not None
        offset = msg.va - self._ring_va
        memoryview(self._ring.memory).cast("B")[offset:offset + len(msg.data)] = msg.data
        if slot is None:
            return RxResult(True, "RX_ROCE_ACCEPTED", int(op), psn, psn_gap=gap)
        self._ring.publish(slot, msg.dma_len)
        self.counters["RX_PUBLISHED"] += 1
        return RxResult(True, "RX_ROCE_ACCEPTED", int(op), psn, slot, msg.dma_len, gap)
