"""Fixtures of the host tests: a software QSC (control-plane register file, RDMA recorder).

The peer lives in this conftest and is handed out by fixtures (``virtual_qsc``,
``threaded_qsc``), so the tests need no import path to it whatever pytest's import mode.

It answers control requests as the QSC's control plane does (Holoscan Sensor Bridge's sequence
check against the latched sequence number, with the QSC's answer to a retransmission: the latched
number again runs no write twice; ACK_REQUEST, BAD_ADDRESS for unmapped addresses), keeps a
sparse byte memory of the PPU windows written by RDMA, records every RoCE packet it accepts, and
can send RPC requests to the host as the gateware would (UC RDMA_WRITE_ONLY_WITH_IMMEDIATE into a
ring slot, or, for a QP in UDP mode, one UDP datagram), taking the responses into a mailbox.
Faults can be injected: dropped responses, stale responses and unrelated frames before a response.
"""

from __future__ import annotations

import collections
import struct
import threading
from dataclasses import dataclass

import pytest

from openqlink.bridges.base import FrameTransport, transport_pair
from openqlink.isa.layout import ISA_VERSION, PPUStatus
from openqlink.memory_map import (
    COUNTERS,
    GLOBAL_REGISTERS,
    MAILBOX_OFFSET,
    PPU_BASE,
    PPU_REGISTERS,
    QP_COUNTERS,
    QP_REGISTERS,
    READOUT_REGISTERS,
    REGS_OFFSET,
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
from openqlink.wire.control import RESPONSE_BIT, Command, Flags, Status, pack_response
from openqlink.wire.ethernet import mac_to_int
from openqlink.wire.ipv4 import ip_to_int
from openqlink.wire.packet import build_roce_frame, build_udp_frame, parse_frame
from openqlink.wire.roce import Opcode, slot_immediate
from openqlink.wire.udp import UDP_CALL_PORT_BASE, udp_checksum_ok


@dataclass
class RoceRecord:
    opcode: int
    dest_qp: int
    psn: int
    va: int | None
    r_key: int | None
    imm: int | None
    payload: bytes


class QSCPeer:
    """Serves one end of a transport pair in a thread (``start``/``stop``) or by ``step()``."""

    def __init__(self, transport: FrameTransport, params: QSCParams | None = None):
        self.t = transport
        self.params = params or QSCParams()
        self.mac = mac_to_int(self.params.mac)
        self.ip = ip_to_int(self.params.ip)
        self.regs: dict[int, int] = {}
        #: Every register write taken, (address, value), in order.
        self.reg_writes: list[tuple[int, int]] = []
        self.read_only: set[int] = set()
        for r in GLOBAL_REGISTERS:
            self.regs[global_reg(r.name)] = r.reset
        self.regs[global_reg("VERSION")] = version_word(ISA_VERSION)
        self.regs[global_reg("NUM_PPUS")] = self.params.num_ppus
        self.regs[global_reg("NUM_QPS")] = self.params.num_qps
        self.read_only |= {global_reg("VERSION"), global_reg("NUM_PPUS"), global_reg("NUM_QPS")}
        for i, (name, _) in enumerate(COUNTERS):
            self.regs[counter_addr(name)] = 1000 + i
            self.read_only.add(counter_addr(name))
        for n in range(self.params.num_qps):
            for r in QP_REGISTERS:
                self.regs[qp_reg(n, r.name)] = r.reset
            self.regs[qp_reg(n, "QSC_QPN")] = self.params.qpn_base + n
            self.regs[qp_reg(n, "PPU")] = n if n < self.params.num_ppus else 0
            for name, _ in QP_COUNTERS:
                self.regs[qp_reg(n, name)] = 0
                self.read_only.add(qp_reg(n, name))
        for n in range(self.params.num_ppus):
            self.read_only.add(qp_reg(n, "PPU"))
            for r in PPU_REGISTERS:
                self.regs[ppu_reg(n, r.name)] = r.reset
            # Readout calibration: the registers read back what a test puts there (the trace
            # memory's words too); TRACE_ARM arms as the gateware does (see _arm_trace).
            self.regs[ppu_reg(n, "TRACE_DEPTH")] = self.params.trace_depth
            self.read_only.add(ppu_reg(n, "TRACE_DEPTH"))
            for c in range(self.params.readouts_per_ppu):
                for r in READOUT_REGISTERS:
                    self.regs[readout_reg(n, c, r.name)] = r.reset
            for k in range(0, self.params.trace_depth, 2):
                self.regs[trace_addr(n, k)] = 0
        self.latched_seq = 0
        self.have_seq = False                   # no request latched since reset
        self.memory: dict[int, int] = {}        # byte address -> byte (PPU windows)
        self.rdma: list[RoceRecord] = []
        self.mailbox: list[tuple[int, bytes]] = []   # (ppu, SEND payload)
        self.udp_drops: list[tuple[int, bytes]] = []  # (QP, frame) of UDP responses dropped
        self.control_log: list[dict[str, int]] = []
        self.drop_responses = 0                 # responses to swallow (requests still executed)
        self.ignore_requests = 0                # requests to swallow without executing
        self.stale_before_response = False      # send a response with an old seq first
        self.noise_before_response: list[bytes] = []  # frames to send before the next response
        self.ppu_stopped = False                # PPU windows answer PPU_TIMEOUT (dtd stopped)
        self.lose_rdma = 0                      # RDMA WRITEs to lose (UC: no retransmission)
        self.tx_psn = [0] * self.params.num_ppus
        self.next_slot = [0] * self.params.num_ppus
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- running ------------------------------------------------------------------------------

    def start(self) -> QSCPeer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _serve(self) -> None:
        while not self._stop.is_set():
            frame = self.t.recv_frame(0.01)
            if frame is not None:
                self.handle(frame)

    def step(self) -> int:
        n = 0
        while (frame := self.t.recv_frame(0)) is not None:
            self.handle(frame)
            n += 1
        return n

    # --- receive ------------------------------------------------------------------------------

    def handle(self, frame: bytes) -> None:
        f = parse_frame(frame)
        if f.ip is None or f.udp is None or f.ip["dst"] != self.ip:
            return
        if f.udp["dst_port"] == 8192 and f.control is not None:
            self._control(f)
        elif f.is_roce and f.icrc_ok:
            self._roce(f)
        else:
            self._udp_response(frame, f)

    def _udp_response(self, frame: bytes, f) -> None:
        """A response datagram to a UDP-mode QP's port, taken into its PPU's mailbox as the
        gateware takes it: from the peer's MAC, IP and PEER_UDP_PORT, 24..RESPONSE_BYTES
        bytes, a UDP checksum that is 0 or right."""
        q = f.udp["dst_port"] - UDP_CALL_PORT_BASE
        if not 0 <= q < self.params.num_ppus or not self.regs[qp_reg(q, "TRANSPORT")]:
            return
        peer_mac = (self.regs[qp_reg(q, "PEER_MAC_HI")] << 32
                    | self.regs[qp_reg(q, "PEER_MAC_LO")])
        n = f.udp["length"] - 8
        udp = frame[34:34 + f.udp["length"]]
        if (f.eth["src"] != peer_mac or f.ip["src"] != self.regs[qp_reg(q, "PEER_IP")]
                or f.udp["src_port"] != self.regs[qp_reg(q, "PEER_UDP_PORT")]
                or not 24 <= n <= self.regs[qp_reg(q, "RESPONSE_BYTES")]
                or (f.udp["checksum"] and not udp_checksum_ok(f.ip["src"], f.ip["dst"], udp))):
            self.udp_drops.append((q, frame))
            return
        self.mailbox.append((q, bytes(udp[8:8 + min(n, 64)])))

    def _ppu_of_qpn(self, qpn: int) -> int | None:
        """The PPU of the lowest QP whose QSC_QPN is ``qpn``, as the gateware chooses."""
        return next((self.regs[qp_reg(n, "PPU")] for n in range(self.params.num_qps)
                     if self.regs[qp_reg(n, "QSC_QPN")] == qpn), None)

    def _roce(self, f) -> None:
        bth = f.bth
        ppu = self._ppu_of_qpn(bth["dest_qp"])
        if ppu is None:
            return
        rec = RoceRecord(bth["opcode"], bth["dest_qp"], bth["psn"],
                         f.reth["va"] if f.reth else None, f.reth["r_key"] if f.reth else None,
                         f.immdt["imm"] if f.immdt else None, f.payload)
        self.rdma.append(rec)
        if bth["opcode"] == Opcode.SEND_ONLY:
            self.mailbox.append((ppu, f.payload))
            return
        if rec.va is None:
            return
        if self.lose_rdma:
            self.lose_rdma -= 1
            self.rdma.pop()
            return
        for i, b in enumerate(f.payload):
            self.memory[rec.va + i] = b
        if f.payload and rec.va - ppu_base(ppu) < MAILBOX_OFFSET:      # IMEM and ENV
            words = (rec.va % 8 + len(f.payload) + 7) // 8
            self.regs[ppu_reg(ppu, "UPLOAD_WORDS")] += words
        regs = ppu_base(ppu) + REGS_OFFSET
        for off in range(0, len(f.payload) - 3, 4):
            addr = rec.va + off
            if regs <= addr < regs + 0x18:
                value = struct.unpack_from("<I", f.payload, off)[0]
                self.regs[addr] = value
                if addr == ppu_reg(ppu, "TRIGGER"):
                    self._trigger(ppu, value)

    def _trigger(self, ppu: int, value: int) -> None:
        """The upload check of an accepted trigger (the run itself is not modelled)."""
        count = ppu_reg(ppu, "UPLOAD_WORDS")
        if value >> 31 and (value >> 16) & 0x7FFF != self.regs[count] % (1 << 15):
            self.regs[ppu_reg(ppu, "STATUS")] |= PPUStatus.const(
                {"trigger_incomplete": 1}).as_bits()
        else:
            self.regs[count] = 0

    def _arm_trace(self, ppu: int, value: int) -> None:
        """TRACE_ARM: armed for channel ``value`` (count 0), or refused."""
        status = ppu_reg(ppu, "TRACE_STATUS")
        if value < self.params.readouts_per_ppu:
            self.regs[status] = 1 | value << 8
            self.regs[ppu_reg(ppu, "TRACE_COUNT")] = 0
        else:
            self.regs[status] |= 1 << 4

    def _control(self, f) -> None:
        req = f.control
        self.control_log.append(req)
        if self.ignore_requests:
            self.ignore_requests -= 1
            return
        cmd, seq = req["cmd"], req["seq"]
        block = cmd in (Command.WR_BLOCK, Command.RD_BLOCK)
        pairs = req["pairs"] if block else [(req["addr"], req["data"])]
        done: list[tuple[int, int]] = []
        checked = bool(req["flags"] & Flags.SEQUENCE_CHECK) and self.have_seq
        # the latched seq again: a retransmission, answered without running its writes again
        retransmit = checked and seq == self.latched_seq
        if checked and not retransmit and seq != (self.latched_seq + 1) & 0xFFFF:
            status = Status.SEQUENCE_ERROR
            done = [(pairs[0][0], 0)]
        elif cmd not in tuple(Command):
            status = Status.BAD_COMMAND
            done = [(pairs[0][0], 0)]
        else:
            self.latched_seq, self.have_seq = seq, True
            write = cmd in (Command.WR_DWORD, Command.WR_BLOCK)
            status = Status.OK
            for addr, data in pairs:            # in order, up to the first error
                value = 0
                if self.ppu_stopped and addr >= PPU_BASE:
                    status = Status.PPU_TIMEOUT
                elif addr not in self.regs:
                    status = Status.BAD_ADDRESS
                elif write and retransmit:
                    pass
                elif write:
                    self.reg_writes.append((addr, data))
                    if addr not in self.read_only:
                        self.regs[addr] = data
                    for n in range(self.params.num_ppus):
                        if addr == ppu_reg(n, "TRACE_ARM") and self.params.trace_depth:
                            self._arm_trace(n, data)
                else:
                    value = self.regs[addr]
                done.append((addr, value))
                if status != Status.OK:
                    break
            if write and not req["flags"] & Flags.ACK_REQUEST:
                return
        if self.drop_responses:
            self.drop_responses -= 1
            return
        for noise in self.noise_before_response:
            self.t.send_frame(noise)
        self.noise_before_response = []
        if self.stale_before_response:
            self.stale_before_response = False
            self._reply(f, cmd, (seq - 5) & 0xFFFF, Status.OK, [(done[0][0], 0xBAD)])
        self._reply(f, cmd, seq, status, done)

    def _reply(self, f, cmd: int, seq: int, status: int, pairs: list[tuple[int, int]]) -> None:
        payload = pack_response(cmd=cmd | RESPONSE_BIT, flags=f.control["flags"], seq=seq,
                                status=status, pairs=pairs, latched_seq=self.latched_seq)
        self.t.send_frame(build_udp_frame(
            dst_mac=f.eth["src"], src_mac=self.mac, src_ip=self.ip, dst_ip=f.ip["src"],
            src_port=8192, dst_port=f.udp["src_port"], payload=payload))

    # --- transmit: RPC requests to the host ---------------------------------------------------

    def rpc_request_frame(self, ppu: int, request: bytes, *, slot: int | None = None,
                          dest_qp: int | None = None) -> bytes:
        """A request as the gateware sends it, from the QP context the host configured."""
        host_mac = (self.regs[qp_reg(ppu, "PEER_MAC_HI")] << 32 |
                    self.regs[qp_reg(ppu, "PEER_MAC_LO")])
        slot_size = self.regs[qp_reg(ppu, "SLOT_SIZE")]
        num_slots = self.regs[qp_reg(ppu, "NUM_SLOTS")]
        if slot is None:
            slot = self.next_slot[ppu]
            self.next_slot[ppu] = (slot + 1) % num_slots
        psn = self.tx_psn[ppu]
        self.tx_psn[ppu] = (psn + 1) % (1 << 24)
        ring_va = self.regs[qp_reg(ppu, "RING_VA_HI")] << 32 | self.regs[qp_reg(ppu, "RING_VA_LO")]
        return build_roce_frame(
            dst_mac=host_mac, src_mac=self.mac, src_ip=self.ip,
            dst_ip=self.regs[qp_reg(ppu, "PEER_IP")],
            src_port=self.regs[global_reg("UDP_SRC_PORT")],
            opcode=Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            dest_qp=self.regs[qp_reg(ppu, "HOST_QPN")] if dest_qp is None else dest_qp,
            psn=psn, va=ring_va + slot * slot_size, r_key=self.regs[qp_reg(ppu, "HOST_RKEY")],
            imm=slot_immediate(psn, slot), payload=request)

    def send_rpc_request(self, ppu: int, request: bytes, **kw) -> None:
        self.t.send_frame(self.rpc_request_frame(ppu, request, **kw))

    def udp_request_frame(self, ppu: int, request: bytes) -> bytes:
        """A request as the gateware sends it from a UDP-mode QP: one datagram from
        UDP_CALL_PORT_BASE + ppu to the QP's PEER_UDP_PORT, checksum 0."""
        return build_udp_frame(
            dst_mac=(self.regs[qp_reg(ppu, "PEER_MAC_HI")] << 32
                     | self.regs[qp_reg(ppu, "PEER_MAC_LO")]),
            src_mac=self.mac, src_ip=self.ip, dst_ip=self.regs[qp_reg(ppu, "PEER_IP")],
            src_port=UDP_CALL_PORT_BASE + ppu,
            dst_port=self.regs[qp_reg(ppu, "PEER_UDP_PORT")], payload=request)

    def read_memory(self, addr: int, n: int) -> bytes:
        return bytes(self.memory.get(addr + i, 0) for i in range(n))


class VirtualLink(FrameTransport):
    """Host end of a single-threaded link to a :class:`QSCPeer` with virtual time.

    ``send_frame`` runs the peer at once; its answers queue here. ``recv_frame`` on an empty queue
    cannot ever get a frame (nothing else runs), so it advances the virtual clock by the time-out
    and returns ``None``: time-outs cost no wall time and every run is the same.
    """

    def __init__(self) -> None:
        self.inbox: collections.deque[bytes] = collections.deque()
        self.peer: QSCPeer | None = None
        self.time_s = 0.0
        self.sent: list[bytes] = []
        self.closed = False

    def send_frame(self, frame: bytes) -> None:
        self.sent.append(frame)
        assert self.peer is not None
        self.peer.handle(frame)

    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        if self.inbox:
            return self.inbox.popleft()
        self.time_s += 1.0 if timeout_s is None else max(0.0, timeout_s)
        return None

    def now_s(self) -> float:
        return self.time_s

    def close(self) -> None:
        self.closed = True


class _PeerEnd(FrameTransport):
    def __init__(self, link: VirtualLink):
        self.link = link

    def send_frame(self, frame: bytes) -> None:
        self.link.inbox.append(frame)

    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        return None

    def close(self) -> None:
        pass


def virtual_peer(params: QSCParams | None = None) -> tuple[VirtualLink, QSCPeer]:
    """A :class:`VirtualLink` and the :class:`QSCPeer` it drives."""
    link = VirtualLink()
    peer = QSCPeer(_PeerEnd(link), params)
    link.peer = peer
    return link, peer


@pytest.fixture
def virtual_qsc():
    """Factory: ``virtual_qsc(params=None) -> (VirtualLink, QSCPeer)``."""
    return virtual_peer


@pytest.fixture
def threaded_qsc():
    """Factory: ``threaded_qsc(params=None) -> (QueueTransport, QSCPeer)``, the peer serving the
    other end of the pair in a thread until the test ends."""
    peers: list[QSCPeer] = []

    def make(params: QSCParams | None = None):
        host_end, peer_end = transport_pair()
        peer = QSCPeer(peer_end, params).start()
        peers.append(peer)
        return host_end, peer

    yield make
    for p in peers:
        p.stop()


@pytest.fixture
def qsc_peer():
    """Factory: ``qsc_peer(transport, params=None) -> QSCPeer`` serving ``transport`` in a
    thread until the test ends (e.g. a raw socket on a veth end)."""
    peers: list[QSCPeer] = []

    def make(transport: FrameTransport, params: QSCParams | None = None) -> QSCPeer:
        peer = QSCPeer(transport, params).start()
        peers.append(peer)
        return peer

    yield make
    for p in peers:
        p.stop()


@pytest.fixture
def fake_run_sim(monkeypatch):
    """Replace the simulator behind ``qlink sim``: record run_sim's arguments and return
    ``calls["results"]`` (without it, fail the test: the command must not have reached the
    simulation)."""
    import openqlink.sim.runner

    calls: dict = {}

    def run_sim(programs, **kwargs):
        if "results" not in calls:
            raise AssertionError("qlink sim went on to simulate")
        calls.update(programs=programs, **kwargs)
        return calls["results"]

    monkeypatch.setattr(openqlink.sim.runner, "run_sim", run_sim)
    return calls
