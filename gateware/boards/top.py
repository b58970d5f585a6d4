"""The board top: clocks, resets, the RGMII MAC, the QSC, one qubit emulator per PPU, markers.

:class:`BoardTop` is what ``qlink build`` hands to an amaranth-boards platform. From the
board's oscillator an ECP5 PLL makes every clock the profile lists (``rti`` and ``dtd`` at
125 MHz); each domain is held in reset until the PLL has locked (and while the board's reset
button, where it has one, is pressed), through a :class:`~amaranth.lib.cdc.ResetSynchronizer`
of its own. The network side is the RGMII MAC on the profile's PHY, the physical side one
:class:`~openqlink.gateware.qubit.QubitEmulator` per PPU; the PPUs' markers leave through
output flip-flops in the I/O cells onto the profile's connector pins (one ``dtd`` cycle after
the timeline cycle they belong to).

:class:`SimBoardTop` is the same design for simulation: the clocks and asynchronous resets are
ports, the MAC has no DDR cells (its RGMII signals are ports) and the markers leave through a
fabric register instead of the I/O cell's; everything between is the same elaboration
(:func:`board_system`).

# Ref: openqlink docs/boards.md; Lattice FPGA-TN-02200 (EHXPLLL); RGMII v2.0 (HP, 2002).
"""

from __future__ import annotations

import math

from amaranth.hdl import (
    Cat,
    ClockDomain,
    Const,
    DomainRenamer,
    Elaboratable,
    Instance,
    Module,
    Signal,
    Value,
)
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out
from amaranth_boards.butterstick import ButterStickPlatform

from openqlink.gateware.top import QSCTop

from .pll import ECP5PLL, ecp5_pll_config
from .profiles import MARKER_RESOURCE, BoardProfile

__all__ = ["BoardTop", "SimBoardTop", "VCCIOControl", "board_system", "sim_verilog",
           "QUBIT_SEED"]

#: Seed of PPU ``n``'s qubit emulator: ``QUBIT_SEED + n``.
QUBIT_SEED = 1


def board_system(m: Module, profile: BoardProfile, mac: wiring.Component) -> Value:
    """Add the QSC and one qubit emulator per PPU to ``m``, joined to ``mac``.

    ``mac`` is an :class:`~openqlink.gateware.mac.RGMIIMAC` whose ``rx``/``tx`` are in ``rti``.
    Returns the markers of every PPU (PPU ``n``'s marker ``i`` at bit ``k n + i``, ``k`` the
    profile's ``markers_per_ppu``), ``dtd``.
    """
    from openqlink.gateware.qubit import QubitEmulator

    p = profile.params
    m.submodules.qsc = qsc = QSCTop(p)
    wiring.connect(m, mac.rx, qsc.rx)
    wiring.connect(m, qsc.tx, mac.tx)
    markers = []
    for n in range(p.num_ppus):
        emu = DomainRenamer("dtd")(QubitEmulator(seed=QUBIT_SEED + n,
                                                 n_drive=p.drives_per_ppu,
                                                 n_readout=p.readouts_per_ppu,
                                                 n_marker=p.markers_per_ppu))
        m.submodules[f"qubit{n}"] = emu
        wiring.connect(m, qsc.ptd[n], emu.ptd)
        markers.append(qsc.ptd[n].marker)
    markers = Cat(*markers)
    assert len(markers) == profile.num_markers
    return markers


def _mac(profile: BoardProfile, pins=None):
    from openqlink.gateware.mac import RGMIIMAC

    if pins is None:
        return RGMIIMAC(None, data_width_bits=profile.params.data_width_bits)
    return RGMIIMAC(pins, data_width_bits=profile.params.data_width_bits,
                    rx_delay_ns=profile.rgmii_rx_delay_ns, tx_delay_ns=profile.rgmii_tx_delay_ns)


