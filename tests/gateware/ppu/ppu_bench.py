"""Test bench helpers for the PPU cluster: bus driver, program builders, PTD monitor.

Programs are built as 128-bit words with ``Instruction.const({...}).as_bits()`` (the assembler
is not used here on purpose).
"""

from __future__ import annotations

import simreuse
from amaranth.sim import Simulator

from openqlink.gateware.bus import BusOp
from openqlink.gateware.ppu.cluster import PPUCluster
from openqlink.isa.layout import AluFunc, Cond, Instruction, Op, PPUState, PPUStatus
from openqlink.memory_map import (
    ENV_OFFSET,
    IMEM_OFFSET,
    MAILBOX_OFFSET,
    QSCParams,
    ppu_base,
    ppu_reg,
)
from openqlink.wire.rpc import Response

__all__ = [
    "PARAMS", "NCO_PARAMS", "make_sim", "shared_cluster", "bus_write", "bus_read", "write32",
    "read32", "read_reg", "write_reg", "upload", "upload_env", "trigger", "status", "wait_state",
    "write_mailbox", "send_response",
    "Monitor", "nop", "end", "wait", "sync", "play", "acquire", "marker", "set_", "add",
    "branch", "call", "barrier", "alu", "loop",
]

#: The boards' configuration (no NCOs: the readout's result a cycle sooner); NCO_PARAMS with.
PARAMS = QSCParams(num_ppus=2, imem_depth=64, env_depth=64, nco=False)
NCO_PARAMS = QSCParams(num_ppus=2, imem_depth=64, env_depth=64, nco=True)


def make_sim(params: QSCParams = PARAMS, **channels) -> tuple[PPUCluster, Simulator]:
    dut = PPUCluster(params, **channels)
    sim = Simulator(dut)
    sim.add_clock(4e-9)
    return dut, sim


def shared_cluster(params: QSCParams = PARAMS, **channels) -> simreuse.ReusableSimulator:
    """The cluster of ``params`` and ``channels`` in this process's one simulator of it (reset
    before each run: ``simreuse``), with room for one process beside the run's testbench."""
    return simreuse.shared(("ppu_cluster", params, tuple(sorted(channels.items()))),
                           lambda: PPUCluster(params, **channels), clocks=4e-9, processes=1)


# ---- Instructions ---------------------------------------------------------------------------

def _ins(op: Op, kind: str | None = None, **fields) -> int:
    value = {"op": op}
    if kind is not None:
        value["operands"] = {kind: fields}
    return Instruction.const(value).as_bits()


def nop() -> int:
    return _ins(Op.NOP)


def end() -> int:
    return _ins(Op.END)


def wait(cycles: int) -> int:
    return _ins(Op.WAIT, "wait", cycles=cycles)


def sync(slack_cycles: int) -> int:
    return _ins(Op.SYNC, "sync", slack_cycles=slack_cycles)


def play(channel: int, offset: int, env_addr: int, env_len: int, amplitude: int,
         phase: int = 0, freq_word: int = 0, phase_reset: int = 0) -> int:
    return _ins(Op.PLAY, "play", channel=channel, offset_cycles=offset, env_addr=env_addr,
                env_len=env_len, amplitude=amplitude, phase=phase, freq_word=freq_word,
                phase_reset=phase_reset)


def acquire(channel: int, rd: int, offset: int, window: int, threshold: int,
            phase: int = 0, freq_word: int = 0) -> int:
    return _ins(Op.ACQUIRE, "acquire", channel=channel, rd=rd, offset_cycles=offset,
                window_cycles=window, threshold=threshold, phase=phase, freq_word=freq_word)


def marker(channel: int, offset: int, duration: int) -> int:
    return _ins(Op.MARKER, "marker", channel=channel, offset_cycles=offset,
                duration_cycles=duration)


def barrier(mask: int, slack_cycles: int) -> int:
    return _ins(Op.BARRIER, "barrier", mask=mask, slack_cycles=slack_cycles)


