"""The tests' reusable simulator (``simreuse``): each run starts from the state a new simulator
would, and a run that raised is never reused."""

import pytest
import simreuse
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib.memory import Memory


class Counter(Elaboratable):
    """A counter, a register the testbench sets, and a memory the testbench writes."""

    def __init__(self):
        self.count = Signal(16, init=3)
        self.reg = Signal(8, init=7)
        self.mem = Memory(shape=8, depth=4, init=[1, 2, 3, 4])
        self.addr = Signal(2)
        self.data = Signal(8)
        self.we = Signal()
        self.rdata = Signal(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = self.mem
        w = self.mem.write_port()
        r = self.mem.read_port(domain="comb")
        m.d.comb += [w.addr.eq(self.addr), w.data.eq(self.data), w.en.eq(self.we),
                     r.addr.eq(self.addr), self.rdata.eq(r.data)]
        m.d.sync += self.count.eq(self.count + 1)
        return m


def _observe(dut, seen: list):
    async def main(ctx):
        seen.append((ctx.get(dut.count), ctx.get(dut.reg),
                     [await _read(ctx, dut, a) for a in range(4)]))
        ctx.set(dut.reg, 99)
        ctx.set(dut.addr, 2)
        ctx.set(dut.data, 0xEE)
        ctx.set(dut.we, 1)
        for _ in range(10):
            await ctx.tick()
    return main


async def _read(ctx, dut, addr):
    ctx.set(dut.addr, addr)
    return ctx.get(dut.rdata)


def test_each_run_starts_from_the_initial_state():
    rsim = simreuse.ReusableSimulator(Counter(), clocks=1e-8, background=1)
    seen, ticks = [], []

    async def ticker(ctx):
        ticks.append(0)
        while True:
            await ctx.tick()
            ticks[-1] += 1

    for _ in range(3):
        rsim.run(_observe(rsim.dut, seen), ticker)
    assert seen == [(3, 7, [1, 2, 3, 4])] * 3
    assert ticks == [10, 10, 10]          # the background testbench restarted each run


def test_a_run_that_raised_is_not_reused():
    key = ("test_simreuse", object())
    rsim = simreuse.shared(key, Counter, clocks=1e-8)

    async def failing(ctx):
        await ctx.tick()
        raise AssertionError("in the testbench")

    with pytest.raises(AssertionError, match="in the testbench"):
        rsim.run(failing)
    with pytest.raises(RuntimeError, match="last run raised"):
        rsim.run(failing)
    again = simreuse.shared(key, Counter, clocks=1e-8)
    assert again is not rsim
    seen = []
    again.run(_observe(again.dut, seen))
    assert seen == [(3, 7, [1, 2, 3, 4])]
    assert simreuse.shared(key, Counter, clocks=1e-8) is again


def test_more_testbenches_than_room_is_an_error():
    rsim = simreuse.ReusableSimulator(Counter(), clocks=1e-8, background=1)

    async def nothing(ctx):
        pass

    with pytest.raises(ValueError, match="2 background testbenches, room for 1"):
        rsim.run(nothing, nothing, nothing)
    with pytest.raises(ValueError, match="1 processes, room for 0"):
        rsim.run(nothing, processes=(nothing,))
    rsim.run(nothing, nothing)
