"""Tests of openqlink.gateware.net.timebase."""

import gc
import warnings

import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from openqlink.gateware.net.timebase import NS_PER_SECOND, Timebase


def _expected(cycles: int, clk_hz: int) -> int:
    return cycles * NS_PER_SECOND // clk_hz


def _run(clk_hz: int, cycles: int, fmt: int, dut: Timebase | None = None
         ) -> list[tuple[int, int]]:
    dut = dut or Timebase(clk_hz)
    seen: list[tuple[int, int]] = []

    async def testbench(ctx):
        ctx.set(dut.format, fmt)
        for _ in range(cycles):
            seen.append((ctx.get(dut.ns), ctx.get(dut.timestamp)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return seen


@pytest.mark.parametrize("clk_hz", [156_250_000, 250_000_000, 161_132_812, 100_000_007])
def test_ns_format_is_exact(clk_hz):
    seen = _run(clk_hz, 400, 0)
    for n, (ns, ts) in enumerate(seen):
        assert ns == _expected(n, clk_hz), n
        assert ts == ns


def test_156_25_mhz_period():
    tb = Timebase(156_250_000)
    assert (tb.period_whole_ns, tb.period_frac_num, tb.period_frac_den) == (6, 2, 5)
    seen = _run(156_250_000, 11, 0, tb)
    assert [ns for ns, _ in seen] == [0, 6, 12, 19, 25, 32, 38, 44, 51, 57, 64]


@pytest.mark.parametrize("clk_hz", [156_250_000, 3, 7, 1])
def test_seconds_nanoseconds_format(clk_hz):
    # slow clocks reach the seconds rollover within a few cycles
    seen = _run(clk_hz, 40, 1)
    rolled = False
    for n, (ns, ts) in enumerate(seen):
        total = _expected(n, clk_hz)
        assert ns == total
        assert ts >> 32 == total // NS_PER_SECOND, n
        assert ts & 0xFFFF_FFFF == total % NS_PER_SECOND, n
        rolled |= ts >> 32 > 0
    assert rolled == (clk_hz < 100)


def test_format_switches_at_run_time():
    dut = Timebase(3)

    async def testbench(ctx):
        for _ in range(5):
            await ctx.tick()
        ns = ctx.get(dut.ns)
        assert ns == 5 * NS_PER_SECOND // 3
        assert ctx.get(dut.timestamp) == ns
        ctx.set(dut.format, 1)
        assert ctx.get(dut.timestamp) == (1 << 32) | (ns - NS_PER_SECOND)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


def test_parameter_validation():
    # The half-built components warn UnusedElaboratable when collected: collect them here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(TypeError, match=r"^clk_hz must be an int, not 156250000\.0$"):
            Timebase(156250000.0)
        with pytest.raises(ValueError, match=r"^clk_hz must be positive, not 0$"):
            Timebase(0)
        gc.collect()
