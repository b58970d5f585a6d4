"""A stand-in ECP5 toolchain for testing ``openqlink.build`` without minutes of place and route.

:func:`install_fake_tools` puts three small Python programs where ``YOSYS``, ``NEXTPNR_ECP5``
and ``ECPPACK`` point. They take the arguments the platform's build script gives the real tools
and write the files the real tools write; the nextpnr one writes a log in nextpnr-ecp5's format
(the lines below are copied from a real LFE5U-25F run of the board top) with the frequencies
asked for. The board top is replaced by :class:`TinyBoardTop` (the same PLL and domains, a
counter in each), so that elaboration takes a second.
"""

from __future__ import annotations

import sys
from pathlib import Path

from amaranth.hdl import ClockDomain, Elaboratable, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

from openqlink.gateware.boards import ECP5PLL, ecp5_pll_config
from openqlink.gateware.boards.profiles import MARKER_RESOURCE

#: Lines of nextpnr-ecp5's log, from a real build of the Colorlight board top.
NEXTPNR_LOG = """\
Info: constraining clock net 'clk25_0__io' to 25.00 MHz
Info: constraining clock net 'eth_rgmii_0__rx_clk__io' to 125.00 MHz

Info: Logic utilisation before packing:
Info:     Total LUT4s:     17173/24288    70%
Info:         logic LUTs:  12177/24288    50%
Info:         carry LUTs:   3292/24288    13%
Info:           RAM LUTs:   1136/ 3036    37%
Info:          RAMW LUTs:    568/ 6072     9%

Info:      Total DFFs:      8011/24288    32%

Info: Generating derived timing constraints...
Info:     Input frequency of PLL 'pll.ehxplll' is constrained to 25.0 MHz
Info:     Derived frequency constraint of 125.0 MHz for net mac.rti_clk
Info: Promoting globals...
Info:     promoting clock net mac.rti_clk to global network
Info:     promoting clock net marker_buf.dtd_clk to global network

Info: Device utilisation:
Info: \t          TRELLIS_IO:      15/    197     7%
Info: \t                DCCA:       2/     56     3%
Info: \t              DP16KD:      13/     56    23%
Info: \t          MULT18X18D:       2/     28     7%
Info: \t             EHXPLLL:       1/      2    50%
Info: \t          TRELLIS_FF:    8011/  24288    32%
Info: \t        TRELLIS_COMB:   17820/  24288    73%

Info: Max frequency for clock '$glbnet$mac.rti_clk': 71.04 MHz (FAIL at 125.00 MHz)
Info: Max frequency for clock '$glbnet$marker_buf.dtd_clk': 55.12 MHz (FAIL at 125.00 MHz)

Info: Routing complete.
Warning: Max frequency for clock              '$glbnet$mac.rti_clk': {rti} MHz \
({rti_verdict} at 125.00 MHz)
Warning: Max frequency for clock '$glbnet$marker_buf.dtd_clk': {dtd} MHz \
({dtd_verdict} at 125.00 MHz)
Info: Max frequency for clock                  '$glbnet$mac.eth_rx_clk': 149.79 MHz \
(PASS at 125.00 MHz)
"""


def nextpnr_log(rti_mhz: float, dtd_mhz: float) -> str:
    """:data:`NEXTPNR_LOG` with the post-routing frequencies of ``rti`` and ``dtd``."""
    return NEXTPNR_LOG.format(rti=f"{rti_mhz:.2f}", dtd=f"{dtd_mhz:.2f}",
                              rti_verdict="PASS" if rti_mhz >= 125 else "FAIL",
                              dtd_verdict="PASS" if dtd_mhz >= 125 else "FAIL")


