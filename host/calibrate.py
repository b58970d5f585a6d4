"""Calibration workflows: measure a qubit's pulses on the device and write them into the
:class:`~openqlink.calibration.CalibrationTable`.

Each workflow generates its PPU program(s) from the table (assembly text, assembled with the
device's build parameters), runs them on any :class:`~openqlink.qsc.QSC` (a board or the
simulated QSC, :class:`openqlink.sim.SimulatedQSC`), takes its data from the device alone
(registers, :meth:`~openqlink.qsc.QSC.read_iq`, raw traces, HOST_CALL requests), fits it and
returns a result with the data, the fit and the fitted value with its uncertainty;
``result.apply(table)`` writes the value into the table and ``result.plot(path)`` draws the
data and the fit (matplotlib, the ``[plot]`` extra, imported only then).

* :func:`calibrate_readout`: |0> and |1> (a pi pulse) many shots each; per shot the I/Q point
  of the readout window, from the IQ registers or demodulated here from the window's raw ADC
  trace; the IQ rotation angle that puts |1> on +I (ACQUIRE reads 1 for ``I > threshold``),
  the threshold midway between the two states in the gateware's integral units, the assignment
  fidelity, and histograms of the projected I.
* :func:`calibrate_rabi`: P(1) against the drive amplitude, counted on the device;
  ``P(1) = A sin^2(pi a / (2 a_pi)) + B`` gives the pi amplitude ``a_pi``.
* :func:`calibrate_ramsey`: two pi/2 pulses a swept delay apart with the NCO detuned by
  ``+delta`` and by ``-delta``; the two fringe frequencies ``|f_q - f_nco|`` give the qubit's
  frequency with its sign, the corrected ``drive_if_hz``.
* :func:`count_ones`, :func:`measure_iq_shots`: the shot loops under them (counts, P(1) with
  its binomial error; per-shot I/Q points and their histograms).

The fits use numpy alone: each model is linear in all but one parameter, which is found on a
grid (refined around its best point) with linear least squares at each grid point; the
uncertainty of that parameter is the curvature of the sum of squared residuals,
``sigma^2 = 2 s^2 / SSE''`` with ``s^2 = SSE / (n - p)``.

# Ref: docs/calibration.md; docs/isa.md (PLAY, ACQUIRE, demodulation, calibration registers);
# Krantz et al., "A quantum engineer's guide to superconducting qubits" (2019), Rabi and
# Ramsey experiments, dispersive readout.
"""

from __future__ import annotations

import cmath
import math
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .calibration import CalibrationError, CalibrationTable, QubitCalibration, phase_word
from .errors import QlinkError

if TYPE_CHECKING:
    from .dispatch import FunctionTable
    from .qsc import QSC

__all__ = [
    "CalibrationRunError", "ProgramRunner", "ShotCounts", "IQShots", "count_ones",
    "measure_iq_shots", "demodulate", "RabiFit", "FringeFit", "fit_rabi", "fit_fringe",
    "resolve_detuning", "fit_readout", "ReadoutResult", "RabiResult", "RamseyResult",
    "calibrate_readout", "calibrate_rabi", "calibrate_ramsey", "calibrate_all",
    "DEFAULT_AMPLITUDES", "DEFAULT_DELAYS_NS", "START_MARGIN_CYCLES", "COUNT_REGISTERS",
]

#: How far ahead of the QSC's timeline a calibration program starts (DTD cycles): the
#: trigger's RDMA WRITE must reach the PPU before then.
START_MARGIN_CYCLES = 2000
#: The registers that count the 1s of the blocks of one program (one block each); a sweep of
#: more points runs as several programs.
COUNT_REGISTERS = tuple(range(4, 16))
#: The Rabi sweep unless told: 11 amplitudes 0, 0.1, ..., 1.0 of full scale.
DEFAULT_AMPLITUDES = tuple(round(0.1 * k, 1) for k in range(11))
#: The Ramsey delays unless told: 0, 100, ..., 1500 ns between the two pi/2 pulses (with the
#: default detuning of 1 MHz, a qubit up to 350 kHz off still gives a period of each fringe).
DEFAULT_DELAYS_NS = tuple(100.0 * k for k in range(16))
#: At most this many rounds of "pi pulse, readout" in a conditional reset (until a readout
#: gives 0).
RESET_ROUNDS = 4
#: The HOST_CALL a per-shot I/Q program makes after each readout (one bit in, one UINT8 out:
#: 1 asks for the reset pulse).
IQ_CALL = "calib_iq_shot"

_TWO_PI = 2 * math.pi


class CalibrationRunError(QlinkError, RuntimeError):
    """A calibration program did not run to its end on the device (the PPU stopped with an
    error, or did not end in time), or the device gave data a fit cannot use; the message
    names the experiment and what went wrong."""


# --- running programs -------------------------------------------------------------------------

def _status_flags(status: Any) -> list[str]:
    names = ("underflow", "late", "call_timeout", "call_failed", "illegal_instruction",
             "trigger_busy", "trigger_late", "sequence", "trigger_incomplete")
    return [n for n in names if int(getattr(status, n))]


