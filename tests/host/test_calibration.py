"""The calibration table: its checks, its units and its file."""

from __future__ import annotations

import json
import math

import pytest

from openqlink.calibration import (
    CalibrationError,
    CalibrationTable,
    CouplerCalibration,
    QubitCalibration,
    freq_word,
    phase_word,
)
from openqlink.memory_map import QSCParams
from openqlink.sim.channel_map import channel_map, sim_params


@pytest.mark.parametrize("qubits", [1, 2, 3, 5])
def test_simulation_table_follows_the_channel_map(qubits):
    table = CalibrationTable.for_simulation(qubits, sim_params(qubits=qubits))
    cmap = channel_map(qubits)
    for entry in cmap["drive"]:
        if entry["role"] == "drive":
            assert table.qubit(entry["qubit"]).drive_channel == entry["channel"]
        else:
            assert table.coupler(*entry["qubits"]).channel == entry["channel"]
    for entry in cmap["readout"]:
        assert table.qubit(entry["qubit"]).readout_channel == entry["channel"]
    assert len(table.couplers) == qubits - 1


def test_units():
    table = CalibrationTable.for_simulation(1, QSCParams(samples_per_cycle=2))
    assert table.sample_rate_hz == 500_000_000
    assert table.cycles(400) == 100          # 250 MHz DTD clock
    assert table.cycles(401) == 101          # rounded up: never a shorter window
    assert table.freq_word(125e6) == 2**30
    assert table.freq_word(-125e6) == 2**32 - 2**30
    assert phase_word(math.pi) == 2**15
    assert phase_word(-math.pi / 2) == 3 * 2**14
    with pytest.raises(CalibrationError, match="Nyquist"):
        freq_word(250e6, 500e6)


def test_round_trip_through_a_file(tmp_path):
    table = CalibrationTable.for_simulation(3, pi_amplitude=0.8, readout_threshold=-120)
    table.qubit(1).readout_phase_rad = 0.25
    table.coupler(2, 1).cz_amplitude = 0.5
    path = tmp_path / "cal.json"
    table.save(path)
    again = CalibrationTable.load(path)
    assert again == table
    assert again.coupler(1, 2).qubits == (1, 2)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["qubits"][0].update(pi_amplitude=1.5), r"qubit 0: pi_amplitude must be <= 1"),
    (lambda d: d["qubits"][1].update(pi_amplitude=0), r"qubit 1: pi_amplitude must be > 0"),
    (lambda d: d["qubits"][0].update(drive_channel=16), r"qubit 0: drive_channel"),
    (lambda d: d["qubits"][1].update(drive_channel=0), r"share a drive channel"),
    (lambda d: d["qubits"][1].update(readout_channel=0), r"share a readout channel"),
    (lambda d: d["qubits"][0].update(readout_threshold=2**31), r"readout_threshold"),
    (lambda d: d["qubits"][0].update(readout_window_ns=float("nan")), r"readout_window_ns"),
    (lambda d: d["qubits"][0].update(colour="red"), r"qubit 0: unknown key\(s\) \['colour'\]"),
    (lambda d: d["couplers"][0].update(qubits=[1, 5]), r"the table has qubits 0\.\.1"),
    (lambda d: d.update(speed=3), r"unknown key\(s\) in the calibration table: \['speed'\]"),
    (lambda d: d.update(qubits=[]), r"at least one qubit"),
])
def test_bad_tables_are_refused_by_name(tmp_path, mutate, message):
    data = CalibrationTable.for_simulation(2).to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=message):
        CalibrationTable.load(path)


def test_lookups_name_what_is_missing():
    table = CalibrationTable.for_simulation(2)
    with pytest.raises(CalibrationError, match="no qubit 2 .*qubits 0..1"):
        table.qubit(2)
    with pytest.raises(CalibrationError, match="no coupler between qubits 0 and 0"):
        table.coupler(0, 0)
    with pytest.raises(CalibrationError, match="unknown qubit calibration field"):
        CalibrationTable.for_simulation(1, pi_amp=0.5)
    with pytest.raises(CalibrationError, match="nonexistent.json: cannot read"):
        CalibrationTable.load("/nonexistent.json")


def test_entries_are_checked_when_built():
    with pytest.raises(CalibrationError, match="pulse_length_samples"):
        CalibrationTable([QubitCalibration(0, 0, pulse_length_samples=0)])
    with pytest.raises(CalibrationError, match="cz_amplitude"):
        CalibrationTable([QubitCalibration(0, 0), QubitCalibration(1, 1)],
                         [CouplerCalibration((0, 1), 2, cz_amplitude=-0.1)])
