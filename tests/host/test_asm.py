"""Tests of the PPU assembler and disassembler (openqlink.isa.asm)."""

from fractions import Fraction
from pathlib import Path

import pytest
from amaranth.hdl import Shape
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from openqlink.errors import AssemblerError, FieldRangeError, TruncatedError
from openqlink.isa import (
    AluFunc,
    Cond,
    Instruction,
    Op,
    Operands,
    amplitude_to_q15,
    assemble,
    decode,
    disassemble,
    encode,
    q15_to_amplitude,
    render_isa_tables,
)
from openqlink.memory_map import QSCParams
from openqlink.wire.rpc import fnv1a32

ROOT = Path(__file__).resolve().parents[2]


def one(line: str, **kw) -> tuple[Op, dict]:
    prog = assemble(line, **kw)
    assert len(prog.instructions) == 1
    return decode(prog.instructions[0])


# --- every mnemonic ------------------------------------------------------------------------


def test_nop_end():
    assert one("nop") == (Op.NOP, {})
    assert one("end") == (Op.END, {})
    assert assemble("end").instructions == [Op.END.value]


def test_wait_sync_times():
    assert one("wait 100") == (Op.WAIT, {"cycles": 100})
    assert one("wait 400ns") == (Op.WAIT, {"cycles": 100})  # 250 MHz default
    assert one("wait 1.5us") == (Op.WAIT, {"cycles": 375})
    assert one("wait 0x10") == (Op.WAIT, {"cycles": 16})
    assert one("wait 0b101") == (Op.WAIT, {"cycles": 5})
    assert one("wait 1_000") == (Op.WAIT, {"cycles": 1000})
    assert one("wait 0.004us") == (Op.WAIT, {"cycles": 1})
    assert one("wait 10 ns", dtd_clk_hz=100_000_000) == (Op.WAIT, {"cycles": 1})
    assert one("sync 16") == (Op.SYNC, {"slack_cycles": 16})
    assert one("SYNC 64ns") == (Op.SYNC, {"slack_cycles": 16})


def test_play_with_envelope_and_explicit_range():
    src = """
    .envelope a, square, length=8, amp=0.5
    .envelope g, gaussian, length=64, sigma=16
    play 3, g, amp=0.5, offset=8ns, phase=7, freq=0x100
    play 1, addr=5, len=6, amp=-1.0
    play 2, a, 1.0
    """
    prog = assemble(src, params=QSCParams(drives_per_ppu=4))
    op, f = decode(prog.instructions[0])
    assert op == Op.PLAY
    assert f == {"channel": 3, "offset_cycles": 2, "env_addr": 8, "env_len": 64,
                 "amplitude": 16384, "phase": 7, "freq_word": 256, "phase_reset": 0}
    assert decode(prog.instructions[1])[1]["env_addr"] == 5
    assert decode(prog.instructions[1])[1]["amplitude"] == -32768
    assert decode(prog.instructions[2])[1]["amplitude"] == 32767
    assert decode(prog.instructions[2])[1]["env_addr"] == 0


def test_acquire_marker():
    assert one("acquire 1, r7, window=100, threshold=-3, offset=2",
               params=QSCParams(readouts_per_ppu=2)) == (Op.ACQUIRE, {
        "channel": 1, "rd": 7, "offset_cycles": 2, "window_cycles": 100, "threshold": -3,
        "phase": 0, "freq_word": 0})
    assert one("acquire 0, r1, 400ns")[1]["threshold"] == 0
    assert one("marker 2, duration=1us, offset=4") == (Op.MARKER, {
        "channel": 2, "offset_cycles": 4, "duration_cycles": 250})


def test_set_add():
    assert one("set r1, -5") == (Op.SET, {"rd": 1, "imm": -5})
    assert one("set r15, 0xFFFFFFFF") == (Op.SET, {"rd": 15, "imm": -1})
    assert one("add r2, r3, 7") == (Op.ADD, {"rd": 2, "rs": 3, "imm": 7})
    assert one(".equ ACC, r4\nadd ACC, ACC, 1") == (Op.ADD, {"rd": 4, "rs": 4, "imm": 1})


def test_branches_and_labels():
    src = """
    top: nop
         beq r1, 1, end_
         bne r1, -1, top
         blt r2, 0, top
         bge r2, 5, top
         branch lt, r4, 9, end_
         jmp top
    end_: end
    """
    prog = assemble(src)
    assert prog.labels == {"top": 0, "end_": 7}
    got = [decode(w)[1] for w in prog.instructions[1:7]]
    assert got[0] == {"cond": Cond.EQ, "rs": 1, "imm": 1, "target": 7}
    assert got[1] == {"cond": Cond.NE, "rs": 1, "imm": -1, "target": 0}
    assert got[2]["cond"] == Cond.LT and got[3]["cond"] == Cond.GE
    assert got[4] == {"cond": Cond.LT, "rs": 4, "imm": 9, "target": 7}
    assert got[5] == {"cond": Cond.ALWAYS, "rs": 0, "imm": 0, "target": 0}


def test_call():
    prog = assemble("call decode(r1:1) -> r2\ncall ping()\ncall 0xdeadbeef(r3) -> r4")
    op, f = decode(prog.instructions[0])
    assert op == Op.CALL
    more = {"rd_hi": 0, "rs1": 0, "rs2": 0, "rs3": 0, "arg1_bits": 0, "arg2_bits": 0,
            "arg3_bits": 0}
    assert f == {"rd": 2, "rs": 1, "arg_bits": 1, "function_id": fnv1a32("decode"), **more}
    assert decode(prog.instructions[1])[1] == {"rd": 0, "rs": 0, "arg_bits": 0,
                                               "function_id": fnv1a32("ping"), **more}
    assert decode(prog.instructions[2])[1] == {"rd": 4, "rs": 3, "arg_bits": 32,
                                               "function_id": 0xDEADBEEF, **more}
    assert prog.functions == {"decode": fnv1a32("decode"), "ping": fnv1a32("ping")}


def test_equ_word_labels_on_same_line_and_comments():
    src = """; header comment
    .equ CH, 2
    .equ T, 40ns
    .equ T2, T
    a: b: marker CH, duration=T2 ; trailing comment
    .word 0x1234
    """
    prog = assemble(src, "x.s")
    assert prog.labels == {"a": 0, "b": 0}
    assert decode(prog.instructions[0])[1] == {"channel": 2, "offset_cycles": 0,
                                               "duration_cycles": 10}
    assert prog.instructions[1] == 0x1234
    assert prog.source_map[0].line == 5 and prog.source_map[0].filename == "x.s"
    assert prog.source_map[1].text == ".word 0x1234"


def test_base_offsets_labels():
    prog = assemble("x: nop\njmp x", base=100)
    assert prog.labels == {"x": 100} and prog.base == 100
    assert decode(prog.instructions[1])[1]["target"] == 100
    assert sorted(prog.source_map) == [100, 101]


def test_encode_matches_layout_const():
    word = encode(Op.ADD, {"rd": 1, "rs": 2, "imm": -1})
    ref = Instruction.const({"op": Op.ADD, "operands": {"add": {"rd": 1, "rs": 2, "imm": -1}}})
    assert word == ref.as_bits()


