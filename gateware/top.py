"""The QSC top: the network core (``rti``) and the PPU cluster (``dtd``) joined by async FIFOs.

The top's network side is a MAC-side packet stream (see :mod:`openqlink.gateware.packet`); the
MAC and PHY are the board's (or the bench's) business. Its physical side is one PTD interface per
PPU (DAC samples, readout windows, ADC samples, markers).

The clock domains ``rti`` and ``dtd`` are used but not defined here, so the generated Verilog has
the ports ``rti_clk``, ``rti_rst``, ``dtd_clk``, ``dtd_rst`` (synchronous, active-high resets).
A board top defines them from its PLL.

Reset and clock robustness: a domain in reset or without a clock never wedges the other.

* The three crossings (:class:`~openqlink.gateware.cdc.CrossingFIFO`) are emptied by a reset of
  either domain and refuse transfers on both sides until both sides are out of reset
  (:class:`~openqlink.gateware.cdc.CrossingReset`); while ``dtd`` has no clock after a reset of
  either domain, the ``rti`` side stays refused.
* Commands to the PPUs (``rti`` -> ``dtd``) pass a guard: once the crossing has refused a command
  for :data:`BUS_DROP_CYCLES` consecutive ``rti`` cycles (``dtd`` stopped, in reset or stalled),
  every command offered is taken and dropped, one per cycle, and counted (DROP_BUS), until the
  crossing takes commands again. The receive path therefore never stalls for good; a PPU whose
  clock stopped without a reset may have missed part of a packet's writes (reset it).
* The control plane answers every request within
  ``PPU_TIMEOUT_CYCLES + 2`` ``rti`` cycles of taking it
  (:class:`~openqlink.gateware.net.control.ControlPlane`): status PPU_TIMEOUT when the PPU side
  did not take or answer its access; READs are tagged, so a late answer is discarded.

# Ref: docs/architecture.md; NVQLink QSC (arXiv 2510.25213).
"""

from __future__ import annotations

from amaranth.hdl import DomainRenamer, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..memory_map import QSCParams
from .bus import READ_TAG_BITS, BusCommand, BusReadData, call_request_layout
from .cdc import CrossingFIFO, CrossingReset
from .net.core import NetworkCore
from .packet import packet_signature
from .ppu.channels import PTDSignature
from .ppu.cluster import PPUCluster

__all__ = ["QSCTop", "BusGuard", "generate_verilog", "CDC_FIFO_DEPTH", "BUS_DROP_CYCLES"]

#: Depth of each clock-crossing FIFO (entries).
CDC_FIFO_DEPTH = 16

#: ``rti`` cycles the command crossing may refuse a command before the guard drops commands
#: (Holoscan Sensor Bridge gives up on its register bus after 256 clocks too). A power of two.
BUS_DROP_CYCLES = 256

# READ tags must not repeat among the READs in flight: at most one per entry of the command and
# answer crossings, plus the one the PPU cluster holds.
assert 2 * CDC_FIFO_DEPTH + 1 < 2 ** READ_TAG_BITS


