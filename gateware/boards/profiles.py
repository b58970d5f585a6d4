"""Board profiles: each board the QSC gateware is built for, described as data.

A :class:`BoardProfile` names the amaranth-boards platform, the FPGA, the :class:`QSCParams` the
board's build uses, the clock domains with their targets, the Ethernet PHY (an ``eth_rgmii``
resource of the platform) and the connector pins that carry the PPUs' markers. The board top
(:mod:`.top`) reads nothing else; the design itself never names a pin.

| board | FPGA | PPUs | ring | envelopes | markers per PPU | marker pins |
|---|---|---|---|---|---|---|
| Colorlight 5A-75B r7.0 | LFE5U-25F-6 CABGA256 | 1 | 512 | 2048 | 2 | HUB75 J1 pins 1 2 |
| ECPIX-5 85F | LFE5UM5G-85F-8 CABGA554 | 2 | 1024 | 4096 | 4 | PMOD0 pins 1-4, 7-10 |
| ButterStick r1.0 | LFE5UM5G-85F-8 CABGA381 | 2 | 1024 | 4096 | 4 | SYZYGY0 S0-S7 (VIO0 3.3 V) |

Every PPU has one drive and one readout channel and ``markers_per_ppu`` marker channels (a
marker channel costs about 530 logic cells: the Colorlight keeps two); its drive and readout
ports are served by a
:class:`~openqlink.gateware.qubit.QubitEmulator` on the board (the boards have no converters).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from amaranth.build import Attrs, Pins, Resource
from amaranth.vendor import LatticeECP5Platform
from amaranth_boards.butterstick import ButterStickPlatform
from amaranth_boards.colorlight_5a75b_r7_0 import Colorlight_5A75B_R70Platform
from amaranth_boards.ecpix5 import ECPIX585Platform

from openqlink.memory_map import QSCParams

__all__ = [
    "ClockTarget", "MarkerPins", "BoardProfile", "PROFILES", "profile",
    "MARKER_RESOURCE",
]

#: Name of the resource :meth:`BoardProfile.marker_resource` adds to the platform.
MARKER_RESOURCE = "qlink_marker"

#: Both QSC domains run at 125 MHz on every board: the RGMII byte clock of 1 Gb/s Ethernet.
CLK_HZ = 125_000_000
#: The PHY's receive clock (RXC) at 1 Gb/s.
RGMII_RX_CLK_HZ = 125_000_000


@dataclass(frozen=True)
class ClockTarget:
    """A clock domain of the board top and the frequency it must reach (Hz).

    ``source`` is where its clock comes from: ``"pll"`` (an output of the board top's PLL, in
    the order of :attr:`BoardProfile.clocks`) or ``"phy"`` (the Ethernet PHY's receive clock,
    constrained at the pin).
    """

    domain: str
    target_hz: int
    doc: str = ""
    source: str = "pll"

    @property
    def target_mhz(self) -> float:
        return self.target_hz / 1e6


@dataclass(frozen=True)
class MarkerPins:
    """Connector pins that carry the markers: PPU ``n``'s marker ``i`` drives ``pins[k n + i]``.

    ``k`` is the profile's ``params.markers_per_ppu``.

    ``connector`` is a connector of the platform, as amaranth-boards names it (``("j", 1)``,
    ``("pmod", 0)``); ``pins`` are its pin names; ``io_type`` the ECP5 I/O standard.
    """

    connector: tuple[str, int]
    pins: tuple[str, ...]
    io_type: str = "LVCMOS33"
    doc: str = ""


@dataclass(frozen=True)
class BoardProfile:
    """One board the gateware is built for.

    Attributes
    ----------
    name : str
        The name ``qlink build --board`` takes.
    title : str
        The board's name for people.
    platform : type[LatticeECP5Platform]
        The amaranth-boards platform class.
    platform_kwargs : tuple[tuple[str, str], ...]
        Keyword arguments of the platform's constructor (ButterStick: the VCCIO voltages).
    params : QSCParams
        What the board's build keeps: PPUs, memory depths, clocks (``rti_clk_hz`` and
        ``dtd_clk_hz`` are the PLL's targets).
    clocks : tuple[ClockTarget, ...]
        Every clock domain of the board top, with its target (default: ``rti`` and ``dtd``
        from the PLL, ``eth_rx`` from the PHY). The report of a build lists each; a build fails
        when one misses its target.
    phy : int
        Index of the platform's ``eth_rgmii`` resource the MAC uses.
    markers : MarkerPins
        Where the markers go.
    cable : str | None
        openFPGALoader's cable for the board (the one amaranth-boards programs it with), or
        ``None`` where the board loads over USB DFU instead.
    dfu : tuple[int, int] | None
        USB vendor and product id of the board's DFU bootloader, where it has one.
    rgmii_rx_delay_ns, rgmii_tx_delay_ns : float
        RGMII clock-to-data skew the FPGA adds (ECP5 ``DELAYG``) on the receive data and on
        TXC; 0 where the PHY adds it (see :class:`~openqlink.gateware.mac.rgmii.RGMIIPort`).
    keeps : str
        One line on what this profile keeps of the default :class:`QSCParams` and why.
    placer : str
        nextpnr's placer that ``qlink build`` uses for the board unless told otherwise
        (``heap``, ``static``, ``sa``): the one that places its top best
        (``docs/benchmarks.md``).
    seed : int
        nextpnr's placer seed that ``qlink build`` starts from unless told otherwise: one
        that places the board's top within its clocks (nextpnr is deterministic for a given
        netlist, placer and seed).
    """

    name: str
    title: str
    platform: type[LatticeECP5Platform]
    params: QSCParams
    phy: int
    markers: MarkerPins
    keeps: str
    cable: str | None = None
    dfu: tuple[int, int] | None = None
    platform_kwargs: tuple[tuple[str, str], ...] = ()
    rgmii_rx_delay_ns: float = 2.0
    rgmii_tx_delay_ns: float = 2.0
    clocks: tuple[ClockTarget, ...] = field(default=())
    placer: str = "heap"
    seed: int = 1

    def __post_init__(self):
        if not self.clocks:
            object.__setattr__(self, "clocks", (
                ClockTarget("rti", self.params.rti_clk_hz,
                            "network core and MAC (RGMII TX byte clock)"),
                ClockTarget("dtd", self.params.dtd_clk_hz, "PPUs, timeline, qubit emulators"),
                ClockTarget("eth_rx", RGMII_RX_CLK_HZ, "MAC receive side (the PHY's RXC)",
                            source="phy"),
            ))
        needed = self.num_markers
        if len(self.markers.pins) < needed:
            raise ValueError(f"{self.name}: {self.params.num_ppus} PPUs need {needed} marker "
                             f"pins, the profile names {len(self.markers.pins)}")

    # -- derived from the platform ------------------------------------------------------------

    def make_platform(self) -> LatticeECP5Platform:
        """A new platform instance with the marker resource added."""
        plat = self.platform(**dict(self.platform_kwargs))
        plat.add_resources([self.marker_resource()])
        return plat

    def marker_resource(self) -> Resource:
        """The markers as one output resource (``qlink_marker`` 0) on the connector's pins."""
        n = self.num_markers
        return Resource(MARKER_RESOURCE, 0,
                        Pins(" ".join(self.markers.pins[:n]), dir="o",
                             conn=self.markers.connector),
                        Attrs(IO_TYPE=self.markers.io_type, DRIVE="8"))

    @property
    def num_markers(self) -> int:
        """Marker outputs of the board: ``num_ppus * markers_per_ppu``."""
        return self.params.num_ppus * self.params.markers_per_ppu

    @property
    def device(self) -> str:
        return self.platform.device

    @property
    def package(self) -> str:
        return self.platform.package

    @property
    def speed(self) -> str:
        return self.platform.speed

    @property
    def part(self) -> str:
        """The part as Lattice names it, e.g. ``LFE5U-25F-6BG256``."""
        return f"{self.device}-{self.speed}{self.package}"

    @property
    def clk_in(self) -> str:
        """The platform's oscillator resource the PLL runs from."""
        return self.platform.default_clk

    @property
    def clk_in_hz(self) -> float:
        """Its frequency, from the platform's resource."""
        plat = self.platform(**dict(self.platform_kwargs))
        return plat.lookup(self.clk_in, 0).clock.frequency

    @property
    def pll_clocks(self) -> tuple[ClockTarget, ...]:
        """The clocks the board top's PLL makes (CLKOP first)."""
        return tuple(c for c in self.clocks if c.source == "pll")

    def clock(self, domain: str) -> ClockTarget:
        for c in self.clocks:
            if c.domain == domain:
                return c
        raise KeyError(f"{self.name}: no clock domain {domain!r}")