class ProgramRunner:
    """Runs calibration programs on one PPU of a QSC: connects and configures the PPU (its QP
    and a ring of ``ring_slots`` slots for CALLs) on first use, then for each program writes
    the envelopes, uploads it, triggers it :data:`START_MARGIN_CYCLES` ahead of the timeline,
    serves its CALLs with a :class:`~openqlink.dispatch.Dispatcher` while it runs, and reads
    the registers back.

    :func:`runner_for` keeps one per QSC and PPU, so that workflows run one after another
    configure the PPU once. Raises :class:`CalibrationRunError` (naming the program) when the
    PPU stops with an error or does not end within ``run_limit_s`` wall-clock seconds.
    """

    def __init__(self, qsc: QSC, ppu: int = 0, *, ring_slots: int = 8,
                 run_limit_s: float = 3600.0):
        self.qsc = qsc
        self.ppu = ppu
        self.ring_slots = ring_slots
        self.run_limit_s = run_limit_s
        self._ring: Any = None

    def check_table(self, table: CalibrationTable) -> None:
        """Raise :class:`CalibrationError` unless ``table``'s timing is the device build's
        (``dtd_clk_hz``, ``samples_per_cycle``)."""
        p = self.qsc.params
        if (table.dtd_clk_hz, table.samples_per_cycle) != (p.dtd_clk_hz, p.samples_per_cycle):
            raise CalibrationError(
                f"table: dtd_clk_hz {table.dtd_clk_hz}, samples_per_cycle "
                f"{table.samples_per_cycle} are not the device's ({p.dtd_clk_hz}, "
                f"{p.samples_per_cycle})")

    def setup(self) -> None:
        """Connect and configure the PPU (once)."""
        if self._ring is not None:
            return
        from .dispatch import SlotRing

        self.qsc.connect()
        ring = SlotRing(num_slots=self.ring_slots, slot_size=256)
        self.qsc.configure(self.ppu, ring)
        self._ring = ring

    def run(self, source: str, name: str = "<calibration>",
            functions: FunctionTable | None = None,
            errors: list[BaseException] | None = None) -> dict[str, int]:
        """Assemble ``source`` (``name`` in its errors) for the device's build, run it to its
        END on the PPU, serving its CALLs from ``functions``, and return the PPU's registers
        by name (``R1`` .. ``R15``, ``STATUS``, ...). A handler that fails should append its
        exception to ``errors``: the first one there is raised as soon as it is seen."""
        from .dispatch import Dispatcher, FunctionTable
        from .isa import PPUState
        from .isa.asm import assemble
        from .memory_map import MAILBOX_BYTES
        from .wire.rpc import HEADER_BYTES

        qsc, ppu = self.qsc, self.ppu
        program = assemble(source, name, params=qsc.params)
        self.setup()
        errors = [] if errors is None else errors
        table = functions if functions is not None else FunctionTable()
        dispatcher = Dispatcher(table, self._ring,
                                send_response=lambda slot, data: qsc.send_response(ppu, slot,
                                                                                   data),
                                max_result_bytes=MAILBOX_BYTES - HEADER_BYTES)
        for env in program.envelopes.values():
            qsc.write_envelope(ppu, env.addr, env.samples)
        qsc.upload_program(ppu, program.to_bytes())
        qsc.trigger(ppu, qsc.timeline(ppu) + START_MARGIN_CYCLES, len(program.instructions))
        deadline = time.monotonic() + self.run_limit_s
        while True:
            qsc.poll_rx()
            dispatcher.poll()
            if errors:
                raise errors[0]
            status = qsc.status(ppu)
            if status.state in (PPUState.DONE, PPUState.ERROR):
                break
            if time.monotonic() > deadline:
                raise CalibrationRunError(f"{name}: PPU {ppu} did not end within "
                                          f"{self.run_limit_s:g} s")
        if errors:
            raise errors[0]
        if status.state == PPUState.ERROR:
            raise CalibrationRunError(f"{name}: PPU {ppu} stopped with an error: "
                                      f"{', '.join(_status_flags(status)) or 'ERROR'}")
        return qsc.read_registers(ppu)


_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runner_for(qsc: QSC | ProgramRunner, ppu: int = 0) -> ProgramRunner:
    """The :class:`ProgramRunner` of ``qsc`` and ``ppu`` (one per QSC and PPU, made on first
    use); a runner is returned as is."""
    if isinstance(qsc, ProgramRunner):
        return qsc
    per_qsc = _RUNNERS.setdefault(qsc, {})
    if ppu not in per_qsc:
        per_qsc[ppu] = ProgramRunner(qsc, ppu)
    return per_qsc[ppu]


# --- program text -----------------------------------------------------------------------------

def _amp(a: float) -> str:
    if not -1.0 <= a <= 1.0:
        raise CalibrationError(f"amplitude {a!r} is outside -1..1 of full scale")
    return f"{a:.6f}"


class _Program:
    """Assembly text of one qubit's calibration program, from its table entry."""

    def __init__(self, table: CalibrationTable, qubit: int, title: str):
        self.table = table
        self.cal: QubitCalibration = table.qubit(qubit)
        self.qubit = qubit
        self.lines: list[str] = [f"; {title} (qubit {qubit}), generated from the calibration "
                                 "table", ""]
        self._labels = 0
        c = self.cal
        self.pulse = c.pulse_length_samples
        s = table.samples_per_cycle
        if self.pulse % s:
            raise CalibrationError(f"qubit {qubit}: pulse_length_samples {self.pulse} is not "
                                   f"a multiple of samples_per_cycle {s}")
        self.pulse_cycles = self.pulse // s
        self.window = max(1, table.cycles(c.readout_window_ns))
        self.slack = max(16, table.cycles(table.sync_slack_ns))
        self.drive_freq = table.freq_word(c.drive_if_hz)
        self.lines += [f".envelope cal_pulse, gaussian, length={self.pulse}, "
                       f"sigma={c.pulse_sigma_samples:g}, amp=1.0", ""]

    def label(self, stem: str) -> str:
        self._labels += 1
        return f"{stem}{self._labels}"

    def emit(self, *lines: str) -> None:
        self.lines.extend(lines)

    def play(self, amplitude: float, freq_word: int | None = None) -> None:
        f = self.drive_freq if freq_word is None else freq_word
        self.emit(f"        play {self.cal.drive_channel}, cal_pulse, amp={_amp(amplitude)}, "
                  f"freq={f}",
                  f"        wait {self.pulse_cycles}")

    def acquire(self, rd: str = "r1") -> None:
        c = self.cal
        self.emit(f"        acquire {c.readout_channel}, {rd}, window={self.window}, "
                  f"threshold={c.readout_threshold}, phase={phase_word(c.readout_phase_rad)}, "
                  f"freq={self.table.freq_word(c.readout_if_hz)}",
                  f"        wait {self.window}")

    def conditional_reset(self, reg: str = "r1", rounds: int = RESET_ROUNDS) -> None:
        """After a readout into ``reg``: while it reads 1, a pi pulse and a readout again, at
        most ``rounds`` times (counted in ``r3``). Every round ends with a readout, so the
        next shot starts from a projected state: an imperfect pi pulse (before the Rabi
        calibration) leaves |1> now and then, never a part of its rotation that the next
        pulse would add to. ``t`` ends SLACK after the last result."""
        top, zero = self.label("reset"), self.label("z")
        self.emit(f"        set r3, {rounds}",
                  f"{top}:  beq {reg}, 0, {zero}         ; waits for the result",
                  f"        sync {self.slack}")
        self.play(self.cal.pi_amplitude)
        self.acquire(reg)
        self.emit(f"        loop r3, {top}",
                  f"        beq {reg}, 0, {zero}         ; waits for the last result",
                  f"{zero}:  sync {self.slack}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def counting_program(table: CalibrationTable, qubit: int, blocks: Sequence[str], shots: int,
                     title: str = "shot loop") -> str:
    """The assembly of a counting shot loop: for each of ``blocks`` (assembly lines that
    prepare the qubit from |0>, using the envelope ``cal_pulse`` of the qubit's pulse),
    ``shots`` shots of the block, a readout into r1 with the table's readout, the 1s added to
    the block's count register (``r4`` for the first block, ``r5`` for the second, ...:
    :data:`COUNT_REGISTERS`) and a conditional reset (``_Program.conditional_reset``: pi
    pulse and readout while it reads 1); the program starts with a reset. At most
    ``len(COUNT_REGISTERS)`` blocks."""
    if not 1 <= len(blocks) <= len(COUNT_REGISTERS):
        raise CalibrationError(f"a counting program has 1..{len(COUNT_REGISTERS)} blocks, not "
                               f"{len(blocks)}")
    _check_shots(shots)
    p = _Program(table, qubit, title)
    p.acquire()
    p.conditional_reset()
    for b, block in enumerate(blocks):
        top = p.label("shot")
        p.emit(f"; block {b}", f"        set r2, {shots}", f"{top}:")
        p.emit(*block.splitlines())
        p.acquire()
        p.emit(f"        add r{COUNT_REGISTERS[b]}, r{COUNT_REGISTERS[b]}, r1")
        p.conditional_reset()
        p.emit(f"        loop r2, {top}")
    p.emit("        end")
    return p.text()


