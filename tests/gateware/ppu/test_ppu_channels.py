"""Timed channels alone: fire cycle, late detection, overlap rules, flush."""

from __future__ import annotations

import gc
import warnings

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from openqlink.gateware.ppu.channels import (
    FIFO_DEPTH,
    DriveChannel,
    MarkerChannel,
    PTDSignature,
    ReadoutChannel,
    TimedQueue,
    readout_event,
)


def _run(dut, bench, *, drive_now: bool = True):
    """Simulate ``dut`` with ``now`` counting from 0; ``bench(ctx, rows)`` gets the samples."""
    m = Module()
    m.submodules.dut = dut
    if drive_now:
        m.d.sync += dut.now.eq(dut.now + 1)
    sim = Simulator(m)
    sim.add_clock(4e-9)

    async def testbench(ctx):
        await bench(ctx)

    sim.add_testbench(testbench)
    sim.run()


async def _push(ctx, dut, **payload):
    ctx.set(dut.event.payload, payload)
    ctx.set(dut.event.valid, 1)
    await ctx.tick().until(dut.event.ready)
    ctx.set(dut.event.valid, 0)


async def _collect(ctx, dut, signal, until_now: int) -> list[tuple[int, int, int]]:
    rows = []
    while True:
        _, _, now, value, late = await ctx.tick().sample(dut.now, signal, dut.late)
        rows.append((now, value, late))
        if now >= until_now:
            return rows


def test_marker_fires_exactly_and_later_event_wins():
    dut = MarkerChannel()

    async def bench(ctx):
        await _push(ctx, dut, time=20, duration_cycles=5)
        await _push(ctx, dut, time=22, duration_cycles=2)     # takes over at 22
        await _push(ctx, dut, time=30, duration_cycles=0)
        rows = await _collect(ctx, dut, dut.marker, 40)
        assert [n for n, v, _ in rows if v] == [20, 21, 22, 23]
        assert not any(late for *_, late in rows)
        assert ctx.get(dut.idle)

    _run(dut, bench)


def test_marker_late_event_is_dropped_not_played():
    dut = MarkerChannel()

    async def bench(ctx):
        await ctx.tick().repeat(10)
        await _push(ctx, dut, time=10, duration_cycles=3)     # pushed at now 10: too late
        rows = await _collect(ctx, dut, dut.marker, 20)
        assert [n for n, v, _ in rows if v] == []
        assert [n for n, _, late in rows if late] == [11]

    _run(dut, bench)


def test_flush_empties_the_fifo_and_quiets_outputs():
    dut = MarkerChannel()

    async def bench(ctx):
        for k in range(FIFO_DEPTH):
            await _push(ctx, dut, time=30 + 4 * k, duration_cycles=2)
        assert not ctx.get(dut.event.ready)                   # full: the core would stall
        await ctx.tick().until(dut.now == 30)   # now reads 31
        assert ctx.get(dut.marker)
        ctx.set(dut.flush, 1)
        await ctx.tick()
        ctx.set(dut.flush, 0)
        assert ctx.get(dut.idle) and not ctx.get(dut.marker)
        rows = await _collect(ctx, dut, dut.marker, 120)
        assert [n for n, v, _ in rows if v] == []

    _run(dut, bench)


def test_readout_back_to_back_and_overlap_is_late():
    dut = ReadoutChannel()

    async def bench(ctx):
        ctx.set(dut.adc[0], 3)
        await _push(ctx, dut, time=20, window_cycles=4, threshold=11, rd=5)
        await _push(ctx, dut, time=24, window_cycles=2, threshold=5, rd=6)
        await _push(ctx, dut, time=25, window_cycles=2, threshold=0, rd=7)  # overlaps
        results, windows, lates = [], [], []
        while ctx.get(dut.now) < 40:
            _, _, now, win, valid, rd, bit, late = await ctx.tick().sample(
                dut.now, dut.window, dut.result_valid, dut.result_rd, dut.result_bit, dut.late)
            if win:
                windows.append(now)
            if valid:
                results.append((now, rd, bit))
            if late:
                lates.append(now)
        assert windows == [20, 21, 22, 23, 24, 25]
        assert results == [(23, 5, 1), (25, 6, 1)]           # 12 > 11, 6 > 5
        assert lates == [24]

    _run(dut, bench)