def _params(**kwargs) -> QSCParams:
    # These boards have no converters: each PPU's qubit emulator takes the drive channel's
    # envelope (on resonance), so the build has no NCOs; nor a raw-trace memory (no logic
    # that the 125 MHz timing does not need).
    return QSCParams(rti_clk_hz=CLK_HZ, dtd_clk_hz=CLK_HZ, nco=False, trace_depth=0, **kwargs)


PROFILES: dict[str, BoardProfile] = {p.name: p for p in (
    BoardProfile(
        name="colorlight-5a-75b",
        title="Colorlight 5A-75B r7.0",
        platform=Colorlight_5A75B_R70Platform,
        params=_params(num_ppus=1, num_qps=1, imem_depth=512, env_depth=2048,
                       markers_per_ppu=2, timeline_bits=48, call_arg_bytes=4, alu=False),
        phy=0,
        markers=MarkerPins(("j", 1), ("1", "2", "3", "5", "6", "7"),
                           doc="HUB75 J1 R0 G0 B0 R1 G1 B1 (through the board's 74HC245 "
                               "output buffers, 5 V)"),
        keeps="1 PPU and its own QP alone (no extra QPs), with 2 markers, 512-instruction ring, "
              "2048-sample envelope memory, 48-bit timeline (wraps after 26 days at 125 MHz), "
              "CALLs of up to 4 argument bytes, no ALU (ADD of an immediate, LOOP and BRANCH "
              "remain): the 25F has 24k LUTs and 56 block RAMs",
        cable="ft232",
        rgmii_tx_delay_ns=0.0,
        placer="static",
    ),
    BoardProfile(
        name="ecpix5-85",
        title="LambdaConcept ECPIX-5 85F",
        platform=ECPIX585Platform,
        params=_params(num_ppus=2),
        phy=0,
        markers=MarkerPins(("pmod", 0), ("1", "2", "3", "4", "7", "8", "9", "10"),
                           doc="PMOD0, 3.3 V"),
        keeps="2 PPUs with the default 1024-instruction ring and 4096-sample envelopes, 4 QPs",
        cable="ft2232",
        rgmii_rx_delay_ns=0.0,
        placer="static",
    ),
    BoardProfile(
        name="butterstick",
        title="ButterStick r1.0 (85F)",
        platform=ButterStickPlatform,
        platform_kwargs=(("VCCIOA", "3V3"),),
        params=_params(num_ppus=2),
        phy=0,
        markers=MarkerPins(("syzygy", 0), tuple(f"S{i}" for i in range(16)),
                           doc="SYZYGY0 single-ended S0.., VIO0 set to 3.3 V by the board top"),
        keeps="2 PPUs with the default 1024-instruction ring and 4096-sample envelopes, 4 QPs",
        dfu=(0x1209, 0x5AF1),
        placer="static",
    ),
)}


def profile(name: str) -> BoardProfile:
    """The profile called ``name``; ``KeyError`` lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown board {name!r}; known: {', '.join(PROFILES)}") from None