def _check_shots(shots: object) -> int:
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 1:
        raise CalibrationError(f"shots must be an int >= 1, not {shots!r}")
    return shots


# --- shot loops -------------------------------------------------------------------------------

@dataclass
class ShotCounts:
    """The 1s counted on the device for each block of a shot loop: ``ones[k]`` of ``shots``
    shots of block ``k`` (shape ``(n_blocks,)``)."""

    ones: np.ndarray
    shots: int

    @property
    def p1(self) -> np.ndarray:
        """The fraction of 1s per block (shape ``(n_blocks,)``)."""
        return self.ones / self.shots

    @property
    def p1_err(self) -> np.ndarray:
        """The binomial standard error of :attr:`p1` (a fraction of 0 or 1 counted as half a
        shot off, so that no point has zero error)."""
        p = np.clip(self.p1, 0.5 / self.shots, 1 - 0.5 / self.shots)
        return np.sqrt(p * (1 - p) / self.shots)

    def histogram(self) -> np.ndarray:
        """The number of 0s and 1s per block: shape ``(n_blocks, 2)``."""
        return np.stack([self.shots - self.ones, self.ones], axis=1)


def count_ones(qsc: QSC | ProgramRunner, table: CalibrationTable, qubit: int,
               blocks: Sequence[str], shots: int, *, ppu: int = 0,
               title: str = "shot loop") -> ShotCounts:
    """Run ``shots`` shots of each of ``blocks`` (assembly that prepares qubit ``qubit`` from
    |0>, see :func:`counting_program`) on the device, counting the readouts' 1s in PPU
    registers (one program per :data:`COUNT_REGISTERS` blocks), and return the counts."""
    runner = runner_for(qsc, ppu)
    runner.check_table(table)
    ones: list[int] = []
    n = len(COUNT_REGISTERS)
    for start in range(0, len(blocks), n):
        chunk = list(blocks[start:start + n])
        source = counting_program(table, qubit, chunk, shots, title)
        regs = runner.run(source, f"<{title}, blocks {start}..{start + len(chunk) - 1}>")
        ones += [regs[f"R{COUNT_REGISTERS[k]}"] for k in range(len(chunk))]
    return ShotCounts(np.array(ones, dtype=np.int64), shots)


