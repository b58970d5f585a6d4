"""openqlink.gateware.mac.rgmii: the behavioural DDR model nibble by nibble (amaranth.sim), and
the board build's I/O cells for amaranth-boards platforms (elaborated, not synthesized)."""

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from openqlink.gateware.mac import RGMIIMAC
from openqlink.gateware.mac.rgmii import RGMIIPort, control_pins

pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


def test_receive_model_pairs_rising_and_falling_nibbles():
    """Low nibble and RX_DV at the rising edge, high nibble and RX_DV^RX_ER at the falling edge
    (driven mid-way between edges, as a PHY with its RX delay does) make one GMII byte."""
    dut = RGMIIPort(rx_domain="eth_rx", tx_domain="rti")
    m = Module()
    m.domains.eth_rx = eth_rx = ClockDomain()
    m.domains.rti = ClockDomain()
    m.d.comb += eth_rx.clk.eq(dut.rx_clk)
    m.submodules.dut = dut
    # (byte, dv, er) per cycle
    sent = [(0x00, 0, 0), (0x55, 1, 0), (0xD5, 1, 0), (0x3C, 1, 0), (0xA7, 1, 1), (0x0F, 0, 1),
            (0x00, 0, 0), (0x00, 0, 0), (0x00, 0, 0)]
    got = []

    async def phy(ctx):
        for byte, dv, er in sent:
            # Rising edge at t, falling edge at t + 4 ns; data changes 2 ns away from each.
            ctx.set(dut.rgmii_rxd, byte & 0xF)
            ctx.set(dut.rgmii_rx_ctl, dv)
            await ctx.delay(2e-9)
            ctx.set(dut.rgmii_rx_clk, 1)
            await ctx.delay(2e-9)
            ctx.set(dut.rgmii_rxd, byte >> 4)
            ctx.set(dut.rgmii_rx_ctl, dv ^ er)
            await ctx.delay(2e-9)
            ctx.set(dut.rgmii_rx_clk, 0)
            got.append((ctx.get(dut.rx.data), ctx.get(dut.rx.en), ctx.get(dut.rx.er)))
            await ctx.delay(2e-9)

    sim = Simulator(m)
    sim.add_clock(8e-9, domain="rti")
    sim.add_testbench(phy)
    sim.run()
    # Sampled after the falling edge of cycle k: the byte whose low nibble was sampled at the
    # rising edge of cycle k - 1 (registered at the rising edge of cycle k: 1 cycle).
    assert got[1:] == sent[:-1]


def test_transmit_model_centres_each_nibble_on_its_edge():
    """Each nibble is on TXD for the half cycle before the TXC edge that samples it: the low
    nibble and TX_EN before the rising edge, the high nibble and TX_EN^TX_ER before the falling
    edge."""
    dut = RGMIIPort(rx_domain="eth_rx", tx_domain="rti")
    m = Module()
    m.domains.eth_rx = ClockDomain()
    m.domains.rti = ClockDomain()
    m.submodules.dut = dut
    sent = [(0x12, 1, 0), (0x34, 1, 0), (0xAB, 1, 1), (0x00, 0, 0), (0xCD, 0, 1)]
    rising, falling = [], []

    async def bench(ctx):
        for byte, en, er in sent + [(0, 0, 0)] * 4:
            ctx.set(dut.tx.data, byte)
            ctx.set(dut.tx.en, en)
            ctx.set(dut.tx.er, er)
            await ctx.tick("rti")
        await ctx.tick("rti")

    async def sink(ctx):
        while True:
            await ctx.delay(1e-9)         # just before each edge
            await ctx.delay(2.9e-9)
            clk = ctx.get(dut.rgmii_tx_clk)
            sample = (ctx.get(dut.rgmii_txd), ctx.get(dut.rgmii_tx_ctl))
            (falling if clk else rising).append(sample)
            await ctx.delay(0.1e-9)

    sim = Simulator(m)
    sim.add_clock(8e-9, domain="rti")
    sim.add_testbench(bench)
    sim.add_testbench(sink, background=True)
    sim.run()
    pairs = list(zip(rising, falling, strict=False))
    got = [((hi << 4) | lo, en, en ^ ctl) for (lo, en), (hi, ctl) in pairs]
    start = next(i for i, (b, en, _) in enumerate(got) if en)
    assert got[start:start + len(sent)] == sent


@pytest.mark.parametrize(("names", "expected"), [
    (("tx_ctl", "rx_ctl"), ("tx_ctl", "rx_ctl")),
    (("tx_ctrl", "rx_ctrl"), ("tx_ctrl", "rx_ctrl")),
])
def test_control_pin_names(names, expected):
    pins = type("Pins", (), {n: n for n in names})()
    assert control_pins(pins) == expected


def test_control_pins_missing():
    with pytest.raises(ValueError, match=r"neither 'tx_ctl' nor 'tx_ctrl'"):
        control_pins(object())


@pytest.mark.parametrize("name", ["rx_delay_ns", "tx_delay_ns"])
def test_delay_range(name):
    with pytest.raises(ValueError, match=rf"{name} must be between 0 and 3.175 ns, not 4.0"):
        RGMIIPort(**{name: 4.0})


def _board_rtlil(platform, **mac_args) -> str:
    from amaranth.lib import io

    class Top(wiring.Component):
        def __init__(self):
            super().__init__({})

        def elaborate(self, platform):
            m = Module()
            clk = platform.request(platform.default_clk, dir="-")
            m.submodules.clk = clk_buf = io.Buffer("i", clk)
            m.domains.rti = rti = ClockDomain()
            m.d.comb += rti.clk.eq(clk_buf.i)
            pins = platform.request("eth_rgmii", 0, dir="-")
            m.submodules.mac = mac = RGMIIMAC(pins, **mac_args)
            wiring.connect(m, mac.rx, mac.tx)
            return m

    plan = platform.prepare(Top(), name="top")
    return plan.files["top.il"]


def test_colorlight_board_build_with_fpga_delays():
    boards = pytest.importorskip("amaranth_boards.colorlight_5a75b_r7_0")
    il = _board_rtlil(boards.Colorlight_5A75B_R70Platform(), rx_delay_ns=2.0, tx_delay_ns=2.0)
    assert il.count("DELAYG") >= 6               # RXD x4, RX_CTL, TXC
    assert "IDDRX1F" in il and "ODDRX1F" in il
    assert "parameter \\DEL_VALUE 80" in il       # 2 ns / 25 ps


def test_ecpix5_board_build_with_phy_delays():
    """The ECPIX-5 names its control pins tx_ctrl/rx_ctrl; with the PHY's delays the I/O cells
    are amaranth's DDR buffers and no DELAYG is used."""
    boards = pytest.importorskip("amaranth_boards.ecpix5")
    il = _board_rtlil(boards.ECPIX585Platform())
    assert "DELAYG" not in il
    assert il.count("IDDRX1F") >= 5 and il.count("ODDRX1F") >= 6