class BoardTop(Elaboratable):
    """The QSC on a board, for :meth:`amaranth.build.Platform.build`.

    Parameters
    ----------
    profile : BoardProfile
        The board; its platform must be the one the top is built with
        (:meth:`BoardProfile.make_platform`, which adds the marker resource).

    Clocks: the PLL's CLKOP is ``rti``, CLKOS ``dtd``; its reference is the platform's default
    clock, which also clocks the reset-less ``board`` domain (the ButterStick's VCCIO control).
    nextpnr derives each PLL output's constraint from the reference's (the platform constrains
    the oscillator pin) and the dividers; the PHY's receive clock pin is constrained at its
    profile target (``eth_rx``, 125 MHz). ``qlink build`` compares what each achieves with the
    profile's target.
    """

    def __init__(self, profile: BoardProfile):
        self.profile = profile

    def elaborate(self, platform):
        m = Module()
        prof = self.profile
        m.submodules.clk_in_buf = clk_in_buf = io.Buffer(
            "i", platform.request(prof.clk_in, 0, dir="-"))
        clk_in = clk_in_buf.i

        config = ecp5_pll_config(prof.clk_in_hz,
                                 [(c.domain, c.target_hz) for c in prof.pll_clocks])
        m.submodules.pll = pll = ECP5PLL(config)
        m.d.comb += pll.clk_in.eq(clk_in)

        m.domains.board = cd_board = ClockDomain("board", reset_less=True)
        m.d.comb += cd_board.clk.eq(clk_in)

        board_rst = Signal()
        if platform.default_rst is not None:
            m.submodules.rst_buf = rst_buf = io.Buffer(
                "i", platform.request(platform.default_rst, 0, dir="-"))
            m.d.comb += board_rst.eq(rst_buf.i)
        for out, clk in zip(config.outputs, pll.clk, strict=True):
            cd = ClockDomain(out.name, async_reset=True)
            m.domains += cd
            m.d.comb += cd.clk.eq(clk)
            # The reset is synchronised in a domain of its own on the same clock, then driven
            # onto a global network (a DCCA): the domain's reset reaches thousands of
            # flip-flops, which fabric routing would carry only through the congested die.
            sync = ClockDomain(f"{out.name}_rst_sync", async_reset=True)
            m.domains += sync
            m.d.comb += sync.clk.eq(clk)
            m.submodules[f"rst_{out.name}"] = ResetSynchronizer(~pll.locked | board_rst,
                                                                domain=sync.name)
            m.submodules[f"rst_{out.name}_global"] = Instance(
                "DCCA", i_CLKI=sync.rst, i_CE=Const(1), o_CLKO=cd.rst)

        if issubclass(prof.platform, ButterStickPlatform):
            m.submodules.vccio = VCCIOControl(platform, dict(prof.platform_kwargs),
                                              clk_hz=prof.clk_in_hz)

        pins = platform.request("eth_rgmii", prof.phy, dir="-")
        for clock in prof.clocks:
            if clock.source == "phy":
                platform.add_clock_constraint(pins.rx_clk.io, clock.target_hz)
        m.submodules.mac = mac = _mac(prof, pins)
        markers = board_system(m, prof, mac)

        port = platform.request(MARKER_RESOURCE, 0, dir="-")
        m.submodules.marker_buf = buf = io.FFBuffer("o", port, o_domain="dtd")
        m.d.comb += buf.o.eq(markers)
        return m


class SimBoardTop(wiring.Component):
    """:class:`BoardTop` for simulation: clocks, resets and RGMII as ports.

    Members
    -------
    rti_clk, dtd_clk : In(1)
        The domain clocks (125 MHz on the boards).
    rti_arst, dtd_arst : In(1)
        Asynchronous resets, each released into its domain by a ResetSynchronizer (2 stages),
        as the board releases them when its PLL locks: hold one high to model a domain whose
        clock has not come up.
    rgmii_rx_clk, rgmii_rxd, rgmii_rx_ctl : In(1), In(4), In(1)
    rgmii_tx_clk, rgmii_txd, rgmii_tx_ctl : Out(1), Out(4), Out(1)
        The MAC's RGMII signals, as :class:`~openqlink.gateware.mac.RGMIIMAC` makes them
        members with ``pins=None`` (a behavioural DDR model; ``rgmii_tx_clk`` is ``rti``'s
        clock). The FPGA-side RGMII delays of the profile are not modelled.
    marker : Out(num_ppus * markers_per_ppu)
        The markers, registered once in ``dtd`` (as the board's output flip-flops do).
    timeline : Out(64)
        The QSC's timeline counter (``dtd``), for monitors.
    """

    def __init__(self, profile: BoardProfile):
        self.profile = profile
        self._mac = _mac(profile)
        self._rgmii = {name: member for name, member in self._mac.signature.members.items()
                       if name.startswith("rgmii_")}
        super().__init__({
            "rti_clk": In(1), "dtd_clk": In(1), "rti_arst": In(1), "dtd_arst": In(1),
            **self._rgmii,
            "marker": Out(profile.num_markers),
            "timeline": Out(64),
        })

    def elaborate(self, platform):
        m = Module()
        for name in ("rti", "dtd"):
            cd = ClockDomain(name, async_reset=True)
            m.domains += cd
            m.d.comb += cd.clk.eq(getattr(self, f"{name}_clk"))
            m.submodules[f"rst_{name}"] = ResetSynchronizer(getattr(self, f"{name}_arst"),
                                                            domain=name)
        m.submodules.mac = mac = self._mac
        for name, member in self._rgmii.items():
            ours, theirs = getattr(self, name), getattr(mac, name)
            if member.flow == In:
                m.d.comb += theirs.eq(ours)
            else:
                m.d.comb += ours.eq(theirs)
        markers = board_system(m, self.profile, mac)
        m.d.dtd += self.marker.eq(markers)
        m.d.comb += self.timeline.eq(m.submodules.qsc.timeline)
        return m


