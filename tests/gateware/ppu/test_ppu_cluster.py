"""PPUCluster in amaranth.sim: trigger, timing, channels, scoreboard, CALL, errors, bus map."""

from __future__ import annotations

import gc
import random
import warnings

import pytest
from amaranth.back import rtlil
from ppu_bench import (
    NCO_PARAMS,
    PARAMS,
    Monitor,
    acquire,
    add,
    alu,
    barrier,
    branch,
    bus_commit,
    bus_read,
    bus_write,
    call,
    end,
    loop,
    make_sim,
    marker,
    nop,
    play,
    read_reg,
    send_response,
    set_,
    shared_cluster,
    status,
    sync,
    trigger,
    upload,
    upload_env,
    wait,
    wait_state,
    write_mailbox,
    write_reg,
)

from openqlink.gateware.ppu.channels import DriveChannel
from openqlink.gateware.ppu.cluster import PPUCluster
from openqlink.gateware.ppu.core import PPU
from openqlink.isa.layout import AluFunc, Cond, PPUState
from openqlink.memory_map import (
    ENV_OFFSET,
    GLOBAL_BASE,
    IMEM_OFFSET,
    MAILBOX_OFFSET,
    PPU_REGISTERS,
    REGS_OFFSET,
    QSCParams,
    ppu_base,
    ppu_reg,
)
from openqlink.wire.rpc import RESPONSE_MAGIC, Response, fnv1a32

#: START_TIME used by the tests, relative to the cycle the trigger is written.
LEAD = 60


def run(tb, *, params: QSCParams = PARAMS, adc=None, ppu: int = 0, **channels) -> Monitor:
    """Run ``tb(ctx, dut)`` on a cluster in its initial state; returns the PTD monitor of PPU
    ``ppu``."""
    rsim = shared_cluster(params, **channels)
    dut = rsim.dut
    mon = Monitor(dut, ppu, adc)

    async def testbench(ctx):
        await tb(ctx, dut)

    rsim.run(testbench, processes=(mon.process,))
    return mon


async def start(ctx, dut, prog: list[int], ppu: int = 0, lead: int = LEAD) -> int:
    """Upload ``prog`` and trigger it ``lead`` cycles from now; returns START_TIME."""
    await upload(ctx, dut, ppu, prog)
    s = ctx.get(dut.now) + lead
    await trigger(ctx, dut, ppu, s, len(prog))
    return s


def rel(cycles: list[int], s: int) -> list[int]:
    return [c - s for c in cycles]


# ---- Trigger and timing -----------------------------------------------------------------

def test_event_cycles_exact_and_done():
    out = {}

    async def tb(ctx, dut):
        prog = [marker(0, 5, 3), play(0, 7, 0, 4, 0x7FFF), acquire(0, 1, 2, 6, -1),
                wait(20), marker(3, 0, 1), play(0, 1, 0, 2, 0x7FFF), end()]
        await upload_env(ctx, dut, 0, [100, 200, 300, 400])
        s = out["s"] = await start(ctx, dut, prog)
        st = await status(ctx, dut, 0)
        assert st.state == PPUState.ARMED
        assert ctx.get(dut.now) < s
        await ctx.tick().until(dut.now == s)
        st = await status(ctx, dut, 0)   # read issued at now == s
        assert st.state == PPUState.RUNNING
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.late and not st.underflow
        assert await read_reg(ctx, dut, 0, "PC") == len(prog) - 1

    mon = run(tb)
    s = out["s"]
    assert rel(mon.cycles("marker", 0), s) == [5, 6, 7]
    assert rel(mon.cycles("marker", 3), s) == [20]
    assert rel(mon.cycles("active"), s) == [7, 8, 9, 10, 21, 22]
    assert rel(mon.cycles("window"), s) == [2, 3, 4, 5, 6, 7]
    assert [mon.value_at("dac", s + k) for k in (7, 8, 9, 10)] == [99, 199, 299, 399]


def test_sync_before_the_start_time_anchors_to_the_start_time():
    """A SYNC the core runs while ARMED must not let events fire before START_TIME."""
    out = {}

    async def tb(ctx, dut):
        out["s"] = await start(ctx, dut, [sync(10), marker(0, 0, 2), end()], lead=200)
        await wait_state(ctx, dut, 0, PPUState.DONE, limit_cycles=1000)

    mon = run(tb)
    assert rel(mon.cycles("marker", 0), out["s"]) == [10, 11]


#: Last ADC sample of an ACQUIRE -> the anchor (``now`` of the cycle it executes in) of a SYNC
#: that waits behind an ADD of the result: the scoreboard's and the pipeline's cycles.
SYNC_AFTER_RESULT_CYCLES = 6


def _sync_after_result(window: int, middle: list[int]) -> int:
    """Cycles from the last sample of an ACQUIRE's ``window`` (at offset 10) to the anchor of a
    ``sync 30`` (minus its 30) that follows an ADD of the result and then ``middle``: the
    cycle a MARKER at offset 0 after the SYNC fires. ``middle`` starts at index 2."""
    out = {}

    async def tb(ctx, dut):
        prog = [acquire(0, 1, 10, window, 0), add(2, 1, 0), *middle, sync(30),
                marker(0, 0, 1), end()]
        out["s"] = await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE, limit_cycles=1000)

    mon = run(tb, adc=lambda now: 5)
    (fired,) = rel(mon.cycles("marker", 0), out["s"])
    return fired - (10 + window - 1) - 30


@pytest.mark.parametrize("window", [5, 9])
def test_sync_while_running_anchors_to_the_cycle_it_executes(window):
    """SYNC after the start time: ``t = now + slack``, ``now`` the cycle it executes. The core
    reaches it once an ACQUIRE's result lands (an ADD waits for it), so a MARKER at offset 0
    after ``sync 30`` fires a fixed number of cycles after the window's last sample, plus 30,
    whatever the window."""
    # The same cycles whatever the window: the anchor follows the cycle the SYNC executes in.
    assert _sync_after_result(window, []) == SYNC_AFTER_RESULT_CYCLES


#: Cycles an instruction adds between the ADD and the SYNC of the program below: a NOP 2, a
#: BRANCH 4 (its condition is evaluated into a register), 5 when taken (its target passes
#: through the instruction memory's output register and is decoded first) and 3 more for the
#: instruction after a taken BRANCH's target (the fetch restarts there); an ALU instruction 5 (its
#: result is registered) and a LOOP as a BRANCH.
BRANCH_CYCLES = {"nop": 2, "not taken": 4, "taken": 5, "taken, then its target's next": 5 + 2 + 3,
                 "alu": 5, "loop taken": 5}


@pytest.mark.parametrize("case", list(BRANCH_CYCLES))
def test_branch_cycles(case):
    """The core's cycles for a BRANCH, measured like the SYNC anchor above: the instructions
    between the ADD that waits for a result and the SYNC delay the SYNC's anchor by their
    cycles. BRANCH targets are absolute: the instructions below start at index 2."""
    middle = {
        "nop": [nop()],
        "not taken": [branch(Cond.EQ, 0, 1, 3)],
        "taken": [branch(Cond.EQ, 0, 0, 3)],
        "taken, then its target's next": [branch(Cond.ALWAYS, 0, 0, 3), nop()],
        "alu": [alu(AluFunc.ADD, 3, 0, imm=1)],
        "loop taken": [loop(0, 3)],     # r0 reads 0: taken (0 != 1), the write dropped
    }[case]
    assert _sync_after_result(5, middle) - SYNC_AFTER_RESULT_CYCLES == BRANCH_CYCLES[case]


def test_determinism_two_runs_identical():
    prog = [marker(0, 3, 2), acquire(0, 2, 4, 8, 0), play(0, 5, 4, 6, -20000),
            wait(9), marker(1, 1, 4), play(0, 0, 0, 3, 12345), end()]
    rng = random.Random(1)
    env = [rng.randrange(-32768, 32768) for _ in range(16)]
    traces = []
    for lead in (LEAD, LEAD + 17):
        out = {}

        async def tb(ctx, dut, lead=lead, out=out):
            await upload_env(ctx, dut, 0, env)
            out["s"] = await start(ctx, dut, prog, lead=lead)
            await wait_state(ctx, dut, 0, PPUState.DONE)
            out["r2"] = await read_reg(ctx, dut, 0, "R2")
            await ctx.tick().until(dut.now == out["s"] + 40)

        mon = run(tb, adc=lambda n: 7)
        s = out["s"]
        traces.append(([(r["now"] - s, r["dac"], r["active"], r["window"], r["marker"])
                        for r in mon.rows if r["now"] >= s and r["now"] < s + 40], out["r2"]))
    assert traces[0] == traces[1]
    assert traces[0][1] == 1          # 8 x 7 > 0


