"""The multi-qubit model of the bench: rotating frame, Rabi, Ramsey, T1, T2, CZ, readout, seeds."""

from __future__ import annotations

import cmath
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from fringe_fit import fringe_frequency

from openqlink.isa.asm import amplitude_to_q15, assemble
from openqlink.sim.qubit import (
    DEFAULT_PI_AREA,
    FULL_SCALE,
    Coupler,
    QubitParams,
    QubitSystem,
    Readout,
)

ROOT = Path(__file__).resolve().parents[2]
FS = 1e9                      # PTD samples per second (e.g. 250 MHz DTD x 4 lanes)
IDEAL = {"t1_ns": math.inf, "t2_ns": math.inf}

#: A 64-sample gaussian (sigma 16), scaled so that at amplitude 1.0 its samples add up to
#: DEFAULT_PI_AREA (full-scale units): a pi pulse; its peak is about 1.0.
_G = [math.exp(-0.5 * ((k - 31.5) / 16) ** 2) for k in range(64)]
GAUSS = [g * DEFAULT_PI_AREA / sum(_G) for g in _G]


def nco(env: Sequence[float], amp: float, n0: int, f_nco_hz: float,
        phase_rad: float = 0.0) -> list[tuple[int, int]]:
    """The (I, Q) codes of a drive channel's NCO mixer for ``env`` starting at sample ``n0``:
    ``I + jQ = env * amp * exp(j (2 pi f_nco t + phase))`` with ``t = n / FS`` (absolute time:
    a phase-continuous NCO)."""
    out = []
    for k, e in enumerate(env):
        z = FULL_SCALE * amp * e * cmath.exp(1j * (2 * math.pi * f_nco_hz * (n0 + k) / FS
                                                   + phase_rad))
        out.append((round(z.real), round(z.imag)))
    return out


def play(sys: QubitSystem, channel: int, n0: int, amp: float, f_nco_hz: float,
         phase_rad: float = 0.0, env: Sequence[float] = GAUSS) -> int:
    """Play ``env`` at ``amp`` on drive ``channel`` from ``n0`` (one call per sample, as the
    bench does); returns the sample after the pulse."""
    for k, (i, q) in enumerate(nco(env, amp, n0, f_nco_hz, phase_rad)):
        sys.drive(channel, n0 + k, i, q)
    return n0 + len(env)


def measure(sys: QubitSystem, channel: int, n: int) -> int:
    outcome = sys.begin_readout(channel, n)
    sys.end_readout(channel)
    return outcome


def ones(make: Callable[[int], QubitSystem], run: Callable[[QubitSystem], int],
         shots: int) -> int:
    """How many of ``shots`` runs (a fresh system with seed ``shot`` each) give outcome 1."""
    return sum(run(make(shot)) for shot in range(shots))


def assert_binomial(k: int, shots: int, p: float, sigmas: float = 4.5) -> None:
    """``k`` ones of ``shots`` are consistent with P(1) = ``p``."""
    tol = sigmas * math.sqrt(max(p * (1 - p), 0.25 / shots) / shots)
    assert abs(k / shots - p) <= tol, f"{k}/{shots}: expected {p:.3f} +- {tol:.3f}"


# --- the rotating frame and the fold ---------------------------------------------------------


def _rotate(v: list[float], axis: tuple[float, float, float], angle: float) -> list[float]:
    """Rodrigues' rotation of the Bloch vector ``v`` by ``angle`` about the unit ``axis``."""
    kx, ky, kz = axis
    c, s = math.cos(angle), math.sin(angle)
    dot = kx * v[0] + ky * v[1] + kz * v[2]
    cross = (ky * v[2] - kz * v[1], kz * v[0] - kx * v[2], kx * v[1] - ky * v[0])
    return [v[i] * c + cross[i] * s + (kx, ky, kz)[i] * dot * (1 - c) for i in range(3)]


