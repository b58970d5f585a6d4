"""The EHXPLLL divider search (openqlink.gateware.boards.pll) and the PLL component."""

import pytest
from amaranth.back import rtlil
from hypothesis import given, settings
from hypothesis import strategies as st

from openqlink.gateware.boards import ECP5PLL, PROFILES, ecp5_pll_config
from openqlink.gateware.boards import pll as pll_mod


def _check_invariants(config, targets):
    assert pll_mod.VCO_MIN_HZ <= config.vco_hz <= pll_mod.VCO_MAX_HZ
    assert pll_mod.PFD_MIN_HZ <= config.pfd_hz <= pll_mod.PFD_MAX_HZ
    op = config.outputs[0]
    assert config.vco_hz == pytest.approx(config.pfd_hz * config.clkfb_div * op.div)
    for out, (name, hz) in zip(config.outputs, targets, strict=True):
        assert out.name == name and out.target_hz == hz
        assert out.hz == pytest.approx(config.vco_hz / out.div)
        assert 1 <= out.div <= 128


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_board_gets_exact_125_mhz(name):
    prof = PROFILES[name]
    targets = [(c.domain, c.target_hz) for c in prof.pll_clocks]
    config = ecp5_pll_config(prof.clk_in_hz, targets)
    _check_invariants(config, targets)
    assert [o.hz for o in config.outputs] == [125e6, 125e6]
    assert [o.port for o in config.outputs] == ["CLKOP", "CLKOS"]


def test_colorlight_setting():
    config = ecp5_pll_config(25e6, [("rti", 125e6), ("dtd", 125e6)])
    assert (config.clki_div, config.clkfb_div, config.vco_hz) == (1, 5, 750e6)
    assert [(o.div, o.cphase, o.fphase) for o in config.outputs] == [(6, 2, 0), (6, 2, 0)]


def test_phase_shift_in_eighths_of_a_vco_cycle():
    config = ecp5_pll_config(25e6, [("a", 125e6), ("b", 125e6, 90)])
    # div 6: 90 degrees is 1.5 VCO cycles past the zero-phase CPHASE of 2.
    assert (config.output("b").cphase, config.output("b").fphase) == (3, 4)


@settings(max_examples=40, deadline=None)
@given(st.integers(8, 200).map(lambda mhz: mhz * 1e6),
       st.lists(st.integers(10, 300).map(lambda mhz: mhz * 1e6), min_size=1, max_size=4))
def test_search_keeps_every_limit_or_says_why_not(in_hz, outs):
    targets = [(f"o{i}", hz) for i, hz in enumerate(outs)]
    try:
        config = ecp5_pll_config(in_hz, targets, max_error_ppm=20_000)
    except ValueError as exc:
        assert "no EHXPLLL setting" in str(exc)
        return
    _check_invariants(config, targets)
    for out in config.outputs:
        assert out.error_ppm <= 20_000


@pytest.mark.parametrize("in_hz, outs, message", [
    (5e6, [("a", 125e6)], "PLL input 5 MHz is outside 8..400 MHz"),
    (25e6, [("a", 500e6)], "PLL output 'a' at 500 MHz is outside 3.125..400 MHz"),
    (25e6, [], "an EHXPLLL has 1..4 outputs, not 0"),
    (25e6, [(str(i), 100e6) for i in range(5)], "an EHXPLLL has 1..4 outputs, not 5"),
    (25e6, [("a", 100e6), ("a", 50e6)], "PLL output names must be unique"),
])
def test_bad_requests_raise(in_hz, outs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        ecp5_pll_config(in_hz, outs)


def test_unreachable_precision_names_the_best_setting():
    # The PFD must stay at 3.125 MHz or more, so CLKI_DIV <= 8 from 25 MHz: 25 * 5 / 1 is the
    # nearest (25 * 39 / 8 = 121.875 MHz is further).
    with pytest.raises(ValueError, match=r"no EHXPLLL setting within 1 ppm from 25 MHz: best "
                                         r"gives a 125 MHz \(12500 ppm off\)"):
        ecp5_pll_config(25e6, [("a", 123.456789e6)], max_error_ppm=1)


def test_pll_instance_carries_the_setting():
    config = ecp5_pll_config(30e6, [("rti", 125e6), ("dtd", 125e6)])
    text = rtlil.convert(ECP5PLL(config))
    for fragment in ("EHXPLLL", "CLKI_DIV", "CLKFB_DIV", "CLKOS_DIV", "FEEDBK_PATH",
                     "FREQUENCY_PIN_CLKI", '"30"', '"125"'):
        assert fragment in text, fragment
    assert config.clki_div == 6 and config.clkfb_div == 25