def test_to_bytes_little_endian():
    prog = assemble("wait 0x01020304\nend")
    b = prog.to_bytes()
    assert len(b) == 32
    assert b[:6] == bytes([0x02, 0x04, 0x03, 0x02, 0x01, 0x00])
    assert b[16] == Op.END.value


# --- envelopes and amplitudes ---------------------------------------------------------------


def test_envelopes():
    prog = assemble(".envelope g, gaussian, length=33, sigma=4, amp=0.8\n"
                    ".envelope s, square, length=3, amp=-0.25")
    g, s = prog.envelopes["g"], prog.envelopes["s"]
    assert (g.addr, g.length, s.addr, s.length) == (0, 33, 33, 3)
    assert g.samples == g.samples[::-1]
    assert max(g.samples) == g.samples[16] == amplitude_to_q15(0.8)
    assert g.samples[0] < g.samples[8] < g.samples[16]
    assert s.samples == [-8192] * 3
    img = prog.envelope_bytes()
    assert len(img) == 72
    assert int.from_bytes(img[66:68], "little", signed=True) == -8192


def test_q15():
    assert amplitude_to_q15(1.0) == 32767
    assert amplitude_to_q15(-1.0) == -32768
    assert amplitude_to_q15(0.5) == 16384
    assert q15_to_amplitude(-32768) == -1.0
    for bad in (1.0001, -1.5, float("nan")):
        with pytest.raises(ValueError):
            amplitude_to_q15(bad)


# --- every error class ------------------------------------------------------------------------

ERRORS = [
    ("frob r1", 1, "frob", "unknown mnemonic"),
    ("nop\nset r16, 1", 2, "r16", "bad register"),
    ("set x1, 1", 1, "x1", "bad register"),
    ("add r1, r2", 1, "r1, r2", "missing operand 'rt_or_imm'"),
    ("set r1, 2, 3", 1, "3", "too many operands"),
    ("set r1, imm=1, 2", 1, "2", "positional operand after a keyword"),
    ("marker 0, dur=3", 1, "dur=3", "unknown operand 'dur'"),
    ("set r1, 1, rd=r2", 1, "rd=r2", "given twice"),
    ("set r1,, 2", 1, "r1,, 2", "empty operand"),
    ("set r1, 2**3", 1, "2**3", "bad number"),
    ("set r1, FOO", 1, "FOO", "unknown symbol"),
    ("set r1, 0x100000000", 1, "0x100000000", "out of range"),
    ("add r1, r1, 0x80000000", 1, "0x80000000", "out of range"),
    ("shl r1, r2, 32", 1, "32", "shift amount 32 outside 0..31"),
    ("sra r1, r2, -1", 1, "-1", "shift amount -1 outside 0..31"),
    ("and r1, r2, 0x100000000", 1, "0x100000000", "out of range"),
    ("alu mul, r1, r2, r3", 1, "mul", "bad ALU function 'mul'"),
    ("sub r1, r2, r16", 1, "r16", "bad register 'r16' for rt"),
    ("loop r1", 1, "r1", "missing operand 'target'"),
    ("loop 5, top", 1, "5", "bad register"),
    ("acquire 0, r1, window=0ns", 1, "0ns", "window must be at least 1 cycle"),
    ("marker 16, duration=1", 1, "16", "channel = 16 is out of range"),
    ("wait -1", 1, "-1", "cycles = -1 is out of range"),
    ("wait 0x100000000", 1, "0x100000000", "out of range"),
    ("play 0, addr=0, len=1, amp=0, offset=65536", 1, "65536", "offset_cycles"),
    ("wait 10ms", 1, "10ms", "bad unit 'ms'"),
    ("wait 10s", 1, "10s", "bad unit"),
    ("wait 6ns", 1, "6ns", "not a whole number of DTD cycles"),
    ("wait 2.5", 1, "2.5", "not a whole number"),
    ("wait ten", 1, "ten", "unknown symbol"),
    ("wait 1..2", 1, "1..2", "bad time"),
    ("play 0, addr=0, len=1, amp=1.5", 1, "1.5", "outside [-1.0, 1.0]"),
    ("play 0, addr=0, len=1, amp=inf", 1, "inf", "finite"),
    ("play 0, nope, amp=0.5", 1, "nope", "unknown envelope"),
    ("play 0, amp=0.5", 1, "0, amp=0.5", "addr= and len="),
    ("jmp nowhere", 1, "nowhere", "unknown label"),
    ("x: nop\nx: nop", 2, "x", "duplicate symbol 'x'"),
    (".equ x, 1\nx: nop", 2, "x", "duplicate symbol"),
    ("r3: nop", 1, "r3", "reserved"),
    (".equ eq, 1", 1, "eq", "reserved"),
    (".equ 9a, 1", 1, "9a", "bad constant name"),
    (".equ x", 1, "x", ".equ needs"),
    (".org 5", 1, ".org", "unknown directive"),
    ("branch maybe, r1, 0, 0", 1, "maybe", "bad condition"),
    ("beq r1, 0, 70000", 1, "70000", "target = 70000 is out of range"),
    ("call decode r1", 1, "decode r1", "call syntax"),
    ("call decode(r1:33) -> r2", 1, "33", "argument bits 33"),
    ("call decode(r1:1) -> q2", 1, "q2", "bad register"),
    ("call decode(x:1)", 1, "x", "bad register"),
    ("nop r1", 1, "r1", "takes no operands"),
    (".word 0x1" + "0" * 32, 1, "0x1" + "0" * 32, "does not fit 128 bits"),
    (".envelope e, triangle, length=4", 1, "triangle", "unknown envelope shape"),
    (".envelope e, gaussian, length=4", 1, "e, gaussian, length=4", "needs sigma"),
    (".envelope e, gaussian, length=4, sigma=0", 1, "0", "sigma must be positive"),
    (".envelope e, square, length=4, sigma=1", 1, "1", "no sigma"),
    (".envelope e, square, length=0", 1, "0", "outside 1..65535"),
    (".envelope e, square, length=4, amp=2", 1, "2", "outside [-1.0, 1.0]"),
    (".envelope e, square, length=4096\n.envelope f, square, length=1", 2, "f",
     "envelope memory holds 4096"),
    # operands the build (QSCParams(): 1 drive, 1 readout, 4 markers, 1024-slot ring,
    # 4096-sample envelope memory) cannot do
    ("nop\nplay 0, addr=4000, len=200, amp=0.5", 2, "200",
     "env_addr + env_len = 4000 + 200 = 4200 is out of range for PLAY (0..4096: the build has "
     "env_depth = 4096)"),
    ("play 0, addr=65000, len=1, amp=0.5", 1, "65000",
     "env_addr = 65000 is out of range for PLAY (0..4095: the build has env_depth = 4096)"),
    ("play 0, addr=4096, len=0, amp=0", 1, "4096", "env_addr = 4096 is out of range"),
    (".equ A, 4090\nplay 0, addr=A, len=7, amp=0", 2, "7", "4090 + 7 = 4097 is out of range"),
    ("jmp 5000", 1, "5000",
     "target = 5000 is out of range for BRANCH (0..1023: the build has imem_depth = 1024)"),
    ("beq r1, 0, 1024", 1, "1024", "target = 1024 is out of range for BRANCH"),
    (".equ FAR, 0x400\nbranch ge, r1, 0, FAR", 2, "FAR", "target = 1024 is out of range"),
    ("play 1, addr=0, len=1, amp=0", 1, "1",
     "channel = 1 is out of range for PLAY (0..0: the build has drives_per_ppu = 1)"),
    ("acquire 1, r1, window=10", 1, "1",
     "channel = 1 is out of range for ACQUIRE (0..0: the build has readouts_per_ppu = 1)"),
    ("marker 4, duration=1", 1, "4",
     "channel = 4 is out of range for MARKER (0..3: the build has markers_per_ppu = 4)"),
    # exact times: the message shows the exact number of cycles, never a rounded one
    ("wait 3.9999999999999999999ns", 1, "3.9999999999999999999ns",
     "is not a whole number of DTD cycles at 250000000 Hz (0.999999999999999999975 cycles)"),
    ("sync 4.0000000000000000001ns", 1, "4.0000000000000000001ns",
     "(1.000000000000000000025 cycles)"),
    ("wait 1e-30us", 1, "1e-30us", "(0.00000000000000000000000000025 cycles)"),
    ("wait 1e-300us", 1, "1e-300us", "exponent out of range"),
    # .equ chains name what was written and what it expanded to
    (".equ Q, nowhere\njmp Q", 2, "Q", "unknown label 'nowhere' (.equ Q -> nowhere)"),
    (".equ A, B\n.equ B, nowhere\njmp A", 3, "A",
     "unknown label 'nowhere' (.equ A -> B -> nowhere)"),
    (".equ X, FOO\nset r1, X", 2, "X", "unknown symbol 'FOO' for imm (.equ X -> FOO)"),
    (".equ R, x1\nset R, 1", 2, "R", "bad register 'x1' for rd (r0..r15) (.equ R -> x1)"),
    (".equ A, B\n.equ B, A\nwait A", 3, "A", "circular .equ (A -> B -> A)"),
    # phases and frequencies (default build: NCOs, 250 MHz, one sample per cycle)
    ("play 0, addr=0, len=4, amp=0, phase=1turn", 1, "1turn",
     "bad unit 'turn' in '1turn' (use deg or rad, or none for turns / 2**16)"),
    ("play 0, addr=0, len=4, amp=0, phase=1.5", 1, "1.5", "bad number '1.5' for phase"),
    ("play 0, addr=0, len=4, amp=0, phase=65536", 1, "65536",
     "phase = 65536 is out of range for PLAY (0..65535)"),
    ("play 0, addr=0, len=4, amp=0, phase=-1", 1, "-1", "phase = -1 is out of range"),
    ("acquire 0, r1, window=4, phase=1e99deg", 1, "1e99deg", "exponent out of range"),
    ("acquire 0, r1, window=4, phase=PH", 1, "PH", "unknown symbol 'PH' for phase"),
    ("acquire 0, r1, window=4, phase=9..0deg", 1, "9..0deg", "bad phase '9..0deg'"),
    ("play 0, addr=0, len=4, amp=0, freq=10mhz", 1, "10mhz",
     "bad unit 'mhz' in '10mhz' (use Hz, kHz, MHz, GHz, or none for the word"),
    ("play 0, addr=0, len=4, amp=0, freq=10mHz", 1, "10mHz", "bad unit 'mHz'"),
    ("acquire 0, r1, window=4, freq=2.5", 1, "2.5", "bad number '2.5' for freq"),
    ("acquire 0, r1, window=4, freq=0x100000000", 1, "0x100000000",
     "freq_word = 4294967296 is out of range for ACQUIRE (0..4294967295)"),
    ("acquire 0, r1, window=4, freq=-1", 1, "-1", "freq_word = -1 is out of range"),
    ("play 0, addr=0, len=4, amp=0, freq=12..5MHz", 1, "12..5MHz", "bad frequency"),
    ("play 0, addr=0, len=4, amp=0, phase_reset=2", 1, "2",
     "phase_reset = 2 is out of range for PLAY (0..1)"),
    ("play 0, addr=0, len=4, amp=0, phase_reset=yes", 1, "yes",
     "unknown symbol 'yes' for phase_reset"),
    ("acquire 0, r1, window=4, phase_reset=1", 1, "phase_reset=1", "unknown operand"),
    ("marker 0, duration=4, phase=1", 1, "phase=1", "unknown operand 'phase'"),
]


