"""Lowering a kernel, through a calibration table, to a PPU program in assembly.

The compiler walks the kernel's AST once and writes PPU assembly (``docs/isa.md``), one
comment line with the kernel's source line before the instructions of each statement, then
assembles it with :func:`openqlink.isa.assemble` against the build's :class:`QSCParams`. What
each construct becomes (``docs/kernels.md`` has the whole language):

* ``q = qubit()``, ``qs = qvector(n)``: the next table qubits (``qs[k]``, ``k`` a constant).
* One-qubit gates, on the qubit's drive channel at its ``drive_if_hz``, a Gaussian envelope of
  the qubit's pulse shape, one after the other (``play`` then ``wait`` of the pulse's cycles):
  ``rx(theta)`` is a pulse of amplitude ``pi_amplitude * theta / pi`` (``theta`` taken into
  ``(-pi, pi]``) about the frame's X axis, ``ry(theta)`` the same a quarter turn later in
  phase, ``x = rx(pi)``, ``y = ry(pi)``. ``rz(theta)``, ``z``, ``s``, ``t`` are virtual: a
  change of the qubit's frame phase ``F`` (no pulse), and every later pulse of the qubit is
  played with ``phase = phi - F`` (``phi`` 0 for X, pi/2 for Y). ``h = ry(pi/2) . z``: the
  frame turns by pi, then one pulse; in a loop body or an ``if`` arm, where every frame must
  come back as it was, ``h = x . ry(pi/2)`` (two pulses, no frame change). The drive of
  the simulation's qubit model (``QubitSystem``) rotates about ``(cos phase, sin phase, 0)``,
  so the pulses and the frame give the gates' unitaries up to a Z rotation by the final
  frame phase, which no Z-basis measurement sees (the test compares with a state-vector
  reference).
* ``cz(a, b)``: a pulse of ``cz_amplitude`` on the pair's coupler channel.
* ``m = mz(q)``: ``acquire`` on the qubit's readout channel with the table's window, IQ
  rotation, demodulation frequency and threshold into a register, then ``wait`` the window.
* ``if``/``else`` on a register (a measurement, a device_call's result, integer arithmetic):
  ``beq``/``bne``/``blt``/``bge`` and ``jmp``. The shorter arm is padded so that both arms
  take the same time (the timeline stays deterministic); arms that leave a qubit's frame at
  different phases are refused.
* ``for _ in range(N)``: ``set`` of a counter register and ``loop`` (N a constant or a
  parameter); a body that changes a qubit's frame phase (other than by whole turns) is refused.
* ``v = device_call(handler, *args)``: ``call`` with one argument register per argument (the
  handler's type hints give each argument's bits and the HOST_CALL entry's schema), the
  result to a register, then ``sync`` (a CALL's round trip is not known in advance).
* Integer arithmetic on registers: ``+ - & | ^ << >>`` (``add`` with an immediate needs no
  ALU; the others need the build's ``alu``); on constants it is folded.
* ``return`` of a register, a constant or a tuple of them, as the kernel's last statement.

**Timing.** The compiler keeps, at every point of the program, bounds on how far the PPU's
core is ahead of its timeline cursor ``t`` (the core runs ahead and stalls only on a pending
register or in a CALL, docs/isa.md): before a pulse or an acquisition it adds a ``wait`` when
the core might be less than the channel's lead ahead (after a branch on a fresh measurement),
so no event is ever LATE; before a CALL it makes the core wait for the last measurement
(an ``add r0, rM, 0`` that stalls on it) and after the CALL it re-anchors with
``sync S`` where ``S = sync_slack + (how far t may be ahead of the core)``, so the timeline
never runs backwards.
"""

from __future__ import annotations

import ast
import inspect
import math
import operator
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..calibration import CalibrationError, CalibrationTable, phase_word
from ..dispatch import DispatchMode, FunctionEntry, FunctionTable, TypeDesc
from ..errors import AssemblerError, DispatchError
from ..isa import Program, assemble
from ..memory_map import QSCParams
from .lang import GATES, Kernel, KernelCompileError

__all__ = ["CompiledKernel", "KernelResult", "compile_kernel", "handler_schema",
           "CORE_COST_CYCLES", "EVENT_LEAD_CYCLES", "RESULT_LANDING_CYCLES"]

#: Core cycles the compiler counts for one instruction that is not timed (ADD, ALU, BRANCH,
#: LOOP): at least their execute time in docs/isa.md ("Instruction timing"), with the refetch
#: after a taken branch.
CORE_COST_CYCLES = 8
#: Core cycles counted for SET, WAIT, SYNC, PLAY, ACQUIRE (one instruction every 2 cycles).
SIMPLE_COST_CYCLES = 2
#: How far ahead of the core a PLAY or ACQUIRE is kept (docs/isa.md: a PLAY queued in cycle c
#: for a time of at least c + 5 is never LATE); with a margin.
EVENT_LEAD_CYCLES = 8
#: Cycles from the end of an ACQUIRE window until its register is written (docs/isa.md: last
#: ADC sample to first DAC sample of a PLAY on a branch, 8 or 9 cycles); with a margin.
RESULT_LANDING_CYCLES = 12
#: Registers the compiler may use (r0 reads 0).
_REGISTERS = range(1, 16)

_ALU_OPS = {ast.Add: "add", ast.Sub: "sub", ast.BitAnd: "and", ast.BitOr: "or",
            ast.BitXor: "xor", ast.LShift: "shl", ast.RShift: "sra"}
_FOLD = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
         ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
         ast.Mod: lambda a, b: a % b, ast.BitAnd: lambda a, b: a & b,
         ast.BitOr: lambda a, b: a | b, ast.BitXor: lambda a, b: a ^ b,
         ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b,
         ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b}

_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}

# Handler type hints -> (argument descriptor, bits the CALL takes from the register)
_HINTS: dict[Any, tuple[TypeDesc, int]] = {
    int: (TypeDesc.int32(), 32), np.int32: (TypeDesc.int32(), 32),
    bool: (TypeDesc.uint8(), 8), np.uint8: (TypeDesc.uint8(), 8),
}


