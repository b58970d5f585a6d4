"""openqlink.gateware.mac.width: packet upsizer and downsizer, byte for byte, with random
valid/ready, and at full rate."""

import random

import pytest
from amaranth.sim import Simulator
from macbench import PacketCollector, random_frame, to_beats

from openqlink.gateware.mac.width import PacketDownsizer, PacketUpsizer


def run(dut, i_width, o_width, packets, *, valid_prob=1.0, ready_prob=1.0, seed=0,
        errors=None, max_cycles=20000):
    """Feed ``packets`` through ``dut``; return the collected packets and the transfer cycles."""
    rng = random.Random(seed)
    errors = errors or [0] * len(packets)
    beats = [b for p, e in zip(packets, errors, strict=True) for b in to_beats(p, i_width, error=e)]
    got = PacketCollector(o_width)
    in_cycles, out_cycles = [], []

    async def bench(ctx):
        n = 0
        for cycle in range(max_cycles):
            valid = n < len(beats) and rng.random() < valid_prob
            if valid:
                ctx.set(dut.i.payload, beats[n])
            ctx.set(dut.i.valid, valid)
            ready = rng.random() < ready_prob
            ctx.set(dut.o.ready, ready)
            i_ready = ctx.get(dut.i.ready)
            o_valid = ctx.get(dut.o.valid)
            if o_valid and ready:
                got.beat(ctx.get(dut.o.payload), cycle)
                out_cycles.append(cycle)
            await ctx.tick()
            if valid and i_ready:
                in_cycles.append(cycle)
                n += 1
            if n == len(beats) and len(got.packets) == len(packets):
                break

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    return got.packets, in_cycles, out_cycles


# Constructors that raise leave an Elaboratable behind, which Amaranth warns about when collected.
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")

LENGTHS = [1, 7, 8, 9, 15, 16, 17, 60, 64, 333]


@pytest.mark.parametrize(("valid_prob", "ready_prob"), [(1.0, 1.0), (0.7, 0.5), (0.3, 0.9)])
def test_upsizer_8_to_64(valid_prob, ready_prob):
    rng = random.Random(1)
    packets = [random_frame(rng, n) for n in LENGTHS]
    errors = [k % 2 for k in range(len(packets))]
    got, _, _ = run(PacketUpsizer(8, 64), 8, 64, packets, valid_prob=valid_prob,
                    ready_prob=ready_prob, errors=errors, seed=2)
    assert [p.data for p in got] == packets
    assert [p.error for p in got] == errors


@pytest.mark.parametrize(("valid_prob", "ready_prob"), [(1.0, 1.0), (0.7, 0.5), (0.3, 0.9)])
def test_downsizer_64_to_8(valid_prob, ready_prob):
    rng = random.Random(3)
    packets = [random_frame(rng, n) for n in LENGTHS]
    errors = [(k + 1) % 2 for k in range(len(packets))]
    got, _, _ = run(PacketDownsizer(64, 8), 64, 8, packets, valid_prob=valid_prob,
                    ready_prob=ready_prob, errors=errors, seed=4)
    assert [p.data for p in got] == packets
    assert [p.error for p in got] == errors


def test_upsizer_16_to_64_keeps_partial_lanes():
    rng = random.Random(5)
    packets = [random_frame(rng, n) for n in (2, 4, 6, 8, 10, 30)]
    got, _, _ = run(PacketUpsizer(16, 64), 16, 64, packets, valid_prob=0.8, ready_prob=0.8)
    assert [p.data for p in got] == packets


def test_downsizer_full_rate_without_bubbles():
    """With the source and sink always ready, a packet leaves one byte per cycle."""
    rng = random.Random(6)
    packets = [random_frame(rng, n) for n in (64, 61, 9)]
    got, _, out_cycles = run(PacketDownsizer(64, 8), 64, 8, packets)
    assert [p.data for p in got] == packets
    total = sum(len(p) for p in packets)
    assert out_cycles[-1] - out_cycles[0] == total - 1


def test_downsizer_ready_is_a_register():
    """``i.ready`` never follows ``o.ready`` within a cycle (the wide side's ready logic starts
    at a flip-flop), in any cycle of a stream; the bytes still arrive whole."""
    dut = PacketDownsizer(64, 8)
    packet = bytes(range(40))
    beats = to_beats(packet, 64)
    got = PacketCollector(8)

    async def bench(ctx):
        n = 0
        for cycle in range(200):
            if n < len(beats):
                ctx.set(dut.i.payload, beats[n])
            ctx.set(dut.i.valid, n < len(beats))
            seen = set()
            for o_ready in (0, 1):
                ctx.set(dut.o.ready, o_ready)
                seen.add(ctx.get(dut.i.ready))
            assert len(seen) == 1, f"cycle {cycle}: i.ready follows o.ready combinationally"
            i_ready = ctx.get(dut.i.ready)
            if ctx.get(dut.o.valid):
                got.beat(ctx.get(dut.o.payload), cycle)
            await ctx.tick()
            n += i_ready and n < len(beats)
        assert got.packets[0].data == packet

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()


def test_upsizer_latency_is_one_cycle():
    got, in_cycles, out_cycles = run(PacketUpsizer(8, 64), 8, 64, [bytes(range(16))])
    assert out_cycles == [in_cycles[7] + 1, in_cycles[15] + 1]


@pytest.mark.parametrize(("cls", "args", "message"), [
    (PacketUpsizer, (16, 40), r"wide width 40 must be a multiple of narrow width 16 \(> 1x\)"),
    (PacketUpsizer, (8, 8), r"wide width 8 must be a multiple of narrow width 8"),
    (PacketDownsizer, (64, 12), r"narrow width must be a positive multiple of 8 bits, not 12"),
])
def test_width_checks(cls, args, message):
    with pytest.raises(ValueError, match=message):
        cls(*args)


def test_downsizer_offers_a_beat_the_cycle_after_taking_it_and_takes_the_next_meanwhile():
    """A beat taken at edge n is offered from edge n on (lane 0), and while it is sent the
    other buffer takes the next beat: ``i.ready`` stays high until both are full, then falls
    (a register: at the edge after the second take)."""
    dut = PacketDownsizer(64, 8)
    beats = to_beats(bytes(range(24)), 64)

    async def bench(ctx):
        ctx.set(dut.o.ready, 0)                   # nothing leaves: the buffers fill
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, beats[0])
        assert ctx.get(dut.i.ready) and not ctx.get(dut.o.valid)
        await ctx.tick()                          # edge n: beat 0 taken
        assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload.data) == 0
        assert ctx.get(dut.o.payload.first)
        assert ctx.get(dut.i.ready)               # the other buffer is empty
        ctx.set(dut.i.payload, beats[1])
        await ctx.tick()                          # beat 1 taken
        assert not ctx.get(dut.i.ready)           # both full
        ctx.set(dut.i.payload, beats[2])
        await ctx.tick()
        assert not ctx.get(dut.i.ready) and ctx.get(dut.o.payload.data) == 0
        ctx.set(dut.o.ready, 1)
        for k in range(8):                        # beat 0 leaves, one byte per cycle
            assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload.data) == k
            await ctx.tick()
        assert ctx.get(dut.o.payload.data) == 8   # beat 1 follows without a bubble
        assert ctx.get(dut.i.ready)               # beat 0's buffer is free again

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
