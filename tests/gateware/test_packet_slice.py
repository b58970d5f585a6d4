"""openqlink.gateware.packet.RegisterSlice and PingPongSlice: every transfer once and in order
under random valid/ready, no bubbles at full rate, and ``i.ready`` a flip-flop."""

import random

import pytest
from amaranth.sim import Simulator

from openqlink.gateware.packet import PingPongSlice, RegisterSlice

SLICES = pytest.mark.parametrize("cls", [RegisterSlice, PingPongSlice])


def run(cls, valid_prob, ready_prob, n=300, seed=0):
    dut = cls(16)
    rng = random.Random(seed)
    sent, got, out_cycles = [], [], []

    async def bench(ctx):
        k = 0
        for cycle in range(20 * n):
            valid = k < n and rng.random() < valid_prob
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.i.payload, k)
            seen = set()
            for ready in (0, 1):
                ctx.set(dut.o.ready, ready)
                seen.add(ctx.get(dut.i.ready))
            assert len(seen) == 1, f"cycle {cycle}: i.ready follows o.ready"
            ready = rng.random() < ready_prob
            ctx.set(dut.o.ready, ready)
            i_ready = ctx.get(dut.i.ready)
            if ctx.get(dut.o.valid) and ready:
                got.append(ctx.get(dut.o.payload))
                out_cycles.append(cycle)
            await ctx.tick()
            if valid and i_ready:
                sent.append(k)
                k += 1
            if len(got) == n:
                break

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    return sent, got, out_cycles


@SLICES
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_in_order_under_random_backpressure(cls, seed):
    sent, got, _ = run(cls, 0.7, 0.5, seed=seed)
    assert got == sent == list(range(300))


@SLICES
def test_full_rate_without_bubbles(cls):
    _, got, out_cycles = run(cls, 1.0, 1.0)
    assert got == list(range(300))
    assert out_cycles == list(range(out_cycles[0], out_cycles[0] + 300))
    assert out_cycles[0] == 1            # latency 1 cycle
