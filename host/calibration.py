"""The calibration table: what a gate and a measurement are, in pulses, for each qubit.

A quantum kernel speaks of gates (``x``, ``rx``, ``cz``, ``mz``); a PPU plays envelopes on
channels. The table in between says, per qubit, which drive and readout channel it has, at
which intermediate frequency (the NCO's ``freq``) each is driven or demodulated, the drive
pulse (a Gaussian of ``pulse_length_samples``) and the amplitude that makes it a pi rotation,
and the readout's window, IQ rotation angle and threshold; per coupled pair, the coupler
channel and the amplitude of its CZ pulse. Calibration experiments (Rabi, Ramsey, readout IQ)
measure these numbers on the device and write them here; the kernel compiler reads them.

Units are SI in the names (``_hz``, ``_ns``, ``_rad``); amplitudes are fractions of the DAC's
full scale (-1..1, the assembler's ``amp=``); lengths of envelopes are PTD samples. The table
is saved as JSON (:meth:`CalibrationTable.save`, :meth:`CalibrationTable.load`) with the same
names as keys.

Conversions to instruction fields follow docs/isa.md: an NCO frequency word is
``round(f / sample_rate_hz * 2**32)`` (two's complement for a negative ``f``), a phase is turns
in units of ``2**-16`` (:func:`freq_word`, :func:`phase_word`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import QlinkError
from .memory_map import QSCParams

__all__ = [
    "CalibrationError", "QubitCalibration", "CouplerCalibration", "CalibrationTable",
    "freq_word", "phase_word",
]


class CalibrationError(QlinkError, ValueError):
    """A calibration table, or an entry of one, that cannot be used; the message names the
    qubit, coupler or key at fault."""


def freq_word(freq_hz: float, sample_rate_hz: float) -> int:
    """The 32-bit NCO frequency word of ``freq_hz`` (PLAY/ACQUIRE ``freq_word``, docs/isa.md):
    ``round(freq_hz / sample_rate_hz * 2**32)`` modulo ``2**32``. Raises
    :class:`CalibrationError` for a frequency at or beyond Nyquist (``|f| >= rate / 2``)."""
    if not math.isfinite(freq_hz) or abs(freq_hz) >= sample_rate_hz / 2:
        raise CalibrationError(f"frequency {freq_hz!r} Hz is not below the Nyquist frequency "
                               f"{sample_rate_hz / 2:g} Hz")
    return round(freq_hz / sample_rate_hz * 2**32) % 2**32


def phase_word(phase_rad: float) -> int:
    """The 16-bit phase field of ``phase_rad`` (turns in units of ``2**-16``, modulo one
    turn)."""
    if not math.isfinite(phase_rad):
        raise CalibrationError(f"phase {phase_rad!r} rad is not finite")
    return round(phase_rad / (2 * math.pi) * 2**16) % 2**16


def _check_number(where: str, name: str, value: object, *, low: float | None = None,
                  high: float | None = None, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value):
        raise CalibrationError(f"{where}: {name} must be a finite number, not {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise CalibrationError(f"{where}: {name} must be {'>' if low_open else '>='} {low:g}, "
                               f"not {value!r}")
    if high is not None and value > high:
        raise CalibrationError(f"{where}: {name} must be <= {high:g}, not {value!r}")


def _check_channel(where: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 16:
        raise CalibrationError(f"{where}: {name} must be a channel number 0..15, not {value!r}")


def _check_pulse(where: str, length_samples: object, sigma_samples: object) -> None:
    """A Gaussian pulse's length (an int >= 1) and standard deviation (> 0)."""
    if isinstance(length_samples, bool) or not isinstance(length_samples, int) or \
            length_samples < 1:
        raise CalibrationError(f"{where}: pulse_length_samples must be an int >= 1, not "
                               f"{length_samples!r}")
    _check_number(where, "pulse_sigma_samples", sigma_samples, low=0.0, low_open=True)