@pytest.mark.parametrize("trotter_fraction", [1e-3, 1e-12])
def test_each_sample_rotates_about_the_rotating_frame_axis(trotter_fraction):
    # Five qubits, each with its own IF, driven by random I/Q samples interleaved over time;
    # every qubit's Bloch vector must follow the rotations of the class docstring, sample by
    # sample (angle |Omega|, axis (cos arg Omega, sin arg Omega, 0),
    # Omega = pi / pi_area * s * exp(-j 2 pi if t)), whether the samples are folded into one
    # rotation (T1, T2 huge: no Trotter step) or applied one by one (tiny trotter_fraction).
    ifs = [0.0, 20e6, -35e6, 110e6, -499e6]
    params = [QubitParams(if_hz=f, t1_ns=1e12, t2_ns=1e12, pi_area=DEFAULT_PI_AREA * (1 + q / 7))
              for q, f in enumerate(ifs)]
    sys = QubitSystem(params, sample_rate_hz=FS, trotter_fraction=trotter_fraction)
    rng = random.Random(3)
    ref = [[0.0, 0.0, 1.0] for _ in ifs]
    for n in range(300):
        for q in rng.sample(range(5), 3):
            i, iq = rng.randint(-32767, 32767), rng.randint(-32767, 32767)
            sys.drive(q, n, i, iq)
            om = (math.pi / params[q].pi_area * complex(i, iq) / FULL_SCALE
                  * cmath.exp(-2j * math.pi * ifs[q] * n / FS))
            ref[q] = _rotate(ref[q], (math.cos(cmath.phase(om)), math.sin(cmath.phase(om)), 0),
                             abs(om))
    for q in range(5):
        got = sys.bloch_vector(q)
        assert got == pytest.approx(ref[q], abs=1e-6), q


def test_axis_follows_the_drive_phase():
    # A pi/2 pulse with the NCO phase 0 turns |0> to -Y (about +X), with phase pi/2 to +X
    # (about +Y): I drives X, Q drives Y, in the qubit's rotating frame.
    for phase, expected in [(0.0, (0, -1, 0)), (math.pi / 2, (1, 0, 0)), (math.pi, (0, 1, 0))]:
        sys = QubitSystem([QubitParams(if_hz=20e6, **IDEAL)], sample_rate_hz=FS)
        play(sys, 0, 1000, 0.5, 20e6, phase)
        assert sys.bloch_vector(0) == pytest.approx(expected, abs=2e-3), phase


def test_drive_samples_is_drive_per_sample():
    a = QubitSystem([QubitParams(if_hz=7e6)] * 2, sample_rate_hz=FS)
    b = QubitSystem([QubitParams(if_hz=7e6)] * 2, sample_rate_hz=FS)
    samples = nco(GAUSS, 0.7, 5, 9e6)
    for k, (i, q) in enumerate(samples):
        a.drive(1, 5 + k, i, q)
    b.drive_samples(1, 5, samples)
    assert a.bloch_vector(1) == b.bloch_vector(1)
    assert a.bloch_vector(1) != b.bloch_vector(0)


# --- Rabi -------------------------------------------------------------------------------------


def test_default_pi_area_makes_the_firmware_gaussian_a_pi_pulse():
    path = ROOT / "firmware" / "active_reset.s"
    env = assemble(path.read_text(), filename=str(path), dtd_clk_hz=250_000_000) \
        .envelopes["gauss"].samples
    for amplitude, p1 in [(1.0, 1.0), (0.5, 0.5)]:
        amp = amplitude_to_q15(amplitude)
        dac = [max(-32768, min(32767, (e * amp) >> 15)) for e in env]
        # if_hz 0: real DAC samples (no NCO) are resonant
        sys = QubitSystem([QubitParams(**IDEAL)], sample_rate_hz=250e6)
        for n, s in enumerate(dac):
            sys.drive(0, n, s)
        assert sys.p1(0) == pytest.approx(p1, abs=1e-4)