def handler_schema(handler: Callable[..., Any]) -> tuple[tuple[TypeDesc, ...],
                                                        tuple[TypeDesc, ...]]:
    """The HOST_CALL schema of a ``device_call`` handler from its type hints: each parameter
    ``int`` (or ``numpy.int32``) is an INT32 argument, ``bool`` (or ``numpy.uint8``) a UINT8;
    the return ``int``/``bool`` likewise one result, ``None`` none (CUDA-Q realtime message
    protocol payload types). Raises :class:`DispatchError` naming the parameter without a hint
    or with another type."""
    name = getattr(handler, "__name__", repr(handler))
    if not inspect.isfunction(handler):
        raise DispatchError(f"device_call handler {name!r} is not a Python function")
    try:
        hints = typing.get_type_hints(handler)
    except Exception as exc:   # a hint that does not evaluate
        raise DispatchError(f"handler {name!r}: its type hints do not evaluate: {exc}") \
            from None
    args = []
    for p in inspect.signature(handler).parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise DispatchError(f"handler {name!r}: parameter {p.name!r} is not positional")
        hint = hints.get(p.name)
        if hint not in _HINTS:
            raise DispatchError(f"handler {name!r}: parameter {p.name!r} needs the type hint "
                                f"int or bool, not {hint!r}")
        args.append(_HINTS[hint][0])
    if "return" not in hints:
        raise DispatchError(f"handler {name!r}: needs a return type hint (int, bool or None)")
    ret = hints["return"]
    if ret is type(None):
        results: tuple[TypeDesc, ...] = ()
    elif ret in _HINTS:
        results = (_HINTS[ret][0],)
    else:
        raise DispatchError(f"handler {name!r}: returns {ret!r}; a device_call returns int, "
                            "bool or None")
    return tuple(args), results


def _host_entry(handler: Callable[..., Any]) -> FunctionEntry:
    args, results = handler_schema(handler)
    hints = typing.get_type_hints(handler)
    names = list(inspect.signature(handler).parameters)
    bools = [hints[n] is bool for n in names]
    if any(bools):
        def call(*values: Any) -> Any:
            return handler(*(bool(v) if b else v for v, b in zip(values, bools, strict=True)))
        fn: Callable[..., Any] = call
    else:
        fn = handler
    return FunctionEntry(handler.__name__, DispatchMode.HOST_CALL, args, results, fn)


@dataclass(frozen=True)
class KernelResult:
    """Where a kernel's return value is after DONE: ``register`` (1..15, read over the control
    plane), or ``constant``; ``signed`` reads the register as a signed 32-bit int."""

    register: int | None = None
    constant: int | None = None
    signed: bool = True

    def value(self, registers: dict[str, int]) -> int:
        """The value from the PPU's registers (``QSC.read_registers``'s ``R1``..``R15``)."""
        if self.register is None:
            assert self.constant is not None
            return self.constant
        v = registers[f"R{self.register}"] & 0xFFFF_FFFF
        return v - (1 << 32) if self.signed and v >= 1 << 31 else v


@dataclass
class CompiledKernel:
    """A kernel lowered for one set of arguments.

    Attributes
    ----------
    name : str
    args : tuple
        The parameter values it was compiled for.
    assembly : str
        The PPU program as text (docs/isa.md), each statement's instructions after a comment
        with the kernel's ``file:line`` and source.
    program : openqlink.isa.Program
        ``assembly`` assembled for ``params``: ``instructions``, ``envelopes``.
    function_table : FunctionTable
        One HOST_CALL entry per ``device_call`` handler (schema from its type hints).
    handlers : dict[str, callable]
        The handlers by name (for :meth:`device_table`).
    results : tuple[KernelResult, ...] | None
        The return value's parts (one for a scalar return; None: the kernel returns nothing);
        ``returns_tuple`` says whether it returned a tuple.
    measurements : dict[str, int]
        Kernel variable -> the register of its last ``mz``.
    qubits : int
        Table qubits the kernel allocated.
    duration_cycles : int | None
        The timeline length of the program in DTD cycles when it has no CALL (else None).
    frames : dict[int, float]
        Each qubit's frame phase at the end (radians, the sum of its virtual Z rotations): the
        state the pulses leave is the kernel's up to ``Rz(-frames[q])`` on each qubit.
    """

    name: str
    args: tuple
    assembly: str
    program: Program
    function_table: FunctionTable
    handlers: dict[str, Callable[..., Any]]
    results: tuple[KernelResult, ...] | None
    returns_tuple: bool
    measurements: dict[str, int]
    qubits: int
    params: QSCParams
    table: CalibrationTable
    duration_cycles: int | None = None
    frames: dict[int, float] = field(default_factory=dict)

    def device_table(self) -> FunctionTable:
        """The same functions as DEVICE_CALL entries for the GPU dispatch kernel: each handler
        compiled by numba-cuda (:class:`openqlink.gpu.NumbaHandler`). Needs the ``[gpu]``
        extra to link, a CUDA GPU to run."""
        from ..gpu import NumbaHandler

        table = FunctionTable()
        for entry in self.function_table:
            handler = self.handlers[entry.name]
            table.device_call(entry.name, NumbaHandler(handler), args=entry.args,
                              results=entry.results)
        return table

    def result_value(self, registers: dict[str, int]) -> Any:
        """The kernel's return value from the PPU registers read after DONE."""
        if self.results is None:
            return None
        values = tuple(r.value(registers) for r in self.results)
        return values if self.returns_tuple else values[0]


# --- values ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Qubit:
    index: int


@dataclass(frozen=True)
class _QVec:
    indices: tuple[int, ...]


@dataclass(frozen=True)
class _Reg:
    n: int


@dataclass(frozen=True)
class _Const:
    value: int | float


_Value = _Qubit | _QVec | _Reg | _Const


# --- timing state -------------------------------------------------------------------------

@dataclass
class _Timing:
    """What the compiler knows about the PPU's core against its timeline cursor ``t`` at one
    point of the program (all in DTD cycles, relative to ``t`` there).

    ``ahead``: the core is at least this far ahead of ``t`` (upper bound on ``now``);
    ``behind``: ``t`` is at most this far ahead of ``now`` (lower bound on ``now``);
    ``pending_hi``/``pending_lo``: per register written by an ACQUIRE, the end of its window
    relative to ``t`` (upper and lower bound); ``elapsed``: cycles ``t`` advanced since the
    start of the block being compiled, None after a SYNC (not known in advance)."""

    ahead: int
    behind: int
    pending_hi: dict[int, int] = field(default_factory=dict)
    pending_lo: dict[int, int] = field(default_factory=dict)
    frames: dict[int, float] = field(default_factory=dict)
    elapsed: int | None = 0

    def copy(self) -> _Timing:
        return _Timing(self.ahead, self.behind, dict(self.pending_hi), dict(self.pending_lo),
                       dict(self.frames), self.elapsed)

    def key(self) -> tuple:
        return (self.ahead, self.behind, sorted(self.pending_hi.items()),
                sorted(self.pending_lo.items()),
                sorted((q, phase_word(f)) for q, f in self.frames.items()))


