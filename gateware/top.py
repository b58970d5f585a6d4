"""The QSC top: the network core (``rti``) and the PPU cluster (``dtd``) joined by async FIFOs.

The top's network side is a MAC-side packet stream (see :mod:`openqlink.gateware.packet`); the
MAC and PHY are the board's (or the bench's) business. Its physical side is one PTD interface per
PPU (DAC samples, readout windows, ADC samples, markers).

The clock domains ``rti`` and ``dtd`` are used but not defined here, so the generated Verilog has
the ports ``rti_clk``, ``rti_rst``, ``dtd_clk``, ``dtd_rst`` (synchronous, active-high resets).
A board top defines them from its PLL.

# Ref: docs/architecture.md; NVQLink QSC (arXiv 2510.25213).
"""

from __future__ import annotations

from amaranth.hdl import DomainRenamer, Module
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from ..memory_map import QSCParams
from .bus import BusCommand, BusReadData, CallRequest
from .net.core import NetworkCore
from .packet import packet_signature
from .ppu.channels import PTDSignature
from .ppu.cluster import PPUCluster

__all__ = ["QSCTop", "generate_verilog"]

#: Depth of each clock-crossing FIFO (entries).
CDC_FIFO_DEPTH = 16


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
    ptd : Out(PTDSignature()).array(num_ppus)
        Physical-side interface of each PPU, ``dtd`` domain.
    timeline : Out(64)
        The shared timeline counter (DTD cycles since ``dtd_rst``), ``dtd`` domain: a PPU's
        event scheduled for time T appears on its ``ptd`` outputs in the cycle ``timeline == T``.
        For monitors (the bench, an on-chip logic analyser); nothing needs to read it.
    """

    def __init__(self, params: QSCParams | None = None):
        self.params = params or QSCParams()
        super().__init__({
            "rx": In(packet_signature(self.params.data_width_bits)),
            "tx": Out(packet_signature(self.params.data_width_bits)),
            "ptd": Out(PTDSignature()).array(self.params.num_ppus),
            "timeline": Out(64),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params

        m.submodules.net = net = DomainRenamer("rti")(NetworkCore(p))
        m.submodules.ppus = ppus = DomainRenamer("dtd")(PPUCluster(p))

        m.submodules.cmd_cdc = cmd_cdc = fifo.AsyncFIFO(
            width=BusCommand.as_shape().size, depth=CDC_FIFO_DEPTH, r_domain="dtd", w_domain="rti")
        m.submodules.rdata_cdc = rdata_cdc = fifo.AsyncFIFO(
            width=BusReadData.as_shape().size, depth=CDC_FIFO_DEPTH, r_domain="rti",
            w_domain="dtd")
        m.submodules.call_cdc = call_cdc = fifo.AsyncFIFO(
            width=CallRequest.as_shape().size, depth=CDC_FIFO_DEPTH, r_domain="rti",
            w_domain="dtd")

        wiring.connect(m, wiring.flipped(self.rx), net.rx)
        wiring.connect(m, net.tx, wiring.flipped(self.tx))
        for n in range(p.num_ppus):
            wiring.connect(m, ppus.ptd[n], wiring.flipped(self.ptd[n]))
        m.d.comb += self.timeline.eq(ppus.now)

        _through_fifo(m, net.bus_cmd, cmd_cdc, ppus.bus_cmd)        # rti -> dtd
        _through_fifo(m, ppus.bus_rdata, rdata_cdc, net.bus_rdata)  # dtd -> rti
        _through_fifo(m, ppus.call_req, call_cdc, net.call_req)     # dtd -> rti
        return m


def _through_fifo(m: Module, source, fifo_, sink) -> None:
    """Join stream ``source`` to stream ``sink`` through ``fifo_`` (payloads as flat bits)."""
    m.d.comb += [
        fifo_.w_data.eq(source.payload),
        fifo_.w_en.eq(source.valid),
        source.ready.eq(fifo_.w_rdy),
        sink.payload.eq(fifo_.r_data),
        sink.valid.eq(fifo_.r_rdy),
        fifo_.r_en.eq(sink.ready),
    ]


def generate_verilog(params: QSCParams | None = None, *, name: str = "qsc_top") -> str:
    """Elaborate :class:`QSCTop` and convert it to Verilog (Yosys, bundled with Amaranth)."""
    from amaranth.back import verilog

    top = QSCTop(params)
    return verilog.convert(top, name=name, emit_src=False)
