"""One pulse processor (PPU): memories, registers, atomic trigger, core, channels, CALL unit.

The PPU is the NVQLink "fast modality" sequencer of docs/architecture.md. Its window of the QSC
memory map (``openqlink.memory_map``) holds the instruction ring, the envelope memory, the
response mailbox and the register block ``PPU_REGISTERS``; the cluster hands it bus commands
already decoded to its window.

Run control (STATUS.state, :class:`~openqlink.isa.PPUState`):

* A bus WRITE to TRIGGER (all four byte lanes of the register enabled; a partial write is
  ignored) with value ``v`` is decided in one cycle: if the PPU is ARMED or RUNNING it is refused
  with ``trigger_busy``; else if ``START_TIME <= now`` it is refused with ``trigger_late``; a
  refused trigger changes nothing but that bit. Otherwise ``TAIL := v``, ``pc := 0``,
  ``t := START_TIME``, r1..r15 := 0, every sticky bit (trigger refusals included) is cleared and
  the state becomes ARMED; the core starts at once and runs ahead of the timeline. STATUS reads
  RUNNING from the cycle ``now == START_TIME``. The trigger is the only way to start.
* TAIL (taken mod ``imem_depth``) may be written at any time: writing it while running appends.
  The core fetches only while ``pc != TAIL``; reaching TAIL before an END is an UNDERFLOW error.
  ``pc`` wraps mod ``imem_depth``; BRANCH targets are absolute indices (mod ``imem_depth``).
* END stops fetching; the state becomes DONE once the PPU is RUNNING and every channel has
  played out its events.
* Errors (UNDERFLOW, LATE, call time-out, call failed, illegal instruction) stop the core, set
  their sticky bit and the state ERROR, and flush the channels: from the next cycle (the first
  in which STATUS reads ERROR) dac, dac_active, ro_window and markers are 0 and the FIFOs empty.

Core: one instruction at a time, 2 cycles (fetch, execute) unless it stalls. r0 reads 0; r1..r15
are 32-bit. PLAY/ACQUIRE/MARKER push ``{time = t + offset_cycles, ...}`` into the channel's FIFO
(stall while full); a channel number beyond the build's channels is an illegal instruction, as
is an ACQUIRE with ``window_cycles == 0``, a CALL with ``arg_bits > 32``, a BRANCH condition
outside :class:`~openqlink.isa.Cond` and any unknown op. Scoreboard: each register has a count
of ACQUIRE results still to land; an instruction that reads a pending register (ADD's and CALL's
``rs``, BRANCH's ``rs`` unless ALWAYS) or writes one (SET, ADD, CALL's ``rd``) stalls until the
count is zero. Several ACQUIREs may target one register; it then holds the last result.
CALL waits for ``rs`` and ``rd``, sends the request, waits for the response (see
:mod:`.callunit`), writes ``rd`` on status 0 and stops with ``call_failed`` otherwise.

Register block (32-bit registers inside 64-bit bus words: register at offset ``o`` is byte lanes
``(o & 4) .. +3`` of word ``o >> 3``; writes honour byte enables). Reads have no side effect but
one: a READ of the word holding TIMELINE_LO whose byte enables include any of lanes 0..3 (or
are all zero, a whole-word read) returns ``now`` in both halves and latches ``now[63:32]``, which
a later read of TIMELINE_HI alone returns. Unused offsets inside the block read 0; words past the
block, the ring, the envelope memory or the mailbox are unmapped (read error, write ignored).

# Ref: openqlink docs/architecture.md (PPU), openqlink.memory_map (PPU window and registers),
# openqlink.isa.layout (instruction word, PPUStatus); ARTIQ RTIO (timeline, LATE, UNDERFLOW);
# NVQLink fast modality (atomic trigger).
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ...isa.layout import (
    INSTRUCTION_BITS,
    NUM_REGISTERS,
    REGISTER_BITS,
    Cond,
    Instruction,
    Op,
    PPUState,
    PPUStatus,
)
from ...memory_map import PPU_REGISTERS, Access, QSCParams
from ..bus import BusCommand, BusOp, BusReadData, CallRequest
from .callunit import MAILBOX_WORDS, CallUnit
from .channels import (
    FIFO_DEPTH,
    DriveChannel,
    MarkerChannel,
    PTDSignature,
    ReadoutChannel,
)

__all__ = ["PPU", "WindowRegion", "LOCAL_ADDR_BITS", "REGION_WORD_BITS", "REGS_WORDS"]

#: Bits of a bus word address inside one PPU window (16 MiB window = 2**21 words).
LOCAL_ADDR_BITS = 21
#: Bits of a word address inside one region of the window (4 MiB = 2**19 words).
REGION_WORD_BITS = 19
#: 64-bit words of the register block that are mapped.
REGS_WORDS = max(r.offset for r in PPU_REGISTERS) // 8 + 1


class WindowRegion(enum.Enum, shape=2):
    """Window regions: bits [23:22] of the byte offset (``memory_map.*_OFFSET``)."""

    IMEM = 0
    ENV = 1
    MAILBOX = 2
    REGS = 3


class _CoreState(enum.Enum, shape=3):
    HALT = 0
    FETCH = 1
    EXEC = 2
    CALL = 3
    DRAIN = 4


def _merge_bytes(old, new, be, nbytes: int):
    """``old`` with the bytes of ``new`` whose ``be`` bit is set replaced."""
    return Cat(*(Mux(be[i], new[8 * i:8 * i + 8], old[8 * i:8 * i + 8]) for i in range(nbytes)))


class PPU(wiring.Component):
    """One pulse processor (``sync`` = dtd).

    Parameters
    ----------
    params : QSCParams
        ``imem_depth`` (instructions, power of two >= 2) and ``env_depth`` (samples, power of
        two >= 4) are used.
    index : int
        PPU number, 0..15 (``CallRequest.ppu``, top byte of request ids).
    n_drive, n_readout, n_marker : int
        Channels of each kind (see :class:`~.channels.PTDSignature`).

    Members
    -------
    now : ``In(64)``
        The shared timeline counter (DTD cycles).
    bus_valid : ``In(1)``; ``bus_cmd : In(BusCommand)``
        A bus command for this PPU's window, one per cycle at most, always accepted.
        ``bus_cmd.word_addr[20:0]`` is the word offset inside the window.
    bus_rdata : ``Out(BusReadData)``
        The answer to a READ, valid in the cycle after the READ (fixed latency 1); ``error`` is
        set for an unmapped offset.
    call_req : ``Out(stream.Signature(CallRequest))``
        CALL requests.
    ptd : ``Out(PTDSignature(n_drive, n_readout, n_marker))``
        The physical interface.
    """

    def __init__(self, params: QSCParams, index: int = 0, *, n_drive: int = 1,
                 n_readout: int = 1, n_marker: int = 4):
        if params.imem_depth < 2:
            raise ValueError(f"imem_depth must be at least 2, not {params.imem_depth}")
        if params.env_depth < 4:
            raise ValueError(f"env_depth must be at least 4, not {params.env_depth}")
        if not 0 <= index < 16:
            raise ValueError(f"index must be 0..15, not {index}")
        self._params = params
        self._index = index
        self._n_drive = n_drive
        self._n_readout = n_readout
        self._n_marker = n_marker
        super().__init__({
            "now": In(64),
            "bus_valid": In(1),
            "bus_cmd": In(BusCommand),
            "bus_rdata": Out(BusReadData),
            "call_req": Out(stream.Signature(CallRequest)),
            "ptd": Out(PTDSignature(n_drive, n_readout, n_marker)),
        })

    def elaborate(self, platform):
        m = Module()
        p = self._params
        imem_depth, env_words = p.imem_depth, p.env_depth // 4
        pc_bits = (imem_depth - 1).bit_length()
        now = self.now

        # ---- Memories ---------------------------------------------------------------------
        m.submodules.imem = imem = Memory(shape=unsigned(INSTRUCTION_BITS), depth=imem_depth,
                                          init=[])
        imem_w = imem.write_port(granularity=8)
        imem_bus_r = imem.read_port()
        imem_core_r = imem.read_port()
        m.submodules.env = env = Memory(shape=unsigned(64), depth=env_words, init=[])
        env_w = env.write_port(granularity=8)
        env_bus_r = env.read_port()

        # ---- Channels and CALL unit --------------------------------------------------------
        drives = [DriveChannel(p.env_depth) for _ in range(self._n_drive)]
        readouts = [ReadoutChannel() for _ in range(self._n_readout)]
        markers = [MarkerChannel() for _ in range(self._n_marker)]
        for kind, chans in (("drive", drives), ("readout", readouts), ("marker", markers)):
            for i, ch in enumerate(chans):
                m.submodules[f"{kind}{i}"] = ch
                m.d.comb += ch.now.eq(now)
        m.submodules.call = call = CallUnit(self._index)
        wiring.connect(m, wiring.flipped(self.call_req), call.call_req)

        for i, ch in enumerate(drives):
            port = env.read_port()
            m.d.comb += [
                port.addr.eq(ch.env_rd_addr),
                ch.env_rd_data.eq(port.data),
                self.ptd.dac[i].eq(ch.dac),
                self.ptd.dac_active[i].eq(ch.active),
            ]
        for i, ch in enumerate(readouts):
            m.d.comb += [ch.adc.eq(self.ptd.adc[i]), self.ptd.ro_window[i].eq(ch.window)]
        for i, ch in enumerate(markers):
            m.d.comb += self.ptd.marker[i].eq(ch.marker)

        # ---- Run state ---------------------------------------------------------------------
        state = Signal(PPUState)           # registered; ARMED until the start time
        cstate = Signal(_CoreState)
        pc = Signal(pc_bits)
        tail = Signal(pc_bits)
        t = Signal(64)
        run_start = Signal(64)
        start_time = Signal(64)
        sticky = Signal(data.StructLayout({
            "underflow": 1, "late": 1, "call_timeout": 1, "call_failed": 1,
            "illegal_instruction": 1, "trigger_busy": 1, "trigger_late": 1,
        }))
        eff_state = Signal(PPUState)
        with m.If((state == PPUState.ARMED) & (now >= run_start)):
            m.d.comb += eff_state.eq(PPUState.RUNNING)
        with m.Else():
            m.d.comb += eff_state.eq(state)
        active = (state == PPUState.ARMED) | (state == PPUState.RUNNING)
        with m.If((state == PPUState.ARMED) & (now >= run_start)):
            m.d.sync += state.eq(PPUState.RUNNING)

        status = Signal(PPUStatus)
        m.d.comb += status.state.eq(eff_state)
        for name in sticky.shape().members:
            m.d.comb += getattr(status, name).eq(getattr(sticky, name))

        # ---- General registers and scoreboard ------------------------------------------------
        regs = [Const(0, REGISTER_BITS)] + [Signal(REGISTER_BITS, name=f"r{i}")
                                            for i in range(1, NUM_REGISTERS)]
        reg_file = Array(regs)
        max_pending = FIFO_DEPTH * self._n_readout
        pending = [Const(0, range(max_pending + 1))] + [
            Signal(range(max_pending + 1), name=f"pending{i}") for i in range(1, NUM_REGISTERS)]
        busy_reg = Array(pend != 0 for pend in pending)

        core_we = Signal()
        core_wrd = Signal(4)
        core_wdata = Signal(REGISTER_BITS)
        acq_issue = Signal()               # an ACQUIRE pushed this cycle, for register acq_rd
        acq_rd = Signal(4)
        clear_regs = Signal()              # accepted trigger
        for i in range(1, NUM_REGISTERS):
            landed = [Mux(ch.result_valid & (ch.result_rd == i), 1, 0) for ch in readouts]
            with m.If(core_we & (core_wrd == i)):
                m.d.sync += regs[i].eq(core_wdata)
            for ch in readouts:
                with m.If(ch.result_valid & (ch.result_rd == i)):
                    m.d.sync += regs[i].eq(ch.result_bit)
            inc = Mux(acq_issue & (acq_rd == i), 1, 0)
            m.d.sync += pending[i].eq(pending[i] + inc - sum(landed))
            with m.If(clear_regs):
                m.d.sync += [regs[i].eq(0), pending[i].eq(0)]

        # ---- Core ------------------------------------------------------------------------
        insn = Instruction(imem_core_r.data)
        next_pc = (pc + 1)[:pc_bits]
        m.d.comb += [imem_core_r.addr.eq(pc), imem_core_r.en.eq(0)]
        err_underflow = Signal()
        err_illegal = Signal()
        advance = Signal()
        push = {
            "drive": [Signal(name=f"push_drive{i}") for i in range(self._n_drive)],
            "readout": [Signal(name=f"push_readout{i}") for i in range(self._n_readout)],
            "marker": [Signal(name=f"push_marker{i}") for i in range(self._n_marker)],
        }

        def push_event(kind: str, chans, channel, fields: dict, extra_ok=None):
            """Push to ``chans[channel]``; illegal if the channel does not exist or
            ``extra_ok`` (a 1-bit value) is low."""
            ready = Array(ch.event.ready for ch in chans)[channel[:4]]
            bad = channel >= len(chans)
            if extra_ok is not None:
                bad = bad | ~extra_ok
            with m.If(bad):
                m.d.comb += err_illegal.eq(1)
            with m.Else():
                for i, ch in enumerate(chans):
                    m.d.comb += push[kind][i].eq(channel == i)
                    for k, v in fields.items():
                        m.d.comb += getattr(ch.event.payload, k).eq(v)
                with m.If(ready):
                    m.d.comb += advance.eq(1)
            return ready

        for kind, chans in (("drive", drives), ("readout", readouts), ("marker", markers)):
            for i, ch in enumerate(chans):
                m.d.comb += ch.event.valid.eq(push[kind][i])

        with m.Switch(cstate):
            with m.Case(_CoreState.FETCH):
                with m.If(pc == tail):
                    m.d.comb += err_underflow.eq(1)
                with m.Else():
                    m.d.comb += imem_core_r.en.eq(1)
                    m.d.sync += cstate.eq(_CoreState.EXEC)
            with m.Case(_CoreState.EXEC):
                with m.Switch(insn.op):
                    with m.Case(Op.NOP):
                        m.d.comb += advance.eq(1)
                    with m.Case(Op.END):
                        m.d.sync += cstate.eq(_CoreState.DRAIN)
                    with m.Case(Op.WAIT):
                        m.d.sync += t.eq(t + insn.operands.wait.cycles)
                        m.d.comb += advance.eq(1)
                    with m.Case(Op.SYNC):
                        # Never anchor before the start time: while ARMED, "now" on the
                        # program's timeline is the start time.
                        m.d.sync += t.eq(Mux(now > run_start, now, run_start)
                                         + insn.operands.sync.slack_cycles)
                        m.d.comb += advance.eq(1)
                    with m.Case(Op.SET):
                        o = insn.operands.set
                        with m.If(~busy_reg[o.rd]):
                            m.d.comb += [core_we.eq(1), core_wrd.eq(o.rd),
                                         core_wdata.eq(o.imm), advance.eq(1)]
                    with m.Case(Op.ADD):
                        o = insn.operands.add
                        with m.If(~busy_reg[o.rd] & ~busy_reg[o.rs]):
                            m.d.comb += [core_we.eq(1), core_wrd.eq(o.rd),
                                         core_wdata.eq(reg_file[o.rs] + o.imm), advance.eq(1)]
                    with m.Case(Op.BRANCH):
                        o = insn.operands.branch
                        rs = reg_file[o.rs].as_signed()
                        taken = Signal()
                        with m.Switch(o.cond):
                            with m.Case(Cond.ALWAYS):
                                m.d.comb += taken.eq(1)
                            with m.Case(Cond.EQ):
                                m.d.comb += taken.eq(rs == o.imm)
                            with m.Case(Cond.NE):
                                m.d.comb += taken.eq(rs != o.imm)
                            with m.Case(Cond.LT):
                                m.d.comb += taken.eq(rs < o.imm)
                            with m.Case(Cond.GE):
                                m.d.comb += taken.eq(rs >= o.imm)
                        legal = ((o.cond == Cond.ALWAYS) | (o.cond == Cond.EQ) |
                                 (o.cond == Cond.NE) | (o.cond == Cond.LT) |
                                 (o.cond == Cond.GE))
                        with m.If(~legal):
                            m.d.comb += err_illegal.eq(1)
                        with m.Elif((o.cond == Cond.ALWAYS) | ~busy_reg[o.rs]):
                            with m.If(taken):
                                m.d.sync += [pc.eq(o.target[:pc_bits]),
                                             cstate.eq(_CoreState.FETCH)]
                            with m.Else():
                                m.d.comb += advance.eq(1)
                    with m.Case(Op.PLAY):
                        o = insn.operands.play
                        push_event("drive", drives, o.channel, {
                            "time": t + o.offset_cycles, "env_addr": o.env_addr,
                            "env_len": o.env_len, "amplitude": o.amplitude,
                            "phase": o.phase, "freq_word": o.freq_word,
                        })
                    with m.Case(Op.ACQUIRE):
                        o = insn.operands.acquire
                        ready = push_event("readout", readouts, o.channel, {
                            "time": t + o.offset_cycles, "window_cycles": o.window_cycles,
                            "threshold": o.threshold, "rd": o.rd,
                        }, extra_ok=o.window_cycles != 0)
                        with m.If((o.channel < len(readouts)) & (o.window_cycles != 0) &
                                  ready):
                            m.d.comb += [acq_issue.eq(1), acq_rd.eq(o.rd)]
                    with m.Case(Op.MARKER):
                        o = insn.operands.marker
                        push_event("marker", markers, o.channel, {
                            "time": t + o.offset_cycles, "duration_cycles": o.duration_cycles,
                        })
                    with m.Case(Op.CALL):
                        o = insn.operands.call
                        with m.If(o.arg_bits > 32):
                            m.d.comb += err_illegal.eq(1)
                        with m.Elif(~busy_reg[o.rs] & ~busy_reg[o.rd] & ~call.busy):
                            m.d.comb += [
                                call.issue.eq(1),
                                call.function_id.eq(o.function_id),
                                call.arg.eq(reg_file[o.rs]),
                                call.arg_bits.eq(o.arg_bits),
                            ]
                            m.d.sync += cstate.eq(_CoreState.CALL)
                    with m.Default():
                        m.d.comb += err_illegal.eq(1)
            with m.Case(_CoreState.CALL):
                with m.If(call.done):
                    o = insn.operands.call
                    m.d.comb += [core_we.eq(1), core_wrd.eq(o.rd), core_wdata.eq(call.result),
                                 advance.eq(1)]
            with m.Case(_CoreState.DRAIN):
                all_idle = Cat(*(ch.idle for ch in drives + readouts + markers)).all()
                with m.If(all_idle & (eff_state == PPUState.RUNNING)):
                    m.d.sync += [state.eq(PPUState.DONE), cstate.eq(_CoreState.HALT)]
        with m.If(advance):
            m.d.sync += [pc.eq(next_pc), cstate.eq(_CoreState.FETCH)]

        # ---- Errors ------------------------------------------------------------------------
        lates = Cat(*(ch.late for ch in drives + readouts + markers))
        late_events = Signal(32)
        errors = {
            "underflow": err_underflow,
            "late": lates.any(),
            "call_timeout": call.timeout,
            "call_failed": call.failed,
            "illegal_instruction": err_illegal,
        }
        error_set = Signal()
        m.d.comb += error_set.eq(active & Cat(*errors.values()).any())
        with m.If(active):
            m.d.sync += late_events.eq(late_events + sum(ch.late for ch in
                                                         drives + readouts + markers))
        with m.If(error_set):
            m.d.sync += [state.eq(PPUState.ERROR), cstate.eq(_CoreState.HALT)]
            for name, sig in errors.items():
                with m.If(sig):
                    m.d.sync += getattr(sticky, name).eq(1)
        flush = error_set | (state == PPUState.ERROR)
        for ch in drives + readouts + markers:
            m.d.comb += ch.flush.eq(flush)
        m.d.comb += call.abort.eq(error_set)

        # ---- Bus: decode ------------------------------------------------------------------
        cmd = self.bus_cmd
        local = cmd.word_addr[:LOCAL_ADDR_BITS]
        region = WindowRegion(local[REGION_WORD_BITS:LOCAL_ADDR_BITS])
        off = local[:REGION_WORD_BITS]
        mapped = Signal()
        with m.Switch(region):
            with m.Case(WindowRegion.IMEM):
                m.d.comb += mapped.eq(off < 2 * imem_depth)
            with m.Case(WindowRegion.ENV):
                m.d.comb += mapped.eq(off < env_words)
            with m.Case(WindowRegion.MAILBOX):
                m.d.comb += mapped.eq(off < MAILBOX_WORDS)
            with m.Case(WindowRegion.REGS):
                m.d.comb += mapped.eq(off < REGS_WORDS)
        is_write = self.bus_valid & (cmd.op == BusOp.WRITE) & mapped
        is_read = self.bus_valid & (cmd.op == BusOp.READ)

        # Memory writes.
        m.d.comb += [
            imem_w.addr.eq(off[1:]),
            imem_w.data.eq(Cat(cmd.data, cmd.data)),
            imem_w.en.eq(Mux(is_write & (region == WindowRegion.IMEM),
                             Mux(off[0], cmd.be << 8, cmd.be), 0)),
            env_w.addr.eq(off),
            env_w.data.eq(cmd.data),
            env_w.en.eq(Mux(is_write & (region == WindowRegion.ENV), cmd.be, 0)),
            imem_bus_r.addr.eq(off[1:]),
            env_bus_r.addr.eq(off),
            call.mb_we.eq(is_write & (region == WindowRegion.MAILBOX)),
            call.mb_addr.eq(off),
            call.mb_be.eq(cmd.be),
            call.mb_data.eq(cmd.data),
            call.mb_raddr.eq(off),
            call.commit.eq(self.bus_valid & (cmd.op == BusOp.MAILBOX_COMMIT) &
                           (region == WindowRegion.MAILBOX)),
            call.commit_bytes.eq(cmd.data[:16]),
        ]

        # ---- Register block ------------------------------------------------------------------
        call_timeout = Signal(32, init=_reset_of("CALL_TIMEOUT_CYCLES"))
        m.d.comb += call.timeout_cycles.eq(call_timeout)
        timeline_hi = Signal(32)
        rw = {
            "TAIL": tail,
            "START_TIME_LO": start_time[:32],
            "START_TIME_HI": start_time[32:],
            "CALL_TIMEOUT_CYCLES": call_timeout,
        }
        values = {
            **rw,
            "TRIGGER": Const(0, 32),
            "STATUS": status.as_value(),
            "PC": pc,
            "TIMELINE_LO": now[:32],
            "TIMELINE_HI": timeline_hi,
            "LAST_CALL_STATUS": call.last_status,
            "CALL_COUNT": call.call_count,
            "STALE_RESPONSES": call.stale,
            "LAST_RTT_CYCLES": call.last_rtt_cycles,
            "LATE_EVENTS": late_events,
            **{f"R{i}": regs[i] for i in range(NUM_REGISTERS)},
        }
        word_values = [[Const(0, 32), Const(0, 32)] for _ in range(REGS_WORDS)]
        for r in PPU_REGISTERS:
            word_values[r.offset >> 3][(r.offset >> 2) & 1] = _u32(values[r.name])
            if r.access is Access.RW and r.name not in rw:
                raise NotImplementedError(f"PPU register {r.name} is RW but not implemented")
        trigger_reg = next(r for r in PPU_REGISTERS if r.name == "TRIGGER")
        tl_reg = next(r for r in PPU_REGISTERS if r.name == "TIMELINE_LO")
        tl_hi_reg = next(r for r in PPU_REGISTERS if r.name == "TIMELINE_HI")
        assert tl_hi_reg.offset == tl_reg.offset + 4 and tl_reg.offset % 8 == 0

        regs_write = is_write & (region == WindowRegion.REGS)
        for r in PPU_REGISTERS:
            if r.name in rw:
                lane = (r.offset >> 2) & 1
                with m.If(regs_write & (off == r.offset >> 3)):
                    be = cmd.be[4 * lane:4 * lane + 4]
                    new = _merge_bytes(_u32(rw[r.name]), cmd.data[32 * lane:32 * lane + 32], be, 4)
                    m.d.sync += rw[r.name].eq(new)

        # Atomic trigger.
        t_lane = (trigger_reg.offset >> 2) & 1
        trig = (regs_write & (off == trigger_reg.offset >> 3) &
                (cmd.be[4 * t_lane:4 * t_lane + 4] == 0xF))
        trig_value = cmd.data[32 * t_lane:32 * t_lane + 32]
        with m.If(trig):
            with m.If(active):
                m.d.sync += sticky.trigger_busy.eq(1)
            with m.Elif(start_time <= now):
                m.d.sync += sticky.trigger_late.eq(1)
            with m.Else():
                m.d.comb += clear_regs.eq(1)
                m.d.sync += [
                    tail.eq(trig_value[:pc_bits]),
                    pc.eq(0),
                    t.eq(start_time),
                    run_start.eq(start_time),
                    sticky.eq(0),
                    state.eq(PPUState.ARMED),
                    cstate.eq(_CoreState.FETCH),
                ]

        # Reads: registered, valid the cycle after the READ.
        rd_region = Signal(WindowRegion)
        rd_half = Signal()
        rd_error = Signal()
        rd_reg = Signal(64)
        rd_mb = Signal(64)
        tl_read = is_read & (region == WindowRegion.REGS) & (off == tl_reg.offset >> 3)
        tl_lo_lanes = (cmd.be[:4] != 0) | (cmd.be == 0)
        with m.If(tl_read & tl_lo_lanes):
            m.d.sync += timeline_hi.eq(now[32:])
        word_mux = Array(Cat(*w) for w in word_values)
        with m.If(is_read):
            m.d.sync += [
                rd_region.eq(region),
                rd_half.eq(off[0]),
                rd_error.eq(~mapped),
                rd_mb.eq(call.mb_rdata),
                rd_reg.eq(Mux(tl_read & tl_lo_lanes, now, word_mux[off[:4]])),
            ]
        m.d.comb += [imem_bus_r.en.eq(is_read), env_bus_r.en.eq(is_read)]
        rdata = Signal(64)
        with m.Switch(rd_region):
            with m.Case(WindowRegion.IMEM):
                m.d.comb += rdata.eq(Mux(rd_half, imem_bus_r.data[64:], imem_bus_r.data[:64]))
            with m.Case(WindowRegion.ENV):
                m.d.comb += rdata.eq(env_bus_r.data)
            with m.Case(WindowRegion.MAILBOX):
                m.d.comb += rdata.eq(rd_mb)
            with m.Case(WindowRegion.REGS):
                m.d.comb += rdata.eq(rd_reg)
        m.d.comb += [
            self.bus_rdata.data.eq(Mux(rd_error, 0, rdata)),
            self.bus_rdata.error.eq(rd_error),
        ]
        return m


def _reset_of(name: str) -> int:
    return next(r.reset for r in PPU_REGISTERS if r.name == name)



def _u32(value):
    """``value`` zero-extended to 32 bits (register read mux lanes)."""
    value = Value.cast(value).as_unsigned()
    return value if len(value) >= 32 else Cat(value, Const(0, 32 - len(value)))
