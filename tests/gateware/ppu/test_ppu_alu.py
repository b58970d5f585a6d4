"""The PPU's ALU instruction and LOOP, in the PPU cluster with Amaranth's simulator.

``alu FUNC, rd, rs, rt|imm`` against a Python model of each function (32-bit, wrapping, shifts
by the low 5 bits), the scoreboard for its registers, and LOOP's count and register write.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from ppu_bench import (
    PARAMS,
    acquire,
    add,
    alu,
    end,
    loop,
    marker,
    read_reg,
    set_,
    wait,
    wait_state,
)
from test_ppu_cluster import rel, run, start

from openqlink.isa.asm import encode
from openqlink.isa.layout import AluFunc, Cond, Op, PPUState

MASK32 = (1 << 32) - 1


def model(func: AluFunc, a: int, b: int) -> int:
    """The documented result of ``a FUNC b`` on 32-bit registers (``a``, ``b`` unsigned)."""
    sa = a - (1 << 32) if a >> 31 else a
    n = b & 31
    return {
        AluFunc.ADD: a + b,
        AluFunc.SUB: a - b,
        AluFunc.AND: a & b,
        AluFunc.OR: a | b,
        AluFunc.XOR: a ^ b,
        AluFunc.SHL: a << n,
        AluFunc.SHR: a >> n,
        AluFunc.SRA: sa >> n,
    }[func] & MASK32


def signed32(v: int) -> int:
    return v - (1 << 32) if v >> 31 else v


#: Operand pairs: the extremes, both signs, shift amounts 0, 31 and ones whose high bits the
#: shifter must ignore (b = 33 shifts by 1).
PAIRS = [(0x80000000, 31), (0xFFFFFFFF, 1), (0x12345678, 0x87654321), (0x7FFFFFFF, 33),
         (5, 0)] + [(random.Random(k).getrandbits(32), random.Random(k + 99).getrandbits(32))
                    for k in range(3)]


def test_each_function_with_a_register_and_an_immediate():
    """r3..r10: the eight functions of r1 and r2; r11..r15: with immediates (shifts by
    ``b & 31``, the others by ``b`` as a signed 32-bit immediate)."""
    imm_funcs = [AluFunc.SUB, AluFunc.XOR, AluFunc.SHL, AluFunc.SHR, AluFunc.SRA]

    async def tb(ctx, dut):
        for a, b in PAIRS:
            prog = [set_(1, signed32(a)), set_(2, signed32(b))]
            prog += [alu(f, 3 + i, 1, rt=2) for i, f in enumerate(AluFunc)]
            for i, f in enumerate(imm_funcs):
                imm = b & 31 if f in (AluFunc.SHL, AluFunc.SHR, AluFunc.SRA) else signed32(b)
                prog.append(alu(f, 11 + i, 1, imm=imm))
            prog.append(end())
            await start(ctx, dut, prog)
            await wait_state(ctx, dut, 0, PPUState.DONE)
            for i, f in enumerate(AluFunc):
                got = await read_reg(ctx, dut, 0, f"R{3 + i}")
                assert got == model(f, a, b), (f, hex(a), hex(b), hex(got))
            for i, f in enumerate(imm_funcs):
                got = await read_reg(ctx, dut, 0, f"R{11 + i}")
                assert got == model(f, a, b), (f, hex(a), hex(b), "imm", hex(got))

    run(tb)


def test_an_alu_result_feeds_the_next_instruction_and_rd_may_be_rs():
    """Back-to-back ALU instructions on one register: each reads the one before's result."""
    async def tb(ctx, dut):
        prog = [set_(1, 1), alu(AluFunc.SHL, 1, 1, imm=4), alu(AluFunc.OR, 1, 1, rt=1),
                alu(AluFunc.ADD, 1, 1, rt=1), alu(AluFunc.SUB, 2, 0, rt=1), end()]
        await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R1") == 32
        assert await read_reg(ctx, dut, 0, "R2") == (-32) & MASK32

    run(tb)


@pytest.mark.parametrize("which", ["rt", "rs", "rd"])
def test_alu_waits_for_a_pending_register(which):
    """An ALU instruction whose rs, rt or rd an ACQUIRE will write waits for the result: the
    result (1, the ADC is above the threshold) is what it reads, not the value set before."""
    acq = {"rt": 2, "rs": 1, "rd": 3}[which]

    async def tb(ctx, dut):
        prog = [set_(1, 40), set_(2, 7), set_(3, 100), acquire(0, acq, 10, 20, 0),
                alu(AluFunc.ADD, 3, 1, rt=2), end()]
        await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        want = {"rt": 40 + 1, "rs": 1 + 7, "rd": 40 + 7}[which]
        assert await read_reg(ctx, dut, 0, "R3") == want

    run(tb, adc=lambda now: 5)


def test_loop_counts_down_to_zero():
    """``loop r1, L`` with r1 = 5 runs the body 5 times and leaves r1 at 0; the general form
    ``branch dbnz, r2, 3, L`` (taken while r2 != 3 before its decrement) from 6 runs 4 times
    and leaves 2."""
    out = {}

    async def tb(ctx, dut):
        prog = [
            set_(1, 5),                       # 0
            marker(0, 0, 1),                  # 1: body
            wait(10),                         # 2
            loop(1, 1),                       # 3
            set_(2, 6),                       # 4
            marker(1, 0, 1),                  # 5: body
            wait(10),                         # 6
            encode(Op.BRANCH, {"cond": Cond.DBNZ, "rs": 2, "imm": 3, "target": 5}),  # 7
            end(),                            # 8
        ]
        out["s"] = await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R1") == 0
        assert await read_reg(ctx, dut, 0, "R2") == 2

    mon = run(tb)
    assert rel(mon.cycles("marker", 0), out["s"]) == [0, 10, 20, 30, 40]
    assert rel(mon.cycles("marker", 1), out["s"]) == [50, 60, 70, 80]


def test_loop_on_a_pending_counter_reads_the_result():
    """A LOOP whose counter an ACQUIRE writes decrements the landed result (1 -> 0, not
    taken), never the value from before: it does not take the measurement's fast path."""
    async def tb(ctx, dut):
        prog = [set_(1, 7), acquire(0, 1, 10, 20, 0), loop(1, 0), set_(2, 9), end()]
        await start(ctx, dut, prog)
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R1") == 0
        assert await read_reg(ctx, dut, 0, "R2") == 9

    run(tb, adc=lambda now: 5)


def test_an_alu_function_beyond_sra_is_illegal():
    word = alu(AluFunc.ADD, 1, 2, rt=3) | (8 << 52)

    async def tb(ctx, dut):
        await start(ctx, dut, [set_(1, 1), word, end()])
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.illegal_instruction
        assert await read_reg(ctx, dut, 0, "PC") == 1

    run(tb)



def test_a_build_without_the_alu_refuses_it_and_keeps_add_and_loop():
    """``alu=False`` (the Colorlight's build): any ALU word is illegal; ADD of an immediate and
    LOOP (ADD's adder) still run."""
    params = replace(PARAMS, alu=False)

    async def tb(ctx, dut):
        await start(ctx, dut, [set_(1, 3), set_(2, 0), add(2, 2, 5), loop(1, 2),
                               alu(AluFunc.ADD, 3, 2, rt=2), end()])
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.illegal_instruction
        assert await read_reg(ctx, dut, 0, "PC") == 4
        assert await read_reg(ctx, dut, 0, "R2") == 15
        assert await read_reg(ctx, dut, 0, "R1") == 0
        assert await read_reg(ctx, dut, 0, "R3") == 0

    run(tb, params=params)
