"""One pulse processor (PPU): memories, registers, atomic trigger, core, channels, CALL unit.

The PPU is the NVQLink "fast modality" sequencer of docs/architecture.md. Its window of the QSC
memory map (``openqlink.memory_map``) holds the instruction ring, the envelope memory, the
response mailbox and the register block ``PPU_REGISTERS``; the cluster hands it bus commands
already decoded to its window.

Run control (STATUS.state, :class:`~openqlink.isa.PPUState`):

* A bus WRITE to TRIGGER (all four byte lanes of the register enabled; a partial write is
  ignored) with value ``v`` is decided in one cycle, the cycle after the PPU decodes it (the
  trigger stage): if the PPU is ARMED or RUNNING it is refused with ``trigger_busy``; else if
  ``START_TIME <= now`` (in the deciding cycle) it is refused with ``trigger_late``; else if
  ``v[31]`` asks for the upload check and ``v[30:16]`` differs from UPLOAD_WORDS mod 2**15 (a
  lost upload packet) it is refused with ``trigger_incomplete``; a refused trigger changes
  nothing but that bit. Otherwise TAIL := ``v`` mod ``imem_depth``, HEAD := 0, UPLOAD_WORDS :=
  0, ``pc := 0``, ``t := START_TIME``, r1..r15 := 0, every sticky bit (trigger refusals
  included) is cleared and the state becomes ARMED; the core starts at once and runs ahead of
  the timeline. STATUS reads
  RUNNING from the cycle ``now == START_TIME``. The trigger is the only way to start.
* TAIL and HEAD (taken mod ``imem_depth``) may be written at any time: writing TAIL while
  running appends, writing HEAD releases slots. The committed range is HEAD .. TAIL - 1 (mod
  ``imem_depth``; a trigger sets HEAD to 0). The core fetches sequentially only while ``pc !=
  TAIL``; reaching TAIL before an END, or a BRANCH to a slot outside the range, is an UNDERFLOW
  error (the slot is read but never executed). ``pc`` wraps mod ``imem_depth``; BRANCH targets
  are absolute indices (mod ``imem_depth``). While ARMED or RUNNING, a bus WRITE into the
  range (the range an accepted trigger commits, from the trigger stage's cycle) is refused and
  counted in IMEM_WRITES_REFUSED.
* END stops fetching; the state becomes DONE once the PPU is RUNNING and every channel has
  played out its events.
* Errors (UNDERFLOW, LATE, SEQUENCE: an event not after its channel's previous one, call
  time-out, call failed, illegal instruction) stop the core, set their sticky bit and the
  state ERROR, and flush the channels. Both are registered: an error detected in cycle ``c``
  is in the error stage in ``c + 1`` (no CALL is issued then), STATUS reads ERROR from
  ``c + 2`` and, from ``c + 3``, dac, dac_active, ro_window and markers are 0 and the FIFOs
  empty. A late event never fires.

Core pipeline (DTD cycles): instruction memory read (address ``fetch_pc``) -> memory output
-> ``o_insn`` (the memory output registered, nothing between them: the build moves it into the
block RAM's output register) -> fetched-instruction register ``f_*`` -> decode (``t +
offset_cycles``, channel selects, legality, scoreboard mask) -> execute-stage registers ``x_*``
(the instruction word and its sums load whenever the stage is open, the control only with the
instruction). Fetching runs ahead of execution up to three instructions. The execute stage
takes the next instruction when it is empty, so an instruction takes 2 cycles unless it stalls
(as an unpipelined fetch-execute core), and the decode stage always sees the ``t`` its
predecessor wrote. A BRANCH takes 4 cycles, 5 when taken: the cycle it enters the execute
stage it reads its target from the instruction memory, and evaluates its condition into a
register (``br_*``); once both are ready, the selected instruction (the fetched one, or the
decoded target) enters the execute stage directly. After a taken BRANCH the fetch restarts
behind the target, whose successor comes 3 cycles later than an instruction in sequence.
While a BRANCH waits for a pending ``rs``, both paths are thus ready when the measurement lands;
and its condition is decided on the bit landing in that very cycle (``settle``/``land_bit``:
``rs`` is written only by the ACQUIREs it waits for, so it is that bit). Measurement ->
conditional pulse (last ADC sample of the window to the first DAC sample of the PLAY on either
path): 8 cycles (the results are registered once in the core).

r0 reads 0; r1..r15 are 32-bit. PLAY/ACQUIRE/MARKER push ``{time = t + offset_cycles, ...}``
into the channel's FIFO (stall while full); a channel number beyond the build's channels is an
illegal instruction, as is an ACQUIRE with ``window_cycles == 0``, a CALL with
``arg_bits > 32`` or more argument bytes than the build's ``call_arg_bytes``, an ALU function
beyond SRA (any ALU in a build without ``alu``), a BRANCH condition outside
:class:`~openqlink.isa.Cond` and any unknown op.
Scoreboard: each register has a count of ACQUIRE results still to land; an instruction that
reads a pending register (ADD's and CALL's ``rs``, ALU's ``rs`` and ``rt``, BRANCH's ``rs`` unless
ALWAYS) or writes one (SET, ADD, ALU, LOOP's ``rs``, CALL's ``rd``) stalls until the count is
zero. ALU computes ``rs FUNC (rt or imm)`` into a register (5 cycles); LOOP is a BRANCH that
writes ``rs - 1`` through ADD's adder as it retires. Several ACQUIREs may target one
register; it then holds the last result. CALL waits for its argument registers, ``rd`` and
``rd_hi``, gathers its argument bytes (one per cycle), sends the request, waits for the response
(see :mod:`.callunit`), writes ``rd`` (and ``rd_hi`` a cycle later) on status 0 and stops with
``call_failed`` otherwise.

Register block (32-bit registers inside 64-bit bus words: register at offset ``o`` is byte lanes
``(o & 4) .. +3`` of word ``o >> 3``; writes honour byte enables). Reads have no side effect but
two: a READ of the word holding TIMELINE_LO whose byte enables include any of lanes 0..3 (or
are all zero, a whole-word read) returns ``now`` in both halves and latches ``now[63:32]``, which
a later read of TIMELINE_HI alone returns; a READ of a readout channel's I_LO word so enabled
returns the live I_LO and I_HI and latches I_HI, Q and IQ_COUNT (:mod:`.calib`), which later
reads of them return. Readout channel ``c``'s four words follow at ``READOUT_OFFSET + 32 c``
(the fourth reads 0), the trace memory (``trace_depth > 0``, read only) at ``TRACE_OFFSET``.
Unused offsets inside the block read 0; words past the block, the readout channels, the trace,
the ring, the envelope memory or the mailbox are unmapped (read error, write ignored).

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
    AluFunc,
    Cond,
    Instruction,
    Op,
    PPUState,
    PPUStatus,
)
from ...memory_map import (
    PPU_REGISTERS,
    READOUT_OFFSET,
    READOUT_STRIDE,
    REGS_OFFSET,
    TRACE_OFFSET,
    Access,
    QSCParams,
)
from .. import bram
from ..bus import MAX_CALL_ARG_BYTES, BusCommand, BusOp, BusReadData, call_request_layout
from ..logic import kept
from .calib import ReadoutCalibration
from .callunit import MAILBOX_WORDS, CallUnit
from .channels import (
    FIFO_DEPTH,
    DriveChannel,
    MarkerChannel,
    PTDSignature,
    ReadoutChannel,
    add_small,
    equal,
    less,
)

__all__ = ["PPU", "WindowRegion", "LOCAL_ADDR_BITS", "REGION_WORD_BITS", "REGS_WORDS"]

#: Bits of a bus word address inside one PPU window (16 MiB window = 2**21 words).
LOCAL_ADDR_BITS = 21
#: Bits of a word address inside one region of the window (4 MiB = 2**19 words).
REGION_WORD_BITS = 19
#: 64-bit words of the register block that are mapped.
REGS_WORDS = max(r.offset for r in PPU_REGISTERS) // 8 + 1
#: The readout channels' registers in the REGS region: channel ``c``'s word ``j`` (0..3) is word
#: ``_RO_WORD + 4 c + j``, so bits [18:6] of the region's word offset are 1 for them.
_RO_WORD = READOUT_OFFSET // 8
assert _RO_WORD == 64 and READOUT_STRIDE == 32
#: The trace memory in the REGS region: the region's word offset with bit 18 set.
_TRACE_BIT = (TRACE_OFFSET - REGS_OFFSET).bit_length() - 4
assert TRACE_OFFSET - REGS_OFFSET == 8 << _TRACE_BIT and _TRACE_BIT == 18
#: Memory attribute: a read of the word that another port writes in the same cycle returns
#: undefined data (the block RAM's own behaviour), so no collision logic follows the block
#: RAM's output. The bus writes a word the core or a channel reads only while it is being
#: overwritten anyway; a bus READ and WRITE never share a cycle.
_NO_RW_CHECK = {"no_rw_check": True}
#: Groups of ``f_insn`` that each have an enable (and an ``o_valid`` copy) of their own.
_FETCH_GROUPS = 4
#: Bits of one slice of the instruction and envelope memories (see :class:`_SlicedMemory`).
_SLICE_BITS = 16


class WindowRegion(enum.Enum, shape=2):
    """Window regions: bits [23:22] of the byte offset (``memory_map.*_OFFSET``)."""

    IMEM = 0
    ENV = 1
    MAILBOX = 2
    REGS = 3


class _CoreMode(enum.Enum, shape=2):
    HALT = 0
    RUN = 1        # fetching and executing
    DRAIN = 2      # END executed: waiting for the channels to play out


def _merge_bytes(old, new, be, nbytes: int):
    """``old`` with the bytes of ``new`` whose ``be`` bit is set replaced."""
    return Cat(*(Mux(be[i], new[8 * i:8 * i + 8], old[8 * i:8 * i + 8]) for i in range(nbytes)))


class PPU(wiring.Component):
    """One pulse processor (``sync`` = dtd).

    Parameters
    ----------
    params : QSCParams
        ``imem_depth`` (instructions, power of two >= 2), ``env_depth`` (samples, power of
        two >= 4) and ``timeline_bits`` (the width of ``now`` and of every time) are used.
    index : int
        PPU number, 0..15 (``CallRequest.ppu``, top byte of request ids).
    n_drive, n_readout, n_marker : int
        Channels of each kind (see :class:`~.channels.PTDSignature`).

    Members
    -------
    now : ``In(timeline_bits)``
        The shared timeline counter (DTD cycles).
    bus_valid : ``In(1)``; ``bus_cmd : In(BusCommand)``
        A bus command for this PPU's window, one per cycle at most, always accepted.
        ``bus_cmd.word_addr[20:0]`` is the word offset inside the window.
    bus_rdata : ``Out(BusReadData)``
        The answer to a READ, valid :attr:`READ_LATENCY` cycles after the READ; ``error`` is
        set for an unmapped offset.
    call_req : ``Out(stream.Signature(call_request_layout(params.call_arg_bytes)))``
        CALL requests, of at most ``params.call_arg_bytes`` argument bytes.
    ptd : ``Out(PTDSignature(n_drive, n_readout, n_marker, samples_per_cycle))``
        The physical interface.
    barrier_arrive : ``Out(1)``; barrier_mask : ``Out(16)``
        A BARRIER waits in the execute stage, for the PPUs of ``barrier_mask`` (this one's bit
        set).
    barrier_go : ``In(1)``
        Releases it in this cycle (the cluster's answer, the same cycle for every PPU of the
        mask; tie to ``barrier_arrive`` for a PPU alone).
    """

    #: Cycles from a READ on ``bus_valid`` to its answer on ``bus_rdata``: command stage,
    #: request stage, part stage, answer stage.
    READ_LATENCY = 4

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
            "now": In(params.timeline_bits),
            "bus_valid": In(1),
            "bus_cmd": In(BusCommand),
            "bus_rdata": Out(BusReadData),
            "call_req": Out(stream.Signature(call_request_layout(params.call_arg_bytes))),
            "ptd": Out(PTDSignature(n_drive, n_readout, n_marker, params.samples_per_cycle)),
            "barrier_arrive": Out(1),
            "barrier_mask": Out(16),
            "barrier_go": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = self._params
        imem_depth, env_words = p.imem_depth, p.env_depth // 4
        pc_bits = (imem_depth - 1).bit_length()
        now = self.now

        # ---- Memories ---------------------------------------------------------------------
        imem = _SlicedMemory(m, "imem", INSTRUCTION_BITS, imem_depth)
        imem_w = imem.write_port()
        imem_bus_r = imem.read_port()
        imem_core_r = imem.read_port()
        # Each envelope byte is stored with "it is the byte of -32768 at its place in a sample"
        # (0x00 low, 0x80 high), for the drive channels' saturation (``env_rd_min``).
        env = _SlicedMemory(m, "env", 64, env_words,
                            byte_flag=lambda g, byte: byte == (0x80 if g % 2 else 0x00))
        env_w = env.write_port()
        env_bus_r = env.read_port()

        # ---- Channels and CALL unit --------------------------------------------------------
        tb = p.timeline_bits
        spc = p.samples_per_cycle
        drives = [DriveChannel(p.env_depth, time_bits=tb, samples_per_cycle=spc, nco=p.nco)
                  for _ in range(self._n_drive)]
        readouts = [ReadoutChannel(time_bits=tb, samples_per_cycle=spc, nco=p.nco)
                    for _ in range(self._n_readout)]
        markers = [MarkerChannel(time_bits=tb) for _ in range(self._n_marker)]
        for kind, chans in (("drive", drives), ("readout", readouts), ("marker", markers)):
            for i, ch in enumerate(chans):
                m.submodules[f"{kind}{i}"] = ch
                m.d.comb += ch.now.eq(now)
        m.submodules.call = call = CallUnit(self._index, p.call_arg_bytes)
        wiring.connect(m, wiring.flipped(self.call_req), call.call_req)

        for i, ch in enumerate(drives):
            port = env.read_port()
            m.d.comb += [
                port.addr.eq(ch.env_rd_addr),
                ch.env_rd_data.eq(port.data),
                ch.env_rd_min.eq(port.flags),
                *(self.ptd.dac[spc * i + k].eq(ch.dac[k]) for k in range(spc)),
                *(self.ptd.dac_q[spc * i + k].eq(ch.dac_q[k]) for k in range(spc)),
                self.ptd.dac_active[i].eq(ch.active),
            ]
        for i, ch in enumerate(readouts):
            m.d.comb += [*(ch.adc[k].eq(self.ptd.adc[spc * i + k]) for k in range(spc)),
                         self.ptd.ro_window[i].eq(ch.window)]
        for i, ch in enumerate(markers):
            m.d.comb += self.ptd.marker[i].eq(ch.marker)

        # ---- Run state ---------------------------------------------------------------------
        state = Signal(PPUState)           # registered; ARMED until the start time
        mode = Signal(_CoreMode)
        pc = Signal(pc_bits)               # the instruction in the execute stage, or the next
        tail = Signal(pc_bits)
        head = Signal(pc_bits)             # the committed range is head .. tail - 1 (mod depth)
        t = Signal(tb)
        run_start = Signal(tb)
        start_time = Signal(tb)

        # ``head`` and ``tail`` of the next cycle (a trigger's, then a register write's, which
        # wins), for the bus's write lock a stage ahead; ``head_w``/``tail_w`` (the register
        # writes' alone) and ``head_t``/``tail_t`` (with a trigger's), each a LUT or two from
        # flip-flops, so that the lock compares both and the trigger chooses last.
        head_d = Signal(pc_bits)
        tail_d = Signal(pc_bits)
        head_w = Signal(pc_bits)
        tail_w = Signal(pc_bits)
        head_t = Signal(pc_bits)
        tail_t = Signal(pc_bits)
        m.d.sync += [head.eq(head_d), tail.eq(tail_d)]

        def committed(index, first=head, end=tail):
            """``index`` is in the committed range ``first .. end - 1`` (mod ``imem_depth``):
            three compares side by side and one LUT; empty when ``first == end``."""
            after_head = first <= index
            before_tail = index < end
            return Mux(first <= end, after_head & before_tail, after_head | before_tail)
        sticky = Signal(data.StructLayout({
            "underflow": 1, "late": 1, "call_timeout": 1, "call_failed": 1,
            "illegal_instruction": 1, "trigger_busy": 1, "trigger_late": 1, "sequence": 1,
            "trigger_incomplete": 1,
        }))
        started = Signal()                 # now >= START_TIME of the run, registered
        # ``now + 2``, registered (``now`` advances by one every cycle): ``time <= now + 1`` is
        # ``time < now_p2``, one carry chain from flip-flops.
        now_p2 = Signal(tb, init=2)
        m.d.sync += now_p2.eq(add_small(now, 3))
        run_due = less(m, run_start, now_p2, "run_due")

        m.d.sync += started.eq(run_due)
        # SYNC's anchor is never before the start time (while ARMED, "now" on the program's
        # timeline is the start time): ``run_due ? now + 1 : START_TIME`` in the cycle before
        # SYNC executes (the cycle it enters the execute stage, below). ``sync_anchor`` is that
        # value registered from the cycle before: the two differ only in the cycle that
        # ``run_due`` rises, where ``START_TIME == now + 1``, or right after a trigger, when
        # no instruction enters the execute stage.
        # Its choice is ``run_due`` computed a cycle early (``run_start <= now_p2``,
        # registered), wrong only in the cycle after a trigger writes ``run_start``, two cycles
        # before the fetch restarted by the trigger can bring an instruction to decode: no
        # carry chain in front of the choice.
        sync_anchor = Signal(tb)
        run_due_early = Signal()
        m.d.sync += [run_due_early.eq(~less(m, now_p2, run_start, "run_due_early")),
                     sync_anchor.eq(Mux(run_due_early, add_small(now, 2), run_start))]
        eff_state = Signal(PPUState)
        with m.If((state == PPUState.ARMED) & started):
            m.d.comb += eff_state.eq(PPUState.RUNNING)
        with m.Else():
            m.d.comb += eff_state.eq(state)
        # ``state`` is ARMED or RUNNING: a flip-flop, set and cleared with ``state``.
        active = Signal()
        with m.If((state == PPUState.ARMED) & started):
            m.d.sync += state.eq(PPUState.RUNNING)

        status = Signal(PPUStatus)
        m.d.comb += status.state.eq(eff_state)
        for name in sticky.shape().members:
            m.d.comb += getattr(status, name).eq(getattr(sticky, name))

        # ---- General registers and scoreboard ------------------------------------------------
        regs = [Const(0, REGISTER_BITS)] + [Signal(REGISTER_BITS, name=f"r{i}")
                                            for i in range(1, NUM_REGISTERS)]
        max_pending = FIFO_DEPTH * self._n_readout + self._n_readout
        pending = [Const(0, range(max_pending + 1))] + [
            Signal(range(max_pending + 1), name=f"pending{i}") for i in range(1, NUM_REGISTERS)]
        busy = Signal(NUM_REGISTERS)       # registers with ACQUIRE results still to land
        pend_one = Signal(NUM_REGISTERS)   # ... exactly one

        core_we = Signal()
        core_wrd = Signal(4)
        core_wdata = Signal(REGISTER_BITS)
        # Register write stage: the execute stage's write, registered, lands a cycle later
        # (before the next instruction, which enters the execute stage two cycles later at the
        # earliest, reads it). The destination is registered one-hot: a register's enable is
        # its bit of ``wr_hot``, its landing result or the trigger's clear.
        wr_hot = Signal(NUM_REGISTERS)
        wr_data = Signal(REGISTER_BITS)
        m.d.sync += [wr_hot.eq(Mux(core_we, 1 << core_wrd, 0)), wr_data.eq(core_wdata)]
        # Each channel's ``flush`` is a flip-flop of its own that is high while ``state`` is
        # ERROR: set and cleared in the same statements as ``state`` (no compare, and no one
        # net across the PPU in front of the registers every channel clears).
        flush = [Signal(name=f"flush__rep{k}")
                 for k in range(len(drives + readouts + markers))]
        # The readout channels' results, registered once more here: the channel's result
        # registers feed only these, so they sit by the channel's logic, and the register file
        # and scoreboard start at flip-flops of their own. A result lands a cycle after the
        # channel presents it; cleared with the channel's flush.
        results = []
        for ch, f in zip(readouts, flush[len(drives):len(drives) + len(readouts)], strict=True):
            res = Signal(data.StructLayout({"valid": 1, "rd": 4, "bit": 1, "hit": 16}),
                         name=f"result{len(results)}")
            m.d.sync += res.eq(Mux(f, 0, Cat(ch.result_valid, ch.result_rd, ch.result_bit,
                                             ch.result_hit)))
            results.append(res)
        acq_issue = Signal()               # an ACQUIRE pushed this cycle, for register acq_rd
        acq_rd = Signal(4)
        clear_regs = Signal()              # accepted trigger
        # The scoreboard counts an ACQUIRE the cycle after it is pushed (registered): the next
        # instruction enters the execute stage two cycles after the push at the earliest, and
        # its result lands later still.
        # One-hot: bit i counts an ACQUIRE for register i.
        acq_inc = Signal(NUM_REGISTERS)
        m.d.sync += acq_inc.eq(Mux(acq_issue, 1 << acq_rd, 0))
        # ``busy`` of the next cycle, but for an accepted trigger (which clears it); with one
        # readout channel each bit is a function of four flip-flops, one LUT.
        busy_held = Signal(NUM_REGISTERS)
        # ``land_last``: bit i is set in the cycle that the last pending result of register i
        # lands (``pend_one[i]`` and a result for i), registered from the cycle before's next
        # values, so that a BRANCH waiting on ``rs`` sees it through one selection by ``rs``.
        land_last = Signal(NUM_REGISTERS)
        for i in range(1, NUM_REGISTERS):
            landed = [res.hit[i] for res in results]
            with m.If(wr_hot[i]):
                m.d.sync += regs[i].eq(wr_data)
            for res in results:
                with m.If(res.hit[i]):
                    m.d.sync += regs[i].eq(res.bit)
            inc = acq_inc[i]
            if len(readouts) == 1:
                # One count up or down at most: the flags follow from flip-flops (a result
                # lands only for a pending register).
                up = inc & ~landed[0]
                down = landed[0] & ~inc
                m.d.comb += busy_held[i].eq(Mux(up, 1, Mux(down, busy[i] & ~pend_one[i],
                                                           busy[i])))
                pend_one_next = Mux(up, ~busy[i], Mux(down, pending[i] == 2, pend_one[i]))
                m.d.sync += [
                    pending[i].eq(Mux(up, pending[i] + 1, Mux(down, pending[i] - 1, pending[i]))),
                    busy[i].eq(Mux(up, 1, Mux(down, busy[i] & ~pend_one[i], busy[i]))),
                    pend_one[i].eq(pend_one_next),
                ]
            else:
                pending_next = Signal.like(pending[i], name=f"pending{i}_next")
                m.d.comb += [pending_next.eq(pending[i] + inc - sum(landed)),
                             busy_held[i].eq(pending_next != 0)]
                pend_one_next = pending_next == 1
                m.d.sync += [pending[i].eq(pending_next), busy[i].eq(pending_next != 0),
                             pend_one[i].eq(pend_one_next)]
            # The results of the next cycle are the channels' (their flush clears them).
            ro_flush = flush[len(drives):len(drives) + len(readouts)]
            lands_next = Cat(*(ch.result_hit[i] & ~f for ch, f in
                               zip(readouts, ro_flush, strict=True))).any()
            m.d.sync += land_last[i].eq(~clear_regs & pend_one_next & lands_next)
            with m.If(clear_regs):
                m.d.sync += [regs[i].eq(0), pending[i].eq(0), busy[i].eq(0), pend_one[i].eq(0)]

        # ---- Core: fetch and decode stages -------------------------------------------------
        # imem read (address stage) -> memory output stage ``m_*`` (the read port's data; it
        # holds while its port is not enabled) -> output register ``o_*`` (the memory output
        # registered, nothing between them) -> fetched-instruction register ``f_insn`` ->
        # decoded-instruction register ``f_dec`` -> execute stage ``x_*``. A BRANCH reads its
        # target into ``tgt_insn`` / ``tgt_dec`` (through ``o_*``) while it waits for its
        # condition.
        # ``run`` (mode is RUN) is a flip-flop of its own, set and cleared with ``mode``.
        run = Signal()

        def set_mode(value):
            m.d.sync += [mode.eq(value), run.eq(value == _CoreMode.RUN)]
        fetch_pc = Signal(pc_bits)         # next sequential instruction to read
        # The read port's data (``m_*``, the block RAM's latch) is registered in ``o_insn``
        # alone, which the build moves into the block RAM's output register (a short
        # clock-to-output where the latch's is most of a cycle); ``f_insn`` and ``tgt_insn``
        # load from it.
        m_valid = Signal()
        m_tgt = Signal()                   # the memory output is a branch target
        m_pc = Signal(pc_bits)
        o_insn = Signal(INSTRUCTION_BITS, reset_less=True)
        # ``o_insn`` holds an instruction: copies of one register (kept apart by the build),
        # the first for the fetch logic, one for each 32-bit group of ``f_insn``'s enable, so
        # that no one enable net reaches more than a group.
        o_valids = [Signal(name=f"o_valid__rep{k}") for k in range(1 + _FETCH_GROUPS)]
        o_valid = o_valids[0]

        def set_o_valid(value):
            m.d.sync += [v.eq(value) for v in o_valids]
        o_tgt = Signal()
        o_pc = Signal(pc_bits)
        f_valid = Signal()
        f_insn = Signal(INSTRUCTION_BITS)
        tgt_valid = Signal()
        tgt_insn = Signal(INSTRUCTION_BITS)
        tgt_issued = Signal()
        tgt_none = Signal()                # the target is TAIL: nothing to read
        decoded = data.StructLayout({
            **{op.name.lower(): 1 for op in Op},
            "illegal": 1,
            "sel_drive": self._n_drive,
            "sel_readout": self._n_readout,
            "sel_marker": self._n_marker,
            "mask": NUM_REGISTERS,         # registers that must not be pending
            "taken_if_0": 1,               # BRANCH condition when rs is 0 ...
            "taken_if_1": 1,               # ... and when it is 1 (a measurement)
            "arg_bytes": 4 * 3,            # CALL: each argument's bytes, ceil(bits / 8) ...
            "arg_nz": 4,                   # ... whether it has any
            "arg_first": 2,                # ... the first argument that has
            "win_m1": 16,                  # ACQUIRE: window_cycles - 1, the last cycle's offset
            "loop": 1,                     # BRANCH with Cond.DBNZ: writes rs - 1 to rs
            "wrd": 4,                      # the register an instruction writes (LOOP: rs)
        })

        def decode(raw, name):
            """The decoded fields of instruction ``raw``, a dict for ``decoded``."""
            ins = Instruction(raw)
            is_ = {op: kept(m, ins.op == op, f"{name}_is_{op.name.lower()}") for op in Op}
            chan = raw[8:12]
            b = ins.operands.branch
            cond_legal = b.cond.as_value() <= max(c.value for c in Cond)
            is_loop = is_[Op.BRANCH] & (b.cond == Cond.DBNZ)
            assert [c.value for c in Cond] == list(range(len(Cond)))
            # The known opcodes, by high nibble: the low nibbles below a bound.
            op_hi, op_lo = raw[4:8], raw[0:4]
            bounds = {}
            for op in Op:
                bounds[op.value >> 4] = max(bounds.get(op.value >> 4, 0), (op.value & 15) + 1)
            assert all((hi << 4 | lo) in {op.value for op in Op}
                       for hi, n in bounds.items() for lo in range(n))
            known = kept(m, Cat(*((op_hi == hi) & (op_lo < n)
                                  for hi, n in bounds.items())).any(), f"{name}_known")

            def zero(value, what):
                """``value == 0`` as kept 4-bit zero tests and their AND."""
                return Cat(*(kept(m, value[i:i + 4] == 0, f"{name}_{what}_z{i // 4}")
                             for i in range(0, len(value), 4))).all()

            # CALL's arguments: each one's ``bits`` (8 bits) at most 32, and its bytes
            # ``ceil(bits / 8)`` (0..4) from its bits 5..3 and whether bits 2..0 are not 0.
            c = ins.operands.call
            all_bits = [c.arg_bits, c.arg1_bits, c.arg2_bits, c.arg3_bits]
            arg_over = Cat(*((b[6:] != 0) | (b[5] & (b[:5] != 0)) for b in all_bits)).any()
            arg_bytes = Cat(*((b[3:6] + (b[:3] != 0))[:3] for b in all_bits))
            arg_nz = Cat(*(b != 0 for b in all_bits))
            arg_first = Const(0, 2)
            for k in reversed(range(4)):
                arg_first = Mux(arg_nz[k], k, arg_first)

            # Each op's operand checks, kept apart from the op compare.
            play_bad = chan >= self._n_drive
            lane_bits = p.samples_per_cycle.bit_length() - 1
            if lane_bits:
                play_bad = play_bad | (ins.operands.play.env_addr[:lane_bits] != 0) | \
                    (ins.operands.play.env_len[:lane_bits] != 0)
            barrier_mask = ins.operands.barrier.mask
            bad = {
                Op.PLAY: play_bad,
                Op.BARRIER: (barrier_mask[p.num_ppus:] != 0 if p.num_ppus < 16
                             else Const(0, 1)),
                Op.MARKER: chan >= self._n_marker,
                Op.ACQUIRE: (chan >= self._n_readout) |
                            kept(m, zero(ins.operands.acquire.window_cycles, "window"),
                                 f"{name}_window_zero"),
                Op.BRANCH: ~cond_legal,
                Op.ALU: ins.operands.alu.func.as_value()[3] if p.alu else Const(1),
                Op.CALL: arg_over,
            }
            illegal = ~known | Cat(*(is_[op] & kept(m, v, f"{name}_bad_{op.name.lower()}")
                                     for op, v in bad.items())).any()

            def onehot(index):
                return Cat(Const(0, 1), *(index == i for i in range(1, NUM_REGISTERS)))

            rd, rs = onehot(raw[8:12]), onehot(raw[12:16])
            alu = ins.operands.alu
            rt = Mux(alu.use_rt, onehot(alu.rt), 0) if p.alu else 0
            call_regs = (rd | rs | onehot(c.rs1) | onehot(c.rs2) | onehot(c.rs3) |
                         onehot(c.rd_hi))
            mask = (Mux(is_[Op.SET], rd, 0) | Mux(is_[Op.ADD], rd | rs, 0) |
                    Mux(is_[Op.ALU], rd | rs | rt, 0) |
                    Mux(is_[Op.BRANCH] & (b.cond != Cond.ALWAYS), rs, 0) |
                    Mux(is_[Op.CALL], call_regs, 0))
            # ``imm`` against 0 and 1 from its bits 31..1 being zero (two kept halves), bit 0
            # and the sign.
            imm = b.imm.as_unsigned()
            z_hi = (kept(m, zero(imm[1:16], "imm_a"), f"{name}_imm_a_zero") &
                    kept(m, zero(imm[16:32], "imm_b"), f"{name}_imm_b_zero"))
            cmp = {
                0: {"eq": z_hi & ~imm[0], "gt": ~imm[31] & ~(z_hi & ~imm[0])},
                1: {"eq": z_hi & imm[0], "gt": ~imm[31] & ~z_hi},
            }
            # Each outcome a table lookup by the condition (an illegal condition: 0).
            taken = {}
            for v in (0, 1):
                eq, gt = cmp[v]["eq"], cmp[v]["gt"]
                table = {Cond.ALWAYS.value: Const(1), Cond.EQ.value: eq, Cond.NE.value: ~eq,
                         Cond.LT.value: gt, Cond.GE.value: ~gt, Cond.DBNZ.value: ~eq}
                cond = b.cond.as_value()
                taken[v] = Array(table.get(c, Const(0)) for c in range(8))[cond[:3]] & ~cond[3]
            return {
                **{op.name.lower(): is_[op] for op in Op},
                "illegal": illegal,
                "sel_drive": Cat(*(is_[Op.PLAY] & (chan == i) for i in range(self._n_drive))),
                "sel_readout": Cat(*(is_[Op.ACQUIRE] & (chan == i)
                                     for i in range(self._n_readout))),
                "sel_marker": Cat(*(is_[Op.MARKER] & (chan == i)
                                    for i in range(self._n_marker))),
                "mask": mask,
                "taken_if_0": taken[0],
                "taken_if_1": taken[1],
                "arg_bytes": arg_bytes,
                "arg_nz": arg_nz,
                "arg_first": arg_first,
                "win_m1": (ins.operands.acquire.window_cycles - 1)[:16],
                "loop": is_loop,
                "wrd": Mux(is_loop, raw[12:16], raw[8:12]),
            }

        # Decode stages: registered the cycle after their instruction register is loaded.
        f_dec = Signal(decoded)
        f_dec_valid = Signal()
        tgt_dec = Signal(decoded)
        tgt_dec_valid = Signal()
        for dec, raw, name in ((f_dec, f_insn, "f"), (tgt_dec, tgt_insn, "tgt")):
            m.d.sync += [getattr(dec, k).eq(v) for k, v in decode(raw, name).items()]

        # Execute stage: the instruction and its decoded fields.
        # ``x_valid``, ``x_br``, ``br_ready`` and ``br_taken`` each have a copy (``__rep1``, set
        # and cleared in the same statements: ``ctl_eq``) that only the wide fields' load below
        # reads, so that the LUTs placed among those hundreds of flip-flops share nothing with
        # the core's own next-state logic.
        ctl = {n: (Signal(name=n), Signal(name=f"{n}__rep1"))
               for n in ("x_valid", "x_br", "br_ready", "br_taken")}
        x_valid = ctl["x_valid"][0]

        def ctl_eq(**values):
            return [s.eq(v) for n, v in values.items() for s in ctl[n]]
        x_raw = Signal(INSTRUCTION_BITS)
        x = Instruction(x_raw)
        xd = Signal(decoded)
        x_is = {op: getattr(xd, op.name.lower()) for op in Op}
        x_illegal = xd.illegal
        x_sel = {"drive": xd.sel_drive, "readout": xd.sel_readout, "marker": xd.sel_marker}
        x_time = Signal(tb)                # t + offset_cycles, for PLAY, ACQUIRE, MARKER
        br_ready = ctl["br_ready"][0]      # BRANCH condition evaluated ...
        br_taken = ctl["br_taken"][0]      # ... and its value
        call_issued = Signal()
        x_rs = x_raw[12:16]
        # BRANCH's target: a register of its own, loaded with the control (below).
        x_target = Signal(pc_bits)

        ex = Signal()                      # the execute stage acts this cycle
        x_done = Signal()                  # ... and its instruction retires
        err_underflow = Signal()
        err_illegal = Signal()
        error_set = Signal()               # the error stage acts: the core stops, no CALL leaves
        # ``x_ok``: the execute stage holds a legal instruction; ``x_br``: ... a BRANCH. Both are
        # flip-flops, set and cleared with ``x_valid``.
        x_ok = Signal()
        x_br = ctl["x_br"][0]
        m.d.comb += ex.eq(run & x_ok)
        # ``blocked``: the mask of the instruction in the execute stage AND'ed with ``busy``,
        # OR'ed: four ORs of four bits registered from the next cycle's values (below), then
        # one LUT.
        mask_busy = Signal(NUM_REGISTERS // 4)
        blocked = kept(m, mask_busy.any(), "blocked")
        # ``settle``: the one pending result of ``rs`` lands this cycle, writing ``land_bit``
        # (two landing at once take the slow way).
        settle = Signal()
        land_bit = Signal()
        if len(results) == 1:
            m.d.comb += land_bit.eq(results[0].bit)
        else:
            for res in results:
                with m.If(res.valid & (res.rd == x_rs)):
                    m.d.comb += land_bit.eq(res.bit)
        m.d.comb += settle.eq(land_last.bit_select(x_rs, 1))

        # Register read of ``rs`` in two stages, every cycle: four 4:1 selections
        # (``rs_part``), then one (``rs_value``). ``rs_ok``: ``rs_value`` is the register's
        # final value (read while it was not pending), from the third cycle in the execute
        # stage, or two cycles after its pending results land.
        rs_part = Array(Signal(REGISTER_BITS, name=f"rs_part{k}") for k in range(4))
        rs_value = Signal(REGISTER_BITS)
        rs_part_ok = Signal()              # rs was not pending when rs_part was read
        rs_ok = Signal()
        x_load = Signal()
        # BRANCH's equality is registered with each part as four byte equalities (each a
        # 4:1 selection, kept 2-bit compares and their AND), chosen and AND'ed with
        # ``rs_value``: no 32-bit reduction sits behind the selection.
        eq_part = Array(Signal(4, name=f"eq_part{k}") for k in range(4))
        imm_bits = x.operands.branch.imm.as_unsigned()
        for k in range(4):
            part = Array(regs[4 * k:4 * k + 4])[x_rs[:2]]
            m.d.sync += rs_part[k].eq(part)
            for j in range(4):
                m.d.sync += eq_part[k][j].eq(equal(m, part[8 * j:8 * j + 8],
                                                   imm_bits[8 * j:8 * j + 8],
                                                   f"rs_part{k}_imm{j}"))
        # BRANCH compares ``rs`` with ``imm`` in the same stage: ``rs_eq``, ``rs_lt`` (signed).
        rs_eq = Signal()
        rs_lt = Signal()
        rs_sel = rs_part[x_rs[2:]]
        m.d.sync += [
            rs_part_ok.eq(~busy.bit_select(x_rs, 1) & ~x_load),
            rs_value.eq(rs_sel),
            rs_eq.eq(eq_part[x_rs[2:]].all()),
            rs_lt.eq((rs_sel.as_signed() - x.operands.branch.imm)[-1]),
            rs_ok.eq(rs_part_ok & ~x_load),
        ]

        # ALU (a build with ``alu``; without, ALU is an illegal instruction): its second
        # operand ``b_value`` (register ``rt``, read in two stages beside ``rs``, or the
        # immediate) and then the result ``alu_res``, registered: ``alu_ok`` a cycle after both
        # operands are final, so an ALU instruction takes 5 cycles and no shifter sits before
        # the register write.
        alu_res = Signal(REGISTER_BITS)
        alu_ok = Signal()
        if p.alu:
            x_alu = x.operands.alu
            x_rt = x_alu.rt
            rt_part = Array(Signal(REGISTER_BITS, name=f"rt_part{k}") for k in range(4))
            for k in range(4):
                m.d.sync += rt_part[k].eq(Array(regs[4 * k:4 * k + 4])[x_rt[:2]])
            b_value = Signal(REGISTER_BITS)
            rt_part_ok = Signal()
            rt_ok = Signal()
            m.d.sync += [
                rt_part_ok.eq((~x_alu.use_rt | ~busy.bit_select(x_rt, 1)) & ~x_load),
                b_value.eq(Mux(x_alu.use_rt, rt_part[x_rt[2:]], x_alu.imm.as_unsigned())),
                rt_ok.eq(rt_part_ok & ~x_load),
            ]
            shamt = b_value[:5]
            alu_out = {
                AluFunc.ADD: rs_value + b_value,
                AluFunc.SUB: rs_value - b_value,
                AluFunc.AND: rs_value & b_value,
                AluFunc.OR: rs_value | b_value,
                AluFunc.XOR: rs_value ^ b_value,
                AluFunc.SHL: rs_value << shamt,
                AluFunc.SHR: rs_value >> shamt,
                AluFunc.SRA: rs_value.as_signed() >> shamt,
            }
            assert set(alu_out) == set(AluFunc)
            with m.Switch(x_alu.func):
                for func, value in alu_out.items():
                    with m.Case(func):
                        m.d.sync += alu_res.eq(value[:REGISTER_BITS])
            m.d.sync += alu_ok.eq(rs_ok & rt_ok & ~x_load)

        # Branch resolution: taken needs the target read and decoded first.
        act = Signal()
        act_taken = Signal()
        use_tgt = Signal()
        m.d.comb += [
            act.eq(run & x_br & br_ready & (~br_taken | tgt_dec_valid | tgt_none)),
            act_taken.eq(act & br_taken),
            use_tgt.eq(act_taken & ~tgt_none),
        ]

        # ``t + offset_cycles`` (16 bits), carry-select: the low 16 bits' carry picks t's high
        # part or its increment, ``t_hi_p1``: a register written with t (below).
        t_hi_p1 = Signal(tb - 16, init=1)

        def add_t(offset_cycles):
            lo = t[:16] + offset_cycles
            return Cat(lo[:16], Mux(lo[16], t_hi_p1, t[16:]))

        # What a WAIT or SYNC in the execute stage adds to t when it executes (in the cycle
        # after it enters): ``x_base`` (t, or SYNC's anchor) and ``x_cycles`` (WAIT's cycles,
        # or SYNC's slack_cycles: the same bits), registered as it enters (t cannot change
        # before it executes: only the instruction in the execute stage writes t).
        # ``x_cycles_p`` is ``x_cycles + 2**16``, for ``t_hi_p1``.
        x_base = Signal(tb)
        x_cycles = Signal(32)
        x_cycles_p = Signal(33)
        # The adder's second operand: ADD's immediate, or -1 for LOOP (which writes rs - 1 as
        # its BRANCH retires, after the wide fields took the next instruction), loaded with
        # the control: the carry chain starts at flip-flops.
        x_addend = Signal(32)

        def plus_2_16(cycles):
            return Cat(cycles[:16], cycles[16:] + 1)

        # The execute stage takes an instruction when it is empty (so ``x_time`` uses the t
        # that the instruction before wrote), or from a resolving BRANCH.
        f_taken = Signal()
        m.d.comb += [
            # The source (the target if taken, else the fetched instruction) is valid and the
            # stage empty or resolving, from flip-flops only
            # (``f_dec_valid`` implies ``f_valid``, ``tgt_dec_valid`` implies ``tgt_valid``).
            x_load.eq(run & ((~x_valid & f_dec_valid) |
                             (x_br & br_ready & Mux(br_taken, tgt_dec_valid & ~tgt_none,
                                                    f_dec_valid)))),
            # ``x_load & ~act_taken``, written from the flip-flops it depends on: a BRANCH
            # that resolves taken loads its target, one that resolves not taken the fetched
            # instruction (``x_br`` implies ``x_valid``: both are set together, and every
            # clear of ``x_valid`` clears ``x_br``). Synthesis does not see that the target's
            # terms cancel; here the enable of ``f_insn`` is two LUT levels from flip-flops.
            f_taken.eq(run & f_dec_valid & (~x_valid | (x_br & br_ready & ~br_taken))),
        ]
        # The execute stage's wide fields (the instruction word, ``x_time``, ``x_base``,
        # ``x_cycles``, CALL's argument mask) load whenever the stage is open: empty, or
        # holding a resolved BRANCH. Their enable is one LUT of three flip-flops and their
        # source ``load_tgt`` one more, not ``x_load``: what they take in a cycle that no
        # instruction enters is never used (``x_valid`` stays low, or the resolved BRANCH,
        # whose target is in ``x_target``, reads none of them). A BRANCH resolved taken loads
        # its target.
        w_valid, w_br, w_ready, w_taken = (ctl[n][1] for n in ctl)
        x_open = kept(m, ~w_valid | (w_br & w_ready), "x_open")
        load_tgt = kept(m, w_br & w_ready & w_taken, "load_tgt")
        # The control (``x_valid``, the decoded flags, ``x_target``) loads with ``x_load``,
        # which implies ``x_br & br_ready`` when the stage is full: its source is the target
        # iff ``x_valid & br_taken`` (two flip-flops, where ``load_tgt`` is a net across the
        # stage's hundreds of multiplexers).
        ctl_tgt = x_valid & br_taken
        wide = {"arg_bytes", "arg_nz", "arg_first", "win_m1"}
        with m.If(x_open):
            m.d.sync += [
                x_raw.eq(Mux(load_tgt, tgt_insn, f_insn)),
                # Both sums in parallel, the choice last.
                x_time.eq(Mux(load_tgt, add_t(Instruction(tgt_insn).operands.play.offset_cycles),
                              add_t(Instruction(f_insn).operands.play.offset_cycles))),
                x_base.eq(Mux(load_tgt, Mux(tgt_dec.sync, sync_anchor, t),
                              Mux(f_dec.sync, sync_anchor, t))),
                x_cycles.eq(Mux(load_tgt, Instruction(tgt_insn).operands.wait.cycles,
                                Instruction(f_insn).operands.wait.cycles)),
                x_cycles_p.eq(Mux(load_tgt,
                                  plus_2_16(Instruction(tgt_insn).operands.wait.cycles),
                                  plus_2_16(Instruction(f_insn).operands.wait.cycles))),
                *(getattr(xd, k).eq(Mux(load_tgt, getattr(tgt_dec, k), getattr(f_dec, k)))
                  for k in wide),
            ]
        with m.Elif(xd.barrier):
            # A BARRIER waiting in the stage: its anchor follows SYNC's, so that the cycle it
            # is released in anchors it as a SYNC executing then.
            m.d.sync += x_base.eq(sync_anchor)
        # Each group's OR for the three candidates (target, fetched, staying), chosen last.
        for j in range(NUM_REGISTERS // 4):
            group = slice(4 * j, 4 * j + 4)
            tgt_b, f_b, x_b = ((mask[group] & busy_held[group]).any()
                               for mask in (tgt_dec.mask, f_dec.mask, xd.mask))
            # The trigger's clear last, beside the choice.
            m.d.sync += mask_busy[j].eq(~clear_regs & Mux(x_load, Mux(ctl_tgt, tgt_b, f_b), x_b))
        with m.If(x_load):
            m.d.sync += [
                *ctl_eq(x_valid=1, x_br=Mux(ctl_tgt, tgt_dec.branch & ~tgt_dec.illegal,
                                            f_dec.branch & ~f_dec.illegal),
                        br_ready=0),
                x_ok.eq(~Mux(ctl_tgt, tgt_dec.illegal, f_dec.illegal)),
                x_target.eq(Mux(ctl_tgt, Instruction(tgt_insn).operands.branch.target[:pc_bits],
                                Instruction(f_insn).operands.branch.target[:pc_bits])),
                x_addend.eq(Mux(ctl_tgt,
                                Mux(tgt_dec.loop, -1, Instruction(tgt_insn).operands.add.imm),
                                Mux(f_dec.loop, -1, Instruction(f_insn).operands.add.imm))),
                *(getattr(xd, k).eq(Mux(ctl_tgt, getattr(tgt_dec, k), getattr(f_dec, k)))
                  for k in decoded.members if k not in wide),
                call_issued.eq(0),
                tgt_issued.eq(0),
                tgt_none.eq(0),
            ]
        with m.Elif(x_done):
            m.d.sync += [*ctl_eq(x_valid=0, x_br=0), x_ok.eq(0)]

        # Instruction memory read: the branch target once, else the next instruction while
        # the memory output and ``o_insn`` are not both full.
        tgt_read = run & x_br & ~tgt_issued
        seq_read = run & ~tgt_read & (fetch_pc != tail) & ~(m_valid & o_valid)
        m.d.comb += [
            imem_core_r.addr.eq(Mux(tgt_read, x_target, fetch_pc)),
            imem_core_r.en.eq(tgt_read | seq_read),
        ]
        # ``o_insn`` -> ``f_insn`` (``of``) when the fetched register is free; a target goes to
        # ``tgt_insn`` at once. ``o_insn`` takes the memory output whenever its own
        # instruction leaves (or it holds none): one enable, from flip-flops.
        f_free = ~o_tgt & (~f_valid | f_taken)
        of = o_valid & f_free
        o_take = ~o_valid | o_tgt | ~f_valid | f_taken
        m.d.sync += [f_dec_valid.eq(f_valid & ~of & ~f_taken), tgt_dec_valid.eq(tgt_valid)]
        with m.If(of):
            m.d.sync += f_valid.eq(1)
        with m.Elif(f_taken):
            m.d.sync += f_valid.eq(0)
        grp_bits = INSTRUCTION_BITS // _FETCH_GROUPS
        for k, valid in enumerate(o_valids[1:]):
            with m.If(valid & f_free):
                m.d.sync += f_insn[k * grp_bits:(k + 1) * grp_bits].eq(
                    o_insn[k * grp_bits:(k + 1) * grp_bits])
        with m.If(o_valid & o_tgt):
            m.d.sync += [tgt_valid.eq(1), tgt_insn.eq(o_insn)]
        with m.If(o_take):
            set_o_valid(m_valid)
            m.d.sync += [o_insn.eq(imem_core_r.data), o_tgt.eq(m_tgt), o_pc.eq(m_pc)]
        with m.If(seq_read | tgt_read):
            m.d.sync += [m_valid.eq(1), m_tgt.eq(tgt_read), m_pc.eq(fetch_pc)]
        with m.Elif(o_take):
            m.d.sync += m_valid.eq(0)
        with m.If(seq_read):
            m.d.sync += fetch_pc.eq(fetch_pc + 1)
        with m.If(tgt_read):
            # The next instructions that do not reach ``f_insn`` now are read again later
            # (``f_insn`` is not taken in this cycle: the BRANCH has just entered the execute
            # stage), so that the target passes them.
            m.d.sync += [tgt_issued.eq(1), tgt_none.eq(~committed(x_target))]
            set_o_valid(0)
            with m.If(o_valid & f_valid):
                m.d.sync += fetch_pc.eq(o_pc)
            with m.Elif(m_valid):
                m.d.sync += fetch_pc.eq(m_pc)
        with m.If(x_load):
            # A target read for the previous instruction is stale.
            m.d.sync += [tgt_valid.eq(0), tgt_dec_valid.eq(0)]
            with m.If(m_tgt):
                m.d.sync += m_valid.eq(0)
            with m.If(Mux(o_take, m_tgt, o_tgt)):
                set_o_valid(0)

        def kill_fetch(next_fetch=None):
            m.d.sync += m_valid.eq(0)
            set_o_valid(0)
            m.d.sync += [f_valid.eq(0), tgt_valid.eq(0), f_dec_valid.eq(0),
                         tgt_dec_valid.eq(0)]
            if next_fetch is not None:
                m.d.sync += fetch_pc.eq(next_fetch)

        # ---- Core: execute stage -----------------------------------------------------------
        push = {kind: Signal(len(sel), name=f"push_{kind}") for kind, sel in x_sel.items()}
        chans = {"drive": drives, "readout": readouts, "marker": markers}
        # ``ready_sel``: the selected channel's queue takes the event (its ``ready`` is a
        # flip-flop). Kept apart from each queue's push (``ex`` AND'ed with the same select),
        # so that synthesis does not build the stall from the pushes, whose LUTs sit by the
        # queues, across the die from the core.
        ready_sel = kept(m, Cat(*(
            x_sel[kind] & Cat(*(ch.event.ready for ch in chans[kind])) for kind in chans)).any(),
            "ready_sel")
        for kind, chs in chans.items():
            m.d.comb += push[kind].eq(Mux(ex, x_sel[kind], 0))
            for i, ch in enumerate(chs):
                m.d.comb += ch.event.valid.eq(push[kind][i])
        def payload(ch, **fields):
            return [getattr(ch.event.payload, k).eq(v) for k, v in fields.items()]

        for ch in drives:
            o = x.operands.play
            m.d.comb += payload(ch, time=x_time, env_addr=o.env_addr, env_len=o.env_len,
                                amplitude=o.amplitude, phase=o.phase, freq_word=o.freq_word,
                                phase_reset=o.phase_reset)
        for ch in readouts:
            o = x.operands.acquire
            m.d.comb += payload(ch, time=x_time, window_cycles=o.window_cycles,
                                threshold=o.threshold, rd=o.rd)
            if p.nco:
                m.d.comb += payload(ch, phase=o.phase, freq_word=o.freq_word)
        for ch in markers:
            m.d.comb += payload(ch, time=x_time,
                                duration_cycles=x.operands.marker.duration_cycles)
        m.d.comb += [
            acq_issue.eq(ex & (x_sel["readout"] &
                               Cat(*(ch.event.ready for ch in readouts))).any()),
            acq_rd.eq(x.operands.acquire.rd),
        ]

        # Order on each channel: an event must come after the one queued before it on its
        # channel (a PLAY or MARKER at least a cycle later, an ACQUIRE window after the
        # previous window closed), else it is refused at issue (``sequence``). Each channel
        # keeps the last time its next event may not be at or before (``order_last``: the
        # event's time, or its window's last cycle), set as an event is queued and forgotten
        # at a trigger; one compare per PPU, for the instruction in the execute stage,
        # registered, with the push it judges. The channel's last time is chosen as the
        # instruction enters the stage (``sel_last``), so that only the compare sits between
        # flip-flops: no push changes it while the instruction waits there (only the
        # instruction's own push does, as it leaves), and a readout's window, still on its way
        # into ``order_last`` while the next instruction enters, is taken from ``window_last``.
        order_chans = [(ch, kind, i) for kind in ("drive", "readout", "marker")
                       for i, ch in enumerate(chans[kind])]
        order_last = [Signal(tb, name=f"order_last{k}") for k in range(len(order_chans))]
        order_seen = [Signal(name=f"order_seen{k}") for k in range(len(order_chans))]
        order_push = Signal()
        order_bad = Signal()
        # A window's last cycle is registered first and kept a cycle after its push (the
        # next instruction is checked two cycles after the push at the earliest).
        accepted = []
        window_last = Signal(tb)
        # ``window_cycles - 1`` comes decoded (``win_m1``): one carry chain between flip-flops.
        m.d.sync += window_last.eq(add_small(x_time, xd.win_m1))
        # ``now_last``/``now_seen``: each channel's values as the instruction entering the
        # execute stage must see them.
        now_last, now_seen = [], []
        for (ch, kind, i), last, seen in zip(order_chans, order_last, order_seen, strict=True):
            taken = push[kind][i] & ch.event.ready
            accepted.append(taken)
            if kind == "readout":
                taken_r = Signal(name=f"order_taken{len(accepted) - 1}")
                m.d.sync += taken_r.eq(taken)
                with m.If(taken_r):
                    m.d.sync += [last.eq(window_last), seen.eq(1)]
                now_last.append(Mux(taken_r, window_last, last))
                now_seen.append(taken_r | seen)
            else:
                with m.If(taken):
                    m.d.sync += [last.eq(x_time), seen.eq(1)]
                now_last.append(last)
                now_seen.append(seen)
            with m.If(clear_regs):
                m.d.sync += seen.eq(0)

        def chan_sel(dec):
            return Cat(dec.sel_drive, dec.sel_readout, dec.sel_marker)
        sel = Signal(len(order_chans))
        sel_last = Signal(tb)
        sel_seen = Signal()
        m.d.comb += sel.eq(Mux(ctl_tgt, chan_sel(tgt_dec), chan_sel(f_dec)))
        with m.If(x_load):
            m.d.sync += [
                sel_last.eq(_or_all([Mux(sel[k], last, 0) for k, last in enumerate(now_last)])),
                sel_seen.eq(Cat(*(sel[k] & seen for k, seen in enumerate(now_seen))).any()),
            ]
        with m.If(clear_regs):
            m.d.sync += sel_seen.eq(0)
        m.d.sync += [
            order_push.eq(Cat(*accepted).any()),
            order_bad.eq(sel_seen & ~less(m, sel_last, x_time, "order")),   # time <= last
        ]

        with m.If(run & x_valid & x_illegal):
            m.d.comb += err_illegal.eq(1)
        # BARRIER: waiting in the execute stage is "arrived"; the cluster answers ``barrier_go``
        # in the cycle that every PPU of the mask (this one's bit implied) has arrived.
        m.d.comb += [
            self.barrier_arrive.eq(ex & x_is[Op.BARRIER] & ~error_set),
            self.barrier_mask.eq(x.operands.barrier.mask | (1 << self._index)),
        ]
        # CALL's arguments, gathered into ``call_args`` byte by byte while the CALL waits in
        # the execute stage, once its registers are not pending (nothing else writes them
        # while it is there): a step chooses argument ``g_k``'s byte ``g_j`` and its mask
        # (``s_*``, registered), the next two cycles read that byte of the register file into
        # byte ``s_p`` of ``call_args``. Arguments of 0 bytes are skipped (the first one with
        # bytes, and whether there is one, were decoded ahead); the call is issued in the
        # cycle after the last byte lands (``g_done``), with ``arg_len`` the bytes gathered:
        # for one argument byte, 5 cycles after the CALL enters the stage. Each step's logic
        # starts at flip-flops.
        o = x.operands.call
        arg_regs = Array([o.rs, o.rs1, o.rs2, o.rs3])
        arg_bits = Array([o.arg_bits, o.arg1_bits, o.arg2_bits, o.arg3_bits])
        arg_bytes = Array(xd.arg_bytes[3 * k:3 * k + 3] for k in range(4))
        g_started = Signal()
        g_k = Signal(2)
        g_j = Signal(2)
        n_args = p.call_arg_bytes
        g_p = Signal(range(n_args + 1))    # bytes chosen so far
        g_stepping = Signal()
        g_last = Signal()                  # the step in ``s_*`` is the last
        g_done = Signal()
        s_valid = Signal()
        s_reg = Signal(4)
        s_j = Signal(2)
        s_p = Signal(range(max(n_args, 1)))
        s_mask = Signal(8)
        call_args = Signal(8 * n_args)
        go = ex & x_is[Op.CALL] & ~call_issued & ~blocked & ~g_started
        with m.If(go):
            m.d.sync += [g_started.eq(1), g_stepping.eq(xd.arg_nz.any()), g_k.eq(xd.arg_first),
                         g_j.eq(0), g_p.eq(0), g_done.eq(~xd.arg_nz.any())]
        # A CALL with more argument bytes than the build's requests carry is an illegal
        # instruction, found as its gathering reaches the byte past them (``g_over``; a
        # count, not a sum in the decode).
        g_over = Signal()
        over = g_stepping & (g_p == n_args) if n_args < MAX_CALL_ARG_BYTES else Const(0)
        with m.If(run & g_over):
            m.d.comb += err_illegal.eq(1)
        with m.If(over):
            m.d.sync += [g_over.eq(1), g_stepping.eq(0), s_valid.eq(0), g_last.eq(0)]
        with m.Elif(g_stepping):
            bits = arg_bits[g_k]
            # The next argument with bytes after ``g_k``.
            found, index = Const(0), Const(0, 2)
            for k in reversed(range(4)):
                hit = xd.arg_nz[k] & (g_k < k)
                found, index = Mux(hit, 1, found), Mux(hit, k, index)
            m.d.sync += [
                s_valid.eq(1),
                s_reg.eq(arg_regs[g_k]),
                s_j.eq(g_j),
                s_p.eq(g_p),
                # A whole byte while the bits reach past it, else the low bits[2:0] bits.
                s_mask.eq(Mux(bits[3:6] > g_j, 0xFF,
                              Array(Const((1 << n) - 1, 8) for n in range(8))[bits[:3]])),
                g_p.eq(g_p + 1),
            ]
            with m.If(g_j + 1 < arg_bytes[g_k]):
                m.d.sync += g_j.eq(g_j + 1)
            with m.Elif(found):
                m.d.sync += [g_k.eq(index), g_j.eq(0)]
            with m.Else():
                m.d.sync += [g_stepping.eq(0), g_last.eq(1)]
        with m.Else():
            m.d.sync += [s_valid.eq(0), g_last.eq(0)]
        # The read, in two stages: the register (``t_word``), then its byte, masked.
        t_valid = Signal()
        t_word = Signal(REGISTER_BITS)
        t_j = Signal(2)
        t_p = Signal(range(max(n_args, 1)))
        t_mask = Signal(8)
        t_last = Signal()
        m.d.sync += [t_valid.eq(s_valid), t_word.eq(Array(regs)[s_reg]), t_j.eq(s_j),
                     t_p.eq(s_p), t_mask.eq(s_mask), t_last.eq(g_last)]
        if n_args:
            with m.If(t_valid):
                m.d.sync += call_args.word_select(t_p, 8).eq(t_word.word_select(t_j, 8) & t_mask)
        with m.If(t_last):
            m.d.sync += g_done.eq(1)
        with m.If(x_load):
            m.d.sync += [g_started.eq(0), g_stepping.eq(0), g_done.eq(0), g_last.eq(0),
                         g_over.eq(0),
                         s_valid.eq(0), g_p.eq(0), t_valid.eq(0), t_last.eq(0)]
        # The CALL unit takes its request while it is idle, every cycle; ``issue`` starts it.
        m.d.comb += [
            call.function_id.eq(o.function_id),
            call.arg.eq(call_args),
            call.arg_len.eq(g_p),
        ]

        # Retire and register write: flat sums of products of flip-flops (the op flags are
        # one-hot; ``ready_sel`` is 0 unless the op is PLAY, ACQUIRE or MARKER).
        wr_ok = ~blocked
        # A CALL with ``rd_hi`` writes its result's low word as the response arrives and
        # the high word in the next cycle (``call_hi``), retiring then.
        done_call = x_is[Op.CALL] & call_issued & call.done
        has_hi = o.rd_hi != 0
        call_hi = Signal()
        with m.If(x_load):
            m.d.sync += call_hi.eq(0)
        with m.Elif(ex & done_call & has_hi):
            m.d.sync += call_hi.eq(1)
        write_hi = x_is[Op.CALL] & call_hi
        # LOOP writes ``rs - 1`` as its BRANCH retires (its condition waited for ``rs_ok``).
        done_loop = xd.loop & br_ready & (~br_taken | tgt_dec_valid | tgt_none)
        retire_writes = ((x_is[Op.SET] & wr_ok) | (x_is[Op.ADD] & wr_ok & rs_ok) |
                         (x_is[Op.ALU] & wr_ok & alu_ok) | (done_call & ~has_hi) | write_hi |
                         done_loop)
        writes = retire_writes | done_call
        m.d.comb += [
            x_done.eq(ex & (x_is[Op.NOP] | x_is[Op.WAIT] | x_is[Op.SYNC] | ready_sel |
                            retire_writes |
                            (x_is[Op.BARRIER] & self.barrier_go) |
                            (x_is[Op.BRANCH] & br_ready &
                             (~br_taken | tgt_dec_valid | tgt_none)))),
            core_we.eq(ex & writes),
            core_wrd.eq(Mux(call_hi, o.rd_hi, xd.wrd)),
            # ADD's adder also decrements LOOP's rs (``x_addend``).
            core_wdata.eq(Mux(x_is[Op.CALL], Mux(call_hi, call.result[32:], call.result[:32]),
                              Mux(x_is[Op.ALU], alu_res,
                                  Mux(x_is[Op.SET], x.operands.set.imm,
                                      rs_value + x_addend)))),
        ]
        with m.If(ex):
            with m.If(x_is[Op.END]):
                set_mode(_CoreMode.DRAIN)
                kill_fetch()
            with m.If(x_is[Op.WAIT] | x_is[Op.SYNC] | (x_is[Op.BARRIER] & self.barrier_go)):
                # One carry chain between flip-flops.
                m.d.sync += [t.eq(x_base + x_cycles), t_hi_p1.eq((x_base + x_cycles_p)[16:])]
            with m.If(x_is[Op.BRANCH]):
                o = x.operands.branch
                with m.If(~br_ready):
                    with m.If(~blocked & (rs_ok | (o.cond == Cond.ALWAYS))):
                        taken = Signal()
                        with m.Switch(o.cond):
                            with m.Case(Cond.EQ):
                                m.d.comb += taken.eq(rs_eq)
                            with m.Case(Cond.NE):
                                m.d.comb += taken.eq(~rs_eq)
                            with m.Case(Cond.LT):
                                m.d.comb += taken.eq(rs_lt)
                            with m.Case(Cond.GE):
                                m.d.comb += taken.eq(~rs_lt)
                            with m.Case(Cond.DBNZ):
                                m.d.comb += taken.eq(~rs_eq)
                            with m.Default():
                                m.d.comb += taken.eq(1)
                        m.d.sync += ctl_eq(br_ready=1, br_taken=taken)
                    with m.Elif(settle & ~xd.loop):
                        # (LOOP writes rs - 1: it waits for ``rs_value``.)
                        # The measurement lands now: decide on the bit it writes.
                        m.d.sync += ctl_eq(br_ready=1, br_taken=Mux(
                            land_bit, xd.taken_if_1, xd.taken_if_0))
            with m.If(x_is[Op.CALL]):
                with m.If(~call_issued):
                    with m.If(g_done & ~error_set):
                        m.d.comb += call.issue.eq(1)
                        m.d.sync += call_issued.eq(1)
        with m.If(x_done):
            m.d.sync += pc.eq(Mux(act_taken, x_target, pc + 1))
        with m.If(act_taken):
            kill_fetch(Mux(use_tgt, x_target + 1, x_target))
        with m.If(run & ~x_valid & ~committed(pc)):
            m.d.comb += err_underflow.eq(1)
        with m.If(mode == _CoreMode.DRAIN):
            all_idle = Cat(*(ch.idle for ch in drives + readouts + markers)).all()
            with m.If(all_idle & (eff_state == PPUState.RUNNING)):
                m.d.sync += [state.eq(PPUState.DONE), active.eq(0)]
                set_mode(_CoreMode.HALT)

        # ---- Errors ------------------------------------------------------------------------
        lates = Cat(*(ch.late for ch in drives + readouts + markers))
        late_events = Signal(32)
        errors = {
            "underflow": err_underflow,
            "late": lates.any(),
            "call_timeout": call.timeout,
            "call_failed": call.failed,
            "illegal_instruction": err_illegal,
            "sequence": order_push & order_bad,
        }
        # Error stage: the errors detected in a cycle are registered; the cycle after, the PPU
        # stops (the core does nothing in that cycle) and STATUS reads ERROR from the next.
        error_r = Signal(len(errors))
        error_next = Mux(active & ~error_set, Cat(*errors.values()), 0)
        # ``error_set`` is the OR of two flip-flops: LATE (the widest sum) and the others.
        error_late = Signal()
        error_other = Signal()
        m.d.sync += [error_r.eq(error_next), error_late.eq(error_next[1]),
                     error_other.eq(Cat(error_next[0], error_next[2:]).any())]
        m.d.comb += error_set.eq(error_late | error_other)
        # LATE_EVENTS counts the late pulses of a cycle two cycles later (the pulses registered,
        # then their count).
        late_bits = Signal(len(lates))
        late_count = Signal(range(len(lates) + 1))
        m.d.sync += [late_bits.eq(Mux(active, lates, 0)),
                     late_count.eq(sum(late_bits)),
                     late_events.eq(late_events + late_count)]
        with m.If(error_set):
            m.d.sync += [state.eq(PPUState.ERROR), active.eq(0), *ctl_eq(x_valid=0, x_br=0),
                         x_ok.eq(0), *(f.eq(1) for f in flush)]
            set_mode(_CoreMode.HALT)
            kill_fetch()
            for k, name in enumerate(errors):
                with m.If(error_r[k]):
                    m.d.sync += getattr(sticky, name).eq(1)
        # Registered: the outputs are quiet from the cycle after STATUS first reads ERROR.
        for ch, f in zip(drives + readouts + markers, flush, strict=True):
            m.d.comb += ch.flush.eq(f)
        m.d.comb += call.abort.eq(error_set)
        for ch in drives:
            m.d.comb += ch.flush_next.eq(error_set)

        # ---- Bus: command stage and decode --------------------------------------------------
        # The command stage ``b_*`` registers the command with its region decoded; everything
        # below acts on it, one cycle after ``bus_valid``.
        raw_local = self.bus_cmd.word_addr[:LOCAL_ADDR_BITS]
        raw_region = WindowRegion(raw_local[REGION_WORD_BITS:LOCAL_ADDR_BITS])
        raw_off = raw_local[:REGION_WORD_BITS]
        raw_mapped = Signal()
        with m.Switch(raw_region):
            with m.Case(WindowRegion.IMEM):
                m.d.comb += raw_mapped.eq(raw_off < 2 * imem_depth)
            with m.Case(WindowRegion.ENV):
                m.d.comb += raw_mapped.eq(raw_off < env_words)
            with m.Case(WindowRegion.MAILBOX):
                m.d.comb += raw_mapped.eq(raw_off < MAILBOX_WORDS)
            with m.Case(WindowRegion.REGS):
                # The register block, the readout channels' words, the trace memory.
                m.d.comb += raw_mapped.eq(
                    (raw_off < REGS_WORDS) |
                    ((raw_off[6:] == 1) & (raw_off[2:6] < self._n_readout)) |
                    ((raw_off[_TRACE_BIT:] == 1) & (raw_off[:_TRACE_BIT] < p.trace_depth // 4)))
        cmd = Signal(BusCommand)
        region = Signal(WindowRegion)
        mapped = Signal()
        b_low = Signal()                   # the offset is below 16 (a register-block word)
        b_high = Signal()                  # ... 16 to 31
        b_ro = Signal()                    # ... a readout channel's word
        b_trace = Signal()                 # ... a trace memory word
        is_write = Signal()                # a WRITE to a mapped word
        is_read = Signal()
        raw_write = self.bus_valid & (self.bus_cmd.op == BusOp.WRITE) & raw_mapped
        # The CALL unit registers the mailbox's commands in a command stage of its own.
        raw_mb = raw_region == WindowRegion.MAILBOX
        m.d.comb += [
            call.bus_cmd.eq(self.bus_cmd),
            call.mb_write.eq(raw_write & raw_mb),
            call.mb_commit.eq(self.bus_valid & raw_mb &
                              (self.bus_cmd.op == BusOp.MAILBOX_COMMIT)),
        ]
        m.d.sync += [
            cmd.eq(self.bus_cmd),
            region.eq(raw_region),
            mapped.eq(raw_mapped),
            b_low.eq(raw_off[4:] == 0),
            b_high.eq(raw_off[4:] == 1),
            b_ro.eq(raw_off[6:] == 1),
            b_trace.eq(raw_off[_TRACE_BIT:] == 1),
            is_write.eq(raw_write),
            is_read.eq(self.bus_valid & (self.bus_cmd.op == BusOp.READ)),
        ]
        off = cmd.word_addr[:REGION_WORD_BITS]

        assert REGS_WORDS <= 32

        def at_word(word: int):
            return (b_low if word < 16 else b_high) & (off[:4] == word % 16)

        trigger_reg = next(r for r in PPU_REGISTERS if r.name == "TRIGGER")
        t_lane = (trigger_reg.offset >> 2) & 1     # its 32-bit half of the bus word
        # The trigger stage's registers (below).
        trig_r = Signal()
        trig_value = Signal(32)
        trig_late = Signal()
        trig_incomplete = Signal()         # the value asks for an upload check that fails
        trig_accept = Signal()             # the trigger stage accepts its trigger
        m.d.comb += trig_accept.eq(trig_r & ~active & ~trig_late & ~trig_incomplete)

        # Memory writes. A write into the committed range while the PPU is ARMED or RUNNING
        # is refused (and counted): the instructions a run may fetch never change under it.
        imem_refused = Signal(32)
        # UPLOAD_WORDS: the 64-bit words written into the ring and the envelope memory since
        # the last accepted trigger (or the host's write of the register), for the trigger's
        # upload check.
        upload_words = Signal(32)
        imem_write = is_write & (region == WindowRegion.IMEM)
        # Both candidates are decided a stage early, from the raw command's slot, and
        # registered: ``lock_range`` against the range of the write's command stage (``head``
        # and ``tail`` of the next cycle, ``head_d``/``tail_d``), ``lock_trig`` against the
        # range that the trigger now in the command stage commits if the trigger stage
        # accepts it in the write's command stage.
        raw_index = raw_off[1:1 + pc_bits]
        lock_range = Signal()
        lock_trig = Signal()
        m.d.sync += [
            lock_range.eq(Mux(trig_accept, committed(raw_index, head_t, tail_t),
                              committed(raw_index, head_w, tail_w))),
            lock_trig.eq(raw_index < cmd.data[32 * t_lane:32 * t_lane + pc_bits]),
        ]
        imem_locked = Mux(trig_accept, lock_trig, active & lock_range)
        with m.If(imem_write & imem_locked):
            m.d.sync += imem_refused.eq(imem_refused + 1)
        # The word counted with each outcome of the trigger stage, so that the carry chain's
        # input is two LUTs from flip-flops and the trigger's choice comes after the chain
        # (an accepted trigger restarts the count from the write beside it).
        env_write = is_write & (region == WindowRegion.ENV)
        counted_if_accepted = (imem_write & ~lock_trig) | env_write
        counted_if_not = (imem_write & ~(active & lock_range)) | env_write
        m.d.sync += upload_words.eq(Mux(trig_accept, counted_if_accepted,
                                        upload_words + counted_if_not))
        m.d.comb += [
            imem_w.addr.eq(off[1:]),
            imem_w.data.eq(Cat(cmd.data, cmd.data)),
            imem_w.en.eq(Mux(imem_write & ~imem_locked, Mux(off[0], cmd.be << 8, cmd.be), 0)),
            env_w.addr.eq(off),
            env_w.data.eq(cmd.data),
            env_w.en.eq(Mux(env_write, cmd.be, 0)),
            imem_bus_r.addr.eq(off[1:]),
            env_bus_r.addr.eq(off),
        ]

        # ---- Register block ------------------------------------------------------------------
        # The readout channels' I/Q registers and the raw-trace capture (see :mod:`.calib`).
        m.submodules.calib = calib = ReadoutCalibration(self._n_readout, spc, p.trace_depth)
        for i, ch in enumerate(readouts):
            m.d.comb += [calib.iq_valid[i].eq(ch.iq_valid), calib.iq_i[i].eq(ch.iq_i),
                         calib.iq_q[i].eq(ch.iq_q), calib.window[i].eq(ch.window),
                         calib.window_last[i].eq(ch.window_last)]
        m.d.comb += calib.adc.eq(self.ptd.adc)
        call_timeout = Signal(32, init=_reset_of("CALL_TIMEOUT_CYCLES"))
        call_slots = Signal(13, init=_reset_of("CALL_SLOTS"))
        m.d.comb += [call.timeout_cycles.eq(call_timeout), call.slots.eq(call_slots)]
        timeline_hi = Signal(tb - 32)
        rw = {
            "TAIL": tail,
            "HEAD": head,
            "START_TIME_LO": start_time[:32],
            "START_TIME_HI": start_time[32:],
            "CALL_TIMEOUT_CYCLES": call_timeout,
            "UPLOAD_WORDS": upload_words,
            "CALL_SLOTS": call_slots,
        }
        values = {
            **rw,
            "TRIGGER": Const(0, 32),
            "STATUS": status.as_value(),
            "PC": pc,
            "IMEM_WRITES_REFUSED": imem_refused,
            "TIMELINE_LO": now[:32],
            "TIMELINE_HI": timeline_hi,
            "LAST_CALL_STATUS": call.last_status,
            "CALL_COUNT": call.call_count,
            "STALE_RESPONSES": call.stale,
            "LAST_RTT_CYCLES": call.last_rtt_cycles,
            "LATE_EVENTS": late_events,
            "CALL_OUTSTANDING": call.outstanding,
            "TRACE_ARM": Const(0, 32),
            "TRACE_STATUS": calib.status,
            "TRACE_COUNT": calib.count,
            "TRACE_DEPTH": Const(p.trace_depth, 32),
            "CALL_ARG_BYTES": Const(p.call_arg_bytes, 32),
            **{f"R{i}": regs[i] for i in range(NUM_REGISTERS)},
        }
        word_values = [[Const(0, 32), Const(0, 32)] for _ in range(REGS_WORDS)]
        for r in PPU_REGISTERS:
            word_values[r.offset >> 3][(r.offset >> 2) & 1] = _u32(values[r.name])
            if r.access is Access.RW and r.name not in rw:
                raise NotImplementedError(f"PPU register {r.name} is RW but not implemented")
        tl_reg = next(r for r in PPU_REGISTERS if r.name == "TIMELINE_LO")
        tl_hi_reg = next(r for r in PPU_REGISTERS if r.name == "TIMELINE_HI")
        assert tl_hi_reg.offset == tl_reg.offset + 4 and tl_reg.offset % 8 == 0

        regs_write = is_write & (region == WindowRegion.REGS)
        # Atomic trigger, in two stages: the trigger stage ``trig_*`` registers the decoded
        # WRITE and compares START_TIME with the next cycle's ``now``; the cycle after, it is
        # refused or accepted (before any register write of that cycle, which wins).
        trig = (regs_write & at_word(trigger_reg.offset >> 3) &
                (cmd.be[4 * t_lane:4 * t_lane + 4] == 0xF))
        trig_soon = Signal()               # START_TIME is the next cycle's ``now + 1``
        m.d.sync += [
            trig_r.eq(trig),
            trig_value.eq(cmd.data[32 * t_lane:32 * t_lane + 32]),
            trig_late.eq(less(m, start_time, now_p2, "trig_late")),
            # Bit 31 asks for the check: bits 30..16 are the upload's words mod 2**15.
            # ``upload_words`` holds every write that precedes the trigger (one in the command
            # stage in the cycle before has landed in it).
            trig_incomplete.eq(cmd.data[32 * t_lane + 31] &
                               (cmd.data[32 * t_lane + 16:32 * t_lane + 31] !=
                                upload_words[:15])),
            # In halves: it shares no carry chain with trig_late.
            trig_soon.eq(equal(m, start_time, now_p2, "trig_soon")),
        ]
        if p.trace_depth:
            arm_reg = next(r for r in PPU_REGISTERS if r.name == "TRACE_ARM")
            a_lane = (arm_reg.offset >> 2) & 1
            m.d.comb += [
                calib.arm.eq(regs_write & at_word(arm_reg.offset >> 3) &
                             (cmd.be[4 * a_lane:4 * a_lane + 4] == 0xF)),
                calib.arm_value.eq(cmd.data[32 * a_lane:32 * a_lane + 32]),
            ]
        m.d.comb += [head_w.eq(head), tail_w.eq(tail)]
        hit_range = {}                     # the HEAD and TAIL writes' hits (below)
        with m.If(trig_r):
            with m.If(active):
                m.d.sync += sticky.trigger_busy.eq(1)
            with m.Elif(trig_late):
                m.d.sync += sticky.trigger_late.eq(1)
            with m.Elif(trig_incomplete):
                m.d.sync += sticky.trigger_incomplete.eq(1)
            with m.Else():
                m.d.comb += clear_regs.eq(1)
                m.d.sync += [
                    # Not late: START_TIME >= now + 1, so the run starts next cycle iff equal.
                    started.eq(trig_soon),
                    pc.eq(0),
                    t.eq(start_time),
                    t_hi_p1.eq(start_time[16:] + 1),
                    run_start.eq(start_time),
                    sticky.eq(0),
                    state.eq(PPUState.ARMED),
                    *(f.eq(0) for f in flush),
                    active.eq(1),
                    *ctl_eq(x_valid=0, x_br=0),
                    x_ok.eq(0),
                ]
                set_mode(_CoreMode.RUN)
                kill_fetch(0)

        for r in PPU_REGISTERS:
            if r.name in rw:
                lane = (r.offset >> 2) & 1
                # The word's write, decoded in front of the command stage's register: the
                # register's enable is a flip-flop.
                hit = Signal(name=f"w_{r.name.lower()}")
                m.d.sync += hit.eq(raw_write & (raw_region == WindowRegion.REGS) &
                                   (raw_off == r.offset >> 3))
                if r.name == "CALL_SLOTS":
                    # A write of the ring's size also forgets the outstanding requests.
                    m.d.comb += call.slots_reset.eq(hit & cmd.be[4 * lane:4 * lane + 4].any())
                with m.If(hit):
                    be = cmd.be[4 * lane:4 * lane + 4]
                    new = _merge_bytes(_u32(rw[r.name]), cmd.data[32 * lane:32 * lane + 32], be, 4)
                    if r.name in ("HEAD", "TAIL"):
                        hit_range[r.name] = hit
                        m.d.comb += (head_w if r.name == "HEAD" else tail_w).eq(new)
                    else:
                        m.d.sync += rw[r.name].eq(new)
        m.d.comb += [
            head_t.eq(Mux(hit_range["HEAD"], head_w, 0)),
            tail_t.eq(Mux(hit_range["TAIL"], tail_w, trig_value[:pc_bits])),
            head_d.eq(Mux(trig_accept, head_t, head_w)),
            tail_d.eq(Mux(trig_accept, tail_t, tail_w)),
        ]

        # Reads, in four stages: the command stage (the memories and the CALL unit's mailbox
        # are read, the mailbox word registered by the mailbox), the request stage ``rd_*``
        # (the decoded READ registered, the register word as a one-hot select), the part stage
        # ``pt_*`` (the register words OR'ed in groups of four beside the registers, the
        # mailbox word and ``now``, each a register; the memories' outputs registered, nothing
        # between them) and the answer stage ``ans_*`` (the answer: the parts OR'ed, or the
        # memory word), three cycles after the command stage. A TIMELINE_LO read
        # returns, and latches the high half of, ``now`` of the request stage's cycle; the
        # registers are read in that cycle too. The mailbox is read in the command stage: only
        # a bus WRITE, which cannot be in the command stage in the cycle after a READ, changes
        # it. While a READ is in flight no other command comes (the cluster holds the bus), so
        # the memories' outputs hold until the answer.
        rd_valid = Signal()
        rd_region = Signal(WindowRegion)
        rd_half = Signal()
        rd_error = Signal()
        rd_sel = Signal(REGS_WORDS)        # the register word, one-hot (REGS region only)
        rd_tl = Signal()
        rd_mb = Signal()                   # the MAILBOX region
        # A readout channel's words, one-hot (channel c's word j at bit 3 c + j; its fourth
        # word reads 0), and "a read of I_LO": it latches the channel's snapshot.
        rd_ro_sel = Signal(3 * self._n_readout)
        rd_ro_latch = Signal(self._n_readout)
        rd_trace = Signal()                # a trace memory word
        is_regs = region == WindowRegion.REGS
        tl_read = is_read & is_regs & at_word(tl_reg.offset >> 3)
        tl_lo_lanes = (cmd.be[:4] != 0) | (cmd.be == 0)
        m.d.sync += rd_valid.eq(is_read)
        with m.If(is_read):
            m.d.sync += [
                rd_region.eq(region),
                rd_half.eq(off[0]),
                rd_error.eq(~mapped),
                rd_sel.eq(Cat(*(is_regs & at_word(k) &
                                ~((k == tl_reg.offset >> 3) & tl_lo_lanes)
                                for k in range(REGS_WORDS)))),
                rd_tl.eq(tl_read & tl_lo_lanes),
                rd_mb.eq(region == WindowRegion.MAILBOX),
                rd_ro_sel.eq(Cat(*(is_regs & b_ro & (off[2:6] == c) & (off[:2] == j)
                                   for c in range(self._n_readout) for j in range(3)))),
                rd_ro_latch.eq(Cat(*(is_regs & b_ro & (off[:6] == 4 * c) & tl_lo_lanes
                                     for c in range(self._n_readout)))),
                rd_trace.eq(is_regs & b_trace),
            ]
        with m.If(rd_valid & rd_tl):
            m.d.sync += timeline_hi.eq(now[32:])
        m.d.comb += [imem_bus_r.en.eq(is_read), env_bus_r.en.eq(is_read),
                     calib.latch.eq(Mux(rd_valid, rd_ro_latch, 0)),
                     calib.rd_addr.eq(off), calib.rd_en.eq(is_read)]
        selected = [Mux(rd_sel[k], Cat(*w), 0) for k, w in enumerate(word_values)]
        for c in range(self._n_readout):
            words = calib.words[c]
            # I_LO's word: I_HI live for a read that latches, else the snapshot's.
            word0 = Cat(words[0][:32], Mux(rd_ro_latch[c], words[0][32:], calib.i_hi_snap[c]))
            selected += [Mux(rd_ro_sel[3 * c], word0, 0), Mux(rd_ro_sel[3 * c + 1], words[1], 0),
                         Mux(rd_ro_sel[3 * c + 2], words[2], 0)]
        parts = [_or_all(selected[k:k + 4]) for k in range(0, len(selected), 4)]
        parts += [Mux(rd_mb, call.mb_rdata, 0), Mux(rd_tl, now, 0)]
        pt_parts = [Signal(64, name=f"pt_part{k}") for k in range(len(parts))]
        pt_region = Signal(WindowRegion)
        pt_half = Signal()
        pt_error = Signal()
        # The memories' outputs land in registers of their own, reset-less and read by nothing
        # else, so that the board build makes them the block RAMs' output registers
        # (``openqlink.build.bram_output_registers``); the answer stage chooses between them.
        pt_imem = Signal(INSTRUCTION_BITS, reset_less=True)
        pt_env = Signal(64, reset_less=True)
        pt_trace = Signal(64, reset_less=True)
        pt_is_trace = Signal()
        m.d.sync += [
            *(r.eq(v) for r, v in zip(pt_parts, parts, strict=True)),
            pt_region.eq(rd_region),
            pt_half.eq(rd_half),
            pt_error.eq(rd_error),
            pt_imem.eq(imem_bus_r.data),
            pt_env.eq(env_bus_r.data),
        ]
        if p.trace_depth:
            m.d.sync += [pt_trace.eq(calib.rd_data), pt_is_trace.eq(rd_trace)]
        ans_error = Signal()
        ans_data = Signal(64)
        pt_mem = Mux(pt_region == WindowRegion.IMEM,
                     Mux(pt_half, pt_imem[64:], pt_imem[:64]), pt_env)
        is_mem = (pt_region == WindowRegion.IMEM) | (pt_region == WindowRegion.ENV)
        if p.trace_depth:
            pt_mem = Mux(pt_is_trace, pt_trace, pt_mem)
            is_mem = is_mem | pt_is_trace
        m.d.sync += [
            ans_error.eq(pt_error),
            ans_data.eq(Mux(pt_error, 0, Mux(is_mem, pt_mem, _or_all(pt_parts)))),
        ]
        m.d.comb += [
            self.bus_rdata.data.eq(ans_data),
            self.bus_rdata.error.eq(ans_error),
        ]
        return m


class _Port:
    """The signals of a memory port (``en`` of a read port is high unless driven; ``flags`` of
    a read port of a memory with byte flags: one bit per byte)."""

    def __init__(self, name: str, addr_bits: int, width: int, en_bits: int, en_init: int):
        self.addr = Signal(addr_bits, name=f"{name}_addr")
        self.data = Signal(width, name=f"{name}_data")
        self.en = Signal(en_bits, name=f"{name}_en", init=en_init)
        self.flags = Const(0, width // 8)


class _SlicedMemory:
    """A memory deeper than 512 words as slices of :data:`_SLICE_BITS` bits, one ``Memory`` each.

    A slice maps to DP16KDs in a deep, narrow mode (1024 x 18, 2048 x 9, ...), so no output
    multiplexer follows the block RAMs whatever the depth; a wide memory may be split by Yosys
    in depth (512 x 36 twice, and a multiplexer). Up to 512 words the memory is one ``Memory``
    (512 x 36 holds the depth). Write ports have 8-bit granularity; read ports are synchronous
    (see :meth:`read_port`).

    With ``byte_flag(index, byte) -> 1-bit Value``, each byte is stored with a flag computed
    from it as it is written (the block RAM's ninth bit of the byte, written with it, so byte
    enables keep each flag true), and read ports give the flags beside the data.
    """

    def __init__(self, m: Module, name: str, width: int, depth: int, *, byte_flag=None):
        # Up to 512 words, a 36-bit wide block RAM holds the whole depth: one memory.
        self._slice = _SLICE_BITS if depth > 512 else width
        assert width % self._slice == 0
        self._m = m
        self._name = name
        self._width = width
        self._byte_flag = byte_flag
        self._unit = 9 if byte_flag is not None else 8     # stored bits per byte
        self._addr_bits = max(1, (depth - 1).bit_length())
        self._mems = []
        for k in range(width // self._slice):
            mem = Memory(shape=unsigned(self._slice // 8 * self._unit), depth=depth, init=[],
                         attrs=_NO_RW_CHECK)
            m.submodules[f"{name}{k}"] = mem
            self._mems.append(mem)
        self._ports = 0

    def _name_next(self) -> str:
        self._ports += 1
        return f"{self._name}_p{self._ports}"

    def write_port(self) -> _Port:
        port = _Port(self._name_next(), self._addr_bits, self._width, self._width // 8, 0)
        lanes = self._slice // 8
        for k, mem in enumerate(self._mems):
            w = mem.write_port(granularity=self._unit)
            stored = []
            for g in range(k * lanes, (k + 1) * lanes):
                byte = port.data[8 * g:8 * g + 8]
                stored.append(byte if self._byte_flag is None
                              else Cat(byte, self._byte_flag(g, byte)))
            self._m.d.comb += [
                w.addr.eq(port.addr),
                w.data.eq(Cat(*stored)),
                w.en.eq(port.en[k * lanes:(k + 1) * lanes]),
            ]
        return port

    def read_port(self) -> _Port:
        """A synchronous read port (:func:`openqlink.gateware.bram.read_port` for each slice:
        no collision logic after the block RAMs)."""
        port = _Port(self._name_next(), self._addr_bits, self._width, 1, 1)
        data, flags = [], []
        for k, mem in enumerate(self._mems):
            r = bram.read_port(self._m, mem, name=f"{port.data.name}{k}")
            self._m.d.comb += [r.addr.eq(port.addr), r.en.eq(port.en)]
            for j in range(self._slice // 8):
                data.append(r.data[self._unit * j:self._unit * j + 8])
                if self._byte_flag is not None:
                    flags.append(r.data[self._unit * j + 8])
        # The slices' outputs themselves (no signal between them and their registers).
        port.data = Cat(*data)
        if flags:
            port.flags = Cat(*flags)
        return port


def _reset_of(name: str) -> int:
    return next(r.reset for r in PPU_REGISTERS if r.name == name)



def _or_all(values):
    """The bitwise OR of ``values``, as a balanced tree."""
    while len(values) > 1:
        values = [values[i] | values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def _u32(value):
    """``value`` zero-extended to 32 bits (register read mux lanes)."""
    value = Value.cast(value).as_unsigned()
    return value if len(value) >= 32 else Cat(value, Const(0, 32 - len(value)))
