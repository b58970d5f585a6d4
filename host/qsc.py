"""The QSC device client: one object that talks to a board or to the simulated gateware.

:class:`QSC` owns one :class:`~openqlink.bridges.base.FrameTransport` and demultiplexes what it
receives: control-plane responses go to its :class:`~openqlink.control.ControlClient`, RoCEv2
packets to the host UC QP of the PPU whose ``DestQP`` they carry (which writes RPC requests into
that PPU's ring and publishes them to the dispatcher), anything else is counted in
:attr:`QSC.rx_counts`. The same code drives the cocotb bench and real boards.

Setup goes over the control plane (register reads and writes, :mod:`openqlink.memory_map`); bulk
data and the atomic trigger go as UC RDMA WRITE_ONLY packets on the PPU's QP into its IMEM, ENV
and REGS regions; RPC responses go as UC SEND_ONLY into the PPU's response mailbox. All memory
the QSC exposes is little-endian (registers, envelope samples, instruction words).

# Ref: docs/architecture.md; openqlink.memory_map (QP contract); IBTA Vol 1 9.4.3 (RDMA WRITE),
# 9.4.1 (SEND); CUDA-Q realtime message protocol (RPC responses); Holoscan Sensor Bridge control
# plane.
"""

from __future__ import annotations

import array
import secrets
import struct
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from amaranth.lib import data

from .bridges.base import FrameTransport
from .control import DEFAULT_LOCAL_PORT, ControlClient
from .errors import (
    FieldRangeError,
    QlinkError,
    UploadError,
    VersionMismatchError,
    WireFormatError,
)
from .isa.layout import INSTRUCTION_BYTES, ISA_VERSION, PPUStatus
from .memory_map import (
    COUNTERS,
    ENV_OFFSET,
    IMEM_OFFSET,
    MAILBOX_BYTES,
    PPU_REGISTERS,
    QP_COUNTERS,
    QP_REGISTERS,
    REGS_OFFSET,
    REGS_RDMA_BYTES,
    Access,
    QSCParams,
    counter_addr,
    global_reg,
    ppu_base,
    ppu_reg,
    qp_reg,
    readout_reg,
    trace_addr,
    version_word,
)
from .roce import PMTU_VALUES, SlotRingLike, UCQueuePair
from .udpcall import UDPCallPort
from .wire.ethernet import mac_to_int
from .wire.ipv4 import IpProtocol, int_to_ip, ip_to_int
from .wire.packet import DEFAULT_ROCE_SRC_PORT, ROCE_HEADERS_BYTES, parse_frame
from .wire.roce import path_mtu_code
from .wire.rpc import HEADER_BYTES
from .wire.udp import ROCEV2_PORT, UDP_CALL_PORT_BASE

_ROCEV2_PORT_BYTES = ROCEV2_PORT.to_bytes(2, "big")

__all__ = ["QSC", "RKeys", "TraceStatus", "DEFAULT_HOST_QPN_BASE", "DEFAULT_HOST_CALL_PORT",
           "CALL_TRANSPORTS", "RX_COUNT_NAMES", "TRIGGER_UPLOAD_CHECK"]

#: Host QPN of PPU ``n`` unless :meth:`QSC.configure` is told otherwise: ``0x200 + n``.
DEFAULT_HOST_QPN_BASE = 0x200
#: This host's UDP port for PPU ``n``'s CALLs in the UDP transport unless told otherwise:
#: ``0xC200 + n``.
DEFAULT_HOST_CALL_PORT = 0xC200
#: How a PPU's CALLs travel (its QP's TRANSPORT register): ``"roce"``, UC RDMA WRITE requests
#: and SEND responses (0); ``"udp"``, one datagram each way, CUDA-Q realtime's ``udp`` bridge
#: format (1).
CALL_TRANSPORTS = ("roce", "udp")
#: The path MTU the host uses unless told otherwise (bytes of payload per packet).
DEFAULT_PMTU_BYTES = 1024

#: Keys of :attr:`QSC.rx_counts`.
RX_COUNT_NAMES = ("roce", "roce_unknown_qpn", "udp_call", "control_unexpected", "malformed",
                  "other")


@dataclass(frozen=True)
class RKeys:
    """The four R_Keys of one PPU's QP contract (32 bits each).

    ``ring``: the host's request ring (checked by the host QP); ``imem``, ``env``, ``regs``: the
    PPU's instruction ring, envelope memory and register block (checked by the QSC).
    """

    ring: int
    imem: int
    env: int
    regs: int

    @classmethod
    def random(cls) -> RKeys:
        """Four distinct, non-zero keys from the operating system's random source
        (:mod:`secrets`): what :meth:`QSC.configure` and :meth:`QSC.configure_qp` take by
        default, so that no one else on the LAN can guess a region's key."""
        keys: set[int] = set()
        while len(keys) < 4:
            keys.add(secrets.randbits(32) or 1)
        ring, imem, env, regs = keys
        return cls(ring=ring, imem=imem, env=env, regs=regs)

    @classmethod
    def fixed(cls, ppu: int) -> RKeys:
        """Non-zero, distinct, predictable keys (a zero key is what an unconfigured QSC holds):
        ASCII tags ``"RI"``, ``"IM"``, ``"EN"``, ``"RG"`` in the high half, the index in the low
        half. For simulations and captures that must replay byte for byte, never for a board
        on a shared network (use :meth:`random`)."""
        return cls(ring=0x5249_0000 | ppu, imem=0x494D_0000 | ppu, env=0x454E_0000 | ppu,
                   regs=0x5247_0000 | ppu)


@dataclass
class _PPUState:
    qp: UCQueuePair
    qsc_qpn: int
    rkeys: RKeys
    ring: SlotRingLike | None
    #: The host end of the PPU's CALLs in the UDP transport (None: RoCE, through ``qp``).
    call_port: UDPCallPort | None = None
    #: With the verbs bridge: the NIC's UC QP (requests, uploads, responses), else None.
    verbs: Any = None
    #: The PPU's UPLOAD_WORDS as this host expects it (words sent since the last trigger, or
    #: the count read back by the last verified upload).
    upload_words: int = 0


@dataclass(frozen=True)
class TraceStatus:
    """A PPU's raw-trace capture, from TRACE_STATUS and TRACE_COUNT (:meth:`QSC.trace_status`).

    ``armed``: waiting for the channel's next ACQUIRE window; ``capturing``: recording it;
    ``done``: the capture ended (the window's end, or ``full``: the trace memory's);
    ``refused``: the last arm named a channel the build lacks; ``channel``: the armed (or last
    captured) readout channel; ``count``: samples captured (a multiple of samples_per_cycle).
    """

    armed: bool
    capturing: bool
    done: bool
    full: bool
    refused: bool
    channel: int
    count: int

    @classmethod
    def from_registers(cls, status: int, count: int) -> TraceStatus:
        """Decode TRACE_STATUS (bits 0..4 the flags, 11..8 the channel) and TRACE_COUNT."""
        return cls(armed=bool(status & 1), capturing=bool(status & 2), done=bool(status & 4),
                   full=bool(status & 8), refused=bool(status & 16),
                   channel=(status >> 8) & 0xF, count=count)


