"""Readout calibration in amaranth.sim: the I/Q registers of each readout channel and the
raw-trace capture of a window's ADC samples, through the PPU's bus (PPUCluster).

The ADC of channel ``c`` carries a fixed pseudo-random sequence of its absolute sample index
(``_adc``), so each test knows every sample a window saw from the window's start time.
"""

from __future__ import annotations

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator
from ppu_bench import (
    acquire,
    bus_read,
    bus_write,
    end,
    read32,
    read_reg,
    shared_cluster,
    upload,
    wait_state,
    write_reg,
)
from ppu_bench import trigger as bus_trigger
from test_ppu_nco import TURN, ReadoutModel

from openqlink.gateware.ppu.calib import ReadoutCalibration
from openqlink.isa.layout import PPUState
from openqlink.memory_map import QSCParams, ppu_reg, readout_reg, trace_addr

#: START_TIME relative to the trigger's write.
LEAD = 60
#: TRACE_STATUS bits.
ARMED, CAPTURING, DONE, FULL, REFUSED = (1 << i for i in range(5))


def _params(lanes: int = 1, nco: bool = False, readouts: int = 2, **kw) -> QSCParams:
    return QSCParams(num_ppus=1, imem_depth=64, env_depth=64, nco=nco, samples_per_cycle=lanes,
                     readouts_per_ppu=readouts, **kw)


def _adc(channel: int, n: int) -> int:
    """Channel ``channel``'s ADC sample number ``n`` (``S * now + lane``): signed 16 bits,
    negative (-25000..-5000), so that plain sums have their high bits set."""
    return (n * 7919 + channel * 104_729) % 20_001 - 25_000


def _window(channel: int, lanes: int, time: int, cycles: int) -> list[int]:
    """The samples a window of ``cycles`` from DTD cycle ``time`` integrates, in order."""
    return [_adc(channel, lanes * time + i) for i in range(lanes * cycles)]


def _iq(samples: list[int], nco: bool, phase: int = 0, freq_word: int = 0) -> tuple[int, int]:
    """The documented I and Q of a window (docs/isa.md, ACQUIRE)."""
    if nco:
        return ReadoutModel.window(samples, phase, freq_word)
    return sum(samples), 0


def _run(params: QSCParams, tb) -> None:
    """Run ``tb(ctx, dut)`` on a cluster in its initial state whose PPU 0's ADCs carry
    :func:`_adc`."""
    rsim = shared_cluster(params)
    dut = rsim.dut
    S, n = params.samples_per_cycle, params.readouts_per_ppu

    async def drive(ctx):
        ptd = dut.ptd[0]

        def put(now):
            for c in range(n):
                for k in range(S):
                    ctx.set(ptd.adc[S * c + k], _adc(c, S * now + k))
        put(0)
        async for _clk, _rst, now in ctx.tick().sample(dut.now):
            put(now + 1)

    async def testbench(ctx):
        await tb(ctx, dut)

    rsim.run(testbench, processes=(drive,))


async def _start(ctx, dut, prog: list[int]) -> int:
    await upload(ctx, dut, 0, prog)
    s = ctx.get(dut.now) + LEAD
    await bus_trigger(ctx, dut, 0, s, len(prog))
    return s


async def _read_iq(ctx, dut, channel: int) -> tuple[int, int, int]:
    """I, Q (signed, from LO then HI) and IQ_COUNT, as the host reads them."""
    regs = [await read32(ctx, dut, readout_reg(0, channel, name))
            for name in ("I_LO", "I_HI", "Q_LO", "Q_HI", "IQ_COUNT")]

    def s64(lo, hi):
        v = hi << 32 | lo
        return v - (1 << 64) if v >> 63 else v
    return s64(regs[0], regs[1]), s64(regs[2], regs[3]), regs[4]


