"""The RGMII MAC as one block: RGMII pins on one side, ``rti`` packet streams on the other.

# Ref: IEEE 802.3-2018 clauses 3 and 4 (framing, FCS, inter-frame gap; see
# :mod:`openqlink.gateware.mac.ethernet`), RGMII v2.0 (see :mod:`openqlink.gateware.mac.rgmii`).

Receive: RGMII (``eth_rx``, the PHY's RXC) -> :class:`~.ethernet.MACRx` (8 bits) ->
:class:`~.cdc.RxClockCrossing` (``eth_rx`` -> ``rti``, 8 bits) -> :class:`~.width.PacketUpsizer`
(8 -> ``data_width_bits``) -> ``rx``. Transmit, all in ``rti``: ``tx`` ->
:class:`~.width.PacketDownsizer` -> :class:`~.ethernet.MACTx` -> RGMII.
"""

from __future__ import annotations

from amaranth.hdl import ClockDomain, DomainRenamer, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import PulseSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out

from ..packet import RegisterSlice, beat_layout, packet_signature
from .cdc import RxClockCrossing
from .ethernet import MIN_IFG_BYTES, MACRx, MACTx
from .rgmii import RGMIIPort, rgmii_pin_members
from .width import PacketDownsizer, PacketUpsizer

__all__ = ["RGMIIMAC", "RX_COUNTERS", "TX_COUNTERS"]

#: Receive status counters (``rti``), in member order: every frame with an SFD; FCS mismatches;
#: frames with RX_ER; frames shorter than 64 bytes; frames cut off or dropped for lack of room.
RX_COUNTERS = ("rx_frames", "rx_fcs_errors", "rx_phy_errors", "rx_runts", "rx_overflows")
#: Transmit status counters (``rti``): frames sent; frames cut off by an underflow of ``tx``.
TX_COUNTERS = ("tx_frames", "tx_underflows")