@pytest.mark.parametrize("source,line,token,message", ERRORS)
def test_errors(source, line, token, message):
    with pytest.raises(AssemblerError) as info:
        assemble(source, "bad.s")
    err = info.value
    assert (err.filename, err.line, err.token) == ("bad.s", line, token)
    assert message in str(err)
    assert str(err).startswith(f"bad.s:{line}: ")


def test_call_hash_collision_is_reported():
    # "costarring" and "liquid" collide in 32-bit FNV-1a.
    assert fnv1a32("costarring") == fnv1a32("liquid")
    with pytest.raises(AssemblerError, match="same FNV-1a id"):
        assemble("call costarring()\ncall liquid()")


def test_program_too_long():
    with pytest.raises(AssemblerError, match="holds at most 1 ") as info:
        assemble("nop\nnop\nnop", params=QSCParams(imem_depth=2))
    assert info.value.line == 3
    # A ring of N slots holds N - 1 instructions: a full ring would read as empty.
    assert len(assemble("nop\n" * 3, params=QSCParams(imem_depth=4)).instructions) == 3
    with pytest.raises(AssemblerError, match="full ring would read as empty"):
        assemble("nop\n" * 4, params=QSCParams(imem_depth=4))
    with pytest.raises(ValueError, match="base"):
        assemble("nop", base=1024)


# --- the build's limits -----------------------------------------------------------------------

@st.composite
def builds(draw) -> QSCParams:
    """Builds of every shape the parameters allow (the ring must hold the one-instruction
    programs; the envelope memory holds at least 4 cycles of samples)."""
    spc = draw(st.sampled_from([1, 2, 4]))
    return QSCParams(
        imem_depth=draw(st.sampled_from([1 << k for k in range(1, 17)])),
        env_depth=draw(st.sampled_from([1 << k for k in range(1 + spc.bit_length(), 18)])),
        drives_per_ppu=draw(st.integers(1, 16)),
        readouts_per_ppu=draw(st.integers(1, 16)),
        markers_per_ppu=draw(st.integers(1, 16)),
        samples_per_cycle=spc,
        nco=draw(st.booleans()),
    )


BUILDS = builds()

CHANNEL_OPS = {
    "play": ("play {}, addr=0, len=4, amp=0.5", "drives_per_ppu"),
    "acquire": ("acquire {}, r1, window=4", "readouts_per_ppu"),
    "marker": ("marker {}, duration=4", "markers_per_ppu"),
}


def refused(source: str, **kw) -> AssemblerError:
    with pytest.raises(AssemblerError) as info:
        assemble(source, "b.s", **kw)
    return info.value


