"""RGMII I/O: 4 bits on both clock edges at 125 MHz <-> one GMII byte per cycle.

# Ref: RGMII v2.0 (HP, 4/1/2002) 3.0 (signal definitions: TXD[3:0] on the rising edge of TXC,
# TXD[7:4] on the falling edge; TX_CTL = TX_EN on the rising edge, TX_EN xor TX_ER on the
# falling edge; likewise RXD/RX_CTL/RXC) and 3.3 (timing: the clock is delayed 1.5-2.0 ns from
# the data, by the PCB trace, by the PHY ("RGMII-ID") or by the MAC); IEEE 802.3-2018 35.2.2
# (GMII). Lattice TN1265 (ECP5 high-speed I/O: IDDRX1F, ODDRX1F, DELAYG).

Two builds of the same block:

- **Board** (``pins`` given): the resource from ``platform.request("eth_rgmii", n, dir="-")``.
  Data and control pass through :class:`amaranth.lib.io.DDRBuffer` (IDDRX1F/ODDRX1F on ECP5),
  TXC is a DDR output of (1, 0). The clock-to-data skew RGMII needs is a parameter:
  ``rx_delay_ns``/``tx_delay_ns`` insert an ECP5 ``DELAYG`` on RXD/RX_CTL (the inputs) or on TXC
  (25 ps a tap, at most 3.175 ns); 0 (the default) means the PHY adds it (RGMII-ID: RX and TX
  internal delays enabled by strap or MDIO), or the board's traces do. ``tx_clk_domain`` names a
  domain for TXC's DDR output instead, e.g. a 90-degree shifted copy of ``tx_domain`` from the
  board's PLL (2 ns at 125 MHz).
- **Simulation** (``pins=None``): the RGMII signals are members and a behavioural DDR model
  stands for the I/O cells (they do not simulate): RXD/RX_CTL are sampled on both edges of
  ``rgmii_rx_clk`` (a negative-edge domain), and TXD/TX_CTL change on the edge opposite to the
  one that samples them, as seen behind a PHY whose internal TX delay centres TXC on the data
  (``rgmii_tx_clk`` is the ``tx_domain`` clock). This matches cocotbext-eth's RgmiiSource and
  RgmiiSink.

Domains: the receive side (``rx`` and the input DDR registers) is clocked by ``rx_domain``,
which the parent defines from ``rx_clk`` (the PHY's RXC, through its input buffer). The transmit
side is in ``tx_domain`` (125 MHz).
"""

from __future__ import annotations

from amaranth.hdl import (
    Cat,
    ClockDomain,
    ClockSignal,
    Const,
    Instance,
    IOPort,
    Module,
    Signal,
)
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from .ethernet import GMIISignature

__all__ = ["RGMIIPort", "RXC_HZ", "DELAYG_TAP_NS", "DELAYG_MAX_TAPS", "control_pins",
           "rgmii_pin_members"]

#: RXC at 1000 Mb/s (RGMII v2.0 3.3), constrained on the board build.
RXC_HZ = 125e6
#: ECP5 DELAYG delay per tap in ns (Lattice TN1265).
DELAYG_TAP_NS = 0.025
#: Largest DELAYG delay value (7-bit tap count).
DELAYG_MAX_TAPS = 127


def control_pins(pins) -> tuple[object, object]:
    """The (TX, RX) control pins of an ``eth_rgmii`` resource: amaranth-boards names them
    ``tx_ctl``/``rx_ctl`` on most boards and ``tx_ctrl``/``rx_ctrl`` on the ECPIX-5."""
    found = []
    for names in (("tx_ctl", "tx_ctrl"), ("rx_ctl", "rx_ctrl")):
        for name in names:
            if hasattr(pins, name):
                found.append(getattr(pins, name))
                break
        else:
            raise ValueError(f"the RGMII resource has neither {names[0]!r} nor {names[1]!r}")
    return found[0], found[1]