@pytest.mark.parametrize("amp", [0.0, 0.25, 0.5, 0.75, 1.0, 1.5])
def test_rabi(amp):
    # P(1) = sin^2(pi amp / (2 amp_pi)) with amp_pi = 1 (the gaussian's area is pi_area), the
    # NCO on the qubit's IF: the exact P(1) of the model, and 300 seeded shots.
    expected = math.sin(math.pi * amp / 2) ** 2
    params = QubitParams(if_hz=-40e6, **IDEAL)

    def run(sys):
        n = play(sys, 0, 17, amp, -40e6, 0.3)
        return measure(sys, 0, n + 3)

    sys = QubitSystem([params], sample_rate_hz=FS)
    play(sys, 0, 17, amp, -40e6, 0.3)
    assert sys.p1(0) == pytest.approx(expected, abs=1e-3)
    shots = 300
    k = ones(lambda seed: QubitSystem([params], sample_rate_hz=FS, seed=seed), run, shots)
    assert_binomial(k, shots, expected)


def test_off_resonant_drive_does_not_flip():
    # An NCO 100 MHz off the qubit's IF: the rotating-frame samples average out.
    sys = QubitSystem([QubitParams(if_hz=0.0, **IDEAL)], sample_rate_hz=FS)
    play(sys, 0, 0, 1.0, 100e6)
    assert sys.p1(0) < 0.01


# --- Ramsey -----------------------------------------------------------------------------------


def _ramsey_p1(detuning_hz: float, separation: int) -> float:
    """P(1) after two pi/2 pulses whose starts are ``separation`` samples apart, the NCO
    ``detuning_hz`` off the qubit's IF (no decay: the model's exact P(1))."""
    if_hz = 30e6
    sys = QubitSystem([QubitParams(if_hz=if_hz, **IDEAL)], sample_rate_hz=FS)
    play(sys, 0, 100, 0.5, if_hz + detuning_hz)
    play(sys, 0, 100 + separation, 0.5, if_hz + detuning_hz)
    return sys.p1(0)


@pytest.mark.parametrize("detuning_hz", [5e6, -2.5e6, 3.3e6])
def test_ramsey_fringes_at_the_nco_detuning(detuning_hz):
    separations = list(range(64, 1064, 20))
    p1 = [_ramsey_p1(detuning_hz, s) for s in separations]
    assert max(p1) - min(p1) > 0.9                      # (nearly) full-contrast fringes
    f = fringe_frequency([s / FS for s in separations], p1)
    assert f == pytest.approx(abs(detuning_hz), rel=0.01)


def test_ramsey_without_detuning_has_no_fringes():
    p1 = [_ramsey_p1(0.0, s) for s in range(64, 1064, 100)]
    assert min(p1) > 0.999                              # two pi/2 about X: a pi pulse


def test_ramsey_shots_follow_the_fringe():
    # Seeded shots over one period of a 5 MHz fringe (200 samples) follow the model's P(1),
    # which is (1 + cos(2 pi df tau + delta)) / 2 (delta: from the pulses' own detuning).
    params = QubitParams(if_hz=30e6, **IDEAL)
    model = []
    for separation in range(200, 400, 50):
        def run(sys, separation=separation):
            play(sys, 0, 100, 0.5, 35e6)
            n = play(sys, 0, 100 + separation, 0.5, 35e6)
            return measure(sys, 0, n)
        model.append(_ramsey_p1(5e6, separation))
        shots = 200
        k = ones(lambda seed: QubitSystem([params], sample_rate_hz=FS, seed=seed), run, shots)
        assert_binomial(k, shots, model[-1])
    assert max(model) > 0.85 and min(model) < 0.15


# --- decay ------------------------------------------------------------------------------------


def test_t1_decay():
    # A pi pulse, then a readout ``delay`` ns after it: P(1) ~ exp(-(delay + 32 ns) / T1)
    # (32 ns: from the pulse's centre). T2 = 2 T1: no pure dephasing.
    t1 = 2000.0
    params = QubitParams(if_hz=10e6, t1_ns=t1, t2_ns=2 * t1)
    shots = 500
    measured = {}
    for delay in [0, 1000, 2000, 4000]:
        def run(sys, delay=delay):
            n = play(sys, 0, 0, 1.0, 10e6)
            return measure(sys, 0, n + delay)
        k = ones(lambda seed: QubitSystem([params], sample_rate_hz=FS, seed=seed), run, shots)
        assert_binomial(k, shots, math.exp(-(delay + 32) / t1))
        measured[delay] = k / shots
    # The decay constant from the data: within 15% of T1.
    fit = 4000 / math.log(measured[0] / measured[4000])
    assert fit == pytest.approx(t1, rel=0.15)


