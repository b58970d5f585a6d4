"""Seeded models of the qubits behind the PTD ports of the bench (the PTD side of a PPU).

Two models live here:

* :class:`QubitModel`: one qubit driven on resonance about X by real DAC samples, and a readout
  that puts ``+/-readout_amplitude`` plus noise on a real ADC: the reference of the boards'
  on-FPGA qubit emulator (:mod:`openqlink.gateware.qubit`).
* :class:`QubitSystem`: up to five qubits with their own intermediate frequencies, complex (I/Q)
  drive channels seen in each qubit's rotating frame, T1/T2 decay, CZ-like couplers, and
  dispersive readout channels that put a tone at an intermediate frequency on the ADC. See its
  docstring for the physics, the time base and the rotating frame. This is what the bench
  puts behind each PPU (:mod:`openqlink.sim.channel_map` says which channel is which).

QubitModel
----------

The qubit is driven on resonance about X, so its state stays on the Y=0 great circle and is
fully described by the rotation angle ``theta`` from ``|0>``: ``P(1) = sin^2(theta/2)``. Each DAC
sample ``s`` (signed 16-bit, full scale 32767) rotates the qubit by
``pi * s / pi_area`` radians, so a pulse whose samples add up to ``pi_area`` is a pi pulse.

A readout window projects the qubit: the outcome is 1 with probability ``P(1)`` (drawn from a
``random.Random(seed)``, so a run is reproducible), the state collapses to ``|outcome>``, and for
the whole window the ADC carries ``+readout_amplitude`` (outcome 1) or ``-readout_amplitude``
(outcome 0) plus Gaussian noise of ``noise_sigma`` (also seeded), clipped to 16 bits. The PPU's
ACQUIRE integrates these samples and thresholds the sum.

These are models of physics, not of the gateware: nothing here does a PPU's job.
"""

from __future__ import annotations

import cmath
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "QubitModel", "Measurement", "QubitSystem", "QubitParams", "Readout", "Coupler",
    "ReadoutRecord", "FULL_SCALE", "DEFAULT_PI_AREA", "MAX_QUBITS",
]


@dataclass
class Measurement:
    """One projective measurement: the outcome and the P(1) it was drawn from."""

    outcome: int
    p1: float
    dtd_cycle: int


@dataclass
class QubitModel:
    """Seeded qubit + readout model. See the module docstring for the physics.

    Parameters
    ----------
    seed : int
        Seed of the outcome and noise generators.
    pi_area : float
        Sum of DAC samples (full scale 32767) that makes a pi rotation. The default is the area
        of the 64-sample gaussian (sigma 16) of ``firmware/active_reset.s`` at amplitude 1.0, the
        pulse that program calls its pi pulse (its calibration, in a lab's terms).
    readout_amplitude : int
        Mean ADC sample during a readout window, sign set by the outcome.
    noise_sigma : float
        Standard deviation of the ADC noise, in ADC codes.
    """

    seed: int = 1
    pi_area: float = 1_254_378
    readout_amplitude: int = 2000
    noise_sigma: float = 300.0
    theta: float = 0.0
    measurements: list[Measurement] = field(default_factory=list)

    def __post_init__(self):
        self._rng = random.Random(self.seed)
        self._outcome: int | None = None

    @property
    def p1(self) -> float:
        """Probability of measuring 1 now."""
        return math.sin(self.theta / 2) ** 2

    def drive(self, sample: int) -> None:
        """Apply one DAC sample of the drive channel."""
        self.theta = (self.theta + math.pi * sample / self.pi_area) % (2 * math.pi)

    def begin_readout(self, dtd_cycle: int) -> int:
        """Project the qubit at the start of a readout window; returns the outcome."""
        p1 = self.p1
        outcome = int(self._rng.random() < p1)
        self.theta = math.pi if outcome else 0.0
        self._outcome = outcome
        self.measurements.append(Measurement(outcome, p1, dtd_cycle))
        return outcome

    def adc_sample(self) -> int:
        """The ADC I sample during the current readout window (0 outside one)."""
        if self._outcome is None:
            return 0
        mean = self.readout_amplitude if self._outcome else -self.readout_amplitude
        value = round(mean + self._rng.gauss(0.0, self.noise_sigma))
        return max(-32768, min(32767, value))

    def end_readout(self) -> None:
        self._outcome = None


# --- QubitSystem ------------------------------------------------------------------------------

#: Full scale of a DAC code: a drive sample ``I + jQ`` in codes is ``s = (I + jQ) / FULL_SCALE``.
FULL_SCALE = 32767