def sim_verilog(profile: BoardProfile, *, name: str = "board_top") -> str:
    """:class:`SimBoardTop` of ``profile`` as Verilog, for a cocotb bench (ports as its
    members: ``rti_clk``, ``dtd_clk``, ``rti_arst``, ``dtd_arst``, ``rgmii_*``, ``marker``,
    ``timeline``)."""
    from amaranth.back import verilog

    return verilog.convert(SimBoardTop(profile), name=name, emit_src=False)


class VCCIOControl(Elaboratable):
    """The ButterStick's I/O bank voltages (SYZYGY VIO0, VIO1, VIO3), set by the FPGA.

    Each bank's buck regulator holds its feedback node at 0.6 V; the FPGA injects a current
    into that node through 68 kOhm from a pulse-width-modulated pin filtered by 68 kOhm and
    100 nF (the ``vccio_ctrl`` resource's ``pdm`` pins). With ``Rf`` = 53.6 kOhm (feedback),
    ``Rs`` = 13 kOhm (set) and ``Ri`` = 68 kOhm (injection), the control voltage for an output
    ``V`` is ``Vfb (1 + Ri/Rf) + Ri Vfb / Rs - (Ri/Rf) V``, and the pin's duty cycle that
    control voltage over 3.3 V. The regulators are enabled (``en``) once the filters have
    settled (four periods of their 23 Hz cutoff, 171 ms) and taken as good 1 ms later.

    Runs in the reset-less ``board`` domain (the board's 30 MHz oscillator). Banks given as
    ``None`` get the lowest voltage (1.2 V) and carry nothing of ours.
    """

    VFB, RI, RF, RS = 0.6, 68e3, 53.6e3, 13e3
    COUNTER_BITS = 10
    FILTER_TAU_S = 68e3 * 100e-9

    def __init__(self, platform, voltages: dict[str, str], *, clk_hz: float):
        self._platform = platform
        self._volts = [self._volts_of(voltages.get(k)) for k in ("VCCIOA", "VCCIOB", "VCCIOC")]
        self._clk_hz = clk_hz
        if clk_hz / (1 << self.COUNTER_BITS) < 4 / (2 * math.pi * self.FILTER_TAU_S):
            raise ValueError(f"{clk_hz / 1e6:g} MHz is too slow for the VCCIO PWM filter")
        self.power_good = Signal()

    @staticmethod
    def _volts_of(setting: str | None) -> float:
        if setting is None:
            return 1.2
        return {"3V3": 3.3, "2V5": 2.5, "1V8": 1.8, "1V5": 1.5, "1V2": 1.2}[setting]

    @classmethod
    def duty(cls, volts: float) -> float:
        """The PWM duty cycle (0..1) that sets a bank to ``volts``."""
        i_total = cls.VFB / cls.RS
        vctl = cls.VFB * (1 + cls.RI / cls.RF) + cls.RI * i_total - cls.RI / cls.RF * volts
        if not 0 < vctl < 3.3:
            raise ValueError(f"VCCIO {volts} V needs a control voltage of {vctl:.2f} V")
        return vctl / 3.3

    def elaborate(self, platform):
        m = Module()
        ctrl = self._platform.request("vccio_ctrl", 0, dir="-")
        m.submodules.pdm_buf = pdm = io.Buffer("o", ctrl.pdm)
        m.submodules.en_buf = en = io.Buffer("o", ctrl.en)
        counter = Signal(self.COUNTER_BITS)
        m.d.board += counter.eq(counter + 1)
        for i, volts in enumerate(self._volts):
            threshold = int(self.duty(volts) * (1 << self.COUNTER_BITS))
            m.d.board += pdm.o[i].eq(counter < threshold)
        settle = int(4 * 2 * math.pi * self.FILTER_TAU_S * self._clk_hz)
        good = settle + int(1e-3 * self._clk_hz)
        boot = Signal(range(good + 1))
        with m.If(boot != good):
            m.d.board += boot.eq(boot + 1)
        m.d.board += en.o.eq(boot >= settle)
        m.d.comb += self.power_good.eq(boot == good)
        return m