def test_t1_decay_of_a_superposition_in_five_qubits():
    # Qubit 3 of five in (|0> + |1>)/sqrt(2), qubit 1 in |1> (no decay): after a wait d,
    # P(1) of qubit 3 is exp(-d/T1) / 2 (the no-jump evolution damps |1> too), and the
    # other qubits are untouched.
    t1 = 1000.0
    params = [QubitParams(**IDEAL)] * 5
    params[3] = QubitParams(if_hz=5e6, t1_ns=t1, t2_ns=t1)
    shots = 400
    for delay in [500, 1500]:
        def run(sys, delay=delay):
            play(sys, 1, 0, 1.0, 0.0)
            n = play(sys, 3, 0, 0.5, 5e6, math.pi / 2)
            assert measure(sys, 1, n + delay) == 1
            assert measure(sys, 0, n + delay) == 0
            return measure(sys, 3, n + delay)
        k = ones(lambda seed: QubitSystem(params, sample_rate_hz=FS, seed=seed), run, shots)
        assert_binomial(k, shots, 0.5 * math.exp(-(delay + 32) / t1))


def test_t1_expected_p1_and_idle_cost():
    # The expected P(1) at a later sample decays as exp(-dt/T1) and draws nothing; advancing
    # over a long idle stretch is one step (it must not take a sample at a time).
    params = QubitParams(if_hz=0.0, t1_ns=1000.0, t2_ns=2000.0)
    sys = QubitSystem([params], sample_rate_hz=FS, trotter_fraction=1.0)
    play(sys, 0, 0, 1.0, 0.0)                            # one folded rotation (step 1000)
    p0 = sys.p1(0)                                       # at sample 63, the decay after it
    assert p0 == pytest.approx(math.exp(-63 / 1000), abs=1e-3)
    for dt in [0, 500, 1000, 3000]:
        assert sys.p1(0, 63 + dt) == pytest.approx(p0 * math.exp(-dt / 1000), rel=1e-9)
    sys.advance_to(10**12)                               # 1000 s of idling, at once
    assert sys.p1(0) == 0.0


def test_t2_ramsey_envelope_decays():
    # On resonance, pi/2 - wait - pi/2: P(1) = (1 + exp(-tau/T2)) / 2 whatever T1 (the
    # population relaxes in Z, which the second pulse turns into the unmeasured Y).
    t1, t2 = 4000.0, 2000.0
    params = QubitParams(if_hz=-20e6, t1_ns=t1, t2_ns=t2)
    shots = 500
    excess = {}
    for tau in [64, 1000, 2000, 4000]:                  # between the pulses' starts
        def run(sys, tau=tau):
            play(sys, 0, 0, 0.5, -20e6)
            n = play(sys, 0, tau, 0.5, -20e6)
            return measure(sys, 0, n)
        k = ones(lambda seed: QubitSystem([params], sample_rate_hz=FS, seed=seed), run, shots)
        assert_binomial(k, shots, (1 + math.exp(-tau / t2)) / 2)
        excess[tau] = 2 * k / shots - 1
    # The decay constant from the data (where the excess is still well above the shot noise):
    # within 25% of T2, far from the 2 T1 = 8 us of T1 alone.
    fit = (2000 - 64) / math.log(excess[64] / excess[2000])
    assert fit == pytest.approx(t2, rel=0.25)


