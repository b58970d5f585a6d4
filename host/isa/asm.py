"""PPU assembler and disassembler.

Turns PPU assembly text (``docs/isa.md``) into 128-bit instruction words packed with the layout
the gateware uses (:class:`openqlink.isa.layout.Instruction`, ``.const({...}).as_bits()``), and
back. Every field is range-checked against its width in that layout, never re-encoded by hand.

Syntax summary (one instruction per line, ``;`` starts a comment)::

    .equ NAME, value                        ; a named constant, usable wherever a value is
    .envelope name, gaussian, length=64, sigma=16, amp=1.0   ; allocate envelope memory
    .envelope name, square, length=32, amp=0.5
    .word 0x...                             ; one raw 128-bit instruction word
    label:  play 0, name, amp=0.5, offset=0, phase=0, freq=0, phase_reset=0
            play 0, addr=0, len=64, amp=0.5 ; explicit envelope memory range
            play 0, name, amp=0.5, phase=90deg, freq=-12.5MHz, phase_reset=1
            acquire 0, r1, window=100, threshold=0, offset=0, phase=0, freq=0
            acquire 0, r1, window=400ns, phase=1.5708rad, freq=25MHz
            marker 0, duration=10, offset=0
            wait 400ns                      ; times: cycles, or ns/us at dtd_clk_hz
            sync 16
            barrier 0b11, 16                ; wait for PPUs 0 and 1, then t = now + 16
            set r1, 5
            add r1, r2, -1
            add r1, r2, r3                  ; rT or an immediate: also sub and or xor shl shr sra
            alu add, r1, r2, 5              ; the general form (funcs: add sub ... sra)
            beq r2, 1, label                ; also bne, blt, bge; jmp label
            loop r4, label                  ; r4 -= 1; to label while r4 != 0
            branch eq, r2, 1, label         ; the general form (conds: always eq ... dbnz)
            call decode(r1:1) -> r2         ; function_id = fnv1a32("decode")
            call f(r1:1, r2:8, r3, r4:16) -> r5, r6   ; up to 4 arguments, a 64-bit result
            nop
            end

Amplitudes are real numbers of DAC full scale in [-1.0, 1.0], stored as signed Q1.15
(``round(x * 32768)``; 1.0 saturates to 32767, the one value that does). Times are DTD cycles
when written without a unit; with ``ns`` or ``us`` they are converted at ``dtd_clk_hz``, exactly
(the number as written, not a float), and must come out as a whole number of cycles. A ``.equ``
value may name another ``.equ`` or a label, defined before or after it; names are followed when
the value is used.

A ``phase`` (PLAY's NCO phase offset, ACQUIRE's demodulation phase) is an integer in turns / 2**16,
the field as is, or an angle in ``deg`` or ``rad``: ``round(angle / 360deg * 2**16) mod 2**16``,
rounded to the nearest step with ties to even (``90deg`` is 16384, ``-90deg`` 49152; ``rad`` uses
the double nearest to pi). A ``freq`` is an integer word in turns / 2**32 per sample, the field
as is, or a frequency in ``Hz``, ``kHz``, ``MHz`` or ``GHz`` (case as written):
``round(f / sample_rate_hz * 2**32) mod 2**32``, ties to even, with ``sample_rate_hz =
dtd_clk_hz * samples_per_cycle`` of the build (``31.25MHz`` at 250 MHz is ``2**29``; a negative
frequency is the two's complement word). A frequency must be below the Nyquist frequency,
``sample_rate_hz / 2``, in magnitude, and must not round to the word ``2**31`` (which is both
+Nyquist and -Nyquist). ``phase_reset=1`` starts the drive channel's NCO accumulator at 0 on the
pulse's first sample. The number before a unit is taken exactly, as for times.

Every operand must fit its field and the build (:class:`openqlink.memory_map.QSCParams`): a
PLAY, ACQUIRE or MARKER channel below ``drives_per_ppu``, ``readouts_per_ppu`` or
``markers_per_ppu``, a PLAY's samples ``addr .. addr + len - 1`` inside the ``env_depth``-sample
envelope memory, a branch target below ``imem_depth`` (anywhere in the ring: code appended later
may be there). A build with ``samples_per_cycle = S > 1`` takes a PLAY's ``addr`` and ``len`` (given
or from an envelope) only as multiples of S, and an ``.envelope`` length only as a multiple of S
(refused, not padded: the length stays the pulse's); envelopes are allocated in order from sample
0, so each starts at a multiple of S. A build with ``nco = False`` takes ``phase``, ``freq`` and
``phase_reset`` only as 0.

Errors raise :class:`openqlink.errors.AssemblerError` carrying file, line and the bad token.

# Ref: docs/isa.md (this project's ISA); CUDA-Q realtime message protocol (FNV-1a function_id)
"""

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from amaranth.hdl import Shape

from ..errors import AssemblerError, FieldRangeError, TruncatedError
from ..memory_map import QSCParams
from ..wire.rpc import fnv1a32
from .layout import (
    INSTRUCTION_BITS,
    INSTRUCTION_BYTES,
    NUM_REGISTERS,
    AluFunc,
    Cond,
    Instruction,
    Op,
    Operands,
    PPUState,
    PPUStatus,
)

__all__ = [
    "Envelope",
    "SourceLocation",
    "Program",
    "assemble",
    "disassemble",
    "encode",
    "decode",
    "amplitude_to_q15",
    "q15_to_amplitude",
    "render_isa_tables",
    "MNEMONICS",
    "MAX_CALL_ARG_BITS",
]

#: The most argument bits a CALL can carry (one 32-bit register).
MAX_CALL_ARG_BITS = 32

#: The largest power of ten a time, phase or frequency may be written with (``1e-40us``): beyond
#: it the exact value and its message grow without bound.
_MAX_EXPONENT = 40

#: Steps of a full turn in a ``phase`` field (turns / 2**16) and in a ``freq_word`` (turns / 2**32
#: per sample).
_PHASE_STEPS = 1 << 16
_FREQ_STEPS = 1 << 32
#: pi as the double nearest to it, exactly (``rad`` phases are converted with it).
_PI = Fraction(math.pi)
#: Frequency units and their value in Hz (case-sensitive: ``mHz`` would be millihertz).
_FREQ_UNITS: dict[str, int] = {"Hz": 1, "kHz": 10**3, "MHz": 10**6, "GHz": 10**9}

_Q15_ONE = 1 << 15

# The operand struct of each op in the ``Operands`` union (ops absent here have no operands).
_OPERANDS_OF: dict[Op, str] = {
    Op.PLAY: "play",
    Op.ACQUIRE: "acquire",
    Op.MARKER: "marker",
    Op.WAIT: "wait",
    Op.SYNC: "sync",
    Op.BARRIER: "barrier",
    Op.SET: "set",
    Op.ADD: "add",
    Op.ALU: "alu",
    Op.BRANCH: "branch",
    Op.CALL: "call",
}

_BRANCH_ALIASES: dict[str, Cond] = {"beq": Cond.EQ, "bne": Cond.NE, "blt": Cond.LT, "bge": Cond.GE}