@dataclass
class IQShots:
    """Per-shot I/Q points of a readout, by prepared state: ``points[s]`` is a complex array
    (``I + jQ`` in the gateware's integral units, shape ``(shots,)``) of the shots prepared in
    state ``s`` (0 or 1), measured with the acquire phase ``phase_rad``; ``source`` says where
    they came from (``"iq"``: the IQ registers, ``"trace"``: raw traces demodulated here).
    From traces, ``traces[s]`` holds each shot's raw ADC samples and ``register_points[s]``
    the same windows' I/Q registers, read beside them (the gateware's own demodulation, for
    comparison)."""

    points: dict[int, np.ndarray]
    phase_rad: float
    source: str
    traces: dict[int, list[np.ndarray]] = field(default_factory=dict)
    register_points: dict[int, np.ndarray] = field(default_factory=dict)

    def mean(self, state: int) -> complex:
        """The mean I/Q point of the shots prepared in ``state``."""
        return complex(np.mean(self.points[state]))

    def histogram(self, angle_rad: float = 0.0, bins: int = 40
                  ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Histograms of the projected I (``Re(z exp(-j angle_rad))``) of each state on common
        bins: ``(edges (bins + 1,), {state: counts (bins,)})``."""
        proj = {s: np.real(z * np.exp(-1j * angle_rad)) for s, z in self.points.items()}
        allv = np.concatenate(list(proj.values()))
        edges = np.histogram_bin_edges(allv, bins=bins)
        return edges, {s: np.histogram(v, bins=edges)[0] for s, v in proj.items()}


_COS_TABLE = np.round(65536 * np.cos(_TWO_PI * np.arange(1024) / 1024)).astype(np.int64)


def demodulate(samples: np.ndarray, freq_word: int, phase_field: int) -> complex:
    """The I/Q integral of a window's raw ADC ``samples`` (shape ``(n,)``, sample order) as
    the gateware's ACQUIRE computes it (docs/isa.md): ``theta_n = phase * 2**16 + n *
    freq_word`` (32 bits), ``I = sum floor(adc_n * COS(theta_n) / 2**16)``,
    ``Q = sum floor(-adc_n * SIN(theta_n) / 2**16)`` with the 1024-entry table indexed by
    ``theta``'s top 10 bits (SIN: the table a quarter turn back). Returns ``I + jQ``."""
    x = np.asarray(samples, dtype=np.int64)
    n = np.arange(x.size, dtype=np.int64)
    theta = (phase_field * 65536 + n * freq_word) % (1 << 32)
    idx = theta >> 22
    cos = _COS_TABLE[idx]
    sin = _COS_TABLE[(idx - 256) % 1024]
    i = int(np.sum((x * cos) >> 16))
    q = int(np.sum((-x * sin) >> 16))
    return complex(i, q)


def iq_program(table: CalibrationTable, qubit: int, shots: int) -> str:
    """The per-shot I/Q program of the readout calibration: ``shots`` times, a readout of
    |0> and a readout after a pi pulse, each followed by the HOST_CALL :data:`IQ_CALL` (the
    host reads the window's I/Q or trace while the PPU waits) whose result asks for a reset
    pulse."""
    _check_shots(shots)
    p = _Program(table, qubit, "readout: per-shot I/Q of |0> and |1>")
    top = p.label("shot")
    p.emit(f"        set r2, {shots}", f"{top}:")
    for state in (0, 1):
        p.emit(f"; prepare |{state}>")
        if state:
            p.play(p.cal.pi_amplitude)
        p.acquire()
        zero, nxt = p.label("z"), p.label("n")
        p.emit(f"        call {IQ_CALL}(r1:1) -> r3", f"        beq r3, 0, {zero}",
               f"        sync {p.slack}")
        p.play(p.cal.pi_amplitude)
        p.emit(f"        jmp {nxt}", f"{zero}:  sync {p.slack}", f"{nxt}:")
    p.emit(f"        loop r2, {top}", "        end")
    return p.text()


def measure_iq_shots(qsc: QSC | ProgramRunner, table: CalibrationTable, qubit: int,
                     shots: int, *, ppu: int = 0, trace: bool = False) -> IQShots:
    """``shots`` shots of |0> and of |1> (the table's pi pulse), alternating, and the I/Q
    point of each shot's readout window: read from the IQ registers
    (:meth:`~openqlink.qsc.QSC.read_iq`) or, with ``trace``, demodulated here
    (:func:`demodulate`) from the window's raw ADC trace (:meth:`~openqlink.qsc.QSC.
    capture_trace`, :meth:`~openqlink.qsc.QSC.read_trace`). After each readout the host
    answers the PPU's HOST_CALL with the reset decision: a pi pulse when the point lies
    nearer the mean of the |1> shots so far than of the |0> shots (before both exist: when
    the shot prepared |1>), so that the decision does not depend on a readout not yet
    calibrated. Raises :class:`CalibrationRunError` when a window's data are missing."""
    from .dispatch import FunctionTable, TypeDesc

    runner = runner_for(qsc, ppu)
    runner.check_table(table)
    cal = table.qubit(qubit)
    dev = runner.qsc
    channel = cal.readout_channel
    fw = table.freq_word(cal.readout_if_hz)
    pw = phase_word(cal.readout_phase_rad)
    runner.setup()
    points: dict[int, list[complex]] = {0: [], 1: []}
    traces: dict[int, list[np.ndarray]] = {0: [], 1: []}
    registers: dict[int, list[complex]] = {0: [], 1: []}
    last_count = [dev.window_count(ppu, channel)]

    def arm() -> None:
        dev.capture_trace(ppu, channel)

    failures: list[BaseException] = []

    def handler(bits: list[int]) -> int:
        try:
            return shot()
        except BaseException as exc:      # raised again by the run loop
            failures.append(exc)
            raise

    def shot() -> int:
        state = (len(points[0]) + len(points[1])) % 2
        if trace:
            st = dev.trace_status(ppu)
            if not st.done or st.full:
                raise CalibrationRunError(f"readout of qubit {qubit}: the raw trace of shot "
                                          f"{len(points[state])} is not complete ({st})")
            samples = dev.read_trace(ppu)
            traces[state].append(samples)
            z = demodulate(samples, fw, pw)
            arm()
        i, q, count = dev.read_iq(ppu, channel)
        if count == last_count[0]:
            raise CalibrationRunError(f"readout of qubit {qubit}: no new window on "
                                      f"readout channel {channel} (WINDOW_COUNT {count})")
        last_count[0] = count
        registers[state].append(complex(i, q))
        if not trace:
            z = complex(i, q)
        points[state].append(z)
        if points[0] and points[1]:
            m0, m1 = np.mean(points[0]), np.mean(points[1])
            return int(abs(z - m1) < abs(z - m0))
        return state

    functions = FunctionTable()
    functions.host_call(IQ_CALL, args=[TypeDesc.bits(1)], results=[TypeDesc.uint8()])(handler)
    if trace:
        arm()
    runner.run(iq_program(table, qubit, shots), f"<readout of qubit {qubit}>", functions,
               failures)
    if len(points[0]) != shots or len(points[1]) != shots:
        raise CalibrationRunError(f"readout of qubit {qubit}: {len(points[0])} and "
                                  f"{len(points[1])} shots came back, not {shots} each")
    return IQShots({s: np.array(v, dtype=complex) for s, v in points.items()},
                   cal.readout_phase_rad, "trace" if trace else "iq",
                   traces if trace else {},
                   {s: np.array(v, dtype=complex) for s, v in registers.items()}
                   if trace else {})


# --- fits -------------------------------------------------------------------------------------

def _curvature_sigma(sse: Callable[[float], float], x: float, h: float, n: int,
                     p: int) -> float:
    """``sqrt(2 s^2 / SSE''(x))``, ``s^2 = SSE(x) / (n - p)``; inf when not a minimum."""
    f0 = sse(x)
    d2 = (sse(x + h) - 2 * f0 + sse(x - h)) / (h * h)
    if n <= p or d2 <= 0:
        return math.inf
    s2 = f0 / (n - p)
    return math.sqrt(2 * s2 / d2) if s2 > 0 else 0.0


def _grid_min(sse: Callable[[float], float], lo: float, hi: float,
              points: int = 400, rounds: int = 3) -> float:
    xs = np.linspace(lo, hi, points)
    for _ in range(rounds):
        vals = np.array([sse(float(x)) for x in xs])
        k = int(np.argmin(vals))
        step = xs[1] - xs[0]
        best = float(xs[k])
        xs = np.linspace(max(lo, best - 2 * step), min(hi, best + 2 * step), 81)
    return best


@dataclass
class RabiFit:
    """``P(1) = contrast * sin^2(pi a / (2 pi_amplitude)) + offset``, fitted: the pi amplitude
    (fraction of full scale) with its standard error, the contrast and the offset."""

    pi_amplitude: float
    pi_amplitude_err: float
    contrast: float
    offset: float

    def __call__(self, a: np.ndarray | float) -> np.ndarray:
        """The fitted P(1) at amplitude(s) ``a``."""
        return self.contrast * np.sin(np.pi * np.asarray(a) / (2 * self.pi_amplitude)) ** 2 \
            + self.offset


def fit_rabi(amplitudes: Sequence[float] | np.ndarray,
             p1: Sequence[float] | np.ndarray) -> RabiFit:
    """Fit ``P(1) = A sin^2(pi a / (2 a_pi)) + B`` to ``p1`` against ``amplitudes`` (both shape
    ``(n,)``, n >= 4): linear least squares in ``A``, ``B`` for each ``a_pi`` of a grid from
    the sweep's smallest step to twice its largest amplitude (refined), ``A > 0``. Raises
    :class:`CalibrationError` for too few or unequal points."""
    a = np.asarray(amplitudes, dtype=float)
    y = np.asarray(p1, dtype=float)
    if a.shape != y.shape or a.ndim != 1 or a.size < 4:
        raise CalibrationError(f"a Rabi fit needs >= 4 amplitudes and as many P(1) values, not "
                               f"{a.shape} and {y.shape}")
    steps = np.diff(np.unique(a))
    lo = max(float(steps.min()) if steps.size else 0.01, 1e-3)
    hi = 2 * float(np.max(np.abs(a)))

    def solve(api: float) -> tuple[float, float, float]:
        x = 0.5 * (1 - np.cos(np.pi * a / api))      # sin^2(pi a / (2 api))
        m = np.stack([x, np.ones_like(x)], axis=1)
        (amp, off), *_ = np.linalg.lstsq(m, y, rcond=None)
        if amp <= 0:
            return math.inf, amp, off
        r = y - m @ np.array([amp, off])
        return float(r @ r), float(amp), float(off)

    best = _grid_min(lambda v: solve(v)[0], lo, hi)
    _, amp, off = solve(best)
    err = _curvature_sigma(lambda v: solve(v)[0], best, best * 1e-3, a.size, 3)
    return RabiFit(best, err, amp, off)


@dataclass
class FringeFit:
    """``P(1) = offset + amplitude cos(2 pi frequency_hz tau + phase_rad)``, fitted: the fringe
    frequency (Hz, >= 0) with its standard error."""

    frequency_hz: float
    frequency_err_hz: float
    amplitude: float
    phase_rad: float
    offset: float

    def __call__(self, tau_ns: np.ndarray | float) -> np.ndarray:
        """The fitted P(1) at delay(s) ``tau_ns``."""
        return self.offset + self.amplitude * np.cos(
            _TWO_PI * self.frequency_hz * np.asarray(tau_ns) * 1e-9 + self.phase_rad)


def fit_fringe(delays_ns: Sequence[float] | np.ndarray, p1: Sequence[float] | np.ndarray,
               max_frequency_hz: float | None = None) -> FringeFit:
    """Fit ``P(1) = B + C cos(2 pi f tau) + S sin(2 pi f tau)`` to ``p1`` against
    ``delays_ns`` (shape ``(n,)``, n >= 5): linear least squares in ``B, C, S`` for each ``f``
    of a grid up to ``max_frequency_hz`` (default: the Nyquist frequency of the sweep's
    smallest step), refined around the best. Raises :class:`CalibrationError` for too few or
    unequal points."""
    t = np.asarray(delays_ns, dtype=float) * 1e-9
    y = np.asarray(p1, dtype=float)
    if t.shape != y.shape or t.ndim != 1 or t.size < 5:
        raise CalibrationError(f"a fringe fit needs >= 5 delays and as many P(1) values, not "
                               f"{t.shape} and {y.shape}")
    steps = np.diff(np.unique(t))
    fmax = max_frequency_hz or 0.5 / float(steps.min())
    span = float(t.max() - t.min())
    fmin = 0.25 / span if span > 0 else 0.0

    def solve(f: float) -> tuple[float, np.ndarray]:
        m = np.stack([np.ones_like(t), np.cos(_TWO_PI * f * t), np.sin(_TWO_PI * f * t)],
                     axis=1)
        coef, *_ = np.linalg.lstsq(m, y, rcond=None)
        r = y - m @ coef
        return float(r @ r), coef

    best = _grid_min(lambda f: solve(f)[0], fmin, fmax, points=max(400, 8 * t.size))
    _, (b, c, s) = solve(best)
    err = _curvature_sigma(lambda f: solve(f)[0], best, max(best * 1e-3, 1.0), t.size, 4)
    return FringeFit(best, err, float(math.hypot(c, s)), float(math.atan2(-s, c)), float(b))


def resolve_detuning(f_plus_hz: float, f_minus_hz: float, delta_hz: float) -> float:
    """The qubit's offset ``d = f_q - f_nco`` from the fringe frequencies ``f_plus_hz =
    |d - delta|`` (NCO at ``f_nco + delta``) and ``f_minus_hz = |d + delta|`` (NCO at
    ``f_nco - delta``): of the candidates ``delta +- f_plus`` and ``-delta +- f_minus``, the
    mean of the pair that agrees best."""
    plus = (delta_hz + f_plus_hz, delta_hz - f_plus_hz)
    minus = (-delta_hz + f_minus_hz, -delta_hz - f_minus_hz)
    a, b = min(((x, y) for x in plus for y in minus), key=lambda p: abs(p[0] - p[1]))
    return 0.5 * (a + b)


def _effective_phase(phase_rad: float) -> float:
    """The angle the gateware's demodulator applies for ``phase_rad``: the phase field's top
    10 bits index its 1024-entry table."""
    return (phase_word(phase_rad) >> 6) * _TWO_PI / 1024


def fit_readout(points0: np.ndarray, points1: np.ndarray, phase_used_rad: float = 0.0
                ) -> dict[str, Any]:
    """The readout's IQ rotation and threshold from the I/Q points of shots prepared in |0>
    and |1> (complex arrays, measured with the acquire phase ``phase_used_rad``).

    Two clusters (k-means in the IQ plane, started at the two sets' means; each cluster named
    by the state whose shots it mostly holds) give the centers ``c0``, ``c1``; the new phase
    is ``phase_used_rad + arg(c1 - c0)`` (the demodulator rotates by ``-phase``, so |1> then
    lies on +I of |0>), the threshold the midpoint of the two centers projected on I with the
    angle the gateware applies. Returns ``phase_rad``, ``phase_err_rad``, ``threshold``
    (float, integral units), ``threshold_err``, ``center0``, ``center1`` (complex, as
    measured), ``rotation_rad`` (applied to the measured points to give the new I),
    ``p1_given_0``, ``p0_given_1``, ``fidelity`` (``1 - (P(1|0) + P(0|1)) / 2``). Raises
    :class:`CalibrationError` when a set is empty or the two states cannot be told apart."""
    z0 = np.asarray(points0, dtype=complex)
    z1 = np.asarray(points1, dtype=complex)
    if z0.size < 2 or z1.size < 2:
        raise CalibrationError("a readout fit needs >= 2 shots of each state")
    allz = np.concatenate([z0, z1])
    c = np.array([z0.mean(), z1.mean()])
    if c[0] == c[1]:
        raise CalibrationError("the |0> and |1> shots have the same mean I/Q point: the "
                               "readout does not tell the states apart")
    labels = np.zeros(allz.size, dtype=int)
    for _ in range(50):
        new = (np.abs(allz - c[1]) < np.abs(allz - c[0])).astype(int)
        c = np.array([allz[new == k].mean() if np.any(new == k) else c[k] for k in (0, 1)])
        if np.array_equal(new, labels):
            break
        labels = new
    # Name the clusters by the prepared state most of their shots had.
    lab0, lab1 = labels[:z0.size], labels[z0.size:]
    if np.mean(lab0 == 1) + np.mean(lab1 == 0) > 1:
        c = c[::-1]
        labels = 1 - labels
    delta = cmath.phase(c[1] - c[0])
    phase = (phase_used_rad + delta) % _TWO_PI
    rotation = _effective_phase(phase) - _effective_phase(phase_used_rad)
    proj = np.real(allz * np.exp(-1j * rotation))
    u0, u1 = (float(np.real(cc * np.exp(-1j * rotation))) for cc in c)
    threshold = 0.5 * (u0 + u1)
    sep = abs(c[1] - c[0])
    spread = [allz[labels == k] for k in (0, 1)]
    perp = [np.imag((s - cc) * np.exp(-1j * delta)) for s, cc in zip(spread, c, strict=True)]
    along = [np.real((s - cc) * np.exp(-1j * delta)) for s, cc in zip(spread, c, strict=True)]

    def var_of_mean(v: np.ndarray) -> float:
        return float(np.var(v, ddof=1) / v.size) if v.size > 1 else 0.0

    phase_err = math.sqrt(sum(var_of_mean(v) for v in perp)) / sep
    threshold_err = 0.5 * math.sqrt(sum(var_of_mean(v) for v in along))
    p0 = proj[:z0.size]
    p1 = proj[z0.size:]
    e10 = float(np.mean(p0 > threshold))
    e01 = float(np.mean(p1 <= threshold))
    return {"phase_rad": float(phase), "phase_err_rad": float(phase_err),
            "threshold": float(threshold), "threshold_err": float(threshold_err),
            "center0": complex(c[0]),
            "center1": complex(c[1]), "rotation_rad": rotation, "p1_given_0": e10,
            "p0_given_1": e01, "fidelity": 1 - 0.5 * (e10 + e01)}


# --- results ----------------------------------------------------------------------------------

def _figure(ncols: int, width: float = 6.0) -> tuple[Any, list[Any]]:
    from .plot import _import_pyplot_free

    Figure, FigureCanvasAgg = _import_pyplot_free()
    fig = Figure(figsize=(width * ncols, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, k + 1) for k in range(ncols)]
    return fig, axes


def _save(fig: Any, path: str | Path) -> Path:
    from .plot import check_path, save_figure

    check_path(path)
    return save_figure(fig, path)


@dataclass
class ReadoutResult:
    """The readout calibration of one qubit: the per-shot I/Q points (:class:`IQShots`), the
    fit (:func:`fit_readout`'s keys as attributes) and the values for the table:
    ``phase_rad`` (``readout_phase_rad``) and ``threshold`` (``readout_threshold``, rounded
    to an integer of the gateware's integral units), each with its standard error."""

    qubit: int
    shots: IQShots
    phase_rad: float
    phase_err_rad: float
    threshold: float
    threshold_err: float
    center0: complex
    center1: complex
    rotation_rad: float
    p1_given_0: float
    p0_given_1: float
    fidelity: float

    name = "readout"

    def projected(self) -> dict[int, np.ndarray]:
        """Each state's shots projected on I with the new phase (the integral ACQUIRE
        thresholds), in integral units: ``{state: (shots,)}``."""
        return {s: np.real(z * np.exp(-1j * self.rotation_rad))
                for s, z in self.shots.points.items()}

    def histogram(self, bins: int = 40) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Histograms of :meth:`projected` on common bins: ``(edges, {state: counts})``."""
        return self.shots.histogram(self.rotation_rad, bins)

    def apply(self, table: CalibrationTable) -> CalibrationTable:
        """Write ``readout_phase_rad`` and ``readout_threshold`` of the qubit into ``table``
        (in place); returns it."""
        cal = table.qubit(self.qubit)
        cal.readout_phase_rad = float(self.phase_rad)
        cal.readout_threshold = int(round(self.threshold))
        cal.check(f"qubit {self.qubit}")
        return table

    def summary(self) -> str:
        """One line: the new phase and threshold with their errors, and the fidelity."""
        return (f"qubit {self.qubit} readout: phase {self.phase_rad:.4f} +- "
                f"{self.phase_err_rad:.4f} rad, threshold {self.threshold:.0f} +- "
                f"{self.threshold_err:.0f}, assignment fidelity {self.fidelity:.4f} "
                f"({self.shots.source}, {self.shots.points[0].size} shots per state)")

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-safe data (complex numbers as ``[re, im]``)."""
        def pair(z: complex) -> list[float]:
            return [float(z.real), float(z.imag)]
        return {"experiment": self.name, "qubit": self.qubit, "source": self.shots.source,
                "phase_rad": self.phase_rad, "phase_err_rad": self.phase_err_rad,
                "threshold": self.threshold, "threshold_err": self.threshold_err,
                "center0": pair(self.center0), "center1": pair(self.center1),
                "fidelity": self.fidelity, "p1_given_0": self.p1_given_0,
                "p0_given_1": self.p0_given_1,
                "points": {str(s): [pair(z) for z in v] for s, v in self.shots.points.items()}}

    def plot(self, path: str | Path) -> Path:
        """Draw the I/Q points of both states with their centers, and the histograms of the
        projected I with the threshold, to ``path`` (png, svg or pdf). Needs matplotlib."""
        fig, (ax_iq, ax_h) = _figure(2)
        for s, color in ((0, "tab:blue"), (1, "tab:red")):
            z = self.shots.points[s]
            ax_iq.scatter(z.real, z.imag, s=10, alpha=0.6, color=color, label=f"|{s}>")
        for cc in (self.center0, self.center1):
            ax_iq.plot([cc.real], [cc.imag], "k+", markersize=14)
        ax_iq.set_aspect("equal", adjustable="datalim")
        ax_iq.set_xlabel("I (integral units)")
        ax_iq.set_ylabel("Q (integral units)")
        ax_iq.set_title(f"qubit {self.qubit}: shots at phase {self.shots.phase_rad:.3f} rad")
        ax_iq.legend()
        edges, counts = self.histogram()
        for s, color in ((0, "tab:blue"), (1, "tab:red")):
            ax_h.stairs(counts[s], edges, color=color, label=f"|{s}>", fill=True, alpha=0.5)
        ax_h.axvline(self.threshold, color="k", linestyle="--",
                     label=f"threshold {self.threshold:.0f}")
        ax_h.set_xlabel(f"I at phase {self.phase_rad:.3f} rad (integral units)")
        ax_h.set_ylabel("shots")
        ax_h.set_title(f"assignment fidelity {self.fidelity:.3f}")
        ax_h.legend()
        return _save(fig, path)


@dataclass
class RabiResult:
    """The Rabi amplitude sweep of one qubit: ``amplitudes`` (fractions of full scale, shape
    ``(n,)``), the device's :class:`ShotCounts`, and the :class:`RabiFit` whose
    ``pi_amplitude`` goes into the table."""

    qubit: int
    amplitudes: np.ndarray
    counts: ShotCounts
    fit: RabiFit

    name = "rabi"

    @property
    def pi_amplitude(self) -> float:
        return self.fit.pi_amplitude

    @property
    def pi_amplitude_err(self) -> float:
        return self.fit.pi_amplitude_err

    def apply(self, table: CalibrationTable) -> CalibrationTable:
        """Write ``pi_amplitude`` of the qubit into ``table`` (in place); returns it. Raises
        :class:`CalibrationError` when the fitted amplitude is above full scale."""
        cal = table.qubit(self.qubit)
        if not 0 < self.pi_amplitude <= 1:
            raise CalibrationError(f"qubit {self.qubit}: the fitted pi_amplitude "
                                   f"{self.pi_amplitude:.4f} is outside (0, 1] of full scale "
                                   "(a longer pulse would be needed)")
        cal.pi_amplitude = float(self.pi_amplitude)
        return table

    def summary(self) -> str:
        return (f"qubit {self.qubit} rabi: pi_amplitude {self.pi_amplitude:.4f} +- "
                f"{self.pi_amplitude_err:.4f}, contrast {self.fit.contrast:.3f}, offset "
                f"{self.fit.offset:.3f} ({self.counts.shots} shots x "
                f"{self.amplitudes.size} amplitudes)")

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.name, "qubit": self.qubit,
                "amplitudes": self.amplitudes.tolist(), "ones": self.counts.ones.tolist(),
                "shots": self.counts.shots, "pi_amplitude": self.pi_amplitude,
                "pi_amplitude_err": self.pi_amplitude_err, "contrast": self.fit.contrast,
                "offset": self.fit.offset}

    def plot(self, path: str | Path) -> Path:
        """Draw P(1) against the amplitude with its errors and the fit to ``path``."""
        fig, (ax,) = _figure(1)
        ax.errorbar(self.amplitudes, self.counts.p1, self.counts.p1_err, fmt="o",
                    label="measured")
        fine = np.linspace(0, float(self.amplitudes.max()), 400)
        ax.plot(fine, self.fit(fine), label="fit")
        ax.axvline(self.pi_amplitude, color="k", linestyle="--",
                   label=f"pi amplitude {self.pi_amplitude:.4f}")
        ax.set_xlabel("drive amplitude (full scale)")
        ax.set_ylabel("P(1)")
        ax.set_title(f"qubit {self.qubit}: Rabi")
        ax.legend()
        return _save(fig, path)


