"""openqlink.gateware.cdc in amaranth.sim: CrossingFIFO with CrossingReset, and BusGuard.

Two domains ``w`` and ``r`` with unrelated periods; the ``r`` clock can be stopped. Each test
checks that what comes out is an in-order run of what went in, and that a reset of either side
empties the FIFO with nothing stale coming out afterwards.
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from openqlink.gateware.cdc import CrossingFIFO, CrossingReset
from openqlink.gateware.top import BUS_DROP_CYCLES, BusGuard

W_PERIOD = 6.4e-9
R_PERIOD = 4e-9


class Bench:
    def __init__(self, w_period: float = W_PERIOD, r_period: float = R_PERIOD):
        self.m = m = Module()
        self.cd_w = ClockDomain("w")
        self.cd_r = ClockDomain("r")
        m.domains += [self.cd_w, self.cd_r]
        m.submodules.rst = rst = CrossingReset("w", "r")
        m.submodules.fifo = self.fifo = fifo = CrossingFIFO(16, 8, w_domain="w", r_domain="r")
        m.d.comb += [
            fifo.w_clr.eq(rst.clr_a), fifo.w_hold.eq(rst.hold_a),
            fifo.r_clr.eq(rst.clr_b), fifo.r_hold.eq(rst.hold_b),
        ]
        self.w_period, self.r_period = w_period, r_period
        self.r_running = True
        self.reading = True
        self.received: list[int] = []
        self.rng = random.Random(5)

    async def r_clock(self, ctx):
        while True:
            await ctx.delay(self.r_period / 2)
            if self.r_running:
                ctx.set(self.cd_r.clk, ~ctx.get(self.cd_r.clk))

    async def reader(self, ctx):
        r = self.fifo.r
        while True:
            ready = self.reading and self.rng.random() < 0.7
            ctx.set(r.ready, ready)
            _, _, valid, payload = await ctx.tick("r").sample(r.valid, r.payload)
            if valid and ready:
                self.received.append(int(payload))

    async def write(self, ctx, values, bound: int = 200):
        w = self.fifo.w
        for v in values:
            ctx.set(w.valid, 1)
            ctx.set(w.payload, v)
            for _ in range(bound):
                _, _, ready = await ctx.tick("w").sample(w.ready)
                if ready:
                    break
            else:
                raise AssertionError(f"write of {v} not taken in {bound} cycles")
        ctx.set(w.valid, 0)

    async def wticks(self, ctx, n):
        for _ in range(n):
            await ctx.tick("w")

    def run(self, tb):
        sim = Simulator(self.m)
        sim.add_clock(self.w_period, domain="w")
        sim.add_testbench(self.r_clock, background=True)
        sim.add_testbench(self.reader, background=True)

        async def main(ctx):
            await self.wticks(ctx, 10)
            await tb(ctx, self)

        sim.add_testbench(main)
        sim.run()


@pytest.mark.parametrize("w_period,r_period", [(W_PERIOD, R_PERIOD), (R_PERIOD, W_PERIOD * 3)])
def test_in_order_through_two_clocks(w_period, r_period):
    async def tb(ctx, b):
        await b.write(ctx, range(200))
        await b.wticks(ctx, 200)
        assert b.received == list(range(200))

    Bench(w_period, r_period).run(tb)


def test_holds_its_depth_and_the_output_register_then_refuses():
    """With the reader idle, 8 entries fill the RAM and one the output register; the tenth
    is refused (the registered ``full`` never lets a write overfill), and all nine come out."""
    async def tb(ctx, b):
        b.reading = False
        await b.write(ctx, range(9))
        with pytest.raises(AssertionError, match="not taken"):
            await b.write(ctx, [9], bound=50)
        b.reading = True
        await b.write(ctx, [9])
        await b.wticks(ctx, 60)
        assert b.received == list(range(10))

    Bench().run(tb)


@pytest.mark.parametrize("side", ["w", "r"])
def test_reset_of_either_side_empties_it(side):
    async def tb(ctx, b):
        b.reading = False
        await b.write(ctx, range(1, 6))         # held in the FIFO: nobody reads
        await b.wticks(ctx, 10)
        cd = b.cd_w if side == "w" else b.cd_r
        ctx.set(cd.rst, 1)
        await b.wticks(ctx, 3)
        ctx.set(cd.rst, 0)
        b.reading = True
        await b.write(ctx, range(100, 110))
        await b.wticks(ctx, 40)
        assert b.received == list(range(100, 110))

    Bench().run(tb)


def test_write_side_held_while_read_clock_stopped_after_a_reset():
    async def tb(ctx, b):
        await b.write(ctx, range(4))
        await b.wticks(ctx, 20)
        assert b.received == [0, 1, 2, 3]
        b.r_running = False
        # before any reset, writes go in while there is room (8 entries), then are refused
        await b.write(ctx, range(10, 18))
        with pytest.raises(AssertionError, match="not taken"):
            await b.write(ctx, [18], bound=50)
        # a reset of the write side empties the FIFO, but the read side has not seen it: the
        # write side stays refused as long as the read clock is stopped
        ctx.set(b.cd_w.rst, 1)
        await b.wticks(ctx, 2)
        ctx.set(b.cd_w.rst, 0)
        await b.wticks(ctx, 50)
        assert not ctx.get(b.fifo.w.ready)
        b.r_running = True
        await b.write(ctx, [20, 21])
        await b.wticks(ctx, 30)
        assert b.received == [0, 1, 2, 3, 20, 21]

    Bench().run(tb)


def test_bus_guard_drops_after_the_bound_and_recovers():
    dut = BusGuard()

    async def tb(ctx):
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.o.ready, 0)
        for _ in range(BUS_DROP_CYCLES):
            assert not ctx.get(dut.i.ready) and ctx.get(dut.o.valid) and not ctx.get(dut.drop)
            await ctx.tick()
        dropped = 0
        for _ in range(5):                      # dropping: one command a cycle, none passed on
            assert ctx.get(dut.i.ready) and not ctx.get(dut.o.valid) and ctx.get(dut.drop)
            dropped += 1
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        await ctx.tick()
        assert not ctx.get(dut.drop)
        ctx.set(dut.i.valid, 1)
        assert ctx.get(dut.drop)                # still shut: still dropping
        ctx.set(dut.o.ready, 1)                 # the crossing takes commands again
        assert ctx.get(dut.i.ready) and not ctx.get(dut.o.valid)
        await ctx.tick()
        assert ctx.get(dut.o.valid) and ctx.get(dut.i.ready) and not ctx.get(dut.drop)

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(tb)
    sim.run()


def test_write_ready_is_a_register():
    """``w.ready`` never follows ``w_hold`` within a cycle (the producer's enable starts at a
    flip-flop next to the FIFO): it falls at the edge after ``w_hold`` rises and comes back at
    the edge after it falls."""
    fifo = CrossingFIFO(16, 8, w_domain="sync", r_domain="sync")

    async def bench(ctx):
        await ctx.tick().repeat(3)
        assert ctx.get(fifo.w.ready)
        ctx.set(fifo.w_hold, 1)
        assert ctx.get(fifo.w.ready), "w.ready follows w_hold combinationally"
        await ctx.tick()
        assert not ctx.get(fifo.w.ready)
        ctx.set(fifo.w_hold, 0)
        assert not ctx.get(fifo.w.ready)
        await ctx.tick()
        assert ctx.get(fifo.w.ready)

    sim = Simulator(fifo)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
