"""PPU instruction word and status layouts: one definition for the gateware and the assembler.

Every instruction is 128 bits: ``op`` (8 bits) in bits [7:0], then the operands of that op in a
120-bit union. Amaranth layouts are LSB-first, so the 16 bytes of an instruction in instruction
memory (and on the wire, in an RDMA WRITE to the instruction ring) are ``as_bits()`` in
little-endian order. The host packs with ``Instruction.const({...}).as_bits()``; the gateware
views the memory word as ``Instruction``.

Time fields are in DTD cycles (``*_cycles``). Amplitudes are signed Q1.15 of DAC full scale.
See ``docs/isa.md`` for the semantics of each instruction.
"""

# No ``from __future__ import annotations``: data.Struct reads its annotations as shapes.
from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

__all__ = [
    "ISA_VERSION", "INSTRUCTION_BITS", "INSTRUCTION_BYTES", "NUM_REGISTERS", "REGISTER_BITS",
    "Op", "Cond", "PlayOperands", "AcquireOperands", "MarkerOperands", "WaitOperands",
    "SyncOperands", "BarrierOperands", "SetOperands", "AddOperands", "AluFunc", "AluOperands",
    "BranchOperands",
    "CallOperands", "Operands", "Instruction", "PPUState", "PPUStatus",
]

#: Bumped whenever the instruction layout or semantics change; reported by the version register.
ISA_VERSION = 4
INSTRUCTION_BITS = 128
INSTRUCTION_BYTES = INSTRUCTION_BITS // 8
#: General registers r0..r15, 32 bits each; r0 always reads 0 and ignores writes.
NUM_REGISTERS = 16
REGISTER_BITS = 32


class Op(enum.Enum, shape=8):
    """Instruction opcodes."""

    NOP = 0x00
    END = 0x01      #: stop with state DONE
    WAIT = 0x02     #: t += cycles
    SYNC = 0x03     #: t = max(now, START_TIME) + slack_cycles (re-anchor after a CALL, input)
    BARRIER = 0x04  #: wait for the PPUs in mask, then t = now + slack_cycles on each of them
    PLAY = 0x10     #: queue a pulse: envelope x amplitude on a drive channel at t + offset
    ACQUIRE = 0x11  #: queue a readout window at t + offset; integrate, threshold -> rd
    MARKER = 0x12   #: queue a digital marker pulse at t + offset
    SET = 0x20      #: rd = imm
    ADD = 0x21      #: rd = rs + imm
    ALU = 0x22      #: rd = rs FUNC (rt or imm): add, sub, and, or, xor, shl, shr, sra
    BRANCH = 0x30   #: if cond(rs, imm): pc = target
    CALL = 0x40     #: RPC to the real-time host; result -> rd


class Cond(enum.Enum, shape=4):
    """Branch conditions; ``rs`` compared with the sign-extended ``imm`` as signed 32-bit."""

    ALWAYS = 0
    EQ = 1
    NE = 2
    LT = 3
    GE = 4
    DBNZ = 5    #: taken if rs != imm; rs = rs - 1 either way (``loop rS, L``: imm = 1)


class PlayOperands(data.Struct):
    channel: unsigned(4)
    phase_reset: unsigned(1)      #: the NCO's accumulator starts at 0 on the first sample
    _rsv: unsigned(3)
    offset_cycles: unsigned(16)   #: event time = t + offset_cycles
    env_addr: unsigned(16)        #: first sample in envelope memory (a multiple of S)
    env_len: unsigned(16)         #: samples to play, S per DTD cycle (a multiple of S)
    amplitude: signed(16)         #: Q1.15 scale of the envelope
    phase: unsigned(16)           #: NCO phase offset, turns / 2**16
    freq_word: unsigned(32)       #: NCO phase step per sample, turns / 2**32


class AcquireOperands(data.Struct):
    channel: unsigned(4)
    rd: unsigned(4)               #: measurement register: gets 1 if integral > threshold
    offset_cycles: unsigned(16)
    window_cycles: unsigned(16)   #: integration window length
    threshold: signed(32)         #: compared with the window's demodulated I integral
    phase: unsigned(16)           #: demodulation phase at the window's start (IQ rotation)
    freq_word: unsigned(32)       #: demodulation phase step per sample, turns / 2**32


class MarkerOperands(data.Struct):
    channel: unsigned(4)
    _rsv: unsigned(4)
    offset_cycles: unsigned(16)
    duration_cycles: unsigned(16)


class WaitOperands(data.Struct):
    cycles: unsigned(32)