def test_readout_one_cycle_windows_queued_deep():
    """Five one-cycle windows pushed at once: the third and later wait in the queue's RAM, and
    each still ends in the cycle it opens, with its register's one-hot ``result_hit``."""
    dut = ReadoutChannel()
    events = [(30 + k, k + 1, (0, 9)[k % 2]) for k in range(5)]   # time, rd, threshold

    async def bench(ctx):
        ctx.set(dut.adc[0], 3)
        for time, rd, threshold in events:
            await _push(ctx, dut, time=time, window_cycles=1, threshold=threshold, rd=rd)
        results = []
        while ctx.get(dut.now) < 45:
            _, _, now, valid, rd, bit, hit, late = await ctx.tick().sample(
                dut.now, dut.result_valid, dut.result_rd, dut.result_bit, dut.result_hit,
                dut.late)
            assert not late, now
            if valid:
                results.append((now, rd, bit, hit))
        assert results == [(time, rd, int(3 > threshold), 1 << rd)
                           for time, rd, threshold in events]

    _run(dut, bench)


def test_a_tag_of_another_width_is_an_error():
    """A tag wider than ``tag_bits`` (a shift by a signal grows its width) would move the
    fields its reader expects: elaboration refuses it."""
    from amaranth.back import rtlil
    from amaranth.hdl import Const

    def wide(event):
        return Const(1, 16) << event.rd                     # 31 bits

    _raises(ValueError, "tag gives 31 bits, not tag_bits=16",
            lambda: rtlil.convert(TimedQueue(readout_event(48), 1, tag=wide, tag_bits=16)))
    _raises(ValueError, "a tag needs tag_bits of at least 1, not 0",
            lambda: TimedQueue(readout_event(48), 1, tag=wide))


def test_drive_preemption_and_lead():
    dut = DriveChannel(16)
    env = [1000 * (i + 1) for i in range(16)]

    async def bench(ctx):
        await _push(ctx, dut, time=20, env_addr=0, env_len=6, amplitude=0x4000)
        await _push(ctx, dut, time=23, env_addr=8, env_len=2, amplitude=-0x8000)
        rows = []
        while ctx.get(dut.now) < 40:
            addr = ctx.get(dut.env_rd_addr)
            word = sum((env[4 * addr + k] & 0xFFFF) << (16 * k) for k in range(4))
            _, _, now, dac, active = await ctx.tick().sample(dut.now, dut.dac[0], dut.active)
            ctx.set(dut.env_rd_data, word)        # a 1-cycle-latency read port model
            ctx.set(dut.env_rd_min, sum(1 << i for i in range(8)
                                        if (word >> 8 * i) & 0xFF == (0x80 if i % 2 else 0)))
            if active:
                rows.append((now, dac))
        assert rows == [(20, 500), (21, 1000), (22, 1500), (23, -9000), (24, -10000)]
        assert DriveChannel.LEAD_CYCLES == 5

    _run(dut, bench)