@settings(max_examples=300, deadline=None)
@given(BUILDS, st.sampled_from(sorted(CHANNEL_OPS)), st.integers(0, 15))
def test_channels_are_checked_against_the_build(params, mnemonic, channel):
    template, count = CHANNEL_OPS[mnemonic]
    n = getattr(params, count)
    source = "; the channel on line 2\n" + template.format(channel)
    if channel < n:
        assert decode(assemble(source, params=params).instructions[0])[1]["channel"] == channel
        return
    err = refused(source, params=params)
    assert (err.line, err.token) == (2, str(channel))
    assert f"channel = {channel} is out of range for {mnemonic.upper()} (0..{n - 1}: the build " \
           f"has {count} = {n})" in str(err)


@settings(max_examples=300, deadline=None)
@given(BUILDS, st.integers(0, 0xFFFF),
       st.sampled_from(["jmp {}", "beq r1, 0, {}", "bge r2, -1, {}", "branch ne, r3, 7, {}"]))
def test_branch_targets_are_checked_against_the_ring(params, target, template):
    source = "; the target on line 2\n" + template.format(target)
    if target < params.imem_depth:   # anywhere in the ring: appends may put code there
        assert decode(assemble(source, params=params).instructions[0])[1]["target"] == target
        return
    err = refused(source, params=params)
    assert (err.line, err.token) == (2, str(target))
    assert f"target = {target} is out of range for BRANCH (0..{params.imem_depth - 1}: the " \
           f"build has imem_depth = {params.imem_depth})" in str(err)


@settings(max_examples=300, deadline=None)
@given(BUILDS, st.integers(0, 0xFFFF), st.integers(0, 0xFFFF))
def test_play_ranges_are_checked_against_envelope_memory(params, addr, length):
    source = f"; the range on line 2\nplay 0, addr={addr}, len={length}, amp=0.5"
    depth, spc = params.env_depth, params.samples_per_cycle
    aligned = addr % spc == 0 and length % spc == 0
    if addr < depth and addr + length <= depth and aligned:
        f = decode(assemble(source, params=params).instructions[0])[1]
        assert (f["env_addr"], f["env_len"]) == (addr, length)
        return
    err = refused(source, params=params)
    assert err.line == 2
    if addr < depth and addr + length <= depth:
        name, value = ("env_addr", addr) if addr % spc else ("env_len", length)
        assert err.token == str(value)
        assert f"{name} = {value} is not a multiple of {spc} for PLAY (the build has " \
               f"samples_per_cycle = {spc}" in str(err)
    elif addr >= depth:
        assert err.token == str(addr)
        assert f"env_addr = {addr} is out of range for PLAY (0..{depth - 1}: the build has " \
               f"env_depth = {depth})" in str(err)
    else:
        assert err.token == str(length)
        assert f"env_addr + env_len = {addr} + {length} = {addr + length} is out of range for " \
               f"PLAY (0..{depth}: the build has env_depth = {depth})" in str(err)


def test_named_envelopes_fill_the_memory_exactly():
    params = QSCParams(env_depth=64)
    prog = assemble(".envelope a, square, length=60\n.envelope b, square, length=4\n"
                    "play 0, b, amp=1.0\nplay 0, addr=63, len=1, amp=1.0\n"
                    "play 0, addr=63, len=0, amp=0", params=params)
    assert [decode(w)[1]["env_addr"] for w in prog.instructions] == [60, 63, 63]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 40), st.sampled_from([-1, 1]))
def test_times_are_exact(k, digits, sign):
    """4 ns is one cycle at 250 MHz: a time a 10**-digits ns off a whole cycle is refused,
    with the exact number of cycles, however close it is."""
    assume(k > 0 or sign > 0)
    whole = f"{4 * k}.{'0' * digits}"
    assert one(f"wait {whole}ns") == (Op.WAIT, {"cycles": k})
    assert one(f"wait {whole}e-3us") == (Op.WAIT, {"cycles": k})
    if sign > 0:
        text, cycles = f"{4 * k}.{'0' * (digits - 1)}1ns", f"{k}.{'0' * digits}25"
    else:
        text, cycles = f"{4 * k - 1}.{'9' * digits}ns", f"{k - 1}.{'9' * digits}75"
    assert Fraction(cycles) == Fraction(text[:-2]) / 4
    err = refused(f"wait {text}")
    assert err.token == text
    assert str(err).endswith(f"is not a whole number of DTD cycles at 250000000 Hz ({cycles} "
                             f"cycles)")


def test_equ_names_a_label_defined_before_or_after():
    src = """
    .equ AGAIN, top
    .equ OUT, done
    .equ OUT2, OUT
    top: beq r1, 1, OUT
         branch ne, r1, 0, OUT2
         jmp AGAIN
    done: end
    .equ BACK, top
         jmp BACK
    """
    prog = assemble(src, base=10)
    assert prog.labels == {"top": 10, "done": 13}
    assert [decode(w)[1].get("target") for w in prog.instructions] == [13, 13, 10, None, 10]


def test_equ_chains_resolve_at_use():
    prog = assemble(".equ B, A\n.equ A, 40ns\nwait B\n.equ R, r3\n.equ S, R\nset S, 1")
    assert [decode(w)[1] for w in prog.instructions] == [{"cycles": 10}, {"rd": 3, "imm": 1}]


# --- disassembler -----------------------------------------------------------------------------


def test_disassemble_text_and_names():
    prog = assemble("l: call reset_decision(r1:1) -> r2\nbeq r2, 0, l\nend")
    text = disassemble(prog.instructions, functions=prog.functions)
    assert "call reset_decision(r1:1) -> r2" in text
    assert "L0:" in text and "beq r2, 0, L0" in text
    assert f"call {fnv1a32('reset_decision'):#010x}(r1:1)" in disassemble(prog.instructions)
    assert disassemble(prog.to_bytes()) == disassemble(prog.instructions)


def test_disassemble_noncanonical_words_as_word():
    words = [0x77, Op.WAIT.value | (1 << 100), Op.BRANCH.value | (9 << 8),
             encode(Op.CALL, {"arg_bits": 40}), encode(Op.ACQUIRE, {"window_cycles": 0})]
    text = disassemble(words)
    assert text.count(".word") == 5
    assert assemble(text).instructions == words


def test_disassemble_words_the_build_refuses_as_word():
    words = [encode(Op.PLAY, {"channel": 1, "env_len": 1}),
             encode(Op.PLAY, {"env_addr": 4000, "env_len": 200}),
             encode(Op.PLAY, {"env_addr": 4096}),
             encode(Op.ACQUIRE, {"channel": 1, "window_cycles": 1}),
             encode(Op.MARKER, {"channel": 4}),
             encode(Op.BRANCH, {"target": 1024})]
    text = disassemble(words)
    assert text.count(".word") == 6
    assert assemble(text).instructions == words
    wide = QSCParams(imem_depth=2048, env_depth=8192, drives_per_ppu=2, readouts_per_ppu=2,
                     markers_per_ppu=5)
    text = disassemble(words, params=wide)
    assert ".word" not in text and "jmp 1024" in text and "play 1, addr=0, len=1" in text
    assert assemble(text, params=wide).instructions == words