async def _read_trace(ctx, dut, count: int) -> list[int]:
    out = []
    for w in range((count + 3) // 4):
        word, err = await bus_read(ctx, dut, trace_addr(0, 4 * w))
        assert not err
        for k in range(4):
            v = (word >> (16 * k)) & 0xFFFF
            out.append(v - 0x10000 if v & 0x8000 else v)
    return out


async def _wait_windows(ctx, dut, channel: int, count: int, limit_cycles: int = 2000):
    """Poll WINDOW_COUNT until ``count`` (a bound on the polling, not a timing check)."""
    start = ctx.get(dut.now)
    while await read32(ctx, dut, readout_reg(0, channel, "WINDOW_COUNT")) < count:
        assert ctx.get(dut.now) - start < limit_cycles, f"fewer than {count} windows"


# ---- I/Q registers --------------------------------------------------------------------------

@pytest.mark.parametrize("nco", [False, True])
@pytest.mark.parametrize("lanes", [1, 2])
def test_iq_registers_hold_each_channels_last_window(lanes, nco):
    """Two channels, three windows (two back to back on channel 0): each channel's registers
    hold its last window's documented I and Q and its count of windows."""
    params = _params(lanes, nco)
    f = round(0.07 * TURN)
    evs = [dict(channel=0, rd=1, offset=10, window=7, threshold=0, phase=0x1234, freq_word=f),
           dict(channel=1, rd=2, offset=12, window=5, threshold=0, phase=0x8000,
                freq_word=0x9000_0000),
           dict(channel=0, rd=3, offset=17, window=3, threshold=0, phase=0, freq_word=0)]
    got = {}

    async def tb(ctx, dut):
        got["s"] = await _start(ctx, dut, [acquire(**ev) for ev in evs] + [end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)
        for c in (0, 1):
            got[c] = await _read_iq(ctx, dut, c)
            got[c, "count"] = await read32(ctx, dut, readout_reg(0, c, "WINDOW_COUNT"))

    _run(params, tb)
    s = got["s"]
    for c, ev, count in ((0, evs[2], 2), (1, evs[1], 1)):
        samples = _window(c, lanes, s + ev["offset"], ev["window"])
        want = _iq(samples, nco, ev["phase"] if nco else 0, ev["freq_word"] if nco else 0)
        assert got[c] == (*want, count), c
        assert got[c, "count"] == count
    if not nco:
        assert got[0][0] < 0               # I_HI sign-extends (all ones)


def test_iq_snapshot_taken_by_i_lo_holds_across_a_new_window():
    """A read of I_LO latches I_HI, Q and IQ_COUNT: a window completing before they are read
    does not mix into them; WINDOW_COUNT counts live, and the next I_LO takes the new one."""
    params = _params(1, True, readouts=1)
    f = round(0.11 * TURN)
    evs = [dict(channel=0, rd=1, offset=10, window=6, threshold=0, phase=0x4000, freq_word=f),
           dict(channel=0, rd=2, offset=400, window=4, threshold=0, phase=0xC000,
                freq_word=f)]
    got = {}

    async def tb(ctx, dut):
        got["s"] = await _start(ctx, dut, [acquire(**ev) for ev in evs] + [end()])
        await _wait_windows(ctx, dut, 0, 1)
        lo = await read32(ctx, dut, readout_reg(0, 0, "I_LO"))
        await _wait_windows(ctx, dut, 0, 2)
        rest = [await read32(ctx, dut, readout_reg(0, 0, name))
                for name in ("I_HI", "Q_LO", "Q_HI", "IQ_COUNT", "WINDOW_COUNT")]
        got["first"] = (lo, *rest)
        got["second"] = await _read_iq(ctx, dut, 0)
        # A whole-word read of I_LO's word: I_LO and I_HI (sign-extended) of the live window.
        got["word"] = await bus_read(ctx, dut, readout_reg(0, 0, "I_LO"))

    _run(params, tb)
    s = got["s"]
    (i1, q1), (i2, q2) = (_iq(_window(0, 1, s + ev["offset"], ev["window"]), True, ev["phase"],
                              ev["freq_word"]) for ev in evs)
    assert (i1, q1) != (i2, q2)
    m = (1 << 32) - 1
    assert got["first"] == (i1 & m, (i1 >> 32) & m, q1 & m, (q1 >> 32) & m, 1, 2)
    assert got["second"] == (i2, q2, 2)
    assert got["word"] == (i2 & ((1 << 64) - 1), 0)


def test_calibration_unit_words_and_snapshot():
    """ReadoutCalibration alone: 40-bit values with bits above 32 (positive and negative)
    appear as LO and sign-extended HI; the snapshot holds until the next latch."""
    dut = ReadoutCalibration(n_readout=2, samples_per_cycle=1, trace_depth=0)
    vals = [(0x7F_1234_5678, -0x80_0000_0001 + 1), (-0x12_3456_789A, 0x05_0000_0000)]

    async def tb(ctx):
        for i, q in vals:
            ctx.set(dut.iq_valid, 0b10)
            ctx.set(dut.iq_i[1], i)
            ctx.set(dut.iq_q[1], q)
            await ctx.tick()
            ctx.set(dut.iq_valid, 0)
            ctx.set(dut.latch, 0b10)
            await ctx.tick()
            ctx.set(dut.latch, 0)
            mask = (1 << 64) - 1
            assert ctx.get(dut.words[1][0]) == i & mask
            assert ctx.get(dut.words[1][1]) == q & mask
            assert ctx.get(dut.words[1][2]) & 0xFFFF_FFFF == ctx.get(dut.words[1][2]) >> 32
            assert ctx.get(dut.i_hi_snap[1]) == (i >> 32) & 0xFFFF_FFFF
            assert ctx.get(dut.words[0][2]) == 0
        # A new window without a latch: live I changes, the snapshot does not.
        ctx.set(dut.iq_valid, 0b10)
        ctx.set(dut.iq_i[1], 5)
        ctx.set(dut.iq_q[1], 6)
        await ctx.tick()
        ctx.set(dut.iq_valid, 0)
        await ctx.tick()
        assert ctx.get(dut.words[1][0]) == 5
        assert ctx.get(dut.words[1][1]) == vals[-1][1] & ((1 << 64) - 1)
        assert ctx.get(dut.words[1][2]) == 3 << 32 | 2

    m = Module()
    m.submodules.dut = dut
    sim = Simulator(m)
    sim.add_clock(4e-9)
    sim.add_testbench(tb)
    sim.run()


# ---- Raw trace ------------------------------------------------------------------------------

@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_trace_records_the_armed_channels_next_window(lanes):
    """Armed for channel 1: channel 0's window is not recorded, channel 1's first window is,
    sample for sample in order, and the back-to-back window after it is not."""
    params = _params(lanes, False, trace_depth=64)
    W = 9
    got = {}

    async def tb(ctx, dut):
        assert await read_reg(ctx, dut, 0, "TRACE_STATUS") == 0
        assert await read_reg(ctx, dut, 0, "TRACE_DEPTH") == 64
        await write_reg(ctx, dut, 0, "TRACE_ARM", 1)
        assert await read_reg(ctx, dut, 0, "TRACE_STATUS") == ARMED | 1 << 8
        prog = [acquire(0, 1, 5, 4, 0), acquire(1, 2, 10, W, 0), acquire(1, 3, 10 + W, 2, 0),
                end()]
        got["s"] = await _start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        got["status"] = await read_reg(ctx, dut, 0, "TRACE_STATUS")
        got["count"] = await read_reg(ctx, dut, 0, "TRACE_COUNT")
        got["trace"] = await _read_trace(ctx, dut, 64)

    _run(params, tb)
    assert got["status"] == DONE | 1 << 8
    assert got["count"] == W * lanes
    want = _window(1, lanes, got["s"] + 10, W)
    assert got["trace"] == want + [0] * (64 - len(want))


def test_trace_stops_when_the_memory_is_full():
    params = _params(2, True, readouts=1, trace_depth=16)
    got = {}

    async def tb(ctx, dut):
        await write_reg(ctx, dut, 0, "TRACE_ARM", 0)
        got["s"] = await _start(ctx, dut, [acquire(0, 1, 10, 20, 0), end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)
        got["status"] = await read_reg(ctx, dut, 0, "TRACE_STATUS")
        got["count"] = await read_reg(ctx, dut, 0, "TRACE_COUNT")
        got["trace"] = await _read_trace(ctx, dut, 16)
        got["past"] = await bus_read(ctx, dut, trace_addr(0, 16))

    _run(params, tb)
    assert got["status"] == DONE | FULL
    assert got["count"] == 16
    assert got["trace"] == _window(0, 2, got["s"] + 10, 8)
    assert got["past"] == (0, 1)                   # past trace_depth: unmapped


def test_trace_arm_refuses_a_channel_the_build_lacks_and_rearming_restarts():
    params = _params(1, False, readouts=2, trace_depth=16)
    got = {}

    async def tb(ctx, dut):
        for value in (2, 0x10, 0xFFFF_FFFF):
            await write_reg(ctx, dut, 0, "TRACE_ARM", value)
            assert await read_reg(ctx, dut, 0, "TRACE_STATUS") == REFUSED, value
        await write_reg(ctx, dut, 0, "TRACE_ARM", 1)
        assert await read_reg(ctx, dut, 0, "TRACE_STATUS") == ARMED | 1 << 8
        await write_reg(ctx, dut, 0, "TRACE_ARM", 7)           # refused: still armed for 1
        assert await read_reg(ctx, dut, 0, "TRACE_STATUS") == ARMED | REFUSED | 1 << 8
        # A write of TRACE_ARM with one byte lane enabled is ignored.
        await bus_write(ctx, dut, ppu_reg(0, "TRACE_ARM") & ~7, 0, be=0x10)
        assert await read_reg(ctx, dut, 0, "TRACE_STATUS") == ARMED | REFUSED | 1 << 8
        s = await _start(ctx, dut, [acquire(1, 1, 10, 3, 0), end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)
        got["first"] = (await read_reg(ctx, dut, 0, "TRACE_STATUS"),
                        await read_reg(ctx, dut, 0, "TRACE_COUNT"),
                        await _read_trace(ctx, dut, 4))
        await write_reg(ctx, dut, 0, "TRACE_ARM", 0)
        got["rearmed"] = (await read_reg(ctx, dut, 0, "TRACE_STATUS"),
                          await read_reg(ctx, dut, 0, "TRACE_COUNT"))
        got["s"] = s

    _run(params, tb)
    assert got["first"] == (DONE | REFUSED | 1 << 8, 3, _window(1, 1, got["s"] + 10, 3) + [0])
    assert got["rearmed"] == (ARMED, 0)


def test_no_trace_and_readout_words_of_missing_channels_are_unmapped():
    """trace_depth=0: no trace memory (its words unmapped), TRACE_* read 0 and an arm does
    nothing; readout words of channels past the build's are unmapped, the fourth word of a
    channel reads 0."""
    params = _params(1, False, readouts=2, trace_depth=0)

    async def tb(ctx, dut):
        await write_reg(ctx, dut, 0, "TRACE_ARM", 0)
        for name in ("TRACE_STATUS", "TRACE_COUNT", "TRACE_DEPTH"):
            assert await read_reg(ctx, dut, 0, name) == 0, name
        assert await bus_read(ctx, dut, trace_addr(0)) == (0, 1)
        assert await bus_read(ctx, dut, readout_reg(0, 1, "I_LO") + 0x18) == (0, 0)
        assert await bus_read(ctx, dut, readout_reg(0, 2, "I_LO")) == (0, 1)
        assert await bus_read(ctx, dut, readout_reg(0, 15, "I_LO")) == (0, 1)

    _run(params, tb)