@dataclass
class RamseyResult:
    """The Ramsey experiment of one qubit: ``delays_ns`` (shape ``(n,)``) between the two pi/2
    pulses, the counts with the NCO at ``nco_hz + detuning_hz`` (``plus``) and at
    ``nco_hz - detuning_hz`` (``minus``), their :class:`FringeFit`\\ s, and the qubit's
    frequency in the drive's frame, ``drive_if_hz``, with its standard error."""

    qubit: int
    delays_ns: np.ndarray
    detuning_hz: float
    nco_hz: float
    plus: ShotCounts
    minus: ShotCounts
    fit_plus: FringeFit
    fit_minus: FringeFit
    drive_if_hz: float
    drive_if_err_hz: float

    name = "ramsey"

    def apply(self, table: CalibrationTable) -> CalibrationTable:
        """Write ``drive_if_hz`` of the qubit into ``table`` (in place); returns it."""
        cal = table.qubit(self.qubit)
        table.freq_word(self.drive_if_hz)          # below Nyquist, or CalibrationError
        cal.drive_if_hz = float(self.drive_if_hz)
        return table

    def summary(self) -> str:
        return (f"qubit {self.qubit} ramsey: drive_if_hz {self.drive_if_hz:.0f} +- "
                f"{self.drive_if_err_hz:.0f} Hz (was {self.nco_hz:.0f}; fringes "
                f"{self.fit_plus.frequency_hz:.0f} and {self.fit_minus.frequency_hz:.0f} Hz "
                f"at detunings +-{self.detuning_hz:.0f} Hz)")

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.name, "qubit": self.qubit,
                "delays_ns": self.delays_ns.tolist(), "detuning_hz": self.detuning_hz,
                "nco_hz": self.nco_hz, "ones_plus": self.plus.ones.tolist(),
                "ones_minus": self.minus.ones.tolist(), "shots": self.plus.shots,
                "fringe_plus_hz": self.fit_plus.frequency_hz,
                "fringe_minus_hz": self.fit_minus.frequency_hz,
                "drive_if_hz": self.drive_if_hz, "drive_if_err_hz": self.drive_if_err_hz}

    def plot(self, path: str | Path) -> Path:
        """Draw both fringes with their errors and fits to ``path``."""
        fig, axes = _figure(2)
        fine = np.linspace(0, float(self.delays_ns.max()), 400)
        for ax, counts, fit, sign in ((axes[0], self.plus, self.fit_plus, "+"),
                                      (axes[1], self.minus, self.fit_minus, "-")):
            ax.errorbar(self.delays_ns, counts.p1, counts.p1_err, fmt="o", label="measured")
            ax.plot(fine, fit(fine), label=f"fit: {fit.frequency_hz / 1e3:.1f} kHz")
            ax.set_xlabel("delay between the pi/2 pulses (ns)")
            ax.set_ylabel("P(1)")
            ax.set_title(f"qubit {self.qubit}: NCO {sign}{self.detuning_hz / 1e3:g} kHz")
            ax.legend()
        return _save(fig, path)