def _raises(exc: type[Exception], match: str, build) -> None:
    """``build()`` raises ``exc``; the half-built component's "never used" warning is muted."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*created but never used")
        with pytest.raises(exc, match=match):
            build()
        gc.collect()


def test_parameter_errors():
    _raises(ValueError, r"n_marker must be an integer in 1\.\.16, not 17",
            lambda: PTDSignature(n_marker=17))
    for build in (lambda: PTDSignature(samples_per_cycle=3),
                  lambda: DriveChannel(16, samples_per_cycle=3),
                  lambda: ReadoutChannel(samples_per_cycle=8)):
        _raises(ValueError, "samples_per_cycle must be 1, 2 or 4, not [38]", build)
    _raises(ValueError, "env_depth must be a power of two >= 4, not 12", lambda: DriveChannel(12))
    assert PTDSignature(2, 1, 4) == PTDSignature(2, 1, 4) != PTDSignature(1, 1, 4)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_timed_queue_against_a_model(seed):
    """Random pushes (times from past to well ahead), pops of every due head and flushes: the
    head, ``valid``, ``on_time`` and ``past`` match a list in every cycle."""
    import random

    rng = random.Random(seed)
    lead = 4
    q = TimedQueue(readout_event(48), lead)
    m = Module()
    m.submodules.q = q
    m.d.sync += q.now.eq(q.now + 1)
    m.d.comb += q.pop.eq(q.due)
    sim = Simulator(m)
    sim.add_clock(4e-9)
    seen = {"on_time": 0, "past": 0, "full": 0}

    async def bench(ctx):
        model: list[int] = []
        for _ in range(3000):
            now = ctx.get(q.now)
            push = rng.random() < 0.5
            flush = rng.random() < 0.01
            time = max(0, now + lead + rng.randrange(-3, 40))
            ctx.set(q.event.valid, push)
            ctx.set(q.event.payload.time, time)
            ctx.set(q.flush, flush)
            due_time = now + lead
            assert ctx.get(q.valid) == bool(model)
            if model:
                assert ctx.get(q.head.time) == model[0]
                assert ctx.get(q.on_time) == (model[0] == due_time)
                assert ctx.get(q.past) == (model[0] < due_time)
                seen["on_time"] += model[0] == due_time
                seen["past"] += model[0] < due_time
            else:
                assert not ctx.get(q.on_time) and not ctx.get(q.past)
            seen["full"] += not ctx.get(q.event.ready)
            accepted = push and ctx.get(q.event.ready)
            if flush:
                model.clear()
            else:
                if model and model[0] <= due_time:
                    model.pop(0)
                if accepted:
                    model.append(time)
            await ctx.tick()

    sim.add_testbench(bench)
    sim.run()
    assert all(seen.values()), seen            # every case was reached


def _fire_cycles(kind: str, seed: int, *, lead_short: bool = False):
    """Push events of increasing times into a ``kind`` channel, each exactly its channel's
    lead ahead or more (random; ``lead_short``: the last one lead - 1 ahead, into an empty
    queue), at random pushes from every cycle to every fourth; returns (times, fired, late) as
    lists of cycles."""
    import random

    rng = random.Random(seed)
    dut = {"marker": MarkerChannel, "drive": lambda: DriveChannel(16),
           "readout": ReadoutChannel}[kind]()
    out = {"times": [], "fired": [], "late": []}
    fields = {"marker": {"duration_cycles": 1}, "drive": {"env_addr": 0, "env_len": 1,
                                                           "amplitude": 0x4000},
              "readout": {"window_cycles": 1, "threshold": 0, "rd": 1}}[kind]
    shown = {"marker": dut.marker if kind == "marker" else None,
             "drive": getattr(dut, "active", None), "readout": getattr(dut, "window", None)}[kind]

    async def watch(ctx):
        async for *_, now, fired, late in ctx.tick().sample(dut.now, shown, dut.late):
            for name, value in (("fired", fired), ("late", late)):
                if value:
                    out[name].append(now)

    async def bench(ctx):
        ctx.set(dut.env_rd_data, 0x1111) if kind == "drive" else None
        last = 0
        for k in range(60):
            await ctx.tick().repeat(rng.choice([1, 1, 2, 3, 4]))
            now = ctx.get(dut.now)      # the push below is taken in this cycle
            if not ctx.get(dut.event.ready):
                continue
            ahead = dut.LEAD_CYCLES + rng.choice([0, 0, 1, 2, 7])
            time = max(now + ahead, last + 1)
            if lead_short and k == 59:
                await ctx.tick().repeat(40)       # an empty queue
                now = ctx.get(dut.now)
                time = now + dut.LEAD_CYCLES - 1
            ctx.set(dut.event.payload, {"time": time, **fields})
            ctx.set(dut.event.valid, 1)
            await ctx.tick()
            ctx.set(dut.event.valid, 0)
            out["times"].append(time)
            last = time
        await ctx.tick().repeat(60)

    m = Module()
    m.submodules.dut = dut
    m.d.sync += dut.now.eq(dut.now + 1)
    sim = Simulator(m)
    sim.add_clock(4e-9)
    sim.add_process(watch)
    sim.add_testbench(bench)
    sim.run()
    return out


@pytest.mark.parametrize("kind", ["marker", "drive", "readout"])
@pytest.mark.parametrize("seed", [1, 2])
def test_lead_is_a_bound(kind, seed):
    """LATE only for an event closer than its channel's documented lead: events of increasing
    times, each pushed LEAD_CYCLES ahead of its time or more, at any pace, all fire on their
    cycle; one pushed LEAD_CYCLES - 1 ahead is LATE and never fires."""
    out = _fire_cycles(kind, seed)
    assert out["late"] == []
    assert out["fired"] == out["times"]
    short = _fire_cycles(kind, seed, lead_short=True)
    assert short["fired"] == short["times"][:-1]
    assert len(short["late"]) == 1