@dataclass
class QubitCalibration:
    """One qubit's gates in pulses.

    ``x`` is a Gaussian of ``pulse_length_samples`` samples (standard deviation
    ``pulse_sigma_samples``) at ``pi_amplitude`` on ``drive_channel`` with the NCO at
    ``drive_if_hz``; ``rx(theta)`` scales the amplitude by ``theta / pi``; ``y`` is the same
    pulse a quarter turn later in phase; ``z``-type gates are virtual (a change of the phase of
    every later pulse on the channel). ``mz`` integrates ``readout_channel`` over
    ``readout_window_ns`` demodulated at ``readout_if_hz``, rotated by ``readout_phase_rad``,
    and reads 1 when the integral exceeds ``readout_threshold`` (ADC codes summed over the
    window)."""

    drive_channel: int
    readout_channel: int
    drive_if_hz: float = 0.0
    pi_amplitude: float = 1.0
    pulse_length_samples: int = 64
    pulse_sigma_samples: float = 16.0
    readout_if_hz: float = 0.0
    readout_window_ns: float = 400.0
    readout_phase_rad: float = 0.0
    readout_threshold: int = 0

    def check(self, where: str = "qubit") -> None:
        """Raise :class:`CalibrationError` naming the first field out of range."""
        _check_channel(where, "drive_channel", self.drive_channel)
        _check_channel(where, "readout_channel", self.readout_channel)
        _check_number(where, "drive_if_hz", self.drive_if_hz)
        _check_number(where, "pi_amplitude", self.pi_amplitude, low=0.0, high=1.0,
                      low_open=True)
        _check_pulse(where, self.pulse_length_samples, self.pulse_sigma_samples)
        _check_number(where, "readout_if_hz", self.readout_if_hz)
        _check_number(where, "readout_window_ns", self.readout_window_ns, low=0.0,
                      low_open=True)
        _check_number(where, "readout_phase_rad", self.readout_phase_rad)
        if isinstance(self.readout_threshold, bool) or \
                not isinstance(self.readout_threshold, int) or \
                not -2**31 <= self.readout_threshold < 2**31:
            raise CalibrationError(f"{where}: readout_threshold must be a signed 32-bit int, "
                                   f"not {self.readout_threshold!r}")


@dataclass
class CouplerCalibration:
    """The CZ of the pair ``qubits`` (``(a, b)``, ``a < b``): a Gaussian of
    ``pulse_length_samples`` (standard deviation ``pulse_sigma_samples``) at ``cz_amplitude``
    on the coupler's ``channel``."""

    qubits: tuple[int, int]
    channel: int
    cz_amplitude: float = 1.0
    pulse_length_samples: int = 64
    pulse_sigma_samples: float = 16.0

    def check(self, where: str = "coupler") -> None:
        """Raise :class:`CalibrationError` naming the first field out of range."""
        a, b = self.qubits
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < b):
            raise CalibrationError(f"{where}: qubits must be two qubit indices a < b, not "
                                   f"{self.qubits!r}")
        _check_channel(where, "channel", self.channel)
        _check_number(where, "cz_amplitude", self.cz_amplitude, low=0.0, high=1.0,
                      low_open=True)
        _check_pulse(where, self.pulse_length_samples, self.pulse_sigma_samples)