def set_(rd: int, imm: int) -> int:
    return _ins(Op.SET, "set", rd=rd, imm=imm)


def add(rd: int, rs: int, imm: int) -> int:
    return _ins(Op.ADD, "add", rd=rd, rs=rs, imm=imm)


def alu(func: AluFunc, rd: int, rs: int, *, rt: int | None = None, imm: int = 0) -> int:
    """``rd = rs FUNC rt`` (with ``rt``) or ``rd = rs FUNC imm``."""
    if rt is None:
        return _ins(Op.ALU, "alu", rd=rd, rs=rs, func=func, imm=imm)
    return _ins(Op.ALU, "alu", rd=rd, rs=rs, func=func, rt=rt, use_rt=1)


def loop(rs: int, target: int) -> int:
    """``rs -= 1``; to ``target`` while ``rs != 0`` (``branch dbnz, rs, 1, target``)."""
    return branch(Cond.DBNZ, rs, 1, target)


def branch(cond: Cond, rs: int, imm: int, target: int) -> int:
    return _ins(Op.BRANCH, "branch", cond=cond, rs=rs, imm=imm, target=target)


def call(rd: int, rs: int, arg_bits: int, function_id: int, **more: int) -> int:
    """A CALL; ``more``: ``rd_hi``, ``rs1``..``rs3``, ``arg1_bits``..``arg3_bits``."""
    return _ins(Op.CALL, "call", rd=rd, rs=rs, arg_bits=arg_bits, function_id=function_id,
                **more)


# ---- Bus ------------------------------------------------------------------------------------

async def _command(ctx, dut, op: BusOp, byte_addr: int, data: int = 0, be: int = 0xFF):
    assert byte_addr % 8 == 0
    ctx.set(dut.bus_cmd.payload, {"op": op, "word_addr": byte_addr >> 3, "be": be,
                                  "data": data})
    ctx.set(dut.bus_cmd.valid, 1)
    await ctx.tick().until(dut.bus_cmd.ready)
    ctx.set(dut.bus_cmd.valid, 0)


async def bus_write(ctx, dut, byte_addr: int, data: int, be: int = 0xFF):
    await _command(ctx, dut, BusOp.WRITE, byte_addr, data, be)


async def bus_commit(ctx, dut, byte_addr: int, nbytes: int):
    await _command(ctx, dut, BusOp.MAILBOX_COMMIT, byte_addr, nbytes, 0)


async def bus_read(ctx, dut, byte_addr: int, be: int = 0xFF) -> tuple[int, int]:
    """READ the word at ``byte_addr``; returns ``(data, error)``."""
    await _command(ctx, dut, BusOp.READ, byte_addr, 0, be)
    ctx.set(dut.bus_rdata.ready, 1)
    payload, = await ctx.tick().sample(dut.bus_rdata.payload).until(dut.bus_rdata.valid)
    ctx.set(dut.bus_rdata.ready, 0)
    return payload.data, payload.error


async def write32(ctx, dut, addr: int, value: int):
    lane = (addr >> 2) & 1
    await bus_write(ctx, dut, addr & ~7, (value & 0xFFFFFFFF) << (32 * lane), 0xF << (4 * lane))


async def read32(ctx, dut, addr: int) -> int:
    lane = (addr >> 2) & 1
    value, error = await bus_read(ctx, dut, addr & ~7, 0xF << (4 * lane))
    assert not error
    return (value >> (32 * lane)) & 0xFFFFFFFF


async def read_reg(ctx, dut, ppu: int, name: str) -> int:
    return await read32(ctx, dut, ppu_reg(ppu, name))


async def write_reg(ctx, dut, ppu: int, name: str, value: int):
    await write32(ctx, dut, ppu_reg(ppu, name), value)


async def upload(ctx, dut, ppu: int, words: list[int], first: int = 0):
    """Write instructions ``words`` at ring index ``first`` (two 64-bit WRITEs each)."""
    for i, word in enumerate(words):
        addr = ppu_base(ppu) + IMEM_OFFSET + 16 * (first + i)
        await bus_write(ctx, dut, addr, word & (2**64 - 1))
        await bus_write(ctx, dut, addr + 8, word >> 64)


