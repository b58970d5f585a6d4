"""Control plane: Holoscan Sensor Bridge compatible register access over UDP port 8192.

# Ref: Holoscan Sensor Bridge control bus (ECB) request/response (openqlink.wire.control;
# shared/reference/cudaq_realtime_hsb.md section 8); openqlink.memory_map (address space).

:class:`ControlPlane` takes the requests the receiver extracted (:class:`ControlRequest`), one at
a time and in order, and answers them with a :class:`~openqlink.gateware.net.common.ControlReply`
for the TX builder:

* flags other than ACK_REQUEST | SEQUENCE_CHECK: status BAD_FLAGS, nothing done;
* SEQUENCE_CHECK set and ``seq`` != last accepted ``seq`` + 1 (mod 2**16): SEQUENCE_ERROR, nothing
  done (the first request after reset is always accepted). Every other request is *accepted*: its
  ``seq`` becomes ``latched_seq``, even when it then fails with BAD_ADDRESS or BAD_COMMAND;
* WR_DWORD / RD_DWORD at a 4-byte aligned address of the rti register block
  (:class:`~openqlink.gateware.net.regs.NetRegisters`): done locally in one cycle;
* WR_DWORD / RD_DWORD inside PPU ``n``'s window (``n < num_ppus``): one ``BusCommand`` WRITE (the
  32-bit value in both halves of ``data``, byte enables 0x0F or 0xF0 by ``addr[2]``) or READ
  (``word_addr = addr >> 3``, the same byte enables naming the half wanted, ``data`` 0; the
  answer's half selected by ``addr[2]``; ``BusReadData.error`` gives BAD_ADDRESS);
* any other address (or an unaligned one): BAD_ADDRESS; any other command (WR_BLOCK, RD_BLOCK
  included): BAD_COMMAND.

A reply is sent when ``flags`` has ACK_REQUEST or the command is a read (RD_DWORD, RD_BLOCK). Its
``value`` is the register read, the written data for a write, 0 on error.
"""

# No ``from __future__ import annotations``: data.Struct reads its annotations as shapes.
from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ...memory_map import PPU_BASE, PPU_STRIDE, QSCParams
from ...wire.control import RESPONSE_BIT, Command, Flags, Status
from ..bus import BusCommand, BusOp, BusReadData
from .common import COUNTER_INDEX, ControlReply
from .regs import NUM_COUNTERS, RegisterPortSignature

__all__ = ["ControlRequest", "ControlPlane"]


class ControlRequest(data.Struct):
    """A control-plane request as the receiver extracted it, with where it came from."""

    src_mac: unsigned(48)
    src_ip: unsigned(32)
    src_port: unsigned(16)
    cmd: unsigned(8)
    flags: unsigned(8)
    seq: unsigned(16)
    addr: unsigned(32)
    data: unsigned(32)


_KNOWN_FLAGS = int(Flags.ACK_REQUEST | Flags.SEQUENCE_CHECK)