#: Default ``pi_area`` (and ``cz_area``), in units of full scale: the area of the 64-sample
#: gaussian (sigma 16) of ``firmware/active_reset.s`` played at amplitude 1.0 (its DAC codes add
#: up to 1_254_378), so that the pulse that program calls its pi pulse stays one.
DEFAULT_PI_AREA = 1_254_378 / FULL_SCALE

#: Largest number of qubits a :class:`QubitSystem` holds (a 32-amplitude state vector).
MAX_QUBITS = 5

_TWO_PI = 2 * math.pi


def _finite(value: float) -> float | None:
    """``value``, or None for an infinite one (for JSON-safe descriptions)."""
    return None if math.isinf(value) else value


@dataclass(frozen=True)
class QubitParams:
    """One qubit of a :class:`QubitSystem`.

    Parameters
    ----------
    if_hz : float
        The qubit's transition frequency in the frame of the drive's NCO (``f_q - f_LO``), Hz:
        an NCO at ``if_hz`` drives it on resonance. 0 (the default) makes real, un-mixed DAC
        samples resonant, as for :class:`QubitModel`.
    t1_ns : float
        Energy relaxation time (amplitude damping), ns; ``math.inf`` for none.
    t2_ns : float
        Total dephasing (Ramsey) time, ns, at most ``2 * t1_ns``; the pure-dephasing rate is
        ``1/T_phi = 1/T2 - 1/(2 T1)``. ``math.inf`` (only with ``t1_ns`` infinite) for none.
    pi_area : float
        Magnitude of the sum of a pulse's complex samples in the qubit's rotating frame, in
        units of full scale (``FULL_SCALE`` codes), that makes a pi rotation: the Rabi
        calibration of this qubit on its drive line. Default :data:`DEFAULT_PI_AREA`.
    """

    if_hz: float = 0.0
    t1_ns: float = 50_000.0
    t2_ns: float = 40_000.0
    pi_area: float = DEFAULT_PI_AREA

    def __post_init__(self) -> None:
        if not math.isfinite(self.if_hz):
            raise ValueError(f"if_hz must be finite, not {self.if_hz!r}")
        if not self.t1_ns > 0:
            raise ValueError(f"t1_ns must be > 0 (or math.inf), not {self.t1_ns!r}")
        if not self.t2_ns > 0:
            raise ValueError(f"t2_ns must be > 0 (or math.inf), not {self.t2_ns!r}")
        if self.t2_ns > 2 * self.t1_ns * (1 + 1e-12):
            raise ValueError(f"t2_ns must be <= 2 * t1_ns ({2 * self.t1_ns!r} ns), "
                             f"not {self.t2_ns!r}")
        if not (self.pi_area > 0 and math.isfinite(self.pi_area)):
            raise ValueError(f"pi_area must be > 0 and finite, not {self.pi_area!r}")

    @property
    def tphi_ns(self) -> float:
        """Pure-dephasing time ``T_phi`` (``1/T_phi = 1/T2 - 1/(2 T1)``), ns; inf for none."""
        rate = 1 / self.t2_ns - 0.5 / self.t1_ns
        return math.inf if rate <= 0 else 1 / rate