async def upload_env(ctx, dut, ppu: int, samples: list[int], first: int = 0):
    assert first % 4 == 0
    padded = list(samples) + [0] * (-len(samples) % 4)
    for w in range(len(padded) // 4):
        word = 0
        for k in range(4):
            word |= (padded[4 * w + k] & 0xFFFF) << (16 * k)
        await bus_write(ctx, dut, ppu_base(ppu) + ENV_OFFSET + 2 * first + 8 * w, word)


async def trigger(ctx, dut, ppu: int, start: int, tail: int):
    await write_reg(ctx, dut, ppu, "START_TIME_LO", start & 0xFFFFFFFF)
    await write_reg(ctx, dut, ppu, "START_TIME_HI", start >> 32)
    await write_reg(ctx, dut, ppu, "TRIGGER", tail)


async def status(ctx, dut, ppu: int):
    return PPUStatus.from_bits(await read_reg(ctx, dut, ppu, "STATUS"))


async def wait_state(ctx, dut, ppu: int, state: PPUState, limit_cycles: int = 2000):
    """Poll STATUS until ``state``; returns the status."""
    start = ctx.get(dut.now)
    while True:
        st = await status(ctx, dut, ppu)
        if st.state == state:
            return st
        assert ctx.get(dut.now) - start < limit_cycles, f"still {st.state} waiting for {state}"


async def write_mailbox(ctx, dut, ppu: int, payload: bytes):
    """Write ``payload`` into the mailbox (64-bit WRITEs, the last one's bytes enabled)."""
    base = ppu_base(ppu) + MAILBOX_OFFSET
    for w in range(0, len(payload), 8):
        chunk = payload[w:w + 8]
        await bus_write(ctx, dut, base + w, int.from_bytes(chunk, "little"),
                        (1 << len(chunk)) - 1)


async def send_response(ctx, dut, ppu: int, payload: bytes | Response):
    """Write a SEND payload into the mailbox and commit it."""
    if isinstance(payload, Response):
        payload = payload.pack()
    await write_mailbox(ctx, dut, ppu, payload)
    await bus_commit(ctx, dut, ppu_base(ppu) + MAILBOX_OFFSET, len(payload))


class Monitor:
    """Background process recording every cycle's ``now`` and PTD outputs of one PPU."""

    def __init__(self, dut, ppu: int = 0, drive_adc=None):
        self.dut = dut
        self.ppu = ppu
        self.drive_adc = drive_adc     # callable now -> adc sample (readout channel 0)
        self.rows: list[dict] = []

    def add_to(self, sim: Simulator):
        sim.add_process(self.process)

    async def process(self, ctx):
        ptd = self.dut.ptd[self.ppu]
        if self.drive_adc is not None:
            ctx.set(ptd.adc[0], self.drive_adc(0))
        async for _clk, _rst, now, dac, dac_q, active, window, mark in ctx.tick().sample(
                self.dut.now, ptd.dac[0], ptd.dac_q[0], ptd.dac_active, ptd.ro_window,
                ptd.marker):
            self.rows.append({"now": now, "dac": dac, "dac_q": dac_q, "active": active,
                              "window": window, "marker": mark})
            if self.drive_adc is not None:
                ctx.set(ptd.adc[0], self.drive_adc(now + 1))

    def cycles(self, key: str, bit: int | None = None) -> list[int]:
        """The ``now`` values of the cycles where ``key`` (or its bit) was non-zero."""
        out = []
        for row in self.rows:
            v = row[key]
            if bit is not None:
                v = (v >> bit) & 1
            if v:
                out.append(row["now"])
        return out

    def value_at(self, key: str, now: int) -> int:
        for row in self.rows:
            if row["now"] == now:
                return row[key]
        raise KeyError(now)