#: ALU mnemonics: ``add`` with a register second operand, the others with either.
_ALU_MNEMONICS: dict[str, AluFunc] = {f.name.lower(): f for f in AluFunc}
_SHIFTS = (AluFunc.SHL, AluFunc.SHR, AluFunc.SRA)

#: Enumerated operand fields (kept as their members by ``decode``).
_ENUMS = (Cond, AluFunc)

#: Every mnemonic the assembler accepts (directives start with a dot and are not listed).
MNEMONICS: tuple[str, ...] = (
    "nop", "end", "wait", "sync", "barrier", "play", "acquire", "marker", "set", "add",
    "sub", "and", "or", "xor", "shl", "shr", "sra", "alu",
    "branch", "beq", "bne", "blt", "bge", "jmp", "loop", "call",
)

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IDENT_RE = re.compile(rf"^{_IDENT}$")
_LABEL_RE = re.compile(rf"^({_IDENT})\s*:(.*)$")
_REG_RE = re.compile(r"^[rR]([0-9]+)$")
_QUANTITY_RE = re.compile(
    r"^(?P<num>[-+]?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+"
    r"|[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
    r"|\.[0-9]+(?:[eE][-+]?[0-9]+)?))\s*(?P<unit>[A-Za-z]*)$")
_CALL_RE = re.compile(r"^(?P<fn>[^\s(]+)\s*\((?P<args>[^()]*)\)\s*(?:->\s*(?P<rd>[^()]+?))?\s*$")
#: A CALL's argument fields, argument k's register and bits.
_CALL_ARGS = (("rs", "arg_bits"), ("rs1", "arg1_bits"), ("rs2", "arg2_bits"), ("rs3", "arg3_bits"))
_MNEMONIC_RE = re.compile(r"^(\S+)\s*(.*)$")
_RESERVED_NAMES = {f"r{i}" for i in range(NUM_REGISTERS)} | {c.name.lower() for c in Cond}


# ---------------------------------------------------------------------------------------------
# Encoding: one place that turns (op, fields) into a word, range-checked by the layout.


def _field_shapes(op: Op) -> dict[str, Shape]:
    if op not in _OPERANDS_OF:
        return {}
    struct = Operands.as_shape()[_OPERANDS_OF[op]].shape
    return {name: fld.shape for name, fld in struct.as_shape()}


def _field_range(shape: object) -> tuple[int, int]:
    s = Shape.cast(shape)
    if s.signed:
        return -(1 << (s.width - 1)), (1 << (s.width - 1)) - 1
    return 0, (1 << s.width) - 1


def encode(op: Op, fields: Mapping[str, object] | None = None) -> int:
    """Pack one instruction into its 128-bit word with :class:`Instruction`.

    ``fields`` names the operand fields of ``op`` as the layout does (``offset_cycles``,
    ``env_addr``, ...); fields left out are 0, reserved fields are always 0. Raises
    :class:`openqlink.errors.FieldRangeError` naming the field when a value does not fit its
    width, or when the field does not exist for ``op``.
    """
    fields = dict(fields or {})
    shapes = _field_shapes(op)
    for name, value in fields.items():
        if name not in shapes or name.startswith("_"):
            raise FieldRangeError(op.name, name, value, f"{op.name} has no operand {name!r}")
        shape = shapes[name]
        if isinstance(shape, type) and issubclass(shape, _ENUMS):
            if not isinstance(value, shape):
                raise FieldRangeError(op.name, name, value,
                                      f"{value!r} is not a {shape.__name__}")
            continue
        lo, hi = _field_range(shape)
        if not isinstance(value, int) or not lo <= value <= hi:
            raise FieldRangeError(op.name, name, value,
                                  f"{value!r} does not fit {Shape.cast(shape)} ({lo}..{hi})")
    operands = {_OPERANDS_OF[op]: fields} if op in _OPERANDS_OF else {}
    return Instruction.const({"op": op, "operands": operands}).as_bits()


def decode(word: int) -> tuple[Op, dict[str, Any]]:
    """Unpack a 128-bit word into ``(op, fields)``, the inverse of :func:`encode`.

    Raises :class:`openqlink.errors.FieldRangeError` naming ``op`` or ``cond`` for a value the
    ISA does not define, ``word`` when the word is out of range, and ``reserved`` when bits that
    :func:`encode` always leaves zero are set (so ``encode(*decode(w)) == w`` always holds).
    """
    if not isinstance(word, int) or not 0 <= word < 1 << INSTRUCTION_BITS:
        raise FieldRangeError("Instruction", "word", word,
                              f"not a {INSTRUCTION_BITS}-bit unsigned integer")
    try:
        op = Op(word & 0xFF)
    except ValueError:
        raise FieldRangeError("Instruction", "op", word & 0xFF,
                              f"{word & 0xFF:#04x} is not an opcode") from None
    fields: dict[str, Any] = {}
    if op in _OPERANDS_OF:
        view = getattr(Instruction.from_bits(word).operands, _OPERANDS_OF[op])
        for name in _field_shapes(op):
            if name.startswith("_"):
                continue
            try:
                value = getattr(view, name)
            except ValueError:
                raise FieldRangeError(op.name, name, None, "value is not defined") from None
            fields[name] = value if isinstance(value, _ENUMS) else int(value)
    if encode(op, fields) != word:
        raise FieldRangeError(op.name, "reserved", word,
                              "reserved or unused bits are set")
    return op, fields


# ---------------------------------------------------------------------------------------------
# What a build can execute


#: Operand fields whose values the build bounds: op -> field -> the QSCParams count it must stay
#: below (the gateware takes a target mod ``imem_depth`` and an address mod ``env_depth``, and
#: refuses a channel it does not have as an illegal instruction).
_BUILD_LIMITS: dict[Op, dict[str, str]] = {
    Op.PLAY: {"channel": "drives_per_ppu", "env_addr": "env_depth"},
    Op.ACQUIRE: {"channel": "readouts_per_ppu"},
    Op.MARKER: {"channel": "markers_per_ppu"},
    Op.BRANCH: {"target": "imem_depth"},
}


#: Operand fields that only a build with NCOs (``QSCParams.nco``) can execute when non-zero.
_NCO_FIELDS: dict[Op, tuple[str, ...]] = {
    Op.PLAY: ("phase", "freq_word", "phase_reset"),
    Op.ACQUIRE: ("phase", "freq_word"),
}