@dataclass(frozen=True)
class Readout:
    """One readout channel of a :class:`QubitSystem`: which qubit it reads and its ADC signal.

    During a window the ADC carries ``readout_amplitude * cos(2 pi ro_if_hz t + phase) + noise``
    with ``phase = phase0_rad`` or ``phase1_rad`` for outcome 0 or 1 (the two pointer states of
    the dispersively shifted resonator) and Gaussian noise of ``noise_sigma`` codes.

    The default phases are pi apart, the pointer states of a readout resonator probed in
    reflection midway between its two dressed frequencies at the optimum ``2 chi = kappa``
    (Krantz et al., "A quantum engineer's guide to superconducting qubits", 2019, dispersive
    readout), rotated so that outcome 1 lies on +I: with ``ro_if_hz = 0`` the ADC then carries
    ``+readout_amplitude`` (1) or ``-readout_amplitude`` (0) as for :class:`QubitModel`.

    Parameters
    ----------
    qubit : int
        Index of the qubit read.
    ro_if_hz : float
        Intermediate frequency of the readout tone on the ADC, Hz (0: a DC level).
    readout_amplitude : float
        Amplitude of the tone, ADC codes.
    phase0_rad, phase1_rad : float
        Phase of the tone for outcome 0 and 1, rad (relative to ``cos(2 pi ro_if_hz t)``).
    noise_sigma : float
        Standard deviation of the ADC noise per sample, codes.
    """

    qubit: int = 0
    ro_if_hz: float = 0.0
    readout_amplitude: float = 2000.0
    phase0_rad: float = math.pi
    phase1_rad: float = 0.0
    noise_sigma: float = 300.0

    def __post_init__(self) -> None:
        for name in ("ro_if_hz", "readout_amplitude", "phase0_rad", "phase1_rad"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, not {getattr(self, name)!r}")
        if not (self.noise_sigma >= 0 and math.isfinite(self.noise_sigma)):
            raise ValueError(f"noise_sigma must be >= 0 and finite, not {self.noise_sigma!r}")


@dataclass(frozen=True)
class Coupler:
    """A tunable coupler between qubits ``a`` and ``b`` (a CZ-like gate, see
    :meth:`QubitSystem.couple`).

    Parameters
    ----------
    a, b : int
        The two qubits (neighbours on a chip; any two distinct qubits here).
    cz_area : float
        Sum of the magnitudes of the coupler's samples, in units of full scale, that gives the
        conditional phase pi on ``|11>`` (a CZ). Default :data:`DEFAULT_PI_AREA`.
    """

    a: int
    b: int
    cz_area: float = DEFAULT_PI_AREA

    def __post_init__(self) -> None:
        if not (self.cz_area > 0 and math.isfinite(self.cz_area)):
            raise ValueError(f"cz_area must be > 0 and finite, not {self.cz_area!r}")


@dataclass
class ReadoutRecord:
    """One projective measurement of a :class:`QubitSystem`: the readout channel, the qubit,
    the outcome, the P(1) it was drawn from and the sample index of the projection."""

    channel: int
    qubit: int
    outcome: int
    p1: float
    sample: int


class QubitSystem:
    """A seeded model of up to five qubits behind the PTD ports: I/Q drive, couplers, decay,
    dispersive readout.

    **State.** A state vector of ``2**N`` complex amplitudes (qubit ``q`` is bit ``q`` of the
    index), with decay unravelled into seeded quantum-jump (Monte Carlo wave-function)
    trajectories (Dalibard, Castin and Molmer, "Wave-function approach to dissipative processes
    in quantum optics", PRL 68, 580, 1992; Plenio and Knight, RMP 70, 101, 1998). A state
    vector rather than a density matrix because the bench wants single shots anyway (a
    trajectory collapses like a real qubit does, and the average over shots is the density
    matrix of the Lindblad equation), and because a one-qubit gate costs 16 pair updates on 32
    amplitudes against 512 on a 32 x 32 density matrix, in pure Python, on every driven sample.

    **Time base.** Time is the PTD sample index ``n`` (an int), ``t = n / sample_rate_hz``.
    Every event (a drive sample, a coupler sample, the start of a readout) acts at once at its
    ``t``; between events the qubits decay. Each qubit keeps its own clock: the events that
    touch one qubit must come in non-decreasing ``n`` (``ValueError`` otherwise), events on
    different qubits may come in any order (they commute), and events with the same ``n``
    apply in call order. :meth:`advance_to` brings every qubit to ``n``.

    **Drive and rotating frame.** Drive channel ``c`` drives qubit ``drives[c]``. Its sample
    ``n`` is ``s = (I + jQ) / FULL_SCALE``, the NCO mixer's output
    ``I + jQ = env * amp * exp(j (2 pi f_nco t + phi))``. In the frame of the qubit, rotating at
    its ``if_hz``, the drive is ``Omega_n = k * s * exp(-j 2 pi if_hz t)`` with
    ``k = pi / pi_area``, and sample ``n`` rotates the qubit by the angle ``|Omega_n|`` about
    the Bloch axis ``(cos arg Omega_n, sin arg Omega_n, 0)``:
    ``U_n = exp(-j |Omega_n| / 2 (cos arg Omega_n X + sin arg Omega_n Y))`` (the rotating-wave
    drive of Krantz et al., "A quantum engineer's guide to superconducting qubits", 2019:
    I drives X, Q drives Y; the rotation operators of Nielsen and Chuang, ch. 4). A pulse whose
    rotating-frame samples add up to ``pi_area`` in magnitude, with a constant phase, is thus a
    pi rotation. An NCO at ``if_hz`` gives a fixed axis (Rabi); an NCO at ``if_hz + df`` turns
    the axis by ``2 pi df`` per second, so two pi/2 pulses ``tau`` apart give
    ``P(1) = (1 + cos(2 pi df tau + ...)) / 2``: Ramsey fringes at ``df``. The samples of a
    channel keep their absolute time: the NCO is phase continuous, as the gateware's is.

    **Couplers.** Coupler channel ``c`` sits between qubits ``couplers[c].a`` and ``.b``; each
    of its samples ``s`` (real or complex, in codes) adds the phase
    ``pi * |s| / (cz_area * FULL_SCALE)`` to every amplitude with both bits set: a pulse of
    area ``cz_area`` is ``diag(1, 1, 1, -1)``, a CZ (the adiabatic ``|11>``-``|20>`` CZ of
    DiCarlo et al., Nature 460, 240, 2009, with its single-qubit phases taken as corrected).

    **Decay.** Per qubit, amplitude damping with ``T1`` and pure dephasing with
    ``T_phi`` (``1/T2 = 1/(2 T1) + 1/T_phi``), the two commuting channels of Nielsen and Chuang,
    ch. 8. Over an interval ``dt`` the amplitude damping channel (Kraus operators
    ``K0 = diag(1, sqrt(1 - p))``, ``K1 = sqrt(p) |0><1|``, ``p = 1 - exp(-dt/T1)``) is
    unravelled exactly: a jump ``K1`` with probability ``p * P(1)``, else ``K0``, renormalised;
    pure dephasing as a ``Z`` with probability ``(1 - exp(-dt/T_phi)) / 2``. Both compose
    exactly over any interval, so an idle stretch costs one step however long it is. The
    consecutive drive samples of a qubit are folded into one SU(2) matrix and applied, then the
    decay of the stretch they span, once a stretch reaches ``trotter_fraction * min(T1,
    T_phi)`` (a first-order Lie-Trotter split: the error in a rotation is of the order of
    ``trotter_fraction`` times its angle) or when another event needs the qubit. Coupler
    samples fold the same way (a sum of phases).

    **Readout.** Readout channel ``c`` reads qubit ``readouts[c].qubit``.
    :meth:`begin_readout` projects that qubit (outcome 1 with its marginal ``P(1)``, drawn
    from the channel's seeded generator; the state collapses) and opens a window;
    :meth:`adc_sample` gives the ADC code of any sample while it is open:
    ``round(A cos(2 pi ro_if_hz t + phase_outcome) + noise)``, saturated to 16 bits (0 when no
    window is open); :meth:`end_readout` closes it. The signal keeps the outcome for the whole
    window (the qubit keeps evolving and decaying; it does not flip the signal).

    **Seeds.** Each qubit's jumps, each readout channel's outcomes and each readout channel's
    noise come from their own ``random.Random`` seeded from ``seed`` and their name, so that
    the same seed and the same calls give the same outcomes and ADC codes, and a channel's
    noise does not depend on the calls made on another channel.

    Parameters
    ----------
    qubits : sequence of QubitParams, or int
        The qubits (1 to ``MAX_QUBITS``), or how many of them with default parameters.
    sample_rate_hz : float
        PTD samples per second (DAC and ADC): the DTD clock times the samples per cycle.
    drives : sequence of int, optional
        ``drives[c]``: the qubit that drive channel ``c`` drives. Default: channel ``q`` drives
        qubit ``q``, one per qubit.
    readouts : sequence of Readout, optional
        ``readouts[c]``: readout channel ``c``. Default: ``Readout(qubit=q)`` for each qubit.
    couplers : sequence of Coupler
        ``couplers[c]``: coupler channel ``c``. Default: none.
    seed : int
        Seed of every generator of the model.
    trotter_fraction : float
        Longest stretch of driving folded into one rotation before its decay is applied, as a
        fraction of the qubit's ``min(T1, T_phi)`` (at least one sample).

    Attributes
    ----------
    measurements : list of ReadoutRecord
        Every projection, in order.
    """

    def __init__(self, qubits: Sequence[QubitParams] | int = 1, *, sample_rate_hz: float,
                 drives: Sequence[int] | None = None, readouts: Sequence[Readout] | None = None,
                 couplers: Sequence[Coupler] = (), seed: int = 1,
                 trotter_fraction: float = 1e-3) -> None:
        if isinstance(qubits, int):
            if not 1 <= qubits <= MAX_QUBITS:
                raise ValueError(f"qubits must be 1..{MAX_QUBITS} qubits, not {qubits}")
            qubits = [QubitParams() for _ in range(qubits)]
        qubits = tuple(qubits)
        if not 1 <= len(qubits) <= MAX_QUBITS:
            raise ValueError(f"qubits must be 1..{MAX_QUBITS} qubits, not {len(qubits)}")
        for q, params in enumerate(qubits):
            if not isinstance(params, QubitParams):
                raise ValueError(f"qubits[{q}] must be a QubitParams, not {params!r}")
        if not (sample_rate_hz > 0 and math.isfinite(sample_rate_hz)):
            raise ValueError(f"sample_rate_hz must be > 0 and finite, not {sample_rate_hz!r}")
        for q, params in enumerate(qubits):
            if abs(params.if_hz) > sample_rate_hz / 2:
                raise ValueError(f"qubits[{q}].if_hz ({params.if_hz!r}) must be within "
                                 f"+/- sample_rate_hz / 2 ({sample_rate_hz / 2!r})")
        if not (trotter_fraction > 0 and math.isfinite(trotter_fraction)):
            raise ValueError(f"trotter_fraction must be > 0 and finite, not {trotter_fraction!r}")
        nq = len(qubits)
        drives = tuple(range(nq)) if drives is None else tuple(drives)
        for c, q in enumerate(drives):
            if not (isinstance(q, int) and 0 <= q < nq):
                raise ValueError(f"drives[{c}] must be a qubit index in 0..{nq - 1}, not {q!r}")
        readouts = tuple(Readout(qubit=q) for q in range(nq)) if readouts is None \
            else tuple(readouts)
        for c, ro in enumerate(readouts):
            if not isinstance(ro, Readout):
                raise ValueError(f"readouts[{c}] must be a Readout, not {ro!r}")
            if not (isinstance(ro.qubit, int) and 0 <= ro.qubit < nq):
                raise ValueError(f"readouts[{c}].qubit must be a qubit index in 0..{nq - 1}, "
                                 f"not {ro.qubit!r}")
            if abs(ro.ro_if_hz) > sample_rate_hz / 2:
                raise ValueError(f"readouts[{c}].ro_if_hz ({ro.ro_if_hz!r}) must be within "
                                 f"+/- sample_rate_hz / 2 ({sample_rate_hz / 2!r})")
        couplers = tuple(couplers)
        pairs_seen: set[frozenset[int]] = set()
        for c, cp in enumerate(couplers):
            if not isinstance(cp, Coupler):
                raise ValueError(f"couplers[{c}] must be a Coupler, not {cp!r}")
            for name in ("a", "b"):
                q = getattr(cp, name)
                if not (isinstance(q, int) and 0 <= q < nq):
                    raise ValueError(f"couplers[{c}].{name} must be a qubit index in "
                                     f"0..{nq - 1}, not {q!r}")
            if cp.a == cp.b:
                raise ValueError(f"couplers[{c}] must join two different qubits, not {cp.a} "
                                 f"and {cp.b}")
            if frozenset((cp.a, cp.b)) in pairs_seen:
                raise ValueError(f"couplers[{c}] joins qubits {cp.a} and {cp.b} again")
            pairs_seen.add(frozenset((cp.a, cp.b)))

        self.qubits: tuple[QubitParams, ...] = qubits
        self.sample_rate_hz = float(sample_rate_hz)
        self.drives: tuple[int, ...] = drives
        self.readouts: tuple[Readout, ...] = readouts
        self.couplers: tuple[Coupler, ...] = couplers
        self.seed = seed
        self.trotter_fraction = trotter_fraction
        self.measurements: list[ReadoutRecord] = []

        dim = 1 << nq
        self._nq = nq
        self._psi: list[complex] = [1 + 0j] + [0j] * (dim - 1)
        ns_per_sample = 1e9 / self.sample_rate_hz
        #: Per qubit: (index with bit q clear, index with bit q set) pairs, and the set ones.
        self._pairs = [[(i, i | 1 << q) for i in range(dim) if not i >> q & 1] for q in range(nq)]
        self._ones = [[i1 for _, i1 in pairs] for pairs in self._pairs]
        self._k = [math.pi / (p.pi_area * FULL_SCALE) for p in qubits]      # rad per code
        self._if = [p.if_hz / self.sample_rate_hz for p in qubits]          # turns per sample
        self._g1 = [ns_per_sample / p.t1_ns for p in qubits]                # per sample
        self._gphi = [ns_per_sample / p.tphi_ns for p in qubits]            # per sample
        self._step = [self._trotter_step(p.t1_ns, p.tphi_ns, ns_per_sample) for p in qubits]
        self._t = [0] * nq           # decay applied up to this sample
        self._last = [0] * nq        # latest event on the qubit
        self._u: list[tuple[complex, complex] | None] = [None] * nq  # pending SU(2): (a, b)
        self._jump_rng = [random.Random(f"{seed}:jumps:{q}") for q in range(nq)]
        self._cboth = [[i for i in range(dim) if i >> cp.a & 1 and i >> cp.b & 1]
                       for cp in couplers]
        self._ck = [math.pi / (cp.cz_area * FULL_SCALE) for cp in couplers]
        self._cstep = [min(self._step[cp.a], self._step[cp.b]) for cp in couplers]
        self._cstart: list[int | None] = [None] * len(couplers)  # pending phase since
        self._cphi = [0.0] * len(couplers)
        self._qcouplers = [[c for c, cp in enumerate(couplers) if q in (cp.a, cp.b)]
                           for q in range(nq)]
        self._ro_if = [ro.ro_if_hz / self.sample_rate_hz for ro in readouts]
        self._ro_rng = [random.Random(f"{seed}:readout:{c}") for c in range(len(readouts))]
        self._noise_rng = [random.Random(f"{seed}:noise:{c}") for c in range(len(readouts))]
        self._window: list[int | None] = [None] * len(readouts)

    def _trotter_step(self, t1_ns: float, tphi_ns: float, ns_per_sample: float) -> int:
        shortest = min(t1_ns, tphi_ns)
        if math.isinf(shortest):
            return 1 << 62
        return max(1, int(self.trotter_fraction * shortest / ns_per_sample))

    # --- description --------------------------------------------------------------------------

    def describe(self) -> dict:
        """The model's settings as plain, JSON-safe data (infinite times as None) for a
        report: qubits, which channel drives/reads/couples which qubits, frequencies, T1/T2."""
        return {
            "model": "state vector, quantum-jump trajectories",
            "seed": self.seed,
            "sample_rate_hz": self.sample_rate_hz,
            "trotter_fraction": self.trotter_fraction,
            "qubits": [{"qubit": q, "if_hz": p.if_hz, "t1_ns": _finite(p.t1_ns),
                        "t2_ns": _finite(p.t2_ns), "pi_area": p.pi_area}
                       for q, p in enumerate(self.qubits)],
            "drives": [{"channel": c, "qubit": q} for c, q in enumerate(self.drives)],
            "readouts": [{"channel": c, "qubit": ro.qubit, "ro_if_hz": ro.ro_if_hz,
                          "readout_amplitude": ro.readout_amplitude,
                          "phase0_rad": ro.phase0_rad, "phase1_rad": ro.phase1_rad,
                          "noise_sigma": ro.noise_sigma}
                         for c, ro in enumerate(self.readouts)],
            "couplers": [{"channel": c, "qubits": [cp.a, cp.b], "cz_area": cp.cz_area}
                         for c, cp in enumerate(self.couplers)],
        }

    # --- checks -------------------------------------------------------------------------------

    def _qubit(self, qubit: int) -> int:
        if not (isinstance(qubit, int) and 0 <= qubit < self._nq):
            raise ValueError(f"qubit must be in 0..{self._nq - 1}, not {qubit!r}")
        return qubit

    def _drive_qubit(self, channel: int) -> int:
        if not (isinstance(channel, int) and 0 <= channel < len(self.drives)):
            raise ValueError(f"drive channel must be in 0..{len(self.drives) - 1}, "
                             f"not {channel!r}")
        return self.drives[channel]

    def _readout_channel(self, channel: int) -> Readout:
        if not (isinstance(channel, int) and 0 <= channel < len(self.readouts)):
            raise ValueError(f"readout channel must be in 0..{len(self.readouts) - 1}, "
                             f"not {channel!r}")
        return self.readouts[channel]

    def _coupler(self, channel: int) -> Coupler:
        if not (isinstance(channel, int) and 0 <= channel < len(self.couplers)):
            raise ValueError(f"coupler channel must be in 0..{len(self.couplers) - 1}, "
                             f"not {channel!r}")
        return self.couplers[channel]

    def _check_time(self, qubit: int, n: int) -> None:
        if n < self._last[qubit]:
            raise ValueError(f"n ({n!r}) is before sample {self._last[qubit]}, the latest event "
                             f"on qubit {qubit}: events on a qubit must come in time order")

    # --- state updates ------------------------------------------------------------------------

    def _apply_u(self, psi: list[complex], q: int, u: tuple[complex, complex]) -> None:
        """``psi <- U psi`` on qubit ``q``, ``U = [[a, -conj(b)], [b, conj(a)]]``."""
        a, b = u
        ac = a.conjugate()
        mbc = -b.conjugate()
        for i0, i1 in self._pairs[q]:
            x0 = psi[i0]
            x1 = psi[i1]
            psi[i0] = a * x0 + mbc * x1
            psi[i1] = b * x0 + ac * x1

    def _apply_phase(self, psi: list[complex], c: int) -> None:
        """The pending conditional phase of coupler ``c`` on ``psi``."""
        w = cmath.rect(1.0, self._cphi[c])
        for i in self._cboth[c]:
            psi[i] *= w

    def _decay(self, q: int, dn: int) -> None:
        """One quantum-jump step of qubit ``q``'s amplitude damping and dephasing over ``dn``
        samples (an exact unravelling of the two channels over the interval)."""
        psi = self._psi
        rng = self._jump_rng[q]
        g1 = self._g1[q]
        if g1:
            p = -math.expm1(-dn * g1)
            p1 = 0.0
            for i in self._ones[q]:
                x = psi[i]
                p1 += x.real * x.real + x.imag * x.imag
            if p1 > 0:
                if rng.random() < p * p1:            # a jump K1 = sqrt(p) |0><1|
                    norm = 1 / math.sqrt(p1)
                    for i0, i1 in self._pairs[q]:
                        psi[i0] = psi[i1] * norm
                        psi[i1] = 0j
                else:                                # no jump: K0 = diag(1, sqrt(1 - p))
                    norm = 1 / math.sqrt(1 - p * p1)
                    damp = math.sqrt(1 - p) * norm
                    for i0, i1 in self._pairs[q]:
                        psi[i0] *= norm
                        psi[i1] *= damp
        gphi = self._gphi[q]
        if gphi and rng.random() < -0.5 * math.expm1(-dn * gphi):
            for i in self._ones[q]:
                psi[i] = -psi[i]

    def _flush(self, q: int, n: int) -> None:
        """Apply everything pending on qubit ``q`` (couplers' phases, folded rotation), then its
        decay up to sample ``n``."""
        for c in self._qcouplers[q]:
            if self._cstart[c] is not None:
                self._apply_phase(self._psi, c)
                self._cstart[c] = None
                self._cphi[c] = 0.0
        u = self._u[q]
        if u is not None:
            self._apply_u(self._psi, q, u)
            self._u[q] = None
        if n > self._t[q]:
            self._decay(q, n - self._t[q])
            self._t[q] = n

    def _kick(self, q: int, n: int, i: float, iq: float) -> None:
        """Drive sample ``I + jQ = i + j iq`` (codes) on qubit ``q`` at sample ``n``."""
        if not (i or iq):
            self._last[q] = n
            return
        # Omega = k s exp(-j 2 pi if t): the drive in the qubit's rotating frame.
        om = complex(i, iq) * cmath.rect(self._k[q], -_TWO_PI * ((n * self._if[q]) % 1.0))
        theta = abs(om)
        sinc = math.sin(0.5 * theta) / theta
        a = math.cos(0.5 * theta)
        b = complex(sinc * om.imag, -sinc * om.real)     # -j sin(theta/2) Omega / |Omega|
        u = self._u[q]
        if u is None or n - self._t[q] >= self._step[q]:
            self._flush(q, n)
            self._u[q] = (complex(a), b)
        else:                                            # U_n @ U: SU(2) product
            ua, ub = u
            self._u[q] = (a * ua - b.conjugate() * ub, b * ua + a * ub)
        self._last[q] = n

    # --- the PTD side -------------------------------------------------------------------------

    def drive(self, channel: int, n: int, i: int, q: int = 0) -> None:
        """Drive sample ``n`` of drive channel ``channel``: ``I = i``, ``Q = q`` in DAC codes
        (a real DAC: ``q = 0``). Rotates the channel's qubit, see the class docstring."""
        qb = self._drive_qubit(channel)
        if n < self._last[qb]:
            self._check_time(qb, n)
        self._kick(qb, n, i, q)

    def drive_samples(self, channel: int, n: int, samples: Iterable[tuple[int, int]]) -> None:
        """Consecutive samples ``n, n + 1, ...`` of drive channel ``channel``, each an ``(I, Q)``
        pair in codes (the lanes of one or more DTD cycles)."""
        qb = self._drive_qubit(channel)
        self._check_time(qb, n)
        for k, (i, q) in enumerate(samples):
            self._kick(qb, n + k, i, q)

    def couple(self, channel: int, n: int, i: int, q: int = 0) -> None:
        """Sample ``n`` of coupler channel ``channel``, ``I + jQ`` in codes: adds the phase
        ``pi * |I + jQ| / (cz_area * FULL_SCALE)`` to the coupler's ``|11>``."""
        cp = self._coupler(channel)
        a, b = cp.a, cp.b
        self._check_time(a, n)
        self._check_time(b, n)
        dphi = self._ck[channel] * abs(complex(i, q))
        if dphi:
            start = self._cstart[channel]
            if (start is None or n - start >= self._cstep[channel]
                    or self._u[a] is not None or self._u[b] is not None):
                self._flush(a, n)
                self._flush(b, n)
                self._cstart[channel] = n
            self._cphi[channel] += dphi
        self._last[a] = self._last[b] = n

    def advance_to(self, n: int) -> None:
        """Bring every qubit to sample ``n``: apply what is pending and the decay up to ``n``
        (one step per qubit, however long the idle stretch)."""
        for q in range(self._nq):
            self._check_time(q, n)
        for q in range(self._nq):
            self._flush(q, n)
            self._last[q] = n

    def begin_readout(self, channel: int, n: int) -> int:
        """Open a window on readout channel ``channel`` at sample ``n``: project its qubit
        (outcome 1 with the marginal P(1), from the channel's seeded generator; the state
        collapses), record it in :attr:`measurements` and return the outcome."""
        ro = self._readout_channel(channel)
        if self._window[channel] is not None:
            raise ValueError(f"readout channel {channel} already has an open window")
        q = ro.qubit
        self._check_time(q, n)
        self._flush(q, n)
        psi = self._psi
        p1 = 0.0
        for i in self._ones[q]:
            x = psi[i]
            p1 += x.real * x.real + x.imag * x.imag
        p1 = min(1.0, max(0.0, p1))
        outcome = int(self._ro_rng[channel].random() < p1)
        norm = 1 / math.sqrt(p1 if outcome else 1 - p1)
        for i0, i1 in self._pairs[q]:
            if outcome:
                psi[i0] = 0j
                psi[i1] *= norm
            else:
                psi[i0] *= norm
                psi[i1] = 0j
        self._last[q] = n
        self._window[channel] = outcome
        self.measurements.append(ReadoutRecord(channel, q, outcome, p1, n))
        return outcome

    def adc_sample(self, channel: int, n: int) -> int:
        """The ADC code of readout channel ``channel`` at sample ``n`` while its window is open
        (0 when none is): ``A cos(2 pi ro_if_hz t + phase_outcome) + noise``, saturated to
        signed 16 bits."""
        ro = self._readout_channel(channel)
        outcome = self._window[channel]
        if outcome is None:
            return 0
        phase = ro.phase1_rad if outcome else ro.phase0_rad
        value = ro.readout_amplitude * math.cos(_TWO_PI * ((n * self._ro_if[channel]) % 1.0)
                                                + phase)
        if ro.noise_sigma:
            value += self._noise_rng[channel].gauss(0.0, ro.noise_sigma)
        return max(-32768, min(32767, round(value)))

    def end_readout(self, channel: int) -> None:
        """Close the window of readout channel ``channel`` (nothing if none is open)."""
        self._readout_channel(channel)
        self._window[channel] = None

    # --- observation (changes nothing) --------------------------------------------------------

    def bloch_vector(self, qubit: int, n: int | None = None) -> tuple[float, float, float]:
        """The Bloch vector ``(x, y, z)`` of ``qubit``'s reduced state at sample ``n`` (default:
        its latest event), averaged over the decay still to come (``x, y`` shrink by
        ``exp(-dt/T2)``, ``P(1)`` by ``exp(-dt/T1)``). Draws nothing: the model is unchanged."""
        q = self._qubit(qubit)
        if n is None:
            n = self._last[q]
        self._check_time(q, n)
        psi = self._psi
        pending = [c for c in self._qcouplers[q] if self._cstart[c] is not None]
        if pending or self._u[q] is not None:
            psi = list(psi)
            for c in pending:
                self._apply_phase(psi, c)
            if self._u[q] is not None:
                self._apply_u(psi, q, self._u[q])
        rho11 = 0.0
        rho01 = 0j
        for i0, i1 in self._pairs[q]:
            x1 = psi[i1]
            rho11 += x1.real * x1.real + x1.imag * x1.imag
            rho01 += psi[i0] * x1.conjugate()
        dn = n - self._t[q]
        p1 = rho11 * math.exp(-dn * self._g1[q])
        coherence = rho01 * math.exp(-dn * (0.5 * self._g1[q] + self._gphi[q]))
        return 2 * coherence.real, -2 * coherence.imag, 1 - 2 * p1

    def p1(self, qubit: int, n: int | None = None) -> float:
        """The probability that a readout of ``qubit`` at sample ``n`` (default: its latest
        event) gives 1, averaged over the decay still to come. Draws nothing."""
        return (1 - self.bloch_vector(qubit, n)[2]) / 2
