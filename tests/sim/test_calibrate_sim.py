"""The calibration workflows end to end on the simulated QSC (:class:`openqlink.sim.
SimulatedQSC`), on a qubit model whose drive frequency, pi area and readout phases are not
the nominal table's: the readout (from raw traces), Rabi and Ramsey workflows find them, and a
program built from the calibrated table reads |1> after an x gate.

One simulation serves the whole module (its start elaborates the top: a minute or two); the
workflows run in order on it, each applied to the table before the next, as ``qlink calibrate
all`` runs them. Minutes in all on a small machine.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from openqlink.calibrate import (
    calibrate_rabi,
    calibrate_ramsey,
    calibrate_readout,
    count_ones,
    demodulate,
)
from openqlink.calibration import CalibrationTable, phase_word
from openqlink.sim.qubit import DEFAULT_PI_AREA

pytestmark = [
    pytest.mark.experiments,
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

#: The model: the qubit 350 kHz above the nominal drive frequency (0 Hz), a pi area of 0.8 of
#: the nominal pulse's (pi amplitude 0.8), and readout phases that put |1> on -I at phase 0
#: with levels 2000 cos(0.4) = 1842 (|0>) and 2000 cos(2.9) = -1942 (|1>) ADC codes.
IF_HZ = 350e3
PI_AMPLITUDE = 0.8
PHASE0, PHASE1 = 0.4, 2.9
NOISE = 600.0
MODEL = {
    "qubits": {"if_hz": IF_HZ, "pi_area": PI_AMPLITUDE * DEFAULT_PI_AREA},
    "readouts": {"phase0_rad": PHASE0, "phase1_rad": PHASE1, "noise_sigma": NOISE},
}
WINDOW_NS = 100.0          # 25 samples at 250 MHz
WINDOW_SAMPLES = 25


@pytest.fixture(scope="module")
def qsc(tmp_path_factory):
    from openqlink.sim import SimulatedQSC

    tmp = tmp_path_factory.mktemp("calibrate")
    model = tmp / "model.json"
    model.write_text(json.dumps(MODEL))
    with SimulatedQSC(build_dir=tmp / "build", model=model) as sim:
        yield sim


@pytest.fixture(scope="module")
def table():
    """The nominal table with a short readout window and slack (shorter shots)."""
    t = CalibrationTable.for_simulation(1, readout_window_ns=WINDOW_NS)
    t.sync_slack_ns = 128.0
    return t


@pytest.fixture(scope="module")
def readout(qsc, table):
    result = calibrate_readout(qsc, table, 0, shots=24, trace=True)
    result.apply(table)
    return result


@pytest.fixture(scope="module")
def rabi(qsc, table, readout):
    result = calibrate_rabi(qsc, table, 0, shots=20)
    result.apply(table)
    return result


@pytest.fixture(scope="module")
def ramsey(qsc, table, rabi):
    result = calibrate_ramsey(qsc, table, 0, delays_ns=[100.0 * k for k in range(13)],
                              shots=16)
    result.apply(table)
    return result


def test_readout_from_traces_finds_the_iq_angle_and_threshold(readout, table, tmp_path):
    """|1> lies on -I at phase 0: the angle is pi (within 0.05 rad), and the threshold midway
    between the two levels, 25 * (1942 - 1842) / 2 = 1250 integral units (within 4 of its
    standard errors, about 400 each); the states are told apart in nearly every shot."""
    assert abs(math.remainder(readout.phase_rad - math.pi, 2 * math.pi)) < 0.05
    expected = -WINDOW_SAMPLES * 2000 * (math.cos(PHASE0) + math.cos(PHASE1)) / 2
    assert abs(readout.threshold - expected) < 4 * readout.threshold_err + 200
    assert readout.fidelity > 0.8
    assert table.qubits[0].readout_phase_rad == readout.phase_rad
    # Every trace demodulated here gives the gateware's own I/Q integral of that window.
    shots = readout.shots
    assert shots.source == "trace"
    for s in (0, 1):
        assert len(shots.traces[s]) == 24
        assert all(t.size == WINDOW_SAMPLES for t in shots.traces[s])
        mine = [demodulate(t, 0, phase_word(shots.phase_rad)) for t in shots.traces[s]]
        assert np.array_equal(np.array(mine), shots.register_points[s])
    edges, counts = readout.histogram(bins=20)
    assert counts[0].sum() == counts[1].sum() == 24 and edges.size == 21
    pytest.importorskip("matplotlib")
    assert readout.plot(tmp_path / "readout.png").stat().st_size > 0


def test_rabi_finds_the_pi_amplitude(rabi, table, tmp_path):
    """The model's pi area is 0.8 of the nominal pulse's: the pi amplitude is 0.8 within
    0.05 (the drive, still 350 kHz off resonance here, shifts it by well under 0.01)."""
    assert abs(rabi.pi_amplitude - PI_AMPLITUDE) < 0.05
    assert rabi.pi_amplitude_err < 0.05
    assert rabi.fit.contrast > 0.8
    assert table.qubits[0].pi_amplitude == rabi.pi_amplitude
    assert rabi.counts.ones[0] <= 2 and rabi.counts.shots == 20
    pytest.importorskip("matplotlib")
    assert rabi.plot(tmp_path / "rabi.png").stat().st_size > 0


def test_ramsey_finds_the_drive_frequency_with_its_sign(ramsey, table, tmp_path):
    """Fringes at |350 kHz - 1 MHz| and 350 kHz + 1 MHz: the qubit is found 350 kHz above the
    nominal drive frequency, within 100 kHz."""
    assert abs(ramsey.fit_plus.frequency_hz - 650e3) < 150e3
    assert abs(ramsey.fit_minus.frequency_hz - 1.35e6) < 150e3
    assert abs(ramsey.drive_if_hz - IF_HZ) < 100e3
    assert table.qubits[0].drive_if_hz == ramsey.drive_if_hz
    pytest.importorskip("matplotlib")
    assert ramsey.plot(tmp_path / "ramsey.png").stat().st_size > 0


def test_the_calibrated_table_reads_one_after_an_x_gate(qsc, table, ramsey):
    """A program built from the calibrated table (its pulse at the calibrated frequency and
    amplitude, its readout at the calibrated phase and threshold) reads |1> after an x gate
    in most shots, and |0> without it."""
    cal = table.qubits[0]
    x = (f"        play {cal.drive_channel}, cal_pulse, amp={cal.pi_amplitude:.6f}, "
         f"freq={table.freq_word(cal.drive_if_hz)}\n        wait {cal.pulse_length_samples}")
    counts = count_ones(qsc, table, 0, [x, "        wait 4"], 20)
    assert counts.ones[0] >= 18
    assert counts.ones[1] <= 2
