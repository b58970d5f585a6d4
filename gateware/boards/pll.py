"""The ECP5 PLL (``EHXPLLL``): divider search from frequencies, and the PLL as a component.

# Ref: Lattice FPGA-TN-02200 "ECP5 and ECP5-5G sysCLOCK PLL/DLL Design and User Guide"
# (EHXPLLL ports and parameters, table of PLL frequency ranges); Lattice FPGA-DS-02012 ECP5
# data sheet, "sysCLOCK PLL Timing" (f_IN, f_PFD, f_VCO, f_OUT limits).

The PLL multiplies the phase-frequency-detector frequency ``f_in / CLKI_DIV`` by the feedback
divider; with the feedback taken from CLKOP (``FEEDBK_PATH = "CLKOP"``) the VCO runs at
``f_in / CLKI_DIV * CLKFB_DIV * CLKOP_DIV`` and every output ``x`` gives ``f_vco / CLKOx_DIV``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from amaranth.hdl import Const, Instance, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "PLLOutput", "PLLConfig", "ecp5_pll_config", "ECP5PLL",
    "VCO_MIN_HZ", "VCO_MAX_HZ", "PFD_MIN_HZ", "PFD_MAX_HZ", "IN_MIN_HZ", "IN_MAX_HZ",
    "OUT_MIN_HZ", "OUT_MAX_HZ", "MAX_OUTPUTS",
]

#: VCO range (data sheet: 400..800 MHz).
VCO_MIN_HZ, VCO_MAX_HZ = 400e6, 800e6
#: Phase-frequency detector input range (after CLKI_DIV).
PFD_MIN_HZ, PFD_MAX_HZ = 3.125e6, 400e6
#: CLKI input range.
IN_MIN_HZ, IN_MAX_HZ = 8e6, 400e6
#: Output range of CLKOP/CLKOS/CLKOS2/CLKOS3.
OUT_MIN_HZ, OUT_MAX_HZ = 3.125e6, 400e6
#: Outputs of one EHXPLLL: CLKOP (also the feedback), CLKOS, CLKOS2, CLKOS3.
MAX_OUTPUTS = 4

_PORTS = ("CLKOP", "CLKOS", "CLKOS2", "CLKOS3")
_CLKI_DIVS = range(1, 129)
_CLKFB_DIVS = range(1, 81)
_CLKO_DIVS = range(1, 129)


@dataclass(frozen=True)
class PLLOutput:
    """One PLL output as configured.

    ``port`` is the EHXPLLL port (CLKOP first), ``div`` its divider, ``cphase``/``fphase`` its
    coarse (VCO cycles) and fine (1/8 VCO cycle) phase settings, ``hz`` the frequency it gives.
    """

    name: str
    port: str
    target_hz: float
    hz: float
    div: int
    cphase: int
    fphase: int
    phase_deg: float

    @property
    def error_ppm(self) -> float:
        return abs(self.hz - self.target_hz) / self.target_hz * 1e6


@dataclass(frozen=True)
class PLLConfig:
    """A divider setting of the EHXPLLL found by :func:`ecp5_pll_config`."""

    in_hz: float
    clki_div: int
    clkfb_div: int
    vco_hz: float
    outputs: tuple[PLLOutput, ...]

    @property
    def pfd_hz(self) -> float:
        return self.in_hz / self.clki_div

    def output(self, name: str) -> PLLOutput:
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(f"no PLL output {name!r}")


def _phase_settings(div: int, phase_deg: float) -> tuple[int, int]:
    """CPHASE/FPHASE for a phase shift of ``phase_deg`` on an output divided by ``div``.

    Zero phase is ``CPHASE = (div - 1) // 2`` (the convention of Project Trellis' ``ecppll``,
    which nextpnr and Diamond accept); a shift adds ``phase / 360 * div`` VCO cycles, whole
    cycles to CPHASE and eighths to FPHASE.
    """
    eighths = round(phase_deg % 360 / 360 * div * 8)
    return (div - 1) // 2 + eighths // 8, eighths % 8


def ecp5_pll_config(in_hz: float, outputs: Sequence[tuple[str, float] | tuple[str, float, float]],
                    *, max_error_ppm: float = 100.0) -> PLLConfig:
    """Dividers of an EHXPLLL giving ``outputs`` from a ``in_hz`` reference.

    ``outputs`` is a sequence of ``(name, hz)`` or ``(name, hz, phase_deg)``; the first is
    CLKOP (the feedback output), the others CLKOS, CLKOS2, CLKOS3 in order.

    The search tries every ``CLKI_DIV`` (1..128) whose PFD frequency is in range, every
    ``CLKFB_DIV`` (1..80) and every ``CLKOP_DIV`` (1..128) whose VCO frequency is in
    400..800 MHz; for each, the other outputs take the divider nearest ``f_vco / hz``. It keeps
    the setting whose worst output error is smallest, and among equals the highest VCO
    frequency (less jitter), then the smallest ``CLKI_DIV``.

    Raises
    ------
    ValueError
        No output, more than four, a frequency out of range, or no setting within
        ``max_error_ppm`` of every target (the message names the best one found).
    """
    specs = [(o[0], float(o[1]), float(o[2]) if len(o) > 2 else 0.0) for o in outputs]
    if not 1 <= len(specs) <= MAX_OUTPUTS:
        raise ValueError(f"an EHXPLLL has 1..{MAX_OUTPUTS} outputs, not {len(specs)}")
    names = [s[0] for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"PLL output names must be unique, not {names}")
    if not IN_MIN_HZ <= in_hz <= IN_MAX_HZ:
        raise ValueError(f"PLL input {in_hz / 1e6:g} MHz is outside "
                         f"{IN_MIN_HZ / 1e6:g}..{IN_MAX_HZ / 1e6:g} MHz")
    for name, hz, _ in specs:
        if not OUT_MIN_HZ <= hz <= OUT_MAX_HZ:
            raise ValueError(f"PLL output {name!r} at {hz / 1e6:g} MHz is outside "
                             f"{OUT_MIN_HZ / 1e6:g}..{OUT_MAX_HZ / 1e6:g} MHz")

    best = None     # (worst error, -vco, clki_div), clki_div, clkfb_div, vco, divs
    op_hz = specs[0][1]
    for clki_div in _CLKI_DIVS:
        pfd = in_hz / clki_div
        if pfd < PFD_MIN_HZ:
            break
        if pfd > PFD_MAX_HZ:
            continue
        for clkfb_div in _CLKFB_DIVS:
            fop = pfd * clkfb_div
            if fop > OUT_MAX_HZ:
                break
            err_op = abs(fop - op_hz) / op_hz
            if best is not None and err_op > best[0][0]:
                continue
            for clkop_div in _CLKO_DIVS:
                vco = fop * clkop_div
                if vco < VCO_MIN_HZ:
                    continue
                if vco > VCO_MAX_HZ:
                    break
                divs = [clkop_div]
                worst = err_op
                for _, hz, _ in specs[1:]:
                    d = min(max(round(vco / hz), 1), _CLKO_DIVS[-1])
                    divs.append(d)
                    worst = max(worst, abs(vco / d - hz) / hz)
                key = (worst, -vco, clki_div)
                if best is None or key < best[0]:
                    best = (key, clki_div, clkfb_div, vco, divs)
    if best is None:
        raise ValueError(f"no EHXPLLL setting reaches a {VCO_MIN_HZ / 1e6:g}.."
                         f"{VCO_MAX_HZ / 1e6:g} MHz VCO from {in_hz / 1e6:g} MHz for "
                         f"{op_hz / 1e6:g} MHz")
    (worst, _, _), clki_div, clkfb_div, vco, divs = best
    outs = []
    for (name, hz, phase), port, div in zip(specs, _PORTS[:len(divs)], divs, strict=True):
        cphase, fphase = _phase_settings(div, phase)
        outs.append(PLLOutput(name, port, hz, vco / div, div, cphase, fphase, phase))
    config = PLLConfig(in_hz, clki_div, clkfb_div, vco, tuple(outs))
    if worst * 1e6 > max_error_ppm:
        got = ", ".join(f"{o.name} {o.hz / 1e6:.6g} MHz" for o in outs)
        raise ValueError(f"no EHXPLLL setting within {max_error_ppm:g} ppm from "
                         f"{in_hz / 1e6:g} MHz: best gives {got} "
                         f"({worst * 1e6:.0f} ppm off)")
    return config


class ECP5PLL(wiring.Component):
    """One EHXPLLL with its feedback on CLKOP, configured by :func:`ecp5_pll_config`.

    Members
    -------
    clk_in : In(1)
        The reference clock (a board oscillator pin, or a global clock net).
    clk : Out(1).array(len(config.outputs))
        The output clocks, in the order of ``config.outputs`` (CLKOP first). Undefined until
        ``locked``.
    locked : Out(1)
        The PLL's LOCK output; asynchronous to every clock. Hold each domain fed by the PLL in
        reset until it is high (:class:`amaranth.lib.cdc.ResetSynchronizer` on ``~locked``).
    """

    def __init__(self, config: PLLConfig):
        self.config = config
        super().__init__({
            "clk_in": In(1),
            "clk": Out(1).array(len(config.outputs)),
            "locked": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        params = dict(
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED",
            p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=c.clki_div, p_CLKFB_DIV=c.clkfb_div, p_FEEDBK_PATH="CLKOP",
            a_FREQUENCY_PIN_CLKI=_mhz(c.in_hz),
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            i_CLKI=self.clk_in, i_CLKFB=self.clk[0], i_RST=Const(0), i_STDBY=Const(0),
            i_PHASESEL0=Const(0), i_PHASESEL1=Const(0), i_PHASEDIR=Const(1),
            i_PHASESTEP=Const(1), i_PHASELOADREG=Const(1), i_PLLWAKESYNC=Const(0),
            i_ENCLKOP=Const(0), o_LOCK=self.locked,
        )
        for out, clk in zip(c.outputs, self.clk, strict=True):
            params[f"p_{out.port}_ENABLE"] = "ENABLED"
            params[f"p_{out.port}_DIV"] = out.div
            params[f"p_{out.port}_CPHASE"] = out.cphase
            params[f"p_{out.port}_FPHASE"] = out.fphase
            params[f"a_FREQUENCY_PIN_{out.port}"] = _mhz(out.hz)
            params[f"o_{out.port}"] = clk
        m.submodules.ehxplll = Instance("EHXPLLL", **params)
        return m


def _mhz(hz: float) -> str:
    """A frequency as nextpnr's FREQUENCY_PIN_* attributes take it (MHz, decimal)."""
    return f"{hz / 1e6:.6f}".rstrip("0").rstrip(".")
