"""The calibration workflows' fits, programs and results without a device (numpy data with
known values), and ``qlink calibrate``'s usage errors. The workflows end to end on the
simulated QSC: tests/sim/test_calibrate_sim.py (``-m experiments``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from openqlink.calibrate import (
    COUNT_REGISTERS,
    FringeFit,
    IQShots,
    RabiFit,
    RabiResult,
    RamseyResult,
    ReadoutResult,
    ShotCounts,
    counting_program,
    demodulate,
    fit_fringe,
    fit_rabi,
    fit_readout,
    iq_program,
    resolve_detuning,
)
from openqlink.calibration import CalibrationError, CalibrationTable, phase_word
from openqlink.cli import main
from openqlink.isa.asm import assemble
from openqlink.sim.channel_map import ModelError, sim_params

# --- fits on data with known values -------------------------------------------------------


@pytest.mark.parametrize("a_pi", [0.35, 0.62, 0.8, 0.97])
@pytest.mark.parametrize("seed", [1, 2])
def test_rabi_fit_recovers_the_pi_amplitude(a_pi, seed):
    """Binomial P(1) of 24 shots per amplitude from A sin^2(pi a / 2 a_pi) + B: the fit finds
    a_pi within 4 of its own standard errors, which stay small (largest for a pi amplitude
    near the end of the sweep, where the sweep sees the top of the first fringe only)."""
    rng = np.random.default_rng(seed)
    amps = np.linspace(0, 1, 11)
    p = 0.93 * np.sin(np.pi * amps / (2 * a_pi)) ** 2 + 0.03
    y = rng.binomial(24, p) / 24
    fit = fit_rabi(amps, y)
    assert abs(fit.pi_amplitude - a_pi) < 4 * fit.pi_amplitude_err
    assert fit.pi_amplitude_err < 0.08
    assert 0.7 < fit.contrast < 1.1


def test_rabi_fit_is_exact_on_exact_data():
    amps = np.linspace(0, 1, 21)
    fit = fit_rabi(amps, 0.9 * np.sin(np.pi * amps / (2 * 0.7)) ** 2 + 0.05)
    assert fit.pi_amplitude == pytest.approx(0.7, abs=1e-4)
    assert fit.contrast == pytest.approx(0.9, abs=1e-3)
    assert fit.offset == pytest.approx(0.05, abs=1e-3)
    assert fit(0.7) == pytest.approx(0.95, abs=1e-3)


@pytest.mark.parametrize("f_hz", [0.65e6, 1.35e6, 2.2e6, 4.1e6])
def test_fringe_fit_recovers_the_frequency(f_hz):
    """Binomial P(1) of 32 shots at 13 delays 100 ns apart (Nyquist 5 MHz), fringes of 0.8
    to 5 periods over the sweep: the fit finds the frequency within 4 of its own standard
    errors, and exactly on exact data. (Under a period the frequency is poorly determined:
    the Ramsey workflow's detuning is chosen to give at least one.)"""
    rng = np.random.default_rng(7)
    delays = np.arange(13) * 100.0
    p = 0.5 + 0.45 * np.cos(2 * np.pi * f_hz * delays * 1e-9 + 0.4)
    y = rng.binomial(32, p) / 32
    fit = fit_fringe(delays, y)
    assert abs(fit.frequency_hz - f_hz) < max(4 * fit.frequency_err_hz, 20e3)
    assert fit.frequency_err_hz < 100e3
    exact = fit_fringe(delays, p)
    assert exact.frequency_hz == pytest.approx(f_hz, rel=1e-3)
    assert exact.amplitude == pytest.approx(0.45, abs=1e-3)


@pytest.mark.parametrize("d_hz", [350e3, -350e3, 1.6e6, -1.6e6, 0.0])
def test_two_detunings_give_the_qubit_frequency_with_its_sign(d_hz):
    """Fringes at |d - delta| and |d + delta| (NCO at +delta, then -delta) name d."""
    delta = 1e6
    assert resolve_detuning(abs(d_hz - delta), abs(d_hz + delta), delta) == \
        pytest.approx(d_hz)


def _blobs(rng, n, c0, c1, sigma, swapped=0):
    z0 = c0 + sigma * (rng.normal(size=n) + 1j * rng.normal(size=n))
    z1 = c1 + sigma * (rng.normal(size=n) + 1j * rng.normal(size=n))
    z1[:swapped] = c0 + sigma * (rng.normal(size=swapped) + 1j * rng.normal(size=swapped))
    return z0, z1


@pytest.mark.parametrize("angle", [0.0, 0.7, math.pi, -2.1])
@pytest.mark.parametrize("phase_used", [0.0, 1.0])
def test_readout_fit_rotates_one_onto_plus_i_with_the_threshold_between(angle, phase_used):
    """Two blobs whose axis is at ``angle`` (some |1> shots left in |0>, as an uncalibrated pi
    pulse leaves them): the new phase is the one used plus ``angle``; projected with it, the
    centers lie either side of the threshold, |1> above, and the threshold is their midpoint."""
    rng = np.random.default_rng(3)
    mid = 20000 * np.exp(1j * 2.0)
    c0 = mid - 40000 * np.exp(1j * angle)
    c1 = mid + 40000 * np.exp(1j * angle)
    z0, z1 = _blobs(rng, 40, c0, c1, 5000, swapped=5)
    fit = fit_readout(z0, z1, phase_used)
    assert abs(math.remainder(fit["phase_rad"] - phase_used - angle, 2 * math.pi)) < \
        4 * fit["phase_err_rad"] + 2 * math.pi / 1024
    rot = np.exp(-1j * fit["rotation_rad"])
    u0, u1 = (c0 * rot).real, (c1 * rot).real
    assert u0 < fit["threshold"] < u1
    assert fit["threshold"] == pytest.approx((mid * rot).real, abs=4 * fit["threshold_err"]
                                             + 300)
    assert fit["p1_given_0"] == 0.0
    assert fit["p0_given_1"] == pytest.approx(5 / 40)
    assert fit["fidelity"] == pytest.approx(1 - 0.5 * 5 / 40)


def test_readout_fit_refuses_states_it_cannot_tell_apart():
    with pytest.raises(CalibrationError):
        fit_readout(np.ones(4), np.ones(4))
    with pytest.raises(CalibrationError):
        fit_readout(np.ones(1), np.zeros(4))


def test_demodulation_matches_the_gateware_formula_and_a_tone():
    """A tone A cos(2 pi f n / fs + phi) of 64 samples demodulated at f with phase p gives
    about (A / 2) 64 exp(j (phi - p)); at f = 0 the sum of the samples rotated by -p."""
    fs, f = 250e6, 31.25e6
    n = np.arange(64)
    x = np.round(2000 * np.cos(2 * np.pi * f * n / fs + 0.9)).astype(np.int16)
    fw = round(f / fs * 2**32)
    z = demodulate(x, fw, phase_word(0.3))
    assert abs(z - 1000 * 64 * np.exp(1j * (0.9 - 0.3))) < 0.01 * 1000 * 64
    dc = np.full(10, 1234, dtype=np.int16)
    assert demodulate(dc, 0, 0) == complex(12340, 0)
    assert demodulate(dc, 0, phase_word(math.pi)) == complex(-12340, 0)
    # floor((-adc) * COS / 2**16) for a quarter turn: Q = -sum(adc)
    assert demodulate(dc, 0, phase_word(math.pi / 2)) == complex(0, -12340)


# --- programs -------------------------------------------------------------------------------


def test_programs_assemble_for_the_simulation_build():
    table = CalibrationTable.for_simulation(2, sim_params(1, 2), pi_amplitude=0.8,
                                            drive_if_hz=1e5, readout_phase_rad=1.0,
                                            readout_threshold=-300)
    params = sim_params(1, 2)
    prog = assemble(iq_program(table, 1, 3), params=params)
    assert "calib_iq_shot" in prog.functions
    text = counting_program(table, 1, ["        wait 4"] * len(COUNT_REGISTERS), 5)
    assemble(text, params=params)
    assert "acquire 1, r1, window=100, threshold=-300, phase=10430" in text
    assert f"play 1, cal_pulse, amp=0.800000, freq={table.freq_word(1e5)}" in text
    assert f"add r{COUNT_REGISTERS[-1]}, r{COUNT_REGISTERS[-1]}, r1" in text
    with pytest.raises(CalibrationError):
        counting_program(table, 0, ["        wait 4"] * (len(COUNT_REGISTERS) + 1), 5)
    with pytest.raises(CalibrationError):
        counting_program(table, 0, ["        wait 4"], 0)
    with pytest.raises(CalibrationError):
        iq_program(table, 2, 3)                   # no qubit 2


# --- results --------------------------------------------------------------------------------


def _readout_result() -> ReadoutResult:
    rng = np.random.default_rng(5)
    z0, z1 = _blobs(rng, 30, 40000 + 0j, -40000 + 0j, 4000)
    shots = IQShots({0: z0, 1: z1}, 0.0, "iq")
    return ReadoutResult(0, shots, **fit_readout(z0, z1, 0.0))


def test_results_apply_their_values_to_the_table():
    table = CalibrationTable.for_simulation(1)
    readout = _readout_result()
    readout.apply(table)
    assert table.qubits[0].readout_phase_rad == pytest.approx(math.pi, abs=0.02)
    assert table.qubits[0].readout_threshold == round(readout.threshold)
    edges, counts = readout.histogram(bins=10)
    assert edges.size == 11 and counts[0].sum() == counts[1].sum() == 30
    assert (readout.projected()[1] > readout.threshold).all()
    json.dumps(readout.to_dict())

    counts = ShotCounts(np.array([0, 10, 20]), 20)
    rabi = RabiResult(0, np.array([0.0, 0.4, 0.8]), counts, RabiFit(0.8, 0.01, 1.0, 0.0))
    rabi.apply(table)
    assert table.qubits[0].pi_amplitude == 0.8
    assert counts.p1.tolist() == [0.0, 0.5, 1.0]
    assert (counts.p1_err > 0).all()
    assert counts.histogram().tolist() == [[20, 0], [10, 10], [0, 20]]
    too_big = RabiResult(0, rabi.amplitudes, counts, RabiFit(1.2, 0.01, 1.0, 0.0))
    with pytest.raises(CalibrationError, match="pi_amplitude"):
        too_big.apply(table)

    fringe = FringeFit(1e6, 1e3, 0.5, 0.0, 0.5)
    ramsey = RamseyResult(0, np.arange(5) * 100.0, 1e6, 0.0, counts, counts, fringe, fringe,
                          3.5e5, 1e3)
    ramsey.apply(table)
    assert table.qubits[0].drive_if_hz == 3.5e5
    json.dumps(ramsey.to_dict())
    json.dumps(rabi.to_dict())


def test_results_plot_their_data_and_fit(tmp_path):
    pytest.importorskip("matplotlib")
    readout = _readout_result()
    assert readout.plot(tmp_path / "readout.png").stat().st_size > 0
    amps = np.linspace(0, 1, 11)
    counts = ShotCounts(np.round(20 * np.sin(np.pi * amps / 1.6) ** 2).astype(int), 20)
    rabi = RabiResult(0, amps, counts, fit_rabi(amps, counts.p1))
    assert rabi.plot(tmp_path / "rabi.svg").stat().st_size > 0
    fringe = FringeFit(1e6, 1e3, 0.5, 0.0, 0.5)
    ramsey = RamseyResult(0, np.arange(11) * 100.0, 1e6, 0.0, counts, counts, fringe, fringe,
                          3.5e5, 1e3)
    assert ramsey.plot(tmp_path / "ramsey.pdf").stat().st_size > 0


# --- the simulated device's model and the CLI -------------------------------------------------


def test_simulated_qsc_checks_a_model_object_before_it_starts(tmp_path):
    from openqlink.sim import SimulatedQSC

    with pytest.raises(ModelError, match="pi_aera"):
        SimulatedQSC(build_dir=tmp_path / "build", model={"qubits": {"pi_aera": 3.0}})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["rabi"], "give --sim or --bridge"),
    (["rabi", "--sim", "--bridge", "raw"], "give --sim or --bridge"),
    (["ramsey", "--bridge", "udp"], "needs --table"),
    (["readout", "--sim", "--board", "ecpix5-85"], "only with --bridge"),
    (["nope", "--sim"], "Invalid value"),
])
def test_calibrate_cli_usage_errors(args, message):
    result = CliRunner().invoke(main, ["calibrate", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_calibrate_cli_names_a_bad_table(tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"qubits": [{"drive_channel": 0, "readout_channel": 0,
                                           "pi_amplitude": 3.0}]}))
    result = CliRunner().invoke(main, ["calibrate", "rabi", "--sim", "--table", str(bad)])
    assert result.exit_code == 2
    assert "pi_amplitude" in result.output and len(result.output.strip().splitlines()) == 1