def _taps(delay_ns: float, name: str) -> int:
    if not 0 <= delay_ns <= DELAYG_MAX_TAPS * DELAYG_TAP_NS:
        raise ValueError(f"{name} must be between 0 and {DELAYG_MAX_TAPS * DELAYG_TAP_NS:.3f} ns, "
                         f"not {delay_ns!r}")
    return round(delay_ns / DELAYG_TAP_NS)


def rgmii_pin_members() -> dict:
    """The RGMII pins as component members, for the simulation build (``pins=None``)."""
    return {
        "rgmii_rx_clk": In(1), "rgmii_rxd": In(4), "rgmii_rx_ctl": In(1),
        "rgmii_tx_clk": Out(1), "rgmii_txd": Out(4), "rgmii_tx_ctl": Out(1),
    }


class RGMIIPort(wiring.Component):
    """The RGMII pins as a GMII byte bus.

    Latency: a byte whose low nibble is sampled at a rising edge of RXC is on ``rx`` from the
    next rising edge (1 ``rx_domain`` cycle) in simulation; on ECP5 the IDDRX1F adds its own
    register. A byte on ``tx`` in a ``tx_domain`` cycle has its low nibble on TXD, centred on
    the next-but-one rising edge of ``rgmii_tx_clk`` (the simulation model); on ECP5 the
    ODDRX1F adds 2 cycles to the output register.

    Parameters
    ----------
    pins : resource or None
        ``platform.request("eth_rgmii", n, dir="-")`` (subsignals ``tx_clk``, ``tx_ctl`` or
        ``tx_ctrl``, ``tx_data``, ``rx_clk``, ``rx_ctl`` or ``rx_ctrl``, ``rx_data``), or None
        for the simulation build.
    rx_domain, tx_domain : str
        Receive domain (clocked by ``rx_clk``, defined by the parent) and transmit domain.
    tx_clk_domain : str or None
        Domain of TXC's DDR output (board build); None: ``tx_domain`` (TXC edge-aligned with
        TXD).
    rx_delay_ns, tx_delay_ns : float
        Delay (ns) added on ECP5 by DELAYG to RXD/RX_CTL and to TXC (board build); 0: none.

    Members
    -------
    rx : Out(GMIISignature())
        Received bytes, ``rx_domain``, registered.
    tx : In(GMIISignature())
        Bytes to send, ``tx_domain``.
    rx_clk : Out(1)
        The PHY's receive clock (RXC), to clock ``rx_domain``.
    rgmii_rx_clk, rgmii_rxd (4), rgmii_rx_ctl : In
        Simulation build only: RXC, RXD[3:0], RX_CTL from the PHY.
    rgmii_tx_clk, rgmii_txd (4), rgmii_tx_ctl : Out
        Simulation build only: TXC, TXD[3:0], TX_CTL to the PHY.
    """

    def __init__(self, pins=None, *, rx_domain: str = "eth_rx", tx_domain: str = "rti",
                 tx_clk_domain: str | None = None, rx_delay_ns: float = 0.0,
                 tx_delay_ns: float = 0.0):
        self.pins = pins
        self.rx_domain = rx_domain
        self.tx_domain = tx_domain
        self.tx_clk_domain = tx_clk_domain or tx_domain
        self.rx_delay_taps = _taps(rx_delay_ns, "rx_delay_ns")
        self.tx_delay_taps = _taps(tx_delay_ns, "tx_delay_ns")
        if pins is not None:
            self.tx_ctl_pin, self.rx_ctl_pin = control_pins(pins)
        members = {
            "rx": Out(GMIISignature()),
            "tx": In(GMIISignature()),
            "rx_clk": Out(1),
        }
        if pins is None:
            members.update(rgmii_pin_members())
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        # Per cycle: the nibble (and control bit) of the rising edge, then of the falling edge.
        rxd_rise, rxd_fall = Signal(4), Signal(4)
        rxc_rise, rxc_fall = Signal(), Signal()
        txd_rise, txd_fall = Signal(4), Signal(4)
        txc_rise, txc_fall = Signal(), Signal()
        m.d.comb += [
            txd_rise.eq(self.tx.data[:4]),
            txd_fall.eq(self.tx.data[4:]),
            txc_rise.eq(self.tx.en),
            txc_fall.eq(self.tx.en ^ self.tx.er),
        ]

        if self.pins is None:
            self._simulation_model(m, rxd_rise, rxd_fall, rxc_rise, rxc_fall,
                                   txd_rise, txd_fall, txc_rise, txc_fall)
        else:
            self._board_io(m, platform, rxd_rise, rxd_fall, rxc_rise, rxc_fall,
                           txd_rise, txd_fall, txc_rise, txc_fall)

        m.d[self.rx_domain] += [
            self.rx.data.eq(Cat(rxd_rise, rxd_fall)),
            self.rx.en.eq(rxc_rise),
            self.rx.er.eq(rxc_rise ^ rxc_fall),
        ]
        return m

    def _simulation_model(self, m, rxd_rise, rxd_fall, rxc_rise, rxc_fall,
                          txd_rise, txd_fall, txc_rise, txc_fall):
        m.d.comb += self.rx_clk.eq(self.rgmii_rx_clk)

        # Receive: sample on the rising edge, then on the following falling edge; both halves
        # are presented together after the next rising edge, as IDDRX1F does.
        m.domains.rgmii_rx_fall = rx_fall = ClockDomain(clk_edge="neg", reset_less=True,
                                                        local=True)
        m.d.comb += rx_fall.clk.eq(ClockSignal(self.rx_domain))
        rise_d, rise_c = Signal(4), Signal()
        fall_d, fall_c = Signal(4), Signal()
        m.d[self.rx_domain] += [rise_d.eq(self.rgmii_rxd), rise_c.eq(self.rgmii_rx_ctl)]
        m.d.rgmii_rx_fall += [fall_d.eq(self.rgmii_rxd), fall_c.eq(self.rgmii_rx_ctl)]
        m.d.comb += [
            rxd_rise.eq(rise_d), rxc_rise.eq(rise_c),
            rxd_fall.eq(fall_d), rxc_fall.eq(fall_c),
        ]

        # Transmit: each nibble is driven from the edge before the one that samples it (the low
        # nibble from the falling edge before TXC rises, the high nibble from the rising edge),
        # so it is stable around its sampling edge. The pins are the XOR of one rising-edge and
        # one falling-edge register: each domain drives its own register only.
        m.domains.rgmii_tx_fall = tx_fall = ClockDomain(clk_edge="neg", reset_less=True,
                                                        local=True)
        m.d.comb += [
            tx_fall.clk.eq(ClockSignal(self.tx_domain)),
            self.rgmii_tx_clk.eq(ClockSignal(self.tx_domain)),
        ]
        byte_d, byte_c = Signal(8), Signal(2)       # the byte being sent, from tx_domain
        pos_d, pos_c = Signal(4), Signal()          # tx_domain (rising edge) halves
        neg_d, neg_c = Signal(4), Signal()          # falling edge halves
        m.d[self.tx_domain] += [
            byte_d.eq(Cat(txd_rise, txd_fall)),
            byte_c.eq(Cat(txc_rise, txc_fall)),
            pos_d.eq(byte_d[4:] ^ neg_d),
            pos_c.eq(byte_c[1] ^ neg_c),
        ]
        m.d.rgmii_tx_fall += [
            neg_d.eq(byte_d[:4] ^ pos_d),
            neg_c.eq(byte_c[0] ^ pos_c),
        ]
        m.d.comb += [
            self.rgmii_txd.eq(pos_d ^ neg_d),
            self.rgmii_tx_ctl.eq(pos_c ^ neg_c),
        ]

    def _board_io(self, m, platform, rxd_rise, rxd_fall, rxc_rise, rxc_fall,
                  txd_rise, txd_fall, txc_rise, txc_fall):
        pins = self.pins
        m.submodules.rx_clk_buf = rx_clk_buf = io.Buffer("i", pins.rx_clk)
        m.d.comb += self.rx_clk.eq(rx_clk_buf.i)
        rxc_io = getattr(pins.rx_clk, "io", None)
        if hasattr(platform, "add_clock_constraint") and isinstance(rxc_io, IOPort):
            platform.add_clock_constraint(rxc_io, RXC_HZ)

        for name, port, rise, fall in (("rxd", pins.rx_data, rxd_rise, rxd_fall),
                                       ("rx_ctl", self.rx_ctl_pin, rxc_rise, rxc_fall)):
            if self.rx_delay_taps:
                i0, i1 = self._ecp5_delayed_iddr(m, platform, name, port)
                m.d.comb += [rise.eq(i0), fall.eq(i1)]
            else:
                m.submodules[f"{name}_ddr"] = ddr = io.DDRBuffer(
                    "i", port, i_domain=self.rx_domain)
                m.d.comb += [rise.eq(ddr.i[0]), fall.eq(ddr.i[1])]

        for name, port, rise, fall in (("txd", pins.tx_data, txd_rise, txd_fall),
                                       ("tx_ctl", self.tx_ctl_pin, txc_rise, txc_fall)):
            m.submodules[f"{name}_ddr"] = ddr = io.DDRBuffer("o", port, o_domain=self.tx_domain)
            m.d.comb += [ddr.o[0].eq(rise), ddr.o[1].eq(fall)]

        if self.tx_delay_taps:
            self._ecp5_delayed_txc(m, platform, pins.tx_clk)
        else:
            m.submodules.tx_clk_ddr = ddr = io.DDRBuffer("o", pins.tx_clk,
                                                         o_domain=self.tx_clk_domain)
            m.d.comb += [ddr.o[0].eq(1), ddr.o[1].eq(0)]

    def _require_ecp5(self, platform):
        if getattr(platform, "family", None) != "ecp5":
            raise ValueError("rx_delay_ns/tx_delay_ns use the ECP5 DELAYG; on this platform "
                             "leave them at 0 and let the PHY add the RGMII delays")

    def _ecp5_delayed_iddr(self, m, platform, name, port):
        """Input buffer -> DELAYG -> IDDRX1F for each bit of ``port`` (ECP5)."""
        self._require_ecp5(platform)
        m.submodules[f"{name}_buf"] = buf = io.Buffer("i", port)
        i0, i1 = Signal(len(port)), Signal(len(port))
        for bit in range(len(port)):
            delayed = Signal(name=f"{name}_delayed_{bit}")
            m.submodules[f"{name}_delay_{bit}"] = Instance(
                "DELAYG", p_DEL_MODE="USER_DEFINED", p_DEL_VALUE=self.rx_delay_taps,
                i_A=buf.i[bit], o_Z=delayed)
            m.submodules[f"{name}_iddr_{bit}"] = Instance(
                "IDDRX1F", i_D=delayed, i_SCLK=ClockSignal(self.rx_domain),
                i_RST=Const(0), o_Q0=i0[bit], o_Q1=i1[bit])
        return i0, i1

    def _ecp5_delayed_txc(self, m, platform, port):
        """ODDRX1F of (1, 0) -> DELAYG -> output buffer (ECP5)."""
        self._require_ecp5(platform)
        m.submodules.tx_clk_buf = buf = io.Buffer("o", port)
        clock, delayed = Signal(), Signal()
        m.submodules.tx_clk_oddr = Instance(
            "ODDRX1F", i_D0=Const(1), i_D1=Const(0), i_SCLK=ClockSignal(self.tx_clk_domain),
            i_RST=Const(0), o_Q=clock)
        m.submodules.tx_clk_delay = Instance(
            "DELAYG", p_DEL_MODE="USER_DEFINED", p_DEL_VALUE=self.tx_delay_taps, i_A=clock,
            o_Z=delayed)
        m.d.comb += buf.o.eq(delayed)