class ControlPlane(wiring.Component):
    """Executes control-plane requests in order, one at a time.

    Parameters
    ----------
    params : QSCParams
        ``num_ppus`` bounds the PPU windows reachable through the bus.

    Members
    -------
    req : In(stream.Signature(ControlRequest))
        Requests from the receiver; taken one at a time (``ready`` only while idle).
    reply : Out(stream.Signature(ControlReply))
        Replies for the TX builder; ``valid`` is a register and holds until ``ready``.
    bus_cmd : Out(stream.Signature(BusCommand))
        At most one READ or WRITE per request; ``valid`` is a register (stream rules hold).
    bus_rdata : In(stream.Signature(BusReadData))
        The answer to a READ; ``ready`` only while waiting for one.
    regs : Out(RegisterPortSignature())
        Access to the rti register block.
    count : Out(NUM_COUNTERS)
        Counter increment strobes: RX_CONTROL for every accepted request (flags and sequence
        checks passed).
    busy : Out(1)
        A bus command is pending (``bus_cmd.valid``), for the bus arbiter.

    Latency: a local register access replies 2 cycles after the request is taken; a PPU access
    waits for ``bus_cmd.ready`` and, for a READ, for ``bus_rdata``.
    """

    def __init__(self, params: QSCParams):
        self.params = params
        super().__init__({
            "req": In(stream.Signature(ControlRequest)),
            "reply": Out(stream.Signature(ControlReply)),
            "bus_cmd": Out(stream.Signature(BusCommand)),
            "bus_rdata": In(stream.Signature(BusReadData)),
            "regs": Out(RegisterPortSignature()),
            "count": Out(NUM_COUNTERS),
            "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        num_ppus = self.params.num_ppus

        req = Signal(ControlRequest)
        status = Signal(8)
        value = Signal(32)
        want_reply = Signal()
        have_seq = Signal()
        last_seq = Signal(16)

        is_read = Signal()
        m.d.comb += is_read.eq((req.cmd == Command.RD_DWORD) | (req.cmd == Command.RD_BLOCK))
        seq_bad = Signal()
        m.d.comb += seq_bad.eq((req.flags & Flags.SEQUENCE_CHECK).any() & have_seq &
                               (req.seq != (last_seq + 1)[:16]))
        ppu_offset = Signal(32)
        m.d.comb += ppu_offset.eq(req.addr - PPU_BASE)
        in_ppu = Signal()
        m.d.comb += in_ppu.eq((req.addr >= PPU_BASE) &
                              (ppu_offset < PPU_STRIDE * num_ppus))
        aligned = Signal()
        m.d.comb += aligned.eq(req.addr[:2] == 0)
        dword = Signal()
        m.d.comb += dword.eq((req.cmd == Command.WR_DWORD) | (req.cmd == Command.RD_DWORD))

        m.d.comb += [
            self.regs.addr.eq(req.addr),
            self.regs.w_data.eq(req.data),
            self.busy.eq(self.bus_cmd.valid),
        ]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.req.ready.eq(1)
                with m.If(self.req.valid):
                    m.d.sync += req.eq(self.req.payload)
                    m.next = "DECODE"

            with m.State("DECODE"):
                m.d.sync += [
                    want_reply.eq((req.flags & Flags.ACK_REQUEST).any() | is_read),
                    value.eq(0),
                ]
                with m.If((req.flags & ~Const(_KNOWN_FLAGS, 8)).any()):
                    m.d.sync += status.eq(Status.BAD_FLAGS)
                    m.next = "REPLY"
                with m.Elif(seq_bad):
                    m.d.sync += status.eq(Status.SEQUENCE_ERROR)
                    m.next = "REPLY"
                with m.Else():
                    m.d.sync += [last_seq.eq(req.seq), have_seq.eq(1)]
                    m.d.comb += self.count[COUNTER_INDEX["RX_CONTROL"]].eq(1)
                    m.next = "REPLY"
                    with m.If(~dword):
                        m.d.sync += status.eq(Status.BAD_COMMAND)
                    with m.Elif(~aligned):
                        m.d.sync += status.eq(Status.BAD_ADDRESS)
                    with m.Elif(self.regs.hit):
                        m.d.sync += status.eq(Status.OK)
                        with m.If(is_read):
                            m.d.sync += value.eq(self.regs.r_data)
                        with m.Else():
                            m.d.comb += self.regs.w_en.eq(1)
                            m.d.sync += value.eq(req.data)
                    with m.Elif(in_ppu):
                        m.d.sync += [
                            status.eq(Status.OK),
                            self.bus_cmd.valid.eq(1),
                            self.bus_cmd.payload.word_addr.eq(req.addr[3:]),
                            self.bus_cmd.payload.op.eq(Mux(is_read, BusOp.READ, BusOp.WRITE)),
                            self.bus_cmd.payload.be.eq(Mux(req.addr[2], 0xF0, 0x0F)),
                            self.bus_cmd.payload.data.eq(
                                Mux(is_read, 0, Cat(req.data, req.data))),
                        ]
                        with m.If(~is_read):
                            m.d.sync += value.eq(req.data)
                        m.next = "BUS"
                    with m.Else():
                        m.d.sync += status.eq(Status.BAD_ADDRESS)

            with m.State("BUS"):
                with m.If(self.bus_cmd.ready):
                    m.d.sync += self.bus_cmd.valid.eq(0)
                    with m.If(is_read):
                        m.next = "READ"
                    with m.Else():
                        m.next = "REPLY"

            with m.State("READ"):
                m.d.comb += self.bus_rdata.ready.eq(1)
                with m.If(self.bus_rdata.valid):
                    rdata = self.bus_rdata.payload
                    with m.If(rdata.error):
                        m.d.sync += status.eq(Status.BAD_ADDRESS)
                    with m.Else():
                        m.d.sync += value.eq(Mux(req.addr[2], rdata.data[32:], rdata.data[:32]))
                    m.next = "REPLY"

            with m.State("REPLY"):
                reply = self.reply.payload
                m.d.comb += [
                    reply.dst_mac.eq(req.src_mac),
                    reply.dst_ip.eq(req.src_ip),
                    reply.dst_port.eq(req.src_port),
                    reply.cmd.eq(req.cmd | RESPONSE_BIT),
                    reply.flags.eq(req.flags),
                    reply.seq.eq(req.seq),
                    reply.status.eq(status),
                    reply.addr.eq(req.addr),
                    reply.value.eq(Mux(status == Status.OK, value, 0)),
                    reply.latched_seq.eq(last_seq),
                    self.reply.valid.eq(want_reply),
                ]
                with m.If(~want_reply | self.reply.ready):
                    m.next = "IDLE"

        return m