# --- workflows --------------------------------------------------------------------------------

def calibrate_readout(qsc: QSC | ProgramRunner, table: CalibrationTable, qubit: int = 0, *,
                      ppu: int = 0, shots: int = 32, trace: bool = False) -> ReadoutResult:
    """Calibrate qubit ``qubit``'s readout: :func:`measure_iq_shots` (``shots`` per state;
    ``trace``: from raw traces) and :func:`fit_readout`. The table's pi pulse prepares |1>: an
    uncalibrated one leaves some |1> shots in |0>, which the clustering sorts out."""
    data = measure_iq_shots(qsc, table, qubit, shots, ppu=ppu, trace=trace)
    fit = fit_readout(data.points[0], data.points[1], data.phase_rad)
    return ReadoutResult(qubit, data, **fit)


def calibrate_rabi(qsc: QSC | ProgramRunner, table: CalibrationTable, qubit: int = 0, *,
                   ppu: int = 0, amplitudes: Iterable[float] = DEFAULT_AMPLITUDES,
                   shots: int = 24) -> RabiResult:
    """Sweep the drive amplitude of qubit ``qubit``'s pulse (the table's Gaussian at its
    ``drive_if_hz``), ``shots`` shots per amplitude counted on the device, and fit
    :func:`fit_rabi`."""
    amps = np.array(list(amplitudes), dtype=float)
    p = _Program(table, qubit, "")
    blocks = [f"        play {p.cal.drive_channel}, cal_pulse, amp={_amp(float(a))}, "
              f"freq={p.drive_freq}\n        wait {p.pulse_cycles}" for a in amps]
    counts = count_ones(qsc, table, qubit, blocks, shots, ppu=ppu,
                        title=f"rabi amplitude sweep of qubit {qubit}")
    return RabiResult(qubit, amps, counts, fit_rabi(amps, counts.p1))


