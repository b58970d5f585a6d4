"""NetworkCore: the QSC network side in one ``rti`` domain (receive, control, registers, transmit).

# Ref: docs/architecture.md (NetworkCore); IBTA Vol 1 9.8 / Annex A17 (RoCEv2 UC) through
# openqlink.gateware.net.rx and .tx; Holoscan Sensor Bridge control bus through .control.

Written in ``sync``; the top places it in ``rti`` with ``DomainRenamer``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...memory_map import QP_COUNTERS, QSCParams
from ..bus import BusCommand, BusReadData, CallRequest
from ..packet import packet_signature
from .announce import BootpAnnouncer
from .common import COUNTER_INDEX, QPContext
from .control import ControlPlane, ControlReplyBuilder
from .regs import NUM_COUNTERS, NUM_QP_COUNTERS, NetRegisters
from .responder import Responder
from .rx import RoCEReceiver
from .timebase import Timebase
from .tx import TxBuilder

__all__ = ["BusArbiter", "FrameArbiter", "NetworkCore"]


class BusArbiter(wiring.Component):
    """Merges the receive path's and the control plane's bus commands without interleaving.

    The grant moves only while its holder is not ``busy``, so the commands of one packet (the
    receive path holds ``rx_busy`` from its first command to its last) and the single command of
    a control request reach ``bus_cmd`` contiguously. When both wait, the grant alternates.

    Members
    -------
    rx_cmd, ctrl_cmd : In(stream.Signature(BusCommand))
        The two sources. A source's ``valid`` may only be high while its ``busy`` is high.
    rx_busy, ctrl_busy : In(1)
        The source is inside a packet or has a command pending.
    bus_cmd : Out(stream.Signature(BusCommand))
        The granted source, passed through combinationally (no latency, no buffering).
    """

    rx_cmd: In(stream.Signature(BusCommand))
    rx_busy: In(1)
    ctrl_cmd: In(stream.Signature(BusCommand))
    ctrl_busy: In(1)
    bus_cmd: Out(stream.Signature(BusCommand))

    def elaborate(self, platform) -> Module:
        m = Module()
        grant_ctrl = Signal()
        with m.If(grant_ctrl):
            wiring.connect(m, wiring.flipped(self.ctrl_cmd), wiring.flipped(self.bus_cmd))
            with m.If(~self.ctrl_busy & self.rx_busy):
                m.d.sync += grant_ctrl.eq(0)
        with m.Else():
            wiring.connect(m, wiring.flipped(self.rx_cmd), wiring.flipped(self.bus_cmd))
            with m.If(~self.rx_busy & self.ctrl_busy):
                m.d.sync += grant_ctrl.eq(1)
        return m


class FrameArbiter(wiring.Component):
    """Merges two frame streams into one, a whole frame at a time.

    The grant moves only between frames, to the other source when the granted one offers
    nothing and the other does. ``o`` is ``a`` or ``b`` passed through combinationally (no
    latency); the source not granted sees ``ready`` low.

    Members
    -------
    a, b : In(packet_signature())
        The sources (each keeps ``valid`` until its beat is taken).
    o : Out(packet_signature())
    """

    a: In(packet_signature())
    b: In(packet_signature())
    o: Out(packet_signature())

    def elaborate(self, platform) -> Module:
        m = Module()
        grant_b = Signal()
        in_frame = Signal()
        with m.If(grant_b):
            wiring.connect(m, wiring.flipped(self.b), wiring.flipped(self.o))
        with m.Else():
            wiring.connect(m, wiring.flipped(self.a), wiring.flipped(self.o))
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += in_frame.eq(~self.o.payload.last)
        with m.Elif(~in_frame & ~self.o.valid):
            m.d.sync += grant_b.eq(Mux(grant_b, ~self.a.valid, self.b.valid))
        return m


class NetworkCore(wiring.Component):
    """The network core: :class:`~openqlink.gateware.net.rx.RoCEReceiver`,
    :class:`~openqlink.gateware.net.control.ControlPlane` and its
    :class:`~openqlink.gateware.net.control.ControlReplyBuilder`,
    :class:`~openqlink.gateware.net.regs.NetRegisters`,
    :class:`~openqlink.gateware.net.timebase.Timebase` and
    :class:`~openqlink.gateware.net.tx.TxBuilder`, joined.

    Parameters
    ----------
    params : QSCParams
        Build parameters (PPU count, QPN base, reset MAC/IP, ``rti_clk_hz`` for the timebase).
    rx_buffer_bytes : int
        Receive buffer size (see :class:`~openqlink.gateware.net.rx.RoCEReceiver`).

    Members
    -------
    rx : In(packet_signature())
        Frames from the MAC, FCS stripped; ``ready`` is always 1 (full buffer: frames dropped
        and counted as DROP_OVERFLOW).
    tx : Out(packet_signature())
        Frames to the MAC (RPC requests; control responses,
        :class:`~.control.ControlReplyBuilder`; ARP and echo replies; BOOTP announcements,
        :class:`~.announce.BootpAnnouncer`; merged a whole frame at a time by
        :class:`FrameArbiter` s), no FCS, padded to 60 bytes.
    bus_cmd : Out(stream.Signature(BusCommand))
        Commands to the PPU cluster: a packet's commands and a control request's command are
        never interleaved (:class:`BusArbiter`); honours ``ready`` (the receive buffer absorbs
        the stall).
    bus_rdata : In(stream.Signature(BusReadData))
        Answers to the control plane's READs, in order.
    call_req : In(stream.Signature(CallRequest))
        CALLs of the PPUs, sent as RPC requests.
    bus_drop : In(1)
        The command offered on ``bus_cmd`` this cycle is taken but dropped, not delivered (the
        top's crossing guard): counted as DROP_BUS, and a control-plane access so dropped is
        answered PPU_TIMEOUT (:class:`~openqlink.gateware.net.control.ControlPlane`).
    """

    def __init__(self, params: QSCParams, *, rx_buffer_bytes: int = 16384):
        self.params = params
        self.rx_buffer_bytes = rx_buffer_bytes
        super().__init__({
            "rx": In(packet_signature(params.data_width_bits)),
            "tx": Out(packet_signature(params.data_width_bits)),
            "bus_cmd": Out(stream.Signature(BusCommand)),
            "bus_rdata": In(stream.Signature(BusReadData)),
            "call_req": In(stream.Signature(CallRequest)),
            "bus_drop": In(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        params = self.params

        m.submodules.rx = rx = RoCEReceiver(params, buffer_bytes=self.rx_buffer_bytes)
        m.submodules.control = ctrl = ControlPlane(params)
        m.submodules.control_tx = ctrl_tx = ControlReplyBuilder()
        m.submodules.regs = regs = NetRegisters(params, num_inc_sources=4)
        m.submodules.responder = responder = Responder()
        m.submodules.announcer = announcer = BootpAnnouncer(params.rti_clk_hz)
        m.submodules.reply_arbiter = reply_arbiter = FrameArbiter()
        m.submodules.local_arbiter = local_arbiter = FrameArbiter()
        m.submodules.tx_arbiter = tx_arbiter = FrameArbiter()
        m.submodules.timebase = timebase = Timebase(params.rti_clk_hz)
        m.submodules.tx = tx = TxBuilder(params.num_ppus, params)
        m.submodules.arbiter = arbiter = BusArbiter()

        wiring.connect(m, wiring.flipped(self.rx), rx.rx)
        # the responder listens to the same frames (both take every beat)
        m.d.comb += [responder.rx.valid.eq(self.rx.valid),
                     responder.rx.payload.eq(self.rx.payload)]
        wiring.connect(m, tx.tx, tx_arbiter.a)
        # ARP and echo replies and BOOTP announcements share the builder's path to the MAC
        wiring.connect(m, responder.tx, reply_arbiter.a)
        wiring.connect(m, announcer.tx, reply_arbiter.b)
        # ... and the control plane's responses
        wiring.connect(m, ctrl_tx.tx, local_arbiter.a)
        wiring.connect(m, reply_arbiter.o, local_arbiter.b)
        wiring.connect(m, local_arbiter.o, tx_arbiter.b)
        wiring.connect(m, tx_arbiter.o, wiring.flipped(self.tx))
        wiring.connect(m, wiring.flipped(self.call_req), tx.call_req)
        wiring.connect(m, wiring.flipped(self.bus_rdata), ctrl.bus_rdata)
        wiring.connect(m, rx.ctrl_req, ctrl.req)
        wiring.connect(m, ctrl.reply, ctrl_tx.reply)
        wiring.connect(m, rx.pairs, ctrl.pairs)
        wiring.connect(m, ctrl.regs, regs.port)
        wiring.connect(m, rx.bus_cmd, arbiter.rx_cmd)
        wiring.connect(m, ctrl.bus_cmd, arbiter.ctrl_cmd)
        wiring.connect(m, arbiter.bus_cmd, wiring.flipped(self.bus_cmd))

        tx_count = Signal(NUM_COUNTERS)
        # the QP counters: the receiver's, and TX_PACKETS of each PPU's own QP
        k_tx = [name for name, _ in QP_COUNTERS].index("TX_PACKETS")
        qp_count = Signal.like(regs.qp_inc)
        m.d.comb += qp_count.eq(rx.qp_count)
        for n in range(params.num_ppus):
            m.d.comb += qp_count[NUM_QP_COUNTERS * n + k_tx].eq(tx.sent_rpc & (tx.sent_ppu == n))
        own = params.num_ppus
        m.d.comb += [
            arbiter.rx_busy.eq(rx.busy),
            arbiter.ctrl_busy.eq(ctrl.busy),
            ctrl.bus_drop.eq(self.bus_drop),
            rx.config.eq(regs.config),
            rx.qp.eq(regs.qp),
            tx.config.eq(regs.config),
            ctrl_tx.config.eq(regs.config),
            tx.qp.eq(regs.qp.as_value()[:own * QPContext.as_shape().size]),
            timebase.format.eq(regs.config.timestamp_format),
            tx.timestamp.eq(timebase.timestamp),
            regs.rx_epsn.eq(rx.epsn),
            regs.tx_psn.eq(tx.tx_psn),
            rx.qp_reset.eq(regs.qp_reset),
            tx.qp_reset.eq(regs.qp_reset[:own]),
            regs.qp_inc.eq(qp_count),
            # one frame's last beat at most per cycle passes the arbiters
            tx_count[COUNTER_INDEX["TX_FRAMES"]].eq(tx.sent_frame | ctrl_tx.sent),
            tx_count[COUNTER_INDEX["TX_RPC_REQUESTS"]].eq(tx.sent_rpc),
            regs.inc[0].eq(rx.count),
            regs.inc[1].eq(ctrl.count),
            regs.inc[2].eq(tx_count),
            regs.inc[3].eq(responder.count),
            responder.reply.eq(rx.reply),
            responder.config.eq(regs.config),
            announcer.config.eq(regs.config),
        ]
        return m
