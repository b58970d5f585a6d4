"""Board profiles and board tops: each elaborates on its amaranth-boards platform, fits its
package's pins, and the simulation top has the ports a bench drives."""

import re

import pytest
from amaranth.hdl import Fragment
from amaranth.lib import io

from openqlink.gateware.boards import PROFILES, BoardTop, VCCIOControl, profile, sim_verilog
from openqlink.gateware.boards.profiles import MARKER_RESOURCE, MarkerPins
from openqlink.memory_map import QSCParams

#: User I/O pins of each package (Lattice ECP5 family data sheet, pinout tables).
PACKAGE_IOS = {"BG256": 197, "BG381": 205, "BG554": 245}


@pytest.mark.parametrize("name", list(PROFILES))
def test_profile_basics(name):
    prof = PROFILES[name]
    assert prof.name == name
    assert {c.domain: c.target_mhz for c in prof.clocks} == {"rti": 125.0, "dtd": 125.0,
                                                              "eth_rx": 125.0}
    assert [c.domain for c in prof.pll_clocks] == ["rti", "dtd"]
    assert prof.params.rti_clk_hz == prof.params.dtd_clk_hz == 125_000_000
    assert len(prof.markers.pins) >= prof.num_markers
    assert prof.keeps and prof.title
    assert (prof.cable is None) != (prof.dfu is None)


def test_colorlight_is_the_25f():
    prof = profile("colorlight-5a-75b")
    assert (prof.device, prof.package, prof.speed) == ("LFE5U-25F", "BG256", "6")
    assert prof.part == "LFE5U-25F-6BG256" and prof.clk_in_hz == 25e6


def test_unknown_board_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown board 'ulx3s'; known: colorlight-5a-75b, "
                                       "ecpix5-85, butterstick"):
        profile("ulx3s")


def test_too_few_marker_pins_is_refused():
    prof = profile("colorlight-5a-75b")
    from dataclasses import replace
    with pytest.raises(ValueError, match="1 PPUs need 2 marker pins, the profile names 1"):
        replace(prof, markers=MarkerPins(("j", 1), ("1",)))
    ecpix5 = profile("ecpix5-85")
    with pytest.raises(ValueError, match="2 PPUs need 8 marker pins, the profile names 4"):
        replace(ecpix5, markers=MarkerPins(("pmod", 0), ("1", "2", "3", "4")))


def test_markers_per_ppu_and_timeline_bits_are_checked():
    with pytest.raises(ValueError, match="markers_per_ppu must be 1..16"):
        QSCParams(markers_per_ppu=0)
    with pytest.raises(ValueError, match="timeline_bits must be 40..64, not 32"):
        QSCParams(timeline_bits=32)
    assert profile("colorlight-5a-75b").params.timeline_wrap_s / 86400 == pytest.approx(26.06,
                                                                                     abs=0.01)


@pytest.mark.parametrize("name, pins", [
    ("colorlight-5a-75b", ["F3", "F1"]),      # HUB75 J1 pins 1 2 (2 markers)
    ("ecpix5-85", ["T25", "U25", "U24", "V24", "T26", "U26", "V26", "W26"]),   # PMOD0
    ("butterstick", ["G2", "J3", "F1", "K3", "J4", "K2", "J5", "J1"]),   # SYZYGY0 S0..S7
])
def test_markers_land_on_the_connector(name, pins):
    plat = PROFILES[name].make_platform()
    assert _pins(plat.request(MARKER_RESOURCE, 0, dir="-")) == pins


def _pins(requested) -> list[str]:
    """Package pins of what ``platform.request(..., dir="-")`` returned."""
    if isinstance(requested, io.SingleEndedPort):
        return [meta.name for meta in requested.io.metadata]
    if isinstance(requested, io.DifferentialPort):
        return _pins(requested.p) + _pins(requested.n)
    return [pin for value in vars(requested).values() if not isinstance(value, str)
            for pin in _pins(value)]


def test_board_top_puts_each_pll_domain_reset_on_a_global():
    """Each PLL domain's reset leaves its synchroniser through a DCCA (a global network): as
    fabric routing, a reset of thousands of flip-flops congests the 25F until it will not
    route."""
    prof = profile("colorlight-5a-75b")
    plat = prof.make_platform()
    text = plat.prepare(BoardTop(prof), name="top").files["top.il"]
    dccas = re.findall(r"cell \\DCCA .*?\n(.*?)\n  end", text, re.S)
    assert len(dccas) == len(prof.pll_clocks) == 2
    for body in dccas:
        assert re.search(r"connect \\CE 1'1", body)


@pytest.mark.parametrize("name", list(PROFILES))
def test_board_top_elaborates_and_fits_the_package(name):
    prof = PROFILES[name]
    plat = prof.make_platform()
    requested = []
    request = plat.request

    def recording_request(*args, **kwargs):
        requested.append(request(*args, **kwargs))
        return requested[-1]

    plat.request = recording_request
    Fragment.get(BoardTop(prof), plat)
    used = [pin for port in requested for pin in _pins(port)]
    assert len(used) == len(set(used)), "a pin is used twice"
    assert len(used) <= PACKAGE_IOS[prof.package]
    # the oscillator, RGMII (12 signals), the markers, and on the ButterStick VCCIO control
    assert len(used) >= 1 + 12 + prof.num_markers


def test_butterstick_vccio_duty_cycles():
    assert VCCIOControl.duty(3.3) == pytest.approx(0.0957, abs=1e-3)
    assert VCCIOControl.duty(1.8) == pytest.approx(0.672, abs=1e-3)
    with pytest.raises(ValueError, match="VCCIO 5.0 V needs a control voltage of -"):
        VCCIOControl.duty(5.0)


def test_sim_board_top_ports():
    text = sim_verilog(profile("colorlight-5a-75b"))
    ports = re.search(r"module board_top\((.*?)\);", text, re.S).group(1)
    assert {p.strip() for p in ports.split(",")} == {
        "rti_clk", "dtd_clk", "rti_arst", "dtd_arst", "rgmii_rx_clk", "rgmii_rxd",
        "rgmii_rx_ctl", "rgmii_tx_clk", "rgmii_txd", "rgmii_tx_ctl", "marker", "timeline"}
    assert re.search(r"output \[1:0\] marker;", text)
    for cell in ("EHXPLLL", "IDDRX1F", "ODDRX1F", "DELAYG"):
        assert cell not in text