def _s40(lo: int, hi: int) -> int:
    """A 40-bit signed value from its LO word and its sign-extended HI word."""
    v = (hi & 0xFFFF_FFFF) << 32 | (lo & 0xFFFF_FFFF)
    return v - (1 << 64) if v >> 63 else v


#: TRIGGER bit 31: check the upload's word count (bits 30..16, mod 2**15) before accepting.
TRIGGER_UPLOAD_CHECK = 1 << 31


def _words_touched(va: int, nbytes: int) -> int:
    """The 64-bit bus words that an RDMA WRITE of ``nbytes`` at ``va`` writes (what the PPU's
    UPLOAD_WORDS counts for it)."""
    return 0 if nbytes == 0 else (va % 8 + nbytes + 7) // 8


def _reg_offset(name: str) -> int:
    return next(r.offset for r in PPU_REGISTERS if r.name == name)


class QSC:
    """Client of one QSC (board or simulation).

    Parameters
    ----------
    transport : FrameTransport | None
        Carries all frames to and from the QSC; owned (closed by :meth:`close`). Give it or
        ``bridge``.
    bridge : str | None
        Open this bridge (:func:`openqlink.bridges.open_bridge`: ``"raw"`` with ``interface``,
        ``"udp"``, ``"verbs"`` with ``device``) instead of taking a transport; it finds
        ``host_mac`` and ``host_ip`` unless they are given. Raises
        :class:`~openqlink.bridges.verbs.BridgeUnavailableError` (one line) where this host
        cannot run it.
    host_mac, host_ip
        This host's addresses, as the QSC must send to them (needed with ``transport``).
    params : QSCParams | None
        The QSC build's parameters (IMEM/ENV depths, number of PPUs, default MAC/IP). ``None``:
        defaults, with the number of PPUs taken from the QSC at :meth:`connect`.
    qsc_mac, qsc_ip
        The QSC's addresses (default: ``params.mac``/``params.ip``).
    control_port : int
        UDP port of this host's control requests.
    roce_src_port : int
        UDP source port of this host's RoCEv2 packets.
    pmtu_bytes : int
        Path MTU: the largest RDMA payload per packet, 256, 512, 1024 (default), 2048 or 4096;
        :meth:`configure` writes it to the QP's PMTU register. A frame of a 4096-byte PMTU
        is 4154 bytes or more: the path needs jumbo frames beyond a 1024-byte PMTU.
    call_transport : str | None
        How :meth:`configure` sets up the PPUs' CALLs by default (:data:`CALL_TRANSPORTS`):
        ``"roce"`` (UC RDMA WRITE WITH IMMEDIATE requests, SEND responses: the default), or
        ``"udp"`` (one datagram each way, CUDA-Q realtime's ``udp`` format; the ``udp`` bridge's
        only one). The ``verbs`` bridge's CALLs are RoCE on the NIC.
    timeout_s, retries
        Control-plane time-out per attempt (seconds of ``transport.now_s()``) and retries.

    Attributes
    ----------
    control : ControlClient
    num_ppus, num_qps : int
        Known after :meth:`connect` (from ``params`` before it).
    rx_counts : dict[str, int]
        Received frames by :data:`RX_COUNT_NAMES`; the host QPs count their own drops in
        ``qsc.qp(ppu).counters``.

    Thread safety: API calls may come from one thread while another calls :meth:`poll_rx` and
    :meth:`send_response` (the dispatcher). While a control transaction runs, :meth:`poll_rx`
    returns at once and the transaction routes the frames it reads itself.
    """

    def __init__(self, transport: FrameTransport | None = None, *, bridge: str | None = None,
                 interface: str | None = None, host_mac: str | bytes | int | None = None,
                 host_ip: str | int | None = None, params: QSCParams | None = None,
                 qsc_mac: str | bytes | int | None = None, qsc_ip: str | int | None = None,
                 control_port: int = DEFAULT_LOCAL_PORT,
                 roce_src_port: int = DEFAULT_ROCE_SRC_PORT,
                 pmtu_bytes: int = DEFAULT_PMTU_BYTES, call_transport: str | None = None,
                 device: str | None = None, timeout_s: float = 0.2, retries: int = 3):
        self._params_given = params is not None
        self.params = params or QSCParams()
        self.qsc_mac = mac_to_int(self.params.mac if qsc_mac is None else qsc_mac)
        self.qsc_ip = ip_to_int(self.params.ip if qsc_ip is None else qsc_ip)
        if pmtu_bytes not in PMTU_VALUES:
            raise FieldRangeError("QPContext", "pmtu_bytes", pmtu_bytes,
                                  f"a path MTU is one of {PMTU_VALUES} bytes")
        if call_transport is not None and call_transport not in CALL_TRANSPORTS:
            raise FieldRangeError("QSC", "call_transport", call_transport,
                                  f"one of {', '.join(CALL_TRANSPORTS)}")
        self.bridge: str | None = None
        self.device: str | None = None
        default_calls = "roce"
        if (transport is None) == (bridge is None):
            raise QlinkError("QSC: give a transport or a bridge name (bridge='raw', 'udp' or "
                             "'verbs'), not " + ("both" if bridge else "neither"))
        if bridge == "udp" and call_transport == "roce":
            raise FieldRangeError("QSC", "call_transport", call_transport,
                                  "the udp bridge takes CALLs as UDP datagrams only")
        if bridge is not None:
            from .bridges import open_bridge
            opened = open_bridge(bridge, qsc_ip=self.qsc_ip, interface=interface,
                                 host_ip=host_ip, device=device)
            transport = opened.transport
            host_mac = opened.host_mac if host_mac is None else host_mac
            host_ip = opened.host_ip
            default_calls = opened.call_transport
            self.bridge, self.device = bridge, opened.device
        if host_mac is None or host_ip is None:
            raise QlinkError("QSC: host_mac and host_ip are needed with a transport (a bridge "
                             "finds them)")
        assert transport is not None
        self.transport = transport
        self.host_mac = mac_to_int(host_mac)
        self.host_ip = ip_to_int(host_ip)
        #: How configure() sets up a PPU's CALLs unless told: "roce", "udp" or (verbs bridge)
        #: "verbs".
        self.call_transport = call_transport or default_calls
        self.roce_src_port = roce_src_port
        self.pmtu_bytes = pmtu_bytes
        self.num_ppus = self.params.num_ppus
        self.num_qps: int = self.params.num_qps
        self.control = ControlClient(transport, local_mac=self.host_mac, local_ip=self.host_ip,
                                     local_port=control_port, qsc_mac=self.qsc_mac,
                                     qsc_ip=self.qsc_ip, timeout_s=timeout_s, retries=retries,
                                     on_frame=self.handle_frame)
        self.rx_counts: dict[str, int] = dict.fromkeys(RX_COUNT_NAMES, 0)
        self.version = 0
        self._ppus: dict[int, _PPUState] = {}
        #: QPs beyond the PPUs' own that :meth:`configure_qp` set up with this host as their
        #: peer: QP -> this host's UC QP
        self._extra_qps: dict[int, UCQueuePair] = {}
        self._by_qpn: dict[int, UCQueuePair] = {}
        #: This host's UDP port -> the UDP call port of the PPU whose CALLs arrive there
        self._by_call_port: dict[int, UDPCallPort] = {}
        #: The verbs bridge's QPs, polled by poll_rx
        self._verbs: list[Any] = []
        #: the R_Keys configure_qp wrote: QP -> region name -> key
        self._qp_rkeys: dict[int, dict[str, int]] = {}
        self._tx_lock = threading.Lock()

    # --- connection and configuration ---------------------------------------------------------

    def connect(self) -> int:
        """Check the QSC speaks our gateware and ISA version; return its VERSION word.

        Reads VERSION (``{major, minor, isa, 0x51}``, see
        :func:`openqlink.memory_map.version_word`): the tag byte, the major version and the ISA
        version must equal ours (minor may differ), then NUM_PPUS (1..16, equal to
        ``params.num_ppus`` when params were given) and NUM_QPS (NUM_PPUS..16, likewise).

        Raises :class:`~openqlink.errors.VersionMismatchError` naming the field that differs, and
        :class:`~openqlink.errors.ControlPlaneError` when the QSC does not answer.
        """
        got = self.control.read(global_reg("VERSION"))
        want = version_word(ISA_VERSION)
        if got & 0xFF != want & 0xFF:
            raise VersionMismatchError(f"VERSION {got:#010x}: tag byte {got & 0xFF:#04x} is not "
                                       f"{want & 0xFF:#04x}: not an openqlink QSC")
        if got >> 24 != want >> 24:
            raise VersionMismatchError(f"VERSION {got:#010x}: gateware major {got >> 24}, this "
                                       f"host speaks major {want >> 24}")
        if (got >> 8) & 0xFF != ISA_VERSION:
            raise VersionMismatchError(f"VERSION {got:#010x}: ISA version {(got >> 8) & 0xFF}, "
                                       f"this host speaks ISA version {ISA_VERSION}")
        num = self.control.read(global_reg("NUM_PPUS"))
        if not 1 <= num <= 16:
            raise VersionMismatchError(f"NUM_PPUS: QSC reports {num}, not 1..16")
        if self._params_given and num != self.params.num_ppus:
            raise VersionMismatchError(f"NUM_PPUS: QSC reports {num}, params.num_ppus is "
                                       f"{self.params.num_ppus}")
        num_qps = self.control.read(global_reg("NUM_QPS"))
        if not num <= num_qps <= 16:
            raise VersionMismatchError(f"NUM_QPS: QSC reports {num_qps}, not {num}..16")
        if self._params_given and num_qps != self.params.num_qps:
            raise VersionMismatchError(f"NUM_QPS: QSC reports {num_qps}, params.num_qps is "
                                       f"{self.params.num_qps}")
        self.num_ppus = num
        self.num_qps = num_qps
        self.version = got
        return got

    def _check_ppu(self, ppu: int) -> None:
        if not 0 <= ppu < self.num_ppus:
            raise FieldRangeError("QSC", "ppu", ppu, f"PPU {ppu} is not in 0..{self.num_ppus - 1}")

    def _state(self, ppu: int) -> _PPUState:
        self._check_ppu(ppu)
        try:
            return self._ppus[ppu]
        except KeyError:
            raise QlinkError(f"PPU {ppu} is not configured: call QSC.configure({ppu}, ...) "
                             "first") from None

    def configure(self, ppu: int, ring: SlotRingLike | None = None, host_qpn: int | None = None,
                  ring_rkey: int | None = None, imem_rkey: int | None = None,
                  env_rkey: int | None = None, regs_rkey: int | None = None,
                  qsc_qpn: int | None = None, response_bytes: int | None = None, *,
                  call_transport: str | None = None,
                  host_call_port: int | None = None) -> UCQueuePair:
        """Set up PPU ``ppu``'s QP contract on both sides; return the host QP.

        Writes the PPU's QP context: HOST_QPN (which restarts
        the QSC's side of the QP: its next request goes with PSN 0 into slot 0, as a new host QP
        and dispatcher expect, however many the QP carried before, and an open message is
        abandoned), PMTU (``pmtu_bytes``' PathMTU code), PEER_MAC_HI/LO and PEER_IP (this
        host's addresses: the QP takes packets from them only and sends its requests to
        them), HOST_RKEY (the
        ring's), RING_VA_HI/LO (0: the ring is registered with iova 0), NUM_SLOTS and SLOT_SIZE
        (when ``ring`` is given, with the PPU's CALL_SLOTS: at most that many CALLs outstanding,
        and none held from before), IMEM_RKEY, ENV_RKEY, REGS_RKEY (a region's R_Key opens it from
        this write on: the QSC holds every R_Key invalid from reset and from the HOST_QPN write),
        then sets RX_ENABLE (off from reset), all in one WR_BLOCK, in that order (a write that
        fails stops the ones after it); reads QSC_QPN. Its first write claims the QSC's
        control plane for this host (global CLAIM register; :meth:`release` gives it up). Then
        makes the
        host UC QP (``host_qpn`` -> QSC_QPN) and registers ``ring`` on it with ``ring_rkey``.
        Keys left ``None`` are random (:meth:`RKeys.random`; :meth:`rkeys` tells them);
        ``host_qpn`` defaults to
        ``DEFAULT_HOST_QPN_BASE + ppu``. ``qsc_qpn`` (24 bits) is written to QSC_QPN first
        when given (the QSC's QPN for this PPU, e.g. 0x2, CUDA-Q's GPU bridge's default remote
        QP; else the QSC keeps its own, ``qpn_base + ppu`` from reset), and ``response_bytes``
        (24..8191) to RESPONSE_BYTES: the largest SEND the QP takes into the response mailbox
        (64 from reset; CUDA-Q's GPU bridge SENDs 24 + its payload size bytes).

        ``call_transport`` (default: the QSC's :attr:`call_transport`) chooses how the PPU's
        CALLs travel, written to the QP's TRANSPORT register before RX_ENABLE: ``"roce"`` as
        above; ``"udp"``: requests come as UDP datagrams from the QP's port
        (``UDP_CALL_PORT_BASE + ppu``) to this host's ``host_call_port`` (PEER_UDP_PORT;
        default ``DEFAULT_HOST_CALL_PORT + ppu``), where a :class:`~openqlink.udpcall.
        UDPCallPort` puts them into ``ring`` in arrival order, and :meth:`send_response`
        answers with one datagram (``ring`` is then required); uploads and the trigger stay
        RDMA WRITEs on the QP. With the ``verbs`` bridge the NIC's UC QP
        (:class:`~openqlink.bridges.verbs.VerbsQueuePair`) takes the requests into ``ring``
        (its QPN is the HOST_QPN, its memory region's address and key RING_VA and HOST_RKEY)
        and sends the uploads, the trigger and the responses.

        Raises :class:`~openqlink.errors.FieldRangeError` (bad PPU, key, QPN or ring geometry:
        1..4096 slots of at most 65535 bytes), :class:`~openqlink.errors.ClaimedError` (another
        host claimed the QSC) and :class:`~openqlink.errors.ControlPlaneError`.
        """
        self._check_ppu(ppu)
        d = RKeys.random()
        keys = RKeys(ring=d.ring if ring_rkey is None else ring_rkey,
                     imem=d.imem if imem_rkey is None else imem_rkey,
                     env=d.env if env_rkey is None else env_rkey,
                     regs=d.regs if regs_rkey is None else regs_rkey)
        for name in ("ring", "imem", "env", "regs"):
            v = getattr(keys, name)
            if not 0 <= v < 1 << 32:
                raise FieldRangeError("RETH", "r_key", v, f"{name} R_Key {v:#x} is not 32 bits")
        qpn = DEFAULT_HOST_QPN_BASE + ppu if host_qpn is None else host_qpn
        if not 0 <= qpn < 1 << 24:
            raise FieldRangeError("BTH", "dest_qp", qpn, f"host QPN {qpn:#x} is not 24 bits")
        if qsc_qpn is not None and not 0 <= qsc_qpn < 1 << 24:
            raise FieldRangeError("BTH", "dest_qp", qsc_qpn,
                                  f"QSC QPN {qsc_qpn:#x} is not 24 bits")
        if response_bytes is not None and not HEADER_BYTES <= response_bytes < 1 << 13:
            raise FieldRangeError("QPContext", "response_bytes", response_bytes,
                                  f"RESPONSE_BYTES {response_bytes} is not {HEADER_BYTES}..8191")
        if ring is not None and not (1 <= ring.num_slots <= 4096
                                     and 0 < ring.slot_size < 1 << 16):
            raise FieldRangeError("QPContext", "num_slots", (ring.num_slots, ring.slot_size),
                                  "the ring needs 1..4096 slots of 1..65535 bytes")
        calls = self.call_transport if call_transport is None else call_transport
        if calls not in CALL_TRANSPORTS and not (calls == "verbs" and self.bridge == "verbs"):
            raise FieldRangeError("QSC", "call_transport", calls,
                                  f"one of {', '.join(CALL_TRANSPORTS)}")
        if self.bridge == "udp" and calls != "udp":
            raise FieldRangeError("QSC", "call_transport", calls,
                                  "the udp bridge takes CALLs as UDP datagrams only")
        port = DEFAULT_HOST_CALL_PORT + ppu if host_call_port is None else host_call_port
        if calls == "udp":
            if ring is None:
                raise FieldRangeError("QSC", "ring", None, "CALLs over UDP need a ring")
            if not 1 <= port <= 0xFFFF:
                raise FieldRangeError("UDP", "host_call_port", port, "a UDP port is 1..65535")
            bind = getattr(self.transport, "bind_port", None)
            if bind is not None:
                bind(port)          # a port taken fails here, before any write
        verbs = None
        ring_va = 0
        if calls == "verbs":
            if ring is None:
                raise FieldRangeError("QSC", "ring", None, "the verbs bridge needs a ring")
            from .bridges.verbs import VerbsQueuePair
            verbs = VerbsQueuePair(ring, local_ip=int_to_ip(self.host_ip),
                                   remote_ip=int_to_ip(self.qsc_ip), device=self.device,
                                   pmtu_bytes=self.pmtu_bytes)
            qpn, ring_va = verbs.qpn, verbs.ring_va
            keys = RKeys(ring=verbs.ring_rkey, imem=keys.imem, env=keys.env, regs=keys.regs)
        writes = self._qp_writes(ppu, qpn, qsc_qpn, self.host_mac, self.host_ip)

        def w(addr: int, value: int) -> None:
            writes.append((addr, value))

        if response_bytes is not None:
            w(qp_reg(ppu, "RESPONSE_BYTES"), response_bytes)
        w(qp_reg(ppu, "TRANSPORT"), int(calls == "udp"))
        if calls == "udp":
            w(qp_reg(ppu, "PEER_UDP_PORT"), port)
        w(qp_reg(ppu, "HOST_RKEY"), keys.ring)
        w(qp_reg(ppu, "RING_VA_HI"), ring_va >> 32)
        w(qp_reg(ppu, "RING_VA_LO"), ring_va & 0xFFFF_FFFF)
        if ring is not None:
            w(qp_reg(ppu, "NUM_SLOTS"), ring.num_slots)
            w(qp_reg(ppu, "SLOT_SIZE"), ring.slot_size)
            w(ppu_reg(ppu, "CALL_SLOTS"), ring.num_slots)
        w(qp_reg(ppu, "IMEM_RKEY"), keys.imem)
        w(qp_reg(ppu, "ENV_RKEY"), keys.env)
        w(qp_reg(ppu, "REGS_RKEY"), keys.regs)
        try:
            qp, qsc_qpn = self._open_qp(ppu, writes, qpn, self.host_mac, self.host_ip)
            if verbs is not None:
                verbs.connect(qsc_qpn)
        except BaseException:
            if verbs is not None:
                verbs.close()
            raise
        call_port = None
        if calls == "udp":
            assert ring is not None
            call_port = UDPCallPort(self.host_mac, self.host_ip, port, self.qsc_mac,
                                    self.qsc_ip, UDP_CALL_PORT_BASE + ppu, ring)
        elif ring is not None and verbs is None:
            qp.register_ring(ring, keys.ring, va=0)
        old = self._ppus.get(ppu)
        if old is not None:
            self._by_qpn.pop(old.qp.qpn, None)
            if old.call_port is not None:
                self._by_call_port.pop(old.call_port.local_port, None)
            if old.verbs is not None:
                self._verbs.remove(old.verbs)
                old.verbs.close()
        self._ppus[ppu] = _PPUState(qp, qsc_qpn, keys, ring, call_port, verbs)
        if verbs is None:
            self._by_qpn[qpn] = qp
        else:
            self._verbs.append(verbs)
        if call_port is not None:
            self._by_call_port[port] = call_port
        return qp

    def _qp_writes(self, qp: int, host_qpn: int, qsc_qpn: int | None, peer_mac: int,
                   peer_ip: int) -> list[tuple[int, int]]:
        """The first writes of configuring QP ``qp``: QSC_QPN (when given), HOST_QPN (the
        restart), PMTU, the peer's addresses."""
        writes = [] if qsc_qpn is None else [(qp_reg(qp, "QSC_QPN"), qsc_qpn)]
        return writes + [
            (qp_reg(qp, "HOST_QPN"), host_qpn),
            (qp_reg(qp, "PMTU"), path_mtu_code(self.pmtu_bytes)),
            (qp_reg(qp, "PEER_MAC_HI"), peer_mac >> 32),
            (qp_reg(qp, "PEER_MAC_LO"), peer_mac & 0xFFFF_FFFF),
            (qp_reg(qp, "PEER_IP"), peer_ip),
        ]

    def _open_qp(self, qp: int, writes: list[tuple[int, int]], host_qpn: int, peer_mac: int,
                 peer_ip: int) -> tuple[UCQueuePair, int]:
        """Write ``writes`` and RX_ENABLE in one WR_BLOCK (in order: a failing write stops the
        rest, RX_ENABLE last), read QP ``qp``'s QSC_QPN; return the peer's UC QP and it."""
        self.control.write_block([*writes, (global_reg("RX_ENABLE"), 1)])
        qsc_qpn = self.control.read(qp_reg(qp, "QSC_QPN")) & 0xFF_FFFF
        return UCQueuePair(peer_mac, peer_ip, host_qpn, self.qsc_mac, self.qsc_ip, qsc_qpn,
                           udp_src_port=self.roce_src_port,
                           pmtu_bytes=self.pmtu_bytes), qsc_qpn

    def configure_qp(self, qp: int, ppu: int, *, host_qpn: int | None = None,
                     qsc_qpn: int | None = None, rkeys: dict[str, int] | None = None,
                     peer_mac: str | bytes | int | None = None,
                     peer_ip: str | int | None = None) -> UCQueuePair:
        """Set up QP ``qp``, one beyond the PPUs' own (``num_ppus <= qp < num_qps``), to reach
        PPU ``ppu``'s regions: e.g. a second connection that uploads programs while the PPU's
        own QP carries its CALLs, or a QP of another host.

        Writes the QP's context in one WR_BLOCK: QSC_QPN (when given), HOST_QPN (the restart:
        ePSN 0, no message open, every R_Key invalid), PMTU, PEER_MAC_HI/LO and PEER_IP (the
        peer: this host unless ``peer_mac``/``peer_ip`` name another), PPU, then the R_Key of
        each region named in ``rkeys`` (``{"IMEM": key, "ENV": key, "REGS": key}``, any
        subset: the QP's map; a region left out stays closed to it; ``None``: the three
        random keys, :meth:`RKeys.random`; :meth:`qp_rkeys` tells them), and sets RX_ENABLE.
        Returns the peer's UC QP (``host_qpn``, default ``DEFAULT_HOST_QPN_BASE + qp``, to
        the QSC_QPN read back); when the peer is this host, frames for it are routed to it, and
        :meth:`rdma_write` sends through it. The QP sends nothing: RPC responses it SENDs land
        in the PPU's mailbox like those of the PPU's own QP.

        Raises :class:`~openqlink.errors.FieldRangeError` (``qp`` not an extra QP of this QSC,
        ``ppu`` not a PPU, an unknown region or a key, QPN out of range),
        :class:`~openqlink.errors.ClaimedError` and
        :class:`~openqlink.errors.ControlPlaneError`.
        """
        if not self.num_ppus <= qp < self.num_qps:
            raise FieldRangeError("QSC", "qp", qp,
                                  f"QP {qp} is not one of this QSC's extra QPs "
                                  f"({self.num_ppus}..{self.num_qps - 1}); a PPU's own QP is "
                                  "set up by configure()")
        self._check_ppu(ppu)
        d = RKeys.random()
        keys = {"IMEM": d.imem, "ENV": d.env, "REGS": d.regs} if rkeys is None else dict(rkeys)
        for name, key in keys.items():
            if name not in ("IMEM", "ENV", "REGS"):
                raise FieldRangeError("QSC", "rkeys", name,
                                      f"{name!r} is not a region (IMEM, ENV, REGS)")
            if not 0 <= key < 1 << 32:
                raise FieldRangeError("RETH", "r_key", key, f"{name} R_Key {key:#x} is not "
                                      "32 bits")
        qpn = DEFAULT_HOST_QPN_BASE + qp if host_qpn is None else host_qpn
        for what, v in (("host", qpn), ("QSC", qsc_qpn)):
            if v is not None and not 0 <= v < 1 << 24:
                raise FieldRangeError("BTH", "dest_qp", v, f"{what} QPN {v:#x} is not 24 bits")
        mac = self.host_mac if peer_mac is None else mac_to_int(peer_mac)
        ip = self.host_ip if peer_ip is None else ip_to_int(peer_ip)
        writes = self._qp_writes(qp, qpn, qsc_qpn, mac, ip)
        writes.append((qp_reg(qp, "PPU"), ppu))
        writes += [(qp_reg(qp, f"{name}_RKEY"), key) for name, key in keys.items()]
        uc, _ = self._open_qp(qp, writes, qpn, mac, ip)
        old = self._extra_qps.pop(qp, None)
        if old is not None:
            self._by_qpn.pop(old.qpn, None)
        if (mac, ip) == (self.host_mac, self.host_ip):
            self._extra_qps[qp] = self._by_qpn[qpn] = uc
        self._qp_rkeys[qp] = keys
        return uc

    def qp_rkeys(self, qp: int) -> dict[str, int]:
        """The R_Keys :meth:`configure_qp` gave extra QP ``qp``: region name -> key. Raises
        :class:`~openqlink.errors.QlinkError` for a QP it has not configured."""
        try:
            return dict(self._qp_rkeys[qp])
        except KeyError:
            raise QlinkError(f"QP {qp} is not configured: call QSC.configure_qp({qp}, ...) "
                             "first") from None

    def rdma_write(self, qp: int, va: int, data: bytes, r_key: int,
                   imm: int | None = None) -> None:
        """Send ``data`` to ``va`` as one UC RDMA WRITE message (ONLY, or FIRST/MIDDLE.../LAST
        at the path MTU; ``imm``: WITH_IMMEDIATE) on QP ``qp``, a PPU's own QP or one that
        :meth:`configure_qp` set up with this host as its peer. The QSC checks ``r_key`` and
        the range; what it drops it counts (:meth:`read_qp_counters`): nothing comes back.

        Raises :class:`~openqlink.errors.QlinkError` for a QP not configured from this host.
        """
        if qp < self.num_ppus:
            st = self._state(qp)
            if st.verbs is not None:
                st.verbs.write(va, r_key, bytes(data), imm)
                return
            uc = st.qp
        elif qp in self._extra_qps:
            uc = self._extra_qps[qp]
        else:
            raise QlinkError(f"QP {qp} is not configured with this host as its peer: call "
                             f"QSC.configure_qp({qp}, ...) first")
        frames = uc.write_frames(va, r_key, bytes(data), imm)
        with self._tx_lock:
            self.transport.send_frames(frames)

    def claim_owner(self) -> str | None:
        """The IPv4 address of the host that claimed the QSC's control plane (the global CLAIM
        register), ``None`` while unclaimed. Raises
        :class:`~openqlink.errors.ControlPlaneError`."""
        owner = self.control.read(global_reg("CLAIM"))
        return None if owner == 0 else int_to_ip(owner)

    def release(self) -> None:
        """Give up this host's claim of the QSC's control plane (write 0 to CLAIM), so that
        another host may configure it. Raises :class:`~openqlink.errors.ClaimedError` when
        another host holds the claim, :class:`~openqlink.errors.ControlPlaneError` otherwise."""
        self.control.write(global_reg("CLAIM"), 0)

    def qp(self, ppu: int) -> UCQueuePair:
        """The host UC QP of a configured PPU."""
        return self._state(ppu).qp

    def rkeys(self, ppu: int) -> RKeys:
        """The R_Keys a configured PPU was given."""
        return self._state(ppu).rkeys

    # --- RDMA writes --------------------------------------------------------------------------

    def _send_write(self, st: _PPUState, va: int, r_key: int, data: bytes,
                    imm: int | None = None) -> None:
        if st.verbs is not None:
            st.verbs.write(va, r_key, data, imm)
            return
        with self._tx_lock:
            self.transport.send_frame(st.qp.write_frame(va, r_key, data, imm))

    def _chunk_bytes(self, unit: int) -> int:
        return self.pmtu_bytes // unit * unit

    def upload_program(self, ppu: int, words: bytes, *, start_index: int = 0,
                       commit_tail: bool = False, verify: bool = True,
                       retries: int = 2) -> int:
        """Write instructions into PPU ``ppu``'s instruction ring; return the packets sent.

        ``words`` is whole 16-byte instructions (as :class:`openqlink.isa.Instruction` packs
        them), written from instruction index ``start_index`` by RDMA_WRITE_ONLY packets of at
        most PMTU bytes to the IMEM region with the IMEM R_Key. Without ``commit_tail`` the
        program stays invisible until :meth:`trigger` (the fast modality); with it, the upload
        becomes the committed TAIL ``start_index + count`` (appending to a running program):
        by a TAIL write after the verified upload, or, without ``verify``, by the last packet
        as RDMA_WRITE_ONLY_WITH_IMMEDIATE whose ImmDt is the tail.

        With ``verify`` (two control-plane reads of UPLOAD_WORDS, before and after), an upload
        that did not land whole (UC does not retransmit a lost packet) is sent again, up to
        ``retries`` more times. :meth:`trigger` carries the count, so a program missing a
        packet never runs even without ``verify``.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``words`` (not whole
        instructions, empty, or past ``params.imem_depth``) or ``ppu``;
        :class:`~openqlink.errors.UploadError` when the last attempt did not land whole.
        """
        st = self._state(ppu)
        words = bytes(words)
        count, rem = divmod(len(words), INSTRUCTION_BYTES)
        if rem or not count:
            raise FieldRangeError("IMEM", "words", len(words),
                                  f"{len(words)} bytes are not whole {INSTRUCTION_BYTES}-byte "
                                  "instructions (or none)")
        if start_index < 0 or start_index + count > self.params.imem_depth:
            raise FieldRangeError("IMEM", "words", count,
                                  f"instructions {start_index}..{start_index + count - 1} leave "
                                  f"the {self.params.imem_depth}-instruction ring")
        base = ppu_base(ppu) + IMEM_OFFSET + start_index * INSTRUCTION_BYTES
        step = self._chunk_bytes(INSTRUCTION_BYTES)
        offsets = range(0, len(words), step)
        tail = (start_index + count) % self.params.imem_depth
        packets = [(base + off, st.rkeys.imem, words[off:off + step],
                    tail if commit_tail and not verify and i == len(offsets) - 1 else None)
                   for i, off in enumerate(offsets)]
        self._upload(ppu, "IMEM", packets, verify, retries)
        if commit_tail and verify:
            self._send_write(st, ppu_base(ppu) + REGS_OFFSET + _reg_offset("TAIL"),
                             st.rkeys.regs, struct.pack("<I", tail))
        return len(packets)

    def _upload(self, ppu: int, region: str, packets: list[tuple[int, int, bytes, int | None]],
                verify: bool, retries: int) -> None:
        """Send RDMA WRITEs ``(va, r_key, data, imm)`` of an upload; with ``verify``, check the
        PPU's UPLOAD_WORDS and send them all again while words are missing."""
        st = self._state(ppu)
        if retries < 0:
            raise FieldRangeError(region, "retries", retries, "must be 0 or more")
        words = sum(_words_touched(va, len(payload)) for va, _, payload, _ in packets)
        landed = attempts = 0
        while attempts <= retries:
            attempts += 1
            before = self.read_register(ppu, "UPLOAD_WORDS") if verify else 0
            if st.verbs is not None:
                for va, r_key, payload, imm in packets:
                    st.verbs.write(va, r_key, payload, imm)
            else:
                # one batch: the raw bridge hands it to the kernel in one system call
                with self._tx_lock:
                    self.transport.send_frames([st.qp.write_frame(va, r_key, payload, imm)
                                                for va, r_key, payload, imm in packets])
            if not verify:
                st.upload_words += words
                return
            after = self.read_register(ppu, "UPLOAD_WORDS")
            st.upload_words = after
            landed = (after - before) % (1 << 32)
            if landed == words:
                return
        raise UploadError(f"PPU {ppu} {region}: {landed} of {words} 64-bit words landed after "
                          f"{attempts} attempt(s) (packets lost)", ppu=ppu, region=region,
                          words_sent=words, words_landed=landed, attempts=attempts)

    def restart_upload_count(self, ppu: int) -> None:
        """Restart PPU ``ppu``'s UPLOAD_WORDS (a control-plane write of 0) and this host's
        count with it: the words uploaded from here on are those the next :meth:`trigger`
        vouches for."""
        st = self._state(ppu)
        self.control.write(ppu_reg(ppu, "UPLOAD_WORDS"), 0)
        st.upload_words = 0

    def write_envelope(self, ppu: int, addr: int, samples: Iterable[int], *,
                       verify: bool = True, retries: int = 2) -> int:
        """Write signed Q1.15 samples into PPU ``ppu``'s envelope memory; return packets sent.

        ``addr`` is the index of the first sample (even: RDMA VAs are 4-byte aligned); samples
        are 16-bit two's complement, little-endian in memory, sent in RDMA_WRITE_ONLY packets of
        at most PMTU bytes to the ENV region with the ENV R_Key.

        ``verify`` and ``retries`` as in :meth:`upload_program`.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``addr`` (odd, or the samples
        leave ``params.env_depth``) or ``samples`` (a value outside -32768..32767, or none);
        :class:`~openqlink.errors.UploadError` when the last attempt did not land whole.
        """
        st = self._state(ppu)
        try:
            arr = array.array("h", samples)
        except OverflowError as e:
            raise FieldRangeError("ENV", "samples", None,
                                  f"a sample does not fit signed 16 bits: {e}") from None
        if not arr:
            raise FieldRangeError("ENV", "samples", 0, "no samples")
        if addr < 0 or addr % 2:
            raise FieldRangeError("ENV", "addr", addr,
                                  "must be an even sample index (4-byte aligned VA)")
        if addr + len(arr) > self.params.env_depth:
            raise FieldRangeError("ENV", "addr", addr,
                                  f"samples {addr}..{addr + len(arr) - 1} leave the "
                                  f"{self.params.env_depth}-sample envelope memory")
        if sys.byteorder != "little":
            arr.byteswap()
        data = arr.tobytes()
        base = ppu_base(ppu) + ENV_OFFSET + 2 * addr
        step = self._chunk_bytes(4)
        packets = [(base + off, st.rkeys.env, data[off:off + step], None)
                   for off in range(0, len(data), step)]
        self._upload(ppu, "ENV", packets, verify, retries)
        return len(packets)

    def trigger(self, ppu: int, start_time_cycles: int, tail: int, *,
                check_upload: bool = True) -> None:
        """Atomically commit ``tail`` and start PPU ``ppu`` at DTD cycle ``start_time_cycles``.

        ONE RDMA_WRITE_ONLY to the REGS region covering START_TIME_LO, START_TIME_HI and TRIGGER
        (12 bytes, little-endian), so the start time and the trigger arrive in one packet that
        is committed whole or not at all. The QSC refuses a trigger while the PPU runs, or whose
        start time has passed, by setting ``trigger_busy``/``trigger_late`` in STATUS: read
        :meth:`status` to know. With ``check_upload`` the TRIGGER value carries the words
        uploaded since the last trigger (:data:`TRIGGER_UPLOAD_CHECK`, bits 30..16: this
        host's count mod 2**15), and the QSC refuses a trigger whose upload lost a packet with
        ``trigger_incomplete``. The count restarts at 0 here (an accepted trigger restarts the
        PPU's); after a refused trigger, upload again with ``verify`` (which adopts the PPU's
        count) before triggering again.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``start_time_cycles`` (not
        within the build's ``timeline_bits``-bit timeline) or ``tail`` (not a ring index
        0..imem_depth-1: a ring of N slots holds at most N-1 instructions, since a full ring
        would read as empty).
        """
        st = self._state(ppu)
        bits = self.params.timeline_bits
        if not 0 <= start_time_cycles < 1 << bits:
            raise FieldRangeError("REGS", "start_time_cycles", start_time_cycles,
                                  f"does not fit the build's {bits}-bit timeline")
        if not 0 <= tail < self.params.imem_depth:
            raise FieldRangeError("REGS", "tail", tail,
                                  f"not a ring index 0..{self.params.imem_depth - 1} (a full "
                                  "ring would read as empty)")
        lo = _reg_offset("START_TIME_LO")
        if (_reg_offset("START_TIME_HI") != lo + 4 or _reg_offset("TRIGGER") != lo + 8
                or lo + 12 > REGS_RDMA_BYTES):
            raise QlinkError("memory map: START_TIME_LO/HI and TRIGGER are not one RDMA span")
        value = tail
        if check_upload:
            value |= TRIGGER_UPLOAD_CHECK | (st.upload_words % (1 << 15)) << 16
        payload = struct.pack("<III", start_time_cycles & 0xFFFF_FFFF, start_time_cycles >> 32,
                              value)
        self._send_write(st, ppu_base(ppu) + REGS_OFFSET + lo, st.rkeys.regs, payload)
        st.upload_words = 0

    # --- control-plane reads ------------------------------------------------------------------

    def read_register(self, ppu: int, name: str) -> int:
        """One PPU register by name (:data:`openqlink.memory_map.PPU_REGISTERS`)."""
        self._check_ppu(ppu)
        return self.control.read(ppu_reg(ppu, name))

    def timeline(self, ppu: int = 0) -> int:
        """The timeline counter in DTD cycles (TIMELINE_LO, which latches HI, then HI):
        ``params.timeline_bits`` wide, wrapping at ``2**timeline_bits``."""
        lo = self.read_register(ppu, "TIMELINE_LO")
        hi = self.read_register(ppu, "TIMELINE_HI")
        return hi << 32 | lo

    def status(self, ppu: int) -> data.Const:
        """PPU STATUS decoded as an :class:`openqlink.isa.PPUStatus` constant view (fields
        ``state``, ``underflow``, ``late``, ``call_timeout``, ...)."""
        return PPUStatus.from_bits(self.read_register(ppu, "STATUS"))

    def counters(self) -> dict[str, int]:
        """Every QSC counter of :data:`openqlink.memory_map.COUNTERS`, by name (one RD_BLOCK)."""
        names = [name for name, _ in COUNTERS]
        return dict(zip(names, self.control.read_block([counter_addr(n) for n in names]),
                        strict=True))

    def read_registers(self, ppu: int) -> dict[str, int]:
        """Every readable PPU register (write-only TRIGGER left out), by name, in map order (one
        RD_BLOCK)."""
        self._check_ppu(ppu)
        names = [r.name for r in PPU_REGISTERS if r.access is not Access.WO]
        return dict(zip(names, self.control.read_block([ppu_reg(ppu, n) for n in names]),
                        strict=True))

    # --- readout calibration ------------------------------------------------------------------

    def _check_readout(self, channel: int) -> None:
        n = self.params.readouts_per_ppu
        if not 0 <= channel < n:
            raise FieldRangeError("READOUT", "channel", channel,
                                  f"readout channel {channel} is not in 0..{n - 1} "
                                  "(params.readouts_per_ppu)")

    def read_iq(self, ppu: int, channel: int = 0) -> tuple[int, int, int]:
        """The raw I and Q integrals of the last completed ACQUIRE window on readout channel
        ``channel`` of PPU ``ppu``, and that window's number: ``(i, q, count)``.

        ``i`` and ``q`` are 40-bit signed integers in ADC units: without NCOs the sum of the
        window's signed 16-bit samples (``q`` = 0), with NCOs the demodulated sums (docs/isa.md,
        ACQUIRE); the result bit of the window is ``i > threshold``. ``count`` is WINDOW_COUNT
        for that window: windows completed on the channel since reset (mod 2**32; 0, with
        ``i = q = 0``, before the first). Five control-plane reads: I_LO, which latches a
        snapshot of the same window, then I_HI, Q_LO, Q_HI and IQ_COUNT from it, so the three
        values belong together whatever windows complete meanwhile (another reader of the
        same channel's I_LO in between would move the snapshot).

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``ppu`` or ``channel`` (not a
        readout channel of ``params.readouts_per_ppu``), and
        :class:`~openqlink.errors.ControlPlaneError`.
        """
        self._check_ppu(ppu)
        self._check_readout(channel)
        lo, i_hi, q_lo, q_hi, count = (
            self.control.read(readout_reg(ppu, channel, name))
            for name in ("I_LO", "I_HI", "Q_LO", "Q_HI", "IQ_COUNT"))
        return _s40(lo, i_hi), _s40(q_lo, q_hi), count

    def window_count(self, ppu: int, channel: int = 0) -> int:
        """WINDOW_COUNT of readout channel ``channel``: ACQUIRE windows completed on it since
        reset (32 bits, wrapping), read live. Errors as :meth:`read_iq`."""
        self._check_ppu(ppu)
        self._check_readout(channel)
        return self.control.read(readout_reg(ppu, channel, "WINDOW_COUNT"))

    def capture_trace(self, ppu: int, channel: int = 0) -> None:
        """Arm PPU ``ppu``'s raw-trace capture for readout channel ``channel``.

        Writes TRACE_ARM: any capture stops, TRACE_COUNT restarts at 0, and the channel's next
        ACQUIRE window (one that opens at least two DTD cycles after the write lands) is
        recorded, every ADC sample (``samples_per_cycle`` per DTD cycle, in sample order) from
        its first until its last or until the trace memory is full; then reads TRACE_STATUS
        back to check the PPU took it. Poll :meth:`trace_status` for ``done``, then
        :meth:`read_trace`.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``ppu``, ``channel`` (not in
        ``params.readouts_per_ppu``, or refused by the QSC) or ``trace_depth`` (the build has
        no trace memory: TRACE_DEPTH reads 0), and :class:`~openqlink.errors.ControlPlaneError`.
        """
        self._check_ppu(ppu)
        self._check_readout(channel)
        self._trace_depth(ppu)
        self.control.write(ppu_reg(ppu, "TRACE_ARM"), channel)
        st = self.trace_status(ppu)
        if st.refused or not (st.armed or st.capturing or st.done) or st.channel != channel:
            raise FieldRangeError("TRACE", "channel", channel,
                                  f"PPU {ppu} refused to arm its trace for readout channel "
                                  f"{channel} ({st})")

    def _trace_depth(self, ppu: int) -> int:
        depth = self.read_register(ppu, "TRACE_DEPTH")
        if not depth:
            raise FieldRangeError("TRACE", "trace_depth", 0,
                                  f"PPU {ppu}'s build has no trace memory (trace_depth 0)")
        return depth

    def trace_status(self, ppu: int) -> TraceStatus:
        """PPU ``ppu``'s raw-trace capture: TRACE_STATUS and TRACE_COUNT (two reads)."""
        status = self.read_register(ppu, "TRACE_STATUS")
        return TraceStatus.from_registers(status, self.read_register(ppu, "TRACE_COUNT"))

    def read_trace(self, ppu: int, n_samples: int | None = None) -> np.ndarray:
        """The first ``n_samples`` samples of PPU ``ppu``'s raw trace (default: all that were
        captured, TRACE_COUNT).

        Returns a 1-D ``numpy.int16`` array of shape ``(n_samples,)``: ADC samples in their
        units (signed Q1.15 of full scale), element ``k`` the window's sample ``k`` (DTD cycle
        ``k // samples_per_cycle`` of the window, lane ``k % samples_per_cycle``). One
        control-plane read per two samples, from the trace memory at ``TRACE_OFFSET``; read
        after the capture is done (a word being written as it is read reads undefined).

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``ppu``, ``n_samples``
        (negative, or more than TRACE_COUNT samples captured) or ``trace_depth`` (no trace
        memory), and :class:`~openqlink.errors.ControlPlaneError`.
        """
        self._check_ppu(ppu)
        depth = self._trace_depth(ppu)
        count = self.read_register(ppu, "TRACE_COUNT")
        n = count if n_samples is None else n_samples
        if not 0 <= n <= count:
            raise FieldRangeError("TRACE", "n_samples", n_samples,
                                  f"PPU {ppu} captured {count} of {depth} samples; cannot "
                                  f"read {n_samples}")
        words = self.control.read_block([trace_addr(ppu, k) for k in range(0, n, 2)])
        out = np.array(words, dtype="<u4").view("<i2")[:n]
        return out.astype(np.int16)

    def _check_qp(self, qp: int) -> None:
        if not 0 <= qp < self.num_qps:
            raise FieldRangeError("QSC", "qp", qp, f"QP {qp} is not in 0..{self.num_qps - 1}")

    def read_qp_context(self, qp: int) -> dict[str, int]:
        """Every register of QP ``qp``'s context, by name (one RD_BLOCK; PPU ``n``'s own QP is
        QP ``n``). Raises :class:`~openqlink.errors.FieldRangeError` for a QP the QSC lacks."""
        self._check_qp(qp)
        names = [r.name for r in QP_REGISTERS]
        return dict(zip(names, self.control.read_block([qp_reg(qp, n) for n in names]),
                        strict=True))

    def read_qp_counters(self, qp: int) -> dict[str, int]:
        """QP ``qp``'s counters (:data:`~openqlink.memory_map.QP_COUNTERS`), by name, in one
        RD_BLOCK. Raises :class:`~openqlink.errors.FieldRangeError` for a QP the QSC lacks."""
        self._check_qp(qp)
        names = [name for name, _ in QP_COUNTERS]
        return dict(zip(names, self.control.read_block([qp_reg(qp, n) for n in names]),
                        strict=True))

    # --- receive path and RPC responses -------------------------------------------------------

    def handle_frame(self, frame: bytes) -> None:
        """Route one received frame: RoCEv2 to the host QP it addresses (which writes RPC
        requests into the ring and publishes their slots), anything else counted in
        ``rx_counts``. Never raises for bad input. For a transport that steers RoCE traffic
        itself, as a RoCE NIC does (and the simulation bench), instead of :meth:`poll_rx`.
        """
        if (len(frame) >= ROCE_HEADERS_BYTES and frame[12:14] == b"\x08\x00"
                and frame[14] == 0x45 and frame[23] == IpProtocol.UDP
                and frame[36:38] == _ROCEV2_PORT_BYTES):
            # RoCEv2 (IPv4 without options, UDP port 4791): to the QP its DestQP names, which
            # checks everything else. Read at fixed offsets: no parse per request.
            qp = self._by_qpn.get(int.from_bytes(frame[47:50], "big"))
            if qp is None:
                self.rx_counts["roce_unknown_qpn"] += 1
                return
            self.rx_counts["roce"] += 1
            qp.handle_frame(frame)
            return
        if (self._by_call_port and len(frame) >= 42 and frame[12:14] == b"\x08\x00"
                and frame[23] == IpProtocol.UDP):
            port = self._by_call_port.get(int.from_bytes(frame[36:38], "big"))
            if port is not None:
                # A CALL over UDP: the PPU's call port checks everything else.
                self.rx_counts["udp_call"] += 1
                port.handle_frame(frame)
                return
        try:
            f = parse_frame(frame)
        except WireFormatError:
            self.rx_counts["malformed"] += 1
            return
        if f.is_roce:
            self.rx_counts["malformed"] += 1   # RoCEv2 in a form no QP takes (IPv4 options)
        elif f.is_control_response:
            self.rx_counts["control_unexpected"] += 1
        else:
            self.rx_counts["other"] += 1

    def poll_rx(self, max_frames: int | None = None) -> int:
        """Route the frames already received, without waiting; return how many.

        The dispatcher's loop calls this. With the verbs bridge it first publishes the requests
        the NIC completed (counted too). It reads no frame while a control transaction (in
        another thread) owns the receive side; that transaction routes what it reads.
        ``max_frames`` bounds the work of one call (``None``: until the transport is empty).
        """
        n = 0
        for verbs in self._verbs:
            n += verbs.poll()             # requests the NIC completed into the ring
        lock = self.control.lock
        if not lock.acquire(blocking=False):
            return n
        try:
            while max_frames is None or n < max_frames:
                frame = self.transport.recv_frame(0)
                if frame is None:
                    break
                n += 1
                self.handle_frame(frame)
            return n
        finally:
            lock.release()

    def send_response(self, ppu: int, slot: int, response_bytes: bytes) -> None:
        """Send an RPC response (header and result, :class:`openqlink.wire.rpc.Response`) for the
        request in ``slot`` to PPU ``ppu``'s mailbox: one UC SEND_ONLY to the PPU's QSC QPN.

        Raises :class:`~openqlink.errors.FieldRangeError` naming ``slot`` (not a slot of the
        PPU's ring) or ``response_bytes`` (longer than the 64-byte mailbox).
        """
        st = self._state(ppu)
        if st.ring is not None and not 0 <= slot < st.ring.num_slots:
            raise FieldRangeError("QSC", "slot", slot,
                                  f"not a slot of PPU {ppu}'s {st.ring.num_slots}-slot ring")
        response_bytes = bytes(response_bytes)
        if len(response_bytes) > MAILBOX_BYTES:
            raise FieldRangeError("RPCResponse", "response_bytes", len(response_bytes),
                                  f"{len(response_bytes)} bytes do not fit the {MAILBOX_BYTES}-"
                                  "byte mailbox")
        if st.verbs is not None:
            st.verbs.send(response_bytes)
            return
        if st.call_port is not None:
            frame = st.call_port.response_frame(response_bytes)
        else:
            frame = st.qp.send_frame(response_bytes)
        with self._tx_lock:
            self.transport.send_frame(frame)

    def close(self) -> None:
        """Close the transport (and the verbs bridge's QPs)."""
        for st in self._ppus.values():
            if st.verbs is not None:
                st.verbs.close()
        self.transport.close()

    def __enter__(self) -> QSC:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