def test_trigger_refused_busy_changes_nothing():
    out = {}

    async def tb(ctx, dut):
        prog = [marker(0, 10, 2), end()]
        s = out["s"] = await start(ctx, dut, prog)
        # A second trigger while ARMED: different tail and start time.
        await write_reg(ctx, dut, 0, "START_TIME_LO", s + 500)
        await write_reg(ctx, dut, 0, "TRIGGER", 7)
        st = await status(ctx, dut, 0)
        assert st.trigger_busy and not st.trigger_late
        assert st.state == PPUState.ARMED
        assert await read_reg(ctx, dut, 0, "TAIL") == 2
        await wait_state(ctx, dut, 0, PPUState.DONE)
        st = await status(ctx, dut, 0)     # sticky until the next accepted trigger
        assert st.trigger_busy
        # An accepted trigger clears the sticky bits.
        await trigger(ctx, dut, 0, ctx.get(dut.now) + LEAD, 2)
        st = await status(ctx, dut, 0)
        assert not st.trigger_busy and st.state == PPUState.ARMED
        out["s2"] = ctx.get(dut.now)
        await wait_state(ctx, dut, 0, PPUState.DONE)

    mon = run(tb)
    s = out["s"]
    first = [c for c in mon.cycles("marker", 0) if c < out["s2"]]
    assert rel(first, s) == [10, 11]


def test_trigger_refused_busy_while_running():
    async def tb(ctx, dut):
        prog = [marker(0, 200, 2), end()]
        s = await start(ctx, dut, prog, lead=20)
        await ctx.tick().until(dut.now == s + 5)
        assert (await status(ctx, dut, 0)).state == PPUState.RUNNING
        await trigger(ctx, dut, 0, s + 100, 1)
        st = await status(ctx, dut, 0)
        assert st.trigger_busy and st.state == PPUState.RUNNING
        assert await read_reg(ctx, dut, 0, "TAIL") == 2
        await wait_state(ctx, dut, 0, PPUState.DONE)

    run(tb)


def test_trigger_refused_late_changes_nothing():
    async def tb(ctx, dut):
        await upload(ctx, dut, 0, [marker(0, 0, 5), end()])
        await write_reg(ctx, dut, 0, "TAIL", 1)
        now = ctx.get(dut.now)
        await trigger(ctx, dut, 0, now, 2)      # START_TIME already passed when it lands
        st = await status(ctx, dut, 0)
        assert st.trigger_late and not st.trigger_busy
        assert st.state == PPUState.IDLE
        assert await read_reg(ctx, dut, 0, "TAIL") == 1
        assert await read_reg(ctx, dut, 0, "PC") == 0
        await ctx.tick().repeat(50)
        assert (await status(ctx, dut, 0)).state == PPUState.IDLE

    mon = run(tb)
    assert mon.cycles("marker") == []


def test_trigger_upload_check():
    """A TRIGGER with bit 31 set carries the upload's 64-bit word count (bits 30..16, mod
    2**15): counted are the ring's and the envelope memory's words written since the last
    accepted trigger (or the host's write of UPLOAD_WORDS). A count that does not match (a
    lost upload packet) refuses the trigger with trigger_incomplete and changes nothing else;
    a matching one runs; without bit 31 nothing is checked. A write right behind a TRIGGER
    counts for the next upload."""
    def value(tail, words):
        return tail | 1 << 31 | (words % 2**15) << 16

    async def tb(ctx, dut):
        await write_reg(ctx, dut, 0, "UPLOAD_WORDS", 0)
        prog = [set_(1, 1), end()]
        await upload(ctx, dut, 0, prog)                    # 4 words
        await upload_env(ctx, dut, 0, [1, 2, 3, 4, 5])     # 2 words
        assert await read_reg(ctx, dut, 0, "UPLOAD_WORDS") == 6
        s = ctx.get(dut.now) + 40
        await write_reg(ctx, dut, 0, "START_TIME_LO", s)
        await write_reg(ctx, dut, 0, "TRIGGER", value(2, 5))          # one word lost
        st = await status(ctx, dut, 0)
        assert st.trigger_incomplete and st.state == PPUState.IDLE
        assert await read_reg(ctx, dut, 0, "UPLOAD_WORDS") == 6      # nothing changed
        await write_reg(ctx, dut, 0, "TRIGGER", value(2, 6 + 2**15))  # mod 2**15: matches
        await upload(ctx, dut, 0, [set_(2, 2)], first=5)             # right behind it
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.trigger_incomplete and await read_reg(ctx, dut, 0, "R1") == 1
        assert await read_reg(ctx, dut, 0, "UPLOAD_WORDS") == 2
        await write_reg(ctx, dut, 0, "START_TIME_LO", ctx.get(dut.now) + 40)
        await write_reg(ctx, dut, 0, "TRIGGER", 2)                   # unchecked
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.trigger_incomplete
        assert await read_reg(ctx, dut, 0, "UPLOAD_WORDS") == 0

    run(tb)


def test_trigger_partial_write_ignored():
    async def tb(ctx, dut):
        await upload(ctx, dut, 0, [end()])
        await write_reg(ctx, dut, 0, "START_TIME_LO", ctx.get(dut.now) + 100)
        await bus_write(ctx, dut, ppu_reg(0, "TRIGGER"), 1, be=0x3)
        assert (await status(ctx, dut, 0)).state == PPUState.IDLE

    run(tb)


def test_trigger_clears_every_register():
    """r1..r15 read 0 after an accepted trigger, whatever the run before wrote into them (SET,
    ADD, an ACQUIRE result): through the bus, in BRANCH compares and as ADD's source."""
    async def tb(ctx, dut):
        first = [set_(i, 0x1000 * i + 3) for i in range(1, 14)]
        first += [add(14, 13, 1), acquire(0, 15, 5, 4, 0), add(1, 15, 0), end()]
        await start(ctx, dut, first)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R14") == 0xD004
        assert await read_reg(ctx, dut, 0, "R15") == 1          # the measurement
        # The second run: r15 counts the registers that do not compare equal to 0, then r13
        # takes r13 + 7.
        second = []
        for i in range(1, 15):
            here = len(second)
            second += [branch(Cond.EQ, i, 0, here + 2), add(15, 15, 1)]
        second += [add(13, 13, 7), end()]
        await start(ctx, dut, second)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        values = [await read_reg(ctx, dut, 0, f"R{i}") for i in range(16)]
        assert values == [0] * 13 + [7, 0, 0]

    run(tb, adc=lambda now: 1)


# ---- Channels -----------------------------------------------------------------------------

def _dac_model(env: int, amp: int) -> int:
    return max(-32768, min(32767, (env * amp) >> 15))