def _contrast(params: QubitParams, start: int, shots: int | None) -> float:
    """Contrast (peak to peak) of a 2 MHz Ramsey fringe (500 samples a period) from four
    separations a quarter period apart from ``start``: ``sqrt((p0 - p2)^2 + (p1 - p3)^2)``;
    from ``shots`` seeded shots each, or the model's P(1) (``shots`` None, no decay)."""
    p = []
    for separation in range(start, start + 500, 125):
        def run(sys, separation=separation):
            play(sys, 0, 0, 0.5, 2e6)
            n = play(sys, 0, separation, 0.5, 2e6)
            return measure(sys, 0, n)
        if shots is None:
            sys = QubitSystem([params], sample_rate_hz=FS)
            play(sys, 0, 0, 0.5, 2e6)
            play(sys, 0, separation, 0.5, 2e6)
            p.append(sys.p1(0))
        else:
            p.append(ones(lambda seed: QubitSystem([params], sample_rate_hz=FS, seed=seed),
                          run, shots) / shots)
    return math.hypot(p[0] - p[2], p[1] - p[3])


def test_detuned_ramsey_fringe_contrast_decays():
    # The contrast of a 2 MHz fringe around separations of ~0.7 us and ~3.2 us: that of the
    # model without decay times exp(-tau/T2) (tau: the middle of the four separations).
    t2 = 1500.0
    params = QubitParams(if_hz=0.0, t1_ns=20_000.0, t2_ns=t2)
    ideal = _contrast(QubitParams(if_hz=0.0, **IDEAL), 500, None)
    assert ideal > 0.95
    for start in (500, 3000):
        expected = ideal * math.exp(-(start + 187.5) / t2)
        assert _contrast(params, start, 300) == pytest.approx(expected, abs=0.08), start


# --- coupler ----------------------------------------------------------------------------------


def _cz_run(sys: QubitSystem, target: int, control: int, control_state: int, area: float,
            second_phase: float) -> None:
    """Control in ``control_state``; pi/2 about X on the target; a coupler pulse of ``area``
    (fraction of cz_area; complex samples, only their magnitudes count); pi/2 on the target
    about the axis at ``second_phase``. Returns nothing; the caller reads the target."""
    ifs = {0: 20e6, 1: -30e6}
    if control_state:
        play(sys, control, 0, 1.0, ifs[control])
    play(sys, target, 100, 0.5, ifs[target])
    for k, e in enumerate(GAUSS):
        z = FULL_SCALE * area * e * cmath.exp(1j * 0.37 * k)
        sys.couple(0, 200 + k, round(z.real), round(z.imag))
    play(sys, target, 300, 0.5, ifs[target], second_phase)


def _cz_system(seed: int = 1) -> QubitSystem:
    return QubitSystem([QubitParams(if_hz=20e6, **IDEAL), QubitParams(if_hz=-30e6, **IDEAL)],
                       sample_rate_hz=FS, couplers=[Coupler(0, 1)], seed=seed)


@pytest.mark.parametrize("target, control", [(0, 1), (1, 0)])
@pytest.mark.parametrize("area", [0.0, 0.25, 0.5, 1.0])
def test_cz_conditional_phase(target, control, area):
    # Ramsey on the target: the second pi/2 about X gives P(1) = (1 + cos phi) / 2, about Y
    # (1 + sin phi) / 2. phi = pi * area / cz_area when the control is 1 (|11>), 0 when it
    # is 0 (|01>, |10> get no phase). The control stays where it was.
    for control_state in (0, 1):
        phi = math.pi * area * control_state
        for second_phase, expected in [(0.0, (1 + math.cos(phi)) / 2),
                                       (math.pi / 2, (1 + math.sin(phi)) / 2)]:
            sys = _cz_system()
            _cz_run(sys, target, control, control_state, area, second_phase)
            assert sys.p1(target) == pytest.approx(expected, abs=2e-3), (control_state,
                                                                          second_phase)
            assert sys.p1(control) == pytest.approx(control_state, abs=1e-3)


def test_cz_shots():
    # A full CZ (area == cz_area) with the control in 1 turns the target's Ramsey from 1 to 0.
    shots = 150
    for control_state, expected in [(0, 1.0), (1, 0.0)]:
        def run(sys, control_state=control_state):
            _cz_run(sys, 0, 1, control_state, 1.0, 0.0)
            assert measure(sys, 1, 400) == control_state
            return measure(sys, 0, 400)
        assert_binomial(ones(_cz_system, run, shots), shots, expected)