def test_disassemble_bad_input():
    with pytest.raises(TruncatedError):
        disassemble(b"\x00" * 17)
    with pytest.raises(FieldRangeError):
        disassemble([1 << 128])
    with pytest.raises(FieldRangeError) as info:
        decode(0xEE)
    assert info.value.field == "op"


def _field_strategy(shape) -> st.SearchStrategy:
    if isinstance(shape, type) and issubclass(shape, (Cond, AluFunc)):
        return st.sampled_from(list(shape))
    s = Shape.cast(shape)
    if s.signed:
        return st.integers(-(1 << (s.width - 1)), (1 << (s.width - 1)) - 1)
    return st.integers(0, (1 << s.width) - 1)


@st.composite
def instructions(draw, params: QSCParams) -> int:
    """A word that ``params``'s build can execute."""
    op = draw(st.sampled_from(list(Op)))
    name = {Op.PLAY: "play", Op.ACQUIRE: "acquire", Op.MARKER: "marker", Op.WAIT: "wait",
            Op.SYNC: "sync", Op.SET: "set", Op.ADD: "add", Op.ALU: "alu",
            Op.BRANCH: "branch", Op.CALL: "call", Op.BARRIER: "barrier"}.get(op)
    fields = {}
    if name:
        for fname, fld in Operands.as_shape()[name].shape.as_shape():
            if fname.startswith("_"):
                continue
            if fname in ("arg_bits", "arg1_bits", "arg2_bits", "arg3_bits"):
                fields[fname] = draw(st.integers(0, 32))
            elif fname == "window_cycles":
                fields[fname] = draw(st.integers(1, 0xFFFF))
            elif fname == "channel":
                n = {Op.PLAY: params.drives_per_ppu, Op.ACQUIRE: params.readouts_per_ppu,
                     Op.MARKER: params.markers_per_ppu}[op]
                fields[fname] = draw(st.integers(0, n - 1))
            elif fname == "target":
                fields[fname] = draw(st.integers(0, params.imem_depth - 1))
            elif fname == "env_addr":
                spc = params.samples_per_cycle
                last = (min(params.env_depth, 1 << 16) - 1) // spc
                fields[fname] = spc * draw(st.integers(0, last))
            elif fname == "env_len":
                spc = params.samples_per_cycle
                end = min(params.env_depth, (1 << 16) - 1 + fields["env_addr"])
                fields[fname] = spc * draw(st.integers(0, (end - fields["env_addr"]) // spc))
            elif fname in ("phase", "freq_word", "phase_reset") and not params.nco:
                fields[fname] = 0
            elif fname == "mask":
                fields[fname] = draw(st.integers(0, (1 << params.num_ppus) - 1))
            else:
                fields[fname] = draw(_field_strategy(fld.shape))
    if op == Op.ALU:
        # Canonical: the operand use_rt does not choose is 0; a shift amount 0..31.
        if fields["use_rt"]:
            fields["imm"] = 0
        else:
            fields["rt"] = 0
            if fields["func"] in (AluFunc.SHL, AluFunc.SHR, AluFunc.SRA):
                fields["imm"] &= 31
    return encode(op, fields)


@settings(max_examples=300, deadline=None)
@given(st.data(), BUILDS.filter(lambda p: p.imem_depth >= 32), st.integers(0, 8))
def test_round_trip_random_instructions(data, params, base):
    words = data.draw(st.lists(instructions(params), min_size=1, max_size=12))
    text = disassemble(words, base=base, params=params)
    assert ".word" not in text
    again = assemble(text, base=base, params=params)
    assert again.instructions == words
    assert disassemble(again.instructions, base=base, params=params) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, (1 << 128) - 1),
                          st.sampled_from([op.value for op in Op]).flatmap(
                              lambda v: st.integers(0, (1 << 40) - 1).map(lambda x: x << 8 | v))),
                min_size=1, max_size=8),
       st.one_of(st.just(QSCParams()), BUILDS.filter(lambda p: p.imem_depth >= 16)))
def test_round_trip_any_words(words, params):
    text = disassemble(words, params=params)
    assert assemble(text, params=params).instructions == words


def test_round_trip_source():
    src = (ROOT / "firmware" / "active_reset.s").read_text()
    prog = assemble(src, "active_reset.s")
    text = disassemble(prog.instructions, functions=prog.functions)
    assert assemble(text).instructions == prog.instructions


# --- firmware and docs ------------------------------------------------------------------------


def test_active_reset_firmware():
    prog = assemble((ROOT / "firmware" / "active_reset.s").read_text(), "active_reset.s")
    ops = [decode(w) for w in prog.instructions]
    kinds = [op for op, _ in ops]
    assert kinds[-1] == Op.END
    plays = [f for op, f in ops if op == Op.PLAY]
    assert len(plays) == 2 and all(p["channel"] == 0 for p in plays)
    acq = next(f for op, f in ops if op == Op.ACQUIRE)
    assert (acq["channel"], acq["rd"], acq["threshold"]) == (0, 1, 0)
    assert 80 <= acq["window_cycles"] <= 120
    call = next(f for op, f in ops if op == Op.CALL)
    assert {k: v for k, v in call.items() if v} == {
        "rd": 2, "rs": 1, "arg_bits": 1, "function_id": fnv1a32("reset_decision")}
    br = next((i, f) for i, (op, f) in enumerate(ops) if op == Op.BRANCH)
    assert br[1]["rs"] == 2
    i_call = kinds.index(Op.CALL)
    assert kinds.index(Op.ACQUIRE) < i_call < br[0]
    # the conditional pi pulse follows a SYNC, after the branch
    assert Op.SYNC in kinds[br[0]:] and kinds.index(Op.PLAY, br[0]) > kinds.index(Op.SYNC, br[0])


def test_isa_doc_tables_in_step():
    doc = (ROOT / "docs" / "isa.md").read_text()
    assert render_isa_tables() in doc, "regenerate with: qlink docs isa-tables"


def test_disassembled_amplitudes_are_short_and_exact():
    from openqlink.isa.asm import amplitude_to_q15, format_amplitude

    assert format_amplitude(32767) == "1.0" and format_amplitude(16384) == "0.5"
    assert all(amplitude_to_q15(float(format_amplitude(q))) == q for q in range(-32768, 32768))
    text = disassemble(assemble("play 0, addr=0, len=4, amp=1.0\nend").instructions)
    assert "amp=1.0" in text


# --- phases, frequencies and phase_reset (NCO operands) -----------------------------------------

#: A PLAY and an ACQUIRE, each with ``{}`` for more operands.
NCO_OPS = {"play": "play 0, addr=0, len=4, amp=0.5, {}", "acquire": "acquire 0, r1, window=4, {}"}


def nco_fields(mnemonic: str, operands: str, **kw) -> dict:
    op, f = one(NCO_OPS[mnemonic].format(operands), **kw)
    assert op == (Op.PLAY if mnemonic == "play" else Op.ACQUIRE)
    return f


