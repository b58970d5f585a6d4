"""openqlink.gateware.mac.cdc.RxClockCrossing: frames cross from ``eth_rx`` to ``rti`` intact, and
a stalled reader makes frames end bad (never deliver wrong bytes as good)."""

import random

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator
from macbench import PacketCollector, random_frame, to_beats

from openqlink.gateware.mac.cdc import RxClockCrossing


def run(frames, *, ready_pattern, gap=20, rx_period=8.0, rti_period=8.0, depth=16):
    """Write ``frames`` a byte per ``eth_rx`` cycle (``gap`` idle cycles between them); read in
    ``rti`` with ``ready_pattern(cycle)``. Returns the packets read and the overflow count."""
    dut = RxClockCrossing(depth=depth)
    m = Module()
    m.domains.eth_rx = ClockDomain()
    m.domains.rti = ClockDomain()
    m.submodules.dut = dut
    got = PacketCollector(8)
    overflows = [0]
    done = [False]

    async def writer(ctx):
        for f in frames:
            for beat in to_beats(f, 8):
                ctx.set(dut.i.payload, beat)
                ctx.set(dut.i.valid, 1)
                await ctx.tick("eth_rx")
                overflows[0] += ctx.get(dut.overflow)
            ctx.set(dut.i.valid, 0)
            for _ in range(gap):
                await ctx.tick("eth_rx")
                overflows[0] += ctx.get(dut.overflow)
        for _ in range(100):
            await ctx.tick("eth_rx")
            overflows[0] += ctx.get(dut.overflow)
        done[0] = True

    async def reader(ctx):
        cycle = 0
        while not done[0]:
            ready = ready_pattern(cycle)
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                got.beat(ctx.get(dut.o.payload), cycle)
            await ctx.tick("rti")
            cycle += 1

    sim = Simulator(m)
    sim.add_clock(rx_period * 1e-9, domain="eth_rx")
    sim.add_clock(rti_period * 1e-9, domain="rti", phase=rti_period * 0.37e-9)
    sim.add_testbench(writer)
    sim.add_testbench(reader, background=True)
    sim.run()
    return got.packets, overflows[0]


@pytest.mark.parametrize("rti_period", [8.0, 7.9992])     # same clock; rti 100 ppm fast
def test_frames_cross_intact_at_line_rate(rti_period):
    rng = random.Random(1)
    frames = [random_frame(rng, n) for n in (60, 64, 1500, 61, 200)]
    packets, overflows = run(frames, ready_pattern=lambda c: True, gap=12,
                             rti_period=rti_period)
    assert [(p.data, p.error) for p in packets] == [(f, 0) for f in frames]
    assert overflows == 0


def test_rti_slower_by_100_ppm_still_loses_nothing():
    rng = random.Random(2)
    frames = [random_frame(rng, 1514) for _ in range(4)]
    packets, overflows = run(frames, ready_pattern=lambda c: True, gap=12, rti_period=8.0008)
    assert [(p.data, p.error) for p in packets] == [(f, 0) for f in frames]
    assert overflows == 0


def test_stalled_reader_cuts_frames_and_marks_them_bad():
    """The reader stalls for 300 cycles in the middle of the stream: the frame being received is
    cut off (ends with error), frames that find the FIFO full are dropped whole, and every frame
    delivered with error=0 is byte-exact."""
    rng = random.Random(3)
    frames = [random_frame(rng, 100) for _ in range(8)]
    packets, overflows = run(frames, ready_pattern=lambda c: not 150 <= c < 450, gap=12)
    good = [p.data for p in packets if not p.error]
    bad = [p for p in packets if p.error]
    assert overflows >= 2
    assert bad, "the frame cut off must be delivered with error set"
    assert all(g in frames for g in good)
    assert good == [f for f in frames if f in good]          # in order, none duplicated
    assert len(good) + overflows == len(frames)
    assert frames[-1] in good                                 # it recovers once the reader runs
    for p in bad:                                             # a cut frame is a prefix + abort
        assert any(f.startswith(p.data[:-1]) for f in frames)


def test_depth_is_checked():
    with pytest.raises(ValueError, match=r"depth must be a power of 2 and at least 4, not 12"):
        RxClockCrossing(depth=12)