class BusGuard(wiring.Component):
    """Passes bus commands to the crossing, and drops them while the crossing stays shut.

    Members
    -------
    i : In(stream.Signature(BusCommand))
        Commands from the network core.
    o : Out(stream.Signature(BusCommand))
        To the crossing; its ``ready`` must not depend on ``valid``. ``valid`` is withdrawn,
        untaken, when the guard starts dropping (the command is dropped instead).
    drop : Out(1)
        The command on ``i`` is taken and dropped this cycle.

    After :data:`BUS_DROP_CYCLES` consecutive cycles in which ``i`` offered a command and
    ``o.ready`` was low, the guard drops: ``i.ready`` is high and ``o.valid`` low, each command
    offered is dropped, until ``o.ready`` is seen high again (the next cycle passes commands).
    The drop state is the top bit of a counter (no compare on the ready path).
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(BusCommand)),
            "o": Out(stream.Signature(BusCommand)),
            "drop": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        refused = Signal(range(2 * BUS_DROP_CYCLES))
        dropping = refused[-1]
        m.d.comb += [
            self.o.payload.eq(self.i.payload),
            self.o.valid.eq(self.i.valid & ~dropping),
            self.i.ready.eq(self.o.ready | dropping),
            self.drop.eq(self.i.valid & dropping),
        ]
        with m.If(self.o.ready):
            m.d.sync += refused.eq(0)
        with m.Elif(self.i.valid & ~dropping):
            m.d.sync += refused.eq(refused + 1)
        return m


class QSCTop(wiring.Component):
    """The whole QSC gateware.

    Parameters
    ----------
    params : QSCParams
        Build parameters (number of PPUs, memory depths, clocks, reset MAC/IP, QPN base).

    Members
    -------
    rx : In(packet_signature(64))
        Frames from the MAC, ``rti`` domain, FCS stripped. ``ready`` stays high: a frame that
        does not fit the receive buffer is dropped and counted (DROP_OVERFLOW).
    tx : Out(packet_signature(64))
        Frames to the MAC, ``rti`` domain, no FCS, padded to 60 bytes. Honours ``ready``.
    ptd : Out(PTDSignature(drives_per_ppu, readouts_per_ppu, markers_per_ppu,
        samples_per_cycle)).array(num_ppus)
        Physical-side interface of each PPU, ``dtd`` domain.
    timeline : Out(64)
        The shared timeline counter (DTD cycles since ``dtd_rst``, ``timeline_bits`` wide and
        zero-extended), ``dtd`` domain: a PPU's event scheduled for time T appears on its ``ptd``
        outputs in the cycle ``timeline == T``.
        For monitors (the bench, an on-chip logic analyser); nothing needs to read it.
    """

    def __init__(self, params: QSCParams | None = None):
        self.params = params or QSCParams()
        super().__init__({
            "rx": In(packet_signature(self.params.data_width_bits)),
            "tx": Out(packet_signature(self.params.data_width_bits)),
            "ptd": Out(PTDSignature(self.params.drives_per_ppu, self.params.readouts_per_ppu,
                                    self.params.markers_per_ppu, self.params.samples_per_cycle))
            .array(self.params.num_ppus),
            "timeline": Out(64),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params

        m.submodules.net = net = DomainRenamer("rti")(NetworkCore(p))
        m.submodules.ppus = ppus = DomainRenamer("dtd")(PPUCluster(p))

        m.submodules.guard = guard = DomainRenamer("rti")(BusGuard())
        m.submodules.cmd_cdc = cmd_cdc = CrossingFIFO(
            BusCommand, CDC_FIFO_DEPTH, w_domain="rti", r_domain="dtd")
        m.submodules.rdata_cdc = rdata_cdc = CrossingFIFO(
            BusReadData, CDC_FIFO_DEPTH, w_domain="dtd", r_domain="rti")
        # The CALL requests cross as wide as the build's CALLs (``call_arg_bytes``).
        m.submodules.call_cdc = call_cdc = CrossingFIFO(
            call_request_layout(p.call_arg_bytes), CDC_FIFO_DEPTH, w_domain="dtd",
            r_domain="rti")
        # Each crossing has a CrossingReset of its own, placed beside it: its clear and hold
        # inputs come from flip-flops next to it, not from one block across the die.
        for name, fifo in (("cmd", cmd_cdc), ("rdata", rdata_cdc), ("call", call_cdc)):
            m.submodules[f"{name}_reset"] = rst = CrossingReset(fifo.w_domain, fifo.r_domain)
            m.d.comb += [
                fifo.w_clr.eq(rst.clr_a), fifo.w_hold.eq(rst.hold_a),
                fifo.r_clr.eq(rst.clr_b), fifo.r_hold.eq(rst.hold_b),
            ]

        wiring.connect(m, wiring.flipped(self.rx), net.rx)
        wiring.connect(m, net.tx, wiring.flipped(self.tx))
        for n in range(p.num_ppus):
            wiring.connect(m, ppus.ptd[n], wiring.flipped(self.ptd[n]))
        m.d.comb += self.timeline.eq(ppus.now)

        wiring.connect(m, net.bus_cmd, guard.i)                     # rti -> dtd
        wiring.connect(m, guard.o, cmd_cdc.w)
        wiring.connect(m, cmd_cdc.r, ppus.bus_cmd)
        m.d.comb += net.bus_drop.eq(guard.drop)
        wiring.connect(m, ppus.bus_rdata, rdata_cdc.w)              # dtd -> rti
        wiring.connect(m, rdata_cdc.r, net.bus_rdata)
        wiring.connect(m, ppus.call_req, call_cdc.w)                # dtd -> rti
        # Zero-extended into the network core's CallRequest (16 argument bytes): the bytes
        # beyond the build's are constant zeros, and synthesis removes what only they feed.
        req_in, req_out = call_cdc.r.payload, net.call_req.payload
        m.d.comb += [
            net.call_req.valid.eq(call_cdc.r.valid),
            call_cdc.r.ready.eq(net.call_req.ready),
            *(req_out[name].eq(req_in[name]) for name, _ in data.Layout.cast(req_in.shape())),
        ]
        return m


def generate_verilog(params: QSCParams | None = None, *, name: str = "qsc_top") -> str:
    """Elaborate :class:`QSCTop` and convert it to Verilog (Yosys, bundled with Amaranth)."""
    from amaranth.back import verilog

    top = QSCTop(params)
    return verilog.convert(top, name=name, emit_src=False)