@pytest.mark.parametrize("mnemonic", sorted(NCO_OPS))
@pytest.mark.parametrize("text,word", [
    ("0", 0), ("7", 7), ("0xFFFF", 65535),
    ("90deg", 16384), ("180deg", 32768), ("-90deg", 49152), ("270 deg", 49152),
    ("360deg", 0), ("-360deg", 0), ("450deg", 16384), ("0deg", 0), ("-0.0deg", 0),
    ("1deg", 182),                          # 65536 / 360 = 182.04: the nearest step
    ("0.0054931640625deg", 1),              # 360 / 2**16: one step, exactly
    ("0.00274658203125deg", 0),             # half a step: ties to even, down to 0
    ("0.00823974609375deg", 2),             # a step and a half: ties to even, up to 2
    ("-0.00274658203125deg", 0),
    ("1.5708rad", 16384), ("-1.5708rad", 49152),
    ("3.141592653589793rad", 32768), ("6.283185307179586rad", 0), ("0rad", 0),
])
def test_phase_units(mnemonic, text, word):
    assert nco_fields(mnemonic, f"phase={text}")["phase"] == word


@pytest.mark.parametrize("mnemonic", sorted(NCO_OPS))
@pytest.mark.parametrize("text,word", [
    ("0", 0), ("0x100", 256), ("0xFFFFFFFF", 2**32 - 1),
    ("31.25MHz", 2**29), ("-31.25MHz", 2**32 - 2**29), ("62.5MHz", 2**30),
    ("31250kHz", 2**29), ("31250000Hz", 2**29), ("0.03125GHz", 2**29), ("0MHz", 0),
    ("-12.5MHz", 2**32 - 214748365),        # -0.05 * 2**32 = -214748364.8: the nearest word
    ("12.5MHz", 214748365),
    ("1kHz", 17180),                        # 17179.869...
    ("0.05820766091346740722656250Hz", 1),  # sample_rate / 2**32: one step, exactly
    ("0.02910383045673370361328125Hz", 0),  # half a step: ties to even, down to 0
    ("0.08731149137020111083984375Hz", 2),  # a step and a half: ties to even, up to 2
    ("124.999MHz", round(Fraction(124_999_000, 250_000_000) * 2**32)),
    ("-124.999MHz", 2**32 - round(Fraction(124_999_000, 250_000_000) * 2**32)),
])
def test_freq_units(mnemonic, text, word):
    assert nco_fields(mnemonic, f"freq={text}")["freq_word"] == word


def test_freq_uses_the_sample_rate_of_the_build():
    # samples_per_cycle multiplies the sample rate: 125 MHz at 4 x 250 MHz is 1/8 turn/sample.
    for spc, word in ((1, 2**29), (2, 2**28), (4, 2**27)):
        params = QSCParams(samples_per_cycle=spc)
        assert params.sample_rate_hz == 250_000_000 * spc
        assert nco_fields("play", "freq=31.25MHz", params=params)["freq_word"] == word
        assert nco_fields("acquire", "freq=31.25MHz", params=params)["freq_word"] == word
    assert nco_fields("play", "freq=125MHz", params=QSCParams(samples_per_cycle=4)) \
        ["freq_word"] == 2**29
    # dtd_clk_hz= overrides the build's clock for frequencies as it does for times
    assert nco_fields("play", "freq=31.25MHz", dtd_clk_hz=125_000_000)["freq_word"] == 2**30
    assert nco_fields("play", "freq=31.25MHz", params=QSCParams(dtd_clk_hz=125_000_000))[
        "freq_word"] == 2**30
    # an integer word is the field as is, whatever the build
    assert nco_fields("play", "freq=1234", params=QSCParams(samples_per_cycle=4))[
        "freq_word"] == 1234


def test_phase_and_freq_through_equ():
    src = ".equ F, IF\n.equ IF, -12.5MHz\n.equ P, 90deg\n" \
          "play 0, addr=0, len=4, amp=0.5, phase=P, freq=F\n" \
          "acquire 0, r1, window=4, freq=F, phase=P"
    prog = assemble(src)
    for w in prog.instructions:
        f = decode(w)[1]
        assert (f["phase"], f["freq_word"]) == (16384, 2**32 - 214748365)
    with pytest.raises(AssemblerError, match=r"bad unit 'turn' .*") as info:
        assemble(".equ P, 1turn\nplay 0, addr=0, len=4, amp=0.5, phase=P")
    assert (info.value.line, info.value.token) == (2, "P")


@pytest.mark.parametrize("mnemonic", sorted(NCO_OPS))
@pytest.mark.parametrize("spc,text,limit,rate", [
    (1, "125MHz", "125000000", "250000000 * 1 = 250000000"),
    (1, "-125MHz", "125000000", "250000000 * 1 = 250000000"),
    (1, "125000000Hz", "125000000", "250000000 * 1 = 250000000"),
    (1, "0.2GHz", "125000000", "250000000 * 1 = 250000000"),
    (1, "-1GHz", "125000000", "250000000 * 1 = 250000000"),
    (2, "250MHz", "250000000", "250000000 * 2 = 500000000"),
    (4, "500MHz", "500000000", "250000000 * 4 = 1000000000"),
    (4, "-500.000001MHz", "500000000", "250000000 * 4 = 1000000000"),
])
def test_freq_at_or_beyond_nyquist_is_refused(mnemonic, spc, text, limit, rate):
    err = refused("nop\n" + NCO_OPS[mnemonic].format(f"freq={text}"),
                  params=QSCParams(samples_per_cycle=spc))
    assert (err.line, err.token) == (2, text)
    assert f"freq '{text}' is at or beyond the Nyquist frequency: |freq| must be below " \
           f"{limit} Hz (sample_rate_hz / 2; the build has sample_rate_hz = dtd_clk_hz * " \
           f"samples_per_cycle = {rate})" in str(err)


@pytest.mark.parametrize("text,hz", [("124999999.98Hz", "124999999.98"),
                                     ("-124999999.98Hz", "-124999999.98"),
                                     ("124.99999998MHz", "124999999.98")])
def test_freq_rounding_to_the_nyquist_word_is_refused(text, hz):
    # A step is 250 MHz / 2**32 = 0.058 Hz: 0.02 Hz below Nyquist rounds to the word +-2**31.
    assert abs(round(Fraction(hz) / 250_000_000 * 2**32)) == 2**31
    err = refused(NCO_OPS["play"].format(f"freq={text}"))
    assert err.token == text
    assert "is within half a step (0.02910383045673370361328125 Hz) of the Nyquist frequency, " \
           "125000000 Hz: it would round to the word 0x80000000" in str(err)
    # the step below still assembles
    assert nco_fields("play", "freq=124999999.94Hz")["freq_word"] == 2**31 - 1


@settings(max_examples=300, deadline=None)
@given(st.integers(-(1 << 20), 1 << 20))
def test_whole_steps_of_phase_in_degrees_are_exact(k):
    """``k`` steps of 360 / 2**16 degrees, written out exactly, are the word ``k mod 2**16``."""
    text = _decimal(Fraction(360 * k, 1 << 16))
    assert nco_fields("acquire", f"phase={text}deg")["phase"] == k % (1 << 16)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.integers(-(1 << 31) + 1, (1 << 31) - 1))