class SyncOperands(data.Struct):
    slack_cycles: unsigned(32)


class BarrierOperands(data.Struct):
    slack_cycles: unsigned(32)    #: t = (the release cycle) + slack_cycles, as SYNC's
    mask: unsigned(16)            #: PPUs that meet here (bit n: PPU n; its own bit implied)


class SetOperands(data.Struct):
    rd: unsigned(4)
    _rsv: unsigned(4)
    imm: signed(32)


class AddOperands(data.Struct):
    rd: unsigned(4)
    rs: unsigned(4)
    imm: signed(32)


class AluFunc(enum.Enum, shape=4):
    """ALU functions: ``rd = rs FUNC b``, ``b`` the register ``rt`` or the immediate. 32-bit,
    wrapping; shifts take the low 5 bits of ``b`` as the amount (RISC-V's SLL, SRL, SRA)."""

    ADD = 0
    SUB = 1     #: rs - b
    AND = 2
    OR = 3
    XOR = 4
    SHL = 5     #: rs << b[4:0]
    SHR = 6     #: rs >> b[4:0], logical (zeros in)
    SRA = 7     #: rs >> b[4:0], arithmetic (the sign in)


class AluOperands(data.Struct):
    rd: unsigned(4)
    rs: unsigned(4)
    imm: signed(32)               #: the second operand when use_rt is 0
    rt: unsigned(4)               #: the second operand's register when use_rt is 1
    func: AluFunc
    use_rt: unsigned(1)


class BranchOperands(data.Struct):
    cond: Cond
    rs: unsigned(4)
    imm: signed(32)
    target: unsigned(16)          #: absolute instruction index in the ring


class CallOperands(data.Struct):
    """Up to 4 arguments: argument k is the low ``arg{k}_bits`` bits of its register, packed
    LSB-first into ``ceil(bits / 8)`` bytes; the arguments' bytes follow each other in order
    (CUDA-Q realtime's argument layout: each argument its schema's ``size_bytes``)."""

    rd: unsigned(4)               #: gets result bytes 0..3 (little-endian, zero-extended)
    rs: unsigned(4)               #: argument 0's register
    arg_bits: unsigned(8)         #: argument 0: 0..32 low bits of rs
    function_id: unsigned(32)     #: FNV-1a of the handler name
    rd_hi: unsigned(4)            #: gets result bytes 4..7 (r0: dropped)
    rs1: unsigned(4)              #: argument 1's register ...
    rs2: unsigned(4)
    rs3: unsigned(4)
    arg1_bits: unsigned(8)        #: ... and its bits, 0..32 (0: no argument 1)
    arg2_bits: unsigned(8)
    arg3_bits: unsigned(8)


class Operands(data.Union):
    play: PlayOperands
    acquire: AcquireOperands
    marker: MarkerOperands
    wait: WaitOperands
    sync: SyncOperands
    barrier: BarrierOperands
    set: SetOperands
    add: AddOperands
    alu: AluOperands
    branch: BranchOperands
    call: CallOperands
    raw: unsigned(INSTRUCTION_BITS - 8)


class Instruction(data.Struct):
    op: Op
    operands: Operands


assert Instruction.as_shape().size == INSTRUCTION_BITS


class PPUState(enum.Enum, shape=3):
    IDLE = 0      #: reset, or nothing triggered yet
    ARMED = 1     #: triggered, waiting for the start time
    RUNNING = 2
    DONE = 3      #: reached END
    ERROR = 4     #: stopped on an error; see the error bits; outputs quiet


class PPUStatus(data.Struct):
    """The PPU STATUS register (32 bits). Error bits are sticky until the next accepted trigger,
    except the two trigger-refusal bits, which a refused trigger sets without touching the run.
    """

    state: PPUState
    _rsv0: unsigned(5)
    underflow: unsigned(1)         #: pc reached the committed tail before END
    late: unsigned(1)              #: an event reached its channel after its time
    call_timeout: unsigned(1)      #: no response within CALL_TIMEOUT_CYCLES
    call_failed: unsigned(1)       #: response status != 0 (see LAST_CALL_STATUS)
    illegal_instruction: unsigned(1)
    trigger_busy: unsigned(1)      #: a trigger arrived while ARMED or RUNNING: refused
    trigger_late: unsigned(1)      #: a trigger's start time had passed: refused
    sequence: unsigned(1)          #: an event not after its channel's previous event
    trigger_incomplete: unsigned(1)  #: a trigger's upload word count did not match: refused
    _rsv1: unsigned(15)