@dataclass
class CalibrationTable:
    """The calibration of one PPU's qubits: ``qubits[q]`` for qubit ``q``, the couplers of the
    pairs that have one, and the timing of the build (``dtd_clk_hz``, ``samples_per_cycle``)
    that turns nanoseconds into cycles and frequencies into NCO words. ``sync_slack_ns`` is
    the slack a compiled program leaves after a measurement's result or a CALL before its
    next pulse (the SYNC instruction's, docs/isa.md)."""

    qubits: list[QubitCalibration]
    couplers: list[CouplerCalibration] = field(default_factory=list)
    dtd_clk_hz: int = QSCParams.dtd_clk_hz
    samples_per_cycle: int = QSCParams.samples_per_cycle
    sync_slack_ns: float = 256.0

    def __post_init__(self) -> None:
        self.check()

    # -- checks and lookups ---------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`CalibrationError` naming the first entry or key that cannot be used
        (a field out of range, two qubits on one channel, a coupler of unknown qubits)."""
        if not self.qubits:
            raise CalibrationError("a calibration table needs at least one qubit")
        for q, cal in enumerate(self.qubits):
            cal.check(f"qubit {q}")
        for cal in self.couplers:
            cal.check(f"coupler {cal.qubits}")
            if cal.qubits[1] >= len(self.qubits):
                raise CalibrationError(f"coupler {cal.qubits}: the table has qubits "
                                       f"0..{len(self.qubits) - 1}")
        drives = [c.drive_channel for c in self.qubits] + [c.channel for c in self.couplers]
        if len(set(drives)) != len(drives):
            raise CalibrationError(f"two qubits or couplers share a drive channel: {drives}")
        readouts = [c.readout_channel for c in self.qubits]
        if len(set(readouts)) != len(readouts):
            raise CalibrationError(f"two qubits share a readout channel: {readouts}")
        pairs = [c.qubits for c in self.couplers]
        if len(set(pairs)) != len(pairs):
            raise CalibrationError(f"a pair has two couplers: {pairs}")
        if self.samples_per_cycle not in (1, 2, 4):
            raise CalibrationError(f"samples_per_cycle must be 1, 2 or 4, not "
                                   f"{self.samples_per_cycle!r}")
        _check_number("table", "dtd_clk_hz", self.dtd_clk_hz, low=0.0, low_open=True)
        _check_number("table", "sync_slack_ns", self.sync_slack_ns, low=0.0)

    def qubit(self, q: int) -> QubitCalibration:
        """Qubit ``q``'s entry; :class:`CalibrationError` if the table has no qubit ``q``."""
        if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q < len(self.qubits):
            raise CalibrationError(f"no qubit {q!r} in the calibration table (it has qubits "
                                   f"0..{len(self.qubits) - 1})")
        return self.qubits[q]

    def coupler(self, a: int, b: int) -> CouplerCalibration:
        """The coupler of qubits ``a`` and ``b`` (either order); :class:`CalibrationError`
        if the pair has none."""
        pair = (min(a, b), max(a, b))
        for cal in self.couplers:
            if tuple(cal.qubits) == pair:
                return cal
        raise CalibrationError(f"no coupler between qubits {a} and {b} in the calibration "
                               f"table (pairs: {[tuple(c.qubits) for c in self.couplers]})")

    # -- units ----------------------------------------------------------------------------
    @property
    def sample_rate_hz(self) -> int:
        """PTD samples per second of each converter (``dtd_clk_hz * samples_per_cycle``)."""
        return self.dtd_clk_hz * self.samples_per_cycle

    def cycles(self, duration_ns: float) -> int:
        """``duration_ns`` in DTD cycles, rounded up (a window never shorter than asked)."""
        return max(0, math.ceil(duration_ns * self.dtd_clk_hz / 1e9 - 1e-9))

    def freq_word(self, freq_hz: float) -> int:
        """:func:`freq_word` at this build's sample rate."""
        return freq_word(freq_hz, self.sample_rate_hz)

    # -- construction and files -----------------------------------------------------------
    @classmethod
    def for_simulation(cls, qubits: int = 1, params: QSCParams | None = None,
                       **qubit_fields: Any) -> CalibrationTable:
        """The nominal table of the simulation build of ``qubits`` qubits per PPU (the
        channel map of :mod:`openqlink.sim.channel_map`: qubit ``q`` on drive ``q`` and
        readout ``q``, the coupler of ``q, q + 1`` on drive ``qubits + q``), with the default
        pulses, which are right for the simulation's default qubit model. A model with other
        frequencies, pi areas or readout phases needs the calibration experiments to find its
        values. ``qubit_fields`` override :class:`QubitCalibration` fields of every qubit."""
        params = params or QSCParams()
        unknown = set(qubit_fields) - {f.name for f in fields(QubitCalibration)}
        if unknown:
            raise CalibrationError(f"unknown qubit calibration field(s): {sorted(unknown)}")
        if isinstance(qubits, bool) or not isinstance(qubits, int) or qubits < 1:
            raise CalibrationError(f"qubits must be an int >= 1, not {qubits!r}")
        entries = [QubitCalibration(**{"drive_channel": q, "readout_channel": q,
                                       **qubit_fields}) for q in range(qubits)]
        couplers = [CouplerCalibration(qubits=(q, q + 1), channel=qubits + q)
                    for q in range(qubits - 1)]
        return cls(entries, couplers, dtd_clk_hz=params.dtd_clk_hz,
                   samples_per_cycle=params.samples_per_cycle)

    def to_dict(self) -> dict[str, Any]:
        """The table as JSON-safe data (the file format of :meth:`save`)."""
        out = asdict(self)
        for c in out["couplers"]:
            c["qubits"] = list(c["qubits"])
        return out

    @classmethod
    def from_dict(cls, data: Any) -> CalibrationTable:
        """The table of :meth:`to_dict`'s data; :class:`CalibrationError` naming an unknown
        or missing key."""
        if not isinstance(data, dict):
            raise CalibrationError(f"a calibration table is a JSON object, not "
                                   f"{type(data).__name__}")
        top = {f.name for f in fields(cls)}
        unknown = set(data) - top
        if unknown:
            raise CalibrationError(f"unknown key(s) in the calibration table: {sorted(unknown)}")

        def entries(key: str, kind: type, where: str) -> list:
            items = data.get(key, [])
            if not isinstance(items, list):
                raise CalibrationError(f"{key} must be a list, not {type(items).__name__}")
            names = {f.name for f in fields(kind)}
            out = []
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    raise CalibrationError(f"{where} {i} must be an object")
                bad = set(item) - names
                if bad:
                    raise CalibrationError(f"{where} {i}: unknown key(s) {sorted(bad)}")
                try:
                    out.append(kind(**item))
                except TypeError as e:
                    raise CalibrationError(f"{where} {i}: {e}") from None
            return out

        couplers = entries("couplers", CouplerCalibration, "coupler")
        for c in couplers:
            if not isinstance(c.qubits, list | tuple) or len(c.qubits) != 2:
                raise CalibrationError(f"coupler qubits must be a pair, not {c.qubits!r}")
            c.qubits = (c.qubits[0], c.qubits[1])
        rest = {k: v for k, v in data.items() if k not in ("qubits", "couplers")}
        return cls(entries("qubits", QubitCalibration, "qubit"), couplers, **rest)

    def save(self, path: str | Path) -> None:
        """Write the table to ``path`` as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CalibrationTable:
        """Read a table that :meth:`save` wrote; :class:`CalibrationError` naming the file
        for a file that is not JSON or not a table."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise CalibrationError(f"{path}: cannot read a calibration table: {e}") from None
        try:
            return cls.from_dict(data)
        except CalibrationError as e:
            raise CalibrationError(f"{path}: {e}") from None