class RGMIIMAC(wiring.Component):
    """1 Gb/s Ethernet MAC on RGMII, with the network core's packet streams.

    Receive. ``rx`` delivers every frame that had an SFD, from its destination address to the
    end of its payload (FCS stripped), with ``error`` on the last beat when the FCS does not
    match, RX_ER was seen, the frame is a runt (< 64 bytes with FCS), or it was cut off by an
    overflow: the consumer must drop such a frame whole. A frame of 4 bytes or fewer after the
    SFD delivers nothing. Cut-through: in simulation the last beat is on ``rx`` 7.5 (8-bit) or
    8.5 (64-bit) ``rti`` cycles after the last FCS nibble was driven on RXD, with RXC half a
    cycle out of phase with ``rti`` (1 RGMII, 2 receive MAC, about 4 clock crossing, 1 width
    converter; 1 more with the ECP5 IDDRX1F; the crossing varies by a cycle with the phase). ``rx``
    cannot stall the wire: while ``rx.ready`` is low the ``rx_fifo_depth``-byte FIFO fills; when
    it is full, the frame being received is cut off (its last beat has ``error`` set) and later
    frames are dropped whole until there is room, each counted in ``rx_overflows``. With
    ``rx.ready`` held high (as the network core holds it) nothing is ever dropped, and stalls
    of up to about ``rx_fifo_depth - 4`` cycles per frame are absorbed.

    Transmit. ``tx`` takes frames without FCS; the MAC sends preamble and SFD, pads frames
    shorter than 60 bytes with zeros, appends the FCS and keeps >= ``ifg_bytes`` idle bytes
    between frames (1 Gb/s line rate). On an idle MAC, the first preamble nibble is sampled on
    TXD 3 (8-bit) or 5 (64-bit: the downsizer's buffers, a register slice) ``rti``
    cycles after the clock edge that first sees a frame's first beat offered (ECP5: 2 more in
    the ODDRX1F); the frame's first byte is taken 8 cycles after the preamble starts, then one
    byte per cycle.
    Once started, a frame's beats must keep up with the wire (one ``data_width_bits`` beat per
    ``data_width_bits // 8`` cycles); an underflow ends the frame on the wire with TX_ER (the
    receiver drops it), counted in ``tx_underflows``, and the rest of the frame is dropped.

    Domains. ``rti`` (125 MHz; used, not defined here: the board defines it) for ``rx``, ``tx``,
    the counters and the whole transmit side. The receive side runs in ``eth_rx``, a local
    domain clocked by the PHY's RXC and reset from ``rti``'s reset through a
    :class:`~amaranth.lib.cdc.ResetSynchronizer`. ``tx_clk_domain`` (board build only), if
    given, must be defined by the board.

    Parameters
    ----------
    pins : resource or None
        ``platform.request("eth_rgmii", n, dir="-")``, or None: the simulation build, whose
        RGMII signals are members.
    data_width_bits : int
        Width of ``rx``/``tx`` data in bits: 8 or a multiple of it (64 for the network core).
    rx_fifo_depth : int
        Bytes of the receive clock-crossing FIFO (a power of 2).
    ifg_bytes : int
        Minimum idle bytes between transmitted frames (>= 12).
    counter_width : int
        Width of each status counter in bits (they wrap).
    tx_clk_domain, rx_delay_ns, tx_delay_ns
        RGMII clock-to-data skew, see :class:`~openqlink.gateware.mac.rgmii.RGMIIPort`.

    Members
    -------
    rx : Out(packet_signature(data_width_bits))
        Received frames, ``rti``.
    tx : In(packet_signature(data_width_bits))
        Frames to send, ``rti``; ``error`` on a last beat sends the frame with TX_ER on its FCS.
    rx_frames, rx_fcs_errors, rx_phy_errors, rx_runts, rx_overflows : Out(counter_width)
        Receive counters (:data:`RX_COUNTERS`), ``rti``, reset by ``rti``'s reset.
    tx_frames, tx_underflows : Out(counter_width)
        Transmit counters (:data:`TX_COUNTERS`), ``rti``.
    rgmii_rx_clk, rgmii_rxd (4), rgmii_rx_ctl : In
        Simulation build only: the PHY's receive side (RXC at 125 MHz).
    rgmii_tx_clk, rgmii_txd (4), rgmii_tx_ctl : Out
        Simulation build only: the transmit side (TXC is the ``rti`` clock; each nibble is
        stable around the TXC edge that samples it).
    """

    def __init__(self, pins=None, *, data_width_bits: int = 64, rx_fifo_depth: int = 16,
                 ifg_bytes: int = MIN_IFG_BYTES, counter_width: int = 32,
                 tx_clk_domain: str | None = None, rx_delay_ns: float = 0.0,
                 tx_delay_ns: float = 0.0):
        if not isinstance(data_width_bits, int) or data_width_bits <= 0 or data_width_bits % 8:
            raise ValueError("data_width_bits must be a positive multiple of 8, not "
                             f"{data_width_bits!r}")
        if not isinstance(counter_width, int) or counter_width < 1:
            raise ValueError(f"counter_width must be a positive integer, not {counter_width!r}")
        self.pins = pins
        self.data_width_bits = data_width_bits
        self.rx_fifo_depth = rx_fifo_depth
        self.ifg_bytes = ifg_bytes
        self.counter_width = counter_width
        self._port_args = dict(tx_clk_domain=tx_clk_domain, rx_delay_ns=rx_delay_ns,
                               tx_delay_ns=tx_delay_ns)
        # Build the parts now so that parameter errors are raised here.
        self._rgmii = RGMIIPort(pins, rx_domain="eth_rx", tx_domain="rti", **self._port_args)
        self._rx_cdc = RxClockCrossing(depth=rx_fifo_depth, w_domain="eth_rx", r_domain="rti")
        self._mac_tx = MACTx(ifg_bytes=ifg_bytes)
        members = {
            "rx": Out(packet_signature(data_width_bits)),
            "tx": In(packet_signature(data_width_bits)),
        }
        for name in RX_COUNTERS + TX_COUNTERS:
            members[name] = Out(counter_width)
        if pins is None:
            members.update(rgmii_pin_members())
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        w = self.data_width_bits

        m.domains.eth_rx = eth_rx = ClockDomain("eth_rx", local=True)
        m.submodules.rgmii = port = self._rgmii
        m.d.comb += eth_rx.clk.eq(port.rx_clk)
        m.submodules.eth_rx_reset = ResetSynchronizer(ResetSignal("rti"), domain="eth_rx")
        if self.pins is None:
            for name, member in rgmii_pin_members().items():
                ours, theirs = getattr(self, name), getattr(port, name)
                m.d.comb += theirs.eq(ours) if member.flow == In else ours.eq(theirs)

        # Receive.
        m.submodules.mac_rx = mac_rx = DomainRenamer("eth_rx")(MACRx())
        m.submodules.rx_cdc = rx_cdc = self._rx_cdc
        wiring.connect(m, port.rx, mac_rx.gmii)
        wiring.connect(m, mac_rx.frames, rx_cdc.i)
        if w == 8:
            wiring.connect(m, rx_cdc.o, wiring.flipped(self.rx))
        else:
            m.submodules.rx_upsizer = up = DomainRenamer("rti")(PacketUpsizer(8, w))
            wiring.connect(m, rx_cdc.o, up.i)
            wiring.connect(m, up.o, wiring.flipped(self.rx))

        # Transmit.
        m.submodules.mac_tx = mac_tx = DomainRenamer("rti")(self._mac_tx)
        if w == 8:
            wiring.connect(m, wiring.flipped(self.tx), mac_tx.frames)
        else:
            # The downsizer's buffers load without regard to the MAC's back-pressure, and the
            # 8-bit stream crosses to the MAC from register to register.
            m.submodules.tx_downsizer = down = DomainRenamer("rti")(PacketDownsizer(w, 8))
            m.submodules.tx_slice = tx_slice = DomainRenamer("rti")(RegisterSlice(beat_layout(8)))
            wiring.connect(m, wiring.flipped(self.tx), down.i)
            wiring.connect(m, down.o, tx_slice.i)
            wiring.connect(m, tx_slice.o, mac_tx.frames)
        wiring.connect(m, mac_tx.gmii, port.tx)

        # Counters, all in rti: receive events cross as pulses (at most one per 8 cycles).
        rx_events = {
            "rx_frames": mac_rx.frame_end,
            "rx_fcs_errors": mac_rx.fcs_error,
            "rx_phy_errors": mac_rx.phy_error,
            "rx_runts": mac_rx.runt,
            "rx_overflows": rx_cdc.overflow,
        }
        for name, pulse in rx_events.items():
            m.submodules[f"{name}_sync"] = sync = PulseSynchronizer("eth_rx", "rti")
            m.d.comb += sync.i.eq(pulse)
            self._count(m, getattr(self, name), sync.o)
        self._count(m, self.tx_frames, mac_tx.frame_sent)
        self._count(m, self.tx_underflows, mac_tx.underflow)
        return m

    @staticmethod
    def _count(m: Module, counter: Signal, event) -> None:
        with m.If(event):
            m.d.rti += counter.eq(counter + 1)