# --- readout ----------------------------------------------------------------------------------


def _demodulate(samples: Sequence[int], n0: int, ro_if_hz: float) -> complex:
    """``(2/N) sum x(t) exp(-j 2 pi ro_if t)``: the tone's complex amplitude ``A e^(j phase)``
    (``I + jQ``; half of it at 0 Hz, where there is no quadrature)."""
    acc = sum(x * cmath.exp(-2j * math.pi * ro_if_hz * (n0 + k) / FS)
              for k, x in enumerate(samples))
    return acc * (2 if ro_if_hz else 1) / len(samples)


@pytest.mark.parametrize("readout", [
    Readout(ro_if_hz=50e6),                                        # default phases: pi and 0
    Readout(ro_if_hz=-73e6, phase0_rad=0.0, phase1_rad=2 * math.pi / 3),
    Readout(ro_if_hz=0.0),                                         # a DC level, as QubitModel
])
def test_readout_blobs_and_assignment_fidelity(readout):
    window = 300
    sys = QubitSystem([QubitParams(if_hz=0.0, **IDEAL)], sample_rate_hz=FS, readouts=[readout],
                      seed=9)
    blobs: dict[int, list[complex]] = {0: [], 1: []}
    n = 0
    for shot in range(400):
        if shot % 2:                                      # prepare 1 on odd shots
            n = play(sys, 0, n, 1.0, 0.0)
        outcome = sys.begin_readout(0, n)
        assert outcome == shot % 2
        samples = [sys.adc_sample(0, n + k) for k in range(window)]
        sys.end_readout(0)
        blobs[outcome].append(_demodulate(samples, n, readout.ro_if_hz))
        n += window + 1
        if outcome:                                       # active reset
            n = play(sys, 0, n, 1.0, 0.0)
    centre = {k: sum(v) / len(v) for k, v in blobs.items()}
    spread = {k: math.sqrt(sum(abs(z - centre[k]) ** 2 for z in v) / len(v))
              for k, v in blobs.items()}
    phases = {0: readout.phase0_rad, 1: readout.phase1_rad}
    for k in (0, 1):
        tone = readout.readout_amplitude * cmath.exp(1j * phases[k])
        expected = tone if readout.ro_if_hz else complex(tone.real, 0)
        assert abs(centre[k] - expected) < 0.02 * readout.readout_amplitude, k
        # the noise: sigma * sqrt(2 / N) on each of I and Q (sigma / sqrt(N) at DC, on I)
        rms = readout.noise_sigma * (2 if readout.ro_if_hz else 1) / math.sqrt(window)
        assert spread[k] == pytest.approx(rms, rel=0.15)
    assert abs(centre[1] - centre[0]) > 10 * max(spread.values())
    # Assignment: the nearer centre; the fidelity 1 - (P(0|1) + P(1|0)) / 2 above 99%.
    errors = sum(abs(z - centre[1 - k]) < abs(z - centre[k]) for k, v in blobs.items()
                 for z in v)
    assert 1 - errors / 400 >= 0.99


def test_readout_noise_and_saturation():
    quiet = QubitSystem(1, sample_rate_hz=FS, readouts=[Readout(ro_if_hz=0.0, noise_sigma=0)])
    assert quiet.adc_sample(0, 0) == 0                     # no window open
    assert measure(quiet, 0, 0) == 0
    assert quiet.adc_sample(0, 1) == 0                     # closed again
    quiet.begin_readout(0, 1)
    assert {quiet.adc_sample(0, k) for k in range(10)} == {-2000}
    loud = QubitSystem(1, sample_rate_hz=FS,
                       readouts=[Readout(ro_if_hz=FS / 8, readout_amplitude=40_000,
                                         noise_sigma=0, phase0_rad=0.0)])
    loud.begin_readout(0, 0)
    samples = [loud.adc_sample(0, k) for k in range(8)]
    assert samples == [32767, 28284, 0, -28284, -32768, -28284, 0, 28284]