def test_envelope_times_amplitude():
    rng = random.Random(7)
    env = [rng.randrange(-32768, 32768) for _ in range(60)] + [-32768, 32767, -32768, 0]
    pulses = [(0, 20, 0x7FFF), (16, 12, -32768), (60, 8, -32768), (61, 7, 12345), (3, 5, 0)]
    out = {}

    async def tb(ctx, dut):
        await upload_env(ctx, dut, 0, env)
        prog = []
        for addr, length, amp in pulses:
            prog += [play(0, 0, addr, length, amp), wait(length + 3)]
        out["s"] = await start(ctx, dut, prog + [end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)

    mon = run(tb)
    s = out["s"]
    expected = {}
    t = 0
    for addr, length, amp in pulses:
        for k in range(length):
            expected[s + t + k] = _dac_model(env[(addr + k) % 64], amp)
        t += length + 3
    got = {r["now"]: r["dac"] for r in mon.rows if r["active"]}
    assert got == expected
    assert all(r["dac"] == 0 for r in mon.rows if not r["active"])
    assert _dac_model(-32768, -32768) == 32767 and got[s + 23 + 15] == 32767


def test_saturation_follows_byte_writes():
    """The drive channel's -1 * -1 saturation uses the stored "this byte is -32768's" bits:
    a sample made -32768 by a write of its low byte alone saturates (32767, not -32768), and
    one made -32767 from -32768 that way does not (32767 from -32767 * -32768, where a stale
    bit would give 32766)."""
    out = {}

    async def tb(ctx, dut):
        await upload_env(ctx, dut, 0, [0, -32768, -32768 + 0x12, 0])
        word = ppu_base(0) + ENV_OFFSET
        await bus_write(ctx, dut, word, 0x01 << 16, be=1 << 2)     # sample 1: 0x8001
        await bus_write(ctx, dut, word, 0x00 << 32, be=1 << 4)     # sample 2: 0x8000
        out["s"] = await start(ctx, dut, [play(0, 0, 1, 2, -32768), wait(5), end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)

    mon = run(tb)
    got = [r["dac"] for r in mon.rows if r["active"]]
    assert got == [_dac_model(-32767, -32768), _dac_model(-32768, -32768)] == [32767, 32767]


def test_acquire_threshold_with_driven_adc():
    out = {}

    def adc(now):
        s = out.get("s")
        if s is None:
            return 0
        return 300 if s + 10 <= now < s + 20 else -50

    async def tb(ctx, dut):
        prog = [
            acquire(0, 1, 10, 10, 2999),   # sum 3000 > 2999 -> 1
            acquire(0, 2, 20, 10, 2999),   # back to back: sum 10*-50 -> 0
            acquire(0, 3, 30, 4, -201),    # -200 > -201 -> 1
            acquire(0, 4, 34, 4, -200),    # -200 > -200 -> 0
            acquire(0, 0, 40, 3, 0),       # r0 stays 0
            end(),
        ]
        await upload(ctx, dut, 0, prog)
        s = ctx.get(dut.now) + LEAD
        out["s"] = s
        await trigger(ctx, dut, 0, s, len(prog))
        await wait_state(ctx, dut, 0, PPUState.DONE)
        out["r"] = [await read_reg(ctx, dut, 0, f"R{i}") for i in range(5)]

    mon = run(tb, adc=adc)
    s = out["s"]
    assert out["r"] == [0, 1, 0, 1, 0]
    assert rel(mon.cycles("window"), s) == list(range(10, 38)) + [40, 41, 42]


def test_scoreboard_stall_branch_uses_measurement():
    out = {}

    async def tb(ctx, dut):
        prog = [
            acquire(0, 1, 5, 50, 0),          # 0: r1 <- (sum > 0) at s + 55
            branch(Cond.EQ, 1, 1, 4),         # 1: stalls until r1 lands
            marker(1, 0, 1),                  # 2: not measured 1
            end(),                            # 3
            sync(20),                         # 4: measured 1: re-anchor and mark
            marker(0, 0, 1),                  # 5
            end(),                            # 6
        ]
        s = out["s"] = await start(ctx, dut, prog)
        await ctx.tick().until(dut.now == s + 30)
        assert await read_reg(ctx, dut, 0, "PC") == 1     # stalled on the BRANCH
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.late
        assert await read_reg(ctx, dut, 0, "R1") == 1
        assert await read_reg(ctx, dut, 0, "PC") == 6

    mon = run(tb, adc=lambda now: 1)
    s = out["s"]
    assert mon.cycles("marker", 1) == []
    (m0,) = mon.cycles("marker", 0)
    # The result lands at s + 55; the branch and SYNC follow within a few cycles.
    assert s + 55 + 20 <= m0 <= s + 55 + 20 + 8


@pytest.mark.parametrize("first, second", [(0, 1), (1, 0)])
def test_scoreboard_branch_waits_for_the_last_of_two_results(first, second):
    """Two ACQUIREs into r1: the BRANCH waits for both and decides on the second's bit, not on
    the first's, even when the second lands right after the first."""
    out = {}

    def adc(now):
        s = out.get("s")
        if s is None:
            return 0
        return 1 if (first if now < s + 12 else second) else -1

    async def tb(ctx, dut):
        prog = [
            acquire(0, 1, 10, 2, 0),          # 0: r1 <- first at s + 12
            acquire(0, 1, 12, 2, 0),          # 1: r1 <- second at s + 14
            branch(Cond.EQ, 1, 1, 6),         # 2: stalls until both land
            sync(10),                         # 3: r1 is 0
            marker(1, 0, 1),                  # 4
            end(),                            # 5
            sync(10),                         # 6: r1 is 1
            marker(0, 0, 1),                  # 7
            end(),                            # 8
        ]
        await upload(ctx, dut, 0, prog)
        s = out["s"] = ctx.get(dut.now) + LEAD
        await trigger(ctx, dut, 0, s, len(prog))
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.late
        assert await read_reg(ctx, dut, 0, "R1") == second

    mon = run(tb, adc=adc)
    assert len(mon.cycles("marker", 0 if second else 1)) == 1
    assert mon.cycles("marker", 1 if second else 0) == []


@pytest.mark.parametrize("window", [20, 1])
def test_scoreboard_add_waits_for_result(window):
    """The ADD reads the ACQUIRE's result; a one-cycle window ends in the cycle it opens."""
    async def tb(ctx, dut):
        prog = [set_(1, 41), acquire(0, 1, 3, window, 0), add(2, 1, 10), end()]
        await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R2") == 11      # 1 + 10, not 41 + 10

    run(tb, adc=lambda now: 5)


# ---- Errors ---------------------------------------------------------------------------------

def test_underflow():
    async def tb(ctx, dut):
        await start(ctx, dut, [nop(), marker(0, 40, 5), nop()])
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.underflow and not st.late
        assert await read_reg(ctx, dut, 0, "PC") == 3

    mon = run(tb)
    assert mon.cycles("marker") == []


@pytest.mark.parametrize("way", ["sequential", "taken_branch", "empty_trigger"])
def test_nothing_at_or_past_tail_runs(way):
    """A slot at TAIL holds an instruction written but not committed: a run that reaches TAIL
    (by falling through, by a taken branch whose successor is TAIL, or from a TRIGGER whose
    TAIL is 0) ends in UNDERFLOW, and that instruction never runs."""
    stale = set_(2, 77)
    progs = {
        "sequential": [set_(1, 1), set_(3, 3)],
        "taken_branch": [branch(Cond.ALWAYS, 0, 0, 2), set_(2, 66), set_(1, 1)],
        "empty_trigger": [],
    }

    async def tb(ctx, dut):
        prog = progs[way]
        await upload(ctx, dut, 0, [stale, stale], first=len(prog))
        await start(ctx, dut, prog)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.underflow and not st.illegal_instruction
        assert await read_reg(ctx, dut, 0, "PC") == len(prog)
        assert await read_reg(ctx, dut, 0, "R2") == 0
        if prog:
            assert await read_reg(ctx, dut, 0, "R1") == 1

    run(tb)


def test_run_wraps_the_ring_and_stops_at_tail_0():
    """A run through the ring's last slot wraps to slot 0, and stops there when TAIL is 0 (the
    ring committed up to its end by an append): UNDERFLOW, slot 0 is not run again."""
    depth = PARAMS.imem_depth

    async def tb(ctx, dut):
        await upload(ctx, dut, 0, [set_(5, 5), set_(6, 6)], first=depth - 2)
        # The ADD stalls ~110 cycles while the host appends up to the ring's end.
        s = await start(ctx, dut, [acquire(0, 1, 10, 100, 0), add(2, 1, 0),
                                   branch(Cond.ALWAYS, 0, 0, depth - 2)])
        await ctx.tick().until(dut.now == s + 20)
        assert await read_reg(ctx, dut, 0, "PC") == 1
        # Slot 0 is released (HEAD 1), so the ring up to its end can be committed (TAIL 0).
        await write_reg(ctx, dut, 0, "HEAD", 1)
        await write_reg(ctx, dut, 0, "TAIL", 0)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.underflow and not st.illegal_instruction and not st.late
        assert await read_reg(ctx, dut, 0, "PC") == 0
        assert [await read_reg(ctx, dut, 0, f"R{i}") for i in (5, 6)] == [5, 6]

    mon = run(tb)
    assert len(mon.cycles("window")) == 100      # the ACQUIRE in slot 0 ran once


@pytest.mark.parametrize("case", ["beyond_tail", "far_beyond_tail", "before_head"])
def test_a_fetch_outside_the_committed_range_underflows(case):
    """A branch to a slot outside HEAD .. TAIL - 1 (a stale instruction sits there, written but
    never committed, or released by the host) stops the PPU with UNDERFLOW; the slot never
    runs. Loops inside the range run (``test_branch_loop``)."""
    depth = PARAMS.imem_depth
    stale = [set_(2, 77), marker(0, 50, 5)]
    target = {"beyond_tail": 40, "far_beyond_tail": depth - 2, "before_head": 0}[case]

    async def tb(ctx, dut):
        await upload(ctx, dut, 0, stale, first=depth - 2)
        await upload(ctx, dut, 0, stale, first=40)
        prog = [set_(5, 1), acquire(0, 1, 10, 300, 0), add(3, 1, 0), set_(1, 1),
                branch(Cond.ALWAYS, 0, 0, target), end()]
        s = await start(ctx, dut, prog)
        if case == "before_head":
            await ctx.tick().until(dut.now == s + 20)
            assert await read_reg(ctx, dut, 0, "PC") == 2    # the ADD waits for r1
            await write_reg(ctx, dut, 0, "HEAD", 2)      # slots 0 and 1 released
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.underflow and not st.illegal_instruction and not st.late
        assert await read_reg(ctx, dut, 0, "PC") == target
        assert await read_reg(ctx, dut, 0, "R1") == 1
        assert await read_reg(ctx, dut, 0, "R2") == 0

    mon = run(tb)
    assert mon.cycles("marker") == []


def test_head_release_and_sequential_fetch():
    """With HEAD moved past the instructions still to run, the run stops with UNDERFLOW at the
    latest when it needs one it has not fetched: it never runs released slots."""
    async def tb(ctx, dut):
        prog = [acquire(0, 1, 10, 300, 0), add(3, 1, 0)] + [set_(4, k) for k in range(1, 9)]
        prog.append(end())
        s = await start(ctx, dut, prog)
        await ctx.tick().until(dut.now == s + 20)
        assert await read_reg(ctx, dut, 0, "PC") == 1    # the ADD waits for r1
        await write_reg(ctx, dut, 0, "HEAD", 9)      # slots 0..8 released
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.underflow
        assert await read_reg(ctx, dut, 0, "R4") < 8

    run(tb)


def test_writes_into_the_committed_range_while_running_are_refused():
    """While ARMED or RUNNING, a bus write into HEAD .. TAIL - 1 is refused and counted
    (IMEM_WRITES_REFUSED, one per 64-bit word): the run executes what was committed. Appends
    (slots at and past TAIL) land; once the run is DONE, every slot is writable again."""
    async def tb(ctx, dut):
        prog = [acquire(0, 1, 10, 300, 0), add(3, 1, 0), set_(2, 5), end()]
        await start(ctx, dut, prog)     # the upload below follows the TRIGGER at once
        await upload(ctx, dut, 0, [set_(2, 99)], first=2)          # committed: refused
        assert await read_reg(ctx, dut, 0, "IMEM_WRITES_REFUSED") == 2
        await upload(ctx, dut, 0, [set_(6, 6), end()], first=4)     # past TAIL: lands
        await write_reg(ctx, dut, 0, "TAIL", 6)
        await upload(ctx, dut, 0, [set_(2, 98)], first=3)          # END, committed: refused
        assert await read_reg(ctx, dut, 0, "IMEM_WRITES_REFUSED") == 4
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R2") == 5
        assert await read_reg(ctx, dut, 0, "R6") == 0               # after the END
        await upload(ctx, dut, 0, [set_(2, 7), set_(6, 6)], first=2)  # DONE: lands
        assert await read_reg(ctx, dut, 0, "IMEM_WRITES_REFUSED") == 4
        await start(ctx, dut, [acquire(0, 1, 10, 2, 0), add(3, 1, 0), set_(2, 7), set_(6, 6),
                               end()])
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.underflow
        assert [await read_reg(ctx, dut, 0, r) for r in ("R2", "R6")] == [7, 6]

    run(tb)


def test_late_event_quiets_outputs_at_once():
    out = {}

    async def tb(ctx, dut):
        await upload_env(ctx, dut, 0, [1000] * 64)
        prog = [play(0, 0, 0, 64, 0x7FFF), marker(2, 0, 60), acquire(0, 1, 0, 30, 0),
                add(2, 1, 0),                 # stalls until s + 30
                sync(0), marker(1, 0, 1),     # an event for "now": late when it reaches
                end()]
        out["s"] = await start(ctx, dut, prog)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.late and not st.underflow
        assert await read_reg(ctx, dut, 0, "LATE_EVENTS") == 1

    mon = run(tb)
    s = out["s"]
    (stop,) = [r["now"] for r in mon.rows
               if r["now"] > s and r["active"] == 0 and mon.value_at("active", r["now"] - 1)]
    assert s + 30 < stop < s + 45       # result, ADD, SYNC, MARKER queued, LATE, flush
    assert mon.cycles("marker", 1) == []
    for r in mon.rows:
        if r["now"] >= stop:
            assert (r["dac"], r["active"], r["window"], r["marker"]) == (0, 0, 0, 0)
        elif r["now"] >= s:
            assert (r["dac"], r["active"], r["marker"]) == (999, 1, 0b100)
            assert r["window"] == (r["now"] < s + 30)


@pytest.mark.parametrize("pair", ["two_markers", "marker_and_zero_length", "two_plays",
                                  "overlapping_windows", "out_of_order"])
def test_events_not_in_order_on_a_channel_are_refused_at_issue(pair):
    """Two events for one channel at one time (or out of order, or a readout window opening
    inside the previous one), with ample slack: neither time has passed, so neither is LATE;
    the PPU stops with ``sequence`` before either plays."""
    pairs = {
        "two_markers": [marker(0, 10, 3), marker(0, 10, 3)],
        "marker_and_zero_length": [marker(1, 10, 3), marker(1, 10, 0)],
        "two_plays": [play(0, 10, 0, 4, 100), play(0, 10, 0, 2, 200)],
        "overlapping_windows": [acquire(0, 1, 10, 8, 0), acquire(0, 2, 17, 8, 0)],
        "out_of_order": [marker(0, 12, 1), marker(0, 11, 1)],
    }

    async def tb(ctx, dut):
        await start(ctx, dut, [sync(300), *pairs[pair], end()], lead=20)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.sequence and not st.late and not st.illegal_instruction
        assert await read_reg(ctx, dut, 0, "LATE_EVENTS") == 0

    mon = run(tb)
    assert mon.cycles("marker") == [] and mon.cycles("active") == []
    assert mon.cycles("window") == []


def test_a_trigger_forgets_the_previous_runs_events():
    """The order is per run: a run stopped with an event queued far ahead (flushed) does not
    make the next run's earlier events out of order."""
    async def tb(ctx, dut):
        await start(ctx, dut, [wait(100_000), marker(0, 0, 1), acquire(0, 1, 0, 4, 0)])
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.underflow
        await start(ctx, dut, [marker(0, 10, 1), acquire(0, 1, 10, 4, 0), end()])
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.sequence

    run(tb)


def test_events_in_order_back_to_back_run():
    """The counterparts that are in order: one cycle apart, a window right after the one before."""
    out = {}

    async def tb(ctx, dut):
        out["s"] = await start(ctx, dut, [
            sync(100), marker(0, 10, 1), marker(0, 11, 1), play(0, 10, 0, 1, 100),
            play(0, 11, 0, 1, 100), acquire(0, 1, 10, 8, 0), acquire(0, 2, 18, 8, 0), end()],
            lead=20)
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.sequence and not st.late

    mon = run(tb)
    assert len(mon.cycles("marker", 0)) == 2 and len(mon.cycles("active")) == 2
    assert len(mon.cycles("window")) == 16


def test_late_start_time_too_close():
    async def tb(ctx, dut):
        await upload(ctx, dut, 0, [play(0, 0, 0, 4, 100), end()])
        s = ctx.get(dut.now) + 8
        await trigger(ctx, dut, 0, s, 2)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.late

    mon = run(tb)
    assert mon.cycles("active") == []


def test_illegal_instructions():
    bad = [0x7F, play(3, 0, 0, 1, 1), marker(4, 0, 1), acquire(0, 1, 0, 0, 0),
           call(1, 2, 33, 5), branch(Cond.ALWAYS, 0, 0, 0) | (9 << 8)]

    async def tb(ctx, dut):
        for word in bad:
            await start(ctx, dut, [nop(), word, end()])
            st = await wait_state(ctx, dut, 0, PPUState.ERROR)
            assert st.illegal_instruction, hex(word)
            assert await read_reg(ctx, dut, 0, "PC") == 1

    run(tb)


def test_timeline_bits_narrows_the_timeline_and_every_time():
    """A 48-bit build (the Colorlight's): ``now`` and START_TIME_HI are 16 bits above the low
    word, and timed instructions still land on their cycles."""
    params = QSCParams(num_ppus=1, imem_depth=64, env_depth=64, timeline_bits=48)
    out = {}

    async def tb(ctx, dut):
        assert len(dut.now) == 48
        await write_reg(ctx, dut, 0, "START_TIME_HI", 0x0102_0304)
        assert await read_reg(ctx, dut, 0, "START_TIME_HI") == 0x0304
        await write_reg(ctx, dut, 0, "START_TIME_HI", 0)
        out["s"] = await start(ctx, dut, [sync(20), marker(1, 5, 3), wait(40),
                                          marker(0, 2, 1), end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "TIMELINE_HI") == 0

    mon = run(tb, params=params)
    assert rel(mon.cycles("marker", bit=1), out["s"]) == [25, 26, 27]
    assert rel(mon.cycles("marker", bit=0), out["s"]) == [62]


@pytest.mark.parametrize("boundary", [1 << 16, 1 << 32, 1 << 47])
def test_event_times_carry_across_the_timeline_chunks(boundary):
    """``t + offset_cycles`` and ``t + cycles`` carry across 2**16, 2**32 (where the core's sums
    choose the high part or its increment) and 2**47 on a 48-bit timeline: events just before
    and after each, a WAIT of more than 2**16 cycles whose low 16 bits carry, and after it an
    event whose offset carries (the increment of the t that the WAIT wrote). ``now`` is moved
    ahead by the testbench rather than counted up."""
    params = QSCParams(num_ppus=1, imem_depth=64, env_depth=64, timeline_bits=48)
    s = boundary - 0x100
    out = {}

    async def tb(ctx, dut):
        await ctx.tick()
        ctx.set(dut.now, s - 400)
        await ctx.tick()
        prog = [marker(0, 0xF0, 1),          # boundary - 0x10
                marker(1, 0x110, 1),         # boundary + 0x10: the low chunk carries
                wait(0x1_0200),              # t = boundary + 0x1_0100: both chunks add
                marker(0, 5, 1),             # boundary + 0x1_0105
                marker(1, 0xFF10, 1),        # boundary + 0x2_0010: the low chunk carries
                end()]
        await upload(ctx, dut, 0, prog)
        await trigger(ctx, dut, 0, s, len(prog))
        assert ctx.get(dut.now) < s - 100
        await ctx.tick().until(dut.now == boundary + 0x20)
        # Skip the quiet 2**16 cycles: the next event is at boundary + 0x1_0105.
        ctx.set(dut.now, boundary + 0x1_0100 - 50)
        await ctx.tick().until(dut.now == boundary + 0x1_0110)
        ctx.set(dut.now, boundary + 0x2_0010 - 50)
        await ctx.tick()
        out["done"] = await wait_state(ctx, dut, 0, PPUState.DONE)

    mon = run(tb, params=params)
    assert not out["done"].late
    assert mon.cycles("marker", 0) == [boundary - 0x10, boundary + 0x1_0105]
    assert mon.cycles("marker", 1) == [boundary + 0x10, boundary + 0x2_0010]


def test_markers_per_ppu_sets_the_marker_channels():
    """A build with ``markers_per_ppu = 2`` (the Colorlight's) plays marker 1 and refuses 2."""
    params = QSCParams(num_ppus=1, imem_depth=64, env_depth=64, markers_per_ppu=2)

    async def tb(ctx, dut):
        assert len(dut.ptd[0].marker) == 2
        out["s"] = await start(ctx, dut, [sync(20), marker(1, 5, 3), end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)
        await start(ctx, dut, [nop(), marker(2, 0, 1), end()])
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.illegal_instruction
        assert await read_reg(ctx, dut, 0, "PC") == 1

    out = {}
    mon = run(tb, params=params)
    assert rel(mon.cycles("marker", bit=1), out["s"]) == [25, 26, 27]
    assert mon.cycles("marker", bit=0) == []


# ---- Queue, loops -----------------------------------------------------------------------

def test_queue_append_while_running():
    out = {}

    async def tb(ctx, dut):
        first = [acquire(0, 1, 10, 100, 0), add(2, 1, 0)]     # the ADD stalls ~110 cycles
        s = out["s"] = await start(ctx, dut, first)
        await ctx.tick().until(dut.now == s + 20)
        await upload(ctx, dut, 0, [marker(0, 120, 2), end()], first=2)
        assert (await status(ctx, dut, 0)).state == PPUState.RUNNING
        assert await read_reg(ctx, dut, 0, "PC") == 1
        await write_reg(ctx, dut, 0, "TAIL", 4)
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.underflow
        assert s + 110 < ctx.get(dut.now)

    mon = run(tb)
    assert rel(mon.cycles("marker", 0), out["s"]) == [120, 121]


def test_branch_loop():
    out = {}

    async def tb(ctx, dut):
        prog = [
            set_(1, 5),                       # 0
            marker(0, 0, 2),                  # 1: loop
            wait(10),                         # 2
            add(1, 1, -1),                    # 3
            branch(Cond.NE, 1, 0, 1),         # 4
            branch(Cond.ALWAYS, 0, 0, 7),     # 5
            marker(1, 0, 1),                  # 6: skipped
            marker(2, 0, 1),                  # 7
            end(),                            # 8
        ]
        out["s"] = await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R1") == 0

    mon = run(tb)
    s = out["s"]
    assert rel(mon.cycles("marker", 0), s) == [k for i in range(5) for k in (10 * i, 10 * i + 1)]
    assert mon.cycles("marker", 1) == []
    assert rel(mon.cycles("marker", 2), s) == [50]


def test_branch_conditions_signed():
    async def tb(ctx, dut):
        prog = [set_(1, -3)]
        # r2 counts the taken branches; each BRANCH skips the ADD after it when taken.
        cases = [(Cond.LT, -2, 1), (Cond.LT, -3, 0), (Cond.GE, -3, 1), (Cond.GE, 5, 0),
                 (Cond.EQ, -3, 1), (Cond.NE, -3, 0)]
        for cond, imm, _ in cases:
            here = len(prog)
            prog += [branch(cond, 1, imm, here + 2), add(3, 3, 1)]
        prog += [end()]
        await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        not_taken = sum(1 for *_, taken in cases if not taken)
        assert await read_reg(ctx, dut, 0, "R3") == not_taken

    run(tb)


#: ``(rs, imm)`` pairs whose signed order is decided in each byte, with the bytes above equal
#: or not, both signs, and the extremes.
LT_CASES = [(0x100, 0xFF), (0xFF, 0x100), (0x12345678, 0x12345679), (0x12345679, 0x12345678),
            (0x12340078, 0x12330079), (0x12330079, 0x12340078), (0x00FF0000, 0x01000000),
            (-0x80000000, 0x7FFFFFFF), (0x7FFFFFFF, -0x80000000), (0x80, 0x7F), (-1, 0),
            (0, -1), (-0x100, -0xFF), (-0xFF, -0x100), (0x7F000000, -0x01000000), (5, 5)]


@pytest.mark.parametrize("cond", [Cond.LT, Cond.GE])
def test_branch_compare_decided_in_each_byte(cond):
    """Signed LT / GE against the immediate, decided in the top byte or a lower one."""
    async def tb(ctx, dut):
        prog = []
        # Bit i of r3 is set when case i's BRANCH is not taken (it skips the ADD when taken).
        for i, (rs, imm) in enumerate(LT_CASES):
            here = len(prog)
            prog += [set_(1, rs), branch(cond, 1, imm, here + 3), add(3, 3, 1 << i)]
        prog += [end()]
        await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        taken = [(rs < imm) == (cond == Cond.LT) for rs, imm in LT_CASES]
        assert await read_reg(ctx, dut, 0, "R3") == sum(
            1 << i for i, t in enumerate(taken) if not t)

    run(tb)


# ---- CALL ------------------------------------------------------------------------------

FID = fnv1a32("decode_syndrome")


async def _take_request(ctx, dut, limit_cycles: int = 2000):
    """Take the next CALL request; fails when none comes within ``limit_cycles``."""
    ctx.set(dut.call_req.ready, 1)
    for _ in range(limit_cycles):
        *_, valid, req, now = await ctx.tick().sample(
            dut.call_req.valid, dut.call_req.payload, dut.now)
        if valid:
            ctx.set(dut.call_req.ready, 0)
            return req, now
    raise AssertionError(f"no CALL request within {limit_cycles} cycles")


def test_call_round_trip_and_stale_responses():
    async def tb(ctx, dut):
        prog = [set_(1, 0x1234567), call(2, 1, 12, FID), call(3, 1, 32, FID + 1),
                sync(10), marker(0, 0, 1), end()]
        await start(ctx, dut, prog, lead=20)
        req, h = await _take_request(ctx, dut)
        assert (req.ppu, req.function_id, req.request_id) == (0, FID, 0)
        assert (req.arg_len, req.args) == (2, 0x567)
        # Wrong request_id, then wrong magic: dropped and counted, the call keeps waiting.
        await send_response(ctx, dut, 0, Response(0, 1, 0, b"\x01\x00\x00\x00"))
        bad = bytearray(Response(0, 0, 0, b"\x01\x00\x00\x00").pack())
        bad[0] ^= 0xFF
        await send_response(ctx, dut, 0, bytes(bad))
        assert await read_reg(ctx, dut, 0, "STALE_RESPONSES") == 2
        assert (await status(ctx, dut, 0)).state == PPUState.RUNNING
        assert await read_reg(ctx, dut, 0, "PC") == 1
        # The good one (5 result bytes: the first 4 are taken).
        await send_response(ctx, dut, 0, Response(0, 0, 77, b"\x78\x56\x34\x12\x99"))
        commit_now = ctx.get(dut.now) + 2  # taken three cycles after the bus took it
        rtt = await read_reg(ctx, dut, 0, "LAST_RTT_CYCLES")
        assert rtt == commit_now - h
        req, _ = await _take_request(ctx, dut)
        assert (req.function_id, req.request_id, req.arg_len, req.args) == \
            (FID + 1, 1, 4, 0x1234567)
        await send_response(ctx, dut, 0, Response(0, 1, 0, b"\xab\xcd"))   # zero-extended
        st = await wait_state(ctx, dut, 0, PPUState.DONE)
        assert not st.call_failed and not st.call_timeout
        assert await read_reg(ctx, dut, 0, "R2") == 0x12345678
        assert await read_reg(ctx, dut, 0, "R3") == 0xCDAB
        assert await read_reg(ctx, dut, 0, "CALL_COUNT") == 2
        assert await read_reg(ctx, dut, 0, "STALE_RESPONSES") == 2
        assert await read_reg(ctx, dut, 0, "LAST_CALL_STATUS") == 0
        # No call waiting: a response is stale.
        await send_response(ctx, dut, 0, Response(0, 2, 0, b""))
        assert await read_reg(ctx, dut, 0, "STALE_RESPONSES") == 3

    mon = run(tb)
    assert len(mon.cycles("marker", 0)) == 1


def test_call_response_byte_count_checked():
    """A MAILBOX_COMMIT whose byte count is not 24..64 or leaves no room for result_len is
    dropped (stale) and the call keeps waiting; all 16 bits of the count and all 32 of
    result_len are checked."""
    async def tb(ctx, dut):
        await start(ctx, dut, [call(1, 0, 0, FID), end()], lead=20)
        req, _ = await _take_request(ctx, dut)
        payload = Response(0, req.request_id, 0, b"\x2a\x00\x00\x00").pack()    # 28 bytes
        base = ppu_base(0) + MAILBOX_OFFSET
        await write_mailbox(ctx, dut, 0, payload)
        for n, stale in ((23, 1), (65, 2), (27, 3), (0x1000 + 28, 4), (0x8000 + 28, 5)):
            await bus_commit(ctx, dut, base, n)     # too short, too long, result_len > room
            assert await read_reg(ctx, dut, 0, "STALE_RESPONSES") == stale, n
            assert (await status(ctx, dut, 0)).state == PPUState.RUNNING
        # result_len (header bytes 8..11) with a high byte set exceeds the room: stale.
        for k, stale in ((1, 6), (2, 7), (3, 8)):
            bad = bytearray(payload)
            bad[8 + k] = 1 << (k + 2)
            await write_mailbox(ctx, dut, 0, bytes(bad))
            await bus_commit(ctx, dut, base, len(payload))
            assert await read_reg(ctx, dut, 0, "STALE_RESPONSES") == stale, k
        # The header rewritten with result_len 4 is taken (nothing of the bad ones stays).
        await write_mailbox(ctx, dut, 0, payload)
        await bus_commit(ctx, dut, base, len(payload))
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R1") == 0x2A
        assert await read_reg(ctx, dut, 0, "STALE_RESPONSES") == 8

    run(tb)


def test_call_failed_status():
    async def tb(ctx, dut):
        await start(ctx, dut, [set_(2, 9), call(2, 0, 0, FID), end()], lead=20)
        req, _ = await _take_request(ctx, dut)
        assert (req.arg_len, req.args) == (0, 0)
        await send_response(ctx, dut, 0, Response(-1, req.request_id, 0, b"\x05\x00\x00\x00"))
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.call_failed and not st.call_timeout
        assert await read_reg(ctx, dut, 0, "LAST_CALL_STATUS") == 0xFFFFFFFF
        assert await read_reg(ctx, dut, 0, "R2") == 9

    run(tb)


def test_call_timeout_then_late_response_is_stale():
    async def tb(ctx, dut):
        await write_reg(ctx, dut, 0, "CALL_TIMEOUT_CYCLES", 40)
        await start(ctx, dut, [call(1, 0, 0, FID), end()], lead=20)
        req, h = await _take_request(ctx, dut)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.call_timeout and not st.call_failed
        assert ctx.get(dut.now) - h >= 40
        await send_response(ctx, dut, 0, Response(0, req.request_id, 0, b"\x01\x00\x00\x00"))
        assert await read_reg(ctx, dut, 0, "STALE_RESPONSES") == 1
        assert await read_reg(ctx, dut, 0, "R1") == 0
        # The next run's call has a new request_id: the old answer can never be taken.
        await start(ctx, dut, [call(1, 0, 0, FID), end()], lead=20)
        req2, _ = await _take_request(ctx, dut)
        assert req2.request_id == req.request_id + 1

    run(tb)


def test_call_waits_for_the_stopped_runs_request_to_be_taken():
    """A run's CALL issued while the stopped run's request is still offered goes out after it."""
    async def tb(ctx, dut):
        await write_reg(ctx, dut, 0, "CALL_TIMEOUT_CYCLES", 40)
        await start(ctx, dut, [call(1, 0, 0, FID), end()], lead=20)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)      # nobody took the request
        assert st.call_timeout
        assert ctx.get(dut.call_req.valid)
        await write_reg(ctx, dut, 0, "CALL_TIMEOUT_CYCLES", 1000)
        await start(ctx, dut, [set_(2, 0x55), call(1, 2, 8, FID + 1), end()], lead=20)
        await wait_state(ctx, dut, 0, PPUState.RUNNING)
        for _ in range(30):     # the new CALL has issued; the old request is still the one offered
            await ctx.tick()
            assert ctx.get(dut.call_req.valid)
            assert ctx.get(dut.call_req.payload.function_id) == FID
        assert await read_reg(ctx, dut, 0, "PC") == 1
        old, _ = await _take_request(ctx, dut)
        assert (old.function_id, old.request_id) == (FID, 0)
        new, _ = await _take_request(ctx, dut)
        assert (new.function_id, new.request_id, new.arg_len, new.args) == (FID + 1, 1, 1, 0x55)
        await send_response(ctx, dut, 0, Response(0, 1, 0, b"\x07\x00\x00\x00"))
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R1") == 7
        assert await read_reg(ctx, dut, 0, "CALL_COUNT") == 2

    run(tb)


def test_call_timeout_covers_a_request_never_handed_over():
    """With the network side taking no request at all, every run's CALL times out: the second
    run's request cannot even be offered (the first run's is still offered), and its time-out
    counts from the CALL's issue all the same."""
    async def tb(ctx, dut):
        await write_reg(ctx, dut, 0, "CALL_TIMEOUT_CYCLES", 40)
        for run_ in range(3):
            await start(ctx, dut, [call(1, 0, 0, FID + run_), end()], lead=20)
            triggered = ctx.get(dut.now)      # the CALL issues a few cycles later
            st = await wait_state(ctx, dut, 0, PPUState.ERROR)
            assert st.call_timeout and not st.call_failed, run_
            assert 40 <= ctx.get(dut.now) - triggered < 70, run_
            assert ctx.get(dut.call_req.payload.function_id) == FID     # still the first
        assert await read_reg(ctx, dut, 0, "CALL_COUNT") == 0
        # Taken at last: the old request leaves, and the dropped calls' requests never do.
        old, _ = await _take_request(ctx, dut)
        assert (old.function_id, old.request_id) == (FID, 0)
        for _ in range(20):
            await ctx.tick()
            assert not ctx.get(dut.call_req.valid)

    run(tb)


def test_at_most_call_slots_requests_outstanding():
    """Requests the host has not answered hold their ring slots: with CALL_SLOTS 2, after two
    timed-out calls a third is never handed over (it times out waiting for a slot) instead of
    overwriting a slot the host still owns. A late answer to the newer one frees both; a write
    of CALL_SLOTS forgets them all."""
    async def one_run(ctx, dut, take: bool):
        await start(ctx, dut, [call(1, 0, 0, FID), end()], lead=20)
        req = None
        if take:
            req, _ = await _take_request(ctx, dut)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.call_timeout
        return req

    async def tb(ctx, dut):
        await write_reg(ctx, dut, 0, "CALL_TIMEOUT_CYCLES", 60)
        await write_reg(ctx, dut, 0, "CALL_SLOTS", 2)
        first = await one_run(ctx, dut, take=True)
        second = await one_run(ctx, dut, take=True)
        assert await read_reg(ctx, dut, 0, "CALL_OUTSTANDING") == 2
        await one_run(ctx, dut, take=False)
        assert not ctx.get(dut.call_req.valid)           # never offered: no slot free
        assert await read_reg(ctx, dut, 0, "CALL_COUNT") == 2
        # A response of another PPU's request_id, or an unsent one, frees nothing.
        await send_response(ctx, dut, 0, Response(0, 1 << 24 | second.request_id, 0, b""))
        await send_response(ctx, dut, 0, Response(0, second.request_id + 1, 0, b""))
        assert await read_reg(ctx, dut, 0, "CALL_OUTSTANDING") == 2
        # The late answer to the second frees its slot and the first's.
        await send_response(ctx, dut, 0, Response(0, second.request_id, 0, b""))
        assert await read_reg(ctx, dut, 0, "CALL_OUTSTANDING") == 0
        third = await one_run(ctx, dut, take=True)
        assert third.request_id == second.request_id + 1
        await write_reg(ctx, dut, 0, "CALL_SLOTS", 2)
        assert await read_reg(ctx, dut, 0, "CALL_OUTSTANDING") == 0
        assert first.request_id + 1 == second.request_id

    run(tb)


def test_call_round_robin_two_ppus():
    async def tb(ctx, dut):
        for ppu in (0, 1):
            await upload(ctx, dut, ppu, [call(1, 0, 0, FID + ppu), end()])
        s = ctx.get(dut.now) + 40
        for ppu in (0, 1):
            await trigger(ctx, dut, ppu, s, 2)
        reqs = []
        for _ in range(2):
            req, _ = await _take_request(ctx, dut)
            reqs.append((req.ppu, req.request_id))
        assert sorted(reqs) == [(0, 0), (1, 1 << 24)]
        for ppu, rid in reqs:
            await send_response(ctx, dut, ppu, Response(0, rid, 0, bytes([ppu + 1, 0, 0, 0])))
        for ppu in (0, 1):
            await wait_state(ctx, dut, ppu, PPUState.DONE)
            assert await read_reg(ctx, dut, ppu, "R1") == ppu + 1

    run(tb)


# ---- Bus map ------------------------------------------------------------------------------

def test_bus_read_every_register_and_memory():
    async def tb(ctx, dut):
        base = ppu_base(1)
        # IMEM: two half-instruction writes, then a byte-enabled write to one byte.
        await bus_write(ctx, dut, base + IMEM_OFFSET + 16 * 5, 0x1111_2222_3333_4444)
        await bus_write(ctx, dut, base + IMEM_OFFSET + 16 * 5 + 8, 0x5555_6666_7777_8888)
        await bus_write(ctx, dut, base + IMEM_OFFSET + 16 * 5 + 8, 0xAB << 8, be=0b10)
        assert await bus_read(ctx, dut, base + IMEM_OFFSET + 16 * 5) == (0x1111_2222_3333_4444, 0)
        assert await bus_read(ctx, dut, base + IMEM_OFFSET + 16 * 5 + 8) == \
            (0x5555_6666_7777_AB88, 0)
        # ENV.
        await upload_env(ctx, dut, 1, [1, -2, 3, -4], first=8)
        assert await bus_read(ctx, dut, base + ENV_OFFSET + 16) == (0xFFFC_0003_FFFE_0001, 0)
        # MAILBOX.
        await bus_write(ctx, dut, base + MAILBOX_OFFSET + 56, 0xDEAD_BEEF_0000_0001)
        assert await bus_read(ctx, dut, base + MAILBOX_OFFSET + 56) == (0xDEAD_BEEF_0000_0001, 0)
        # Registers: reset values, RW registers, byte enables.
        for r in PPU_REGISTERS:
            value, err = await bus_read(ctx, dut, ppu_reg(1, r.name) & ~7)
            assert not err
            value = (value >> (32 * ((r.offset >> 2) & 1))) & 0xFFFFFFFF
            if r.name == "TRACE_DEPTH":                             # the build's
                assert value == PARAMS.trace_depth
            elif r.name == "CALL_ARG_BYTES":
                assert value == PARAMS.call_arg_bytes
            elif r.name not in ("TIMELINE_LO", "TIMELINE_HI", "UPLOAD_WORDS"):
                assert value == r.reset, r.name
        assert await read_reg(ctx, dut, 1, "UPLOAD_WORDS") == 4     # the writes above
        await write_reg(ctx, dut, 1, "START_TIME_HI", 0x0102_0304)
        await bus_write(ctx, dut, ppu_reg(1, "START_TIME_LO"), 0xAABB_CCDD, be=0b0101)
        assert await bus_read(ctx, dut, ppu_reg(1, "START_TIME_LO")) == \
            (0x0102_0304_00BB_00DD, 0)
        await write_reg(ctx, dut, 1, "CALL_TIMEOUT_CYCLES", 1234)
        await write_reg(ctx, dut, 1, "TAIL", 0xFFFF_FFFF)          # kept mod imem_depth
        assert await read_reg(ctx, dut, 1, "CALL_TIMEOUT_CYCLES") == 1234
        assert await read_reg(ctx, dut, 1, "TAIL") == 63
        await write_reg(ctx, dut, 1, "STATUS", 0xFFFF_FFFF)        # RO: ignored
        assert await read_reg(ctx, dut, 1, "STATUS") == 0
        # TIMELINE: a read of LO latches HI; a whole-word read is coherent.
        value, _ = await bus_read(ctx, dut, ppu_reg(1, "TIMELINE_LO"))
        assert 0 < value < 10_000
        lo = await read_reg(ctx, dut, 1, "TIMELINE_LO")
        assert lo > value & 0xFFFFFFFF
        assert await read_reg(ctx, dut, 1, "TIMELINE_HI") == 0
        # R0..R15 after a run.
        await write_reg(ctx, dut, 1, "TAIL", 0)
        prog = [set_(i, 0x100 * i + 7) for i in range(16)] + [end()]
        await start(ctx, dut, prog, ppu=1)
        await wait_state(ctx, dut, 1, PPUState.DONE)
        for i in range(16):
            assert await read_reg(ctx, dut, 1, f"R{i}") == (0x100 * i + 7 if i else 0)
        assert await read_reg(ctx, dut, 1, "PC") == 16
        assert await read_reg(ctx, dut, 1, "TAIL") == 17

    run(tb)


def test_timeline_hi_latch():
    params = QSCParams(num_ppus=1, imem_depth=16, env_depth=16)

    async def tb(ctx, dut):
        await ctx.tick().repeat(5)
        lo = await read_reg(ctx, dut, 0, "TIMELINE_LO")
        await ctx.tick().repeat(20)
        assert await read_reg(ctx, dut, 0, "TIMELINE_HI") == 0
        assert 5 <= lo < 10

    run(tb, params=params)


def test_unmapped_addresses():
    async def tb(ctx, dut):
        mapped = ppu_base(1) + REGS_OFFSET
        unmapped = [
            GLOBAL_BASE,                                   # not a PPU window
            ppu_base(2),                                   # only 2 PPUs
            0xFF00_0000,
            ppu_base(0) + IMEM_OFFSET + 16 * 64,           # past the ring
            ppu_base(0) + ENV_OFFSET + 2 * 64,             # past the envelopes
            ppu_base(1) + MAILBOX_OFFSET + 64,             # past the mailbox
            ppu_base(1) + REGS_OFFSET + 0xA0,              # past the register block
        ]
        for addr in unmapped:
            await bus_write(ctx, dut, addr, 0x1234)
            assert await bus_read(ctx, dut, addr) == (0, 1), hex(addr)
        # Mapped reads still work, unused register offsets read 0 without error.
        assert await bus_read(ctx, dut, mapped) == (0, 0)
        assert await bus_read(ctx, dut, ppu_base(0) + IMEM_OFFSET) == (0, 0)
        # The wrapped-around address of the ignored ring write was not written.
        assert await bus_read(ctx, dut, ppu_base(0) + IMEM_OFFSET + 16 * 0) == (0, 0)

    run(tb)


def test_two_ppus_share_the_timeline():
    out = {}

    async def tb(ctx, dut):
        for ppu in (0, 1):
            await upload(ctx, dut, ppu, [wait(3), marker(0, 2, 1), end()])
        s = out["s"] = ctx.get(dut.now) + LEAD
        for ppu in (1, 0):
            await trigger(ctx, dut, ppu, s, 3)
        for ppu in (0, 1):
            await wait_state(ctx, dut, ppu, PPUState.DONE)

    dut, sim = make_sim()
    mons = [Monitor(dut, ppu) for ppu in (0, 1)]
    for mon in mons:
        mon.add_to(sim)

    async def testbench(ctx):
        await tb(ctx, dut)

    sim.add_testbench(testbench)
    sim.run()
    assert [rel(mon.cycles("marker", 0), out["s"]) for mon in mons] == [[5], [5]]


# ---- Elaboration ------------------------------------------------------------------------

@pytest.mark.parametrize("params", [QSCParams(), QSCParams(num_ppus=3, imem_depth=256)])
def test_conversion_names_the_ports(params):
    """The cluster converts to RTLIL with its ports named (Amaranth's own back end: Yosys's
    Verilog of the whole top is what the system tests and ``qlink build --verilog`` make)."""
    dut = PPUCluster(params, n_drive=2, n_readout=2, n_marker=4)
    text = rtlil.convert(dut, name="ppu_cluster")
    assert "module \\ppu_cluster" in text
    for port in ("bus_cmd__valid", "bus_rdata__payload", "call_req__ready", "now",
                 f"ptd__{params.num_ppus - 1}__dac", "ptd__0__adc", "ptd__0__marker"):
        assert port in text, port


def _raises(exc: type[Exception], match: str, build) -> None:
    """``build()`` raises ``exc``; the half-built component's "never used" warning is muted."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*created but never used")
        with pytest.raises(exc, match=match):
            build()
        gc.collect()


def test_parameter_errors():
    _raises(ValueError, "n_drive must be an integer in 1..16, not 0",
            lambda: PPUCluster(PARAMS, n_drive=0))
    _raises(ValueError, "env_depth must be a power of two >= 4, not 2", lambda: DriveChannel(2))
    _raises(ValueError, "imem_depth must be at least 2, not 1",
            lambda: PPU(QSCParams(imem_depth=1)))
    assert RESPONSE_MAGIC == 0x43555153


# ---- Latency ------------------------------------------------------------------------------

#: Measurement -> conditional pulse: last ADC sample of an ACQUIRE window -> first DAC sample
#: of the PLAY that a BRANCH on its result selects (the smallest PLAY time that is not LATE),
#: without and with the NCOs (the demodulator's product stage is one cycle more).
MEAS_TO_PULSE_CYCLES = {False: 8, True: 9}


def _conditional_pulse(taken: bool, lead: int, params: QSCParams = PARAMS
                       ) -> tuple[int, bool, list[int]]:
    """ACQUIRE over s+10..s+17, BRANCH on it, PLAY at ``s + 17 + lead`` on the selected path.

    Returns (last ADC sample cycle, late, DAC active cycles)."""
    window, offset = 8, 10
    last = offset + window - 1
    pulse = play(0, last + lead, 0, 4, 0x4000)
    if taken:     # the measured 1 takes the branch to the PLAY
        prog = [acquire(0, 1, offset, window, 0), branch(Cond.EQ, 1, 1, 3), end(), pulse, end()]
    else:         # the measured 1 falls through to the PLAY
        prog = [acquire(0, 1, offset, window, 0), branch(Cond.NE, 1, 1, 3), pulse, end()]
    out = {}

    async def tb(ctx, dut):
        await upload_env(ctx, dut, 0, [1000] * 4)
        out["s"] = await start(ctx, dut, prog)
        for _ in range(200):
            st = await status(ctx, dut, 0)
            if st.state in (PPUState.DONE, PPUState.ERROR):
                break
        out["late"] = bool(st.late)

    mon = run(tb, params=params, adc=lambda now: 100)
    s = out["s"]
    return s + last, out["late"], mon.cycles("active")


@pytest.mark.parametrize("nco", [False, True])
@pytest.mark.parametrize("taken", [True, False])
def test_measurement_to_conditional_pulse_latency(taken, nco):
    params = NCO_PARAMS if nco else PARAMS
    cycles = MEAS_TO_PULSE_CYCLES[nco]
    last, late, active = _conditional_pulse(taken, cycles, params)
    assert not late and active[0] - last == cycles
    assert MEAS_TO_PULSE_CYCLES[False] <= 8
    _, late, active = _conditional_pulse(taken, cycles - 1, params)
    assert late and active == []


def test_play_and_acquire_carry_the_nco_fields_to_their_channels():
    """Through the core: a PLAY's phase turns its I into Q (90 degrees: I = 0, Q = the
    envelope times the amplitude) and its frequency word turns it sample by sample; an
    ACQUIRE's phase rotates the integral (180 degrees: a positive signal integrates below
    the threshold)."""
    out = {}
    quarter = 1 << 14                      # 90 degrees in turns / 2**16

    async def tb(ctx, dut):
        await upload_env(ctx, dut, 0, [1000] * 8)
        out["s"] = await start(ctx, dut, [
            play(0, 10, 0, 4, 0x4000, phase=quarter),
            play(0, 20, 0, 8, 0x4000, freq_word=1 << 30, phase_reset=1),   # a quarter turn
            acquire(0, 1, 10, 4, 0), acquire(0, 2, 20, 4, 0, phase=2 * quarter),
            end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)
        out["r"] = [await read_reg(ctx, dut, 0, r) for r in ("R1", "R2")]

    mon = run(tb, params=NCO_PARAMS, adc=lambda now: 100)
    s = out["s"]
    rows = {r["now"] - s: (r["dac"], r["dac_q"]) for r in mon.rows if r["active"]}
    assert [rows[k] for k in range(10, 14)] == [(0, 500)] * 4
    assert [rows[k] for k in range(20, 28)] == [(500, 0), (0, 500), (-500, 0), (0, -500)] * 2
    assert out["r"] == [1, 0]


def test_barrier_releases_every_ppu_of_its_mask_in_one_cycle():
    """PPU 1 reaches the BARRIER only once its ACQUIRE's result (a window 300 cycles after the
    start) lands, PPU 0 at once: both leave it in the same cycle and re-anchor ``t`` there
    (their next MARKERs at offset 0 fire together, ``slack`` after the release), and PPU 0
    does not leave before PPU 1 arrived."""
    dut, sim = make_sim(PARAMS)
    mons = [Monitor(dut, n) for n in range(2)]
    for mon in mons:
        mon.add_to(sim)
    out = {}

    async def bench(ctx):
        progs = [[marker(0, 0, 1), barrier(0b11, 12), marker(0, 0, 2), end()],
                 [acquire(0, 1, 300, 4, 0), add(2, 1, 0), barrier(0b11, 12), marker(0, 0, 2),
                  end()]]
        for n, prog in enumerate(progs):
            await upload(ctx, dut, n, prog)
        s = out["s"] = ctx.get(dut.now) + LEAD
        for n, prog in enumerate(progs):
            await trigger(ctx, dut, n, s, len(prog))
        for n in range(2):
            st = await wait_state(ctx, dut, n, PPUState.DONE)
            assert not st.late and not st.sequence and not st.illegal_instruction

    sim.add_testbench(bench)
    sim.run()
    s = out["s"]
    marks = [rel(mon.cycles("marker", 0), s) for mon in mons]
    release = marks[1][0] - 12
    assert marks[0] == [0, release + 12, release + 13]
    assert marks[1] == [release + 12, release + 13]
    assert 303 < release < 303 + 12          # the window's last sample, its result, the ADD


def test_barrier_of_one_ppu_is_a_sync_and_a_mask_beyond_the_build_is_illegal():
    out = {}

    async def bench(ctx, dut):
        out["s"] = await start(ctx, dut, [barrier(0, 7), marker(0, 0, 1), end()])
        await wait_state(ctx, dut, 0, PPUState.DONE)
        await start(ctx, dut, [barrier(0b100, 7), marker(0, 0, 1), end()])
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.illegal_instruction

    mon = run(bench)
    (fired, *rest) = rel(mon.cycles("marker", 0), out["s"])
    assert rest == [] and 7 <= fired <= 7 + 4         # SYNC's: now + slack at the start