def calibrate_ramsey(qsc: QSC | ProgramRunner, table: CalibrationTable, qubit: int = 0, *,
                     ppu: int = 0, detuning_hz: float = 1e6,
                     delays_ns: Iterable[float] = DEFAULT_DELAYS_NS,
                     shots: int = 16) -> RamseyResult:
    """Ramsey fringes of qubit ``qubit``: two pi/2 pulses (the table's pulse at half its
    ``pi_amplitude``) ``delays_ns`` apart (rounded up to whole DTD cycles), the NCO at
    ``drive_if_hz + detuning_hz`` and then at ``drive_if_hz - detuning_hz``, ``shots`` shots
    per delay counted on the device; each fringe fitted with :func:`fit_fringe` and the
    qubit's frequency resolved with :func:`resolve_detuning`. ``detuning_hz`` should exceed
    the expected error of ``drive_if_hz`` and its fringes be sampled by the delays' step."""
    cal = table.qubit(qubit)
    if not detuning_hz > 0:
        raise CalibrationError(f"detuning_hz must be > 0, not {detuning_hz!r}")
    cycles = [table.cycles(float(d)) for d in delays_ns]
    delays = np.array([c * 1e9 / table.dtd_clk_hz for c in cycles])
    results: list[ShotCounts] = []
    for sign in (1, -1):
        f = table.freq_word(cal.drive_if_hz + sign * detuning_hz)
        p = _Program(table, qubit, "")
        half = _amp(cal.pi_amplitude / 2)
        pulse = (f"        play {cal.drive_channel}, cal_pulse, amp={half}, freq={f}\n"
                 f"        wait {p.pulse_cycles}")
        blocks = [pulse + (f"\n        wait {c}" if c else "") + "\n" + pulse for c in cycles]
        results.append(count_ones(qsc, table, qubit, blocks, shots, ppu=ppu,
                                  title=f"ramsey of qubit {qubit}, NCO "
                                        f"{'+' if sign > 0 else '-'}{detuning_hz:g} Hz"))
    fmax = 0.5 / (np.min(np.diff(np.unique(delays))) * 1e-9)
    fits = [fit_fringe(delays, r.p1, fmax) for r in results]
    d = resolve_detuning(fits[0].frequency_hz, fits[1].frequency_hz, detuning_hz)
    err = 0.5 * math.hypot(fits[0].frequency_err_hz, fits[1].frequency_err_hz)
    return RamseyResult(qubit, delays, float(detuning_hz), cal.drive_if_hz, results[0],
                        results[1], fits[0], fits[1], cal.drive_if_hz + d, err)