def test_measurement_records_and_collapse():
    sys = QubitSystem([QubitParams(**IDEAL)] * 3, sample_rate_hz=FS,
                      readouts=[Readout(qubit=2), Readout(qubit=0)])
    play(sys, 2, 0, 0.5, 0.0)                              # qubit 2 to P(1) = 1/2
    outcome = measure(sys, 0, 70)
    assert sys.p1(2) == pytest.approx(outcome, abs=1e-12)  # collapsed
    assert measure(sys, 0, 80) == outcome                  # and stays so
    assert measure(sys, 1, 90) == 0
    m = sys.measurements
    assert [(r.channel, r.qubit, r.outcome, r.sample) for r in m] == \
        [(0, 2, outcome, 70), (0, 2, outcome, 80), (1, 0, 0, 90)]
    assert m[0].p1 == pytest.approx(0.5, abs=1e-3)
    assert m[1].p1 == pytest.approx(outcome, abs=1e-12) and m[2].p1 == 0


# --- seeds, description, errors ---------------------------------------------------------------


def _scripted(seed: int) -> tuple[list, list[int]]:
    params = [QubitParams(if_hz=10e6 * q, t1_ns=3000.0, t2_ns=2500.0) for q in range(3)]
    sys = QubitSystem(params, sample_rate_hz=FS, couplers=[Coupler(0, 1), Coupler(1, 2)],
                      seed=seed)
    adc = []
    n = 0
    for _ in range(30):
        for q in range(3):
            play(sys, q, n, 0.5, 10e6 * q)
        for k in range(32):
            sys.couple(1, n + 64 + k, 9000)
        n += 200
        for c in range(3):
            sys.begin_readout(c, n)
            adc += [sys.adc_sample(c, n + k) for k in range(20)]
            sys.end_readout(c)
        n += 50
    return [(r.qubit, r.outcome, r.p1, r.sample) for r in sys.measurements], adc


def test_same_seed_same_outcomes_and_adc_samples():
    a, b, c = _scripted(5), _scripted(5), _scripted(6)
    assert a == b
    assert a[0] != c[0] and a[1] != c[1]
    assert 10 < sum(outcome for _, outcome, _, _ in a[0]) < 80


def test_the_seed_sets_the_outcomes_without_decay():
    def outcomes(seed):
        sys = QubitSystem([QubitParams(**IDEAL)], sample_rate_hz=FS, seed=seed)
        got = []
        for shot in range(40):
            n = play(sys, 0, 100 * shot, 0.5, 0.0)
            got.append(measure(sys, 0, n))
        return got
    assert outcomes(1) == outcomes(1)
    assert outcomes(1) != outcomes(2)
    assert 5 < sum(outcomes(1)) < 35


def test_describe():
    sys = QubitSystem([QubitParams(if_hz=1e6, **IDEAL), QubitParams(if_hz=2e6)],
                      sample_rate_hz=FS, drives=[1, 0, 1], couplers=[Coupler(1, 0, 20.0)],
                      readouts=[Readout(qubit=1, ro_if_hz=5e6)], seed=4)
    d = sys.describe()
    assert d["seed"] == 4 and d["sample_rate_hz"] == FS
    assert d["qubits"] == [
        {"qubit": 0, "if_hz": 1e6, "t1_ns": None, "t2_ns": None, "pi_area": DEFAULT_PI_AREA},
        {"qubit": 1, "if_hz": 2e6, "t1_ns": 50_000.0, "t2_ns": 40_000.0,
         "pi_area": DEFAULT_PI_AREA}]
    assert d["drives"] == [{"channel": 0, "qubit": 1}, {"channel": 1, "qubit": 0},
                           {"channel": 2, "qubit": 1}]
    assert d["readouts"] == [{"channel": 0, "qubit": 1, "ro_if_hz": 5e6,
                              "readout_amplitude": 2000.0, "phase0_rad": math.pi,
                              "phase1_rad": 0.0, "noise_sigma": 300.0}]
    assert d["couplers"] == [{"channel": 0, "qubits": [1, 0], "cz_area": 20.0}]