def test_whole_steps_of_frequency_are_exact(spc, k):
    """``k`` steps of sample_rate / 2**32 Hz, written out exactly, are the word ``k mod 2**32``
    (every word but the Nyquist one, 2**31, is some frequency below Nyquist)."""
    params = QSCParams(samples_per_cycle=spc)
    text = _decimal(Fraction(k * params.sample_rate_hz, 1 << 32))
    assert nco_fields("play", f"freq={text}Hz", params=params)["freq_word"] == k % (1 << 32)


def _decimal(x: Fraction) -> str:
    """``x`` (a fraction with a power of two as its denominator) as an exact decimal."""
    places = x.denominator.bit_length() - 1
    assert x.denominator == 1 << places
    digits = str(abs(x.numerator) * 5**places).rjust(places + 1, "0")
    sign = "-" if x < 0 else ""
    return f"{sign}{digits[:len(digits) - places]}.{digits[len(digits) - places:] or '0'}"


def test_phase_reset():
    assert nco_fields("play", "phase_reset=1")["phase_reset"] == 1
    assert nco_fields("play", "phase_reset=0")["phase_reset"] == 0
    assert nco_fields("play", "phase=1")["phase_reset"] == 0
    f = one("play 0, addr=0, len=4, amp=0.5, phase_reset=1, freq=25MHz")[1]
    assert (f["phase_reset"], f["freq_word"]) == (1, 429496730)     # 2**32 / 10, rounded
    word = encode(Op.PLAY, {"phase_reset": 1})
    assert word == Op.PLAY.value | 1 << 12        # bit 12, just above the channel


# --- the build: NCOs and samples per cycle ------------------------------------------------------

NO_NCO = QSCParams(nco=False)


@pytest.mark.parametrize("source,token,message", [
    ("play 0, addr=0, len=4, amp=0.5, phase=1", "1", "phase = 1 is not allowed for PLAY"),
    ("play 0, addr=0, len=4, amp=0.5, phase=90deg", "90deg",
     "phase = 16384 is not allowed for PLAY"),
    ("play 0, addr=0, len=4, amp=0.5, freq=25MHz", "25MHz",
     "freq_word = 429496730 is not allowed for PLAY"),
    ("play 0, addr=0, len=4, amp=0.5, freq=0xFFFFFFFF", "0xFFFFFFFF",
     "freq_word = 4294967295 is not allowed for PLAY"),
    ("play 0, addr=0, len=4, amp=0.5, phase_reset=1", "1",
     "phase_reset = 1 is not allowed for PLAY"),
    ("acquire 0, r1, window=4, phase=-1.5708rad", "-1.5708rad",
     "phase = 49152 is not allowed for ACQUIRE"),
    ("acquire 0, r1, window=4, freq=-1Hz", "-1Hz",
     "freq_word = 4294967279 is not allowed for ACQUIRE"),
])
def test_nco_operands_need_a_build_with_ncos(source, token, message):
    assert assemble(source).instructions           # the default build has NCOs
    err = refused("; line 2\n" + source, params=NO_NCO)
    assert (err.line, err.token) == (2, token)
    assert f"{message}: the build has no NCO (nco = False), so it must be 0" in str(err)


@pytest.mark.parametrize("source", ["add r1, r2, r3", "sub r1, r2, 4", "shl r1, r1, 3",
                                    "alu xor, r1, r2, r3"])
def test_alu_needs_a_build_with_the_alu(source):
    assert assemble(source).instructions           # the default build has the ALU
    err = refused("; line 2\n" + source, params=QSCParams(alu=False))
    assert err.line == 2
    assert "ALU is not in the build (alu = False)" in str(err)


def test_add_of_an_immediate_and_loop_need_no_alu():
    src = "top:\n add r1, r2, 5\n add r1, r1, -1\n loop r1, top\n end"
    assert assemble(src, params=QSCParams(alu=False)).instructions == \
        assemble(src).instructions


@pytest.mark.parametrize("source,token,total", [
    ("call f(r1:8, r2:32) -> r3", "32", 5),
    ("call f(r1, r2:1) -> r3", "1", 5),
])
def test_call_arguments_beyond_the_builds_bytes_are_refused(source, token, total):
    assert assemble(source).instructions           # the default build carries 16 bytes
    assert assemble("call f(r1:8, r2:24) -> r3", params=QSCParams(call_arg_bytes=4))
    err = refused(source, params=QSCParams(call_arg_bytes=4))
    assert err.token == token                      # the argument that goes past the bytes
    assert f"take {total} bytes; the build's CALLs carry at most 4" in str(err)


def test_zero_nco_operands_in_a_build_without_ncos():
    src = ("play 0, addr=0, len=4, amp=0.5, phase=0, freq=0, phase_reset=0\n"
           "play 0, addr=0, len=4, amp=0.5, phase=0deg, freq=0MHz\n"
           "play 0, addr=0, len=4, amp=0.5, phase=360deg\n"      # wraps to 0
           "acquire 0, r1, window=4, phase=0rad, freq=0Hz\nend")
    prog = assemble(src, params=NO_NCO)
    assert prog.instructions == assemble(src).instructions
    assert all(decode(w)[1].get("phase", 0) == decode(w)[1].get("freq_word", 0) == 0
               for w in prog.instructions)
    fw = (ROOT / "firmware" / "active_reset.s").read_text()
    assert assemble(fw, params=NO_NCO).instructions == assemble(fw).instructions


@pytest.mark.parametrize("spc", [2, 4])
@pytest.mark.parametrize("operands,field,value,token", [
    ("addr={a}, len={n}", None, None, None),
    ("addr={a1}, len={n}", "env_addr", "{a1}", "{a1}"),
    ("addr={a}, len={n1}", "env_len", "{n1}", "{n1}"),
    ("addr={a1}, len={n1}", "env_addr", "{a1}", "{a1}"),
    ("addr={a3}, len=0", "env_addr", "{a3}", "{a3}"),
])
def test_play_ranges_must_be_whole_cycles(spc, operands, field, value, token):
    names = {"a": 8 * spc, "n": 4 * spc, "a1": 8 * spc + 1, "n1": 4 * spc - 1,
             "a3": spc - 1 + 4 * spc}
    source = f"; line 2\nplay 0, {operands.format(**names)}, amp=0.5"
    params = QSCParams(samples_per_cycle=spc)
    if field is None:
        f = decode(assemble(source, params=params).instructions[0])[1]
        assert (f["env_addr"], f["env_len"]) == (names["a"], names["n"])
        return
    assert assemble(source).instructions                # one sample per cycle takes it
    err = refused(source, params=params)
    assert (err.line, err.token) == (2, token.format(**names))
    assert f"{field} = {value.format(**names)} is not a multiple of {spc} for PLAY (the build " \
           f"has samples_per_cycle = {spc}: {spc} samples per DTD cycle)" in str(err)


@pytest.mark.parametrize("spc,length,near", [(2, 7, "6 or 8"), (4, 6, "4 or 8"), (4, 3, "4"),
                                             (4, 65535, "65532"), (2, 1, "2")])