#: The order :func:`calibrate_all` runs the workflows in: a first readout (with the table's pi
#: pulse), the pi amplitude, the drive frequency, and the readout again with the calibrated
#: pulse.
ALL_STEPS = ("readout", "rabi", "ramsey", "readout")


def calibrate_all(qsc: QSC | ProgramRunner, table: CalibrationTable,
                  qubits: Iterable[int] | None = None, *, ppu: int = 0,
                  steps: Sequence[str] = ALL_STEPS,
                  on_result: Callable[[Any], None] | None = None, **options: Any
                  ) -> list[Any]:
    """Run ``steps`` (names of :data:`WORKFLOWS`) for each of ``qubits`` (default: all of the
    table's), applying each result to ``table`` before the next step; ``on_result`` is called
    with each result as it comes. ``options`` maps a workflow name to its keyword arguments
    (``{"rabi": {"shots": 40}}``). Returns the results in order."""
    out = []
    for q in (range(len(table.qubits)) if qubits is None else qubits):
        for step in steps:
            if step not in WORKFLOWS:
                raise CalibrationError(f"unknown calibration step {step!r} (known: "
                                       f"{', '.join(WORKFLOWS)})")
            result = WORKFLOWS[step](qsc, table, q, ppu=ppu, **options.get(step, {}))
            result.apply(table)
            out.append(result)
            if on_result is not None:
                on_result(result)
    return out


#: The workflows by name.
WORKFLOWS: dict[str, Callable[..., Any]] = {
    "readout": calibrate_readout, "rabi": calibrate_rabi, "ramsey": calibrate_ramsey,
}
