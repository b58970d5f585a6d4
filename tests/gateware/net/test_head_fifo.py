"""openqlink.gateware.net.rx.HeadFIFO against amaranth.lib.fifo.SyncFIFO of the same depth:
the same outputs, cycle for cycle, under random writes (only while ``w_rdy``) and reads."""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib.fifo import SyncFIFO
from amaranth.sim import Simulator

from openqlink.gateware.net.rx import HeadFIFO


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("seed", [1, 2])
def test_same_outputs_as_syncfifo(depth, seed):
    m = Module()
    m.submodules.dut = dut = HeadFIFO(16, depth)
    m.submodules.ref = ref = SyncFIFO(width=16, depth=depth)
    rng = random.Random(seed)
    counts = {"written": 0, "read": 0}

    async def bench(ctx):
        k = 0
        for cycle in range(3000):
            # Bursts of writes and of reads, so that the FIFO fills and drains.
            phase = (cycle // 40) % 3
            w_prob, r_prob = [(0.9, 0.3), (0.3, 0.9), (0.7, 0.7)][phase]
            assert ctx.get(dut.w_rdy) == ctx.get(ref.w_rdy), f"cycle {cycle}: w_rdy"
            assert ctx.get(dut.r_rdy) == ctx.get(ref.r_rdy), f"cycle {cycle}: r_rdy"
            if ctx.get(ref.r_rdy):
                assert ctx.get(dut.r_data) == ctx.get(ref.r_data), f"cycle {cycle}: r_data"
            w_en = ctx.get(ref.w_rdy) and rng.random() < w_prob
            r_en = rng.random() < r_prob
            for fifo in (dut, ref):
                ctx.set(fifo.w_en, w_en)
                ctx.set(fifo.w_data, k)
                ctx.set(fifo.r_en, r_en)
            if w_en:
                k += 1
                counts["written"] += 1
            if r_en and ctx.get(ref.r_rdy):
                counts["read"] += 1
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    assert counts["written"] > 700 and counts["read"] > 700