def test_calibrate_cli_says_in_one_line_when_no_board_answers(tmp_path):
    """The udp bridge to an address where no QSC listens: one line, exit status 1."""
    table = tmp_path / "cal.json"
    CalibrationTable.for_simulation(1).save(table)
    result = CliRunner().invoke(main, ["calibrate", "rabi", "--bridge", "udp", "--qsc-ip",
                                       "127.0.0.1", "--table", str(table)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qlink calibrate: ")
    assert "no board answered at 127.0.0.1" in lines[0] or "bridge" in lines[0]


def test_every_reset_pulse_is_followed_by_a_readout():
    """A reset's pi pulse is always measured before the next shot's pulse: an imperfect one
    played straight into the next pulse would add part of its rotation to it (the qubit then
    looked faster than it is: a Rabi of pi amplitude 0.8 fitted 0.73)."""
    table = CalibrationTable.for_simulation(1, pi_amplitude=0.9)
    text = counting_program(table, 0, ["        play 0, cal_pulse, amp=0.300000, freq=0"], 5)
    lines = [line for line in text.splitlines()
             if any(w in line.split()[:2] for w in ("play", "acquire"))]
    for k, line in enumerate(lines):
        if "amp=0.900000" in line:
            assert k + 1 < len(lines) and "acquire" in lines[k + 1], text