@pytest.mark.parametrize("kwargs, match", [
    ({"qubits": 6}, r"qubits must be 1\.\.5 qubits, not 6"),
    ({"qubits": [QubitParams()] * 6}, r"qubits must be 1\.\.5 qubits, not 6"),
    ({"qubits": 0}, r"qubits must be 1\.\.5"),
    ({"qubits": 2, "drives": [0, 2]}, r"drives\[1\] must be a qubit index in 0\.\.1, not 2"),
    ({"qubits": 2, "readouts": [Readout(qubit=-1)]}, r"readouts\[0\]\.qubit"),
    ({"qubits": 2, "couplers": [Coupler(0, 2)]}, r"couplers\[0\]\.b"),
    ({"qubits": 2, "couplers": [Coupler(1, 1)]}, r"couplers\[0\] must join two different"),
    ({"qubits": 2, "couplers": [Coupler(0, 1), Coupler(1, 0)]}, r"couplers\[1\] joins"),
    ({"qubits": [QubitParams(if_hz=600e6)]}, r"qubits\[0\]\.if_hz"),
    ({"qubits": 1, "readouts": [Readout(ro_if_hz=-501e6)]}, r"readouts\[0\]\.ro_if_hz"),
    ({"qubits": 1, "sample_rate_hz": 0}, r"sample_rate_hz"),
    ({"qubits": 1, "trotter_fraction": 0}, r"trotter_fraction"),
])
def test_bad_construction_names_the_parameter(kwargs, match):
    kwargs = {"sample_rate_hz": FS, **kwargs}
    with pytest.raises(ValueError, match=match):
        QubitSystem(kwargs.pop("qubits"), **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"t1_ns": 1000.0, "t2_ns": 2000.1}, r"t2_ns must be <= 2 \* t1_ns"),
    ({"t1_ns": math.inf, "t2_ns": math.inf}, None),
    ({"t1_ns": 1000.0, "t2_ns": 2000.0}, None),
    ({"t1_ns": 0.0}, r"t1_ns"),
    ({"t2_ns": -1.0}, r"t2_ns"),
    ({"pi_area": 0.0}, r"pi_area"),
    ({"if_hz": math.nan}, r"if_hz"),
])
def test_qubit_params(kwargs, match):
    if match is None:
        QubitParams(**kwargs)
    else:
        with pytest.raises(ValueError, match=match):
            QubitParams(**kwargs)


def test_bad_calls_name_the_parameter():
    sys = QubitSystem(2, sample_rate_hz=FS, couplers=[Coupler(0, 1)])
    for call, match in [
        (lambda: sys.drive(2, 0, 1), r"drive channel must be in 0\.\.1, not 2"),
        (lambda: sys.drive(-1, 0, 1), r"drive channel"),
        (lambda: sys.drive_samples(3, 0, [(1, 0)]), r"drive channel"),
        (lambda: sys.couple(1, 0, 1), r"coupler channel must be in 0\.\.0, not 1"),
        (lambda: sys.begin_readout(2, 0), r"readout channel must be in 0\.\.1, not 2"),
        (lambda: sys.adc_sample(5, 0), r"readout channel"),
        (lambda: sys.end_readout(-1), r"readout channel"),
        (lambda: sys.p1(2), r"qubit must be in 0\.\.1, not 2"),
        (lambda: sys.bloch_vector(-1), r"qubit must be"),
        (lambda: sys.drive(0, -1, 1), r"n \(-1\) is before sample 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    sys.drive(0, 10, 100)
    with pytest.raises(ValueError, match=r"n \(9\) is before sample 10.*qubit 0"):
        sys.drive(0, 9, 100)
    with pytest.raises(ValueError, match=r"n \(9\) is before sample 10.*qubit 0"):
        sys.couple(0, 9, 100)
    sys.drive(1, 9, 100)                                   # another qubit: its own clock
    with pytest.raises(ValueError, match=r"n \(9\)"):
        sys.advance_to(9)
    sys.begin_readout(0, 12)
    with pytest.raises(ValueError, match=r"readout channel 0 already has an open window"):
        sys.begin_readout(0, 13)