def _build_fault(op: Op, fields: Mapping[str, Any], params: QSCParams) -> tuple[str, str] | None:
    """Why ``params``'s build cannot execute ``op`` with ``fields`` (each in its field's range):
    ``(field, message)`` for the first operand at fault, or ``None`` when it can."""
    for name, count_name in _BUILD_LIMITS.get(op, {}).items():
        value, count = int(fields.get(name, 0)), getattr(params, count_name)
        if value >= count:
            return name, (f"{name} = {value} is out of range for {op.name} (0..{count - 1}: the "
                          f"build has {count_name} = {count})")
    if op == Op.BARRIER and int(fields.get("mask", 0)) >> params.num_ppus:
        return "mask", (f"mask = {int(fields['mask']):#x} names a PPU the build does not have "
                        f"(PPUs 0..{params.num_ppus - 1}: the build has num_ppus = "
                        f"{params.num_ppus})")
    if op == Op.PLAY:
        addr, length = int(fields.get("env_addr", 0)), int(fields.get("env_len", 0))
        depth = params.env_depth
        if addr + length > depth:
            return "env_len", (f"env_addr + env_len = {addr} + {length} = {addr + length} is out "
                               f"of range for PLAY (0..{depth}: the build has env_depth = "
                               f"{depth})")
        spc = params.samples_per_cycle
        for name, value in (("env_addr", addr), ("env_len", length)):
            if value % spc:
                return name, (f"{name} = {value} is not a multiple of {spc} for PLAY (the build "
                              f"has samples_per_cycle = {spc}: {spc} samples per DTD cycle)")
    if not params.nco:
        for name in _NCO_FIELDS.get(op, ()):
            value = int(fields.get(name, 0))
            if value:
                return name, (f"{name} = {value} is not allowed for {op.name}: the build has no "
                              f"NCO (nco = False), so it must be 0")
    if op == Op.ACQUIRE and fields.get("window_cycles", 0) == 0:
        return "window_cycles", "window must be at least 1 cycle"
    if op == Op.ALU and not params.alu:
        return "func", (f"{op.name} is not in the build (alu = False): it has ADD of an "
                        f"immediate (add rD, rS, IMM), LOOP and BRANCH, not the ALU's functions "
                        f"of two registers or shifts")
    if op == Op.ALU:
        # Canonical words only: the operand that use_rt does not choose is 0, and a shift's
        # immediate amount is 0..31 (the gateware takes its low 5 bits).
        unused, value = (("imm", fields.get("imm", 0)) if fields.get("use_rt", 0)
                         else ("rt", fields.get("rt", 0)))
        if value:
            return unused, (f"{unused} = {value} must be 0 for ALU with use_rt = "
                            f"{int(fields.get('use_rt', 0))}")
        if fields.get("func") in _SHIFTS and not fields.get("use_rt", 0) \
                and not 0 <= int(fields.get("imm", 0)) <= 31:
            return "imm", f"shift amount {fields['imm']} outside 0..31"
    if op == Op.CALL:
        total = 0
        for _, name in _CALL_ARGS:
            if fields.get(name, 0) > MAX_CALL_ARG_BITS:
                return name, f"argument bits {fields[name]} outside 0..{MAX_CALL_ARG_BITS}"
            total += -(-int(fields.get(name, 0)) // 8)
            if total > params.call_arg_bytes:
                return name, (f"the arguments up to {name} take {total} bytes; the build's CALLs "
                              f"carry at most {params.call_arg_bytes} (call_arg_bytes = "
                              f"{params.call_arg_bytes})")
    return None


def _exact(value: Fraction) -> str:
    """``value`` written out exactly: as a decimal when it has one (``0.999999999999999999975``,
    never rounded), else as ``p/q``."""
    rest, places = value.denominator, 0
    for prime in (2, 5):
        k = 0
        while rest % prime == 0:
            rest //= prime
            k += 1
        places = max(places, k)
    if rest != 1:
        return f"{value.numerator}/{value.denominator}"
    if places == 0:
        return str(value.numerator)
    digits = str(abs(value.numerator * 10**places // value.denominator)).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


# ---------------------------------------------------------------------------------------------
# Program and helpers


@dataclass(frozen=True)
class Envelope:
    """An allocated envelope: ``addr`` (first sample, in samples) and ``samples`` (Q1.15 ints)."""

    addr: int
    samples: list[int]

    @property
    def length(self) -> int:
        """Number of 16-bit samples."""
        return len(self.samples)


@dataclass(frozen=True)
class SourceLocation:
    """Where an instruction came from: file name, 1-based line number and the line's text."""

    filename: str
    line: int
    text: str


@dataclass
class Program:
    """An assembled PPU program.

    Attributes
    ----------
    instructions : list[int]
        128-bit instruction words, the first one at instruction index ``base``.
    labels : dict[str, int]
        Label name -> absolute instruction index.
    envelopes : dict[str, Envelope]
        Envelope name -> its allocation in envelope memory (addresses in 16-bit samples).
    functions : dict[str, int]
        CALL handler name -> function_id (32-bit FNV-1a of the name).
    source_map : dict[int, SourceLocation]
        Absolute instruction index -> the source line it was assembled from.
    base : int
        Instruction index of the first instruction (0 unless assembled with ``base=``).
    """

    instructions: list[int]
    labels: dict[str, int] = field(default_factory=dict)
    envelopes: dict[str, Envelope] = field(default_factory=dict)
    functions: dict[str, int] = field(default_factory=dict)
    source_map: dict[int, SourceLocation] = field(default_factory=dict)
    base: int = 0

    def to_bytes(self) -> bytes:
        """The instructions as stored in IMEM: 16 bytes each, little-endian."""
        return b"".join(w.to_bytes(INSTRUCTION_BYTES, "little") for w in self.instructions)

    def envelope_bytes(self) -> bytes:
        """Envelope memory image from sample 0 to the end of the last envelope, as stored in ENV
        memory: signed 16-bit samples, little-endian (2 bytes per sample). Gaps are zero."""
        end = max((e.addr + e.length for e in self.envelopes.values()), default=0)
        image = [0] * end
        for env in self.envelopes.values():
            image[env.addr:env.addr + env.length] = env.samples
        return b"".join(s.to_bytes(2, "little", signed=True) for s in image)


def amplitude_to_q15(x: float) -> int:
    """Real amplitude in [-1.0, 1.0] -> signed Q1.15 (``round(x * 32768)``, 1.0 -> 32767).

    Raises :class:`ValueError` outside that range or for NaN.
    """
    if not math.isfinite(x) or not -1.0 <= x <= 1.0:
        raise ValueError(f"amplitude {x!r} is outside [-1.0, 1.0]")
    return min(round(x * _Q15_ONE), _Q15_ONE - 1)


def q15_to_amplitude(q: int) -> float:
    """Signed Q1.15 -> real amplitude (exact: every Q1.15 value is a binary fraction)."""
    return q / _Q15_ONE


def format_amplitude(q: int) -> str:
    """The shortest decimal that :func:`amplitude_to_q15` turns back into ``q``
    (``32767`` -> ``"1.0"``, ``16384`` -> ``"0.5"``), for the disassembler."""
    for digits in range(1, 17):
        text = f"{q15_to_amplitude(q):.{digits}g}"
        x = float(text)
        if -1.0 <= x <= 1.0 and amplitude_to_q15(x) == q:
            return text if any(c in text for c in ".e") else text + ".0"
    return repr(q15_to_amplitude(q))


# ---------------------------------------------------------------------------------------------
# The assembler


def _split_mnemonic(text: str) -> tuple[str, str]:
    m = _MNEMONIC_RE.match(text)
    assert m is not None  # text is stripped and not empty
    return m[1], m[2].strip()


@dataclass
class _Line:
    lineno: int
    text: str          # the source line as written
    mnemonic: str
    operands: str
    index: int         # absolute instruction index


class _Assembler:
    def __init__(self, filename: str, params: QSCParams, dtd_clk_hz: int, base: int):
        self.filename = filename
        self.params = params
        self.hz = dtd_clk_hz
        self.base = base
        self.labels: dict[str, int] = {}
        self.equs: dict[str, str] = {}
        self.envelopes: dict[str, Envelope] = {}
        self.functions: dict[str, int] = {}
        self.env_next = 0
        self.lineno = 0

    # -- errors and symbols -------------------------------------------------------------------

    def error(self, message: str, token: str = "") -> AssemblerError:
        return AssemblerError(message, filename=self.filename, line=self.lineno, token=token)

    def define(self, name: str, kind: str) -> None:
        if not _IDENT_RE.match(name):
            raise self.error(f"bad {kind} name {name!r}", name)
        if name.lower() in _RESERVED_NAMES:
            raise self.error(f"{kind} name {name!r} is reserved (register or condition)", name)
        for table, what in ((self.labels, "label"), (self.equs, "constant"),
                            (self.envelopes, "envelope")):
            if name in table:
                raise self.error(f"duplicate symbol {name!r} (already a {what})", name)

    def expand(self, token: str) -> tuple[str, list[str]]:
        """Follow ``.equ`` names from ``token``: the text they end at, and the names passed."""
        text, chain = token.strip(), []
        while text in self.equs:
            if text in chain:
                raise self.error(f"circular .equ ({' -> '.join([*chain, text])})", token.strip())
            chain.append(text)
            text = self.equs[text]
        return text, chain

    def resolve(self, token: str) -> str:
        """Replace a ``.equ`` name by its value text, through ``.equ`` chains; other tokens are
        returned stripped."""
        token = token.strip()
        if not token:
            raise self.error("missing value", token)
        return self.expand(token)[0]

    def via(self, token: str) -> str:
        """`` (.equ A -> B -> text)`` when ``token`` names a ``.equ``, for messages; else ``""``."""
        text, chain = self.expand(token)
        return f" (.equ {' -> '.join([*chain, text])})" if chain else ""

    # -- value parsers ------------------------------------------------------------------------

    def integer(self, token: str, what: str) -> int:
        text = self.resolve(token)
        try:
            return int(text, 0)
        except ValueError:
            if _IDENT_RE.match(text):
                raise self.error(f"unknown symbol {text!r} for {what}{self.via(token)}",
                                 token) from None
            raise self.error(f"bad number {text!r} for {what}{self.via(token)}", token) from None

    def real(self, token: str, what: str) -> float:
        text = self.resolve(token)
        try:
            return float(int(text, 0))
        except ValueError:
            pass
        try:
            value = float(text)
        except ValueError:
            if _IDENT_RE.match(text):
                raise self.error(f"unknown symbol {text!r} for {what}{self.via(token)}",
                                 token) from None
            raise self.error(f"bad number {text!r} for {what}{self.via(token)}", token) from None
        if not math.isfinite(value):
            raise self.error(f"{what} must be finite, not {text!r}", token)
        return value

    def amplitude(self, token: str) -> int:
        value = self.real(token, "amplitude")
        try:
            return amplitude_to_q15(value)
        except ValueError as exc:
            raise self.error(str(exc), token) from None

    def quantity(self, token: str, what: str, kind: str) -> tuple[Fraction, str, str]:
        """A number with an optional unit, exactly as written: ``(value, unit, text)``, with
        ``unit`` ``""`` when there is none and ``text`` the token after ``.equ`` names."""
        text = self.resolve(token)
        m = _QUANTITY_RE.match(text)
        if not m:
            if _IDENT_RE.match(text):
                raise self.error(f"unknown symbol {text!r} for {what}{self.via(token)}", token)
            raise self.error(f"bad {kind} {text!r} for {what}{self.via(token)}", token)
        num = m["num"]
        radix = num.lstrip("+-")[:2].lower() in ("0x", "0b", "0o")
        exponent = "" if radix else num.lower().partition("e")[2]
        if exponent and abs(int(exponent)) > _MAX_EXPONENT:
            raise self.error(f"{what} {text!r}: exponent out of range "
                             f"(-{_MAX_EXPONENT}..{_MAX_EXPONENT})", token)
        try:
            # Exact: the number as written (3.9999999999999999999 is not 4.0).
            value = Fraction(int(num, 0)) if radix else Fraction(num.replace("_", ""))
        except (ValueError, ZeroDivisionError):
            raise self.error(f"bad {kind} {text!r} for {what}{self.via(token)}",
                             token) from None
        return value, m["unit"], text

    def cycles(self, token: str, what: str) -> int:
        """A time: integer DTD cycles, or ``ns``/``us`` converted at ``dtd_clk_hz``."""
        value, unit, text = self.quantity(token, what, "time")
        if unit == "":
            cycles = value
        elif unit == "ns":
            cycles = value * self.hz / 10**9
        elif unit == "us":
            cycles = value * self.hz / 10**6
        else:
            raise self.error(f"bad unit {unit!r} in {text!r} (use ns or us, or none for cycles)",
                             token)
        if cycles.denominator != 1:
            raise self.error(f"{what} {text!r} is not a whole number of DTD cycles at "
                             f"{self.hz} Hz ({_exact(cycles)} cycles)", token)
        return int(cycles)

    def phase(self, token: str) -> int:
        """A phase: an integer in turns / 2**16 (the field as is), or an angle in ``deg`` or
        ``rad``, rounded to the nearest step (ties to even) and wrapped mod 2**16."""
        value, unit, text = self.quantity(token, "phase", "phase")
        if unit == "":
            return self.integer(token, "phase")
        if unit == "deg":
            turns = value / 360
        elif unit == "rad":
            turns = value / (2 * _PI)
        else:
            raise self.error(f"bad unit {unit!r} in {text!r} (use deg or rad, or none for "
                             f"turns / 2**16)", token)
        return round(turns * _PHASE_STEPS) % _PHASE_STEPS

    def frequency(self, token: str) -> int:
        """A frequency word: an integer in turns / 2**32 per sample (the field as is), or a
        frequency in ``Hz``, ``kHz``, ``MHz`` or ``GHz``, converted at the build's sample rate
        to ``round(f / sample_rate_hz * 2**32) mod 2**32`` (ties to even); it must be below the
        Nyquist frequency, ``sample_rate_hz / 2``, in magnitude."""
        value, unit, text = self.quantity(token, "freq", "frequency")
        if unit == "":
            return self.integer(token, "freq")
        if unit not in _FREQ_UNITS:
            raise self.error(f"bad unit {unit!r} in {text!r} (use {', '.join(_FREQ_UNITS)}, or "
                             f"none for the word in turns / 2**32 per sample)", token)
        hz = value * _FREQ_UNITS[unit]
        spc = self.params.samples_per_cycle
        rate = self.hz * spc
        build = (f"the build has sample_rate_hz = dtd_clk_hz * samples_per_cycle = "
                 f"{self.hz} * {spc} = {rate}")
        if abs(hz) >= Fraction(rate, 2):
            raise self.error(f"freq {text!r} is at or beyond the Nyquist frequency: |freq| must "
                             f"be below {_exact(Fraction(rate, 2))} Hz (sample_rate_hz / 2; "
                             f"{build})", token)
        word = round(hz / rate * _FREQ_STEPS)
        if abs(word) >= _FREQ_STEPS // 2:
            raise self.error(f"freq {text!r} is within half a step "
                             f"({_exact(Fraction(rate, 2 * _FREQ_STEPS))} Hz) of the Nyquist "
                             f"frequency, {_exact(Fraction(rate, 2))} Hz: it would round to the "
                             f"word 0x80000000, which is also -Nyquist (sample_rate_hz / 2; "
                             f"{build})", token)
        return word % _FREQ_STEPS

    def register(self, token: str, what: str) -> int:
        text = self.expand(token)[0]
        m = _REG_RE.match(text)
        if not m or int(m[1]) >= NUM_REGISTERS:
            raise self.error(f"bad register {text!r} for {what} (r0..r{NUM_REGISTERS - 1})"
                             f"{self.via(token)}", token)
        return int(m[1])

    def is_register(self, token: str) -> bool:
        return _REG_RE.match(self.expand(token)[0]) is not None

    def alu(self, func: AluFunc, a: dict[str, str | None]) -> int:
        """ALU ``func`` with ``rd``, ``rs`` and ``rt`` (a register or an immediate)."""
        b = a["rt_or_imm"] or ""
        values: dict[str, tuple[object, str]] = {
            "rd": (self.register(a["rd"] or "", "rd"), a["rd"] or ""),
            "rs": (self.register(a["rs"] or "", "rs"), a["rs"] or ""),
            "func": (func, ""),
        }
        if self.is_register(b):
            values.update(rt=(self.register(b, "rt"), b), use_rt=(1, b))
        else:
            imm = self.integer(b, "imm")
            if func in _SHIFTS and not 0 <= imm <= 31:
                raise self.error(f"shift amount {imm} outside 0..31", b)
            if (1 << 31) <= imm < (1 << 32):  # a 32-bit value written unsigned (a mask)
                imm -= 1 << 32
            values["imm"] = (imm, b)
        return self.encode(Op.ALU, values)

    def condition(self, token: str) -> Cond:
        text = token.strip().lower()
        for cond in Cond:
            if cond.name.lower() == text:
                return cond
        names = ", ".join(c.name.lower() for c in Cond)
        raise self.error(f"bad condition {token.strip()!r} (one of {names})", token)

    def target(self, token: str) -> int:
        """A label, a number, or a ``.equ`` naming either (labels of the whole file count)."""
        text = self.resolve(token)
        if text in self.labels:
            return self.labels[text]
        try:
            return int(text, 0)
        except ValueError:
            raise self.error(f"unknown label {text!r}{self.via(token)}", token) from None

    # -- operand binding ----------------------------------------------------------------------

    _REQUIRED = object()

    def bind(self, text: str, params: list[tuple[str, object]]) -> dict[str, str | None]:
        """Split operands at commas and bind them to ``params`` (positional, then ``key=v``)."""
        tokens = [t.strip() for t in text.split(",")] if text.strip() else []
        names = [n for n, _ in params]
        out: dict[str, str | None] = {}
        seen_keyword = False
        for i, tok in enumerate(tokens):
            if not tok:
                raise self.error("empty operand", text)
            key, eq, value = tok.partition("=")
            if eq:
                key, value = key.strip(), value.strip()
                if key not in names:
                    raise self.error(f"unknown operand {key!r} (expected one of "
                                     f"{', '.join(names)})", tok)
                seen_keyword = True
            else:
                if seen_keyword:
                    raise self.error("positional operand after a keyword operand", tok)
                if i >= len(names):
                    raise self.error(f"too many operands (at most {len(names)})", tok)
                key, value = names[i], tok
            if key in out:
                raise self.error(f"operand {key!r} given twice", tok)
            if not value:
                raise self.error(f"operand {key!r} has no value", tok)
            out[key] = value
        for name, default in params:
            if name not in out:
                if default is self._REQUIRED:
                    raise self.error(f"missing operand {name!r}", text)
                out[name] = default
        return out

    def check(self, op: Op, name: str, value: int, token: str) -> int:
        shape = _field_shapes(op)[name]
        lo, hi = _field_range(shape)
        if not lo <= value <= hi:
            raise self.error(f"{name} = {value} is out of range for {op.name} "
                             f"({lo}..{hi})", token)
        return value

    # -- directives ---------------------------------------------------------------------------

    def directive(self, name: str, text: str) -> None:
        if name == ".equ":
            sym, comma, value = text.partition(",")
            sym, value = sym.strip(), value.strip()
            if not comma or not value:
                raise self.error(".equ needs a name and a value: .equ NAME, value", text)
            self.define(sym, "constant")
            self.equs[sym] = value      # followed when used: it may name a later symbol
        elif name == ".envelope":
            self.envelope(text)
        else:
            raise self.error(f"unknown directive {name!r}", name)

    def envelope(self, text: str) -> None:
        R = self._REQUIRED
        a = self.bind(text, [("name", R), ("shape", R), ("length", R), ("sigma", None),
                             ("amp", "1.0")])
        name, shape = a["name"] or "", (a["shape"] or "").lower()
        self.define(name, "envelope")
        length = self.integer(a["length"] or "", "envelope length")
        if not 1 <= length <= 0xFFFF:
            raise self.error(f"envelope length {length} is outside 1..65535 samples",
                             a["length"] or "")
        spc = self.params.samples_per_cycle
        if length % spc:
            # Refused, not padded: the length is the pulse's, and code may time with it.
            down = length - length % spc
            near = " or ".join(str(n) for n in (down, down + spc) if 0 < n <= 0xFFFF)
            raise self.error(f"envelope length {length} is not a multiple of {spc} (the build has "
                             f"samples_per_cycle = {spc}: PLAY takes {spc} samples per DTD "
                             f"cycle); use {near}", a["length"] or "")
        amp_token = a["amp"] or ""
        amp = self.real(amp_token, "envelope amplitude")
        if not -1.0 <= amp <= 1.0:
            raise self.error(f"envelope amplitude {amp!r} is outside [-1.0, 1.0]", amp_token)
        if shape == "gaussian":
            if a["sigma"] is None:
                raise self.error("a gaussian envelope needs sigma=<samples>", text)
            sigma = self.real(a["sigma"], "sigma")
            if sigma <= 0:
                raise self.error(f"sigma must be positive, not {sigma!r}", a["sigma"])
            centre = (length - 1) / 2
            samples = [amplitude_to_q15(amp * math.exp(-0.5 * ((i - centre) / sigma) ** 2))
                       for i in range(length)]
        elif shape == "square":
            if a["sigma"] is not None:
                raise self.error("a square envelope takes no sigma", a["sigma"])
            samples = [amplitude_to_q15(amp)] * length
        else:
            raise self.error(f"unknown envelope shape {a['shape']!r} (gaussian or square)",
                             a["shape"] or "")
        addr = self.env_next
        if addr + length > self.params.env_depth:
            raise self.error(f"envelope {name!r} needs samples {addr}..{addr + length - 1} but "
                             f"envelope memory holds {self.params.env_depth}", name)
        self.env_next += length
        self.envelopes[name] = Envelope(addr, samples)

    # -- instructions -------------------------------------------------------------------------

    def instruction(self, mnemonic: str, text: str) -> int:
        m = mnemonic.lower()
        R = self._REQUIRED
        if m == ".word":
            value = self.integer(text, ".word")
            if not 0 <= value < 1 << INSTRUCTION_BITS:
                raise self.error(f".word {value:#x} does not fit {INSTRUCTION_BITS} bits", text)
            return value
        if m in ("nop", "end"):
            if text.strip():
                raise self.error(f"{m} takes no operands", text.strip())
            return encode(Op.NOP if m == "nop" else Op.END)
        if m in ("wait", "sync"):
            op, fname = (Op.WAIT, "cycles") if m == "wait" else (Op.SYNC, "slack_cycles")
            a = self.bind(text, [(fname, R)])
            return self.encode(op, {fname: (self.cycles(a[fname], fname), a[fname])})
        if m == "barrier":
            a = self.bind(text, [("mask", R), ("slack", "0")])
            return self.encode(Op.BARRIER, {
                "mask": (self.integer(a["mask"], "mask"), a["mask"]),
                "slack_cycles": (self.cycles(a["slack"], "slack"), a["slack"]),
            })
        if m == "play":
            return self.play(text)
        if m == "acquire":
            a = self.bind(text, [("channel", R), ("rd", R), ("window", R), ("threshold", "0"),
                                 ("offset", "0"), ("phase", "0"), ("freq", "0")])
            window = self.cycles(a["window"], "window")
            if window == 0:
                raise self.error("window must be at least 1 cycle", a["window"])
            return self.encode(Op.ACQUIRE, {
                "channel": (self.integer(a["channel"], "channel"), a["channel"]),
                "rd": (self.register(a["rd"], "rd"), a["rd"]),
                "window_cycles": (window, a["window"]),
                "threshold": (self.integer(a["threshold"], "threshold"), a["threshold"]),
                "offset_cycles": (self.cycles(a["offset"], "offset"), a["offset"]),
                "phase": (self.phase(a["phase"]), a["phase"]),
                "freq_word": (self.frequency(a["freq"]), a["freq"]),
            })
        if m == "marker":
            a = self.bind(text, [("channel", R), ("duration", R), ("offset", "0")])
            return self.encode(Op.MARKER, {
                "channel": (self.integer(a["channel"], "channel"), a["channel"]),
                "duration_cycles": (self.cycles(a["duration"], "duration"), a["duration"]),
                "offset_cycles": (self.cycles(a["offset"], "offset"), a["offset"]),
            })
        if m == "set":
            a = self.bind(text, [("rd", R), ("imm", R)])
            imm = self.integer(a["imm"], "imm")
            if (1 << 31) <= imm < (1 << 32):  # a 32-bit register value written unsigned
                imm -= 1 << 32
            return self.encode(Op.SET, {"rd": (self.register(a["rd"], "rd"), a["rd"]),
                                        "imm": (imm, a["imm"])})
        if m == "alu":
            a = self.bind(text, [("func", R), ("rd", R), ("rs", R), ("rt_or_imm", R)])
            names = {f.name.lower(): f for f in AluFunc}
            func = names.get((a["func"] or "").strip().lower())
            if func is None:
                raise self.error(f"bad ALU function {a['func']!r} (one of "
                                 f"{', '.join(names)})", a["func"] or "")
            return self.alu(func, a)
        if m in _ALU_MNEMONICS:
            a = self.bind(text, [("rd", R), ("rs", R), ("rt_or_imm", R)])
            if m != "add" or self.is_register(a["rt_or_imm"] or ""):
                return self.alu(_ALU_MNEMONICS[m], a)
            a["imm"] = a.pop("rt_or_imm")
            return self.encode(Op.ADD, {"rd": (self.register(a["rd"], "rd"), a["rd"]),
                                        "rs": (self.register(a["rs"], "rs"), a["rs"]),
                                        "imm": (self.integer(a["imm"], "imm"), a["imm"])})
        if m in ("branch", "jmp", "loop") or m in _BRANCH_ALIASES:
            if m == "jmp":
                a = self.bind(text, [("target", R)])
                cond, rs, imm = Cond.ALWAYS, (0, ""), (0, "")
            elif m == "loop":
                a = self.bind(text, [("rs", R), ("target", R)])
                cond, rs, imm = Cond.DBNZ, (self.register(a["rs"], "rs"), a["rs"]), (1, "")
            else:
                params = [("rs", R), ("imm", R), ("target", R)]
                if m == "branch":
                    params.insert(0, ("cond", R))
                a = self.bind(text, params)
                cond = self.condition(a["cond"]) if m == "branch" else _BRANCH_ALIASES[m]
                rs = (self.register(a["rs"], "rs"), a["rs"])
                imm = (self.integer(a["imm"], "imm"), a["imm"])
            return self.encode(Op.BRANCH, {"cond": (cond, ""), "rs": rs, "imm": imm,
                                           "target": (self.target(a["target"]), a["target"])})
        if m == "call":
            return self.call(text)
        raise self.error(f"unknown mnemonic {mnemonic!r}", mnemonic)

    def encode(self, op: Op, values: dict[str, tuple[object, str]]) -> int:
        """Check each field against its width, then the instruction against the build."""
        fields: dict[str, object] = {}
        for name, (value, token) in values.items():
            if isinstance(value, int) and not isinstance(value, Cond):
                self.check(op, name, value, token)
            fields[name] = value
        fault = _build_fault(op, fields, self.params)
        if fault is not None:
            name, message = fault
            raise self.error(message, values[name][1])
        return encode(op, fields)

    def play(self, text: str) -> int:
        R = self._REQUIRED
        a = self.bind(text, [("channel", R), ("env", None), ("amp", R), ("offset", "0"),
                             ("phase", "0"), ("freq", "0"), ("addr", None), ("len", None),
                             ("phase_reset", "0")])
        if a["env"] is not None:
            if a["addr"] is not None or a["len"] is not None:
                raise self.error("give an envelope name or addr= and len=, not both", a["env"])
            env = self.envelopes.get(a["env"])
            if env is None:
                raise self.error(f"unknown envelope {a['env']!r}", a["env"])
            addr, length = (env.addr, a["env"]), (env.length, a["env"])
        elif a["addr"] is not None and a["len"] is not None:
            addr = (self.integer(a["addr"], "addr"), a["addr"])
            length = (self.integer(a["len"], "len"), a["len"])
        else:
            raise self.error("play needs an envelope name, or addr= and len=", text)
        return self.encode(Op.PLAY, {
            "channel": (self.integer(a["channel"], "channel"), a["channel"]),
            "offset_cycles": (self.cycles(a["offset"], "offset"), a["offset"]),
            "env_addr": addr,
            "env_len": length,
            "amplitude": (self.amplitude(a["amp"]), a["amp"]),
            "phase": (self.phase(a["phase"]), a["phase"]),
            "freq_word": (self.frequency(a["freq"]), a["freq"]),
            "phase_reset": (self.integer(a["phase_reset"], "phase_reset"), a["phase_reset"]),
        })

    def call(self, text: str) -> int:
        m = _CALL_RE.match(text.strip())
        if not m:
            raise self.error("call syntax is: call name(rS:bits, ...) -> rD[, rE]", text.strip())
        fn = m["fn"]
        if _IDENT_RE.match(fn) and fn not in self.equs:
            if not fn.isascii():
                raise self.error(f"function name {fn!r} is not ASCII", fn)
            function_id = fnv1a32(fn)
            for other, fid in self.functions.items():
                if fid == function_id and other != fn:
                    raise self.error(f"function names {other!r} and {fn!r} have the same "
                                     f"FNV-1a id {fid:#010x}", fn)
            self.functions[fn] = function_id
        else:
            function_id = self.integer(fn, "function_id")
        values: dict[str, tuple[object, str]] = {"function_id": (function_id, fn)}
        args = m["args"].strip()
        tokens = [t.strip() for t in args.split(",")] if args else []
        if len(tokens) > len(_CALL_ARGS):
            raise self.error(f"{len(tokens)} arguments: a CALL takes at most "
                             f"{len(_CALL_ARGS)}", args)
        for (reg_field, bits_field), token in zip(_CALL_ARGS, tokens, strict=False):
            if not token:
                raise self.error("empty argument", args)
            reg, colon, nbits = token.partition(":")
            values[reg_field] = (self.register(reg, "argument register"), reg.strip())
            bits = self.integer(nbits, "argument bits") if colon else MAX_CALL_ARG_BITS
            if not 0 <= bits <= MAX_CALL_ARG_BITS:
                raise self.error(f"argument bits {bits} outside 0..{MAX_CALL_ARG_BITS}",
                                 nbits.strip())
            values[bits_field] = (bits, nbits.strip())
        if m["rd"]:
            results = [t.strip() for t in m["rd"].split(",")]
            if len(results) > 2 or not all(results):
                raise self.error("a CALL writes one or two result registers: -> rD[, rE]",
                                 m["rd"])
            for name, token in zip(("rd", "rd_hi"), results, strict=False):
                values[name] = (self.register(token, "result register"), token)
        return self.encode(Op.CALL, values)

    # -- driver -------------------------------------------------------------------------------

    def run(self, source: str) -> Program:
        lines: list[_Line] = []
        index = self.base
        for lineno, raw in enumerate(source.splitlines(), 1):
            self.lineno = lineno
            text = raw.split(";", 1)[0].strip()
            while (m := _LABEL_RE.match(text)) is not None:
                self.define(m[1], "label")
                self.labels[m[1]] = index
                text = m[2].strip()
            if not text:
                continue
            mnemonic, operands = _split_mnemonic(text)
            if mnemonic.startswith(".") and mnemonic.lower() != ".word":
                self.directive(mnemonic.lower(), operands)
                continue
            lines.append(_Line(lineno, raw.strip(), mnemonic, operands, index))
            index += 1
        count = index - self.base
        if count > self.params.imem_depth - 1 or index > self.params.imem_depth - 1:
            # The ring's committed TAIL is an index mod imem_depth: a full ring would read as
            # empty, so it holds at most imem_depth - 1 instructions.
            self.lineno = lines[-1].lineno if lines else 0
            raise self.error(f"program ends at instruction {index} but the instruction ring "
                             f"holds at most {self.params.imem_depth - 1} (imem_depth - 1: a "
                             f"full ring would read as empty)")
        words: list[int] = []
        source_map: dict[int, SourceLocation] = {}
        for line in lines:
            self.lineno = line.lineno
            words.append(self.instruction(line.mnemonic, line.operands))
            source_map[line.index] = SourceLocation(self.filename, line.lineno, line.text)
        return Program(words, dict(self.labels), dict(self.envelopes), dict(self.functions),
                       source_map, self.base)


def assemble(source: str, filename: str = "<asm>", *, params: QSCParams | None = None,
             dtd_clk_hz: int | None = None, base: int = 0) -> Program:
    """Assemble PPU assembly ``source`` into a :class:`Program`.

    Parameters
    ----------
    source : str
        The assembly text (syntax in this module's docstring and ``docs/isa.md``).
    filename : str
        Named in error messages.
    params : QSCParams, optional
        Build parameters (default ``QSCParams()``): ``imem_depth`` bounds the program and its
        branch targets, ``env_depth`` its envelopes and PLAY ranges, ``drives_per_ppu``,
        ``readouts_per_ppu`` and ``markers_per_ppu`` the PLAY, ACQUIRE and MARKER channels;
        ``dtd_clk_hz`` converts times given in ``ns``/``us``, ``dtd_clk_hz * samples_per_cycle``
        (``sample_rate_hz``) frequencies given in ``Hz``..``GHz``; ``samples_per_cycle`` aligns
        PLAY ranges and envelope lengths; ``nco = False`` refuses non-zero ``phase``, ``freq``
        and ``phase_reset``.
    dtd_clk_hz : int, optional
        Overrides ``params.dtd_clk_hz`` (for times and for the sample rate).
    base : int
        Instruction index of the first instruction (labels and branch targets are absolute).

    Raises
    ------
    AssemblerError
        For every bad input, with ``filename``, ``line`` and the offending ``token``.
    """
    params = params or QSCParams()
    hz = params.dtd_clk_hz if dtd_clk_hz is None else dtd_clk_hz
    if hz <= 0:
        raise ValueError(f"dtd_clk_hz must be positive, not {hz}")
    if not 0 <= base < params.imem_depth:
        raise ValueError(f"base must be 0..{params.imem_depth - 1}, not {base}")
    return _Assembler(filename, params, hz, base).run(source)


# ---------------------------------------------------------------------------------------------
# The disassembler


def _words_of(words: Iterable[int] | bytes | bytearray | memoryview) -> list[int]:
    if isinstance(words, bytes | bytearray | memoryview):
        buf = bytes(words)
        if len(buf) % INSTRUCTION_BYTES:
            raise TruncatedError("Instruction", "word", len(buf),
                                 f"{len(buf)} bytes is not a multiple of {INSTRUCTION_BYTES}")
        return [int.from_bytes(buf[i:i + INSTRUCTION_BYTES], "little")
                for i in range(0, len(buf), INSTRUCTION_BYTES)]
    out = list(words)
    for w in out:
        if not isinstance(w, int) or not 0 <= w < 1 << INSTRUCTION_BITS:
            raise FieldRangeError("Instruction", "word", w,
                                  f"not a {INSTRUCTION_BITS}-bit unsigned integer")
    return out


def _format(op: Op, f: Mapping[str, Any], label_of: Mapping[int, str],
            name_of: Mapping[int, str]) -> str:
    if op in (Op.NOP, Op.END):
        return op.name.lower()
    if op == Op.WAIT:
        return f"wait {f['cycles']}"
    if op == Op.SYNC:
        return f"sync {f['slack_cycles']}"
    if op == Op.BARRIER:
        return f"barrier {int(f['mask']):#x}, {f['slack_cycles']}"
    if op == Op.PLAY:
        text = (f"play {f['channel']}, addr={f['env_addr']}, len={f['env_len']}, "
                f"amp={format_amplitude(int(f['amplitude']))}")
        for key, name in (("offset", "offset_cycles"), ("phase", "phase"), ("freq", "freq_word"),
                          ("phase_reset", "phase_reset")):
            if f[name]:
                text += f", {key}={f[name]}"
        return text
    if op == Op.ACQUIRE:
        text = (f"acquire {f['channel']}, r{f['rd']}, window={f['window_cycles']}, "
                f"threshold={f['threshold']}")
        for key, name in (("offset", "offset_cycles"), ("phase", "phase"), ("freq", "freq_word")):
            if f[name]:
                text += f", {key}={f[name]}"
        return text
    if op == Op.MARKER:
        text = f"marker {f['channel']}, duration={f['duration_cycles']}"
        return text + (f", offset={f['offset_cycles']}" if f["offset_cycles"] else "")
    if op == Op.SET:
        return f"set r{f['rd']}, {f['imm']}"
    if op == Op.ADD:
        return f"add r{f['rd']}, r{f['rs']}, {f['imm']}"
    if op == Op.ALU:
        func = f["func"].name.lower()
        if f["use_rt"]:
            return f"{func} r{f['rd']}, r{f['rs']}, r{f['rt']}"
        prefix = "alu add," if f["func"] == AluFunc.ADD else func
        return f"{prefix} r{f['rd']}, r{f['rs']}, {f['imm']}"
    if op == Op.BRANCH:
        target = label_of.get(int(f["target"]), str(f["target"]))
        cond = f["cond"]
        if cond == Cond.ALWAYS and f["rs"] == 0 and f["imm"] == 0:
            return f"jmp {target}"
        if cond == Cond.DBNZ and f["imm"] == 1:
            return f"loop r{f['rs']}, {target}"
        for alias, c in _BRANCH_ALIASES.items():
            if c == cond:
                return f"{alias} r{f['rs']}, {f['imm']}, {target}"
        return f"branch {cond.name.lower()}, r{f['rs']}, {f['imm']}, {target}"
    if op == Op.CALL:
        fid = int(f["function_id"])
        fn = name_of.get(fid, f"{fid:#010x}")
        args = [f"r{f[reg]}:{f[bits]}" for reg, bits in _CALL_ARGS]
        while args and args[-1] == "r0:0":
            args.pop()
        hi = f", r{f['rd_hi']}" if f["rd_hi"] else ""
        return f"call {fn}({', '.join(args)}) -> r{f['rd']}{hi}"
    raise AssertionError(op)  # pragma: no cover - every Op is handled above


def disassemble(words: Iterable[int] | bytes | bytearray | memoryview, *, base: int = 0,
                functions: Mapping[str, int] | None = None,
                params: QSCParams | None = None) -> str:
    """Turn instruction words (or IMEM bytes, 16 per instruction, little-endian) into assembly.

    Branch targets inside the program get labels ``L<index>``; CALLs print the handler name
    when ``functions`` (name -> function_id, e.g. :attr:`Program.functions`) holds it, else the
    hexadecimal function_id. A word that is not a canonical instruction (unknown opcode or
    condition, reserved bits set, more than 32 CALL argument bits, an ACQUIRE window of 0) or
    that the build ``params`` (default ``QSCParams()``) cannot execute (a channel, envelope
    range or branch target it does not have, a PLAY range that is not a multiple of
    ``samples_per_cycle``, a non-zero ``phase``, ``freq_word`` or ``phase_reset`` without NCOs)
    becomes ``.word 0x...``. ``phase`` and ``freq`` are printed as their integer fields, exact.
    ``assemble(disassemble(ws, base=b, params=p), base=b, params=p).instructions == ws`` for
    every list of words.

    Raises :class:`openqlink.errors.TruncatedError` for a byte string whose length is not a
    multiple of 16 and :class:`openqlink.errors.FieldRangeError` for a word outside 128 bits.
    """
    ws = _words_of(words)
    params = params or QSCParams()
    name_of: dict[int, str] = {}
    for name, fid in (functions or {}).items():
        if _IDENT_RE.match(name) and name.isascii() and fnv1a32(name) == fid \
                and name.lower() not in _RESERVED_NAMES:
            name_of[fid] = name
    decoded: list[tuple[Op, dict[str, Any]] | None] = []
    for w in ws:
        try:
            op, f = decode(w)
        except FieldRangeError:
            decoded.append(None)
            continue
        if _build_fault(op, f, params) is not None:
            decoded.append(None)  # illegal, or not in this build: the assembler refuses them
            continue
        decoded.append((op, f))
    label_of: dict[int, str] = {}
    for d in decoded:
        if d is not None and d[0] == Op.BRANCH:
            t = int(d[1]["target"])
            if base <= t < base + len(ws):
                label_of[t] = f"L{t}"
    out = [f"; {len(ws)} instructions, base {base} (openqlink.isa.asm.disassemble)"]
    for i, (w, d) in enumerate(zip(ws, decoded, strict=True)):
        if base + i in label_of:
            out.append(f"{label_of[base + i]}:")
        text = f".word {w:#034x}" if d is None else _format(d[0], d[1], label_of, name_of)
        out.append(f"    {text}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Documentation tables


def render_isa_tables() -> str:
    """Markdown tables of every instruction's fields, generated from the layout (``docs/isa.md``
    embeds this text; a test keeps it in step)."""
    parts = ["| op | mnemonic(s) | opcode |", "|---|---|---|"]
    mnems = {Op.BRANCH: "branch, beq, bne, blt, bge, jmp, loop",
             Op.ALU: "alu, add (rT), sub, and, or, xor, shl, shr, sra"}
    for op in Op:
        parts.append(f"| {op.name} | {mnems.get(op, op.name.lower())} | `{op.value:#04x}` |")
    parts.append("")
    parts.append("Every word: `op` in bits [7:0], operands from bit 8. Bits not listed are "
                 "reserved and zero.")
    for op in Op:
        if op not in _OPERANDS_OF:
            continue
        struct = Operands.as_shape()[_OPERANDS_OF[op]].shape
        parts += ["", f"### {op.name} (`{op.value:#04x}`)", "",
                  "| field | bits | width | type |", "|---|---|---|---|"]
        for name, fld in struct.as_shape():
            lo = 8 + fld.offset
            hi = lo + fld.width - 1
            shape = fld.shape
            if isinstance(shape, type) and issubclass(shape, _ENUMS):
                kind = f"{shape.__name__}: " + ", ".join(f"{c.name}={c.value}" for c in shape)
            else:
                s = Shape.cast(shape)
                kind = f"{'signed' if s.signed else 'unsigned'}({s.width})"
            shown = "(reserved, 0)" if name.startswith("_") else f"`{name}`"
            parts.append(f"| {shown} | [{hi}:{lo}] | {fld.width} | {kind} |")
    parts += ["", "### STATUS register (`PPUStatus`, 32 bits)", "",
              "| field | bits | width | values |", "|---|---|---|---|"]
    for name, fld in PPUStatus.as_shape():
        lo, hi = fld.offset, fld.offset + fld.width - 1
        shape = fld.shape
        if isinstance(shape, type) and issubclass(shape, PPUState):
            kind = ", ".join(f"{s.name}={s.value}" for s in PPUState)
        else:
            kind = "sticky bit" if fld.width == 1 else ""
        shown = "(reserved, 0)" if name.startswith("_") else f"`{name}`"
        parts.append(f"| {shown} | [{hi}:{lo}] | {fld.width} | {kind} |")
    return "\n".join(parts) + "\n"