def _join(a: _Timing, b: _Timing) -> _Timing:
    """The state that is true after either of ``a`` and ``b`` (frames taken from ``a``)."""
    hi = dict(a.pending_hi)
    for r, v in b.pending_hi.items():
        hi[r] = max(v, hi.get(r, v))
    lo = {r: min(v, b.pending_lo[r]) for r, v in a.pending_lo.items() if r in b.pending_lo}
    elapsed = a.elapsed if a.elapsed == b.elapsed else None
    return _Timing(min(a.ahead, b.ahead), max(a.behind, b.behind), hi, lo, dict(a.frames),
                   elapsed)


class _Compiler:
    def __init__(self, kern: Kernel, table: CalibrationTable, args: Sequence[Any],
                 params: QSCParams):
        self.kernel = kern
        self.table = table
        self.params = params
        self.filename = kern.filename
        self.lines: list[str] = []
        self.env: dict[str, _Value] = {}
        self.free_regs = list(_REGISTERS)
        self.next_qubit = 0
        self.labels = 0
        self.handlers: dict[str, Callable[..., Any]] = {}
        self.function_table = FunctionTable()
        self.measurements: dict[str, int] = {}
        self.has_call = False
        self.slack = table.cycles(table.sync_slack_ns)
        self.state = _Timing(ahead=self.slack, behind=0)
        self.temps: set[int] = set()
        self.depth = 0                 # nesting of loop bodies and if arms
        self.loop_vars: set[str] = set()
        try:
            self.globals = dict(kern.func.__globals__)
            self.globals.update(inspect.getclosurevars(kern.func).nonlocals)
        except (TypeError, ValueError):
            self.globals = dict(kern.func.__globals__)
        if len(args) != len(kern.params):
            raise KernelCompileError(
                f"kernel {kern.name!r} takes {len(kern.params)} argument(s) "
                f"({', '.join(kern.params) or 'none'}), {len(args)} given",
                self.filename, kern.tree.lineno)
        for name, value in zip(kern.params, args, strict=True):
            if isinstance(value, bool) or not isinstance(value, int | float | np.integer |
                                                           np.floating):
                raise KernelCompileError(f"argument {name}={value!r}: a kernel parameter is "
                                         "an int or a float", self.filename, kern.tree.lineno)
            self.env[name] = _Const(value.item() if isinstance(value, np.generic) else value)
        self.envelopes: dict[tuple[int, float], str] = {}
        self.sample_rate_hz = table.sample_rate_hz

    # --- helpers ------------------------------------------------------------------------------
    def error(self, node: ast.AST, message: str) -> KernelCompileError:
        return KernelCompileError(message, self.filename, getattr(node, "lineno", 0))

    def emit(self, text: str) -> None:
        self.lines.append(f"        {text}")

    def label(self) -> str:
        self.labels += 1
        return f"L{self.labels}"

    def alloc(self, node: ast.AST) -> int:
        if not self.free_regs:
            raise self.error(node, "the kernel needs more than the PPU's 15 registers "
                                   "(r1..r15)")
        return self.free_regs.pop(0)

    def release(self, reg: int) -> None:
        self.free_regs.insert(0, reg)

    def envelope(self, length: int, sigma: float) -> str:
        key = (length, float(sigma))
        if key not in self.envelopes:
            self.envelopes[key] = f"gauss{len(self.envelopes)}"
        return self.envelopes[key]

    # --- timing ---------------------------------------------------------------------------
    def cost(self, cycles: int) -> None:
        self.state.ahead -= cycles

    def wait(self, cycles: int) -> None:
        if cycles <= 0:
            return
        self.emit(f"wait {cycles}")
        st = self.state
        st.ahead += cycles - SIMPLE_COST_CYCLES
        st.behind += cycles
        st.pending_hi = {r: v - cycles for r, v in st.pending_hi.items()}
        st.pending_lo = {r: v - cycles for r, v in st.pending_lo.items()}
        if st.elapsed is not None:
            st.elapsed += cycles

    def fence(self, reg: int) -> None:
        """The core stalls on ``reg`` here (a read or write of a pending register)."""
        st = self.state
        if reg in st.pending_hi:
            st.ahead = min(st.ahead, -st.pending_hi[reg] - RESULT_LANDING_CYCLES)
        if reg in st.pending_lo:
            st.behind = min(st.behind, -st.pending_lo[reg])
        st.pending_hi.pop(reg, None)
        st.pending_lo.pop(reg, None)

    def before_event(self) -> None:
        if self.state.ahead < EVENT_LEAD_CYCLES:
            self.wait(EVENT_LEAD_CYCLES - self.state.ahead + SIMPLE_COST_CYCLES)

    def written(self, reg: int) -> None:
        self.fence(reg)

    # --- statements -----------------------------------------------------------------------
    def compile(self) -> tuple[str, tuple[KernelResult, ...] | None, bool]:
        body = self.kernel.tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]                                   # the docstring
        results: tuple[KernelResult, ...] | None = None
        is_tuple = False
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.Return):
                if i != len(body) - 1:
                    raise self.error(stmt, "`return` must be the kernel's last statement")
                self.source_comment(stmt)
                results, is_tuple = self.ret(stmt)
            else:
                self.statement(stmt)
        self.emit("end")
        head = [f"; kernel {self.kernel.name}{tuple(self.env_args())} compiled for "
                f"{len(self.table.qubits)} table qubit(s), {self.table.dtd_clk_hz} Hz DTD clock",
                f".equ SLACK, {self.slack}"]
        for (length, sigma), name in self.envelopes.items():
            head.append(f".envelope {name}, gaussian, length={length}, sigma={sigma!r}, "
                        "amp=1.0")
        return "\n".join(head + self.lines) + "\n", results, is_tuple

    def env_args(self) -> list:
        return [self.env[p].value for p in self.kernel.params  # type: ignore[union-attr]
                if isinstance(self.env.get(p), _Const)]

    def source_comment(self, stmt: ast.stmt) -> None:
        first = ast.unparse(stmt).splitlines()[0].strip()
        self.lines.append(f"; {self.filename_short}:{stmt.lineno}: {first}")

    @property
    def filename_short(self) -> str:
        return self.filename.rsplit("/", 1)[-1]

    def block(self, stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.Return):
                raise self.error(stmt, "`return` must be the kernel's last statement (not "
                                       "inside an if or a loop)")
            self.statement(stmt)

    def statement(self, stmt: ast.stmt) -> None:
        if not isinstance(stmt, ast.If | ast.For):
            self.source_comment(stmt)
        if isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Call):
                value = self.call(stmt.value, None)
                if isinstance(value, _Reg) and value.n in self.temps:
                    self.temps.discard(value.n)
                    self.release(value.n)
                return
            if isinstance(stmt.value, ast.Constant):
                return                                          # a string or ... as a comment
            raise self.error(stmt, f"a statement `{ast.unparse(stmt)}` that does nothing")
        if isinstance(stmt, ast.Assign):
            if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                raise self.error(stmt, "assign to one plain name (no tuples, subscripts or "
                                       "attributes)")
            self.assign(stmt.targets[0].id, stmt.value, stmt)
            return
        if isinstance(stmt, ast.AugAssign):
            if not isinstance(stmt.target, ast.Name):
                raise self.error(stmt, "augmented assignment to a plain name only")
            expr = ast.BinOp(left=ast.Name(stmt.target.id, ast.Load()), op=stmt.op,
                             right=stmt.value)
            ast.copy_location(expr, stmt)
            self.assign(stmt.target.id, expr, stmt)
            return
        if isinstance(stmt, ast.If):
            self.if_(stmt)
            return
        if isinstance(stmt, ast.For):
            self.for_(stmt)
            return
        if isinstance(stmt, ast.Pass):
            return
        kind = type(stmt).__name__
        raise self.error(stmt, f"`{ast.unparse(stmt).splitlines()[0]}`: {kind} statements are "
                               "not supported in a kernel")

    def assign(self, name: str, value: ast.expr, stmt: ast.stmt) -> None:
        if name in self.kernel.params:
            raise self.error(stmt, f"parameter {name!r} is bound at launch; assign to another "
                                   "name")
        if name in self.loop_vars:
            raise self.error(stmt, f"{name!r} is a loop variable")
        if isinstance(value, ast.Call) and self.callee(value) in ("qubit", "qvector"):
            if name in self.env:
                raise self.error(stmt, f"{name!r} is already defined: a qubit is allocated "
                                       "once, to a new name")
            self.env[name] = self.allocate(value)
            return
        if isinstance(value, ast.Call) and self.callee(value) in GATES:
            raise self.error(stmt, f"{self.callee(value)}() is a gate; it has no value")
        if isinstance(value, ast.Call) and self.callee(value) == "device_call" and \
                value.args and isinstance(value.args[0], ast.Name | ast.Attribute):
            handler = self.resolve(value.args[0])
            if inspect.isfunction(handler) and \
                    typing.get_type_hints(handler).get("return", 0) is type(None):
                raise self.error(stmt, f"device_call: {handler.__name__} returns None; it "
                                       "has no value to assign")
        old = self.env.get(name)
        if isinstance(old, _Qubit | _QVec):
            raise self.error(stmt, f"{name!r} holds qubits; it cannot be reassigned")
        target = old.n if isinstance(old, _Reg) else None
        result = self.expr(value, target)
        if isinstance(result, _Qubit | _QVec):
            raise self.error(stmt, "qubits are allocated with qubit() or qvector(n) only")
        if isinstance(result, _Const):
            if target is None and isinstance(result.value, float):
                self.env[name] = result                  # a float constant: an angle
                return
            if not isinstance(result.value, int):
                raise self.error(stmt, f"{name!r}: a register holds an int, not "
                                       f"{result.value!r}")
            reg = target if target is not None else self.alloc(stmt)
            self.set_reg(reg, result.value, stmt)
            result = _Reg(reg)
        assert isinstance(result, _Reg)
        if target is not None and result.n != target:
            self.emit(f"add r{target}, r{result.n}, 0")
            self.cost(CORE_COST_CYCLES)
            self.fence(result.n)
            self.written(target)
            self.free_temp(result)
            result = _Reg(target)
        self.temps.discard(result.n)
        self.env[name] = result
        if isinstance(value, ast.Call) and self.callee(value) == "mz":
            self.measurements[name] = result.n
        else:
            self.measurements.pop(name, None)

    def set_reg(self, reg: int, value: int, node: ast.AST) -> None:
        if not -2**31 <= value < 2**32:
            raise self.error(node, f"{value} does not fit a 32-bit register")
        self.written(reg)
        self.emit(f"set r{reg}, {value}")
        self.cost(SIMPLE_COST_CYCLES)

    def allocate(self, call: ast.Call) -> _Value:
        kind = self.callee(call)
        if call.keywords:
            raise self.error(call, f"{kind}() takes no keyword arguments")
        if kind == "qubit":
            if call.args:
                raise self.error(call, "qubit() takes no arguments")
            count = 1
        else:
            if len(call.args) != 1:
                raise self.error(call, "qvector(n) takes the number of qubits")
            n = self.expr(call.args[0], None)
            if not isinstance(n, _Const) or not isinstance(n.value, int) or n.value < 1:
                raise self.error(call, "qvector(n): n is a constant int >= 1")
            count = n.value
        first = self.next_qubit
        if first + count > len(self.table.qubits):
            raise self.error(call, f"the kernel allocates {first + count} qubit(s); the "
                                   f"calibration table has {len(self.table.qubits)}")
        self.next_qubit += count
        for q in range(first, first + count):
            self.state.frames[q] = 0.0
        if kind == "qubit":
            return _Qubit(first)
        return _QVec(tuple(range(first, first + count)))

    def callee(self, call: ast.Call) -> str | None:
        f = call.func
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute):
            return f.attr
        return None

    # --- expressions ----------------------------------------------------------------------
    def free_temp(self, value: _Value) -> None:
        if isinstance(value, _Reg) and value.n in self.temps:
            self.temps.discard(value.n)
            self.release(value.n)

    def temp(self, node: ast.AST) -> int:
        reg = self.alloc(node)
        self.temps.add(reg)
        return reg

    def expr(self, node: ast.expr, target: int | None) -> _Value:
        """Evaluate ``node``; a register result goes to ``target`` when given (else a temp)."""
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise self.error(node, f"the constant {node.value!r} is not an int or float")
            return _Const(node.value)
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            if node.id in self.loop_vars:
                raise self.error(node, f"the loop variable {node.id!r} cannot be used (the "
                                       "PPU's LOOP counts down); use `_`")
            if node.id in ("pi",):
                return _Const(math.pi)
            raise self.error(node, f"unknown name {node.id!r} (kernel variables are "
                                   "parameters, qubits and registers assigned before)")
        if isinstance(node, ast.Attribute) and node.attr == "pi":
            return _Const(math.pi)
        if isinstance(node, ast.Subscript):
            vec = self.expr(node.value, None)
            if not isinstance(vec, _QVec):
                raise self.error(node, "only a qvector can be indexed")
            idx = self.expr(node.slice, None)
            if not isinstance(idx, _Const) or not isinstance(idx.value, int):
                raise self.error(node, "a qvector's index is a constant int")
            if not -len(vec.indices) <= idx.value < len(vec.indices):
                raise self.error(node, f"index {idx.value} is out of a qvector of "
                                       f"{len(vec.indices)}")
            return _Qubit(vec.indices[idx.value])
        if isinstance(node, ast.UnaryOp):
            operand = self.expr(node.operand, None)
            if isinstance(operand, _Const):
                if isinstance(node.op, ast.USub):
                    return _Const(-operand.value)
                if isinstance(node.op, ast.UAdd):
                    return operand
            if isinstance(node.op, ast.USub) and isinstance(operand, _Reg):
                return self.alu(ast.Sub(), _Const(0), operand, target, node)
            raise self.error(node, f"`{ast.unparse(node)}`: only - on a register or a "
                                   "constant (use `if not m:` in a condition)")
        if isinstance(node, ast.BinOp):
            left = self.expr(node.left, None)
            right = self.expr(node.right, None)
            if isinstance(left, _Const) and isinstance(right, _Const):
                op = _FOLD.get(type(node.op))
                if op is None:
                    raise self.error(node, f"`{ast.unparse(node)}`: operator not supported")
                try:
                    return _Const(op(left.value, right.value))
                except (ArithmeticError, ValueError, TypeError) as exc:
                    raise self.error(node, f"`{ast.unparse(node)}`: {exc}") from None
            if isinstance(left, _Reg | _Const) and isinstance(right, _Reg | _Const):
                return self.alu(node.op, left, right, target, node)
            raise self.error(node, f"`{ast.unparse(node)}`: arithmetic on qubits")
        if isinstance(node, ast.Call):
            return self.call(node, target)
        raise self.error(node, f"`{ast.unparse(node)}`: {type(node).__name__} expressions are "
                               "not supported in a kernel")

    def alu(self, op: ast.operator, left: _Reg | _Const, right: _Reg | _Const,
            target: int | None, node: ast.AST) -> _Reg:
        name = _ALU_OPS.get(type(op))
        if name is None:
            raise self.error(node, f"`{ast.unparse(node)}`: the PPU's ALU has no "
                                   f"{type(op).__name__} (it has + - & | ^ << >>)")
        for v in (left, right):
            if isinstance(v, _Const) and not isinstance(v.value, int):
                raise self.error(node, f"`{ast.unparse(node)}`: registers hold ints, not "
                                       f"{v.value!r}")
        if isinstance(left, _Const):
            if name in ("add", "and", "or", "xor"):
                left, right = right, left
            else:
                reg = self.temp(node)
                self.set_reg(reg, int(left.value), node)
                left = _Reg(reg)
        assert isinstance(left, _Reg)
        dest = target if target is not None else self.temp(node)
        if isinstance(right, _Const) and name in ("add", "sub"):
            imm = int(right.value) if name == "add" else -int(right.value)
            self.fence(left.n)
            self.written(dest)
            self.emit(f"add r{dest}, r{left.n}, {imm}")
        else:
            if not self.params.alu:
                raise self.error(node, f"`{ast.unparse(node)}`: the build has no ALU "
                                       "(alu = False): only + and - of a constant")
            if isinstance(right, _Const):
                if name in ("shl", "sra") and not 0 <= int(right.value) < 32:
                    raise self.error(node, "a shift amount is 0..31")
                operand = str(int(right.value))
            else:
                self.fence(right.n)
                operand = f"r{right.n}"
            self.fence(left.n)
            self.written(dest)
            self.emit(f"{name} r{dest}, r{left.n}, {operand}")
        self.cost(CORE_COST_CYCLES)
        self.free_temp(left)
        self.free_temp(right)
        if target is None:
            self.temps.add(dest)
        return _Reg(dest)

    def call(self, node: ast.Call, target: int | None) -> _Value:
        name = self.callee(node)
        if node.keywords:
            raise self.error(node, f"{name}(): keyword arguments are not supported")
        if name in GATES:
            self.gate(name, node)
            return _Const(0)
        if name == "mz":
            return self.measure(node, target)
        if name == "device_call":
            return self.device_call(node, target)
        if name in ("qubit", "qvector"):
            raise self.error(node, f"{name}() is assigned to a name: `q = {name}(...)`")
        raise self.error(node, f"`{ast.unparse(node.func)}` is not a kernel operation (gates "
                               f"{', '.join(GATES)}, mz, device_call, qubit, qvector)")

    def qubits_of(self, node: ast.expr) -> list[int]:
        v = self.expr(node, None)
        if isinstance(v, _Qubit):
            return [v.index]
        if isinstance(v, _QVec):
            return list(v.indices)
        raise self.error(node, f"`{ast.unparse(node)}` is not a qubit")

    def angle(self, node: ast.expr) -> float:
        v = self.expr(node, None)
        if not isinstance(v, _Const):
            raise self.error(node, "a rotation angle is a constant or a kernel parameter "
                                   "(radians), not a register")
        return float(v.value)

    # --- gates ----------------------------------------------------------------------------
    def gate(self, name: str, node: ast.Call) -> None:
        n_angles = GATES[name]
        if name == "cz":
            if len(node.args) != 2:
                raise self.error(node, "cz(a, b) takes two qubits")
            (a,), (b,) = self.single(node.args[0]), self.single(node.args[1])
            if a == b:
                raise self.error(node, "cz(a, b) of one qubit with itself")
            try:
                cal = self.table.coupler(a, b)
            except CalibrationError as exc:
                raise self.error(node, str(exc)) from None
            env = self.envelope(cal.pulse_length_samples, cal.pulse_sigma_samples)
            self.before_event()
            self.emit(f"play {cal.channel}, {env}, amp={cal.cz_amplitude!r}")
            self.cost(SIMPLE_COST_CYCLES)
            self.wait(self.pulse_cycles(cal.pulse_length_samples, node))
            return
        if len(node.args) != n_angles + 1:
            what = "an angle and a qubit" if n_angles else "one qubit (or a qvector)"
            raise self.error(node, f"{name}() takes {what}")
        theta = self.angle(node.args[0]) if n_angles else 0.0
        for q in self.qubits_of(node.args[-1]):
            if name in ("z", "s", "t", "rz"):
                self.virtual_z(q, {"z": math.pi, "s": math.pi / 2, "t": math.pi / 4,
                                   "rz": theta}[name])
            elif name == "h" and self.depth:
                # in a loop body or an if arm the frame must come back as it was: H = X RY(pi/2)
                self.pulse(q, math.pi / 2, math.pi / 2, node)
                self.pulse(q, 0.0, math.pi, node)
            elif name == "h":
                self.virtual_z(q, math.pi)
                self.pulse(q, math.pi / 2, math.pi / 2, node)
            elif name in ("x", "rx"):
                self.pulse(q, 0.0, math.pi if name == "x" else theta, node)
            else:
                self.pulse(q, math.pi / 2, math.pi if name == "y" else theta, node)

    def single(self, node: ast.expr) -> list[int]:
        qs = self.qubits_of(node)
        if len(qs) != 1:
            raise self.error(node, "cz() takes single qubits, not a qvector")
        return qs

    def virtual_z(self, q: int, theta: float) -> None:
        self.state.frames[q] = self.state.frames.get(q, 0.0) + theta

    def pulse_cycles(self, length: int, node: ast.AST) -> int:
        spc = self.table.samples_per_cycle
        if length % spc:
            raise self.error(node, f"a pulse of {length} samples is not a whole number of DTD "
                                   f"cycles of {spc} samples")
        return length // spc

    def pulse(self, q: int, phi: float, theta: float, node: ast.AST) -> None:
        """A rotation by ``theta`` about the frame's axis at angle ``phi`` from X."""
        theta = math.remainder(theta, 2 * math.pi)          # (-pi, pi]: -pi and pi agree
        if abs(theta) < 1e-12:
            return
        cal = self.table.qubit(q)
        amp = cal.pi_amplitude * theta / math.pi
        phase = phase_word(phi - self.state.frames.get(q, 0.0))
        freq = self.table.freq_word(cal.drive_if_hz)
        if not self.params.nco and (phase or freq):
            raise self.error(node, f"qubit {q}: the build has no NCO (nco = False), so a pulse "
                                   f"of phase {phase}/65536 turn or an IF of "
                                   f"{cal.drive_if_hz:g} Hz cannot be played")
        env = self.envelope(cal.pulse_length_samples, cal.pulse_sigma_samples)
        extra = (f", phase={phase}" if phase else "") + (f", freq={freq}" if freq else "")
        self.before_event()
        self.emit(f"play {cal.drive_channel}, {env}, amp={amp:.9f}{extra}")
        self.cost(SIMPLE_COST_CYCLES)
        self.wait(self.pulse_cycles(cal.pulse_length_samples, node))

    def measure(self, node: ast.Call, target: int | None) -> _Reg:
        if len(node.args) != 1:
            raise self.error(node, "mz(q) takes one qubit")
        qs = self.qubits_of(node.args[0])
        if len(qs) != 1:
            raise self.error(node, "mz(q) measures one qubit; measure a qvector's qubits one "
                                   "by one")
        cal = self.table.qubit(qs[0])
        window = self.table.cycles(cal.readout_window_ns)
        phase = phase_word(cal.readout_phase_rad)
        freq = self.table.freq_word(cal.readout_if_hz)
        if not self.params.nco and (phase or freq):
            raise self.error(node, f"qubit {qs[0]}: the build has no NCO (nco = False): no "
                                   "readout phase or IF")
        reg = target if target is not None else self.temp(node)
        self.written(reg)
        extra = (f", phase={phase}" if phase else "") + (f", freq={freq}" if freq else "")
        self.before_event()
        self.emit(f"acquire {cal.readout_channel}, r{reg}, window={window}, "
                  f"threshold={cal.readout_threshold}{extra}")
        self.cost(SIMPLE_COST_CYCLES)
        self.wait(window)
        self.state.pending_hi[reg] = 0
        self.state.pending_lo[reg] = 0
        return _Reg(reg)

    # --- device_call ------------------------------------------------------------------------
    def resolve(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name):
            if node.id not in self.globals:
                raise self.error(node, f"device_call: unknown handler {node.id!r}")
            return self.globals[node.id]
        if isinstance(node, ast.Attribute):
            return getattr(self.resolve(node.value), node.attr)
        raise self.error(node, "device_call's handler is a function's name")

    def device_call(self, node: ast.Call, target: int | None) -> _Reg:
        if not node.args:
            raise self.error(node, "device_call(handler, *args) needs a handler")
        handler = self.resolve(node.args[0])
        try:
            entry = _host_entry(handler)
        except DispatchError as exc:
            raise self.error(node, str(exc)) from None
        args = node.args[1:]
        if len(args) != len(entry.args):
            raise self.error(node, f"device_call: {entry.name} takes {len(entry.args)} "
                                   f"argument(s), {len(args)} given")
        if len(args) > 4:
            raise self.error(node, "device_call: a CALL carries at most 4 arguments")
        hints = typing.get_type_hints(handler)
        names = list(inspect.signature(handler).parameters)
        bits = [_HINTS[hints[n]][1] for n in names]
        if sum(b // 8 for b in bits) > self.params.call_arg_bytes:
            raise self.error(node, f"device_call {entry.name}: {sum(b // 8 for b in bits)} "
                                   f"argument bytes; the build's CALL takes "
                                   f"{self.params.call_arg_bytes}")
        if entry.result_len_bytes > 4:
            raise self.error(node, "device_call: a result of more than 32 bits")
        known = self.handlers.get(entry.name)
        if known is None:
            self.handlers[entry.name] = handler
            self.function_table.add(entry)
        elif known is not handler:
            raise self.error(node, f"device_call: two handlers named {entry.name!r}")
        regs = []
        for a in args:
            v = self.expr(a, None)
            if isinstance(v, _Const):
                if not isinstance(v.value, int):
                    raise self.error(a, f"device_call argument {v.value!r}: an int")
                reg = self.temp(a)
                self.set_reg(reg, v.value, a)
                v = _Reg(reg)
            if not isinstance(v, _Reg):
                raise self.error(a, f"device_call argument `{ast.unparse(a)}` is not a "
                                    "register or an int")
            regs.append(v.n)
        # the core waits for the latest measurement, so that it knows how far the timeline is
        st = self.state
        if st.pending_lo:
            latest = max(st.pending_lo, key=lambda r: st.pending_lo[r])
            if latest not in regs:
                self.emit(f"add r0, r{latest}, 0")
                self.cost(CORE_COST_CYCLES)
            self.fence(latest)
        for r in regs:
            self.fence(r)
        dest = 0
        if entry.results:
            dest = target if target is not None else self.temp(node)
            self.written(dest)
        arglist = ", ".join(f"r{r}:{b}" for r, b in zip(regs, bits, strict=True))
        self.emit(f"call {entry.name}({arglist})" + (f" -> r{dest}" if dest else ""))
        for r in regs:
            self.free_temp(_Reg(r))
        amount = self.slack + max(0, st.behind)
        self.emit(f"sync {amount}" if amount != self.slack else "sync SLACK")
        self.has_call = True
        self.state = _Timing(ahead=amount - SIMPLE_COST_CYCLES, behind=amount,
                             frames=st.frames, elapsed=None)
        return _Reg(dest) if dest else _Const(0)  # type: ignore[return-value]

    # --- control flow -----------------------------------------------------------------------
    def condition(self, node: ast.expr) -> tuple[str, int, int] | bool:
        """``(mnemonic that jumps when the condition is FALSE, register, immediate)``, or a
        constant truth value."""
        negate = False
        while isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            negate = not negate
            node = node.operand
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise self.error(node, "one comparison at a time (no chains)")
            left = self.expr(node.left, None)
            right = self.expr(node.comparators[0], None)
            op = type(node.ops[0])
            flip = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE,
                    ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}
            if op not in flip:
                raise self.error(node, f"`{ast.unparse(node)}`: compare with == != < <= > >=")
            if isinstance(left, _Const) and isinstance(right, _Const):
                return bool(_COMPARE[op](left.value, right.value)) != negate
            if isinstance(left, _Const):
                left, right, op = right, left, flip[op]
            if isinstance(right, _Reg):
                if not self.params.alu:
                    raise self.error(node, "comparing two registers needs the ALU")
                left = self.alu(ast.Sub(), left, right, None, node)  # type: ignore[arg-type]
                right = _Const(0)
            if not isinstance(left, _Reg) or not isinstance(right.value, int):
                raise self.error(node, f"`{ast.unparse(node)}`: compare a register with an int")
            k = int(right.value)
            # the branch that jumps to the else arm: taken when the condition is false
            false_jump = {ast.Eq: ("bne", k), ast.NotEq: ("beq", k), ast.Lt: ("bge", k),
                          ast.GtE: ("blt", k), ast.Gt: ("blt", k + 1),
                          ast.LtE: ("bge", k + 1)}[op]
            true_jump = {"bne": "beq", "beq": "bne", "bge": "blt", "blt": "bge"}
            mnem, imm = false_jump
            if negate:
                mnem = true_jump[mnem]
            return mnem, left.n, imm
        v = self.expr(node, None)
        if isinstance(v, _Const):
            return bool(v.value) != negate
        if not isinstance(v, _Reg):
            raise self.error(node, f"`{ast.unparse(node)}` is not a condition on a register")
        return ("bne" if negate else "beq"), v.n, 0

    def run_block(self, stmts: list[ast.stmt], state: _Timing) -> tuple[list[str], _Timing]:
        saved_lines, saved_state = self.lines, self.state
        self.lines, self.state = [], state
        self.depth += 1
        try:
            self.block(stmts)
            return self.lines, self.state
        finally:
            self.lines, self.state = saved_lines, saved_state
            self.depth -= 1

    def if_(self, stmt: ast.If) -> None:
        self.lines.append(f"; {self.filename_short}:{stmt.lineno}: if {ast.unparse(stmt.test)}:")
        cond = self.condition(stmt.test)
        if isinstance(cond, bool):
            self.block(stmt.body if cond else stmt.orelse)
            return
        mnem, reg, imm = cond
        self.fence(reg)
        self.cost(CORE_COST_CYCLES)
        self.free_temp(_Reg(reg))             # a comparison's difference: read by the branch
        start = self.state.copy()
        start.elapsed = 0
        then_lines, then_state = self.run_block(stmt.body, start.copy())
        else_lines, else_state = self.run_block(stmt.orelse, start.copy())
        for q in set(then_state.frames) | set(else_state.frames):
            a, b = then_state.frames.get(q, 0.0), else_state.frames.get(q, 0.0)
            if phase_word(a) != phase_word(b):
                raise self.error(stmt, f"the arms of this `if` leave qubit {q}'s frame at "
                                       f"different phases ({a:.4f} and {b:.4f} rad: virtual Z "
                                       "gates); balance them")
        # equal durations: pad the shorter arm
        if then_state.elapsed is not None and else_state.elapsed is not None:
            pad = then_state.elapsed - else_state.elapsed
            for lines, state, d in ((else_lines, else_state, pad),
                                    (then_lines, then_state, -pad)):
                if d > 0:
                    saved_lines, saved_state = self.lines, self.state
                    self.lines, self.state = lines, state
                    self.wait(d)
                    self.lines, self.state = saved_lines, saved_state
        end = self.label()
        if stmt.orelse or any(not line.startswith(";") for line in else_lines):
            other = self.label()
            self.emit(f"{mnem} r{reg}, {imm}, {other}")
            self.lines += then_lines
            self.emit(f"jmp {end}")
            self.lines.append(f"{other}:")
            self.lines += else_lines
        else:
            self.emit(f"{mnem} r{reg}, {imm}, {end}")
            self.lines += then_lines
        self.lines.append(f"{end}:")
        joined = _join(then_state, else_state)
        joined.ahead -= CORE_COST_CYCLES            # the jmp of the then arm
        before = self.state.elapsed
        joined.elapsed = (before + joined.elapsed
                          if before is not None and joined.elapsed is not None else None)
        self.state = joined

    def for_(self, stmt: ast.For) -> None:
        self.lines.append(f"; {self.filename_short}:{stmt.lineno}: for "
                          f"{ast.unparse(stmt.target)} in {ast.unparse(stmt.iter)}:")
        if stmt.orelse:
            raise self.error(stmt, "for ... else is not supported")
        it = stmt.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                and it.func.id == "range" and len(it.args) == 1 and not it.keywords):
            raise self.error(stmt, "a kernel loops with `for _ in range(N)` only")
        if not isinstance(stmt.target, ast.Name):
            raise self.error(stmt, "the loop variable is a plain name")
        n = self.expr(it.args[0], None)
        if not isinstance(n, _Const) or not isinstance(n.value, int):
            raise self.error(stmt, "range(N): N is a constant int or an int parameter")
        count = n.value
        if count <= 0:
            return
        if count >= 2**31:
            raise self.error(stmt, f"range({count}): at most 2**31 - 1 iterations")
        var = stmt.target.id
        if var in self.env:
            raise self.error(stmt, f"the loop variable {var!r} shadows a kernel variable")
        if var != "_":
            self.loop_vars.add(var)
        counter = self.alloc(stmt)
        self.set_reg(counter, count, stmt)
        top = self.label()
        entry = self.state.copy()
        # the state at the loop's top holds for the first iteration and for every later one:
        # the join of the entry and the end of the body, found by iterating
        state_top = entry.copy()
        state_top.ahead = min(entry.ahead, self.slack)
        state_top.pending_lo = {}
        state_top.elapsed = 0
        saved = (dict(self.env), list(self.free_regs), dict(self.measurements), self.labels,
                 set(self.temps), self.has_call)
        for _ in range(8):
            (self.env, self.free_regs, self.measurements, self.labels, self.temps,
             self.has_call) = (dict(saved[0]), list(saved[1]), dict(saved[2]), saved[3],
                               set(saved[4]), saved[5])
            body_lines, end = self.run_block(stmt.body, state_top.copy())
            floor = min(state_top.ahead, self.slack)
            if end.ahead < floor:       # keep the core's margin from shrinking each iteration
                saved_lines, saved_state = self.lines, self.state
                self.lines, self.state = body_lines, end
                self.wait(floor - end.ahead + CORE_COST_CYCLES)
                end = self.state
                self.lines, self.state = saved_lines, saved_state
            for q in set(end.frames) | set(entry.frames):
                turn = end.frames.get(q, 0.0) - entry.frames.get(q, 0.0)
                if phase_word(turn):
                    raise self.error(stmt, f"the loop body turns qubit {q}'s frame by "
                                           f"{turn:.4f} rad (virtual Z gates); a loop body "
                                           "must leave every frame as it found it")
            end_loop = end.copy()
            end_loop.ahead -= CORE_COST_CYCLES           # the LOOP instruction
            nxt = _join(state_top, end_loop)
            nxt.pending_lo = {}
            nxt.elapsed = 0
            if end.elapsed is not None:    # no SYNC in the body: nothing in it reads behind
                nxt.behind = entry.behind
            if nxt.key() == state_top.key():
                break
            state_top = nxt
        else:
            raise self.error(stmt, "cannot bound the timing of this loop's body")
        self.lines.append(f"{top}:")
        self.lines += body_lines
        self.emit(f"loop r{counter}, {top}")
        self.release(counter)
        self.loop_vars.discard(var)
        exit_state = end_loop
        if end.elapsed is not None:
            # no SYNC in the body: t moved by the whole loop since the loop's entry
            exit_state.behind = entry.behind + end.elapsed * count
            exit_state.pending_lo = {}
            exit_state.elapsed = (entry.elapsed + end.elapsed * count
                                  if entry.elapsed is not None else None)
        else:
            exit_state.elapsed = None
        self.state = exit_state

    # --- return -----------------------------------------------------------------------------
    def ret(self, stmt: ast.Return) -> tuple[tuple[KernelResult, ...] | None, bool]:
        if stmt.value is None:
            return None, False
        items = stmt.value.elts if isinstance(stmt.value, ast.Tuple) else [stmt.value]
        out = []
        for item in items:
            v = self.expr(item, None)
            if isinstance(v, _Reg):
                self.temps.discard(v.n)
                self.fence(v.n)
                out.append(KernelResult(register=v.n))
            elif isinstance(v, _Const) and isinstance(v.value, int):
                out.append(KernelResult(constant=v.value))
            else:
                raise self.error(item, f"`{ast.unparse(item)}`: a kernel returns registers "
                                       "(measurements, device_call results) or ints")
        return tuple(out), isinstance(stmt.value, ast.Tuple)