class TinyBoardTop(Elaboratable):
    """The board top's clocking (PLL, one ResetSynchronizer per domain) with a counter in each
    domain driving the marker pins, instead of the QSC."""

    def __init__(self, profile):
        self.profile = profile

    def elaborate(self, platform):
        m = Module()
        prof = self.profile
        config = ecp5_pll_config(prof.clk_in_hz,
                                 [(c.domain, c.target_hz) for c in prof.pll_clocks])
        m.submodules.pll = pll = ECP5PLL(config)
        m.submodules.clk_buf = clk_buf = io.Buffer("i", platform.request(prof.clk_in, 0,
                                                                         dir="-"))
        m.d.comb += pll.clk_in.eq(clk_buf.i)
        outs = []
        for out, clk in zip(config.outputs, pll.clk, strict=True):
            cd = ClockDomain(out.name)
            m.domains += cd
            m.d.comb += cd.clk.eq(clk)
            m.submodules[f"rst_{out.name}"] = ResetSynchronizer(~pll.locked, domain=out.name)
            count = Signal(4, name=f"count_{out.name}")
            m.d[out.name] += count.eq(count + 1)
            outs.append(count)
        m.submodules.markers = markers = io.Buffer(
            "o", platform.request(MARKER_RESOURCE, 0, dir="-"))
        m.d.comb += markers.o.eq(outs[0] ^ outs[1])
        return m


_YOSYS = """
import sys
args = sys.argv[1:]
log = args[args.index("-l") + 1]
script = args[-1]
name = script.removesuffix(".ys")
open(log, "w").write("fake yosys\\n")
open(name + ".json", "w").write("{}\\n")
"""

_NEXTPNR = """
import os, sys, time
args = sys.argv[1:]
log = args[args.index("--log") + 1]
cfg = args[args.index("--textcfg") + 1]
seed = args[args.index("--seed") + 1]
assert "--timing-allow-fail" in args, args
src = os.environ["FAKE_NEXTPNR_LOG"]
bindir = os.path.dirname(src)
with open(os.path.join(bindir, "seeds"), "a") as f:
    f.write(seed + "\\n")
with open(os.path.join(bindir, "argv"), "a") as f:
    f.write(" ".join(args) + "\\n")
with open(os.path.join(bindir, f"nextpnr.seed{seed}.pid"), "w") as f:
    f.write(str(os.getpid()))
if os.path.exists(os.path.join(bindir, f"nextpnr.seed{seed}.log")):
    src = os.path.join(bindir, f"nextpnr.seed{seed}.log")
    time.sleep(float(open(os.path.join(bindir, f"nextpnr.seed{seed}.sleep")).read()))
text = open(src).read()
open(log, "w").write(text)
open(cfg, "w").write(".device LFE5U-25F seed " + seed + "\\n")
"""

_ECPPACK = """
import sys
args = sys.argv[1:]
open(args[args.index("--bit") + 1], "wb").write(b"\\xff\\x00fake bitstream")
open(args[args.index("--svf") + 1], "w").write("! fake\\n")
"""


def install_fake_tools(tmp_path: Path, monkeypatch, *, rti_mhz: float, dtd_mhz: float,
                       per_seed: dict[int, tuple[float, float, float]] | None = None) -> None:
    """Point the build at the stand-in tools and the tiny top; nextpnr reports the given
    post-routing frequencies, or for a seed in ``per_seed`` its ``(rti_mhz, dtd_mhz,
    seconds)`` after that many seconds. Each run's seed is appended to ``fake-tools/seeds``, its
    arguments (one line) to ``fake-tools/argv``."""
    import openqlink.gateware.boards as boards

    bindir = tmp_path / "fake-tools"
    bindir.mkdir()
    for var, name, body in (("YOSYS", "yosys", _YOSYS), ("NEXTPNR_ECP5", "nextpnr", _NEXTPNR),
                            ("ECPPACK", "ecppack", _ECPPACK)):
        path = bindir / f"fake-{name}"
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
        monkeypatch.setenv(var, str(path))
    log = bindir / "nextpnr.log"
    log.write_text(nextpnr_log(rti_mhz, dtd_mhz))
    monkeypatch.setenv("FAKE_NEXTPNR_LOG", str(log))
    for seed, (rti, dtd, seconds) in (per_seed or {}).items():
        (bindir / f"nextpnr.seed{seed}.log").write_text(nextpnr_log(rti, dtd))
        (bindir / f"nextpnr.seed{seed}.sleep").write_text(str(seconds))
    monkeypatch.setattr(boards, "BoardTop", TinyBoardTop)