def test_envelope_lengths_must_be_whole_cycles(spc, length, near):
    source = f".envelope a, square, length=8\n.envelope b, gaussian, length={length}, sigma=2"
    big = {"env_depth": 1 << 17}
    assert assemble(source, params=QSCParams(**big)).envelopes["b"].length == length
    err = refused(source, params=QSCParams(samples_per_cycle=spc, **big))
    assert (err.line, err.token) == (2, str(length))
    assert f"envelope length {length} is not a multiple of {spc} (the build has " \
           f"samples_per_cycle = {spc}: PLAY takes {spc} samples per DTD cycle); use {near}" \
           in str(err)


@pytest.mark.parametrize("spc", [1, 2, 4])
def test_envelopes_are_allocated_at_whole_cycles(spc):
    params = QSCParams(samples_per_cycle=spc)
    src = (f".envelope a, square, length={4 * spc}\n.envelope b, gaussian, length={12 * spc}, "
           f"sigma=3\n.envelope c, square, length={spc}\nplay 0, c, amp=1.0\nplay 0, b, amp=0.5")
    prog = assemble(src, params=params)
    assert [(e.addr, e.length) for e in prog.envelopes.values()] == [
        (0, 4 * spc), (4 * spc, 12 * spc), (16 * spc, spc)]
    assert [(decode(w)[1]["env_addr"], decode(w)[1]["env_len"]) for w in prog.instructions] == [
        (16 * spc, spc), (4 * spc, 12 * spc)]


# --- NCO operands in the disassembler -----------------------------------------------------------


def test_disassemble_nco_operands():
    src = ("play 0, addr=0, len=4, amp=0.5, phase=90deg, freq=-12.5MHz, phase_reset=1\n"
           "play 0, addr=0, len=4, amp=0.5, phase_reset=1\n"
           "acquire 0, r1, window=4, threshold=-2, phase=180deg, freq=31.25MHz\n"
           "acquire 0, r2, window=4, offset=3, freq=1\n"
           "acquire 0, r3, window=4, phase=1\n"
           "acquire 0, r4, window=4\nend")
    prog = assemble(src)
    lines = [line.strip() for line in disassemble(prog.instructions).splitlines()[1:]]
    assert lines == [
        f"play 0, addr=0, len=4, amp=0.5, phase=16384, freq={2**32 - 214748365}, phase_reset=1",
        "play 0, addr=0, len=4, amp=0.5, phase_reset=1",
        f"acquire 0, r1, window=4, threshold=-2, phase=32768, freq={2**29}",
        "acquire 0, r2, window=4, threshold=0, offset=3, freq=1",
        "acquire 0, r3, window=4, threshold=0, phase=1",
        "acquire 0, r4, window=4, threshold=0",
        "end",
    ]
    assert assemble("\n".join(lines)).instructions == prog.instructions


def test_disassemble_nco_and_unaligned_words_per_build():
    words = [encode(Op.PLAY, {"env_len": 4, "phase": 1}),
             encode(Op.PLAY, {"env_len": 4, "freq_word": 2**31}),     # the Nyquist word
             encode(Op.PLAY, {"env_len": 4, "phase_reset": 1}),
             encode(Op.ACQUIRE, {"window_cycles": 1, "phase": 2}),
             encode(Op.ACQUIRE, {"window_cycles": 1, "freq_word": 3}),
             encode(Op.PLAY, {"env_addr": 2, "env_len": 4}),
             encode(Op.PLAY, {"env_addr": 4, "env_len": 6})]
    text = disassemble(words)                            # NCOs, one sample per cycle: all run
    assert ".word" not in text and "freq=2147483648" in text
    assert assemble(text).instructions == words
    text = disassemble(words, params=NO_NCO)
    assert text.count(".word") == 5 and "play 0, addr=2, len=4" in text
    assert assemble(text, params=NO_NCO).instructions == words
    spc4 = QSCParams(samples_per_cycle=4)
    text = disassemble(words, params=spc4)
    assert text.count(".word") == 2 and "phase_reset=1" in text
    assert assemble(text, params=spc4).instructions == words


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(NCO_OPS)), st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1),
       st.integers(0, 1), st.sampled_from([1, 2, 4]))
def test_round_trip_nco_operands(mnemonic, phase, freq, reset, spc):
    params = QSCParams(samples_per_cycle=spc)
    fields = {"phase": phase, "freq_word": freq}
    if mnemonic == "play":
        op = Op.PLAY
        fields |= {"phase_reset": reset, "env_addr": 4 * spc, "env_len": 8 * spc}
    else:
        op = Op.ACQUIRE
        fields |= {"window_cycles": 5}
    words = [encode(op, fields)]
    text = disassemble(words, params=params)
    assert ".word" not in text
    assert assemble(text, params=params).instructions == words
    nco_set = phase or freq or (reset and mnemonic == "play")
    text = disassemble(words, params=QSCParams(samples_per_cycle=spc, nco=False))
    assert (".word" in text) == bool(nco_set)
    assert assemble(text, params=QSCParams(samples_per_cycle=spc, nco=False)).instructions \
        == words


def test_barrier_syntax_build_check_and_round_trip():
    params = QSCParams(num_ppus=2, dtd_clk_hz=250_000_000)
    prog = assemble("barrier 0b11, 16ns\nbarrier 1\nend\n", params=params)
    assert [decode(w)[1] for w in prog.instructions[:2]] == [
        {"slack_cycles": 4, "mask": 3}, {"slack_cycles": 0, "mask": 1}]
    text = disassemble(prog.instructions, params=params)
    assert "barrier 0x3, 4" in text
    assert assemble(text, params=params).instructions == prog.instructions
    with pytest.raises(AssemblerError, match=r"mask = 0x5 names a PPU the build does not have "
                                             r"\(PPUs 0\.\.1: the build has num_ppus = 2\)"):
        assemble("barrier 0b101, 0\nend\n", params=params)


def test_alu_loop_and_multi_argument_call_source():
    """The ALU mnemonics, LOOP (a label may be called ``loop``) and a CALL of 4 arguments with
    a 64-bit result assemble to the documented fields and back."""
    src = """
    loop:   set r1, 3
            shl r2, r1, 4
            or r2, r2, r1
            sub r3, r2, r1
            loop r1, loop
            call f(r1:1, r2:8, r3:12, r4) -> r5, r6
            end
    """
    prog = assemble(src)
    assert decode(prog.instructions[1]) == (Op.ALU, {"rd": 2, "rs": 1, "imm": 4, "rt": 0,
                                                     "func": AluFunc.SHL, "use_rt": 0})
    assert decode(prog.instructions[2])[1]["use_rt"] == 1
    assert decode(prog.instructions[4]) == (Op.BRANCH, {"cond": Cond.DBNZ, "rs": 1, "imm": 1,
                                                        "target": 0})
    op, f = decode(prog.instructions[5])
    assert (f["rs"], f["arg_bits"], f["rs1"], f["arg1_bits"], f["rs2"], f["arg2_bits"],
            f["rs3"], f["arg3_bits"], f["rd"], f["rd_hi"]) == (1, 1, 2, 8, 3, 12, 4, 32, 5, 6)
    text = disassemble(prog.instructions, functions=prog.functions)
    assert "loop r1, L0" in text and "call f(r1:1, r2:8, r3:12, r4:32) -> r5, r6" in text
    assert assemble(text).instructions == prog.instructions