def compile_kernel(kern: Kernel, table: CalibrationTable, args: Sequence[Any] = (), *,
                   params: QSCParams | None = None) -> CompiledKernel:
    """Lower ``kern`` for the parameter values ``args`` through ``table`` to a program of
    the build ``params`` (default ``QSCParams()``; a simulation build:
    :func:`openqlink.sim.channel_map.sim_params`).

    Raises :class:`KernelCompileError` (``file:line:`` of the kernel source) for a construct
    the language does not have, a qubit or coupler the table lacks, a gate the build cannot
    play (no NCO), a handler whose type hints do not give a schema, or a program the
    assembler refuses for the build (a channel the build lacks, memory full).
    """
    params = params or QSCParams()
    if table.dtd_clk_hz != params.dtd_clk_hz or \
            table.samples_per_cycle != params.samples_per_cycle:
        raise KernelCompileError(
            f"the calibration table is for {table.dtd_clk_hz} Hz and {table.samples_per_cycle} "
            f"sample(s) per cycle, the build runs {params.dtd_clk_hz} Hz and "
            f"{params.samples_per_cycle}", kern.filename, kern.tree.lineno)
    c = _Compiler(kern, table, args, params)
    text, results, is_tuple = c.compile()
    try:
        program = assemble(text, filename=f"<kernel {kern.name}>", params=params)
    except AssemblerError as exc:
        raise KernelCompileError(f"the program does not fit the build: {exc}", kern.filename,
                                 kern.tree.lineno) from None
    return CompiledKernel(
        name=kern.name, args=tuple(args), assembly=text, program=program,
        function_table=c.function_table, handlers=c.handlers, results=results,
        returns_tuple=is_tuple, measurements=dict(c.measurements), qubits=c.next_qubit,
        params=params, table=table, duration_cycles=c.state.elapsed,
        frames=dict(c.state.frames))
